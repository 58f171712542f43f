// SPDX-License-Identifier: MIT
// Row kernels and checks shared by the relative-position encoders (ALiBi, T5, clipped, Shaw).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <type_traits>
#include <vector>

#include "posenc/core/checked.hpp"
#include "posenc/core/eigen.hpp"
#include "posenc/core/error.hpp"
#include "posenc/core/half.hpp"
#include "posenc/core/positions.hpp"
#include "posenc/core/simd.hpp"
#include "posenc/core/span.hpp"

// Keeps a row hook (bias_row, score_row, value_row) out of its caller. Inlined
// next to a caller's fixed-size buffer (a q vector of 8 floats, a 4096-float
// row filled in tiles of 128), GCC 12 warns (-Warray-bounds,
// -Waggressive-loop-optimizations) about SIMD lanes on paths the run-time
// length rules out, which breaks -Werror builds of user code. One call per
// row or tile costs a few cycles against the >= 100 of filling it.
#if defined(__GNUC__) || defined(__clang__)
#define POSENC_ROW_NOINLINE __attribute__((noinline))
#else
#define POSENC_ROW_NOINLINE __attribute__((noinline))
#endif

namespace posenc {

/// A learned table as the reference models store it: rows = relative
/// positions (buckets, clipped distances), columns = heads or head_dim;
/// row-major. Any Eigen matrix or `Eigen::Map` converts to
/// `Eigen::Ref<const relative_table<T>>` (column-major ones are copied).
template <class T>
using relative_table = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

namespace detail::rel {

// The loops below run over n / w full batches, then over a tail of n % w
// lanes indexed from its own start: bounds a compiler can see are < w, so that
// no "iteration ... invokes undefined behavior" or array-bounds warning arises
// when a hook is inlined next to a caller's fixed-size buffer.

/// out[0..n) += v. Runs of keys that share one bias (saturated T5 buckets,
/// clipped distances) come here, so it is a plain SIMD loop.
template <class T>
inline void add_constant(T* out, index_t n, T v) noexcept {
  constexpr index_t w = simd::width<T>;
  auto const vb = simd::broadcast<T>(v);
  index_t const full = n / w;
  for (index_t b = 0; b < full; ++b) simd::store(out + b * w, simd::load(out + b * w) + vb);
  T* tail = out + full * w;
  for (index_t t = 0; t < n % w; ++t) tail[t] += v;
}

/// width<T> values from x as T: a plain load when S is T; a 16-bit S (with
/// float T) widened exactly, so a table stored in 16 bits gives the float
/// table's results bit for bit.
template <class T, class S>
inline auto load_as(S const* x) noexcept {
  if constexpr (std::is_same_v<S, T>) {
    return simd::load(x);
  } else {
    static_assert(std::is_same_v<T, float> && is_half_storage_v<S>,
                  "posenc::detail::rel::load_as: S is T, or a 16-bit type with float T");
    return simd::load_widen<half_format_of_v<S>>(half_bits(x));
  }
}

/// out[0..n) += in[0..n) (in stored as T, or in 16 bits with float T).
template <class T, class S>
inline void add_array(T* out, S const* in, index_t n) noexcept {
  constexpr index_t w = simd::width<T>;
  index_t const full = n / w;
  for (index_t b = 0; b < full; ++b) simd::store(out + b * w, simd::load(out + b * w) + load_as<T>(in + b * w));
  T* tail = out + full * w;
  S const* in_tail = in + full * w;
  for (index_t t = 0; t < n % w; ++t) tail[t] += stored_value<T>(in_tail[t]);
}

/// out[0..n) += a * x[0..n) (x stored as T, or in 16 bits with float T).
template <class T, class S>
inline void add_scaled(T* out, T a, S const* x, index_t n) noexcept {
  constexpr index_t w = simd::width<T>;
  auto const ab = simd::broadcast<T>(a);
  index_t const full = n / w;
  for (index_t b = 0; b < full; ++b)
    simd::store(out + b * w, simd::fma(ab, load_as<T>(x + b * w), simd::load(out + b * w)));
  T* tail = out + full * w;
  S const* x_tail = x + full * w;
  for (index_t t = 0; t < n % w; ++t) tail[t] = simd::fma_scalar(a, stored_value<T>(x_tail[t]), tail[t]);  // as the body
}

/// sum_i a[i] * b[i] (b stored as T, or in 16 bits with float T).
template <class T, class S>
inline T dot(T const* a, S const* b, index_t n) noexcept {
  constexpr index_t w = simd::width<T>;
  index_t const full = n / w;
  T s = T(0);
  if (full > 0) {
    auto acc = simd::broadcast<T>(T(0));
    for (index_t k = 0; k < full; ++k) acc = simd::fma(simd::load(a + k * w), load_as<T>(b + k * w), acc);
    s = simd::reduce_add(acc);
  }
  T const* a_tail = a + full * w;
  S const* b_tail = b + full * w;
  // simd::fma_scalar, rounded as the batches: a contraction left to the compiler may differ
  // between the instantiations for T and for a 16-bit S (they must agree bit for bit).
  for (index_t t = 0; t < n % w; ++t) s = simd::fma_scalar(a_tail[t], stored_value<T>(b_tail[t]), s);
  return s;
}

/// sum_i x[i].
template <class T>
inline T sum(T const* x, index_t n) noexcept {
  constexpr index_t w = simd::width<T>;
  index_t const full = n / w;
  T s = T(0);
  if (full > 0) {
    auto acc = simd::load(x);
    for (index_t k = 1; k < full; ++k) acc = acc + simd::load(x + k * w);
    s = simd::reduce_add(acc);
  }
  T const* tail = x + full * w;
  for (index_t t = 0; t < n % w; ++t) s += tail[t];
  return s;
}

/// Clamps x into [-k, k] (k >= 0) without overflow for any x.
inline index_t clip_distance(index_t x, index_t k) noexcept { return x < -k ? -k : (x > k ? k : x); }

/// Number of keys from delta `d` (inclusive) up to `end` (exclusive), end > d,
/// computed in unsigned arithmetic so that far-apart values cannot overflow.
inline std::uint64_t run_length(index_t d, index_t end) noexcept {
  return static_cast<std::uint64_t>(end) - static_cast<std::uint64_t>(d);
}

/// Throws unless 0 <= `pos` <= position_limit.
inline void check_position(char const* where, char const* name, index_t pos) {
  require(pos >= 0, where, name, " is ", pos, ", expected >= 0");
  require(pos <= position_limit, where, name, " is ", pos, ", expected <= ", position_limit, " (position_limit)");
}

/// Rows of a clipped-distance table, 2 * max_distance + 1, checked for overflow.
inline index_t clipped_rows(char const* where, index_t max_distance) {
  return checked_add(where, checked_mul(where, 2, max_distance, "2 x max_distance"), 1, "2 x max_distance + 1");
}

/// Throws unless 0 <= head < heads.
inline void check_head(char const* where, index_t head, index_t heads) {
  require(head >= 0 && head < heads, where, "head is ", head, ", expected 0 .. ", heads - 1);
}

/// Throws unless the table is rows x cols.
template <class T>
void check_table_shape(char const* where, char const* name, Eigen::Ref<const relative_table<T>> const& t, index_t rows,
                       index_t cols, char const* what) {
  require(t.rows() == rows && t.cols() == cols, where, name, " shape is (", t.rows(), ", ", t.cols(), "), expected (",
          rows, ", ", cols, ") ", what);
  for (index_t r = 0; r < t.rows(); ++r)
    for (index_t c = 0; c < t.cols(); ++c)
      require(std::isfinite(static_cast<double>(t(r, c))), where, name, "(", r, ", ", c, ") is ", t(r, c),
              ", expected a finite number");
}

/// Throws unless every entry of the row-major (rows x cols) buffer `data` is
/// finite (the values check of check_table_shape, for a borrowed table).
template <class T>
void check_buffer_values(char const* where, char const* name, T const* data, index_t rows, index_t cols) {
  for (index_t r = 0; r < rows; ++r)
    for (index_t c = 0; c < cols; ++c) {
      double const x = stored_value<double>(data[r * cols + c]);
      require(std::isfinite(x), where, name, "(", r, ", ", c, ") is ", x, ", expected a finite number");
    }
}

/// The (rows x cols) table with entry (r, c) at data[r * row_step + c * col_step],
/// copied column by column: out[c * rows + r] (the layout transpose_table gives).
template <class T>
std::vector<T> gather_transposed(T const* data, index_t rows, index_t cols, index_t row_step, index_t col_step) {
  std::vector<T> out(static_cast<std::size_t>(rows * cols));
  for (index_t c = 0; c < cols; ++c)
    for (index_t r = 0; r < rows; ++r) out[static_cast<std::size_t>(c * rows + r)] = data[r * row_step + c * col_step];
  return out;
}

/// One table entry of U stored as T: itself when U is T, else a float rounded
/// once to nearest even into the 16-bit T.
template <class T, class U>
inline T table_entry(U x) noexcept {
  if constexpr (std::is_same_v<T, U>)
    return x;
  else
    return to_storage<T>(x);
}

/// Column-major copy of a (rows x cols) table: out[c * rows + r] = t(r, c), so
/// that one head's values over the relative positions are contiguous. A float
/// table U copied into a 16-bit T is rounded once per entry.
template <class T, class U = T>
std::vector<T> transpose_table(Eigen::Ref<const relative_table<U>> const& t) {
  std::vector<T> out(static_cast<std::size_t>(t.rows() * t.cols()));
  for (index_t r = 0; r < t.rows(); ++r)
    for (index_t c = 0; c < t.cols(); ++c) out[static_cast<std::size_t>(c * t.rows() + r)] = table_entry<T>(t(r, c));
  return out;
}

/// Row-major copy of a table (a float U into a 16-bit T: rounded once per entry).
template <class T, class U = T>
std::vector<T> copy_table(Eigen::Ref<const relative_table<U>> const& t) {
  std::vector<T> out(static_cast<std::size_t>(t.rows() * t.cols()));
  for (index_t r = 0; r < t.rows(); ++r)
    for (index_t c = 0; c < t.cols(); ++c) out[static_cast<std::size_t>(r * t.cols() + c)] = table_entry<T>(t(r, c));
  return out;
}

/// A (rows x cols) table of normal(0, stddev) values truncated to +-2 stddev
/// (resampled), from a 64-bit Mersenne Twister seeded with `seed` and the
/// Box-Muller transform: the same numbers on every platform and standard library.
template <class T>
relative_table<T> seeded_normal_table(char const* where, index_t rows, index_t cols, std::uint64_t seed,
                                      double stddev) {
  require(std::isfinite(stddev) && stddev >= 0.0, where, "stddev is ", stddev, ", expected a finite number >= 0");
  checked_mul(where, rows, cols, "table rows x columns");
  relative_table<T> t(rows, cols);
  std::mt19937_64 gen(seed);
  auto uniform = [&gen] {  // (0, 1]: 53 random bits
    return (static_cast<double>(gen() >> 11) + 1.0) * (1.0 / 9007199254740992.0);
  };
  double const two_pi = 6.283185307179586476925286766559;
  for (index_t r = 0; r < rows; ++r) {
    for (index_t c = 0; c < cols; ++c) {
      double z = 0.0;
      do {
        z = std::sqrt(-2.0 * std::log(uniform())) * std::cos(two_pi * uniform());
      } while (std::abs(z) > 2.0);
      t(r, c) = static_cast<T>(z * stddev);
    }
  }
  return t;
}

}  // namespace detail::rel
}  // namespace posenc
