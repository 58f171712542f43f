// SPDX-License-Identifier: MIT
// What every backward path shares: the gradient views, their validation, the encoder's backward terms, the dispatcher.
#pragma once

// API (namespace posenc::detail) used by every kernel behind posenc::attention_backward:
//
//   backward_views<T>                     q, k, v, out, dout (read) and dq, dk, dv (written);
//                                         q and k as the kernel sees them (rotated copies
//                                         when the encoder rotates, q + u with a content
//                                         bias; see below)
//   validate_backward(...)                every argument of attention_backward; throws
//                                         posenc::error ("posenc::attention_backward: <arg>
//                                         is <value>, expected <what>") before anything is written
//   encoder_bias_backward, encoder_score_backward, encoder_value_backward
//                                         the encoder's backward hooks over the key runs of
//                                         one query row, as encoder_terms / encoder_values
//                                         call the forward hooks (encoder_score_backward
//                                         takes the head, for per-head tables)
//   backward_kernel<Path>                 dispatcher; the primary template has `available =
//                                         false` and a run() that static_asserts. A path
//                                         specializes it with
//       static constexpr bool available = true;
//       static constexpr bool needs_lse;            // opt.lse must be given
//       template <class T, class E>
//       static void run(attention_plan<T> const&, backward_views<T> const&, E const& enc,
//                       encoder_gradients_t<E>& grads);
//     `run` writes every element of dq, dk and dv (zeros where no gradient flows) as
//     gradients with respect to the q and k it is given (the entry point applies the
//     encoder's rotate_transpose, or content_bias_backward, afterwards), and adds the encoder's parameter gradients
//     into grads (zeroed per-task copies added in task order: the same bits for any
//     thread count). plan.lse, when non-null, holds the forward log-sum-exp (input).
//
// Gradients (docs/backward.md): with P = softmax(s) of the forward pass,
//   dV_j += P_ij dO_i;  dP_ij = dO_i . (V_j + aV(j - i));  dS_ij = P_ij (dP_ij - dO_i . O_i);
//   d(bias)_ij = dS_ij;  d(raw)_ij = dS_ij (1 - tanh^2(raw_ij / c)) under softcap c, else dS_ij;
//   dQ_i += scale sum_j d(raw)_ij (K_j + aK(j - i));  dK_j += scale d(raw)_ij Q_i.
// Masked and invisible pairs have P = 0 and pass no gradient; rows with no visible key give zeros.

#include <cmath>
#include <limits>
#include <type_traits>

#include "posenc/attention/options.hpp"
#include "posenc/attention/plan.hpp"
#include "posenc/core/error.hpp"
#include "posenc/core/overlap.hpp"
#include "posenc/core/view.hpp"
#include "posenc/encoding/traits.hpp"

namespace posenc::detail {

/// The tensors of one backward call, (batch, seq, head, dim) each.
template <class T>
struct backward_views {
  view<const T> q, k, v;  // as the kernel sees them (rotated when the encoder rotates)
  view<const T> out;      // forward output (batch, Sq, Hq, Dv)
  view<const T> dout;     // its gradient, same shape
  view<T> dq, dk, dv;     // written: shapes of q, k, v
  // A given plan.lse is the forward pass's over exactly these keys: the path checks it
  // (check_lse_row) before writing. False only where the caller passes the lse of a longer
  // key sequence on purpose (ring attention's blocks: partial sums).
  bool check_lse = true;
  // With a given lse and check_lse false: when non-null, each row's sum_j exp(s_ij - lse_i) over
  // these keys is added to row_sums[(b * Hq + h) * Sq + i] (0 where the row sees none of them), so
  // that the caller can check the rows once it has every key's share (ring attention's blocks).
  double* row_sums = nullptr;
};

/// The bound on |log sum_j exp(s_ij - lse_i)| for a row of `n` keys whose lse is `lse`:
/// 2^12 eps_T (sqrt(n) + |lse|). The sum is exp(lse' - lse), lse' the exact log-sum-exp of the
/// recomputed scores, so its log is lse' - lse: the rounding of the given lse (eps |lse| / 2,
/// which exceeds 1 for |lse| above 2^24 in float, so the bound is on the log, not on the sum)
/// and of two computations of the scores and of their row sum: each score is off by about eps |s| sqrt(head_dim) (and |s| is near |lse| for
/// the keys that carry the weight), each row sum by about eps sqrt(n). The factor 2^12 covers
/// sqrt(head_dim) up to 2^4 (head_dim 256) with a margin of 2^8 for worst-case rather than typical
/// accumulation. For float it is 4.9e-4 (sqrt(n) + |lse|), e.g. 5.9e-3 for 64 keys and lse 4,
/// while options that differ (causal, scale, mask, encoder, positions) change a row's keys or
/// scores by O(1), and its sum by O(1). A forward pass with bfloat16 products rounds its scores
/// by up to 2^-8 relative, beyond this bound: pass no lse to the backward pass of such a forward.
template <class T>
double lse_check_tolerance(index_t n, double lse) noexcept {
  return 4096.0 * static_cast<double>(std::numeric_limits<T>::epsilon()) *
         (std::sqrt(static_cast<double>(n)) + std::fabs(lse));
}

/// The largest |lse_i| at which the backward pass computes a row's probabilities from the given
/// lse: 2^11 for float, 2^40 for double, where one unit in its last place is 2^-12. A given lse
/// is the forward pass's rounded to T, and exp(s_ij - lse_i) scales the row's probabilities and
/// gradients by exp of its rounding error: beyond this (scores that large come from huge
/// positions under a distance bias) a matched lse could make finite gradients overflow. Such a
/// row takes its own lse from its scores (the max and sum the call without lse forms), and the
/// given one is checked against it: sum_j exp(s_ij - lse_i) = exp(own_i - lse_i).
template <class T>
constexpr double lse_trusted_limit() noexcept {
  return 1.0 / (4096.0 * static_cast<double>(std::numeric_limits<T>::epsilon()));
}

/// True when a given lse value is used as it is (see lse_trusted_limit): not finite, or small enough.
template <class T, class U>
bool lse_trusted(U lse) noexcept {
  double const x = static_cast<double>(lse);
  return !std::isfinite(x) || std::fabs(x) <= lse_trusted_limit<T>();
}

/// Checks one row of a given lse against the scores the backward pass recomputed:
/// `sum` = sum_j exp(s_ij - lse_i) over the row's visible keys (each masked or invisible key adds
/// 0) must have |log sum| <= lse_check_tolerance (1 to first order), or be 0 when lse_i is -inf
/// (the row sees no key). A NaN
/// sum (a NaN in q, k or the lse of the row) passes: the NaN flows into the gradients as it flowed
/// through the forward pass. Throws posenc::error naming the row; the paths call it before they
/// write any output.
template <class T>
void check_lse_row(char const* w, index_t b, index_t h, index_t i, index_t n, T lse, double sum) {
  if (sum != sum) return;
  char const* const causes =
      "; the lse was computed with other options: causal, scale, mask, encoder or positions differ from the "
      "forward's";
  if (lse == -std::numeric_limits<T>::infinity()) {
    require(sum == 0.0, w, "lse does not match the scores of batch entry ", b, ", head ", h, ", row ", i,
            ": lse is -inf (no visible key) but the row sees keys, sum_j exp(s_ij - lse) is ", static_cast<T>(sum),
            causes);
    return;
  }
  double const tol = lse_check_tolerance<T>(n, static_cast<double>(lse));
  require(sum > 0.0 && std::fabs(std::log(sum)) <= tol, w, "lse does not match the scores of batch entry ", b,
          ", head ", h, ", row ", i, ": sum_j exp(s_ij - lse) is ", static_cast<T>(sum), ", expected 1 within a factor ",
          "exp(", static_cast<T>(tol), ")", causes);
}

/// Requires view `g` (named `name`) to have the extents of `x` (named `x_name`).
template <class G, class X>
void check_same_shape(char const* where, char const* name, view<G> const& g, char const* x_name, view<X> const& x) {
  check_view(where, name, g);
  auto one = [&](char const* dim, index_t got, index_t want) {
    require(got == want, where, name, ".", dim, " is ", got, ", expected ", want, " (", x_name, ".", dim, ")");
  };
  one("batch", g.batch, x.batch);
  one("seq", g.seq, x.seq);
  one("heads", g.heads, x.heads);
  one("dim", g.dim, x.dim);
}

/// Validates the arguments of attention_backward beyond those of the forward
/// pass (make_plan checks those): shapes of dout, dq, dk, dv; no output shares
/// a byte with an input or another output; no scores output; out is not q
/// (the forward pass ran in place, q is gone); the encoder's gradients fit it;
/// the given lse holds finite values, -inf or NaN (not +inf); `needs_lse`: it is given.
/// `masks16`: the 16-bit additive masks, read like opt.mask (never written).
template <class T, class E>
void validate_backward(char const* w, view<const T> q, view<const T> k, view<const T> v, view<const T> out,
                       view<const T> dout, view<T> dq, view<T> dk, view<T> dv, E const& enc,
                       attention_options<T> const& opt, encoder_gradients_t<E> const& grads, bool needs_lse,
                       half_masks const& masks16 = {}) {
  require(!opt.scores, w, "scores is set, expected null (the backward pass has no scores output)");
  check_same_shape(w, "dout", dout, "out", out);
  check_same_shape(w, "dq", dq, "q", q);
  check_same_shape(w, "dk", dk, "k", k);
  check_same_shape(w, "dv", dv, "v", v);
  require(!(out.data == q.data && out.data != nullptr && !out.empty()), w,
          "out is q (same data), expected the forward output in its own buffer (a forward pass run in place "
          "overwrote q, which the gradients need)");
  check_encoder_gradients(w, enc, grads);
  index_t const rows = q.batch * q.heads * q.seq;  // fits: a partial product of q's checked element count
  require(!needs_lse || opt.lse || rows == 0, w,
          "lse is null, expected the forward pass's log-sum-exp (q.batch x q.heads x q.seq = ", rows,
          " values; this path does not recompute it)");
  check_output_span(w, "lse", opt.lse, rows, "q.batch x q.heads x q.seq");
  if (opt.lse) {
    for (index_t r = 0; r < rows; ++r) {
      T const x = opt.lse.data()[r];
      // NaN is the forward pass's lse of a row holding a NaN: it flows into that row's gradients.
      require(x != std::numeric_limits<T>::infinity(), w, "lse[", r, "] is ", x,
              ", expected a finite value, -inf or NaN (the forward pass's log-sum-exp)");
    }
  }
  // Aliasing: the kernels read q, k, v, out, dout, the masks and lse while they write dq, dk, dv.
  auto mask_bytes = [](auto const& m, std::size_t bytes) {
    index_t const ext[3] = {m.batch, m.heads, m.q}, str[3] = {m.batch_stride, m.head_stride, m.q_stride};
    return make_byte_set(m.data, bytes, 3, ext, str, m.k);
  };
  byte_set const in_sets[9] = {bytes_of(q),   bytes_of(k),
                               bytes_of(v),   bytes_of(out),
                               bytes_of(dout), mask_bytes(opt.mask, sizeof(T)),
                               mask_bytes(opt.bool_mask, sizeof(bool)),
                               bytes_of(static_cast<T const*>(opt.lse.data()), rows),
                               masks16.half.empty() ? mask_bytes(masks16.bfloat16, std::size_t{2})
                                                    : mask_bytes(masks16.half, std::size_t{2})};
  char const* const in_names[9] = {"q", "k", "v", "out", "dout", "mask", "bool_mask", "lse", "mask (16-bit)"};
  byte_set const out_sets[3] = {bytes_of(dq), bytes_of(dk), bytes_of(dv)};
  char const* const out_names[3] = {"dq", "dk", "dv"};
  for (int o = 0; o < 3; ++o) {
    require(!overlaps_itself(out_sets[o]), w, out_names[o], " has elements that overlap each other, expected a ",
            "layout whose rows do not overlap");
    for (int i = 0; i < 9; ++i) {
      require(!overlaps(out_sets[o], in_sets[i]), w, out_names[o], " is at bytes ", byte_range(out_sets[o]),
              " and overlaps ", in_names[i], " at ", byte_range(in_sets[i]), ", expected no shared memory");
    }
    for (int o2 = 0; o2 < o; ++o2) {
      require(!overlaps(out_sets[o], out_sets[o2]), w, out_names[o], " is at bytes ", byte_range(out_sets[o]),
              " and overlaps ", out_names[o2], " at ", byte_range(out_sets[o2]), ", expected no shared memory");
    }
  }
}

/// The encoder's bias_row_backward for keys j0 .. j0 + n - 1 of (b, h, i),
/// given d(bias) of each key in dbias[n]. Rows at a negative position (no
/// visible key) add nothing.
template <class T, class E>
void encoder_bias_backward(attention_plan<T> const& plan, E const& enc, index_t b, index_t h, index_t i, index_t j0,
                           index_t n, T const* dbias, encoder_gradients_t<E>& g) noexcept {
  if constexpr (encoder_traits<E>::biases_scores) {
    index_t const pi = plan.q_position(b, i);
    if (pi < 0) return;
    for_each_key_run(plan, b, j0, n, [&](index_t kp, index_t t0, index_t len) {
      enc.bias_row_backward(h, pi, kp, len, dbias + t0, g);
    });
  } else {
    (void)plan, (void)enc, (void)b, (void)h, (void)i, (void)j0, (void)n, (void)dbias, (void)g;
  }
}

/// The encoder's score_row_backward (Shaw's q . aK term, Transformer-XL's
/// position term) for keys j0 .. j0 + n - 1 of (b, h, i): dq_row += its d/dq,
/// g += its parameter part, given d(raw score) in dscore[n]. Encoders whose
/// hook takes the head first (transformer_xl) get h.
template <class T, class E>
void encoder_score_backward(attention_plan<T> const& plan, E const& enc, T const* q_row, index_t b, index_t h,
                            index_t i, index_t j0, index_t n, T const* dscore, T* dq_row,
                            encoder_gradients_t<E>& g) noexcept {
  if constexpr (encoder_traits<E>::relative_key_value) {
    index_t const pi = plan.q_position(b, i);
    if (pi < 0) return;
    T const sc = static_cast<T>(plan.scale);
    for_each_key_run(plan, b, j0, n, [&](index_t kp, index_t t0, index_t len) {
      if constexpr (has_headed_relative_key_value_backward_hooks<E, T>::value)
        enc.score_row_backward(h, q_row, pi, kp, len, sc, dscore + t0, dq_row, g);
      else
        enc.score_row_backward(q_row, pi, kp, len, sc, dscore + t0, dq_row, g);
    });
  } else {
    (void)plan, (void)enc, (void)q_row, (void)b, (void)h, (void)i, (void)j0, (void)n, (void)dscore, (void)dq_row,
        (void)g;
  }
}

/// encoder_score_backward without the head, for encoders whose hook takes none.
template <class T, class E>
void encoder_score_backward(attention_plan<T> const& plan, E const& enc, T const* q_row, index_t b, index_t i,
                            index_t j0, index_t n, T const* dscore, T* dq_row, encoder_gradients_t<E>& g) noexcept {
  static_assert(!has_headed_relative_key_value_backward_hooks<E, T>::value,
                "posenc::detail::encoder_score_backward: this encoder's hook takes the head; pass it");
  encoder_score_backward(plan, enc, q_row, b, index_t{0}, i, j0, n, dscore, dq_row, g);
}

/// The encoder's value_row_backward (Shaw's aV term) for keys j0 .. j0 + n - 1
/// of (b, i): dp[t] += dout_row . aV(key t), g += p[t] dout_row per row.
template <class T, class E>
void encoder_value_backward(attention_plan<T> const& plan, E const& enc, T const* prob, T const* dout_row, index_t b,
                            index_t i, index_t j0, index_t n, T* dp, encoder_gradients_t<E>& g) noexcept {
  if constexpr (encoder_traits<E>::relative_key_value) {
    index_t const pi = plan.q_position(b, i);
    if (pi < 0 || !enc.has_values()) return;
    for_each_key_run(plan, b, j0, n, [&](index_t kp, index_t t0, index_t len) {
      enc.value_row_backward(prob + t0, dout_row, pi, kp, len, dp + t0, g);
    });
  } else {
    (void)plan, (void)enc, (void)prob, (void)dout_row, (void)b, (void)i, (void)j0, (void)n, (void)dp, (void)g;
  }
}

/// Dispatcher over path tags for the backward pass (see the API at the top).
template <class Path>
struct backward_kernel {
  static constexpr bool available = false;
  static constexpr bool needs_lse = false;
  template <class T, class E>
  static void run(attention_plan<T> const&, backward_views<T> const&, E const&, encoder_gradients_t<E>&) {
    static_assert(dependent_false_v<E>,
                  "posenc::attention_backward: this path has no backward pass yet; use path::reference "
                  "(or path::best, which picks the fastest path that has one)");
  }
};

}  // namespace posenc::detail
