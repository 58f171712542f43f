// SPDX-License-Identifier: MIT
// Shaw et al. (2018) relative position representations: learned key and value embeddings.
#pragma once

#include <algorithm>
#include <cmath>
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

/// Which terms a seeded shaw encoder learns.
enum class shaw_terms {
  keys,            ///< aK only: scores gain q_i . aK(j - i)
  keys_and_values  ///< aK and aV: outputs also gain sum_j p_ij aV(j - i)
};

/// Relative key/value embeddings of Shaw, Uszkoreit and Vaswani (2018), as in
/// tensor2tensor's `dot_product_attention_relative` (docs/formulas.md 4.3). With clip
/// distance K >= 1 and tables aK, aV of shape (2K + 1, head_dim), shared by
/// the heads of a layer, and idx(i, j) = clip(p_j - p_i, -K, K) + K:
///
///     e_ij = scale * (q_i . k_j + q_i . aK[idx(i, j)])
///     z_i  = sum_j softmax_j(e_ij) * (v_j + aV[idx(i, j)])
///
/// The encoder provides the two position terms (the attention kernel adds
/// q_i . k_j and p_ij v_j): score_row() for one query vector against a run of
/// keys, value_row() for one row of probabilities. Keys at |distance| >= K
/// share a table row, so a row costs at most 2K + 1 dot products (score_row)
/// or axpys (value_row), whatever the number of keys.
///
/// 16-bit tables. shaw<Eigen::half> and shaw<Eigen::bfloat16> store aK and aV
/// in 16 bits and compute in float (`compute_type`): q, scores, probabilities
/// and outputs are float, and each table row is widened exactly in the SIMD
/// loads of the dot products and axpys, which keep the float encoder's order,
/// so every term is exactly that of a shaw<float> holding the widened tables.
/// `rounded_from` rounds a float encoder's tables once per entry, to nearest
/// even; the seeded constructor rounds the float encoder's draws the same way.
///
/// Owned or borrowed tables. The constructors copy aK and aV; copies of the
/// encoder share those copies read-only. `view_of` borrows the caller's
/// (2K + 1, head_dim) row-major buffers instead: no copy, values read when
/// used, so a training loop can update them in place
/// (`a_k -= lr * grads.key`, `a_v -= lr * grads.value`) and the next call
/// sees the new values. The buffers must outlive the encoder and every copy
/// of it, and must not change while a call that reads them runs.
/// @tparam T float, double, Eigen::half or Eigen::bfloat16 (the tables' element type).
template <class T = float>
class shaw {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double> || is_half_storage_v<T>,
                "posenc::shaw: T must be float, double, Eigen::half or Eigen::bfloat16");

 public:
  using value_type = T;
  /// The type of q, scores, outputs and gradients: T, or float for 16-bit tables.
  using compute_type = std::conditional_t<is_half_storage_v<T>, float, T>;
  using table_type = relative_table<T>;
  /// The gradients of the tables (compute_type): a gradient_tensor, the type
  /// of every encoder's gradients (posenc/encoding/traits.hpp).
  using gradient_table = gradient_tensor<compute_type>;

  /// Key embeddings only: `key_table` of shape (2K + 1, head_dim), row r for distance r - K.
  shaw(index_t max_distance, Eigen::Ref<const table_type> const& key_table) : k_(max_distance) {
    check_k("posenc::shaw");
    head_dim_ = key_table.cols();
    check_tables(key_table, nullptr);
    own_keys(detail::rel::copy_table<T>(key_table));
  }

  /// Key and value embeddings, each (2K + 1, head_dim).
  shaw(index_t max_distance, Eigen::Ref<const table_type> const& key_table,
       Eigen::Ref<const table_type> const& value_table)
      : k_(max_distance) {
    check_k("posenc::shaw");
    head_dim_ = key_table.cols();
    check_tables(key_table, &value_table);
    own_keys(detail::rel::copy_table<T>(key_table));
    own_values(detail::rel::copy_table<T>(value_table));
  }

  /// Seeded tables: normal(0, stddev) truncated at +-2 stddev; aK first, then aV
  /// from the same generator seeded with seed + 1.
  shaw(index_t max_distance, index_t head_dim, shaw_terms terms, std::uint64_t seed, double stddev = 0.02)
      : k_(max_distance), head_dim_(head_dim) {
    check_k("posenc::shaw");
    detail::require(head_dim_ >= 1, "posenc::shaw", "head_dim is ", head_dim_, ", expected >= 1");
    // A 16-bit table: the float draws rounded once.
    own_keys(detail::rel::copy_table<T, compute_type>(
        detail::rel::seeded_normal_table<compute_type>("posenc::shaw", 2 * k_ + 1, head_dim_, seed, stddev)));
    if (terms == shaw_terms::keys_and_values)
      own_values(detail::rel::copy_table<T, compute_type>(
          detail::rel::seeded_normal_table<compute_type>("posenc::shaw", 2 * k_ + 1, head_dim_, seed + 1, stddev)));
  }

  /// Key embeddings only, read from the caller's `key_table` in place (no
  /// copy): row-major (2K + 1, head_dim), the layout and shape the constructor
  /// takes. Checked as the constructor checks its table (shape, finite
  /// values), plus a non-null buffer. The buffer must outlive the encoder and
  /// every copy of it; its values are read when used, so an update in place is
  /// seen by the next call (and by identity()). make_gradients().key is
  /// (2K + 1, head_dim) too, so `key_table -= lr * grads.key` (elementwise over
  /// the buffer) is an optimiser step on the borrowed table.
  static shaw view_of(index_t max_distance, index_t head_dim, span<const T> key_table) {
    shaw s(max_distance, head_dim, rounded{});
    s.check_view(key_table, nullptr);
    s.ak_ = key_table.data();
    return s;
  }

  /// Key and value embeddings, read from the caller's buffers in place (no
  /// copy), each row-major (2K + 1, head_dim); as the keys-only view_of, and
  /// `value_table -= lr * grads.value` updates aV.
  static shaw view_of(index_t max_distance, index_t head_dim, span<const T> key_table, span<const T> value_table) {
    shaw s(max_distance, head_dim, rounded{});
    s.check_view(key_table, &value_table);
    s.ak_ = key_table.data();
    s.av_ = value_table.data();
    return s;
  }

  // Copies share owned tables (or borrow the same buffers); there are no move
  // operations, so a moved-from encoder stays usable.
  shaw(shaw const&) = default;
  shaw& operator=(shaw const&) = default;

  /// True when the encoder owns its tables (the constructors, rounded_from);
  /// false for `view_of`.
  bool owns_tables() const noexcept { return own_k_ != nullptr; }

  /// A 16-bit encoder holding `f`'s clip distance and its tables (aK, and aV
  /// when it has them) rounded once per entry to nearest even.
  template <class U = T, std::enable_if_t<is_half_storage_v<U>, int> = 0>
  static shaw rounded_from(shaw<float> const& f) {
    index_t const rows = 2 * f.max_distance() + 1, d = f.head_dim();
    relative_table<float> ak(rows, d), av(f.has_values() ? rows : 0, f.has_values() ? d : 0);
    for (index_t r = 0; r < rows; ++r)
      for (index_t c = 0; c < d; ++c) {
        ak(r, c) = f.key_weight(r, c);
        if (f.has_values()) av(r, c) = f.value_weight(r, c);
      }
    shaw h(f.max_distance(), d, rounded{});
    h.own_keys(detail::rel::copy_table<T, float>(ak));
    if (f.has_values()) h.own_values(detail::rel::copy_table<T, float>(av));
    return h;
  }

  /// K: distances are clipped to [-K, K].
  index_t max_distance() const noexcept { return k_; }
  /// Width of the embeddings (the attention head_dim).
  index_t head_dim() const noexcept { return head_dim_; }
  /// True when the encoder has value embeddings aV.
  bool has_values() const noexcept { return av_ != nullptr; }
  /// Any position works.
  index_t max_positions() const noexcept { return 0; }

  /// Element type, max_distance, head_dim, the terms and a digest of each
  /// embedding table ((2 * max_distance + 1) x head_dim), owned or borrowed
  /// alike; borrowed tables are hashed as they are when called.
  encoder_identity identity() const {
    encoder_identity id("shaw");
    id.add("type", detail::element_name<T>()).add("max_distance", k_).add("head_dim", head_dim_);
    id.add("terms", has_values() ? "keys_and_values" : "keys");
    id.add_table("key_table", ak_, 2 * k_ + 1, head_dim_, head_dim_);
    if (has_values()) id.add_table("value_table", av_, 2 * k_ + 1, head_dim_, head_dim_);
    return id;
  }

  /// Table row of (q_pos, k_pos): clip(k_pos - q_pos, -K, K) + K.
  index_t row(index_t q_pos, index_t k_pos) const {
    detail::rel::check_position("posenc::shaw::row", "q_pos", q_pos);
    detail::rel::check_position("posenc::shaw::row", "k_pos", k_pos);
    return detail::rel::clip_distance(k_pos - q_pos, k_) + k_;
  }
  /// aK[row, dim] (widened for 16-bit tables).
  compute_type key_weight(index_t r, index_t dim) const {
    check_entry("posenc::shaw::key_weight", r, dim);
    return detail::stored_value<compute_type>(ak_[static_cast<std::size_t>(r * head_dim_ + dim)]);
  }
  /// aV[row, dim]; requires has_values().
  compute_type value_weight(index_t r, index_t dim) const {
    detail::require(has_values(), "posenc::shaw::value_weight",
                    "value table is absent, expected shaw_terms::keys_and_values");
    check_entry("posenc::shaw::value_weight", r, dim);
    return detail::stored_value<compute_type>(av_[static_cast<std::size_t>(r * head_dim_ + dim)]);
  }

  /// Hook: out[j] += scale * (q . aK[clip(k_pos_first + j - q_pos) + K]),
  /// j in [0, count); q has head_dim values. Unchecked.
  POSENC_ROW_NOINLINE void score_row(compute_type const* q, index_t q_pos, index_t k_pos_first, index_t count,
                                     compute_type scale, compute_type* out) const noexcept {
    if (count <= 0) return;
    index_t d = k_pos_first - q_pos;
    index_t j = 0;
    if (d <= -k_) {  // every key at distance <= -K uses row 0
      std::uint64_t const run = detail::rel::run_length(d, -k_ + 1);
      index_t const len = run < static_cast<std::uint64_t>(count) ? static_cast<index_t>(run) : count;
      detail::rel::add_constant(out, len, scale * detail::rel::dot(q, ak_, head_dim_));
      j = len;
      d += len;
    }
    for (; j < count && d < k_; ++j, ++d)  // -K < d < K: one row per key
      out[j] += scale * detail::rel::dot(q, ak_ + (d + k_) * head_dim_, head_dim_);
    if (j < count)  // distance >= K: row 2K
      detail::rel::add_constant(out + j, count - j,
                                scale * detail::rel::dot(q, ak_ + 2 * k_ * head_dim_, head_dim_));
  }

  /// Hook: out[0..head_dim) += sum_j p[j] * aV[clip(k_pos_first + j - q_pos) + K],
  /// j in [0, count). Does nothing without value embeddings. Unchecked.
  POSENC_ROW_NOINLINE void value_row(compute_type const* p, index_t q_pos, index_t k_pos_first, index_t count,
                                     compute_type* out) const noexcept {
    if (count <= 0 || av_ == nullptr) return;
    index_t d = k_pos_first - q_pos;
    index_t j = 0;
    if (d <= -k_) {
      std::uint64_t const run = detail::rel::run_length(d, -k_ + 1);
      index_t const len = run < static_cast<std::uint64_t>(count) ? static_cast<index_t>(run) : count;
      detail::rel::add_scaled(out, detail::rel::sum(p, len), av_, head_dim_);
      j = len;
      d += len;
    }
    for (; j < count && d < k_; ++j, ++d)
      detail::rel::add_scaled(out, p[j], av_ + (d + k_) * head_dim_, head_dim_);
    if (j < count)
      detail::rel::add_scaled(out, detail::rel::sum(p + j, count - j), av_ + 2 * k_ * head_dim_, head_dim_);
  }

  /// Checked score_row: q has head_dim values, out one per key; throws
  /// posenc::error before writing anything.
  void add_scores(span<const compute_type> q, index_t q_pos, index_t k_pos_first, compute_type scale,
                  span<compute_type> out) const {
    char const* where = "posenc::shaw::add_scores";
    detail::require(q.size() == head_dim_, where, "q has ", q.size(), " values, expected ", head_dim_, " (head_dim)");
    detail::require(std::isfinite(static_cast<double>(scale)), where, "scale is ", scale, ", expected a finite number");
    detail::rel::check_position(where, "q_pos", q_pos);
    detail::rel::check_position(where, "k_pos", k_pos_first);
    score_row(q.data(), q_pos, k_pos_first, out.size(), scale, out.data());
  }

  /// Checked value_row: p has one probability per key, out head_dim values;
  /// requires value embeddings; throws posenc::error before writing anything.
  void add_values(span<const compute_type> p, index_t q_pos, index_t k_pos_first, span<compute_type> out) const {
    char const* where = "posenc::shaw::add_values";
    detail::require(has_values(), where, "value table is absent, expected shaw_terms::keys_and_values");
    detail::require(out.size() == head_dim_, where, "out has ", out.size(), " values, expected ", head_dim_,
                    " (head_dim)");
    detail::rel::check_position(where, "q_pos", q_pos);
    detail::rel::check_position(where, "k_pos", k_pos_first);
    value_row(p.data(), q_pos, k_pos_first, p.size(), out.data());
  }

  // --- backward (hooks documented in posenc/encoding/traits.hpp) -----------

  /// Gradients of aK and aV per relative distance, shaped like the tables the
  /// constructor takes: `key` (2K + 1, head_dim); `value` the same, or empty
  /// (0 x 0) when the encoder has no value embeddings.
  struct gradient_tensors {
    gradient_tensor<compute_type> key, value;
    static constexpr char const* add_where = "posenc::shaw::gradients::operator+=";
    /// f("key", ...), then f("value", ...), also when value is empty (see gradient_set).
    template <class F, class... G>
    static void each(F&& f, G&... g) {
      f("key", g.key...);
      f("value", g.value...);
    }
  };
  using gradients = gradient_set<gradient_tensors>;
  /// Zeros of the tables' shapes.
  gradients make_gradients() const {
    index_t const rows = 2 * k_ + 1;
    return {gradient_table::Zero(rows, head_dim_),
            has_values() ? gradient_table::Zero(rows, head_dim_) : gradient_table()};
  }
  /// Throws unless g's tables have the shapes make_gradients() gives.
  void check_gradients(char const* where, gradients const& g) const {
    index_t const rows = 2 * k_ + 1, vr = has_values() ? rows : 0, vc = has_values() ? head_dim_ : 0;
    detail::require(g.key.rows() == rows && g.key.cols() == head_dim_, where, "grads.key shape is (", g.key.rows(),
                    ", ", g.key.cols(), "), expected (", rows, ", ", head_dim_, ") (2 * max_distance + 1, head_dim)");
    detail::require(g.value.rows() == vr && g.value.cols() == vc, where, "grads.value shape is (", g.value.rows(),
                    ", ", g.value.cols(), "), expected (", vr, ", ", vc, ")",
                    has_values() ? " (2 * max_distance + 1, head_dim)" : " (no value embeddings)");
  }

  // The backward hooks use the SIMD helpers of the forward ones (explicit
  // fused multiply-adds in a fixed order): a loop left to the compiler may be
  // contracted differently in the instantiations for a float and a 16-bit
  // table, and 16-bit tables must give the float encoder's gradients bit for bit.

  /// Hook, the transpose of score_row: for j in [0, count), with r the row of
  /// key k_pos_first + j and ds = scale * dscore[j]: dq[0..head_dim) += ds * aK[r]
  /// and g.key.row(r) += ds * q. Unchecked.
  void score_row_backward(compute_type const* q, index_t q_pos, index_t k_pos_first, index_t count,
                          compute_type scale, compute_type const* dscore, compute_type* dq,
                          gradients& g) const noexcept {
    index_t const d0 = k_pos_first - q_pos;
    for (index_t j = 0; j < count; ++j) {
      index_t const r = detail::rel::clip_distance(d0 + j, k_) + k_;
      compute_type const ds = scale * dscore[j];
      detail::rel::add_scaled(dq, ds, ak_ + r * head_dim_, head_dim_);
      detail::rel::add_scaled(g.key.data() + r * head_dim_, ds, q, head_dim_);  // row-major
    }
  }

  /// Hook, the transpose of value_row: for j in [0, count), with r the row of
  /// key k_pos_first + j: dp[j] += dout . aV[r] and g.value.row(r) += p[j] * dout.
  /// Does nothing without value embeddings. Unchecked.
  void value_row_backward(compute_type const* p, compute_type const* dout, index_t q_pos, index_t k_pos_first,
                          index_t count, compute_type* dp, gradients& g) const noexcept {
    if (av_ == nullptr) return;
    index_t const d0 = k_pos_first - q_pos;
    for (index_t j = 0; j < count; ++j) {
      index_t const r = detail::rel::clip_distance(d0 + j, k_) + k_;
      dp[j] += detail::rel::dot(dout, av_ + r * head_dim_, head_dim_);
      detail::rel::add_scaled(g.value.data() + r * head_dim_, p[j], dout, head_dim_);
    }
  }

 private:
  struct rounded {};
  // No tables yet: filled by rounded_from, pointed by view_of.
  shaw(index_t max_distance, index_t head_dim, rounded) : k_(max_distance), head_dim_(head_dim) {}

  void own_keys(std::vector<T>&& t) {
    auto v = std::make_shared<std::vector<T>>(std::move(t));
    ak_ = v->data();
    own_k_ = std::move(v);
  }
  void own_values(std::vector<T>&& t) {
    auto v = std::make_shared<std::vector<T>>(std::move(t));
    av_ = v->data();
    own_v_ = std::move(v);
  }

  // view_of's checks: K, head_dim, then each buffer's size, data and values.
  void check_view(span<const T> const& key_table, span<const T> const* value_table) const {
    constexpr char const* where = "posenc::shaw::view_of";
    check_k(where);
    detail::require(head_dim_ >= 1, where, "head_dim is ", head_dim_, ", expected >= 1");
    index_t const rows = 2 * k_ + 1;
    index_t const n = detail::checked_mul(where, rows, head_dim_, "(2 x max_distance + 1) x head_dim");
    auto const check = [&](char const* name, span<const T> const& t) {
      detail::require(t.size() == n, where, name, ".size is ", t.size(), ", expected ", n,
                      " (2 * max_distance + 1 = ", rows, " rows * head_dim ", head_dim_, ")");
      detail::require(t.data() != nullptr, where, name, ".data is null, expected a buffer of ", n, " elements");
      detail::rel::check_buffer_values(where, name, t.data(), rows, head_dim_);
    };
    check("key_table", key_table);
    if (value_table) check("value_table", *value_table);
  }

  void check_k(char const* where) const {
    detail::require(k_ >= 1, where, "max_distance is ", k_, ", expected >= 1");
    detail::rel::clipped_rows(where, k_);
  }

  void check_tables(Eigen::Ref<const table_type> const& key_table,
                    Eigen::Ref<const table_type> const* value_table) const {
    detail::require(head_dim_ >= 1, "posenc::shaw", "key_table shape is (", key_table.rows(), ", ", key_table.cols(),
                    "), expected (", 2 * k_ + 1, ", head_dim >= 1)");
    detail::rel::check_table_shape<T>("posenc::shaw", "key_table", key_table, 2 * k_ + 1, head_dim_,
                                      "(2 * max_distance + 1, head_dim)");
    if (value_table)
      detail::rel::check_table_shape<T>("posenc::shaw", "value_table", *value_table, 2 * k_ + 1, head_dim_,
                                        "(2 * max_distance + 1, head_dim of key_table)");
  }

  void check_entry(char const* where, index_t r, index_t dim) const {
    detail::require(r >= 0 && r <= 2 * k_, where, "row is ", r, ", expected 0 .. ", 2 * k_);
    detail::require(dim >= 0 && dim < head_dim_, where, "dim is ", dim, ", expected 0 .. ", head_dim_ - 1);
  }

  index_t k_, head_dim_ = 0;
  std::shared_ptr<std::vector<T> const> own_k_, own_v_;  // owned aK and aV; null when borrowed (or absent)
  T const* ak_ = nullptr;                                 // (2K + 1, head_dim), row-major
  T const* av_ = nullptr;                                 // (2K + 1, head_dim), null without value embeddings
};

template <class T>
struct encoder_traits<shaw<T>> {
  static constexpr bool adds_to_embeddings = false, rotates_queries_keys = false;
  static constexpr bool biases_scores = false, relative_key_value = true;
  static constexpr bool is_relative = true;
};

}  // namespace posenc
