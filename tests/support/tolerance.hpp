// SPDX-License-Identifier: MIT
// The agreement rule: error vs the double reference <= 2x a plain float implementation's error + atol.
#pragma once

#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include <posenc/attention/reference.hpp>

namespace posenc_test {

/// Result of comparing a path's output against the double reference.
struct tolerance_report {
  double error = 0;        ///< max |got - reference| (inf when finiteness differs)
  double plain_error = 0;  ///< max |plain float - reference|
  double bound = 0;        ///< 2 * plain_error + atol
  bool ok = false;
  std::string describe() const {
    std::ostringstream os;
    os << "error " << error << ", plain float error " << plain_error << ", bound " << bound;
    return os.str();
  }
};

/// max |got - ref| <= 2 * max |plain - ref| + atol, element-wise over equal-size
/// sequences; non-finite values must match exactly (-inf lse, etc.).
template <class A, class B, class C>
tolerance_report within_tolerance(A const& got, B const& ref, C const& plain, double atol = 1e-6) {
  tolerance_report r;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    double const g = static_cast<double>(got[i]), e = static_cast<double>(ref[i]),
                 p = static_cast<double>(plain[i]);
    if (!std::isfinite(e) || !std::isfinite(g)) {
      if (!(g == e)) r.error = INFINITY;
      continue;
    }
    r.error = std::max(r.error, std::abs(g - e));
    if (std::isfinite(p)) r.plain_error = std::max(r.plain_error, std::abs(p - e));
  }
  r.bound = 2 * r.plain_error + atol;
  r.ok = r.error <= r.bound;
  return r;
}

}  // namespace posenc_test


namespace posenc_test {

/// Path tag of the "plain float implementation" of the tolerance rule: the
/// reference path accumulating in T instead of double.
struct plain_path {};

}  // namespace posenc_test

namespace posenc::detail {
template <>
struct kernel<posenc_test::plain_path> {
  static constexpr bool available = true;
  static constexpr bool provides_scores = true;
  static constexpr bool rotates_itself = false;
  template <class T, class E>
  static void run(attention_plan<T> const& p, view<const T> q, view<const T> k, view<const T> v, view<T> out,
                  E const& enc) {
    reference_attention<T>(p, q, k, v, out, enc);
  }
};
}  // namespace posenc::detail
