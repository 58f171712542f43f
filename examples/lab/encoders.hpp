// SPDX-License-Identifier: MIT
// The control encodings of the lab, written as ordinary posenc encoders through encoder_traits.
//
// The comparisons that motivate sinusoidal encodings train the same model with
// stand-ins for a position signal. Each one here is a value type with add_to /
// add_to_backward and an encoder_traits specialization, exactly the contract
// posenc/encoding/traits.hpp lists: no kernel knows about them.
//   integer_position: x[b, s, 0] += scale * pos (an increasing integer in the first column;
//                     the same number in every column would vanish in the model's LayerNorms)
//   zero_position:    x[b, s, :] += 0 (zero vectors: position information absent)
//   noise_position:   x[b, s, :] += table[pos, :], a fixed seeded N(0, stddev) table
#pragma once

#include <posenc/posenc.hpp>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace lab {

namespace detail {
/// Checks (x, pos) as the library's absolute encoders do (throws posenc::error).
template <class T>
void check_absolute(char const* where, posenc::token_view<T> const& x, posenc::position_span pos, posenc::index_t d) {
  posenc::detail::check_view(where, "x", x);
  posenc::detail::require(x.dim == d, where, "x.dim is ", x.dim, ", expected ", d, " (d_model)");
  pos.validate_shape(where, "pos", x.batch, x.seq);
}
}  // namespace detail

/// The increasing-integer control: column 0 of token s gets scale * pos(s). (Added to every
/// column, a per-token constant, it would be removed by the LayerNorm that reads the stream.)
template <class T = float>
class integer_position {
 public:
  /// @param d_model embedding width; @param scale added per unit of position.
  explicit integer_position(posenc::index_t d_model, T scale = T(1)) : d_(d_model), scale_(scale) {
    posenc::detail::require(d_model >= 1, "lab::integer_position", "d_model is ", d_model, ", expected >= 1");
  }
  /// Any position works.
  posenc::index_t max_positions() const noexcept { return 0; }
  /// x[b, s, 0] += scale * pos.at(b, s).
  void add_to(posenc::token_view<T> x, posenc::position_span pos) const {
    detail::check_absolute("lab::integer_position::add_to", x, pos, d_);
    for (posenc::index_t b = 0; b < x.batch; ++b)
      for (posenc::index_t s = 0; s < x.seq; ++s) x(b, s, 0) += scale_ * static_cast<T>(pos.at(b, s));
  }
  /// No parameters: d(x) passes through.
  void add_to_backward(posenc::token_view<const T> dx, posenc::position_span pos, posenc::no_gradients&) const {
    detail::check_absolute("lab::integer_position::add_to_backward", dx, pos, d_);
  }

 private:
  posenc::index_t d_;
  T scale_;
};

/// The zero-vector control: adds nothing; the model sees no position.
template <class T = float>
class zero_position {
 public:
  explicit zero_position(posenc::index_t d_model) : d_(d_model) {
    posenc::detail::require(d_model >= 1, "lab::zero_position", "d_model is ", d_model, ", expected >= 1");
  }
  posenc::index_t max_positions() const noexcept { return 0; }
  /// Checks its arguments, then adds zeros.
  void add_to(posenc::token_view<T> x, posenc::position_span pos) const {
    detail::check_absolute("lab::zero_position::add_to", x, pos, d_);
  }
  void add_to_backward(posenc::token_view<const T> dx, posenc::position_span pos, posenc::no_gradients&) const {
    detail::check_absolute("lab::zero_position::add_to_backward", dx, pos, d_);
  }

 private:
  posenc::index_t d_;
};

/// The noise control: a fixed (not trained) table of N(0, stddev) values, one row per position.
template <class T = float>
class noise_position {
 public:
  /// @param rows positions covered; @param seed the table's generator seed.
  noise_position(posenc::index_t rows, posenc::index_t d_model, std::uint64_t seed, double stddev = 1.0)
      : rows_(rows), d_(d_model), table_(static_cast<std::size_t>(rows * d_model)) {
    posenc::detail::require(rows >= 1, "lab::noise_position", "rows is ", rows, ", expected >= 1");
    posenc::detail::require(d_model >= 1, "lab::noise_position", "d_model is ", d_model, ", expected >= 1");
    std::mt19937_64 gen(seed);
    for (auto& v : table_) v = static_cast<T>(stddev * normal(gen));
  }
  /// Rows of the table: positions 0 .. rows - 1 work.
  posenc::index_t max_positions() const noexcept { return rows_; }
  /// x[b, s, :] += table[pos.at(b, s), :]; throws when a position has no row.
  void add_to(posenc::token_view<T> x, posenc::position_span pos) const {
    check("lab::noise_position::add_to", x, pos);
    for (posenc::index_t b = 0; b < x.batch; ++b)
      for (posenc::index_t s = 0; s < x.seq; ++s)
        for (posenc::index_t c = 0; c < x.dim; ++c) x(b, s, c) += table_[static_cast<std::size_t>(pos.at(b, s) * d_ + c)];
  }
  void add_to_backward(posenc::token_view<const T> dx, posenc::position_span pos, posenc::no_gradients&) const {
    check("lab::noise_position::add_to_backward", dx, pos);
  }

 private:
  template <class V>
  void check(char const* where, V const& x, posenc::position_span pos) const {
    detail::check_absolute(where, x, pos, d_);
    for (posenc::index_t b = 0; b < x.batch; ++b)
      for (posenc::index_t s = 0; s < x.seq; ++s)
        posenc::detail::require(pos.at(b, s) >= 0 && pos.at(b, s) < rows_, where, "position is ", pos.at(b, s),
                                ", expected 0 .. ", rows_ - 1);
  }
  // Box-Muller from 53-bit uniforms: the same numbers with every standard library.
  static double normal(std::mt19937_64& gen) {
    double u1 = (static_cast<double>(gen() >> 11) + 1.0) * 0x1.0p-53, u2 = static_cast<double>(gen() >> 11) * 0x1.0p-53;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
  posenc::index_t rows_, d_;
  std::vector<T> table_;  // (rows, d_model)
};

}  // namespace lab

namespace posenc {
/// The controls act where sinusoidal and learned act: added to the embeddings; none is relative.
template <class T>
struct encoder_traits<lab::integer_position<T>> {
  static constexpr bool adds_to_embeddings = true, rotates_queries_keys = false;
  static constexpr bool biases_scores = false, relative_key_value = false, is_relative = false;
};
template <class T>
struct encoder_traits<lab::zero_position<T>> {
  static constexpr bool adds_to_embeddings = true, rotates_queries_keys = false;
  static constexpr bool biases_scores = false, relative_key_value = false, is_relative = false;
};
template <class T>
struct encoder_traits<lab::noise_position<T>> {
  static constexpr bool adds_to_embeddings = true, rotates_queries_keys = false;
  static constexpr bool biases_scores = false, relative_key_value = false, is_relative = false;
};
}  // namespace posenc
