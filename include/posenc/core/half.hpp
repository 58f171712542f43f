// SPDX-License-Identifier: MIT
// 16-bit storage element types (Eigen::half, Eigen::bfloat16): their format and one-element conversions.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "posenc/core/eigen.hpp"
#include "posenc/core/simd.hpp"

namespace posenc {

/// True for the 16-bit element types K and V (and a kv_cache) may be stored
/// in: Eigen::half (IEEE binary16) and Eigen::bfloat16. Compute stays float.
template <class S>
inline constexpr bool is_half_storage_v =
    std::is_same_v<std::remove_const_t<S>, Eigen::half> || std::is_same_v<std::remove_const_t<S>, Eigen::bfloat16>;

namespace detail {

/// The simd::half_format of a 16-bit storage type S.
template <class S>
inline constexpr simd::half_format half_format_of_v = std::is_same_v<std::remove_const_t<S>, Eigen::bfloat16>
                                                          ? simd::half_format::bfloat16
                                                          : simd::half_format::binary16;

/// The raw bits of a 16-bit storage pointer, for simd::load_widen / store_narrow.
template <class S>
inline std::uint16_t const* half_bits(S const* p) noexcept {
  static_assert(sizeof(S) == 2, "posenc::detail::half_bits: a 16-bit storage type");
  return reinterpret_cast<std::uint16_t const*>(p);
}

/// One stored element as T: unchanged for T itself, widened (exactly) for a 16-bit type.
template <class T, class S>
inline T stored_value(S x) noexcept {
  if constexpr (is_half_storage_v<S>) {
    return static_cast<T>(simd::widen<half_format_of_v<S>>(Eigen::numext::bit_cast<std::uint16_t>(x)));
  } else {
    return static_cast<T>(x);
  }
}

/// `x` as storage type S: unchanged for float or double, rounded once to
/// nearest even for a 16-bit type (simd::narrow).
template <class S>
inline S to_storage(float x) noexcept {
  if constexpr (is_half_storage_v<S>) {
    return Eigen::numext::bit_cast<S>(simd::narrow<half_format_of_v<S>>(x));
  } else {
    return static_cast<S>(x);
  }
}

/// A double `x` rounded once to nearest even into the 16-bit type S. Through
/// float with round-to-odd: an inexact float conversion keeps an odd last bit,
/// and float has 24 significand bits >= 11 + 2 (binary16) and >= 8 + 2
/// (bfloat16), so the second rounding sees the sticky bit and never rounds a
/// second time (Boldo and Melquiond, "Emulation of FMA and correctly rounded
/// sums: proved algorithms using rounding to odd", 2008).
template <class S>
inline S round_double_to_storage(double x) noexcept {
  static_assert(is_half_storage_v<S>, "posenc::detail::round_double_to_storage: S is a 16-bit type");
  float f = static_cast<float>(x);
  if (std::isfinite(x) && std::isfinite(f) && static_cast<double>(f) != x) {
    auto u = Eigen::numext::bit_cast<std::uint32_t>(f);
    if ((u & 1u) == 0) {  // inexact and even: step to the odd neighbour on x's side
      bool const away = std::abs(x) > std::abs(static_cast<double>(f));
      u = away ? u + 1 : u - 1;
      f = Eigen::numext::bit_cast<float>(u);
    }
  }
  return to_storage<S>(f);
}

/// A computed value x of T as stored in D: x itself when D is T, else
/// (float x, 16-bit D) rounded once to nearest even.
template <class D, class T>
inline D to_output(T x) noexcept {
  if constexpr (std::is_same_v<D, T>) {
    return x;
  } else {
    static_assert(std::is_same_v<T, float> && is_half_storage_v<D>,
                  "posenc::detail::to_output: D is T, or a 16-bit type with float T");
    return to_storage<D>(x);
  }
}

/// Copies n stored elements into T (widening 16-bit ones).
template <class T, class S>
inline void widen_row(S const* src, index_t n, T* dst) noexcept {
  for (index_t d = 0; d < n; ++d) dst[d] = stored_value<T>(src[d]);
}

}  // namespace detail
}  // namespace posenc
