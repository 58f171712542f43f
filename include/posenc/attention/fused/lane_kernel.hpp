// SPDX-License-Identifier: MIT
// path::fused, room 7: the lane kernel (prefill): query rows along the SIMD lanes, one key tile at a time.
#pragma once

// A work item is (batch, kv head, a run of query blocks); its rows are the
// pairs (query i, query head of the kv group), so every K/V tile is loaded
// once for all query heads of a group. Per query block of block_q_v rows:
//   qt  (head_dim, block_q_v)   the block's queries, transposed once
//   st  (block_kv_v, block_q_v) scores of one key tile: st[j][l] = k_j . q_l
//                               (broadcast k_j[d], FMA with the row qt[d]);
//                               K is read in place, never packed or transposed
//                               (16-bit K and V: each tile widened once into
//                               float scratch, ktile and vtile, for all blocks)
//   ot  (value_dim, block_q_v)  output, transposed: ot[d][l] += v_j[d] * p[j][l]
// The softmax statistics are vectors over lanes (fused/softmax.hpp). What a
// tile is for a block (skipped, full, bounded, diagonal, per-key) comes from
// plan_tile (fused/tile_plan.hpp); the steps below follow it.
// May include: the fused/ rooms above it, attention/plan.hpp, encoding/, core/.

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "posenc/attention/fused/bf16_products.hpp"
#include "posenc/attention/fused/micro_kernels.hpp"
#include "posenc/attention/fused/rotary.hpp"
#include "posenc/attention/fused/scratch.hpp"
#include "posenc/attention/fused/softmax.hpp"
#include "posenc/attention/fused/storage.hpp"
#include "posenc/attention/fused/tile_plan.hpp"
#include "posenc/attention/fused/traits.hpp"
#include "posenc/attention/plan.hpp"
#include "posenc/core/aligned_buffer.hpp"
#include "posenc/core/threading.hpp"

namespace posenc::detail::fused {

/// Per-thread scratch of the lane kernel, described once by lay_out.
template <class Tr>
struct lane_scratch {
  using value_type = typename Tr::value_type;
  using T = value_type;
  struct block_buffers {
    T* qt;     // (head_dim, block_q_v) transposed queries
    T* ot;     // (value_dim, block_q_v) transposed unnormalised output
    T* m;      // (block_q_v) running max
    T* l;      // (block_q_v) running sum
    T* alpha;  // (block_q_v) rescale factor of the last tile
  };
  block_buffers blocks[Tr::blocks_per_item_v];
  T* st;     // (block_kv_v, block_q_v) scores, then probabilities
  T* bt;     // (block_kv_v, block_q_v) per-key terms, transposed
  T* brow;   // (block_q_v, block_kv_v) per-key terms, row by row
  T* rlo;    // (block_q_v) first visible key of each lane, tile-relative
  T* rhi;    // (block_q_v) end of the visible keys of each lane
  T* ktile;  // (block_kv_v, head_dim) a rotated or widened key tile
  T* vtile;  // (block_kv_v, widened_value_dim) a widened value tile (16-bit V only)
  T* qrows;  // (block_q_v, head_dim) query rows being rotated
  T* diag;   // (block_kv_v + block_q_v) one diagonal of a shift-invariant bias
  T* pairs;  // bfloat16 product operands (fused/bf16_products.hpp; nothing for float products)

  template <class Taker>
  void lay_out(Taker& c, index_t head_dim, index_t value_dim, index_t widened_value_dim = 0) {
    constexpr index_t bq_v = Tr::block_q_v, bk_v = Tr::block_kv_v;
    for (block_buffers& bb : blocks) {
      bb.qt = c.take(head_dim * bq_v);
      bb.ot = c.take(value_dim * bq_v);
      bb.m = c.take(bq_v);
      bb.l = c.take(bq_v);
      bb.alpha = c.take(bq_v);
    }
    st = c.take(bk_v * bq_v);
    bt = c.take(bk_v * bq_v);
    brow = c.take(bq_v * bk_v);
    rlo = c.take(bq_v);
    rhi = c.take(bq_v);
    ktile = c.take(bk_v * head_dim);
    vtile = c.take(bk_v * widened_value_dim);  // nothing for K and V stored as T
    qrows = c.take(bq_v * head_dim);
    diag = c.take(bk_v + bq_v);
    pairs = c.take(bf16_pair_elements<Tr>(head_dim, value_dim));
  }
};

/// What every step of one work item shares: the call, the item's (b, kv head)
/// and the per-call decisions. K and V are stored as KV: T, or a 16-bit type.
template <class Tr, class E, class KV = typename Tr::value_type, class Q = typename Tr::value_type,
          class O = typename Tr::value_type>
struct lane_item_context {
  using T = typename Tr::value_type;
  attention_plan<T> const& p;
  view<const Q> q;  // T, or a 16-bit type widened as its rows are read
  view<const KV> k, v;
  view<O> out;  // T, or a 16-bit type rounded once as each row is finished
  E const& enc;
  rotation_ids const* rot;  // rotate queries and key tiles here; null: they arrive rotated
  index_t b, hk;
  bool per_key_terms;  // a bias or masks, per (row, key) unless a diagonal applies
  bool diagonal_bias;  // a shift-invariant bias without masks
};

/// Query row copy into scratch: copied as T, or a 16-bit row widened (exactly).
template <class T, class Q>
POSENC_ALWAYS_INLINE void lane_query_row(Q const* qi, index_t head_dim, T* dst) noexcept {
  if constexpr (std::is_same_v<Q, T>)
    std::copy(qi, qi + head_dim, dst);
  else
    widen_row(qi, head_dim, dst);
}

/// A query row as T for an encoder hook: q itself, or a 16-bit row widened
/// into dst (head_dim elements of scratch no step holds at that point).
template <class T, class Q>
POSENC_ALWAYS_INLINE T const* lane_query_in(Q const* qi, index_t head_dim, T* dst) noexcept {
  if constexpr (std::is_same_v<Q, T>) {
    (void)head_dim, (void)dst;
    return qi;
  } else {
    widen_row(qi, head_dim, dst);
    return dst;
  }
}

/// The query row a bias hook receives (bias_row reads no query): q itself
/// when it is T, else null.
template <class T, class Q>
POSENC_ALWAYS_INLINE T const* lane_bias_query(Q const* qi) noexcept {
  if constexpr (std::is_same_v<Q, T>)
    return qi;
  else
    return (void)qi, static_cast<T const*>(nullptr);
}

/// Block setup: fills the transposed (rotated) queries, zero output, empty
/// statistics and the visible key ranges of blocks [blk0, blk0 + nb).
/// Returns the union [first, last) of the keys any of their rows sees.
template <class Tr, class E, class KV, class Q, class O>
key_range lane_begin_blocks(lane_item_context<Tr, E, KV, Q, O> const& c, lane_scratch<Tr> const& sc, block_keys<Tr>* keys,
                            index_t blk0, index_t nb) noexcept {
  using T = typename Tr::value_type;
  constexpr index_t bq_v = Tr::block_q_v;
  attention_plan<T> const& p = c.p;
  index_t const head_dim = p.head_dim, group = p.group, rows = p.q_len * group;
  index_t rid[static_cast<std::size_t>(bq_v)];
  key_range all{far_key_v, 0, false};
  for (index_t t = 0; t < nb; ++t) {
    auto const& bb = sc.blocks[t];
    block_keys<Tr>& bk = keys[t];
    bk.reset((blk0 + t) * bq_v, std::min(bq_v, rows - (blk0 + t) * bq_v));
    std::fill(bb.qt, bb.qt + head_dim * bq_v, T(0));
    std::fill(bb.ot, bb.ot + p.value_dim * bq_v, T(0));
    std::fill(bb.m, bb.m + bq_v, -std::numeric_limits<T>::infinity());
    std::fill(bb.l, bb.l + bq_v, T(0));
    for (index_t l = 0; l < bk.rows; ++l) {
      index_t const r = bk.row0 + l, i = r / group, h = c.hk * group + r % group;
      Q const* qi = c.q.ptr(c.b, i, h);
      if (c.rot) {
        lane_query_row<T>(qi, head_dim, sc.qrows + l * head_dim);
        rid[l] = c.rot->q[c.b * p.q_len + i];
      } else {
        for (index_t d = 0; d < head_dim; ++d) bb.qt[d * bq_v + l] = stored_value<T>(qi[d]);
      }
      bk.add_row(l, p.visible_range(c.b, i, 0, p.k_len));
    }
    // One head, consecutive positions: a shift-invariant bias is a function
    // of j - l over the tile (one diagonal, see lane_tile_terms).
    bk.q0 = bk.rows > 0 ? p.q_position(c.b, bk.row0 / group) : 0;
    bk.shifts = c.diagonal_bias && group == 1 && bk.q0 >= 0;
    for (index_t l = 1; l < bk.rows && bk.shifts; ++l) bk.shifts = p.q_position(c.b, bk.row0 + l) == bk.q0 + l;
    if (c.rot) {  // each query block rotated once, then transposed
      rotate_query_rows(p, c.enc, *c.rot, rid, bk.rows, sc.qrows);
      for (index_t l = 0; l < bk.rows; ++l)
        for (index_t d = 0; d < head_dim; ++d) bb.qt[d * bq_v + l] = sc.qrows[l * head_dim + d];
    }
    bk.close();
    all.first = std::min(all.first, bk.first);
    all.last = std::max(all.last, bk.last);
  }
  return all;
}

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

/// Finish: normalises each row of blocks [0, nb) into out (b, i, h, :) and
/// writes its log-sum-exp.
template <class Tr, class E, class KV, class Q, class O>
void lane_finish_blocks(lane_item_context<Tr, E, KV, Q, O> const& c, lane_scratch<Tr> const& sc, block_keys<Tr> const* keys,
                        index_t nb) noexcept {
  using T = typename Tr::value_type;
  index_t const group = c.p.group;
  for (index_t t = 0; t < nb; ++t) {
    auto const& bb = sc.blocks[t];
    for (index_t l = 0; l < keys[t].rows; ++l) {
      index_t const r = keys[t].row0 + l, i = r / group, h = c.hk * group + r % group;
      T const lse = normalize_row(c.out.ptr(c.b, i, h), c.p.value_dim, bb.ot + l, Tr::block_q_v, bb.m[l], bb.l[l]);
      c.p.set_lse(c.b, h, i, lse);
    }
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

/// Every tile of blocks [0, nb) of an item: scores, terms, softmax update,
/// values. `Guard`: in tiles whose V is not all finite, keys of probability 0
/// add nothing (0 * NaN would be NaN).
template <class Tr, bool Guard, class E, class KV, class Q, class O>
void lane_item_tiles(lane_item_context<Tr, E, KV, Q, O> const& c, lane_scratch<Tr> const& sc, block_keys<Tr> const* keys,
                     index_t nb, key_range span) noexcept {
  using T = typename Tr::value_type;
  constexpr index_t bq_v = Tr::block_q_v, bk_v = Tr::block_kv_v;
  attention_plan<T> const& p = c.p;
  index_t const head_dim = p.head_dim;
  lane_logits<Tr> logit{static_cast<T>(p.scale), static_cast<T>(p.softcap),
                        p.softcap > 0 ? T(1) / static_cast<T>(p.softcap) : T(0), {}, 0, sc.bt, sc.diag, sc.rlo, sc.rhi};
  index_t const t_begin = span.first >= span.last ? 0 : span.first / bk_v * bk_v;
  [[maybe_unused]] bf16_operands pairs{};
  if constexpr (has_bf16_products_v<Tr>) pairs = bf16_begin_item<Tr>(sc, nb, head_dim, p.value_dim);
  for (index_t t0 = t_begin; t0 < span.last; t0 += bk_v) {
    index_t const nk = std::min(bk_v, span.last - t0);
    // K and V of T are read in place; 16-bit ones from ktile and vtile once
    // widened (kt stays null until then, see lane_widen_tile).
    T const* kt = nullptr;
    index_t ldk = head_dim;
    T const* vt = sc.vtile;
    if constexpr (std::is_same_v<KV, T>) {
      kt = c.k.ptr(c.b, t0, c.hk);
      ldk = c.k.seq_stride;
      vt = c.v.ptr(c.b, t0, c.hk);
    }
    // The tile's keys at consecutive positions (once per tile, for every block).
    bool const diagonal_ready = c.diagonal_bias && keys_consecutive(p, c.b, t0, nk);
    int v_finite = -1;  // V of the tile all finite: tested once, for every block that uses the tile
    [[maybe_unused]] bool paired = false;  // bfloat16 products: the tile's K and V pairs made
    for (index_t t = 0; t < nb; ++t) {
      tile_plan const tp = plan_tile(keys[t], t0, nk, c.per_key_terms, diagonal_ready);
      if (tp.kind == tile_kind::skipped) continue;
      if constexpr (std::is_same_v<KV, T>) {
        if (c.rot && c.rot->k && kt != sc.ktile) {  // rotated once, for every block that uses the tile
          rotate_key_tile(p, c.k, c.enc, *c.rot, c.b, c.hk, t0, nk, sc.ktile);
          kt = sc.ktile;
          ldk = head_dim;
        }
      } else if (!kt) {  // widened (and rotated) once, for every block that uses the tile
        lane_widen_tile(c, sc, t0, nk);
        kt = sc.ktile;
      }
      auto const& bb = sc.blocks[t];
      index_t const nvec = lane_vectors<Tr>(keys[t].rows);
      if constexpr (has_bf16_products_v<Tr>) {
        if (!paired) bf16_pack_tile<Tr>(pairs, kt, ldk, vt, lane_value_stride(c), nk, head_dim, p.value_dim);
        paired = true;
        bf16_tile_scores<Tr>(pairs, t, tp.keys, head_dim, nvec, sc.st);
      } else {
        lane_tile_scores<Tr>(kt, ldk, tp.keys, head_dim, bb.qt, nvec, sc.st);
      }
      if constexpr (has_distance_columns<E, T>::value) lane_tile_positions(c, sc, keys[t], bb.qt, tp, t0, nvec);
      lane_tile_terms(c, sc, keys[t], tp, t0, nk, nvec);
      logit.tp = tp;
      logit.nk = nk;
      lane_softmax_update<Tr>(sc.st, bq_v, tp.keys, nvec, bb.m, bb.l, bb.alpha, logit);
      if (Guard && v_finite < 0) v_finite = rows_finite<Tr>(vt, lane_value_stride(c), nk, p.value_dim) ? 1 : 0;
      if constexpr (has_bf16_products_v<Tr>) {
        if (v_finite != 0) {  // a guarded tile (V not all finite) takes the float step below
          bf16_tile_values<Tr>(pairs, tp.keys, p.value_dim, sc.st, nvec, bb.alpha, bb.ot);
          continue;
        }
      }
      lane_tile_values<Tr>(vt, lane_value_stride(c), tp.keys, p.value_dim, sc.st, nvec, bb.alpha, bb.ot, v_finite == 0);
    }
  }
}

/// The unnormalised outputs of the rows of blocks [0, nb) are all finite.
template <class Tr>
bool lane_outputs_finite(lane_scratch<Tr> const& sc, block_keys<Tr> const* keys, index_t nb,
                         index_t value_dim) noexcept {
  constexpr index_t bq_v = Tr::block_q_v;
  bool finite = true;
  for (index_t t = 0; t < nb; ++t)
    for (index_t d = 0; d < value_dim; ++d)
      for (index_t l = 0; l < keys[t].rows; ++l) finite = finite && std::isfinite(sc.blocks[t].ot[d * bq_v + l]);
  return finite;
}

/// One work item of the lane kernel: (b, kv head hk), query blocks
/// [blk0, blk1), every key tile any of their rows sees. A key of probability
/// 0 adds nothing, even with NaN or Inf in its v (a key the row cannot see,
/// or whose logit is -inf or underflows). The tiles run unguarded first: a
/// finite result is then exact. Otherwise (rare: V holds NaN or Inf) the item
/// runs again with the guard, which gives the same values where the first
/// run was finite.
template <class Tr, class E, class KV, class Q, class O>
void lane_item(lane_item_context<Tr, E, KV, Q, O> const& c, lane_scratch<Tr> const& sc, index_t blk0, index_t blk1) noexcept {
  index_t const nb = blk1 - blk0;
  block_keys<Tr> keys[Tr::blocks_per_item_v];
  key_range span = lane_begin_blocks(c, sc, keys, blk0, nb);
  lane_item_tiles<Tr, false>(c, sc, keys, nb, span);
  if (!lane_outputs_finite(sc, keys, nb, c.p.value_dim)) {
    span = lane_begin_blocks(c, sc, keys, blk0, nb);
    lane_item_tiles<Tr, true>(c, sc, keys, nb, span);
  }
  lane_finish_blocks(c, sc, keys, nb);
}

/// The lane kernel over a validated plan: items (b, kv head, run of up to
/// blocks_per_item_v query blocks) spread over the threads. K and V stored as
/// a 16-bit KV are widened tile by tile (lane_widen_tile); the scratch then
/// holds a value tile as well.
template <class Tr, class T, class Q, class KV, class O, class E>
void run_lane_kernel(attention_plan<T> const& p, view<const Q> q, view<const KV> k, view<const KV> v, view<O> out,
                     E const& enc, rotation_ids const* rot) {
  constexpr index_t bq_v = Tr::block_q_v;
  index_t const batch = p.batch, kv_heads = p.kv_heads, rows = p.q_len * p.group;
  int const threads = loop_threads(p.threads);
  index_t const widened_value_dim = std::is_same_v<KV, T> ? 0 : p.value_dim;
  index_t const per_thread = scratch_elements<lane_scratch<Tr>>(p.head_dim, p.value_dim, widened_value_dim);
  auto scratch = aligned_buffer<T>::uninitialized(per_thread * threads);
  index_t const nblocks = (rows + bq_v - 1) / bq_v;
  // Fewer blocks per item when that is what keeps every thread busy.
  index_t per_item = Tr::blocks_per_item_v;
  while (per_item > 1 && batch * kv_heads * ((nblocks + per_item - 1) / per_item) < 4 * threads) per_item /= 2;
  index_t const items_per_head = (nblocks + per_item - 1) / per_item;
  bool const has_bias = encoder_traits<E>::biases_scores;
  bool const diagonal_bias = has_bias && !p.has_masks() && bias_shift_invariant(enc);
  parallel_for(batch * kv_heads * items_per_head, threads, [&](index_t it) {
    index_t const bh = it / items_per_head, sb = it % items_per_head;
    int const tid = std::min(thread_index(), threads - 1);  // serial: one slot
    auto const sc = carve_scratch<lane_scratch<Tr>>(scratch.data() + tid * per_thread, per_thread, p.head_dim,
                                                    p.value_dim, widened_value_dim);
    lane_item_context<Tr, E, KV, Q, O> const c{p,  q,  k,  v, out, enc, rot, bh / kv_heads, bh % kv_heads, has_bias || p.has_masks(),
                                     diagonal_bias};
    index_t const blk0 = sb * per_item;
    lane_item(c, sc, blk0, std::min(nblocks, blk0 + per_item));
  });
}

}  // namespace posenc::detail::fused
