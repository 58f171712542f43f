// SPDX-License-Identifier: MIT
// The SIMD shim against scalar code at lengths around the vector width, on misaligned pointers.
#include <posenc/core/eigen.hpp>
#include <posenc/core/simd.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "support/catch.hpp"
#include "support/random.hpp"

namespace core_simd_tests {

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

TEMPLATE_TEST_CASE("simd: exp and tanh of NaN, infinities and huge arguments", "[simd]", float, double) {
  // Every lane a value whose integer part of x / ln 2 does not fit 64 bits (or has none). Run
  // under clang's -fsanitize=float-cast-overflow (the sanitizer build), xsimd 8.1's double exp
  // converted these with undefined scalar casts; the shim clamps them first.
  constexpr auto W = simd::width<TestType>;
  using lim = std::numeric_limits<TestType>;
  TestType const cases[] = {lim::quiet_NaN(), lim::infinity(), -lim::infinity(), lim::max(), lim::lowest(),
                            TestType(1e30), TestType(-1e30), TestType(-745), TestType(80), TestType(-104),
                            TestType(50), TestType(-50), TestType(0.5), TestType(-0.5)};
  std::vector<TestType> x(W), e(W), t(W);
  for (TestType c : cases) {
    for (posenc::index_t i = 0; i < W; ++i) x[i] = (i % 3 == 1) ? TestType(0.25) : c;
    simd::store(e.data(), simd::exp(simd::load(x.data())));
    simd::store(t.data(), simd::tanh(simd::load(x.data())));
    for (posenc::index_t i = 0; i < W; ++i) {
      CAPTURE(c, i);
      TestType const want_e = std::exp(x[i]), want_t = std::tanh(x[i]);
      if (std::isnan(want_e)) {
        CHECK(std::isnan(e[i]));
        CHECK(std::isnan(t[i]));
      } else if (std::isinf(want_e)) {
        CHECK(e[i] == want_e);
        CHECK(t[i] == want_t);
      } else {
        CHECK(e[i] == posenc_test::Approx(want_e).epsilon(4e-7).margin(1e-30));
        CHECK(t[i] == posenc_test::Approx(want_t).epsilon(4e-7).margin(1e-7));
      }
    }
  }
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
#if defined(__FMA__) || defined(__AVX512F__) || defined(__aarch64__)  // AArch64: fmla, always
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

// The kernels' scalar tails use fma_scalar beside fma's lanes (rope's two layouts split a row
// between body and tail differently): both must round alike on every instruction set.
TEMPLATE_TEST_CASE("simd: fma_scalar rounds as a lane of fma; fma_rounds_once says how", "[simd]", float, double) {
  using T = TestType;
  constexpr auto W = simd::width<T>;
  // a * a = 1 + 2e + e^2 with e^2 below half a unit of 1: rounded first, a * a + c is 0;
  // rounded once, it is e^2.
  T const e = std::ldexp(T(1), -(std::numeric_limits<T>::digits + 1) / 2);
  T const a = T(1) + e, c = -(T(1) + 2 * e);
  std::vector<T> lanes(W);
  simd::store(lanes.data(), simd::fma(simd::broadcast(a), simd::broadcast(a), simd::broadcast(c)));
  T const once = e * e;
  for (T x : lanes) CHECK(x == (simd::fma_rounds_once<> ? once : T(0)));
  CHECK(simd::fma_scalar(a, a, c) == lanes[0]);
#if defined(__FMA__) || defined(__AVX512F__) || defined(__aarch64__)
  CHECK(simd::fma_rounds_once<>);
#elif defined(__x86_64__)
  CHECK_FALSE(simd::fma_rounds_once<>);
#endif
  // Random triples, lane by lane, bit for bit.
  posenc::index_t const n = 64 * W;
  auto x = posenc_test::random_vector<T>(static_cast<std::size_t>(n), 61, -4, 4);
  auto y = posenc_test::random_vector<T>(static_cast<std::size_t>(n), 62, -4, 4);
  auto z = posenc_test::random_vector<T>(static_cast<std::size_t>(n), 63, -4, 4);
  std::vector<T> r(static_cast<std::size_t>(n));
  for (posenc::index_t i = 0; i < n; i += W)
    simd::store(r.data() + i, simd::fma(simd::load(x.data() + i), simd::load(y.data() + i), simd::load(z.data() + i)));
  int differ = 0;
  for (std::size_t i = 0; i < r.size(); ++i) {
    T const s = simd::fma_scalar(x[i], y[i], z[i]);
    differ += std::memcmp(&s, &r[i], sizeof(T)) != 0;
  }
  CHECK(differ == 0);
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
#if defined(__aarch64__) || defined(__AVX512F__)
  CHECK(simd::vector_registers<simd::default_arch> == 32);  // v0-v31, zmm0-zmm31
#else
  CHECK(simd::vector_registers<simd::default_arch> == 16);
#endif
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

// ---------------------------------------------------------------------------
// 16-bit floats: the shim's conversions against Eigen's Eigen::half and
// Eigen::bfloat16 (an independent implementation), at this build's instruction set.

namespace {

using posenc::simd::half_format;

std::uint32_t float_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// Eigen's conversions, the oracle.
template <half_format F>
float eigen_widen(std::uint16_t h) {
  if constexpr (F == half_format::binary16) return static_cast<float>(Eigen::numext::bit_cast<Eigen::half>(h));
  else return static_cast<float>(Eigen::numext::bit_cast<Eigen::bfloat16>(h));
}
template <half_format F>
std::uint16_t eigen_narrow(float f) {
  if constexpr (F == half_format::binary16) return Eigen::numext::bit_cast<std::uint16_t>(Eigen::half(f));
  else return Eigen::numext::bit_cast<std::uint16_t>(Eigen::bfloat16(f));
}

bool is_nan16(half_format f, std::uint16_t h) {
  return f == half_format::binary16 ? (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0
                                    : (h & 0x7f80u) == 0x7f80u && (h & 0x7fu) != 0;
}

// Floats that probe narrowing: every 16-bit value widened, the midpoints
// between neighbours (exact ties) and one float ulp either side of them, the
// edges of overflow and of the subnormal range, and random bit patterns.
template <half_format F>
std::vector<float> narrowing_probes() {
  std::vector<float> x;
  for (std::uint32_t h = 0; h < 0x10000u; ++h) {
    float const a = posenc::simd::widen<F>(static_cast<std::uint16_t>(h));
    x.push_back(a);
    if ((h & 0x7fffu) >= (F == half_format::binary16 ? 0x7c00u : 0x7f80u) - 1u) continue;  // no finite neighbour above
    float const b = posenc::simd::widen<F>(static_cast<std::uint16_t>(h + 1));
    float const mid = static_cast<float>((static_cast<double>(a) + static_cast<double>(b)) / 2);
    x.insert(x.end(), {mid, std::nextafter(mid, -INFINITY), std::nextafter(mid, INFINITY)});
  }
  for (float e : {65504.0f, 65519.996f, 65520.0f, 65536.0f, 1e10f, 6.1035156e-5f, 5.9604645e-8f, 2.9802322e-8f,
                  2.9802326e-8f, 1e-30f, 1e-40f, 1.1754942e-38f, 3.4028235e38f, INFINITY,
                  std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::denorm_min()}) {
    x.push_back(e);
    x.push_back(-e);
  }
  std::uint64_t s = 12345;
  for (int i = 0; i < 200000; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    std::uint32_t const u = static_cast<std::uint32_t>(s >> 32);
    float f;
    std::memcpy(&f, &u, sizeof f);
    x.push_back(f);
  }
  return x;
}

// What the vector store gives for f: the scalar rule, except that AVX-512 BF16's
// instruction flushes float subnormals to signed zero (core/simd.hpp).
template <half_format F>
std::uint16_t vector_narrow_rule(float f) {
#if defined(__AVX512BF16__)
  if constexpr (F == half_format::bfloat16) {
    if (std::is_base_of<xsimd::avx512f, simd::default_arch>::value && std::fpclassify(f) == FP_SUBNORMAL)
      return static_cast<std::uint16_t>((float_bits(f) >> 16) & 0x8000u);
  }
#endif
  return posenc::simd::narrow<F>(f);
}

template <half_format F>
void check_half_format() {
  char const* const name = F == half_format::binary16 ? "binary16" : "bfloat16";
  constexpr auto W = simd::width<float>;
  // Widening: every encoding, scalar and vector, full and partial, misaligned.
  std::vector<std::uint16_t> all(0x10000u + 1);
  for (std::uint32_t h = 0; h < 0x10000u; ++h) all[h + 1] = static_cast<std::uint16_t>(h);
  std::size_t widen_bad = 0;
  for (std::uint32_t h = 0; h < 0x10000u; ++h) {
    float const want = eigen_widen<F>(static_cast<std::uint16_t>(h));
    float const got = simd::widen<F>(static_cast<std::uint16_t>(h));
    bool const same = std::isnan(want) ? std::isnan(got) : float_bits(got) == float_bits(want);
    widen_bad += same ? 0 : 1;
  }
  INFO(name);
  CHECK(widen_bad == 0);
  std::vector<float> lanes(static_cast<std::size_t>(W));
  std::size_t vector_bad = 0;
  for (std::size_t at = 1; at + static_cast<std::size_t>(W) <= all.size(); at += static_cast<std::size_t>(W)) {
    for (posenc::index_t n : {W, W - 1, posenc::index_t(1)}) {
      auto const b = n == W ? simd::load_widen<F>(all.data() + at) : simd::load_widen_partial<F>(all.data() + at, n);
      b.store_unaligned(lanes.data());
      for (posenc::index_t i = 0; i < W; ++i) {
        float const want = i < n ? simd::widen<F>(all[at + static_cast<std::size_t>(i)]) : 0.0f;
        float const got = lanes[static_cast<std::size_t>(i)];
        vector_bad += (std::isnan(want) ? std::isnan(got) : float_bits(got) == float_bits(want)) ? 0 : 1;
      }
    }
  }
  CHECK(vector_bad == 0);

  // Narrowing: scalar against Eigen, vector against the scalar rule.
  std::vector<float> const x = narrowing_probes<F>();
  std::size_t narrow_bad = 0, nan_bad = 0, round_trip_bad = 0;
  for (float f : x) {
    std::uint16_t const got = simd::narrow<F>(f), want = eigen_narrow<F>(f);
    if (std::isnan(f)) nan_bad += is_nan16(F, got) && (got & 0x8000u) == ((float_bits(f) >> 16) & 0x8000u) ? 0 : 1;
    else narrow_bad += got == want ? 0 : 1;
  }
  for (std::uint32_t h = 0; h < 0x10000u; ++h)
    if (!is_nan16(F, static_cast<std::uint16_t>(h)))
      round_trip_bad += simd::narrow<F>(simd::widen<F>(static_cast<std::uint16_t>(h))) == h ? 0 : 1;
  CHECK(narrow_bad == 0);
  CHECK(nan_bad == 0);
  CHECK(round_trip_bad == 0);

  std::vector<std::uint16_t> out(static_cast<std::size_t>(W) + 2);
  std::size_t store_bad = 0;
  for (std::size_t at = 0; at + static_cast<std::size_t>(W) <= x.size(); at += static_cast<std::size_t>(W)) {
    auto const b = simd::load(x.data() + at);
    for (posenc::index_t n : {W, W - 1, posenc::index_t(1)}) {
      std::fill(out.begin(), out.end(), std::uint16_t(0xabcd));
      if (n == W) simd::store_narrow<F>(out.data() + 1, b);
      else simd::store_narrow_partial<F>(out.data() + 1, b, n);
      for (posenc::index_t i = 0; i < W + 1; ++i) {
        std::uint16_t const got = out[static_cast<std::size_t>(i) + 1];
        if (i >= n) {  // past the stored lanes: untouched
          store_bad += got == 0xabcd ? 0 : 1;
          continue;
        }
        float const f = x[at + static_cast<std::size_t>(i)];
        std::uint16_t const want = vector_narrow_rule<F>(f);
        store_bad += (std::isnan(f) ? is_nan16(F, got) : got == want) ? 0 : 1;
      }
      store_bad += out[0] == 0xabcd ? 0 : 1;
    }
  }
  CHECK(store_bad == 0);

  // load_widen_pair: 2 x W values widened exactly, in the order pair_order puts
  // two batches of consecutive floats in; pair_unorder undoes it. Every
  // encoding (NaN, Inf, subnormals included), at odd addresses.
  std::vector<float> a_lanes(static_cast<std::size_t>(W)), b_lanes(static_cast<std::size_t>(W));
  std::vector<float> wide(static_cast<std::size_t>(2 * W));
  std::size_t pair_bad = 0, order_bad = 0, unorder_bad = 0;
  for (std::size_t at = 1; at + static_cast<std::size_t>(2 * W) <= all.size(); at += static_cast<std::size_t>(2 * W)) {
    for (posenc::index_t i = 0; i < 2 * W; ++i)
      wide[static_cast<std::size_t>(i)] = simd::widen<F>(all[at + static_cast<std::size_t>(i)]);
    simd::batch<float> pa, pb;
    simd::load_widen_pair<F>(all.data() + at, pa, pb);
    simd::batch<float> oa = simd::load(wide.data()), ob = simd::load(wide.data() + W);
    simd::pair_order<F>(oa, ob);
    auto same = [](float g, float w) { return std::isnan(w) ? std::isnan(g) : float_bits(g) == float_bits(w); };
    pa.store_unaligned(a_lanes.data());
    pb.store_unaligned(b_lanes.data());
    std::vector<float> got(a_lanes);
    got.insert(got.end(), b_lanes.begin(), b_lanes.end());
    oa.store_unaligned(a_lanes.data());
    ob.store_unaligned(b_lanes.data());
    std::vector<float> ordered(a_lanes);
    ordered.insert(ordered.end(), b_lanes.begin(), b_lanes.end());
    // The pair order is a permutation of the 2 W values: its multiset is theirs
    // (each value found once; a NaN matches a NaN: the vector conversion may
    // quiet it), and order and load agree lane for lane.
    std::vector<bool> used(static_cast<std::size_t>(2 * W), false);
    for (std::size_t i = 0; i < got.size(); ++i) {
      pair_bad += same(got[i], ordered[i]) ? 0 : 1;
      bool found = false;
      for (std::size_t k = 0; k < wide.size() && !found; ++k)
        if (!used[k] && same(got[i], wide[k])) used[k] = found = true;
      order_bad += found ? 0 : 1;
    }
    simd::pair_unorder<F>(oa, ob);
    oa.store_unaligned(a_lanes.data());
    ob.store_unaligned(b_lanes.data());
    for (posenc::index_t i = 0; i < W; ++i) {
      unorder_bad += float_bits(a_lanes[static_cast<std::size_t>(i)]) == float_bits(wide[static_cast<std::size_t>(i)]) ? 0 : 1;
      unorder_bad += float_bits(b_lanes[static_cast<std::size_t>(i)]) == float_bits(wide[static_cast<std::size_t>(W + i)]) ? 0 : 1;
    }
  }
  CHECK(pair_bad == 0);
  CHECK(order_bad == 0);
  CHECK(unorder_bad == 0);
  // Where the order is the shim's own, it is the documented one: even, then odd elements.
  if constexpr (simd::widen_pair_permutes_v<F>) {
    std::vector<float> seq(static_cast<std::size_t>(2 * W));
    for (std::size_t i = 0; i < seq.size(); ++i) seq[i] = static_cast<float>(i);
    simd::batch<float> ea = simd::load(seq.data()), eb = simd::load(seq.data() + W);
    simd::pair_order<F>(ea, eb);
    ea.store_unaligned(a_lanes.data());
    eb.store_unaligned(b_lanes.data());
    for (posenc::index_t i = 0; i < W; ++i) {
      CHECK(a_lanes[static_cast<std::size_t>(i)] == static_cast<float>(2 * i));
      CHECK(b_lanes[static_cast<std::size_t>(i)] == static_cast<float>(2 * i + 1));
    }
  }
}

}  // namespace

TEST_CASE("simd: binary16 widening and narrowing agree with Eigen::half, rounding to nearest even", "[simd][half]") {
  check_half_format<half_format::binary16>();
  // The documented edges: overflow gives Inf (not 65504), ties go to even.
  CHECK(simd::narrow<half_format::binary16>(65519.0f) == 0x7bffu);
  CHECK(simd::narrow<half_format::binary16>(65520.0f) == 0x7c00u);
  CHECK(simd::narrow<half_format::binary16>(-1e9f) == 0xfc00u);
  CHECK(simd::narrow<half_format::binary16>(2.9802322e-8f) == 0x0000u);  // 2^-25: a tie, to even (0)
  CHECK(simd::narrow<half_format::binary16>(8.940697e-8f) == 0x0002u);   // 1.5 * 2^-24: a tie, to even (2)
  CHECK(simd::widen<half_format::binary16>(0x0001u) == 5.9604645e-8f);   // the smallest subnormal
}

TEST_CASE("simd: bfloat16 widening and narrowing agree with Eigen::bfloat16, rounding to nearest even", "[simd][half]") {
  check_half_format<half_format::bfloat16>();
  CHECK(simd::narrow<half_format::bfloat16>(1.00390625f) == 0x3f80u);  // 1 + 2^-8: a tie, to even (1)
  CHECK(simd::narrow<half_format::bfloat16>(1.01171875f) == 0x3f82u);  // 1 + 3 * 2^-8: a tie, to even
  CHECK(simd::narrow<half_format::bfloat16>(3.4028235e38f) == 0x7f80u);  // rounds past the largest: Inf
}
}  // namespace core_simd_tests
