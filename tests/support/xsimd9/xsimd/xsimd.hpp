// SPDX-License-Identifier: MIT
// The installed xsimd 8.x dressed as xsimd 9.0: hadd renamed reduce_add, reduce_max added.
//
// xsimd 9.0.0 renamed `hadd` to `reduce_add` and added `reduce_min` / `reduce_max`
// (xsimd's Changelog.rst). Debian 12 packages only 8.1, so this header, put ahead of
// the real one on the include path, gives core/simd.hpp the 9.x names and version
// number: a shim that still calls `xsimd::hadd` on 9.x does not compile against it.
// With an installed xsimd of 9 or newer it adds nothing.
#pragma once

#if defined(__has_include_next)
#define hadd posenc_test_hadd_before_xsimd_9
#include_next <xsimd/xsimd.hpp>
#undef hadd
#else
#error "tests/support/xsimd9 needs #include_next (GCC or Clang)"
#endif

#if XSIMD_VERSION_MAJOR < 9
#define POSENC_TEST_XSIMD9_MOCK 1
#undef XSIMD_VERSION_MAJOR
#undef XSIMD_VERSION_MINOR
#undef XSIMD_VERSION_PATCH
#define XSIMD_VERSION_MAJOR 9
#define XSIMD_VERSION_MINOR 0
#define XSIMD_VERSION_PATCH 0

#include <cstddef>

namespace xsimd {

/// Sum of the lanes (9.x name of 8.x's hadd).
template <class T, class A>
inline T reduce_add(batch<T, A> const& b) noexcept {
  return posenc_test_hadd_before_xsimd_9(b);
}

/// Largest lane (new in 9.0).
template <class T, class A>
inline T reduce_max(batch<T, A> const& b) noexcept {
  alignas(A::alignment()) T buf[batch<T, A>::size];
  b.store_aligned(buf);
  T m = buf[0];
  for (std::size_t i = 1; i < batch<T, A>::size; ++i) m = buf[i] > m ? buf[i] : m;
  return m;
}

}  // namespace xsimd
#endif
