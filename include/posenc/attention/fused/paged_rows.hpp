// SPDX-License-Identifier: MIT
// path::fused, room 10: a paged call's layout and the row kernel's walk of one row group over a chunk's pages.
#pragma once

// What this room holds: what a paged call is cut into (runs of pages with
// consecutive ids, key chunks, the pages' strides, the workspace paged_work
// reused across calls) and one item of the row kernel over them (paged_item):
// a row group of one kv head against a chunk's keys, in the steps of the
// contiguous head-major walk. A chunk that is one run is a strided view;
// otherwise each step's key and value rows are gathered in place from the
// page runs it spans (one pointer per row, no copy: gather_tile_rows,
// paged_row_tile), so that the online softmax updates once per step whatever
// the page size. 16-bit pages: each gathered K and V row is widened in
// registers as it is loaded. The entries that run these items and merge the
// chunks (and the lane kernel over the pages): fused/paged.hpp.
// May include: the fused/ rooms above it, attention/plan.hpp, core/.

#include <algorithm>
#include <cstddef>
#include <type_traits>
#include <vector>

#include "posenc/attention/fused/micro_kernels.hpp"
#include "posenc/attention/fused/row_kernel.hpp"
#include "posenc/attention/fused/row_products.hpp"
#include "posenc/attention/fused/softmax.hpp"
#include "posenc/attention/fused/traits.hpp"
#include "posenc/attention/plan.hpp"
#include "posenc/core/aligned_buffer.hpp"
#include "posenc/core/span.hpp"
#include "posenc/core/view.hpp"

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
/// measured about halfway, 4 and 8 no better, 32 worse (docs/performance-log.md).
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
  // pages than a quarter step (docs/performance-log.md).
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

}  // namespace posenc::detail::fused
