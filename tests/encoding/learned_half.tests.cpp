// SPDX-License-Identifier: MIT
// learned<Eigen::half / Eigen::bfloat16>: a 16-bit table gives exactly the float result of the widened table.
#include <posenc/core/half.hpp>
#include <posenc/encoding/learned.hpp>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/random.hpp"
#include "support/strided_buffer.hpp"

namespace encoding_learned_half_tests {

using posenc::index_t;
using posenc::learned;
using posenc::position_span;

namespace {

using posenc_test::bits;
using posenc_test::widen;

/// The 16-bit value nearest to x (ties to the even encoding), by brute force over x's neighbours.
template <class S>
std::uint16_t nearest(double x) {
  std::uint16_t const h = bits(posenc::detail::to_storage<S>(static_cast<float>(x)));
  std::uint16_t best = h;
  for (int delta : {-1, 1}) {
    std::uint16_t const c = static_cast<std::uint16_t>(h + delta);
    double const dc = std::abs(double(widen(Eigen::numext::bit_cast<S>(c))) - x);
    double const db = std::abs(double(widen(Eigen::numext::bit_cast<S>(best))) - x);
    if (dc < db || (dc == db && (c & 1u) == 0 && (best & 1u) != 0)) best = c;
  }
  return best;
}

}  // namespace

TEMPLATE_TEST_CASE("learned 16-bit: the table rounded once, then exactly the float encoder of the widened table",
                   "[learned][half]", Eigen::half, Eigen::bfloat16) {
  using S = TestType;
  index_t const rows = 19, d = 37, offset = 2;  // d: vectors and a partial tail
  std::vector<float> const w = posenc_test::random_vector<float>(static_cast<std::size_t>(rows * d), 7, -3.0, 3.0);
  auto const h = learned<S>::rounded_from(posenc::span<const float>(w.data(), rows * d), rows, d, offset);
  REQUIRE(h.rows() == rows);
  std::size_t bad_round = 0;
  std::vector<float> widened(w.size());
  for (std::size_t i = 0; i < w.size(); ++i) {
    bad_round += bits(h.table()[static_cast<index_t>(i)]) != bits(posenc::detail::to_storage<S>(w[i])) ? 1 : 0;
    widened[i] = widen(h.table()[static_cast<index_t>(i)]);
  }
  CHECK(bad_round == 0);
  auto const f = learned<float>::copy_of(posenc::span<const float>(widened.data(), rows * d), rows, d, offset);

  SECTION("add_to, with and without a scale, and with explicit ids") {
    std::vector<float> x = posenc_test::random_vector<float>(static_cast<std::size_t>(3 * 5 * d), 9);
    std::vector<float> y = x;
    posenc::token_view<float> xv{x.data(), 3, 5, d, 5 * d, d, 1}, yv{y.data(), 3, 5, d, 5 * d, d, 1};
    h.add_to(xv, position_span(-2));
    f.add_to(yv, position_span(-2));
    CHECK(x == y);
    h.add_to(xv, position_span(4), 1.75f);
    f.add_to(yv, position_span(4), 1.75f);
    CHECK(x == y);
    std::vector<index_t> ids = {0, 3, 16, 1, -1, 7, 7, 2, 9, 12, 5, 6, 0, 15, 8};
    h.add_to(xv, position_span::ids(ids.data(), 3, 5));
    f.add_to(yv, position_span::ids(ids.data(), 3, 5));
    CHECK(x == y);
  }
  SECTION("value and fill") {
    std::size_t bad = 0;
    for (index_t p = -offset; p < rows - offset; ++p)
      for (index_t c = 0; c < d; ++c) bad += h.value(p, c) != f.value(p, c) ? 1 : 0;
    CHECK(bad == 0);
    std::vector<float> a(static_cast<std::size_t>(5 * d)), b(a.size());
    h.fill(3, 5, posenc::span<float>(a.data(), 5 * d));
    f.fill(3, 5, posenc::span<float>(b.data(), 5 * d));
    CHECK(a == b);
  }
  SECTION("add_to_backward: float gradients, as the float encoder's") {
    std::vector<float> dx = posenc_test::random_vector<float>(static_cast<std::size_t>(2 * 4 * d), 3);
    posenc::token_view<const float> dv{dx.data(), 2, 4, d, 4 * d, d, 1};
    auto gh = h.make_gradients();
    auto gf = f.make_gradients();
    h.add_to_backward(dv, position_span(1), gh);
    f.add_to_backward(dv, position_span(1), gf);
    CHECK(gh.table == gf.table);
  }
  SECTION("extended: the double interpolation of the widened table, rounded once") {
    auto const he = h.extended(40);
    std::vector<double> const wd(widened.begin(), widened.end());
    auto const dt = learned<double>::copy_of(posenc::span<const double>(wd.data(), rows * d), rows, d, offset);
    auto const de = dt.extended(40);
    REQUIRE(he.rows() == de.rows());
    std::size_t bad = 0;
    for (index_t i = 0; i < he.rows() * d; ++i) bad += bits(he.table()[i]) != nearest<S>(de.table()[i]) ? 1 : 0;
    CHECK(bad == 0);
  }
  SECTION("random: the float draws, each rounded once") {
    auto const hr = learned<S>::random(rows, d, 42, offset, 0.5, 1);
    auto const fr = learned<float>::random(rows, d, 42, offset, 0.5, 1);
    std::size_t bad = 0;
    for (index_t i = 0; i < rows * d; ++i)
      bad += bits(hr.table()[i]) != bits(posenc::detail::to_storage<S>(fr.table()[i])) ? 1 : 0;
    CHECK(bad == 0);
  }
  SECTION("bad input: the float encoder's messages, x untouched") {
    std::vector<float> x(static_cast<std::size_t>(2 * d), 0.5f);
    std::vector<float> const x0 = x;
    posenc::token_view<float> xv{x.data(), 1, 2, d, 2 * d, d, 1};
    std::string msg;
    try {
      f.add_to(xv, position_span(rows));
    } catch (posenc::error const& e) {
      msg = e.what();
    }
    REQUIRE(!msg.empty());
    REQUIRE_THROWS_WITH(h.add_to(xv, position_span(rows)), msg);
    CHECK(x == x0);
    REQUIRE_THROWS_WITH(learned<S>::rounded_from(posenc::span<const float>(w.data(), 5), rows, d),
                        "posenc::learned::rounded_from: table.size is 5, expected 703 (rows 19 * d_model 37)");
  }
}

TEMPLATE_TEST_CASE("learned 16-bit: a double just past a 16-bit midpoint rounds once (no double rounding via float)",
                   "[learned][half]", Eigen::half, Eigen::bfloat16) {
  using S = TestType;
  // v even, v' the next value up: float(m + tiny) is the midpoint m itself, and rounding
  // m to even would give v; x lies above m, so the correct rounding is v'.
  std::size_t bad = 0, cases = 0;
  for (std::uint16_t h : {std::uint16_t(0x3c00), std::uint16_t(0x3c02), std::uint16_t(0x4100), std::uint16_t(0x0402),
                          std::uint16_t(0x3f80), std::uint16_t(0x4000)}) {
    double const v = widen(Eigen::numext::bit_cast<S>(h));
    double const v1 = widen(Eigen::numext::bit_cast<S>(static_cast<std::uint16_t>(h + 1)));
    double const m = 0.5 * (v + v1);
    for (double x : {m + m * 0x1p-35, -(m + m * 0x1p-35)}) {
      std::uint16_t const want = static_cast<std::uint16_t>((h + 1) | (x < 0 ? 0x8000u : 0u));
      bad += bits(posenc::detail::round_double_to_storage<S>(x)) != want ? 1 : 0;
      ++cases;
    }
    // Just below the midpoint: v.
    double const below = m - m * 0x1p-35;
    bad += bits(posenc::detail::round_double_to_storage<S>(below)) != h ? 1 : 0;
    ++cases;
  }
  CHECK(cases == 18);
  CHECK(bad == 0);
}
}  // namespace encoding_learned_half_tests
