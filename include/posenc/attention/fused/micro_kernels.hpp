// SPDX-License-Identifier: MIT
// path::fused, room 3: the lane layout's register tiles of the two products, scores (q.k) and values (p v).
#pragma once

// What this room holds: the FMA micro-kernels of the lane layout, each a fully
// unrolled register tile with compile-time bounds (prefill: query rows along
// the lanes): score_micro, value_micro. The row layout's products (decode,
// Shaw) are in fused/row_products.hpp. Plus the helpers both layouts (and the
// backward pass) share: walking a range in register-tile steps, fetching cache
// lines, testing rows for finite values. Nothing here knows masks, biases or softmax.
// May include: fused/traits.hpp, fused/storage.hpp and core/.

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "posenc/attention/fused/storage.hpp"
#include "posenc/attention/fused/traits.hpp"
#include "posenc/core/simd.hpp"
#include "posenc/core/span.hpp"

namespace posenc::detail::fused {

/// Calls f(row, std::integral_constant<int, N'>) once for the tail of `rem`
/// rows at `r` with the compile-time N' == rem (rem <= N).
template <int N, class F>
POSENC_ALWAYS_INLINE void tail_block(index_t rem, index_t r, F& f) noexcept {
  if constexpr (N >= 1) {
    if (rem == N)
      f(r, std::integral_constant<int, N>{});
    else
      tail_block<N - 1>(rem, r, f);
  } else {
    (void)rem, (void)r, (void)f;
  }
}

/// Calls f(row, std::integral_constant<int, MR>) over [0, n) in blocks of MR
/// rows, the tail with a smaller compile-time block.
template <int MR, class F>
POSENC_ALWAYS_INLINE void row_blocks(index_t n, F&& f) noexcept {
  index_t r = 0;
  for (; r + MR <= n; r += MR) f(r, std::integral_constant<int, MR>{});
  if (r < n) tail_block<MR - 1>(n - r, r, f);
}

/// Largest of 8, 4, 2, 1 such that `per` accumulators per unit plus `extra`
/// operand registers fit the register file (and at most `cap`).
template <class Tr>
constexpr int register_block(int per, int extra, index_t cap) noexcept {
  for (int u : {8, 4, 2}) {
    if (u <= cap && per * u + extra <= Tr::registers_v) return u;
  }
  return 1;
}

/// Asks for the cache line at `at` (a software prefetch: never faults, never
/// changes a result), into L2 rather than L1 (locality 1: prefetcht2 on x86).
/// A fetch into L1 holds one of the core's few L1 miss buffers until its line
/// arrives, and the decode walks issue one per line they load: on a Zen 4
/// core that capped a decode near half the core's read bandwidth, and a fetch
/// into L2 took the 16-bit kv_cache decode from 1.8 to 2.1 times the read of
/// its bytes to 1.5 (docs/performance-log.md); the L1 prefetcher brings the lines
/// on from L2 as the step loads them.
template <class S>
POSENC_ALWAYS_INLINE void fetch_line(S const* at) noexcept {
#if defined(__GNUC__) || defined(__clang__)
  __builtin_prefetch(at, 0, 1);
#else
  (void)at;
#endif
}

/// Elements of S in a cache line: the row kernels fetch a row of the next
/// step once per line they load of this step's row.
template <class S>
inline constexpr index_t line_elements_v = 64 / static_cast<index_t>(sizeof(S));

/// Every element of n rows of `len` values, `ld` apart, is finite (no NaN,
/// no Inf); the rows are of storage type S (T, or a 16-bit type).
template <class Tr, class S>
inline bool rows_finite(S const* x, index_t ld, index_t n, index_t len) noexcept {
  using T = typename Tr::value_type;
  using B = typename Tr::batch;
  using A = typename Tr::arch;
  constexpr index_t w_v = Tr::width_v;
  B acc(T(0));  // x * 0 is 0 for finite x, NaN for NaN and Inf
  bool finite = true;
  for (index_t j = 0; j < n; ++j) {
    S const* r = x + j * ld;
    index_t d = 0;
    for (; d + w_v <= len; d += w_v) acc = simd::fma(load_stored<T, A>(r + d), B(T(0)), acc);
    for (; d < len; ++d) finite = finite && std::isfinite(stored_value<T>(r[d]));
  }
  return finite && simd::reduce_add(acc) == T(0);
}

/// Asks for the cache lines of n rows of `len` elements, `stride` apart.
template <class T>
inline void prefetch_rows(T const* p, index_t stride, index_t n, index_t len) noexcept {
  for (index_t j = 0; j < n; ++j)
    for (index_t e = 0; e < len; e += line_elements_v<T>) fetch_line(p + j * stride + e);
}

// ---------------------------------------------------------------------------
// Lane layout.

/// st[r][lanes] = sum_d k[r][d] * qt[d][lanes] for MR key rows and MQ lane vectors.
template <class Tr, int MR, int MQ>
POSENC_ALWAYS_INLINE void score_micro(typename Tr::value_type const* k, index_t ldk, typename Tr::value_type const* qt,
                        index_t ldq, index_t head_dim, typename Tr::value_type* st, index_t lds) noexcept {
  using T = typename Tr::value_type;
  using B = typename Tr::batch;
  constexpr index_t w_v = Tr::width_v;
  B acc[size_v<MR>][size_v<MQ>];
  for (int r = 0; r < MR; ++r)
    for (int m = 0; m < MQ; ++m) acc[r][m] = B(T(0));
  T const* kr[size_v<MR>];
  for (int r = 0; r < MR; ++r) kr[r] = k + r * ldk;
  for (index_t d = 0; d < head_dim; ++d) {
    B qv[size_v<MQ>];
    for (int m = 0; m < MQ; ++m) qv[m] = simd::load<T, typename Tr::arch>(qt + d * ldq + m * w_v);
    for (int r = 0; r < MR; ++r) {
      B const kb(kr[r][d]);
      for (int m = 0; m < MQ; ++m) acc[r][m] = simd::fma(kb, qv[m], acc[r][m]);
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int m = 0; m < MQ; ++m) simd::store(st + r * lds + m * w_v, acc[r][m]);
}

/// st[r][lanes] += c[o - r + lanes] + sum_d qt[d][lanes] * rt[d][o - r + lanes] for
/// MR key rows and MQ lane vectors: a relative-key term whose table rt
/// (head_dim, ldr) and per-distance term c are indexed by lane - key (lanes at
/// consecutive query positions, keys at consecutive key positions), so each
/// lane vector reads one contiguous run of a table row.
template <class Tr, int MR, int MQ>
POSENC_ALWAYS_INLINE void position_micro(typename Tr::value_type const* rt, index_t ldr,
                                         typename Tr::value_type const* c, typename Tr::value_type const* qt,
                                         index_t ldq, index_t head_dim, typename Tr::value_type* st,
                                         index_t lds) noexcept {
  using T = typename Tr::value_type;
  using B = typename Tr::batch;
  using A = typename Tr::arch;
  constexpr index_t w_v = Tr::width_v;
  B acc[size_v<MR>][size_v<MQ>];
  for (int r = 0; r < MR; ++r)
    for (int m = 0; m < MQ; ++m) acc[r][m] = simd::load<T, A>(c - r + m * w_v);
  for (index_t d = 0; d < head_dim; ++d) {
    B qv[size_v<MQ>];
    for (int m = 0; m < MQ; ++m) qv[m] = simd::load<T, A>(qt + d * ldq + m * w_v);
    T const* row = rt + d * ldr;
    for (int r = 0; r < MR; ++r)
      for (int m = 0; m < MQ; ++m) acc[r][m] = simd::fma(simd::load<T, A>(row - r + m * w_v), qv[m], acc[r][m]);
  }
  for (int r = 0; r < MR; ++r)
    for (int m = 0; m < MQ; ++m)
      simd::store(st + r * lds + m * w_v, simd::load<T, A>(st + r * lds + m * w_v) + acc[r][m]);
}

/// ot[r][lanes] = alpha[lanes] * ot[r][lanes] + sum_j v[j][r] * pt[j][lanes]
/// for MR output dims (v points at dim d0 of key row 0) and MQ lane vectors.
/// `Guarded`: a key adds nothing to a lane where its probability is 0, even
/// when its value is NaN or Inf (0 * NaN would be NaN); for tiles whose V is
/// not all finite.
template <class Tr, int MR, int MQ, bool Guarded = false>
POSENC_ALWAYS_INLINE void value_micro(typename Tr::value_type const* v, index_t ldv, index_t nk,
                        typename Tr::value_type const* pt, index_t ldp, typename Tr::value_type const* alpha,
                        typename Tr::value_type* ot, index_t ldo) noexcept {
  using T = typename Tr::value_type;
  using B = typename Tr::batch;
  using A = typename Tr::arch;
  constexpr index_t w_v = Tr::width_v;
  B acc[size_v<MR>][size_v<MQ>];
  B al[size_v<MQ>];
  for (int m = 0; m < MQ; ++m) al[m] = simd::load<T, A>(alpha + m * w_v);
  for (int r = 0; r < MR; ++r)
    for (int m = 0; m < MQ; ++m) acc[r][m] = simd::load<T, A>(ot + r * ldo + m * w_v) * al[m];
  for (index_t j = 0; j < nk; ++j) {
    B pv[size_v<MQ>];
    for (int m = 0; m < MQ; ++m) pv[m] = simd::load<T, A>(pt + j * ldp + m * w_v);
    T const* vj = v + j * ldv;
    if constexpr (Guarded) {
      decltype(pv[0] != pv[0]) seen[size_v<MQ>];
      for (int m = 0; m < MQ; ++m) seen[m] = pv[m] != B(T(0));
      for (int r = 0; r < MR; ++r) {
        B const vb(vj[r]);
        for (int m = 0; m < MQ; ++m) acc[r][m] = simd::select(seen[m], simd::fma(vb, pv[m], acc[r][m]), acc[r][m]);
      }
    } else {
      for (int r = 0; r < MR; ++r) {
        B const vb(vj[r]);
        for (int m = 0; m < MQ; ++m) acc[r][m] = simd::fma(vb, pv[m], acc[r][m]);
      }
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int m = 0; m < MQ; ++m) simd::store(ot + r * ldo + m * w_v, acc[r][m]);
}

}  // namespace posenc::detail::fused
