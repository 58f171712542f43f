// SPDX-License-Identifier: MIT
// Clipped relative bias: a learned scalar per head and clipped key-query distance.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "posenc/core/checked.hpp"
#include "posenc/core/error.hpp"
#include "posenc/core/half.hpp"
#include "posenc/core/span.hpp"
#include "posenc/encoding/bias_kernels.hpp"
#include "posenc/encoding/traits.hpp"

namespace posenc {

/// Clipped scalar relative bias (docs/formulas.md 4.4), the 1-D form of Swin's
/// relative position bias:
/// `bias(h, i, j) = table[clip(p_j - p_i, -K, K) + K, h]` with a table of
/// shape (2K + 1, heads). Row r holds distance key - query = r - K. A
/// Swin-style table (indexed by query - key) maps onto this one by reversing
/// its rows (row r <-> row 2K - r).
///
/// bias_row splits a row of keys into three runs: keys at distance <= -K (one
/// value), the |distance| < K window (a contiguous slice of the head's table
/// column), keys at distance >= K (one value).
///
/// 16-bit tables. clipped_bias<Eigen::half> and clipped_bias<Eigen::bfloat16>
/// store the table in 16 bits and compute in float (`compute_type`): entries
/// are widened exactly as read (the window slice in SIMD loads), so every
/// result is exactly that of a clipped_bias<float> holding the widened table.
/// `rounded_from` rounds a float encoder's table once per entry, to nearest
/// even; the seeded constructor rounds the float encoder's draws the same way.
///
/// Owned or borrowed table. The constructors copy the table (stored
/// transposed, one head's distances contiguous, so the window is one SIMD
/// slice); copies of the encoder share that copy read-only. `view_of` borrows
/// the caller's (2K + 1, heads) row-major buffer instead: no copy, values read
/// when used (the window then strided, one entry per key), so a training loop
/// can update the buffer in place (`table -= lr * grads.table`) and the next
/// call sees the new values. The buffer must outlive the encoder and every
/// copy of it, and must not change while a call that reads it runs.
/// @tparam T float, double, Eigen::half or Eigen::bfloat16 (the table's element type).
template <class T = float>
class clipped_bias {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double> || is_half_storage_v<T>,
                "posenc::clipped_bias: T must be float, double, Eigen::half or Eigen::bfloat16");

 public:
  using value_type = T;
  /// The type of bias rows, values and gradients: T, or float for a 16-bit table.
  using compute_type = std::conditional_t<is_half_storage_v<T>, float, T>;
  using table_type = relative_table<T>;
  /// The gradient of the table (compute_type): a gradient_tensor, the type
  /// of every encoder's gradients (posenc/encoding/traits.hpp).
  using gradient_table = gradient_tensor<compute_type>;

  /// Clip distance `max_distance` (K >= 0) and a learned (2K + 1, heads) table.
  clipped_bias(index_t max_distance, index_t heads, Eigen::Ref<const table_type> const& table)
      : k_(max_distance), heads_(heads) {
    check_params("posenc::clipped_bias");
    detail::rel::check_table_shape<T>("posenc::clipped_bias", "table", table, 2 * k_ + 1, heads_,
                                      "(2 * max_distance + 1, heads)");
    own(detail::rel::transpose_table<T>(table));
  }

  /// A seeded (2K + 1, heads) table: normal(0, stddev) truncated at +-2 stddev
  /// (Swin initialises with a truncated normal of std 0.02).
  clipped_bias(index_t max_distance, index_t heads, std::uint64_t seed, double stddev = 0.02)
      : k_(max_distance), heads_(heads) {
    check_params("posenc::clipped_bias");
    auto t = detail::rel::seeded_normal_table<compute_type>("posenc::clipped_bias", 2 * k_ + 1, heads_, seed, stddev);
    own(detail::rel::transpose_table<T, compute_type>(t));  // a 16-bit table: the float draws rounded once
  }

  /// An encoder reading the caller's `table` in place (no copy): row-major
  /// (2K + 1, heads), the layout and shape the constructor takes. Checked as
  /// the constructor checks its table (shape, finite values), plus a non-null
  /// buffer. The buffer must outlive the encoder and every copy of it; its
  /// values are read when used, so an update in place is seen by the next call
  /// (and by identity()). make_gradients() is (2K + 1, heads) too, so
  /// `table -= lr * grads.table` (elementwise over the buffer) is an optimiser
  /// step on the borrowed table.
  static clipped_bias view_of(index_t max_distance, index_t heads, span<const T> table) {
    constexpr char const* where = "posenc::clipped_bias::view_of";
    clipped_bias c(max_distance, heads, borrowed{});
    c.check_params(where);
    index_t const rows = 2 * max_distance + 1, n = rows * heads;  // fits: check_params
    detail::require(table.size() == n, where, "table.size is ", table.size(), ", expected ", n,
                    " (2 * max_distance + 1 = ", rows, " rows * heads ", heads, ")");
    detail::require(table.data() != nullptr, where, "table.data is null, expected a buffer of ", n, " elements");
    detail::rel::check_buffer_values(where, "table", table.data(), rows, heads);
    c.data_ = table.data();
    c.row_step_ = heads;
    c.head_step_ = 1;
    return c;
  }

  // Copies share an owned table (or borrow the same buffer); there are no
  // move operations, so a moved-from encoder stays usable.
  clipped_bias(clipped_bias const&) = default;
  clipped_bias& operator=(clipped_bias const&) = default;

  /// True when the encoder owns its table (the constructors, rounded_from);
  /// false for `view_of`.
  bool owns_table() const noexcept { return own_ != nullptr; }

  /// A 16-bit encoder holding `f`'s clip distance and its table rounded once
  /// per entry to nearest even.
  template <class U = T, std::enable_if_t<is_half_storage_v<U>, int> = 0>
  static clipped_bias rounded_from(clipped_bias<float> const& f) {
    index_t const rows = 2 * f.max_distance() + 1;
    relative_table<float> t(rows, f.heads());
    for (index_t r = 0; r < rows; ++r)
      for (index_t h = 0; h < f.heads(); ++h) t(r, h) = f.weight(r, h);
    return clipped_bias(f.max_distance(), f.heads(), t, rounded{});
  }

  /// K: distances are clipped to [-K, K].
  index_t max_distance() const noexcept { return k_; }
  index_t heads() const noexcept { return heads_; }
  /// Any position works.
  index_t max_positions() const noexcept { return 0; }

  /// Element type, max_distance, heads and a digest of the table, hashed head
  /// by head (heads x (2 * max_distance + 1)) whether owned or borrowed, so
  /// both give one identity for the same values; a borrowed table is hashed as
  /// it is when called.
  encoder_identity identity() const {
    encoder_identity id("clipped_bias");
    id.add("type", detail::element_name<T>()).add("max_distance", k_).add("heads", heads_);
    if (row_step_ == 1) return id.add_table("table", data_, heads_, 2 * k_ + 1, head_step_);
    std::vector<T> const t = detail::rel::gather_transposed(data_, 2 * k_ + 1, heads_, row_step_, head_step_);
    return id.add_table("table", t.data(), heads_, 2 * k_ + 1, 2 * k_ + 1);
  }

  /// Table entry (row, head); row = clipped distance + K (widened for a 16-bit table).
  compute_type weight(index_t row, index_t head) const {
    detail::require(row >= 0 && row <= 2 * k_, "posenc::clipped_bias::weight", "row is ", row, ", expected 0 .. ",
                    2 * k_);
    detail::rel::check_head("posenc::clipped_bias::weight", head, heads_);
    return at(row, head);
  }

  /// table[clip(k_pos - q_pos, -K, K) + K, head].
  compute_type bias(index_t head, index_t q_pos, index_t k_pos) const {
    check_call("posenc::clipped_bias::bias", head, q_pos, k_pos);
    return at(detail::rel::clip_distance(k_pos - q_pos, k_) + k_, head);
  }

  /// Hook: out[j] += bias(head, q_pos, k_pos_first + j), j in [0, count). Unchecked.
  POSENC_ROW_NOINLINE void bias_row(index_t head, index_t q_pos, index_t k_pos_first, index_t count,
                                    compute_type* out) const noexcept {
    POSENC_ASSERT(head >= 0 && head < heads_, "clipped_bias::bias_row: head out of range");
    if (count <= 0) return;
    T const* col = data_ + head * head_step_;  // (2K + 1) entries row_step_ apart: distance -K .. K
    index_t const step = row_step_;             // 1 owned, heads borrowed
    index_t d = k_pos_first - q_pos;
    index_t j = 0;
    if (d <= -k_) {  // keys at distance <= -K: row 0 (for K = 0: every key)
      std::uint64_t const run = detail::rel::run_length(d, -k_ + 1);
      index_t const len = run < static_cast<std::uint64_t>(count) ? static_cast<index_t>(run) : count;
      detail::rel::add_constant(out, len, detail::stored_value<compute_type>(col[0]));
      j = len;
      d += len;
    }
    if (j < count && d < k_) {  // -K < d < K: one row per key
      index_t const len = std::min(count - j, k_ - d);
      if (step == 1) {  // owned: a contiguous slice, SIMD
        detail::rel::add_array(out + j, col + (d + k_), len);
      } else {  // borrowed: one strided entry per key
        T const* w = col + (d + k_) * step;
        compute_type* o = out + j;
        for (index_t t = 0; t < len; ++t) o[t] += detail::stored_value<compute_type>(w[t * step]);
      }
      j += len;
      d += len;
    }
    if (j < count)  // distance >= K
      detail::rel::add_constant(out + j, count - j, detail::stored_value<compute_type>(col[2 * k_ * step]));
  }

  /// The bias is a function of the clipped k_pos - q_pos alone (see posenc/encoding/traits.hpp).
  bool shift_invariant() const noexcept { return true; }

  /// Checked bias_row over `out`; throws posenc::error before writing anything.
  void add_bias(index_t head, index_t q_pos, index_t k_pos_first, span<compute_type> out) const {
    check_call("posenc::clipped_bias::add_bias", head, q_pos, k_pos_first);
    bias_row(head, q_pos, k_pos_first, out.size(), out.data());
  }

  // --- backward (hooks documented in posenc/encoding/traits.hpp) -----------

  /// Gradient of the table: `table(clipped distance + K, head)`, shaped like
  /// the table the constructor takes, (2K + 1, heads).
  struct gradient_tensors {
    gradient_tensor<compute_type> table;
    static constexpr char const* add_where = "posenc::clipped_bias::gradients::operator+=";
    /// f("table", g.table...) (see gradient_set).
    template <class F, class... G>
    static void each(F&& f, G&... g) {
      f("table", g.table...);
    }
  };
  using gradients = gradient_set<gradient_tensors>;
  /// Zeros of shape (2K + 1, heads).
  gradients make_gradients() const { return {gradient_table::Zero(2 * k_ + 1, heads_)}; }
  /// Throws unless g.table is (2K + 1, heads).
  void check_gradients(char const* where, gradients const& g) const {
    detail::require(g.table.rows() == 2 * k_ + 1 && g.table.cols() == heads_, where, "grads.table shape is (",
                    g.table.rows(), ", ", g.table.cols(), "), expected (", 2 * k_ + 1, ", ", heads_,
                    ") (2 * max_distance + 1, heads)");
  }
  /// Hook: g.table(clip(k_pos_first + j - q_pos, -K, K) + K, head) += dbias[j],
  /// j in [0, count), in order of j. Unchecked.
  void bias_row_backward(index_t head, index_t q_pos, index_t k_pos_first, index_t count,
                         compute_type const* dbias, gradients& g) const noexcept {
    POSENC_ASSERT(head >= 0 && head < heads_, "clipped_bias::bias_row_backward: head out of range");
    index_t const d0 = k_pos_first - q_pos;
    for (index_t j = 0; j < count; ++j) g.table(detail::rel::clip_distance(d0 + j, k_) + k_, head) += dbias[j];
  }

 private:
  struct rounded {};
  struct borrowed {};
  // A float table rounded once per entry into the 16-bit T.
  clipped_bias(index_t max_distance, index_t heads, relative_table<float> const& table, rounded)
      : k_(max_distance), heads_(heads) {
    check_params("posenc::clipped_bias::rounded_from");
    own(detail::rel::transpose_table<T, float>(table));
  }
  // No table yet: view_of checks and points it.
  clipped_bias(index_t max_distance, index_t heads, borrowed) : k_(max_distance), heads_(heads) {}

  // Owns `t`, (heads, 2K + 1): one head's distances contiguous.
  void own(std::vector<T>&& t) {
    auto v = std::make_shared<std::vector<T>>(std::move(t));
    data_ = v->data();
    own_ = std::move(v);
    row_step_ = 1;
    head_step_ = 2 * k_ + 1;
  }

  // Entry (row, head), widened.
  compute_type at(index_t row, index_t head) const noexcept {
    return detail::stored_value<compute_type>(data_[row * row_step_ + head * head_step_]);
  }

  void check_params(char const* where) const {
    detail::require(k_ >= 0, where, "max_distance is ", k_, ", expected >= 0");
    detail::require(heads_ >= 1, where, "heads is ", heads_, ", expected >= 1");
    detail::checked_mul(where, detail::rel::clipped_rows(where, k_), heads_, "(2 x max_distance + 1) x heads");
  }

  void check_call(char const* where, index_t head, index_t q_pos, index_t k_pos) const {
    detail::rel::check_head(where, head, heads_);
    detail::rel::check_position(where, "q_pos", q_pos);
    detail::rel::check_position(where, "k_pos", k_pos);
  }

  index_t k_, heads_;
  std::shared_ptr<std::vector<T> const> own_;  // the owned table, (heads, 2K + 1); null when borrowed
  T const* data_ = nullptr;                     // entry (row, h) at data_[row * row_step_ + h * head_step_]
  index_t row_step_ = 1;                        // 1 owned (transposed), heads borrowed (caller's layout)
  index_t head_step_ = 0;                       // 2K + 1 owned, 1 borrowed
};

template <class T>
struct encoder_traits<clipped_bias<T>> {
  static constexpr bool adds_to_embeddings = false, rotates_queries_keys = false;
  static constexpr bool biases_scores = true, relative_key_value = false;
  static constexpr bool is_relative = true;
};

}  // namespace posenc
