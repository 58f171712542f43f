// SPDX-License-Identifier: MIT
// Packed variable-length attention: several sequences back to back along seq, described by cumulative offsets.
#pragma once

// The whole story of a packed call, in one place.
//
// Layout. q, k, v and out are views with batch = 1 whose seq axis holds the
// tokens of n sequences back to back: sequence s owns query rows
// [cu_seqlens_q[s], cu_seqlens_q[s + 1]) and key rows [cu_seqlens_k[s],
// cu_seqlens_k[s + 1]). Both offset arrays have n + 1 entries, start at 0, never
// decrease and end at q.seq (resp. k.seq). A sequence may have no query (it
// costs nothing) or no key (its rows give zeros and lse = -inf).
//
// Element types. q, k, v and out of one float or double type T, with
// attention_options<T>; or the 16-bit mixes of the contiguous call, computed
// in float on path::fused / path::best and path::reference: q and out float
// with k and v Eigen::half or Eigen::bfloat16, or all four of one 16-bit
// type, with attention_options<float> (lse and scores float).
//
// Semantics. Sequence s gives exactly what posenc::attention gives on its own
// rows alone (a contiguous call with batch = 1, Sq = its queries, Sk = its
// keys): its own positions, its own bottom-right causal alignment when Sq != Sk,
// its own window, key length and encoder length (RoPE's dynamic scalings pick
// their frequencies from the sequence's own largest position). No query ever
// sees another sequence's key, and nothing is computed or stored for padding.
//
// Options (attention_options<T>) read per sequence:
//   scale, causal, sliding_window, softcap, keys_rotated, scores_stage: shared.
//   q_positions / k_positions: unset (each sequence's defaults), one offset
//     (every sequence's token i at offset + i), per_batch(firsts) with n
//     offsets (sequence s's token i at firsts[s] + i), or ids(p, 1, q.seq)
//     (resp. k.seq): explicit ids of the packed tokens.
//   key_lengths: n entries; keys of sequence s past key_lengths[s] are padding.
//   mask / bool_mask: in the packed call's coordinates, (1, 1 or Hq, 1 or
//     q.seq, <= k.seq): sequence s reads rows cu_seqlens_q[s].. (or the one
//     broadcast row) and keys cu_seqlens_k[s].. of it, i.e. only its diagonal
//     block; a key extent that ends before a sequence's keys masks them (as a
//     short key extent does in a contiguous call). A key mask (q = 1) costs
//     k.seq elements; a per-query mask costs q.seq x k.seq although only the
//     diagonal blocks are read.
//   An additive mask stored in 16 bits (mask_view<Eigen::half> or
//     mask_view<Eigen::bfloat16>, the last argument, with any tensor types):
//     the layout of mask above, widened exactly as read, so each sequence
//     gives what a float mask of the widened values gives, bit for bit;
//     checked as "mask (16-bit)".
//   lse: (Hq, q.seq) contiguous, as for a contiguous call with batch = 1.
//   scores: the blocks (Hq, Sq_s, Sk_s) of the sequences back to back (no
//     padding), sequence s starting at Hq x sum_{t < s} Sq_t x Sk_t.
//   threads: see Work below.
//
// Work. A sequence whose share of the call's query-key pairs exceeds 1 /
// threads runs alone on every thread (inside-sequence parallelism); the others
// run one per thread, largest first, so that many short sequences keep every
// thread busy. Each sequence runs the path's own kernel on sub-views (no copy,
// no padding); the only extra memory is one lse row block per thread (when lse
// is requested) and n + 1 indices.
//
// Errors. Every argument of every sequence is checked before anything is
// written; a per-sequence problem names its sequence
// ("posenc::attention (sequence 2): ...").

#include <algorithm>
#include <cstdio>
#include <limits>
#include <numeric>
#include <optional>
#include <type_traits>
#include <vector>

#include "posenc/attention/attention.hpp"
#include "posenc/attention/options.hpp"
#include "posenc/core/aligned_buffer.hpp"
#include "posenc/core/checked.hpp"
#include "posenc/core/error.hpp"
#include "posenc/core/overlap.hpp"
#include "posenc/core/positions.hpp"
#include "posenc/core/span.hpp"
#include "posenc/core/threading.hpp"
#include "posenc/core/view.hpp"
#include "posenc/encoding/traits.hpp"

namespace posenc {

/// The sequences of a packed call: cumulative token offsets of the queries and
/// of the keys (flash-attention's cu_seqlens), n + 1 entries each, starting at
/// 0, non-decreasing, ending at q.seq and k.seq. Non-owning.
struct packed_sequences {
  span<const index_t> cu_seqlens_q;  ///< (n + 1): sequence s owns query rows [cu_seqlens_q[s], cu_seqlens_q[s + 1])
  span<const index_t> cu_seqlens_k;  ///< (n + 1): sequence s owns key rows [cu_seqlens_k[s], cu_seqlens_k[s + 1])

  /// Number of sequences n (0 for empty offsets).
  index_t count() const noexcept { return cu_seqlens_q.size() > 0 ? cu_seqlens_q.size() - 1 : 0; }
  /// Queries of sequence s.
  index_t q_len(index_t s) const noexcept { return cu_seqlens_q[s + 1] - cu_seqlens_q[s]; }
  /// Keys of sequence s.
  index_t k_len(index_t s) const noexcept { return cu_seqlens_k[s + 1] - cu_seqlens_k[s]; }
};

/// Cumulative offsets {0, l0, l0 + l1, ...} of sequence lengths: the
/// cu_seqlens of sequences of these lengths packed back to back.
inline std::vector<index_t> cumulative_lengths(span<const index_t> lengths) {
  std::vector<index_t> cu(static_cast<std::size_t>(lengths.size() + 1), 0);
  for (index_t s = 0; s < lengths.size(); ++s)
    cu[static_cast<std::size_t>(s + 1)] = cu[static_cast<std::size_t>(s)] + lengths[s];
  return cu;
}

namespace detail {

/// Checks one cumulative offset array: n + 1 entries, 0 first, non-decreasing, `total` last.
inline void check_cu_seqlens(char const* w, char const* name, span<const index_t> cu, index_t total,
                             char const* total_name) {
  require(cu.size() >= 1, w, name, " has ", cu.size(), " entries, expected n + 1 >= 1 (n sequences)");
  require(cu.data() != nullptr, w, name, ".data is null, expected ", cu.size(), " entries");
  require(cu[0] == 0, w, name, "[0] is ", cu[0], ", expected 0");
  for (index_t s = 1; s < cu.size(); ++s)
    require(cu[s] >= cu[s - 1], w, name, "[", s, "] is ", cu[s], ", expected >= ", cu[s - 1], " (", name, "[", s - 1,
            "]: offsets never decrease)");
  require(cu[cu.size() - 1] == total, w, name, "[", cu.size() - 1, "] is ", cu[cu.size() - 1], ", expected ", total,
          " (", total_name, ")");
}

/// Position span of `n` tokens of one sequence starting at packed token
/// `first`, sequence `s`, from a packed span (offset, per-sequence offsets or
/// packed ids copied into `ids`).
inline position_span sequence_positions(position_span const& p, index_t const* ids, index_t s, index_t first,
                                        index_t n) noexcept {
  if (p.is_explicit()) return position_span::ids(ids + first, 1, n);
  if (p.is_per_batch()) return position_span(p.at(s, 0));
  return position_span(p.at(0, 0));
}

/// A packed call cut into its sequences: each sequence's views, options and
/// 16-bit masks, built on demand from the packed ones (no per-sequence
/// storage). Compute type T; q stored as Q, k and v as KV, out as O (each T,
/// or a 16-bit type with float T, as for the contiguous call).
template <class T, class Q = T, class KV = T, class O = T>
struct packed_call {
  view<const Q> q;
  view<const KV> k, v;
  view<O> out;
  packed_sequences seqs;
  attention_options<T> const* opt = nullptr;
  half_masks masks16;                 // additive masks stored in 16 bits, read as opt.mask
  std::vector<index_t> q_ids, k_ids;  // packed explicit ids, when given
  std::vector<index_t> scores_at;     // (n): first scores element of each sequence

  /// Rows [first, first + n) of a packed view.
  template <class U>
  static view<U> rows(view<U> x, index_t first, index_t n) noexcept {
    x.data = x.seq > 0 ? x.ptr(0, first, 0) : x.data;
    x.seq = n;
    return x;
  }

  /// The mask of sequence s: its rows (or the broadcast one) and its keys.
  template <class M>
  mask_view<M> sequence_mask(mask_view<M> m, index_t s) const noexcept {
    if (m.empty()) return m;
    index_t const q0 = seqs.cu_seqlens_q[s], k0 = seqs.cu_seqlens_k[s];
    if (m.data != nullptr) m.data += (m.q == 1 ? 0 : q0 * m.q_stride) + std::min(k0, m.k);
    if (m.q != 1) m.q = seqs.q_len(s);
    m.k = std::clamp<index_t>(m.k - k0, 0, seqs.k_len(s));
    return m;
  }

  /// Options of sequence s alone; `lse` is where its (Hq, Sq_s) lse goes
  /// (null: no lse, for the per-sequence checks).
  attention_options<T> sequence_options(index_t s, T* lse, int threads) const noexcept {
    attention_options<T> o = *opt;
    index_t const q0 = seqs.cu_seqlens_q[s], k0 = seqs.cu_seqlens_k[s];
    if (opt->q_positions) o.q_positions = sequence_positions(*opt->q_positions, q_ids.data(), s, q0, seqs.q_len(s));
    if (opt->k_positions) o.k_positions = sequence_positions(*opt->k_positions, k_ids.data(), s, k0, seqs.k_len(s));
    if (!opt->key_lengths.empty()) o.key_lengths = span<const index_t>(opt->key_lengths.data() + s, 1);
    o.mask = sequence_mask(opt->mask, s);
    o.bool_mask = sequence_mask(opt->bool_mask, s);
    index_t const sq = seqs.q_len(s), sk = seqs.k_len(s);
    o.lse = opt->lse && lse ? output_span<T>(lse, q.heads * sq) : output_span<T>();
    o.scores = opt->scores
                   ? output_span<T>(opt->scores.data() + scores_at[static_cast<std::size_t>(s)], q.heads * sq * sk)
                   : output_span<T>();
    o.threads = threads;
    return o;
  }

  /// The 16-bit masks of sequence s, cut as opt.mask is.
  half_masks sequence_masks(index_t s) const noexcept {
    return {sequence_mask(masks16.half, s), sequence_mask(masks16.bfloat16, s)};
  }

  view<const Q> q_of(index_t s) const noexcept { return rows(q, seqs.cu_seqlens_q[s], seqs.q_len(s)); }
  view<const KV> k_of(index_t s) const noexcept { return rows(k, seqs.cu_seqlens_k[s], seqs.k_len(s)); }
  view<const KV> v_of(index_t s) const noexcept { return rows(v, seqs.cu_seqlens_k[s], seqs.k_len(s)); }
  view<O> out_of(index_t s) const noexcept { return rows(out, seqs.cu_seqlens_q[s], seqs.q_len(s)); }
};

/// Checks the packed arguments as a whole: views with batch 1, offsets,
/// per-sequence option arrays, the packed forms of positions and masks, and
/// that no output shares memory with an input or another output.
template <class T, class Q, class KV, class O>
void validate_packed(char const* w, packed_call<T, Q, KV, O> const& c) {
  view<const Q> const q = c.q;
  view<const KV> const k = c.k, v = c.v;
  view<O> const out = c.out;
  attention_options<T> const& opt = *c.opt;
  check_view(w, "q", q);
  check_view(w, "k", k);
  check_view(w, "v", v);
  check_view(w, "out", out);
  require(q.batch == 1, w, "q.batch is ", q.batch, ", expected 1 (packed sequences lie back to back along seq)");
  check_equal(w, "k.batch", k.batch, 1, "packed sequences lie back to back along seq");
  check_equal(w, "v.batch", v.batch, 1, "packed sequences lie back to back along seq");
  check_equal(w, "out.batch", out.batch, 1, "packed sequences lie back to back along seq");
  check_equal(w, "v.seq", v.seq, k.seq, "k.seq");
  check_equal(w, "out.seq", out.seq, q.seq, "q.seq");
  check_cu_seqlens(w, "cu_seqlens_q", c.seqs.cu_seqlens_q, q.seq, "q.seq");
  check_cu_seqlens(w, "cu_seqlens_k", c.seqs.cu_seqlens_k, k.seq, "k.seq");
  require(c.seqs.cu_seqlens_k.size() == c.seqs.cu_seqlens_q.size(), w, "cu_seqlens_k has ",
          c.seqs.cu_seqlens_k.size(), " entries, expected ", c.seqs.cu_seqlens_q.size(),
          " (cu_seqlens_q: one sequence count for queries and keys)");
  index_t const n = c.seqs.count();
  if (!opt.key_lengths.empty() || opt.key_lengths.data() != nullptr) {
    require(opt.key_lengths.size() == n, w, "key_lengths has ", opt.key_lengths.size(), " entries, expected ", n,
            " (one per sequence)");
    require(opt.key_lengths.data() != nullptr || n == 0, w, "key_lengths.data is null, expected ", n, " entries");
    for (index_t s = 0; s < n; ++s) {
      index_t const L = opt.key_lengths[s];
      require(L >= 0 && L <= c.seqs.k_len(s), w, "key_lengths[", s, "] is ", L, ", expected 0 .. ", c.seqs.k_len(s),
              " (the keys of sequence ", s, ")");
    }
  }
  // Positions: explicit ids cover the packed tokens, per-sequence offsets the sequences.
  auto check_positions = [&](char const* name, std::optional<position_span> const& p, index_t total) {
    if (!p) return;
    if (p->is_per_batch())
      p->validate_shape(w, name, n, 0);  // n offsets; each sequence's range is checked with it
    else
      p->validate_shape(w, name, 1, total);
  };
  check_positions("q_positions", opt.q_positions, q.seq);
  check_positions("k_positions", opt.k_positions, k.seq);
  check_mask(w, "mask", opt.mask, 1, q.heads, q.seq, k.seq);
  check_mask(w, "bool_mask", opt.bool_mask, 1, q.heads, q.seq, k.seq);
  check_mask(w, "mask (16-bit)", c.masks16.half, 1, q.heads, q.seq, k.seq);
  check_mask(w, "mask (16-bit)", c.masks16.bfloat16, 1, q.heads, q.seq, k.seq);
  index_t const rows = checked_mul(w, q.heads, q.seq, "q.heads x q.seq");
  index_t scores_size = 0;
  if (opt.scores) {
    for (index_t s = 0; s < n; ++s) {
      index_t const block = checked_mul(w, checked_mul(w, q.heads, c.seqs.q_len(s), "q.heads x the queries of a sequence"),
                                        c.seqs.k_len(s), "q.heads x the queries x the keys of a sequence");
      scores_size = checked_add(w, scores_size, block, "scores size (sum over sequences of q.heads x Sq x Sk)");
    }
  }
  check_output_span(w, "lse", opt.lse, rows, "q.heads x q.seq");
  if (opt.scores)
    check_output_span(w, "scores", opt.scores, scores_size, "the sum over sequences of q.heads x Sq x Sk");
  // Aliasing over the whole packed buffers: a sequence's output must not
  // share memory with another sequence's input either (out == q, the same
  // view, is in-place attention, as for a contiguous call).
  auto const half_bytes = [](auto const& m) {
    index_t const ext[3] = {m.batch, m.heads, m.q}, str[3] = {m.batch_stride, m.head_stride, m.q_stride};
    return make_byte_set(m.data, std::size_t{2}, 3, ext, str, m.k);
  };
  byte_set const in_sets[6] = {
      bytes_of(q), bytes_of(k), bytes_of(v),
      [&] {
        mask_view<T> const& m = opt.mask;
        index_t const ext[3] = {m.batch, m.heads, m.q}, str[3] = {m.batch_stride, m.head_stride, m.q_stride};
        return make_byte_set(m.data, sizeof(T), 3, ext, str, m.k);
      }(),
      [&] {
        mask_view<bool> const& m = opt.bool_mask;
        index_t const ext[3] = {m.batch, m.heads, m.q}, str[3] = {m.batch_stride, m.head_stride, m.q_stride};
        return make_byte_set(m.data, sizeof(bool), 3, ext, str, m.k);
      }(),
      c.masks16.half.empty() ? half_bytes(c.masks16.bfloat16) : half_bytes(c.masks16.half)};
  char const* const in_names[6] = {"q", "k", "v", "mask", "bool_mask", "mask (16-bit)"};
  byte_set const out_sets[3] = {bytes_of(out), bytes_of(static_cast<T const*>(opt.lse.data()), rows),
                                opt.scores ? bytes_of(static_cast<T const*>(opt.scores.data()), scores_size) : byte_set{}};
  char const* const out_names[3] = {"out", "lse", "scores"};
  bool const in_place = out.data == q.data && out.seq == q.seq && out.heads == q.heads && out.dim == q.dim &&
                        out.seq_stride == q.seq_stride && out.head_stride == q.head_stride;
  for (int o = 0; o < 3; ++o) {
    for (int i = 0; i < 6; ++i) {
      if (o == 0 && i == 0 && in_place) continue;
      require(!overlaps(out_sets[o], in_sets[i]), w, out_names[o], " is at bytes ", byte_range(out_sets[o]),
              " and overlaps ", in_names[i], " at ", byte_range(in_sets[i]), ", expected no shared memory");
    }
    for (int o2 = 0; o2 < o; ++o2)
      require(!overlaps(out_sets[o], out_sets[o2]), w, out_names[o], " is at bytes ", byte_range(out_sets[o]),
              " and overlaps ", out_names[o2], " at ", byte_range(out_sets[o2]), ", expected no shared memory");
  }
}

/// Query-key pairs of sequence s (its scheduling weight; at least 1 when it has queries).
inline index_t sequence_work(packed_sequences const& seqs, index_t s) noexcept {
  index_t const sq = seqs.q_len(s), sk = seqs.k_len(s);
  if (sq == 0) return 0;
  return std::max<index_t>(1, sq) * std::max<index_t>(1, sk);
}

}  // namespace detail

namespace detail {

/// The packed call after its compile-time checks: validates every argument of
/// every sequence, then runs each sequence on the path's kernel (see the top
/// of this header). T is the compute type, Q, KV and O the stored types.
template <class Path, class T, class Q, class KV, class O, class E>
void packed_attention(packed_call<T, Q, KV, O>& c, E const& enc) {
  char const* const w = "posenc::attention";
  view<const Q> const q = c.q;
  view<const KV> const k = c.k;
  packed_sequences const& seqs = c.seqs;
  attention_options<T> const& opt = *c.opt;
  detail::validate_packed(w, c);
  index_t const n = seqs.count();
  // Packed explicit ids, read per sequence through position_span::at.
  if (opt.q_positions && opt.q_positions->is_explicit()) {
    c.q_ids.resize(static_cast<std::size_t>(q.seq));
    for (index_t i = 0; i < q.seq; ++i) c.q_ids[static_cast<std::size_t>(i)] = opt.q_positions->at(0, i);
  }
  if (opt.k_positions && opt.k_positions->is_explicit()) {
    c.k_ids.resize(static_cast<std::size_t>(k.seq));
    for (index_t j = 0; j < k.seq; ++j) c.k_ids[static_cast<std::size_t>(j)] = opt.k_positions->at(0, j);
  }
  c.scores_at.assign(static_cast<std::size_t>(n), 0);
  for (index_t s = 1; s < n; ++s)
    c.scores_at[static_cast<std::size_t>(s)] =
        c.scores_at[static_cast<std::size_t>(s - 1)] + q.heads * seqs.q_len(s - 1) * seqs.k_len(s - 1);

  // What the chosen path cannot do, said before any sequence runs.
  if constexpr (!std::is_same_v<Path, path::best>) {
    if constexpr (!detail::kernel<typename detail::dependent_path<Path, E>::type>::provides_scores)
      detail::require(!opt.scores, w, "scores is set, expected null (this path does not produce the "
                      "scores output; use path::reference or path::materialized)");
  }
  // Every sequence's own checks, before any sequence writes.
  index_t max_q = 0;
  for (index_t s = 0; s < n; ++s) {
    max_q = std::max(max_q, seqs.q_len(s));
    char where[64];
    std::snprintf(where, sizeof where, "posenc::attention (sequence %lld)", static_cast<long long>(s));
    detail::validate(c.q_of(s), c.k_of(s), c.v_of(s), c.out_of(s), enc, c.sequence_options(s, nullptr, 1), where);
    if constexpr (detail::has_memory_length<E>::value) {
      index_t const M = enc.memory_length(), memory = seqs.k_len(s) - seqs.q_len(s);
      detail::require(!opt.scores || M == 0 || memory <= M, where, "scores is set with a memory of ", memory,
                      " keys, expected null (the encoder's memory_length() is ", M, ": the memory is cut)");
    }
  }

  // Work split: sequences too large to balance run alone on every thread; the
  // others run one per thread, largest first.
  int const threads = loop_threads(opt.threads);
  std::vector<index_t> order;
  order.reserve(static_cast<std::size_t>(n));
  index_t total = 0;
  for (index_t s = 0; s < n; ++s) total += detail::sequence_work(seqs, s);
  for (index_t s = 0; s < n; ++s)
    if (detail::sequence_work(seqs, s) > 0) order.push_back(s);
  std::stable_sort(order.begin(), order.end(), [&](index_t a, index_t b) {
    return detail::sequence_work(seqs, a) > detail::sequence_work(seqs, b);
  });
  auto const alone = [&](index_t s) { return threads > 1 && detail::sequence_work(seqs, s) * threads > total; };
  // lse: each sequence writes its (Hq, Sq_s) block into its thread's rows, then scatters it to (Hq, q.seq).
  aligned_buffer<T> lse_rows;
  if (opt.lse) lse_rows = aligned_buffer<T>::uninitialized(q.heads * max_q * threads);
  auto const run_one = [&](index_t s, int slot, int inner_threads) {
    T* const lse = opt.lse ? lse_rows.data() + static_cast<index_t>(slot) * q.heads * max_q : nullptr;
    run_attention<Path, false>(c.q_of(s), c.k_of(s), c.v_of(s), c.out_of(s), enc,
                               c.sequence_options(s, lse, inner_threads), c.sequence_masks(s));
    if (opt.lse) {
      index_t const sq = seqs.q_len(s), q0 = seqs.cu_seqlens_q[s];
      for (index_t h = 0; h < q.heads; ++h)
        std::copy(lse + h * sq, lse + (h + 1) * sq, opt.lse.data() + h * q.seq + q0);
    }
  };
  std::size_t first_shared = 0;
  while (first_shared < order.size() && alone(order[first_shared])) run_one(order[first_shared++], 0, threads);
  index_t const shared = static_cast<index_t>(order.size() - first_shared);
  parallel_for(shared, threads, [&](index_t t) {
    run_one(order[first_shared + static_cast<std::size_t>(t)], std::min(thread_index(), threads - 1), 1);
  });
}

}  // namespace detail

/// Attention over packed variable-length sequences: q, k, v, out hold the
/// tokens of `seqs.count()` sequences back to back (batch = 1), and sequence s
/// gives what posenc::attention gives on its own rows alone. The layout, how
/// each option reads per sequence (positions, key lengths, masks, lse, scores)
/// and how the threads share the work: the top of posenc/attention/packed.hpp.
/// A batched decode step of many sequences (one or a few query tokens each
/// over their packed keys) is this same call.
///
/// @tparam Path as for posenc::attention (every path and encoder works)
/// @param q    (1, total queries, Hq, D)
/// @param k    (1, total keys, Hkv, D)
/// @param v    (1, total keys, Hkv, Dv)
/// @param out  (1, total queries, Hq, Dv)
/// @param seqs cumulative offsets of the sequences' queries and keys
/// @param opt  options in the packed call's coordinates (top of this header)
/// @throws posenc::error on any bad argument of any sequence, before anything is written.
template <class Path = path::best, class T, class E, std::enable_if_t<!is_half_storage_v<T>, int> = 0>
void attention(view<const detail::identity_t<T>> q, view<const detail::identity_t<T>> k,
               view<const detail::identity_t<T>> v, view<T> out, packed_sequences const& seqs, E const& enc,
               attention_options<detail::identity_t<T>> const& opt = {}) {
  if constexpr (detail::attention_encoder_ok<T, E>()) {
    detail::packed_call<T> c{q, k, v, out, seqs, &opt, {}, {}, {}, {}};
    detail::packed_attention<Path>(c, enc);
  }
}

/// The packed call above with an additive mask stored in 16 bits
/// (`mask_view<M>`, M `Eigen::half` or `Eigen::bfloat16`), beside opt.mask
/// and opt.bool_mask with their packed layout: (1, 1 or Hq, 1 or q.seq,
/// <= k.seq) in the packed call's coordinates, sequence s reading only its
/// diagonal block (top of this header). Each element is widened exactly as it
/// is read: every sequence gives what a float mask holding the widened values
/// gives, bit for bit.
template <class Path = path::best, class T, class E, class M,
          std::enable_if_t<!is_half_storage_v<T> && is_half_storage_v<M>, int> = 0>
void attention(view<const detail::identity_t<T>> q, view<const detail::identity_t<T>> k,
               view<const detail::identity_t<T>> v, view<T> out, packed_sequences const& seqs, E const& enc,
               attention_options<detail::identity_t<T>> const& opt, mask_view<M> const& mask16) {
  if constexpr (detail::attention_encoder_ok<T, E>()) {
    detail::packed_call<T> c{q, k, v, out, seqs, &opt, detail::half_masks_of(mask16), {}, {}, {}};
    detail::packed_attention<Path>(c, enc);
  }
}

namespace detail {

/// The 16-bit packed calls below after their type checks.
template <class Path, class T, class Q, class K, class V, class E>
void packed_half_attention(view<Q> q, view<K> k, view<V> v, view<T> out, packed_sequences const& seqs, E const& enc,
                           attention_options<float> const& opt, half_masks const& masks16) {
  using S = std::remove_const_t<K>;
  using QS = std::remove_const_t<Q>;
  if constexpr (half_io_types_ok<Q, K, V, T>()) {
    if constexpr (attention_encoder_ok<float, E>()) {
      packed_call<float, QS, S, T> c{view<const QS>(q), view<const S>(k), view<const S>(v), out, seqs, &opt,
                                     masks16, {}, {}, {}};
      packed_attention<Path>(c, enc);
    }
  }
}

}  // namespace detail

/// Packed attention with 16-bit tensors, computed in float (path::reference:
/// in double): the mixes, options and rounding of the contiguous 16-bit call
/// (posenc/attention/attention.hpp), on path::fused (and path::best) and
/// path::reference:
/// - q and out float, k and v `Eigen::half` or `Eigen::bfloat16`;
/// - q, k, v and out all of one 16-bit type.
/// Options are `attention_options<float>` read per sequence as for float
/// tensors (top of this header); lse and scores are float. Sequence s gives
/// exactly what the contiguous 16-bit call gives on its own rows alone.
template <class Path = path::best, class T, class Q, class K, class V, class E,
          std::enable_if_t<is_half_storage_v<Q> || is_half_storage_v<K> || is_half_storage_v<V> ||
                               is_half_storage_v<T>,
                           int> = 0>
void attention(view<Q> q, view<K> k, view<V> v, view<T> out, packed_sequences const& seqs, E const& enc,
               attention_options<float> const& opt = {}) {
  detail::packed_half_attention<Path>(q, k, v, out, seqs, enc, opt, {});
}

/// The 16-bit packed call above with an additive mask stored in 16 bits
/// (`mask_view<M>`, either 16-bit type with either tensor type), in the
/// packed layout of the float packed call's 16-bit mask.
template <class Path = path::best, class T, class Q, class K, class V, class E, class M,
          std::enable_if_t<(is_half_storage_v<Q> || is_half_storage_v<K> || is_half_storage_v<V> ||
                            is_half_storage_v<T>) && is_half_storage_v<M>,
                           int> = 0>
void attention(view<Q> q, view<K> k, view<V> v, view<T> out, packed_sequences const& seqs, E const& enc,
               attention_options<float> const& opt, mask_view<M> const& mask16) {
  detail::packed_half_attention<Path>(q, k, v, out, seqs, enc, opt, detail::half_masks_of(mask16));
}

}  // namespace posenc
