// SPDX-License-Identifier: MIT
// A tiny BERT-like model (embeddings with learned positions, LayerNorm, one self-attention layer) against torch (tests/golden/gen_mha.py).
#include <posenc/attention/multi_head.hpp>
#include <posenc/encoding/learned.hpp>
#include <posenc/encoding/none.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/golden.hpp"
#include "support/tolerance.hpp"

namespace golden_mha_tests {

using posenc::index_t;

namespace {

posenc_test::golden_file const& golden() {
  static posenc_test::golden_file const g = posenc_test::read_golden("mha.txt");
  return g;
}
std::vector<double> const& rec(std::string const& name) { return posenc_test::golden_record(golden(), name); }
std::vector<float> as_float(std::string const& name) {
  auto const& r = rec(name);
  return std::vector<float>(r.begin(), r.end());
}
std::size_t at(index_t i) { return static_cast<std::size_t>(i); }

struct sizes {
  index_t vocab, max_positions, types, model, heads, batch, seq;
};
sizes read_sizes() {
  auto const& c = rec("config");
  REQUIRE(c.size() == 7);
  auto i = [&](int k) { return static_cast<index_t>(c[at(k)]); };
  return {i(0), i(1), i(2), i(3), i(4), i(5), i(6)};
}

/// LayerNorm over the last dim of rows (n, d), in float (the same in both float pipelines).
std::vector<float> layer_norm(std::vector<float> const& x, index_t d, std::vector<float> const& g,
                              std::vector<float> const& b, float eps) {
  std::vector<float> y(x.size());
  for (std::size_t r = 0; r < x.size() / at(d); ++r) {
    float mean = 0, var = 0;
    for (index_t t = 0; t < d; ++t) mean += x[r * at(d) + at(t)];
    mean /= static_cast<float>(d);
    for (index_t t = 0; t < d; ++t) var += (x[r * at(d) + at(t)] - mean) * (x[r * at(d) + at(t)] - mean);
    var /= static_cast<float>(d);
    float const inv = 1.0f / std::sqrt(var + eps);
    for (index_t t = 0; t < d; ++t) y[r * at(d) + at(t)] = (x[r * at(d) + at(t)] - mean) * inv * g[at(t)] + b[at(t)];
  }
  return y;
}

/// y = x W^T + b in float, rows (n, d) and W (d, d).
std::vector<float> linear(std::vector<float> const& x, index_t d, std::vector<float> const& w,
                          std::vector<float> const& b) {
  std::vector<float> y(x.size());
  for (std::size_t r = 0; r < x.size() / at(d); ++r)
    for (index_t o = 0; o < d; ++o) {
      float s = b[at(o)];
      for (index_t i = 0; i < d; ++i) s += x[r * at(d) + at(i)] * w[at(o * d + i)];
      y[r * at(d) + at(o)] = s;
    }
  return y;
}

}  // namespace

TEST_CASE("golden: BERT-like embeddings + self-attention layer match torch", "[golden][module]") {
  sizes const z = read_sizes();
  index_t const M = z.model, H = z.heads, D = M / H, B = z.batch, S = z.seq;
  auto const ids = rec("input_ids"), types = rec("token_type_ids"), lengths_d = rec("lengths");
  auto const word = as_float("word_embeddings"), pos = as_float("position_embeddings"),
             typ = as_float("token_type_embeddings");
  auto const g1 = as_float("embeddings_ln_gamma"), b1 = as_float("embeddings_ln_beta");
  auto const g2 = as_float("output_ln_gamma"), b2 = as_float("output_ln_beta");
  float const eps = static_cast<float>(rec("layer_norm_eps")[0]);
  auto const wq = as_float("wq"), wk = as_float("wk"), wv = as_float("wv"), wo = as_float("wo");
  auto const bq = as_float("bq"), bk = as_float("bk"), bv = as_float("bv"), bo = as_float("bo");
  std::vector<index_t> lengths(lengths_d.begin(), lengths_d.end());
  REQUIRE(ids.size() == at(B * S));
  REQUIRE(pos.size() == at(z.max_positions * M));

  // Word + token type embeddings (a table lookup), then the positions, as BERT adds them: once,
  // to the embeddings, with the learned table's add_to at positions 0..S-1.
  std::vector<float> words(at(B * S * M));
  for (index_t r = 0; r < B * S; ++r)
    for (index_t t = 0; t < M; ++t)
      words[at(r * M + t)] = word[at(static_cast<index_t>(ids[at(r)]) * M + t)] +
                             typ[at(static_cast<index_t>(types[at(r)]) * M + t)];
  std::vector<float> x = words;
  auto const table = posenc::learned<float>::view_of(pos, z.max_positions, M);
  table.add_to(posenc::make_bsd(x.data(), B, S, M), posenc::position_span(0));
  auto const emb = layer_norm(x, M, g1, b1, eps);

  posenc::multi_head_attention<posenc::none, float> layer({M, H}, {});
  layer.load(wq.data(), wk.data(), wv.data(), wo.data(), bq.data(), bk.data(), bv.data(), bo.data());
  posenc::attention_options<float> opt;
  opt.key_lengths = lengths;  // padding keys are masked (BERT's attention_mask)
  std::vector<float> attn(emb.size());
  layer.forward(posenc::make_bsd<const float>(emb.data(), B, S, M), posenc::make_bsd(attn.data(), B, S, M), opt);
  std::vector<float> res(emb.size());
  for (std::size_t i = 0; i < res.size(); ++i) res[i] = attn[i] + emb[i];
  auto const out = layer_norm(res, M, g2, b2, eps);

  // The plain float implementation of the rule: the same model written out with float loops.
  std::vector<float> px = words;
  for (index_t r = 0; r < B * S; ++r)
    for (index_t t = 0; t < M; ++t) px[at(r * M + t)] += pos[at((r % S) * M + t)];
  auto const pemb = layer_norm(px, M, g1, b1, eps);
  auto const pq = linear(pemb, M, wq, bq), pk = linear(pemb, M, wk, bk), pv = linear(pemb, M, wv, bv);
  std::vector<float> ctx(pemb.size(), 0.0f);
  for (index_t b = 0; b < B; ++b)
    for (index_t h = 0; h < H; ++h)
      for (index_t i = 0; i < S; ++i) {
        index_t const L = lengths[at(b)];
        std::vector<float> p(at(L));
        float mx = -INFINITY, sum = 0;
        for (index_t j = 0; j < L; ++j) {
          float s = 0;
          for (index_t t = 0; t < D; ++t) s += pq[at((b * S + i) * M + h * D + t)] * pk[at((b * S + j) * M + h * D + t)];
          p[at(j)] = s / std::sqrt(static_cast<float>(D));
          mx = std::max(mx, p[at(j)]);
        }
        for (index_t j = 0; j < L; ++j) sum += (p[at(j)] = std::exp(p[at(j)] - mx));
        for (index_t j = 0; j < L; ++j)
          for (index_t t = 0; t < D; ++t)
            ctx[at((b * S + i) * M + h * D + t)] += p[at(j)] / sum * pv[at((b * S + j) * M + h * D + t)];
      }
  auto const pattn = linear(ctx, M, wo, bo);
  std::vector<float> pres(pattn.size());
  for (std::size_t i = 0; i < pres.size(); ++i) pres[i] = pattn[i] + pemb[i];
  auto const pout = layer_norm(pres, M, g2, b2, eps);

  struct stage {
    char const* name;
    std::vector<float> const& got;
    std::vector<float> const& plain;
  };
  for (stage const& s : {stage{"embeddings", emb, pemb}, stage{"attention_output", attn, pattn},
                         stage{"layer_output", out, pout}}) {
    auto const& want = rec(s.name);
    REQUIRE(want.size() == s.got.size());
    auto const r = posenc_test::within_tolerance(s.got, want, s.plain);
    INFO(s.name << ": " << r.describe());
    CHECK(r.ok);
  }
}
}  // namespace golden_mha_tests
