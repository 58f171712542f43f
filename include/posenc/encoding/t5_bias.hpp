// SPDX-License-Identifier: MIT
// T5 relative position buckets (Raffel et al. 2020): a learned scalar per (bucket, head).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
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

/// Parameters of t5_bias. Defaults are those of every T5 checkpoint
/// (`relative_attention_num_buckets` 32, `relative_attention_max_distance` 128).
struct t5_bias_params {
  index_t heads = 0;           ///< attention heads (columns of the table), >= 1
  bool bidirectional = true;   ///< true: encoder self-attention; false: decoder (causal)
  index_t num_buckets = 32;    ///< N: even and >= 4 when bidirectional, >= 2 otherwise
  index_t max_distance = 128;  ///< D: must exceed max_exact (N/4 bidirectional, N/2 causal)
};

/// T5 bucketed relative position bias (docs/formulas.md 4.1):
/// `bias(h, i, j) = table[bucket(p_j - p_i), h]`, not scaled (T5 attention uses scale 1).
///
/// bucket(delta), delta = key - query: with N' = N/2 and a +N' offset for
/// delta > 0 (bidirectional) or N' = N and n = max(-delta, 0) (causal), e = N'/2;
/// n < e maps to its own bucket, larger n to
/// `e + trunc(ln(n / e) / ln(D / e) * (N' - e))`, capped at N' - 1. It is
/// evaluated in double, in exactly that order: the boundaries land on exact
/// integers (n = 16, 32, 64 for the defaults) and rewrites that are equal
/// algebraically can round below them.
///
/// Since bucket(delta) is constant over runs of keys, the constructor lists
/// the runs once (at most N of them); bias_row walks the runs and adds each
/// one's value with a SIMD fill, no logarithm per key.
///
/// 16-bit tables. t5_bias<Eigen::half> and t5_bias<Eigen::bfloat16> store the
/// table in 16 bits and compute in float (`compute_type`): each entry is
/// widened exactly when read, so bias_row, bias and weight give exactly what
/// a t5_bias<float> holding the widened table gives, and attention takes the
/// encoder with float (or 16-bit) tensors. `rounded_from` rounds a float
/// encoder's table once per entry, to nearest even; the seeded constructor
/// rounds the float encoder's draws the same way.
///
/// Owned or borrowed table. The constructors copy the table (stored
/// transposed, one head's buckets contiguous); copies of the encoder share
/// that copy read-only. `view_of` borrows the caller's (num_buckets, heads)
/// row-major buffer instead: no copy, values read when used, so a training
/// loop can update the buffer in place (`table -= lr * grads.table`) and the
/// next call sees the new values. The buffer must outlive the encoder and
/// every copy of it, and must not change while a call that reads it runs.
/// @tparam T float, double, Eigen::half or Eigen::bfloat16 (the table's element type).
template <class T = float>
class t5_bias {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double> || is_half_storage_v<T>,
                "posenc::t5_bias: T must be float, double, Eigen::half or Eigen::bfloat16");

 public:
  using value_type = T;
  /// The type of bias rows, values and gradients: T, or float for a 16-bit table.
  using compute_type = std::conditional_t<is_half_storage_v<T>, float, T>;
  using table_type = relative_table<T>;
  /// The gradient of the table (compute_type): a gradient_tensor, the type
  /// of every encoder's gradients (posenc/encoding/traits.hpp).
  using gradient_table = gradient_tensor<compute_type>;
  static_assert(std::is_same_v<gradient_table, relative_table<compute_type>>,
                "posenc: gradient_tensor and relative_table must be one type");

  /// A learned table of shape (num_buckets, heads), as HF's
  /// `relative_attention_bias.weight`.
  t5_bias(t5_bias_params const& p, Eigen::Ref<const table_type> const& table) : p_(p) {
    check_params("posenc::t5_bias");
    detail::rel::check_table_shape<T>("posenc::t5_bias", "table", table, p_.num_buckets, p_.heads,
                                      "(num_buckets, heads)");
    own(detail::rel::transpose_table<T>(table));
    build_runs();
  }

  /// A seeded table: normal(0, stddev) truncated at +-2 stddev (see
  /// detail::rel::seeded_normal_table); T5 itself initialises with stddev d_model^-0.5.
  t5_bias(t5_bias_params const& p, std::uint64_t seed, double stddev = 0.02) : p_(p) {
    check_params("posenc::t5_bias");
    auto t = detail::rel::seeded_normal_table<compute_type>("posenc::t5_bias", p_.num_buckets, p_.heads, seed, stddev);
    own(detail::rel::transpose_table<T, compute_type>(t));  // a 16-bit table: the float draws rounded once
    build_runs();
  }

  /// An encoder reading the caller's `table` in place (no copy): row-major
  /// (num_buckets, heads), the layout and shape the constructor takes (HF's
  /// `relative_attention_bias.weight`). Checked as the constructor checks its
  /// table (shape, finite values), plus a non-null buffer. The buffer must
  /// outlive the encoder and every copy of it; its values are read when used,
  /// so an update in place is seen by the next call (and by identity()).
  /// make_gradients() is (num_buckets, heads) too, so `table -= lr * grads.table`
  /// (elementwise over the buffer) is an optimiser step on the borrowed table.
  static t5_bias view_of(t5_bias_params const& p, span<const T> table) {
    constexpr char const* where = "posenc::t5_bias::view_of";
    t5_bias t(p, borrowed{});
    t.check_params(where);
    index_t const n = p.num_buckets * p.heads;  // fits: check_params
    detail::require(table.size() == n, where, "table.size is ", table.size(), ", expected ", n, " (num_buckets ",
                    p.num_buckets, " * heads ", p.heads, ")");
    detail::require(table.data() != nullptr, where, "table.data is null, expected a buffer of ", n, " elements");
    detail::rel::check_buffer_values(where, "table", table.data(), p.num_buckets, p.heads);
    t.data_ = table.data();
    t.bucket_step_ = p.heads;
    t.head_step_ = 1;
    t.build_runs();
    return t;
  }

  // Copies share an owned table (or borrow the same buffer); there are no
  // move operations, so a moved-from encoder stays usable.
  t5_bias(t5_bias const&) = default;
  t5_bias& operator=(t5_bias const&) = default;

  /// True when the encoder owns its table (the constructors, rounded_from);
  /// false for `view_of`.
  bool owns_table() const noexcept { return own_ != nullptr; }

  /// A 16-bit encoder holding `f`'s parameters and its table rounded once per
  /// entry to nearest even.
  template <class U = T, std::enable_if_t<is_half_storage_v<U>, int> = 0>
  static t5_bias rounded_from(t5_bias<float> const& f) {
    relative_table<float> t(f.num_buckets(), f.heads());
    for (index_t b = 0; b < f.num_buckets(); ++b)
      for (index_t h = 0; h < f.heads(); ++h) t(b, h) = f.weight(b, h);
    return t5_bias(f.params(), t, rounded{});
  }

  t5_bias_params const& params() const noexcept { return p_; }
  index_t heads() const noexcept { return p_.heads; }
  index_t num_buckets() const noexcept { return p_.num_buckets; }
  index_t max_distance() const noexcept { return p_.max_distance; }
  bool bidirectional() const noexcept { return p_.bidirectional; }
  /// Any position works.
  index_t max_positions() const noexcept { return 0; }

  /// Element type, heads, bidirectional, num_buckets, max_distance and a
  /// digest of the table, hashed head by head (heads x num_buckets) whether
  /// owned or borrowed, so both give one identity for the same values; a
  /// borrowed table is hashed as it is when called.
  encoder_identity identity() const {
    encoder_identity id("t5_bias");
    id.add("type", detail::element_name<T>()).add("heads", p_.heads).add("bidirectional", p_.bidirectional);
    id.add("num_buckets", p_.num_buckets).add("max_distance", p_.max_distance);
    if (bucket_step_ == 1) return id.add_table("table", data_, p_.heads, p_.num_buckets, head_step_);
    std::vector<T> const t = detail::rel::gather_transposed(data_, p_.num_buckets, p_.heads, bucket_step_, head_step_);
    return id.add_table("table", t.data(), p_.heads, p_.num_buckets, p_.num_buckets);
  }

  /// Table entry (bucket, head) (widened for a 16-bit table).
  compute_type weight(index_t bucket_index, index_t head) const {
    detail::require(bucket_index >= 0 && bucket_index < p_.num_buckets, "posenc::t5_bias::weight", "bucket is ",
                    bucket_index, ", expected 0 .. ", p_.num_buckets - 1);
    detail::rel::check_head("posenc::t5_bias::weight", head, p_.heads);
    return at(bucket_index, head);
  }

  /// The bucket of relative position delta = key - query; any delta.
  index_t bucket(index_t delta) const noexcept {
    index_t const half = p_.bidirectional ? p_.num_buckets / 2 : p_.num_buckets;
    index_t offset = 0, n = 0;
    if (p_.bidirectional) {
      if (delta > 0) offset = half;
      n = delta < 0 ? (delta <= -p_.max_distance ? p_.max_distance : -delta) : std::min(delta, p_.max_distance);
    } else {
      n = delta >= 0 ? 0 : (delta <= -p_.max_distance ? p_.max_distance : -delta);
    }
    return offset + side_bucket(n, half);
  }

  /// table[bucket(k_pos - q_pos), head].
  compute_type bias(index_t head, index_t q_pos, index_t k_pos) const {
    check_call("posenc::t5_bias::bias", head, q_pos, k_pos);
    return at(bucket(k_pos - q_pos), head);
  }

  /// Hook: out[j] += bias(head, q_pos, k_pos_first + j), j in [0, count). Unchecked.
  POSENC_ROW_NOINLINE void bias_row(index_t head, index_t q_pos, index_t k_pos_first, index_t count,
                                    compute_type* out) const noexcept {
    POSENC_ASSERT(head >= 0 && head < p_.heads, "t5_bias::bias_row: head out of range");
    if (count <= 0) return;
    T const* col = data_ + head * head_step_;
    index_t const step = bucket_step_;  // 1 owned, heads borrowed
    auto const at = [col, step](index_t b) { return detail::stored_value<compute_type>(col[b * step]); };
    index_t d = k_pos_first - q_pos;
    // Most tiles of a long sequence lie wholly in a saturated run (far keys):
    // one fill, no search.
    if (d >= starts_.back()) return detail::rel::add_constant(out, count, at(buckets_.back()));
    if (d < starts_[1] && detail::rel::run_length(d, starts_[1]) >= static_cast<std::uint64_t>(count))
      return detail::rel::add_constant(out, count, at(buckets_[0]));
    // The run holding d: the last start <= d (starts_[0] is the lowest index_t).
    auto r = static_cast<std::size_t>(std::upper_bound(starts_.begin(), starts_.end(), d) - starts_.begin()) - 1;
    index_t j = 0;
    while (j < count) {
      index_t len = count - j;
      if (r + 1 < starts_.size()) {
        std::uint64_t const run = detail::rel::run_length(d, starts_[r + 1]);
        if (run < static_cast<std::uint64_t>(len)) len = static_cast<index_t>(run);
      }
      detail::rel::add_constant(out + j, len, at(buckets_[r]));
      j += len;
      d += len;
      ++r;
    }
  }

  /// The bias is a function of the bucket of k_pos - q_pos alone (see posenc/encoding/traits.hpp).
  bool shift_invariant() const noexcept { return true; }

  /// Checked bias_row over `out`; throws posenc::error before writing anything.
  void add_bias(index_t head, index_t q_pos, index_t k_pos_first, span<compute_type> out) const {
    check_call("posenc::t5_bias::add_bias", head, q_pos, k_pos_first);
    bias_row(head, q_pos, k_pos_first, out.size(), out.data());
  }

  // --- backward (hooks documented in posenc/encoding/traits.hpp) -----------

  /// Gradient of the table: `table(bucket, head)`, shaped like the table the
  /// constructor takes, (num_buckets, heads).
  struct gradient_tensors {
    gradient_tensor<compute_type> table;
    static constexpr char const* add_where = "posenc::t5_bias::gradients::operator+=";
    /// f("table", g.table...) (see gradient_set).
    template <class F, class... G>
    static void each(F&& f, G&... g) {
      f("table", g.table...);
    }
  };
  using gradients = gradient_set<gradient_tensors>;
  /// Zeros of shape (num_buckets, heads).
  gradients make_gradients() const { return {gradient_table::Zero(p_.num_buckets, p_.heads)}; }
  /// Throws unless g.table is (num_buckets, heads).
  void check_gradients(char const* where, gradients const& g) const {
    detail::require(g.table.rows() == p_.num_buckets && g.table.cols() == p_.heads, where, "grads.table shape is (",
                    g.table.rows(), ", ", g.table.cols(), "), expected (", p_.num_buckets, ", ", p_.heads,
                    ") (num_buckets, heads)");
  }
  /// Hook: g.table(bucket(k_pos_first + j - q_pos), head) += dbias[j], j in
  /// [0, count), in order of j. Unchecked.
  void bias_row_backward(index_t head, index_t q_pos, index_t k_pos_first, index_t count,
                         compute_type const* dbias, gradients& g) const noexcept {
    POSENC_ASSERT(head >= 0 && head < p_.heads, "t5_bias::bias_row_backward: head out of range");
    for (index_t j = 0; j < count; ++j) g.table(bucket(k_pos_first + j - q_pos), head) += dbias[j];
  }

 private:
  struct rounded {};
  struct borrowed {};
  // A float table rounded once per entry into the 16-bit T.
  t5_bias(t5_bias_params const& p, relative_table<float> const& table, rounded) : p_(p) {
    check_params("posenc::t5_bias::rounded_from");
    own(detail::rel::transpose_table<T, float>(table));
    build_runs();
  }
  // No table yet: view_of checks and points it.
  t5_bias(t5_bias_params const& p, borrowed) : p_(p) {}

  // Owns `t`, (heads, num_buckets): one head's buckets contiguous.
  void own(std::vector<T>&& t) {
    auto v = std::make_shared<std::vector<T>>(std::move(t));
    data_ = v->data();
    own_ = std::move(v);
    bucket_step_ = 1;
    head_step_ = p_.num_buckets;
  }

  // Entry (bucket, head), widened.
  compute_type at(index_t bucket_index, index_t head) const noexcept {
    return detail::stored_value<compute_type>(data_[bucket_index * bucket_step_ + head * head_step_]);
  }

  // Bucket of distance n >= 0 on one side (before the direction offset),
  // for n <= max_distance.
  index_t side_bucket(index_t n, index_t half) const noexcept {
    index_t const exact = half / 2;
    if (n < exact) return n;
    double const v = std::log(static_cast<double>(n) / static_cast<double>(exact)) /
                     std::log(static_cast<double>(p_.max_distance) / static_cast<double>(exact)) *
                     static_cast<double>(half - exact);
    index_t const b = exact + static_cast<index_t>(v);  // v >= 0: the cast truncates toward zero
    return std::min(half - 1, b);
  }

  void check_params(char const* where) const {
    detail::require(p_.heads >= 1, where, "heads is ", p_.heads, ", expected >= 1");
    if (p_.bidirectional) {
      detail::require(p_.num_buckets >= 4 && p_.num_buckets % 2 == 0, where, "num_buckets is ", p_.num_buckets,
                      ", expected an even number >= 4 (bidirectional)");
    } else {
      detail::require(p_.num_buckets >= 2, where, "num_buckets is ", p_.num_buckets,
                      ", expected >= 2 (unidirectional)");
    }
    detail::checked_mul(where, p_.num_buckets, p_.heads, "num_buckets x heads");
    index_t const half = p_.bidirectional ? p_.num_buckets / 2 : p_.num_buckets;
    detail::require(p_.max_distance > half / 2, where, "max_distance is ", p_.max_distance, ", expected > ", half / 2,
                    " (max_exact = ", p_.bidirectional ? "num_buckets / 4" : "num_buckets / 2", ")");
  }

  void check_call(char const* where, index_t head, index_t q_pos, index_t k_pos) const {
    detail::rel::check_head(where, head, p_.heads);
    detail::rel::check_position(where, "q_pos", q_pos);
    detail::rel::check_position(where, "k_pos", k_pos);
  }

  // Lists the runs of equal bucket over delta, ascending: run r covers
  // [starts_[r], starts_[r + 1]) (the last one is unbounded) with bucket buckets_[r].
  void build_runs() {
    index_t const half = p_.bidirectional ? p_.num_buckets / 2 : p_.num_buckets;
    index_t const exact = half / 2;
    // Where each bucket starts on one side, as distances n ascending.
    std::vector<index_t> n_start, n_bucket;
    for (index_t n = 0; n < exact; ++n) {
      n_start.push_back(n);
      n_bucket.push_back(n);
    }
    index_t n = exact;
    for (;;) {
      index_t const b = side_bucket(n, half);
      n_start.push_back(n);
      n_bucket.push_back(b);
      if (b == half - 1) break;
      // bucket(n) is non-decreasing and reaches half - 1 at n = max_distance
      // (ln(D/e) / ln(D/e) is exactly 1): bisect for the first n with a larger bucket.
      index_t lo = n, hi = p_.max_distance;  // side_bucket(lo) == b < side_bucket(hi)
      while (hi - lo > 1) {
        index_t const mid = lo + (hi - lo) / 2;
        (side_bucket(mid, half) > b ? hi : lo) = mid;
      }
      n = hi;
    }
    index_t const lowest = std::numeric_limits<index_t>::min();
    auto const m = n_start.size();
    // Keys before or at the query: delta = -n, runs in reverse order of n.
    for (std::size_t i = m; i-- > 0;) {
      starts_.push_back(i + 1 == m ? lowest : -(n_start[i + 1] - 1));
      buckets_.push_back(n_bucket[i]);
    }
    // Keys after the query.
    if (!p_.bidirectional) {
      starts_.push_back(1);
      buckets_.push_back(0);
      return;
    }
    for (std::size_t i = 0; i < m; ++i) {
      index_t const first = std::max<index_t>(n_start[i], 1);
      if (i + 1 < m && first > n_start[i + 1] - 1) continue;  // empty (n = 0 is not after the query)
      starts_.push_back(first);
      buckets_.push_back(half + n_bucket[i]);
    }
  }

  t5_bias_params p_;
  std::shared_ptr<std::vector<T> const> own_;  // the owned table, (heads, num_buckets); null when borrowed
  T const* data_ = nullptr;                     // entry (b, h) at data_[b * bucket_step_ + h * head_step_]
  index_t bucket_step_ = 1;                     // 1 owned (transposed), heads borrowed (caller's layout)
  index_t head_step_ = 0;                       // num_buckets owned, 1 borrowed
  std::vector<index_t> starts_;   // (runs): first delta of each run, ascending
  std::vector<index_t> buckets_;  // (runs): bucket of each run
};

template <class T>
struct encoder_traits<t5_bias<T>> {
  static constexpr bool adds_to_embeddings = false, rotates_queries_keys = false;
  static constexpr bool biases_scores = true, relative_key_value = false;
  static constexpr bool is_relative = true;
};

}  // namespace posenc
