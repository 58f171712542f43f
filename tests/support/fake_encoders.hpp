// SPDX-License-Identifier: MIT
// Small test encoders, one per hook, written from docs/formulas.md with no library code.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include <posenc/encoding/traits.hpp>

#include "support/random.hpp"

namespace posenc_test {

/// Rotates interleaved pairs (2k, 2k+1) by pos * base^(-2k/dim) (RoPE, GPT-J layout).
struct fake_rotary {
  double base = 10000.0;
  posenc::index_t max_positions() const noexcept { return 0; }
  template <class T>
  void rotate(posenc::view<T> x, posenc::position_span pos, posenc::index_t /*length*/) const {
    for (posenc::index_t b = 0; b < x.batch; ++b)
      for (posenc::index_t s = 0; s < x.seq; ++s)
        for (posenc::index_t h = 0; h < x.heads; ++h) {
          T* r = x.ptr(b, s, h);
          double const p = static_cast<double>(pos.at(b, s));
          for (posenc::index_t t = 0; t + 1 < x.dim; t += 2) {
            double const a = p * std::pow(base, -static_cast<double>(t) / static_cast<double>(x.dim));
            double const c = std::cos(a), sn = std::sin(a);
            double const x0 = r[t], x1 = r[t + 1];
            r[t] = static_cast<T>(c * x0 - sn * x1);
            r[t + 1] = static_cast<T>(sn * x0 + c * x1);
          }
        }
  }
};

/// Adds -slope_h * |p_i - p_j| (symmetric ALiBi form) with slope_h = 2^-(h+1).
struct fake_bias {
  posenc::index_t n_heads = 0;  // 0 = any
  posenc::index_t max_positions() const noexcept { return 0; }
  posenc::index_t heads() const noexcept { return n_heads; }
  template <class T>
  void bias_row(posenc::index_t head, posenc::index_t q_pos, posenc::index_t k_first,
                posenc::index_t count, T* out) const noexcept {
    double const slope = std::pow(2.0, -static_cast<double>(head + 1));
    for (posenc::index_t j = 0; j < count; ++j)
      out[j] += static_cast<T>(-slope * std::abs(static_cast<double>(k_first + j - q_pos)));
  }
};

/// Shaw et al. relative keys/values with clip distance c and random tables.
template <class T>
struct fake_shaw {
  posenc::index_t clip = 3, dim = 8;
  bool values = true;
  std::vector<T> ak, av;  // (2c+1, dim)
  fake_shaw(posenc::index_t c, posenc::index_t d, bool with_values, std::uint64_t seed)
      : clip(c), dim(d), values(with_values),
        ak(random_vector<T>(static_cast<std::size_t>((2 * c + 1) * d), seed)),
        av(random_vector<T>(static_cast<std::size_t>((2 * c + 1) * d), seed + 1)) {}
  posenc::index_t max_positions() const noexcept { return 0; }
  posenc::index_t head_dim() const { return dim; }
  bool has_values() const { return values; }
  posenc::index_t row(posenc::index_t q_pos, posenc::index_t k_pos) const noexcept {
    return std::clamp<posenc::index_t>(k_pos - q_pos, -clip, clip) + clip;
  }
  void score_row(T const* q, posenc::index_t q_pos, posenc::index_t k_first, posenc::index_t count,
                 T scale, T* out) const noexcept {
    for (posenc::index_t j = 0; j < count; ++j) {
      T const* a = ak.data() + row(q_pos, k_first + j) * dim;
      double d = 0;
      for (posenc::index_t t = 0; t < dim; ++t) d += static_cast<double>(q[t]) * a[t];
      out[j] += static_cast<T>(scale * d);
    }
  }
  void value_row(T const* p, posenc::index_t q_pos, posenc::index_t k_first, posenc::index_t count,
                 T* out) const noexcept {
    for (posenc::index_t j = 0; j < count; ++j) {
      T const* a = av.data() + row(q_pos, k_first + j) * dim;
      for (posenc::index_t t = 0; t < dim; ++t) out[t] += p[j] * a[t];
    }
  }
};

/// Adds sin/cos of the position to the embeddings (an absolute encoder).
struct fake_absolute {
  posenc::index_t max_positions() const noexcept { return 0; }
  template <class T>
  void add_to(posenc::token_view<T> x, posenc::position_span pos) const {
    for (posenc::index_t b = 0; b < x.batch; ++b)
      for (posenc::index_t s = 0; s < x.seq; ++s)
        for (posenc::index_t d = 0; d < x.dim; ++d) {
          double const p = static_cast<double>(pos.at(b, s));
          double const w = std::pow(10000.0, -static_cast<double>(d / 2 * 2) / static_cast<double>(x.dim));
          x.ptr(b, s)[d] += static_cast<T>(d % 2 == 0 ? std::sin(p * w) : std::cos(p * w));
        }
  }
};

}  // namespace posenc_test

namespace posenc {
template <>
struct encoder_traits<posenc_test::fake_rotary> {
  static constexpr bool adds_to_embeddings = false, rotates_queries_keys = true;
  static constexpr bool biases_scores = false, relative_key_value = false, is_relative = true;
};
template <>
struct encoder_traits<posenc_test::fake_bias> {
  static constexpr bool adds_to_embeddings = false, rotates_queries_keys = false;
  static constexpr bool biases_scores = true, relative_key_value = false, is_relative = true;
};
template <class T>
struct encoder_traits<posenc_test::fake_shaw<T>> {
  static constexpr bool adds_to_embeddings = false, rotates_queries_keys = false;
  static constexpr bool biases_scores = false, relative_key_value = true, is_relative = true;
};
template <>
struct encoder_traits<posenc_test::fake_absolute> {
  static constexpr bool adds_to_embeddings = true, rotates_queries_keys = false;
  static constexpr bool biases_scores = false, relative_key_value = false, is_relative = false;
};
}  // namespace posenc
