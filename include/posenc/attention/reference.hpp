// SPDX-License-Identifier: MIT
// path::reference: scalar attention with double accumulation, the oracle of every other path.
#pragma once

#include <cmath>
#include <limits>
#include <vector>

#include "posenc/attention/plan.hpp"
#include "posenc/core/half.hpp"
#include "posenc/core/threading.hpp"

namespace posenc::detail {

/// Query row q (D elements) as T: q itself, or widened (exactly) into buf.
template <class T, class Q>
T const* query_row(Q const* q, index_t D, T* buf) noexcept {
  if constexpr (std::is_same_v<Q, T>) {
    (void)D, (void)buf;
    return q;
  } else {
    widen_row(q, D, buf);
    return buf;
  }
}

/// An output element from its accumulated value: a 16-bit O with a double
/// Acc is rounded once to nearest even from the double value (not through
/// float, which would round twice); otherwise as T, then to_output.
template <class O, class T, class Acc>
O accumulated_output(Acc x) noexcept {
  if constexpr (is_half_storage_v<O> && std::is_same_v<Acc, double>) {
    return round_double_to_storage<O>(x);
  } else {
    return to_output<O>(static_cast<T>(x));
  }
}

/// Scalar attention following docs/formulas.md 5.1 step by step. Dot products,
/// softmax and the weighted sum of values accumulate in `Acc` (double for
/// path::reference; float gives the "plain float implementation" the tests
/// use to set their tolerance). Encoder hooks work in T. K and V are stored
/// as KV, q as Q and out as O: T, or a 16-bit type; a 16-bit element is
/// widened (exactly) as it is read, a 16-bit output rounded once from
/// the Acc value.
template <class Acc, class T, class Q, class KV, class O, class E>
void reference_attention(attention_plan<T> const& p, view<const Q> q, view<const KV> k,
                         view<const KV> v, view<O> out, E const& enc) {
  using traits = encoder_traits<E>;
  index_t const Sq = p.q_len, Sk = p.k_len, D = p.head_dim, Dv = p.value_dim;
  Acc const scale = static_cast<Acc>(p.scale);
  Acc const cap = static_cast<Acc>(p.softcap);
  Acc const ninf = -std::numeric_limits<Acc>::infinity();
  parallel_for(p.batch * p.q_heads, p.threads, [&](index_t bh) {
    index_t const b = bh / p.q_heads, h = bh % p.q_heads, hk = p.kv_head(h);
    std::vector<Acc> s_buf(static_cast<std::size_t>(Sk)), acc_buf(static_cast<std::size_t>(Dv));
    std::vector<T> tmp_buf(static_cast<std::size_t>(Sk)), prob_buf(static_cast<std::size_t>(Sk));
    std::vector<T> extra_buf(static_cast<std::size_t>(Dv));
    std::vector<T> q_buf(std::is_same_v<Q, T> ? 0 : static_cast<std::size_t>(D));
    Acc* const s = s_buf.data();
    Acc* const acc = acc_buf.data();
    T* const tmp = tmp_buf.data();
    T* const prob = prob_buf.data();
    T* const extra = extra_buf.data();
    auto capture = [&](index_t i, score_stage stage) {
      if (p.scores && p.stage == stage) {
        T* row = p.scores_row(b, h, i);
        for (index_t j = 0; j < Sk; ++j) row[j] = static_cast<T>(s[j]);
      }
    };
    for (index_t i = 0; i < Sq; ++i) {
      T const* qi = query_row(q.ptr(b, i, h), D, q_buf.data());
      for (index_t j = 0; j < Sk; ++j) {
        KV const* kj = k.ptr(b, j, hk);
        Acc dot = 0;
        for (index_t d = 0; d < D; ++d) dot += static_cast<Acc>(qi[d]) * stored_value<Acc>(kj[d]);
        s[j] = scale * dot;
      }
      if constexpr (traits::relative_key_value) {
        encoder_terms<score_term::shaw>(p, enc, qi, b, h, i, 0, Sk, tmp);
        for (index_t j = 0; j < Sk; ++j) s[j] += static_cast<Acc>(tmp[j]);
      }
      capture(i, score_stage::raw);
      if (cap > 0) {
        for (index_t j = 0; j < Sk; ++j) s[j] = cap * std::tanh(s[j] / cap);
      }
      capture(i, score_stage::softcapped);
      if constexpr (traits::biases_scores) {
        encoder_terms<score_term::bias>(p, enc, qi, b, h, i, 0, Sk, tmp);
        for (index_t j = 0; j < Sk; ++j) s[j] += static_cast<Acc>(tmp[j]);
      }
      apply_masks(p, b, h, i, 0, Sk, s);
      capture(i, score_stage::biased);

      Acc m = ninf;
      bool nan_score = false;
      for (index_t j = 0; j < Sk; ++j) {
        nan_score = nan_score || std::isnan(s[j]);
        m = s[j] > m ? s[j] : m;
      }
      O* oi = out.ptr(b, i, h);
      if (nan_score) {  // a visible score is NaN: the whole row is NaN (docs/formulas.md 5.4)
        T const nan = std::numeric_limits<T>::quiet_NaN();
        for (index_t d = 0; d < Dv; ++d) oi[d] = to_output<O>(nan);
        p.set_lse(b, h, i, nan);
        for (index_t j = 0; j < Sk; ++j) s[j] = std::numeric_limits<Acc>::quiet_NaN();
        capture(i, score_stage::probabilities);
        continue;
      }
      if (m == ninf) {  // no visible key: zeros, lse = -inf (docs/formulas.md 5.4)
        for (index_t d = 0; d < Dv; ++d) oi[d] = to_output<O>(T(0));
        p.set_lse(b, h, i, -std::numeric_limits<T>::infinity());
        for (index_t j = 0; j < Sk; ++j) s[j] = 0;
        capture(i, score_stage::probabilities);
        continue;
      }
      Acc sum = 0;
      for (index_t j = 0; j < Sk; ++j) {
        s[j] = s[j] == ninf ? Acc(0) : std::exp(s[j] - m);
        sum += s[j];
      }
      for (index_t j = 0; j < Sk; ++j) s[j] /= sum;
      for (index_t d = 0; d < Dv; ++d) acc[d] = 0;
      for (index_t j = 0; j < Sk; ++j) {
        if (s[j] == 0) continue;
        KV const* vj = v.ptr(b, j, hk);
        for (index_t d = 0; d < Dv; ++d) acc[d] += s[j] * stored_value<Acc>(vj[d]);
      }
      if constexpr (traits::relative_key_value) {
        for (index_t j = 0; j < Sk; ++j) prob[j] = static_cast<T>(s[j]);
        for (index_t d = 0; d < Dv; ++d) extra[d] = T(0);
        encoder_values(p, enc, prob, b, i, 0, Sk, extra);
        for (index_t d = 0; d < Dv; ++d) acc[d] += static_cast<Acc>(extra[d]);
      }
      for (index_t d = 0; d < Dv; ++d) oi[d] = accumulated_output<O, T>(acc[d]);
      p.set_lse(b, h, i, static_cast<T>(m + std::log(sum)));
      capture(i, score_stage::probabilities);
    }
  });
}

/// path::reference: the double-accumulating oracle.
template <>
struct kernel<path::reference> {
  static constexpr bool available = true;
  static constexpr bool provides_scores = true;
  static constexpr bool rotates_itself = false;
  template <class T, class Q, class KV, class O, class E>
  static void run(attention_plan<T> const& p, view<const Q> q, view<const KV> k, view<const KV> v,
                  view<O> out, E const& enc) {
    reference_attention<double>(p, q, k, v, out, enc);
  }
};

}  // namespace posenc::detail
