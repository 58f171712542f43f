// SPDX-License-Identifier: MIT
// path::fused, room 2b: loads of stored K and V elements: float and double as they are, 16-bit widened in registers.
#pragma once

// What this room holds: the one load the micro-kernels use for K and V rows
// whose element type S may differ from the compute type T. S == T is a plain
// simd::load (the code the float and double kernels always ran); S a 16-bit
// type (Eigen::half, Eigen::bfloat16) loads width 16-bit values and widens
// them in registers with simd::load_widen: nothing is copied to float first.
// May include: core/ only.

#include <type_traits>

#include "posenc/core/half.hpp"
#include "posenc/core/simd.hpp"
#include "posenc/core/span.hpp"

namespace posenc::detail::fused {

/// width<T, A> elements of storage type S at p (unaligned) as a batch of T.
template <class T, class A, class S>
POSENC_ALWAYS_INLINE simd::batch<T, A> load_stored(S const* p) noexcept {
  if constexpr (std::is_same_v<S, T>) {
    return simd::load<T, A>(p);
  } else {
    static_assert(std::is_same_v<T, float> && is_half_storage_v<S>,
                  "posenc::fused: K and V are stored as T or as a 16-bit type with float compute");
    return simd::load_widen<half_format_of_v<S>, A>(half_bits(p));
  }
}

}  // namespace posenc::detail::fused
