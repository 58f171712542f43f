// SPDX-License-Identifier: MIT
// The one place that knows the xsimd version and the ISA: batches, loads, reductions, exp, pair swaps, 16-bit floats.
//
// Supports xsimd 8.1 .. 14; tested with Debian's xsimd 8.1, and against the 9.x
// names through tests/support/xsimd9. The version branches follow xsimd's
// Changelog.rst: 9.0 renamed hadd to reduce_add and added reduce_max; 13.0 spells
// a constant batch batch_constant<U, A, V...> instead of batch_constant<batch<U, A>, V...>.
// Everything else used here (load/store, fma, exp, select, swizzle, Arch::name,
// Arch::alignment, register_type) is spelled the same from 8.1 to 14.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

// GCC before 12.3 reports false -Wuninitialized / -Wmaybe-uninitialized inside its
// own AVX-512 intrinsics headers (GCC bug 105593) wherever they are inlined. The
// intrinsics headers are included here first (through xsimd) with those two
// warnings off, so that a consumer's -Wall -Werror build stays clean; nothing
// else is silenced. core/eigen.hpp does the same for Eigen.
#if defined(__GNUC__) && !defined(__clang__) && (__GNUC__ < 12 || (__GNUC__ == 12 && __GNUC_MINOR__ < 3))
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif
#include <xsimd/xsimd.hpp>
#pragma GCC diagnostic pop
#else
#include <xsimd/xsimd.hpp>
#endif

// The instruction sets the kernels are written and tested for: x86 from SSE2 (x86-64's baseline)
// and AArch64 with NEON (every AArch64 CPU; SVE CPUs run the NEON kernels). Anything else (32-bit
// ARM, whose NEON has no double vectors; AArch64 built with +nosimd; x86 built with -mno-sse2; an
// ISA this xsimd has no kernels for) stops here with one sentence: the missing include below is a
// fatal error, so no cascade of errors from the headers that follow.
#if !(XSIMD_WITH_SSE2 || XSIMD_WITH_NEON64)
#error "posenc: this target has no vector instruction set posenc supports (x86 with SSE2 or later, or AArch64 with NEON); build for one of them: x86-64 (any -march), or AArch64 with -march=armv8-a or later, without +nosimd (docs/integration.md, Platforms)"
#include "posenc: no supported instruction set, see the error above"
#endif

#include "posenc/core/span.hpp"

/// 1 when xsimd has reduce_add and reduce_max (9.0 and later; hadd before).
#define POSENC_XSIMD_HAS_REDUCE (XSIMD_VERSION_MAJOR >= 9)
/// 1 when xsimd spells a constant batch batch_constant<U, A, V...> (13.0 and later;
/// batch_constant<batch<U, A>, V...> before).
#define POSENC_XSIMD_BATCH_CONSTANT_TYPE_ARCH (XSIMD_VERSION_MAJOR >= 13)

/// Forces inlining of a small kernel whose register-resident state must not
/// be spilled across a call (GCC and Clang; a plain `inline` elsewhere).
#if defined(__GNUC__) || defined(__clang__)
#define POSENC_ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define POSENC_ALWAYS_INLINE inline
#endif

namespace posenc::simd {

/// The instruction set picked at compile time (by -m flags).
using default_arch = xsimd::default_arch;

template <class T, class Arch = default_arch>
using batch = xsimd::batch<T, Arch>;

/// Number of lanes of batch<T, Arch>.
template <class T, class Arch = default_arch>
inline constexpr index_t width = static_cast<index_t>(batch<T, Arch>::size);

/// Name of the instruction set in use ("avx512f", "fma3+avx2", "sse2", ...).
inline constexpr char const* arch_name() noexcept { return default_arch::name(); }

template <class T, class Arch = default_arch>
inline batch<T, Arch> load(T const* p) noexcept {
  return batch<T, Arch>::load_unaligned(p);
}

template <class T, class Arch>
inline void store(T* p, batch<T, Arch> const& b) noexcept {
  b.store_unaligned(p);
}

template <class T, class Arch = default_arch>
inline batch<T, Arch> broadcast(T x) noexcept {
  return batch<T, Arch>(x);
}

/// Loads n < width lanes, the rest zero.
template <class T, class Arch = default_arch>
inline batch<T, Arch> load_partial(T const* p, index_t n) noexcept {
  alignas(Arch::alignment()) T buf[batch<T, Arch>::size] = {};
  for (index_t i = 0; i < n; ++i) buf[i] = p[i];
  return batch<T, Arch>::load_aligned(buf);
}

/// Stores the first n < width lanes.
template <class T, class Arch>
inline void store_partial(T* p, batch<T, Arch> const& b, index_t n) noexcept {
  alignas(Arch::alignment()) T buf[batch<T, Arch>::size];
  b.store_aligned(buf);
  for (index_t i = 0; i < n; ++i) p[i] = buf[i];
}

/// a * b + c, fused where the instruction set has FMA.
/// xsimd 8 has no AVX-512 fma kernel (it falls back to a * b + c, which the
/// compiler may contract either way round), so AVX-512 calls the instruction
/// directly: one rounding, the same result as std::fma.
template <class T, class Arch>
inline batch<T, Arch> fma(batch<T, Arch> const& a, batch<T, Arch> const& b,
                          batch<T, Arch> const& c) noexcept {
#if XSIMD_WITH_AVX512F
  if constexpr (std::is_base_of<xsimd::avx512f, Arch>::value && std::is_same<T, float>::value) {
    return batch<T, Arch>(_mm512_fmadd_ps(a, b, c));
  } else if constexpr (std::is_base_of<xsimd::avx512f, Arch>::value && std::is_same<T, double>::value) {
    return batch<T, Arch>(_mm512_fmadd_pd(a, b, c));
  } else {
    return xsimd::fma(a, b, c);
  }
#else
  return xsimd::fma(a, b, c);
#endif
}

namespace detail {
constexpr bool name_has_fma(char const* s) noexcept {
  for (; *s; ++s)
    if (s[0] == 'f' && s[1] == 'm' && s[2] == 'a') return true;
  return false;
}
}  // namespace detail

/// True when fma<T, Arch> rounds once: x86 with FMA3 or FMA4 (xsimd's "fma3+..." and "fma4"
/// architectures), AVX-512, and AArch64 NEON. False on x86 without FMA (SSE2 .. AVX), where
/// xsimd computes a * b + c with two roundings.
template <class Arch = default_arch>
inline constexpr bool fma_rounds_once = detail::name_has_fma(Arch::name())
#if XSIMD_WITH_AVX512F
                                        || std::is_base_of<xsimd::avx512f, Arch>::value
#endif
#if XSIMD_WITH_NEON64
                                        || std::is_base_of<xsimd::neon64, Arch>::value
#endif
    ;

/// a * b + c for one scalar, rounded as a lane of fma<T, Arch> is: std::fma where the batches
/// fuse (fma_rounds_once), else the product rounded and then the sum. A kernel's scalar tail
/// uses it beside a vector body, so an element's bits do not depend on whether it falls in the
/// body or in the tail (and no call into libm's software fma on x86 without FMA).
template <class Arch = default_arch, class T>
inline T fma_scalar(T a, T b, T c) noexcept {
  if constexpr (fma_rounds_once<Arch>) {
    return std::fma(a, b, c);
  } else {
    // No FMA instruction on this target, so the compiler cannot contract this into one.
    T const p = a * b;
    return p + c;
  }
}

/// x with NaN lanes as 0 and every other lane clamped to [-bound, bound].
template <class T, class Arch>
inline batch<T, Arch> clamp_finite(batch<T, Arch> const& x, T bound) noexcept {
  batch<T, Arch> const b(bound);
  batch<T, Arch> const x0 = xsimd::select(!(x == x), batch<T, Arch>(T(0)), x);  // ordered ==: false for NaN
  return xsimd::min(xsimd::max(x0, -b), b);
}

/// e^x. For double, xsimd's exp turns x / ln 2 into 64-bit integers, which xsimd 8.1 does with a
/// scalar loop on several ISAs (AVX-512 among them): there, NaN, infinities and |x| > 2^63 ln 2
/// would be undefined conversions. The kernel is given x clamped to +-800 (where exp is already 0
/// or Inf) with NaN as 0, and NaN is put back: the same values, defined behaviour.
template <class T, class Arch>
inline batch<T, Arch> exp(batch<T, Arch> const& x) noexcept {
  if constexpr (std::is_same<T, double>::value) {
    batch<T, Arch> const r = xsimd::exp(clamp_finite(x, 800.0));
    return xsimd::select(!(x == x), x, r);
  } else {
    return xsimd::exp(x);
  }
}

template <class T, class Arch>
inline batch<T, Arch> max(batch<T, Arch> const& a, batch<T, Arch> const& b) noexcept {
  return xsimd::max(a, b);
}

/// Lane-wise `cond ? a : b`.
template <class T, class Arch>
inline batch<T, Arch> select(xsimd::batch_bool<T, Arch> const& cond, batch<T, Arch> const& a,
                             batch<T, Arch> const& b) noexcept {
  return xsimd::select(cond, a, b);
}

/// tanh x. For double, through exp's integer conversion as above: x clamped to +-40 (tanh is +-1
/// exactly in double past 19.1) with NaN as 0, and NaN put back.
template <class T, class Arch>
inline batch<T, Arch> tanh(batch<T, Arch> const& x) noexcept {
  if constexpr (std::is_same<T, double>::value) {
    batch<T, Arch> const r = xsimd::tanh(clamp_finite(x, 40.0));
    return xsimd::select(!(x == x), x, r);
  } else {
    return xsimd::tanh(x);
  }
}

namespace detail {
template <class T, class Arch>
inline void transpose_generic(batch<T, Arch>* rows) noexcept {
  constexpr std::size_t n = batch<T, Arch>::size;
  alignas(Arch::alignment()) T buf[n * n];
  alignas(Arch::alignment()) T col[n];
  for (std::size_t r = 0; r < n; ++r) rows[r].store_aligned(buf + r * n);
  for (std::size_t r = 0; r < n; ++r) {
    for (std::size_t c = 0; c < n; ++c) col[c] = buf[c * n + r];
    rows[r] = batch<T, Arch>::load_aligned(col);
  }
}
}  // namespace detail

/// Transposes in place the width x width block whose rows are rows[0 .. width):
/// afterwards rows[i] holds lane i of every row. AVX-512 float: 64 shuffles
/// in registers (in-lane unpack and shuffle, then two rounds of 128-bit block
/// shuffles); other cases go through memory.
template <class T, class Arch>
inline void transpose(batch<T, Arch>* rows) noexcept {
#if defined(__AVX512F__)
  if constexpr (std::is_same<T, float>::value && std::is_base_of<xsimd::avx512f, Arch>::value) {
    __m512 t[16], u[16];
    for (int i = 0; i < 8; ++i) {
      __m512 const a = rows[2 * i], b = rows[2 * i + 1];
      t[2 * i] = _mm512_unpacklo_ps(a, b);
      t[2 * i + 1] = _mm512_unpackhi_ps(a, b);
    }
    for (int i = 0; i < 4; ++i) {
      u[4 * i + 0] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
      u[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
      u[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
      u[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
    }
    for (int base = 0; base < 16; base += 8) {
      for (int i = 0; i < 4; ++i) {
        t[base + i] = _mm512_shuffle_f32x4(u[base + i], u[base + i + 4], 0x88);
        t[base + i + 4] = _mm512_shuffle_f32x4(u[base + i], u[base + i + 4], 0xDD);
      }
    }
    for (int i = 0; i < 8; ++i) {
      rows[i] = batch<T, Arch>(_mm512_shuffle_f32x4(t[i], t[i + 8], 0x88));
      rows[i + 8] = batch<T, Arch>(_mm512_shuffle_f32x4(t[i], t[i + 8], 0xDD));
    }
    return;
  }
#endif
  detail::transpose_generic(rows);
}

/// Architectural vector registers of Arch: 32 with AVX-512 and on AArch64 (v0-v31), else 16.
/// Kernels size their register blocks from it (accumulators + operands must fit).
template <class Arch = default_arch>
inline constexpr int vector_registers =
#if XSIMD_WITH_NEON64
    std::is_base_of<xsimd::neon64, Arch>::value ? 32 :
#endif
    std::is_base_of<xsimd::avx512f, Arch>::value ? 32 : 16;

/// Sum of the lanes.
template <class T, class Arch>
inline T reduce_add(batch<T, Arch> const& b) noexcept {
#if POSENC_XSIMD_HAS_REDUCE
  return xsimd::reduce_add(b);
#else
  return xsimd::hadd(b);
#endif
}

/// Largest lane.
template <class T, class Arch>
inline T reduce_max(batch<T, Arch> const& b) noexcept {
#if POSENC_XSIMD_HAS_REDUCE
  return xsimd::reduce_max(b);
#else
  alignas(Arch::alignment()) T buf[batch<T, Arch>::size];
  b.store_aligned(buf);
  T m = buf[0];
  for (std::size_t i = 1; i < batch<T, Arch>::size; ++i) m = std::max(m, buf[i]);
  return m;
#endif
}

namespace detail {
template <class T>
using index_of = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;

/// xsimd::swizzle with compile-time indices; the one place that knows how
/// batch_constant is spelled in each xsimd version.
template <class T, class Arch, index_of<T>... Idx>
inline batch<T, Arch> swizzle_const(batch<T, Arch> const& b) noexcept {
  using U = index_of<T>;
#if POSENC_XSIMD_BATCH_CONSTANT_TYPE_ARCH
  return xsimd::swizzle(b, xsimd::batch_constant<U, Arch, Idx...>());
#else
  return xsimd::swizzle(b, xsimd::batch_constant<xsimd::batch<U, Arch>, Idx...>());
#endif
}

template <class T, class Arch, std::size_t... I>
inline batch<T, Arch> swap_pairs_impl(batch<T, Arch> const& b, std::index_sequence<I...>) noexcept {
  return swizzle_const<T, Arch, static_cast<index_of<T>>(I ^ 1u)...>(b);
}

template <bool High, class T, class Arch, std::size_t... I>
inline batch<T, Arch> duplicate_half_impl(batch<T, Arch> const& b, std::index_sequence<I...>) noexcept {
  constexpr std::size_t base = High ? sizeof...(I) / 2 : 0;
  return swizzle_const<T, Arch, static_cast<index_of<T>>(base + I / 2)...>(b);
}
}  // namespace detail

/// Each element of one half of b twice, in order: High = false gives
/// [x0, x0, x1, x1, ..., x(W/2-1), x(W/2-1)], High = true the same from x(W/2).
/// (xsimd's zip_lo is not this on every version: on AVX-512 it interleaves
/// within 128-bit lanes in xsimd 8.)
template <bool High, class T, class Arch>
inline batch<T, Arch> duplicate_half(batch<T, Arch> const& b) noexcept {
  return detail::duplicate_half_impl<High>(b, std::make_index_sequence<batch<T, Arch>::size>());
}

/// Makes the compiler treat b as computed in a register: a loaded value that
/// has two uses is then loaded once. (GCC otherwise folds the load into both
/// instructions and reads memory twice; on a memory-bound kernel that costs.)
/// No instruction is emitted.
#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
#define POSENC_VECTOR_REGISTER "+v"
#elif (defined(__GNUC__) || defined(__clang__)) && defined(__aarch64__)
#define POSENC_VECTOR_REGISTER "+w"
#endif
template <class T, class Arch>
inline void keep_in_register(batch<T, Arch>& b) noexcept {
#ifdef POSENC_VECTOR_REGISTER
  typename batch<T, Arch>::register_type r = b;
  __asm__("" : POSENC_VECTOR_REGISTER(r));
  b = batch<T, Arch>(r);
#else
  (void)b;
#endif
}

/// [x0, x1, x2, x3, ...] -> [x1, x0, x3, x2, ...] (the pair swap of interleaved RoPE).
/// On x86 an in-lane shuffle with an immediate (shufps / shufpd) does it:
/// cheaper than the cross-lane index permute a generic swizzle compiles to.
template <class T, class Arch>
inline batch<T, Arch> swap_pairs(batch<T, Arch> const& b) noexcept {
#if XSIMD_WITH_AVX512F
  if constexpr (std::is_base_of<xsimd::avx512f, Arch>::value && std::is_same<T, float>::value)
    return batch<T, Arch>(_mm512_shuffle_ps(b, b, 0xB1));
  if constexpr (std::is_base_of<xsimd::avx512f, Arch>::value && std::is_same<T, double>::value)
    return batch<T, Arch>(_mm512_shuffle_pd(b, b, 0x55));
#endif
#if XSIMD_WITH_AVX
  if constexpr (std::is_base_of<xsimd::avx, Arch>::value && !std::is_base_of<xsimd::avx512f, Arch>::value &&
                std::is_same<T, float>::value)
    return batch<T, Arch>(_mm256_shuffle_ps(b, b, 0xB1));
  if constexpr (std::is_base_of<xsimd::avx, Arch>::value && !std::is_base_of<xsimd::avx512f, Arch>::value &&
                std::is_same<T, double>::value)
    return batch<T, Arch>(_mm256_shuffle_pd(b, b, 0x5));
#endif
#if XSIMD_WITH_SSE2
  if constexpr (std::is_base_of<xsimd::sse2, Arch>::value && !std::is_base_of<xsimd::avx, Arch>::value &&
                !std::is_base_of<xsimd::avx512f, Arch>::value && std::is_same<T, float>::value)
    return batch<T, Arch>(_mm_shuffle_ps(b, b, 0xB1));
  if constexpr (std::is_base_of<xsimd::sse2, Arch>::value && !std::is_base_of<xsimd::avx, Arch>::value &&
                !std::is_base_of<xsimd::avx512f, Arch>::value && std::is_same<T, double>::value)
    return batch<T, Arch>(_mm_shuffle_pd(b, b, 0x1));
#endif
  return detail::swap_pairs_impl(b, std::make_index_sequence<batch<T, Arch>::size>());
}

/// [-1, +1, -1, +1, ...]: multiplies a swapped pair into (-x1, x0, -x3, x2, ...).
template <class T, class Arch = default_arch>
inline batch<T, Arch> alternating_sign() noexcept {
  alignas(Arch::alignment()) T buf[batch<T, Arch>::size];
  for (std::size_t i = 0; i < batch<T, Arch>::size; ++i) buf[i] = (i % 2 == 0) ? T(-1) : T(1);
  return batch<T, Arch>::load_aligned(buf);
}

// ---------------------------------------------------------------------------
// 16-bit storage of float: IEEE binary16 and bfloat16, as their raw bits.
//
// Widening is exact. Narrowing rounds to nearest, ties to even. NaN stays NaN
// (quieted, sign and the top payload bits kept). binary16 overflows to Inf, as
// IEEE rounding does (max 65504; from 65520 up, and Inf itself, give Inf):
// saturating to 65504 would turn an overflow into a plausible finite number
// that a softmax or a cache would carry on silently. Float subnormals narrow
// to binary16 subnormals or zero by the same rounding. bfloat16 has float's
// exponent range and rounds the same way; the one exception: where the target
// has AVX-512 BF16 (`__AVX512BF16__`) the vector stores (full and partial)
// use its instruction, which flushes float subnormals (below 2^-126) to
// signed zero; the scalar narrow() keeps them.
// Partial loads and stores convert like the full-width ones. The scalar
// functions serve where no vector conversion exists (binary16 on SSE2
// without F16C), lane by lane. On AArch64 (NEON) binary16 converts with
// fcvtl / fcvtn and bfloat16 widens with a shift (shll); it narrows with
// bfcvtn where the target has the bfloat16 extension (+bf16, armv8.6-a),
// else with narrow()'s integer rounding on four lanes: the same results
// (FPCR as Linux starts a program: round to nearest even, no flush to zero).
// ---------------------------------------------------------------------------

/// The 16-bit formats a float can be stored in.
enum class half_format { binary16, bfloat16 };

namespace detail {
inline float float_from_bits(std::uint32_t u) noexcept {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
inline std::uint32_t bits_of(float f) noexcept {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
}  // namespace detail

/// The float whose 16-bit encoding in format F is `h` (exact).
template <half_format F>
inline float widen(std::uint16_t h) noexcept {
  if constexpr (F == half_format::bfloat16) {
    return detail::float_from_bits(static_cast<std::uint32_t>(h) << 16);
  } else {
    std::uint32_t const sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
    std::uint32_t const e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f) return detail::float_from_bits(sign | 0x7f800000u | (m << 13));  // Inf, NaN
    if (e == 0) {                                       // zero and subnormals: m * 2^-24, exact
      float const f = static_cast<float>(m) * 5.9604644775390625e-8f;
      return sign ? -f : f;
    }
    return detail::float_from_bits(sign | ((e + 112u) << 23) | (m << 13));  // rebias 15 -> 127
  }
}

/// The 16-bit encoding in format F of `f`, rounded to nearest even (see above).
template <half_format F>
inline std::uint16_t narrow(float f) noexcept {
  std::uint32_t const x = detail::bits_of(f);
  if constexpr (F == half_format::bfloat16) {
    if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);  // quiet NaN
    return static_cast<std::uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
  } else {
    std::uint32_t const sign = (x >> 16) & 0x8000u, a = x & 0x7fffffffu;
    if (a > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // 65520 and up: Inf
    if (a >= 0x38800000u) {  // normal: rebias 127 -> 15, round the 13 dropped bits
      std::uint32_t const r = a - (112u << 23);
      return static_cast<std::uint16_t>(sign | ((r + 0xfffu + ((r >> 13) & 1u)) >> 13));
    }
    // Below 2^-14: adding 0.5 rounds |f| to a multiple of 2^-24 (0.5's ulp), ties to even.
    float const t = detail::float_from_bits(a) + 0.5f;
    return static_cast<std::uint16_t>(sign | (detail::bits_of(t) - 0x3f000000u));
  }
}

/// width<float, Arch> values of format F from p (unaligned), widened to float.
template <half_format F, class Arch = default_arch>
inline batch<float, Arch> load_widen(std::uint16_t const* p) noexcept {
  using B = batch<float, Arch>;
#if defined(__AVX512F__)
  if constexpr (std::is_base_of<xsimd::avx512f, Arch>::value) {
    __m256i const h = _mm256_loadu_si256(reinterpret_cast<__m256i const*>(p));
    if constexpr (F == half_format::binary16) return B(_mm512_cvtph_ps(h));
    else return B(_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)));
  }
#endif
#if defined(__AVX2__)
  if constexpr (std::is_base_of<xsimd::avx2, Arch>::value && !std::is_base_of<xsimd::avx512f, Arch>::value) {
    __m128i const h = _mm_loadu_si128(reinterpret_cast<__m128i const*>(p));
#if defined(__F16C__)
    if constexpr (F == half_format::binary16) return B(_mm256_cvtph_ps(h));
#endif
    if constexpr (F == half_format::bfloat16)
      return B(_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)));
  }
#endif
#if defined(__SSE2__)
  if constexpr (F == half_format::bfloat16 && std::is_base_of<xsimd::sse2, Arch>::value &&
                !std::is_base_of<xsimd::avx, Arch>::value && !std::is_base_of<xsimd::avx512f, Arch>::value) {
    __m128i const h = _mm_loadl_epi64(reinterpret_cast<__m128i const*>(p));
    return B(_mm_castsi128_ps(_mm_unpacklo_epi16(_mm_setzero_si128(), h)));
  }
#endif
#if defined(__aarch64__) && XSIMD_WITH_NEON64
  if constexpr (std::is_base_of<xsimd::neon64, Arch>::value) {
    uint16x4_t const h = vld1_u16(p);
    if constexpr (F == half_format::binary16) return B(vcvt_f32_f16(vreinterpret_f16_u16(h)));  // fcvtl
    else return B(vreinterpretq_f32_u32(vshll_n_u16(h, 16)));                                     // shll #16
  }
#endif
  alignas(Arch::alignment()) float buf[B::size];
  for (std::size_t i = 0; i < B::size; ++i) buf[i] = widen<F>(p[i]);
  return B::load_aligned(buf);
}

/// Narrows b to format F and stores its width<float, Arch> values at p (unaligned).
template <half_format F, class Arch>
inline void store_narrow(std::uint16_t* p, batch<float, Arch> const& b) noexcept {
#if defined(__AVX512F__)
  if constexpr (std::is_base_of<xsimd::avx512f, Arch>::value) {
    if constexpr (F == half_format::binary16) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtps_ph(b, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      return;
    }
#if defined(__AVX512BF16__)
    if constexpr (F == half_format::bfloat16) {
      __m256bh const h = _mm512_cvtneps_pbh(b);
      std::memcpy(p, &h, sizeof h);
      return;
    }
#endif
  }
#endif
#if defined(__AVX2__) && defined(__F16C__)
  if constexpr (F == half_format::binary16 && std::is_base_of<xsimd::avx2, Arch>::value &&
                !std::is_base_of<xsimd::avx512f, Arch>::value) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(b, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    return;
  }
#endif
#if defined(__aarch64__) && XSIMD_WITH_NEON64
  if constexpr (std::is_base_of<xsimd::neon64, Arch>::value) {
    float32x4_t const x = b;
    if constexpr (F == half_format::binary16) {
      // fcvtn: the rounding of FPCR (to nearest even unless a program changes it), NaN quieted
      // with its top payload bits, Inf from 65520 up: narrow()'s results.
      vst1_u16(p, vreinterpret_u16_f16(vcvt_f16_f32(x)));
    } else {
#if defined(__ARM_FEATURE_BF16_VECTOR_ARITHMETIC)
      vst1_u16(p, vreinterpret_u16_bf16(vcvt_bf16_f32(x)));  // bfcvtn (armv8.6-a, or +bf16)
#else
      // narrow()'s integer rounding, four lanes at a time.
      uint32x4_t const u = vreinterpretq_u32_f32(x);
      uint32x4_t const bias = vaddq_u32(vdupq_n_u32(0x7fffu), vandq_u32(vshrq_n_u32(u, 16), vdupq_n_u32(1u)));
      uint16x4_t const rounded = vshrn_n_u32(vaddq_u32(u, bias), 16);
      uint16x4_t const quiet = vorr_u16(vshrn_n_u32(u, 16), vdup_n_u16(0x40u));
      uint16x4_t const is_nan = vmovn_u32(vcgtq_u32(vandq_u32(u, vdupq_n_u32(0x7fffffffu)), vdupq_n_u32(0x7f800000u)));
      vst1_u16(p, vbsl_u16(is_nan, quiet, rounded));
#endif
    }
    return;
  }
#endif
  alignas(Arch::alignment()) float buf[batch<float, Arch>::size];
  b.store_aligned(buf);
  for (std::size_t i = 0; i < batch<float, Arch>::size; ++i) p[i] = narrow<F>(buf[i]);
}

/// True when load_widen_pair hands out its 2 x width values in an order of
/// its own (bfloat16 with AVX-512: even elements, then odd ones), false when
/// it gives two load_widen of consecutive halves. A kernel that sums over the
/// dims (q.k) or adds whole rows (o += p v) may work in that order as long as
/// its other operand is put in the same order (pair_order) and its result back
/// (pair_unorder).
template <half_format F, class Arch = default_arch>
inline constexpr bool widen_pair_permutes_v =
#if defined(__AVX512F__)
    F == half_format::bfloat16 && std::is_base_of<xsimd::avx512f, Arch>::value;
#else
    false;
#endif

/// 2 x width<float, Arch> values of format F from p (unaligned), widened to
/// float as a and b: a = p[0, w), b = p[w, 2w), or, when widen_pair_permutes_v,
/// a = the even elements p[0], p[2], ... and b = the odd ones, each one
/// integer shift or mask of one 64-byte load (load_widen takes a cross-lane
/// zero extension and a shift per 16 values).
template <half_format F, class Arch = default_arch>
POSENC_ALWAYS_INLINE void load_widen_pair(std::uint16_t const* p, batch<float, Arch>& a, batch<float, Arch>& b) noexcept {
#if defined(__AVX512F__)
  if constexpr (widen_pair_permutes_v<F, Arch>) {
    __m512i const x = _mm512_loadu_si512(p);
    a = batch<float, Arch>(_mm512_castsi512_ps(_mm512_slli_epi32(x, 16)));
    b = batch<float, Arch>(_mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32(static_cast<int>(0xffff0000u)))));
    return;
  }
#endif
  a = load_widen<F, Arch>(p);
  b = load_widen<F, Arch>(p + batch<float, Arch>::size);
}

/// Puts two float batches holding 2 x width consecutive values (a the first
/// half) into load_widen_pair's order (nothing when it keeps their order).
template <half_format F, class Arch = default_arch>
POSENC_ALWAYS_INLINE void pair_order(batch<float, Arch>& a, batch<float, Arch>& b) noexcept {
#if defined(__AVX512F__)
  if constexpr (widen_pair_permutes_v<F, Arch>) {
    __m512i const even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    __m512i const odd = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
    __m512 const x = a, y = b;
    a = batch<float, Arch>(_mm512_permutex2var_ps(x, even, y));
    b = batch<float, Arch>(_mm512_permutex2var_ps(x, odd, y));
  }
#endif
  (void)a, (void)b;
}

/// The inverse of pair_order: back to a = the first width values, b = the next.
template <half_format F, class Arch = default_arch>
POSENC_ALWAYS_INLINE void pair_unorder(batch<float, Arch>& a, batch<float, Arch>& b) noexcept {
#if defined(__AVX512F__)
  if constexpr (widen_pair_permutes_v<F, Arch>) {
    __m512i const first = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    __m512i const second = _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
    __m512 const x = a, y = b;
    a = batch<float, Arch>(_mm512_permutex2var_ps(x, first, y));
    b = batch<float, Arch>(_mm512_permutex2var_ps(x, second, y));
  }
#endif
  (void)a, (void)b;
}

/// Loads n < width lanes of format F, the rest zero (converted as load_widen does).
template <half_format F, class Arch = default_arch>
inline batch<float, Arch> load_widen_partial(std::uint16_t const* p, index_t n) noexcept {
  std::uint16_t buf[batch<float, Arch>::size] = {};
  for (index_t i = 0; i < n; ++i) buf[i] = p[i];
  return load_widen<F, Arch>(buf);
}

/// Narrows b as store_narrow does and stores its first n < width lanes.
template <half_format F, class Arch>
inline void store_narrow_partial(std::uint16_t* p, batch<float, Arch> const& b, index_t n) noexcept {
  std::uint16_t buf[batch<float, Arch>::size];
  store_narrow<F>(buf, b);
  for (index_t i = 0; i < n; ++i) p[i] = buf[i];
}

// ---------------------------------------------------------------------------
// bfloat16 pair products (the attention's bfloat16 product mode).
//
// A pair batch is a batch<float, Arch> whose 32-bit lanes each hold two
// bfloat16 encodings: the even element in the low 16 bits, the odd one in the
// high 16 bits (the operand layout of AVX-512 BF16's vdpbf16ps). Its lanes are
// bits, not floats: only the helpers below make or read them, and moves
// (load, store, broadcast of one lane's 32 bits) keep them. Rounding is to
// nearest, ties to even. Where the target has AVX-512 BF16 (`__AVX512BF16__`)
// and Arch is AVX-512, the instructions run (they flush subnormal inputs,
// products and sums to signed zero); elsewhere an emulation gives the same
// rounding of the inputs (narrow<bfloat16>, subnormals kept) and the same
// float accumulation (each product is exact in float: 8 x 8 significant bits),
// lane by lane: correct on every ISA, not fast.
// ---------------------------------------------------------------------------

/// 1 when the bfloat16 pair helpers run AVX-512 BF16 instructions for Arch.
template <class Arch = default_arch>
inline constexpr bool native_bf16_products =
#if defined(__AVX512BF16__) && defined(__AVX512BW__)
    std::is_base_of<xsimd::avx512f, Arch>::value;
#else
    false;
#endif

namespace detail {
/// The 32 bits of a pair lane: bfloat16 of `even` low, of `odd` high.
inline std::uint32_t bf16_pair_bits(float even, float odd) noexcept {
  return static_cast<std::uint32_t>(narrow<half_format::bfloat16>(even)) |
         (static_cast<std::uint32_t>(narrow<half_format::bfloat16>(odd)) << 16);
}
}  // namespace detail

/// The pair batch whose lane i holds (even[i], odd[i]), each rounded to bfloat16.
template <class Arch>
inline batch<float, Arch> bf16_pairs(batch<float, Arch> const& even, batch<float, Arch> const& odd) noexcept {
  using B = batch<float, Arch>;
#if defined(__AVX512BF16__) && defined(__AVX512BW__)
  if constexpr (std::is_base_of<xsimd::avx512f, Arch>::value) {
    // [even 0..15 | odd 0..15] as 16-bit elements, then interleaved.
    __m512i const h = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(odd, even));
    __m512i const idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                         21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    return B(_mm512_castsi512_ps(_mm512_permutexvar_epi16(idx, h)));
  }
#endif
  constexpr std::size_t n = B::size;
  alignas(Arch::alignment()) float e[n], o[n], r[n];
  even.store_aligned(e);
  odd.store_aligned(o);
  for (std::size_t i = 0; i < n; ++i) {
    std::uint32_t const u = detail::bf16_pair_bits(e[i], o[i]);
    std::memcpy(&r[i], &u, sizeof u);
  }
  return B::load_aligned(r);
}

/// Rounds the n floats at src to bfloat16 and stores them in order at dst as
/// (n + 1) / 2 pair lanes (pairs (src[2e], src[2e + 1]); an odd n: the last high half 0).
template <class Arch = default_arch>
inline void store_bf16_row(float* dst, float const* src, index_t n) noexcept {
  index_t i = 0;
#if defined(__AVX512BF16__) && defined(__AVX512BW__)
  if constexpr (std::is_base_of<xsimd::avx512f, Arch>::value) {
    for (; i + 32 <= n; i += 32) {
      __m512bh const h = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + i + 16), _mm512_loadu_ps(src + i));
      _mm512_storeu_si512(dst + i / 2, reinterpret_cast<__m512i>(h));
    }
    if (i < n) {  // the tail through the same instruction (the same rounding)
      alignas(64) float buf[32] = {};
      alignas(64) std::uint32_t out[16];
      std::memcpy(buf, src + i, static_cast<std::size_t>(n - i) * sizeof(float));
      _mm512_store_si512(out, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(_mm512_load_ps(buf + 16), _mm512_load_ps(buf))));
      std::memcpy(dst + i / 2, out, static_cast<std::size_t>((n - i + 1) / 2) * sizeof(float));
    }
    return;
  }
#endif
  for (; i < n; i += 2) {
    std::uint32_t const u = detail::bf16_pair_bits(src[i], i + 1 < n ? src[i + 1] : 0.0f);
    std::memcpy(dst + i / 2, &u, sizeof u);
  }
}

/// acc + a.odd * b.odd + a.even * b.even, lane by lane, for pair batches a and
/// b: the products exact, each addition rounded in float (vdpbf16ps's order).
template <class Arch>
inline batch<float, Arch> dot_bf16_pairs(batch<float, Arch> const& acc, batch<float, Arch> const& a,
                                         batch<float, Arch> const& b) noexcept {
  using B = batch<float, Arch>;
#if defined(__AVX512BF16__) && defined(__AVX512BW__)
  if constexpr (std::is_base_of<xsimd::avx512f, Arch>::value)
    return B(_mm512_dpbf16_ps(acc, reinterpret_cast<__m512bh>(static_cast<__m512>(a)),
                              reinterpret_cast<__m512bh>(static_cast<__m512>(b))));
#endif
  constexpr std::size_t n = B::size;
  alignas(Arch::alignment()) float s[n], x[n], y[n];
  acc.store_aligned(s);
  a.store_aligned(x);
  b.store_aligned(y);
  for (std::size_t i = 0; i < n; ++i) {
    std::uint32_t const ua = detail::bits_of(x[i]), ub = detail::bits_of(y[i]);
    float const ao = detail::float_from_bits(ua & 0xffff0000u), ae = detail::float_from_bits(ua << 16);
    float const bo = detail::float_from_bits(ub & 0xffff0000u), be = detail::float_from_bits(ub << 16);
    float const t = s[i] + ao * bo;  // exact products: fused or not, the same sums
    s[i] = t + ae * be;
  }
  return B::load_aligned(s);
}

}  // namespace posenc::simd
