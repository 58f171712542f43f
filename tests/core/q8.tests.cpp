// SPDX-License-Identifier: MIT
// 8-bit blocks (posenc::q8_block): the error bound of docs/formulas.md 7.1, zeros, partial blocks, rejected input.
#include <posenc/core/q8.hpp>

#include <cmath>
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "support/catch.hpp"

namespace core_q8_tests {

using posenc::index_t;

namespace {

// The bound of docs/formulas.md 7.1: s / 2, or max(s / 2, 127 x 2^-25) for a block whose scale
// is not a normal float16 (1 + 2^-20: the float division's rounding of max|x| / 127).
double bound(float scale) {
  double const s = static_cast<double>(scale);
  return s >= std::ldexp(1.0, -14) ? s / 2 : std::max(s / 2, std::ldexp(127.0, -25) * (1 + std::ldexp(1.0, -20)));
}

std::vector<posenc::q8_block> quantize(std::vector<float> const& x) {
  std::vector<posenc::q8_block> b(static_cast<std::size_t>(posenc::q8_blocks(static_cast<index_t>(x.size()))));
  REQUIRE(posenc::quantize_q8(x.data(), static_cast<index_t>(x.size()), b.data()));
  return b;
}

}  // namespace

TEST_CASE("q8: 34-byte blocks of 32 values; q8_blocks counts a partial last block", "[core][q8]") {
  STATIC_REQUIRE(sizeof(posenc::q8_block) == 34);
  CHECK(posenc::q8_blocks(0) == 0);
  CHECK(posenc::q8_blocks(1) == 1);
  CHECK(posenc::q8_blocks(32) == 1);
  CHECK(posenc::q8_blocks(33) == 2);
  CHECK(posenc::q8_blocks(80) == 3);
  CHECK(posenc::q8_blocks(128) == 4);
}

TEST_CASE("q8: every value within the bound of its block, at every magnitude and head dim", "[core][q8]") {
  std::mt19937_64 rng(7);
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<double> expo(-30.0, 14.0);
  double worst = 0;  // the largest error / bound seen
  for (index_t n : {1, 16, 31, 32, 33, 64, 80, 96, 128, 200})
    for (int trial = 0; trial < 40; ++trial) {
      std::vector<float> x(static_cast<std::size_t>(n));
      double const mag = std::exp2(expo(rng));  // 1e-9 .. 2e4 (x 50 for an outlier): subnormal, normal, large scales
      for (float& v : x) v = static_cast<float>(normal(rng) * mag);
      if (trial % 5 == 0) x[static_cast<std::size_t>(trial) % x.size()] *= 50.0f;  // an outlier channel
      auto const blocks = quantize(x);
      std::vector<float> back(x.size());
      posenc::dequantize_q8(blocks.data(), n, back.data());
      for (index_t i = 0; i < n; ++i) {
        auto const at = static_cast<std::size_t>(i);
        posenc::q8_block const& blk = blocks[at / 32];
        float const s = static_cast<float>(blk.scale);
        double const e = std::fabs(static_cast<double>(x[at]) - back[at]);
        INFO("n " << n << " value " << i << " = " << x[at] << ", scale " << s);
        REQUIRE(e <= bound(s));
        REQUIRE(back[at] == s * static_cast<float>(blk.q[i % 32]));  // exact product
        REQUIRE(blk.q[i % 32] >= -127);
        worst = std::max(worst, e / bound(s));
      }
      // Past a partial block's values: q 0.
      for (index_t i = n; i < posenc::q8_blocks(n) * 32; ++i) REQUIRE(blocks.back().q[i % 32] == 0);
    }
  CHECK(worst > 0.9);  // the bound is reached, not loose
}

TEST_CASE("q8: the scale is max|x| / 127 rounded once into float16, and the largest value maps to +-127",
          "[core][q8]") {
  std::vector<float> x(32);
  for (index_t i = 0; i < 32; ++i) x[static_cast<std::size_t>(i)] = 0.01f * static_cast<float>(i - 12);
  x[20] = -3.7f;
  auto const b = quantize(x);
  CHECK(static_cast<float>(b[0].scale) == static_cast<float>(Eigen::half(3.7f / 127.0f)));
  CHECK(b[0].q[20] == -127);
  // Values on the grid of a scale that is max / 127 exactly come back unchanged.
  std::vector<float> grid(64);
  for (index_t i = 0; i < 64; ++i)
    grid[static_cast<std::size_t>(i)] = std::ldexp(static_cast<float>((i * 37) % 255 - 127), i < 32 ? -6 : 3);
  grid[0] = std::ldexp(127.0f, -6);
  grid[32] = std::ldexp(-127.0f, 3);
  auto const g = quantize(grid);
  std::vector<float> back(grid.size());
  posenc::dequantize_q8(g.data(), 64, back.data());
  CHECK(back == grid);
}

TEST_CASE("q8: a block of zeros stores scale 0 and q 0; negative zeros too", "[core][q8]") {
  std::vector<float> x(40, 0.0f);
  for (index_t i = 32; i < 40; ++i) x[static_cast<std::size_t>(i)] = -0.0f;
  auto const b = quantize(x);
  for (auto const& blk : b) {
    CHECK(static_cast<float>(blk.scale) == 0.0f);
    CHECK_FALSE(std::signbit(static_cast<float>(blk.scale)));
    for (std::int8_t v : blk.q) CHECK(v == 0);
  }
}

TEST_CASE("q8: NaN, infinities and values past the float16 scale are rejected before anything is written",
          "[core][q8]") {
  float const inf = std::numeric_limits<float>::infinity();
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), inf, -inf, 65504.0f * 128.0f, -1e30f}) {
    INFO("bad value " << bad);
    std::vector<float> x(70, 1.0f);
    x[45] = bad;
    x[60] = std::numeric_limits<float>::quiet_NaN();  // a later one: the first is named
    if (std::isfinite(bad)) x[60] = 2.0f;
    std::vector<posenc::q8_block> out(3);
    std::memset(static_cast<void*>(out.data()), 0x5a, out.size() * sizeof(posenc::q8_block));
    posenc::q8_result const r = posenc::quantize_q8(x.data(), 70, out.data());
    CHECK_FALSE(r);
    CHECK(r.at == 45);
    CHECK(r.reason == (std::isfinite(bad) ? posenc::q8_reject::too_large : posenc::q8_reject::non_finite));
    for (auto const& blk : out) {
      unsigned char const* p = reinterpret_cast<unsigned char const*>(&blk);
      for (std::size_t i = 0; i < sizeof blk; ++i) REQUIRE(p[i] == 0x5a);
    }
  }
  // The largest value the scale holds: 65504 x 127 (its scale rounds to 65504, not to infinity).
  std::vector<float> big(32, 1.0f);
  big[3] = 65504.0f * 127.0f;
  auto const b = quantize(big);
  CHECK(static_cast<float>(b[0].scale) == 65504.0f);
  CHECK(b[0].q[3] == 127);
}

}  // namespace core_q8_tests
