// SPDX-License-Identifier: MIT
// The agreement rule: error vs the double reference <= 2x a plain float implementation's error
// + atol (relative to the reference's magnitude when that exceeds 1).
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
  double magnitude = 0;    ///< max |reference| over the finite elements
  double bound = 0;        ///< 2 * plain_error + max(atol * max(1, magnitude), floor)
  bool ok = false;
  std::string describe() const {
    std::ostringstream os;
    os << "error " << error << ", plain float error " << plain_error << ", magnitude " << magnitude << ", bound "
       << bound;
    return os.str();
  }
};

/// max |got - ref| <= 2 * max |plain - ref| + atol * max(1, max |ref|), over
/// equal-size sequences; non-finite values must match exactly (-inf lse, etc.).
///
/// The plain float error is one sample of rounding noise: a path that sums in
/// another order is as accurate on average (the fused path is more accurate:
/// mean error ratio 0.8 to 0.96 over random shapes) yet exceeds twice that
/// sample now and then. atol is the floor for those cases. It scales with the
/// values compared because rounding does: an absolute 1e-6 is less than one
/// float ulp for values above 8 (a log-sum-exp of -17 has ulp 1.9e-6).
/// Up to magnitude 1 the floor is the absolute atol, as before.
///
/// `floor`, when given, is a lower bound for the atol term that the caller
/// derives from the problem (the fuzzer passes the effect of one rounding of
/// every logit, which no float implementation avoids).
template <class A, class B, class C>
tolerance_report within_tolerance(A const& got, B const& ref, C const& plain, double atol = 1e-6,
                                  double floor = 0) {
  tolerance_report r;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    double const g = static_cast<double>(got[i]), e = static_cast<double>(ref[i]),
                 p = static_cast<double>(plain[i]);
    if (!std::isfinite(e) || !std::isfinite(g)) {
      if (!(g == e)) r.error = INFINITY;
      continue;
    }
    r.error = std::max(r.error, std::abs(g - e));
    r.magnitude = std::max(r.magnitude, std::abs(e));
    if (std::isfinite(p)) r.plain_error = std::max(r.plain_error, std::abs(p - e));
  }
  r.bound = 2 * r.plain_error + std::max(atol * std::max(1.0, r.magnitude), floor);
  r.ok = r.error <= r.bound;
  return r;
}

}  // namespace posenc_test


namespace posenc_test {

/// Path tag of the "plain float implementation" of the tolerance rule: the
/// reference path accumulating in T instead of double (on 16-bit tensors:
/// float compute on the 16-bit inputs, a 16-bit output rounded once).
struct plain_path {};

}  // namespace posenc_test

namespace posenc::detail {
template <>
struct kernel<posenc_test::plain_path> {
  static constexpr bool available = true;
  static constexpr bool provides_scores = true;
  static constexpr bool rotates_itself = false;
  template <class T, class Q, class KV, class O, class E>
  static void run(attention_plan<T> const& p, view<const Q> q, view<const KV> k, view<const KV> v, view<O> out,
                  E const& enc) {
    reference_attention<T>(p, q, k, v, out, enc);
  }
};
}  // namespace posenc::detail
