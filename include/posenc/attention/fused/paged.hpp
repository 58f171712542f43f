// SPDX-License-Identifier: MIT
// path::fused, room 10: attention over key chunks that sit in pages of a paged cache, merged by log-sum-exp.
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
// softmax updates once per step whatever the page size; `merge_partials`
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
#include "posenc/attention/fused/lane_kernel.hpp"
#include "posenc/attention/fused/row_kernel.hpp"
#include "posenc/attention/fused/scratch.hpp"
#include "posenc/attention/fused/storage.hpp"
#include "posenc/attention/fused/traits.hpp"
#include "posenc/attention/plan.hpp"
#include "posenc/core/aligned_buffer.hpp"
#include "posenc/core/threading.hpp"

namespace posenc::detail::fused {

/// One run of keys [j0, j1) of an entry in pages with consecutive ids; `k`
/// and `v` point at key j0, laid out (token, kv head, dim) with the cache's
/// strides; elements of the cache's storage type S.
template <class S>
struct paged_run {
  index_t j0 = 0, j1 = 0;
  S const* k = nullptr;
  S const* v = nullptr;
};

/// One key chunk: keys [j0, j1) of call entry `entry`, the runs [r0, r1) of the run list.
struct paged_chunk {
  index_t entry = 0, j0 = 0, j1 = 0, r0 = 0, r1 = 0;
};

/// Buffers of a paged call over a cache stored as S, computed in T (kept
/// across calls; each only grows).
template <class T, class S = T>
struct paged_work {
  using Tr = fused_default_traits<T>;
  std::vector<attention_plan<T>> plans;     // one per call entry (batch 1, global key indices)
  std::vector<paged_run<S>> runs;           // every chunk's runs, chunk by chunk
  std::vector<paged_chunk> chunks;          // every entry's chunks, entry by entry
  std::vector<index_t> first_chunk;         // (entries + 1): chunks of entry b
  std::vector<index_t> q_ids;               // (entries, Sq) query positions
  std::vector<index_t> rot_q;               // (entries, Sq) rotation ids of the queries (>= 0)
  std::vector<rotation_ids> rots;           // per entry, when the kernel rotates the queries
  std::vector<row_rows<Tr>> rows;           // per thread: the rows of its item
  aligned_buffer<T> scratch, states, qrot;  // per-thread scratch, partial states, rotated queries

  /// Makes `buf` hold at least n elements (contents dropped when it grows).
  static void fit(aligned_buffer<T>& buf, index_t n) {
    if (buf.size() < n) buf = aligned_buffer<T>::uninitialized(n);
  }
};

/// Strides of a paged cache's storage (elements): from one token's key (value)
/// row to the next of the same kv head, and from one kv head's rows to the next.
struct paged_strides {
  index_t k_token = 0, k_head = 0, v_token = 0, v_head = 0;
};

/// A view of one run whose key index j (j0 <= j < j1) lands on the run's
/// key j - j0: the kernels index keys by the entry's global key index, so the
/// view's base is the run's key j0 moved back by j0 tokens. Only keys j0 ..
/// j1 - 1 of the view are ever addressed.
template <class S>
view<const S> chunk_view(S const* at_j0, index_t j0, index_t j1, index_t heads, index_t dim, index_t token_stride,
                         index_t head_stride) noexcept {
  return {at_j0 - j0 * token_stride, 1, j1, heads, dim, heads * head_stride, token_stride, head_stride, 1};
}

/// The key and value rows of a row walk's current step and the next,
/// gathered from the page runs: row j (key t0 + j of the current step, t0 +
/// nk + ... of the next) of kv head 0 at k[j] and v[j] (kv head hk at + hk *
/// the head stride), so that a step spans runs and pages of any size and a
/// row can be fetched a few keys ahead across a page boundary. Rows of
/// storage type S, steps of up to the compute type T's tile size.
template <class T, class S = T>
struct paged_tile_rows {
  static constexpr std::size_t capacity_v = 2 * static_cast<std::size_t>(fused_default_traits<T>::block_kv_v);
  S const* k[capacity_v];
  S const* v[capacity_v];
};

/// Fills rows [at, at + nk) of `tr` with keys [t0, t0 + nk) of the runs from
/// `*ri` on (the runs of the chunk, in key order, that cover those keys);
/// leaves *ri on the run of key t0 + nk - 1.
template <class T, class S>
void gather_tile_rows(paged_run<S> const* runs, index_t* ri, index_t t0, index_t nk, paged_strides const& ps,
                      paged_tile_rows<T, S>& tr, index_t at) noexcept {
  index_t j = 0;
  while (j < nk) {
    while (runs[*ri].j1 <= t0 + j) ++*ri;
    paged_run<S> const& run = runs[*ri];
    index_t const off = t0 + j - run.j0, n = std::min(nk - j, run.j1 - run.j0 - off);
    for (index_t e = 0; e < n; ++e, ++j) {
      tr.k[at + j] = run.k + (off + e) * ps.k_token;
      tr.v[at + j] = run.v + (off + e) * ps.v_token;
    }
  }
}

/// Key tile [t0, t0 + nk) of kv head hk for the rows of rr, its rows
/// gathered in `tr` (row 0 = key t0): scores, logits, one online softmax
/// update, values, as row_tile does over a strided view (the same bits); the
/// keys arrive rotated (cached rotated), 16-bit rows widened in registers as
/// loaded. `Guard` as in row_tile.
/// `ahead` != 0 (a whole step follows this one, its rows gathered in `tr`
/// after this step's): the rows `ahead` keys further on are fetched line by
/// line among this tile's loads, as row_tile does.
template <class Tr, bool Guard, class T, class S, class E>
void paged_row_tile(attention_plan<T> const& p, paged_tile_rows<T, S> const& tr, E const& enc, index_t hk,
                    row_rows<Tr> const& rr, index_t t0, index_t nk, paged_strides const& ps,
                    row_scratch<Tr> const& sc, row_state<T> st, index_t ahead) noexcept {
  index_t const head_dim = p.head_dim, value_dim = p.value_dim;
  listed_rows<S> const krow{tr.k, hk * ps.k_head}, vrow{tr.v, hk * ps.v_head};
  listed_rows<S> const kn{tr.k + ahead, hk * ps.k_head}, vn{tr.v + ahead, hk * ps.v_head};
  bool guarded = false;
  if constexpr (Guard)
    for (index_t j = 0; j < nk && !guarded; ++j) guarded = !rows_finite<Tr>(vrow(j), 0, 1, value_dim);
  // Scores of every row, each row's softmax update, then the values of every row.
  auto rows = [&](index_t, auto n) {
    constexpr int ng_v = decltype(n)::value;
    if (ahead != 0)  // rows of a page lie end to end
      row_scores<Tr, ng_v, true>(rr.q, krow, kn, nk, head_dim, sc.s, true);
    else
      row_scores<Tr, ng_v, false>(rr.q, krow, krow, nk, head_dim, sc.s, true);
    T al[size_v<ng_v>];
    for (int g = 0; g < ng_v; ++g) {
      row_logits<Tr>(p, enc, 0, rr, g, t0, nk, sc.s[g], sc.tmp);
      al[g] = row_softmax_update<Tr>(sc.s[g], nk, st.m[g], st.l[g]);
    }
    if (guarded)  // rare (V not all finite): no fetch
      row_values<Tr, ng_v, true, false>(sc.s, al, vrow, vrow, nk, value_dim, st.o);
    else if (ahead != 0)
      row_values<Tr, ng_v, false, true>(sc.s, al, vrow, vn, nk, value_dim, st.o);
    else
      row_values<Tr, ng_v, false, false>(sc.s, al, vrow, vrow, nk, value_dim, st.o);
  };
  tail_block<Tr::row_group_v>(rr.n, 0, rows);
  if constexpr (encoder_traits<E>::relative_key_value)
    for (index_t g = 0; g < rr.n; ++g) encoder_values(p, enc, sc.s[g], 0, rr.i[g], t0, nk, st.o + g * value_dim);
}

/// Cache lines fetched one step early at the start of each page run that a
/// gathered walk enters. Within a run a kv head's rows lie end to end and the
/// hardware prefetchers follow them as over a contiguous cache, but each
/// run starts at an address they cannot guess: there they wait for a few
/// misses before they fetch ahead. Two early lines start them: on an Intel
/// Xeon (family 6, model 167) a decode over pages scattered in a fragmented
/// pool went from 1.25-1.44 to 1.14-1.20 times the contiguous decode; one line
/// measured about halfway, 4 and 8 no better, 32 worse (docs/performance.md).
inline constexpr index_t prime_lines_v = 2;

/// Row group u (kv head u / groups, group u % groups) of the chunk's entry
/// against the chunk's keys: the row setup, then the head-major walk of the
/// contiguous kernel (row_steps: steps of decode_step_v keys from the rows'
/// first visible key, each step fetching rows further on among its loads)
/// over the head's rows in the pages. A chunk that is one run of pages with
/// consecutive ids is a head-major strided view and takes row_steps itself;
/// otherwise each step's rows are gathered across the runs (the next step's
/// with them, so that rows further on can be fetched across a page boundary,
/// and the runs starting in the next step primed: prime_lines_v), so that the
/// softmax updates once per step whatever the page size. Either way the bits
/// are those of the contiguous kernel over the same keys. Every key keeps its
/// global index in the entry, so positions, masks and windows see it where it
/// sits. `Guard` as in row_tile.
template <class Tr, bool Guard, class T, class Q, class S, class E>
void paged_item(attention_plan<T> const& p, view<const Q> q, paged_run<S> const* runs, paged_chunk const& ch,
                index_t u, index_t groups, paged_strides const& ps, E const& enc, rotation_ids const* rot,
                row_scratch<Tr> const& sc, row_rows<Tr>& rr, row_state<T> st) noexcept {
  constexpr index_t rg_v = Tr::row_group_v;
  index_t const rows = p.q_len * p.group, hk = u / groups, r0 = u % groups * rg_v;
  row_begin<Tr>(p, q, enc, 0, hk, r0, std::min(rg_v, rows - r0), ch.j0, ch.j1, rot, sc.qbuf, rr, st);
  if (rr.first >= rr.last) return;
  if (ch.r1 - ch.r0 == 1) {
    paged_run<S> const& run = runs[ch.r0];
    view<const S> const k = chunk_view(run.k, run.j0, run.j1, p.kv_heads, p.head_dim, ps.k_token, ps.k_head);
    view<const S> const v = chunk_view(run.v, run.j0, run.j1, p.kv_heads, p.value_dim, ps.v_token, ps.v_head);
    row_steps<Tr, Guard>(p, k, v, enc, 0, hk, rr, rot, sc, st);
    return;
  }
  constexpr index_t step_v = decode_step_v<Tr, S, E>;
  // Float rows fetch fetch_ahead keys on, as row_steps does; 16-bit rows
  // keep fetching the whole next step, which measured faster over scattered
  // pages than a quarter step (docs/performance.md).
  index_t const ahead = std::is_same_v<S, T> ? fetch_ahead<Tr, S, E>(rr.n) : step_v;
  paged_tile_rows<T, S> tr;
  index_t ri = ch.r0, prime = ch.r0;
  gather_tile_rows(runs, &ri, rr.first, std::min(step_v, rr.last - rr.first), ps, tr, 0);
  for (index_t t0 = rr.first; t0 < rr.last; t0 += step_v) {
    index_t const nk = std::min(step_v, rr.last - t0), nn = std::min(step_v, rr.last - t0 - nk);
    if (nn > 0) gather_tile_rows(runs, &ri, t0 + nk, nn, ps, tr, nk);
    // The first lines of every run that starts in the next step: see prime_lines_v.
    for (; prime < ch.r1 && runs[prime].j0 < std::min(rr.last, t0 + 2 * step_v); ++prime) {
      if (runs[prime].j0 < t0 + step_v) continue;
      index_t const run_keys = runs[prime].j1 - runs[prime].j0, lines = prime_lines_v * line_elements_v<S>;
      prefetch_rows(runs[prime].k + hk * ps.k_head, 0, 1, std::min(lines, run_keys * p.head_dim));
      prefetch_rows(runs[prime].v + hk * ps.v_head, 0, 1, std::min(lines, run_keys * p.value_dim));
    }
    if (nn > 0 && nn < step_v) {  // the last, shorter step: fetched all at once, as row_steps does
      for (index_t j = nk; j < nk + nn; ++j) {
        prefetch_rows(tr.k[j] + hk * ps.k_head, 0, 1, p.head_dim);
        prefetch_rows(tr.v[j] + hk * ps.v_head, 0, 1, p.value_dim);
      }
    }
    paged_row_tile<Tr, Guard>(p, tr, enc, hk, rr, t0, nk, ps, sc, st, nn == step_v ? ahead : 0);
    std::copy(tr.k + nk, tr.k + nk + nn, tr.k);
    std::copy(tr.v + nk, tr.v + nk + nn, tr.v);
  }
}

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
    qb.data += b * q.batch_stride;
    qb.batch = 1;
    view<O> ob = out;
    ob.data += b * out.batch_stride;
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
    qb.data += ch.entry * q.batch_stride;
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
    ob.data += b * out.batch_stride;
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

}  // namespace posenc::detail::fused
