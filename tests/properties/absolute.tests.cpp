// SPDX-License-Identifier: MIT
// Properties of the absolute encoders, numbered as postconditions.
//  1. PE(p + k) = M_k PE(p) for the interleaved table (M_k: 2x2 rotation blocks built from PE(k)).
//  2. Every sinusoidal value is in [-1, 1].
//  3. Rows are distinct over 10,000 positions.
//  4. The concatenated-paper table is a fixed column permutation of the interleaved one.
//  5. Interpolation (align_corners = true) keeps the end rows and is exact on linear tables; both modes
//     reproduce row 0 when growing and are exact on linear tables inside the clamped range.
//  6. add_to equals lookup + add (random shapes, strides, positions); fairseq left and right padding
//     give real tokens the same encodings.
#include <posenc/encoding/learned.hpp>
#include <posenc/encoding/sinusoidal.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <set>
#include <vector>

#include "support/catch.hpp"
#include "support/random.hpp"

namespace properties_absolute_tests {

using posenc::index_t;
using posenc::sinusoidal_frequency;
using posenc::sinusoidal_layout;

TEST_CASE("property 1: PE(p + k) = M_k PE(p), interleaved", "[properties][sinusoidal]") {
  std::mt19937_64 gen(17);
  std::uniform_int_distribution<index_t> pos(0, 20000), shift(0, 3000);
  for (index_t d : {2, 8, 64, 65}) {
    posenc::sinusoidal_params sp;
    sp.d_model = d;
    sp.cache_positions = 0;
    posenc::sinusoidal<double> pe(sp);
    for (int trial = 0; trial < 40; ++trial) {
      index_t const p = pos(gen), k = shift(gen);
      for (index_t j = 0; 2 * j + 1 < d; ++j) {
        double const sk = pe.value(k, 2 * j), ck = pe.value(k, 2 * j + 1);
        double const sp_ = pe.value(p, 2 * j), cp = pe.value(p, 2 * j + 1);
        // [sin(a+b), cos(a+b)] = [[cos b, sin b], [-sin b, cos b]] [sin a, cos a]
        INFO("d " << d << " p " << p << " k " << k << " pair " << j);
        CHECK(std::abs(pe.value(p + k, 2 * j) - (ck * sp_ + sk * cp)) < 1e-9);
        CHECK(std::abs(pe.value(p + k, 2 * j + 1) - (ck * cp - sk * sp_)) < 1e-9);
      }
    }
  }
}

TEST_CASE("property 2: every sinusoidal value is in [-1, 1]", "[properties][sinusoidal]") {
  for (auto layout : {sinusoidal_layout::interleaved, sinusoidal_layout::concatenated}) {
    for (auto freq : {sinusoidal_frequency::paper, sinusoidal_frequency::tensor2tensor}) {
      if (layout == sinusoidal_layout::interleaved && freq == sinusoidal_frequency::tensor2tensor) continue;
      for (index_t d : {7, 96}) {
        posenc::sinusoidal_params sp;
        sp.d_model = d;
        sp.layout = layout;
        sp.frequency = freq;
        sp.cache_positions = 0;
        posenc::sinusoidal<float> pe(sp);
        std::vector<float> rows(static_cast<std::size_t>(2000 * d));
        for (index_t first : {index_t(0), index_t(123456789)}) {
          pe.fill(first, 2000, rows);
          float lo = 2, hi = -2;
          for (float v : rows) {
            lo = std::min(lo, v);
            hi = std::max(hi, v);
          }
          CHECK(lo >= -1.0f);
          CHECK(hi <= 1.0f);
          CHECK(hi > 0.99f);  // and the range is used
          CHECK(lo < -0.99f);
        }
      }
    }
  }
}

TEST_CASE("property 3: rows are distinct over 10,000 positions", "[properties][sinusoidal]") {
  for (auto freq : {sinusoidal_frequency::paper, sinusoidal_frequency::tensor2tensor}) {
    for (index_t d : {8, 64}) {
      posenc::sinusoidal_params sp;
      sp.d_model = d;
      sp.layout = sinusoidal_layout::concatenated;
      sp.frequency = freq;
      sp.cache_positions = 0;
      posenc::sinusoidal<float> pe(sp);
      std::vector<float> rows(static_cast<std::size_t>(10000 * d));
      pe.fill(0, 10000, rows);
      std::set<std::vector<float>> seen;
      for (index_t p = 0; p < 10000; ++p)
        seen.emplace(rows.begin() + p * d, rows.begin() + (p + 1) * d);
      CHECK(seen.size() == 10000u);
    }
  }
}

TEST_CASE("property 4: concatenated-paper = a fixed permutation of interleaved", "[properties][sinusoidal]") {
  for (index_t d : {1, 2, 7, 8, 64, 65}) {
    posenc::sinusoidal<double> il(d, sinusoidal_layout::interleaved);
    posenc::sinusoidal<double> cp(d, sinusoidal_layout::concatenated, sinusoidal_frequency::paper);
    index_t const sines = (d + 1) / 2;
    for (index_t p : {0, 1, 5, 999, 4096, 65535, 1000000}) {
      for (index_t c = 0; c < d; ++c) {
        index_t const from = c < sines ? 2 * c : 2 * (c - sines) + 1;
        CHECK(cp.value(p, c) == il.value(p, from));
      }
    }
  }
}

TEST_CASE("property 5: interpolation keeps the ends and is exact on linear tables", "[properties][learned]") {
  for (index_t L : {2, 5, 17}) {
    for (index_t n : {3, 10, 40}) {
      index_t const d = 4;
      auto t = posenc_test::random_vector<double>(static_cast<std::size_t>(L * d), 100 + L);
      auto enc = posenc::learned<double>::copy_of(t, L, d);
      auto ac = enc.extended(n, true);
      for (index_t c = 0; c < d; ++c) {
        CHECK(ac.value(0, c) == enc.value(0, c));
        CHECK(ac.value(n - 1, c) == enc.value(L - 1, c));
      }
      auto pt = enc.extended(n, false);
      if (n >= L) {
        for (index_t c = 0; c < d; ++c) CHECK(pt.value(0, c) == enc.value(0, c));
      }
      // linear table W[r, c] = a_c + b_c r
      std::vector<double> lin(static_cast<std::size_t>(L * d));
      double const a[4] = {0.5, -1.0, 3.0, 0.0}, b[4] = {0.25, 2.0, -0.125, 1.0};
      for (index_t r = 0; r < L; ++r)
        for (index_t c = 0; c < d; ++c) lin[static_cast<std::size_t>(r * d + c)] = a[c] + b[c] * static_cast<double>(r);
      auto le = posenc::learned<double>::copy_of(lin, L, d);
      auto lac = le.extended(n, true), lpt = le.extended(n, false);
      for (index_t tt = 0; tt < n; ++tt) {
        double const x_ac = static_cast<double>(tt) * static_cast<double>(L - 1) / static_cast<double>(n - 1);
        double const x_pt = std::clamp((static_cast<double>(tt) + 0.5) * static_cast<double>(L) / static_cast<double>(n) - 0.5,
                                       0.0, static_cast<double>(L - 1));
        for (index_t c = 0; c < d; ++c) {
          CHECK(std::abs(lac.value(tt, c) - (a[c] + b[c] * x_ac)) < 1e-12);
          CHECK(std::abs(lpt.value(tt, c) - (a[c] + b[c] * x_pt)) < 1e-12);
        }
      }
    }
  }
}

TEMPLATE_TEST_CASE("property 6: add_to = lookup + add on random shapes", "[properties]", float, double) {
  std::mt19937_64 gen(99);
  std::uniform_int_distribution<index_t> dim(1, 70), len(0, 9), bat(1, 3), pos(0, 2500);
  for (int trial = 0; trial < 25; ++trial) {
    index_t const d = dim(gen), S = len(gen), B = bat(gen), gap = len(gen);
    index_t const row = d + gap;
    posenc::sinusoidal_params sp;
    sp.d_model = d;
    sp.layout = trial % 2 ? sinusoidal_layout::interleaved : sinusoidal_layout::concatenated;
    sp.frequency = trial % 3 == 0 && !(trial % 2) ? sinusoidal_frequency::tensor2tensor : sinusoidal_frequency::paper;
    sp.cache_positions = 300;
    posenc::sinusoidal<TestType> sin_enc(sp);
    auto table = posenc_test::random_vector<TestType>(static_cast<std::size_t>(2600 * d), 7 + trial);
    auto lrn = posenc::learned<TestType>::view_of(table, 2600, d, 1);
    std::vector<index_t> ids(static_cast<std::size_t>(B * S));
    for (auto& v : ids) v = pos(gen);
    auto const x0 = posenc_test::random_vector<TestType>(static_cast<std::size_t>(B * S * row + 1), 50 + trial);
    // views start one element in: a misaligned base pointer
    auto run = [&](auto const& enc, auto lookup) {
      auto x = x0;
      posenc::token_view<TestType> xv{x.data() + 1, B, S, d, S * row, row, 1};
      enc.add_to(xv, posenc::position_span::ids(ids.data(), B, S));
      CHECK(x[0] == x0[0]);
      for (index_t b = 0; b < B; ++b)
        for (index_t s = 0; s < S; ++s)
          for (index_t c = 0; c < row; ++c) {
            auto const i = static_cast<std::size_t>(1 + (b * S + s) * row + c);
            TestType const want = c < d ? x0[i] + lookup(ids[static_cast<std::size_t>(b * S + s)], c) : x0[i];
            CHECK(x[i] == want);
          }
    };
    run(sin_enc, [&](index_t p, index_t c) { return sin_enc.value(p, c); });
    run(lrn, [&](index_t p, index_t c) { return table[static_cast<std::size_t>((p + 1) * d + c)]; });
  }
}

TEST_CASE("property 6b: fairseq left and right padding give the real tokens the same encodings", "[properties]") {
  posenc::sinusoidal_params sp;
  sp.d_model = 12;
  sp.layout = sinusoidal_layout::concatenated;
  sp.frequency = sinusoidal_frequency::tensor2tensor;
  sp.padding_idx = 1;
  posenc::sinusoidal<float> enc(sp);
  for (index_t real = 0; real <= 6; ++real) {
    index_t const S = 6;
    std::vector<index_t> tok(static_cast<std::size_t>(2 * S), 1);
    for (index_t s = 0; s < real; ++s) {
      tok[static_cast<std::size_t>(s)] = 10 + s;                  // row 0: right padded
      tok[static_cast<std::size_t>(S + S - real + s)] = 10 + s;  // row 1: left padded
    }
    std::vector<index_t> ids(tok.size());
    posenc::fairseq_positions(tok, 2, S, 1, ids);
    std::vector<float> x(static_cast<std::size_t>(2 * S * 12), 0.0f);
    enc.add_to(posenc::make_bsd(x.data(), 2, S, 12), posenc::position_span::ids(ids.data(), 2, S));
    for (index_t s = 0; s < real; ++s)
      for (index_t c = 0; c < 12; ++c)
        CHECK(x[static_cast<std::size_t>(s * 12 + c)] == x[static_cast<std::size_t>((S + S - real + s) * 12 + c)]);
    for (index_t s = real; s < S; ++s)
      for (index_t c = 0; c < 12; ++c) CHECK(x[static_cast<std::size_t>(s * 12 + c)] == 0.0f);
  }
}
}  // namespace properties_absolute_tests
