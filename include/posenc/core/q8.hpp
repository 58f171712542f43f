// SPDX-License-Identifier: MIT
// 8-bit block storage (q8_block): 32 consecutive values sharing one float16 scale; quantize and widen.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "posenc/core/half.hpp"
#include "posenc/core/span.hpp"

namespace posenc {

/// Values per 8-bit block.
inline constexpr index_t q8_block_values = 32;

/// 32 consecutive values (along the head dimension) stored as `scale * q[i]`:
/// a float16 scale and 32 signed bytes in [-127, 127], 34 bytes, the layout
/// of ggml's q8_0 block (docs/formulas.md 7.1). A widened value
/// `float(scale) * q[i]` is exact in float (11 + 7 significand bits).
struct q8_block {
  Eigen::half scale;
  std::int8_t q[q8_block_values];
};
static_assert(sizeof(q8_block) == 34, "posenc::q8_block: 2 bytes of scale and 32 of values, no padding");

/// Blocks that hold n values: the last one partial when n is not a multiple of 32.
constexpr index_t q8_blocks(index_t n) noexcept { return (n + q8_block_values - 1) / q8_block_values; }

/// Why quantize_q8 rejected its input.
enum class q8_reject {
  none,        ///< stored
  non_finite,  ///< a NaN or an infinity: 8 bits have no code for it
  too_large,   ///< |x| / 127 past float16's largest finite value (|x| > 65504 x 127, about 8.3e6)
};

/// What quantize_q8 did: `reason` none, or why it stored nothing and the
/// index of the first value concerned (`at`).
struct q8_result {
  q8_reject reason = q8_reject::none;
  index_t at = -1;
  explicit operator bool() const noexcept { return reason == q8_reject::none; }
};

namespace detail {
/// The float16 scale of a block whose largest magnitude is `amax`: amax / 127
/// divided in float, rounded once to nearest even into float16.
inline Eigen::half q8_scale(float amax) noexcept { return to_storage<Eigen::half>(amax / 127.0f); }
}  // namespace detail

/// Quantizes x[0 .. n) into q8_blocks(n) blocks at `out` (docs/formulas.md 7.1):
/// - each block's scale s = float16(max|x| / 127) (the division in float, one
///   rounding to nearest even into float16);
/// - q[i] = x[i] / s rounded to nearest, ties to even (the quotient taken in
///   double, where it is exact enough that only true ties are ties), clamped
///   to [-127, 127] (a value can pass 127.5 s only by the scale's rounding);
/// - a block of zeros (or of values so small that s rounds to 0) stores
///   scale 0 and q 0;
/// - a partial last block (n not a multiple of 32) takes its scale from its
///   own values and stores q 0 past them.
/// So |x[i] - s q[i]| <= s / 2 when s is a normal float16 (max|x| >= 127 x
/// 2^-14, about 0.0078), and <= max(s / 2, 127 x 2^-25) (127 x 2^-25 is
/// about 3.8e-6) below that, where s is subnormal or 0 (docs/formulas.md 7.1
/// derives both). A NaN, an
/// infinity or a value too large for the float16 scale is rejected before
/// anything is written: the result names the first such value.
inline q8_result quantize_q8(float const* x, index_t n, q8_block* out) noexcept {
  for (index_t i = 0; i < n; ++i) {  // a block's scale overflows exactly when one of its values' would
    if (!std::isfinite(x[i])) return {q8_reject::non_finite, i};
    if (!std::isfinite(static_cast<float>(detail::q8_scale(std::fabs(x[i]))))) return {q8_reject::too_large, i};
  }
  for (index_t b = 0; b * q8_block_values < n; ++b) {
    index_t const first = b * q8_block_values, end = first + q8_block_values < n ? first + q8_block_values : n;
    float amax = 0.0f;
    for (index_t i = first; i < end; ++i) amax = std::fmax(amax, std::fabs(x[i]));
    q8_block& blk = out[b];
    blk.scale = detail::q8_scale(amax);
    double const s = static_cast<double>(detail::stored_value<float>(blk.scale));
    std::memset(blk.q, 0, sizeof blk.q);
    if (s == 0.0) continue;
    for (index_t i = first; i < end; ++i) {
      double const r = std::nearbyint(static_cast<double>(x[i]) / s);  // the default mode: to nearest, ties to even
      blk.q[i - first] = static_cast<std::int8_t>(r > 127.0 ? 127.0 : r < -127.0 ? -127.0 : r);
    }
  }
  return {};
}

/// Widens n values from q8_blocks(n) blocks: x[i] = float(scale) * q[i], exact.
inline void dequantize_q8(q8_block const* blocks, index_t n, float* x) noexcept {
  for (index_t i = 0; i < n; ++i) {
    q8_block const& blk = blocks[i / q8_block_values];
    x[i] = detail::stored_value<float>(blk.scale) * static_cast<float>(blk.q[i % q8_block_values]);
  }
}

}  // namespace posenc
