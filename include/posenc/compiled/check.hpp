// SPDX-License-Identifier: MIT
// The first call into posenc::compiled from a translation unit checks that the library and the
// headers agree: the same posenc version and the same instruction set.
#pragma once

#include "posenc/core/simd.hpp"
#include "posenc/core/version.hpp"

namespace posenc::detail::compiled_kernels {

/// Throws posenc::error naming both sides when the library was built from another posenc
/// version than `headers_version` ("major.minor.patch") or for another instruction set than
/// `headers_isa` (posenc::simd::arch_name() of the calling translation unit). Defined in the
/// library (src/compiled/check.cpp): a program that defines POSENC_COMPILED without linking
/// posenc::compiled fails to link with this symbol's name.
void check_library(char const* headers_version, char const* headers_isa);

/// Runs check_library once per program and translation-unit flags.
inline void check_once() {
  static bool const ok = (check_library(version_string(), simd::arch_name()), true);
  (void)ok;
}

}  // namespace posenc::detail::compiled_kernels
