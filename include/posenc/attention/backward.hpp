// SPDX-License-Identifier: MIT
// posenc::attention_backward: gradients of attention and of the encoder's parameters; checks and path dispatch.
#pragma once

#include <type_traits>

#include "posenc/attention/attention.hpp"
#include "posenc/attention/backward/fused.hpp"
#include "posenc/attention/backward/plan.hpp"
#include "posenc/attention/backward/reference.hpp"
#include "posenc/attention/options.hpp"
#include "posenc/attention/plan.hpp"
#include "posenc/core/aligned_buffer.hpp"
#include "posenc/core/view.hpp"
#include "posenc/encoding/traits.hpp"
// Further backward paths specialize detail::backward_kernel<Path> in attention/backward/; include them here.

namespace posenc {
namespace detail {

/// Encoders the fused backward does not handle (yet): those with a content
/// bias (transformer_xl); path::best takes the reference path for them and
/// path::fused is a compile error.
template <class E>
struct fused_backward_excluded : has_any_content_bias<E> {};

/// The backward path that runs for tag `Path`: path::best picks the fused
/// path once it has a backward pass, else the reference one.
template <class Path, class D>
struct backward_path {
  using type = Path;
};
template <class D>
struct backward_path<path::best, D> {
  using type = std::conditional_t<backward_kernel<typename dependent_path<path::fused, D>::type>::available &&
                                      !fused_backward_excluded<D>::value,
                                  path::fused, path::reference>;
};

template <class Path, class T, class E>
void run_attention_backward_here(view<const T> q, view<const T> k, view<const T> v, view<const T> out,
                                 view<const T> dout, view<T> dq, view<T> dk, view<T> dv, E const& enc,
                                 attention_options<T> const& opt, encoder_gradients_t<E>& grads,
                                 half_masks const& masks16, bool check_lse = true, double* row_sums = nullptr);

/// Validates, rotates q and k when the encoder rotates, runs the path, and
/// rotates dq and dk back (the transposed rotation). `masks16`: additive
/// masks stored in 16 bits, beside opt's float mask (as in the forward pass).
/// `check_lse`: a given opt.lse is checked against the recomputed scores
/// (backward_views::check_lse); std::false_type only for an lse over more
/// keys than k holds (ring attention's blocks). A type, not a value, so that
/// a consumer of posenc::compiled compiles no backward of its own for the
/// checked calls (the library's entries always check). `row_sums`: with
/// check_lse off, where each row's share of the check goes (backward_views::row_sums).
template <class Path, class T, class E, bool CheckLse = true>
void run_attention_backward(view<const T> q, view<const T> k, view<const T> v, view<const T> out,
                            view<const T> dout, view<T> dq, view<T> dk, view<T> dv, E const& enc,
                            attention_options<T> const& opt, encoder_gradients_t<E>& grads,
                            half_masks const& masks16 = {}, std::bool_constant<CheckLse> = {},
                            double* row_sums = nullptr) {
#if POSENC_COMPILED
  // posenc::compiled holds the whole fused backward call of its list (compiled/list.hpp):
  // validation, rotations and kernel.
  if constexpr (CheckLse && std::is_same_v<typename backward_path<Path, E>::type, path::fused> &&
                compiled_kernels::has_backward<T, E>) {
    compiled_kernels::check_once();
    compiled_kernels::entry::attention_backward_call(q, k, v, out, dout, dq, dk, dv, enc, opt, grads, masks16);
  } else
#endif
  {
    run_attention_backward_here<Path>(q, k, v, out, dout, dq, dk, dv, enc, opt, grads, masks16, CheckLse,
                                      CheckLse ? nullptr : row_sums);
  }
}

/// The backward pass of a call whose batch entries cut their segment
/// memories differently (key_lengths): each entry runs alone (batch 1, its
/// own cut) into scratch gradients. A given lse is checked row by row once
/// every entry has run (naming the call's batch entry), and only then are
/// dq, dk, dv and grads written: an error leaves them untouched.
template <class Path, class T, class E>
void memory_cut_entries(view<const T> q, view<const T> k, view<const T> v, view<const T> out, view<const T> dout,
                        view<T> dq, view<T> dk, view<T> dv, E const& enc, attention_options<T> const& opt,
                        encoder_gradients_t<E>& grads, half_masks const& masks16, bool check_lse, double* row_sums) {
  index_t const B = q.batch, Sq = q.seq, Sk = k.seq, Hq = q.heads;
  aligned_buffer<T> bq = aligned_buffer<T>::uninitialized(dq.size()), bk = aligned_buffer<T>::uninitialized(dk.size()),
                    bv = aligned_buffer<T>::uninitialized(dv.size());
  view<T> const sq = make_bshd(bq.data(), B, Sq, dq.heads, dq.dim), sk = make_bshd(bk.data(), B, Sk, dk.heads, dk.dim),
                sv = make_bshd(bv.data(), B, Sk, dv.heads, dv.dim);
  encoder_gradients_t<E> g = make_gradients(enc);
  bool const gather = check_lse && opt.lse;  // the rows' sums come back here, checked below
  std::vector<double> sums(gather ? static_cast<std::size_t>(B * Hq * Sq) : 0, 0.0);
  double* const rs = gather ? sums.data() : row_sums;
  for (index_t b = 0; b < B; ++b) {
    attention_options<T> const o = entry_options(opt, b, Hq, Sq, Sk);
    half_masks const m = entry_masks(masks16, b, Sk);
    if (check_lse && !gather)  // no lse given: nothing to check
      run_attention_backward<Path>(entry_of(q, b), entry_of(k, b), entry_of(v, b), entry_of(out, b), entry_of(dout, b),
                                   entry_of(sq, b), entry_of(sk, b), entry_of(sv, b), enc, o, g, m);
    else
      run_attention_backward<Path>(entry_of(q, b), entry_of(k, b), entry_of(v, b), entry_of(out, b), entry_of(dout, b),
                                   entry_of(sq, b), entry_of(sk, b), entry_of(sv, b), enc, o, g, m, std::false_type{},
                                   rs ? rs + b * Hq * Sq : nullptr);
  }
  if (gather) {
    T const* const lse = opt.lse.data();
    for (index_t b = 0; b < B; ++b) {
      index_t const n = Sk - entry_memory_cut(enc, opt, b, Sq, Sk);  // the keys of the entry's cut call
      for (index_t h = 0; h < Hq; ++h)
        for (index_t i = 0; i < Sq; ++i) {
          index_t const r = (b * Hq + h) * Sq + i;
          check_lse_row("posenc::attention_backward", b, h, i, n, lse[r], sums[static_cast<std::size_t>(r)]);
        }
    }
  }
  auto const copy = [](view<const T> from, view<T> to) {
    for (index_t b = 0; b < to.batch; ++b)
      for (index_t s = 0; s < to.seq; ++s)
        for (index_t h = 0; h < to.heads; ++h)
          for (index_t d = 0; d < to.dim; ++d) to.ptr(b, s, h)[d * to.dim_stride] = from.ptr(b, s, h)[d];
  };
  copy(sq, dq);
  copy(sk, dk);
  copy(sv, dv);
  grads += g;
}

/// run_attention_backward's work in this translation unit.
template <class Path, class T, class E>
void run_attention_backward_here(view<const T> q, view<const T> k, view<const T> v, view<const T> out,
                                 view<const T> dout, view<T> dq, view<T> dk, view<T> dv, E const& enc,
                                 attention_options<T> const& opt, encoder_gradients_t<E>& grads,
                                 half_masks const& masks16, bool check_lse, double* row_sums) {
  using P = typename backward_path<Path, E>::type;
  using K = backward_kernel<P>;
  char const* const w = "posenc::attention_backward";
  require(!opt.scores, w, "scores is set, expected null (the backward pass has no scores output)");
  // make_plan validates the forward arguments; out is only read (const_cast for the shared check).
  view<T> const out_checked{const_cast<T*>(out.data), out.batch,        out.seq,        out.heads,      out.dim,
                            out.batch_stride,         out.seq_stride,   out.head_stride, out.dim_stride};
  attention_plan<T> plan = make_plan(q, k, v, out_checked, enc, opt, w);
  require(opt.products == product_precision::float32, w,
          "products is bfloat16, expected float32 (the backward pass computes float products)");
  check_mask(w, "mask (16-bit)", masks16.half, q.batch, q.heads, q.seq, k.seq);
  check_mask(w, "mask (16-bit)", masks16.bfloat16, q.batch, q.heads, q.seq, k.seq);
  validate_backward(w, q, k, v, out, dout, dq, dk, dv, enc, opt, grads, K::needs_lse, masks16);
  set_half_masks(plan, masks16);
  plan.lse = opt.lse.data();  // an input here: the forward pass's log-sum-exp

  if constexpr (has_memory_length<E>::value) {
    // The forward pass cut a memory longer than the encoder's M keys to its
    // last M: the cut keys get no gradient, the rest that of the cut call.
    // Entry b's memory is the keys before its queries among its own
    // (key_lengths[b]); when the entries' cuts differ, see memory_cut_entries.
    index_t const B = q.batch, Sq = q.seq, Sk = k.seq;
    index_t const cut = B > 0 ? entry_memory_cut(enc, opt, 0, Sq, Sk) : 0;
    bool uneven = false;
    for (index_t b = 1; b < B; ++b) uneven = uneven || entry_memory_cut(enc, opt, b, Sq, Sk) != cut;
    if (uneven) {
      memory_cut_entries<Path>(q, k, v, out, dout, dq, dk, dv, enc, opt, grads, masks16, check_lse, row_sums);
      return;
    }
    if (cut > 0) {
      memory_cut<T> const c(q, k, v, opt, cut);
      view<T> dkc = dk, dvc = dv;
      if (dkc.data) dkc.data += cut * dk.seq_stride;  // null only for a view with no element
      dkc.seq -= cut;
      if (dvc.data) dvc.data += cut * dv.seq_stride;
      dvc.seq -= cut;
      half_masks m = masks16;
      memory_cut<T>::cut_mask(m.half, cut);
      memory_cut<T>::cut_mask(m.bfloat16, cut);
      // The cut call may throw (its lse check) before it writes: the cut keys' zeros come after it.
      if (check_lse)
        run_attention_backward<Path>(q, c.k, c.v, out, dout, dq, dkc, dvc, enc, c.opt, grads, m);
      else
        run_attention_backward<Path>(q, c.k, c.v, out, dout, dq, dkc, dvc, enc, c.opt, grads, m, std::false_type{},
                                     row_sums);
      for (index_t b = 0; b < dk.batch; ++b)
        for (index_t j = 0; j < cut; ++j)
          for (index_t h = 0; h < dk.heads; ++h) {
            T* a = dk.ptr(b, j, h);
            T* z = dv.ptr(b, j, h);
            for (index_t d = 0; d < dk.dim; ++d) a[d] = T(0);
            for (index_t d = 0; d < dv.dim; ++d) z[d] = T(0);
          }
      return;
    }
  }

  backward_views<T> io{q, k, v, out, dout, dq, dk, dv};
  io.check_lse = check_lse;  // the path checks a given lse before it writes anything
  io.row_sums = row_sums;    // or leaves the check to its caller (ring attention)
  if constexpr (has_content_bias<E, T>::value) {
    // Transformer-XL's u: the paths see q + u (as the forward pass's), so dq
    // is also the gradient of the shifted query; each row adds it to d(u).
    aligned_buffer<T> qbuf;
    if (plan.batch > 0 && plan.q_len > 0 && plan.q_heads > 0) io.q = content_shifted(q, qbuf, enc);
    K::run(plan, io, enc, grads);
    for (index_t b = 0; b < dq.batch; ++b)
      for (index_t i = 0; i < dq.seq; ++i)
        for (index_t h = 0; h < dq.heads; ++h) enc.content_bias_backward(h, dq.ptr(b, i, h), grads);
    return;
  }
  if constexpr (encoder_traits<E>::rotates_queries_keys) {
    rotation_plan const rot = plan_rotation<false>(plan, enc, opt.keys_rotated);
    if (rot.route == rotation_route::copies && plan.batch > 0 && plan.q_len > 0 && plan.q_heads > 0) {
      // Copies first (any error of the encoder is thrown here, before a write).
      aligned_buffer<T> qbuf, kbuf;
      io.q = rotated_copy(q, qbuf, enc, rot.q_ids.data(), rot.length);
      if (!rot.k_ids.empty()) io.k = rotated_copy(k, kbuf, enc, rot.k_ids.data(), rot.length);
      K::run(plan, io, enc, grads);
      enc.rotate_transpose(dq, position_span::ids(rot.q_ids.data(), plan.batch, plan.q_len), rot.length);
      if (!rot.k_ids.empty())
        enc.rotate_transpose(dk, position_span::ids(rot.k_ids.data(), plan.batch, plan.k_len), rot.length);
      return;
    }
  }
  K::run(plan, io, enc, grads);
}

}  // namespace detail

namespace detail {

/// attention_backward after its compile-time checks (a sentence for each problem).
/// `check_lse`: as in run_attention_backward (std::false_type only for ring attention's blocks).
template <class Path, class T, class E, bool CheckLse = true>
void checked_attention_backward(view<const T> q, view<const T> k, view<const T> v, view<const T> out,
                                view<const T> dout, view<T> dq, view<T> dk, view<T> dv, E const& enc,
                                attention_options<T> const& opt, half_masks const& masks16,
                                encoder_gradients_t<E>& grads, std::bool_constant<CheckLse> check_lse = {},
                                double* row_sums = nullptr) {
  if constexpr (!has_encoder_traits_v<E>) {
    static_assert(dependent_false_v<E>,
                  "posenc::attention_backward: E is not an encoder; specialize posenc::encoder_traits<E> "
                  "(see posenc/encoding/traits.hpp)");
  } else {
    static_assert(!encoder_traits<E>::adds_to_embeddings,
                  "posenc::attention_backward: this encoder adds to embeddings, which the attention kernel "
                  "cannot reach; call its add_to_backward() with the gradient of the embeddings");
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                  "posenc::attention_backward: T must be float or double");
    static_assert(keeps_encoder_contract_v<E, T>,
                  "posenc::attention_backward: the encoder does not keep the encoder contract for the views' "
                  "element type; call posenc::attention with it for the precise message");
    constexpr backward_problem problem = encoder_backward_problem<E, T>();
    static_assert(problem != backward_problem::rotate_transpose,
                  "posenc::attention_backward: the encoder rotates q and k but has no "
                  "`rotate_transpose(view<T>, position_span, index_t) const`; it is usable forward only");
    static_assert(problem != backward_problem::bias_row_backward,
                  "posenc::attention_backward: the encoder biases scores but has no `bias_row_backward(index_t, "
                  "index_t, index_t, index_t, T const*, gradients&) const`; it is usable forward only");
    static_assert(problem != backward_problem::relative_key_value_backward,
                  "posenc::attention_backward: the encoder adds relative key/value terms but lacks "
                  "`score_row_backward` or `value_row_backward` (see posenc/encoding/traits.hpp); it is usable "
                  "forward only");
    static_assert(problem != backward_problem::content_bias_backward,
                  "posenc::attention_backward: the encoder shifts queries by a content bias but has no "
                  "`content_bias_backward(index_t, T const*, gradients&) const` (see posenc/encoding/traits.hpp); "
                  "it is usable forward only");
    using P = typename backward_path<Path, E>::type;
    static_assert(!std::is_same_v<P, path::best>, "posenc::attention_backward: unreachable");
    static_assert(!(std::is_same_v<P, path::fused> && fused_backward_excluded<E>::value),
                  "posenc::attention_backward: the fused path has no backward for an encoder with a content "
                  "bias (transformer_xl); use path::reference (path::best picks it for this encoder)");
    if constexpr (!encoder_traits<E>::adds_to_embeddings && keeps_encoder_contract_v<E, T> &&
                  problem == backward_problem::none &&
                  !(std::is_same_v<P, path::fused> && fused_backward_excluded<E>::value)) {
      if constexpr (!backward_kernel<P>::available) {
        static_assert(dependent_false_v<E>,
                      "posenc::attention_backward: this path has no backward pass yet; use path::reference "
                      "(or path::best, which picks the fastest path that has one)");
      } else {
        run_attention_backward<P>(q, k, v, out, dout, dq, dk, dv, enc, opt, grads, masks16, check_lse, row_sums);
      }
    }
  }
}

}  // namespace detail

/// Gradients of posenc::attention (docs/backward.md): given the forward
/// pass's inputs, its output `out` and the gradient `dout` of a loss with
/// respect to out, writes the gradients dq, dk, dv of that loss with respect
/// to q, k, v, and adds the gradients of the encoder's parameters into
/// `grads`. Every option of the forward pass is honoured as it was there (the
/// same `opt`); masked and invisible pairs pass no gradient, and rows with no
/// visible key give zero gradients, never NaN.
///
/// - Rotating encoders (RoPE): q and k are rotated as in the forward pass and
///   dq, dk rotated back by the transposed rotation; with `opt.keys_rotated`,
///   dk is the gradient with respect to the given (rotated) keys.
/// - GQA: dk and dv of a kv head sum the gradients of every query head of its group.
/// - `opt.lse`, when set, is read (not written): the forward pass's
///   log-sum-exp, from which the probabilities are recomputed; when null the
///   path recomputes it (paths with `needs_lse` require it). A given lse is
///   checked against the recomputed scores: every row's sum_j exp(s_ij -
///   lse_i) must be 1 within a factor exp(2^12 eps (sqrt(Sk) + |lse_i|)) (0 where lse_i is
///   -inf), else posenc::error names the row (the lse of a forward pass with
///   other options: causal, scale, mask, encoder or positions), before any
///   output is written. A NaN lse (the forward pass's for a row holding a
///   NaN) gives that row NaN gradients.
/// - A NaN in q, k or v gives NaN gradients wherever it flows (its rows' dq,
///   the dk and dv of the keys those rows see), as it gives NaN output in the
///   forward pass; rows with no visible key give zeros.
/// - `opt.scores` must be null.
/// - Transformer-XL (an encoder with a content bias): its u is added to q as
///   in the forward pass and d(u) gathered from dq; a memory longer than its
///   memory_length() gets zero dk and dv for the cut keys. Reference path
///   only (path::best picks it; path::fused is a compile error).
///
/// @tparam Path path::reference (scalar, double accumulation: the oracle),
///         path::fused (flash-style tiles, SIMD, no Sq x Sk buffer), or
///         path::best (the fastest path with a backward pass: the fused one).
///         path::materialized has none yet (a compile error says so).
/// @param q, k, v, out, opt  as given to (and returned by) posenc::attention
/// @param dout (batch, Sq, Hq, Dv): gradient with respect to out
/// @param dq, dk, dv  written: shapes of q, k, v; no byte shared with any input or each other
/// @param enc  the forward pass's encoder; it needs the backward hooks of
///        posenc/encoding/traits.hpp for the places it acts
/// @param grads  the encoder's parameter gradients, added into (start from
///        posenc::make_gradients(enc)); `no_gradients` for encoders without parameters
/// @throws posenc::error on any bad argument, before anything is written.
template <class Path = path::best, class T, class E>
void attention_backward(view<const detail::identity_t<T>> q, view<const detail::identity_t<T>> k,
                        view<const detail::identity_t<T>> v, view<const detail::identity_t<T>> out,
                        view<const detail::identity_t<T>> dout, view<T> dq, view<detail::identity_t<T>> dk,
                        view<detail::identity_t<T>> dv, E const& enc, attention_options<detail::identity_t<T>> const& opt,
                        encoder_gradients_t<E>& grads) {
  detail::checked_attention_backward<Path, T>(q, k, v, out, dout, dq, dk, dv, enc, opt, {}, grads);
}

/// The gradients above for a forward pass given an additive mask stored in 16
/// bits (`mask_view<M>`, M `Eigen::half` or `Eigen::bfloat16`: the `mask16`
/// of posenc::attention), beside opt.mask and opt.bool_mask with their shape
/// rules. Each element is widened exactly as read: the gradients are those of
/// a float mask holding the widened values, bit for bit; `-inf` pairs pass no
/// gradient. Checked as "mask (16-bit)", before anything is written.
template <class Path = path::best, class T, class E, class M, std::enable_if_t<is_half_storage_v<M>, int> = 0>
void attention_backward(view<const detail::identity_t<T>> q, view<const detail::identity_t<T>> k,
                        view<const detail::identity_t<T>> v, view<const detail::identity_t<T>> out,
                        view<const detail::identity_t<T>> dout, view<T> dq, view<detail::identity_t<T>> dk,
                        view<detail::identity_t<T>> dv, E const& enc, attention_options<detail::identity_t<T>> const& opt,
                        mask_view<M> const& mask16, encoder_gradients_t<E>& grads) {
  detail::checked_attention_backward<Path, T>(q, k, v, out, dout, dq, dk, dv, enc, opt, detail::half_masks_of(mask16),
                                              grads);
}

/// The tensors attention_backward reads, by name: the forward pass's q, k,
/// v and output `out`, and `dout`, the gradient of the loss with respect to
/// out (its shape). Naming them at the call site keeps `out` and `dout`, or
/// k and v, from trading places unnoticed.
template <class T>
struct backward_inputs {
  view<const T> q, k, v, out, dout;
};

/// The gradients attention_backward writes, by name: dq, dk, dv, the shapes
/// of q, k, v. Written, never added into; only the encoder's parameter
/// gradients (`grads`) are added into (docs/backward.md states the rule).
template <class T>
struct backward_outputs {
  view<T> dq, dk, dv;
};

/// attention_backward with its tensors named:
///
///     posenc::backward_inputs<float> in;
///     in.q = q; in.k = k; in.v = v; in.out = out; in.dout = dout;
///     posenc::backward_outputs<float> d;
///     d.dq = dq; d.dk = dk; d.dv = dv;
///     posenc::attention_backward<posenc::path::best>(in, d, enc, opt, grads);
///
/// The same call, checks and results as the positional form above.
template <class Path = path::best, class T, class E>
void attention_backward(backward_inputs<T> const& in, backward_outputs<T> const& d, E const& enc,
                        attention_options<detail::identity_t<T>> const& opt, encoder_gradients_t<E>& grads) {
  detail::checked_attention_backward<Path, T>(in.q, in.k, in.v, in.out, in.dout, d.dq, d.dk, d.dv, enc, opt, {},
                                              grads);
}

/// The named form with the forward pass's 16-bit additive mask (see above).
template <class Path = path::best, class T, class E, class M, std::enable_if_t<is_half_storage_v<M>, int> = 0>
void attention_backward(backward_inputs<T> const& in, backward_outputs<T> const& d, E const& enc,
                        attention_options<detail::identity_t<T>> const& opt, mask_view<M> const& mask16,
                        encoder_gradients_t<E>& grads) {
  detail::checked_attention_backward<Path, T>(in.q, in.k, in.v, in.out, in.dout, d.dq, d.dk, d.dv, enc, opt,
                                              detail::half_masks_of(mask16), grads);
}

}  // namespace posenc
