// SPDX-License-Identifier: MIT
// path::fused, room 10: attention over key chunks that sit in pages of a paged cache, merged by log-sum-exp.
#pragma once

// What this room holds: the driver of the row kernel when the keys of each
// call entry are scattered over runs of pages. Every run (split further when
// that keeps the threads busy) is a key chunk read in place as a strided view;
// its partial (max, sum, output) per row comes from the decode items (or the
// per-head row items with Shaw terms or many rows) of decode.hpp and
// row_kernel.hpp, and `merge_partials` combines the chunks of an entry. The
// plans give the true key positions (global key indices of the entry), so
// causal alignment, windows, masks and relative encoders see every key where
// it sits. All buffers live in a workspace reused across calls: once it has
// grown, a call allocates nothing.
// May include: the fused/ rooms above it, attention/plan.hpp, core/.

#include <algorithm>
#include <cstdint>
#include <vector>

#include "posenc/attention/fused/decode.hpp"
#include "posenc/attention/fused/row_kernel.hpp"
#include "posenc/attention/fused/scratch.hpp"
#include "posenc/attention/fused/traits.hpp"
#include "posenc/attention/plan.hpp"
#include "posenc/core/aligned_buffer.hpp"
#include "posenc/core/threading.hpp"

namespace posenc::detail::fused {

/// One key chunk: keys [j0, j1) of call entry `entry`; `k` and `v` point at
/// key j0 in its page run, laid out (token, kv head, dim) with the cache's strides.
template <class T>
struct paged_chunk {
  index_t entry = 0, j0 = 0, j1 = 0;
  T const* k = nullptr;
  T const* v = nullptr;
};

/// Buffers of a paged call, kept across calls (each only grows).
template <class T>
struct paged_work {
  using Tr = fused_default_traits<T>;
  std::vector<attention_plan<T>> plans;     // one per call entry (batch 1, global key indices)
  std::vector<paged_chunk<T>> chunks;       // every entry's chunks, entry by entry
  std::vector<index_t> first_chunk;         // (entries + 1): chunks of entry b
  std::vector<index_t> q_ids;               // (entries, Sq) query positions
  std::vector<index_t> rot_q;               // (entries, Sq) rotation ids of the queries (>= 0)
  std::vector<rotation_ids> rots;           // per entry, when the kernel rotates the queries
  std::vector<row_rows<Tr>> rows;           // per thread on the decode items
  aligned_buffer<T> scratch, states, qrot;  // per-thread scratch, partial states, rotated queries

  /// Makes `buf` hold at least n elements (contents dropped when it grows).
  static void fit(aligned_buffer<T>& buf, index_t n) {
    if (buf.size() < n) buf = aligned_buffer<T>::uninitialized(n);
  }
};

/// A view of one chunk whose key index j (j0 <= j < j1) lands on the chunk's
/// key j - j0: the kernels index keys by the entry's global key index. The
/// base address is formed as an integer so that no pointer before the page
/// run is formed; only keys of the chunk are ever addressed.
template <class T>
view<const T> chunk_view(T const* at_j0, index_t j0, index_t j1, index_t heads, index_t dim, index_t token_stride) noexcept {
  auto const addr = reinterpret_cast<std::uintptr_t>(at_j0) -
                    static_cast<std::uintptr_t>(j0) * static_cast<std::uintptr_t>(token_stride) * sizeof(T);
  return {reinterpret_cast<T const*>(addr), 1, j1, heads, dim, j1 * token_stride, token_stride, dim, 1};
}

/// Runs the row kernel over the chunks of `w` and writes out (entries, Sq,
/// Hq, Dv) and the lse of each plan (plans 0 .. entries - 1 of `w`).
/// `rots`: per entry, the rotation of its query rows done in the kernel
/// (keys arrive rotated); null: q arrives rotated or needs no rotation. `q` (entries, Sq, Hq, D) arrives rotated
/// when the encoder rotates. Key views: token strides `kstride`, `vstride`.
template <class T, class E>
void run_paged(paged_work<T>& w, index_t entries, view<const T> q, view<T> out, E const& enc,
               rotation_ids const* rots, index_t kstride, index_t vstride, int threads_requested) {
  using Tr = fused_default_traits<T>;
  constexpr index_t rg_v = Tr::row_group_v;
  if (entries <= 0) return;
  attention_plan<T> const& p0 = w.plans[0];
  index_t const kv_heads = p0.kv_heads, group = p0.group, rows = p0.q_len * group, value_dim = p0.value_dim;
  index_t const head_dim = p0.head_dim;
  index_t const groups = (rows + rg_v - 1) / rg_v;
  // Decode items walk every kv head of a chunk together (no Shaw terms, rows
  // that fit the decode scratch); otherwise an item is (chunk, kv head, group).
  bool const decode = !encoder_traits<E>::relative_key_value && groups <= Tr::max_decode_groups_v;
  int const threads = loop_threads(threads_requested);
  index_t const n_chunks = static_cast<index_t>(w.chunks.size());
  index_t const per_chunk = kv_heads * groups;  // row groups of a chunk
  index_t const items = decode ? n_chunks : n_chunks * per_chunk;
  index_t const query_rows = decode ? per_chunk * rg_v : rg_v;
  index_t const per_thread = scratch_elements<row_scratch<Tr>>(head_dim, query_rows);
  paged_work<T>::fit(w.scratch, per_thread * threads);
  index_t const state_rows = n_chunks * per_chunk * rg_v;
  paged_work<T>::fit(w.states, state_rows * (value_dim + 2));
  if (w.rows.size() < static_cast<std::size_t>(per_chunk * threads))
    w.rows.resize(static_cast<std::size_t>(per_chunk * threads));
  T* const ms = w.states.data();
  T* const ls = ms + state_rows;
  T* const os = ls + state_rows;
  auto state_at = [&](index_t c, index_t hk, index_t grp) {
    index_t const slot = ((c * kv_heads + hk) * groups + grp) * rg_v;
    return row_state<T>{ms + slot, ls + slot, os + slot * value_dim};
  };
  auto entry_q = [&](index_t b) {
    view<const T> qb = q;
    qb.data += b * q.batch_stride;
    qb.batch = 1;
    return qb;
  };
  // Partial states of every chunk.
  parallel_for(items, threads, [&](index_t it) {
    index_t const c = decode ? it : it / per_chunk;
    paged_chunk<T> const& ch = w.chunks[static_cast<std::size_t>(c)];
    attention_plan<T> const& p = w.plans[static_cast<std::size_t>(ch.entry)];
    int const tid = std::min(thread_index(), threads - 1);
    auto const sc = carve_scratch<row_scratch<Tr>>(w.scratch.data() + tid * per_thread, per_thread, head_dim,
                                                   query_rows);
    view<const T> const qb = entry_q(ch.entry);
    view<const T> const kc = chunk_view(ch.k, ch.j0, ch.j1, kv_heads, head_dim, kstride);
    view<const T> const vc = chunk_view(ch.v, ch.j0, ch.j1, kv_heads, value_dim, vstride);
    rotation_ids const* const rot = rots ? rots + ch.entry : nullptr;
    if (decode) {
      auto state_of = [&](index_t hk, index_t grp) { return state_at(c, hk, grp); };
      row_rows<Tr>* const rr = w.rows.data() + tid * per_chunk;
      guarded_rerun([&](auto guard) {
                      decode_item<Tr, decltype(guard)::value>(p, qb, kc, vc, enc, 0, ch.j0, ch.j1, rot, sc, rr,
                                                              state_of);
                    },
                    [&] {
                      bool finite = true;
                      for (index_t u = 0; u < per_chunk && finite; ++u)
                        finite = row_outputs_finite(state_of(u / groups, u % groups), rr[u].n, value_dim);
                      return finite;
                    });
    } else {
      index_t const u = it % per_chunk, hk = u / groups, grp = u % groups;
      index_t const r0 = grp * rg_v;
      row_item<Tr>(p, qb, kc, vc, enc, 0, hk, r0, std::min(rg_v, rows - r0), ch.j0, ch.j1, rot, sc,
                   state_at(c, hk, grp));
    }
  });
  // Merge the chunks of each (entry, kv head, group) and write the rows.
  parallel_for(entries * per_chunk, threads, [&](index_t it) {
    index_t const b = it / per_chunk, u = it % per_chunk, hk = u / groups, grp = u % groups;
    index_t const c0 = w.first_chunk[static_cast<std::size_t>(b)];
    index_t const n = w.first_chunk[static_cast<std::size_t>(b) + 1] - c0;
    attention_plan<T> const& p = w.plans[static_cast<std::size_t>(b)];
    view<T> ob = out;
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
