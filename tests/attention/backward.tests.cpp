// SPDX-License-Identifier: MIT
// attention_backward on the reference path: central differences in double for every option and every encoder.
#include <posenc/posenc.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "support/backward_check.hpp"
#include "support/catch.hpp"

namespace attention_backward_tests {

using namespace posenc;
using posenc_test::attention_problem;
using posenc_test::central_differences;
using posenc_test::check_input_gradients;
using posenc_test::fd_report;

namespace {

using table = relative_table<double>;
Eigen::Map<const table> as_table(std::vector<double> const& v, index_t rows, index_t cols) {
  return Eigen::Map<const table>(v.data(), rows, cols);
}
std::vector<double> flat(table const& t) { return std::vector<double>(t.data(), t.data() + t.size()); }

}  // namespace

TEST_CASE("backward: central differences of dq, dk, dv for every option", "[backward]") {
  none enc;
  no_gradients g;
  SECTION("defaults") {
    attention_problem<double> p(2, 5, 5, 2, 2, 4, 4, 11);
    auto r = check_input_gradients(p, enc, g);
    INFO(r.describe());
    CHECK(r.ok());
  }
  SECTION("scale") {
    attention_problem<double> p(1, 4, 6, 2, 2, 3, 3, 12);
    p.opt.scale = 1.7;
    auto r = check_input_gradients(p, enc, g);
    INFO(r.describe());
    CHECK(r.ok());
  }
  SECTION("causal, Sq < Sk (bottom-right)") {
    attention_problem<double> p(2, 3, 7, 2, 2, 4, 4, 13);
    p.opt.causal = true;
    auto r = check_input_gradients(p, enc, g);
    INFO(r.describe());
    CHECK(r.ok());
  }
  SECTION("sliding window") {
    attention_problem<double> p(1, 7, 7, 2, 2, 4, 4, 14);
    p.opt.sliding_window = 3;
    auto r = check_input_gradients(p, enc, g);
    INFO(r.describe());
    CHECK(r.ok());
  }
  SECTION("softcap") {
    attention_problem<double> p(1, 5, 5, 2, 2, 4, 4, 15);
    p.opt.softcap = 0.8;
    p.opt.scale = 2.0;  // scores near the cap: tanh' far from 1
    auto r = check_input_gradients(p, enc, g);
    INFO(r.describe());
    CHECK(r.ok());
  }
  SECTION("GQA (4 query heads over 2 kv heads)") {
    attention_problem<double> p(2, 4, 5, 4, 2, 3, 3, 16);
    p.opt.causal = true;
    auto r = check_input_gradients(p, enc, g);
    INFO(r.describe());
    CHECK(r.ok());
  }
  SECTION("Dv != D") {
    attention_problem<double> p(1, 4, 6, 2, 1, 3, 5, 17);
    auto r = check_input_gradients(p, enc, g);
    INFO(r.describe());
    CHECK(r.ok());
  }
  SECTION("key_lengths (padding)") {
    attention_problem<double> p(2, 5, 5, 2, 2, 4, 4, 18);
    std::vector<index_t> lens = {3, 5};
    p.opt.key_lengths = lens;
    p.opt.causal = true;
    auto r = check_input_gradients(p, enc, g);
    INFO(r.describe());
    CHECK(r.ok());
    // Padding keys get no gradient.
    for (index_t j = 3; j < 5; ++j)
      for (index_t h = 0; h < 2; ++h)
        for (index_t d = 0; d < 4; ++d) {
          CHECK(p.vdk()(0, j, h, d) == 0.0);
          CHECK(p.vdv()(0, j, h, d) == 0.0);
        }
  }
  SECTION("additive mask with -inf entries, and a fully masked row") {
    attention_problem<double> p(1, 4, 5, 2, 2, 3, 3, 19);
    std::vector<double> m = posenc_test::random_vector<double>(4 * 5, 99);
    double const ninf = -std::numeric_limits<double>::infinity();
    m[1] = ninf;
    m[7] = ninf;
    for (int j = 0; j < 5; ++j) m[static_cast<std::size_t>(3 * 5 + j)] = ninf;  // row 3 sees nothing
    p.opt.mask = make_mask<double>(m.data(), 1, 1, 4, 5);
    auto r = check_input_gradients(p, enc, g);
    INFO(r.describe());
    CHECK(r.ok());
    CHECK(posenc_test::all_finite(p.dq));
    CHECK(posenc_test::all_finite(p.dk));
    for (index_t h = 0; h < 2; ++h)
      for (index_t d = 0; d < 3; ++d) CHECK(p.vdq()(0, 3, h, d) == 0.0);
  }
  SECTION("boolean mask, per head, with a fully masked row") {
    attention_problem<double> p(1, 4, 4, 2, 2, 3, 3, 20);
    bool mk[2 * 4 * 4];
    for (int t = 0; t < 32; ++t) mk[t] = (t * 7) % 3 != 0;
    for (int j = 0; j < 4; ++j) mk[4 * 4 + 2 * 4 + j] = false;  // head 1 row 2 sees nothing
    p.opt.bool_mask = make_mask<bool>(mk, 1, 2, 4, 4);
    auto r = check_input_gradients(p, enc, g);
    INFO(r.describe());
    CHECK(r.ok());
    for (index_t d = 0; d < 3; ++d) CHECK(p.vdq()(0, 2, 1, d) == 0.0);
    CHECK(posenc_test::all_finite(p.dk));
  }
}

TEST_CASE("backward: positions and position-dependent encoders", "[backward]") {
  t5_bias<double> t5(t5_bias_params{2, true, 8, 20}, 7u, 0.5);
  auto g = make_gradients(t5);
  SECTION("query offset") {
    attention_problem<double> p(1, 3, 6, 2, 2, 4, 4, 21);
    p.opt.q_positions = position_span(10);
    p.opt.k_positions = position_span(8);
    auto r = check_input_gradients(p, t5, g);
    INFO(r.describe());
    CHECK(r.ok());
  }
  SECTION("per-batch offsets") {
    attention_problem<double> p(2, 3, 5, 2, 2, 4, 4, 22);
    std::vector<index_t> firsts = {2, 0};
    p.opt.q_positions = position_span::per_batch(firsts);
    p.opt.causal = true;
    auto r = check_input_gradients(p, t5, g);
    INFO(r.describe());
    CHECK(r.ok());
  }
  SECTION("explicit ids (packed sequences)") {
    attention_problem<double> p(1, 5, 5, 2, 2, 4, 4, 23);
    std::vector<index_t> ids = {0, 1, 2, 0, 1};
    p.opt.q_positions = position_span::ids(ids.data(), 1, 5);
    p.opt.k_positions = position_span::ids(ids.data(), 1, 5);
    auto r = check_input_gradients(p, t5, g);
    INFO(r.describe());
    CHECK(r.ok());
  }
  SECTION("negative query positions under causal give zero gradients") {
    attention_problem<double> p(1, 4, 3, 2, 2, 4, 4, 24);
    p.opt.q_positions = position_span(-2);
    p.opt.causal = true;
    auto r = check_input_gradients(p, t5, g);
    INFO(r.describe());
    CHECK(r.ok());
    for (index_t i = 0; i < 2; ++i)
      for (index_t h = 0; h < 2; ++h)
        for (index_t d = 0; d < 4; ++d) CHECK(p.vdq()(0, i, h, d) == 0.0);
  }
}

TEST_CASE("backward: the given lse is used and agrees with the recomputed one", "[backward]") {
  attention_problem<double> p(2, 5, 6, 2, 1, 4, 3, 25);
  p.opt.causal = true;
  clipped_bias<double> cb(2, 2, 5u, 0.3);
  auto g1 = make_gradients(cb), g2 = make_gradients(cb);
  p.gradients(cb, g1, false);
  auto const dq = p.dq, dk = p.dk, dv = p.dv;
  p.gradients(cb, g2, true);
  CHECK(posenc_test::max_abs_diff(dq, p.dq) < 1e-13);
  CHECK(posenc_test::max_abs_diff(dk, p.dk) < 1e-13);
  CHECK(posenc_test::max_abs_diff(dv, p.dv) < 1e-13);
  CHECK(posenc_test::max_abs_diff(flat(g1.table), flat(g2.table)) < 1e-13);
  SECTION("a shifted lse is read: its rows no longer sum to 1, which throws") {
    auto lse = p.lse;
    for (auto& x : lse) x += 0.5;
    attention_options<double> o = p.opt;
    o.lse = lse;
    auto g3 = make_gradients(cb);
    CHECK_THROWS_WITH(attention_backward<path::reference>(p.vq(), p.vk(), p.vv(), p.vout(), p.vdout(), p.vdq(),
                                                          p.vdk(), p.vdv(), cb, o, g3),
                      Catch::Matchers::StartsWith("posenc::attention_backward: lse does not match the scores of "
                                                  "batch entry 0, head 0, row 0: sum_j exp(s_ij - lse) is 0.60653"));
  }
}

namespace {

/// True when every one of the n values from x is finite (all = true) or none is (all = false).
template <class T>
bool every(T const* x, index_t n, bool finite) {
  for (index_t d = 0; d < n; ++d)
    if (std::isfinite(x[d]) != finite) return false;
  return true;
}

/// Runs the forward pass (reference) and the backward pass on Path, lse given or not.
template <class Path>
void nan_gradients(attention_problem<float>& p, bool with_lse) {
  no_gradients g;
  p.gradients<Path>(none{}, g, with_lse);
}

}  // namespace

namespace {

/// The gradients of p (dq, dk, dv and the encoder's) on Path with the forward pass's lse given
/// or not.
template <class Path, class E>
std::vector<std::vector<float>> all_gradients(attention_problem<float>& p, E const& enc, bool with_lse) {
  auto g = make_gradients(enc);
  p.gradients<Path>(enc, g, with_lse);
  std::vector<float> e;
  if constexpr (std::is_same_v<E, alibi<float>>) e.assign(g.slopes.data(), g.slopes.data() + g.slopes.size());
  return {p.dq, p.dk, p.dv, e};
}

template <class Path>
void huge_lse_case(index_t offset) {
  // Queries `offset` positions after the keys: the ALiBi bias, slope x distance, makes every
  // score and the lse about -slope * offset, where one unit in float's last place is 2^10 and
  // more. The lse the forward pass gives is that rounded: probabilities from it would be off by
  // up to exp(2^9) (infinite gradients, or a row scaled by its key count). The backward pass
  // takes the row's own lse there and checks the given one against it.
  attention_problem<float> p(1, 6, 9, 2, 2, 16, 16, 31);
  p.opt.q_positions = position_span(offset);
  alibi<float> const al(alibi_form::paper, 2);
  auto const given = all_gradients<Path>(p, al, true);
  auto const lse = p.lse;
  auto const own = all_gradients<Path>(p, al, false);
  CHECK(std::abs(lse[0]) > 1e9f);
  for (std::size_t t = 0; t < given.size(); ++t) {
    INFO("gradient " << t << " (dq, dk, dv, slopes), offset " << offset);
    for (float x : given[t]) REQUIRE(std::isfinite(x));
    CHECK(given[t] == own[t]);  // the same own lse: bit for bit
  }
  SECTION("a given lse off by more than the tolerance still throws") {
    auto off = lse;
    off[3] += off[3] * 1e-3f;  // a thousandth of 1e10: far beyond 2^12 eps |lse|
    attention_options<float> o = p.opt;
    o.lse = off;
    auto g = make_gradients(al);
    CHECK_THROWS_WITH(attention_backward<Path>(p.vq(), p.vk(), p.vv(), p.vout(), p.vdout(), p.vdq(), p.vdk(),
                                               p.vdv(), al, o, g),
                      Catch::Matchers::StartsWith("posenc::attention_backward: lse does not match the scores of "
                                                  "batch entry 0, head 0, row 3"));
  }
}

}  // namespace

TEST_CASE("backward: a given lse too large for its rounding gives the gradients of the row's own lse",
          "[backward]") {
  for (index_t offset : {index_t{40000000000}, index_t{9000000000000}}) {
    huge_lse_case<path::reference>(offset);
    huge_lse_case<path::fused>(offset);
  }
}

TEST_CASE("backward: a NaN in q, k or v flows into the gradients it reaches, as in the forward pass", "[backward]") {
  // (1, 6, 2, 4) queries and (1, 6, 1, 4) keys and values, causal: row i sees keys 0 .. i. The clean
  // problem's gradients are the oracle of what the NaN does not reach. Each setting runs on both
  // paths, with the lse recomputed and with the forward pass's lse given (NaN for a NaN row).
  auto make = [] {
    attention_problem<float> p(1, 6, 6, 2, 1, 4, 4, 31);
    p.opt.causal = true;
    return p;
  };
  float const nan = std::numeric_limits<float>::quiet_NaN();
  auto same = [](float const* a, float const* b) {
    for (index_t d = 0; d < 4; ++d)
      if (!(std::fabs(a[d] - b[d]) <= 1e-5f)) return false;
    return true;
  };
  auto each_setting = [&](auto poison, auto verify) {
    for (int path = 0; path < 2; ++path)
      for (bool with_lse : {false, true}) {
        INFO((path == 0 ? "reference" : "fused") << " path, lse " << (with_lse ? "given" : "recomputed"));
        auto run = [&](attention_problem<float>& p) {
          if (path == 0)
            nan_gradients<path::reference>(p, with_lse);
          else
            nan_gradients<path::fused>(p, with_lse);
        };
        attention_problem<float> clean = make(), p = make();
        run(clean);
        poison(p);
        run(p);
        verify(p, clean, with_lse);
      }
  };
  SECTION("q row 2 of head 0: its dq, and dk, dv of keys 0 .. 2") {
    each_setting([&](attention_problem<float>& p) { p.vq()(0, 2, 0, 1) = nan; },
                 [&](attention_problem<float>& p, attention_problem<float>& clean, bool with_lse) {
                   if (with_lse) CHECK(std::isnan(p.lse[2]));  // the forward pass's lse of the row, given back
                   for (index_t h = 0; h < 2; ++h)
                     for (index_t i = 0; i < 6; ++i) {
                       INFO("dq row " << i << " head " << h);
                       bool const reached = h == 0 && i == 2;
                       CHECK(every(p.vdq().ptr(0, i, h), 4, !reached));
                       if (!reached) CHECK(same(p.vdq().ptr(0, i, h), clean.vdq().ptr(0, i, h)));
                     }
                   for (index_t j = 0; j < 6; ++j) {
                     INFO("key " << j);
                     CHECK(every(p.vdk().ptr(0, j, 0), 4, j > 2));
                     CHECK(every(p.vdv().ptr(0, j, 0), 4, j > 2));
                     if (j > 2) {
                       CHECK(same(p.vdk().ptr(0, j, 0), clean.vdk().ptr(0, j, 0)));
                       CHECK(same(p.vdv().ptr(0, j, 0), clean.vdv().ptr(0, j, 0)));
                     }
                   }
                 });
  }
  SECTION("k row 0, the only key row 0 sees: every dq row, dk and dv of every key") {
    each_setting([&](attention_problem<float>& p) { p.vk()(0, 0, 0, 3) = nan; },
                 [&](attention_problem<float>& p, attention_problem<float>&, bool) {
                   for (index_t h = 0; h < 2; ++h)
                     for (index_t i = 0; i < 6; ++i) {
                       INFO("dq row " << i << " head " << h);
                       CHECK(every(p.vdq().ptr(0, i, h), 4, false));
                     }
                   for (index_t j = 0; j < 6; ++j) {
                     INFO("key " << j);
                     CHECK(every(p.vdk().ptr(0, j, 0), 4, false));
                     CHECK(every(p.vdv().ptr(0, j, 0), 4, false));
                   }
                 });
  }
  // Rows 4 and 5 see key 4 (causal): their dq is not finite; rows 0 .. 3 keep the clean run's.
  auto const dq_rows_4_and_5_not_finite = [&](attention_problem<float>& p, attention_problem<float>& clean) {
    for (index_t h = 0; h < 2; ++h)
      for (index_t i = 0; i < 6; ++i) {
        INFO("dq row " << i << " head " << h);
        CHECK(every(p.vdq().ptr(0, i, h), 4, i < 4));
        if (i < 4) CHECK(same(p.vdq().ptr(0, i, h), clean.vdq().ptr(0, i, h)));
      }
  };
  SECTION("k row 4: dq of rows 4 and 5; rows 0 .. 3 keep their gradients") {
    each_setting([&](attention_problem<float>& p) { p.vk()(0, 4, 0, 0) = nan; },
                 [&](attention_problem<float>& p, attention_problem<float>& clean, bool) {
                   dq_rows_4_and_5_not_finite(p, clean);
                 });
  }
  SECTION("v row 4: dq of rows 4 and 5 and every dk; dv (sum of P dO) stays finite") {
    each_setting([&](attention_problem<float>& p) { p.vv()(0, 4, 0, 2) = nan; },
                 [&](attention_problem<float>& p, attention_problem<float>& clean, bool) {
                   dq_rows_4_and_5_not_finite(p, clean);
                   for (index_t j = 0; j < 6; ++j) {
                     INFO("key " << j);
                     CHECK(every(p.vdk().ptr(0, j, 0), 4, false));
                     CHECK(every(p.vdv().ptr(0, j, 0), 4, true));
                     CHECK(same(p.vdv().ptr(0, j, 0), clean.vdv().ptr(0, j, 0)));
                   }
                 });
  }
}

TEST_CASE("backward: bias encoders' table gradients by central differences", "[backward]") {
  index_t const H = 2;
  SECTION("T5 buckets, bidirectional and causal") {
    for (bool bi : {true, false}) {
      t5_bias_params tp{H, bi, 8, 12};
      std::vector<double> theta = posenc_test::random_vector<double>(static_cast<std::size_t>(8 * H), 31, -0.5, 0.5);
      auto make = [&] { return t5_bias<double>(tp, as_table(theta, 8, H)); };
      attention_problem<double> p(2, 6, 9, H, H, 3, 3, 32);
      p.opt.causal = !bi;
      p.opt.q_positions = position_span(3);  // keys on both sides, far ones in log buckets
      auto enc = make();
      auto g = make_gradients(enc);
      fd_report r = check_input_gradients(p, enc, g);
      central_differences(r, "d(table)", theta, flat(g.table), [&] { return p.loss(make()); });
      INFO((bi ? "bidirectional: " : "causal: ") << r.describe());
      CHECK(r.ok());
    }
  }
  SECTION("clipped relative bias, with softcap and GQA") {
    index_t const K = 2;
    std::vector<double> theta = posenc_test::random_vector<double>(static_cast<std::size_t>((2 * K + 1) * 4), 33);
    auto make = [&] { return clipped_bias<double>(K, 4, as_table(theta, 2 * K + 1, 4)); };
    attention_problem<double> p(1, 6, 6, 4, 2, 3, 3, 34);
    p.opt.softcap = 1.5;
    auto enc = make();
    auto g = make_gradients(enc);
    fd_report r = check_input_gradients(p, enc, g);
    central_differences(r, "d(table)", theta, flat(g.table), [&] { return p.loss(make()); });
    INFO(r.describe());
    CHECK(r.ok());
  }
  SECTION("ALiBi: every form, slopes learned") {
    for (alibi_form form : {alibi_form::paper, alibi_form::key_only, alibi_form::shifted, alibi_form::symmetric}) {
      std::vector<double> slopes = {0.3, 0.11};
      index_t const L = form == alibi_form::shifted ? 7 : 0;
      auto make = [&] { return alibi<double>(form, H, span<const double>(slopes.data(), H), L); };
      attention_problem<double> p(1, 5, 7, H, H, 3, 3, 35);
      p.opt.causal = form != alibi_form::symmetric;
      auto enc = make();
      auto g = enc.make_gradients(true);
      fd_report r = check_input_gradients(p, enc, g);
      central_differences(r, "d(slopes)", slopes, flat(g.slopes), [&] { return p.loss(make()); });
      INFO("form " << static_cast<int>(form) << ": " << r.describe());
      CHECK(r.ok());
    }
  }
  SECTION("ALiBi slopes get their gradient by default, and stay fixed only when asked") {
    alibi<double> enc(alibi_form::paper, H);
    attention_problem<double> p(1, 4, 4, H, H, 3, 3, 36);
    auto g = make_gradients(enc);
    REQUIRE(g.slopes.rows() == H);  // (heads, 1), the slopes' shape
    REQUIRE(g.slopes.cols() == 1);
    p.gradients(enc, g);
    auto asked = enc.make_gradients(true);
    p.gradients(enc, asked);
    CHECK(g.slopes == asked.slopes);
    CHECK((g.slopes.array() != 0.0).any());
    auto fixed = enc.make_gradients(false);
    p.gradients(enc, fixed);
    CHECK(fixed.slopes.size() == 0);
  }
}

TEST_CASE("backward: Shaw's key and value embeddings by central differences", "[backward]") {
  index_t const K = 2, D = 3;
  for (bool values : {false, true}) {
    std::vector<double> ak = posenc_test::random_vector<double>(static_cast<std::size_t>((2 * K + 1) * D), 41);
    std::vector<double> av = posenc_test::random_vector<double>(static_cast<std::size_t>((2 * K + 1) * D), 42);
    auto make = [&] {
      return values ? shaw<double>(K, as_table(ak, 2 * K + 1, D), as_table(av, 2 * K + 1, D))
                    : shaw<double>(K, as_table(ak, 2 * K + 1, D));
    };
    attention_problem<double> p(2, 5, 6, 2, 1, D, D, 43);
    p.opt.causal = true;
    p.opt.softcap = 2.0;
    auto enc = make();
    auto g = make_gradients(enc);
    fd_report r = check_input_gradients(p, enc, g);
    central_differences(r, "d(aK)", ak, flat(g.key), [&] { return p.loss(make()); });
    if (values) central_differences(r, "d(aV)", av, flat(g.value), [&] { return p.loss(make()); });
    INFO((values ? "keys and values: " : "keys: ") << r.describe());
    CHECK(r.ok());
    CHECK(g.value.size() == (values ? (2 * K + 1) * D : 0));
  }
}

TEST_CASE("backward: RoPE, every scaling and layout, partial rotary, by central differences", "[backward]") {
  index_t const D = 8;
  struct rope_case {
    char const* name;
    rope_scaling scaling;
    index_t rotary_dim;
  };
  std::vector<rope_case> cases = {
      {"none", rope_scaling::none(), D},
      {"partial rotary", rope_scaling::none(), 4},
      {"linear", rope_scaling::linear(4.0), D},
      {"dynamic NTK past its length", rope_scaling::dynamic_ntk(2.0, 4), D},
      {"YaRN (attention factor)", rope_scaling::yarn(4.0, 4), D},
      {"Llama 3", rope_scaling::llama3(8.0, 1.0, 4.0, 4), D},
      {"LongRoPE long factors", rope_scaling::longrope({1.0, 1.5, 2.0, 3.0}, {2.0, 3.0, 5.0, 8.0}, 4, 32), D},
  };
  for (auto const& c : cases) {
    for (rope_layout layout : {rope_layout::half_split, rope_layout::interleaved}) {
      rope_options o;
      o.rotary_dim = c.rotary_dim;
      o.scaling = c.scaling;
      o.base = 100.0;
      rope<double> enc(layout, D, o);
      no_gradients g;
      attention_problem<double> p(1, 5, 7, 2, 1, D, 3, 51);
      p.opt.causal = true;
      auto r = check_input_gradients(p, enc, g);
      INFO(c.name << (layout == rope_layout::half_split ? " half-split: " : " interleaved: ") << r.describe());
      CHECK(r.ok());
    }
  }
}

TEST_CASE("backward: keys_rotated gives the gradient of the given rotated keys", "[backward]") {
  rope<double> enc(rope_layout::half_split, 4);
  attention_problem<double> p(1, 3, 5, 2, 2, 4, 4, 52);
  // Rotate the keys as a cache would hold them.
  enc.rotate(p.vk(), position_span(0), 5);
  p.opt.keys_rotated = true;
  no_gradients g;
  auto r = check_input_gradients(p, enc, g);
  INFO(r.describe());
  CHECK(r.ok());
}

TEST_CASE("backward: compose sums its parts' gradients", "[backward]") {
  index_t const H = 2, D = 4, K = 1;
  std::vector<double> t5t = posenc_test::random_vector<double>(8 * H, 61, -0.5, 0.5);
  std::vector<double> ak = posenc_test::random_vector<double>(static_cast<std::size_t>((2 * K + 1) * D), 62);
  std::vector<double> slopes = {0.2, 0.05};
  t5_bias_params tp{H, true, 8, 12};
  auto make = [&] {
    return compose<rope<double>, t5_bias<double>, alibi<double>, shaw<double>>(
        rope<double>(rope_layout::interleaved, D), t5_bias<double>(tp, as_table(t5t, 8, H)),
        alibi<double>(alibi_form::paper, H, span<const double>(slopes.data(), H)),
        shaw<double>(K, as_table(ak, 2 * K + 1, D)));
  };
  auto enc = make();
  auto g = enc.make_gradients();
  g.get<2>() = enc.get<2>().make_gradients(true);
  attention_problem<double> p(1, 5, 5, H, H, D, D, 63);
  fd_report r = check_input_gradients(p, enc, g);
  central_differences(r, "d(t5)", t5t, flat(g.get<1>().table), [&] { return p.loss(make()); });
  central_differences(r, "d(slopes)", slopes, flat(g.get<2>().slopes), [&] { return p.loss(make()); });
  central_differences(r, "d(aK)", ak, flat(g.get<3>().key), [&] { return p.loss(make()); });
  INFO(r.describe());
  CHECK(r.ok());
}

TEST_CASE("backward: absolute encoders through attention (learned scatter-add, sinusoidal pass-through)",
          "[backward]") {
  // x (batch, seq, d_model = heads * head_dim) + PE(pos), then q = k = v = x
  // split into heads: the loss depends on the table through every position read.
  index_t const B = 2, S = 4, H = 2, D = 3, dm = H * D, rows = 9, offset = 2;
  std::vector<double> x0 = posenc_test::random_vector<double>(static_cast<std::size_t>(B * S * dm), 71);
  std::vector<double> dout = posenc_test::random_vector<double>(x0.size(), 72);
  std::vector<double> table = posenc_test::random_vector<double>(static_cast<std::size_t>(rows * dm), 73);
  // OPT-style ids from a left-padded mask: padding at -1 reads row 1.
  std::vector<int> mask = {0, 1, 1, 1, 1, 1, 1, 1};
  std::vector<index_t> ids(static_cast<std::size_t>(B * S));
  positions_from_mask<int>(mask, B, S, S, ids, -1);
  position_span pos = position_span::ids(ids.data(), B, S);
  auto run = [&](learned<double> const& enc, std::vector<double>& x, std::vector<double>& out) {
    x = x0;
    enc.add_to(make_bsd(x.data(), B, S, dm), pos);
    auto xv = make_bshd(x.data(), B, S, H, D);
    attention_options<double> o;
    o.causal = true;
    attention<path::reference>(xv, xv, xv, make_bshd(out.data(), B, S, H, D), none{}, o);
  };
  auto loss = [&] {
    std::vector<double> x, out(x0.size());
    run(learned<double>::view_of(table, rows, dm, offset), x, out);
    double l = 0;
    for (std::size_t i = 0; i < out.size(); ++i) l += dout[i] * out[i];
    return l;
  };
  auto enc = learned<double>::view_of(table, rows, dm, offset);
  std::vector<double> x, out(x0.size()), dq(x0.size()), dk(x0.size()), dv(x0.size());
  run(enc, x, out);
  auto xv = make_bshd(x.data(), B, S, H, D);
  attention_options<double> o;
  o.causal = true;
  no_gradients ng;
  attention_backward<path::reference>(xv, xv, xv, make_bshd(out.data(), B, S, H, D),
                                      make_bshd(dout.data(), B, S, H, D), make_bshd(dq.data(), B, S, H, D),
                                      make_bshd(dk.data(), B, S, H, D), make_bshd(dv.data(), B, S, H, D), none{}, o,
                                      ng);
  std::vector<double> dx(x0.size());
  for (std::size_t i = 0; i < dx.size(); ++i) dx[i] = dq[i] + dk[i] + dv[i];
  auto g = enc.make_gradients();
  enc.add_to_backward(make_bsd(static_cast<double const*>(dx.data()), B, S, dm), pos, g);
  fd_report r;
  central_differences(r, "d(table)", table, flat(g.table), loss);
  INFO(r.describe());
  CHECK(r.ok());
  // Rows no position reads get nothing; the padding row (position -1 + offset 2 = row 1) gets its share.
  for (index_t c = 0; c < dm; ++c) CHECK(g.table(0, c) == 0.0);
  bool row1 = false;
  for (index_t c = 0; c < dm; ++c) row1 = row1 || g.table(1, c) != 0.0;
  CHECK(row1);

  SECTION("sinusoidal: no parameters, the gradient of x passes through") {
    sinusoidal<double> s(dm);
    no_gradients sg;
    std::vector<double> dx_copy = dx;
    s.add_to_backward(make_bsd(static_cast<double const*>(dx.data()), B, S, dm), position_span(0), sg);
    CHECK(dx == dx_copy);
  }
}

TEST_CASE("backward: learned scatter-add matches an explicit loop, offsets respected, deterministic",
          "[backward]") {
  index_t const B = 3, S = 5, dm = 4, rows = 12;
  auto enc = learned<float>::random(rows, dm, 5u, 2);
  std::vector<float> dx = posenc_test::random_vector<float>(static_cast<std::size_t>(B * S * dm), 81);
  std::vector<index_t> firsts = {0, 3, 1};
  position_span pos = position_span::per_batch(firsts);
  auto g = enc.make_gradients();
  enc.add_to_backward(make_bsd(static_cast<float const*>(dx.data()), B, S, dm), pos, g);
  gradient_tensor<float> want = gradient_tensor<float>::Zero(rows, dm);  // the table's shape
  for (index_t b = 0; b < B; ++b)
    for (index_t s = 0; s < S; ++s)
      for (index_t c = 0; c < dm; ++c)
        want(firsts[static_cast<std::size_t>(b)] + s + 2, c) += dx[static_cast<std::size_t>((b * S + s) * dm + c)];
  CHECK(g.table == want);
  auto g2 = enc.make_gradients();
  enc.add_to_backward(make_bsd(static_cast<float const*>(dx.data()), B, S, dm), pos, g2);
  CHECK(g2.table == g.table);
}

TEST_CASE("backward: results are bit-identical run to run and across thread counts", "[backward]") {
  index_t const H = 4;
  t5_bias<float> t5(t5_bias_params{H, true, 16, 40}, 9u, 0.3);
  attention_problem<float> p(3, 17, 19, H, 2, 8, 8, 91);
  p.opt.causal = true;
  std::vector<std::vector<float>> results;
  std::vector<std::vector<float>> tables;
  for (int threads : {1, 2, 2, 1, 2}) {
    p.opt.threads = threads;
    auto g = make_gradients(t5);
    p.gradients(t5, g);
    std::vector<float> all = p.dq;
    all.insert(all.end(), p.dk.begin(), p.dk.end());
    all.insert(all.end(), p.dv.begin(), p.dv.end());
    results.push_back(all);
    tables.emplace_back(g.table.data(), g.table.data() + g.table.size());
  }
  for (std::size_t r = 1; r < results.size(); ++r) {
    CHECK(results[r] == results[0]);
    CHECK(tables[r] == tables[0]);
  }
}

TEST_CASE("backward: the example of docs/backward.md", "[backward][docs]") {
  index_t const heads = 2, B = 1, S = 6, D = 8;
  std::uint64_t const seed = 7;
  std::vector<float> qb = posenc_test::random_vector<float>(static_cast<std::size_t>(B * S * heads * D), 1);
  std::vector<float> kb = posenc_test::random_vector<float>(qb.size(), 2), vb = posenc_test::random_vector<float>(qb.size(), 3);
  std::vector<float> dob = posenc_test::random_vector<float>(qb.size(), 4), ob(qb.size()), dqb(qb.size()),
      dkb(qb.size()), dvb(qb.size()), lse(static_cast<std::size_t>(B * heads * S));
  auto at = [&](std::vector<float>& x) { return make_bshd(x.data(), B, S, heads, D); };
  view<float> q = at(qb), k = at(kb), v = at(vb), out = at(ob), dout = at(dob), dq = at(dqb), dk = at(dkb),
              dv = at(dvb);
  posenc::t5_bias<float> t5(posenc::t5_bias_params{heads}, seed);
  posenc::attention_options<float> opt;
  opt.lse = lse;                            // saved by the forward pass
  posenc::attention(q, k, v, out, t5, opt);
  auto g = posenc::make_gradients(t5);             // g.table: (num_buckets, heads), zeros
  posenc::attention_backward<posenc::path::reference>(q, k, v, out, dout, dq, dk, dv, t5, opt, g);
  CHECK(g.table.rows() == 32);
  CHECK(g.table.cwiseAbs().sum() > 0.0f);
  CHECK(posenc_test::all_finite(dqb));
  {
    // The named form: the same gradients, bit for bit.
    auto const want_dq = dqb, want_dk = dkb, want_dv = dvb;
    auto const want_table = g.table;
    std::fill(dqb.begin(), dqb.end(), 0.0f);
    std::fill(dkb.begin(), dkb.end(), 0.0f);
    std::fill(dvb.begin(), dvb.end(), 0.0f);
    g = posenc::make_gradients(t5);
    posenc::backward_inputs<float> in;
    in.q = q;
    in.k = k;
    in.v = v;
    in.out = out;
    in.dout = dout;
    posenc::backward_outputs<float> d;
    d.dq = dq;
    d.dk = dk;
    d.dv = dv;
    posenc::attention_backward<posenc::path::reference>(in, d, t5, opt, g);
    CHECK(dqb == want_dq);
    CHECK(dkb == want_dk);
    CHECK(dvb == want_dv);
    CHECK(g.table == want_table);
  }
}

TEST_CASE("backward: strided, misaligned and BHSD views give the same gradients", "[backward]") {
  index_t const B = 2, Sq = 5, Sk = 7, Hq = 4, Hkv = 2, D = 5, Dv = 3;
  shaw<float> sh(2, D, shaw_terms::keys, 3u, 0.3);  // value embeddings would need Dv == D
  attention_problem<float> p(B, Sq, Sk, Hq, Hkv, D, Dv, 131);
  p.opt.causal = true;
  auto g1 = sh.make_gradients();
  p.gradients(sh, g1);
  // The same tensors in other layouts: q, dq in BHSD; k, v, dk, dv with padded
  // rows starting one element past an aligned address.
  auto copy_into = [](view<float> dst, view<float> src) {
    for (index_t b = 0; b < src.batch; ++b)
      for (index_t s = 0; s < src.seq; ++s)
        for (index_t h = 0; h < src.heads; ++h)
          for (index_t d = 0; d < src.dim; ++d) dst(b, s, h, d) = src(b, s, h, d);
  };
  auto padded = [](std::vector<float>& buf, index_t b, index_t s, index_t h, index_t d) {
    index_t const hs = d + 3, ss = h * hs + 1, bs = s * ss + 2;
    buf.assign(static_cast<std::size_t>(b * bs + 1), -7.0f);
    return view<float>{buf.data() + 1, b, s, h, d, bs, ss, hs, 1};
  };
  std::vector<float> q2(p.q.size()), dq2(p.q.size()), out2(p.out.size()), dout2(p.dout.size()), kb, vb, dkb, dvb;
  view<float> q = make_bhsd(q2.data(), B, Hq, Sq, D), dq = make_bhsd(dq2.data(), B, Hq, Sq, D);
  view<float> out = make_bhsd(out2.data(), B, Hq, Sq, Dv), dout = make_bhsd(dout2.data(), B, Hq, Sq, Dv);
  view<float> k = padded(kb, B, Sk, Hkv, D), v = padded(vb, B, Sk, Hkv, Dv);
  view<float> dk = padded(dkb, B, Sk, Hkv, D), dv = padded(dvb, B, Sk, Hkv, Dv);
  copy_into(q, p.vq());
  copy_into(k, p.vk());
  copy_into(v, p.vv());
  copy_into(out, p.vout());
  copy_into(dout, p.vdout());
  auto g2 = sh.make_gradients();
  attention_backward<path::reference>(q, k, v, out, dout, dq, dk, dv, sh, p.opt, g2);
  bool same = true;
  for (index_t b = 0; b < B; ++b)
    for (index_t s = 0; s < Sk; ++s) {
      for (index_t h = 0; h < Hq && s < Sq; ++h)
        for (index_t d = 0; d < D; ++d) same = same && dq(b, s, h, d) == p.vdq()(b, s, h, d);
      for (index_t h = 0; h < Hkv; ++h) {
        for (index_t d = 0; d < D; ++d) same = same && dk(b, s, h, d) == p.vdk()(b, s, h, d);
        for (index_t d = 0; d < Dv; ++d) same = same && dv(b, s, h, d) == p.vdv()(b, s, h, d);
      }
    }
  CHECK(same);
  CHECK(g1.key == g2.key);
  CHECK(g1.value == g2.value);
  // The padding between rows is never written.
  CHECK(dkb[0] == -7.0f);
  CHECK(dvb[0] == -7.0f);
}

TEST_CASE("backward: no query rows or no query heads give zero dk and dv", "[backward]") {
  index_t const B = 2, Sk = 3, Hkv = 2, D = 4;
  std::vector<double> k = posenc_test::random_vector<double>(static_cast<std::size_t>(B * Sk * Hkv * D), 141);
  std::vector<double> v = k, dk(k.size(), 5.0), dv(k.size(), 5.0);
  std::vector<double> q(64, 1.0), out(64, 1.0), dout(64, 1.0), dq(64, 5.0);
  no_gradients g;
  for (index_t sq : {0, 3}) {
    index_t const hq = sq == 0 ? 2 : 0;  // no rows, or rows of no head
    auto const kv = make_bshd(k.data(), B, Sk, Hkv, D);
    auto const vv = make_bshd(v.data(), B, Sk, Hkv, D);
    attention_backward<path::reference>(make_bshd(q.data(), B, sq, hq, D), kv, vv, make_bshd(out.data(), B, sq, hq, D),
                                        make_bshd(dout.data(), B, sq, hq, D), make_bshd(dq.data(), B, sq, hq, D),
                                        make_bshd(dk.data(), B, Sk, Hkv, D), make_bshd(dv.data(), B, Sk, Hkv, D),
                                        none{}, attention_options<double>{}, g);
    CHECK(std::all_of(dk.begin(), dk.end(), [](double x) { return x == 0.0; }));
    CHECK(std::all_of(dv.begin(), dv.end(), [](double x) { return x == 0.0; }));
    std::fill(dk.begin(), dk.end(), 5.0);
    std::fill(dv.begin(), dv.end(), 5.0);
  }
}

TEST_CASE("backward: Transformer-XL's u, v and W_R by central differences", "[backward][transformer_xl]") {
  index_t const H = 2, D = 3, P = 4, L = 8;
  std::vector<double> u = posenc_test::random_vector<double>(static_cast<std::size_t>(H * D), 51, -0.5, 0.5);
  std::vector<double> v = posenc_test::random_vector<double>(static_cast<std::size_t>(H * D), 52, -0.5, 0.5);
  std::vector<double> wr = posenc_test::random_vector<double>(static_cast<std::size_t>(H * D * P), 53, -0.5, 0.5);
  struct config {
    char const* name;
    index_t sq, sk, hkv, memory_length;
    bool causal;
    double softcap;
  };
  config const configs[] = {{"memory 3, causal", 4, 7, H, 0, true, 0.0},
                            {"no memory, bidirectional, softcap", 5, 5, H, 0, false, 2.0},
                            {"memory cut from 4 to 2, GQA", 3, 7, 1, 2, true, 0.0}};
  for (config const& c : configs) {
    auto make = [&] {
      return transformer_xl<double>(L, as_table(u, H, D), as_table(v, H, D), as_table(wr, H * D, P), c.memory_length);
    };
    attention_problem<double> p(2, c.sq, c.sk, H, c.hkv, D, 2, 54);
    p.opt.causal = c.causal;
    p.opt.softcap = c.softcap;
    auto enc = make();
    auto g = enc.make_gradients();
    fd_report r = check_input_gradients(p, enc, g);
    std::vector<double> const gu = flat(g.u), gv = flat(g.v), gw = flat(enc.w_r_gradient(g));
    auto loss = [&] { return p.loss(make()); };
    central_differences(r, "d(u)", u, gu, loss);
    central_differences(r, "d(v)", v, gv, loss);
    central_differences(r, "d(W_R)", wr, gw, loss);
    INFO(c.name << ": " << r.describe());
    CHECK(r.ok());
    if (c.memory_length > 0) {  // the cut keys get no gradient
      index_t const cut = c.sk - c.sq - c.memory_length;
      for (index_t b = 0; b < 2; ++b)
        for (index_t j = 0; j < cut; ++j)
          for (index_t h = 0; h < c.hkv; ++h) {
            CHECK(p.vdk().ptr(b, j, h)[0] == 0.0);
            CHECK(p.vdv().ptr(b, j, h)[1] == 0.0);
          }
    }
  }
}
}  // namespace attention_backward_tests
