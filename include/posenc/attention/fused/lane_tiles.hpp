// SPDX-License-Identifier: MIT
// path::fused, room 7b: the lane kernel's steps over one key tile for one query block.
#pragma once

// What this room holds: the steps of the lane kernel (fused/lane_kernel.hpp)
// for one key tile and one query block, in the order the kernel runs them:
// scores (st = K qt, score_tiles), the relative-key term by distance
// (Transformer-XL, position_tiles), bias and visibility (lane_tile_terms), the
// logits the online softmax update reads (lane_logits), values (ot = alpha *
// ot + V^T p), and the widening of a 16-bit K and V tile into float scratch,
// once for every block of the item (lane_widen_tile). What a tile is for a
// block comes from plan_tile (fused/tile_plan.hpp); the steps follow it.
// May include: the fused/ rooms above it, attention/plan.hpp, encoding/, core/.

#include <algorithm>
#include <limits>
#include <type_traits>

#include "posenc/attention/fused/lane_context.hpp"
#include "posenc/attention/fused/micro_kernels.hpp"
#include "posenc/attention/fused/rotary.hpp"
#include "posenc/attention/fused/storage.hpp"
#include "posenc/attention/fused/tile_plan.hpp"
#include "posenc/attention/fused/traits.hpp"
#include "posenc/attention/plan.hpp"
#include "posenc/core/simd.hpp"
#include "posenc/core/span.hpp"
#include "posenc/encoding/traits.hpp"

namespace posenc::detail::fused {

/// Lane vectors of a block that hold rows, rounded up to whole micro-tiles.
template <class Tr>
index_t lane_vectors(index_t rows) noexcept {
  constexpr index_t w_v = Tr::width_v, mq_v = Tr::micro_q_v;
  return ((rows + w_v - 1) / w_v + mq_v - 1) / mq_v * mq_v;
}

/// The score micro-tiles of one lane group, as a named functor rather than a
/// lambda so that every micro-tile (the tail too) is inlined into the kernel
/// with the block's leading dimension as a constant.
template <class Tr>
struct score_tiles {
  using T = typename Tr::value_type;
  T const* kt;
  index_t ldk, head_dim;
  T const* qt;
  T* st;
  template <class MR>
  POSENC_ALWAYS_INLINE void operator()(index_t r0, MR) const noexcept {
    constexpr index_t bq_v = Tr::block_q_v;
    score_micro<Tr, MR::value, Tr::micro_q_v>(kt + r0 * ldk, ldk, qt, bq_v, head_dim, st + r0 * bq_v, bq_v);
  }
};

/// Tile scores: st (keys, block_q_v) = K qt for the lanes that hold rows.
template <class Tr>
POSENC_ALWAYS_INLINE void lane_tile_scores(typename Tr::value_type const* kt, index_t ldk, index_t keys, index_t head_dim,
                      typename Tr::value_type const* qt, index_t nvec, typename Tr::value_type* st) noexcept {
  constexpr index_t w_v = Tr::width_v, mq_v = Tr::micro_q_v;
  for (index_t g = 0; g < nvec / mq_v; ++g)
    row_blocks<Tr::micro_rows_v>(keys, score_tiles<Tr>{kt, ldk, head_dim, qt + g * mq_v * w_v, st + g * mq_v * w_v});
}

/// The score micro-tiles of a relative-key term by distance (position_micro)
/// for one lane group; rt and c point at the distance of lane 0 and key 0.
template <class Tr>
struct position_tiles {
  using T = typename Tr::value_type;
  T const* rt;
  T const* c;
  index_t ldr, head_dim;
  T const* qt;
  T* st;
  template <class MR>
  POSENC_ALWAYS_INLINE void operator()(index_t r0, MR) const noexcept {
    constexpr index_t bq_v = Tr::block_q_v;
    position_micro<Tr, MR::value, Tr::micro_q_v>(rt - r0, ldr, c - r0, qt, bq_v, head_dim, st + r0 * bq_v, bq_v);
  }
};

/// Tile relative-key term (transformer_xl), unscaled like the scores it joins:
/// st[j][l] += q_l . R(p_l - p_j) + c(p_l - p_j). One register-tiled product
/// over the tile's lanes - keys distances when the block is one head at
/// consecutive positions, the keys are consecutive and every distance is in
/// the table; else the encoder's score_row per row.
template <class Tr, class E, class KV, class Q, class O>
void lane_tile_positions(lane_item_context<Tr, E, KV, Q, O> const& c, lane_scratch<Tr> const& sc, block_keys<Tr> const& bk,
                         typename Tr::value_type const* qt, tile_plan const& tp, index_t t0, index_t nvec) noexcept {
  using T = typename Tr::value_type;
  constexpr index_t w_v = Tr::width_v, bq_v = Tr::block_q_v, bk_v = Tr::block_kv_v, mq_v = Tr::micro_q_v;
  attention_plan<T> const& p = c.p;
  index_t const keys = tp.keys, group = p.group;
  index_t const q0 = bk.rows > 0 ? p.q_position(c.b, bk.row0 / group) : 0, k0 = p.k_position(c.b, t0);
  distance_columns<T> const dc = c.enc.columns(c.hk * group);
  index_t const first = dc.zero + q0 - k0 - (keys - 1), last = dc.zero + q0 - k0 + nvec * w_v - 1;
  bool by_distance = group == 1 && first >= 0 && last < dc.count && keys_consecutive(p, c.b, t0, keys);
  for (index_t l = 1; l < bk.rows && by_distance; ++l) by_distance = p.q_position(c.b, bk.row0 + l) == q0 + l;
  if (by_distance) {
    index_t const o = dc.zero + q0 - k0;  // distance index of lane 0, key 0
    for (index_t g = 0; g < nvec / mq_v; ++g)
      row_blocks<Tr::micro_rows_v>(keys, position_tiles<Tr>{dc.keys + o + g * mq_v * w_v, dc.bias + o + g * mq_v * w_v,
                                                            dc.stride, p.head_dim, qt + g * mq_v * w_v,
                                                            sc.st + g * mq_v * w_v});
    return;
  }
  for (index_t l = 0; l < bk.rows; ++l) {
    index_t const r = bk.row0 + l, i = r / group, h = c.hk * group + r % group;
    index_t const pi = p.q_position(c.b, i);
    if (pi < 0) continue;  // sees no key
    T* row = sc.brow + l * bk_v;
    std::fill(row, row + keys, T(0));
    T const* qi = lane_query_in(c.q.ptr(c.b, i, h), p.head_dim, sc.qrows + l * p.head_dim);
    for_each_key_run(p, c.b, t0, keys, [&](index_t kp, index_t t, index_t len) {
      c.enc.score_row(h, qi, pi, kp, len, T(1), row + t);
    });
    for (index_t j = 0; j < keys; ++j) sc.st[j * bq_v + l] += row[j];
  }
}

/// Tile bias and visibility: prepares what the tile's kind adds to the
/// scores: the diagonal (diag), the per-key terms transposed (bt, -inf where
/// invisible or masked) or the per-lane bounds (rlo, rhi).
template <class Tr, class E, class KV, class Q, class O>
void lane_tile_terms(lane_item_context<Tr, E, KV, Q, O> const& c, lane_scratch<Tr> const& sc, block_keys<Tr> const& bk,
                     tile_plan const& tp, index_t t0, index_t nk, index_t nvec) noexcept {
  using T = typename Tr::value_type;
  using A = typename Tr::arch;
  using B = typename Tr::batch;
  constexpr index_t w_v = Tr::width_v, bq_v = Tr::block_q_v, bk_v = Tr::block_kv_v;
  attention_plan<T> const& p = c.p;
  if constexpr (encoder_traits<E>::biases_scores) {
    if (tp.adds_diagonal()) {
      // Lane l at position q0 + l, key j at k0 + j: bias(l, j) = f(k0 - q0 + j - l).
      // diag[u] holds f at distance k0 - q0 + nk - 1 - u (u = 0 .. nk + bq_v - 2),
      // so lanes o .. o + w_v - 1 of key j read diag[nk - 1 - j + o ..] in order.
      index_t const n = nk + bq_v - 1;
      std::fill(sc.diag, sc.diag + n, T(0));
      c.enc.bias_row(c.hk, bk.q0 + bq_v - 1, p.k_position(c.b, t0), n, sc.diag);  // distances ascending
      std::reverse(sc.diag, sc.diag + n);
    }
  }
  if (tp.has_bounds()) {
    for (index_t l = 0; l < bq_v; ++l) {
      sc.rlo[l] = static_cast<T>(std::clamp<index_t>(bk.lo[l] - t0, -1, bk_v + 1));
      sc.rhi[l] = static_cast<T>(std::clamp<index_t>(bk.hi[l] - t0, -1, bk_v + 1));
    }
  }
  if (tp.kind != tile_kind::per_key) return;
  // One row per query in brow (bq_v, bk_v), then transposed into bt by
  // w_v x w_v register blocks.
  index_t const keys = tp.keys, group = p.group;
  for (index_t l = 0; l < bq_v; ++l) {
    T* row = sc.brow + l * bk_v;
    if (l >= bk.rows) {
      std::fill(row, row + keys, -std::numeric_limits<T>::infinity());
      continue;
    }
    index_t const r = bk.row0 + l, i = r / group, h = c.hk * group + r % group;
    encoder_terms<score_term::bias>(p, c.enc, lane_bias_query<T>(c.q.ptr(c.b, i, h)), c.b, h, i, t0, keys, row);
    if (!bk.lane_covers(l, t0, keys) || p.has_masks()) apply_masks(p, c.b, h, i, t0, keys, row);
  }
  for (index_t l0 = 0; l0 < nvec * w_v; l0 += w_v) {
    for (index_t j0 = 0; j0 < keys; j0 += w_v) {
      B blk[static_cast<std::size_t>(w_v)];
      for (index_t t = 0; t < w_v; ++t) blk[t] = simd::load<T, A>(sc.brow + (l0 + t) * bk_v + j0);
      simd::transpose(blk);
      for (index_t t = 0; t < w_v; ++t) simd::store(sc.bt + (j0 + t) * bq_v + l0, blk[t]);
    }
  }
}

/// The logits of one tile for lane_softmax_update: scale, softcap, then what
/// the tile kind adds (per-key terms, or the diagonal and per-lane bounds).
template <class Tr>
struct lane_logits {
  using T = typename Tr::value_type;
  using A = typename Tr::arch;
  using B = typename Tr::batch;
  T scale, cap, inv_cap;
  tile_plan tp;
  index_t nk;  // keys of the tile (the diagonal's offset)
  T const *bt, *diag, *rlo, *rhi;

  /// Lanes o .. o + width - 1: every operand by value (registers; no reload
  /// through a pointer the score stores might alias), bounds loaded once.
  struct at_lanes {
    B scale, cap, inv_cap, lo, hi;
    T const* bt;    // bt + o
    T const* diag;  // diag + nk - 1 + o
    bool has_cap, per_key, diagonal, bounds;
    POSENC_ALWAYS_INLINE B operator()(index_t j, B s) const noexcept {
      s = s * scale;
      if (has_cap) s = cap * simd::tanh(s * inv_cap);
      if (per_key) {  // -inf terms hide the key whatever its score holds (NaN + -inf is NaN)
        B const t = simd::load<T, A>(bt + j * Tr::block_q_v);
        B const ninf(-std::numeric_limits<T>::infinity());
        return simd::select(t == ninf, ninf, s + t);
      }
      if (diagonal) s = s + simd::load<T, A>(diag - j);
      if (bounds) {
        B const jj(static_cast<T>(j));
        s = simd::select((jj >= lo) & (jj < hi), s, B(-std::numeric_limits<T>::infinity()));
      }
      return s;
    }
  };
  POSENC_ALWAYS_INLINE at_lanes at(index_t o) const noexcept {
    return {B(scale),      B(cap),         B(inv_cap),       simd::load<T, A>(rlo + o), simd::load<T, A>(rhi + o),
            bt + o,        diag + nk - 1 + o, cap > 0,       tp.kind == tile_kind::per_key,
            tp.adds_diagonal(), tp.has_bounds()};
  }
};

/// Tile values: ot = alpha * ot + V^T p for the lanes that hold rows (p: the
/// tile's probabilities in st, alpha: the rescale factors of the softmax update).
/// `guarded`: keys add nothing where their probability is 0 (a tile whose V
/// holds NaN or Inf).
template <class Tr>
POSENC_ALWAYS_INLINE void lane_tile_values(typename Tr::value_type const* vt, index_t ldv, index_t keys, index_t value_dim,
                      typename Tr::value_type const* st, index_t nvec, typename Tr::value_type const* alpha,
                      typename Tr::value_type* ot, bool guarded) noexcept {
  using T = typename Tr::value_type;
  constexpr index_t w_v = Tr::width_v, bq_v = Tr::block_q_v, mq_v = Tr::micro_q_v;
  for (index_t g = 0; g < nvec / mq_v; ++g) {
    row_blocks<Tr::micro_rows_v>(value_dim, [&](index_t d0, auto mr) {
      constexpr int mr_v = decltype(mr)::value;
      T const* pt = st + g * mq_v * w_v;
      T const* al = alpha + g * mq_v * w_v;
      T* o = ot + d0 * bq_v + g * mq_v * w_v;
      if (guarded)
        value_micro<Tr, mr_v, mq_v, true>(vt + d0, ldv, keys, pt, bq_v, al, o, bq_v);
      else
        value_micro<Tr, mr_v, mq_v, false>(vt + d0, ldv, keys, pt, bq_v, al, o, bq_v);
    });
  }
}

/// Tile packing of 16-bit K and V: the tile's keys (rotated here, or widened)
/// into ktile and its values into vtile, as float, once for every block of the
/// item that uses the tile.
template <class Tr, class E, class KV, class Q, class O>
void lane_widen_tile(lane_item_context<Tr, E, KV, Q, O> const& c, lane_scratch<Tr> const& sc, index_t t0,
                     index_t nk) noexcept {
  using T = typename Tr::value_type;
  using A = typename Tr::arch;
  attention_plan<T> const& p = c.p;
  if (c.rot && c.rot->k)
    rotate_key_tile(p, c.k, c.enc, *c.rot, c.b, c.hk, t0, nk, sc.ktile);
  else
    widen_tile<T, A>(c.k.ptr(c.b, t0, c.hk), c.k.seq_stride, nk, p.head_dim, sc.ktile, p.head_dim);
  widen_tile<T, A>(c.v.ptr(c.b, t0, c.hk), c.v.seq_stride, nk, p.value_dim, sc.vtile, p.value_dim);
}

/// Distance between the value rows the tile steps read: V itself, or vtile.
template <class Tr, class E, class KV, class Q, class O>
POSENC_ALWAYS_INLINE index_t lane_value_stride(lane_item_context<Tr, E, KV, Q, O> const& c) noexcept {
  if constexpr (std::is_same_v<KV, typename Tr::value_type>)
    return c.v.seq_stride;
  else
    return c.p.value_dim;
}

}  // namespace posenc::detail::fused
