// SPDX-License-Identifier: MIT
// posenc version numbers (CMake reads them from this file).
#pragma once

#define POSENC_VERSION_MAJOR 0
#define POSENC_VERSION_MINOR 1
#define POSENC_VERSION_PATCH 0

namespace posenc {
/// The library version as "major.minor.patch".
inline constexpr char const* version_string() noexcept { return "0.1.0"; }
}  // namespace posenc
