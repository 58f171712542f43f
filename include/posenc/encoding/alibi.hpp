// SPDX-License-Identifier: MIT
// ALiBi (Press et al. 2022): a per-head linear bias of the query-key distance, four forms.
#pragma once

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <utility>
#include <vector>

#include "posenc/core/checked.hpp"
#include "posenc/core/error.hpp"
#include "posenc/core/simd.hpp"
#include "posenc/core/span.hpp"
#include "posenc/encoding/bias_kernels.hpp"
#include "posenc/encoding/traits.hpp"

namespace posenc {

/// The four ALiBi bias forms (docs/formulas.md 4.2), for query position p_i, key
/// position p_j and head slope m:
///
/// | form      | bias                  | used by                                     |
/// |-----------|-----------------------|---------------------------------------------|
/// | paper     | -m * (p_i - p_j)      | the ALiBi paper                              |
/// | key_only  | m * p_j               | BLOOM, fairseq ALiBi code                    |
/// | shifted   | m * (p_j - (L - 1))   | MPT (causal); L = key length                 |
/// | symmetric | -m * abs(p_i - p_j)   | MPT non-causal, encoder variants             |
///
/// paper, key_only and shifted differ by a constant per query row, so under
/// a causal mask they give the same probabilities and outputs; raw scores
/// differ. symmetric also penalises keys after the query.
enum class alibi_form { paper, key_only, shifted, symmetric };

/// A tensor-parallel shard: the encoder serves heads `first .. first + heads - 1`
/// of a model with `total` heads, whose slopes are those of `total` heads.
struct head_shard {
  index_t first = 0;  ///< index of the shard's first head in the whole model
  index_t total = 0;  ///< head count of the whole model
};

/// The ALiBi slopes of the paper for a model of `heads` heads (heads >= 1), in
/// double: `2^(-8h/H)`, h = 1..H, for H a power of two; otherwise the `c =
/// 2^floor(log2 H)` slopes of c heads followed by the first H - c odd-numbered
/// slopes of the 2c-head sequence, `2^(-4(2t-1)/c)`. BLOOM and MPT give the same
/// values (BLOOM forms them in float, up to 5e-8 off).
inline std::vector<double> alibi_slopes(index_t heads) {
  detail::require(heads >= 1, "posenc::alibi_slopes", "heads is ", heads, ", expected >= 1");
  index_t c = 1;
  while (c * 2 <= heads) c *= 2;
  std::vector<double> s;
  s.reserve(static_cast<std::size_t>(heads));
  for (index_t h = 1; h <= c; ++h) s.push_back(std::exp2(-8.0 * static_cast<double>(h) / static_cast<double>(c)));
  for (index_t t = 1; t <= heads - c; ++t)
    s.push_back(std::exp2(-4.0 * static_cast<double>(2 * t - 1) / static_cast<double>(c)));
  return s;
}

namespace detail::rel {

/// out[j] += m * (x0 + j) (or -(m * |x0 + j|) when Symmetric), j in [0, n). The
/// lanes hold the integer x0 + i converted once per batch plus 0..w-1, so every
/// value equals the scalar m * T(x) exactly while |x| < 2^24 (float) / 2^53
/// (double); further out it is within one rounding of x.
template <bool Symmetric, class T>
inline void alibi_row(T* out, index_t n, index_t x0, T m) noexcept {
  constexpr index_t w = simd::width<T>;
  T const sm = Symmetric ? -m : m;
  alignas(64) T iota[simd::width<T>];
  for (index_t l = 0; l < w; ++l) iota[l] = static_cast<T>(l);
  auto const vi = simd::load(iota);
  auto const vm = simd::broadcast<T>(sm);
  index_t const full = n / w;
  for (index_t b = 0; b < full; ++b) {
    auto d = simd::broadcast<T>(static_cast<T>(x0 + b * w)) + vi;
    if constexpr (Symmetric) d = simd::max(d, -d);
    simd::store(out + b * w, simd::load(out + b * w) + d * vm);
  }
  T* tail = out + full * w;
  index_t const x_tail = x0 + full * w;
  for (index_t t = 0; t < n % w; ++t) {
    T d = static_cast<T>(x_tail + t);
    if constexpr (Symmetric) d = std::abs(d);
    tail[t] += d * sm;
  }
}

}  // namespace detail::rel

/// ALiBi bias of one attention call's query heads.
///
/// `head` in the hooks is the query head index of the attention call; with a
/// head_shard the slope used is that of model head `shard.first + head`.
/// Positions are absolute (a query of a KV-cache step sits at past_len + i).
///
/// The shifted form needs the key length L (MPT slices its bias to the last L
/// columns, so the newest key gets 0): it is the explicit `key_length`
/// parameter, required for that form and rejected for the others. With a KV
/// cache L grows each step; `with_key_length(L)` gives the encoder for the
/// next step. `max_positions()` is L for the shifted form (positions past L - 1
/// have no meaning there) and 0 (any) otherwise.
///
/// `is_relative` holds: paper and symmetric depend only on p_j - p_i; key_only
/// and shifted add a per-row constant to it, which the softmax cancels.
/// @tparam T float or double.
template <class T = float>
class alibi {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "posenc::alibi: T must be float or double");

 public:
  using value_type = T;

  /// The paper's slopes for a model of `heads` heads, all served.
  alibi(alibi_form form, index_t heads, index_t key_length = 0)
      : alibi(form, heads, head_shard{0, heads}, key_length) {}

  /// The paper's slopes of a `shard.total`-head model; serves heads
  /// shard.first .. shard.first + heads - 1.
  alibi(alibi_form form, index_t heads, head_shard shard, index_t key_length = 0)
      : form_(form), heads_(heads), first_(shard.first), total_(shard.total), key_length_(key_length) {
    check_common("posenc::alibi");
    auto all = alibi_slopes(total_);
    for (index_t h = 0; h < heads_; ++h) slopes_.push_back(static_cast<T>(all[static_cast<std::size_t>(first_ + h)]));
  }

  /// Caller-given slopes, one per head (`slopes.size() == heads`).
  alibi(alibi_form form, index_t heads, span<const T> slopes, index_t key_length = 0)
      : alibi(form, heads, head_shard{0, heads}, slopes, key_length) {}

  /// Caller-given slopes of the whole model (`slopes.size() == shard.total`);
  /// serves heads shard.first .. shard.first + heads - 1.
  alibi(alibi_form form, index_t heads, head_shard shard, span<const T> slopes, index_t key_length = 0)
      : form_(form), heads_(heads), first_(shard.first), total_(shard.total), key_length_(key_length) {
    check_common("posenc::alibi");
    detail::require(slopes.size() == total_, "posenc::alibi", "slopes has ", slopes.size(), " values, expected ",
                    total_, " (one per head of the model)");
    for (index_t h = 0; h < total_; ++h)
      detail::require(std::isfinite(static_cast<double>(slopes[h])), "posenc::alibi", "slopes[", h, "] is ", slopes[h],
                      ", expected a finite number");
    for (index_t h = 0; h < heads_; ++h) slopes_.push_back(slopes[first_ + h]);
  }

  /// The same encoder with key length L (the shifted form's next decoding step).
  alibi with_key_length(index_t key_length) const {
    alibi a = *this;
    a.key_length_ = key_length;
    a.check_common("posenc::alibi::with_key_length");
    return a;
  }

  alibi_form form() const noexcept { return form_; }
  /// Heads served (the query heads of the attention call).
  index_t heads() const noexcept { return heads_; }
  /// Model index of the first served head.
  index_t head_offset() const noexcept { return first_; }
  /// Heads of the whole model.
  index_t total_heads() const noexcept { return total_; }
  /// L of the shifted form (0 for the other forms).
  index_t key_length() const noexcept { return key_length_; }
  /// L for the shifted form, else 0 (any position).
  index_t max_positions() const noexcept { return form_ == alibi_form::shifted ? key_length_ : 0; }

  /// Element type, form, heads, key_length and a digest of the served heads'
  /// slopes (the shard enters through them).
  encoder_identity identity() const {
    static char const* const forms[] = {"paper", "key_only", "shifted", "symmetric"};
    encoder_identity id("alibi");
    id.add("type", detail::element_name<T>()).add("form", forms[static_cast<int>(form_)]);
    id.add("heads", heads_).add("key_length", key_length_);
    return id.add_table("slopes", slopes_.data(), 1, heads_, heads_);
  }

  /// Slope of served head `head` (model head head_offset() + head).
  T slope(index_t head) const {
    detail::rel::check_head("posenc::alibi::slope", head, heads_);
    return slopes_[static_cast<std::size_t>(head)];
  }

  /// The bias of query position q_pos against key position k_pos for `head`.
  T bias(index_t head, index_t q_pos, index_t k_pos) const {
    check_call("posenc::alibi::bias", head, q_pos, k_pos, 1);
    T const m = slopes_[static_cast<std::size_t>(head)];
    switch (form_) {
      case alibi_form::paper:
        return static_cast<T>(k_pos - q_pos) * m;
      case alibi_form::key_only:
        return static_cast<T>(k_pos) * m;
      case alibi_form::shifted:
        return static_cast<T>(k_pos - (key_length_ - 1)) * m;
      case alibi_form::symmetric:
        break;
    }
    return static_cast<T>(k_pos - q_pos < 0 ? q_pos - k_pos : k_pos - q_pos) * -m;
  }

  /// Hook: out[j] += bias(head, q_pos, k_pos_first + j), j in [0, count).
  /// Unchecked (the attention kernel validated head and positions).
  POSENC_ROW_NOINLINE void bias_row(index_t head, index_t q_pos, index_t k_pos_first, index_t count,
                                    T* out) const noexcept {
    POSENC_ASSERT(head >= 0 && head < heads_, "alibi::bias_row: head out of range");
    T const m = slopes_[static_cast<std::size_t>(head)];
    switch (form_) {
      case alibi_form::paper:
        detail::rel::alibi_row<false>(out, count, k_pos_first - q_pos, m);
        return;
      case alibi_form::key_only:
        detail::rel::alibi_row<false>(out, count, k_pos_first, m);
        return;
      case alibi_form::shifted:
        detail::rel::alibi_row<false>(out, count, k_pos_first - (key_length_ - 1), m);
        return;
      case alibi_form::symmetric:
        detail::rel::alibi_row<true>(out, count, k_pos_first - q_pos, m);
        return;
    }
  }

  /// The paper and symmetric forms depend on k_pos - q_pos alone; key_only and
  /// shifted add a per-row constant (see posenc/encoding/traits.hpp).
  bool shift_invariant() const noexcept { return form_ == alibi_form::paper || form_ == alibi_form::symmetric; }

  /// Checked bias_row: out[j] += bias(head, q_pos, k_pos_first + j) for every j
  /// of `out`; throws posenc::error before writing anything.
  void add_bias(index_t head, index_t q_pos, index_t k_pos_first, span<T> out) const {
    check_call("posenc::alibi::add_bias", head, q_pos, k_pos_first, out.size());
    bias_row(head, q_pos, k_pos_first, out.size(), out.data());
  }

  // --- backward (hooks documented in posenc/encoding/traits.hpp) -----------

  /// Gradient of the served heads' slopes, a (heads(), 1) gradient_tensor
  /// (the default: make_gradients(), posenc::make_gradients(enc)), row h that
  /// of slope(h): d(slope_h) = sum over the pairs of head h of d(bias) *
  /// distance, where distance is the bias at slope 1 of the form (paper
  /// k - q, key_only k, shifted k - (L - 1), symmetric -|k - q|). Empty
  /// (0 x 0) only when asked for (make_gradients(false): fixed slopes,
  /// nothing computed).
  struct gradient_tensors {
    gradient_tensor<T> slopes;
    static constexpr char const* add_where = "posenc::alibi::gradients::operator+=";
    /// f("slopes", g.slopes...) (see gradient_set).
    template <class F, class... G>
    static void each(F&& f, G&... g) {
      f("slopes", g.slopes...);
    }
  };
  using gradients = gradient_set<gradient_tensors>;
  /// Zeros of shape (heads(), 1); (0 x 0) when `learn_slopes` is false (fixed
  /// slopes, as in the paper: the backward then skips their sums).
  gradients make_gradients(bool learn_slopes = true) const {
    return {learn_slopes ? gradient_tensor<T>::Zero(heads_, 1) : gradient_tensor<T>()};
  }
  /// Throws unless g.slopes is (heads(), 1) or (0 x 0).
  void check_gradients(char const* where, gradients const& g) const {
    bool const fixed = g.slopes.rows() == 0 && g.slopes.cols() == 0;
    detail::require(fixed || (g.slopes.rows() == heads_ && g.slopes.cols() == 1), where, "grads.slopes shape is (",
                    g.slopes.rows(), ", ", g.slopes.cols(), "), expected (0, 0) (fixed slopes) or (", heads_,
                    ", 1) (heads, 1)");
  }
  /// Hook: g.slopes(head, 0) += sum_j dbias[j] * distance(q_pos, k_pos_first + j)
  /// (summed in double in order of j); nothing when g.slopes is empty. Unchecked.
  void bias_row_backward(index_t head, index_t q_pos, index_t k_pos_first, index_t count, T const* dbias,
                         gradients& g) const noexcept {
    POSENC_ASSERT(head >= 0 && head < heads_, "alibi::bias_row_backward: head out of range");
    if (g.slopes.size() == 0 || count <= 0) return;
    double acc = 0;
    for (index_t j = 0; j < count; ++j) {
      index_t const kp = k_pos_first + j;
      index_t dist = 0;
      switch (form_) {
        case alibi_form::paper: dist = kp - q_pos; break;
        case alibi_form::key_only: dist = kp; break;
        case alibi_form::shifted: dist = kp - (key_length_ - 1); break;
        case alibi_form::symmetric: dist = kp < q_pos ? kp - q_pos : q_pos - kp; break;
      }
      acc += static_cast<double>(dbias[j]) * static_cast<double>(dist);
    }
    g.slopes(head, 0) += static_cast<T>(acc);
  }

 private:
  void check_common(char const* where) const {
    detail::require(heads_ >= 1, where, "heads is ", heads_, ", expected >= 1");
    detail::require(first_ >= 0, where, "shard.first is ", first_, ", expected >= 0");
    index_t const end = detail::checked_add(where, first_, heads_, "shard.first + heads");
    detail::require(total_ >= end, where, "shard.total is ", total_, ", expected >= ", end, " (shard.first + heads)");
    if (form_ == alibi_form::shifted) {
      detail::require(key_length_ >= 1, where, "key_length is ", key_length_,
                      ", expected >= 1 (the shifted form needs the key length L)");
    } else {
      detail::require(key_length_ == 0, where, "key_length is ", key_length_,
                      ", expected 0 (only alibi_form::shifted uses it)");
    }
  }

  void check_call(char const* where, index_t head, index_t q_pos, index_t k_pos_first, index_t count) const {
    detail::rel::check_head(where, head, heads_);
    detail::rel::check_position(where, "q_pos", q_pos);
    detail::rel::check_position(where, "k_pos", k_pos_first);
    index_t const k_last = count > 0 ? detail::checked_add(where, k_pos_first, count - 1, "k_pos + count - 1") : 0;
    detail::rel::check_position(where, "last k_pos", k_last);
    if (form_ == alibi_form::shifted) {
      detail::require(q_pos < key_length_, where, "q_pos is ", q_pos, ", expected < ", key_length_, " (key_length)");
      detail::require(count == 0 || k_last < key_length_, where, "last k_pos is ", k_last, ", expected < ",
                      key_length_, " (key_length)");
    }
  }

  alibi_form form_;
  index_t heads_, first_, total_, key_length_;
  std::vector<T> slopes_;  // (heads): the served heads' slopes
};

template <class T>
struct encoder_traits<alibi<T>> {
  static constexpr bool adds_to_embeddings = false, rotates_queries_keys = false;
  static constexpr bool biases_scores = true, relative_key_value = false;
  static constexpr bool is_relative = true;
};

}  // namespace posenc
