// SPDX-License-Identifier: MIT
// The SIMD shim against scalar code at lengths around the vector width, on misaligned pointers.
#include <posenc/core/simd.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "support/catch.hpp"
#include "support/random.hpp"

namespace simd = posenc::simd;

// The shim's version guards agree with what the installed xsimd declares
// (argument-dependent lookup finds reduce_add / hadd only when xsimd has them).
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
static_assert(xsimd_probe::has_reduce_add<simd::batch<float>>::value == bool(POSENC_XSIMD_HAS_REDUCE),
              "POSENC_XSIMD_HAS_REDUCE disagrees with the installed xsimd");
static_assert(POSENC_XSIMD_HAS_REDUCE || xsimd_probe::has_hadd<simd::batch<float>>::value,
              "xsimd without reduce_add must have hadd");

TEMPLATE_TEST_CASE("simd: load/store, partial load/store round-trip", "[simd]", float, double) {
  constexpr auto W = simd::width<TestType>;
  for (posenc::index_t n : {W - 1, W, W + 1, 2 * W - 1, 2 * W + 1}) {
    for (posenc::index_t offset : {0, 1, 3}) {
      auto src = posenc_test::random_vector<TestType>(static_cast<std::size_t>(n + offset + W), 7);
      std::vector<TestType> dst(src.size(), TestType(-9));
      TestType const* s = src.data() + offset;
      TestType* d = dst.data() + offset;
      posenc::index_t i = 0;
      for (; i + W <= n; i += W) simd::store(d + i, simd::load(s + i));
      simd::store_partial(d + i, simd::load_partial(s + i, n - i), n - i);
      for (posenc::index_t j = 0; j < n; ++j) CHECK(d[j] == s[j]);
      CHECK(d[n] == TestType(-9));  // nothing written past the end
    }
  }
}

TEMPLATE_TEST_CASE("simd: fma, reduce_add, reduce_max, exp against scalar", "[simd]", float, double) {
  constexpr auto W = simd::width<TestType>;
  auto a = posenc_test::random_vector<TestType>(W + 1, 1, -3, 3);
  auto b = posenc_test::random_vector<TestType>(W + 1, 2, -3, 3);
  auto c = posenc_test::random_vector<TestType>(W + 1, 3, -3, 3);
  for (int off = 0; off < 2; ++off) {
    auto va = simd::load(a.data() + off), vb = simd::load(b.data() + off), vc = simd::load(c.data() + off);
    std::vector<TestType> r(W);
    simd::store(r.data(), simd::fma(va, vb, vc));
    double sum = 0, mx = -1e300;
    for (posenc::index_t i = 0; i < W; ++i) {
      // Without an FMA instruction a * b + c rounds twice: within one ulp of |a b| + |c|.
      double const bound = static_cast<double>(std::numeric_limits<TestType>::epsilon()) *
                           (std::abs(static_cast<double>(a[i + off]) * b[i + off]) + std::abs(c[i + off]));
      double const exact = std::fma(static_cast<double>(a[i + off]), static_cast<double>(b[i + off]),
                                    static_cast<double>(c[i + off]));
      CHECK(std::abs(static_cast<double>(r[i]) - exact) <= bound);
      sum += a[i + off];
      mx = std::max(mx, static_cast<double>(a[i + off]));
    }
    CHECK(simd::reduce_add(va) == posenc_test::Approx(sum).epsilon(1e-6));
    CHECK(simd::reduce_max(va) == static_cast<TestType>(mx));
    simd::store(r.data(), simd::exp(va));
    for (posenc::index_t i = 0; i < W; ++i)
      CHECK(r[i] == posenc_test::Approx(std::exp(a[i + off])).epsilon(4e-7));
  }
}

TEMPLATE_TEST_CASE("simd: swap_pairs and alternating_sign", "[simd]", float, double) {
  constexpr auto W = simd::width<TestType>;
  std::vector<TestType> x(W), r(W), s(W);
  for (posenc::index_t i = 0; i < W; ++i) x[i] = static_cast<TestType>(i + 1);
  simd::store(r.data(), simd::swap_pairs(simd::load(x.data())));
  simd::store(s.data(), simd::alternating_sign<TestType>());
  for (posenc::index_t i = 0; i < W; ++i) {
    CHECK(r[i] == x[i ^ 1]);
    CHECK(s[i] == (i % 2 == 0 ? TestType(-1) : TestType(1)));
  }
}

TEMPLATE_TEST_CASE("simd: duplicate_half repeats each element of one half, in order", "[simd]", float, double) {
  constexpr auto W = simd::width<TestType>;
  std::vector<TestType> x(W), lo(W), hi(W);
  for (posenc::index_t i = 0; i < W; ++i) x[i] = static_cast<TestType>(i + 1);
  simd::store(lo.data(), simd::duplicate_half<false>(simd::load(x.data())));
  simd::store(hi.data(), simd::duplicate_half<true>(simd::load(x.data())));
  for (posenc::index_t i = 0; i < W; ++i) {
    CHECK(lo[i] == x[i / 2]);
    CHECK(hi[i] == x[W / 2 + i / 2]);
  }
}

TEMPLATE_TEST_CASE("simd: max and broadcast against scalar, misaligned", "[simd]", float, double) {
  constexpr auto W = simd::width<TestType>;
  auto a = posenc_test::random_vector<TestType>(W + 3, 11, -5, 5);
  auto b = posenc_test::random_vector<TestType>(W + 3, 12, -5, 5);
  for (int off = 0; off < 4; ++off) {
    std::vector<TestType> r(W), c(W);
    simd::store(r.data(), simd::max(simd::load(a.data() + off), simd::load(b.data() + off)));
    simd::store(c.data(), simd::broadcast(a[off]));
    for (posenc::index_t i = 0; i < W; ++i) {
      CHECK(r[i] == std::max(a[i + off], b[i + off]));
      CHECK(c[i] == a[off]);
    }
  }
}

TEMPLATE_TEST_CASE("simd: exp is exact at 0, zero at -inf, finite over the softmax range", "[simd]", float,
                   double) {
  constexpr auto W = simd::width<TestType>;
  TestType const inf = std::numeric_limits<TestType>::infinity();
  std::vector<TestType> x(W), r(W);
  for (posenc::index_t i = 0; i < W; ++i) x[i] = (i % 2 == 0) ? TestType(0) : -inf;
  simd::store(r.data(), simd::exp(simd::load(x.data())));
  for (posenc::index_t i = 0; i < W; ++i) CHECK(r[i] == (i % 2 == 0 ? TestType(1) : TestType(0)));
  // Softmax exponents are <= 0 after subtracting the row max.
  auto y = posenc_test::random_vector<TestType>(W, 21, -80, 0);
  simd::store(r.data(), simd::exp(simd::load(y.data())));
  for (posenc::index_t i = 0; i < W; ++i) {
    CHECK(std::isfinite(r[i]));
    CHECK(r[i] == posenc_test::Approx(std::exp(y[i])).epsilon(4e-7).margin(1e-30));
  }
  CHECK(simd::reduce_max(simd::broadcast(-inf)) == -inf);
}

TEMPLATE_TEST_CASE("simd: a dot-product loop with a partial tail at lengths around the width", "[simd]", float,
                   double) {
  // The loop shape every kernel uses: full batches, then load_partial for the rest.
  constexpr auto W = simd::width<TestType>;
  for (posenc::index_t n : {W - 1, W, W + 1, 3 * W - 1, 3 * W, 3 * W + 1}) {
    for (posenc::index_t offset : {0, 1, 2}) {
      auto a = posenc_test::random_vector<TestType>(static_cast<std::size_t>(n + offset), 31 + n, -2, 2);
      auto b = posenc_test::random_vector<TestType>(static_cast<std::size_t>(n + offset), 41 + n, -2, 2);
      TestType const* pa = a.data() + offset;
      TestType const* pb = b.data() + offset;
      auto acc = simd::broadcast(TestType(0));
      posenc::index_t i = 0;
      for (; i + W <= n; i += W) acc = simd::fma(simd::load(pa + i), simd::load(pb + i), acc);
      if (i < n) acc = simd::fma(simd::load_partial(pa + i, n - i), simd::load_partial(pb + i, n - i), acc);
      double ref = 0, mag = 0;
      for (posenc::index_t j = 0; j < n; ++j) {
        ref += static_cast<double>(pa[j]) * static_cast<double>(pb[j]);
        mag += std::abs(static_cast<double>(pa[j]) * static_cast<double>(pb[j]));
      }
      INFO("n " << n << ", offset " << offset);
      double const eps = static_cast<double>(std::numeric_limits<TestType>::epsilon());
      CHECK(std::abs(static_cast<double>(simd::reduce_add(acc)) - ref) <= 2.0 * static_cast<double>(n) * eps * mag);
    }
  }
}

TEST_CASE("simd: arch_name names the instruction set", "[simd]") {
  std::string name = simd::arch_name();
  CHECK_FALSE(name.empty());
  CHECK(simd::width<float> == 2 * simd::width<double>);
  CHECK(simd::width<float> >= 1);
}

TEMPLATE_TEST_CASE("simd: fma rounds once where the target has FMA", "[simd]", float, double) {
#if defined(__FMA__) || defined(__AVX512F__)
  constexpr auto W = simd::width<TestType>;
  auto a = posenc_test::random_vector<TestType>(W + 1, 51, -3, 3);
  auto b = posenc_test::random_vector<TestType>(W + 1, 52, -3, 3);
  auto c = posenc_test::random_vector<TestType>(W + 1, 53, -3, 3);
  std::vector<TestType> r(W);
  simd::store(r.data(), simd::fma(simd::load(a.data() + 1), simd::load(b.data() + 1), simd::load(c.data() + 1)));
  int inexact = 0;
  for (posenc::index_t i = 0; i < W; ++i) inexact += r[i] != std::fma(a[i + 1], b[i + 1], c[i + 1]);
  CHECK(inexact == 0);
#else
  WARN("fma exactness skipped: the target has no FMA instruction (" << simd::arch_name() << ")");
#endif
}

TEMPLATE_TEST_CASE("simd: transpose against a scalar transposition", "[simd]", float, double) {
  constexpr auto W = simd::width<TestType>;
  using B = simd::batch<TestType>;
  auto src = posenc_test::random_vector<TestType>(static_cast<std::size_t>(W * W + 1), 61);
  std::vector<B> rows;
  for (posenc::index_t r = 0; r < W; ++r) rows.push_back(simd::load(src.data() + 1 + r * W));  // misaligned
  simd::transpose(rows.data());
  std::vector<TestType> got(static_cast<std::size_t>(W));
  int wrong = 0;
  for (posenc::index_t i = 0; i < W; ++i) {
    simd::store(got.data(), rows[static_cast<std::size_t>(i)]);
    for (posenc::index_t j = 0; j < W; ++j) wrong += got[static_cast<std::size_t>(j)] != src[static_cast<std::size_t>(1 + j * W + i)];
  }
  CHECK(wrong == 0);
  CHECK(simd::vector_registers<simd::default_arch> >= 16);
}

TEMPLATE_TEST_CASE("simd: select and tanh against scalar", "[simd]", float, double) {
  constexpr auto W = simd::width<TestType>;
  auto a = posenc_test::random_vector<TestType>(W + 2, 71, -12, 12);
  auto b = posenc_test::random_vector<TestType>(W + 2, 72, -12, 12);
  std::vector<TestType> r(W), t(W);
  for (int off = 0; off < 3; ++off) {
    auto va = simd::load(a.data() + off), vb = simd::load(b.data() + off);
    simd::store(r.data(), simd::select(va < vb, va, vb));
    simd::store(t.data(), simd::tanh(va));
    for (posenc::index_t i = 0; i < W; ++i) {
      CHECK(r[i] == std::min(a[i + off], b[i + off]));
      CHECK(t[i] == posenc_test::Approx(std::tanh(a[i + off])).epsilon(4e-7).margin(1e-7));
    }
  }
}
