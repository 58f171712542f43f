// SPDX-License-Identifier: MIT
// clipped_bias: bias against the clipped-index formula, bias_row against bias, K = 0, tables.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <posenc/core/half.hpp>
#include <posenc/encoding/clipped_bias.hpp>
#include <random>
#include <utility>
#include <vector>

#include "support/catch.hpp"
#include "support/encoder_runs.hpp"
#include "support/random.hpp"

namespace encoding_clipped_bias_tests {

using posenc_test::random_buffer;
using posenc_test::as_table;
using posenc_test::bias_row_mismatches;

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


TEMPLATE_TEST_CASE("clipped_bias: view_of reads the caller's table in place, bit for bit an owned copy of it",
                   "[clipped][view]", float, Eigen::half) {
  using T = TestType;
  using posenc::detail::stored_value;
  // K >= 1: with K = 0 every key of a head gets one bias, which the softmax cancels (no step would show).
  // One head: the caller's layout is then contiguous too.
  for (auto [k, heads] : {std::pair<index_t, index_t>{1, 2}, {3, 2}, {40, 2}, {3, 1}}) {  // 40: a long window
    INFO("K " << k << " heads " << heads);
    index_t const rows = 2 * k + 1;
    std::vector<T> buf = random_buffer<T>(rows, heads, static_cast<std::uint64_t>(5 + k));
    auto const view = clipped_bias<T>::view_of(k, heads, posenc::span<const T>(buf));
    clipped_bias<T> const owned(k, heads, as_table(buf, rows, heads));
    CHECK_FALSE(view.owns_table());
    CHECK(owned.owns_table());
    std::size_t bad = 0;
    for (index_t r = 0; r < rows; ++r)
      for (index_t h = 0; h < heads; ++h) {
        bad += view.weight(r, h) != owned.weight(r, h) ? 1 : 0;
        bad += view.weight(r, h) != stored_value<float>(buf[static_cast<std::size_t>(r * heads + h)]) ? 1 : 0;
      }
    CHECK(bad == 0);
    CHECK(view.bias(heads - 1, 30, 2) == owned.bias(heads - 1, 30, 2));
    CHECK(bias_row_mismatches(view, owned, heads) == 0);
    CHECK(view.identity() == owned.identity());

    posenc_test::encoder_run_shape const s{heads, 8};
    auto const fused = posenc_test::attention_output<posenc::path::fused>(view, s);
    auto const reference = posenc_test::attention_output<posenc::path::reference>(view, s);
    CHECK(fused == posenc_test::attention_output<posenc::path::fused>(owned, s));
    CHECK(reference == posenc_test::attention_output<posenc::path::reference>(owned, s));

    // The gradients have the table's shape: an optimiser step on the buffer in place.
    auto const g = posenc_test::attention_encoder_gradients<posenc::path::fused>(view, s);
    CHECK(g.table == posenc_test::attention_encoder_gradients<posenc::path::fused>(owned, s).table);
    CHECK(posenc_test::attention_encoder_gradients<posenc::path::reference>(view, s).table ==
          posenc_test::attention_encoder_gradients<posenc::path::reference>(owned, s).table);
    REQUIRE(g.table.rows() == rows);
    REQUIRE(g.table.cols() == heads);
    auto const id_before = view.identity();
    std::size_t changed = 0;
    for (std::size_t i = 0; i < buf.size(); ++i) {
      T const old = buf[i];
      buf[i] = static_cast<T>(stored_value<float>(buf[i]) - 4.0f * g.table.data()[i]);
      changed += stored_value<float>(buf[i]) != stored_value<float>(old) ? 1 : 0;
    }
    REQUIRE(changed > 0);
    clipped_bias<T> const fresh(k, heads, as_table(buf, rows, heads));
    auto const fused_after = posenc_test::attention_output<posenc::path::fused>(view, s);
    CHECK(fused_after == posenc_test::attention_output<posenc::path::fused>(fresh, s));
    CHECK(fused_after != fused);
    CHECK(posenc_test::attention_output<posenc::path::reference>(view, s) ==
          posenc_test::attention_output<posenc::path::reference>(fresh, s));
    CHECK(bias_row_mismatches(view, fresh, heads) == 0);
    CHECK(view.identity() == fresh.identity());
    CHECK(view.identity() != id_before);
    // The owned copy kept the old values.
    CHECK(owned.identity() == id_before);
    CHECK(posenc_test::attention_output<posenc::path::fused>(owned, s) == fused);
  }
}

TEMPLATE_TEST_CASE("clipped_bias: copies outlive an owned original; copies of a view read the buffer",
                   "[clipped][view]", float, Eigen::half) {
  using T = TestType;
  index_t const heads = 3, k = 5, rows = 2 * k + 1;
  std::vector<T> buf = random_buffer<T>(rows, heads, 4);
  clipped_bias<T> const expect(k, heads, as_table(buf, rows, heads));
  {  // Owned: copy-constructed and copy-assigned, then the original goes.
    auto original = std::make_unique<clipped_bias<T>>(k, heads, as_table(buf, rows, heads));
    clipped_bias<T> copy = *original;
    clipped_bias<T> assigned(k, heads, 99);
    assigned = *original;
    original.reset();
    std::vector<T>(buf.size(), T(0)).swap(buf);  // the caller's table changes: owned copies keep theirs
    CHECK(copy.owns_table());
    CHECK(bias_row_mismatches(copy, expect, heads) == 0);
    CHECK(bias_row_mismatches(assigned, expect, heads) == 0);
    CHECK(copy.identity() == expect.identity());
    CHECK(assigned.identity() == expect.identity());
  }
  buf = random_buffer<T>(rows, heads, 4);
  {  // Borrowed: the copies read the same buffer, after the original goes too.
    auto original = std::make_unique<clipped_bias<T>>(clipped_bias<T>::view_of(k, heads, posenc::span<const T>(buf)));
    clipped_bias<T> copy = *original;
    clipped_bias<T> assigned(k, heads, 99);
    assigned = *original;
    original.reset();
    CHECK_FALSE(copy.owns_table());
    CHECK_FALSE(assigned.owns_table());
    CHECK(bias_row_mismatches(copy, expect, heads) == 0);
    for (auto& x : buf) x = static_cast<T>(-posenc::detail::stored_value<float>(x) + 0.25f);
    clipped_bias<T> const changed(k, heads, as_table(buf, rows, heads));
    CHECK(bias_row_mismatches(copy, changed, heads) == 0);
    CHECK(bias_row_mismatches(assigned, changed, heads) == 0);
    CHECK(bias_row_mismatches(copy, expect, heads) > 0);
    CHECK(copy.identity() == changed.identity());
  }
}
}  // namespace encoding_clipped_bias_tests
