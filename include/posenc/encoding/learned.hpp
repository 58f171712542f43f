// SPDX-License-Identifier: MIT
// learned<T>: a trained [rows x d_model] position table (BERT, GPT-2, RoBERTa, BART, OPT), with offsets and extension.
//
// PE[p] = W[p + offset]. The offset is the number of reserved rows before
// position 0: 0 for BERT and GPT-2, 2 for BART, mBART and OPT, padding_idx + 1
// = 2 for RoBERTa (docs/formulas.md 2.1). A row outside [0, rows) is an error;
// `extended` resamples the position rows to more (or fewer) positions by
// linear interpolation along the position axis (docs/formulas.md 2.3).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <initializer_list>
#include <random>
#include <type_traits>
#include <vector>

#include "posenc/core/aligned_buffer.hpp"
#include "posenc/core/checked.hpp"
#include "posenc/core/error.hpp"
#include "posenc/core/half.hpp"
#include "posenc/core/positions.hpp"
#include "posenc/core/span.hpp"
#include "posenc/core/view.hpp"
#include "posenc/encoding/absolute_common.hpp"
#include "posenc/encoding/traits.hpp"

namespace posenc {

namespace detail {

/// Fills n values with N(0, stddev^2) truncated at +-2 stddev (redrawn).
template <class T>
void truncated_normal_fill(T* out, index_t n, std::uint64_t seed, double stddev) {
  std::mt19937_64 gen(seed);
  auto uniform = [&] { return static_cast<double>(gen() >> 11) * 0x1.0p-53; };  // [0, 1)
  constexpr double two_pi = 6.283185307179586476925286766559;
  for (index_t i = 0; i < n;) {
    double const u1 = 1.0 - uniform();  // (0, 1]
    double const u2 = uniform();
    double const r = std::sqrt(-2.0 * std::log(u1));
    for (double z : {r * std::cos(two_pi * u2), r * std::sin(two_pi * u2)}) {
      if (i < n && std::abs(z) <= 2.0) out[i++] = static_cast<T>(z * stddev);
    }
  }
}

/// x[0..d) = x * scale + row for a 16-bit row: the row is widened (exactly)
/// in chunks and added by add_scaled_row, so the result is that of the float
/// row bit for bit.
template <class S>
inline void add_scaled_row_widened(float* x, S const* row, index_t d, float scale) noexcept {
  constexpr index_t chunk = 256;
  alignas(64) float buf[chunk];
  for (index_t i = 0; i < d; i += chunk) {
    index_t const n = std::min(chunk, d - i);
    widen_row<float>(row + i, n, buf);
    add_scaled_row(x + i, buf, n, scale);
  }
}

}  // namespace detail

/// A learned absolute position table. The table is either owned (copied from
/// the caller, seeded, or produced by `extended`; copies of the encoder share
/// it read-only) or borrowed (`view_of`: the caller's buffer must outlive the
/// encoder and every copy of it, and must not change while add_to runs).
///
/// Positions may be negative as long as the row `p + offset` is in the table:
/// OPT marks padding with position -1, which reads row 1 with offset 2.
///
/// Thread safety: every member is const after construction; any number of
/// threads may call add_to / value / fill at once.
///
/// 16-bit tables. learned<Eigen::half> and learned<Eigen::bfloat16> store
/// the table in 16 bits (half the bytes) and compute in float: each entry is
/// widened exactly when read, so add_to, value and fill give exactly what a
/// learned<float> holding the widened table gives. A float table is loaded
/// with `rounded_from` (each entry rounded once to nearest even).
///
/// @tparam T float, double, Eigen::half or Eigen::bfloat16 (the table's element type).
template <class T = float>
class learned {
  static_assert(std::is_floating_point_v<T> || is_half_storage_v<T>,
                "posenc::learned: T must be float, double, Eigen::half or Eigen::bfloat16");

 public:
  using value_type = T;
  /// The type of x, of values and of gradients: T, or float for a 16-bit table.
  using compute_type = std::conditional_t<is_half_storage_v<T>, float, T>;

  /// An encoder owning a copy of `table` (row-major (rows, d_model)).
  static learned copy_of(span<const T> table, index_t rows, index_t d_model, index_t offset = 0) {
    check_table("posenc::learned::copy_of", table, rows, d_model, offset);
    auto buf = std::make_shared<aligned_buffer<T>>(rows * d_model);  // fits: check_table
    std::memcpy(buf->data(), table.data(), static_cast<std::size_t>(rows * d_model) * sizeof(T));
    return learned(std::move(buf), rows, d_model, offset);
  }

  /// A 16-bit encoder owning `table` (row-major (rows, d_model), float)
  /// rounded once per entry to nearest even.
  template <class U = T, std::enable_if_t<is_half_storage_v<U>, int> = 0>
  static learned rounded_from(span<const float> table, index_t rows, index_t d_model, index_t offset = 0) {
    constexpr char const* where = "posenc::learned::rounded_from";
    check_shape(where, rows, d_model, offset);
    index_t const n = rows * d_model;  // fits: check_shape
    detail::require(table.size() == n, where, "table.size is ", table.size(), ", expected ", n, " (rows ", rows,
                    " * d_model ", d_model, ")");
    detail::require(table.data() != nullptr, where, "table.data is null, expected a buffer of ", n, " elements");
    auto buf = std::make_shared<aligned_buffer<T>>(n);
    for (index_t i = 0; i < n; ++i) (*buf)[i] = detail::to_storage<T>(table[i]);
    return learned(std::move(buf), rows, d_model, offset);
  }

  /// An encoder reading the caller's `table` in place (no copy).
  static learned view_of(span<const T> table, index_t rows, index_t d_model, index_t offset = 0) {
    check_table("posenc::learned::view_of", table, rows, d_model, offset);
    return learned(nullptr, table.data(), rows, d_model, offset);
  }

  /// An owning table drawn from a truncated normal: N(0, stddev^2) redrawn
  /// outside +-2 stddev (original TF BERT; the realised std is 0.8796 stddev).
  /// The generator is a 64-bit Mersenne Twister with our own Box-Muller
  /// transform, so a seed gives the same table with every standard library.
  /// If `padding_row >= 0` that row is zero and is the encoder's padding row
  /// (`with_padding_row`: HF RoBERTa's, as `nn.Embedding(padding_idx=...)`).
  static learned random(index_t rows, index_t d_model, std::uint64_t seed, index_t offset = 0,
                        double stddev = 0.02, index_t padding_row = -1) {
    constexpr char const* where = "posenc::learned::random";
    check_shape(where, rows, d_model, offset);
    detail::require(std::isfinite(stddev) && stddev >= 0, where, "stddev is ", stddev, ", expected >= 0 and finite");
    detail::require(padding_row >= -1 && padding_row < rows, where, "padding_row is ", padding_row,
                    ", expected -1 (none) or in [0, ", rows, ") (rows)");
    if constexpr (is_half_storage_v<T>) {
      // The draws of learned<float>::random, each rounded once.
      auto const f = learned<float>::random(rows, d_model, seed, offset, stddev, padding_row);
      return rounded_from(f.table(), rows, d_model, offset).with_padding_row(padding_row);
    } else {
      auto buf = std::make_shared<aligned_buffer<T>>(rows * d_model);  // fits: check_shape
      detail::truncated_normal_fill(buf->data(), rows * d_model, seed, stddev);
      if (padding_row >= 0) std::fill_n(buf->data() + padding_row * d_model, d_model, T(0));
      return learned(std::move(buf), rows, d_model, offset).with_padding_row(padding_row);
    }
  }

  // Copies share the table; there are no move operations, so a moved-from
  // encoder stays usable (a move is a copy of a pointer and three integers).
  learned(learned const&) = default;
  learned& operator=(learned const&) = default;

  /// Rows of the table, reserved rows included.
  index_t rows() const noexcept { return rows_; }
  /// Row width.
  index_t d_model() const noexcept { return d_; }
  /// Row of position 0.
  index_t offset() const noexcept { return offset_; }
  /// True when the encoder owns its table (copy_of, random, extended).
  bool owns_table() const noexcept { return own_ != nullptr; }
  /// The whole table, row-major (rows, d_model).
  span<const T> table() const noexcept { return {data_, rows_ * d_}; }
  /// Largest usable position + 1: rows - offset.
  index_t max_positions() const noexcept { return rows_ - offset_; }

  /// Element type, rows, d_model, offset and a digest of the table, read
  /// when called (a borrowed table is hashed as it is then).
  encoder_identity identity() const {
    encoder_identity id("learned");
    id.add("type", detail::element_name<T>()).add("rows", rows_).add("d_model", d_).add("offset", offset_);
    id.add("padding_row", padding_row_);
    return id.add_table("table", data_, rows_, d_, d_);
  }

  /// The same table with `row` as its padding row (-1: none, the default), as
  /// PyTorch's `nn.Embedding(padding_idx=row)`: the row is read as any other
  /// (a padding token reads it at position row - offset), but add_to_backward
  /// gives it no gradient. HF RoBERTa, XLM-R and CamemBERT have one (row 1);
  /// BART and OPT read their row 1 for padding without one, so it learns.
  learned with_padding_row(index_t row) const {
    detail::require(row >= -1 && row < rows_, "posenc::learned::with_padding_row", "row is ", row,
                    ", expected -1 (none) or in [0, ", rows_, ") (rows)");
    learned r = *this;
    r.padding_row_ = row;
    return r;
  }
  /// The row that gets no gradient (`with_padding_row`), or -1.
  index_t padding_row() const noexcept { return padding_row_; }

  /// The same table read with another offset.
  learned with_offset(index_t offset) const {
    detail::require(offset >= 0 && offset < rows_, "posenc::learned::with_offset", "offset is ", offset,
                    ", expected in [0, ", rows_, ") (rows)");
    learned r = *this;
    r.offset_ = offset;
    return r;
  }

  /// PE[pos, column] = W[pos + offset, column].
  compute_type value(index_t pos, index_t column) const {
    constexpr char const* where = "posenc::learned::value";
    check_row(where, "pos", pos);
    detail::require(column >= 0 && column < d_, where, "column is ", column, ", expected in [0, ", d_,
                    ") (d_model)");
    return detail::stored_value<compute_type>(data_[(pos + offset_) * d_ + column]);
  }

  /// Writes PE[first_pos .. first_pos+count-1] into `out` (row-major (count, d_model)).
  void fill(index_t first_pos, index_t count, span<compute_type> out) const {
    constexpr char const* where = "posenc::learned::fill";
    detail::require(count >= 0, where, "count is ", count, ", expected >= 0");
    index_t const n = detail::checked_mul(where, count, d_, "count x d_model");
    detail::require(out.size() == n, where, "out.size is ", out.size(), ", expected ", n, " (count * d_model)");
    if (count == 0) return;
    check_row(where, "first_pos", first_pos);
    check_row(where, "last position", detail::checked_add(where, first_pos, count - 1, "first_pos + count - 1"));
    if constexpr (is_half_storage_v<T>)
      detail::widen_row<float>(data_ + (first_pos + offset_) * d_, count * d_, out.data());
    else
      std::memcpy(out.data(), data_ + (first_pos + offset_) * d_, static_cast<std::size_t>(count * d_) * sizeof(T));
  }

  /// x[b, s, :] += W[pos(b, s) + offset] for every token of x (batch, seq, d_model).
  /// Checks x and every position first (throws posenc::error, x untouched).
  void add_to(token_view<compute_type> x, position_span pos) const { add_to(x, pos, compute_type(1)); }

  /// x[b, s, :] = x[b, s, :] * x_scale + W[pos(b, s) + offset] (an embedding
  /// scale fused into the add; BART with scale_embedding uses sqrt(d_model)).
  void add_to(token_view<compute_type> x, position_span pos, compute_type x_scale) const {
    constexpr char const* where = "posenc::learned::add_to";
    detail::check_view(where, "x", x);
    detail::check_equal(where, "x.dim", x.dim, d_, "d_model");
    detail::require(std::isfinite(x_scale), where, "x_scale is ", x_scale, ", expected finite");
    pos.validate_shape(where, "positions", x.batch, x.seq);
    for (index_t b = 0; b < x.batch; ++b) {
      for (index_t s = 0; s < x.seq; ++s) {
        index_t const p = pos.at(b, s);
        if (p < -offset_ || p >= rows_ - offset_) {
          detail::fail(where, "position of batch ", b, " token ", s, " is ", p, ", expected in [", -offset_, ", ",
                       rows_ - offset_, ") (table length ", rows_, ", offset ", offset_, ")");
        }
      }
    }
    for (index_t b = 0; b < x.batch; ++b) {
      for (index_t s = 0; s < x.seq; ++s) {
        if constexpr (is_half_storage_v<T>)
          detail::add_scaled_row_widened(x.ptr(b, s), data_ + (pos.at(b, s) + offset_) * d_, d_, x_scale);
        else
          detail::add_scaled_row(x.ptr(b, s), data_ + (pos.at(b, s) + offset_) * d_, d_, x_scale);
      }
    }
  }

  // --- backward (hooks documented in posenc/encoding/traits.hpp) -----------

  /// Gradient of the table, a (rows, d_model) gradient_tensor, row-major like
  /// table() (so `table -= lr * grads.table`, elementwise over the buffer of
  /// view_of, is an optimiser step): reserved rows included (a row read for
  /// padding, as OPT's row 1 at position -1, gets its gradient), except the
  /// padding row (`with_padding_row`), which gets none, as in PyTorch's
  /// nn.Embedding(padding_idx).
  struct gradient_tensors {
    gradient_tensor<compute_type> table;
    static constexpr char const* add_where = "posenc::learned::gradients::operator+=";
    /// f("table", g.table...) (see gradient_set).
    template <class F, class... G>
    static void each(F&& f, G&... g) {
      f("table", g.table...);
    }
  };
  using gradients = gradient_set<gradient_tensors>;
  /// Zeros of shape (rows(), d_model()).
  gradients make_gradients() const { return {gradient_tensor<compute_type>::Zero(rows_, d_)}; }
  /// Throws unless g.table is (rows(), d_model()).
  void check_gradients(char const* where, gradients const& g) const {
    detail::require(g.table.rows() == rows_ && g.table.cols() == d_, where, "grads.table shape is (", g.table.rows(),
                    ", ", g.table.cols(), "), expected (", rows_, ", ", d_, ") (rows, d_model)");
  }

  /// Backward of add_to: g.table[pos(b, s) + offset, :] += dx[b, s, :] for
  /// every token, batch entry by batch entry, token by token (a fixed order:
  /// the same bits every run). The positions are those given to add_to
  /// (offset spans, per-batch offsets, ids from positions_from_mask or
  /// fairseq_positions). d(x) passes through unchanged (times x_scale when
  /// add_to scaled x). Checks dx, g and every position first (throws
  /// posenc::error, g untouched).
  void add_to_backward(token_view<const compute_type> dx, position_span pos, gradients& g) const {
    constexpr char const* where = "posenc::learned::add_to_backward";
    detail::check_view(where, "dx", dx);
    detail::check_equal(where, "dx.dim", dx.dim, d_, "d_model");
    check_gradients(where, g);
    pos.validate_shape(where, "positions", dx.batch, dx.seq);
    for (index_t b = 0; b < dx.batch; ++b) {
      for (index_t s = 0; s < dx.seq; ++s) {
        index_t const p = pos.at(b, s);
        if (p < -offset_ || p >= rows_ - offset_) {
          detail::fail(where, "position of batch ", b, " token ", s, " is ", p, ", expected in [", -offset_, ", ",
                       rows_ - offset_, ") (table length ", rows_, ", offset ", offset_, ")");
        }
      }
    }
    for (index_t b = 0; b < dx.batch; ++b) {
      for (index_t s = 0; s < dx.seq; ++s) {
        index_t const r = pos.at(b, s) + offset_;
        if (r == padding_row_) continue;  // nn.Embedding(padding_idx): no gradient
        detail::add_scaled_row(g.table.data() + r * d_, dx.ptr(b, s), d_, compute_type(1));
      }
    }
  }

  /// A learned encoder (owning, same offset) for `new_positions` positions:
  /// the position rows [offset, rows) are resampled linearly along the
  /// position axis to `new_positions` rows (docs/formulas.md 2.3,
  /// torch.nn.functional.interpolate(mode="linear") of a [1, d, rows - offset]
  /// tensor); the `offset` reserved rows before them (RoBERTa's padding row,
  /// BART's two) are kept as they are, and a padding row among them stays the
  /// padding row (one past them is resampled and is not). The result has offset + new_positions
  /// rows and max_positions() == new_positions. align_corners = true keeps the
  /// first and last position rows; false (PyTorch's default) keeps the first
  /// when growing and clamps the tail to the last. Computed in double, rounded once.
  learned extended(index_t new_positions, bool align_corners = false) const {
    constexpr char const* where = "posenc::learned::extended";
    detail::require(new_positions > 0, where, "new_positions is ", new_positions, ", expected > 0");
    index_t const old_positions = rows_ - offset_;
    index_t const new_rows = detail::checked_add(where, offset_, new_positions, "offset + new_positions");
    auto buf = std::make_shared<aligned_buffer<T>>(
        detail::checked_mul(where, new_rows, d_, "(offset + new_positions) x d_model"));
    if (offset_ > 0) std::memcpy(buf->data(), data_, static_cast<std::size_t>(offset_ * d_) * sizeof(T));
    T const* src = data_ + offset_ * d_;  // (old_positions, d_)
    T* dst = buf->data() + offset_ * d_;  // (new_positions, d_)
    double const L = static_cast<double>(old_positions), Ln = static_cast<double>(new_positions);
    for (index_t t = 0; t < new_positions; ++t) {
      double x;
      if (align_corners) {
        x = new_positions == 1 ? 0.0 : static_cast<double>(t) * (L - 1.0) / (Ln - 1.0);
      } else {
        x = std::max((static_cast<double>(t) + 0.5) * L / Ln - 0.5, 0.0);
      }
      index_t const i0 = std::min(static_cast<index_t>(std::floor(x)), old_positions - 1);
      index_t const i1 = std::min(i0 + 1, old_positions - 1);
      double const a = x - static_cast<double>(i0);
      T const* r0 = src + i0 * d_;
      T const* r1 = src + i1 * d_;
      T* out = dst + t * d_;
      for (index_t c = 0; c < d_; ++c)
        out[c] = to_table((1.0 - a) * detail::stored_value<double>(r0[c]) + a * detail::stored_value<double>(r1[c]));
    }
    // The reserved rows are kept, and with them a padding row among them.
    return learned(std::move(buf), new_rows, d_, offset_).with_padding_row(padding_row_ < offset_ ? padding_row_ : -1);
  }

 private:
  /// A double rounded once to the table's type.
  static T to_table(double x) noexcept {
    if constexpr (is_half_storage_v<T>)
      return detail::round_double_to_storage<T>(x);
    else
      return static_cast<T>(x);
  }

  learned(std::shared_ptr<aligned_buffer<T>> own, index_t rows, index_t d, index_t offset)
      : learned(std::shared_ptr<aligned_buffer<T> const>(own), own->data(), rows, d, offset) {}
  learned(std::shared_ptr<aligned_buffer<T> const> own, T const* data, index_t rows, index_t d, index_t offset)
      : own_(std::move(own)), data_(data), rows_(rows), d_(d), offset_(offset) {}

  static void check_shape(char const* where, index_t rows, index_t d_model, index_t offset) {
    detail::require(d_model > 0, where, "d_model is ", d_model, ", expected > 0");
    detail::require(rows > 0, where, "rows is ", rows, ", expected > 0");
    detail::require(offset >= 0 && offset < rows, where, "offset is ", offset, ", expected in [0, ", rows,
                    ") (rows)");
    detail::checked_mul(where, rows, d_model, "rows x d_model");
  }
  static void check_table(char const* where, span<const T> table, index_t rows, index_t d_model, index_t offset) {
    check_shape(where, rows, d_model, offset);
    index_t const n = rows * d_model;  // fits: check_shape
    detail::require(table.size() == n, where, "table.size is ", table.size(), ", expected ", n, " (rows ", rows,
                    " * d_model ", d_model, ")");
    detail::require(table.data() != nullptr, where, "table.data is null, expected a buffer of ", n, " elements");
  }
  void check_row(char const* where, char const* name, index_t pos) const {
    detail::require(pos >= -offset_ && pos < rows_ - offset_, where, name, " is ", pos, ", expected in [",
                    -offset_, ", ", rows_ - offset_, ") (table length ", rows_, ", offset ", offset_, ")");
  }

  std::shared_ptr<aligned_buffer<T> const> own_;  // null when borrowed
  T const* data_ = nullptr;                         // (rows_, d_), row-major
  index_t rows_ = 0, d_ = 0, offset_ = 0;
  index_t padding_row_ = -1;  // gets no gradient; -1: none
};

template <class T>
struct encoder_traits<learned<T>> {
  static constexpr bool adds_to_embeddings = true, rotates_queries_keys = false;
  static constexpr bool biases_scores = false, relative_key_value = false;
  static constexpr bool is_relative = false;
};

}  // namespace posenc
