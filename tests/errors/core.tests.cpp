// SPDX-License-Identifier: MIT
// Core error reporting: posenc::error, require/fail formatting, and the messages of core checks.
#include <posenc/core/aligned_buffer.hpp>
#include <posenc/core/error.hpp>
#include <posenc/core/positions.hpp>
#include <posenc/core/view.hpp>

#include <limits>
#include <ostream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "support/catch.hpp"
#include "support/error_of.hpp"

namespace errors_core_tests {

using posenc::index_t;

namespace {

using posenc_test::error_of;


/// Counts how often it is formatted.
struct counted {
  int* count;
};
std::ostream& operator<<(std::ostream& os, counted const& c) {
  ++*c.count;
  return os << "counted";
}

}  // namespace

TEST_CASE("errors: posenc::error is a std::invalid_argument", "[errors]") {
  static_assert(std::is_base_of_v<std::invalid_argument, posenc::error>);
  REQUIRE_THROWS_AS(posenc::detail::fail("posenc::f", "x is 1"), std::invalid_argument);
  REQUIRE_THROWS_AS(posenc::detail::fail("posenc::f", "x is 1"), posenc::error);
  posenc::error e("posenc::f: message");
  CHECK(std::string(e.what()) == "posenc::f: message");
}

TEST_CASE("errors: fail and require build '<function>: <argument> is <value>, expected <what>'", "[errors]") {
  CHECK(error_of([] { posenc::detail::fail("posenc::rope", "base is ", -1, ", expected > 0"); }) ==
        "posenc::rope: base is -1, expected > 0");
  CHECK(error_of([] { posenc::detail::require(true, "posenc::rope", "never"); }) == "<no error>");
  CHECK(error_of([] {
          posenc::detail::require(false, "posenc::alibi", "heads is ", index_t{0}, ", expected >= 1");
        }) == "posenc::alibi: heads is 0, expected >= 1");
  std::string name = "rotary_dim";
  CHECK(error_of([&] { posenc::detail::require(3 > 4, "posenc::rope", name, " is ", 3, ", expected even"); }) ==
        "posenc::rope: rotary_dim is 3, expected even");
}

TEST_CASE("errors: floating-point values print with the %g digits that read back exactly", "[errors]") {
  CHECK(posenc::detail::cat(0.1) == "0.1");
  CHECK(posenc::detail::cat(0.1f) == "0.1");
  CHECK(posenc::detail::cat(10000.0) == "10000");
  CHECK(posenc::detail::cat(123456789.0) == "123456789");
  CHECK(posenc::detail::cat(1e20) == "1e+20");
  CHECK(posenc::detail::cat(1e-5) == "1e-05");
  CHECK(posenc::detail::cat(-2.5f) == "-2.5");
  CHECK(posenc::detail::cat(1.0 / 3.0) == "0.3333333333333333");
  CHECK(posenc::detail::cat(std::numeric_limits<double>::infinity()) == "inf");
  CHECK(posenc::detail::cat(-std::numeric_limits<float>::infinity()) == "-inf");
  std::string nan = posenc::detail::cat(std::numeric_limits<double>::quiet_NaN());
  CHECK(nan.find("nan") != std::string::npos);
  // Every double round-trips.
  for (double x : {3.141592653589793, 1e300, 2.2250738585072014e-308, 0.30000000000000004}) {
    CHECK(std::stod(posenc::detail::cat(x)) == x);
  }
  CHECK(posenc::detail::cat("a", 1, 'b', index_t{-7}, 2.5) == "a1b-72.5");
}

TEST_CASE("errors: require formats its arguments only when it fails", "[errors]") {
  int count = 0;
  posenc::detail::require(true, "posenc::f", "x is ", counted{&count}, ", expected y");
  CHECK(count == 0);
  CHECK(error_of([&] { posenc::detail::require(false, "posenc::f", "x is ", counted{&count}, ", expected y"); }) ==
        "posenc::f: x is counted, expected y");
  CHECK(count == 1);
}

TEST_CASE("errors: every core check names the function, argument, value and expectation", "[errors]") {
  std::vector<float> buf(24);
  auto v = posenc::make_bshd(buf.data(), 1, 2, 3, 4);
  v.dim_stride = 4;
  CHECK(error_of([&] { posenc::detail::check_view("posenc::attention", "q", v); }) ==
        "posenc::attention: q.dim_stride is 4, expected 1 (the last dim must be contiguous)");
  v = posenc::make_bshd(buf.data(), 1, 2, 3, 4);
  v.heads = -1;
  CHECK(error_of([&] { posenc::detail::check_view("posenc::attention", "k", v); }) ==
        "posenc::attention: k.heads is -1, expected >= 0");
  CHECK(error_of([] { posenc::detail::check_equal("posenc::attention", "out.dim", 8, 16, "v.dim"); }) ==
        "posenc::attention: out.dim is 8, expected 16 (v.dim)");
  CHECK(error_of([] { posenc::position_span(-3).validate("posenc::sinusoidal::add_to", "pos", 2, 4); }) ==
        "posenc::sinusoidal::add_to: pos position of batch 0 token 0 is -3, expected >= 0");
  CHECK(error_of([] { posenc::aligned_buffer<double> b(-8); }) ==
        "posenc::aligned_buffer: n is -8, expected >= 0");
}
}  // namespace errors_core_tests
