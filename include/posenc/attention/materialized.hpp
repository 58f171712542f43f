// SPDX-License-Identifier: MIT
// path::materialized: per (batch, head) the (Sq x Sk) scores with an Eigen GEMM, then a stable softmax and a GEMM with V.
#pragma once

#include <cmath>
#include <limits>
#include <vector>


#include "posenc/attention/plan.hpp"
#include "posenc/core/eigen.hpp"
#include "posenc/core/simd.hpp"
#include "posenc/core/threading.hpp"

namespace posenc::detail {

template <class T>
using row_major_t = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using const_rows_map = Eigen::Map<const row_major_t<T>, Eigen::Unaligned, Eigen::OuterStride<>>;
template <class T>
using rows_map = Eigen::Map<row_major_t<T>, Eigen::Unaligned, Eigen::OuterStride<>>;

/// The rows (b, 0..n-1, h) of a view as an (n x dim) matrix: a strided Map when
/// rows do not overlap, else a packed copy in `pack`.
template <class T>
const_rows_map<T> rows_of(view<const T> x, index_t b, index_t h, row_major_t<T>& pack) {
  index_t const n = x.seq, d = x.dim;
  if (n <= 1 || x.seq_stride >= d) {
    return const_rows_map<T>(n > 0 ? x.ptr(b, 0, h) : x.data, n, d,
                             Eigen::OuterStride<>(n <= 1 ? d : x.seq_stride));
  }
  pack.resize(n, d);
  for (index_t s = 0; s < n; ++s)
    for (index_t c = 0; c < d; ++c) pack(s, c) = x.ptr(b, s, h)[c];
  return const_rows_map<T>(pack.data(), n, d, Eigen::OuterStride<>(d));
}

/// s[j] = exp(s[j] - m) over a row (m finite; -inf entries give 0), returns the sum.
template <class T>
T exp_shifted_row(T* s, index_t n, T m) noexcept {
  constexpr index_t w_v = simd::width<T>;
  auto const vm = simd::broadcast<T>(m);
  auto vsum = simd::broadcast<T>(T(0));
  index_t j = 0;
  for (; j + w_v <= n; j += w_v) {
    auto const e = simd::exp(simd::load<T>(s + j) - vm);
    simd::store(s + j, e);
    vsum = vsum + e;
  }
  T sum = simd::reduce_add(vsum);
  for (; j < n; ++j) {
    s[j] = s[j] == -std::numeric_limits<T>::infinity() ? T(0) : std::exp(s[j] - m);
    sum += s[j];
  }
  return sum;
}

/// path::materialized body, in T throughout (Eigen GEMMs for q k^T and p v).
template <class T, class E>
void materialized_attention(attention_plan<T> const& p, view<const T> q, view<const T> k,
                            view<const T> v, view<T> out, E const& enc) {
  using traits = encoder_traits<E>;
  index_t const Sq = p.q_len, Sk = p.k_len, Dv = p.value_dim;
  T const scale = static_cast<T>(p.scale);
  T const cap = static_cast<T>(p.softcap);
  T const ninf = -std::numeric_limits<T>::infinity();
  parallel_for(p.batch * p.q_heads, p.threads, [&](index_t bh) {
    index_t const b = bh / p.q_heads, h = bh % p.q_heads, hk = p.kv_head(h);
    row_major_t<T> qpack, kpack, vpack;
    auto const Q = rows_of(q, b, h, qpack);    // (Sq, D)
    auto const K = rows_of(k, b, hk, kpack);   // (Sk, D)
    auto const V = rows_of(v, b, hk, vpack);   // (Sk, Dv)
    row_major_t<T> S(Sq, Sk);                  // scores, then probabilities
    if (p.head_dim > 0 && Sk > 0) {
      S.noalias() = Q * K.transpose();
      S *= scale;
    } else {
      S.setZero();
    }
    std::vector<T> tmp_buf(static_cast<std::size_t>(Sk));
    T* const tmp = tmp_buf.data();
    std::vector<bool> empty_row(static_cast<std::size_t>(Sq), false);
    auto capture = [&](index_t i, T const* row, score_stage stage) {
      if (p.scores && p.stage == stage) {
        T* dst = p.scores_row(b, h, i);
        for (index_t j = 0; j < Sk; ++j) dst[j] = row[j];
      }
    };
    for (index_t i = 0; i < Sq; ++i) {
      T* s = S.row(i).data();
      if constexpr (traits::relative_key_value) {
        encoder_terms<score_term::shaw>(p, enc, q.ptr(b, i, h), b, h, i, 0, Sk, tmp);
        for (index_t j = 0; j < Sk; ++j) s[j] += tmp[j];
      }
      capture(i, s, score_stage::raw);
      if (cap > 0) {
        for (index_t j = 0; j < Sk; ++j) s[j] = cap * std::tanh(s[j] / cap);
      }
      capture(i, s, score_stage::softcapped);
      if constexpr (traits::biases_scores) {
        encoder_terms<score_term::bias>(p, enc, q.ptr(b, i, h), b, h, i, 0, Sk, tmp);
        for (index_t j = 0; j < Sk; ++j) s[j] += tmp[j];
      }
      apply_masks(p, b, h, i, 0, Sk, s);
      capture(i, s, score_stage::biased);
      T m = ninf;
      bool nan_score = false;
      for (index_t j = 0; j < Sk; ++j) {
        nan_score = nan_score || std::isnan(s[j]);
        m = s[j] > m ? s[j] : m;
      }
      if (nan_score) {  // a visible score is NaN: the whole row is NaN (docs/formulas.md 5.4)
        T const nan = std::numeric_limits<T>::quiet_NaN();
        for (index_t j = 0; j < Sk; ++j) s[j] = nan;  // P V gives the NaN row
        p.set_lse(b, h, i, nan);
        capture(i, s, score_stage::probabilities);
        continue;
      }
      if (m == ninf) {  // no visible key: zeros, lse = -inf (docs/formulas.md 5.4)
        for (index_t j = 0; j < Sk; ++j) s[j] = T(0);
        p.set_lse(b, h, i, ninf);
        empty_row[static_cast<std::size_t>(i)] = true;
        capture(i, s, score_stage::probabilities);
        continue;
      }
      T sum = exp_shifted_row(s, Sk, m);
      T const inv = T(1) / sum;
      for (index_t j = 0; j < Sk; ++j) s[j] *= inv;
      p.set_lse(b, h, i, m + std::log(sum));
      capture(i, s, score_stage::probabilities);
    }
    // out rows (b, 0..Sq-1, h) = P V
    bool const direct = Sq <= 1 || out.seq_stride >= Dv;
    row_major_t<T> opack;
    if (!direct) opack.resize(Sq, Dv);
    rows_map<T> O(direct ? (Sq > 0 ? out.ptr(b, 0, h) : out.data) : opack.data(), Sq, Dv,
                  Eigen::OuterStride<>(direct && Sq > 1 ? out.seq_stride : Dv));
    if (Sk > 0 && Dv > 0) {
      // Keys whose value holds NaN or Inf: the GEMM sees them as zero rows,
      // and each is added to the rows that gave it a probability > 0 (a row
      // that cannot see a key must get nothing from it; 0 * NaN would be NaN).
      std::vector<index_t> bad;
      for (index_t j = 0; j < Sk; ++j)
        if (!V.row(j).allFinite()) bad.push_back(j);
      if (bad.empty()) {
        O.noalias() = S * V;
      } else {
        row_major_t<T> V0 = V;
        for (index_t j : bad) V0.row(j).setZero();
        O.noalias() = S * V0;
        for (index_t j : bad)
          for (index_t i = 0; i < Sq; ++i)
            if (S(i, j) != T(0)) O.row(i) += S(i, j) * V.row(j);
      }
    } else {
      O.setZero();
    }
    if constexpr (traits::relative_key_value) {
      for (index_t i = 0; i < Sq; ++i)
        if (!empty_row[static_cast<std::size_t>(i)])
          encoder_values(p, enc, S.row(i).data(), b, i, 0, Sk, O.row(i).data());
    }
    if (!direct) {
      for (index_t i = 0; i < Sq; ++i)
        for (index_t c = 0; c < Dv; ++c) out.ptr(b, i, h)[c] = opack(i, c);
    }
  });
}

/// path::materialized: Eigen GEMMs around a row-wise softmax.
template <>
struct kernel<path::materialized> {
  static constexpr bool available = true;
  static constexpr bool provides_scores = true;
  static constexpr bool rotates_itself = false;
  template <class T, class E>
  static void run(attention_plan<T> const& p, view<const T> q, view<const T> k, view<const T> v,
                  view<T> out, E const& enc) {
    materialized_attention(p, q, k, v, out, enc);
  }
};

}  // namespace posenc::detail
