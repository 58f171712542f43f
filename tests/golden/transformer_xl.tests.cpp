// SPDX-License-Identifier: MIT
// Transformer-XL attention against golden values from tests/golden/gen_transformer_xl.py (numpy, HF TransfoXL).
#include <posenc/attention/attention.hpp>
#include <posenc/encoding/transformer_xl.hpp>

#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include "support/catch.hpp"
#include "support/golden.hpp"

namespace golden_transformer_xl_tests {

using posenc::index_t;

namespace {

posenc_test::golden_file const& golden() {
  static posenc_test::golden_file const g = posenc_test::read_golden("transformer_xl.txt");
  return g;
}
std::vector<double> const& rec(std::string const& name) { return posenc_test::golden_record(golden(), name); }

template <class T>
std::vector<T> values_of(std::string const& name) {
  auto const& v = rec(name);
  return std::vector<T>(v.begin(), v.end());
}

template <class T>
posenc::relative_table<T> table_of(std::string const& name, index_t rows, index_t cols) {
  return posenc_test::golden_table<posenc::relative_table<T>>(golden(), name, rows, cols);
}

template <class Path, class T>
void check_case(std::string const& c) {
  auto const& sh = rec(c + "_shape");
  index_t const B = static_cast<index_t>(sh[0]), Sq = static_cast<index_t>(sh[1]), mem = static_cast<index_t>(sh[2]),
                H = static_cast<index_t>(sh[3]), D = static_cast<index_t>(sh[4]), dm = static_cast<index_t>(sh[5]),
                M = static_cast<index_t>(sh[6]);
  index_t const Sk = mem + Sq, kept = M > 0 && M < mem ? M + Sq : Sk;
  posenc::transformer_xl<T> enc(Sk, table_of<T>(c + "_u", H, D), table_of<T>(c + "_vb", H, D),
                                table_of<T>(c + "_wr", H * D, dm), M);
  auto const q = values_of<T>(c + "_q");
  auto const k = values_of<T>(c + "_k");
  auto const v = values_of<T>(c + "_v");
  std::vector<T> out(static_cast<std::size_t>(B * Sq * H * D), T(-7));
  posenc::attention_options<T> opt;
  opt.causal = true;
  std::vector<T> scores;
  bool const with_scores = std::is_same_v<Path, posenc::path::materialized> && kept == Sk;
  if (with_scores) {
    scores.assign(static_cast<std::size_t>(B * H * Sq * Sk), T(0));
    opt.scores = scores;
    opt.scores_stage = posenc::score_stage::biased;
  }
  posenc::attention<Path>(posenc::make_bshd(q.data(), B, Sq, H, D), posenc::make_bshd(k.data(), B, Sk, H, D),
                          posenc::make_bshd(v.data(), B, Sk, H, D), posenc::make_bshd(out.data(), B, Sq, H, D), enc,
                          opt);
  // Sums of <= 20 products of values of size ~1 and a softmax, in T.
  double const tol = std::is_same_v<T, float> ? 2e-5 : 1e-12;
  auto const& want = rec(c + "_out");
  REQUIRE(want.size() == out.size());
  for (std::size_t t = 0; t < out.size(); ++t) {
    INFO(c << " out[" << t << "] = " << out[t] << ", expected " << want[t]);
    CHECK(std::abs(static_cast<double>(out[t]) - want[t]) <= tol);
  }
  if (with_scores) {
    auto const& ws = rec(c + "_scores");
    REQUIRE(ws.size() == scores.size());
    for (std::size_t t = 0; t < scores.size(); ++t) {
      INFO(c << " scores[" << t << "] = " << scores[t] << ", expected " << ws[t]);
      if (std::isinf(ws[t]))
        CHECK(static_cast<double>(scores[t]) == ws[t]);
      else
        CHECK(std::abs(static_cast<double>(scores[t]) - ws[t]) <= tol);
    }
  }
}

}  // namespace

TEMPLATE_TEST_CASE("golden: Transformer-XL attention with segment memory (HF TransfoXL)", "[golden][transformer_xl]",
                   float, double) {
  using T = TestType;
  for (std::string const c : {"mem", "nomem", "cut"}) {
    SECTION("reference " + c) { check_case<posenc::path::reference, T>(c); }
    SECTION("materialized " + c) { check_case<posenc::path::materialized, T>(c); }
    SECTION("fused " + c) { check_case<posenc::path::fused, T>(c); }
  }
}

TEMPLATE_TEST_CASE("golden: Transformer-XL position table R_h(d) = W_R PE(d)", "[golden][transformer_xl]", float,
                   double) {
  using T = TestType;
  // The scores of the "nomem" case at distance 0 against the encoder's own
  // table: (q + u) . k + (q + v) . R(0) for query 0, key 0 (no other key is visible).
  auto const& sh = rec("nomem_shape");
  index_t const Sq = static_cast<index_t>(sh[1]), H = static_cast<index_t>(sh[3]), D = static_cast<index_t>(sh[4]),
                dm = static_cast<index_t>(sh[5]);
  auto const u = table_of<double>("nomem_u", H, D), vb = table_of<double>("nomem_vb", H, D);
  posenc::transformer_xl<T> enc(Sq, table_of<T>("nomem_u", H, D), table_of<T>("nomem_vb", H, D),
                                table_of<T>("nomem_wr", H * D, dm));
  auto const& q = rec("nomem_q");
  auto const& k = rec("nomem_k");
  auto const& ws = rec("nomem_scores");
  double const tol = std::is_same_v<T, float> ? 1e-5 : 1e-12;
  for (index_t h = 0; h < H; ++h) {
    double s = 0;
    for (index_t d = 0; d < D; ++d) {
      double const qd = q[static_cast<std::size_t>(h * D + d)], kd = k[static_cast<std::size_t>(h * D + d)];
      s += (qd + u(h, d)) * kd + (qd + vb(h, d)) * static_cast<double>(enc.relative_key(h, 0, d));
    }
    s /= std::sqrt(static_cast<double>(D));
    CHECK(std::abs(s - ws[static_cast<std::size_t>(h * Sq * Sq)]) <= tol);
  }
}

namespace {

// Case "rtab": the model's R for the distances klen - 1 down to 0 (r_head_k,
// no W_R) given by distance to from_distances: reversed into rows limit ..
// 2 limit, zeros for the negative distances (causal: never read).
template <class Path, class T>
void check_r_case(std::string const& c) {
  auto const& sh = rec(c + "_shape");
  index_t const B = static_cast<index_t>(sh[0]), Sq = static_cast<index_t>(sh[1]), mem = static_cast<index_t>(sh[2]),
                H = static_cast<index_t>(sh[3]), D = static_cast<index_t>(sh[4]);
  REQUIRE(sh[5] == 0.0);  // no d_model: R is given
  index_t const Sk = mem + Sq, limit = Sk - 1;
  auto const r_head_k = table_of<T>(c + "_r", Sk, H * D);
  posenc::relative_table<T> r = posenc::relative_table<T>::Zero(2 * limit + 1, H * D);
  r.bottomRows(Sk) = r_head_k.colwise().reverse();
  auto const enc = posenc::transformer_xl<T>::from_distances(limit, table_of<T>(c + "_u", H, D),
                                                             table_of<T>(c + "_vb", H, D), r);
  auto const q = values_of<T>(c + "_q");
  auto const k = values_of<T>(c + "_k");
  auto const v = values_of<T>(c + "_v");
  std::vector<T> out(static_cast<std::size_t>(B * Sq * H * D), T(-7));
  posenc::attention_options<T> opt;
  opt.causal = true;
  std::vector<T> scores;
  bool const with_scores = std::is_same_v<Path, posenc::path::materialized>;
  if (with_scores) {
    scores.assign(static_cast<std::size_t>(B * H * Sq * Sk), T(0));
    opt.scores = scores;
    opt.scores_stage = posenc::score_stage::biased;
  }
  posenc::attention<Path>(posenc::make_bshd(q.data(), B, Sq, H, D), posenc::make_bshd(k.data(), B, Sk, H, D),
                          posenc::make_bshd(v.data(), B, Sk, H, D), posenc::make_bshd(out.data(), B, Sq, H, D), enc,
                          opt);
  // As check_case: sums of <= 20 products of values of size ~1 and a softmax, in T.
  double const tol = std::is_same_v<T, float> ? 2e-5 : 1e-12;
  auto const& want = rec(c + "_out");
  REQUIRE(want.size() == out.size());
  for (std::size_t t = 0; t < out.size(); ++t) {
    INFO(c << " out[" << t << "] = " << out[t] << ", expected " << want[t]);
    CHECK(std::abs(static_cast<double>(out[t]) - want[t]) <= tol);
  }
  if (with_scores) {
    auto const& ws = rec(c + "_scores");
    REQUIRE(ws.size() == scores.size());
    for (std::size_t t = 0; t < scores.size(); ++t) {
      INFO(c << " scores[" << t << "] = " << scores[t] << ", expected " << ws[t]);
      if (std::isinf(ws[t]))
        CHECK(static_cast<double>(scores[t]) == ws[t]);
      else
        CHECK(std::abs(static_cast<double>(scores[t]) - ws[t]) <= tol);
    }
  }
}

}  // namespace

TEMPLATE_TEST_CASE("golden: Transformer-XL from R by distance (HF's r_head_k, no W_R)", "[golden][transformer_xl]",
                   float, double) {
  using T = TestType;
  SECTION("reference") { check_r_case<posenc::path::reference, T>("rtab"); }
  SECTION("materialized") { check_r_case<posenc::path::materialized, T>("rtab"); }
  SECTION("fused") { check_r_case<posenc::path::fused, T>("rtab"); }
}
}  // namespace golden_transformer_xl_tests
