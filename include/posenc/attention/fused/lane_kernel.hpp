// SPDX-License-Identifier: MIT
// path::fused, room 7c: the lane kernel (prefill): query rows along the SIMD lanes, one key tile at a time.
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
// plan_tile (fused/tile_plan.hpp); the steps (fused/lane_tiles.hpp) follow it.
// May include: the fused/ rooms above it, attention/plan.hpp, encoding/, core/.

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "posenc/attention/fused/bf16_products.hpp"
#include "posenc/attention/fused/lane_context.hpp"
#include "posenc/attention/fused/lane_tiles.hpp"
#include "posenc/attention/fused/micro_kernels.hpp"
#include "posenc/attention/fused/rotary.hpp"
#include "posenc/attention/fused/scratch.hpp"
#include "posenc/attention/fused/softmax.hpp"
#include "posenc/attention/fused/tile_plan.hpp"
#include "posenc/attention/fused/traits.hpp"
#include "posenc/attention/plan.hpp"
#include "posenc/core/aligned_buffer.hpp"
#include "posenc/core/half.hpp"
#include "posenc/core/threading.hpp"
#include "posenc/encoding/traits.hpp"

namespace posenc::detail::fused {

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
