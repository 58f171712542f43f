// SPDX-License-Identifier: MIT
// path::fused, room 10b: attention over key chunks that sit in pages of a paged cache, merged by log-sum-exp.
#pragma once

// What this room holds: the driver of the row kernel when the keys of each
// call entry are scattered over pages. The pool is head-major (each kv head's
// rows of a page one block, paged_kv_cache), so that an item (chunk, kv head,
// row group) reads its head's keys and values as the contiguous kernel reads
// a head-major kv_cache. The keys of an entry are cut into chunks (one per
// entry, or more when that keeps the threads busy); a chunk walks its keys in
// the contiguous walk's steps, a run of pages with consecutive ids as one
// strided view, else each step's key and value rows gathered in place from
// the page runs it spans (one pointer per row, no copy), so that the online
// softmax updates once per step whatever the page size (that walk, and the
// runs, chunks and workspace it uses: fused/paged_rows.hpp); `merge_partials`
// combines the chunks of an entry. The
// plans give the true key positions (global key indices of the entry), so
// causal alignment, windows, masks and relative encoders see every key where
// it sits. All buffers live in a workspace reused across calls: once it has
// grown, a call allocates nothing.
//
// Prefill over the pages (many query rows per kv head) runs the lane kernel's
// steps instead (run_paged_lanes): an item's query blocks are set up once,
// then walk the entry's page runs, each in tiles laid from the run's first
// key so that no tile reaches past the run.
//
// Pages stored in 16 bits (S = Eigen::half or Eigen::bfloat16, T = float):
// the row kernel widens each gathered K and V row in registers as it loads
// it; the lane kernel widens each key tile once into float scratch for all
// the query blocks of its item (as over a contiguous 16-bit cache). Nothing
// else of the cache is copied. A 16-bit q is widened as its rows are read, a
// 16-bit out rounded once as each row is finished.
// May include: the fused/ rooms above it, attention/plan.hpp, core/.

#include <algorithm>
#include <cstddef>
#include <type_traits>
#include <utility>
#include <vector>

#include "posenc/attention/fused/decode.hpp"
#include "posenc/attention/fused/lane_context.hpp"
#include "posenc/attention/fused/lane_kernel.hpp"
#include "posenc/attention/fused/lane_tiles.hpp"
#include "posenc/attention/fused/micro_kernels.hpp"
#include "posenc/attention/fused/paged_rows.hpp"
#include "posenc/attention/fused/row_kernel.hpp"
#include "posenc/attention/fused/scratch.hpp"
#include "posenc/attention/fused/softmax.hpp"
#include "posenc/attention/fused/storage.hpp"
#include "posenc/attention/fused/tile_plan.hpp"
#include "posenc/attention/fused/traits.hpp"
#include "posenc/attention/plan.hpp"
#include "posenc/core/aligned_buffer.hpp"
#include "posenc/core/threading.hpp"
#if POSENC_COMPILED
#include "posenc/compiled/paged.hpp"
#endif

namespace posenc::detail::fused {

/// Every tile of blocks [0, nb) over one page run, the keys [span.first,
/// span.last) of the run starting at key `j0` (c.k and c.v view that run):
/// the steps of lane_item_tiles, with the tiles laid from j0 so that none
/// reaches outside the run. Keys arrive rotated (cached rotated); 16-bit K
/// and V of a tile are widened once into float scratch (lane_widen_tile), for
/// every block that uses the tile.
template <class Tr, bool Guard, class E, class KV, class Q, class O>
void paged_lane_tiles(lane_item_context<Tr, E, KV, Q, O> const& c, lane_scratch<Tr> const& sc,
                      block_keys<Tr> const* keys, index_t nb, key_range span, index_t j0) noexcept {
  using T = typename Tr::value_type;
  constexpr index_t bq_v = Tr::block_q_v, bk_v = Tr::block_kv_v;
  attention_plan<T> const& p = c.p;
  index_t const ldv = lane_value_stride(c);
  lane_logits<Tr> logit{static_cast<T>(p.scale), static_cast<T>(p.softcap),
                        p.softcap > 0 ? T(1) / static_cast<T>(p.softcap) : T(0), {}, 0, sc.bt, sc.diag, sc.rlo, sc.rhi};
  index_t const t_begin = span.first >= span.last ? span.last : j0 + (span.first - j0) / bk_v * bk_v;
  for (index_t t0 = t_begin; t0 < span.last; t0 += bk_v) {
    index_t const nk = std::min(bk_v, span.last - t0);
    // K and V of T read in place; 16-bit ones from ktile and vtile once widened.
    T const* kt = nullptr;
    index_t ldk = p.head_dim;
    T const* vt = sc.vtile;
    if constexpr (std::is_same_v<KV, T>) {
      kt = c.k.ptr(0, t0, c.hk);
      ldk = c.k.seq_stride;
      vt = c.v.ptr(0, t0, c.hk);
    }
    bool const diagonal_ready = c.diagonal_bias && keys_consecutive(p, 0, t0, nk);
    int v_finite = -1;  // V of the tile all finite: tested once, for every block that uses the tile
    for (index_t t = 0; t < nb; ++t) {
      tile_plan const tp = plan_tile(keys[t], t0, nk, c.per_key_terms, diagonal_ready);
      if (tp.kind == tile_kind::skipped) continue;
      if constexpr (!std::is_same_v<KV, T>) {
        if (!kt) {
          lane_widen_tile(c, sc, t0, nk);
          kt = sc.ktile;
        }
      }
      auto const& bb = sc.blocks[t];
      index_t const nvec = lane_vectors<Tr>(keys[t].rows);
      lane_tile_scores<Tr>(kt, ldk, tp.keys, p.head_dim, bb.qt, nvec, sc.st);
      lane_tile_terms(c, sc, keys[t], tp, t0, nk, nvec);
      logit.tp = tp;
      logit.nk = nk;
      lane_softmax_update<Tr>(sc.st, bq_v, tp.keys, nvec, bb.m, bb.l, bb.alpha, logit);
      if (Guard && v_finite < 0) v_finite = rows_finite<Tr>(vt, ldv, nk, p.value_dim) ? 1 : 0;
      lane_tile_values<Tr>(vt, ldv, tp.keys, p.value_dim, sc.st, nvec, bb.alpha, bb.ot, v_finite == 0);
    }
  }
}

/// The lane kernel over the pages: items (entry, kv head, up to
/// blocks_per_item_v query blocks), each walking every run of its entry's one
/// chunk (`w` planned with one chunk per entry); writes out (entries, Sq, Hq,
/// Dv) and the lse of each plan. Arguments as run_paged. The encoder has no
/// relative key or value terms (Shaw runs the row kernel). Pages of S (T, or
/// a 16-bit type: the scratch then holds a widened value tile as well).
template <class T, class S, class Q, class O, class E>
void run_paged_lanes(paged_work<T, S>& w, index_t entries, view<const Q> q, view<O> out, E const& enc,
                     rotation_ids const* rots, paged_strides const& ps, int threads_requested) {
  using Tr = fused_default_traits<T>;
  constexpr index_t bq_v = Tr::block_q_v;
  if (entries <= 0) return;
  attention_plan<T> const& p0 = w.plans[0];
  index_t const kv_heads = p0.kv_heads, rows = p0.q_len * p0.group;
  int const threads = loop_threads(threads_requested);
  index_t const widened_value_dim = std::is_same_v<S, T> ? 0 : p0.value_dim;
  index_t const per_thread = scratch_elements<lane_scratch<Tr>>(p0.head_dim, p0.value_dim, widened_value_dim);
  paged_work<T>::fit(w.scratch, per_thread * threads);
  index_t const nblocks = (rows + bq_v - 1) / bq_v;
  // Fewer blocks per item when that is what keeps every thread busy.
  index_t per_item = Tr::blocks_per_item_v;
  while (per_item > 1 && entries * kv_heads * ((nblocks + per_item - 1) / per_item) < 4 * threads) per_item /= 2;
  index_t const items_per_head = (nblocks + per_item - 1) / per_item;
  bool const has_bias = encoder_traits<E>::biases_scores;
  parallel_for(entries * kv_heads * items_per_head, threads, [&](index_t it) {
    index_t const bh = it / items_per_head, b = bh / kv_heads, hk = bh % kv_heads;
    index_t const blk0 = it % items_per_head * per_item, nb = std::min(nblocks, blk0 + per_item) - blk0;
    attention_plan<T> const& p = w.plans[static_cast<std::size_t>(b)];
    paged_chunk const& ch = w.chunks[static_cast<std::size_t>(w.first_chunk[static_cast<std::size_t>(b)])];
    int const tid = std::min(thread_index(), threads - 1);
    auto const sc = carve_scratch<lane_scratch<Tr>>(w.scratch.data() + tid * per_thread, per_thread, p.head_dim,
                                                    p.value_dim, widened_value_dim);
    view<const Q> qb = q;
    if (qb.data) qb.data += b * q.batch_stride;
    qb.batch = 1;
    view<O> ob = out;
    if (ob.data) ob.data += b * out.batch_stride;
    ob.batch = 1;
    rotation_ids const* const rot = rots ? rots + b : nullptr;
    bool const per_key = has_bias || p.has_masks();
    bool const diagonal = has_bias && !p.has_masks() && bias_shift_invariant(enc);
    view<const S> const none{};  // the setup and finish steps read no key
    lane_item_context<Tr, E, S, Q, O> const c{p, qb, none, none, ob, enc, rot, 0, hk, per_key, diagonal};
    block_keys<Tr> keys[Tr::blocks_per_item_v];
    // Setup, then every run of the entry; again with the guard when an output is not finite.
    auto walk = [&](auto guard) {
      key_range const span = lane_begin_blocks(c, sc, keys, blk0, nb);
      for (index_t ri = ch.r0; ri < ch.r1; ++ri) {
        paged_run<S> const& run = w.runs[static_cast<std::size_t>(ri)];
        key_range const part{std::max(span.first, run.j0), std::min(span.last, run.j1), false};
        if (part.empty()) continue;
        view<const S> const k = chunk_view(run.k, run.j0, run.j1, p.kv_heads, p.head_dim, ps.k_token, ps.k_head);
        view<const S> const v = chunk_view(run.v, run.j0, run.j1, p.kv_heads, p.value_dim, ps.v_token, ps.v_head);
        lane_item_context<Tr, E, S, Q, O> const cr{p, qb, k, v, ob, enc, rot, 0, hk, per_key, diagonal};
        paged_lane_tiles<Tr, decltype(guard)::value>(cr, sc, keys, nb, part, run.j0);
      }
    };
    walk(std::false_type{});
    if (!lane_outputs_finite(sc, keys, nb, p.value_dim)) walk(std::true_type{});
    lane_finish_blocks(c, sc, keys, nb);
  });
}

/// Runs the row kernel over the chunks of `w` and writes out (entries, Sq,
/// Hq, Dv) and the lse of each plan (plans 0 .. entries - 1 of `w`).
/// `rots`: per entry, the rotation of its query rows done in the kernel
/// (keys arrive rotated); null: q (entries, Sq, Hq, D) arrives rotated or
/// needs no rotation. `ps`: the pages' strides. Pages of S (T, or a 16-bit
/// type widened in registers as loaded). An item is (chunk, kv head, row
/// group): each reads its own head's keys and values, as the contiguous
/// kernel does over a head-major kv_cache.
template <class T, class S, class Q, class O, class E>
void run_paged(paged_work<T, S>& w, index_t entries, view<const Q> q, view<O> out, E const& enc,
               rotation_ids const* rots, paged_strides const& ps, int threads_requested) {
  using Tr = fused_default_traits<T>;
  constexpr index_t rg_v = Tr::row_group_v;
  if (entries <= 0) return;
  attention_plan<T> const& p0 = w.plans[0];
  index_t const kv_heads = p0.kv_heads, group = p0.group, rows = p0.q_len * group, value_dim = p0.value_dim;
  index_t const head_dim = p0.head_dim;
  index_t const groups = (rows + rg_v - 1) / rg_v;
  int const threads = loop_threads(threads_requested);
  index_t const n_chunks = static_cast<index_t>(w.chunks.size());
  index_t const per_chunk = kv_heads * groups;  // row groups of a chunk
  index_t const per_thread = scratch_elements<row_scratch<Tr>>(head_dim, rg_v);
  paged_work<T>::fit(w.scratch, per_thread * threads);
  index_t const state_rows = n_chunks * per_chunk * rg_v;
  paged_work<T>::fit(w.states, state_rows * (value_dim + 2));
  if (w.rows.size() < static_cast<std::size_t>(threads)) w.rows.resize(static_cast<std::size_t>(threads));
  T* const ms = w.states.data();
  T* const ls = ms + state_rows;
  T* const os = ls + state_rows;
  auto state_at = [&](index_t c, index_t hk, index_t grp) {
    index_t const slot = ((c * kv_heads + hk) * groups + grp) * rg_v;
    return row_state<T>{ms + slot, ls + slot, os + slot * value_dim};
  };
  // Partial states of every (chunk, kv head, row group).
  parallel_for(n_chunks * per_chunk, threads, [&](index_t it) {
    index_t const c = it / per_chunk, u = it % per_chunk;
    paged_chunk const& ch = w.chunks[static_cast<std::size_t>(c)];
    attention_plan<T> const& p = w.plans[static_cast<std::size_t>(ch.entry)];
    int const tid = std::min(thread_index(), threads - 1);
    auto const sc = carve_scratch<row_scratch<Tr>>(w.scratch.data() + tid * per_thread, per_thread, head_dim, rg_v);
    view<const Q> qb = q;
    if (qb.data) qb.data += ch.entry * q.batch_stride;
    qb.batch = 1;
    rotation_ids const* const rot = rots ? rots + ch.entry : nullptr;
    row_state<T> const st = state_at(c, u / groups, u % groups);
    row_rows<Tr>& rr = w.rows[static_cast<std::size_t>(tid)];
    guarded_rerun([&](auto guard) {
                    paged_item<Tr, decltype(guard)::value>(p, qb, w.runs.data(), ch, u, groups, ps, enc, rot, sc,
                                                           rr, st);
                  },
                  [&] { return row_outputs_finite(st, rr.n, value_dim); });
  });
  // Merge the chunks of each (entry, kv head, group) and write the rows.
  parallel_for(entries * per_chunk, threads, [&](index_t it) {
    index_t const b = it / per_chunk, u = it % per_chunk, hk = u / groups, grp = u % groups;
    index_t const c0 = w.first_chunk[static_cast<std::size_t>(b)];
    index_t const n = w.first_chunk[static_cast<std::size_t>(b) + 1] - c0;
    attention_plan<T> const& p = w.plans[static_cast<std::size_t>(b)];
    view<O> ob = out;
    if (ob.data) ob.data += b * out.batch_stride;
    ob.batch = 1;
    row_state<T> const st = state_at(c0, hk, grp);
    index_t const r0 = grp * rg_v, ng = std::min(rg_v, rows - r0);
    for (index_t g = 0; g < ng; ++g) {
      T* o = st.o + g * value_dim;
      auto const [mx, sum] = merge_partials(st.m + g, st.l + g, o, n, per_chunk * rg_v, value_dim);
      finish_row(p, ob, 0, hk * group + (r0 + g) % group, (r0 + g) / group, mx, sum, o);
    }
  });
}

/// Rows per (batch, kv head) from which a paged call runs the lane kernel: a SIMD width of
/// the kernels that run it (posenc::compiled's, where it holds them: they may be built for
/// another instruction set than the caller).
template <class T, class S, class O, class E>
index_t paged_lane_min_rows() {
#if POSENC_COMPILED
  if constexpr (std::is_same_v<T, float> && compiled_kernels::has_paged<S, T, O, E>) {
    compiled_kernels::check_once();
    return compiled_kernels::lane_min_rows();
  }
#endif
  return fused_default_traits<T>::lane_kernel_min_rows_v;
}

/// The paged kernel of a call, header-only: the lane kernel over one chunk per entry
/// (`lanes`, run_paged_lanes) or the row walk (run_paged). posenc::compiled's sources call
/// this one (a name of its own: paged_kernel below differs between its consumers and them).
template <class T, class S, class Q, class O, class E>
void run_paged_kernel(bool lanes, paged_work<T, S>& w, index_t entries, view<const Q> q, view<O> out, E const& enc,
                      rotation_ids const* rots, paged_strides const& ps, int threads) {
  // Relative key or value terms (Shaw) never take the lane kernel: it is not compiled for them.
  if constexpr (!encoder_traits<E>::relative_key_value) {
    if (lanes) {
      run_paged_lanes(w, entries, q, out, enc, rots, ps, threads);
      return;
    }
  }
  run_paged(w, entries, q, out, enc, rots, ps, threads);
}

/// The paged kernel of a call: posenc::compiled's where it holds it, else run_paged_kernel.
template <class T, class S, class Q, class O, class E>
void paged_kernel(bool lanes, paged_work<T, S>& w, index_t entries, view<const Q> q, view<O> out, E const& enc,
                  rotation_ids const* rots, paged_strides const& ps, int threads) {
#if POSENC_COMPILED
  if constexpr (std::is_same_v<T, float> && compiled_kernels::has_paged<S, Q, O, E>) {
    compiled_kernels::check_once();
    compiled_kernels::paged(lanes, w, entries, q, out, enc, rots, ps, threads);
    return;
  }
#endif
  run_paged_kernel(lanes, w, entries, q, out, enc, rots, ps, threads);
}

}  // namespace posenc::detail::fused
