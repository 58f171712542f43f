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

/// True when K or V rows of storage type S are widened two vectors at a time
/// in an order of their own (simd::widen_pair_permutes_v: bfloat16 with
/// AVX-512, one shift or mask per 16 values instead of a cross-lane zero
/// extension and a shift). The row micro-kernels take that form for one row
/// per kv head (NG == 1), putting q, or the output, in the pair order once per
/// 16 keys or per step; with several rows the permutes cost more than the
/// widening saves (GQA 32 / 8: 1.6 against 1.4 ms, docs/performance-log.md).
template <class T, class A, class S>
inline constexpr bool pairs_permuted_v = [] {
  if constexpr (std::is_same_v<T, float> && is_half_storage_v<S>)
    return simd::widen_pair_permutes_v<half_format_of_v<S>, A>;
  else
    return false;
}();

/// 2 x width<T, A> elements of the 16-bit storage type S at p as two batches
/// of float, in simd::load_widen_pair's order.
template <class T, class A, class S>
POSENC_ALWAYS_INLINE void load_stored_pair(S const* p, simd::batch<T, A>& a, simd::batch<T, A>& b) noexcept {
  static_assert(std::is_same_v<T, float> && is_half_storage_v<S>,
                "posenc::fused: load_stored_pair widens 16-bit K and V into float");
  simd::load_widen_pair<half_format_of_v<S>, A>(half_bits(p), a, b);
}

/// Two float batches of consecutive values put into load_stored_pair's order
/// for S (order_pair) and back (unorder_pair).
template <class T, class A, class S>
POSENC_ALWAYS_INLINE void order_pair(simd::batch<T, A>& a, simd::batch<T, A>& b) noexcept {
  simd::pair_order<half_format_of_v<S>, A>(a, b);
}
template <class T, class A, class S>
POSENC_ALWAYS_INLINE void unorder_pair(simd::batch<T, A>& a, simd::batch<T, A>& b) noexcept {
  simd::pair_unorder<half_format_of_v<S>, A>(a, b);
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
