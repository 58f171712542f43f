// SPDX-License-Identifier: MIT
// Eigen, included for posenc's headers with GCC's false AVX-512 warnings kept out of consumers' builds.
#pragma once

// GCC before 12.3 reports false -Wuninitialized / -Wmaybe-uninitialized inside its
// own AVX-512 intrinsics headers (GCC bug 105593); Eigen includes them. Including
// them here first with those two warnings off keeps a consumer's -Wall -Werror
// build clean (see core/simd.hpp, which does the same for xsimd).
#if defined(__GNUC__) && !defined(__clang__) && (__GNUC__ < 12 || (__GNUC__ == 12 && __GNUC_MINOR__ < 3))
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif
#include <Eigen/Core>
#pragma GCC diagnostic pop
#else
#include <Eigen/Core>
#endif
