// SPDX-License-Identifier: MIT
// Relative encoders against golden values from tests/golden/gen_relative_bias.py (numpy, from docs/formulas.md 4).
#include <cmath>
#include <limits>
#include <posenc/encoding/alibi.hpp>
#include <posenc/encoding/clipped_bias.hpp>
#include <posenc/encoding/shaw.hpp>
#include <posenc/encoding/t5_bias.hpp>
#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/golden.hpp"

namespace golden_relative_bias_tests {

using posenc::index_t;

namespace {

posenc_test::golden_file const& golden() {
  static posenc_test::golden_file const g = posenc_test::read_golden("relative_bias.txt");
  return g;
}
std::vector<double> const& rec(std::string const& name) { return posenc_test::golden_record(golden(), name); }

template <class T>
posenc::relative_table<T> table_of(std::string const& name, index_t rows, index_t cols) {
  return posenc_test::golden_table<posenc::relative_table<T>>(golden(), name, rows, cols);
}

// A value computed in double and rounded once to T: within half an ulp of the reference.
template <class T>
bool close(double got, double want, double rel) {
  return std::abs(got - want) <= rel * std::abs(want) + std::numeric_limits<double>::min();
}

}  // namespace

TEST_CASE("golden: T5 buckets, both modes, several settings, delta -300..300", "[golden][t5]") {
  struct setting {
    bool bi;
    index_t nb, md;
  };
  setting const settings[] = {{true, 32, 128},  {true, 64, 128},   {true, 16, 32},   {true, 4, 3},    {true, 10, 50},
                              {true, 32, 1000}, {true, 8, 300},    {false, 32, 128}, {false, 16, 64}, {false, 2, 2},
                              {false, 7, 40},   {false, 48, 1000}, {false, 32, 17}};
  for (auto s : settings) {
    std::string const name =
        std::string("t5_bucket_") + (s.bi ? "bi" : "uni") + "_N" + std::to_string(s.nb) + "_D" + std::to_string(s.md);
    auto const& want = rec(name);
    REQUIRE(want.size() == 601u);
    posenc::t5_bias<float> t({1, s.bi, s.nb, s.md}, 0);
    for (index_t d = -300; d <= 300; ++d) {
      INFO(name << " delta " << d);
      REQUIRE(static_cast<double>(t.bucket(d)) == want[static_cast<std::size_t>(d + 300)]);  // exact
    }
  }
}

TEMPLATE_TEST_CASE("golden: ALiBi slopes", "[golden][alibi]", float, double) {
  using T = TestType;
  double const rel = std::is_same_v<T, float> ? 6e-8 : 2e-16;
  for (index_t h : {1, 6, 8, 12, 20, 32, 40, 112}) {
    auto const& want = rec("alibi_slopes_H" + std::to_string(h));
    REQUIRE(static_cast<index_t>(want.size()) == h);
    posenc::alibi<T> a(posenc::alibi_form::paper, h);
    auto const exact = posenc::alibi_slopes(h);
    for (index_t i = 0; i < h; ++i) {
      INFO("heads " << h << " slope " << i);
      CHECK(close<T>(static_cast<double>(a.slope(i)), want[static_cast<std::size_t>(i)], rel));
      CHECK(close<double>(exact[static_cast<std::size_t>(i)], want[static_cast<std::size_t>(i)], 2e-16));
    }
  }
}

TEMPLATE_TEST_CASE("golden: ALiBi bias forms", "[golden][alibi]", float, double) {
  using T = TestType;
  // Slope rounded once, times an exact integer, rounded once: <= 2 half-ulps.
  double const rel = std::is_same_v<T, float> ? 1.2e-7 : 4.5e-16;
  struct form_case {
    char const* name;
    posenc::alibi_form form;
  };
  form_case const forms[] = {{"paper", posenc::alibi_form::paper},
                             {"key_only", posenc::alibi_form::key_only},
                             {"shifted", posenc::alibi_form::shifted},
                             {"symmetric", posenc::alibi_form::symmetric}};
  for (auto f : forms) {
    posenc::alibi<T> a(f.form, 6, f.form == posenc::alibi_form::shifted ? 13 : 0);
    auto const& want = rec(std::string("alibi_") + f.name);
    REQUIRE(want.size() == 6u * 4u * 13u);
    for (index_t h = 0; h < 6; ++h)
      for (index_t i = 0; i < 4; ++i) {
        std::vector<T> row(13, T(0));
        a.bias_row(h, 5 + i, 0, 13, row.data());
        for (index_t j = 0; j < 13; ++j) {
          double const w = want[static_cast<std::size_t>((h * 4 + i) * 13 + j)];
          INFO(f.name << " head " << h << " query " << 5 + i << " key " << j);
          CHECK(close<T>(static_cast<double>(row[static_cast<std::size_t>(j)]), w, rel));
          CHECK(close<T>(static_cast<double>(a.bias(h, 5 + i, j)), w, rel));
        }
      }
  }
}

TEMPLATE_TEST_CASE("golden: T5 bias with a given table", "[golden][t5]", float, double) {
  using T = TestType;
  for (bool bi : {true, false}) {
    std::string const tag = bi ? "bi" : "uni";
    posenc::t5_bias<T> t({3, bi}, table_of<T>("t5_" + tag + "_table", 32, 3));
    auto const& want = rec("t5_" + tag + "_bias");  // (head, query 100..103, key 0..250)
    REQUIRE(want.size() == 3u * 4u * 251u);
    for (index_t h = 0; h < 3; ++h)
      for (index_t i = 0; i < 4; ++i) {
        std::vector<T> row(251, T(0));
        t.bias_row(h, 100 + i, 0, 251, row.data());
        for (index_t j = 0; j < 251; ++j) {
          INFO(tag << " head " << h << " query " << 100 + i << " key " << j);
          // The table holds float-representable values: the lookup is exact.
          REQUIRE(static_cast<double>(row[static_cast<std::size_t>(j)]) ==
                  want[static_cast<std::size_t>((h * 4 + i) * 251 + j)]);
        }
      }
  }
}

TEMPLATE_TEST_CASE("golden: clipped bias with a given table", "[golden][clipped]", float, double) {
  using T = TestType;
  posenc::clipped_bias<T> c(3, 2, table_of<T>("clipped_table", 7, 2));
  auto const& want = rec("clipped_bias");  // (head, query 2..6, key 0..10)
  REQUIRE(want.size() == 2u * 5u * 11u);
  for (index_t h = 0; h < 2; ++h)
    for (index_t i = 0; i < 5; ++i) {
      std::vector<T> row(11, T(0));
      c.bias_row(h, 2 + i, 0, 11, row.data());
      for (index_t j = 0; j < 11; ++j)
        REQUIRE(static_cast<double>(row[static_cast<std::size_t>(j)]) ==
                want[static_cast<std::size_t>((h * 5 + i) * 11 + j)]);
    }
}

TEMPLATE_TEST_CASE("golden: Shaw score and value terms", "[golden][shaw]", float, double) {
  using T = TestType;
  index_t const k = 2, dh = 5, sq = 3, sk = 10;
  posenc::shaw<T> s(k, table_of<T>("shaw_aK", 2 * k + 1, dh), table_of<T>("shaw_aV", 2 * k + 1, dh));
  auto const q = table_of<T>("shaw_q", sq, dh);
  auto const p = table_of<T>("shaw_p", sq, sk);
  auto const& want_s = rec("shaw_scores");
  auto const& want_v = rec("shaw_values");
  // Sums of <= 10 products of values of size ~1, accumulated in T.
  double const tol = std::is_same_v<T, float> ? 2e-6 : 1e-14;
  T const scale = static_cast<T>(1.0 / std::sqrt(5.0));
  for (index_t i = 0; i < sq; ++i) {
    std::vector<T> scores(static_cast<std::size_t>(sk), T(0)), values(static_cast<std::size_t>(dh), T(0));
    s.score_row(q.row(i).data(), 4 + i, 0, sk, scale, scores.data());
    s.value_row(p.row(i).data(), 4 + i, 0, sk, values.data());
    for (index_t j = 0; j < sk; ++j)
      CHECK(std::abs(static_cast<double>(scores[static_cast<std::size_t>(j)]) -
                     want_s[static_cast<std::size_t>(i * sk + j)]) <= tol);
    for (index_t d = 0; d < dh; ++d)
      CHECK(std::abs(static_cast<double>(values[static_cast<std::size_t>(d)]) -
                     want_v[static_cast<std::size_t>(i * dh + d)]) <= tol);
  }
}
}  // namespace golden_relative_bias_tests
