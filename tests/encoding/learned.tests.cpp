// SPDX-License-Identifier: MIT
// learned<T>: owning and borrowed tables, offsets, the seeded init, fill/add_to, extension, mask positions.
#include <posenc/encoding/learned.hpp>

#include <cmath>
#include <cstring>
#include <vector>

#include "support/catch.hpp"
#include "support/random.hpp"

namespace encoding_learned_tests {

using posenc::index_t;
using posenc::learned;

namespace {
template <class T>
std::vector<T> ramp_table(index_t rows, index_t d) {
  std::vector<T> t(static_cast<std::size_t>(rows * d));
  for (index_t r = 0; r < rows; ++r)
    for (index_t c = 0; c < d; ++c) t[static_cast<std::size_t>(r * d + c)] = static_cast<T>(100 * r + c);
  return t;
}
}  // namespace

TEMPLATE_TEST_CASE("learned: copy_of owns a copy, view_of reads the caller's table", "[learned]", float, double) {
  auto w = ramp_table<TestType>(6, 3);
  auto owned = learned<TestType>::copy_of(w, 6, 3);
  auto borrowed = learned<TestType>::view_of(w, 6, 3);
  CHECK(owned.owns_table());
  CHECK(!borrowed.owns_table());
  CHECK(borrowed.table().data() == w.data());
  CHECK(owned.table().data() != w.data());
  CHECK(owned.rows() == 6);
  CHECK(owned.d_model() == 3);
  CHECK(owned.offset() == 0);
  CHECK(owned.max_positions() == 6);
  w[4 * 3 + 1] = TestType(-5);
  CHECK(owned.value(4, 1) == TestType(401));
  CHECK(borrowed.value(4, 1) == TestType(-5));
  // copies of an owning encoder share its (immutable) table
  auto copy = owned;
  CHECK(copy.table().data() == owned.table().data());
}

TEST_CASE("learned: offsets shift rows; max_positions = rows - offset", "[learned]") {
  auto w = ramp_table<float>(10, 2);
  auto bart = learned<float>::copy_of(w, 10, 2, 2);
  CHECK(bart.offset() == 2);
  CHECK(bart.max_positions() == 8);
  CHECK(bart.value(0, 1) == 201.0f);
  CHECK(bart.value(7, 0) == 900.0f);
  CHECK(bart.value(-1, 0) == 100.0f);  // OPT's padding id -1 reads row 1
  CHECK(bart.value(-2, 0) == 0.0f);
  auto plain = bart.with_offset(0);
  CHECK(plain.value(0, 1) == 1.0f);
  CHECK(plain.max_positions() == 10);
  CHECK(plain.table().data() == bart.table().data());
  std::vector<float> out(3 * 2);
  bart.fill(1, 3, out);
  CHECK(out == std::vector<float>{300, 301, 400, 401, 500, 501});
  STATIC_REQUIRE(posenc::adds_to_embeddings_v<learned<float>>);
  STATIC_REQUIRE(!posenc::is_relative_v<learned<float>>);
  STATIC_REQUIRE(!posenc::biases_scores_v<learned<double>>);
  STATIC_REQUIRE(!posenc::rotates_queries_keys_v<learned<double>>);
  STATIC_REQUIRE(!posenc::relative_key_value_v<learned<double>>);
}

TEMPLATE_TEST_CASE("learned: add_to equals lookup + add for every position form and width", "[learned]", float,
                   double) {
  constexpr index_t W = posenc::simd::width<TestType>;
  for (index_t d : {index_t(1), W - 1, W + 1, 4 * W, 4 * W + 5}) {
    if (d < 1) continue;
    index_t const rows = 40, B = 3, S = 4, gap = 2, row = d + gap;
    auto table = posenc_test::random_vector<TestType>(static_cast<std::size_t>(rows * d), 5);
    auto enc = learned<TestType>::copy_of(table, rows, d, 2);
    auto x0 = posenc_test::random_vector<TestType>(static_cast<std::size_t>(B * S * row), 6);
    std::vector<index_t> firsts = {0, 10, 34};
    std::vector<index_t> ids = {-2, -1, 0, 37, 5, 5, 5, 5, 36, 1, 2, 3};
    posenc::position_span forms[] = {posenc::position_span(7), posenc::position_span::per_batch(firsts),
                                     posenc::position_span::ids(ids.data(), B, S),
                                     posenc::position_span::ids(ids.data(), 1, S)};
    for (auto const& pos : forms) {
      for (TestType scale : {TestType(1), TestType(-0.25)}) {
        auto x = x0;
        enc.add_to(posenc::token_view<TestType>{x.data(), B, S, d, S * row, row, 1}, pos, scale);
        for (index_t b = 0; b < B; ++b) {
          for (index_t s = 0; s < S; ++s) {
            for (index_t c = 0; c < row; ++c) {
              auto const i = static_cast<std::size_t>((b * S + s) * row + c);
              if (c >= d) {
                CHECK(x[i] == x0[i]);
                continue;
              }
              TestType const v = table[static_cast<std::size_t>((pos.at(b, s) + 2) * d + c)];
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

TEST_CASE("learned: the seeded truncated normal", "[learned]") {
  auto a = learned<float>::random(512, 64, 1234);
  auto b = learned<float>::random(512, 64, 1234);
  auto c = learned<float>::random(512, 64, 1235);
  REQUIRE(a.table().size() == 512 * 64);
  CHECK(std::memcmp(a.table().data(), b.table().data(), 512 * 64 * sizeof(float)) == 0);
  CHECK(std::memcmp(a.table().data(), c.table().data(), 512 * 64 * sizeof(float)) != 0);
  double sum = 0, sq = 0, mx = 0;
  for (float v : a.table()) {
    sum += v;
    sq += static_cast<double>(v) * v;
    mx = std::max(mx, std::abs(static_cast<double>(v)));
  }
  double const n = 512.0 * 64.0;
  double const mean = sum / n, sd = std::sqrt(sq / n - mean * mean);
  CHECK(mx <= static_cast<double>(static_cast<float>(0.04)));  // truncated at 2 sigma
  CHECK(mx > 0.039);                                            // and the tails are used
  CHECK(std::abs(mean) < 3e-4);                                 // 3 standard errors: 3 * 0.0176 / 181
  CHECK(sd == posenc_test::Approx(0.02 * 0.87962566).epsilon(0.01));  // realised std of a 2-sigma cut
  // another stddev, a padding row, an offset
  auto r = learned<double>::random(20, 7, 9, 2, 0.5, 1);
  CHECK(r.offset() == 2);
  for (index_t col = 0; col < 7; ++col) CHECK(r.value(-1, col) == 0.0);
  double rmax = 0;
  for (double v : r.table()) rmax = std::max(rmax, std::abs(v));
  CHECK(rmax <= 1.0);
  CHECK(rmax > 0.0);
  auto z = learned<float>::random(3, 2, 9, 0, 0.0);
  for (float v : z.table()) CHECK(v == 0.0f);
}

TEST_CASE("learned: extended() to the same length is the identity in both modes", "[learned]") {
  auto t = posenc_test::random_vector<double>(9 * 4, 3);
  auto enc = learned<double>::copy_of(t, 9, 4, 1);
  for (bool ac : {false, true}) {
    auto same = enc.extended(8, ac);
    CHECK(same.owns_table());
    CHECK(same.offset() == 1);
    CHECK(same.rows() == 9);
    CHECK(same.max_positions() == 8);
    for (index_t i = 0; i < 36; ++i) CHECK(same.table()[i] == t[static_cast<std::size_t>(i)]);
  }
}

TEST_CASE("learned: extended() keeps the reserved rows and resamples the position rows", "[learned]") {
  auto t = posenc_test::random_vector<double>(12 * 3, 8);
  auto enc = learned<double>::copy_of(t, 12, 3, 2);  // rows 0, 1 reserved; positions 0..9
  std::vector<double> positions(t.begin() + 2 * 3, t.end());
  auto plain = learned<double>::copy_of(positions, 10, 3);
  for (index_t n : {1, 5, 10, 23}) {
    for (bool ac : {false, true}) {
      auto ext = enc.extended(n, ac);
      auto ref = plain.extended(n, ac);
      REQUIRE(ext.rows() == n + 2);
      CHECK(ext.offset() == 2);
      CHECK(ext.max_positions() == n);
      for (index_t c = 0; c < 3; ++c) {
        CHECK(ext.value(-2, c) == enc.value(-2, c));
        CHECK(ext.value(-1, c) == enc.value(-1, c));
        for (index_t p = 0; p < n; ++p) CHECK(ext.value(p, c) == ref.value(p, c));
      }
    }
  }
}

TEST_CASE("learned: extended() by hand (docs/formulas.md 2.3)", "[learned]") {
  // two rows [0] and [10] -> four rows
  std::vector<double> t = {0.0, 10.0};
  auto enc = learned<double>::copy_of(t, 2, 1);
  auto ac = enc.extended(4, true);  // x = t / 3
  CHECK(ac.value(0, 0) == 0.0);
  CHECK(ac.value(1, 0) == posenc_test::Approx(10.0 / 3.0));
  CHECK(ac.value(2, 0) == posenc_test::Approx(20.0 / 3.0));
  CHECK(ac.value(3, 0) == 10.0);
  auto pt = enc.extended(4, false);  // x = max((t + 0.5) / 2 - 0.5, 0) = 0, 0.25, 0.75, 1.25
  CHECK(pt.value(0, 0) == 0.0);
  CHECK(pt.value(1, 0) == 2.5);
  CHECK(pt.value(2, 0) == 7.5);
  CHECK(pt.value(3, 0) == 10.0);  // clamped to the last row
  auto one = enc.extended(1, true);
  CHECK(one.value(0, 0) == 0.0);
  auto one_pt = enc.extended(1, false);  // x = 0.5
  CHECK(one_pt.value(0, 0) == 5.0);
}

TEST_CASE("positions_from_mask: GPT-2 and OPT by hand; decode step = last prefill column", "[learned][positions]") {
  std::vector<unsigned char> mask = {0, 0, 1, 1, 1,  //
                                     1, 1, 1, 1, 1,  //
                                     1, 0, 1, 1, 0};
  std::vector<index_t> gpt2(15), opt(15), step(3);
  posenc::positions_from_mask<unsigned char>(mask, 3, 5, 5, gpt2);
  posenc::positions_from_mask<unsigned char>(mask, 3, 5, 5, opt, -1);
  CHECK(gpt2 == std::vector<index_t>{1, 1, 0, 1, 2, 0, 1, 2, 3, 4, 0, 1, 1, 2, 1});
  CHECK(opt == std::vector<index_t>{-1, -1, 0, 1, 2, 0, 1, 2, 3, 4, 0, -1, 1, 2, -1});
  posenc::positions_from_mask<unsigned char>(mask, 3, 5, 1, step, -1);
  for (index_t b = 0; b < 3; ++b) CHECK(step[static_cast<std::size_t>(b)] == opt[static_cast<std::size_t>(b * 5 + 4)]);
  std::vector<index_t> two(6);
  posenc::positions_from_mask<unsigned char>(mask, 3, 5, 2, two, -1);
  CHECK(two == std::vector<index_t>{1, 2, 3, 4, 2, -1});
}

TEST_CASE("learned: the padding row gets no gradient, as nn.Embedding(padding_idx); other rows read for padding do",
          "[learned][backward]") {
  // RoBERTa's layout: offset 2, row 1 read at position -1 for padding tokens.
  index_t const rows = 8, dm = 3, B = 2, S = 4, offset = 2;
  std::vector<index_t> const ids = {-1, -1, 0, 1, 0, 1, 2, -1};  // (B, S), -1 = padding
  auto const dx = posenc_test::random_vector<float>(static_cast<std::size_t>(B * S * dm), 91);
  auto const dxv = posenc::make_bsd(static_cast<float const*>(dx.data()), B, S, dm);
  auto const pos = posenc::position_span::ids(ids.data(), B, S);
  // The scatter-add of every token into the row it read, then the padding row cleared when there is one.
  // The gradient has the table's shape, (rows, d_model).
  posenc::gradient_tensor<float> every_row = posenc::gradient_tensor<float>::Zero(rows, dm);
  for (index_t t = 0; t < B * S; ++t)
    for (index_t c = 0; c < dm; ++c)
      every_row(ids[static_cast<std::size_t>(t)] + offset, c) += dx[static_cast<std::size_t>(t * dm + c)];
  auto without_padding_row = every_row;
  without_padding_row.row(1).setZero();
  REQUIRE(every_row(1, 0) != 0.0f);

  auto const opt_like = learned<float>::random(rows, dm, 3u, offset);  // OPT, BART: row 1 learns
  CHECK(opt_like.padding_row() == -1);
  auto g = opt_like.make_gradients();
  opt_like.add_to_backward(dxv, pos, g);
  CHECK(g.table == every_row);

  auto const roberta = learned<float>::random(rows, dm, 3u, offset, 0.02, 1);  // nn.Embedding(padding_idx=1)
  CHECK(roberta.padding_row() == 1);
  for (index_t c = 0; c < dm; ++c) CHECK(roberta.table()[dm + c] == 0.0f);
  auto g2 = roberta.make_gradients();
  roberta.add_to_backward(dxv, pos, g2);
  CHECK(g2.table == without_padding_row);

  // The same through with_padding_row on a caller's table, and kept by extended() (a reserved row).
  auto const table = ramp_table<float>(rows, dm);
  auto const copied = learned<float>::copy_of(posenc::span<const float>(table.data(), rows * dm), rows, dm, offset)
                          .with_padding_row(1);
  auto g3 = copied.make_gradients();
  copied.add_to_backward(dxv, pos, g3);
  CHECK(g3.table == without_padding_row);
  CHECK(copied.extended(10).padding_row() == 1);
  CHECK(copied.with_padding_row(-1).padding_row() == -1);
  CHECK(copied.identity() != copied.with_padding_row(-1).identity());
  CHECK_THROWS_WITH(copied.with_padding_row(rows), posenc_test::contains("row is 8, expected -1 (none) or in [0, 8)"));
}
}  // namespace encoding_learned_tests
