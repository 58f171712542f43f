// SPDX-License-Identifier: MIT
// transformer_xl: its tables against the formulas in double, the hooks against the checked forms, the docs' usage code.
#include <posenc/attention/attention.hpp>
#include <posenc/encoding/transformer_xl.hpp>

#include <cmath>
#include <vector>

#include "support/catch.hpp"
#include "support/transformer_xl.hpp"

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
