// SPDX-License-Identifier: MIT
// none: the identity encoder. Attention with it is permutation-equivariant.
#pragma once

#include "posenc/encoding/traits.hpp"

namespace posenc {

/// The encoder that encodes nothing: no hook, any position.
struct none {
  constexpr index_t max_positions() const noexcept { return 0; }
  /// `none()`: no parameter.
  encoder_identity identity() const { return encoder_identity("none"); }
};

template <>
struct encoder_traits<none> {
  static constexpr bool adds_to_embeddings = false, rotates_queries_keys = false;
  static constexpr bool biases_scores = false, relative_key_value = false;
  // Scores do not depend on positions at all, so trivially only on p_i - p_j.
  static constexpr bool is_relative = true;
};

}  // namespace posenc
