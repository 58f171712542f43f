// SPDX-License-Identifier: MIT
// path::fused, room 3c: the row layout's products, scores (q.k) and values (p v), over strided or gathered rows.
#pragma once

// What this room holds: the row layout's products (decode, Shaw: keys or
// output dims along the lanes), register tiles with compile-time bounds:
// row_scores (one row in memory order, one_row_scores, or rows side by side,
// side_scores) and row_values, over rows `ld` apart (strided_rows) or gathered
// one pointer each (listed_rows, paged decode). The register-tile walks and
// cache-line fetches they use are in fused/micro_kernels.hpp. Nothing here
// knows masks, biases or softmax.
// May include: fused/traits.hpp, fused/storage.hpp, fused/micro_kernels.hpp and core/.

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "posenc/attention/fused/micro_kernels.hpp"
#include "posenc/attention/fused/storage.hpp"
#include "posenc/attention/fused/traits.hpp"
#include "posenc/core/half.hpp"
#include "posenc/core/simd.hpp"
#include "posenc/core/span.hpp"

namespace posenc::detail::fused {

/// Rows `ld` elements apart (a strided view, a tile): row j at base + j * ld.
template <class S>
struct strided_rows {
  using value_type = S;
  S const* base;
  index_t ld;
  POSENC_ALWAYS_INLINE S const* operator()(index_t j) const noexcept { return base + j * ld; }
};

/// Rows with one pointer each (rows gathered from pages): row j at at[j] + offset.
template <class S>
struct listed_rows {
  using value_type = S;
  S const* const* at;
  index_t offset;
  POSENC_ALWAYS_INLINE S const* operator()(index_t j) const noexcept { return at[j] + offset; }
};

/// s[j0, j0 + n) from part[t] (per-lane partial sums of key t over the dims
/// [0, dim_w), the whole vectors of the head dim): the sums of width keys
/// reduced by one width x width transpose instead of a horizontal sum per
/// key; the dims past dim_w one by one (simd::fma_scalar: the lanes' rounding, the same bits
/// whatever the compiler contracts).
template <class Tr, class Rows>
POSENC_ALWAYS_INLINE void reduce_scores(typename Tr::value_type const (*part)[size_v<Tr::width_v>], index_t n,
                                        typename Tr::value_type const* q, Rows const& krow, index_t j0,
                                        index_t dim_w, index_t head_dim, typename Tr::value_type* s) noexcept {
  using T = typename Tr::value_type;
  using B = typename Tr::batch;
  using A = typename Tr::arch;
  constexpr index_t w_v = Tr::width_v;
  B blk[size_v<w_v>];
  for (index_t t = 0; t < w_v; ++t) blk[t] = t < n && dim_w > 0 ? simd::load<T, A>(part[t]) : B(T(0));
  simd::transpose(blk);
  B sum = blk[0];
  for (index_t t = 1; t < w_v; ++t) sum = sum + blk[t];
  if (dim_w < head_dim) {
    alignas(64) T tail[size_v<w_v>];
    for (index_t t = 0; t < w_v; ++t) {
      T x = 0;
      if (t < n)
        for (index_t e = dim_w; e < head_dim; ++e) x = simd::fma_scalar<A>(q[e], stored_value<T>(krow(j0 + t)[e]), x);
      tail[t] = x;
    }
    sum = sum + simd::load<T, A>(tail);
  }
  if (n == w_v)
    simd::store(s + j0, sum);
  else
    simd::store_partial(s + j0, sum, n);
}

/// s[j] = q . k_j for one query row and nk key rows, each key row read whole
/// before the next: in memory order, the order the hardware prefetchers
/// follow. The q row stays in registers (8 vectors at a time) and every key
/// keeps one accumulator over its dims in ascending order, the dims
/// [0, dim_p) in pairs of vectors in load_stored_pair's order (q put in it)
/// where the key storage has one, as side_scores does: both give the same
/// bits. Read side by side (8 rows, dim d of each, then d + width), the
/// kv_cache decodes from memory took 1.3 to 1.6 (float) and 1.3 to 1.4
/// (bfloat16) times the read of their bytes on a Zen 4 core; in memory order
/// about 1.0 to 1.1 (docs/performance-log.md).
template <class Tr, bool Fetch, class Rows, class FetchRows>
inline void one_row_scores(typename Tr::value_type const* q, Rows const& krow, FetchRows const& fetch_row,
                           index_t nk, index_t head_dim, typename Tr::value_type* s) noexcept {
  using T = typename Tr::value_type;
  using B = typename Tr::batch;
  using A = typename Tr::arch;
  using KS = typename Rows::value_type;
  constexpr index_t w_v = Tr::width_v;
  constexpr int qv_v = 8;  // q vectors held in registers (even: chunks start on a pair)
  constexpr bool pairs_v = pairs_permuted_v<T, A, KS>;
  index_t const dim_w = head_dim / w_v * w_v;
  alignas(64) T part[size_v<w_v>][size_v<w_v>];  // part[key][lane]: partial sums of w_v keys
  for (index_t j0 = 0; j0 < nk; j0 += w_v) {
    index_t const n = std::min(w_v, nk - j0);
    for (index_t dc = 0; dc < dim_w; dc += qv_v * w_v) {
      auto dims = [&](index_t, auto nv) {  // dims [dc, dc + nv * w_v) of the n keys
        constexpr int nv_v = decltype(nv)::value;
        // dim_p (the paired dims) is dim_w or dim_w - w_v, and every chunk
        // but the last is whole: the chunk's paired vectors are its first
        // nv_v rounded down to even.
        constexpr int np_v = pairs_v ? nv_v / 2 * 2 : 0;
        B qv[size_v<nv_v>];
        for (int c = 0; c < nv_v; ++c) qv[c] = simd::load<T, A>(q + dc + c * w_v);
        if constexpr (np_v > 0)
          for (int c = 0; c < np_v; c += 2) order_pair<T, A, KS>(qv[c], qv[c + 1]);
        for (index_t t = 0; t < n; ++t) {
          KS const* kr = krow(j0 + t) + dc;
          B acc = dc == 0 ? B(T(0)) : simd::load<T, A>(part[t]);
          if constexpr (np_v > 0) {
            for (int c = 0; c < np_v; c += 2) {
              B ka, kb;
              load_stored_pair<T, A>(kr + c * w_v, ka, kb);
              if constexpr (Fetch) {
                if ((dc + c * w_v) % line_elements_v<KS> == 0) fetch_line(fetch_row(j0 + t) + dc + c * w_v);
              }
              acc = simd::fma(qv[c + 1], kb, simd::fma(qv[c], ka, acc));
            }
          }
          for (int c = np_v; c < nv_v; ++c) {
            acc = simd::fma(qv[c], load_stored<T, A>(kr + c * w_v), acc);
            if constexpr (Fetch) {
              if ((dc + c * w_v) % line_elements_v<KS> == 0) fetch_line(fetch_row(j0 + t) + dc + c * w_v);
            }
          }
          simd::store(part[t], acc);
        }
      };
      tail_block<qv_v>(std::min<index_t>(qv_v, (dim_w - dc) / w_v), 0, dims);
    }
    reduce_scores<Tr>(part, n, q, krow, j0, dim_w, head_dim, s);
  }
}

/// s[g][j] = q_g . k_j for NG rows and nk keys, the key rows read side by
/// side: kj_v keys at a time keep NG * kj_v accumulators in registers (each
/// K row loaded once for all rows), dim d of each, then d + width.
template <class Tr, int NG, bool Fetch, class Rows, class FetchRows>
inline void side_scores(typename Tr::value_type const* const* qr, Rows const& krow, FetchRows const& fetch_row,
                        index_t nk, index_t head_dim, typename Tr::value_type* const* s) noexcept {
  using T = typename Tr::value_type;
  using B = typename Tr::batch;
  using A = typename Tr::arch;
  using KS = typename Rows::value_type;
  constexpr index_t w_v = Tr::width_v;
  constexpr int kj_v = register_block<Tr>(NG + 1, 2, w_v);
  constexpr bool pairs_v = pairs_permuted_v<T, A, KS> && NG == 1;  // see pairs_permuted_v
  index_t const dim_p = pairs_v ? head_dim / (2 * w_v) * (2 * w_v) : 0;
  index_t const dim_w = head_dim / w_v * w_v;
  alignas(64) T part[size_v<NG>][size_v<w_v>][size_v<w_v>];  // part[g][key][lane]: partial sums of w_v keys
  for (index_t j0 = 0; j0 < nk; j0 += w_v) {
    index_t const n = std::min(w_v, nk - j0);
    for (index_t jj = 0; jj < n; jj += kj_v) {
      B acc[size_v<NG>][size_v<kj_v>];
      KS const* kr[size_v<kj_v>];
      [[maybe_unused]] KS const* kn[size_v<kj_v>];  // the rows fetched (with Fetch)
      for (int t = 0; t < kj_v; ++t) {
        index_t const j = std::min(j0 + jj + t, nk - 1);  // past the tile: a repeat, discarded
        kr[t] = krow(j);
        if constexpr (Fetch) kn[t] = fetch_row(j);
        for (int g = 0; g < NG; ++g) acc[g][t] = B(T(0));
      }
      if constexpr (pairs_v) {  // the dims in load_stored_pair's order, q put in it
        for (index_t d = 0; d < dim_p; d += 2 * w_v) {
          B ka[size_v<kj_v>], kb[size_v<kj_v>];
          for (int t = 0; t < kj_v; ++t) load_stored_pair<T, A>(kr[t] + d, ka[t], kb[t]);
          if constexpr (Fetch) {
            if (d % line_elements_v<KS> == 0)
              for (int t = 0; t < kj_v; ++t) fetch_line(kn[t] + d);
          }
          B qa = simd::load<T, A>(qr[0] + d), qb = simd::load<T, A>(qr[0] + d + w_v);
          order_pair<T, A, KS>(qa, qb);
          for (int t = 0; t < kj_v; ++t) acc[0][t] = simd::fma(qb, kb[t], simd::fma(qa, ka[t], acc[0][t]));
        }
      }
      for (index_t d = dim_p; d < dim_w; d += w_v) {
        B kv[size_v<kj_v>];
        for (int t = 0; t < kj_v; ++t) kv[t] = load_stored<T, A>(kr[t] + d);
        if constexpr (Fetch) {
          if (d % line_elements_v<KS> == 0)
            for (int t = 0; t < kj_v; ++t) fetch_line(kn[t] + d);
        }
        for (int g = 0; g < NG; ++g) {
          B const qv = simd::load<T, A>(qr[g] + d);
          for (int t = 0; t < kj_v; ++t) acc[g][t] = simd::fma(qv, kv[t], acc[g][t]);
        }
      }
      for (int g = 0; g < NG; ++g)
        for (int t = 0; t < kj_v; ++t) simd::store(part[g][jj + t], acc[g][t]);
    }
    for (int g = 0; g < NG; ++g) reduce_scores<Tr>(part[g], n, qr[g], krow, j0, dim_w, head_dim, s[g]);
  }
}

/// s[g][j] = q_g . k_j for NG rows and nk keys, key row j at krow(j)
/// (strided_rows or listed_rows; rows of storage type T, or a 16-bit type
/// widened as loaded). One row over rows laid end to end (`end_to_end`: a
/// head-major cache, a page, a rotated tile) reads them in memory order
/// (one_row_scores); rows further apart (a token-major K, rows a whole
/// token apart) measured slower that way and, like several rows, are read
/// side by side (side_scores): the same bits either way.
/// `Fetch`: as key row j is loaded, the line at the same offset of
/// fetch_row(j) (a row further on in the walk, row_steps) is fetched, so
/// that the walk's reads are spread among its arithmetic.
template <class Tr, int NG, bool Fetch, class Rows, class FetchRows>
inline void row_scores(typename Tr::value_type const* const* qr, Rows const& krow, FetchRows const& fetch_row,
                       index_t nk, index_t head_dim, typename Tr::value_type* const* s, bool end_to_end) noexcept {
  if constexpr (NG == 1) {
    if (end_to_end) {
      one_row_scores<Tr, Fetch>(qr[0], krow, fetch_row, nk, head_dim, s[0]);
      return;
    }
  }
  side_scores<Tr, NG, Fetch>(qr, krow, fetch_row, nk, head_dim, s);
}

/// o_g = alpha_g * o_g + sum_j p_g[j] v_j over value_dim dims for NG rows
/// (o_g at o + g * value_dim), value row j at vrow(j) (strided_rows or
/// listed_rows; rows of storage type T, or a 16-bit type widened as loaded).
/// Each V row chunk is loaded once for all rows; the cw_v * NG accumulators
/// of a chunk stay in registers across the keys.
/// `Guarded`: keys with p_g[j] = 0 add nothing, even when v_j is NaN or Inf.
/// `Fetch`: the line at the same offset of fetch_row(j) is fetched as in
/// row_scores.
template <class Tr, int NG, bool Guarded, bool Fetch, class Rows, class FetchRows>
inline void row_values(typename Tr::value_type const* const* pr, typename Tr::value_type const* alpha,
                       Rows const& vrow, FetchRows const& fetch_row, index_t nk, index_t value_dim,
                       typename Tr::value_type* o) noexcept {
  using T = typename Tr::value_type;
  using B = typename Tr::batch;
  using A = typename Tr::arch;
  using VS = typename Rows::value_type;
  constexpr index_t w_v = Tr::width_v;
  constexpr int cw_v = register_block<Tr>(NG, NG + 2, 8);
  // One row (NG == 1) over V with a pair order of its own: o put in that
  // order as it is loaded, and back as it is stored. (Kept out of `chunk`:
  // GCC then calls `chunk` out of line for several rows, 7 to 14% slower
  // 16-bit GQA decode; docs/performance-log.md.)
  auto paired_chunk = [&](index_t d, auto cw) {
    constexpr int C = decltype(cw)::value;
    B acc[size_v<C>];
    for (int c = 0; c < C; ++c) acc[c] = simd::load<T, A>(o + d + c * w_v);
    for (int c = 0; c < C; c += 2) order_pair<T, A, VS>(acc[c], acc[c + 1]);
    for (int c = 0; c < C; ++c) acc[c] = acc[c] * B(alpha[0]);
    for (index_t j = 0; j < nk; ++j) {
      VS const* vj = vrow(j) + d;
      [[maybe_unused]] VS const* vn = nullptr;
      if constexpr (Fetch) vn = fetch_row(j) + d;
      T const p = pr[0][j];
      B const pj(p);
      for (int c = 0; c < C; c += 2) {
        B va, vb;
        load_stored_pair<T, A>(vj + c * w_v, va, vb);
        if constexpr (Fetch) {
          if ((d + c * w_v) % line_elements_v<VS> == 0) fetch_line(vn + c * w_v);
        }
        if (!Guarded || p != T(0)) {
          acc[c] = simd::fma(pj, va, acc[c]);
          acc[c + 1] = simd::fma(pj, vb, acc[c + 1]);
        }
      }
    }
    for (int c = 0; c < C; c += 2) unorder_pair<T, A, VS>(acc[c], acc[c + 1]);
    for (int c = 0; c < C; ++c) simd::store(o + d + c * w_v, acc[c]);
  };
  auto chunk = [&](index_t d, auto cw) {
    constexpr int C = decltype(cw)::value;
    if constexpr (pairs_permuted_v<T, A, VS> && NG == 1 && C % 2 == 0) {  // see pairs_permuted_v
      paired_chunk(d, cw);
      return;
    }
    B acc[size_v<NG>][size_v<C>];
    for (int g = 0; g < NG; ++g)
      for (int c = 0; c < C; ++c) acc[g][c] = simd::load<T, A>(o + g * value_dim + d + c * w_v) * B(alpha[g]);
    for (index_t j = 0; j < nk; ++j) {
      VS const* vj = vrow(j) + d;
      [[maybe_unused]] VS const* vn = nullptr;
      if constexpr (Fetch) vn = fetch_row(j) + d;
      B pj[size_v<NG>];
      for (int g = 0; g < NG; ++g) pj[g] = B(pr[g][j]);
      for (int c = 0; c < C; ++c) {
        B const vv = load_stored<T, A>(vj + c * w_v);
        if constexpr (Fetch) {
          if ((d + c * w_v) % line_elements_v<VS> == 0) fetch_line(vn + c * w_v);
        }
        for (int g = 0; g < NG; ++g) {
          if constexpr (Guarded)
            acc[g][c] = pr[g][j] != T(0) ? simd::fma(pj[g], vv, acc[g][c]) : acc[g][c];
          else
            acc[g][c] = simd::fma(pj[g], vv, acc[g][c]);
        }
      }
    }
    for (int g = 0; g < NG; ++g)
      for (int c = 0; c < C; ++c) simd::store(o + g * value_dim + d + c * w_v, acc[g][c]);
  };
  index_t d = 0;
  for (; d + cw_v * w_v <= value_dim; d += cw_v * w_v) chunk(d, std::integral_constant<int, cw_v>{});
  for (; d + w_v <= value_dim; d += w_v) chunk(d, std::integral_constant<int, 1>{});
  for (; d < value_dim; ++d) {
    for (int g = 0; g < NG; ++g) {
      T a = o[g * value_dim + d] * alpha[g];
      for (index_t j = 0; j < nk; ++j)
        if (!Guarded || pr[g][j] != T(0)) a = simd::fma_scalar<A>(pr[g][j], stored_value<T>(vrow(j)[d]), a);
      o[g * value_dim + d] = a;
    }
  }
}

}  // namespace posenc::detail::fused
