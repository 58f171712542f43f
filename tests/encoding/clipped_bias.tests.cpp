// SPDX-License-Identifier: MIT
// clipped_bias: bias against the clipped-index formula, bias_row against bias, K = 0, tables.
#include <algorithm>
#include <posenc/encoding/clipped_bias.hpp>
#include <random>
#include <vector>

#include "support/catch.hpp"

namespace encoding_clipped_bias_tests {

using posenc::clipped_bias;
using posenc::index_t;

static_assert(posenc::biases_scores_v<clipped_bias<float>> && posenc::is_relative_v<clipped_bias<float>>);
static_assert(!posenc::relative_key_value_v<clipped_bias<double>>);

TEMPLATE_TEST_CASE("clipped_bias: bias is table[clip(k - q) + K, head]", "[clipped]", float, double) {
  using T = TestType;
  for (index_t k : {0, 1, 3, 8}) {
    index_t const heads = 3;
    posenc::relative_table<T> table(2 * k + 1, heads);
    for (index_t r = 0; r <= 2 * k; ++r)
      for (index_t h = 0; h < heads; ++h) table(r, h) = static_cast<T>(1000 * h + r);
    clipped_bias<T> c(k, heads, table);
    CHECK(c.max_distance() == k);
    CHECK(c.heads() == heads);
    for (index_t h = 0; h < heads; ++h)
      for (index_t qp = 0; qp < 30; ++qp)
        for (index_t kp = 0; kp < 30; ++kp) {
          index_t const r = std::clamp<index_t>(kp - qp, -k, k) + k;
          CHECK(c.bias(h, qp, kp) == static_cast<T>(1000 * h + r));
          CHECK(c.weight(r, h) == c.bias(h, qp, kp));
        }
  }
}

TEMPLATE_TEST_CASE("clipped_bias: bias_row equals bias for random rows, heads and offsets", "[clipped]", float,
                   double) {
  using T = TestType;
  std::mt19937_64 gen(3);
  for (index_t k : {0, 1, 2, 5, 16, 100}) {
    clipped_bias<T> c(k, 4, 17, 1.0);
    for (int trial = 0; trial < 300; ++trial) {
      index_t const count = std::uniform_int_distribution<index_t>(0, 300)(gen);
      index_t const base = trial % 3 == 0 ? (index_t(1) << 40) : 0;
      index_t const q_pos = base + std::uniform_int_distribution<index_t>(0, 400)(gen);
      index_t const k_first = base + std::uniform_int_distribution<index_t>(0, 400)(gen);
      index_t const head = std::uniform_int_distribution<index_t>(0, 3)(gen);
      std::vector<T> row(static_cast<std::size_t>(count + 2), T(0));
      row[static_cast<std::size_t>(count)] = row[static_cast<std::size_t>(count + 1)] = T(9);
      c.bias_row(head, q_pos, k_first, count, row.data());
      for (index_t j = 0; j < count; ++j) {
        INFO("K " << k << " head " << head << " q " << q_pos << " k " << k_first + j);
        REQUIRE(row[static_cast<std::size_t>(j)] == c.bias(head, q_pos, k_first + j));
      }
      CHECK(row[static_cast<std::size_t>(count)] == T(9));
      CHECK(row[static_cast<std::size_t>(count + 1)] == T(9));
    }
  }
  clipped_bias<T> c(3, 2, 1);
  std::vector<T> row(20, T(-1)), want(20);
  for (index_t j = 0; j < 20; ++j) want[static_cast<std::size_t>(j)] = T(-1) + c.bias(1, 9, j);
  c.add_bias(1, 9, 0, posenc::span<T>(row));
  CHECK(row == want);
}

TEST_CASE("clipped_bias: a Swin-style (query - key) table maps by reversing rows", "[clipped]") {
  // Swin 1-D analogue: row (p_i - p_j) + M - 1 with window M = K + 1.
  index_t const k = 4, heads = 2;
  posenc::relative_table<float> swin(2 * k + 1, heads), ours(2 * k + 1, heads);
  for (index_t r = 0; r <= 2 * k; ++r)
    for (index_t h = 0; h < heads; ++h) swin(r, h) = static_cast<float>(r * 10 + h);
  for (index_t r = 0; r <= 2 * k; ++r) ours.row(r) = swin.row(2 * k - r);
  clipped_bias<float> c(k, heads, ours);
  for (index_t h = 0; h < heads; ++h)
    for (index_t i = 0; i <= k; ++i)
      for (index_t j = 0; j <= k; ++j) CHECK(c.bias(h, i, j) == swin((i - j) + k, h));
}

TEST_CASE("clipped_bias: usage code of docs/encoders/relative.md", "[clipped][docs]") {
  // --- docs/encoders/relative.md: clipped_bias ---
  // Clip distance K = 2, 4 heads: a (2K + 1, heads) table, row r for distance key - query = r - K.
  posenc::relative_table<float> table = posenc::relative_table<float>::Zero(5, 4);
  table(0, 1) = -2.0f;  // head 1, keys 2 or more before the query
  table(4, 1) = 1.0f;   // head 1, keys 2 or more after the query
  posenc::clipped_bias<float> bias(/*max_distance=*/2, /*heads=*/4, table);
  posenc::clipped_bias<float> seeded(/*max_distance=*/2, /*heads=*/4, /*seed=*/7);  // truncated normal, std 0.02
  std::vector<float> row(10, 0.0f);
  bias.bias_row(1, 5, 0, 10, row.data());  // query at 5, keys 0..9
  // row = {-2, -2, -2, -2, 0, 0, 0, 1, 1, 1}
  // --- end ---
  std::vector<float> const want = {-2, -2, -2, -2, 0, 0, 0, 1, 1, 1};
  CHECK(row == want);
  CHECK(std::abs(seeded.weight(0, 0)) <= 0.04f);
}
}  // namespace encoding_clipped_bias_tests
