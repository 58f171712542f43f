// SPDX-License-Identifier: MIT
// path::reference backward: scalar gradients of attention with double accumulation, the oracle of every other path.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "posenc/attention/backward/plan.hpp"
#include "posenc/attention/plan.hpp"
#include "posenc/core/threading.hpp"

namespace posenc::detail {

/// Scalar attention backward following the formulas at the top of
/// backward/plan.hpp row by row. Scores, probabilities, dP and the sums into
/// dq, dk and dv accumulate in `Acc` (double for path::reference; float gives
/// the "plain float implementation" of the tests' tolerance rule). Encoder
/// hooks work in T. The probabilities come from plan.lse when given, else
/// from the row's own maximum and sum, as the forward pass computes them.
///
/// Tasks are (batch entry, kv head): each owns the dk and dv rows of its kv
/// head and the dq rows of the query heads of its group, and a zeroed copy
/// of the encoder gradients, added into `grads` in task order afterwards. So
/// the result is the same, bit for bit, for every thread count.
///
/// A score that is NaN (a NaN in q or k) makes the row's maximum NaN, so the
/// NaN flows into the row's gradients as into the forward pass's output; only
/// rows with no visible key give zeros. With a given lse (and io.check_lse),
/// each row's sum_j exp(s_ij - lse_i) is checked (check_lse_row) once every
/// task has run and before dq, dk, dv or `grads` is written: the tasks keep
/// their gradients in their own buffers until then.
/// Where a row's Delta = dO . O of dS = P (dP - Delta) comes from.
enum class row_delta {
  keys,    ///< sum_j P_ij dP_ij over the row's keys (the oracle: exact for any set of keys)
  output,  ///< dO_i . O_i from the forward output, as flash-style paths compute it
};

template <class Acc, row_delta Delta = row_delta::keys, class T, class E>
void reference_attention_backward(attention_plan<T> const& p, backward_views<T> const& io, E const& enc,
                                  encoder_gradients_t<E>& grads) {
  using traits = encoder_traits<E>;
  using G = encoder_gradients_t<E>;
  index_t const Sq = p.q_len, Sk = p.k_len, D = p.head_dim, Dv = p.value_dim;
  Acc const scale = static_cast<Acc>(p.scale);
  Acc const cap = static_cast<Acc>(p.softcap);
  Acc const ninf = -std::numeric_limits<Acc>::infinity();
  index_t const tasks = p.batch * p.kv_heads;
  std::vector<G> local(static_cast<std::size_t>(tasks), grads);
  for (G& g : local) g.set_zero();
  bool const check = p.lse != nullptr && io.check_lse;
  bool const gather = p.lse != nullptr && (io.check_lse || io.row_sums != nullptr);  // row sums wanted
  // Per task until the check: its dk, dv rows (Sk x D, Sk x Dv) and dq rows (group x Sq x D).
  std::vector<std::vector<Acc>> dk_task(static_cast<std::size_t>(tasks)), dv_task(static_cast<std::size_t>(tasks));
  std::vector<std::vector<T>> dq_task(static_cast<std::size_t>(tasks));
  std::vector<double> row_sums(gather ? static_cast<std::size_t>(p.batch * p.q_heads * Sq) : 0);

  parallel_for(tasks, p.threads, [&](index_t task) {
    index_t const b = task / p.kv_heads, hk = task % p.kv_heads;
    G& g = local[static_cast<std::size_t>(task)];
    auto const sk = static_cast<std::size_t>(Sk);
    std::vector<Acc> s(sk), th(sk), prob(sk), dp(sk);
    std::vector<Acc>& dk_acc = dk_task[static_cast<std::size_t>(task)];
    std::vector<Acc>& dv_acc = dv_task[static_cast<std::size_t>(task)];
    std::vector<T>& dq_rows = dq_task[static_cast<std::size_t>(task)];
    dk_acc.assign(sk * static_cast<std::size_t>(D), Acc(0));
    dv_acc.assign(sk * static_cast<std::size_t>(Dv), Acc(0));
    std::vector<Acc> dq_acc(static_cast<std::size_t>(D));
    std::vector<T> tmp(sk), prob_t(sk), dp_t(sk), ds_t(sk), dout_t(static_cast<std::size_t>(Dv)),
        dq_t(static_cast<std::size_t>(D));
    index_t const h0 = hk * p.group, h_end = std::min((hk + 1) * p.group, p.q_heads);  // none: dk = dv = 0
    dq_rows.assign(static_cast<std::size_t>(std::max<index_t>(0, h_end - h0) * Sq * D), T(0));
    for (index_t h = h0; h < h_end; ++h) {
      for (index_t i = 0; i < Sq; ++i) {
        T const* qi = io.q.ptr(b, i, h);
        T const* doi = io.dout.ptr(b, i, h);
        T* dqi = dq_rows.data() + ((h - h0) * Sq + i) * D;
        // Scores as the forward pass forms them (raw, softcapped, biased and masked).
        for (index_t j = 0; j < Sk; ++j) {
          T const* kj = io.k.ptr(b, j, hk);
          Acc dot = 0;
          for (index_t d = 0; d < D; ++d) dot += static_cast<Acc>(qi[d]) * static_cast<Acc>(kj[d]);
          s[static_cast<std::size_t>(j)] = scale * dot;
        }
        if constexpr (traits::relative_key_value) {
          encoder_terms<score_term::shaw>(p, enc, qi, b, h, i, 0, Sk, tmp.data());
          for (index_t j = 0; j < Sk; ++j) s[static_cast<std::size_t>(j)] += static_cast<Acc>(tmp[static_cast<std::size_t>(j)]);
        }
        if (cap > 0) {
          for (std::size_t j = 0; j < sk; ++j) {
            th[j] = std::tanh(s[j] / cap);
            s[j] = cap * th[j];
          }
        }
        if constexpr (traits::biases_scores) {
          encoder_terms<score_term::bias>(p, enc, qi, b, h, i, 0, Sk, tmp.data());
          for (index_t j = 0; j < Sk; ++j) s[static_cast<std::size_t>(j)] += static_cast<Acc>(tmp[static_cast<std::size_t>(j)]);
        }
        apply_masks(p, b, h, i, 0, Sk, s.data());

        // Probabilities: from the given log-sum-exp, or max and sum of the row. A NaN score makes
        // m NaN (not skipped as by a plain max): the row then has a NaN lse and NaN gradients.
        Acc m = ninf;
        bool nan_score = false;
        for (std::size_t j = 0; j < sk; ++j) {
          m = s[j] > m ? s[j] : m;
          nan_score = nan_score || s[j] != s[j];
        }
        if (nan_score) m = std::numeric_limits<Acc>::quiet_NaN();
        Acc const given = p.lse ? static_cast<Acc>(p.lse[(b * p.q_heads + h) * Sq + i]) : Acc(0);
        // The row's own lse where no lse is given, or where a given one is too large for its
        // rounding to pin the probabilities (lse_trusted_limit; checked against the own one).
        bool const own_lse = !p.lse || (io.check_lse && !lse_trusted<T>(given));
        Acc lse = ninf;
        if (m != ninf) {
          if (!own_lse) {
            lse = given;
          } else {
            Acc sum = 0;
            for (std::size_t j = 0; j < sk; ++j) sum += s[j] == ninf ? Acc(0) : std::exp(s[j] - m);
            lse = m + std::log(sum);
          }
        }
        if (gather) {  // sum_j exp(s_ij - lse_i) over the visible keys, for check_lse_row
          double row_sum = 0;
          if (own_lse) {  // exp(own_i - lse_i): 0 where the row sees no key, NaN where its scores are
            row_sum = m == ninf ? 0.0 : std::exp(static_cast<double>(lse) - static_cast<double>(given));
          } else {
            Acc sum = 0;
            for (std::size_t j = 0; j < sk; ++j) sum += s[j] == ninf ? Acc(0) : std::exp(s[j] - given);
            row_sum = static_cast<double>(sum);
          }
          row_sums[static_cast<std::size_t>((b * p.q_heads + h) * Sq + i)] = row_sum;
        }
        if (lse == ninf) continue;  // no visible key: no gradient, dq stays 0 (docs/formulas.md 5.4)
        for (std::size_t j = 0; j < sk; ++j) prob[j] = s[j] == ninf ? Acc(0) : std::exp(s[j] - lse);

        // dP = dO . V (+ dO . aV), and the row's dO . O as sum_j P dP.
        for (index_t j = 0; j < Sk; ++j) {
          Acc acc = 0;
          if (prob[static_cast<std::size_t>(j)] != 0) {
            T const* vj = io.v.ptr(b, j, hk);
            for (index_t d = 0; d < Dv; ++d) acc += static_cast<Acc>(doi[d]) * static_cast<Acc>(vj[d]);
          }
          dp[static_cast<std::size_t>(j)] = acc;
        }
        if constexpr (traits::relative_key_value) {
          for (std::size_t j = 0; j < sk; ++j) {
            prob_t[j] = static_cast<T>(prob[j]);
            dp_t[j] = T(0);
          }
          encoder_value_backward(p, enc, prob_t.data(), doi, b, i, 0, Sk, dp_t.data(), g);
          for (std::size_t j = 0; j < sk; ++j) dp[j] += prob[j] != 0 ? static_cast<Acc>(dp_t[j]) : Acc(0);
        }
        Acc row_dot = 0;
        if constexpr (Delta == row_delta::keys) {
          for (std::size_t j = 0; j < sk; ++j) row_dot += prob[j] * dp[j];
        } else {
          T const* oi = io.out.ptr(b, i, h);
          for (index_t d = 0; d < Dv; ++d) row_dot += static_cast<Acc>(doi[d]) * static_cast<Acc>(oi[d]);
        }

        // dS, the encoder's bias gradient, then through the softcap to the raw score.
        for (std::size_t j = 0; j < sk; ++j) {
          Acc ds = prob[j] * (dp[j] - row_dot);
          s[j] = ds;  // s now holds dS
          ds_t[j] = static_cast<T>(ds);
        }
        if constexpr (traits::biases_scores) encoder_bias_backward(p, enc, b, h, i, 0, Sk, ds_t.data(), g);
        if (cap > 0) {
          for (std::size_t j = 0; j < sk; ++j) s[j] *= Acc(1) - th[j] * th[j];
        }

        // dq, dk, dv of the row.
        for (index_t d = 0; d < D; ++d) dq_acc[static_cast<std::size_t>(d)] = 0;
        for (index_t j = 0; j < Sk; ++j) {
          Acc const gj = s[static_cast<std::size_t>(j)], pj = prob[static_cast<std::size_t>(j)];
          if (pj == 0) continue;  // invisible, masked or underflowed: no gradient
          T const* kj = io.k.ptr(b, j, hk);
          Acc* dkj = dk_acc.data() + j * D;
          Acc* dvj = dv_acc.data() + j * Dv;
          for (index_t d = 0; d < D; ++d) {
            dq_acc[static_cast<std::size_t>(d)] += gj * static_cast<Acc>(kj[d]);
            dkj[d] += scale * gj * static_cast<Acc>(qi[d]);
          }
          for (index_t d = 0; d < Dv; ++d) dvj[d] += pj * static_cast<Acc>(doi[d]);
        }
        for (index_t d = 0; d < D; ++d) dq_acc[static_cast<std::size_t>(d)] *= scale;
        if constexpr (traits::relative_key_value) {
          for (std::size_t j = 0; j < sk; ++j) tmp[j] = prob[j] != 0 ? static_cast<T>(s[j]) : T(0);
          for (index_t d = 0; d < D; ++d) dq_t[static_cast<std::size_t>(d)] = T(0);
          encoder_score_backward(p, enc, qi, b, h, i, 0, Sk, tmp.data(), dq_t.data(), g);
          for (index_t d = 0; d < D; ++d) dq_acc[static_cast<std::size_t>(d)] += static_cast<Acc>(dq_t[static_cast<std::size_t>(d)]);
        }
        for (index_t d = 0; d < D; ++d) dqi[d] = static_cast<T>(dq_acc[static_cast<std::size_t>(d)]);
      }
    }
  });
  if (check) {
    for (index_t b = 0; b < p.batch; ++b)
      for (index_t h = 0; h < p.q_heads; ++h)
        for (index_t i = 0; i < Sq; ++i) {
          index_t const r = (b * p.q_heads + h) * Sq + i;
          check_lse_row("posenc::attention_backward", b, h, i, Sk, p.lse[r], row_sums[static_cast<std::size_t>(r)]);
        }
  } else if (gather) {
    for (std::size_t r = 0; r < row_sums.size(); ++r) io.row_sums[r] += row_sums[r];
  }
  parallel_for(tasks, p.threads, [&](index_t task) {
    index_t const b = task / p.kv_heads, hk = task % p.kv_heads;
    index_t const h0 = hk * p.group, h_end = std::min((hk + 1) * p.group, p.q_heads);
    std::vector<Acc> const& dk_acc = dk_task[static_cast<std::size_t>(task)];
    std::vector<Acc> const& dv_acc = dv_task[static_cast<std::size_t>(task)];
    std::vector<T> const& dq_rows = dq_task[static_cast<std::size_t>(task)];
    for (index_t j = 0; j < Sk; ++j) {
      T* dkj = io.dk.ptr(b, j, hk);
      T* dvj = io.dv.ptr(b, j, hk);
      for (index_t d = 0; d < D; ++d) dkj[d] = static_cast<T>(dk_acc[static_cast<std::size_t>(j * D + d)]);
      for (index_t d = 0; d < Dv; ++d) dvj[d] = static_cast<T>(dv_acc[static_cast<std::size_t>(j * Dv + d)]);
    }
    for (index_t h = h0; h < h_end; ++h)
      for (index_t i = 0; i < Sq; ++i) {
        T const* src = dq_rows.data() + ((h - h0) * Sq + i) * D;
        std::copy(src, src + D, io.dq.ptr(b, i, h));
      }
  });
  for (G const& g : local) grads += g;
}

/// path::reference backward: the double-accumulating oracle.
template <>
struct backward_kernel<path::reference> {
  static constexpr bool available = true;
  static constexpr bool needs_lse = false;
  template <class T, class E>
  static void run(attention_plan<T> const& p, backward_views<T> const& io, E const& enc,
                  encoder_gradients_t<E>& grads) {
    reference_attention_backward<double>(p, io, enc, grads);
  }
};

}  // namespace posenc::detail
