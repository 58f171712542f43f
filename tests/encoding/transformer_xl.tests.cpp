// SPDX-License-Identifier: MIT
// transformer_xl: its tables against the formulas in double, the hooks against the checked forms, the docs' usage code.
#include <posenc/attention/attention.hpp>
#include <posenc/attention/backward.hpp>
#include <posenc/encoding/transformer_xl.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "support/backward_check.hpp"
#include "support/catch.hpp"
#include "support/error_of.hpp"
#include "support/transformer_xl.hpp"

namespace encoding_transformer_xl_tests {

using posenc::index_t;

// The encoder contract: relative-key hooks with the head first, for its own element type only.
static_assert(posenc::keeps_encoder_contract_v<posenc::transformer_xl<float>, float>);
static_assert(posenc::keeps_encoder_contract_v<posenc::transformer_xl<double>, double>);
static_assert(!posenc::keeps_encoder_contract_v<posenc::transformer_xl<float>, double>);
static_assert(posenc::relative_key_value_v<posenc::transformer_xl<float>> &&
              posenc::is_relative_v<posenc::transformer_xl<float>>);

TEST_CASE("transformer_xl tables: R_h(d) = W_R,h PE(d) with the paper's frequencies", "[encoding][transformer_xl]") {
  index_t const H = 3, D = 5, m = 6, L = 40;
  auto const w = posenc_test::random_table<double>(H * D, m, 3);
  auto const u = posenc_test::random_table<double>(H, D, 1), v = posenc_test::random_table<double>(H, D, 2);
  posenc::transformer_xl<double> enc(L, u, v, w);
  CHECK(enc.heads() == H);
  CHECK(enc.head_dim() == D);
  CHECK(enc.pos_dim() == m);
  CHECK(enc.distance_limit() == L);
  CHECK(enc.memory_length() == 0);
  CHECK(enc.max_positions() == 0);
  CHECK_FALSE(enc.has_values());
  for (index_t h = 0; h < H; ++h)
    for (index_t d : {index_t{-L}, index_t{-7}, index_t{0}, index_t{1}, index_t{13}, index_t{L}}) {
      double c = 0;
      for (index_t t = 0; t < D; ++t) {
        double r = 0;
        for (index_t k = 0; k < m / 2; ++k) {
          double const f = std::pow(10000.0, -2.0 * static_cast<double>(k) / static_cast<double>(m));
          r += w(h * D + t, k) * std::sin(static_cast<double>(d) * f) +
               w(h * D + t, m / 2 + k) * std::cos(static_cast<double>(d) * f);
        }
        CHECK(std::abs(enc.relative_key(h, d, t) - r) < 1e-14);
        c += (v(h, t) - u(h, t)) * r;
      }
      CHECK(std::abs(enc.position_bias(h, d) - c) < 1e-14);
    }
  // The transposed table the fused path reads holds the same values.
  auto const dc = enc.columns(1);
  CHECK(dc.count == 2 * L + 1);
  CHECK(dc.zero == L);
  for (index_t t = 0; t < D; ++t) CHECK(dc.keys[t * dc.stride + dc.zero - 7] == enc.relative_key(1, -7, t));
  CHECK(dc.bias[dc.zero + 13] == enc.position_bias(1, 13));
  for (index_t t = 0; t < D; ++t) CHECK(enc.content_bias(2)[t] == u(2, t));
}

TEMPLATE_TEST_CASE("transformer_xl score_row: scale * (q + v) . R(d) for the query shifted by u, nothing past count",
                   "[encoding][transformer_xl]", float, double) {
  using T = TestType;
  index_t const H = 2, D = 9, L = 30;
  auto const enc = posenc_test::random_transformer_xl<T>(H, D, 8, L, 4);
  auto const vb = posenc_test::random_table<double>(H, D, 5);  // v of random_transformer_xl(.., 4)
  auto const q = posenc_test::random_vector<T>(static_cast<std::size_t>(D), 8);
  double const tol = std::is_same_v<T, float> ? 1e-5 : 1e-13;
  for (index_t count : {index_t{1}, index_t{7}, index_t{17}}) {
    std::vector<T> out(static_cast<std::size_t>(count + 3), T(0.25));
    enc.add_position_scores(1, posenc::span<const T>(q.data(), D), 20, 12, T(0.5),
                            posenc::span<T>(out.data(), count));
    for (index_t j = 0; j < count; ++j) {
      index_t const d = 20 - 12 - j;
      double want = 0;
      for (index_t t = 0; t < D; ++t)
        want += (static_cast<double>(q[static_cast<std::size_t>(t)]) + vb(1, t)) *
                static_cast<double>(enc.relative_key(1, d, t));
      CHECK(std::abs(static_cast<double>(out[static_cast<std::size_t>(j)]) - (0.25 + 0.5 * want)) < tol);
    }
    for (index_t j = count; j < count + 3; ++j) CHECK(out[static_cast<std::size_t>(j)] == T(0.25));
  }
}

TEST_CASE("usage code of docs/encoders/relative.md: Transformer-XL", "[encoding][transformer_xl][docs]") {
  // Transformer-XL: 4 heads of 16, d_model 64; u and v (heads, head_dim), W_R (heads x head_dim, d_model).
  posenc::index_t const heads = 4, head_dim = 16, d_model = 64, mem = 32, seg = 16;
  posenc::relative_table<float> u = posenc::relative_table<float>::Constant(heads, head_dim, 0.01f);
  posenc::relative_table<float> v = posenc::relative_table<float>::Constant(heads, head_dim, -0.01f);
  posenc::relative_table<float> w_r = posenc::relative_table<float>::Constant(heads * head_dim, d_model, 0.02f);
  // Distances up to mem + seg - 1; a longer memory is cut to its last `mem` keys.
  posenc::transformer_xl<float> enc(mem + seg, u, v, w_r, mem);
  // Keys and values are [memory ; segment]: query i sits at position mem + i.
  std::vector<float> q(seg * heads * head_dim, 0.1f), k((mem + seg) * heads * head_dim, 0.2f);
  std::vector<float> val(k.size(), 0.3f), out(q.size());
  posenc::attention_options<float> opt;
  opt.causal = true;  // the model's mask: key j <= mem + i
  posenc::attention(posenc::make_bshd<const float>(q.data(), 1, seg, heads, head_dim),
                    posenc::make_bshd<const float>(k.data(), 1, mem + seg, heads, head_dim),
                    posenc::make_bshd<const float>(val.data(), 1, mem + seg, heads, head_dim),
                    posenc::make_bshd(out.data(), 1, seg, heads, head_dim), enc, opt);
  for (float x : out) CHECK(std::abs(x - 0.3f) < 1e-6f);
}

namespace {

using dtable = posenc::relative_table<double>;

template <class T>
posenc::relative_table<T> cast_table(dtable const& t) {
  return t.template cast<T>();
}

template <class A, class B>
double max_abs_diff(A const& a, B const& b) {
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    m = std::max(m, std::abs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
  return m;
}

template <class A>
double max_abs(A const& a) {
  double m = 0;
  for (auto x : a) m = std::max(m, std::abs(static_cast<double>(x)));
  return m;
}

Eigen::Map<const dtable> as_table(std::vector<double> const& v, index_t rows, index_t cols) {
  return Eigen::Map<const dtable>(v.data(), rows, cols);
}
std::vector<double> flat(dtable const& t) { return std::vector<double>(t.data(), t.data() + t.size()); }

// The float rounding of R moves (v_h - u_h) . R_h(d) by at most
// sum_t |v_t - u_t| |R_t - fl(R_t)| (R_t in double), and each form rounds its
// double result to float once more: half an ulp each.
double float_bias_bound(dtable const& u, dtable const& v, dtable const& r, index_t h, index_t row, index_t D,
                        double c) {
  double b = 0;
  for (index_t t = 0; t < D; ++t) {
    double const x = r(row, h * D + t);
    b += std::abs(v(h, t) - u(h, t)) * std::abs(x - static_cast<double>(static_cast<float>(x)));
  }
  return b + std::ldexp(std::abs(c), -23) + std::numeric_limits<double>::min();
}

}  // namespace

TEMPLATE_TEST_CASE("transformer_xl from_distances: R tabulated from W_R gives the same tables and attention",
                   "[encoding][transformer_xl]", float, double) {
  using T = TestType;
  index_t const H = 3, D = 8, P = 10, B = 2, Sq = 5, mem = 4, Sk = mem + Sq, L = Sk - 1;
  // Values exact in float, so that both element types start from the same numbers.
  dtable const u = posenc_test::random_table<float>(H, D, 71).cast<double>();
  dtable const v = posenc_test::random_table<float>(H, D, 72).cast<double>();
  dtable const w = posenc_test::random_table<float>(H * D, P, 73).cast<double>();
  // R by distance from a double W_R encoder, read through relative_key.
  posenc::transformer_xl<double> const exact(L, u, v, w);
  dtable r(2 * L + 1, H * D);
  for (index_t d = -L; d <= L; ++d)
    for (index_t h = 0; h < H; ++h)
      for (index_t t = 0; t < D; ++t) r(d + L, h * D + t) = exact.relative_key(h, d, t);

  for (index_t M : {index_t{0}, index_t{3}}) {
    posenc::transformer_xl<T> const by_w(L, cast_table<T>(u), cast_table<T>(v), cast_table<T>(w), M);
    auto const by_r = posenc::transformer_xl<T>::from_distances(L, cast_table<T>(u), cast_table<T>(v),
                                                                cast_table<T>(r), M);
    CHECK(by_r.heads() == H);
    CHECK(by_r.head_dim() == D);
    CHECK(by_r.pos_dim() == 0);
    CHECK(by_r.distance_limit() == L);
    CHECK(by_r.memory_length() == M);
    CHECK(by_r.max_positions() == 0);
    CHECK_FALSE(by_r.has_values());
    CHECK(by_r.from_r());
    CHECK_FALSE(by_w.from_r());
    // Both forms store R_h(d) rounded once from the same double value: equal.
    // The bias term is computed in double from the given values; in double
    // these are the same values (equal results), in float the R form sees
    // R rounded to float (bounded by float_bias_bound).
    double worst_bias = 0;
    for (index_t h = 0; h < H; ++h)
      for (index_t d = -L; d <= L; ++d) {
        for (index_t t = 0; t < D; ++t) CHECK(by_r.relative_key(h, d, t) == by_w.relative_key(h, d, t));
        double const cw = static_cast<double>(by_w.position_bias(h, d));
        double const cr = static_cast<double>(by_r.position_bias(h, d));
        double const bound = std::is_same_v<T, double> ? 0.0 : float_bias_bound(u, v, r, h, d + L, D, cw);
        INFO("head " << h << " distance " << d);
        CHECK(std::abs(cr - cw) <= bound);
        worst_bias = std::max(worst_bias, std::abs(cr - cw));
      }
    auto const cols_w = by_w.columns(2), cols_r = by_r.columns(2);
    REQUIRE(cols_r.count == cols_w.count);
    for (index_t i = 0; i < D * cols_r.count; ++i) CHECK(cols_r.keys[i] == cols_w.keys[i]);
    for (index_t t = 0; t < D; ++t) CHECK(by_r.content_bias(1)[t] == by_w.content_bias(1)[t]);

    // Attention: the two encoders differ at most by worst_bias in each
    // position term, so each score by scale * worst_bias, each probability by a
    // factor within exp(+-2 scale worst_bias) and each output by at most
    // 2.0001 scale worst_bias max|v| (and the lse by scale worst_bias); on top,
    // each float run's own rounding, below the tests' 1e-6 (relative above 1).
    // In double both runs compute the same numbers: equal.
    posenc_test::txl_buffers<T> bf(B, Sq, Sk, H, H, D, 74);
    double const scale = 1.0 / std::sqrt(static_cast<double>(D));
    for (bool causal : {true, false}) {
      posenc::attention_options<T> opt;
      opt.causal = causal;
      auto const rw = bf.template run<posenc::path::reference>(by_w, opt);
      auto const rr = bf.template run<posenc::path::reference>(by_r, opt);
      auto const fw = bf.template run<posenc::path::fused>(by_w, opt);
      auto const fr = bf.template run<posenc::path::fused>(by_r, opt);
      double const spread = 2.0001 * scale * worst_bias * std::max(1.0, max_abs(bf.v));
      double const tol = std::is_same_v<T, double> ? 0.0 : spread + 2e-6 * std::max(1.0, max_abs(rw));
      INFO("memory_length " << M << (causal ? " causal" : " bidirectional"));
      CHECK(max_abs_diff(rr, rw) <= tol);
      CHECK(max_abs_diff(fr, fw) <= tol);
    }
  }
}

TEST_CASE("transformer_xl from_distances: one R entry moves only the scores at its distance and head",
          "[encoding][transformer_xl]") {
  index_t const H = 2, D = 4, B = 1, Sq = 4, mem = 3, Sk = mem + Sq, L = Sk - 1;
  auto const u = posenc_test::random_table<double>(H, D, 81), v = posenc_test::random_table<double>(H, D, 82);
  auto const r = posenc_test::random_table<double>(2 * L + 1, H * D, 83);
  posenc_test::txl_buffers<double> bf(B, Sq, Sk, H, H, D, 84);
  auto scores_of = [&](dtable const& table) {
    auto const enc = posenc::transformer_xl<double>::from_distances(L, u, v, table);
    std::vector<double> out(static_cast<std::size_t>(B * Sq * H * D)), s(static_cast<std::size_t>(B * H * Sq * Sk));
    posenc::attention_options<double> opt;  // bidirectional: negative distances too
    opt.scores = s;
    opt.scores_stage = posenc::score_stage::biased;
    posenc::attention<posenc::path::materialized>(bf.qv(), bf.kv(), bf.vv(),
                                                  posenc::make_bshd(out.data(), B, Sq, H, D), enc, opt);
    return s;
  };
  auto const base = scores_of(r);
  double const scale = 1.0 / std::sqrt(static_cast<double>(D)), delta = 0.75;
  for (index_t d : {index_t{-2}, index_t{0}, index_t{4}}) {
    for (index_t h = 0; h < H; ++h) {
      index_t const t = (d + 2 + h) % D;
      dtable changed = r;
      changed(d + L, h * D + t) += delta;
      auto const s = scores_of(changed);
      int moved = 0;
      for (index_t hh = 0; hh < H; ++hh)
        for (index_t i = 0; i < Sq; ++i)
          for (index_t j = 0; j < Sk; ++j) {
            std::size_t const at = static_cast<std::size_t>((hh * Sq + i) * Sk + j);
            INFO("entry (" << d << ", head " << h << ", dim " << t << "): head " << hh << " query " << i
                           << " key " << j);
            if (hh == h && mem + i - j == d) {
              // scale * ((q + u) . R + (v - u) . R) moves by scale * (q + v)_t * delta.
              double const want = scale * (bf.q[static_cast<std::size_t>((i * H + h) * D + t)] + v(h, t)) * delta;
              CHECK(std::abs((s[at] - base[at]) - want) <= 1e-14);
              ++moved;
            } else {
              CHECK(s[at] == base[at]);
            }
          }
      index_t const pairs = std::min(Sq, Sk - mem + d) - std::max(index_t{0}, d - mem);  // i with 0 <= mem + i - d < Sk
      CHECK(moved == pairs);
    }
  }
}

TEST_CASE("transformer_xl r_gradient: g.r laid out like from_distances' r; W_R's gradient its projection",
          "[encoding][transformer_xl][backward]") {
  index_t const H = 3, D = 2, P = 6, L = 4, n = 2 * L + 1;
  auto const u = posenc_test::random_table<double>(H, D, 91), v = posenc_test::random_table<double>(H, D, 92);
  posenc::transformer_xl<double> const by_w(L, u, v, posenc_test::random_table<double>(H * D, P, 93));
  auto const by_r =
      posenc::transformer_xl<double>::from_distances(L, u, v, posenc_test::random_table<double>(n, H * D, 94));
  for (auto const* enc : {&by_w, &by_r}) {
    auto g = enc->make_gradients();
    for (index_t row = 0; row < H * n; ++row)
      for (index_t t = 0; t < D; ++t) g.r(row, t) = static_cast<double>(100 * row + t);
    auto const gr = enc->r_gradient(g);
    REQUIRE(gr.rows() == n);
    REQUIRE(gr.cols() == H * D);
    for (index_t h = 0; h < H; ++h)
      for (index_t d = -L; d <= L; ++d)
        for (index_t t = 0; t < D; ++t) CHECK(gr(d + L, h * D + t) == g.r(h * n + d + L, t));
  }
  // d(W_R)[h D + t][m] = sum_d d(R)(d, h D + t) PE(d)[m].
  auto g = by_w.make_gradients();
  g.r = posenc_test::random_table<double>(H * n, D, 95);
  auto const gr = by_w.r_gradient(g);
  auto const gw = by_w.w_r_gradient(g);
  for (index_t c = 0; c < H * D; ++c)
    for (index_t m = 0; m < P; ++m) {
      double want = 0;
      for (index_t d = -L; d <= L; ++d) {
        double const f = std::pow(10000.0, -2.0 * static_cast<double>(m % (P / 2)) / static_cast<double>(P));
        double const pe = m < P / 2 ? std::sin(static_cast<double>(d) * f) : std::cos(static_cast<double>(d) * f);
        want += gr(d + L, c) * pe;
      }
      CHECK(std::abs(gw(c, m) - want) <= 1e-13);
    }
  // The gradients' shapes are checked first.
  auto bad = by_r.make_gradients();
  bad.r = dtable::Zero(H * n - 1, D);
  CHECK_THAT(posenc_test::error_of([&] { (void)by_r.r_gradient(bad); }),
             posenc_test::contains("posenc::transformer_xl::r_gradient: grads.r shape is (26, 2), expected (27, 2)"));
}

TEST_CASE("transformer_xl from_distances: u, v and R by central differences", "[encoding][transformer_xl][backward]") {
  index_t const H = 2, D = 3, L = 8;
  std::vector<double> u = posenc_test::random_vector<double>(static_cast<std::size_t>(H * D), 101, -0.5, 0.5);
  std::vector<double> v = posenc_test::random_vector<double>(static_cast<std::size_t>(H * D), 102, -0.5, 0.5);
  std::vector<double> r =
      posenc_test::random_vector<double>(static_cast<std::size_t>((2 * L + 1) * H * D), 103, -0.5, 0.5);
  struct config {
    char const* name;
    index_t sq, sk, hkv, memory_length;
    bool causal;
  };
  config const configs[] = {{"memory 3, causal", 4, 7, H, 0, true},
                            {"no memory, bidirectional", 5, 5, H, 0, false},
                            {"memory cut from 4 to 2, GQA", 3, 7, 1, 2, true}};
  for (config const& c : configs) {
    auto make = [&] {
      return posenc::transformer_xl<double>::from_distances(L, as_table(u, H, D), as_table(v, H, D),
                                                            as_table(r, 2 * L + 1, H * D), c.memory_length);
    };
    posenc_test::attention_problem<double> p(2, c.sq, c.sk, H, c.hkv, D, 2, 104);
    p.opt.causal = c.causal;
    auto const enc = make();
    auto g = enc.make_gradients();
    posenc_test::fd_report rep = posenc_test::check_input_gradients(p, enc, g);
    std::vector<double> const gu = flat(g.u), gv = flat(g.v), gr = flat(enc.r_gradient(g));
    auto loss = [&] { return p.loss(make()); };
    posenc_test::central_differences(rep, "d(u)", u, gu, loss);
    posenc_test::central_differences(rep, "d(v)", v, gv, loss);
    posenc_test::central_differences(rep, "d(R)", r, gr, loss);
    INFO(c.name << ": " << rep.describe());
    CHECK(rep.ok());
    // Distances no visible pair has get no gradient (causal: every negative one).
    if (c.causal)
      for (index_t d = -L; d < 0; ++d)
        for (index_t col = 0; col < H * D; ++col) CHECK(gr[static_cast<std::size_t>((d + L) * H * D + col)] == 0.0);
  }
}

TEST_CASE("transformer_xl from_distances: errors name the argument and the expected value",
          "[encoding][transformer_xl][errors]") {
  using table = posenc::relative_table<float>;
  using posenc_test::contains;
  using posenc_test::error_of;
  using txl = posenc::transformer_xl<float>;
  table const u = table::Zero(2, 4), v = table::Zero(2, 4), r = table::Zero(21, 8);
  REQUIRE_NOTHROW(txl::from_distances(10, u, v, r));
  CHECK(error_of([&] { txl::from_distances(10, u, v, table::Zero(20, 8)); }) ==
        "posenc::transformer_xl::from_distances: r shape is (20, 8), expected (21, 8) (2 x distance_limit + 1, "
        "heads x head_dim of u)");
  CHECK_THAT(error_of([&] { txl::from_distances(10, u, v, table::Zero(21, 9)); }),
             contains("r shape is (21, 9), expected (21, 8) (2 x distance_limit + 1, heads x head_dim of u)"));
  CHECK_THAT(error_of([&] { txl::from_distances(9, u, v, r); }), contains("r shape is (21, 8), expected (19, 8)"));
  table bad = r;
  bad(3, 5) = std::numeric_limits<float>::infinity();
  CHECK(error_of([&] { txl::from_distances(10, u, v, bad); }) ==
        "posenc::transformer_xl::from_distances: r(3, 5) is inf, expected a finite number");
  bad(3, 5) = std::numeric_limits<float>::quiet_NaN();
  CHECK_THAT(error_of([&] { txl::from_distances(10, u, v, bad); }),
             contains("r(3, 5) is nan, expected a finite number"));
  CHECK_THAT(error_of([&] { txl::from_distances(-1, u, v, r); }),
             contains("posenc::transformer_xl::from_distances: distance_limit is -1, expected 0 .. "));
  CHECK_THAT(error_of([&] { txl::from_distances(10, u, v, r, -2); }), contains("memory_length is -2, expected 0 .. "));
  CHECK_THAT(error_of([&] { txl::from_distances(10, u, table::Zero(2, 5), r); }),
             contains("v shape is (2, 5), expected (2, 4) (heads, head_dim) of u"));
  CHECK_THAT(error_of([&] { txl::from_distances(10, table::Zero(0, 4), v, r); }),
             contains("u shape is (0, 4), expected (heads >= 1, head_dim >= 1)"));
  table bad_u = u;
  bad_u(1, 2) = std::numeric_limits<float>::quiet_NaN();
  CHECK_THAT(error_of([&] { txl::from_distances(10, bad_u, v, r); }), contains("u(1, 2) is nan, expected a finite"));
  // No W_R to differentiate: w_r_gradient names r_gradient.
  auto const enc = txl::from_distances(10, u, v, r);
  auto g = enc.make_gradients();
  CHECK(error_of([&] { (void)enc.w_r_gradient(g); }) ==
        "posenc::transformer_xl::w_r_gradient: the encoder was built from R by distance (from_distances) and has no "
        "W_R, expected r_gradient(g) for the gradient of R");
  CHECK(enc.r_gradient(g).rows() == 21);
  CHECK(enc.r_gradient(g).cols() == 8);
}

TEST_CASE("usage code of docs/encoders/relative.md: Transformer-XL from R by distance",
          "[encoding][transformer_xl][docs]") {
  using table = posenc::relative_table<float>;
  posenc::index_t const heads = 2, head_dim = 4, klen = 6;
  table u = table::Constant(heads, head_dim, 0.01f), v = table::Constant(heads, head_dim, -0.01f);
  table r_head_k = table::Constant(klen, heads * head_dim, 0.05f);  // as stored: distances klen - 1 .. 0
  r_head_k.row(0).setConstant(0.5f);                                 // distance klen - 1
  // Distances -limit .. limit by row: distance d at row limit + d; the negative ones
  // (keys after the query, never visible under the model's causal mask) are zeros here.
  posenc::index_t const limit = klen - 1;
  table r = table::Zero(2 * limit + 1, heads * head_dim);
  r.bottomRows(klen) = r_head_k.colwise().reverse();
  auto enc = posenc::transformer_xl<float>::from_distances(limit, u, v, r);
  float const far = enc.relative_key(0, limit, 0);  // R_0(klen - 1) = r_head_k(0, 0)
  CHECK(far == 0.5f);
  CHECK(enc.relative_key(1, 0, 3) == 0.05f);
  CHECK(enc.relative_key(1, -1, 3) == 0.0f);
  CHECK(enc.pos_dim() == 0);
}

TEST_CASE("usage code of docs/backward.md: Transformer-XL's d(R) by distance", "[encoding][transformer_xl][docs]") {
  posenc::index_t const heads = 2, head_dim = 4, seg = 5, limit = seg - 1;
  using table = posenc::relative_table<double>;
  table u = table::Constant(heads, head_dim, 0.1), v = table::Constant(heads, head_dim, -0.1);
  table r = table::Constant(2 * limit + 1, heads * head_dim, 0.2);
  std::size_t const n = static_cast<std::size_t>(seg * heads * head_dim);
  std::vector<double> qb(n, 0.3), kb(n, 0.4), vb(n, 0.5), ob(n), dob(n, 1.0), dqb(n), dkb(n), dvb(n);
  auto view = [&](std::vector<double>& b) { return posenc::make_bshd(b.data(), 1, seg, heads, head_dim); };
  auto q = view(qb), k = view(kb), val = view(vb), out = view(ob), dout = view(dob), dq = view(dqb), dk = view(dkb),
       dv = view(dvb);
  posenc::attention_options<double> opt;
  opt.causal = true;
  posenc::attention(q, k, val, out, posenc::transformer_xl<double>::from_distances(limit, u, v, r), opt);
  // R given by distance: its gradient in r's shape, (2 limit + 1, heads x head_dim).
  auto enc = posenc::transformer_xl<double>::from_distances(limit, u, v, r);
  auto g = enc.make_gradients();
  posenc::attention_backward(q, k, val, out, dout, dq, dk, dv, enc, opt, g);
  table d_r = enc.r_gradient(g);  // enc.w_r_gradient(g) throws: there is no W_R
  CHECK(d_r.rows() == 2 * limit + 1);
  CHECK(d_r.cols() == heads * head_dim);
  // Every value is equal: the outputs do not depend on the weights, and d(R) is 0.
  CHECK(d_r.cwiseAbs().maxCoeff() < 1e-12);
  CHECK(d_r.topRows(limit).isZero());  // causal: no pair at a negative distance
}
}  // namespace encoding_transformer_xl_tests
