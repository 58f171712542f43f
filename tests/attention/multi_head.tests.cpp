// SPDX-License-Identifier: MIT
// multi_head_attention<Encoder, T>: projections, encoders, batching, against plain loops.
#include <posenc/attention/multi_head.hpp>
#include <posenc/encoding/rope.hpp>
#include <posenc/encoding/none.hpp>
#include <posenc/encoding/sinusoidal.hpp>

#include <cmath>
#include <vector>

#include "support/catch.hpp"
#include "support/random.hpp"

namespace attention_multi_head_tests {

using posenc::index_t;
using posenc_test::random_vector;

namespace {

/// y = x W^T + b for row-major x (n, in), W (out, in).
std::vector<double> linear(std::vector<double> const& x, index_t n, index_t in, std::vector<double> const& w,
                           index_t out, std::vector<double> const* b) {
  std::vector<double> y(static_cast<std::size_t>(n * out));
  for (index_t r = 0; r < n; ++r)
    for (index_t o = 0; o < out; ++o) {
      double s = b ? (*b)[static_cast<std::size_t>(o)] : 0.0;
      for (index_t i = 0; i < in; ++i) s += x[static_cast<std::size_t>(r * in + i)] * w[static_cast<std::size_t>(o * in + i)];
      y[static_cast<std::size_t>(r * out + o)] = s;
    }
  return y;
}

}  // namespace

TEST_CASE("multi_head_attention: prefill equals projections + softmax attention written out", "[module]") {
  index_t const B = 2, S = 5, M = 12, Hq = 4, Hkv = 2, D = 3, Dv = 2;
  auto wq = random_vector<double>(static_cast<std::size_t>(Hq * D * M), 1);
  auto wk = random_vector<double>(static_cast<std::size_t>(Hkv * D * M), 2);
  auto wv = random_vector<double>(static_cast<std::size_t>(Hkv * Dv * M), 3);
  auto wo = random_vector<double>(static_cast<std::size_t>(M * Hq * Dv), 4);
  auto bq = random_vector<double>(static_cast<std::size_t>(Hq * D), 5);
  auto bk = random_vector<double>(static_cast<std::size_t>(Hkv * D), 6);
  auto bv = random_vector<double>(static_cast<std::size_t>(Hkv * Dv), 7);
  auto bo = random_vector<double>(static_cast<std::size_t>(M), 8);
  auto x = random_vector<double>(static_cast<std::size_t>(B * S * M), 9);
  bool const causal = GENERATE(false, true);
  bool const absolute = GENERATE(false, true);
  posenc::sinusoidal<double> pe(M);

  std::vector<double> y(x.size(), 0.0);
  posenc::attention_options<double> opt;
  opt.causal = causal;
  // Absolute positions are added to the embeddings by the model, once, before the layer.
  auto xe = x;
  if (absolute) pe.add_to(posenc::make_bsd(xe.data(), B, S, M), posenc::position_span(0));
  posenc::multi_head_attention<posenc::none, double> m({M, Hq, Hkv, D, Dv}, {});
  m.load(wq.data(), wk.data(), wv.data(), wo.data(), bq.data(), bk.data(), bv.data(), bo.data());
  m.forward(posenc::make_bsd<const double>(xe.data(), B, S, M), posenc::make_bsd(y.data(), B, S, M), opt);

  auto Q = linear(xe, B * S, M, wq, Hq * D, &bq), K = linear(xe, B * S, M, wk, Hkv * D, &bk);
  auto V = linear(xe, B * S, M, wv, Hkv * Dv, &bv);
  std::vector<double> O(static_cast<std::size_t>(B * S * Hq * Dv), 0.0);
  for (index_t b = 0; b < B; ++b)
    for (index_t h = 0; h < Hq; ++h)
      for (index_t i = 0; i < S; ++i) {
        index_t const g = h / (Hq / Hkv);
        std::vector<double> s(static_cast<std::size_t>(S));
        double mx = -INFINITY, sum = 0;
        index_t const last = causal ? i : S - 1;
        for (index_t j = 0; j <= last; ++j) {
          double d = 0;
          for (index_t t = 0; t < D; ++t) d += Q[static_cast<std::size_t>((b * S + i) * Hq * D + h * D + t)] * K[static_cast<std::size_t>((b * S + j) * Hkv * D + g * D + t)];
          s[j] = d / std::sqrt(double(D));
          mx = std::max(mx, s[j]);
        }
        for (index_t j = 0; j <= last; ++j) sum += (s[j] = std::exp(s[j] - mx));
        for (index_t j = 0; j <= last; ++j)
          for (index_t t = 0; t < Dv; ++t)
            O[static_cast<std::size_t>((b * S + i) * Hq * Dv + h * Dv + t)] += s[j] / sum * V[static_cast<std::size_t>((b * S + j) * Hkv * Dv + g * Dv + t)];
      }
  auto Y = linear(O, B * S, Hq * Dv, wo, M, &bo);
  CHECK(posenc_test::max_abs_diff(y, Y) < 1e-12);
}

TEST_CASE("multi_head_attention: a batch equals its entries run alone; float matches double", "[module]") {
  index_t const B = 3, S = 6, M = 16;
  auto w = random_vector<float>(static_cast<std::size_t>(4 * M * M), 11, -0.3, 0.3);
  auto x = random_vector<float>(static_cast<std::size_t>(B * S * M), 12);
  posenc::multi_head_attention<posenc::none, float> m({M, 4, 1, 0, 0}, {});
  m.load(w.data(), w.data() + M * M, w.data() + M * M + 4 * M, w.data() + 2 * M * M);
  CHECK(m.config().head_dim == 4);
  std::vector<float> y(x.size()), y1(static_cast<std::size_t>(S * M));
  m.forward(posenc::make_bsd<const float>(x.data(), B, S, M), posenc::make_bsd(y.data(), B, S, M));
  for (index_t b = 0; b < B; ++b) {
    m.forward(posenc::make_bsd<const float>(x.data() + b * S * M, 1, S, M), posenc::make_bsd(y1.data(), 1, S, M));
    for (index_t n = 0; n < S * M; ++n)
      CHECK(y1[static_cast<std::size_t>(n)] == posenc_test::Approx(y[static_cast<std::size_t>(b * S * M + n)]).margin(1e-6));
  }
}

TEST_CASE("multi_head_attention: borrowed weights give the owned results and are read in place", "[module]") {
  index_t const B = 2, S = 5, M = 16, Hq = 4, Hkv = 2, D = 4;
  auto wq = random_vector<float>(static_cast<std::size_t>(Hq * D * M), 31, -0.3, 0.3);
  auto wk = random_vector<float>(static_cast<std::size_t>(Hkv * D * M), 32, -0.3, 0.3);
  auto wv = random_vector<float>(static_cast<std::size_t>(Hkv * D * M), 33, -0.3, 0.3);
  auto wo = random_vector<float>(static_cast<std::size_t>(M * Hq * D), 34, -0.3, 0.3);
  auto bq = random_vector<float>(static_cast<std::size_t>(Hq * D), 35);
  auto bo = random_vector<float>(static_cast<std::size_t>(M), 36);
  auto x = random_vector<float>(static_cast<std::size_t>(B * S * M), 37);
  using layer = posenc::multi_head_attention<posenc::rope<float>, float>;
  posenc::rope<float> rope(posenc::rope_layout::half_split, D);
  layer owned({M, Hq, Hkv, D, D}, rope), borrowed({M, Hq, Hkv, D, D}, rope);
  owned.load(wq.data(), wk.data(), wv.data(), wo.data(), bq.data(), nullptr, nullptr, bo.data());
  borrowed.load_borrowed(wq.data(), wk.data(), wv.data(), wo.data(), bq.data(), nullptr, nullptr, bo.data());
  CHECK(!owned.borrows_weights());
  CHECK(borrowed.borrows_weights());
  CHECK(borrowed.w_k().data() == wk.data());
  posenc::attention_options<float> opt;
  opt.causal = true;
  auto run = [&](layer const& m) {
    std::vector<float> y(x.size());
    m.forward(posenc::make_bsd<const float>(x.data(), B, S, M), posenc::make_bsd(y.data(), B, S, M), opt);
    return y;
  };
  auto const y_owned = run(owned), y_borrowed = run(borrowed);
  CHECK(posenc_test::max_abs_diff(y_owned, y_borrowed) == 0);

  SECTION("a weight changed in the caller's buffer after load_borrowed is seen; the owned copy is not") {
    wv[3] += 1.0f;
    bo[2] += 1.0f;
    auto const b2 = run(borrowed), o2 = run(owned);
    CHECK(posenc_test::max_abs_diff(o2, y_owned) == 0);
    CHECK(posenc_test::max_abs_diff(b2, y_borrowed) > 1e-3);
    layer fresh({M, Hq, Hkv, D, D}, rope);
    fresh.load(wq.data(), wk.data(), wv.data(), wo.data(), bq.data(), nullptr, nullptr, bo.data());
    CHECK(posenc_test::max_abs_diff(b2, run(fresh)) == 0);
  }
  SECTION("a copy of a borrowing layer borrows the same buffers; load() makes it own again") {
    layer copy = borrowed;
    CHECK(copy.w_q().data() == wq.data());
    copy.load(wq.data(), wk.data(), wv.data(), wo.data(), bq.data(), nullptr, nullptr, bo.data());
    CHECK(!copy.borrows_weights());
    CHECK(copy.w_q().data() != wq.data());
    CHECK(posenc_test::max_abs_diff(run(copy), y_owned) == 0);
  }
  SECTION("decode with borrowed weights equals prefill") {
    auto cache = borrowed.make_cache(B);
    std::vector<float> steps(x.size());
    for (index_t s = 0; s < S; ++s) {
      posenc::token_view<const float> xs{x.data() + s * M, B, 1, M, S * M, M, 1};
      posenc::token_view<float> ys{steps.data() + s * M, B, 1, M, S * M, M, 1};
      borrowed.forward(xs, ys, cache, opt);
    }
    CHECK(posenc_test::max_abs_diff(steps, y_borrowed) < 1e-5);
  }
}

TEST_CASE("multi_head_attention: null weight pointers are rejected by load and load_borrowed", "[module][errors]") {
  index_t const M = 8;
  std::vector<float> w(static_cast<std::size_t>(M * M), 0.5f);
  posenc::multi_head_attention<posenc::none, float> m({M, 2, 1, 4, 4}, {});
  float const* p = w.data();
  REQUIRE_THROWS_WITH(m.load_borrowed(p, nullptr, p, p),
                      posenc_test::contains("posenc::multi_head_attention::load_borrowed: wk is null, expected a "
                                            "row-major (4 x 8) weight buffer"));
  REQUIRE_THROWS_WITH(m.load(nullptr, p, p, p),
                      posenc_test::contains("posenc::multi_head_attention::load: wq is null, expected a row-major "
                                            "(8 x 8) weight buffer"));
  REQUIRE_THROWS_WITH(m.load_borrowed(p, p, p, nullptr), posenc_test::contains("wo is null"));
  REQUIRE_THROWS_WITH(m.load_borrowed(p, p, nullptr, p), posenc_test::contains("wv is null"));
  CHECK(!m.borrows_weights());
  CHECK(m.w_q().isZero());  // a rejected load leaves the weights as they were
}

TEST_CASE("multi_head_attention: decode over a cache that starts at a later position equals prefill there",
          "[module][kv_cache]") {
  index_t const B = 1, S = 6, M = 16, P = 300;
  auto w = random_vector<double>(static_cast<std::size_t>(4 * M * M), 41, -0.3, 0.3);
  auto x = random_vector<double>(static_cast<std::size_t>(B * S * M), 42);
  posenc::multi_head_attention<posenc::rope<double>, double> m({M, 4, 2, 4, 4},
                                                               posenc::rope<double>(posenc::rope_layout::half_split, 4));
  m.load(w.data(), w.data() + M * M, w.data() + M * M + 8 * M, w.data() + 2 * M * M);
  posenc::attention_options<double> opt;
  opt.causal = true;
  std::vector<double> full(x.size()), steps(x.size());
  opt.q_positions = posenc::position_span(P);
  m.forward(posenc::make_bsd<const double>(x.data(), B, S, M), posenc::make_bsd(full.data(), B, S, M), opt);
  opt.q_positions.reset();
  auto cache = m.make_cache(B, P);
  for (index_t s = 0; s < S; ++s)
    m.forward(posenc::make_bsd<const double>(x.data() + s * M, B, 1, M), posenc::make_bsd(steps.data() + s * M, B, 1, M),
              cache, opt);
  CHECK(cache.keys_rotated());
  CHECK(cache.next_position() == P + S);
  CHECK(posenc_test::max_abs_diff(full, steps) < 1e-12);
}

TEST_CASE("multi_head_attention: decode whose attention throws leaves the cache as it was", "[module][kv_cache]") {
  index_t const B = 2, M = 16;
  auto w = random_vector<double>(static_cast<std::size_t>(4 * M * M), 43, -0.3, 0.3);
  auto x = random_vector<double>(static_cast<std::size_t>(B * 3 * M), 44);
  posenc::multi_head_attention<posenc::rope<double>, double> m({M, 4, 2, 4, 4},
                                                               posenc::rope<double>(posenc::rope_layout::half_split, 4));
  m.load(w.data(), w.data() + M * M, w.data() + M * M + 8 * M, w.data() + 2 * M * M);
  auto cache = m.make_cache(B, 5);
  std::vector<double> y(x.size(), -7.0);
  m.forward(posenc::make_bsd<const double>(x.data(), B, 2, M), posenc::make_bsd(y.data(), B, 2, M), cache);
  REQUIRE(cache.length() == 2);
  std::vector<double> keys, values;
  for (index_t b = 0; b < B; ++b)
    for (index_t s = 0; s < 2; ++s)
      for (index_t h = 0; h < 2; ++h)
        for (index_t d = 0; d < 4; ++d) {
          keys.push_back(cache.keys()(b, s, h, d));
          values.push_back(cache.values()(b, s, h, d));
        }
  posenc::attention_options<double> bad;
  bad.softcap = -1;  // rejected by attention, after the new keys were appended
  std::vector<double> y1(static_cast<std::size_t>(B * M), -7.0);
  REQUIRE_THROWS_WITH(m.forward(posenc::make_bsd<const double>(x.data(), B, 1, M), posenc::make_bsd(y1.data(), B, 1, M),
                                cache, bad),
                      posenc_test::contains("softcap is -1"));
  CHECK(cache.length() == 2);
  CHECK(cache.next_position() == 7);
  std::size_t n = 0;
  for (index_t b = 0; b < B; ++b)
    for (index_t s = 0; s < 2; ++s)
      for (index_t h = 0; h < 2; ++h)
        for (index_t d = 0; d < 4; ++d, ++n) {
          CHECK(cache.keys()(b, s, h, d) == keys[n]);
          CHECK(cache.values()(b, s, h, d) == values[n]);
        }
  for (double v : y1) CHECK(v == -7.0);
  // The next good step continues from there.
  m.forward(posenc::make_bsd<const double>(x.data(), B, 1, M), posenc::make_bsd(y1.data(), B, 1, M), cache);
  CHECK(cache.length() == 3);
}

TEST_CASE("kv_cache::truncate keeps the first tokens and checks its argument", "[kv_cache]") {
  posenc::kv_cache<float> cache(1, 1, 2, 2, 10);
  std::vector<float> k{1, 2, 3, 4, 5, 6}, v{-1, -2, -3, -4, -5, -6};
  cache.append(posenc::make_bshd<const float>(k.data(), 1, 3, 1, 2), posenc::make_bshd<const float>(v.data(), 1, 3, 1, 2),
               posenc::none{});
  REQUIRE_THROWS_WITH(cache.truncate(4), posenc_test::contains(
                                             "posenc::kv_cache::truncate: tokens is 4, expected 0 <= tokens <= length() (3)"));
  REQUIRE_THROWS_WITH(cache.truncate(-1), posenc_test::contains("tokens is -1"));
  CHECK(cache.length() == 3);
  cache.truncate(1);
  CHECK(cache.length() == 1);
  CHECK(cache.next_position() == 11);
  CHECK(cache.keys()(0, 0, 0, 1) == 2);
  cache.append(posenc::make_bshd<const float>(k.data() + 4, 1, 1, 1, 2),
               posenc::make_bshd<const float>(v.data() + 4, 1, 1, 1, 2), posenc::none{});
  CHECK(cache.length() == 2);
  CHECK(cache.keys()(0, 1, 0, 0) == 5);
  CHECK(cache.values()(0, 1, 0, 1) == -6);
}
}  // namespace attention_multi_head_tests
