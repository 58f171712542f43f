// SPDX-License-Identifier: MIT
// Attention problems for the backward tests: random data, the forward loss, central differences, the plain-float path.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <posenc/attention/attention.hpp>
#include <posenc/attention/backward.hpp>

#include <type_traits>

#include "support/random.hpp"

namespace posenc_test {

/// Path tag of the plain float backward of the tolerance rule for the
/// reference formulas: the reference backward accumulating in T instead of double.
struct plain_backward_path {};

/// The same for the fused path's formulas: Delta = dO . O from the forward
/// output, as flash-style backward passes compute it. In a row that sees one
/// key the exact dS is 0, and both this and the fused path carry the rounding
/// of the float output O into it.
struct plain_flash_backward_path {};

/// The plain float backward that path P is held to.
template <class P>
using plain_backward_for = std::conditional_t<std::is_same_v<P, posenc::path::fused>, plain_flash_backward_path,
                                              plain_backward_path>;

}  // namespace posenc_test

namespace posenc::detail {
template <>
struct backward_kernel<posenc_test::plain_backward_path> {
  static constexpr bool available = true;
  static constexpr bool needs_lse = false;
  template <class T, class E>
  static void run(attention_plan<T> const& p, backward_views<T> const& io, E const& enc,
                  encoder_gradients_t<E>& grads) {
    reference_attention_backward<T>(p, io, enc, grads);
  }
};
template <>
struct backward_kernel<posenc_test::plain_flash_backward_path> {
  static constexpr bool available = true;
  static constexpr bool needs_lse = false;
  template <class T, class E>
  static void run(attention_plan<T> const& p, backward_views<T> const& io, E const& enc,
                  encoder_gradients_t<E>& grads) {
    reference_attention_backward<T, row_delta::output>(p, io, enc, grads);
  }
};
}  // namespace posenc::detail

namespace posenc_test {

using posenc::index_t;

/// One attention problem in BSHD buffers, with the gradient dout of the loss
/// L = sum(dout * out), and buffers for the gradients.
template <class T>
struct attention_problem {
  index_t B = 1, Sq = 1, Sk = 1, Hq = 1, Hkv = 1, D = 1, Dv = 1;
  std::vector<T> q, k, v, out, dout, dq, dk, dv, lse;
  posenc::attention_options<T> opt;

  attention_problem(index_t b, index_t sq, index_t sk, index_t hq, index_t hkv, index_t d, index_t dv_,
                    std::uint64_t seed)
      : B(b), Sq(sq), Sk(sk), Hq(hq), Hkv(hkv), D(d), Dv(dv_) {
    q = random_vector<T>(static_cast<std::size_t>(B * Sq * Hq * D), seed);
    k = random_vector<T>(static_cast<std::size_t>(B * Sk * Hkv * D), seed + 1);
    v = random_vector<T>(static_cast<std::size_t>(B * Sk * Hkv * Dv), seed + 2);
    dout = random_vector<T>(static_cast<std::size_t>(B * Sq * Hq * Dv), seed + 3);
    out.assign(dout.size(), T(0));
    dq.assign(q.size(), T(0));
    dk.assign(k.size(), T(0));
    dv.assign(v.size(), T(0));
  }
  posenc::view<T> vq() { return posenc::make_bshd(q.data(), B, Sq, Hq, D); }
  posenc::view<T> vk() { return posenc::make_bshd(k.data(), B, Sk, Hkv, D); }
  posenc::view<T> vv() { return posenc::make_bshd(v.data(), B, Sk, Hkv, Dv); }
  posenc::view<T> vout() { return posenc::make_bshd(out.data(), B, Sq, Hq, Dv); }
  posenc::view<T> vdout() { return posenc::make_bshd(dout.data(), B, Sq, Hq, Dv); }
  posenc::view<T> vdq() { return posenc::make_bshd(dq.data(), B, Sq, Hq, D); }
  posenc::view<T> vdk() { return posenc::make_bshd(dk.data(), B, Sk, Hkv, D); }
  posenc::view<T> vdv() { return posenc::make_bshd(dv.data(), B, Sk, Hkv, Dv); }

  /// Forward on the reference path; returns L = sum(dout * out).
  template <class E>
  double loss(E const& enc) {
    posenc::attention_options<T> o = opt;
    o.lse = nullptr;
    posenc::attention<posenc::path::reference>(vq(), vk(), vv(), vout(), enc, o);
    double l = 0;
    for (std::size_t i = 0; i < out.size(); ++i) l += static_cast<double>(dout[i]) * static_cast<double>(out[i]);
    return l;
  }
  /// Forward (filling out and, when `with_lse`, lse) then backward on Path.
  template <class Path = posenc::path::reference, class E>
  void gradients(E const& enc, posenc::encoder_gradients_t<E>& g, bool with_lse = false) {
    posenc::attention_options<T> o = opt;
    lse.assign(static_cast<std::size_t>(B * Hq * Sq), T(0));
    o.lse = with_lse ? posenc::output_span<T>(lse) : posenc::output_span<T>();
    posenc::attention<posenc::path::reference>(vq(), vk(), vv(), vout(), enc, o);
    posenc::attention_backward<Path>(vq(), vk(), vv(), vout(), vdout(), vdq(), vdk(), vdv(), enc, o, g);
  }
};

/// Outcome of comparing analytic gradients with central differences.
struct fd_report {
  double worst = 0;     // max |analytic - numeric|
  double largest = 0;   // max |analytic|
  double tolerance = 0; // 1e-6 * max(largest, 1e-3)
  std::string where;    // the worst element
  bool ok() const { return worst <= tolerance; }
  std::string describe() const {
    std::ostringstream os;
    os << "worst |analytic - numeric| " << worst << " at " << where << ", largest gradient " << largest
       << ", tolerance " << tolerance;
    return os.str();
  }
};

/// Central differences of `loss` with respect to each x[i] against analytic[i].
///
/// Step h = 1e-5: in double the truncation error of a central difference is
/// h^2 |L'''| / 6 ~ 2e-11 for these O(1) losses, and the rounding error
/// eps |L| / h ~ 1e-16 / 1e-5 = 1e-11, so the numeric gradient carries about
/// 1e-10 of error, far below the 1e-6 relative agreement required (relative
/// to the largest gradient of the tensor, at least 1e-3).
inline void central_differences(fd_report& r, std::string const& name, std::vector<double>& x,
                                 std::vector<double> const& analytic, std::function<double()> const& loss) {
  double const h = 1e-5;
  for (double a : analytic) r.largest = std::max(r.largest, std::abs(a));
  for (std::size_t i = 0; i < x.size(); ++i) {
    double const keep = x[i];
    x[i] = keep + h;
    double const lp = loss();
    x[i] = keep - h;
    double const lm = loss();
    x[i] = keep;
    double const num = (lp - lm) / (2 * h);
    double const err = std::abs(num - analytic[i]);
    if (!(err <= r.worst)) {
      r.worst = err;
      r.where = name + "[" + std::to_string(i) + "] analytic " + std::to_string(analytic[i]) + " numeric " +
                std::to_string(num);
    }
  }
  r.tolerance = 1e-6 * std::max(r.largest, 1e-3);
}

/// An encoder's parameter gradients as one flat vector of doubles: every tensor
/// for_each_tensor visits, in its order, each in its memory order.
template <class G>
void flatten_gradients(std::vector<double>& out, G const& g) {
  g.for_each_tensor([&](char const*, auto const& t) {
    for (Eigen::Index i = 0; i < t.size(); ++i) out.push_back(static_cast<double>(t.data()[i]));
  });
}

/// Checks dq, dk, dv of attention with encoder `enc` on problem p (double) by
/// central differences, on the reference path and, where the encoder has a
/// fused backward, on the fused path (the report holds the worse of the two;
/// the fused path's `where` says so).
/// `g` receives the reference path's parameter gradients (the caller checks
/// them by central differences); the fused path's, from a zeroed copy, must
/// equal them to 1e-6 of the largest (so they pass the same check), and are
/// part of the report. p's gradient buffers hold the fused path's afterwards.
template <class E>
fd_report check_input_gradients(attention_problem<double>& p, E const& enc, posenc::encoder_gradients_t<E>& g) {
  std::vector<double> before;
  if constexpr (!posenc::detail::fused_backward_excluded<E>::value) flatten_gradients(before, g);
  fd_report r;
  auto loss = [&] { return p.loss(enc); };
  p.gradients(enc, g);
  {
    std::vector<double> const dq = p.dq, dk = p.dk, dv = p.dv;
    central_differences(r, "dq", p.q, dq, loss);
    central_differences(r, "dk", p.k, dk, loss);
    central_differences(r, "dv", p.v, dv, loss);
  }
  if constexpr (posenc::detail::fused_backward_excluded<E>::value) {
    return r;  // no fused backward for this encoder (Transformer-XL): the reference path alone
  } else {
    posenc::encoder_gradients_t<E> gf = g;
    gf.set_zero();
    p.template gradients<posenc::path::fused>(enc, gf);
    fd_report f;
    {
      std::vector<double> const dq = p.dq, dk = p.dk, dv = p.dv;
      central_differences(f, "fused dq", p.q, dq, loss);
      central_differences(f, "fused dk", p.k, dk, loss);
      central_differences(f, "fused dv", p.v, dv, loss);
    }
    std::vector<double> ref_params, fused_params;
    flatten_gradients(ref_params, g);
    flatten_gradients(fused_params, gf);
    for (std::size_t i = 0; i < fused_params.size(); ++i) {
      double const want = ref_params[i] - (i < before.size() ? before[i] : 0.0);  // what this call added
      f.largest = std::max(f.largest, std::abs(want));
      double const err = std::abs(fused_params[i] - want);
      if (!(err <= f.worst)) {
        f.worst = err;
        f.where = "fused parameter gradient [" + std::to_string(i) + "] " + std::to_string(fused_params[i]) +
                  " reference " + std::to_string(want);
      }
    }
    f.tolerance = 1e-6 * std::max(f.largest, 1e-3);
    return f.worst / f.tolerance > r.worst / r.tolerance ? f : r;
  }
}

/// True when every value is finite.
template <class V>
bool all_finite(V const& v) {
  return std::all_of(v.begin(), v.end(), [](auto x) { return std::isfinite(static_cast<double>(x)); });
}

}  // namespace posenc_test
