// SPDX-License-Identifier: MIT
// Properties of the relative encoders: shift invariance, bucket shape, slopes, softmax equivalence.
//
// Postconditions checked:
//  1. bias(h, i + c, j + c) == bias(h, i, j) for T5, clipped, ALiBi paper/symmetric and the Shaw
//     terms, for many shifts c; ALiBi key_only/shifted change by one constant per row.
//  2. T5 buckets lie in [0, N), are monotone in |delta| within each direction, unidirectional
//     future keys land in bucket 0, bidirectional never produces bucket N/2.
//  3. ALiBi slopes for 8 heads are 2^-1 .. 2^-8; a non-power-of-two model starts with the
//     slopes of the largest power of two below it.
//  4. Under a causal mask the paper, key_only and shifted forms give the same probabilities.
//  5. Clipped bias and Shaw rows are constant beyond the clip distance.
#include <cmath>
#include <posenc/encoding/alibi.hpp>
#include <posenc/encoding/clipped_bias.hpp>
#include <posenc/encoding/shaw.hpp>
#include <posenc/encoding/t5_bias.hpp>
#include <random>
#include <vector>

#include "support/catch.hpp"
#include "support/random.hpp"

namespace properties_relative_bias_tests {

using posenc::alibi;
using posenc::alibi_form;
using posenc::index_t;

namespace {

std::vector<index_t> shifts() {
  std::vector<index_t> c = {0, 1, 2, 7, 64, 1000, 123457, index_t(1) << 40};
  std::mt19937_64 gen(77);
  for (int t = 0; t < 12; ++t) c.push_back(std::uniform_int_distribution<index_t>(0, 1 << 20)(gen));
  return c;
}

/// bias and the kernels' bias_row rows are equal under every shift, and the
/// encoder says so (shift_invariant(), which lets fused attention compute one
/// diagonal per tile).
template <class E>
void check_shift_invariant(E const& e, index_t heads) {
  using T = typename E::value_type;
  REQUIRE(e.shift_invariant());
  for (index_t c : shifts())
    for (index_t h = 0; h < heads; ++h)
      for (index_t i = 0; i < 40; i += 3) {
        for (index_t j = 0; j < 300; j += 7) REQUIRE(e.bias(h, i + c, j + c) == e.bias(h, i, j));
        std::vector<T> row(127, T(0)), shifted(127, T(0));
        e.bias_row(h, i, 0, 127, row.data());
        e.bias_row(h, i + c, c, 127, shifted.data());
        REQUIRE(row == shifted);
      }
}

}  // namespace

TEST_CASE("property 1: shift invariance of the biases", "[properties]") {
  check_shift_invariant(posenc::t5_bias<float>({4, true}, 1, 1.0), 4);
  check_shift_invariant(posenc::t5_bias<float>({4, false}, 2, 1.0), 4);
  check_shift_invariant(posenc::t5_bias<double>({2, true, 16, 40}, 3, 1.0), 2);
  check_shift_invariant(posenc::clipped_bias<float>(5, 3, 4, 1.0), 3);
  check_shift_invariant(posenc::clipped_bias<double>(0, 2, 5, 1.0), 2);
  // ALiBi paper and symmetric in double: the distances stay exact for these shifts.
  check_shift_invariant(alibi<double>(alibi_form::paper, 12), 12);
  check_shift_invariant(alibi<double>(alibi_form::symmetric, 6), 6);
  check_shift_invariant(alibi<float>(alibi_form::paper, 8), 8);

  // key_only and shifted: a shift adds m * c to every key of the row (one constant per row).
  for (auto form : {alibi_form::key_only, alibi_form::shifted}) {
    alibi<double> a(form, 6, form == alibi_form::shifted ? (index_t(1) << 41) : 0);
    CHECK_FALSE(a.shift_invariant());
    for (index_t c : shifts())
      for (index_t h = 0; h < 6; ++h)
        for (index_t i = 0; i < 40; i += 3) {
          double const base = a.bias(h, i + c, c) - a.bias(h, i, 0);
          CHECK(base == posenc_test::Approx(a.slope(h) * static_cast<double>(c)).epsilon(1e-12));
          for (index_t j = 0; j < 300; j += 7)
            REQUIRE(a.bias(h, i + c, j + c) - a.bias(h, i, j) == posenc_test::Approx(base).epsilon(1e-12).margin(1e-9));
        }
  }
}

TEST_CASE("property 1: shift invariance of the Shaw terms", "[properties]") {
  posenc::shaw<double> s(3, 6, posenc::shaw_terms::keys_and_values, 11, 1.0);
  auto q = posenc_test::random_vector<double>(6, 1);
  auto p = posenc_test::random_vector<double>(50, 2, 0.0, 1.0);
  for (index_t c : shifts())
    for (index_t i = 0; i < 60; i += 7) {
      std::vector<double> s0(50, 0.0), s1(50, 0.0), v0(6, 0.0), v1(6, 0.0);
      s.score_row(q.data(), i, 5, 50, 0.5, s0.data());
      s.score_row(q.data(), i + c, 5 + c, 50, 0.5, s1.data());
      s.value_row(p.data(), i, 5, 50, v0.data());
      s.value_row(p.data(), i + c, 5 + c, 50, v1.data());
      REQUIRE(s0 == s1);
      REQUIRE(v0 == v1);
    }
}

TEST_CASE("property 2: shape of the T5 buckets", "[properties]") {
  struct setting {
    index_t nb, md;
  };
  for (bool bi : {true, false})
    for (auto s :
         {setting{32, 128}, setting{64, 128}, setting{4, 3}, setting{16, 1000}, setting{10, 11}, setting{6, 100}}) {
      posenc::t5_bias<float> t({1, bi, s.nb, s.md}, 0);
      index_t prev_past = -1, prev_future = -1;
      for (index_t n = 0; n <= 5000; ++n) {
        index_t const past = t.bucket(-n), future = t.bucket(n);
        INFO("bidirectional " << bi << " N " << s.nb << " D " << s.md << " n " << n);
        REQUIRE(past >= 0);
        REQUIRE(past < s.nb);
        REQUIRE(future >= 0);
        REQUIRE(future < s.nb);
        REQUIRE(past >= prev_past);  // monotone in |delta| on the past side
        prev_past = past;
        if (bi) {
          REQUIRE(past < s.nb / 2);  // past side: the lower half
          REQUIRE(past != s.nb / 2);
          REQUIRE(future != s.nb / 2);  // bucket N/2 would be delta = 0 on the future side
          if (n > 0) {
            REQUIRE(future > s.nb / 2);
            REQUIRE(future >= prev_future);  // monotone on the future side
            prev_future = future;
          }
        } else if (n > 0) {
          REQUIRE(future == 0);  // future keys share bucket 0 with delta = 0
        }
      }
      // Both sides saturate at their last bucket.
      CHECK(t.bucket(-s.md) == (bi ? s.nb / 2 : s.nb) - 1);
      if (bi) CHECK(t.bucket(s.md) == s.nb - 1);
    }
}

TEST_CASE("property 3: ALiBi slopes", "[properties]") {
  alibi<float> a(alibi_form::paper, 8);
  for (index_t h = 0; h < 8; ++h) CHECK(a.slope(h) == std::ldexp(1.0f, -static_cast<int>(h + 1)));
  for (index_t heads : {3, 6, 12, 20, 40, 112}) {
    index_t c = 1;
    while (2 * c <= heads) c *= 2;
    auto all = posenc::alibi_slopes(heads), first = posenc::alibi_slopes(c), twice = posenc::alibi_slopes(2 * c);
    for (index_t h = 0; h < c; ++h) CHECK(all[static_cast<std::size_t>(h)] == first[static_cast<std::size_t>(h)]);
    // The rest are the odd-numbered slopes of 2c heads: m_1, m_3, m_5, ...
    for (index_t t = 0; t < heads - c; ++t)
      CHECK(all[static_cast<std::size_t>(c + t)] ==
            posenc_test::Approx(twice[static_cast<std::size_t>(2 * t)]).epsilon(1e-15));
    for (std::size_t h = 1; h < all.size(); ++h) CHECK(all[h] > 0.0);
  }
}

TEST_CASE("property 4: causal ALiBi forms give the same probabilities", "[properties]") {
  index_t const sk = 37, heads = 12;
  alibi<double> paper(alibi_form::paper, heads), key_only(alibi_form::key_only, heads),
      shifted(alibi_form::shifted, heads, sk), symmetric(alibi_form::symmetric, heads);
  auto scores = posenc_test::random_vector<double>(static_cast<std::size_t>(sk), 4, -2.0, 2.0);
  auto softmax = [&](alibi<double> const& a, index_t h, index_t i) {
    std::vector<double> s(static_cast<std::size_t>(i + 1));  // causal: keys 0..i
    for (index_t j = 0; j <= i; ++j) s[static_cast<std::size_t>(j)] = scores[static_cast<std::size_t>(j)];
    a.bias_row(h, i, 0, i + 1, s.data());
    double mx = s[0], z = 0;
    for (double x : s) mx = std::max(mx, x);
    for (double& x : s) z += (x = std::exp(x - mx));
    for (double& x : s) x /= z;
    return s;
  };
  for (index_t h = 0; h < heads; ++h)
    for (index_t i = 0; i < sk; ++i) {
      auto a = softmax(paper, h, i), b = softmax(key_only, h, i), c = softmax(shifted, h, i),
           d = softmax(symmetric, h, i);
      for (std::size_t j = 0; j < a.size(); ++j) {
        REQUIRE(b[j] == posenc_test::Approx(a[j]).epsilon(1e-12).margin(1e-15));
        REQUIRE(c[j] == posenc_test::Approx(a[j]).epsilon(1e-12).margin(1e-15));
        REQUIRE(d[j] == posenc_test::Approx(a[j]).epsilon(1e-12).margin(1e-15));  // keys <= query: same as paper
      }
    }
  // Without the mask, symmetric differs from paper for keys after the query.
  CHECK(symmetric.bias(0, 3, 10) != paper.bias(0, 3, 10));
}

TEST_CASE("property 5: clipped and Shaw rows are constant beyond the clip distance", "[properties]") {
  index_t const k = 6;
  posenc::clipped_bias<float> c(k, 2, 9, 1.0);
  std::vector<float> row(200, 0.0f);
  c.bias_row(1, 100, 0, 200, row.data());
  for (index_t j = 0; j <= 100 - k; ++j) REQUIRE(row[static_cast<std::size_t>(j)] == c.weight(0, 1));
  for (index_t j = 100 + k; j < 200; ++j) REQUIRE(row[static_cast<std::size_t>(j)] == c.weight(2 * k, 1));
  for (index_t j = 100 - k + 1; j < 100 + k; ++j) REQUIRE(row[static_cast<std::size_t>(j)] == c.weight(j - 100 + k, 1));
}
}  // namespace properties_relative_bias_tests
