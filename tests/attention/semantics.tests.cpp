// SPDX-License-Identifier: MIT
// posenc::attention: options and pinned semantics on small hand-checked cases.
#include <posenc/attention/attention.hpp>
#include <posenc/encoding/none.hpp>

#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/error_of.hpp"
#include "support/fake_encoders.hpp"
#include "support/random.hpp"

namespace attention_semantics_tests {

using posenc::index_t;
using posenc_test::Approx;

namespace {

/// q, k, v, out buffers in BSHD layout.
template <class T>
struct problem {
  index_t B, Sq, Sk, Hq, Hkv, D, Dv;
  std::vector<T> q, k, v, out;
  problem(index_t b, index_t sq, index_t sk, index_t hq, index_t hkv, index_t d, index_t dv,
          std::uint64_t seed)
      : B(b), Sq(sq), Sk(sk), Hq(hq), Hkv(hkv), D(d), Dv(dv),
        q(posenc_test::random_vector<T>(static_cast<std::size_t>(b * sq * hq * d), seed)),
        k(posenc_test::random_vector<T>(static_cast<std::size_t>(b * sk * hkv * d), seed + 1)),
        v(posenc_test::random_vector<T>(static_cast<std::size_t>(b * sk * hkv * dv), seed + 2)),
        out(static_cast<std::size_t>(b * sq * hq * dv), T(-7)) {}
  posenc::view<T> qv() { return posenc::make_bshd(q.data(), B, Sq, Hq, D); }
  posenc::view<T> kv() { return posenc::make_bshd(k.data(), B, Sk, Hkv, D); }
  posenc::view<T> vv() { return posenc::make_bshd(v.data(), B, Sk, Hkv, Dv); }
  posenc::view<T> ov() { return posenc::make_bshd(out.data(), B, Sq, Hq, Dv); }
  template <class Path, class E>
  void run(E const& enc, posenc::attention_options<T> const& opt = {}) {
    posenc::attention<Path>(qv(), kv(), vv(), ov(), enc, opt);
  }
};

/// Element (b, s, h, t) of a BSHD buffer.
template <class T>
double at(std::vector<T> const& x, index_t S, index_t H, index_t Dd, index_t b, index_t s, index_t h, index_t t) {
  return static_cast<double>(x[static_cast<std::size_t>(((b * S + s) * H + h) * Dd + t)]);
}

/// Attention of query (b, i, h) of p over the keys `allowed` says, with an
/// extra per-key score term; plain double code, independent of the library.
template <class T, class Allowed, class Extra>
std::vector<double> expected_row(problem<T> const& p, index_t b, index_t i, index_t h, double scale,
                                 Allowed allowed, Extra extra) {
  index_t const hk = h / (p.Hq / p.Hkv);
  std::vector<double> s;
  std::vector<index_t> js;
  double m = -INFINITY;
  for (index_t j = 0; j < p.Sk; ++j) {
    if (!allowed(j)) continue;
    double d = 0;
    for (index_t t = 0; t < p.D; ++t)
      d += at(p.q, p.Sq, p.Hq, p.D, b, i, h, t) * at(p.k, p.Sk, p.Hkv, p.D, b, j, hk, t);
    s.push_back(scale * d + extra(j));
    js.push_back(j);
    m = std::max(m, s.back());
  }
  std::vector<double> o(static_cast<std::size_t>(p.Dv), 0.0);
  if (js.empty()) return o;
  double sum = 0;
  for (auto& x : s) sum += (x = std::exp(x - m));
  for (std::size_t n = 0; n < js.size(); ++n)
    for (index_t t = 0; t < p.Dv; ++t) o[t] += s[n] / sum * at(p.v, p.Sk, p.Hkv, p.Dv, b, js[n], hk, t);
  return o;
}

template <class T>
void check_row(problem<T> const& p, index_t b, index_t i, index_t h, std::vector<double> const& want,
               double tol = 1e-5) {
  for (index_t t = 0; t < p.Dv; ++t) {
    INFO("b " << b << " i " << i << " h " << h << " t " << t);
    CHECK(at(p.out, p.Sq, p.Hq, p.Dv, b, i, h, t) == Approx(want[t]).margin(tol));
  }
}

auto all_keys = [](index_t) { return true; };
auto no_extra = [](index_t) { return 0.0; };

}  // namespace

TEMPLATE_TEST_CASE("attention: plain softmax attention, GQA head mapping, default scale", "[attention]",
                   posenc::path::reference, posenc::path::materialized) {
  problem<float> p(2, 3, 5, 4, 2, 4, 3, 11);
  p.run<TestType>(posenc::none{});
  for (index_t b = 0; b < p.B; ++b)
    for (index_t h = 0; h < p.Hq; ++h)
      for (index_t i = 0; i < p.Sq; ++i) check_row(p, b, i, h, expected_row(p, b, i, h, 0.5, all_keys, no_extra));
  // contiguous groups: query heads 0, 1 use kv head 0 (not h mod Hkv)
  problem<double> g(1, 2, 3, 4, 2, 2, 2, 5);
  g.run<TestType>(posenc::none{});
  for (index_t h = 0; h < 4; ++h)
    for (index_t i = 0; i < 2; ++i)
      check_row(g, 0, i, h, expected_row(g, 0, i, h, 1 / std::sqrt(2.0), all_keys, no_extra), 1e-12);
}

TEMPLATE_TEST_CASE("attention: causal alignment, offsets, window, padding", "[attention]",
                   posenc::path::reference, posenc::path::materialized) {
  problem<double> p(2, 3, 6, 2, 1, 4, 4, 21);
  double const sc = 0.5;
  SECTION("default offset is bottom-right: query i sits at Sk - Sq + i") {
    posenc::attention_options<double> opt;
    opt.causal = true;
    p.run<TestType>(posenc::none{}, opt);
    for (index_t b = 0; b < 2; ++b)
      for (index_t h = 0; h < 2; ++h)
        for (index_t i = 0; i < 3; ++i)
          check_row(p, b, i, h, expected_row(p, b, i, h, sc, [&](index_t j) { return j <= 3 + i; }, no_extra), 1e-12);
  }
  SECTION("per-batch offsets, negative ones give rows with no key: zeros and lse -inf") {
    std::vector<index_t> offs{-1, 2};
    std::vector<double> lse(2 * 2 * 3, 5.0);
    posenc::attention_options<double> opt;
    opt.causal = true;
    opt.q_positions = posenc::position_span::per_batch(offs);
    opt.lse = lse;
    p.run<TestType>(posenc::none{}, opt);
    for (index_t b = 0; b < 2; ++b)
      for (index_t h = 0; h < 2; ++h)
        for (index_t i = 0; i < 3; ++i) {
          index_t const pi = offs[b] + i;
          check_row(p, b, i, h, expected_row(p, b, i, h, sc, [&](index_t j) { return j <= pi; }, no_extra), 1e-12);
          double const l = lse[static_cast<std::size_t>((b * 2 + h) * 3 + i)];
          if (pi < 0) {
            CHECK(l == -INFINITY);
          } else {
            CHECK(std::isfinite(l));
          }
        }
  }
  SECTION("sliding window W: keys p_i - W < p_j <= p_i, W keys including the query") {
    posenc::attention_options<double> opt;
    opt.sliding_window = 2;
    opt.q_positions = posenc::position_span(1);
    p.run<TestType>(posenc::none{}, opt);
    for (index_t b = 0; b < 2; ++b)
      for (index_t i = 0; i < 3; ++i)
        check_row(p, b, i, 1, expected_row(p, b, i, 1, sc, [&](index_t j) { return j <= 1 + i && j > 1 + i - 2; }, no_extra), 1e-12);
  }
  SECTION("key lengths: padding keys are ignored; the default offset is key_length - Sq") {
    std::vector<index_t> lens{4, 6};
    posenc::attention_options<double> opt;
    opt.causal = true;
    opt.key_lengths = lens;
    p.run<TestType>(posenc::none{}, opt);
    for (index_t b = 0; b < 2; ++b)
      for (index_t i = 0; i < 3; ++i)
        check_row(p, b, i, 0,
                  expected_row(p, b, i, 0, sc, [&](index_t j) { return j < lens[b] && j <= lens[b] - 3 + i; }, no_extra),
                  1e-12);
  }
  SECTION("explicit key positions (a packed or reordered cache)") {
    std::vector<index_t> kpos{5, 0, 4, 1, 3, 2};
    posenc::attention_options<double> opt;
    opt.causal = true;
    opt.k_positions = posenc::position_span::ids(kpos.data(), 1, 6);
    opt.q_positions = posenc::position_span(1);
    p.run<TestType>(posenc::none{}, opt);
    for (index_t i = 0; i < 3; ++i)
      check_row(p, 1, i, 1, expected_row(p, 1, i, 1, sc, [&](index_t j) { return kpos[j] <= 1 + i; }, no_extra), 1e-12);
  }
}

TEMPLATE_TEST_CASE("attention: masks, softcap and fully masked rows", "[attention]", posenc::path::reference,
                   posenc::path::materialized) {
  problem<float> p(2, 2, 4, 2, 2, 8, 8, 31);
  double const sc = 1 / std::sqrt(8.0);
  float const ninf = -std::numeric_limits<float>::infinity();
  SECTION("additive mask broadcast over batch and heads, short key extent masks the rest") {
    std::vector<float> m{0.5f, ninf, -1.0f,  // row 0, keys 0..2; key 3 beyond the extent
                         0.0f, 0.0f, 2.0f};
    posenc::attention_options<float> opt;
    opt.mask = posenc::make_mask<float>(m.data(), 1, 1, 2, 3);
    p.run<TestType>(posenc::none{}, opt);
    for (index_t b = 0; b < 2; ++b)
      for (index_t h = 0; h < 2; ++h)
        for (index_t i = 0; i < 2; ++i)
          check_row(p, b, i, h,
                    expected_row(p, b, i, h, sc, [&](index_t j) { return j < 3 && m[i * 3 + j] != ninf; },
                                 [&](index_t j) { return static_cast<double>(m[i * 3 + j]); }));
  }
  SECTION("bool mask per head (true = attend); a row with no true gives zeros, never NaN") {
    bool bm[2][1][2][4] = {{{{true, false, true, false}, {false, false, false, false}}},
                           {{{false, true, true, true}, {true, true, true, true}}}};
    std::vector<float> lse(8, 3.0f), probs(2 * 2 * 2 * 4, 9.0f);
    posenc::attention_options<float> opt;
    opt.bool_mask = posenc::make_mask<bool>(&bm[0][0][0][0], 2, 1, 2, 4);
    opt.lse = lse;
    opt.scores = probs;
    p.run<TestType>(posenc::none{}, opt);
    for (index_t b = 0; b < 2; ++b)
      for (index_t h = 0; h < 2; ++h)
        for (index_t i = 0; i < 2; ++i) {
          check_row(p, b, i, h, expected_row(p, b, i, h, sc, [&](index_t j) { return bm[b][0][i][j]; }, no_extra));
          double sum = 0;
          for (index_t j = 0; j < 4; ++j) sum += probs[static_cast<std::size_t>(((b * 2 + h) * 2 + i) * 4 + j)];
          bool const empty = b == 0 && i == 1;
          CHECK(sum == Approx(empty ? 0.0 : 1.0).margin(1e-6));
          CHECK((lse[static_cast<std::size_t>((b * 2 + h) * 2 + i)] == ninf) == empty);
        }
    for (float x : p.out) CHECK(std::isfinite(x));
  }
  SECTION("softcap applies before the mask: -inf stays -inf, masked keys get no weight") {
    std::vector<float> m{0, 0, ninf, ninf, 0, ninf, 0, ninf};
    std::vector<float> capped(2 * 2 * 2 * 4);
    posenc::attention_options<float> opt;
    opt.softcap = 0.5;
    opt.mask = posenc::make_mask<float>(m.data(), 1, 1, 2, 4);
    opt.scores = capped;
    opt.scores_stage = posenc::score_stage::biased;
    p.run<TestType>(posenc::none{}, opt);
    for (index_t b = 0; b < 2; ++b)
      for (index_t h = 0; h < 2; ++h)
        for (index_t i = 0; i < 2; ++i) {
          // expected: softmax over capped scores of the unmasked keys
          std::vector<double> s(4);
          for (index_t j = 0; j < 4; ++j) {
            double d = 0;
            for (index_t t = 0; t < 8; ++t)
              d += at(p.q, 2, 2, 8, b, i, h, t) * at(p.k, 4, 2, 8, b, j, h, t);
            s[j] = 0.5 * std::tanh(sc * d / 0.5);
            double const got = capped[static_cast<std::size_t>(((b * 2 + h) * 2 + i) * 4 + j)];
            if (m[i * 4 + j] == ninf) {
              CHECK(got == ninf);
            } else {
              CHECK(got == Approx(s[j]).margin(1e-6));
            }
          }
          check_row(p, b, i, h,
                    expected_row(p, b, i, h, 0.0, [&](index_t j) { return m[i * 4 + j] != ninf; },
                                 [&](index_t j) { return s[j]; }));
        }
  }
  SECTION("scores of +-1e4 give finite results") {
    for (auto& x : p.q) x *= 300.0f;
    for (auto& x : p.k) x *= 300.0f;
    std::vector<float> lse(8);
    posenc::attention_options<float> opt;
    opt.lse = lse;
    p.run<TestType>(posenc::none{}, opt);
    for (float x : p.out) CHECK(std::isfinite(x));
    for (float x : lse) CHECK(std::isfinite(x));
    for (index_t i = 0; i < 2; ++i)
      check_row(p, 1, i, 1, expected_row(p, 1, i, 1, sc, all_keys, no_extra), 1e-3);
  }
}

TEMPLATE_TEST_CASE("attention: score stages and log-sum-exp", "[attention]", posenc::path::reference,
                   posenc::path::materialized) {
  problem<double> p(1, 2, 3, 1, 1, 2, 2, 41);
  posenc_test::fake_bias enc;
  double const sc = 0.25, cap = 0.3;
  std::vector<double> st[4];
  std::vector<double> lse(2);
  posenc::score_stage stages[4] = {posenc::score_stage::raw, posenc::score_stage::softcapped,
                                   posenc::score_stage::biased, posenc::score_stage::probabilities};
  for (int s = 0; s < 4; ++s) {
    st[s].assign(6, 0.0);
    posenc::attention_options<double> opt;
    opt.scale = sc;
    opt.softcap = cap;
    opt.causal = true;
    opt.scores = st[s];
    opt.scores_stage = stages[s];
    opt.lse = lse;
    p.run<TestType>(enc, opt);
  }
  for (index_t i = 0; i < 2; ++i) {
    double lsum = 0;
    for (index_t j = 0; j < 3; ++j) {
      double d = 0;
      for (index_t t = 0; t < 2; ++t) d += at(p.q, 2, 1, 2, 0, i, 0, t) * at(p.k, 3, 1, 2, 0, j, 0, t);
      double const raw = sc * d, capped = cap * std::tanh(raw / cap);
      double const biased = j <= 1 + i ? capped - 0.5 * std::abs(double(j - (1 + i))) : -INFINITY;
      std::size_t const n = static_cast<std::size_t>(i * 3 + j);
      CHECK(st[0][n] == Approx(raw).margin(1e-12));
      CHECK(st[1][n] == Approx(capped).margin(1e-12));
      if (std::isfinite(biased)) {
        CHECK(st[2][n] == Approx(biased).margin(1e-12));
        lsum += std::exp(biased);
      } else {
        CHECK(st[2][n] == -INFINITY);
      }
    }
    CHECK(lse[static_cast<std::size_t>(i)] == Approx(std::log(lsum)).margin(1e-12));
    for (index_t j = 0; j < 3; ++j) {
      double const b = st[2][static_cast<std::size_t>(i * 3 + j)];
      CHECK(st[3][static_cast<std::size_t>(i * 3 + j)] == Approx(std::isfinite(b) ? std::exp(b) / lsum : 0.0).margin(1e-12));
    }
  }
}

TEMPLATE_TEST_CASE("attention: encoders act where their traits say", "[attention]", posenc::path::reference,
                   posenc::path::materialized) {
  problem<double> p(2, 3, 5, 2, 1, 4, 4, 51);
  double const sc = 0.5;
  SECTION("rotation of q and k at their positions; keys_rotated skips the keys") {
    posenc_test::fake_rotary rot;
    posenc::attention_options<double> opt;
    opt.causal = true;
    p.run<TestType>(rot, opt);
    problem<double> r = p;  // rotate by hand, then plain attention
    std::vector<index_t> qid(6), kid(10);
    for (index_t b = 0; b < 2; ++b) {
      for (index_t i = 0; i < 3; ++i) qid[b * 3 + i] = 2 + i;
      for (index_t j = 0; j < 5; ++j) kid[b * 5 + j] = j;
    }
    rot.rotate(r.qv(), posenc::position_span::ids(qid.data(), 2, 3), 5);
    rot.rotate(r.kv(), posenc::position_span::ids(kid.data(), 2, 5), 5);
    for (index_t b = 0; b < 2; ++b)
      for (index_t h = 0; h < 2; ++h)
        for (index_t i = 0; i < 3; ++i)
          check_row(p, b, i, h, expected_row(r, b, i, h, sc, [&](index_t j) { return j <= 2 + i; }, no_extra), 1e-12);
    problem<double> pre = p;  // already-rotated keys give the same result
    pre.k = r.k;
    opt.keys_rotated = true;
    pre.run<TestType>(rot, opt);
    for (std::size_t n = 0; n < p.out.size(); ++n) CHECK(pre.out[n] == Approx(p.out[n]).margin(1e-12));
  }
  SECTION("bias_row adds the bias at absolute positions") {
    posenc_test::fake_bias bias;
    posenc::attention_options<double> opt;
    opt.q_positions = posenc::position_span(7);
    opt.k_positions = posenc::position_span(6);
    p.run<TestType>(bias, opt);
    for (index_t b = 0; b < 2; ++b)
      for (index_t h = 0; h < 2; ++h)
        for (index_t i = 0; i < 3; ++i)
          check_row(p, b, i, h,
                    expected_row(p, b, i, h, sc, all_keys,
                                 [&](index_t j) {
                                   return -std::pow(2.0, -(static_cast<double>(h) + 1.0)) * std::abs(static_cast<double>((6 + j) - (7 + i)));
                                 }),
                    1e-12);
  }
  SECTION("Shaw: scale * q.aK in the scores, sum p aV in the outputs") {
    posenc_test::fake_shaw<double> shaw(2, 4, true, 77);
    p.run<TestType>(shaw);
    for (index_t b = 0; b < 2; ++b)
      for (index_t h = 0; h < 2; ++h)
        for (index_t i = 0; i < 3; ++i) {
          index_t const pi = 2 + i;
          auto extra = [&](index_t j) {
            double const* a = shaw.ak.data() + shaw.row(pi, j) * 4;
            double d = 0;
            for (index_t t = 0; t < 4; ++t) d += at(p.q, 3, 2, 4, b, i, h, t) * a[t];
            return sc * d;
          };
          auto want = expected_row(p, b, i, h, sc, all_keys, extra);
          // value term, with the same probabilities
          std::vector<double> s(5);
          double m = -INFINITY, sum = 0;
          for (index_t j = 0; j < 5; ++j) {
            double d = 0;
            for (index_t t = 0; t < 4; ++t) d += at(p.q, 3, 2, 4, b, i, h, t) * at(p.k, 5, 1, 4, b, j, 0, t);
            s[j] = sc * d + extra(j);
            m = std::max(m, s[j]);
          }
          for (auto& x : s) sum += (x = std::exp(x - m));
          for (index_t j = 0; j < 5; ++j)
            for (index_t t = 0; t < 4; ++t) want[t] += s[j] / sum * shaw.av[shaw.row(pi, j) * 4 + t];
          check_row(p, b, i, h, want, 1e-12);
        }
  }
}

TEMPLATE_TEST_CASE("attention: layouts, strides, threads and empty inputs", "[attention]", posenc::path::reference,
                   posenc::path::materialized) {
  problem<float> p(2, 5, 7, 4, 2, 8, 6, 61);
  posenc::attention_options<float> opt;
  opt.causal = true;
  opt.threads = 1;
  p.run<TestType>(posenc::none{}, opt);
  SECTION("BHSD buffers and padded rows give the same numbers") {
    std::vector<float> qh(p.q.size()), kh(p.k.size() * 2), vh(p.v.size()), oh(p.out.size() + 40, 5.0f);
    auto q = posenc::make_bhsd(qh.data(), 2, 4, 5, 8);
    posenc::view<float> k{kh.data(), 2, 7, 2, 8, 7 * 2 * 16, 2 * 16, 16, 1};  // rows padded to 16
    auto v = posenc::make_bhsd(vh.data(), 2, 2, 7, 6);
    auto o = posenc::make_bhsd(oh.data() + 40, 2, 4, 5, 6);
    for (index_t b = 0; b < 2; ++b)
      for (index_t s = 0; s < 5; ++s)
        for (index_t h = 0; h < 4; ++h)
          for (index_t t = 0; t < 8; ++t) q(b, s, h, t) = p.q[static_cast<std::size_t>(((b * 5 + s) * 4 + h) * 8 + t)];
    for (index_t b = 0; b < 2; ++b)
      for (index_t s = 0; s < 7; ++s)
        for (index_t h = 0; h < 2; ++h) {
          for (index_t t = 0; t < 8; ++t) k(b, s, h, t) = p.k[static_cast<std::size_t>(((b * 7 + s) * 2 + h) * 8 + t)];
          for (index_t t = 0; t < 6; ++t) v(b, s, h, t) = p.v[static_cast<std::size_t>(((b * 7 + s) * 2 + h) * 6 + t)];
        }
    opt.threads = 2;
    posenc::attention<TestType>(q, k, v, o, posenc::none{}, opt);
    for (index_t n = 0; n < 40; ++n) CHECK(oh[static_cast<std::size_t>(n)] == 5.0f);
    for (index_t b = 0; b < 2; ++b)
      for (index_t s = 0; s < 5; ++s)
        for (index_t h = 0; h < 4; ++h)
          for (index_t t = 0; t < 6; ++t)
            CHECK(o(b, s, h, t) == Approx(p.out[static_cast<std::size_t>(((b * 5 + s) * 4 + h) * 6 + t)]).margin(1e-6));
  }
  SECTION("empty query sequence or batch: no-op; no keys: zeros and lse -inf") {
    std::vector<float> out(4, 1.0f), lse(2, 1.0f);
    float dummy = 0;
    auto q0 = posenc::make_bshd<const float>(nullptr, 1, 0, 2, 2);
    auto k1 = posenc::make_bshd<const float>(&dummy, 1, 0, 1, 2);
    posenc::attention<TestType>(q0, k1, k1, posenc::make_bshd<float>(nullptr, 1, 0, 2, 2), posenc::none{});
    std::vector<float> q(4, 1.0f);
    posenc::attention_options<float> o2;
    o2.lse = lse;
    posenc::attention<TestType>(posenc::make_bshd<const float>(q.data(), 1, 1, 2, 2),
                                posenc::make_bshd<const float>(nullptr, 1, 0, 1, 2),
                                posenc::make_bshd<const float>(nullptr, 1, 0, 1, 2),
                                posenc::make_bshd(out.data(), 1, 1, 2, 2), posenc::none{}, o2);
    for (float x : out) CHECK(x == 0.0f);
    for (float x : lse) CHECK(x == -INFINITY);
  }
}


TEMPLATE_TEST_CASE("attention: a mask over a prefix of longer rows (make_mask with row_stride) equals its packed copy",
                   "[attention]", posenc::path::reference, posenc::path::materialized, posenc::path::fused) {
  index_t const B = 2, H = 2, Sq = 3, Sk = 4, W = 7;  // mask rows of W elements, the first Sk of them used
  float const ninf = -std::numeric_limits<float>::infinity();
  std::vector<float> wide = posenc_test::random_vector<float>(static_cast<std::size_t>(B * H * Sq * W), 41);
  std::vector<bool> wide_allowed(wide.size());
  for (std::size_t e = 0; e < wide.size(); ++e) {
    if (e % 5 == 2) wide[e] = ninf;  // some keys dropped
    wide_allowed[e] = e % 3 != 1;
  }
  std::vector<float> packed(static_cast<std::size_t>(B * H * Sq * Sk));
  std::unique_ptr<bool[]> wide_bool(new bool[wide.size()]), packed_bool(new bool[packed.size()]);
  for (index_t r = 0; r < B * H * Sq; ++r)
    for (index_t j = 0; j < W; ++j) {
      wide_bool[static_cast<std::size_t>(r * W + j)] = wide_allowed[static_cast<std::size_t>(r * W + j)];
      if (j >= Sk) continue;
      packed[static_cast<std::size_t>(r * Sk + j)] = wide[static_cast<std::size_t>(r * W + j)];
      packed_bool[static_cast<std::size_t>(r * Sk + j)] = wide_allowed[static_cast<std::size_t>(r * W + j)];
    }
  problem<float> strided(B, Sq, Sk, H, H, 8, 8, 42), contiguous = strided;
  posenc::attention_options<float> so, co;
  so.mask = posenc::make_mask<float>(wide.data(), B, H, Sq, Sk, W);
  so.bool_mask = posenc::make_mask<bool>(wide_bool.get(), B, H, Sq, Sk, W);
  co.mask = posenc::make_mask<float>(packed.data(), B, H, Sq, Sk);
  co.bool_mask = posenc::make_mask<bool>(packed_bool.get(), B, H, Sq, Sk);
  CHECK(so.mask.q_stride == W);
  CHECK(so.mask.head_stride == Sq * W);
  CHECK(so.mask.batch_stride == H * Sq * W);
  strided.run<TestType>(posenc::none{}, so);
  contiguous.run<TestType>(posenc::none{}, co);
  CHECK(strided.out == contiguous.out);
  // the mask matters: without it the output differs
  problem<float> unmasked = contiguous;
  unmasked.run<TestType>(posenc::none{}, {});
  CHECK(unmasked.out != contiguous.out);
  // row_stride == k is the contiguous mask
  auto const same = posenc::make_mask<float>(packed.data(), B, H, Sq, Sk, Sk);
  CHECK(same.batch_stride == co.mask.batch_stride);
  CHECK(same.head_stride == co.mask.head_stride);
  CHECK(same.q_stride == co.mask.q_stride);
}

TEST_CASE("make_mask: a row stride shorter than the key extent throws", "[attention][errors]") {
  std::vector<float> m(64);
  std::string const e = posenc_test::error_of([&] { (void)posenc::make_mask<float>(m.data(), 1, 2, 2, 4, 3); });
  CHECK(e == "posenc::make_mask: row_stride is 3, expected >= 4 (k)");
  CHECK(posenc_test::error_of([&] { (void)posenc::make_mask<float>(m.data(), 1, 1, 1, 5, -1); }) ==
        "posenc::make_mask: row_stride is -1, expected >= 5 (k)");
  bool b[8] = {};
  CHECK(posenc_test::error_of([&] { (void)posenc::make_mask<bool>(b, 1, 1, 2, 4, 0); }) ==
        "posenc::make_mask: row_stride is 0, expected >= 4 (k)");
}
}  // namespace attention_semantics_tests
