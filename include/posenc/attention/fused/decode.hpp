// SPDX-License-Identifier: MIT
// path::fused, room 9: the row-kernel driver: decode walk, key split across threads, log-sum-exp merge.
#pragma once

// What this room holds: how the row kernel's work is cut into items and put
// back together. On the decode path (no Shaw terms, K and V token-major) an
// item is (batch entry, key chunk) and walks every kv head step by step, so
// the cache is read once, as one front through memory. With Shaw terms, or
// K and V head-major (each kv head's keys one after another, as kv_cache
// stores them), an item is (b, kv head, row group, key chunk) and reads its
// head's keys and values as plain runs. When keys are split into chunks (few
// items, several threads), each chunk leaves a partial (max, sum, output) per
// row, and `merge_partials` combines them by the log-sum-exp rule
// (docs/formulas.md 5.5).
// May include: the fused/ rooms above it, attention/plan.hpp, core/.

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "posenc/attention/fused/micro_kernels.hpp"
#include "posenc/attention/fused/row_kernel.hpp"
#include "posenc/attention/fused/scratch.hpp"
#include "posenc/attention/fused/softmax.hpp"
#include "posenc/attention/fused/traits.hpp"
#include "posenc/attention/plan.hpp"
#include "posenc/core/aligned_buffer.hpp"
#include "posenc/core/threading.hpp"

namespace posenc::detail::fused {

/// The decode walk: units [u0, u1) (unit u: kv head u / groups, row group
/// u % groups; `rows_of(u)` its rows, `states(u)` its state) against keys
/// [first, last) of batch entry b, step by step with every unit of a step
/// together, so that the cache is read as one front moving through memory;
/// every group of a head reuses the head's keys from cache. `Guard` as in
/// row_tile.
///
/// The step: a float cache is walked a whole key tile at a time, and the
/// hardware prefetchers follow the front (software prefetch made it slower).
/// A 16-bit cache has rows half as long per head, and the prefetchers fall
/// behind: the walk goes half_decode_step_v keys at a time (one score block
/// of 16 keys), and while the units of one step run, each fetches its share
/// of the next step's K and V rows (of every kv head the units cover, in
/// memory order). Each unit fetching its own head's next rows among its
/// loads, as the head-major walk does (row_tile's `ahead`), was slower here.
/// Measured (docs/performance-log.md): 0.6x to 0.85x the time of the whole-tile
/// walk. `decode_step_v<Tr, KV, E>` (fused/row_kernel.hpp) is the step; a
/// walk over gathered pages takes the same steps, so that both give the same
/// bits. Encoders with Shaw-like terms (relative_key_value) never reach the
/// contiguous decode: the row kernel walks them whole tiles at a time
/// (row_item_tiles), and so does every paged walk of them, whatever KV is.
template <class Tr, bool Guard, class T, class KV, class E, class RowsOf, class StateOf>
void decode_steps(attention_plan<T> const& p, view<const KV> k, view<const KV> v, E const& enc, index_t b,
                  index_t first, index_t last, index_t u0, index_t u1, index_t groups, rotation_ids const* rot,
                  row_scratch<Tr> const& sc, RowsOf const& rows_of, StateOf const& states) noexcept {
  constexpr bool half_v = !std::is_same_v<KV, T>;
  constexpr index_t step_v = decode_step_v<Tr, KV, E>;
  index_t const units = u1 - u0;
  for (index_t t0 = first; t0 < last; t0 += step_v) {
    index_t const nk = std::min(step_v, last - t0);
    [[maybe_unused]] index_t const next = t0 + nk, nn = std::min(step_v, last - next);
    for (index_t u = u0; u < u1; ++u) {
      if constexpr (half_v) {
        if (nn > 0) {  // unit u's share of the next step's key rows, every kv head of the units
          index_t const a = next + (u - u0) * nn / units, n = next + (u - u0 + 1) * nn / units - a;
          for (index_t h = u0 / groups; h <= (u1 - 1) / groups; ++h) {
            prefetch_rows(k.ptr(b, a, h), k.seq_stride, n, p.head_dim);
            prefetch_rows(v.ptr(b, a, h), v.seq_stride, n, p.value_dim);
          }
        }
      }
      // This unit's own visible union, clipped to the step.
      row_rows<Tr> const& r = rows_of(u);
      index_t const a = std::max(t0, r.first), e = std::min(t0 + nk, r.last);
      if (a < e) row_tile<Tr, Guard>(p, k, v, enc, b, u / groups, r, a, e - a, rot, sc, states(u));
    }
  }
}

/// Decode: rows [0, R) of every kv head of batch entry b (R below a lane
/// block, in groups of row_group_v) against keys [j0, j1): one row setup per
/// unit, then decode_steps over the union of their visible keys.
/// `states(hk, grp)` gives the state of a row group; rr holds kv_heads *
/// groups entries. `Guard` as in row_tile.
template <class Tr, bool Guard, class T, class Q, class KV, class E, class StateOf>
void decode_item(attention_plan<T> const& p, view<const Q> q, view<const KV> k, view<const KV> v, E const& enc,
                 index_t b, index_t j0, index_t j1, rotation_ids const* rot, row_scratch<Tr> const& sc,
                 row_rows<Tr>* rr, StateOf const& states) noexcept {
  constexpr index_t rg_v = Tr::row_group_v;
  index_t const kv_heads = p.kv_heads, rows = p.q_len * p.group, groups = (rows + rg_v - 1) / rg_v;
  index_t first = j1, last = j0;
  for (index_t u = 0; u < kv_heads * groups; ++u) {
    index_t const hk = u / groups, r0 = u % groups * rg_v;
    row_begin<Tr>(p, q, enc, b, hk, r0, std::min(rg_v, rows - r0), j0, j1, rot, sc.qbuf + u * rg_v * p.head_dim,
                  rr[u], states(hk, u % groups));
    if (rr[u].first < rr[u].last) {
      first = std::min(first, rr[u].first);
      last = std::max(last, rr[u].last);
    }
  }
  decode_steps<Tr, Guard>(p, k, v, enc, b, first, last, 0, kv_heads * groups, groups, rot, sc,
                          [&](index_t u) -> row_rows<Tr> const& { return rr[u]; },
                          [&](index_t u) { return states(u / groups, u % groups); });
}

/// How the keys are split: `chunks` ranges of `chunk_len` keys (a multiple of
/// the tile), so that `work` units x chunks keep every thread busy.
struct key_split {
  index_t chunks = 1, chunk_len = 0;
};
template <class Tr>
key_split split_keys(index_t keys, index_t work, int threads) noexcept {
  constexpr index_t bk_v = Tr::block_kv_v;
  index_t chunks = 1;
  if (threads > 1 && work < 2 * threads && keys >= 2 * bk_v)
    chunks = std::min<index_t>((2 * threads + work - 1) / work, (keys + bk_v - 1) / bk_v);
  key_split s;
  s.chunk_len = ((keys + chunks - 1) / chunks + bk_v - 1) / bk_v * bk_v;
  s.chunks = s.chunk_len > 0 ? std::max<index_t>(1, (keys + s.chunk_len - 1) / s.chunk_len) : 1;
  return s;
}

/// The log-sum-exp merge: the partial states of row g in chunks 0 .. n - 1
/// (state c at m[c * stride], l[c * stride], o + c * stride * value_dim) are
/// combined into chunk 0's output, rescaled to the common max. Returns
/// (max, sum) of the merged row; max = -inf and sum = 0 when no chunk saw a key.
template <class T>
std::pair<T, T> merge_partials(T const* m, T const* l, T* o, index_t n, index_t stride, index_t value_dim) noexcept {
  T mx = -std::numeric_limits<T>::infinity();
  bool nan = false;  // a chunk saw a NaN score: the merged row is NaN
  for (index_t c = 0; c < n; ++c) {
    mx = std::max(mx, m[c * stride]);
    nan = nan || std::isnan(m[c * stride]) || std::isnan(l[c * stride]);
  }
  if (nan) return {std::numeric_limits<T>::quiet_NaN(), std::numeric_limits<T>::quiet_NaN()};
  if (mx == -std::numeric_limits<T>::infinity()) return {mx, T(0)};
  T const w0 = std::exp(m[0] - mx);
  for (index_t d = 0; d < value_dim; ++d) o[d] *= w0;
  T sum = l[0] * w0;
  for (index_t c = 1; c < n; ++c) {
    T const w = std::exp(m[c * stride] - mx);
    sum += l[c * stride] * w;
    T const* oc = o + c * stride * value_dim;
    for (index_t d = 0; d < value_dim; ++d) o[d] += w * oc[d];
  }
  return {mx, sum};
}

/// Writes row (b, i, h) from (max, sum, unnormalised output) and its
/// log-sum-exp (a 16-bit out rounded once).
template <class T, class O>
void finish_row(attention_plan<T> const& p, view<O> out, index_t b, index_t h, index_t i, T m, T l,
                T const* o) noexcept {
  p.set_lse(b, h, i, normalize_row(out.ptr(b, i, h), p.value_dim, o, 1, m, l));
}

/// K and V are head-major: the keys of one kv head lie closer together than
/// the kv heads of one key (make_bhsd, kv_cache's storage).
template <class KV>
bool head_major(view<const KV> k, view<const KV> v) noexcept {
  return k.seq_stride < k.head_stride && v.seq_stride < v.head_stride;
}

/// The row kernel over a validated plan: decode items (no Shaw terms, K and V
/// token-major) or per-head row items, split over key chunks when that keeps
/// the threads busy, then merged. K and V are stored as KV (T, or a 16-bit
/// type widened in registers as loaded).
///
/// Head-major K and V take the per-head row items whatever the encoder: each
/// (b, kv head) then reads its own keys and values as two plain runs through
/// memory, which the hardware prefetchers follow better than the decode
/// walk's front across every head of a token (docs/performance-log.md, "Decode
/// through a kv_cache").
template <class Tr, class T, class Q, class KV, class O, class E>
void run_row_kernel(attention_plan<T> const& p, view<const Q> q, view<const KV> k, view<const KV> v, view<O> out,
                    E const& enc, rotation_ids const* rot) {
  constexpr index_t rg_v = Tr::row_group_v;
  constexpr bool decode_walk_v = !encoder_traits<E>::relative_key_value;  // the decode walk can serve E
  bool const decode = decode_walk_v && !head_major(k, v);
  index_t const kv_heads = p.kv_heads, group = p.group, rows = p.q_len * group, value_dim = p.value_dim;
  int const threads = loop_threads(p.threads);
  index_t const groups = (rows + rg_v - 1) / rg_v;
  index_t const items = p.batch * kv_heads * groups;  // (b, hk, group): the states' layout
  index_t const work = decode ? p.batch : items;      // units split into key chunks
  key_split const split = split_keys<Tr>(p.k_len, work, threads);
  index_t const chunks = split.chunks;
  index_t const query_rows = decode ? kv_heads * groups * rg_v : rg_v;
  index_t const per_thread = scratch_elements<row_scratch<Tr>>(p.head_dim, query_rows);
  auto scratch = aligned_buffer<T>::uninitialized(per_thread * threads);
  // Partial states (m, l, o) of every (item, chunk) when split or decoding;
  // otherwise one item per thread.
  bool const all_states = chunks > 1 || decode;
  index_t const state_rows = rg_v * (all_states ? items * chunks : threads);
  auto states = aligned_buffer<T>::uninitialized(state_rows * (value_dim + 2));
  T* const ms = states.data();
  T* const ls = ms + state_rows;
  T* const os = ls + state_rows;
  std::vector<row_rows<Tr>> rrs(static_cast<std::size_t>(decode ? kv_heads * groups * threads : 0));
  parallel_for(work * chunks, threads, [&](index_t it) {
    index_t const u = it / chunks, ch = it % chunks;
    int const tid = std::min(thread_index(), threads - 1);
    auto const sc = carve_scratch<row_scratch<Tr>>(scratch.data() + tid * per_thread, per_thread, p.head_dim,
                                                   query_rows);
    index_t const j0 = ch * split.chunk_len, j1 = std::min(p.k_len, j0 + split.chunk_len);
    if (decode) {
      if constexpr (decode_walk_v) {
        index_t const b = u;
        auto state_of = [&](index_t hk, index_t grp) {
          index_t const slot = (((b * kv_heads + hk) * groups + grp) * chunks + ch) * rg_v;
          return row_state<T>{ms + slot, ls + slot, os + slot * value_dim};
        };
        row_rows<Tr>* const rr = rrs.data() + tid * kv_heads * groups;
        guarded_rerun([&](auto guard) {
                        decode_item<Tr, decltype(guard)::value>(p, q, k, v, enc, b, j0, j1, rot, sc, rr, state_of);
                      },
                      [&] {
                        bool finite = true;
                        for (index_t u2 = 0; u2 < kv_heads * groups && finite; ++u2)
                          finite = row_outputs_finite(state_of(u2 / groups, u2 % groups), rr[u2].n, value_dim);
                        return finite;
                      });
      }
    } else {
      index_t const bh = u / groups, grp = u % groups;
      index_t const b = bh / kv_heads, hk = bh % kv_heads;
      index_t const r0 = grp * rg_v, ng = std::min(rg_v, rows - r0);
      index_t const slot = all_states ? it * rg_v : static_cast<index_t>(tid) * rg_v;
      row_state<T> const st{ms + slot, ls + slot, os + slot * value_dim};
      row_item<Tr>(p, q, k, v, enc, b, hk, r0, ng, j0, j1, rot, sc, st);
      if (!all_states) {
        for (index_t g = 0; g < ng; ++g)
          finish_row(p, out, b, hk * group + (r0 + g) % group, (r0 + g) / group, st.m[g], st.l[g],
                     st.o + g * value_dim);
      }
    }
  });
  if (!all_states) return;
  parallel_for(items, threads, [&](index_t item) {
    index_t const bh = item / groups, grp = item % groups;
    index_t const b = bh / kv_heads, hk = bh % kv_heads;
    index_t const r0 = grp * rg_v, ng = std::min(rg_v, rows - r0);
    index_t const slot0 = item * chunks * rg_v;  // chunk 0's rows receive the merge
    for (index_t g = 0; g < ng; ++g) {
      T* o = os + (slot0 + g) * value_dim;
      auto const [mx, sum] = merge_partials(ms + slot0 + g, ls + slot0 + g, o, chunks, rg_v, value_dim);
      finish_row(p, out, b, hk * group + (r0 + g) % group, (r0 + g) / group, mx, sum, o);
    }
  });
}

}  // namespace posenc::detail::fused
