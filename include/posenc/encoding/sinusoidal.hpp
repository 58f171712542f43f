// SPDX-License-Identifier: MIT
// sinusoidal<T>: the fixed sine/cosine absolute encoding (Vaswani et al. 2017, tensor2tensor, fairseq, Marian).
//
// PE[p, c] is a sine or a cosine of p * w for a per-column frequency w:
//
//   interleaved (the paper, DistilBERT, XLM):
//     c even: sin(p * w_k), c odd: cos(p * w_k),   k = floor(c/2),  w_k = base^(-2k/d)
//   concatenated, frequency = tensor2tensor (tensor2tensor, fairseq, FSMT, M2M100/NLLB, XGLM):
//     [sin(p w_0) .. sin(p w_{n-1}) | cos(p w_0) .. cos(p w_{n-1}) | 0 if d odd],
//     n = floor(d/2),  w_k = exp(-k ln(base) / max(n-1, 1))
//   concatenated, frequency = paper (Marian, Pegasus; the interleaved table with its even columns first):
//     [sin(p w_0) .. sin(p w_{ceil(d/2)-1}) | cos(p w_0) .. cos(p w_{floor(d/2)-1})],  w_k = base^(-2k/d)
//
// Every value is computed in double (angle and sine) and rounded once to T,
// so position 65535 is as exact as position 1. With `padding_idx = P >= 0`
// the encoding of position P is all zeros (fairseq's padding row; pair with
// posenc::fairseq_positions).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#include "posenc/core/aligned_buffer.hpp"
#include "posenc/core/checked.hpp"
#include "posenc/core/error.hpp"
#include "posenc/core/positions.hpp"
#include "posenc/core/span.hpp"
#include "posenc/core/view.hpp"
#include "posenc/encoding/absolute_common.hpp"
#include "posenc/encoding/traits.hpp"

namespace posenc {

/// Where the sines and cosines go in a row.
enum class sinusoidal_layout {
  interleaved,   ///< sin on even columns, cos on odd columns (Vaswani et al. 2017)
  concatenated,  ///< all sines, then all cosines
};

/// Frequencies of the concatenated layout. The interleaved layout always uses `paper`.
enum class sinusoidal_frequency {
  paper,          ///< w_k = base^(-2k/d) (Marian, Pegasus)
  tensor2tensor,  ///< w_k = exp(-k ln(base) / max(d/2 - 1, 1)) (tensor2tensor, fairseq)
};

/// Parameters of sinusoidal<T>.
struct sinusoidal_params {
  /// Row width d (> 0). Odd widths follow docs/formulas.md 1.1-1.3.
  index_t d_model = 0;
  sinusoidal_layout layout = sinusoidal_layout::interleaved;
  /// `tensor2tensor` requires the concatenated layout.
  sinusoidal_frequency frequency = sinusoidal_frequency::paper;
  /// Wavelength base (> 0, finite); 10000 in every reference model.
  double base = 10000.0;
  /// If >= 0: the position whose encoding is all zeros (fairseq padding_idx, 1). -1: none.
  index_t padding_idx = -1;
  /// Rows 0 .. cache_positions-1 are precomputed at construction; other rows
  /// are computed when used (same values, slower).
  index_t cache_positions = 1024;
};

/// The sinusoidal absolute encoding: `add_to` adds PE[pos] to token embeddings.
///
/// Thread safety: the const members (`value`, `fill`, `add_to`) never modify
/// the object and may run concurrently from any number of threads. `reserve`
/// replaces the cached table and needs exclusive access to this object; copies
/// share the old table read-only and are unaffected.
///
/// @tparam T float or double.
template <class T = float>
class sinusoidal {
  static_assert(std::is_floating_point_v<T>, "posenc::sinusoidal: T must be float or double");

 public:
  using value_type = T;

  /// Checks the parameters (throws posenc::error) and precomputes the cached rows.
  explicit sinusoidal(sinusoidal_params const& p) : p_(p) {
    constexpr char const* where = "posenc::sinusoidal";
    detail::require(p.d_model > 0, where, "d_model is ", p.d_model, ", expected > 0");
    detail::require(std::isfinite(p.base) && p.base > 0, where, "base is ", p.base, ", expected > 0 and finite");
    detail::require(p.layout == sinusoidal_layout::concatenated || p.frequency == sinusoidal_frequency::paper,
                    where, "frequency is tensor2tensor, expected paper with the interleaved layout "
                           "(tensor2tensor frequencies belong to the concatenated layout)");
    detail::require(p.padding_idx >= -1, where, "padding_idx is ", p.padding_idx, ", expected >= 0 or -1 (none)");
    detail::require(p.cache_positions >= 0, where, "cache_positions is ", p.cache_positions, ", expected >= 0");
    build_columns();
    cached_ = 0;
    reserve(p.cache_positions);
  }

  /// Same as sinusoidal(sinusoidal_params{d_model, layout, frequency, base}).
  explicit sinusoidal(index_t d_model, sinusoidal_layout layout = sinusoidal_layout::interleaved,
                      sinusoidal_frequency frequency = sinusoidal_frequency::paper, double base = 10000.0)
      : sinusoidal(make_params(d_model, layout, frequency, base)) {}

  // Copies share the cached table. There are no move operations, so a
  // moved-from encoder stays usable (a move copies the small column tables).
  sinusoidal(sinusoidal const&) = default;
  sinusoidal& operator=(sinusoidal const&) = default;

  /// Row width.
  index_t d_model() const noexcept { return p_.d_model; }
  /// Interleaved or concatenated.
  sinusoidal_layout layout() const noexcept { return p_.layout; }
  /// Frequencies (always `paper` for the interleaved layout).
  sinusoidal_frequency frequency() const noexcept { return p_.frequency; }
  /// Wavelength base.
  double base() const noexcept { return p_.base; }
  /// The position whose row is zero, or -1.
  index_t padding_idx() const noexcept { return p_.padding_idx; }
  /// Rows held in the table cache.
  index_t cached_positions() const noexcept { return cached_; }
  /// Any non-negative position works.
  constexpr index_t max_positions() const noexcept { return 0; }

  /// Element type, d_model, layout, frequency, base and padding_idx (the
  /// cached rows hold the same values as computed ones: not part of it).
  encoder_identity identity() const {
    encoder_identity id("sinusoidal");
    id.add("type", detail::element_name<T>()).add("d_model", p_.d_model);
    id.add("layout", p_.layout == sinusoidal_layout::interleaved ? "interleaved" : "concatenated");
    id.add("frequency", p_.frequency == sinusoidal_frequency::paper ? "paper" : "tensor2tensor");
    return id.add("base", p_.base).add("padding_idx", p_.padding_idx);
  }

  /// PE[pos, column], computed in double and rounded once.
  T value(index_t pos, index_t column) const {
    constexpr char const* where = "posenc::sinusoidal::value";
    detail::require(pos >= 0, where, "pos is ", pos, ", expected >= 0");
    detail::require(column >= 0 && column < p_.d_model, where, "column is ", column, ", expected in [0, ",
                    p_.d_model, ") (d_model)");
    return static_cast<T>(exact(pos, column));
  }

  /// Precomputes rows [0, positions) (no-op when already cached). Not
  /// thread-safe: see the class comment.
  void reserve(index_t positions) {
    detail::require(positions >= 0, "posenc::sinusoidal::reserve", "positions is ", positions, ", expected >= 0");
    if (positions <= cached_) return;
    index_t const d = p_.d_model;
    auto t = std::make_shared<aligned_buffer<T>>(
        detail::checked_mul("posenc::sinusoidal::reserve", positions, d, "positions x d_model"));
    if (cached_ > 0) std::memcpy(t->data(), table_->data(), static_cast<std::size_t>(cached_ * d) * sizeof(T));
    for (index_t q = cached_; q < positions; ++q) compute_row(q, t->data() + q * d);
    table_ = std::move(t);
    cached_ = positions;
  }

  /// Writes rows first_pos .. first_pos+count-1 of the table into `out`
  /// (row-major (count, d_model)).
  void fill(index_t first_pos, index_t count, span<T> out) const {
    constexpr char const* where = "posenc::sinusoidal::fill";
    detail::require(first_pos >= 0, where, "first_pos is ", first_pos, ", expected >= 0");
    detail::require(count >= 0, where, "count is ", count, ", expected >= 0");
    index_t const n = detail::checked_mul(where, count, p_.d_model, "count x d_model");
    detail::require(out.size() == n, where, "out.size is ", out.size(), ", expected ", n, " (count * d_model)");
    if (count > 0) detail::checked_add(where, first_pos, count - 1, "first_pos + count - 1");
    index_t const d = p_.d_model;
    for (index_t r = 0; r < count; ++r) {
      index_t const q = first_pos + r;
      if (q < cached_) {
        std::memcpy(out.data() + r * d, table_->data() + q * d, static_cast<std::size_t>(d) * sizeof(T));
      } else {
        compute_row(q, out.data() + r * d);
      }
    }
  }

  /// x[b, s, :] += PE[pos(b, s)] for every token of x (batch, seq, d_model).
  /// Checks x and the positions first (throws posenc::error, x untouched).
  void add_to(token_view<T> x, position_span pos) const { add_to(x, pos, T(1)); }

  /// x[b, s, :] = x[b, s, :] * x_scale + PE[pos(b, s)]: the embedding scale
  /// sqrt(d_model) of fairseq and the paper (Section 3.4) fused into the add.
  void add_to(token_view<T> x, position_span pos, T x_scale) const {
    constexpr char const* where = "posenc::sinusoidal::add_to";
    detail::check_view(where, "x", x);
    detail::check_equal(where, "x.dim", x.dim, p_.d_model, "d_model");
    detail::require(std::isfinite(x_scale), where, "x_scale is ", x_scale, ", expected finite");
    pos.validate(where, "positions", x.batch, x.seq);
    if (x.empty()) return;
    index_t const d = p_.d_model;
    std::vector<T> scratch;
    if (pos.max_position(x.batch, x.seq) >= cached_) scratch.resize(static_cast<std::size_t>(d));
    T const* table = table_ ? table_->data() : nullptr;
    index_t scratch_pos = -1;
    // s outer, b inner: the batch entries of an offset span share each row.
    for (index_t s = 0; s < x.seq; ++s) {
      for (index_t b = 0; b < x.batch; ++b) {
        index_t const q = pos.at(b, s);
        T const* row;
        if (q < cached_) {
          row = table + q * d;
        } else {
          if (q != scratch_pos) {
            compute_row(q, scratch.data());
            scratch_pos = q;
          }
          row = scratch.data();
        }
        detail::add_scaled_row(x.ptr(b, s), row, d, x_scale);
      }
    }
  }

  /// Backward hook of add_to (posenc/encoding/traits.hpp): no parameters, so
  /// nothing to add; d(x) passes through unchanged (times x_scale when add_to
  /// scaled x). Checks its arguments as add_to does.
  void add_to_backward(token_view<const T> dx, position_span pos, no_gradients& g) const {
    constexpr char const* where = "posenc::sinusoidal::add_to_backward";
    detail::check_view(where, "dx", dx);
    detail::check_equal(where, "dx.dim", dx.dim, p_.d_model, "d_model");
    pos.validate(where, "positions", dx.batch, dx.seq);
    (void)g;
  }

 private:
  enum class kind : unsigned char { sine, cosine, zero };

  static sinusoidal_params make_params(index_t d_model, sinusoidal_layout layout, sinusoidal_frequency frequency,
                                       double base) {
    sinusoidal_params p;
    p.d_model = d_model;
    p.layout = layout;
    p.frequency = frequency;
    p.base = base;
    return p;
  }

  void build_columns() {
    index_t const d = p_.d_model;
    freq_.assign(static_cast<std::size_t>(d), 0.0);
    kind_.assign(static_cast<std::size_t>(d), kind::zero);
    auto paper = [&](index_t k) { return std::pow(p_.base, -2.0 * static_cast<double>(k) / static_cast<double>(d)); };
    for (index_t c = 0; c < d; ++c) {
      auto const i = static_cast<std::size_t>(c);
      if (p_.layout == sinusoidal_layout::interleaved) {
        freq_[i] = paper(c / 2);
        kind_[i] = c % 2 == 0 ? kind::sine : kind::cosine;
      } else if (p_.frequency == sinusoidal_frequency::paper) {
        index_t const sines = (d + 1) / 2;
        index_t const k = c < sines ? c : c - sines;
        freq_[i] = paper(k);
        kind_[i] = c < sines ? kind::sine : kind::cosine;
      } else {
        index_t const n = d / 2;
        double const step = std::log(p_.base) / static_cast<double>(std::max<index_t>(n - 1, 1));
        if (c < 2 * n) {
          index_t const k = c < n ? c : c - n;
          freq_[i] = std::exp(-static_cast<double>(k) * step);
          kind_[i] = c < n ? kind::sine : kind::cosine;
        }
      }
    }
  }

  double exact(index_t pos, index_t c) const noexcept {
    if (pos == p_.padding_idx) return 0.0;
    auto const i = static_cast<std::size_t>(c);
    double const angle = static_cast<double>(pos) * freq_[i];
    switch (kind_[i]) {
      case kind::sine:
        return std::sin(angle);
      case kind::cosine:
        return std::cos(angle);
      default:
        return 0.0;
    }
  }

  void compute_row(index_t pos, T* out) const noexcept {
    for (index_t c = 0; c < p_.d_model; ++c) out[c] = static_cast<T>(exact(pos, c));
  }

  sinusoidal_params p_;
  std::vector<double> freq_;  // (d_model) angle per unit position of each column
  std::vector<kind> kind_;    // (d_model)
  std::shared_ptr<aligned_buffer<T> const> table_;  // (cached_, d_model), immutable once published
  index_t cached_ = 0;
};

template <class T>
struct encoder_traits<sinusoidal<T>> {
  static constexpr bool adds_to_embeddings = true, rotates_queries_keys = false;
  static constexpr bool biases_scores = false, relative_key_value = false;
  static constexpr bool is_relative = false;
};

}  // namespace posenc
