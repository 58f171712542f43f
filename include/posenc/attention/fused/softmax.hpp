// SPDX-License-Identifier: MIT
// path::fused, room 4: the online softmax (running max and sum) of both layouts, and the final normalisation.
#pragma once

// What this room holds: the online-softmax update for the lane layout (the
// statistics are vectors over query lanes: no horizontal reduction) and for
// the row layout (one row of keys), the shift rule they share (a row that has
// seen no key yet keeps max = -inf and contributes exp(-inf) = 0, never NaN),
// and the normalisation that turns (max, sum, unnormalised output) into the
// output row and its log-sum-exp. docs/formulas.md 5 has the formulas.
// May include: fused/traits.hpp and core/.

#include <algorithm>
#include <cmath>
#include <limits>

#include "posenc/attention/fused/traits.hpp"
#include "posenc/core/half.hpp"
#include "posenc/core/simd.hpp"
#include "posenc/core/span.hpp"

namespace posenc::detail::fused {

/// The value subtracted before exp: the running max, or 0 while it is -inf
/// (no visible key yet), so that exp(-inf - shift) = 0 and never NaN.
template <class T>
inline T softmax_shift(T mx) noexcept {
  return mx == -std::numeric_limits<T>::infinity() ? T(0) : mx;
}
template <class T, class Arch>
inline simd::batch<T, Arch> softmax_shift(simd::batch<T, Arch> const& mx) noexcept {
  using B = simd::batch<T, Arch>;
  return simd::select(mx == B(-std::numeric_limits<T>::infinity()), B(T(0)), mx);
}

/// Lane layout: the statistics of `nvec` lane vectors of one query block.
/// For each lane, the nk scores of column st[j * ld + lane] become logits
/// (`logit.at(lane0)` gives f with f(j, s) applying scale, softcap, bias and
/// visibility to the raw scores s of lanes lane0 .. lane0 + width - 1 of key j), then
/// exp(logit - max); m and l (per lane) are updated and alpha[lane] is the
/// factor the lane's output must be rescaled by before the tile's values are added.
template <class Tr, class Logit>
POSENC_ALWAYS_INLINE void lane_softmax_update(typename Tr::value_type* st, index_t ld, index_t nk, index_t nvec,
                                typename Tr::value_type* m, typename Tr::value_type* l,
                                typename Tr::value_type* alpha, Logit const& logit) noexcept {
  using T = typename Tr::value_type;
  using A = typename Tr::arch;
  using B = typename Tr::batch;
  constexpr index_t w_v = Tr::width_v;
  for (index_t mv = 0; mv < nvec; ++mv) {
    index_t const o = mv * w_v;
    B const m_old = simd::load<T, A>(m + o);
    B mx = m_old;
    auto const f = logit.at(o);
    for (index_t j = 0; j < nk; ++j) {
      B const s = f(j, simd::load<T, A>(st + j * ld + o));
      simd::store(st + j * ld + o, s);
      mx = simd::max(mx, s);
    }
    B const shift = softmax_shift(mx);
    B const al = simd::exp(m_old - shift);
    B sum(T(0));
    for (index_t j = 0; j < nk; ++j) {
      B const e = simd::exp(simd::load<T, A>(st + j * ld + o) - shift);
      simd::store(st + j * ld + o, e);
      sum = sum + e;
    }
    simd::store(l + o, simd::load<T, A>(l + o) * al + sum);
    simd::store(m + o, mx);
    simd::store(alpha + o, al);
  }
}

/// Row layout: logits s[0, nk) of one row become exp(s - max); the row's
/// running max m and sum l are updated. Returns the factor the row's output
/// must be rescaled by before the new keys' values are added.
template <class Tr>
inline typename Tr::value_type row_softmax_update(typename Tr::value_type* s, index_t nk,
                                                  typename Tr::value_type& m,
                                                  typename Tr::value_type& l) noexcept {
  using T = typename Tr::value_type;
  using A = typename Tr::arch;
  using B = typename Tr::batch;
  constexpr index_t w_v = Tr::width_v;
  B mxv(m);
  index_t jm = 0;
  for (; jm + w_v <= nk; jm += w_v) mxv = simd::max(mxv, simd::load<T, A>(s + jm));
  T mx = simd::reduce_max(mxv);
  for (; jm < nk; ++jm) mx = std::max(mx, s[jm]);
  T const shift = softmax_shift(mx);
  T const al = std::exp(m - shift);
  B sumv(T(0));
  index_t j = 0;
  for (; j + w_v <= nk; j += w_v) {
    B const e = simd::exp(simd::load<T, A>(s + j) - B(shift));
    simd::store(s + j, e);
    sumv = sumv + e;
  }
  T sum = simd::reduce_add(sumv);
  for (; j < nk; ++j) {
    s[j] = std::exp(s[j] - shift);
    sum += s[j];
  }
  l = l * al + sum;
  m = mx;
  return al;
}

/// dst[d] = o[d * o_stride] / l for d < value_dim (zeros when l = 0: no
/// visible key; NaN when l or m is NaN: a visible score was NaN, and exp(NaN)
/// made the sum NaN whatever the running max did). Returns the row's
/// log-sum-exp, m + log(l), -inf when l = 0, NaN with a NaN row. A 16-bit
/// dst (float T) gets each value rounded once, to nearest even.
template <class T, class D>
inline T normalize_row(D* dst, index_t value_dim, T const* o, index_t o_stride, T m, T l) noexcept {
  if (std::isnan(l) || std::isnan(m)) {
    for (index_t d = 0; d < value_dim; ++d) dst[d] = to_output<D>(std::numeric_limits<T>::quiet_NaN());
    return std::numeric_limits<T>::quiet_NaN();
  }
  T const inv = l > 0 ? T(1) / l : T(0);
  for (index_t d = 0; d < value_dim; ++d) dst[d] = to_output<D>(o[d * o_stride] * inv);
  return l > 0 ? m + std::log(l) : -std::numeric_limits<T>::infinity();
}

}  // namespace posenc::detail::fused
