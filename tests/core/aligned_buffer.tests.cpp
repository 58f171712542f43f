// SPDX-License-Identifier: MIT
// aligned_buffer: 64-byte alignment, zero fill, deep copy, move, assignment, bad sizes.
#include <posenc/core/aligned_buffer.hpp>

#include <cstdint>
#include <utility>

#include "support/catch.hpp"

namespace core_aligned_buffer_tests {

using posenc::index_t;

namespace {
template <class T>
bool is_aligned(T const* p) {
  return reinterpret_cast<std::uintptr_t>(p) % 64 == 0;
}
}  // namespace

TEMPLATE_TEST_CASE("aligned_buffer: aligned, zero-filled, writable end to end", "[aligned_buffer]", float, double,
                   char, std::int64_t) {
  for (index_t n : {1, 3, 15, 16, 17, 64, 1000}) {
    posenc::aligned_buffer<TestType> b(n);
    REQUIRE(b.data() != nullptr);
    CHECK(is_aligned(b.data()));
    CHECK(b.size() == n);
    CHECK_FALSE(b.empty());
    CHECK(b.end() - b.begin() == n);
    int nonzero = 0;
    for (TestType x : b) nonzero += x != TestType(0);
    CHECK(nonzero == 0);
    for (index_t i = 0; i < n; ++i) b[i] = static_cast<TestType>(i % 100);
    auto const& cb = b;
    CHECK(cb[n - 1] == static_cast<TestType>((n - 1) % 100));
    CHECK(cb.data() == b.data());
  }
}

TEST_CASE("aligned_buffer: empty buffers", "[aligned_buffer]") {
  posenc::aligned_buffer<float> a;
  CHECK(a.empty());
  CHECK(a.size() == 0);
  CHECK(a.data() == nullptr);
  CHECK(a.begin() == a.end());
  posenc::aligned_buffer<float> z(0);
  CHECK(z.empty());
  CHECK(z.data() == nullptr);
  posenc::aligned_buffer<float> c = z;
  CHECK(c.empty());
}

TEST_CASE("aligned_buffer: copies are deep, moves steal, assignment replaces", "[aligned_buffer]") {
  posenc::aligned_buffer<double> a(37);
  for (index_t i = 0; i < a.size(); ++i) a[i] = 0.5 * static_cast<double>(i);

  posenc::aligned_buffer<double> copy = a;
  REQUIRE(copy.size() == a.size());
  CHECK(copy.data() != a.data());
  CHECK(is_aligned(copy.data()));
  int diff = 0;
  for (index_t i = 0; i < a.size(); ++i) diff += copy[i] != a[i];
  CHECK(diff == 0);
  copy[3] = -1;
  CHECK(a[3] == 1.5);

  double* const p = a.data();
  posenc::aligned_buffer<double> moved = std::move(a);
  CHECK(moved.data() == p);
  CHECK(moved.size() == 37);
  CHECK(a.data() == nullptr);  // NOLINT: checking the moved-from state on purpose
  CHECK(a.size() == 0);

  posenc::aligned_buffer<double> target(5);
  target = moved;
  CHECK(target.size() == 37);
  CHECK(target.data() != moved.data());
  CHECK(target[36] == 18.0);
  target = posenc::aligned_buffer<double>(2);
  CHECK(target.size() == 2);
  CHECK(target[1] == 0.0);
  auto& self = target;
  target = self;
  CHECK(target.size() == 2);
}

TEST_CASE("aligned_buffer: a negative size throws posenc::error", "[aligned_buffer]") {
  REQUIRE_THROWS_AS(posenc::aligned_buffer<float>(-1), posenc::error);
  REQUIRE_THROWS_WITH(posenc::aligned_buffer<float>(-4),
                      posenc_test::contains("posenc::aligned_buffer: n is -4, expected >= 0"));
}
}  // namespace core_aligned_buffer_tests
