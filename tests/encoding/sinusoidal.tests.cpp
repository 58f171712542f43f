// SPDX-License-Identifier: MIT
// sinusoidal<T>: values against a scalar reference of docs/formulas.md 1.1-1.5, the cache, fill, add_to, fairseq positions.
#include <posenc/encoding/sinusoidal.hpp>

#include <cmath>
#include <cstring>
#include <vector>

#include <posenc/encoding/learned.hpp>

#include "support/catch.hpp"
#include "support/random.hpp"

namespace encoding_sinusoidal_tests {

using posenc::index_t;
using posenc::sinusoidal;
using posenc::sinusoidal_frequency;
using posenc::sinusoidal_layout;
using posenc::sinusoidal_params;

namespace {

// Scalar reference, written column by column from docs/formulas.md section 1.
double reference(sinusoidal_layout layout, sinusoidal_frequency freq, index_t d, double base, index_t p,
                 index_t c) {
  double const pd = static_cast<double>(p);
  if (layout == sinusoidal_layout::interleaved) {
    double const w = std::pow(base, -2.0 * static_cast<double>(c / 2) / static_cast<double>(d));
    return c % 2 == 0 ? std::sin(pd * w) : std::cos(pd * w);
  }
  if (freq == sinusoidal_frequency::paper) {
    index_t const s = (d + 1) / 2;
    index_t const k = c < s ? c : c - s;
    double const w = std::pow(base, -2.0 * static_cast<double>(k) / static_cast<double>(d));
    return c < s ? std::sin(pd * w) : std::cos(pd * w);
  }
  index_t const n = d / 2;
  if (c >= 2 * n) return 0.0;
  index_t const k = c < n ? c : c - n;
  double const div = n - 1 > 1 ? static_cast<double>(n - 1) : 1.0;
  // k * (ln(base) / div), associated as tensor2tensor and fairseq do (log_timescale_increment)
  double const w = std::exp(-static_cast<double>(k) * (std::log(base) / div));
  return c < n ? std::sin(pd * w) : std::cos(pd * w);
}

struct config {
  sinusoidal_layout layout;
  sinusoidal_frequency freq;
};
config const configs[] = {{sinusoidal_layout::interleaved, sinusoidal_frequency::paper},
                          {sinusoidal_layout::concatenated, sinusoidal_frequency::tensor2tensor},
                          {sinusoidal_layout::concatenated, sinusoidal_frequency::paper}};

}  // namespace

TEMPLATE_TEST_CASE("sinusoidal: value() equals the scalar reference rounded once", "[sinusoidal]", float, double) {
  for (auto const& cfg : configs) {
    for (index_t d : {1, 2, 3, 4, 7, 8, 33, 64}) {
      for (double base : {10000.0, 500.0, 1.5}) {
        sinusoidal<TestType> enc(d, cfg.layout, cfg.freq, base);
        for (index_t p : {0, 1, 2, 17, 1023, 1024, 4095, 65535, 1000003}) {
          for (index_t c = 0; c < d; ++c) {
            auto const want = static_cast<TestType>(reference(cfg.layout, cfg.freq, d, base, p, c));
            INFO("layout " << int(cfg.layout) << " d " << d << " base " << base << " p " << p << " c " << c);
            CHECK(enc.value(p, c) == want);
          }
        }
      }
    }
  }
}

TEST_CASE("sinusoidal: hand-checked rows", "[sinusoidal]") {
  // d = 4 interleaved: w = [1, 1, 0.01, 0.01].
  sinusoidal<double> il(4);
  CHECK(il.value(1, 0) == std::sin(1.0));
  CHECK(il.value(1, 1) == std::cos(1.0));
  CHECK(il.value(1, 2) == posenc_test::Approx(std::sin(0.01)).epsilon(1e-15));
  CHECK(il.value(1, 3) == posenc_test::Approx(std::cos(0.01)).epsilon(1e-15));
  CHECK(il.value(0, 0) == 0.0);
  CHECK(il.value(0, 1) == 1.0);
  // Odd d interleaved: the last column is a sine (ceil(d/2) sines).
  sinusoidal<double> odd(5);
  CHECK(odd.value(3, 4) == posenc_test::Approx(std::sin(3.0 * std::pow(10000.0, -4.0 / 5.0))).epsilon(1e-15));
  // tensor2tensor d = 2: the max(n-1, 1) guard gives w_0 = 1.
  sinusoidal<double> t2(2, sinusoidal_layout::concatenated, sinusoidal_frequency::tensor2tensor);
  CHECK(t2.value(2, 0) == std::sin(2.0));
  CHECK(t2.value(2, 1) == std::cos(2.0));
  // tensor2tensor slowest frequency is exactly 1/base: d = 8, n = 4, k = 3.
  sinusoidal<double> t8(8, sinusoidal_layout::concatenated, sinusoidal_frequency::tensor2tensor);
  CHECK(t8.value(10000, 3) == posenc_test::Approx(std::sin(1.0)).epsilon(1e-12));
  // tensor2tensor odd d: zero last column; d = 1 is a single zero column.
  sinusoidal<double> t7(7, sinusoidal_layout::concatenated, sinusoidal_frequency::tensor2tensor);
  sinusoidal<double> t1(1, sinusoidal_layout::concatenated, sinusoidal_frequency::tensor2tensor);
  for (index_t p : {0, 1, 5, 999}) {
    CHECK(t7.value(p, 6) == 0.0);
    CHECK(t1.value(p, 0) == 0.0);
  }
  // Concatenated paper d = 5: 3 sines then 2 cosines.
  sinusoidal<double> cp(5, sinusoidal_layout::concatenated, sinusoidal_frequency::paper);
  CHECK(cp.value(7, 2) == posenc_test::Approx(std::sin(7.0 * std::pow(10000.0, -4.0 / 5.0))).epsilon(1e-15));
  CHECK(cp.value(7, 3) == std::cos(7.0));
}

TEST_CASE("sinusoidal: parameters, accessors, traits", "[sinusoidal]") {
  sinusoidal_params p;
  p.d_model = 6;
  p.layout = sinusoidal_layout::concatenated;
  p.frequency = sinusoidal_frequency::tensor2tensor;
  p.base = 250.0;
  p.padding_idx = 1;
  p.cache_positions = 10;
  sinusoidal<float> enc(p);
  CHECK(enc.d_model() == 6);
  CHECK(enc.layout() == sinusoidal_layout::concatenated);
  CHECK(enc.frequency() == sinusoidal_frequency::tensor2tensor);
  CHECK(enc.base() == 250.0);
  CHECK(enc.padding_idx() == 1);
  CHECK(enc.cached_positions() == 10);
  CHECK(enc.max_positions() == 0);
  STATIC_REQUIRE(posenc::adds_to_embeddings_v<sinusoidal<float>>);
  STATIC_REQUIRE(!posenc::rotates_queries_keys_v<sinusoidal<float>>);
  STATIC_REQUIRE(!posenc::biases_scores_v<sinusoidal<double>>);
  STATIC_REQUIRE(!posenc::relative_key_value_v<sinusoidal<double>>);
  STATIC_REQUIRE(!posenc::is_relative_v<sinusoidal<double>>);
  // Padding row is zeros; its neighbours are not.
  for (index_t c = 0; c < 6; ++c) CHECK(enc.value(1, c) == 0.0f);
  CHECK(enc.value(0, 3) == 1.0f);  // cos(0)
  CHECK(enc.value(2, 0) != 0.0f);
}

TEMPLATE_TEST_CASE("sinusoidal: cached and computed rows are bit-identical; reserve grows", "[sinusoidal]", float,
                   double) {
  for (auto const& cfg : configs) {
    sinusoidal_params p;
    p.d_model = 37;
    p.layout = cfg.layout;
    p.frequency = cfg.freq;
    p.cache_positions = 0;
    sinusoidal<TestType> uncached(p);
    p.cache_positions = 50;
    sinusoidal<TestType> cached(p);
    CHECK(uncached.cached_positions() == 0);
    CHECK(cached.cached_positions() == 50);
    std::vector<TestType> a(static_cast<std::size_t>(60 * 37)), b(a.size());
    uncached.fill(0, 60, a);
    cached.fill(0, 60, b);
    CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(TestType)) == 0);
    sinusoidal<TestType> copy = cached;
    cached.reserve(80);
    CHECK(cached.cached_positions() == 80);
    CHECK(copy.cached_positions() == 50);
    cached.reserve(10);  // never shrinks
    CHECK(cached.cached_positions() == 80);
    std::vector<TestType> c(a.size());
    cached.fill(0, 60, c);
    CHECK(std::memcmp(a.data(), c.data(), a.size() * sizeof(TestType)) == 0);
    copy.fill(0, 60, c);
    CHECK(std::memcmp(a.data(), c.data(), a.size() * sizeof(TestType)) == 0);
    // fill from a non-zero first position straddling the cache edge
    std::vector<TestType> tail(static_cast<std::size_t>(20 * 37));
    copy.fill(40, 20, tail);
    for (index_t r = 0; r < 20; ++r)
      for (index_t col = 0; col < 37; ++col) CHECK(tail[static_cast<std::size_t>(r * 37 + col)] == copy.value(40 + r, col));
  }
}

TEMPLATE_TEST_CASE("sinusoidal: add_to with every position form, strided x, lengths around the SIMD width",
                   "[sinusoidal]", float, double) {
  constexpr index_t W = posenc::simd::width<TestType>;
  for (index_t d : {index_t(1), W - 1, W, W + 1, 4 * W - 1, 4 * W, 4 * W + 3, 9 * W + 1}) {
    if (d < 1) continue;
    sinusoidal_params sp;
    sp.d_model = d;
    sp.cache_positions = 6;  // positions past 6 take the computed-row path
    sinusoidal<TestType> enc(sp);
    index_t const B = 2, S = 5, pad = 3, row = d + pad;
    auto x0 = posenc_test::random_vector<TestType>(static_cast<std::size_t>(B * S * row), 11);
    std::vector<index_t> firsts = {0, 4};
    std::vector<index_t> ids = {3, 0, 9, 9, 100, 7, 2, 65535, 1, 0};
    posenc::position_span forms[] = {posenc::position_span(2), posenc::position_span::per_batch(firsts),
                                     posenc::position_span::ids(ids.data(), B, S),
                                     posenc::position_span::ids(ids.data(), 1, S)};
    for (auto const& pos : forms) {
      for (TestType scale : {TestType(1), TestType(0.5), TestType(22.627417)}) {
        auto x = x0;
        posenc::token_view<TestType> xv{x.data(), B, S, d, S * row, row, 1};
        enc.add_to(xv, pos, scale);
        for (index_t b = 0; b < B; ++b) {
          for (index_t s = 0; s < S; ++s) {
            for (index_t c = 0; c < row; ++c) {
              auto const i = static_cast<std::size_t>(b * S * row + s * row + c);
              if (c >= d) {
                CHECK(x[i] == x0[i]);  // the gap between rows is untouched
              } else if (scale == TestType(1)) {
                CHECK(x[i] == x0[i] + enc.value(pos.at(b, s), c));
              } else {
                // fused where the instruction set has FMA, else multiply then add
                TestType const v = enc.value(pos.at(b, s), c);
                TestType const fused = static_cast<TestType>(std::fma(x0[i], scale, v));
                TestType const unfused = x0[i] * scale + v;
                CHECK((x[i] == fused || x[i] == unfused));
              }
            }
          }
        }
      }
    }
  }
}

TEST_CASE("sinusoidal: empty inputs are fine", "[sinusoidal]") {
  sinusoidal<float> enc(8);
  std::vector<float> none;
  enc.add_to(posenc::make_bsd(none.data(), 0, 5, 8), posenc::position_span(0));
  enc.add_to(posenc::make_bsd(none.data(), 3, 0, 8), posenc::position_span(0));
  enc.fill(7, 0, none);
  CHECK(none.empty());
}

TEST_CASE("fairseq_positions: docs/formulas.md 1.4 by hand", "[sinusoidal][positions]") {
  // padding_idx 1; right padding, left padding, no padding.
  std::vector<index_t> tokens = {5, 6, 7, 1, 1,  //
                                 1, 1, 5, 6, 7,  //
                                 4, 4, 4, 4, 4};
  std::vector<index_t> out(15, -7);
  posenc::fairseq_positions(tokens, 3, 5, 1, out);
  std::vector<index_t> want = {2, 3, 4, 1, 1, 1, 1, 2, 3, 4, 2, 3, 4, 5, 6};
  CHECK(out == want);
  posenc::fairseq_positions(tokens, 3, 5, 1, out, 10);
  std::vector<index_t> want_past = {12, 13, 14, 1, 1, 1, 1, 12, 13, 14, 12, 13, 14, 15, 16};
  CHECK(out == want_past);
}

TEST_CASE("sinusoidal: fairseq padding gives zero rows and padding-independent encodings", "[sinusoidal]") {
  sinusoidal_params sp;
  sp.d_model = 16;
  sp.layout = sinusoidal_layout::concatenated;
  sp.frequency = sinusoidal_frequency::tensor2tensor;
  sp.padding_idx = 1;
  sinusoidal<float> enc(sp);
  std::vector<index_t> tokens = {5, 6, 7, 1, 1, 1, 1, 5, 6, 7};
  std::vector<index_t> ids(10);
  posenc::fairseq_positions(tokens, 2, 5, 1, ids);
  std::vector<float> x(2 * 5 * 16, 0.0f);
  enc.add_to(posenc::make_bsd(x.data(), 2, 5, 16), posenc::position_span::ids(ids.data(), 2, 5));
  for (index_t c = 0; c < 16; ++c) {
    for (index_t s = 0; s < 3; ++s) CHECK(x[static_cast<std::size_t>(s * 16 + c)] == x[static_cast<std::size_t>((7 + s) * 16 + c)]);
    CHECK(x[static_cast<std::size_t>(3 * 16 + c)] == 0.0f);
    CHECK(x[static_cast<std::size_t>(5 * 16 + c)] == 0.0f);
  }
  // the first real token sits at timestep 2 (padding_idx + 1), not 0
  CHECK(x[0] == static_cast<float>(std::sin(2.0)));
}

// The usage code of docs/encoders/absolute.md, compiled and checked here.
TEST_CASE("docs/encoders/absolute.md usage", "[sinusoidal][learned][docs]") {
  // --- begin docs snippet ---
  // x: token embeddings, (batch 2, seq 4, d_model 8), contiguous.
  std::vector<float> x(2 * 4 * 8, 0.0f);
  auto xv = posenc::make_bsd(x.data(), 2, 4, 8);

  // The 2017 paper's interleaved table; tokens at positions 0..3.
  posenc::sinusoidal<float> paper(8);
  paper.add_to(xv, posenc::position_span(0));

  // fairseq: concatenated, tensor2tensor frequencies, padding row 1.
  posenc::sinusoidal_params fp;
  fp.d_model = 8;
  fp.layout = posenc::sinusoidal_layout::concatenated;
  fp.frequency = posenc::sinusoidal_frequency::tensor2tensor;
  fp.padding_idx = 1;
  posenc::sinusoidal<float> fairseq(fp);
  std::vector<posenc::index_t> tokens = {1, 1, 7, 9, 4, 5, 6, 8};  // (2, 4); row 0 left-padded
  std::vector<posenc::index_t> ids(8);
  posenc::fairseq_positions(tokens, 2, 4, /*padding_idx=*/1, ids);
  fairseq.add_to(xv, posenc::position_span::ids(ids.data(), 2, 4));

  // BART: a learned table of 1024 + 2 rows, offset 2, a decode step after 3 cached tokens.
  std::vector<float> weights(1026 * 8, 0.01f);  // from the checkpoint
  auto bart = posenc::learned<float>::copy_of(weights, 1026, 8, /*offset=*/2);
  std::vector<float> step(2 * 1 * 8, 0.0f);
  bart.add_to(posenc::make_bsd(step.data(), 2, 1, 8), posenc::position_span(3));  // reads row 5

  // OPT with left padding: ids from the attention mask, -1 at padding (row 1).
  std::vector<int> mask = {0, 0, 1, 1, 1, 1, 1, 1};  // (2, 4)
  std::vector<posenc::index_t> opt_ids(8);
  posenc::positions_from_mask<int>(mask, 2, 4, 4, opt_ids, /*padding_position=*/-1);
  auto opt = posenc::learned<float>::random(2050, 8, /*seed=*/42, /*offset=*/2);
  std::vector<float> y(2 * 4 * 8, 0.0f);
  opt.add_to(posenc::make_bsd(y.data(), 2, 4, 8), posenc::position_span::ids(opt_ids.data(), 2, 4));

  // BART's 1024 positions resampled to 2048 (the two reserved rows are kept).
  auto longer = bart.extended(2048, /*align_corners=*/true);
  // --- end docs snippet ---
  CHECK(ids == std::vector<posenc::index_t>{1, 1, 2, 3, 2, 3, 4, 5});
  CHECK(opt_ids == std::vector<posenc::index_t>{-1, -1, 0, 1, 0, 1, 2, 3});
  CHECK(x[1] == 1.0f + fairseq.value(1, 1));  // padding row adds 0 on top of the paper row at 0
  CHECK(step[3] == 0.01f);
  CHECK(y[0] == opt.table()[1 * 8]);
  CHECK(longer.rows() == 2050);
  CHECK(longer.max_positions() == 2048);
}

TEST_CASE("sinusoidal and learned: a moved-from encoder stays usable", "[sinusoidal][learned]") {
  sinusoidal<float> a(8);
  sinusoidal<float> b = std::move(a);
  std::vector<float> x(2 * 8, 0.0f), y(2 * 8, 0.0f);
  a.add_to(posenc::make_bsd(x.data(), 1, 2, 8), posenc::position_span(3));  // NOLINT(bugprone-use-after-move)
  b.add_to(posenc::make_bsd(y.data(), 1, 2, 8), posenc::position_span(3));
  CHECK(x == y);
  std::vector<float> t(4 * 8, 0.25f);
  auto l = posenc::learned<float>::copy_of(t, 4, 8);
  auto m = std::move(l);
  CHECK(l.value(3, 7) == 0.25f);  // NOLINT(bugprone-use-after-move)
  CHECK(m.value(3, 7) == 0.25f);
}
}  // namespace encoding_sinusoidal_tests
