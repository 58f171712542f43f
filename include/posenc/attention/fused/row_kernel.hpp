// SPDX-License-Identifier: MIT
// path::fused, room 8: the row kernel: keys along the lanes of a row of scores, up to row_group_v rows at once.
#pragma once

// Runs when a (batch, kv head) has fewer rows than a lane block (decode,
// speculative tokens) and for Shaw terms (which need each query vector). Up
// to row_group_v rows share every K and V row load. A row keeps (max, sum,
// unnormalised output) in a `row_state`, so that a key range split across
// threads can be merged afterwards (fused/decode.hpp).
// May include: the fused/ rooms above it, attention/plan.hpp, encoding/, core/.

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "posenc/attention/fused/micro_kernels.hpp"
#include "posenc/attention/fused/rotary.hpp"
#include "posenc/attention/fused/row_products.hpp"
#include "posenc/attention/fused/scratch.hpp"
#include "posenc/attention/fused/softmax.hpp"
#include "posenc/attention/fused/traits.hpp"
#include "posenc/attention/plan.hpp"

namespace posenc::detail::fused {

/// Partial result of the row kernel for rows g = 0, 1, ...: running max m[g],
/// sum l[g] and the unnormalised output o + g * value_dim.
template <class T>
struct row_state {
  T* m;
  T* l;
  T* o;
};

/// Rows [r0, r0 + n) of one (b, kv head): query row pointers (rotated copies
/// when RoPE is fused), positions, visible key ranges.
template <class Tr>
struct row_rows {
  using T = typename Tr::value_type;
  T const* q[Tr::row_group_v];
  index_t i[Tr::row_group_v], h[Tr::row_group_v];
  key_range kr[Tr::row_group_v];
  index_t n = 0;
  index_t first = 0, last = 0;  // union of the visible ranges
};

/// Per-thread scratch of the row kernel, described once by lay_out:
/// `query_rows` rotated query rows (one row group, or every group of every
/// kv head on the decode path).
template <class Tr>
struct row_scratch {
  using value_type = typename Tr::value_type;
  using T = value_type;
  T* s[Tr::row_group_v];  // (block_kv_v) scores, then probabilities, of each row
  T* tmp;                 // (block_kv_v) an encoder's terms of one row
  T* ktile;               // (block_kv_v, head_dim) a rotated key tile
  T* qbuf;                // (query_rows, head_dim) rotated query rows

  template <class Taker>
  void lay_out(Taker& c, index_t head_dim, index_t query_rows) {
    for (T*& r : s) r = c.take(Tr::block_kv_v);
    tmp = c.take(Tr::block_kv_v);
    ktile = c.take(Tr::block_kv_v * head_dim);
    qbuf = c.take(query_rows * head_dim);
  }
};

/// Row setup: rows [r0, r0 + ng) of (b, hk) against keys [j0, j1) get their
/// query pointers (copied into qbuf and rotated with `rot`; a 16-bit q is
/// widened into qbuf and stays float), visible ranges and a fresh state.
template <class Tr, class T, class Q, class E>
void row_begin(attention_plan<T> const& p, view<const Q> q, E const& enc, index_t b, index_t hk, index_t r0,
               index_t ng, index_t j0, index_t j1, rotation_ids const* rot, T* qbuf, row_rows<Tr>& rr,
               row_state<T> st) noexcept {
  index_t const head_dim = p.head_dim, value_dim = p.value_dim, group = p.group;
  index_t rid[Tr::row_group_v];
  rr.n = ng;
  rr.first = j1;
  rr.last = j0;
  for (index_t g = 0; g < ng; ++g) {
    index_t const r = r0 + g;
    rr.i[g] = r / group;
    rr.h[g] = hk * group + r % group;
    Q const* src = q.ptr(b, rr.i[g], rr.h[g]);
    if constexpr (!std::is_same_v<Q, T>) {  // 16-bit q: widened once, rotated below in float
      widen_row(src, head_dim, qbuf + g * head_dim);
      rr.q[g] = qbuf + g * head_dim;
      if (rot) rid[g] = rot->q[b * p.q_len + rr.i[g]];
    } else if (rot) {
      std::copy(src, src + head_dim, qbuf + g * head_dim);
      rid[g] = rot->q[b * p.q_len + rr.i[g]];
      rr.q[g] = qbuf + g * head_dim;
    } else {
      rr.q[g] = src;
    }
    rr.kr[g] = p.visible_range(b, rr.i[g], j0, j1);
    st.m[g] = -std::numeric_limits<T>::infinity();
    st.l[g] = T(0);
    std::fill(st.o + g * value_dim, st.o + (g + 1) * value_dim, T(0));
    if (!rr.kr[g].empty()) {
      rr.first = std::min(rr.first, rr.kr[g].first);
      rr.last = std::max(rr.last, rr.kr[g].last);
    }
  }
  if (rot) rotate_query_rows(p, enc, *rot, rid, ng, qbuf);
}

/// Row bias and visibility: raw scores s[0, nk) of row g of rr for keys t0 ..
/// become logits: scale, Shaw term, softcap, bias, masks (-inf where invisible).
template <class Tr, class T, class E>
void row_logits(attention_plan<T> const& p, E const& enc, index_t b, row_rows<Tr> const& rr, index_t g, index_t t0,
                index_t nk, T* s, T* tmp) noexcept {
  constexpr bool has_bias_v = encoder_traits<E>::biases_scores;
  constexpr bool has_shaw_v = encoder_traits<E>::relative_key_value;
  T const scale = static_cast<T>(p.scale);
  T const cap = static_cast<T>(p.softcap);
  index_t const ri = rr.i[g], rh = rr.h[g];
  for (index_t j = 0; j < nk; ++j) s[j] *= scale;
  if constexpr (has_shaw_v) {
    // Shaw's scale * q.aK term is part of the raw score (before the softcap).
    encoder_terms<score_term::shaw>(p, enc, rr.q[g], b, rh, ri, t0, nk, tmp);
    for (index_t j = 0; j < nk; ++j) s[j] += tmp[j];
  }
  if (cap > 0) {
    for (index_t j = 0; j < nk; ++j) s[j] = cap * std::tanh(s[j] / cap);
  }
  bool const covered = rr.kr[g].all && rr.kr[g].first <= t0 && rr.kr[g].last >= t0 + nk;
  if (has_bias_v || has_shaw_v || p.has_masks() || !covered) {
    if constexpr (has_bias_v) {
      encoder_terms<score_term::bias>(p, enc, rr.q[g], b, rh, ri, t0, nk, tmp);
      for (index_t j = 0; j < nk; ++j) s[j] += tmp[j];
    }
    apply_masks(p, b, rh, ri, t0, nk, s);
  }
}

/// Key tile [t0, t0 + nk) for the rows of rr: scores, logits, online softmax
/// update, values. Leaves (max, sum, unnormalised output) per row in `st`.
/// `Guard`: when the tile's V is not all finite, keys of probability 0 add
/// nothing (0 * NaN would be NaN); see `guarded_rerun`.
/// K and V are stored as KV: T, or a 16-bit type widened in registers as its
/// rows are loaded (a tile rotated here is widened into the float key tile).
/// `ahead` != 0 (only when a whole tile of nk keys follows this one, all in
/// the views): the rows `ahead` keys further on are fetched line by line
/// among this tile's loads (row_scores), or, when the tile is rotated here,
/// the next tile's key rows all at once.
template <class Tr, bool Guard, class T, class KV, class E>
void row_tile(attention_plan<T> const& p, view<const KV> k, view<const KV> v, E const& enc, index_t b, index_t hk,
              row_rows<Tr> const& rr, index_t t0, index_t nk, rotation_ids const* rot, row_scratch<Tr> const& sc,
              row_state<T> st, index_t ahead = 0) noexcept {
  index_t const head_dim = p.head_dim, value_dim = p.value_dim;
  KV const* kt = k.ptr(b, t0, hk);
  index_t ldk = k.seq_stride;
  index_t ahead_k = ahead * k.seq_stride;
  index_t const ahead_v = ahead * v.seq_stride;
  [[maybe_unused]] T const* kw = nullptr;  // 16-bit KV: the rotated tile, widened
  if (rot && rot->k) {
    // The key rows are read by the rotation, into scratch: fetch the next
    // ones here, all at once.
    if (ahead != 0) prefetch_rows(kt + nk * k.seq_stride, k.seq_stride, nk, head_dim);
    ahead_k = 0;
    rotate_key_tile(p, k, enc, *rot, b, hk, t0, nk, sc.ktile);
    if constexpr (std::is_same_v<KV, T>)
      kt = sc.ktile;
    else
      kw = sc.ktile;
    ldk = head_dim;
  }
  KV const* vt = v.ptr(b, t0, hk);
  bool const guarded = Guard && !rows_finite<Tr>(vt, v.seq_stride, nk, value_dim);
  // Scores of every row, each row's softmax update, then the values of every
  // row (each K and V row loaded once for all rows).
  auto rows = [&](index_t, auto n) {
    constexpr int ng_v = decltype(n)::value;
    bool const end_to_end = ldk == head_dim;
    if (ahead_k != 0)
      row_scores<Tr, ng_v, true>(rr.q, strided_rows<KV>{kt, ldk}, strided_rows<KV>{kt + ahead_k, ldk}, nk, head_dim,
                                 sc.s, end_to_end);
    else if (kw)  // 16-bit keys rotated here: the widened tile
      row_scores<Tr, ng_v, false>(rr.q, strided_rows<T>{kw, ldk}, strided_rows<T>{kw, ldk}, nk, head_dim, sc.s,
                                  end_to_end);
    else
      row_scores<Tr, ng_v, false>(rr.q, strided_rows<KV>{kt, ldk}, strided_rows<KV>{kt, ldk}, nk, head_dim, sc.s,
                                  end_to_end);
    T al[size_v<ng_v>];
    for (int g = 0; g < ng_v; ++g) {
      row_logits<Tr>(p, enc, b, rr, g, t0, nk, sc.s[g], sc.tmp);
      al[g] = row_softmax_update<Tr>(sc.s[g], nk, st.m[g], st.l[g]);
    }
    strided_rows<KV> const vr{vt, v.seq_stride}, vn{vt + ahead_v, v.seq_stride};
    if (guarded)  // rare (V not all finite): no fetch
      row_values<Tr, ng_v, true, false>(sc.s, al, vr, vr, nk, value_dim, st.o);
    else if (ahead_v != 0)
      row_values<Tr, ng_v, false, true>(sc.s, al, vr, vn, nk, value_dim, st.o);
    else
      row_values<Tr, ng_v, false, false>(sc.s, al, vr, vr, nk, value_dim, st.o);
  };
  tail_block<Tr::row_group_v>(rr.n, 0, rows);
  if constexpr (encoder_traits<E>::relative_key_value)
    for (index_t g = 0; g < rr.n; ++g) encoder_values(p, enc, sc.s[g], b, rr.i[g], t0, nk, st.o + g * value_dim);
}

/// The unnormalised outputs of `ng` rows of a state are all finite.
template <class T>
bool row_outputs_finite(row_state<T> st, index_t ng, index_t value_dim) noexcept {
  bool finite = true;
  for (index_t n = 0; n < ng * value_dim; ++n) finite = finite && std::isfinite(st.o[n]);
  return finite;
}

/// A key of probability 0 (one the row cannot see, or whose logit is -inf or
/// underflows) adds nothing, even with NaN or Inf in its v. An item runs its
/// tiles unguarded first (`run(std::false_type)`, code without any guard): a
/// finite result is then exact. Otherwise (rare: V holds NaN or Inf) it runs
/// again with the guard (`run(std::true_type)`), which gives the same values
/// where the first run was finite.
template <class Run, class Finite>
void guarded_rerun(Run const& run, Finite const& finite) noexcept {
  run(std::false_type{});
  if (!finite()) run(std::true_type{});
}

/// Keys per step of a row walk (the decode walk, fused/decode.hpp, and a
/// per-head walk, row_item_tiles): a whole key tile for a float cache and
/// for Shaw terms; half_decode_step_v keys (one score block of 16) for a
/// 16-bit cache, whose rows are half as long per head: smaller steps keep the
/// reads of K and V spread among the arithmetic (docs/performance-log.md).
template <class Tr, class KV, class E>
inline constexpr index_t decode_step_v =
    std::is_same_v<KV, typename Tr::value_type> || encoder_traits<E>::relative_key_value ? Tr::block_kv_v
                                                                                       : Tr::half_decode_step_v;

/// How far ahead the head-by-head walk fetches for `rows` query rows, in
/// keys: as row j of a step is loaded, row j + fetch_ahead(rows) is fetched.
/// One row (one query per kv head, its key rows read in memory order:
/// one_row_scores) fetches an eighth of a float step on (8 keys) and a
/// quarter of a 16-bit one (4 keys). Fetching a whole step ahead left that
/// decode waiting on memory about as long as it computed; on a Zen 4 core
/// 8 keys measured at or below 2 to 64 for float, and 4 keys within the
/// spread of 2 and 6 for both 16-bit types (docs/performance-log.md). Several
/// rows (GQA), whose steps compute longer and read K side by side, measured
/// slower with it and fetch the next step.
template <class Tr, class KV, class E>
constexpr index_t fetch_ahead(index_t rows) noexcept {
  constexpr index_t step_v = decode_step_v<Tr, KV, E>;
  if (rows > 1) return step_v;
  if (std::is_same_v<KV, typename Tr::value_type>) return std::max<index_t>(1, step_v / 8);
  return std::max<index_t>(1, step_v / 4);
}

/// Every step (decode_step_v keys) of the rows of rr (set up by row_begin)
/// over their visible keys [rr.first, rr.last) of (b, hk); `Guard` as in
/// row_tile. A step followed by a whole one fetches, among its own loads,
/// line by line, the rows fetch_ahead keys on (a run of fetches before the
/// step's arithmetic stalls it: docs/performance-log.md); the last, shorter
/// step is fetched all at once. The steps are the decode walk's, laid from
/// the first visible key: where the rows' keys start together, both walks
/// give the same bits; so does the walk over gathered pages (fused/paged_rows.hpp).
template <class Tr, bool Guard, class T, class KV, class E>
void row_steps(attention_plan<T> const& p, view<const KV> k, view<const KV> v, E const& enc, index_t b, index_t hk,
               row_rows<Tr> const& rr, rotation_ids const* rot, row_scratch<Tr> const& sc, row_state<T> st) noexcept {
  constexpr index_t bk_v = decode_step_v<Tr, KV, E>;
  for (index_t t0 = rr.first; t0 < rr.last; t0 += bk_v) {
    index_t const nk = std::min(bk_v, rr.last - t0), nn = std::min(bk_v, rr.last - t0 - nk);
    if (nn > 0 && nn < bk_v) {
      prefetch_rows(k.ptr(b, t0 + bk_v, hk), k.seq_stride, nn, p.head_dim);
      prefetch_rows(v.ptr(b, t0 + bk_v, hk), v.seq_stride, nn, p.value_dim);
    }
    row_tile<Tr, Guard>(p, k, v, enc, b, hk, rr, t0, nk, rot, sc, st, nn == bk_v ? fetch_ahead<Tr, KV, E>(rr.n) : 0);
  }
}

/// Rows [r0, r0 + ng) of (b, hk) over keys [j0, j1): the row setup, then row_steps.
template <class Tr, bool Guard, class T, class Q, class KV, class E>
void row_item_tiles(attention_plan<T> const& p, view<const Q> q, view<const KV> k, view<const KV> v, E const& enc,
                    index_t b, index_t hk, index_t r0, index_t ng, index_t j0, index_t j1, rotation_ids const* rot,
                    row_scratch<Tr> const& sc, row_state<T> st) noexcept {
  row_rows<Tr> rr;
  row_begin<Tr>(p, q, enc, b, hk, r0, ng, j0, j1, rot, sc.qbuf, rr, st);
  row_steps<Tr, Guard>(p, k, v, enc, b, hk, rr, rot, sc, st);
}

/// Row kernel over rows [r0, r0 + ng) of (b, hk) and keys [j0, j1): leaves
/// (max, sum, unnormalised output) per row in `st`.
template <class Tr, class T, class Q, class KV, class E>
void row_item(attention_plan<T> const& p, view<const Q> q, view<const KV> k, view<const KV> v, E const& enc,
              index_t b, index_t hk, index_t r0, index_t ng, index_t j0, index_t j1, rotation_ids const* rot,
              row_scratch<Tr> const& sc, row_state<T> st) noexcept {
  guarded_rerun([&](auto guard) {
                  row_item_tiles<Tr, decltype(guard)::value>(p, q, k, v, enc, b, hk, r0, ng, j0, j1, rot, sc, st);
                },
                [&] { return row_outputs_finite(st, ng, p.value_dim); });
}

}  // namespace posenc::detail::fused
