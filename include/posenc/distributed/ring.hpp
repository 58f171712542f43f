// SPDX-License-Identifier: MIT
// ring_attention: attention over a sequence sharded across MPI ranks, key/value blocks passed around a ring.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <typeinfo>
#include <utility>
#include <vector>

#include "posenc/attention/attention.hpp"
#include "posenc/attention/fused/decode.hpp"
#include "posenc/core/aligned_buffer.hpp"
#include "posenc/distributed/agreement.hpp"
#include "posenc/distributed/rotation_applied.hpp"
#include "posenc/distributed/shards.hpp"

namespace posenc::distributed {

/// Options of ring_attention: those of posenc::attention for the whole
/// sequence, plus how the sequence is cut into shards.
/// Not supported across ranks (rejected): masks, the scores output, explicit
/// or per-batch positions (a single offset for q_positions / k_positions is).
/// Buffers of ring_attention kept between calls: the two key/value blocks of the
/// double buffer, the rotated queries, one block's output and the per-row
/// accumulator. A call grows them to its sizes and never shrinks them, so the
/// calls after the first (the next layer, the next step) touch memory already
/// mapped. Not shared between concurrent calls.
template <class T>
struct ring_workspace {
  aligned_buffer<T> blocks[2];  ///< K then V of one shard, packed (batch, shard, Hkv, D | Dv)
  aligned_buffer<T> q_rotated;  ///< (batch, shard, Hq, D) when the encoder rotates
  aligned_buffer<T> out;        ///< one (query run, key run) output, (batch, run, Hq, Dv)
  aligned_buffer<T> lse;        ///< its log-sum-exp, (batch, Hq, run)
  std::vector<double> o;        ///< (batch, shard, Hq, Dv): unnormalised output of every row
  std::vector<double> m, l;     ///< (batch, shard, Hq): its running max and sum
};

template <class T>
struct ring_options : attention_options<T> {
  /// Which tokens each rank holds (zig-zag balances a causal mask).
  shard_layout layout = shard_layout::zigzag;
  /// Optional buffers reused across calls (null: the call allocates its own).
  ring_workspace<T>* workspace = nullptr;
};

/// What one ring_attention call spent its time on, on this rank.
struct ring_stats {
  double seconds = 0;          ///< the whole call
  double compute_seconds = 0;  ///< attention of the blocks and the log-sum-exp merges
  double wait_seconds = 0;     ///< in MPI_Waitall for the next key/value block
  index_t steps = 0;           ///< ring steps (the rank count)
  index_t blocks_run = 0;      ///< (query run, key run) pairs computed
  index_t blocks_skipped = 0;  ///< pairs skipped: no visible key (causal, window or padding)
  /// wait_seconds / seconds (0 for an empty call).
  double wait_fraction() const noexcept { return seconds > 0 ? wait_seconds / seconds : 0; }
};

namespace detail {

using clock = std::chrono::steady_clock;

inline double seconds_since(clock::time_point t0) {
  return std::chrono::duration<double>(clock::now() - t0).count();
}

template <class T>
MPI_Datatype mpi_type() noexcept {
  if constexpr (std::is_same_v<T, float>)
    return MPI_FLOAT;
  else
    return MPI_DOUBLE;
}

/// A communicator duplicated for one call, so that the ring's messages never
/// meet the caller's; freed on every exit.
class comm_copy {
 public:
  explicit comm_copy(MPI_Comm c) { MPI_Comm_dup(c, &comm_); }
  ~comm_copy() { MPI_Comm_free(&comm_); }
  comm_copy(comm_copy const&) = delete;
  comm_copy& operator=(comm_copy const&) = delete;
  MPI_Comm get() const noexcept { return comm_; }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
};

/// The first phase's checks: what a rank can check alone. Throws posenc::error
/// naming the call `w`.
template <class T>
void check_local(char const* w, view<const T> q, view<const T> k, ring_options<T> const& opt) {
  using posenc::detail::require;
  require(opt.mask.empty(), w, "mask is set, expected none (masks are not split across ranks)");
  require(opt.bool_mask.empty(), w, "bool_mask is set, expected none (masks are not split across ranks)");
  require(!opt.scores, w, "scores is set, expected null (the scores output is not split across ranks)");
  // A rank without tokens gives an empty (or no) lse.
  posenc::detail::check_output_span(
      w, "lse", opt.lse,
      posenc::detail::checked_mul(w, posenc::detail::checked_mul(w, q.batch, q.heads, "q.batch x q.heads"), q.seq,
                                  "q.batch x q.heads x q.seq"),
      "batch x Hq x shard");
  for (auto const* pos : {&opt.q_positions, &opt.k_positions}) {
    char const* const name = pos == &opt.q_positions ? "q_positions" : "k_positions";
    if (!pos->has_value()) continue;
    require(!(*pos)->is_explicit(), w, name, " is explicit ids, expected unset or one offset");
    require(!(*pos)->is_per_batch(), w, name, " is per-batch offsets, expected unset or one offset");
  }
  require(k.seq == q.seq, w, "k.seq is ", k.seq, ", expected ", q.seq,
          " (q.seq: a rank's queries and keys are the same tokens)");
  require(opt.key_lengths.size() == 0 || opt.key_lengths.size() == q.batch, w, "key_lengths has ",
          opt.key_lengths.size(), " entries, expected ", q.batch, " (q.batch) or none");
}

/// The descriptor every rank sends in the first phase.
template <class T, class E>
descriptor describe(view<const T> q, view<const T> k, view<const T> v, ring_options<T> const& opt) {
  descriptor d;
  auto set = [&](field f, std::int64_t x) { d.values[static_cast<int>(f)] = x; };
  set(field::element_size, static_cast<std::int64_t>(sizeof(T)));
  set(field::batch, q.batch);
  set(field::q_heads, q.heads);
  set(field::kv_heads, k.heads);
  set(field::head_dim, q.dim);
  set(field::value_dim, v.dim);
  set(field::layout, static_cast<std::int64_t>(opt.layout));
  set(field::causal, opt.causal ? 1 : 0);
  set(field::sliding_window, opt.sliding_window);
  set(field::scale, opt.scale ? bits_of(*opt.scale) : -1);
  set(field::softcap, bits_of(opt.softcap));
  set(field::keys_rotated, opt.keys_rotated ? 1 : 0);
  set(field::q_offset, opt.q_positions && !opt.q_positions->is_explicit() && !opt.q_positions->is_per_batch()
                           ? opt.q_positions->at(0, 0)
                           : 0);
  set(field::k_offset, opt.k_positions && !opt.k_positions->is_explicit() && !opt.k_positions->is_per_batch()
                           ? opt.k_positions->at(0, 0)
                           : 0);
  hasher kl;
  kl.add(static_cast<std::int64_t>(opt.key_lengths.size()));
  for (index_t b = 0; b < opt.key_lengths.size(); ++b) kl.add(static_cast<std::int64_t>(opt.key_lengths[b]));
  set(field::key_lengths, static_cast<std::int64_t>(kl.value()));
  hasher ty;
  char const* const name = typeid(E).name();
  ty.add_bytes(name, std::strlen(name));
  set(field::encoder_type, static_cast<std::int64_t>(ty.value()));
  d.shard_length = q.seq;
  return d;
}

/// Everything the ring needs once every rank agrees: where the tokens are,
/// the positions, and the buffers (the rotated queries, the first key/value block).
template <class T>
struct ring_setup {
  shard_map map;
  index_t q_offset = 0, k_offset = 0;
  index_t max_block = 0;           // the longest shard
  std::vector<index_t> key_len;    // (batch): the whole sequence's key lengths
  ring_workspace<T>* ws = nullptr;
};

/// Grows b to at least n elements (contents not kept).
template <class T>
void fit(aligned_buffer<T>& b, index_t n) {
  if (b.size() < n) b = aligned_buffer<T>::uninitialized(n);
}

/// Packed (batch, seq, heads, dim) copy of x at `dst`.
template <class T>
view<T> pack(view<const T> x, T* dst) {
  view<T> y = make_bshd(dst, x.batch, x.seq, x.heads, x.dim);
  for (index_t b = 0; b < x.batch; ++b)
    for (index_t s = 0; s < x.seq; ++s)
      for (index_t h = 0; h < x.heads; ++h) std::copy(x.ptr(b, s, h), x.ptr(b, s, h) + x.dim, y.ptr(b, s, h));
  return y;
}

/// Rows [first, first + count) of x.
template <class T>
view<T> rows_of(view<T> x, index_t first, index_t count) noexcept {
  view<T> y = x;
  y.data = x.data ? x.data + first * x.seq_stride : x.data;
  y.seq = count;
  return y;
}

/// Views of the K and V parts of a packed block of `len` tokens.
template <class T>
std::pair<view<const T>, view<const T>> block_views(T const* data, index_t batch, index_t len, index_t kv_heads,
                                                    index_t head_dim, index_t value_dim) noexcept {
  view<const T> k = make_bshd(data, batch, len, kv_heads, head_dim);
  view<const T> v = make_bshd(data + batch * len * kv_heads * head_dim, batch, len, kv_heads, value_dim);
  return {k, v};
}

/// The positions at which this rank's queries and keys are rotated: the
/// single-process call's rotation (plan_rotation) at the whole sequence's
/// length. q_ids (shard), k_ids (batch x shard; padding keys clamped below the
/// length).
struct shard_rotation {
  std::vector<index_t> q_ids, k_ids;
  index_t length = 0;
};

/// Global positions of this rank's tokens (ids of its shard, offset by `offset`).
template <class T>
std::vector<index_t> shard_positions(ring_setup<T> const& st, int rank, index_t S, index_t offset) {
  std::vector<index_t> ids(static_cast<std::size_t>(S));
  for (index_t s = 0; s < S; ++s) ids[static_cast<std::size_t>(s)] = st.map.global_index(rank, s) + offset;
  return ids;
}

/// The rotation of this rank's shard (B batch entries of S tokens).
template <class T>
shard_rotation rotation_of_shard(ring_setup<T> const& st, int rank, index_t B, index_t S) {
  shard_rotation rot;
  index_t const total = st.map.total;
  // The largest key position that is not padding (or any key, when all are), or a larger query position, + 1.
  index_t klen = 0;
  for (index_t b = 0; b < B; ++b) klen = std::max(klen, st.key_len[static_cast<std::size_t>(b)]);
  index_t const kmax = st.k_offset + (klen > 0 ? klen : total) - 1, qmax = st.q_offset + total - 1;
  rot.length = std::max(kmax, qmax) + 1;
  rot.q_ids = shard_positions(st, rank, S, st.q_offset);
  for (auto& p : rot.q_ids) p = std::max<index_t>(p, 0);
  rot.k_ids.resize(static_cast<std::size_t>(B * S));
  for (index_t b = 0; b < B; ++b)
    for (index_t s = 0; s < S; ++s) {
      index_t const j = st.map.global_index(rank, s);
      index_t const p = j + st.k_offset;
      rot.k_ids[static_cast<std::size_t>(b * S + s)] =
          j < st.key_len[static_cast<std::size_t>(b)] ? p : std::min(p, rot.length - 1);
    }
  return rot;
}

/// The second phase: validates this rank's share of the whole call with its
/// global positions, then packs (and rotates) its first block. Throws posenc::error.
template <class T, class E>
void prepare(ring_setup<T>& st, int rank, view<const T> q, view<const T> k, view<const T> v, view<T> out,
             E const& enc, ring_options<T> const& opt) {
  using traits = encoder_traits<E>;
  index_t const B = q.batch, S = q.seq;
  std::vector<index_t> const qids = shard_positions(st, rank, S, st.q_offset);
  std::vector<index_t> const kids = shard_positions(st, rank, S, st.k_offset);
  attention_options<T> vo;
  vo.scale = opt.scale;
  vo.causal = opt.causal;
  vo.sliding_window = opt.sliding_window;
  vo.softcap = opt.softcap;
  vo.q_positions = position_span::ids(qids.data(), 1, S);
  vo.k_positions = position_span::ids(kids.data(), 1, S);
  if constexpr (traits::rotates_queries_keys) {
    rotation_applied<E> const applied(enc);
    (void)posenc::detail::make_plan(q, k, v, out, applied, vo);
  } else {
    (void)posenc::detail::make_plan(q, k, v, out, enc, vo);
  }
  ring_workspace<T>& ws = *st.ws;
  fit(ws.blocks[0], B * st.max_block * k.heads * (k.dim + v.dim));
  fit(ws.blocks[1], B * st.max_block * k.heads * (k.dim + v.dim));
  view<T> const kp = pack(k, ws.blocks[0].data());
  pack(v, ws.blocks[0].data() + B * S * k.heads * k.dim);
  if constexpr (traits::rotates_queries_keys) {
    shard_rotation const rot = rotation_of_shard(st, rank, B, S);
    fit(ws.q_rotated, B * S * q.heads * q.dim);
    view<T> const qp = pack(q, ws.q_rotated.data());
    if (S > 0 && q.dim > 0) enc.rotate(qp, position_span::ids(rot.q_ids.data(), 1, S), rot.length);
    if (!opt.keys_rotated && S > 0 && k.dim > 0) enc.rotate(kp, position_span::ids(rot.k_ids.data(), B, S), rot.length);
  } else {
    (void)kp;
  }
}

/// Merges one block's normalised output (batch, n, q_heads, value_dim) and
/// its log-sum-exp (batch, q_heads, n) into the rows [s0, s0 + n) of the
/// accumulator, with the decode split's merge_partials.
template <class T>
void merge_block(ring_workspace<T>& acc, T const* out, T const* lse, index_t batch, index_t shard, index_t s0,
                 index_t n, index_t heads, index_t value_dim) {
  std::vector<double> o2(static_cast<std::size_t>(2 * value_dim));
  for (index_t b = 0; b < batch; ++b)
    for (index_t i = 0; i < n; ++i)
      for (index_t h = 0; h < heads; ++h) {
        std::size_t const row = static_cast<std::size_t>((b * shard + s0 + i) * heads + h);
        double* const o = acc.o.data() + row * static_cast<std::size_t>(value_dim);
        T const* const src = out + ((b * n + i) * heads + h) * value_dim;
        std::copy(o, o + value_dim, o2.begin());
        std::copy(src, src + value_dim, o2.begin() + value_dim);
        double m2[2] = {acc.m[row], static_cast<double>(lse[(b * heads + h) * n + i])};
        double l2[2] = {acc.l[row], 1.0};
        auto const ml = posenc::detail::fused::merge_partials<double>(m2, l2, o2.data(), 2, 1, value_dim);
        acc.m[row] = ml.first;
        acc.l[row] = ml.second;
        std::copy(o2.begin(), o2.begin() + value_dim, o);
      }
}

/// True when no query of run qs sees any key of run ks: every key in the
/// queries' future (causal), behind their window, or padding in every entry.
inline bool block_invisible(segment qs, segment ks, index_t q_offset, index_t k_offset, bool causal, index_t window,
                            std::vector<index_t> const& key_len) {
  if (qs.count == 0 || ks.count == 0) return true;
  index_t const qlo = q_offset + qs.first, qhi = qlo + qs.count - 1;
  index_t const klo = k_offset + ks.first, khi = klo + ks.count - 1;
  if ((causal || window > 0) && klo > qhi) return true;
  if (window > 0 && khi <= qlo - window) return true;
  bool any = false;
  for (index_t L : key_len) any = any || L > ks.first;
  return !any;
}

/// The options of one (query run, key run) call: the user's scale, causal
/// rule, window and softcap, the runs' positions, the key lengths of the key
/// run (`klens` holds them), and the block's log-sum-exp output.
template <class T>
attention_options<T> block_options(ring_setup<T> const& st, ring_options<T> const& opt, segment qs, segment ks,
                                   bool shift_ok, std::vector<index_t>& klens, T* lse, index_t lse_values) {
  attention_options<T> o;
  o.scale = opt.scale;
  o.causal = opt.causal;
  o.sliding_window = opt.sliding_window;
  o.softcap = opt.softcap;
  o.threads = opt.threads;
  o.keys_rotated = opt.keys_rotated;
  index_t const qlo = st.q_offset + qs.first, klo = st.k_offset + ks.first;
  if (shift_ok && (qlo >= klo || opt.causal || opt.sliding_window > 0)) {
    // Keys at their indices, queries at their distance from the run's first key: the
    // same scores (they depend on positions only through j - i), and the kernel's
    // exact tile plan (per-key tests only on the diagonal). Negative query positions
    // only come with causal, where they are allowed.
    o.q_positions = position_span(qlo - klo);
  } else if (shift_ok) {
    // Queries before the keys, without causal: every key is visible anyway.
    o.q_positions = position_span(0);
    o.k_positions = position_span(klo - qlo);
  } else {
    o.q_positions = position_span(qlo);
    o.k_positions = position_span(klo);
  }
  if (!opt.key_lengths.empty()) {
    index_t const B = static_cast<index_t>(klens.size());
    for (index_t b = 0; b < B; ++b)
      klens[static_cast<std::size_t>(b)] =
          std::clamp<index_t>(st.key_len[static_cast<std::size_t>(b)] - ks.first, 0, ks.count);
    o.key_lengths = span<const index_t>(klens.data(), B);
  }
  o.lse = output_span<T>(lse, lse_values);
  return o;
}

/// The two agreement phases: (1) shapes, options and shard lengths against
/// every other rank, then the shard map; (2) this rank's share validated with
/// its global positions, its first block packed (and rotated), the digest of
/// the encoder's identity (identity_of: every parameter and table) against
/// every other rank. Throws the same posenc::error on every rank, naming the
/// call `w` (posenc::ring_attention or posenc::ring_attention_backward).
template <class T, class E>
void agree_and_prepare(char const* w, MPI_Comm comm, int r, view<const T> q, view<const T> k, view<const T> v,
                       view<T> out, E const& enc, ring_options<T> const& opt, ring_setup<T>& st) {
  using posenc::detail::require;
  descriptor mine;
  try {
    check_local(w, q, k, opt);
    if constexpr (posenc::detail::has_memory_length<E>::value)
      require(enc.memory_length() == 0, w, "the encoder's memory_length() is ", enc.memory_length(),
              ", expected 0 (ring attention is self-attention over the sharded sequence: there is no segment "
              "memory before the queries to cut)");
    mine = describe<T, E>(q, k, v, opt);
  } catch (error const& e) {
    mine.set_error(e.what());
  }
  std::vector<descriptor> const all = exchange(comm, mine);
  require_agreement(all, r, w);

  std::vector<index_t> lengths;
  for (auto const& d : all) lengths.push_back(d.shard_length);
  st.map = make_shard_map(opt.layout, span<const index_t>(lengths.data(), static_cast<index_t>(lengths.size())), w);
  st.q_offset = mine.get(field::q_offset);
  st.k_offset = mine.get(field::k_offset);
  index_t const B = q.batch, Hkv = k.heads, D = q.dim, Dv = v.dim;
  st.key_len.assign(static_cast<std::size_t>(B), st.map.total);
  for (index_t b = 0; b < opt.key_lengths.size(); ++b) {
    index_t const L = opt.key_lengths[b];
    require(L >= 0 && L <= st.map.total, w, "key_lengths[", b, "] is ", L, ", expected 0 .. ", st.map.total,
            " (the whole sequence)");
    st.key_len[static_cast<std::size_t>(b)] = L;
  }
  for (index_t len : lengths) st.max_block = std::max(st.max_block, len);
  index_t const block_elems = posenc::detail::checked_mul(
      w, posenc::detail::checked_mul(w, B, st.max_block, "batch x shard"),
      posenc::detail::checked_mul(w, Hkv, posenc::detail::checked_add(w, D, Dv, "D + Dv"), "Hkv x (D + Dv)"),
      "key/value block size");
  require(block_elems <= INT_MAX, w, "a key/value block is ", block_elems, " elements, expected <= ", INT_MAX,
          " (one MPI message; use more ranks or a smaller batch)");

  descriptor second;
  encoder_identity id;
  try {
    prepare(st, r, q, k, v, out, enc, opt);
    id = identity_of(enc);
    second.encoder_digest = id.digest();
  } catch (error const& e) {
    second.set_error(e.what());
  }
  std::vector<descriptor> const all2 = exchange(comm, second);
  require_agreement(all2, r, w);
  require_same_encoder(all2, r, w, id.text());
}

/// One (query run, key run) pair: attention of the run's queries (rows
/// [q0, q0 + q.seq) of the shard) over the key run into the workspace's block
/// output, then merged into the accumulator.
template <class T, class E>
void attend_and_merge(MPI_Comm comm, ring_workspace<T>& ws, view<const T> q, view<const T> k, view<const T> v,
                      E const& enc, attention_options<T> const& o, index_t shard, index_t q0) {
  index_t const B = q.batch, Hq = q.heads, Dv = v.dim;
  view<T> const ov = make_bshd(ws.out.data(), B, q.seq, Hq, Dv);
  try {
    if constexpr (encoder_traits<E>::rotates_queries_keys)
      attention(q, k, v, ov, rotation_applied<E>(enc), o);
    else
      attention(q, k, v, ov, enc, o);
  } catch (error const& e) {
    // Unreachable after the two agreement phases; the other ranks would wait forever.
    std::fprintf(stderr, "%s\n", e.what());
    MPI_Abort(comm, 1);
  }
  merge_block(ws, ws.out.data(), ws.lse.data(), B, shard, q0, q.seq, Hq, Dv);
}

/// Writes every row of the shard from the accumulator: out = o / l (zeros
/// when no key was visible) and, when asked, lse = m + ln l (-inf then).
template <class T>
void finish_rows(ring_workspace<T> const& acc, view<T> out, T* lse, index_t B, index_t S, index_t Hq, index_t Dv) {
  for (index_t b = 0; b < B; ++b)
    for (index_t s = 0; s < S; ++s)
      for (index_t h = 0; h < Hq; ++h) {
        std::size_t const row = static_cast<std::size_t>((b * S + s) * Hq + h);
        double const l = acc.l[row];
        double const* const o = acc.o.data() + row * static_cast<std::size_t>(Dv);
        T* const dst = out.ptr(b, s, h);
        for (index_t d = 0; d < Dv; ++d) dst[d] = l > 0 ? static_cast<T>(o[d] / l) : T(0);
        if (lse != nullptr)
          lse[(b * Hq + h) * S + s] =
              l > 0 ? static_cast<T>(acc.m[row] + std::log(l)) : -std::numeric_limits<T>::infinity();
      }
}

/// One ring step's work on this rank: every (query run, key run) pair of the
/// shard's runs against block `src`'s runs that some query can see, as
/// body(qs, ks, q0, k0) with q0, k0 the runs' first rows in the shard and the
/// block. Pairs nobody sees are counted and skipped; after each pair the
/// pending transfers get a chance to progress.
template <class T, class Body>
void for_each_visible_pair(ring_setup<T> const& st, int r, int src, bool causal, index_t window, ring_stats& stats,
                           MPI_Request* req, int nreq, Body&& body) {
  index_t q0 = 0;
  for (segment const& qs : st.map.runs[static_cast<std::size_t>(r)]) {
    index_t k0 = 0;
    for (segment const& ks : st.map.runs[static_cast<std::size_t>(src)]) {
      if (block_invisible(qs, ks, st.q_offset, st.k_offset, causal, window, st.key_len)) {
        ++stats.blocks_skipped;
      } else {
        body(qs, ks, q0, k0);
        ++stats.blocks_run;
        int done = 0;
        MPI_Testall(nreq, req, &done, MPI_STATUSES_IGNORE);  // lets the transfers progress between blocks
      }
      k0 += ks.count;
    }
    q0 += qs.count;
  }
}

}  // namespace detail

/// Attention over a sequence split across the ranks of `comm`: rank r holds
/// its shard of the queries, keys and values (the tokens of
/// opt.layout) and gets the rows of its shard, equal to posenc::attention over
/// the whole sequence with the same encoder and options (under the tests'
/// tolerance rule). Key/value blocks travel around the ring with non-blocking
/// MPI while the previous block is computed; partial results merge by their
/// log-sum-exp; every block gets its absolute positions, so every encoder
/// gives the single-process result. Blocks that no query of a run sees
/// (causal future, outside the window) are skipped.
///
/// Every rank of `comm` must call it. The ranks first exchange a descriptor
/// (shapes, options, the encoder's type, the shard lengths), then the digest
/// of the encoder's identity (identity_of(enc): every parameter and every
/// table entry): a disagreement, or a bad argument on any rank, throws
/// posenc::error on every rank, before anything is written; an encoder that
/// differs names this rank's identity text.
///
/// @param q   (batch, shard, Hq, D): this rank's queries
/// @param k   (batch, shard, Hkv, D): the keys of the same tokens
/// @param v   (batch, shard, Hkv, Dv)
/// @param out (batch, shard, Hq, Dv)
/// @param opt attention options of the whole sequence (key_lengths are the
///        whole sequence's; opt.lse, when set, gets (batch, Hq, shard)) and the layout
/// @return the time spent computing and waiting on this rank
template <class T, class E>
ring_stats ring_attention(MPI_Comm comm, view<const posenc::detail::identity_t<T>> q,
                          view<const posenc::detail::identity_t<T>> k, view<const posenc::detail::identity_t<T>> v,
                          view<T> out, E const& enc, ring_options<posenc::detail::identity_t<T>> const& opt) {
  static_assert(has_encoder_traits_v<E>, "posenc::ring_attention: E is not an encoder; specialize "
                                         "posenc::encoder_traits<E> (see posenc/encoding/traits.hpp)");
  static_assert(!encoder_traits<E>::adds_to_embeddings,
                "posenc::ring_attention: this encoder adds to embeddings; call its add_to() on the input "
                "embeddings before the projections");
  static_assert(keeps_encoder_contract_v<E, T>,
                "posenc::ring_attention: the encoder breaks the encoder contract; posenc::attention names the "
                "problem");
  using traits = encoder_traits<E>;
  auto const t_start = detail::clock::now();
  detail::comm_copy const ring(comm);
  int R = 1, r = 0;
  MPI_Comm_size(ring.get(), &R);
  MPI_Comm_rank(ring.get(), &r);
  ring_stats stats;
  stats.steps = R;

  detail::ring_setup<T> st;
  ring_workspace<T> own;
  st.ws = opt.workspace != nullptr ? opt.workspace : &own;
  ring_workspace<T>& ws = *st.ws;
  detail::agree_and_prepare("posenc::ring_attention", ring.get(), r, q, k, v, out, enc, opt, st);
  std::vector<index_t> const& lengths = st.map.lengths;
  index_t const B = q.batch, S = q.seq, Hq = q.heads, Hkv = k.heads, D = q.dim, Dv = v.dim;

  // The ring: step t computes the block of rank (r - t) mod R while the next one arrives.
  index_t max_run = 0;
  for (segment const& g : st.map.runs[static_cast<std::size_t>(r)]) max_run = std::max(max_run, g.count);
  ws.o.assign(static_cast<std::size_t>(B * S * Hq * Dv), 0.0);
  ws.m.assign(static_cast<std::size_t>(B * S * Hq), -std::numeric_limits<double>::infinity());
  ws.l.assign(ws.m.size(), 0.0);
  detail::fit(ws.out, B * max_run * Hq * Dv);
  detail::fit(ws.lse, B * Hq * max_run);
  T* const tmp_lse = ws.lse.data();
  std::vector<index_t> klens(static_cast<std::size_t>(B));
  view<const T> const qsrc = traits::rotates_queries_keys
                                 ? view<const T>(make_bshd(ws.q_rotated.data(), B, S, Hq, D))
                                 : q;
  // Scores that depend on positions only through their difference (no bias, or a
  // shift-invariant one: not ALiBi's key-only form) let every block count keys from 0.
  bool shift_ok = true;
  if constexpr (traits::biases_scores) shift_ok = posenc::detail::bias_shift_invariant(enc);
  int const right = (r + 1) % R, left = (r + R - 1) % R;
  int cur = 0;
  for (int t = 0; t < R; ++t) {
    int const src = (r - t + R) % R, next_src = (src + R - 1) % R;
    MPI_Request req[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    if (t + 1 < R) {
      index_t const send_n = B * lengths[static_cast<std::size_t>(src)] * Hkv * (D + Dv);
      index_t const recv_n = B * lengths[static_cast<std::size_t>(next_src)] * Hkv * (D + Dv);
      MPI_Irecv(ws.blocks[1 - cur].data(), static_cast<int>(recv_n), detail::mpi_type<T>(), left, t, ring.get(),
                &req[0]);
      MPI_Isend(ws.blocks[cur].data(), static_cast<int>(send_n), detail::mpi_type<T>(), right, t, ring.get(),
                &req[1]);
    }
    auto const t_compute = detail::clock::now();
    auto const kv = detail::block_views(ws.blocks[cur].data(), B, lengths[static_cast<std::size_t>(src)], Hkv, D, Dv);
    detail::for_each_visible_pair(st, r, src, opt.causal, opt.sliding_window, stats, req, 2,
                                  [&](segment qs, segment ks, index_t q0, index_t k0) {
                                    attention_options<T> const o =
                                        detail::block_options(st, opt, qs, ks, shift_ok, klens, tmp_lse,
                                                              B * Hq * qs.count);
                                    detail::attend_and_merge(ring.get(), ws, detail::rows_of(qsrc, q0, qs.count),
                                                             detail::rows_of(kv.first, k0, ks.count),
                                                             detail::rows_of(kv.second, k0, ks.count), enc, o, S, q0);
                                  });
    stats.compute_seconds += detail::seconds_since(t_compute);
    auto const t_wait = detail::clock::now();
    MPI_Waitall(2, req, MPI_STATUSES_IGNORE);
    stats.wait_seconds += detail::seconds_since(t_wait);
    cur = 1 - cur;
  }

  // Finish: normalise every row, write out (and lse).
  detail::finish_rows(ws, out, opt.lse.data(), B, S, Hq, Dv);
  stats.seconds = detail::seconds_since(t_start);
  return stats;
}

}  // namespace posenc::distributed
