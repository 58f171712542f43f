// SPDX-License-Identifier: MIT
// path::fused: tiled attention with an online softmax and xsimd FMA micro-kernels; never holds Sq x Sk.
#pragma once

// Two kernels share the plan (posenc/attention/plan.hpp) and the semantics of
// docs/formulas.md 5:
//
// * The lane kernel (prefill). Query rows go along the SIMD lanes. A work item
//   is (batch, kv head, a run of query blocks); its rows are the pairs
//   (query i, query head of the kv group), so every K/V tile is loaded once for
//   all query heads of a group. Per query block of `block_q` rows:
//     qt  (D, block_q)        the block's queries, transposed once
//     st  (block_kv, block_q) scores of one key tile: st[j][l] = k_j . q_l
//                             (broadcast k_j[d], FMA with the row qt[d]); K is
//                             read in place, never packed or transposed
//     ot  (Dv, block_q)       output, transposed: ot[d][l] += v_j[d] * p[j][l]
//   The softmax statistics (running max, sum) are vectors over lanes, so the
//   online softmax has no horizontal reduction. Tiles with no visible key are
//   skipped, fully visible tiles are not tested, the diagonal tiles are masked
//   in registers by comparing the key index with per-lane bounds. Biases and
//   masks are computed per (query row, key tile) with bias_row / apply_masks
//   and added transposed; a shift-invariant bias over a block of one head at
//   consecutive positions is one diagonal per tile instead.
// * The row kernel (fewer rows than a lane block, and Shaw). Keys go along
//   the lanes of a row of scores; up to row_group rows share each K and V row
//   load. Without Shaw terms (the decode path) a work item walks every kv head
//   of a batch entry tile by tile, so K and V are read once, in memory order.
//   Long key ranges are split across threads, each keeping (max, sum, partial
//   output) per row, merged with the log-sum-exp rule (docs/formulas.md 5.5).
//
// Scratch: one buffer per thread, sized by the tile constants, D and Dv only
// (fused_scratch_elements); nothing grows with Sq x Sk.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <initializer_list>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "posenc/attention/plan.hpp"
#include "posenc/core/aligned_buffer.hpp"
#include "posenc/core/simd.hpp"
#include "posenc/core/threading.hpp"

namespace posenc::detail {

/// Every tile constant of the fused path, derived and checked once.
/// @tparam T       float or double
/// @tparam BlockQ  query rows per block (the lanes of one tile), a multiple of
///                 the lane group of the micro-kernels
/// @tparam BlockKV keys per tile
/// @tparam Arch    xsimd architecture tag
template <class T, index_t BlockQ, index_t BlockKV, class Arch = simd::default_arch>
struct fused_traits {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "posenc::fused_traits: T must be float or double");
  using value_type = T;
  using arch = Arch;
  using batch = simd::batch<T, Arch>;

  /// Lanes of one vector.
  static constexpr index_t width = simd::width<T, Arch>;
  static constexpr index_t block_q = BlockQ;
  static constexpr index_t block_kv = BlockKV;
  /// Vectors across one block of query rows.
  static constexpr index_t q_vectors = BlockQ / width;
  /// Register file: 32 vector registers with AVX-512, 16 otherwise.
  static constexpr int registers = simd::vector_registers<Arch>;
  /// Lane vectors of one micro-tile: 4 with 32 registers (64 float lanes on
  /// AVX-512), 2 with 16.
  static constexpr index_t micro_q = registers >= 32 ? 4 : 2;
  /// Rows (keys for scores, output dims for values) of one micro-tile:
  /// micro_rows * micro_q accumulators plus micro_q operands plus one
  /// broadcast must fit the register file: 6 * 4 + 4 + 1 = 29 of 32,
  /// 6 * 2 + 2 + 1 = 15 of 16.
  static constexpr index_t micro_rows = 6;
  /// Query blocks of one work item that share each key tile.
  static constexpr index_t blocks_per_item = 4;
  /// Rows handled together by the row kernel (each K/V row load serves them all).
  static constexpr index_t row_group = 4;
  /// Below this many rows per (batch, kv head) the row kernel runs: a lane
  /// block would be mostly empty lanes.
  static constexpr index_t lane_kernel_min_rows = width;

  static_assert(BlockQ <= 256, "posenc::fused_traits: BlockQ must be <= 256");
  static_assert(BlockQ > 0 && BlockQ % width == 0,
                "posenc::fused_traits: BlockQ must be a multiple of the SIMD width");
  static_assert(q_vectors % micro_q == 0,
                "posenc::fused_traits: BlockQ must be a multiple of micro_q * width (the lanes of a micro-tile)");
  static_assert(BlockKV > 0 && BlockKV % width == 0,
                "posenc::fused_traits: BlockKV must be a multiple of the SIMD width");
  static_assert(micro_rows * micro_q + micro_q + 1 <= registers,
                "posenc::fused_traits: the micro-tile does not fit the register file");
};

/// The tile configuration path::fused uses for T on the compiled architecture.
/// 64 query rows (one micro-tile of 4 x 16 float lanes with AVX-512) by 64 keys.
template <class T>
using fused_default_traits = fused_traits<T, 64, 64>;

namespace fused {

// ---------------------------------------------------------------------------
// Micro-kernels. Accumulators are arrays of batches with compile-time bounds,
// fully unrolled so that they live in registers.

/// st[r][lanes] = sum_d k[r][d] * qt[d][lanes] for MR key rows and MQ lane vectors.
template <class Tr, int MR, int MQ>
inline void score_micro(typename Tr::value_type const* k, index_t ldk, typename Tr::value_type const* qt,
                        index_t ldq, index_t D, typename Tr::value_type* st, index_t lds) noexcept {
  using T = typename Tr::value_type;
  using B = typename Tr::batch;
  constexpr index_t W = Tr::width;
  B acc[MR][MQ];
  for (int r = 0; r < MR; ++r)
    for (int m = 0; m < MQ; ++m) acc[r][m] = B(T(0));
  T const* kr[MR];
  for (int r = 0; r < MR; ++r) kr[r] = k + r * ldk;
  for (index_t d = 0; d < D; ++d) {
    B qv[MQ];
    for (int m = 0; m < MQ; ++m) qv[m] = simd::load<T, typename Tr::arch>(qt + d * ldq + m * W);
    for (int r = 0; r < MR; ++r) {
      B const kb(kr[r][d]);
      for (int m = 0; m < MQ; ++m) acc[r][m] = simd::fma(kb, qv[m], acc[r][m]);
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int m = 0; m < MQ; ++m) simd::store(st + r * lds + m * W, acc[r][m]);
}

/// ot[r][lanes] = alpha[lanes] * ot[r][lanes] + sum_j v[j][r] * pt[j][lanes]
/// for MR output dims (v points at dim d0 of key row 0) and MQ lane vectors.
template <class Tr, int MR, int MQ>
inline void value_micro(typename Tr::value_type const* v, index_t ldv, index_t nk,
                        typename Tr::value_type const* pt, index_t ldp, typename Tr::value_type const* alpha,
                        typename Tr::value_type* ot, index_t ldo) noexcept {
  using T = typename Tr::value_type;
  using B = typename Tr::batch;
  using A = typename Tr::arch;
  constexpr index_t W = Tr::width;
  B acc[MR][MQ];
  B al[MQ];
  for (int m = 0; m < MQ; ++m) al[m] = simd::load<T, A>(alpha + m * W);
  for (int r = 0; r < MR; ++r)
    for (int m = 0; m < MQ; ++m) acc[r][m] = simd::load<T, A>(ot + r * ldo + m * W) * al[m];
  for (index_t j = 0; j < nk; ++j) {
    B pv[MQ];
    for (int m = 0; m < MQ; ++m) pv[m] = simd::load<T, A>(pt + j * ldp + m * W);
    T const* vj = v + j * ldv;
    for (int r = 0; r < MR; ++r) {
      B const vb(vj[r]);
      for (int m = 0; m < MQ; ++m) acc[r][m] = simd::fma(vb, pv[m], acc[r][m]);
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int m = 0; m < MQ; ++m) simd::store(ot + r * ldo + m * W, acc[r][m]);
}

/// Calls f(row, std::integral_constant<int, MR>) over [0, n) in blocks of MR
/// rows, the tail with a smaller compile-time block.
template <int N, class F>
inline void tail_block(index_t rem, index_t r, F& f) noexcept {
  if constexpr (N >= 1) {
    if (rem == N)
      f(r, std::integral_constant<int, N>{});
    else
      tail_block<N - 1>(rem, r, f);
  } else {
    (void)rem, (void)r, (void)f;
  }
}
template <int MR, class F>
inline void row_blocks(index_t n, F&& f) noexcept {
  index_t r = 0;
  for (; r + MR <= n; r += MR) f(r, std::integral_constant<int, MR>{});
  if (r < n) tail_block<MR - 1>(n - r, r, f);
}

inline constexpr index_t far_key = std::numeric_limits<index_t>::max() / 4;

/// Scratch of one thread, carved out of one aligned buffer.
template <class T>
struct carve {
  T* p;
  T* take(index_t n) noexcept {
    T* r = p;
    p += (n + 15) / 16 * 16;  // keep 64-byte alignment for float and double
    return r;
  }
};

// ---------------------------------------------------------------------------
// Lane kernel.

/// Keys t0 .. t0 + n - 1 of batch entry b sit at consecutive positions.
template <class T>
bool keys_consecutive(attention_plan<T> const& p, index_t b, index_t t0, index_t n) noexcept {
  if (p.keys_are_indices) return true;
  index_t const k0 = p.k_position(b, t0);
  for (index_t j = 1; j < n; ++j)
    if (p.k_position(b, t0 + j) != k0 + j) return false;
  return true;
}

template <class Tr>
struct lane_sizes {
  static index_t block_elements(index_t D, index_t Dv) noexcept {
    index_t const bq = Tr::block_q;
    return (D + Dv + 4) * bq + 64;  // qt, ot, m, l, alpha, spare + carve padding
  }
  static index_t shared_elements(index_t D) noexcept {
    index_t const bq = Tr::block_q, bk = Tr::block_kv;
    return 3 * bk * bq + 3 * bq + bk + (bk + bq) * D + 128;  // st, bt, brow, rlo/rhi, diagonal, rotated k, q
  }
  static index_t elements(index_t D, index_t Dv) noexcept {
    return Tr::blocks_per_item * block_elements(D, Dv) + shared_elements(D);
  }
};

template <class T>
struct lane_block {
  T* qt;
  T* ot;
  T* m;
  T* l;
  T* alpha;
  index_t row0 = 0, rows = 0;  // rows of this block within the (b, kv head) rows
  index_t first = 0, last = 0;  // union of the visible key ranges of its rows
  index_t all_first = 0, all_last = 0;  // every row sees [all_first, all_last)
  bool exact = true;            // the visible ranges are exact (no per-key test)
  bool shifts = false;          // rows = one head at positions q0, q0 + 1, ... (q0 >= 0)
  index_t q0 = 0;
  index_t lo[256], hi[256];     // per-row visible key range [lo, hi)
};

/// Copies key rows [t0, t0 + nk) of (b, hk) into `tile` (nk, D) and rotates
/// them at their position ids (RoPE fused: each key tile rotated as loaded).
template <class T, class E>
void rotate_key_tile(attention_plan<T> const& p, view<const T> k, E const& enc, rotation_ids const& rot, index_t b,
                     index_t hk, index_t t0, index_t nk, T* tile) noexcept {
  index_t const D = p.head_dim;
  for (index_t j = 0; j < nk; ++j) {
    T const* src = k.ptr(b, t0 + j, hk);
    std::copy(src, src + D, tile + j * D);
  }
  if constexpr (encoder_traits<E>::rotates_queries_keys)
    enc.rotate(make_bshd(tile, 1, nk, 1, D), position_span::ids(rot.k + b * p.k_len + t0, 1, nk), rot.length);
  else
    (void)enc, (void)rot;
}

/// Rotates n query rows gathered in `rows` (n, D) at position ids `ids`.
template <class T, class E>
void rotate_query_rows(attention_plan<T> const& p, E const& enc, rotation_ids const& rot, index_t const* ids,
                       index_t n, T* rows) noexcept {
  if constexpr (encoder_traits<E>::rotates_queries_keys) {
    if (n > 0) enc.rotate(make_bshd(rows, 1, n, 1, p.head_dim), position_span::ids(ids, 1, n), rot.length);
  } else {
    (void)p, (void)enc, (void)rot, (void)ids, (void)n, (void)rows;
  }
}

/// One work item of the lane kernel: (b, kv head hk), blocks [blk0, blk1).
/// `rot`: rotate the queries and key tiles here (null: they arrive rotated).
template <class Tr, class T, class E>
void lane_item(attention_plan<T> const& p, view<const T> q, view<const T> k, view<const T> v,
               view<T> out, E const& enc, index_t b, index_t hk, index_t blk0, index_t blk1,
               T* scratch, lane_block<T>* blocks, rotation_ids const* rot) noexcept {
  using A = typename Tr::arch;
  using B = typename Tr::batch;
  constexpr index_t W = Tr::width, BQ = Tr::block_q, BK = Tr::block_kv, MQ = Tr::micro_q;
  constexpr bool has_bias = encoder_traits<E>::biases_scores;
  index_t const D = p.head_dim, Dv = p.value_dim, G = p.group, R = p.q_len * G;
  T const scale = static_cast<T>(p.scale);
  T const cap = static_cast<T>(p.softcap);
  T const inv_cap = cap > 0 ? T(1) / cap : T(0);
  T const ninf = -std::numeric_limits<T>::infinity();
  bool const general = has_bias || p.has_masks();
  // A shift-invariant bias without masks: per tile one diagonal instead of a
  // row per query (and no transpose).
  bool diagonal_bias = false;
  if constexpr (has_bias) diagonal_bias = !p.has_masks() && bias_shift_invariant(enc);

  carve<T> c{scratch};
  index_t const nb = blk1 - blk0;
  for (index_t t = 0; t < nb; ++t) {
    lane_block<T>& bl = blocks[t];
    bl.qt = c.take(D * BQ);
    bl.ot = c.take(Dv * BQ);
    bl.m = c.take(BQ);
    bl.l = c.take(BQ);
    bl.alpha = c.take(BQ);
  }
  T* st = c.take(BK * BQ);
  T* bt = c.take(BK * BQ);
  T* brow = c.take(BQ * BK);
  T* rlo = c.take(BQ);
  T* rhi = c.take(BQ);
  T* ktile = c.take(BK * D);
  T* qrows = c.take(BQ * D);
  T* diag = c.take(BK + BQ);
  index_t rid[BQ];

  // Block setup: transposed queries, statistics, visible key ranges.
  index_t kfirst = far_key, klast = 0;
  for (index_t t = 0; t < nb; ++t) {
    lane_block<T>& bl = blocks[t];
    bl.row0 = (blk0 + t) * BQ;
    bl.rows = std::min(BQ, R - bl.row0);
    bl.first = far_key;
    bl.last = 0;
    bl.all_first = 0;
    bl.all_last = far_key;
    bl.exact = true;
    std::fill(bl.qt, bl.qt + D * BQ, T(0));
    std::fill(bl.ot, bl.ot + Dv * BQ, T(0));
    std::fill(bl.m, bl.m + BQ, ninf);
    std::fill(bl.l, bl.l + BQ, T(0));
    for (index_t l = 0; l < BQ; ++l) {
      bl.lo[l] = far_key;
      bl.hi[l] = -far_key;
    }
    for (index_t l = 0; l < bl.rows; ++l) {
      index_t const r = bl.row0 + l, i = r / G, h = hk * G + r % G;
      T const* qi = q.ptr(b, i, h);
      if (rot) {
        std::copy(qi, qi + D, qrows + l * D);
        rid[l] = rot->q[b * p.q_len + i];
      } else {
        for (index_t d = 0; d < D; ++d) bl.qt[d * BQ + l] = qi[d];
      }
      key_range const kr = p.visible_range(b, i, 0, p.k_len);
      bl.exact = bl.exact && kr.all;
      if (kr.empty()) {
        bl.all_last = 0;
        continue;
      }
      bl.lo[l] = kr.first;
      bl.hi[l] = kr.last;
      bl.first = std::min(bl.first, kr.first);
      bl.last = std::max(bl.last, kr.last);
      bl.all_first = std::max(bl.all_first, kr.first);
      bl.all_last = std::min(bl.all_last, kr.last);
    }
    // One head, consecutive positions: a shift-invariant bias is a function
    // of j - l over the tile (one diagonal, see below).
    bl.q0 = bl.rows > 0 ? p.q_position(b, bl.row0 / G) : 0;
    bl.shifts = diagonal_bias && G == 1 && bl.q0 >= 0;
    for (index_t l = 1; l < bl.rows && bl.shifts; ++l) bl.shifts = p.q_position(b, bl.row0 + l) == bl.q0 + l;
    if (rot) {  // each query block rotated once, then transposed
      rotate_query_rows(p, enc, *rot, rid, bl.rows, qrows);
      for (index_t l = 0; l < bl.rows; ++l)
        for (index_t d = 0; d < D; ++d) bl.qt[d * BQ + l] = qrows[l * D + d];
    }
    if (bl.rows < BQ) bl.all_last = 0;  // padding lanes: never "all visible"
    kfirst = std::min(kfirst, bl.first);
    klast = std::max(klast, bl.last);
  }

  index_t const t_begin = kfirst >= klast ? 0 : kfirst / BK * BK;
  for (index_t t0 = t_begin; t0 < klast; t0 += BK) {
    index_t const nk = std::min(BK, klast - t0);
    T const* kt = k.ptr(b, t0, hk);
    index_t ldk = k.seq_stride;
    T const* vt = v.ptr(b, t0, hk);
    // The tile's keys at consecutive positions (once per tile, for every block).
    bool const keys_run = diagonal_bias && keys_consecutive(p, b, t0, nk);
    for (index_t t = 0; t < nb; ++t) {
      lane_block<T>& bl = blocks[t];
      if (bl.first >= bl.last || t0 >= bl.last || t0 + nk <= bl.first) continue;
      if (rot && rot->k && kt != ktile) {  // rotated once, for every block that uses the tile
        rotate_key_tile(p, k, enc, *rot, b, hk, t0, nk, ktile);
        kt = ktile;
        ldk = D;
      }
      // Keys past the block's last visible key are not computed (with GQA a
      // block spans fewer query positions than a tile has keys).
      index_t const nkb = std::min(nk, bl.last - t0);
      // Only the rows that use this tile count; vectors past them are padding.
      index_t const nv = (bl.rows + W - 1) / W;
      index_t const ngroups = (nv + MQ - 1) / MQ;
      index_t const nvec = ngroups * MQ;
      // Scores st (nkb, BQ).
      for (index_t g = 0; g < ngroups; ++g) {
        row_blocks<Tr::micro_rows>(nkb, [&](index_t r0, auto mr) {
          score_micro<Tr, decltype(mr)::value, MQ>(kt + r0 * ldk, ldk, bl.qt + g * MQ * W,
                                                   BQ, D, st + r0 * BQ + g * MQ * W, BQ);
        });
      }
      bool const full = bl.exact && bl.all_first <= t0 && bl.all_last >= t0 + nkb;
      // Diagonal bias: with lane l at position q0 + l and key j at k0 + j,
      // bias(l, j) = f(k0 - q0 + j - l). diag[u] holds f at distance
      // k0 - q0 + nk - 1 - u (u = 0 .. nk + BQ - 2), so the lanes o .. o + W - 1
      // of key j read diag[nk - 1 - j + o ..] in order.
      bool const diagonal = bl.shifts && bl.exact && keys_run;
      if constexpr (has_bias) {
        if (diagonal) {
          index_t const n = nk + BQ - 1;
          std::fill(diag, diag + n, T(0));
          enc.bias_row(hk, bl.q0 + BQ - 1, p.k_position(b, t0), n, diag);  // distances ascending
          std::reverse(diag, diag + n);
        }
      }
      bool const per_key_bias = (general || !bl.exact) && !diagonal;
      if (per_key_bias) {
        // Per (row, key): encoder bias, masks and visibility, one row per
        // query in brow (BQ, BK), then transposed into bt (BK, BQ) by
        // width x width register blocks.
        for (index_t l = 0; l < BQ; ++l) {
          T* row = brow + l * BK;
          if (l >= bl.rows) {
            std::fill(row, row + nkb, ninf);
            continue;
          }
          index_t const r = bl.row0 + l, i = r / G, h = hk * G + r % G;
          encoder_terms(p, enc, q.ptr(b, i, h), b, h, i, t0, nkb, false, true, row);
          bool const covers = bl.exact && bl.lo[l] <= t0 && bl.hi[l] >= t0 + nkb;
          if (!covers || p.has_masks()) apply_masks(p, b, h, i, t0, nkb, row);
        }
        for (index_t l0 = 0; l0 < nvec * W; l0 += W) {
          for (index_t j0 = 0; j0 < nkb; j0 += W) {
            B blk[W];
            for (index_t t = 0; t < W; ++t) blk[t] = simd::load<T, A>(brow + (l0 + t) * BK + j0);
            simd::transpose(blk);
            for (index_t t = 0; t < W; ++t) simd::store(bt + (j0 + t) * BQ + l0, blk[t]);
          }
        }
      } else if (!full) {  // visibility by per-lane bounds
        for (index_t l = 0; l < BQ; ++l) {
          rlo[l] = static_cast<T>(std::clamp<index_t>(bl.lo[l] - t0, -1, BK + 1));
          rhi[l] = static_cast<T>(std::clamp<index_t>(bl.hi[l] - t0, -1, BK + 1));
        }
      }
      // Online softmax over the lanes: vertical max, exp, sum.
      for (index_t mv = 0; mv < nvec; ++mv) {
        index_t const o = mv * W;
        B const m_old = simd::load<T, A>(bl.m + o);
        B mx = m_old;
        B const lo = simd::load<T, A>(rlo + o), hi = simd::load<T, A>(rhi + o);
        for (index_t j = 0; j < nkb; ++j) {
          B s = simd::load<T, A>(st + j * BQ + o) * B(scale);
          if (cap > 0) s = B(cap) * simd::tanh(s * B(inv_cap));
          if (per_key_bias) {
            s = s + simd::load<T, A>(bt + j * BQ + o);
          } else {
            if (diagonal) s = s + simd::load<T, A>(diag + (nk - 1 - j) + o);
            if (!full) {
              B const jj(static_cast<T>(j));
              s = simd::select((jj >= lo) & (jj < hi), s, B(ninf));
            }
          }
          simd::store(st + j * BQ + o, s);
          mx = simd::max(mx, s);
        }
        B const m_use = simd::select(mx == B(ninf), B(T(0)), mx);
        B const al = simd::exp(m_old - m_use);
        B sum(T(0));
        for (index_t j = 0; j < nkb; ++j) {
          B const e = simd::exp(simd::load<T, A>(st + j * BQ + o) - m_use);
          simd::store(st + j * BQ + o, e);
          sum = sum + e;
        }
        simd::store(bl.l + o, simd::load<T, A>(bl.l + o) * al + sum);
        simd::store(bl.m + o, mx);
        simd::store(bl.alpha + o, al);
      }
      // ot = alpha * ot + V^T p.
      for (index_t g = 0; g < ngroups; ++g) {
        row_blocks<Tr::micro_rows>(Dv, [&](index_t d0, auto mr) {
          value_micro<Tr, decltype(mr)::value, MQ>(vt + d0, v.seq_stride, nkb, st + g * MQ * W, BQ,
                                                   bl.alpha + g * MQ * W, bl.ot + d0 * BQ + g * MQ * W, BQ);
        });
      }
    }
  }

  // Normalise and write out (b, i, h, :) and the log-sum-exp.
  for (index_t t = 0; t < nb; ++t) {
    lane_block<T>& bl = blocks[t];
    for (index_t l = 0; l < bl.rows; ++l) {
      index_t const r = bl.row0 + l, i = r / G, h = hk * G + r % G;
      T* o = out.ptr(b, i, h);
      T const sum = bl.l[l];
      T const inv = sum > 0 ? T(1) / sum : T(0);
      for (index_t d = 0; d < Dv; ++d) o[d] = bl.ot[d * BQ + l] * inv;
      p.set_lse(b, h, i, sum > 0 ? bl.m[l] + std::log(sum) : ninf);
    }
  }
}

// ---------------------------------------------------------------------------
// Row kernel.

/// Elements of row_scratch<Tr, T> for head dim D.
template <class Tr>
index_t row_scratch_elements(index_t D) noexcept {
  return (Tr::row_group + 1 + D) * Tr::block_kv + 64;
}

template <class Tr>
struct row_sizes {
  /// Per thread: the scratch, and query rows (rotated copies) of one item.
  static index_t elements(index_t D, index_t Dv) noexcept {
    (void)Dv;
    return row_scratch_elements<Tr>(D) + Tr::row_group * D + 16;
  }
  /// Row groups per kv head on the decode path at most (fewer rows than a lane block).
  static constexpr index_t max_decode_groups = (Tr::lane_kernel_min_rows + Tr::row_group - 1) / Tr::row_group;
  /// Per thread on the decode path: the scratch and the query rows of every
  /// kv head (`groups` row groups each).
  static index_t decode_elements(index_t D, index_t kv_heads, index_t groups = max_decode_groups) noexcept {
    return row_scratch_elements<Tr>(D) + kv_heads * groups * Tr::row_group * D + 16;
  }
};

/// Asks for the cache lines of n rows of `len` elements, `stride` apart.
template <class T>
inline void prefetch_rows(T const* p, index_t stride, index_t n, index_t len) noexcept {
#if defined(__GNUC__) || defined(__clang__)
  constexpr index_t line = 64 / static_cast<index_t>(sizeof(T));
  for (index_t j = 0; j < n; ++j)
    for (index_t e = 0; e < len; e += line) __builtin_prefetch(p + j * stride + e);
#else
  (void)p, (void)stride, (void)n, (void)len;
#endif
}

/// Largest of 8, 4, 2, 1 such that `per` accumulators per unit plus `extra`
/// operand registers fit the register file (and at most `cap`).
template <class Tr>
constexpr int register_block(int per, int extra, index_t cap) noexcept {
  for (int u : {8, 4, 2}) {
    if (u <= cap && per * u + extra <= Tr::registers) return u;
  }
  return 1;
}

/// s[g][j] = q_g . k_j for NG rows and nk keys. KJ keys at a time keep
/// NG * KJ accumulators in registers (each K row loaded once for all rows);
/// the partial sums of width keys are then reduced together by one
/// width x width transpose instead of a horizontal sum per key.
template <class Tr, int NG>
inline void row_scores(typename Tr::value_type const* const* qr, typename Tr::value_type const* k, index_t ldk,
                       index_t nk, index_t D, typename Tr::value_type* const* s) noexcept {
  using T = typename Tr::value_type;
  using B = typename Tr::batch;
  using A = typename Tr::arch;
  constexpr index_t W = Tr::width;
  constexpr int KJ = register_block<Tr>(NG + 1, 2, W);
  index_t const Dw = D / W * W;
  alignas(64) T part[NG][W][W];  // part[g][key][lane]: partial sums of W keys
  for (index_t j0 = 0; j0 < nk; j0 += W) {
    index_t const n = std::min(W, nk - j0);
    for (index_t jj = 0; jj < n; jj += KJ) {
      B acc[NG][KJ];
      T const* kr[KJ];
      for (int t = 0; t < KJ; ++t) {
        kr[t] = k + std::min(j0 + jj + t, nk - 1) * ldk;  // past the tile: a repeat, discarded
        for (int g = 0; g < NG; ++g) acc[g][t] = B(T(0));
      }
      for (index_t d = 0; d < Dw; d += W) {
        B kv[KJ];
        for (int t = 0; t < KJ; ++t) kv[t] = simd::load<T, A>(kr[t] + d);
        for (int g = 0; g < NG; ++g) {
          B const qv = simd::load<T, A>(qr[g] + d);
          for (int t = 0; t < KJ; ++t) acc[g][t] = simd::fma(qv, kv[t], acc[g][t]);
        }
      }
      for (int g = 0; g < NG; ++g)
        for (int t = 0; t < KJ; ++t) simd::store(part[g][jj + t], acc[g][t]);
    }
    for (int g = 0; g < NG; ++g) {
      B blk[W];
      for (index_t t = 0; t < W; ++t) blk[t] = t < n ? simd::load<T, A>(part[g][t]) : B(T(0));
      simd::transpose(blk);
      B sum = blk[0];
      for (index_t t = 1; t < W; ++t) sum = sum + blk[t];
      if (Dw < D) {  // head dim not a multiple of the width: the last dims one by one
        alignas(64) T tail[W];
        for (index_t t = 0; t < W; ++t) {
          T x = 0;
          if (t < n)
            for (index_t e = Dw; e < D; ++e) x += qr[g][e] * k[(j0 + t) * ldk + e];
          tail[t] = x;
        }
        sum = sum + simd::load<T, A>(tail);
      }
      if (n == W)
        simd::store(s[g] + j0, sum);
      else
        simd::store_partial(s[g] + j0, sum, n);
    }
  }
}

/// o_g = alpha_g * o_g + sum_j p_g[j] v_j over Dv dims for NG rows (o_g at
/// o + g * Dv). Each V row chunk is loaded once for all rows; the CW * NG
/// accumulators of a chunk stay in registers across the keys.
template <class Tr, int NG>
inline void row_values(typename Tr::value_type const* const* pr, typename Tr::value_type const* alpha,
                       typename Tr::value_type const* v, index_t ldv, index_t nk, index_t Dv,
                       typename Tr::value_type* o) noexcept {
  using T = typename Tr::value_type;
  using B = typename Tr::batch;
  using A = typename Tr::arch;
  constexpr index_t W = Tr::width;
  constexpr int CW = register_block<Tr>(NG, NG + 2, 8);
  auto chunk = [&](index_t d, auto cw) {
    constexpr int C = decltype(cw)::value;
    B acc[NG][C];
    for (int g = 0; g < NG; ++g)
      for (int c = 0; c < C; ++c) acc[g][c] = simd::load<T, A>(o + g * Dv + d + c * W) * B(alpha[g]);
    for (index_t j = 0; j < nk; ++j) {
      T const* vj = v + j * ldv + d;
      B pj[NG];
      for (int g = 0; g < NG; ++g) pj[g] = B(pr[g][j]);
      for (int c = 0; c < C; ++c) {
        B const vv = simd::load<T, A>(vj + c * W);
        for (int g = 0; g < NG; ++g) acc[g][c] = simd::fma(pj[g], vv, acc[g][c]);
      }
    }
    for (int g = 0; g < NG; ++g)
      for (int c = 0; c < C; ++c) simd::store(o + g * Dv + d + c * W, acc[g][c]);
  };
  index_t d = 0;
  for (; d + CW * W <= Dv; d += CW * W) chunk(d, std::integral_constant<int, CW>{});
  for (; d + W <= Dv; d += W) chunk(d, std::integral_constant<int, 1>{});
  for (; d < Dv; ++d) {
    for (int g = 0; g < NG; ++g) {
      T a = o[g * Dv + d] * alpha[g];
      for (index_t j = 0; j < nk; ++j) a += pr[g][j] * v[j * ldv + d];
      o[g * Dv + d] = a;
    }
  }
}

/// Partial result of the row kernel for one row: running max, sum and the
/// unnormalised output (Dv values).
template <class T>
struct row_state {
  T* m;
  T* l;
  T* o;  // (rows, Dv)
};

/// Rows [r0, r0 + n) of one (b, kv head) for the row kernel: query row
/// pointers (rotated copies when RoPE is fused), positions, visible key ranges.
template <class Tr, class T>
struct row_rows {
  T const* q[Tr::row_group];
  index_t i[Tr::row_group], h[Tr::row_group];
  key_range kr[Tr::row_group];
  index_t n = 0;
  index_t first = 0, last = 0;  // union of the visible ranges
};

/// Sets up rows [r0, r0 + ng) of (b, hk) against keys [j0, j1) and a fresh
/// state. With `rot`, the rows are copied into qbuf (ng, D) and rotated.
template <class Tr, class T, class E>
void row_begin(attention_plan<T> const& p, view<const T> q, E const& enc, index_t b, index_t hk, index_t r0,
               index_t ng, index_t j0, index_t j1, rotation_ids const* rot, T* qbuf, row_rows<Tr, T>& rr,
               row_state<T> st) noexcept {
  index_t const D = p.head_dim, Dv = p.value_dim, G = p.group;
  index_t rid[Tr::row_group];
  rr.n = ng;
  rr.first = j1;
  rr.last = j0;
  for (index_t g = 0; g < ng; ++g) {
    index_t const r = r0 + g;
    rr.i[g] = r / G;
    rr.h[g] = hk * G + r % G;
    T const* src = q.ptr(b, rr.i[g], rr.h[g]);
    if (rot) {
      std::copy(src, src + D, qbuf + g * D);
      rid[g] = rot->q[b * p.q_len + rr.i[g]];
      rr.q[g] = qbuf + g * D;
    } else {
      rr.q[g] = src;
    }
    rr.kr[g] = p.visible_range(b, rr.i[g], j0, j1);
    st.m[g] = -std::numeric_limits<T>::infinity();
    st.l[g] = T(0);
    std::fill(st.o + g * Dv, st.o + (g + 1) * Dv, T(0));
    if (!rr.kr[g].empty()) {
      rr.first = std::min(rr.first, rr.kr[g].first);
      rr.last = std::max(rr.last, rr.kr[g].last);
    }
  }
  if (rot) rotate_query_rows(p, enc, *rot, rid, ng, qbuf);
}

/// Per-thread scratch of the row kernel: score rows, a bias row, a rotated key tile.
template <class Tr, class T>
struct row_scratch {
  T* s[Tr::row_group];
  T* tmp;
  T* ktile;
  row_scratch(T* p, index_t D) noexcept {
    carve<T> c{p};
    for (auto& r : s) r = c.take(Tr::block_kv);
    tmp = c.take(Tr::block_kv);
    ktile = c.take(Tr::block_kv * D);
  }
};

/// Online softmax update of row g of rr for raw scores s[0, nk) of keys
/// t0 ..: scale, Shaw term, softcap, bias, masks; s becomes exp(s - max) and
/// the row's (max, sum) are updated. Returns the factor the row's output
/// must be rescaled by before the new keys' values are added.
template <class Tr, class T, class E>
T row_softmax(attention_plan<T> const& p, E const& enc, index_t b, row_rows<Tr, T> const& rr, index_t g, index_t t0,
              index_t nk, T* s, T* tmp, row_state<T> st) noexcept {
  using A = typename Tr::arch;
  using B = typename Tr::batch;
  constexpr index_t W = Tr::width;
  constexpr bool has_bias = encoder_traits<E>::biases_scores;
  constexpr bool has_shaw = encoder_traits<E>::relative_key_value;
  T const scale = static_cast<T>(p.scale);
  T const cap = static_cast<T>(p.softcap);
  T const ninf = -std::numeric_limits<T>::infinity();
  bool const general = has_bias || has_shaw || p.has_masks();
  index_t const ri = rr.i[g], rh = rr.h[g];
  for (index_t j = 0; j < nk; ++j) s[j] *= scale;
  if (has_shaw) {
    // Shaw's scale * q.aK term is part of the raw score (before the softcap).
    encoder_terms(p, enc, rr.q[g], b, rh, ri, t0, nk, true, false, tmp);
    for (index_t j = 0; j < nk; ++j) s[j] += tmp[j];
  }
  if (cap > 0) {
    for (index_t j = 0; j < nk; ++j) s[j] = cap * std::tanh(s[j] / cap);
  }
  bool const covered = rr.kr[g].all && rr.kr[g].first <= t0 && rr.kr[g].last >= t0 + nk;
  if (general || !covered) {
    if (has_bias) {
      encoder_terms(p, enc, rr.q[g], b, rh, ri, t0, nk, false, true, tmp);
      for (index_t j = 0; j < nk; ++j) s[j] += tmp[j];
    }
    apply_masks(p, b, rh, ri, t0, nk, s);
  }
  B mxv(st.m[g]);
  index_t jm = 0;
  for (; jm + W <= nk; jm += W) mxv = simd::max(mxv, simd::load<T, A>(s + jm));
  T mx = simd::reduce_max(mxv);
  for (; jm < nk; ++jm) mx = std::max(mx, s[jm]);
  T const m_use = mx == ninf ? T(0) : mx;
  T const al = std::exp(st.m[g] - m_use);
  B sumv(T(0));
  index_t j = 0;
  for (; j + W <= nk; j += W) {
    B const e = simd::exp(simd::load<T, A>(s + j) - B(m_use));
    simd::store(s + j, e);
    sumv = sumv + e;
  }
  T sum = simd::reduce_add(sumv);
  for (; j < nk; ++j) {
    s[j] = std::exp(s[j] - m_use);
    sum += s[j];
  }
  st.l[g] = st.l[g] * al + sum;
  st.m[g] = mx;
  return al;
}

/// Key tile [t0, t0 + nk) for the rows of rr: scores, online softmax update,
/// values. Leaves (max, sum, unnormalised output) per row in `st`.
template <class Tr, class T, class E>
void row_tile(attention_plan<T> const& p, view<const T> k, view<const T> v, E const& enc, index_t b, index_t hk,
              row_rows<Tr, T> const& rr, index_t t0, index_t nk, rotation_ids const* rot,
              row_scratch<Tr, T> const& sc, row_state<T> st) noexcept {
  constexpr bool has_shaw = encoder_traits<E>::relative_key_value;
  index_t const D = p.head_dim, Dv = p.value_dim;
  T const* kt = k.ptr(b, t0, hk);
  index_t ldk = k.seq_stride;
  if (rot && rot->k) {
    rotate_key_tile(p, k, enc, *rot, b, hk, t0, nk, sc.ktile);
    kt = sc.ktile;
    ldk = D;
  }
  T const* vt = v.ptr(b, t0, hk);
  // Scores of every row, each row's softmax update, then the values of every
  // row (each K and V row loaded once for all rows).
  auto rows = [&](index_t, auto n) {
    constexpr int NG = decltype(n)::value;
    row_scores<Tr, NG>(rr.q, kt, ldk, nk, D, sc.s);
    T al[NG];
    for (int g = 0; g < NG; ++g) al[g] = row_softmax<Tr>(p, enc, b, rr, g, t0, nk, sc.s[g], sc.tmp, st);
    row_values<Tr, NG>(sc.s, al, vt, v.seq_stride, nk, Dv, st.o);
  };
  fused::tail_block<Tr::row_group>(rr.n, 0, rows);
  if (has_shaw)
    for (index_t g = 0; g < rr.n; ++g) encoder_values(p, enc, sc.s[g], b, rr.i[g], t0, nk, st.o + g * Dv);
}

/// Row kernel over rows [r0, r0 + ng) of (b, hk) and keys [j0, j1): leaves
/// (max, sum, unnormalised output) per row in `st`.
template <class Tr, class T, class E>
void row_item(attention_plan<T> const& p, view<const T> q, view<const T> k, view<const T> v, E const& enc,
              index_t b, index_t hk, index_t r0, index_t ng, index_t j0, index_t j1, rotation_ids const* rot,
              T* qbuf, row_scratch<Tr, T> const& sc, row_state<T> st) noexcept {
  constexpr index_t BK = Tr::block_kv;
  row_rows<Tr, T> rr;
  row_begin<Tr>(p, q, enc, b, hk, r0, ng, j0, j1, rot, qbuf, rr, st);
  for (index_t t0 = rr.first; t0 < rr.last; t0 += BK) {
    index_t const nk = std::min(BK, rr.last - t0);
    if (t0 + BK < rr.last) {
      // Rows of one head sit a token stride apart (often in different 4 KiB
      // pages, where hardware prefetchers stop): fetch the next tile now.
      index_t const nn = std::min(BK, rr.last - t0 - BK);
      prefetch_rows(k.ptr(b, t0 + BK, hk), k.seq_stride, nn, p.head_dim);
      prefetch_rows(v.ptr(b, t0 + BK, hk), v.seq_stride, nn, p.value_dim);
    }
    row_tile<Tr>(p, k, v, enc, b, hk, rr, t0, nk, rot, sc, st);
  }
}

/// Decode: rows [0, R) of every kv head of batch entry b (R below a lane
/// block, in groups of row_group) against keys [j0, j1), walking the keys tile
/// by tile with all heads of a tile together, so that the cache is read as
/// one front moving through memory (one work item per batch entry and key
/// chunk, not per head); every group of a head reuses the head's tile from
/// cache. The hardware prefetchers follow this front: software prefetch of
/// the next tile made it slower. `states(hk, grp)` gives the state of a row
/// group; rr holds Hkv * groups entries.
template <class Tr, class T, class E, class StateOf>
void decode_item(attention_plan<T> const& p, view<const T> q, view<const T> k, view<const T> v, E const& enc,
                 index_t b, index_t j0, index_t j1, rotation_ids const* rot, T* qbuf, row_scratch<Tr, T> const& sc,
                 row_rows<Tr, T>* rr, StateOf const& states) noexcept {
  constexpr index_t RG = Tr::row_group, BK = Tr::block_kv;
  index_t const Hkv = p.kv_heads, R = p.q_len * p.group, groups = (R + RG - 1) / RG;
  index_t first = j1, last = j0;
  for (index_t u = 0; u < Hkv * groups; ++u) {
    index_t const hk = u / groups, r0 = u % groups * RG;
    row_begin<Tr>(p, q, enc, b, hk, r0, std::min(RG, R - r0), j0, j1, rot, qbuf + u * RG * p.head_dim, rr[u],
                  states(hk, u % groups));
    if (rr[u].first < rr[u].last) {
      first = std::min(first, rr[u].first);
      last = std::max(last, rr[u].last);
    }
  }
  for (index_t t0 = first; t0 < last; t0 += BK) {
    index_t const nk = std::min(BK, last - t0);
    for (index_t u = 0; u < Hkv * groups; ++u) {
      // This group's own visible union, clipped to the tile.
      index_t const a = std::max(t0, rr[u].first), e = std::min(t0 + nk, rr[u].last);
      if (a < e) row_tile<Tr>(p, k, v, enc, b, u / groups, rr[u], a, e - a, rot, sc, states(u / groups, u % groups));
    }
  }
}

/// Writes one row from (max, sum, unnormalised output).
template <class T>
void finish_row(attention_plan<T> const& p, view<T> out, index_t b, index_t h, index_t i, T m, T l,
                T const* o) noexcept {
  T* dst = out.ptr(b, i, h);
  T const inv = l > 0 ? T(1) / l : T(0);
  for (index_t d = 0; d < p.value_dim; ++d) dst[d] = o[d] * inv;
  p.set_lse(b, h, i, l > 0 ? m + std::log(l) : -std::numeric_limits<T>::infinity());
}

}  // namespace fused

/// Elements of T of the per-thread scratch of path::fused for head dims D and
/// Dv and kv_heads kv heads: depends on the tile constants, the head dims and
/// the head count only, never on the sequence lengths.
template <class T>
index_t fused_scratch_elements(index_t D, index_t Dv, index_t kv_heads = 1) noexcept {
  using Tr = fused_default_traits<T>;
  return std::max({fused::lane_sizes<Tr>::elements(D, Dv), fused::row_sizes<Tr>::elements(D, Dv),
                   fused::row_sizes<Tr>::decode_elements(D, kv_heads)});
}

/// Runs path::fused on a validated plan. `rot`: rotate q and k tiles in the
/// kernel (RoPE fused); null: q and k arrive rotated (or need no rotation).
template <class Tr, class T, class E>
void fused_attention(attention_plan<T> const& p, view<const T> q, view<const T> k, view<const T> v,
                     view<T> out, E const& enc, rotation_ids const* rot = nullptr) {
  constexpr index_t BQ = Tr::block_q, NB = Tr::blocks_per_item, RG = Tr::row_group;
  index_t const B = p.batch, Hkv = p.kv_heads, G = p.group, R = p.q_len * G, D = p.head_dim,
                Dv = p.value_dim;
  int const threads = loop_threads(p.threads);
  constexpr bool shaw = encoder_traits<E>::relative_key_value;

  if (!shaw && R >= Tr::lane_kernel_min_rows) {
    index_t const per_thread = fused::lane_sizes<Tr>::elements(D, Dv);
    auto scratch = aligned_buffer<T>::uninitialized(per_thread * threads);
    // Lane kernel: items (b, hk, run of up to NB query blocks).
    index_t const nblocks = (R + BQ - 1) / BQ;
    // Fewer blocks per item when that is what keeps every thread busy.
    index_t per_item = NB;
    while (per_item > 1 && B * Hkv * ((nblocks + per_item - 1) / per_item) < 4 * threads) per_item /= 2;
    index_t const items_per_head = (nblocks + per_item - 1) / per_item;
    std::vector<fused::lane_block<T>> blocks(static_cast<std::size_t>(NB * threads));
    parallel_for(B * Hkv * items_per_head, threads, [&](index_t it) {
      index_t const bh = it / items_per_head, sb = it % items_per_head;
      index_t const b = bh / Hkv, hk = bh % Hkv;
      int const tid = std::min(thread_index(), threads - 1);  // serial: one slot
      index_t const blk0 = sb * per_item, blk1 = std::min(nblocks, blk0 + per_item);
      fused::lane_item<Tr>(p, q, k, v, out, enc, b, hk, blk0, blk1, scratch.data() + tid * per_thread,
                           blocks.data() + tid * NB, rot);
    });
    return;
  }

  // Row kernel. Items (b, hk, group of up to RG rows, key chunk); on the
  // decode path (no Shaw terms) items (b, key chunk) covering every kv head,
  // so that K and V stream in memory order, once.
  bool const decode = !shaw;
  index_t const groups = (R + RG - 1) / RG;
  index_t const items = B * Hkv * groups;  // (b, hk, group): the states' layout
  index_t const work = decode ? B : items;  // units split into key chunks
  index_t const Sk = p.k_len, BK = Tr::block_kv;
  index_t chunks = 1;
  if (threads > 1 && work < 2 * threads && Sk >= 2 * BK) {
    chunks = std::min<index_t>((2 * threads + work - 1) / work, (Sk + BK - 1) / BK);
  }
  index_t const chunk_len = ((Sk + chunks - 1) / chunks + BK - 1) / BK * BK;
  chunks = std::max<index_t>(1, (Sk + chunk_len - 1) / chunk_len);
  index_t const per_thread = decode ? fused::row_sizes<Tr>::decode_elements(D, Hkv, groups)
                                    : fused::row_sizes<Tr>::elements(D, Dv);
  auto scratch = aligned_buffer<T>::uninitialized(per_thread * threads);
  // Partial states (m, l, o) of every (item, chunk) when split or decoding;
  // otherwise one item per thread.
  bool const all_states = chunks > 1 || decode;
  index_t const state_rows = RG * (all_states ? items * chunks : threads);
  auto states = aligned_buffer<T>::uninitialized(state_rows * (Dv + 2));
  T* const ms = states.data();
  T* const ls = ms + state_rows;
  T* const os = ls + state_rows;
  std::vector<fused::row_rows<Tr, T>> rrs(static_cast<std::size_t>(decode ? Hkv * groups * threads : 0));
  parallel_for(work * chunks, threads, [&](index_t it) {
    index_t const u = it / chunks, ch = it % chunks;
    int const tid = std::min(thread_index(), threads - 1);
    T* const base = scratch.data() + tid * per_thread;
    fused::row_scratch<Tr, T> const sc(base, D);
    T* const qbuf = base + fused::row_scratch_elements<Tr>(D);
    index_t const j0 = ch * chunk_len, j1 = std::min(Sk, j0 + chunk_len);
    if (decode) {
      index_t const b = u;
      auto state_of = [&](index_t hk, index_t grp) {
        index_t const slot = (((b * Hkv + hk) * groups + grp) * chunks + ch) * RG;
        return fused::row_state<T>{ms + slot, ls + slot, os + slot * Dv};
      };
      fused::decode_item<Tr>(p, q, k, v, enc, b, j0, j1, rot, qbuf, sc, rrs.data() + tid * Hkv * groups, state_of);
      return;
    }
    index_t const bh = u / groups, grp = u % groups;
    index_t const b = bh / Hkv, hk = bh % Hkv;
    index_t const r0 = grp * RG, ng = std::min(RG, R - r0);
    index_t const slot = all_states ? it * RG : static_cast<index_t>(tid) * RG;
    fused::row_state<T> st{ms + slot, ls + slot, os + slot * Dv};
    fused::row_item<Tr>(p, q, k, v, enc, b, hk, r0, ng, j0, j1, rot, qbuf, sc, st);
    if (!all_states) {
      for (index_t g = 0; g < ng; ++g) {
        index_t const r = r0 + g;
        fused::finish_row(p, out, b, hk * G + r % G, r / G, st.m[g], st.l[g], st.o + g * Dv);
      }
    }
  });
  if (!all_states) return;
  // Merge the chunks of each row with the log-sum-exp rule (docs/formulas.md 5.5).
  parallel_for(items, threads, [&](index_t item) {
    index_t const bh = item / groups, grp = item % groups;
    index_t const b = bh / Hkv, hk = bh % Hkv;
    index_t const r0 = grp * RG, ng = std::min(RG, R - r0);
    T* acc = os + (item * chunks) * RG * Dv;  // chunk 0's rows receive the merge
    for (index_t g = 0; g < ng; ++g) {
      T mx = -std::numeric_limits<T>::infinity();
      for (index_t ch = 0; ch < chunks; ++ch) mx = std::max(mx, ms[(item * chunks + ch) * RG + g]);
      T* o = acc + g * Dv;
      T l = 0;
      if (mx != -std::numeric_limits<T>::infinity()) {
        for (index_t d = 0; d < Dv; ++d) o[d] *= std::exp(ms[item * chunks * RG + g] - mx);
        l = ls[item * chunks * RG + g] * std::exp(ms[item * chunks * RG + g] - mx);
        for (index_t ch = 1; ch < chunks; ++ch) {
          index_t const s = (item * chunks + ch) * RG + g;
          T const w = std::exp(ms[s] - mx);
          l += ls[s] * w;
          T const* oc = os + s * Dv;
          for (index_t d = 0; d < Dv; ++d) o[d] += w * oc[d];
        }
      }
      index_t const r = r0 + g;
      fused::finish_row(p, out, b, hk * G + r % G, r / G, mx, l, o);
    }
  });
}

/// path::fused: see the top of this file.
template <>
struct kernel<path::fused> {
  static constexpr bool available = true;
  static constexpr bool provides_scores = false;
  /// With an encoder whose rotation is reserved for the call's length (rope
  /// after reserve), q blocks and key tiles are rotated here as they are
  /// loaded (a key tile once per work item, for all its query blocks); else
  /// the entry point passes rotated copies.
  static constexpr bool rotates_itself = true;
  template <class T, class E>
  static void run(attention_plan<T> const& p, view<const T> q, view<const T> k, view<const T> v,
                  view<T> out, E const& enc, rotation_ids const* rot = nullptr) {
    fused_attention<fused_default_traits<T>>(p, q, k, v, out, enc, rot);
  }
};

}  // namespace posenc::detail
