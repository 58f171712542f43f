// SPDX-License-Identifier: MIT
// The one Catch2 v2/v3 shim: include this, never Catch2 directly.
#pragma once

#if __has_include(<catch2/catch_test_macros.hpp>)
// Catch2 v3
#include <catch2/catch_approx.hpp>
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/generators/catch_generators_adapters.hpp>
#include <catch2/generators/catch_generators_random.hpp>
#include <catch2/matchers/catch_matchers_floating_point.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#define POSENC_CATCH_V3 1
namespace posenc_test {
using Catch::Approx;
}
#else
// Catch2 v2 (single header)
#include <catch2/catch.hpp>
#define POSENC_CATCH_V3 0
namespace posenc_test {
using Catch::Detail::Approx;
}
#endif

#include <string>

namespace posenc_test {
/// Matcher: the exception message / string contains `s` (v2 Contains, v3 ContainsSubstring).
inline auto contains(std::string const& s) {
#if POSENC_CATCH_V3
  return Catch::Matchers::ContainsSubstring(s);
#else
  return Catch::Matchers::Contains(s);
#endif
}
}  // namespace posenc_test
