// SPDX-License-Identifier: MIT
// path::fused, room 6: RoPE inside the tiles: query rows and key tiles rotated as they are loaded.
#pragma once

// What this room holds: the two calls through which the kernels rotate what
// they load when the entry point hands them `rotation_ids` (an encoder whose
// rotation is reserved for the call's length, see attention/plan.hpp). Without
// ids, q and k arrive rotated and these functions are not called.
// May include: attention/plan.hpp, encoding/, core/.

#include <algorithm>
#include <type_traits>

#include "posenc/attention/plan.hpp"
#include "posenc/core/half.hpp"
#include "posenc/core/positions.hpp"
#include "posenc/core/view.hpp"
#include "posenc/encoding/traits.hpp"

namespace posenc::detail::fused {

/// Copies key rows [t0, t0 + nk) of (b, hk) into `tile` (nk, head_dim) and
/// rotates them at their position ids. Keys stored as a 16-bit KV are widened
/// into the tile, rotated in float and rounded once back to KV (the values the
/// rotated copies of the other paths hold).
template <class T, class KV, class E>
void rotate_key_tile(attention_plan<T> const& p, view<const KV> k, E const& enc, rotation_ids const& rot, index_t b,
                     index_t hk, index_t t0, index_t nk, T* tile) noexcept {
  index_t const head_dim = p.head_dim;
  for (index_t j = 0; j < nk; ++j) {
    KV const* src = k.ptr(b, t0 + j, hk);
    if constexpr (std::is_same_v<KV, T>)
      std::copy(src, src + head_dim, tile + j * head_dim);
    else
      widen_row(src, head_dim, tile + j * head_dim);
  }
  if constexpr (encoder_traits<E>::rotates_queries_keys) {
    enc.rotate(make_bshd(tile, 1, nk, 1, head_dim), position_span::ids(rot.k + b * p.k_len + t0, 1, nk), rot.length);
    if constexpr (!std::is_same_v<KV, T>) {
      // Rotated 16-bit keys are rounded once to KV, as every path and a 16-bit cache store them.
      for (index_t n = 0; n < nk * head_dim; ++n) tile[n] = stored_value<T>(to_storage<KV>(tile[n]));
    }
  } else {
    (void)enc, (void)rot;
  }
}

/// Rotates n query rows gathered in `rows` (n, head_dim) at position ids `ids`.
template <class T, class E>
void rotate_query_rows(attention_plan<T> const& p, E const& enc, rotation_ids const& rot, index_t const* ids,
                       index_t n, T* rows) noexcept {
  if constexpr (encoder_traits<E>::rotates_queries_keys) {
    if (n > 0) enc.rotate(make_bshd(rows, 1, n, 1, p.head_dim), position_span::ids(ids, 1, n), rot.length);
  } else {
    (void)p, (void)enc, (void)rot, (void)ids, (void)n, (void)rows;
  }
}

}  // namespace posenc::detail::fused
