// SPDX-License-Identifier: MIT
// path::fused backward: flash-style tiles that recompute the probabilities from q, k and the log-sum-exp; no Sq x Sk buffer.
#pragma once

// How it runs (docs/backward.md):
//
//   1. row_statistics: per query row, lse (the given opt.lse, or recomputed by
//      one forward sweep over the row's key tiles with an online max and sum)
//      and Delta_i = dO_i . O_i. Tasks: (batch entry, query head).
//   2. Tasks (batch entry, kv head, key chunk): a task owns the dk and dv rows
//      of its chunk. For each key tile of the chunk it sweeps every query row
//      of every query head of the group in blocks (its q, dO rows and the
//      tile's k rows packed contiguously first): scores (tile_scores, the
//      forward pass's terms, softcap, bias and masks), P = exp(S - lse), dP =
//      dO V^T (+ Shaw's value term), dS = P (dP - Delta), the encoder's bias and
//      score hooks, the softcap derivative, then dV += P^T dO, dK += dS^T Q and
//      the chunk's dQ partial += dS K (tile_products, the register tiles of
//      backward/products.hpp).
//   3. sum_dq_partials: dq = the partials of the chunks, summed in chunk order.
//
// With a given lse (and io.check_lse), step 2 also sums each row's P over its chunk's keys and
// writes dk, dv into a scratch copy; between steps 2 and 3 every row's sum is checked
// (check_lse_row: 1 within the float rule, 0 for lse = -inf), and only then are dk, dv copied out
// and dq written. The added work is O(rows x keys), on the probabilities step 2 computes anyway,
// plus one copy of dk and dv; without a given lse nothing changes.
//
// No atomics: every output element has one writer; encoder gradients go into
// zeroed per-task copies added in task order. The chunk count depends only on
// the thread count, so a given thread count gives the same bits every run.
// Memory: per task O(tile) scratch; per call the statistics (2 x B x Hq x Sq)
// and the dQ partials (chunks x B x Hq x Sq x D); nothing grows with Sq x Sk.

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "posenc/attention/backward/plan.hpp"
#include "posenc/attention/backward/products.hpp"
#include "posenc/attention/fused/micro_kernels.hpp"
#include "posenc/attention/fused/traits.hpp"
#include "posenc/attention/plan.hpp"
#include "posenc/core/aligned_buffer.hpp"
#include "posenc/core/simd.hpp"
#include "posenc/core/threading.hpp"
#if POSENC_COMPILED
#include "posenc/compiled/backward.hpp"
#endif

namespace posenc::detail::fused_backward {

/// Tile shape of the fused backward: query rows per block and keys per tile.
inline constexpr index_t block_rows_v = 64;
inline constexpr index_t block_keys_v = 64;

/// Per-task scratch of one (row block, key tile) pair, sized by the tile constants and the head dims only.
template <class T>
struct tile_scratch {
  // 64-byte aligned: the tiles' rows are whole vectors, loaded without crossing a cache line.
  aligned_buffer<T> s, th, dp, tmp, dpt, dk, dv, kt, vt, qb, ob, kr;
  tile_scratch(index_t head_dim, index_t value_dim)
      : s(block_rows_v * block_keys_v),
        th(block_rows_v * block_keys_v),
        dp(block_rows_v * block_keys_v),
        tmp(block_keys_v),
        dpt(block_keys_v),
        dk(block_keys_v * head_dim),
        dv(block_keys_v * value_dim),
        kt((head_dim + 1) * block_keys_v),  // one row more: reads past a sub-range
        vt((value_dim + 1) * block_keys_v),
        qb(block_rows_v * head_dim),
        ob(block_rows_v * value_dim),
        kr(block_keys_v * head_dim) {}
};

/// The union [first, last) of the keys of [j0, j1) that rows i0 .. i0 + nr - 1 may see (ignoring masks).
template <class T>
key_range block_key_range(attention_plan<T> const& p, index_t b, index_t i0, index_t nr, index_t j0,
                          index_t j1) noexcept {
  key_range u{j1, j0, false};
  for (index_t r = 0; r < nr; ++r) {
    key_range const kr = p.visible_range(b, i0 + r, j0, j1);
    if (kr.empty()) continue;
    u.first = std::min(u.first, kr.first);
    u.last = std::max(u.last, kr.last);
  }
  if (u.last < u.first) u.last = u.first;
  return u;
}

/// n rows of `len` values (`ld` apart) packed `len` apart into xp: the rows of a block or tile, which
/// are a head's stride apart in the views (often a multiple of 4 KiB, so they would share L1 sets).
template <class T>
void pack_rows(T const* x, index_t ld, index_t n, index_t len, T* xp) noexcept {
  for (index_t t = 0; t < n; ++t) std::copy(x + t * ld, x + t * ld + len, xp + t * len);
}

/// x^T of n rows of `len` values (`ld` apart) into xt[len][block_keys_v]; columns n .. of each
/// vector-padded row are zeros.
template <class Tr, class T>
void transpose_tile(T const* x, index_t ld, index_t n, index_t len, T* xt) noexcept {
  index_t const padded = std::min(block_keys_v, (n + Tr::width_v - 1) / Tr::width_v * Tr::width_v);
  for (index_t t = 0; t < n; ++t) {
    T const* row = x + t * ld;
    for (index_t d = 0; d < len; ++d) xt[d * block_keys_v + t] = row[d];
  }
  for (index_t d = 0; d < len; ++d) std::fill(xt + d * block_keys_v + n, xt + d * block_keys_v + padded, T(0));
}

/// s[g][0 .. nk) = sum_d x_g[d] * yt[d][0 .. nk) for NG rows: keys along the lanes of cv_v vectors, one
/// broadcast of x_g[d] per vector of yt; no horizontal sums. yt rows are block_keys_v apart.
template <class Tr, int NG>
POSENC_ALWAYS_INLINE void lane_scores(typename Tr::value_type const* const* xr, typename Tr::value_type const* yt,
                                      index_t nk, index_t len, typename Tr::value_type* const* s) noexcept {
  using T = typename Tr::value_type;
  using B = typename Tr::batch;
  using A = typename Tr::arch;
  constexpr index_t w_v = Tr::width_v;
  constexpr int cv_v = NG * 4 + 4 + NG <= Tr::registers_v ? 4 : NG * 2 + 2 + NG <= Tr::registers_v ? 2 : 1;
  auto chunk = [&](index_t c0, auto cv) {
    constexpr int C = decltype(cv)::value;
    B acc[fused::size_v<NG>][fused::size_v<C>];
    for (int g = 0; g < NG; ++g)
      for (int c = 0; c < C; ++c) acc[g][c] = B(T(0));
    for (index_t d = 0; d < len; ++d) {
      T const* yd = yt + d * block_keys_v + c0;
      B y[fused::size_v<C>];
      for (int c = 0; c < C; ++c) {
        y[c] = simd::load<T, A>(yd + c * w_v);
        simd::keep_in_register(y[c]);  // one load for the NG FMAs, not one folded into each
      }
      for (int g = 0; g < NG; ++g) {
        B const xv(xr[g][d]);
        for (int c = 0; c < C; ++c) acc[g][c] = simd::fma(xv, y[c], acc[g][c]);
      }
    }
    for (int g = 0; g < NG; ++g)
      for (int c = 0; c < C; ++c) simd::store(s[g] + c0 + c * w_v, acc[g][c]);
  };
  index_t const padded = (nk + w_v - 1) / w_v * w_v;
  index_t c0 = 0;
  for (; c0 + cv_v * w_v <= padded; c0 += cv_v * w_v) chunk(c0, std::integral_constant<int, cv_v>{});
  for (; c0 < padded; c0 += w_v) chunk(c0, std::integral_constant<int, 1>{});
}

/// s[r][0 .. nk) = x_r . y_t for rows x_r = x + r * ldx, r < nr, and the keys of yt (transposed,
/// len x block_keys_v), in groups of row_group_v rows.
template <class Tr, class T>
void block_products(T const* x, index_t ldx, index_t nr, T const* yt, index_t nk, index_t len, T* s) noexcept {
  fused::row_blocks<static_cast<int>(Tr::row_group_v)>(nr, [&](index_t r0, auto ng) {
    constexpr int NG = decltype(ng)::value;
    T const* xr[static_cast<std::size_t>(NG)];
    T* sr[static_cast<std::size_t>(NG)];
    for (int g = 0; g < NG; ++g) {
      xr[g] = x + (r0 + g) * ldx;
      sr[g] = s + (r0 + g) * block_keys_v;
    }
    lane_scores<Tr, NG>(xr, yt, nk, len, sr);
  });
}

/// Scores of rows i0 .. i0 + nr - 1 (head h; their q at qr, ldq apart) for keys j0 .. j0 + nk - 1 (transposed in kt) into
/// s[r * block_keys_v + t], formed as the forward pass forms them (scaled, Shaw, softcap with tanh
/// kept in th, bias, masks).
template <class Tr, class T, class E>
void tile_scores(attention_plan<T> const& p, backward_views<T> const& io, E const& enc, index_t b, index_t h,
                 index_t i0, index_t nr, T const* qr, index_t ldq, index_t j0, index_t nk, T const* kt, T* s, T* th,
                 T* tmp) noexcept {
  using traits = encoder_traits<E>;
  block_products<Tr>(qr, ldq, nr, kt, nk, p.head_dim, s);
  T const scale = static_cast<T>(p.scale), cap = static_cast<T>(p.softcap);
  for (index_t r = 0; r < nr; ++r) {
    index_t const i = i0 + r;
    T* row = s + r * block_keys_v;
    for (index_t t = 0; t < nk; ++t) row[t] *= scale;
    if constexpr (traits::relative_key_value) {
      encoder_terms<score_term::shaw>(p, enc, io.q.ptr(b, i, h), b, h, i, j0, nk, tmp);
      for (index_t t = 0; t < nk; ++t) row[t] += tmp[t];
    }
    if (cap > 0) {
      T* tr = th + r * block_keys_v;
      for (index_t t = 0; t < nk; ++t) {
        tr[t] = std::tanh(row[t] / cap);
        row[t] = cap * tr[t];
      }
    }
    if constexpr (traits::biases_scores) {
      encoder_terms<score_term::bias>(p, enc, io.q.ptr(b, i, h), b, h, i, j0, nk, tmp);
      for (index_t t = 0; t < nk; ++t) row[t] += tmp[t];
    }
    apply_masks(p, b, h, i, j0, nk, row);
  }
}

/// Phase 1 for (b, h): lse (given, or recomputed by an online max and sum over the key tiles) and
/// Delta = dO . O of every row, into lse_out[Sq] and delta_out[Sq]. A given lse beyond
/// lse_trusted_limit (while it is checked) is replaced by the row's own, and own_out[i] (else NaN)
/// keeps that own lse for the check of the given one.
template <class Tr, class T, class E>
void own_row_lse(attention_plan<T> const& p, backward_views<T> const& io, E const& enc, index_t b, index_t h,
                 tile_scratch<T>& sc, T* lse_out) noexcept;

template <class Tr, class T, class E>
void row_statistics(attention_plan<T> const& p, backward_views<T> const& io, E const& enc, index_t b, index_t h,
                    tile_scratch<T>& sc, T* lse_out, T* delta_out, T* own_out) noexcept {
  index_t const Sq = p.q_len, Dv = p.value_dim;
  for (index_t i = 0; i < Sq; ++i) {
    T const* o = io.out.ptr(b, i, h);
    T const* d = io.dout.ptr(b, i, h);
    // The FMAs of dP = dO V^T (lane_scores) in the same order: where a row sees one key, O is that
    // key's value and Delta equals its dP bit for bit, so dS is exactly 0 as it should be.
    T acc = 0;
    for (index_t e = 0; e < Dv; ++e) acc = simd::fma_scalar<typename Tr::arch>(d[e], o[e], acc);
    delta_out[i] = acc;
  }
  std::fill(own_out, own_out + Sq, std::numeric_limits<T>::quiet_NaN());
  if (p.lse) {
    T const* given = p.lse + (b * p.q_heads + h) * Sq;
    bool any_own = false;
    for (index_t i = 0; i < Sq; ++i) any_own = any_own || (io.check_lse && !lse_trusted<T>(given[i]));
    if (!any_own) {
      std::copy(given, given + Sq, lse_out);
      return;
    }
    own_row_lse<Tr>(p, io, enc, b, h, sc, lse_out);
    for (index_t i = 0; i < Sq; ++i) {
      if (lse_trusted<T>(given[i])) {
        lse_out[i] = given[i];
      } else {
        own_out[i] = lse_out[i];
      }
    }
    return;
  }
  own_row_lse<Tr>(p, io, enc, b, h, sc, lse_out);
}

/// The own lse of every row of (b, h), by an online max and sum over the key tiles, into lse_out[Sq].
template <class Tr, class T, class E>
void own_row_lse(attention_plan<T> const& p, backward_views<T> const& io, E const& enc, index_t b, index_t h,
                 tile_scratch<T>& sc, T* lse_out) noexcept {
  T const ninf = -std::numeric_limits<T>::infinity();
  index_t const Sq = p.q_len, Sk = p.k_len;
  for (index_t i0 = 0; i0 < Sq; i0 += block_rows_v) {
    index_t const nr = std::min(block_rows_v, Sq - i0);
    T m[block_rows_v], l[block_rows_v];
    std::fill(m, m + nr, ninf);
    std::fill(l, l + nr, T(0));
    key_range const u = block_key_range(p, b, i0, nr, 0, Sk);
    for (index_t j0 = u.first; j0 < u.last; j0 += block_keys_v) {
      index_t const nk = std::min(block_keys_v, u.last - j0);
      transpose_tile<Tr>(io.k.ptr(b, j0, p.kv_head(h)), io.k.seq_stride, nk, p.head_dim, sc.kt.data());
      tile_scores<Tr>(p, io, enc, b, h, i0, nr, io.q.ptr(b, i0, h), io.q.seq_stride, j0, nk, sc.kt.data(),
                      sc.s.data(), sc.th.data(), sc.tmp.data());
      for (index_t r = 0; r < nr; ++r) {
        T const* row = sc.s.data() + r * block_keys_v;
        T mt = m[r];
        for (index_t t = 0; t < nk; ++t) mt = row[t] > mt ? row[t] : mt;  // skips NaN; NaN m[r] stays
        if (mt == ninf) {
          // No visible score in the row so far, or only NaN ones (a NaN in q or k): a NaN makes the
          // row's m and l NaN, which later tiles keep, so its lse and gradients are NaN as its
          // forward output is. Tested once per row and tile, only here: rows with a finite
          // score find a NaN through their sum below.
          bool has_nan = false;
          for (index_t t = 0; t < nk; ++t) has_nan = has_nan || row[t] != row[t];
          if (!has_nan) continue;
          m[r] = l[r] = std::numeric_limits<T>::quiet_NaN();
          continue;
        }
        T sum = m[r] == ninf ? T(0) : l[r] * std::exp(m[r] - mt);
        for (index_t t = 0; t < nk; ++t) sum += row[t] == ninf ? T(0) : std::exp(row[t] - mt);
        m[r] = mt;
        l[r] = sum;
      }
    }
    for (index_t r = 0; r < nr; ++r) lse_out[i0 + r] = m[r] == ninf ? ninf : m[r] + std::log(l[r]);
  }
}

/// P = exp(S - lse) in place over nk keys (0 where S is -inf or the row has no visible key);
/// returns their sum (in vector lanes, then across them), for the check of a given lse.
template <class Tr, class T>
T tile_probabilities(T* row, index_t nk, T lse) noexcept {
  using B = typename Tr::batch;
  using A = typename Tr::arch;
  constexpr index_t w_v = Tr::width_v;
  T const ninf = -std::numeric_limits<T>::infinity();
  if (lse == ninf) {
    std::fill(row, row + nk, T(0));
    return T(0);
  }
  index_t t = 0;
  B const vl(lse), vninf(ninf), zero(T(0));
  B acc(T(0));
  for (; t + w_v <= nk; t += w_v) {
    B const x = simd::load<T, A>(row + t);
    B const pr = simd::select(x == vninf, zero, simd::exp(x - vl));
    simd::store(row + t, pr);
    acc += pr;
  }
  T sum = simd::reduce_add(acc);
  for (; t < nk; ++t) {
    row[t] = row[t] == ninf ? T(0) : std::exp(row[t] - lse);
    sum += row[t];
  }
  return sum;
}

/// dS of one row from P and dP (dP zeroed where P is 0, plus Shaw's value term), through the encoder's
/// bias hook and the softcap derivative to d(raw); Shaw's score hook adds its part to dq_row. Leaves
/// scale * d(raw) in dp.
template <class T, class E>
void tile_row_gradient(attention_plan<T> const& p, backward_views<T> const& io, E const& enc, index_t b,
                       index_t h, index_t i, index_t j0, index_t nk, T const* prob, T* dp, T const* th, T delta,
                       T* dpt, T* dq_row, encoder_gradients_t<E>& g) noexcept {
  using traits = encoder_traits<E>;
  if constexpr (traits::relative_key_value) {
    std::fill(dpt, dpt + nk, T(0));
    encoder_value_backward(p, enc, prob, io.dout.ptr(b, i, h), b, i, j0, nk, dpt, g);
    for (index_t t = 0; t < nk; ++t) dp[t] += dpt[t];
  } else {
    (void)dpt, (void)dq_row;
  }
  for (index_t t = 0; t < nk; ++t) dp[t] = prob[t] != T(0) ? prob[t] * (dp[t] - delta) : T(0);
  if constexpr (traits::biases_scores) encoder_bias_backward(p, enc, b, h, i, j0, nk, dp, g);
  if (p.softcap > 0) {
    for (index_t t = 0; t < nk; ++t) dp[t] = prob[t] != T(0) ? dp[t] * (T(1) - th[t] * th[t]) : T(0);
  }
  if constexpr (traits::relative_key_value)
    encoder_score_backward(p, enc, io.q.ptr(b, i, h), b, i, j0, nk, dp, dq_row, g);
  T const scale = static_cast<T>(p.scale);
  for (index_t t = 0; t < nk; ++t) dp[t] *= scale;
}

/// The three accumulating products of one (row block, nk keys): dV += P^T dO and
/// dK += dS^T Q into the tile accumulators from key `off` of the tile on, dQ += dS K into dq_rows.
/// P and dS are read by column for the first two (no transposed copies); q, dO and k rows come packed
/// (sc.qb, sc.ob, and sc.kr from key `off` on).
template <class Tr, class T>
void tile_products(index_t nr, index_t nk, index_t D, index_t Dv, tile_scratch<T>& sc, T* dq_rows, bool keys_finite,
                   bool rows_finite, index_t off) noexcept {
  constexpr int NG = product_rows_v<Tr>;
  T const* const prob = sc.s.data();
  T const* const ds = sc.dp.data();
  fused::row_blocks<NG>(nk, [&](index_t t0, auto ng) {
    constexpr int G = decltype(ng)::value;
    T const* pr[static_cast<std::size_t>(G)];
    T const* dr[static_cast<std::size_t>(G)];
    for (int g = 0; g < G; ++g) {
      pr[g] = prob + t0 + g;  // column t0 + g of P: stride block_keys_v over the rows
      dr[g] = ds + t0 + g;
    }
    T* const dv = sc.dv.data() + (off + t0) * Dv;
    T* const dk = sc.dk.data() + (off + t0) * D;
    if (rows_finite) {
      add_row_products<Tr, G>(pr, block_keys_v, sc.ob.data(), Dv, nr, Dv, dv);
      add_row_products<Tr, G>(dr, block_keys_v, sc.qb.data(), D, nr, D, dk);
    } else {  // a row with NaN or Inf in q or dO that sees no key of the tile adds nothing
      add_row_products<Tr, G, true>(pr, block_keys_v, sc.ob.data(), Dv, nr, Dv, dv);
      add_row_products<Tr, G, true>(dr, block_keys_v, sc.qb.data(), D, nr, D, dk);
    }
  });
  T const* kt = sc.kr.data() + off * D;
  fused::row_blocks<NG>(nr, [&](index_t r0, auto ng) {
    constexpr int G = decltype(ng)::value;
    T const* dr[static_cast<std::size_t>(G)];
    for (int g = 0; g < G; ++g) dr[g] = ds + (r0 + g) * block_keys_v;
    if (keys_finite)
      add_row_products<Tr, G>(dr, 1, kt, D, nk, D, dq_rows + r0 * D);
    else  // a key with NaN or Inf (masked) adds nothing where its dS is 0
      add_row_products<Tr, G, true>(dr, 1, kt, D, nk, D, dq_rows + r0 * D);
  });
}

/// Phase 2 for (b, hk, keys [c0, c1)): dk, dv of those keys; the chunk's dQ partial (zeroed first) of
/// every query head of the group, at dq_part + (h - h0) * Sq * D.
/// dk, dv go to dk_out, dv_out (io.dk, io.dv, or their scratch copy while a given lse is checked).
/// row_sums, when non-null: the chunk's sum_j exp(s_ij - lse_i) of every row of the group, at
/// row_sums + (h - h0) * Sq (zeroed first).
template <class Tr, class T, class E>
void key_chunk(attention_plan<T> const& p, backward_views<T> const& io, E const& enc, index_t b, index_t hk,
               index_t c0, index_t c1, T const* lse, T const* delta, tile_scratch<T>& sc, T* dq_part,
               view<T> const& dk_out, view<T> const& dv_out, T* row_sums, encoder_gradients_t<E>& g) noexcept {
  T const ninf = -std::numeric_limits<T>::infinity();
  index_t const Sq = p.q_len, D = p.head_dim, Dv = p.value_dim;
  index_t const h0 = hk * p.group, h_end = std::min((hk + 1) * p.group, p.q_heads);
  std::fill(dq_part, dq_part + std::max<index_t>(0, h_end - h0) * Sq * D, T(0));
  if (row_sums) std::fill(row_sums, row_sums + std::max<index_t>(0, h_end - h0) * Sq, T(0));
  for (index_t j0 = c0; j0 < c1; j0 += block_keys_v) {
    index_t const nk = std::min(block_keys_v, c1 - j0);
    std::fill(sc.dk.begin(), sc.dk.end(), T(0));
    std::fill(sc.dv.begin(), sc.dv.end(), T(0));
    bool const keys_finite = fused::rows_finite<Tr>(io.k.ptr(b, j0, hk), io.k.seq_stride, nk, D);
    transpose_tile<Tr>(io.k.ptr(b, j0, hk), io.k.seq_stride, nk, D, sc.kt.data());
    transpose_tile<Tr>(io.v.ptr(b, j0, hk), io.v.seq_stride, nk, Dv, sc.vt.data());
    pack_rows(io.k.ptr(b, j0, hk), io.k.seq_stride, nk, D, sc.kr.data());
    for (index_t h = h0; h < h_end; ++h) {
      T const* lse_h = lse + (b * p.q_heads + h) * Sq;
      T const* delta_h = delta + (b * p.q_heads + h) * Sq;
      T* dq_h = dq_part + (h - h0) * Sq * D;
      for (index_t i0 = 0; i0 < Sq; i0 += block_rows_v) {
        index_t const nr = std::min(block_rows_v, Sq - i0);
        key_range const u = block_key_range(p, b, i0, nr, j0, j0 + nk);
        if (u.empty()) continue;  // no row of the block sees a key of the tile
        index_t const k0 = u.first, nu = u.last - u.first;
        pack_rows(io.q.ptr(b, i0, h), io.q.seq_stride, nr, D, sc.qb.data());
        pack_rows(io.dout.ptr(b, i0, h), io.dout.seq_stride, nr, Dv, sc.ob.data());
        tile_scores<Tr>(p, io, enc, b, h, i0, nr, sc.qb.data(), D, k0, nu, sc.kt.data() + (k0 - j0), sc.s.data(),
                        sc.th.data(), sc.tmp.data());
        block_products<Tr>(sc.ob.data(), Dv, nr, sc.vt.data() + (k0 - j0), nu, Dv, sc.dp.data());  // dP = dO V^T
        for (index_t r = 0; r < nr; ++r) {
          T* prob = sc.s.data() + r * block_keys_v;
          T const lse_i = lse_h[i0 + r];
          if (row_sums && lse_i == ninf) {
            // The check of a given lse of -inf: the scores, before tile_probabilities zeroes them, must
            // all be -inf (the row sees no key).
            T add = 0;
            for (index_t t = 0; t < nu; ++t) add += prob[t] == ninf ? T(0) : std::exp(prob[t] - lse_i);
            row_sums[(h - h0) * Sq + i0 + r] += add;
          }
          T const row_sum = tile_probabilities<Tr>(prob, nu, lse_i);
          if (row_sums && lse_i != ninf) row_sums[(h - h0) * Sq + i0 + r] += row_sum;  // sum_j exp(s_ij - lse_i)
          tile_row_gradient(p, io, enc, b, h, i0 + r, k0, nu, prob, sc.dp.data() + r * block_keys_v,
                            sc.th.data() + r * block_keys_v, delta_h[i0 + r], sc.dpt.data(),
                            dq_h + (i0 + r) * D, g);
        }
        // The products write keys k0 - j0 onward of the tile accumulators.
        bool const rows_finite = fused::rows_finite<Tr>(io.q.ptr(b, i0, h), io.q.seq_stride, nr, D) &&
                                 fused::rows_finite<Tr>(io.dout.ptr(b, i0, h), io.dout.seq_stride, nr, Dv);
        tile_products<Tr>(nr, nu, D, Dv, sc, dq_h + i0 * D, keys_finite, rows_finite, k0 - j0);
      }
    }
    for (index_t t = 0; t < nk; ++t) {
      T* dkj = dk_out.ptr(b, j0 + t, hk);
      T* dvj = dv_out.ptr(b, j0 + t, hk);
      std::copy(sc.dk.begin() + t * D, sc.dk.begin() + (t + 1) * D, dkj);
      std::copy(sc.dv.begin() + t * Dv, sc.dv.begin() + (t + 1) * Dv, dvj);
    }
  }
}

/// Key chunks per (batch entry, kv head): enough tasks for every thread even for one batch entry and
/// one kv head, at most one per key tile. Depends on the thread count only.
inline index_t key_chunks(index_t pairs, index_t k_len, int threads) noexcept {
  index_t const tiles = std::max<index_t>(1, (k_len + block_keys_v - 1) / block_keys_v);
  index_t const want = pairs >= threads ? 1 : (threads + pairs - 1) / std::max<index_t>(1, pairs);
  return std::min(tiles, std::max<index_t>(1, want));
}

/// Phase 3 for (b, h): dq = sum of the chunks' partials in chunk order.
template <class T>
void sum_dq_partials(attention_plan<T> const& p, backward_views<T> const& io, index_t b, index_t h,
                     index_t chunks, T const* part) noexcept {
  index_t const Sq = p.q_len, D = p.head_dim;
  index_t const hk = p.kv_head(h), h0 = hk * p.group;
  index_t const per_task = p.group * Sq * D;  // one task's partial: every head of its group
  for (index_t i = 0; i < Sq; ++i) {
    T* dqi = io.dq.ptr(b, i, h);
    for (index_t c = 0; c < chunks; ++c) {
      T const* src = part + ((b * p.kv_heads + hk) * chunks + c) * per_task + ((h - h0) * Sq + i) * D;
      if (c == 0)
        std::copy(src, src + D, dqi);
      else
        for (index_t d = 0; d < D; ++d) dqi[d] += src[d];
    }
  }
}

/// The fused backward pass (the plan at the top of this file).
template <class T, class E>
void fused_attention_backward(attention_plan<T> const& p, backward_views<T> const& io, E const& enc,
                              encoder_gradients_t<E>& grads) {
  using Tr = fused_default_traits<T>;
  using G = encoder_gradients_t<E>;
  index_t const B = p.batch, Sq = p.q_len, Sk = p.k_len, D = p.head_dim, Dv = p.value_dim;
  index_t const pairs = B * p.kv_heads;
  index_t const chunks = key_chunks(pairs, Sk, loop_threads(p.threads));
  index_t const per_chunk = (Sk + chunks - 1) / chunks;
  index_t const chunk_len = (per_chunk + block_keys_v - 1) / block_keys_v * block_keys_v;  // whole tiles
  std::vector<T> stats(static_cast<std::size_t>(3 * B * p.q_heads * Sq));
  T* const lse = stats.data();
  T* const delta = stats.data() + B * p.q_heads * Sq;
  T* const own = stats.data() + 2 * B * p.q_heads * Sq;  // NaN, or the own lse replacing a given one
  parallel_for(B * p.q_heads, p.threads, [&](index_t task) {
    tile_scratch<T> sc(D, Dv);
    index_t const b = task / p.q_heads, h = task % p.q_heads;
    row_statistics<Tr>(p, io, enc, b, h, sc, lse + task * Sq, delta + task * Sq, own + task * Sq);
  });
  // A given lse replaced by the row's own (lse_trusted_limit) is checked against it now, before
  // anything is written: sum_j exp(s_ij - lse_i) = exp(own_i - lse_i).
  if (p.lse && io.check_lse)
    for (index_t r = 0; r < B * p.q_heads * Sq; ++r)
      if (!lse_trusted<T>(p.lse[r])) {
        double const sum = own[r] == -std::numeric_limits<T>::infinity()
                               ? 0.0
                               : std::exp(static_cast<double>(own[r]) - static_cast<double>(p.lse[r]));
        index_t const i = r % Sq, h = (r / Sq) % p.q_heads, b = r / (Sq * p.q_heads);
        check_lse_row("posenc::attention_backward", b, h, i, Sk, p.lse[r], sum);
      }
  index_t const tasks = pairs * chunks, per_task = p.group * Sq * D;
  // Each task zeroes its own part first.
  auto part = aligned_buffer<T>::uninitialized(tasks * per_task);
  std::vector<G> local(static_cast<std::size_t>(tasks), grads);
  for (G& g : local) g.set_zero();
  // A given lse is checked before any output is written: dk, dv go to scratch until then.
  bool const check = p.lse != nullptr && io.check_lse;
  bool const gather = p.lse != nullptr && (io.check_lse || io.row_sums != nullptr);  // row sums wanted
  index_t const dk_n = check ? B * Sk * p.kv_heads * D : 0, dv_n = check ? B * Sk * p.kv_heads * Dv : 0;
  // Kept by the calling thread and reused: a fresh buffer of this size costs a page fault per 4 KiB
  // on every call (about 15% of a 4096-token backward on this project's machine).
  thread_local aligned_buffer<T> kv_scratch;
  if (kv_scratch.size() < dk_n + dv_n) kv_scratch = aligned_buffer<T>::uninitialized(dk_n + dv_n);
  auto sums = aligned_buffer<T>::uninitialized(gather ? tasks * p.group * Sq : 0);  // (task, group head, row)
  view<T> const dk_out = check ? make_bshd(kv_scratch.data(), B, Sk, p.kv_heads, D) : io.dk;
  view<T> const dv_out = check ? make_bshd(kv_scratch.data() + dk_n, B, Sk, p.kv_heads, Dv) : io.dv;
  parallel_for(tasks, p.threads, [&](index_t task) {
    tile_scratch<T> sc(D, Dv);
    index_t const pair = task / chunks, c = task % chunks;
    index_t const b = pair / p.kv_heads, hk = pair % p.kv_heads;
    index_t const c0 = std::min(Sk, c * chunk_len), c1 = std::min(Sk, c0 + chunk_len);
    key_chunk<Tr>(p, io, enc, b, hk, c0, c1, lse, delta, sc, part.data() + task * per_task, dk_out, dv_out,
                  gather ? sums.data() + task * p.group * Sq : nullptr, local[static_cast<std::size_t>(task)]);
  });
  if (check) {
    for (index_t b = 0; b < B; ++b)
      for (index_t h = 0; h < p.q_heads; ++h) {
        index_t const hk = p.kv_head(h), h0 = hk * p.group;
        for (index_t i = 0; i < Sq; ++i) {
          double sum = 0;  // the chunks' sums in chunk order
          for (index_t c = 0; c < chunks; ++c)
            sum += static_cast<double>(sums[((b * p.kv_heads + hk) * chunks + c) * p.group * Sq + (h - h0) * Sq + i]);
          check_lse_row("posenc::attention_backward", b, h, i, Sk, p.lse[(b * p.q_heads + h) * Sq + i], sum);
        }
      }
    parallel_for(pairs, p.threads, [&](index_t pair) {
      index_t const b = pair / p.kv_heads, hk = pair % p.kv_heads;
      for (index_t j = 0; j < Sk; ++j) {
        std::copy(dk_out.ptr(b, j, hk), dk_out.ptr(b, j, hk) + D, io.dk.ptr(b, j, hk));
        std::copy(dv_out.ptr(b, j, hk), dv_out.ptr(b, j, hk) + Dv, io.dv.ptr(b, j, hk));
      }
    });
  } else if (gather) {  // the caller checks: each row's sum, the chunks' in chunk order
    for (index_t b = 0; b < B; ++b)
      for (index_t h = 0; h < p.q_heads; ++h) {
        index_t const hk = p.kv_head(h), h0 = hk * p.group;
        for (index_t i = 0; i < Sq; ++i) {
          double sum = 0;
          for (index_t c = 0; c < chunks; ++c)
            sum += static_cast<double>(sums[((b * p.kv_heads + hk) * chunks + c) * p.group * Sq + (h - h0) * Sq + i]);
          io.row_sums[(b * p.q_heads + h) * Sq + i] += sum;
        }
      }
  }
  parallel_for(B * p.q_heads, p.threads, [&](index_t task) {
    sum_dq_partials(p, io, task / p.q_heads, task % p.q_heads, chunks, part.data());
  });
  for (G const& g : local) grads += g;
}

}  // namespace posenc::detail::fused_backward

namespace posenc::detail {

/// path::fused backward: flash-style tiles (attention/backward/fused.hpp).
template <>
struct backward_kernel<path::fused> {
  static constexpr bool available = true;
  static constexpr bool needs_lse = false;  // recomputed by a forward sweep when opt.lse is null
  template <class T, class E>
  static void run(attention_plan<T> const& p, backward_views<T> const& io, E const& enc,
                  encoder_gradients_t<E>& grads) {
#if POSENC_COMPILED
    // posenc::compiled holds this kernel (compiled/list.hpp): call it there.
    if constexpr (compiled_kernels::has_backward<T, E>) {
      compiled_kernels::check_once();
      compiled_kernels::backward(p, io, enc, grads);
      return;
    }
#endif
    fused_backward::fused_attention_backward(p, io, enc, grads);
  }
};

}  // namespace posenc::detail
