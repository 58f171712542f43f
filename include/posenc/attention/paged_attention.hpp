// SPDX-License-Identifier: MIT
// posenc::attention over a paged_kv_cache: many sequences of different lengths in one call, pages read in place.
#pragma once

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "posenc/attention/attention.hpp"
#include "posenc/attention/fused/paged.hpp"
#include "posenc/attention/paged_kv_cache.hpp"

namespace posenc {

/// Buffers of `attention(q, paged_cache, seq_ids, out, enc, opt, workspace)`,
/// kept between calls: once a call of a given shape has run, the next calls
/// of that shape (a decode loop) allocate nothing. Not shared between threads
/// calling attention at the same time.
/// @tparam T the cache's element type (float, double, or a 16-bit type, whose
///         calls compute in float)
template <class T>
class paged_attention_workspace {
 public:
  /// The compute type: T, or float for a 16-bit cache.
  using compute_type = std::conditional_t<is_half_storage_v<T>, float, T>;
  /// The buffers (internal layout of the fused path).
  detail::fused::paged_work<compute_type, T>& buffers() noexcept { return work_; }

 private:
  detail::fused::paged_work<compute_type, T> work_;
};

namespace detail {

/// Resizes v to n entries; when it grows, to twice what is asked for, so that
/// a slowly growing n (a sequence's length) reallocates only when it doubles.
template <class U>
void fit_vector(std::vector<U>& v, index_t n) {
  auto const want = static_cast<std::size_t>(n);
  if (v.capacity() < want) v.reserve(2 * want);
  v.resize(want);
}

/// The options entry b runs with: its key and query positions, its mask and lse rows.
template <class T>
attention_options<T> paged_entry_options(attention_options<T> const& opt, index_t b, index_t first, index_t keys,
                                         index_t const* q_ids, index_t sq, index_t hq, bool keys_rotated) {
  attention_options<T> o = opt;
  o.k_positions = position_span(first);
  o.q_positions = position_span::ids(q_ids + b * sq, 1, sq);
  o.key_lengths = {};
  o.mask = mask_entry(opt.mask, b, keys);
  o.bool_mask = mask_entry(opt.bool_mask, b, keys);
  if (o.lse) o.lse = output_span<T>(o.lse.data() + b * hq * sq, hq * sq);
  o.keys_rotated = keys_rotated;
  return o;
}

/// Keys (or values) of one sequence gathered into a contiguous (1, L, H, d) copy (elements as stored).
template <class T>
view<const T> gather_sequence(paged_kv_cache<T> const& cache, index_t id, bool values, std::vector<T>& buf) {
  index_t const L = cache.length(id), H = cache.kv_heads(), d = values ? cache.value_dim() : cache.head_dim();
  index_t const P = cache.page_tokens();
  buf.resize(static_cast<std::size_t>(L * H * d));
  span<const index_t> const table = cache.page_table(id);
  for (index_t t = 0; t < L; ++t) {
    index_t const page = table[t / P];
    view<const T> const src = values ? cache.page_values(page, 1) : cache.page_keys(page, 1);
    for (index_t h = 0; h < H; ++h) std::copy_n(src.ptr(0, t % P, h), d, buf.data() + (t * H + h) * d);
  }
  return make_bshd(static_cast<T const*>(buf.data()), 1, L, H, d);
}

/// The first key entry b attends to: 0, or, for an encoder with a segment
/// memory of M > 0 keys (transformer_xl), the first of the last M keys before
/// the entry's Sq queries (the memory cut of the contiguous call).
template <class E>
index_t paged_first_key(E const& enc, index_t keys, index_t sq) noexcept {
  return memory_cut_length(enc, sq, keys);
}

/// The chunks of every entry: its keys from `first_key(b)` on cut into pieces
/// of at most `max_len` keys, each listing its runs of pages with consecutive
/// ids; an entry without keys gets one empty chunk.
template <class T, class S, class F>
void plan_chunks(fused::paged_work<T, S>& w, paged_kv_cache<S> const& cache, span<const index_t> ids,
                 index_t max_len, F const& first_key) {
  index_t const P = cache.page_tokens();
  w.chunks.clear();
  w.runs.clear();
  fit_vector(w.first_chunk, ids.size() + 1);
  for (index_t b = 0; b < ids.size(); ++b) {
    w.first_chunk[static_cast<std::size_t>(b)] = static_cast<index_t>(w.chunks.size());
    index_t const L = cache.length(ids[b]), start = first_key(b);
    span<const index_t> const table = cache.page_table(ids[b]);
    index_t const runs0 = static_cast<index_t>(w.runs.size());
    index_t t = start;
    while (t < L) {  // the run of consecutive pages starting at token t
      index_t end_pg = t / P + 1;
      while (end_pg * P < L && table[end_pg] == table[end_pg - 1] + 1) ++end_pg;
      index_t const page = table[t / P];
      w.runs.push_back({t, std::min(L, end_pg * P), cache.page_keys(page, 1).ptr(0, t % P, 0),
                        cache.page_values(page, 1).ptr(0, t % P, 0)});
      t = w.runs.back().j1;
    }
    if (start >= L) {
      w.chunks.push_back({b, 0, 0, runs0, runs0});
      continue;
    }
    // Chunks of at most max_len keys, cutting a run where a chunk ends.
    index_t ri = runs0;
    for (index_t j0 = start; j0 < L; j0 += max_len) {
      index_t const j1 = std::min(L, j0 + max_len);
      while (w.runs[static_cast<std::size_t>(ri)].j1 <= j0) ++ri;
      index_t r_end = ri;
      while (r_end < static_cast<index_t>(w.runs.size()) && w.runs[static_cast<std::size_t>(r_end)].j0 < j1) ++r_end;
      w.chunks.push_back({b, j0, j1, ri, r_end});
    }
  }
  w.first_chunk[static_cast<std::size_t>(ids.size())] = static_cast<index_t>(w.chunks.size());
}

/// True when every score of enc depends on positions only through p_i - p_j,
/// so that moving all positions of a call by one shift changes neither out nor
/// lse: a relative encoder whose bias, if any, is shift-invariant. ALiBi's
/// key_only and shifted forms are relative only up to a per-row constant,
/// which the softmax cancels in out but the lse keeps.
template <class E>
bool scores_shift_invariant(E const& enc) noexcept {
  if constexpr (!encoder_traits<E>::is_relative) {
    (void)enc;
    return false;
  } else if constexpr (encoder_traits<E>::biases_scores) {
    return bias_shift_invariant(enc);
  } else {
    (void)enc;
    return true;
  }
}

/// The plan of entry b (batch 1, the sequence's keys at their global indices
/// 0 .. L - 1 and positions first + j), from validated options.
///
/// `relative`: the encoder's scores see positions only through p_i - p_j
/// (scores_shift_invariant; queries are rotated from their own ids, not from
/// the plan). Then, when every query
/// sits at or after the first key (always so for the default positions of a
/// decode step), every position is shifted down by `first`: the keys sit at
/// their indices, nothing is listed per key, and a warm plan allocates
/// nothing whatever the sequence's length and first position. Otherwise the
/// key positions are listed (growing by doubling).
template <class T, class Q, class S>
void fill_paged_plan(attention_plan<T>& p, view<const Q> q, paged_kv_cache<S> const& cache, index_t id,
                     attention_options<T> const& o, half_masks const& masks16, bool relative) {
  index_t const L = cache.length(id), first = cache.first_position(id);
  p.batch = 1;
  p.q_len = q.seq;
  p.k_len = L;
  p.q_heads = q.heads;
  p.kv_heads = cache.kv_heads();
  p.group = std::max<index_t>(1, q.heads / std::max<index_t>(1, cache.kv_heads()));
  p.head_dim = q.dim;
  p.value_dim = cache.value_dim();
  p.scale = o.scale ? *o.scale : (q.dim > 0 ? 1.0 / std::sqrt(static_cast<double>(q.dim)) : 1.0);
  p.softcap = o.softcap;
  p.window = std::min(o.sliding_window, 2 * position_limit + 1);
  p.causal = o.causal || o.sliding_window > 0;
  p.has_padding = false;
  fit_vector(p.k_valid, 1);
  p.k_valid[0] = L;
  fit_vector(p.q_pos, q.seq);
  bool shift = relative;
  for (index_t i = 0; i < q.seq; ++i) {
    p.q_pos[static_cast<std::size_t>(i)] = o.q_positions->at(0, i);
    shift = shift && p.q_pos[static_cast<std::size_t>(i)] >= first;
  }
  p.keys_are_indices = first == 0 || shift;
  if (p.keys_are_indices) {
    if (first > 0)
      for (index_t i = 0; i < q.seq; ++i) p.q_pos[static_cast<std::size_t>(i)] -= first;
    p.k_pos.clear();
  } else {
    fit_vector(p.k_pos, L);
    for (index_t j = 0; j < L; ++j) p.k_pos[static_cast<std::size_t>(j)] = first + j;
  }
  p.mask = o.mask;
  p.bool_mask = o.bool_mask;
  if (!p.mask.empty() && p.mask.data == nullptr) p.mask.batch_stride = p.mask.head_stride = p.mask.q_stride = 0;
  if (!p.bool_mask.empty() && p.bool_mask.data == nullptr)
    p.bool_mask.batch_stride = p.bool_mask.head_stride = p.bool_mask.q_stride = 0;
  set_half_masks(p, masks16);  // always: a reused plan keeps no mask of an earlier call
  p.lse = o.lse.data();
  p.scores = nullptr;
  p.threads = o.threads;
}

}  // namespace detail

namespace detail {

/// The paged call after its compile-time checks: q of Q, out of O, the cache
/// stored as S, computed in T (Q, O, S each T, or 16-bit with float T).
/// `masks16`: additive masks stored in 16 bits beside opt's float mask, with
/// its per-entry rules (batch extent 1 or the entries; key j is the
/// sequence's token j, the extent cut to each sequence's length).
template <class Path, class T, class S, class Q, class O, class E>
void paged_attention_here(view<const Q> q, paged_kv_cache<S> const& cache, span<const index_t> seq_ids,
                          view<O> out, E const& enc, attention_options<T> const& opt, half_masks const& masks16,
                          fused::paged_work<T, S>& work);

#if POSENC_COMPILED
namespace compiled_kernels {
/// True for the (page storage, q and out, encoder) whose whole paged call the library holds.
template <class S, class Q, class E>
inline constexpr bool has_paged_call = false;
#define POSENC_COMPILED_X(S, Q, E)                                                                     \
  template <>                                                                                          \
  inline constexpr bool has_paged_call<S, Q, E> = true;                                                \
  namespace entry {                                                                                    \
  void paged_attention_call(view<const Q> q, paged_kv_cache<S> const& cache, span<const index_t> seq_ids, \
                            view<Q> out, E const& enc, attention_options<float> const& opt,             \
                            half_masks const& masks16, fused::paged_work<float, S>& work);               \
  }
POSENC_COMPILED_PAGED_CALLS(POSENC_COMPILED_X)
#undef POSENC_COMPILED_X
}  // namespace compiled_kernels
#endif

/// The paged call: posenc::compiled's entry where the library holds it (validation, plan,
/// rotation and kernel), else paged_attention_here.
template <class Path, class T, class S, class Q, class O, class E>
void paged_attention(view<const Q> q, paged_kv_cache<S> const& cache, span<const index_t> seq_ids, view<O> out,
                     E const& enc, attention_options<T> const& opt, half_masks const& masks16,
                     fused::paged_work<T, S>& work) {
#if POSENC_COMPILED
  if constexpr ((std::is_same_v<Path, path::fused> || std::is_same_v<Path, path::best>) &&
                std::is_same_v<T, float> && std::is_same_v<Q, O> && compiled_kernels::has_paged_call<S, Q, E>) {
    compiled_kernels::check_once();
    compiled_kernels::entry::paged_attention_call(q, cache, seq_ids, out, enc, opt, masks16, work);
  } else
#endif
  {
    paged_attention_here<Path>(q, cache, seq_ids, out, enc, opt, masks16, work);
  }
}

/// paged_attention's work in this translation unit.
template <class Path, class T, class S, class Q, class O, class E>
void paged_attention_here(view<const Q> q, paged_kv_cache<S> const& cache, span<const index_t> seq_ids,
                          view<O> out, E const& enc, attention_options<T> const& opt, half_masks const& masks16,
                          fused::paged_work<T, S>& work) {
  char const* w = "posenc::attention";
  constexpr bool rotates = encoder_traits<E>::rotates_queries_keys;
  bool const stored_rotated = cache.keys_rotated();
  index_t const n = seq_ids.size(), Sq = q.seq;
  detail::check_view(w, "q", q);
  detail::check_view(w, "out", out);
  detail::require(n == 0 || seq_ids.data() != nullptr, w, "seq_ids.data is null, expected ", n, " entries");
  detail::check_equal(w, "q.batch", q.batch, n, "seq_ids.size()");
  detail::check_equal(w, "out.batch", out.batch, n, "seq_ids.size()");
  for (index_t b = 0; b < n; ++b)
    detail::require(cache.contains(seq_ids[b]), w, "seq_ids[", b, "] is ", seq_ids[b],
                    ", expected the id of an open sequence of the cache");
  detail::check_equal(w, "q.dim", q.dim, cache.head_dim(), "cache.head_dim()");
  detail::require(!opt.k_positions, w, "k_positions is set, expected unset with a paged_kv_cache (token j of a "
                  "sequence sits at its first_position() + j)");
  detail::require(opt.key_lengths.empty() && opt.key_lengths.data() == nullptr, w, "key_lengths has ",
                  opt.key_lengths.size(), " entries, expected none with a paged_kv_cache (each sequence has its "
                  "length(); mask keys with mask or bool_mask)");
  detail::require(!opt.scores, w, "scores is set, expected null (attention over a paged_kv_cache does "
                  "not produce the scores output)");
  detail::require(!opt.keys_rotated || stored_rotated, w, "keys_rotated is true, expected false (the cached keys "
                  "are stored unrotated)");
  detail::require(!cache.keys_rotated() || rotates, w, "the encoder's rotates_queries_keys is false, expected true "
                  "(the cached keys are stored rotated: attend with an encoder that acts as the one used on append)");
  detail::check_encoder_head_dim(w, enc, cache.head_dim());  // before the rotation's identity: the plainer fault
  if constexpr (rotates) {
    if (stored_rotated) {
      // Compared without building anything (a decode step allocates nothing); texts only to fail.
      encoder_identity const& rotation = rotation_identity_of(enc);
      if (rotation != cache.key_rotation())
        detail::fail(w, "the encoder rotates as ", rotation.text(), ", expected ",
                      cache.key_rotation().text(), " (the cached keys were rotated so: attend with the encoder used "
                      "on append)");
    }
  }
  detail::require(!rotates || stored_rotated || n == 0 || [&] {
    bool empty = true;
    for (index_t b = 0; b < n; ++b) empty = empty && cache.length(seq_ids[b]) == 0;
    return empty;
  }(), w, "the encoder's rotates_queries_keys is true, expected false (the cached keys are stored unrotated: "
          "attend with an encoder that acts as the one used on append)");
  detail::require(opt.mask.empty() || opt.mask.batch == 1 || opt.mask.batch == n, w, "mask.batch is ",
                  opt.mask.batch, ", expected 1 or ", n, " (seq_ids.size())");
  detail::require(opt.bool_mask.empty() || opt.bool_mask.batch == 1 || opt.bool_mask.batch == n, w,
                  "bool_mask.batch is ", opt.bool_mask.batch, ", expected 1 or ", n, " (seq_ids.size())");
  if (opt.q_positions) opt.q_positions->validate_shape(w, "q_positions", n, Sq);
  index_t const sq_n = detail::checked_mul(w, n, Sq, "seq_ids.size() x q.seq");
  detail::fit_vector(work.q_ids, sq_n);
  for (index_t b = 0; b < n; ++b)
    for (index_t i = 0; i < Sq; ++i)
      work.q_ids[static_cast<std::size_t>(b * Sq + i)] =
          opt.q_positions ? opt.q_positions->at(b, i) : cache.next_position(seq_ids[b]) - Sq + i;
  detail::check_output_span(w, "lse", opt.lse, detail::checked_mul(w, sq_n, q.heads, "seq_ids.size() x q.seq x q.heads"),
                            "seq_ids.size() x q.heads x q.seq");
  // Every entry validated as the call on its own sequence, before anything is written.
  view<const S> const pool_k = cache.page_keys(0, cache.pages()), pool_v = cache.page_values(0, cache.pages());
  for (index_t b = 0; b < n; ++b) {
    index_t const id = seq_ids[b];
    attention_options<T> const ob = detail::paged_entry_options(opt, b, cache.first_position(id), cache.length(id),
                                                                work.q_ids.data(), Sq, q.heads, stored_rotated);
    view<const S> kb = pool_k, vb = pool_v;
    kb.seq = vb.seq = cache.length(id);
    detail::validate(detail::entry_of(q, b), kb, vb, detail::entry_of(out, b), enc, ob, w);
  }
  if (!masks16.empty()) {
    // The 16-bit mask over all entries at once: shape as opt.mask, its key
    // extent cut to the longest sequence (the keys any entry reads), and no
    // byte shared with out or lse of any entry (entries run in parallel).
    index_t keys = 0;
    for (index_t b = 0; b < n; ++b) keys = std::max(keys, cache.length(seq_ids[b]));
    index_t const mb = masks16.half.empty() ? masks16.bfloat16.batch : masks16.half.batch;
    detail::require(mb == 1 || mb == n, w, "mask (16-bit).batch is ", mb, ", expected 1 or ", n, " (seq_ids.size())");
    view<const S> kall = pool_k;
    kall.seq = keys;
    half_masks whole = masks16;
    whole.half.k = std::min(whole.half.k, keys);
    whole.bfloat16.k = std::min(whole.bfloat16.k, keys);
    detail::check_half_masks(w, whole, q, kall, out, opt);
  }
  if (n == 0 || Sq == 0 || q.heads == 0) return;
  if constexpr (std::is_same_v<Path, path::reference> || std::is_same_v<Path, path::materialized>) {
    std::vector<S> kbuf, vbuf;
    for (index_t b = 0; b < n; ++b) {
      index_t const id = seq_ids[b];
      attention_options<T> const ob = detail::paged_entry_options(opt, b, cache.first_position(id), cache.length(id),
                                                                  work.q_ids.data(), Sq, q.heads, stored_rotated);
      view<const S> const kb = detail::gather_sequence(cache, id, false, kbuf);
      view<const S> const vb = detail::gather_sequence(cache, id, true, vbuf);
      // The contiguous call on the gathered sequence (its compile-time checks
      // are the entry point's; over 16 bits path::reference accumulates in double).
      detail::run_attention<Path, false>(detail::entry_of(q, b), kb, vb, detail::entry_of(out, b), enc, ob,
                                         detail::entry_masks(masks16, b, cache.length(id)));
    }
  } else {
    static_assert(std::is_same_v<Path, path::fused> || std::is_same_v<Path, path::best>,
                  "posenc::attention: Path must be path::reference, path::materialized, path::fused or path::best");
    // Queries rotated at their positions: in the kernel when the encoder's
    // rotation is reserved for every entry's length, else in a copy. The
    // cached keys are rotated already. The copy is of T (a 16-bit q widened
    // exactly, rotated in T, never rounded).
    view<const T> qrot{};
    bool copied = false;
    if constexpr (detail::has_content_bias<E, T>::value) {
      // Transformer-XL's u: the kernel sees q + u (content and position terms).
      detail::fused::paged_work<T, S>::fit(work.qrot, detail::checked_mul(w, sq_n, q.heads * q.dim, "q elements"));
      view<T> const qs = make_bshd(work.qrot.data(), n, Sq, q.heads, q.dim);
      for (index_t b = 0; b < n; ++b)
        for (index_t i = 0; i < Sq; ++i)
          for (index_t h = 0; h < q.heads; ++h) {
            Q const* x = q.ptr(b, i, h);
            T const* u = enc.content_bias(h);
            T* y = qs.ptr(b, i, h);
            for (index_t d = 0; d < q.dim; ++d) y[d] = detail::stored_value<T>(x[d]) + u[d];
          }
      qrot = qs;
      copied = true;
    }
    detail::rotation_ids const* rots = nullptr;
    if constexpr (rotates) {
      if (stored_rotated && q.dim > 0) {
        detail::fit_vector(work.rot_q, sq_n);
        if (work.rots.size() < static_cast<std::size_t>(n)) work.rots.resize(static_cast<std::size_t>(n));
        bool reserved = true;
        for (index_t b = 0; b < n; ++b) {
          // length = largest position + 1, as the contiguous call on this sequence asks for;
          // rows at negative positions see no key (validated) and rotate as position 0. An
          // empty sequence whose queries all sit below 0 sees no key at all: length 1 then
          // (a rotation has length >= 1; its rows give zeros whatever the rotation).
          index_t len = std::max<index_t>(1, cache.next_position(seq_ids[b]));
          for (index_t i = 0; i < Sq; ++i) {
            index_t const pi = work.q_ids[static_cast<std::size_t>(b * Sq + i)];
            len = std::max(len, pi + 1);
            work.rot_q[static_cast<std::size_t>(b * Sq + i)] = std::max<index_t>(0, pi);
          }
          work.rots[static_cast<std::size_t>(b)] = {work.rot_q.data() + b * Sq, nullptr, len};
          reserved = reserved && detail::rotation_reserved(enc, len);
        }
        if (reserved) {
          rots = work.rots.data();
        } else {
          detail::fused::paged_work<T, S>::fit(work.qrot, detail::checked_mul(w, sq_n, q.heads * q.dim, "q elements"));
          view<T> const qr = make_bshd(work.qrot.data(), n, Sq, q.heads, q.dim);
          for (index_t b = 0; b < n; ++b)
            for (index_t i = 0; i < Sq; ++i)
              for (index_t h = 0; h < q.heads; ++h)
                detail::widen_row(q.ptr(b, i, h), q.dim, qr.ptr(b, i, h));
          for (index_t b = 0; b < n; ++b) {
            detail::rotation_ids const& r = work.rots[static_cast<std::size_t>(b)];
            enc.rotate(detail::entry_of(qr, b), position_span::ids(r.q, 1, Sq), r.length);
          }
          qrot = qr;
          copied = true;
        }
      }
    }
    if (work.plans.size() < static_cast<std::size_t>(n)) work.plans.resize(static_cast<std::size_t>(n));
    // Positions shift down by each sequence's first position only when that changes no score.
    bool const shift_ok = detail::scores_shift_invariant(enc);
    index_t total = 0;
    for (index_t b = 0; b < n; ++b) {
      index_t const id = seq_ids[b];
      attention_options<T> const ob = detail::paged_entry_options(opt, b, cache.first_position(id), cache.length(id),
                                                                  work.q_ids.data(), Sq, q.heads, stored_rotated);
      detail::fill_paged_plan(work.plans[static_cast<std::size_t>(b)], detail::entry_of(q, b), cache, id, ob,
                              detail::entry_masks(masks16, b, cache.length(id)), shift_ok);
      total += cache.length(id) - detail::paged_first_key(enc, cache.length(id), Sq);
    }
    auto const first_key = [&](index_t b) { return detail::paged_first_key(enc, cache.length(seq_ids[b]), Sq); };
    using Tr = detail::fused_default_traits<T>;
    detail::fused::paged_strides const strides{pool_k.seq_stride, pool_k.head_stride, pool_v.seq_stride,
                                               pool_v.head_stride};
    // Prefill (rows enough for lanes, no relative key or value terms): the lane
    // kernel over one chunk per entry, parallel over (entry, kv head, query blocks).
    if (!encoder_traits<E>::relative_key_value &&
        Sq * work.plans[0].group >= detail::fused::paged_lane_min_rows<T, S, O, E>()) {
      detail::plan_chunks(work, cache, seq_ids, position_limit, first_key);
      if (copied)
        detail::fused::paged_kernel(true, work, n, qrot, out, enc, rots, strides, opt.threads);
      else
        detail::fused::paged_kernel(true, work, n, q, out, enc, rots, strides, opt.threads);
      return;
    }
    // Chunks: one per entry with one thread. With more, an item (chunk, kv
    // head, row group) holds at most 1 / (2 threads) of the call's work, so
    // that every thread gets work: entries are cut into pieces only when
    // their items are too few or too uneven for that (a decode over several
    // kv heads usually is not cut, as over a contiguous kv_cache).
    int const threads = loop_threads(opt.threads);
    index_t max_len = position_limit;
    if (threads > 1) {
      index_t const units = cache.kv_heads() * ((Sq * work.plans[0].group + Tr::row_group_v - 1) / Tr::row_group_v);
      index_t const target = (total * units + 2 * threads - 1) / (2 * threads);
      max_len = std::max<index_t>(Tr::block_kv_v, (target + Tr::block_kv_v - 1) / Tr::block_kv_v * Tr::block_kv_v);
    }
    detail::plan_chunks(work, cache, seq_ids, max_len, first_key);
    if (copied)
      detail::fused::paged_kernel(false, work, n, qrot, out, enc, rots, strides, opt.threads);
    else
      detail::fused::paged_kernel(false, work, n, q, out, enc, rots, strides, opt.threads);
  }
}


}  // namespace detail

namespace detail {

/// The float or double paged call after the compile-time checks of the
/// contiguous call for T (one sentence per misuse).
template <class Path, class T, class E>
void paged_call(view<const T> q, paged_kv_cache<T> const& cache, span<const index_t> seq_ids, view<T> out,
                E const& enc, attention_options<T> const& opt, half_masks const& masks16,
                paged_attention_workspace<T>& ws) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "posenc::attention: T must be float or double");
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    if constexpr (attention_encoder_ok<T, E>())
      paged_attention<Path>(q, cache, seq_ids, out, enc, opt, masks16, ws.buffers());
  }
}

/// The 16-bit paged call after its compile-time checks: the mixes of q and
/// out, the path, then the encoder as the contiguous 16-bit call checks it
/// (attention_encoder_ok for float: float tables, or 16-bit tables computing
/// in float). One sentence per misuse: each check assumes the ones above it passed.
template <class Path, class S, class Q, class O, class E>
void paged_call_half(view<Q> q, paged_kv_cache<S> const& cache, span<const index_t> seq_ids, view<O> out,
                     E const& enc, attention_options<float> const& opt, half_masks const& masks16,
                     paged_attention_workspace<S>& ws) {
  using QS = std::remove_const_t<Q>;
  constexpr bool no_double = !std::is_same_v<QS, double> && !std::is_same_v<O, double>;
  static_assert(no_double,
                "posenc::attention: over a 16-bit paged_kv_cache, q and out must be float or of the cache's "
                "16-bit type; double q or out is not supported");
  static_assert(!no_double || std::is_same_v<QS, O>,
                "posenc::attention: q and out must have the same element type (both float, or both the "
                "cache's 16-bit type)");
  static_assert(!no_double || !std::is_same_v<QS, O> || std::is_same_v<QS, float> || std::is_same_v<QS, S>,
                "posenc::attention: over a 16-bit paged_kv_cache, q and out are float or of the cache's 16-bit "
                "type; q of the other 16-bit type is not supported");
  static_assert(!std::is_same_v<Path, path::materialized>,
                "posenc::attention: path::materialized is not available over a 16-bit paged_kv_cache; use "
                "path::fused (or path::best) or path::reference");
  if constexpr (std::is_same_v<QS, O> && (std::is_same_v<QS, float> || std::is_same_v<QS, S>) &&
                !std::is_same_v<Path, path::materialized>) {
    if constexpr (attention_encoder_ok<float, E>())
      paged_attention<Path>(view<const QS>(q), cache, seq_ids, out, enc, opt, masks16, ws.buffers());
  }
}

}  // namespace detail

/// Attention of each query entry over the keys and values of one sequence of
/// a paged_kv_cache, all entries in one call (a batched decode step: one query
/// token per sequence, or a few for speculative decoding; or a prefill chunk).
///
/// Entry b of q and out belongs to sequence `seq_ids[b]` (an id may repeat).
/// As with kv_cache, what is cached and where it sits comes from the cache:
/// - Keys: sequence seq_ids[b]'s tokens, rotated exactly when the cache
///   stores them rotated (`cache.keys_rotated()`); `opt.keys_rotated` is set
///   from the cache (true over unrotated keys throws).
/// - Key positions: token j of the sequence sits at `first_position(id) + j`;
///   `opt.k_positions` must be unset. Key lengths: `length(id)` per entry;
///   `opt.key_lengths` must be empty.
/// - Query positions: by default the Sq queries of entry b are the last Sq
///   tokens appended to its sequence: `next_position(id) - Sq + i`;
///   `opt.q_positions` (shape (entries, Sq)) overrides it.
/// - Masks: batch extent 1 or the number of entries; key index j is the
///   sequence's token j (an extent past a sequence's length is cut to it, a
///   shorter one masks the keys past it). `opt.lse` is (entries, Hq, Sq).
/// - `opt.scores` must be null (no path produces scores here).
/// - The encoder acts as it did on append (it rotates exactly when the cached
///   keys are rotated; its head_dim() if any is the cache's).
/// - transformer_xl: the sequence's tokens before the Sq queries are the
///   segment memory; with memory_length() = M > 0 an entry attends to its last
///   M memory keys and its Sq current keys (the keys before are skipped, not
///   copied), and every query is shifted by the content bias u, as in the
///   contiguous call (over a 16-bit cache too: q + u in float, from the
///   16-bit pages as they are).
///
/// path::fused and path::best read the pages in place: the keys of an entry
/// are one chunk (cut into several to keep the threads busy) that the row
/// kernel walks head by head in the steps of the contiguous kernel over a
/// kv_cache, a run of pages with consecutive ids as one strided view, else
/// each step's rows gathered across the pages; the chunks of an entry are
/// merged by log-sum-exp. Work is parallel over (entry, chunk, kv head, row
/// group).
/// A prefill (Sq x group at least the lane kernel's minimum rows, no Shaw
/// terms) runs the lane kernel's steps over each entry's runs of pages
/// instead, parallel over (entry, kv head, query blocks).
/// path::reference and path::materialized gather each sequence (the oracle).
/// A cache stored in 16 bits has an overload of its own (below).
///
/// @param q   (entries, Sq, Hq, D), D = cache.head_dim(), Hq a multiple of cache.kv_heads()
/// @param seq_ids entries ids of open sequences
/// @param out (entries, Sq, Hq, cache.value_dim())
/// @param ws  buffers kept between calls (see paged_attention_workspace)
/// @throws posenc::error on any bad argument, before anything is written.
template <class Path = path::best, class T, class E, std::enable_if_t<!is_half_storage_v<T>, int> = 0>
void attention(view<const detail::identity_t<T>> q, paged_kv_cache<T> const& cache, span<const index_t> seq_ids,
               view<detail::identity_t<T>> out, E const& enc, attention_options<detail::identity_t<T>> const& opt,
               paged_attention_workspace<T>& ws) {
  detail::paged_call<Path, T>(q, cache, seq_ids, out, enc, opt, {}, ws);
}

/// The call above with an additive mask stored in 16 bits (`mask_view<M>`, M
/// `Eigen::half` or `Eigen::bfloat16`), added beside opt.mask and
/// opt.bool_mask with their per-entry rules (batch extent 1 or the number of
/// entries; key index j is the sequence's token j, an extent past a
/// sequence's length cut to it, a shorter one masking the keys past it).
/// Each element is widened exactly as it is read: the result is that of a
/// float mask holding the widened values, bit for bit, on every path. Its
/// checks name it `mask (16-bit)`; it shares no byte with out or lse.
template <class Path = path::best, class T, class E, class M,
          std::enable_if_t<!is_half_storage_v<T> && is_half_storage_v<M>, int> = 0>
void attention(view<const detail::identity_t<T>> q, paged_kv_cache<T> const& cache, span<const index_t> seq_ids,
               view<detail::identity_t<T>> out, E const& enc, attention_options<detail::identity_t<T>> const& opt,
               mask_view<M> const& mask16, paged_attention_workspace<T>& ws) {
  detail::paged_call<Path, T>(q, cache, seq_ids, out, enc, opt, detail::half_masks_of(mask16), ws);
}

/// Attention over a paged_kv_cache stored in 16 bits (paged_kv_cache<Eigen::half>
/// or paged_kv_cache<Eigen::bfloat16>), with the contract of the call above.
/// The mixes of the contiguous 16-bit cache: q and out float, or both of the
/// cache's 16-bit type (all-16-bit); options float; encoders those of the
/// contiguous 16-bit call: float, or with a 16-bit table computing in float
/// (t5_bias, clipped_bias, shaw of Eigen::half or Eigen::bfloat16), and
/// transformer_xl (memory cut and content bias as above).
/// Computed in float: path::fused and path::best read the 16-bit pages in
/// place and widen K and V in registers (the lane kernel: each key tile once
/// into float scratch), no float copy of the cache; a 16-bit q is widened as
/// read, a 16-bit out rounded once per element. path::reference gathers each
/// sequence and runs the 16-bit reference (double accumulation);
/// path::materialized is not available. Other mixes are compile errors.
/// @param q   (entries, Sq, Hq, D) float or S
/// @param out (entries, Sq, Hq, cache.value_dim()) of q's type
template <class Path = path::best, class S, class Q, class O, class E, std::enable_if_t<is_half_storage_v<S>, int> = 0>
void attention(view<Q> q, paged_kv_cache<S> const& cache, span<const index_t> seq_ids, view<O> out, E const& enc,
               attention_options<float> const& opt, paged_attention_workspace<S>& ws) {
  detail::paged_call_half<Path>(q, cache, seq_ids, out, enc, opt, {}, ws);
}

/// The 16-bit call above with an additive mask stored in 16 bits
/// (`mask_view<M>`, M `Eigen::half` or `Eigen::bfloat16`, either over either
/// cache), with the rules of the float cache's 16-bit mask above: widened
/// exactly as read, the result that of the float mask of the widened values.
template <class Path = path::best, class S, class Q, class O, class E, class M,
          std::enable_if_t<is_half_storage_v<S> && is_half_storage_v<M>, int> = 0>
void attention(view<Q> q, paged_kv_cache<S> const& cache, span<const index_t> seq_ids, view<O> out, E const& enc,
               attention_options<float> const& opt, mask_view<M> const& mask16, paged_attention_workspace<S>& ws) {
  detail::paged_call_half<Path>(q, cache, seq_ids, out, enc, opt, detail::half_masks_of(mask16), ws);
}

/// The calls above with a workspace of their own (allocating their buffers on every call).
template <class Path = path::best, class T, class E, std::enable_if_t<!is_half_storage_v<T>, int> = 0>
void attention(view<const detail::identity_t<T>> q, paged_kv_cache<T> const& cache, span<const index_t> seq_ids,
               view<detail::identity_t<T>> out, E const& enc, attention_options<detail::identity_t<T>> const& opt = {}) {
  paged_attention_workspace<T> ws;
  detail::paged_call<Path, T>(q, cache, seq_ids, out, enc, opt, {}, ws);
}

template <class Path = path::best, class T, class E, class M,
          std::enable_if_t<!is_half_storage_v<T> && is_half_storage_v<M>, int> = 0>
void attention(view<const detail::identity_t<T>> q, paged_kv_cache<T> const& cache, span<const index_t> seq_ids,
               view<detail::identity_t<T>> out, E const& enc, attention_options<detail::identity_t<T>> const& opt,
               mask_view<M> const& mask16) {
  paged_attention_workspace<T> ws;
  detail::paged_call<Path, T>(q, cache, seq_ids, out, enc, opt, detail::half_masks_of(mask16), ws);
}

template <class Path = path::best, class S, class Q, class O, class E, std::enable_if_t<is_half_storage_v<S>, int> = 0>
void attention(view<Q> q, paged_kv_cache<S> const& cache, span<const index_t> seq_ids, view<O> out, E const& enc,
               attention_options<float> const& opt = {}) {
  paged_attention_workspace<S> ws;
  detail::paged_call_half<Path>(q, cache, seq_ids, out, enc, opt, {}, ws);
}

template <class Path = path::best, class S, class Q, class O, class E, class M,
          std::enable_if_t<is_half_storage_v<S> && is_half_storage_v<M>, int> = 0>
void attention(view<Q> q, paged_kv_cache<S> const& cache, span<const index_t> seq_ids, view<O> out, E const& enc,
               attention_options<float> const& opt, mask_view<M> const& mask16) {
  paged_attention_workspace<S> ws;
  detail::paged_call_half<Path>(q, cache, seq_ids, out, enc, opt, detail::half_masks_of(mask16), ws);
}

}  // namespace posenc
