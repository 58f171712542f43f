// SPDX-License-Identifier: MIT
// The SIMD shim built against the xsimd 9.x API (tests/support/xsimd9 ahead of the installed xsimd).
#include <posenc/core/simd.hpp>

#include <algorithm>
#include <cstddef>
#include <type_traits>
#include <utility>
#include <vector>

#include "support/catch.hpp"
#include "support/random.hpp"

namespace simd = posenc::simd;

// Found by argument-dependent lookup only when xsimd declares it.
namespace xsimd_probe {
template <class B, class = void>
struct has_reduce_add : std::false_type {};
template <class B>
struct has_reduce_add<B, std::void_t<decltype(reduce_add(std::declval<B const&>()))>> : std::true_type {};
template <class B, class = void>
struct has_hadd : std::false_type {};
template <class B>
struct has_hadd<B, std::void_t<decltype(hadd(std::declval<B const&>()))>> : std::true_type {};
}  // namespace xsimd_probe

static_assert(XSIMD_VERSION_MAJOR >= 9, "tests/support/xsimd9 must stand ahead of the installed xsimd");
static_assert(xsimd_probe::has_reduce_add<simd::batch<float>>::value, "xsimd 9 has reduce_add");
#ifdef POSENC_TEST_XSIMD9_MOCK
static_assert(!xsimd_probe::has_hadd<simd::batch<float>>::value, "the 9.x stand-in has no hadd");
#endif

TEMPLATE_TEST_CASE("simd with the xsimd 9 API: reduce_add, reduce_max, pair swizzles", "[simd]", float, double) {
  constexpr auto W = simd::width<TestType>;
  auto x = posenc_test::random_vector<TestType>(static_cast<std::size_t>(W), 11);
  auto const b = simd::load(x.data());
  TestType sum = 0;
  for (TestType v : x) sum += v;
  CHECK(simd::reduce_add(b) == posenc_test::Approx(sum).epsilon(1e-6));
  CHECK(simd::reduce_max(b) == *std::max_element(x.begin(), x.end()));

  std::vector<TestType> y(x.size());
  simd::store(y.data(), simd::swap_pairs(b));
  for (std::size_t i = 0; i < x.size(); ++i) CHECK(y[i] == x[i ^ 1u]);
  simd::store(y.data(), simd::duplicate_half<false>(b));
  for (std::size_t i = 0; i < x.size(); ++i) CHECK(y[i] == x[i / 2]);
}
