// SPDX-License-Identifier: MIT
// alibi: slopes, the four bias forms against their formulas, bias_row against bias, shards.
#include <cmath>
#include <limits>
#include <posenc/encoding/alibi.hpp>
#include <posenc/encoding/compose.hpp>
#include <posenc/encoding/t5_bias.hpp>
#include <random>
#include <vector>

#include "support/catch.hpp"

namespace encoding_alibi_tests {

using posenc::alibi;
using posenc::alibi_form;
using posenc::index_t;

static_assert(posenc::biases_scores_v<alibi<float>> && posenc::is_relative_v<alibi<float>>);
static_assert(!posenc::adds_to_embeddings_v<alibi<double>> && !posenc::rotates_queries_keys_v<alibi<double>> &&
              !posenc::relative_key_value_v<alibi<double>>);

namespace {

// The formula of docs/formulas.md 4.2 in double.
double direct(alibi_form form, double m, index_t qp, index_t kp, index_t key_length) {
  switch (form) {
    case alibi_form::paper:
      return -m * static_cast<double>(qp - kp);
    case alibi_form::key_only:
      return m * static_cast<double>(kp);
    case alibi_form::shifted:
      return m * static_cast<double>(kp - (key_length - 1));
    case alibi_form::symmetric:
      return -m * std::abs(static_cast<double>(qp - kp));
  }
  return 0;
}

alibi_form const all_forms[] = {alibi_form::paper, alibi_form::key_only, alibi_form::shifted, alibi_form::symmetric};

template <class T>
alibi<T> make(alibi_form f, index_t heads, index_t key_length) {
  return alibi<T>(f, heads, f == alibi_form::shifted ? key_length : 0);
}

}  // namespace

TEMPLATE_TEST_CASE("alibi: paper slopes, caller slopes and shards", "[alibi]", float, double) {
  using T = TestType;
  auto const s12 = posenc::alibi_slopes(12);
  REQUIRE(s12.size() == 12u);
  for (int h = 0; h < 8; ++h) CHECK(s12[static_cast<std::size_t>(h)] == std::ldexp(1.0, -(h + 1)));
  for (int t = 0; t < 4; ++t)
    CHECK(s12[static_cast<std::size_t>(8 + t)] == posenc_test::Approx(std::pow(2.0, -0.5 - t)).epsilon(1e-15));

  alibi<T> a(alibi_form::paper, 12);
  for (index_t h = 0; h < 12; ++h) CHECK(a.slope(h) == static_cast<T>(s12[static_cast<std::size_t>(h)]));

  // A shard of heads 4..8 of a 12-head model uses the model's slopes 4..8.
  alibi<T> shard(alibi_form::paper, 5, posenc::head_shard{4, 12});
  CHECK(shard.heads() == 5);
  CHECK(shard.head_offset() == 4);
  CHECK(shard.total_heads() == 12);
  for (index_t h = 0; h < 5; ++h) {
    CHECK(shard.slope(h) == a.slope(4 + h));
    CHECK(shard.bias(h, 7, 2) == a.bias(4 + h, 7, 2));
  }

  // Caller-given slopes, whole model and a shard of it.
  std::vector<T> given = {T(0.3), T(0.2), T(0.1)};
  alibi<T> g(alibi_form::symmetric, 3, posenc::span<const T>(given));
  for (index_t h = 0; h < 3; ++h) CHECK(g.slope(h) == given[static_cast<std::size_t>(h)]);
  alibi<T> gs(alibi_form::symmetric, 2, posenc::head_shard{1, 3}, posenc::span<const T>(given));
  CHECK(gs.slope(0) == given[1]);
  CHECK(gs.slope(1) == given[2]);
  CHECK(gs.bias(1, 10, 4) == static_cast<T>(6) * -given[2]);
}

TEMPLATE_TEST_CASE("alibi: bias of each form against the formula", "[alibi]", float, double) {
  using T = TestType;
  index_t const key_length = 40;
  for (auto form : all_forms) {
    auto a = make<T>(form, 6, key_length);
    auto const m = posenc::alibi_slopes(6);
    for (index_t h = 0; h < 6; ++h)
      for (index_t qp = 0; qp < key_length; qp += 3)
        for (index_t kp = 0; kp < key_length; ++kp) {
          double const want = direct(form, m[static_cast<std::size_t>(h)], qp, kp, key_length);
          CHECK(static_cast<double>(a.bias(h, qp, kp)) == posenc_test::Approx(want).epsilon(1e-6).margin(1e-12));
        }
  }
  // The shifted form gives 0 to the newest key and paper == shifted + m * (q - (L - 1)).
  alibi<T> sh(alibi_form::shifted, 4, key_length), pa(alibi_form::paper, 4);
  for (index_t h = 0; h < 4; ++h) {
    CHECK(sh.bias(h, 5, key_length - 1) == T(0));
    CHECK(pa.bias(h, key_length - 1, 3) == sh.bias(h, 11, 3));
  }
}

TEMPLATE_TEST_CASE("alibi: bias_row equals bias for random rows, heads and offsets", "[alibi]", float, double) {
  using T = TestType;
  std::mt19937_64 gen(11);
  for (auto form : all_forms) {
    for (int trial = 0; trial < 200; ++trial) {
      index_t const heads = std::uniform_int_distribution<index_t>(1, 20)(gen);
      index_t const count = std::uniform_int_distribution<index_t>(0, 130)(gen);
      bool const big = trial % 4 == 0;  // KV-cache offsets up to a million
      index_t const span_max = big ? 1000000 : 300;
      index_t const key_length = count + std::uniform_int_distribution<index_t>(1, span_max)(gen);
      index_t const k_first = std::uniform_int_distribution<index_t>(0, key_length - count)(gen);
      index_t const q_pos = std::uniform_int_distribution<index_t>(0, key_length - 1)(gen);
      index_t const head = std::uniform_int_distribution<index_t>(0, heads - 1)(gen);
      auto a = make<T>(form, heads, key_length);
      // Zeroed row: exactly the scalar bias; guards after the end stay untouched.
      std::vector<T> row(static_cast<std::size_t>(count + 3), T(0));
      row[static_cast<std::size_t>(count)] = row[static_cast<std::size_t>(count + 1)] =
          row[static_cast<std::size_t>(count + 2)] = T(-777);
      a.bias_row(head, q_pos, k_first, count, row.data());
      for (index_t j = 0; j < count; ++j) {
        INFO("form " << static_cast<int>(form) << " head " << head << " q " << q_pos << " k " << k_first + j);
        REQUIRE(row[static_cast<std::size_t>(j)] == a.bias(head, q_pos, k_first + j));
      }
      for (int g = 0; g < 3; ++g) CHECK(row[static_cast<std::size_t>(count + g)] == T(-777));
      // A non-zero row: bias_row adds.
      std::vector<T> acc(static_cast<std::size_t>(count));
      for (index_t j = 0; j < count; ++j) acc[static_cast<std::size_t>(j)] = static_cast<T>(j % 7) - T(3);
      a.bias_row(head, q_pos, k_first, count, acc.data());
      for (index_t j = 0; j < count; ++j) {
        double const init = static_cast<double>(j % 7) - 3.0, b = static_cast<double>(a.bias(head, q_pos, k_first + j));
        // One rounding of the sum (two if it is fused): within 1 ulp of the larger operand.
        double const tol = static_cast<double>(std::numeric_limits<T>::epsilon()) * (std::abs(init) + std::abs(b));
        CHECK(std::abs(static_cast<double>(acc[static_cast<std::size_t>(j)]) - (init + b)) <= tol);
      }
    }
  }
}

TEMPLATE_TEST_CASE("alibi: key length, max_positions and add_bias", "[alibi]", float, double) {
  using T = TestType;
  alibi<T> sh(alibi_form::shifted, 8, 16);
  CHECK(sh.key_length() == 16);
  CHECK(sh.max_positions() == 16);
  auto next = sh.with_key_length(17);  // one decoding step later
  CHECK(next.key_length() == 17);
  CHECK(next.bias(2, 16, 16) == T(0));
  CHECK(next.bias(2, 16, 15) == -sh.slope(2));
  CHECK(alibi<T>(alibi_form::paper, 8).max_positions() == 0);
  CHECK(alibi<T>(alibi_form::key_only, 8).key_length() == 0);

  std::vector<T> out(10, T(1));
  sh.add_bias(3, 9, 6, posenc::span<T>(out));
  for (index_t j = 0; j < 10; ++j) CHECK(out[static_cast<std::size_t>(j)] == T(1) + sh.bias(3, 9, 6 + j));
}

TEST_CASE("alibi: compose with a T5 bias adds both", "[alibi]") {
  alibi<float> a(alibi_form::paper, 4);
  posenc::t5_bias<float> t({4}, 3);
  posenc::compose<alibi<float>, posenc::t5_bias<float>> c(a, t);
  static_assert(posenc::biases_scores_v<decltype(c)> && posenc::is_relative_v<decltype(c)>);
  CHECK(c.heads() == 4);
  std::vector<float> row(50, 0.0f);
  c.bias_row(2, 30, 0, 50, row.data());
  for (index_t j = 0; j < 50; ++j)
    CHECK(row[static_cast<std::size_t>(j)] == posenc_test::Approx(a.bias(2, 30, j) + t.bias(2, 30, j)));
}

TEST_CASE("alibi: usage code of docs/encoders/relative.md", "[alibi][docs]") {
  // --- docs/encoders/relative.md: alibi ---
  // BLOOM-7b1: 32 heads, key-only form; a tensor-parallel shard serves heads 8..15.
  posenc::alibi<float> bloom(posenc::alibi_form::key_only, 32);
  posenc::alibi<float> shard(posenc::alibi_form::key_only, 8, posenc::head_shard{8, 32});
  // MPT: the shifted form needs the key length L; the next decoding step uses L + 1.
  posenc::alibi<float> mpt(posenc::alibi_form::shifted, 32, /*key_length=*/100);
  posenc::alibi<float> mpt_next = mpt.with_key_length(101);
  // The bias of head 3 for a query at position 99 against keys 0..99, added into a row.
  std::vector<float> row(100, 0.0f);
  mpt.bias_row(3, 99, 0, 100, row.data());             // unchecked hook, as the kernels call it
  shard.add_bias(0, 99, 0, posenc::span<float>(row));  // checked: throws posenc::error on bad input
  float b = bloom.bias(8, 99, 40);                     // one entry: slope(8) * 40
  // --- end ---
  CHECK(b == bloom.slope(8) * 40.0f);
  CHECK(shard.slope(0) == bloom.slope(8));
  CHECK(mpt_next.key_length() == 101);
  CHECK(row[99] == posenc_test::Approx(0.0f + shard.bias(0, 99, 99)));
}
}  // namespace encoding_alibi_tests
