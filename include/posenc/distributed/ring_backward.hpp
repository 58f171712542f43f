// SPDX-License-Identifier: MIT
// ring_attention_backward: gradients of ring_attention; dK/dV travel around the ring with their blocks.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "posenc/attention/backward.hpp"
#include "posenc/distributed/ring.hpp"

namespace posenc::distributed {
namespace detail {

/// The buffers of one backward call beyond the forward ring's: the travelling
/// dK/dV partial sums (two, one being sent while the other is filled), the
/// one arriving from the left, the query rows' dq accumulator and one block
/// call's outputs.
template <class T>
struct ring_backward_buffers {
  aligned_buffer<T> partial[2];  // (batch, block, Hkv, D) dK then (batch, block, Hkv, Dv) dV
  aligned_buffer<T> arriving;    // the same, from the left neighbour
  std::vector<double> dq;        // (batch, shard, Hq, D)
  aligned_buffer<T> dq_run, dk_run, dv_run, lse_run;
  // The check of the given lse: each query row's sum_j exp(s_ij - lse_i) over every key of the
  // ring, (batch, Hq, shard), and one block call's share, (batch, Hq, run).
  std::vector<double> lse_sums, run_sums;
};

/// Phase 0's check of the given lse values: a finite value beyond lse_trusted_limit (2^11 in
/// float) is rejected. The single-process backward recomputes such a row's lse from its scores;
/// on the ring a row's scores are spread over every rank's block, so it cannot, and the given
/// value's rounding would scale the row's gradients by up to exp of it.
template <class T>
void check_ring_lse_values(char const* w, T const* lse, index_t B, index_t Hq, index_t S) {
  for (index_t r = 0; r < B * Hq * S; ++r) {
    double const x = static_cast<double>(lse[r]);
    posenc::detail::require(posenc::detail::lse_trusted<T>(lse[r]), w, "lse of batch entry ", r / (Hq * S),
                            ", head ", (r / S) % Hq, ", row ", r % S, " is ", x, ", expected |lse| <= ",
                            posenc::detail::lse_trusted_limit<T>(),
                            ": beyond it the rounding of a given lse scales a row's gradients, and a ring ",
                            "cannot recompute the row's own (its keys are on every rank); run this ring in ",
                            "double, or call attention_backward on the whole sequence");
  }
}

/// The forward log-sum-exp of the query rows [q0, q0 + n) of the shard, packed (batch, Hq, n).
template <class T>
void copy_lse_rows(T const* lse, T* dst, index_t B, index_t Hq, index_t S, index_t q0, index_t n) {
  for (index_t b = 0; b < B; ++b)
    for (index_t h = 0; h < Hq; ++h) std::copy(lse + (b * Hq + h) * S + q0, lse + (b * Hq + h) * S + q0 + n, dst + (b * Hq + h) * n);
}

/// Adds the (batch, n, heads, dim) gradient `g` into rows [r0, r0 + n) of the
/// packed (batch, rows, heads, dim) buffer `acc`.
template <class A, class T>
void add_rows(A* acc, index_t rows, T const* g, index_t B, index_t r0, index_t n, index_t heads, index_t dim) {
  index_t const row = heads * dim;
  for (index_t b = 0; b < B; ++b)
    for (index_t s = 0; s < n; ++s) {
      A* dst = acc + (b * rows + r0 + s) * row;
      T const* src = g + (b * n + s) * row;
      for (index_t e = 0; e < row; ++e) dst[e] += static_cast<A>(src[e]);
    }
}

/// The gradients of one (query run, key run) pair, from the forward pass's
/// log-sum-exp and output: dq into the accumulator, dK/dV into this step's
/// partial sum of the block, the encoder's parameters into grads.
template <class T, class E>
void backward_block(MPI_Comm comm, ring_backward_buffers<T>& bb, T* partial, index_t block_len,
                    view<const T> q, view<const T> k, view<const T> v, view<const T> out, view<const T> dout,
                    E const& enc, attention_options<T> const& o, index_t shard, index_t q0, index_t k0,
                    encoder_gradients_t<E>& grads) {
  index_t const B = q.batch, n = q.seq, kn = k.seq, Hq = q.heads, Hkv = k.heads, D = q.dim, Dv = v.dim;
  view<T> const dq = make_bshd(bb.dq_run.data(), B, n, Hq, D);
  view<T> const dk = make_bshd(bb.dk_run.data(), B, kn, Hkv, D);
  view<T> const dv = make_bshd(bb.dv_run.data(), B, kn, Hkv, Dv);
  try {
    // The lse is the whole sequence's, over more keys than this block's: a row's probabilities here
    // sum to less than 1, so the block call does not check it; it adds each row's share of the
    // check to run_sums, and ring_attention_backward checks the whole rows before writing.
    std::fill(bb.run_sums.begin(), bb.run_sums.begin() + B * Hq * n, 0.0);
    if constexpr (encoder_traits<E>::rotates_queries_keys)
      posenc::detail::checked_attention_backward<path::fused, T>(q, k, v, out, dout, dq, dk, dv,
                                                                 rotation_applied<E>(enc), o, {}, grads,
                                                                 std::false_type{}, bb.run_sums.data());
    else
      posenc::detail::checked_attention_backward<path::fused, T>(q, k, v, out, dout, dq, dk, dv, enc, o, {}, grads,
                                                                 std::false_type{}, bb.run_sums.data());
  } catch (error const& e) {
    // Unreachable after the agreement phases; the other ranks would wait forever.
    std::fprintf(stderr, "%s\n", e.what());
    MPI_Abort(comm, 1);
  }
  for (index_t bh = 0; bh < B * Hq; ++bh)
    for (index_t i = 0; i < n; ++i) bb.lse_sums[static_cast<std::size_t>(bh * shard + q0 + i)] += bb.run_sums[static_cast<std::size_t>(bh * n + i)];
  add_rows(bb.dq.data(), shard, bb.dq_run.data(), B, q0, n, Hq, D);
  add_rows(partial, block_len, bb.dk_run.data(), B, k0, kn, Hkv, D);
  add_rows(partial + B * block_len * Hkv * D, block_len, bb.dv_run.data(), B, k0, kn, Hkv, Dv);
}

}  // namespace detail

/// Gradients of ring_attention (docs/distributed.md, docs/backward.md): rank r
/// gets dq, dk and dv of its own shard, equal to posenc::attention_backward
/// over the whole sequence with the same encoder and options (under the tests'
/// tolerance rule), and adds its share of the encoder's parameter gradients
/// into `grads`.
///
/// Key/value blocks travel around the ring as in the forward pass (the next
/// one arrives while the current one is computed); each block's dK/dV partial
/// sum travels behind it: a rank adds its contribution to the sum that
/// arrives from its left neighbour and passes it on, and after R steps the sum
/// is back with the block's owner. Each step's contribution is computed in a
/// zeroed buffer while that sum is on its way, so the transfer overlaps the
/// computation too. Every block runs the fused flash-style backward from the
/// forward pass's log-sum-exp and output (`attention_backward<path::fused>`).
/// The order of every sum is fixed by the ring, so the result is the same, bit
/// for bit, from run to run.
///
/// - `opt` must be the forward call's options, with `opt.lse` the forward
///   pass's log-sum-exp of this shard, (batch, Hq, shard) (read, not written).
/// - Rotating encoders: q and k are rotated once per rank at the whole
///   sequence's length, as in the forward pass, and dq, dk rotated back.
/// - `grads` receives this rank's share only; the encoder's gradient is the
///   sum over the ranks (an MPI_Allreduce over its values, as data-parallel
///   training does for every other parameter).
///
/// Every rank of `comm` must call it; a bad argument or a disagreement on any
/// rank throws posenc::error on every rank before anything is written.
template <class T, class E>
ring_stats ring_attention_backward(MPI_Comm comm, view<const posenc::detail::identity_t<T>> q,
                                   view<const posenc::detail::identity_t<T>> k,
                                   view<const posenc::detail::identity_t<T>> v,
                                   view<const posenc::detail::identity_t<T>> out,
                                   view<const posenc::detail::identity_t<T>> dout, view<T> dq,
                                   view<posenc::detail::identity_t<T>> dk, view<posenc::detail::identity_t<T>> dv,
                                   E const& enc, ring_options<posenc::detail::identity_t<T>> const& opt,
                                   encoder_gradients_t<E>& grads) {
  static_assert(has_encoder_traits_v<E>, "posenc::ring_attention_backward: E is not an encoder; specialize "
                                         "posenc::encoder_traits<E> (see posenc/encoding/traits.hpp)");
  static_assert(!encoder_traits<E>::adds_to_embeddings,
                "posenc::ring_attention_backward: this encoder adds to embeddings; call its add_to_backward() "
                "with the gradient of the embeddings");
  static_assert(!posenc::detail::has_any_content_bias<E>::value,
                "posenc::ring_attention_backward: the encoder shifts queries by a content bias (transformer_xl), "
                "which the fused backward the ring runs does not handle; its forward ring_attention works, its "
                "backward only single-process (attention_backward<path::reference>)");
  using traits = encoder_traits<E>;
  char const* const w = "posenc::ring_attention_backward";
  auto const t_start = detail::clock::now();
  detail::comm_copy const ring(comm);
  int R = 1, r = 0;
  MPI_Comm_size(ring.get(), &R);
  MPI_Comm_rank(ring.get(), &r);
  ring_stats stats;
  stats.steps = R;

  // Phase 0: the backward arguments of this rank (shapes, aliasing, lse given).
  view<T> const out_checked{const_cast<T*>(out.data), out.batch,        out.seq,         out.heads,     out.dim,
                            out.batch_stride,         out.seq_stride,   out.head_stride, out.dim_stride};
  detail::descriptor mine;
  try {
    // A rank that holds no token has no log-sum-exp: a null lse is its zero values.
    posenc::detail::check_view(w, "q", q);
    index_t const lse_values = q.batch * q.heads * q.seq;  // fits: a partial product of q's checked element count
    posenc::detail::require(opt.lse || lse_values == 0, w,
                            "lse is null, expected the forward ring_attention's log-sum-exp (batch, Hq, shard) = ",
                            lse_values, " values");
    posenc::detail::validate_backward(w, q, k, v, out, dout, dq, dk, dv, enc, opt, grads, true);
    if (lse_values > 0) detail::check_ring_lse_values(w, static_cast<T const*>(opt.lse.data()), q.batch, q.heads, q.seq);
  } catch (error const& e) {
    mine.set_error(e.what());
  }
  detail::require_agreement(detail::exchange(ring.get(), mine), r, w);

  // Phases 1 and 2 of the forward ring: agreement, shard map, first block packed and rotated.
  detail::ring_setup<T> st;
  ring_workspace<T> own;
  st.ws = opt.workspace != nullptr ? opt.workspace : &own;
  ring_workspace<T>& ws = *st.ws;
  detail::agree_and_prepare(w, ring.get(), r, q, k, v, out_checked, enc, opt, st);
  std::vector<index_t> const& lengths = st.map.lengths;
  index_t const B = q.batch, S = q.seq, Hq = q.heads, Hkv = k.heads, D = q.dim, Dv = v.dim;
  index_t const block_elems = B * st.max_block * Hkv * (D + Dv);

  detail::ring_backward_buffers<T> bb;
  index_t max_run = 0;
  for (auto const& runs : st.map.runs)
    for (segment const& g : runs) max_run = std::max(max_run, g.count);
  for (auto& b : bb.partial) detail::fit(b, block_elems);
  detail::fit(bb.arriving, block_elems);
  detail::fit(bb.dq_run, B * max_run * Hq * D);
  detail::fit(bb.dk_run, B * max_run * Hkv * D);
  detail::fit(bb.dv_run, B * max_run * Hkv * Dv);
  detail::fit(bb.lse_run, B * Hq * max_run);
  bb.dq.assign(static_cast<std::size_t>(B * S * Hq * D), 0.0);
  bb.lse_sums.assign(static_cast<std::size_t>(B * Hq * S), 0.0);
  bb.run_sums.assign(static_cast<std::size_t>(B * Hq * max_run), 0.0);
  std::vector<index_t> klens(static_cast<std::size_t>(B));
  view<const T> const qsrc = traits::rotates_queries_keys
                                 ? view<const T>(make_bshd(ws.q_rotated.data(), B, S, Hq, D))
                                 : q;
  bool shift_ok = true;
  if constexpr (traits::biases_scores) shift_ok = posenc::detail::bias_shift_invariant(enc);

  // Step t: compute with the block of rank src = (r - t) mod R while the next
  // block arrives and the partial sum of src arrives from the left; add it to
  // this rank's contribution and send the sum to the right. At the last step
  // the right neighbour is the block's owner; the owner's own sum comes from
  // its left.
  int const right = (r + 1) % R, left = (r + R - 1) % R;
  int const partial_tag = 2 * R;
  int cur = 0;
  MPI_Request send_partial[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};  // of partial[0] and partial[1]
  for (int t = 0; t < R; ++t) {
    int const src = (r - t + R) % R, next_src = (src + R - 1) % R;
    index_t const blen = lengths[static_cast<std::size_t>(src)];
    index_t const n_block = B * blen * Hkv * (D + Dv);
    MPI_Request req[3] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    if (t + 1 < R) {
      index_t const recv_n = B * lengths[static_cast<std::size_t>(next_src)] * Hkv * (D + Dv);
      MPI_Irecv(ws.blocks[1 - cur].data(), static_cast<int>(recv_n), detail::mpi_type<T>(), left, t, ring.get(),
                &req[0]);
      MPI_Isend(ws.blocks[cur].data(), static_cast<int>(n_block), detail::mpi_type<T>(), right, t, ring.get(),
                &req[1]);
    }
    if (t > 0)
      MPI_Irecv(bb.arriving.data(), static_cast<int>(n_block), detail::mpi_type<T>(), left, partial_tag + t - 1,
                ring.get(), &req[2]);
    // The partial buffer sent two steps ago is free once that send completed.
    T* const partial = bb.partial[t % 2].data();
    auto const t_wait0 = detail::clock::now();
    MPI_Wait(&send_partial[t % 2], MPI_STATUS_IGNORE);
    stats.wait_seconds += detail::seconds_since(t_wait0);

    auto const t_compute = detail::clock::now();
    std::fill(partial, partial + n_block, T(0));
    auto const kv = detail::block_views(ws.blocks[cur].data(), B, blen, Hkv, D, Dv);
    detail::for_each_visible_pair(
        st, r, src, opt.causal, opt.sliding_window, stats, req, 3, [&](segment qs, segment ks, index_t q0, index_t k0) {
          detail::copy_lse_rows(static_cast<T const*>(opt.lse.data()), bb.lse_run.data(), B, Hq, S, q0, qs.count);
          attention_options<T> const o = detail::block_options(st, opt, qs, ks, shift_ok, klens, bb.lse_run.data(),
                                                                         B * Hq * qs.count);
          detail::backward_block(ring.get(), bb, partial, blen, detail::rows_of(qsrc, q0, qs.count),
                                 detail::rows_of(kv.first, k0, ks.count), detail::rows_of(kv.second, k0, ks.count),
                                 detail::rows_of(out, q0, qs.count), detail::rows_of(dout, q0, qs.count), enc, o, S,
                                 q0, k0, grads);
        });
    stats.compute_seconds += detail::seconds_since(t_compute);

    auto const t_wait = detail::clock::now();
    MPI_Waitall(3, req, MPI_STATUSES_IGNORE);
    stats.wait_seconds += detail::seconds_since(t_wait);
    if (t > 0)  // the sum so far, then this rank's contribution: the ring fixes the order
      for (index_t e = 0; e < n_block; ++e) partial[e] = bb.arriving.data()[e] + partial[e];
    if (R > 1)
      MPI_Isend(partial, static_cast<int>(n_block), detail::mpi_type<T>(), right, partial_tag + t, ring.get(),
                &send_partial[t % 2]);
    cur = 1 - cur;
  }

  // This rank's own block: its complete sum arrives from the left (or is the
  // one just computed, alone on the ring).
  index_t const own_n = B * S * Hkv * (D + Dv);
  T const* sums = bb.partial[(R - 1) % 2].data();
  auto const t_wait = detail::clock::now();
  if (R > 1) {
    MPI_Recv(bb.arriving.data(), static_cast<int>(own_n), detail::mpi_type<T>(), left, partial_tag + R - 1,
             ring.get(), MPI_STATUS_IGNORE);
    MPI_Waitall(2, send_partial, MPI_STATUSES_IGNORE);
    sums = bb.arriving.data();
  }
  stats.wait_seconds += detail::seconds_since(t_wait);

  // The check of the given lse, now that each row has every key's share (as attention_backward
  // checks it: options other than the forward's change a row's sum by O(1)). Every rank learns of
  // any rank's mismatch, and nothing is written on any of them.
  {
    detail::descriptor checked;
    try {
      index_t keys = 0;
      for (index_t len : lengths) keys += len;
      T const* lse = static_cast<T const*>(opt.lse.data());
      for (index_t row = 0; row < B * Hq * S; ++row)
        posenc::detail::check_lse_row(w, row / (Hq * S), (row / S) % Hq, row % S, keys, lse[row],
                                      bb.lse_sums[static_cast<std::size_t>(row)]);
    } catch (error const& e) {
      checked.set_error(e.what());
    }
    detail::require_agreement(detail::exchange(ring.get(), checked), r, w);
  }

  // Write dq, dk, dv; rotating encoders: the transposed rotation at the forward's positions.
  auto const dk_sum = detail::block_views(sums, B, S, Hkv, D, Dv);
  for (index_t b = 0; b < B; ++b)
    for (index_t s = 0; s < S; ++s) {
      for (index_t h = 0; h < Hq; ++h) {
        double const* src = bb.dq.data() + ((b * S + s) * Hq + h) * D;
        T* dst = dq.ptr(b, s, h);
        for (index_t d = 0; d < D; ++d) dst[d] = static_cast<T>(src[d]);
      }
      for (index_t h = 0; h < Hkv; ++h) {
        std::copy(dk_sum.first.ptr(b, s, h), dk_sum.first.ptr(b, s, h) + D, dk.ptr(b, s, h));
        std::copy(dk_sum.second.ptr(b, s, h), dk_sum.second.ptr(b, s, h) + Dv, dv.ptr(b, s, h));
      }
    }
  if constexpr (traits::rotates_queries_keys) {
    detail::shard_rotation const rot = detail::rotation_of_shard(st, r, B, S);
    if (S > 0 && D > 0) {
      enc.rotate_transpose(dq, position_span::ids(rot.q_ids.data(), 1, S), rot.length);
      if (!opt.keys_rotated) enc.rotate_transpose(dk, position_span::ids(rot.k_ids.data(), B, S), rot.length);
    }
  }
  stats.seconds = detail::seconds_since(t_start);
  return stats;
}

}  // namespace posenc::distributed
