// SPDX-License-Identifier: MIT
// path::fused, room 2b: loads of stored K and V elements: float and double as they are, 16-bit widened in registers.
#pragma once

// What this room holds: the one load the micro-kernels use for K and V rows
// whose element type S may differ from the compute type T. S == T is a plain
// simd::load (the code the float and double kernels always ran); S a 16-bit
// type (Eigen::half, Eigen::bfloat16) loads width 16-bit values and widens
// them in registers with simd::load_widen: nothing is copied to float first.
// `widen_tile` is the lane kernel's packing step for 16-bit K and V: one key
// tile (never the cache) widened into float scratch once, for every query
// block of a work item.
// May include: core/ only.

#include <cstdint>
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

/// Widens `rows` rows of `cols` 16-bit elements of S (`ld` apart) into T rows
/// `ldd` apart at dst: one simd::load_widen per vector, the tail partial.
template <class T, class A, class S>
void widen_tile(S const* src, index_t ld, index_t rows, index_t cols, T* dst, index_t ldd) noexcept {
  static_assert(std::is_same_v<T, float> && is_half_storage_v<S>,
                "posenc::fused: widen_tile widens 16-bit K and V into float");
  constexpr simd::half_format f_v = half_format_of_v<S>;
  constexpr index_t w_v = simd::width<T, A>;
  for (index_t j = 0; j < rows; ++j) {
    std::uint16_t const* r = half_bits(src + j * ld);
    T* o = dst + j * ldd;
    index_t d = 0;
    for (; d + w_v <= cols; d += w_v) simd::store(o + d, simd::load_widen<f_v, A>(r + d));
    if (d < cols) simd::store_partial(o + d, simd::load_widen_partial<f_v, A>(r + d, cols - d), cols - d);
  }
}

}  // namespace posenc::detail::fused
