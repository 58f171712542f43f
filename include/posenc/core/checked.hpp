// SPDX-License-Identifier: MIT
// Overflow-checked index_t arithmetic for sizes, offsets and positions.
#pragma once

#include <cstdint>
#include <limits>

#include "posenc/core/error.hpp"
#include "posenc/core/span.hpp"

namespace posenc::detail {

/// a op b in index_t; sets `out` and returns false when the exact result does
/// not fit (then `out` is unspecified). Op is '+', '-' or '*'.
template <char Op>
constexpr bool overflow_free(index_t a, index_t b, index_t& out) noexcept {
#if defined(__GNUC__) || defined(__clang__)
  if constexpr (Op == '+') return !__builtin_add_overflow(a, b, &out);
  if constexpr (Op == '-') return !__builtin_sub_overflow(a, b, &out);
  if constexpr (Op == '*') return !__builtin_mul_overflow(a, b, &out);
#else
  constexpr index_t hi = std::numeric_limits<index_t>::max(), lo = std::numeric_limits<index_t>::min();
  if constexpr (Op == '+') {
    if ((b > 0 && a > hi - b) || (b < 0 && a < lo - b)) return false;
    out = a + b;
    return true;
  }
  if constexpr (Op == '-') {
    if ((b < 0 && a > hi + b) || (b > 0 && a < lo + b)) return false;
    out = a - b;
    return true;
  }
  if constexpr (Op == '*') {
    if (a == 0 || b == 0) {
      out = 0;
      return true;
    }
    // Compare magnitudes in unsigned arithmetic: |a| * |b| <= limit of the sign.
    std::uint64_t const ua = a < 0 ? 0 - static_cast<std::uint64_t>(a) : static_cast<std::uint64_t>(a);
    std::uint64_t const ub = b < 0 ? 0 - static_cast<std::uint64_t>(b) : static_cast<std::uint64_t>(b);
    std::uint64_t const limit = (a < 0) != (b < 0) ? static_cast<std::uint64_t>(hi) + 1 : static_cast<std::uint64_t>(hi);
    if (ua > limit / ub) return false;
    std::uint64_t const m = ua * ub;
    out = (a < 0) != (b < 0) ? (m == limit ? lo : -static_cast<index_t>(m)) : static_cast<index_t>(m);
    return true;
  }
#endif
}

/// Fails with "<where>: <what> is <a> <op> <b>, expected a <kind> that fits index_t (|x| <= 2^63 - 1)".
template <char Op, class... What>
[[noreturn]] void fail_overflow(char const* where, index_t a, index_t b, What const&... what) {
  char const* op = Op == '+' ? " + " : (Op == '-' ? " - " : " x ");
  char const* kind = Op == '+' ? "sum" : (Op == '-' ? "difference" : "product");
  fail(where, what..., " is ", a, op, b, ", expected a ", kind, " that fits index_t (|x| <= ",
       std::numeric_limits<index_t>::max(), ")");
}

/// a * b, or posenc::error naming the expression `what...` (pieces streamed
/// together only on failure, e.g. "q.batch x q.seq") when the product
/// overflows index_t. Every size and offset product of the library goes through here.
template <class... What>
index_t checked_mul(char const* where, index_t a, index_t b, What const&... what) {
  index_t r = 0;
  if (!overflow_free<'*'>(a, b, r)) fail_overflow<'*'>(where, a, b, what...);
  return r;
}

/// a + b, or posenc::error naming `what...` when the sum overflows index_t.
template <class... What>
index_t checked_add(char const* where, index_t a, index_t b, What const&... what) {
  index_t r = 0;
  if (!overflow_free<'+'>(a, b, r)) fail_overflow<'+'>(where, a, b, what...);
  return r;
}

/// a - b, or posenc::error naming `what...` when the difference overflows index_t.
template <class... What>
index_t checked_sub(char const* where, index_t a, index_t b, What const&... what) {
  index_t r = 0;
  if (!overflow_free<'-'>(a, b, r)) fail_overflow<'-'>(where, a, b, what...);
  return r;
}

/// a * b modulo 2^64, without undefined behaviour: for helpers that cannot
/// throw (make_bshd, make_mask) and whose result the checks reject later.
constexpr index_t wrapping_mul(index_t a, index_t b) noexcept {
  return static_cast<index_t>(static_cast<std::uint64_t>(a) * static_cast<std::uint64_t>(b));
}

/// Largest element offset of a strided dimension: (extent - 1) * |stride|,
/// 0 for an extent <= 1; posenc::error naming `what...` on overflow.
template <class... What>
index_t checked_span_of(char const* where, index_t extent, index_t stride, What const&... what) {
  if (extent <= 1) return 0;
  index_t const magnitude = stride < 0 ? checked_sub(where, 0, stride, what...) : stride;
  return checked_mul(where, extent - 1, magnitude, what...);
}

}  // namespace posenc::detail
