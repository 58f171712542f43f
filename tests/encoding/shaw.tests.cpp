// SPDX-License-Identifier: MIT
// shaw: score_row and value_row against the direct formulas of Shaw et al. (docs/formulas.md 4.3).
#include <algorithm>
#include <cmath>
#include <limits>
#include <posenc/encoding/shaw.hpp>
#include <random>
#include <vector>

#include "support/catch.hpp"
#include "support/random.hpp"

namespace encoding_shaw_tests {

using posenc::index_t;
using posenc::shaw;

static_assert(posenc::relative_key_value_v<shaw<float>> && posenc::is_relative_v<shaw<float>>);
static_assert(!posenc::biases_scores_v<shaw<double>> && !posenc::adds_to_embeddings_v<shaw<double>>);

namespace {

template <class T>
posenc::relative_table<T> random_table(index_t rows, index_t cols, std::uint64_t seed) {
  auto v = posenc_test::random_vector<T>(static_cast<std::size_t>(rows * cols), seed);
  return Eigen::Map<posenc::relative_table<T>>(v.data(), rows, cols);
}

// Tolerance of a float sum of n products of values <= 1 in magnitude, against double.
template <class T>
double tol(index_t n) {
  return 4.0 * static_cast<double>(std::numeric_limits<T>::epsilon()) * static_cast<double>(n + 1) + 1e-30;
}

}  // namespace

TEMPLATE_TEST_CASE("shaw: score_row and value_row against the direct formulas", "[shaw]", float, double) {
  using T = TestType;
  std::mt19937_64 gen(8);
  for (index_t k : {1, 2, 4, 16}) {
    for (index_t dh : {1, 5, 16, 33}) {
      auto ak = random_table<T>(2 * k + 1, dh, 100 + static_cast<std::uint64_t>(k * 64 + dh));
      auto av = random_table<T>(2 * k + 1, dh, 200 + static_cast<std::uint64_t>(k * 64 + dh));
      shaw<T> s(k, ak, av);
      REQUIRE(s.has_values());
      REQUIRE(s.head_dim() == dh);
      for (int trial = 0; trial < 30; ++trial) {
        index_t const count = std::uniform_int_distribution<index_t>(0, 70)(gen);
        index_t const base = trial % 4 == 0 ? 123456789 : 0;
        index_t const q_pos = base + std::uniform_int_distribution<index_t>(0, 60)(gen);
        index_t const k_first = base + std::uniform_int_distribution<index_t>(0, 60)(gen);
        auto q = posenc_test::random_vector<T>(static_cast<std::size_t>(dh), static_cast<std::uint64_t>(trial));
        auto p = posenc_test::random_vector<T>(static_cast<std::size_t>(count) + 1,
                                               50u + static_cast<std::uint64_t>(trial), 0.0, 1.0);
        T const scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(dh)));
        // Direct formulas in double.
        std::vector<double> want_s(static_cast<std::size_t>(count)), want_v(static_cast<std::size_t>(dh), 0.5);
        for (index_t j = 0; j < count; ++j) {
          index_t const r = std::clamp<index_t>(k_first + j - q_pos, -k, k) + k;
          REQUIRE(s.row(q_pos, k_first + j) == r);
          double dotv = 0;
          for (index_t d = 0; d < dh; ++d) dotv += static_cast<double>(q[static_cast<std::size_t>(d)]) * ak(r, d);
          want_s[static_cast<std::size_t>(j)] = 0.25 + static_cast<double>(scale) * dotv;
          for (index_t d = 0; d < dh; ++d)
            want_v[static_cast<std::size_t>(d)] += static_cast<double>(p[static_cast<std::size_t>(j)]) * av(r, d);
        }
        std::vector<T> scores(static_cast<std::size_t>(count) + 1, T(0.25)),
            values(static_cast<std::size_t>(dh) + 1, T(0.5));
        scores[static_cast<std::size_t>(count)] = values[static_cast<std::size_t>(dh)] = T(-3);
        s.score_row(q.data(), q_pos, k_first, count, scale, scores.data());
        s.value_row(p.data(), q_pos, k_first, count, values.data());
        INFO("K " << k << " head_dim " << dh << " q " << q_pos << " k " << k_first << " count " << count);
        for (index_t j = 0; j < count; ++j)
          CHECK(std::abs(scores[static_cast<std::size_t>(j)] - want_s[static_cast<std::size_t>(j)]) <= tol<T>(dh));
        for (index_t d = 0; d < dh; ++d)
          CHECK(std::abs(values[static_cast<std::size_t>(d)] - want_v[static_cast<std::size_t>(d)]) <= tol<T>(count));
        CHECK(scores[static_cast<std::size_t>(count)] == T(-3));
        CHECK(values[static_cast<std::size_t>(dh)] == T(-3));
      }
    }
  }
}

TEST_CASE("shaw: far keys share one row; keys-only encoders add no values", "[shaw]") {
  auto ak = random_table<float>(5, 8, 1);
  shaw<float> s(2, ak);
  CHECK_FALSE(s.has_values());
  std::vector<float> q(8, 0.5f), row(40, 0.0f), out(8, 1.0f), p(40, 0.25f);
  s.score_row(q.data(), 20, 0, 40, 1.0f, row.data());
  for (index_t j = 0; j <= 18; ++j) CHECK(row[static_cast<std::size_t>(j)] == row[0]);   // distance <= -2
  for (index_t j = 22; j < 40; ++j) CHECK(row[static_cast<std::size_t>(j)] == row[39]);  // distance >= 2
  s.value_row(p.data(), 20, 0, 40, out.data());
  for (float x : out) CHECK(x == 1.0f);
  // Seeded tables: deterministic, both terms.
  shaw<double> a(3, 4, posenc::shaw_terms::keys_and_values, 9), b(3, 4, posenc::shaw_terms::keys_and_values, 9);
  shaw<double> c(3, 4, posenc::shaw_terms::keys, 9);
  CHECK(a.has_values());
  CHECK_FALSE(c.has_values());
  for (index_t r = 0; r < 7; ++r)
    for (index_t d = 0; d < 4; ++d) {
      CHECK(a.key_weight(r, d) == b.key_weight(r, d));
      CHECK(a.value_weight(r, d) == b.value_weight(r, d));
      CHECK(a.key_weight(r, d) == c.key_weight(r, d));
      CHECK(std::abs(a.value_weight(r, d)) <= 0.04);
    }
}

TEST_CASE("shaw: usage code of docs/encoders/relative.md", "[shaw][docs]") {
  // --- docs/encoders/relative.md: shaw ---
  // Clip distance K = 4, head_dim 64: aK and aV are (2K + 1, head_dim), shared by the heads.
  posenc::index_t const k = 4, head_dim = 64;
  posenc::relative_table<float> a_k = posenc::relative_table<float>::Constant(2 * k + 1, head_dim, 0.01f);
  posenc::relative_table<float> a_v = posenc::relative_table<float>::Constant(2 * k + 1, head_dim, 0.02f);
  posenc::shaw<float> rel(k, a_k, a_v);
  // One query vector at position 10 against keys 0..15: scores gain scale * q . aK(j - i).
  std::vector<float> q(head_dim, 1.0f), scores(16, 0.0f);
  float const scale = 1.0f / 8.0f;  // 1 / sqrt(head_dim)
  rel.add_scores(posenc::span<const float>(q), 10, 0, scale, posenc::span<float>(scores));
  // One row of probabilities over the same keys: the output gains sum_j p_j aV(j - i).
  std::vector<float> p(16, 1.0f / 16.0f), z(head_dim, 0.0f);
  rel.add_values(posenc::span<const float>(p), 10, 0, posenc::span<float>(z));
  // --- end ---
  CHECK(scores[0] == posenc_test::Approx(0.08f));
  CHECK(z[0] == posenc_test::Approx(0.02f));
}
}  // namespace encoding_shaw_tests
