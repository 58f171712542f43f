// SPDX-License-Identifier: MIT
// rotation_applied<E>: encoder E after its rotation was applied to q and k, acting everywhere else as E (backward too).
#pragma once

#include <utility>

#include "posenc/core/span.hpp"
#include "posenc/encoding/traits.hpp"

namespace posenc::distributed::detail {

/// Encoder E whose rotation the caller has already applied to q and k (at the
/// whole sequence's length, which a block of keys cannot know); every other
/// hook (bias_row, Shaw's score_row / value_row, heads, max_positions)
/// forwards to E. Holds a pointer: E must outlive it.
template <class E>
class rotation_applied {
 public:
  using value_type = typename posenc::detail::declared_value_type<E>::type;

  /// E's parameter gradients (the rotation has none).
  using gradients = encoder_gradients_t<E>;

  explicit rotation_applied(E const& enc) noexcept : enc_(&enc) {}

  /// E's max_positions().
  index_t max_positions() const { return enc_->max_positions(); }
  /// `rotation_applied(encoder ...)`: the wrapped encoder's identity.
  encoder_identity identity() const {
    encoder_identity id("rotation_applied");
    return id.add("encoder", posenc::identity_of(*enc_));
  }
  /// E's heads(), when E has one.
  template <class F = E>
  auto heads() const -> decltype(index_t(std::declval<F const&>().heads())) {
    return enc_->heads();
  }
  /// E's bias_row, when E has one.
  template <class U, class F = E>
  auto bias_row(index_t head, index_t q_pos, index_t k_first, index_t count, U* out) const
      -> decltype(std::declval<F const&>().bias_row(head, q_pos, k_first, count, out)) {
    return enc_->bias_row(head, q_pos, k_first, count, out);
  }
  /// E's shift_invariant(), when E has one.
  template <class F = E>
  auto shift_invariant() const -> decltype(bool(std::declval<F const&>().shift_invariant())) {
    return enc_->shift_invariant();
  }
  /// E's Shaw score term, when E has one.
  template <class U, class F = E>
  auto score_row(U const* q, index_t q_pos, index_t k_first, index_t count, U scale, U* out) const
      -> decltype(std::declval<F const&>().score_row(q, q_pos, k_first, count, scale, out)) {
    return enc_->score_row(q, q_pos, k_first, count, scale, out);
  }
  /// E's Shaw value term, when E has one.
  template <class U, class F = E>
  auto value_row(U const* p, index_t q_pos, index_t k_first, index_t count, U* out) const
      -> decltype(std::declval<F const&>().value_row(p, q_pos, k_first, count, out)) {
    return enc_->value_row(p, q_pos, k_first, count, out);
  }
  /// E's has_values(), when E has one.
  template <class F = E>
  auto has_values() const -> decltype(bool(std::declval<F const&>().has_values())) {
    return enc_->has_values();
  }
  /// E's head_dim(), when E has one.
  template <class F = E>
  auto head_dim() const -> decltype(index_t(std::declval<F const&>().head_dim())) {
    return enc_->head_dim();
  }
  /// E's make_gradients().
  gradients make_gradients() const { return posenc::make_gradients(*enc_); }
  /// E's check_gradients().
  void check_gradients(char const* where, gradients const& g) const {
    posenc::detail::check_encoder_gradients(where, *enc_, g);
  }
  /// E's bias_row_backward, when E has one.
  template <class U, class F = E>
  auto bias_row_backward(index_t head, index_t q_pos, index_t k_first, index_t count, U const* dbias,
                         gradients& g) const noexcept
      -> decltype(std::declval<F const&>().bias_row_backward(head, q_pos, k_first, count, dbias, g)) {
    return enc_->bias_row_backward(head, q_pos, k_first, count, dbias, g);
  }
  /// E's score_row_backward (Shaw), when E has one.
  template <class U, class F = E>
  auto score_row_backward(U const* q, index_t q_pos, index_t k_first, index_t count, U scale, U const* dscore, U* dq,
                          gradients& g) const noexcept
      -> decltype(std::declval<F const&>().score_row_backward(q, q_pos, k_first, count, scale, dscore, dq, g)) {
    return enc_->score_row_backward(q, q_pos, k_first, count, scale, dscore, dq, g);
  }
  /// E's value_row_backward (Shaw), when E has one.
  template <class U, class F = E>
  auto value_row_backward(U const* p, U const* dout, index_t q_pos, index_t k_first, index_t count, U* dp,
                          gradients& g) const noexcept
      -> decltype(std::declval<F const&>().value_row_backward(p, dout, q_pos, k_first, count, dp, g)) {
    return enc_->value_row_backward(p, dout, q_pos, k_first, count, dp, g);
  }

 private:
  E const* enc_;
};

}  // namespace posenc::distributed::detail

namespace posenc {

/// E's traits without the rotation (already applied).
template <class E>
struct encoder_traits<distributed::detail::rotation_applied<E>> {
  static constexpr bool adds_to_embeddings = encoder_traits<E>::adds_to_embeddings;
  static constexpr bool rotates_queries_keys = false;
  static constexpr bool biases_scores = encoder_traits<E>::biases_scores;
  static constexpr bool relative_key_value = encoder_traits<E>::relative_key_value;
  static constexpr bool is_relative = encoder_traits<E>::is_relative;
};

}  // namespace posenc
