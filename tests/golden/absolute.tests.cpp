// SPDX-License-Identifier: MIT
// Absolute encoders against golden values from tests/golden/gen_absolute.py (numpy, float64, from docs/formulas.md 1-2).
#include <posenc/encoding/learned.hpp>
#include <posenc/encoding/sinusoidal.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/golden.hpp"

namespace golden_absolute_tests {

using posenc::index_t;

namespace {

posenc_test::golden_file const& golden() {
  static posenc_test::golden_file const g = posenc_test::read_golden("absolute.txt");
  return g;
}
std::vector<double> const& rec(std::string const& name) { return posenc_test::golden_record(golden(), name); }

// Every value is computed in double and rounded once: float is within half an
// ulp of the float64 reference (<= 6e-8 for |v| <= 1); double agrees up to the
// last bits of the angle p * w (|angle| <= 65535 -> ~1e-11).
template <class T>
double tolerance() {
  return std::is_same_v<T, float> ? 1e-7 : 1e-10;
}

template <class T, class V>
void check_close(std::string const& what, V const& got, std::vector<double> const& want, double tol) {
  INFO(what);
  REQUIRE(static_cast<std::size_t>(got.size()) == want.size());
  double worst = 0;
  std::size_t at = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    double const e = std::abs(static_cast<double>(got[static_cast<index_t>(i)]) - want[i]);
    if (!(e <= worst)) {
      worst = e;
      at = i;
    }
  }
  INFO("worst error " << worst << " at " << at);
  CHECK(worst <= tol);
}

std::vector<index_t> as_index(std::vector<double> const& v) {
  std::vector<index_t> r(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) r[i] = static_cast<index_t>(v[i]);
  return r;
}

template <class T>
std::vector<T> as(std::vector<double> const& v) {
  return std::vector<T>(v.begin(), v.end());
}

struct layout_case {
  char const* name;
  posenc::sinusoidal_layout layout;
  posenc::sinusoidal_frequency freq;
};
layout_case const layouts[] = {
    {"interleaved", posenc::sinusoidal_layout::interleaved, posenc::sinusoidal_frequency::paper},
    {"concat_t2t", posenc::sinusoidal_layout::concatenated, posenc::sinusoidal_frequency::tensor2tensor},
    {"concat_paper", posenc::sinusoidal_layout::concatenated, posenc::sinusoidal_frequency::paper}};

}  // namespace

TEMPLATE_TEST_CASE("golden: sinusoidal rows, every layout, d 1..512, positions 0..65535", "[golden][sinusoidal]",
                   float, double) {
  index_t const positions[] = {0, 1, 17, 4095, 65535};
  for (auto const& lc : layouts) {
    for (index_t d : {1, 2, 3, 7, 8, 512}) {
      posenc::sinusoidal<TestType> enc(d, lc.layout, lc.freq);  // caches rows 0..1023
      // fill(): cached rows and computed rows
      for (index_t p : positions) {
        std::string const name = std::string("sinusoidal.") + lc.name + ".d" + std::to_string(d) + ".p" + std::to_string(p);
        std::vector<TestType> row(static_cast<std::size_t>(d));
        enc.fill(p, 1, row);
        check_close<TestType>(name + " fill", row, rec(name), tolerance<TestType>());
      }
      // add_to() on zeros with explicit ids, two batch entries in opposite order
      std::vector<index_t> ids = {0, 1, 17, 4095, 65535, 65535, 4095, 17, 1, 0};
      std::vector<TestType> x(static_cast<std::size_t>(10 * d), TestType(0));
      enc.add_to(posenc::make_bsd(x.data(), 2, 5, d), posenc::position_span::ids(ids.data(), 2, 5));
      for (index_t t = 0; t < 10; ++t) {
        std::string const name = std::string("sinusoidal.") + lc.name + ".d" + std::to_string(d) + ".p" +
                                 std::to_string(ids[static_cast<std::size_t>(t)]);
        posenc::span<const TestType> got(x.data() + t * d, d);
        check_close<TestType>(name + " add_to", got, rec(name), tolerance<TestType>());
      }
    }
    // another base
    posenc::sinusoidal<TestType> b500(8, lc.layout, lc.freq, 500.0);
    for (index_t p : {0, 1, 17, 4095}) {
      std::string const name = std::string("sinusoidal.") + lc.name + ".base500.d8.p" + std::to_string(p);
      std::vector<TestType> row(8);
      b500.fill(p, 1, row);
      check_close<TestType>(name, row, rec(name), tolerance<TestType>());
    }
  }
}

TEMPLATE_TEST_CASE("golden: fairseq padding positions and encodings", "[golden][sinusoidal]", float, double) {
  auto const tokens = as_index(rec("fairseq.tokens"));
  std::vector<index_t> pos(tokens.size());
  posenc::fairseq_positions(tokens, 2, 6, 1, pos);
  CHECK(pos == as_index(rec("fairseq.positions")));
  posenc::fairseq_positions(tokens, 2, 6, 1, pos, 3);
  CHECK(pos == as_index(rec("fairseq.positions.past3")));
  posenc::fairseq_positions(tokens, 2, 6, 1, pos);

  posenc::sinusoidal_params p;
  p.d_model = 8;
  p.layout = posenc::sinusoidal_layout::concatenated;
  p.frequency = posenc::sinusoidal_frequency::tensor2tensor;
  p.padding_idx = 1;
  posenc::sinusoidal<TestType> enc(p);
  std::vector<TestType> x(2 * 6 * 8, TestType(0));
  enc.add_to(posenc::make_bsd(x.data(), 2, 6, 8), posenc::position_span::ids(pos.data(), 2, 6));
  check_close<TestType>("fairseq.pe.d8", x, rec("fairseq.pe.d8"), tolerance<TestType>());
}

TEMPLATE_TEST_CASE("golden: learned lookups with BART, RoBERTa, OPT and GPT-2 positions", "[golden][learned]", float,
                   double) {
  auto const table = as<TestType>(rec("learned.table"));
  // float tables hold the golden values rounded once; lookups copy them exactly.
  double const tol = std::is_same_v<TestType, float> ? 1e-7 : 0.0;
  index_t const d = 5;

  SECTION("BART: offset 2, positions past_len + s") {
    auto enc = posenc::learned<TestType>::copy_of(table, 10, d, 2);
    std::vector<TestType> x(4 * d, TestType(0));
    enc.add_to(posenc::make_bsd(x.data(), 1, 4, d), posenc::position_span(3));
    check_close<TestType>("learned.bart.pe", x, rec("learned.bart.pe"), tol);
    std::vector<TestType> f(4 * d);
    enc.fill(3, 4, f);
    check_close<TestType>("learned.bart.pe fill", f, rec("learned.bart.pe"), tol);
  }
  SECTION("RoBERTa: fairseq positions at offset 0, or mask positions at offset padding_idx + 1") {
    auto const tokens = as_index(rec("learned.roberta.tokens"));
    std::vector<index_t> rows(tokens.size());
    posenc::fairseq_positions(tokens, 2, 6, 1, rows);
    CHECK(rows == as_index(rec("learned.roberta.rows")));
    auto enc = posenc::learned<TestType>::view_of(table, 10, d);
    std::vector<TestType> x(12 * d, TestType(0));
    enc.add_to(posenc::make_bsd(x.data(), 2, 6, d), posenc::position_span::ids(rows.data(), 2, 6));
    check_close<TestType>("learned.roberta.pe", x, rec("learned.roberta.pe"), tol);

    std::vector<int> mask(tokens.size());
    for (std::size_t i = 0; i < tokens.size(); ++i) mask[i] = tokens[i] != 1;
    std::vector<index_t> ids(tokens.size());
    posenc::positions_from_mask<int>(mask, 2, 6, 6, ids, -1);
    std::vector<TestType> y(12 * d, TestType(0));
    enc.with_offset(2).add_to(posenc::make_bsd(y.data(), 2, 6, d), posenc::position_span::ids(ids.data(), 2, 6));
    check_close<TestType>("learned.roberta.pe via mask", y, rec("learned.roberta.pe"), tol);
  }
  SECTION("OPT: cumsum(mask) - 1, -1 at padding, offset 2; prefill and a decode step") {
    auto const mask = as_index(rec("learned.opt.mask"));
    std::vector<index_t> ids(mask.size()), step(2);
    posenc::positions_from_mask<index_t>(mask, 2, 6, 6, ids, -1);
    auto want_rows = as_index(rec("learned.opt.rows"));
    for (std::size_t i = 0; i < ids.size(); ++i) CHECK(ids[i] + 2 == want_rows[i]);
    auto enc = posenc::learned<TestType>::copy_of(table, 10, d, 2);
    std::vector<TestType> x(12 * d, TestType(0));
    enc.add_to(posenc::make_bsd(x.data(), 2, 6, d), posenc::position_span::ids(ids.data(), 2, 6));
    check_close<TestType>("learned.opt.pe", x, rec("learned.opt.pe"), tol);
    posenc::positions_from_mask<index_t>(mask, 2, 6, 1, step, -1);
    auto want_step = as_index(rec("learned.opt.step.rows"));
    CHECK(step[0] + 2 == want_step[0]);
    CHECK(step[1] + 2 == want_step[1]);
  }
  SECTION("GPT-2: cumsum(mask) - 1, 1 at padding, offset 0") {
    auto const mask = as_index(rec("learned.opt.mask"));
    std::vector<index_t> ids(mask.size());
    posenc::positions_from_mask<index_t>(mask, 2, 6, 6, ids);
    CHECK(ids == as_index(rec("learned.gpt2.rows")));
    auto enc = posenc::learned<TestType>::copy_of(table, 10, d);
    std::vector<TestType> x(12 * d, TestType(0));
    enc.add_to(posenc::make_bsd(x.data(), 2, 6, d), posenc::position_span::ids(ids.data(), 2, 6));
    check_close<TestType>("learned.gpt2.pe", x, rec("learned.gpt2.pe"), tol);
  }
}

TEMPLATE_TEST_CASE("golden: learned interpolation, both align_corners modes", "[golden][learned]", float, double) {
  // Resampling mixes two rows in double and rounds once; the float table
  // itself is rounded too: two half-ulp errors for |v| < 2, <= 1.2e-7.
  double const tol = std::is_same_v<TestType, float> ? 2.5e-7 : 1e-14;
  auto const table = as<TestType>(rec("interp.table"));
  auto enc = posenc::learned<TestType>::copy_of(table, 7, 3);
  for (index_t n : {1, 2, 4, 7, 12, 20}) {
    for (int ac : {0, 1}) {
      auto ext = enc.extended(n, ac == 1);
      REQUIRE(ext.rows() == n);
      std::string const name = "interp.ac" + std::to_string(ac) + ".n" + std::to_string(n);
      check_close<TestType>(name, ext.table(), rec(name), tol);
    }
  }
}
}  // namespace golden_absolute_tests
