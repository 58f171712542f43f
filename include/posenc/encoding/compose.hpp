// SPDX-License-Identifier: MIT
// compose<E...>: several encoders acting together (learned + T5 bias, RoPE + ALiBi, ...).
#pragma once

#include <algorithm>
#include <string>
#include <tuple>
#include <utility>

#include "posenc/encoding/traits.hpp"

namespace posenc {

/// Encoders E... applied together. Where it acts is the OR of the parts,
/// `is_relative` the AND; `max_positions()` the smallest non-zero of the parts.
/// Each hook forwards to every part that has it, in order: embeddings get
/// every additive encoding, rotations apply one after the other, biases and
/// Shaw terms add up.
template <class... E>
class compose {
  static_assert(sizeof...(E) >= 1, "posenc::compose: give at least one encoder");
  static_assert(!(detail::has_memory_length<E>::value || ...),
                "posenc::compose: a part shifts the queries and cuts the memory (transformer_xl), which a "
                "composition cannot forward; pass that encoder to attention alone");

 public:
  explicit compose(E... parts) : parts_(std::move(parts)...) {
    // The parts never change after this (parts() is const): their rotation is known once, so that
    // every cache check of a decode step compares without building it again.
    if constexpr ((rotates_queries_keys_v<E> || ...)) rotation_ = make_rotation_identity();
  }

  std::tuple<E...> const& parts() const noexcept { return parts_; }
  template <std::size_t I>
  auto const& get() const noexcept { return std::get<I>(parts_); }

  /// `compose(part0 ..., part1 ...)`: every part's identity (identity_of), in order.
  encoder_identity identity() const {
    encoder_identity id("compose");
    for_each_indexed([&](auto const& p, auto i) {
      std::string const name = "part" + std::to_string(decltype(i)::value);
      id.add(name.c_str(), posenc::identity_of(p));
    });
    return id;
  }

  /// The identity of what rotates queries and keys: the rotating part's own
  /// rotation identity when there is one (so a cache filled through RoPE +
  /// ALiBi serves RoPE + another ALiBi, or RoPE alone), else `compose(...)`
  /// of the rotating parts only, by their index among all parts. Known from
  /// construction (empty when no part rotates).
  encoder_identity const& rotation_identity() const noexcept { return rotation_; }

 private:
  encoder_identity make_rotation_identity() const {
    constexpr int rotating = (0 + ... + (rotates_queries_keys_v<E> ? 1 : 0));
    encoder_identity id("compose");
    for_each_indexed([&](auto const& p, auto i) {
      if constexpr (rotates_queries_keys_v<std::decay_t<decltype(p)>>) {
        if constexpr (rotating == 1) {
          (void)i;
          id = posenc::rotation_identity_of(p);
        } else {
          std::string const name = "part" + std::to_string(decltype(i)::value);
          id.add(name.c_str(), posenc::rotation_identity_of(p));
        }
      }
    });
    return id;
  }

 public:
  index_t max_positions() const noexcept {
    index_t m = 0;
    std::apply([&](auto const&... p) { ((m = pick(m, p.max_positions())), ...); }, parts_);
    return m;
  }

  template <class T>
  void add_to(token_view<T> x, position_span pos) const {
    for_each([&](auto const& p) {
      if constexpr (adds_to_embeddings_v<std::decay_t<decltype(p)>>) p.add_to(x, pos);
    });
  }

  template <class T>
  void rotate(view<T> x, position_span pos, index_t length) const {
    for_each([&](auto const& p) {
      if constexpr (rotates_queries_keys_v<std::decay_t<decltype(p)>>) p.rotate(x, pos, length);
    });
  }

  /// True when every rotating part reports reserved_for(length) (see
  /// rope::reserved_for); false when one of them has no such member.
  bool reserved_for(index_t length) const {
    bool all = true;
    for_each([&](auto const& p) {
      using P = std::decay_t<decltype(p)>;
      if constexpr (rotates_queries_keys_v<P>) all = all && detail::rotation_reserved(p, length);
    });
    return all;
  }

  template <class T>
  void bias_row(index_t head, index_t q_pos, index_t k_pos_first, index_t count, T* out) const noexcept {
    for_each([&](auto const& p) {
      if constexpr (biases_scores_v<std::decay_t<decltype(p)>>) p.bias_row(head, q_pos, k_pos_first, count, out);
    });
  }

  /// True when every biasing part reports shift_invariant() (the sum of
  /// functions of k_pos - q_pos is one); false when one of them does not.
  bool shift_invariant() const noexcept {
    bool all = true;
    for_each([&](auto const& p) {
      using P = std::decay_t<decltype(p)>;
      if constexpr (biases_scores_v<P>) all = all && detail::bias_shift_invariant(p);
    });
    return all;
  }

  /// Head count the biasing parts were built for (0 = any); they must agree.
  index_t heads() const noexcept {
    index_t h = 0;
    for_each([&](auto const& p) {
      if constexpr (biases_scores_v<std::decay_t<decltype(p)>>) {
        if (h == 0) h = p.heads();
      }
    });
    return h;
  }

  template <class T>
  void score_row(T const* q, index_t q_pos, index_t k_pos_first, index_t count, T scale,
                 T* out) const noexcept {
    for_each([&](auto const& p) {
      if constexpr (relative_key_value_v<std::decay_t<decltype(p)>>)
        p.score_row(q, q_pos, k_pos_first, count, scale, out);
    });
  }

  template <class T>
  void value_row(T const* prob, index_t q_pos, index_t k_pos_first, index_t count, T* out) const noexcept {
    for_each([&](auto const& p) {
      if constexpr (relative_key_value_v<std::decay_t<decltype(p)>>) {
        if (p.has_values()) p.value_row(prob, q_pos, k_pos_first, count, out);
      }
    });
  }

  bool has_values() const noexcept {
    bool any = false;
    for_each([&](auto const& p) {
      if constexpr (relative_key_value_v<std::decay_t<decltype(p)>>) any = any || p.has_values();
    });
    return any;
  }

  /// head_dim of the first relative_key_value part (0 when none).
  index_t head_dim() const noexcept {
    index_t d = 0;
    for_each([&](auto const& p) {
      if constexpr (relative_key_value_v<std::decay_t<decltype(p)>>) {
        if (d == 0) d = p.head_dim();
      }
    });
    return d;
  }

  // --- backward (hooks documented in posenc/encoding/traits.hpp) -----------

  /// The parts' gradients, one per part in order (`no_gradients` for a part
  /// without parameters): `grads.get<I>()` is part I's. for_each_tensor visits
  /// part 0's tensors, then part 1's, ..., each with the part's own names
  /// (f(name, tensor), as the part's own for_each_tensor passes them; a part
  /// without parameters passes nothing).
  struct gradients {
    std::tuple<encoder_gradients_t<E>...> parts;
    template <std::size_t I>
    auto& get() noexcept {
      return std::get<I>(parts);
    }
    template <std::size_t I>
    auto const& get() const noexcept {
      return std::get<I>(parts);
    }
    void set_zero() {
      std::apply([](auto&... g) { (g.set_zero(), ...); }, parts);
    }
    /// Throws unless every part of o has the shapes of this one's.
    void check_same_shape(char const* where, gradients const& o) const {
      check_parts(where, o, std::index_sequence_for<E...>{});
    }
    /// Adds o part by part (throws first, before any part is added, when a shape differs).
    gradients& operator+=(gradients const& o) {
      check_same_shape("posenc::compose::gradients::operator+=", o);
      add(o, std::index_sequence_for<E...>{});
      return *this;
    }
    /// Each part's for_each_tensor(f), in part order (see encoder_traits).
    template <class F>
    void for_each_tensor(F&& f) {
      std::apply([&f](auto&... g) { (g.for_each_tensor(f), ...); }, parts);
    }
    template <class F>
    void for_each_tensor(F&& f) const {
      std::apply([&f](auto const&... g) { (g.for_each_tensor(f), ...); }, parts);
    }

   private:
    template <std::size_t... I>
    void check_parts(char const* where, gradients const& o, std::index_sequence<I...>) const {
      (detail::check_same_encoder_gradients(where, std::get<I>(parts), std::get<I>(o.parts)), ...);
    }
    template <std::size_t... I>
    void add(gradients const& o, std::index_sequence<I...>) {
      ((std::get<I>(parts) += std::get<I>(o.parts)), ...);
    }
  };

  /// Each part's make_gradients(), in order.
  gradients make_gradients() const {
    return std::apply([](auto const&... p) { return gradients{{posenc::make_gradients(p)...}}; }, parts_);
  }
  /// Each part's check_gradients.
  void check_gradients(char const* where, gradients const& g) const {
    for_each_indexed([&](auto const& p, auto i) { detail::check_encoder_gradients(where, p, g.template get<decltype(i)::value>()); });
  }

  /// Gradients of the additive parts, each into its own slot.
  template <class T>
  void add_to_backward(token_view<const T> dx, position_span pos, gradients& g) const {
    for_each_indexed([&](auto const& p, auto i) {
      if constexpr (adds_to_embeddings_v<std::decay_t<decltype(p)>>) p.add_to_backward(dx, pos, g.template get<decltype(i)::value>());
    });
  }

  /// The transpose of rotate: each rotating part's transpose, last part first.
  template <class T>
  void rotate_transpose(view<T> x, position_span pos, index_t length) const {
    reverse_transpose(x, pos, length, std::index_sequence_for<E...>{});
  }

  template <class T>
  void bias_row_backward(index_t head, index_t q_pos, index_t k_pos_first, index_t count, T const* dbias,
                         gradients& g) const noexcept {
    for_each_indexed([&](auto const& p, auto i) {
      if constexpr (biases_scores_v<std::decay_t<decltype(p)>>)
        p.bias_row_backward(head, q_pos, k_pos_first, count, dbias, g.template get<decltype(i)::value>());
    });
  }

  template <class T>
  void score_row_backward(T const* q, index_t q_pos, index_t k_pos_first, index_t count, T scale, T const* dscore,
                          T* dq, gradients& g) const noexcept {
    for_each_indexed([&](auto const& p, auto i) {
      if constexpr (relative_key_value_v<std::decay_t<decltype(p)>>)
        p.score_row_backward(q, q_pos, k_pos_first, count, scale, dscore, dq, g.template get<decltype(i)::value>());
    });
  }

  template <class T>
  void value_row_backward(T const* prob, T const* dout, index_t q_pos, index_t k_pos_first, index_t count, T* dp,
                          gradients& g) const noexcept {
    for_each_indexed([&](auto const& p, auto i) {
      if constexpr (relative_key_value_v<std::decay_t<decltype(p)>>) {
        if (p.has_values()) p.value_row_backward(prob, dout, q_pos, k_pos_first, count, dp, g.template get<decltype(i)::value>());
      }
    });
  }

 private:
  template <class F, std::size_t... I>
  void for_each_indexed_impl(F& f, std::index_sequence<I...>) const {
    (f(std::get<I>(parts_), std::integral_constant<std::size_t, I>{}), ...);
  }
  /// f(part, integral_constant<I>) for each part in order.
  template <class F>
  void for_each_indexed(F&& f) const {
    for_each_indexed_impl(f, std::index_sequence_for<E...>{});
  }
  template <class T, std::size_t... I>
  void reverse_transpose(view<T> x, position_span pos, index_t length, std::index_sequence<I...>) const {
    constexpr std::size_t n = sizeof...(E);
    auto one = [&](auto const& p) {
      if constexpr (rotates_queries_keys_v<std::decay_t<decltype(p)>>) p.rotate_transpose(x, pos, length);
    };
    (one(std::get<n - 1 - I>(parts_)), ...);
  }

  static index_t pick(index_t a, index_t b) noexcept {
    if (a == 0) return b;
    if (b == 0) return a;
    return std::min(a, b);
  }
  template <class F>
  void for_each(F&& f) const {
    std::apply([&](auto const&... p) { (f(p), ...); }, parts_);
  }

  std::tuple<E...> parts_;
  encoder_identity rotation_;  // rotation_identity(), of the rotating parts
};

template <class... E>
compose(E...) -> compose<E...>;

template <class... E>
struct encoder_traits<compose<E...>> {
  static constexpr bool adds_to_embeddings = (adds_to_embeddings_v<E> || ...);
  static constexpr bool rotates_queries_keys = (rotates_queries_keys_v<E> || ...);
  static constexpr bool biases_scores = (biases_scores_v<E> || ...);
  static constexpr bool relative_key_value = (relative_key_value_v<E> || ...);
  static constexpr bool is_relative = (is_relative_v<E> && ...);
};

namespace detail {
/// compose<E...> has its backward when every part has its own.
template <class... E, class T>
struct encoder_backward<compose<E...>, T> {
  static constexpr backward_problem problem = [] {
    backward_problem first = backward_problem::none;
    ((first = first != backward_problem::none ? first : encoder_backward_problem<E, T>()), ...);
    return first;
  }();
};

/// compose<E...> keeps the encoder contract when every part keeps it for its
/// own traits; the first part that does not names the problem.
template <class... E, class T>
struct encoder_contract<compose<E...>, T> {
  static constexpr contract_problem problem = [] {
    contract_problem first = contract_problem::none;
    ((first = first != contract_problem::none ? first : encoder_contract_problem<E, T>()), ...);
    return first;
  }();
};
}  // namespace detail

}  // namespace posenc
