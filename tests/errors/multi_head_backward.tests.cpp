// SPDX-License-Identifier: MIT
// multi_head_attention::backward: bad shapes, a missing or foreign saved state, bad gradients; nothing written.
#include <posenc/posenc.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/random.hpp"

namespace errors_multi_head_backward_tests {

using namespace posenc;
using posenc_test::random_vector;

namespace {
template <class M>
std::vector<double> flat(M const& t) {
  return std::vector<double>(t.data(), t.data() + t.size());
}
/// Weights, input and output gradient of a (6, 4 query heads, 2 kv heads, D 3, Dv 2) layer, batch 2, seq 3.
struct module_problem {
  mha_config cfg{6, 4, 2, 3, 2};
  index_t B = 2, S = 3;
  std::vector<double> w[4], x, r;
  module_problem() {
    index_t const sizes[4] = {12 * 6, 6 * 6, 4 * 6, 6 * 8};
    for (int i = 0; i < 4; ++i) w[i] = random_vector<double>(static_cast<std::size_t>(sizes[i]), 180u + static_cast<unsigned>(i));
    x = random_vector<double>(static_cast<std::size_t>(B * S * 6), 185);
    r = random_vector<double>(x.size(), 186);
  }
  template <class L>
  void load(L& layer) const {
    layer.load(w[0].data(), w[1].data(), w[2].data(), w[3].data());
  }
};
}  // namespace

TEST_CASE("multi_head_attention::backward rejects bad input before writing anything", "[module][backward][errors]") {
  module_problem p;
  t5_bias<double> t5(t5_bias_params{4, true, 8, 12}, 181u, 0.3);
  using layer_t = multi_head_attention<t5_bias<double>, double>;
  layer_t layer(p.cfg, t5);
  p.load(layer);
  auto tv = [&](std::vector<double>& v, index_t seq) { return make_bsd(v.data(), p.B, seq, p.cfg.model_dim); };
  std::vector<double> y(p.x.size()), dx(p.x.size(), 7.0), x2(p.x.size() * 2, 0.5);
  layer_t::saved s, empty;
  layer.forward(tv(p.x, p.S), tv(y, p.S), attention_options<double>{}, s);
  auto g = layer.make_gradients();
  auto const g0 = g;
  auto untouched = [&] {
    CHECK(std::all_of(dx.begin(), dx.end(), [](double v) { return v == 7.0; }));
    CHECK(flat(g.w_q) == flat(g0.w_q));
    CHECK(flat(g.w_o) == flat(g0.w_o));
    CHECK(flat(g.encoder.table) == flat(g0.encoder.table));
  };
  char const* w = "posenc::multi_head_attention::backward: ";
  REQUIRE_THROWS_WITH(layer.backward(tv(p.x, p.S), tv(p.r, p.S), tv(dx, p.S), empty, g),
                      std::string(w) + "saved is empty, expected the state filled by forward(x, y, opt, saved)");
  untouched();
  REQUIRE_THROWS_WITH(layer.backward(tv(x2, 2 * p.S), tv(x2, 2 * p.S), tv(x2, 2 * p.S), s, g),
                      std::string(w) + "saved holds (batch 2, seq 3), expected (batch 2, seq 6) of x");
  untouched();
  REQUIRE_THROWS_WITH(layer.backward(tv(p.x, p.S), make_bsd(p.r.data(), p.B, p.S, 5), tv(dx, p.S), s, g),
                      std::string(w) + "dy.dim is 5, expected 6 (model_dim)");
  untouched();
  REQUIRE_THROWS_WITH(layer.backward(tv(p.x, p.S), tv(p.r, p.S), make_bsd(dx.data(), p.B, p.S - 1, 6), s, g),
                      std::string(w) + "dx.seq is 2, expected 3 (x.seq)");
  untouched();
  {
    layer_t::saved other = s;
    other.k.resize(other.k.rows(), other.k.cols() + 1);
    REQUIRE_THROWS_WITH(layer.backward(tv(p.x, p.S), tv(p.r, p.S), tv(dx, p.S), other, g),
                        std::string(w) + "saved.k shape is (6, 7), expected (6, 6) (a forward pass of this layer)");
    untouched();
    other = s;
    other.lse.pop_back();
    REQUIRE_THROWS_WITH(layer.backward(tv(p.x, p.S), tv(p.r, p.S), tv(dx, p.S), other, g),
                        std::string(w) + "saved.lse has 23 values, expected 24 (batch x q_heads x seq)");
    untouched();
  }
  {
    auto bad = layer.make_gradients();
    bad.w_v.resize(4, 5);
    REQUIRE_THROWS_WITH(layer.backward(tv(p.x, p.S), tv(p.r, p.S), tv(dx, p.S), s, bad),
                        std::string(w) + "grads.w_v shape is (4, 5), expected (4, 6) (the weight's)");
  }
  {
    auto bad = layer.make_gradients();
    bad.b_o.resize(5);
    REQUIRE_THROWS_WITH(layer.backward(tv(p.x, p.S), tv(p.r, p.S), tv(dx, p.S), s, bad),
                        std::string(w) + "grads.b_o has 5 values, expected 6");
    bad = layer.make_gradients();
    bad.encoder.table.resize(7, 4);
    REQUIRE_THROWS_WITH(layer.backward(tv(p.x, p.S), tv(p.r, p.S), tv(dx, p.S), s, bad),
                        posenc_test::contains("grads.table shape is (7, 4)"));
  }
  // Options attention_backward rejects (a scores output) throw before dx or g is touched.
  attention_options<double> opt;
  std::vector<double> scores(static_cast<std::size_t>(p.B * 4 * p.S * p.S));
  opt.scores = scores;
  REQUIRE_THROWS_WITH(layer.backward(tv(p.x, p.S), tv(p.r, p.S), tv(dx, p.S), s, g, opt),
                      posenc_test::contains("scores is set, expected null"));
  untouched();
}


TEST_CASE("multi_head_attention::gradients::operator+= rejects another layer's shapes before adding anything",
          "[module][backward][errors]") {
  module_problem p;
  using layer_t = multi_head_attention<t5_bias<double>, double>;
  layer_t layer(p.cfg, t5_bias<double>(t5_bias_params{4, true, 8, 12}, 181u, 0.3));
  auto g = layer.make_gradients();
  g.w_q.setConstant(1.0);
  g.b_k.setConstant(2.0);
  g.encoder.table.setConstant(3.0);
  auto const g0 = g;
  auto untouched = [&] {
    CHECK(flat(g.w_q) == flat(g0.w_q));
    CHECK(flat(g.b_k) == flat(g0.b_k));
    CHECK(flat(g.encoder.table) == flat(g0.encoder.table));
  };
  char const* w = "posenc::multi_head_attention::gradients::operator+=: ";
  SECTION("a layer without grouped-query heads: w_k differs") {
    layer_t mha(mha_config{6, 4, 4, 3, 2}, t5_bias<double>(t5_bias_params{4, true, 8, 12}, 181u, 0.3));
    REQUIRE_THROWS_WITH(g += mha.make_gradients(),
                        std::string(w) + "other.w_k shape is (12, 6), expected (6, 6) (this one's)");
    untouched();
  }
  SECTION("a bias of another size") {
    auto other = layer.make_gradients();
    other.b_o.resize(5);
    REQUIRE_THROWS_WITH(g += other, std::string(w) + "other.b_o has 5 values, expected 6 (this one's)");
    untouched();
  }
  SECTION("the encoder's: a T5 table of other buckets, after every weight matched") {
    layer_t other_layer(p.cfg, t5_bias<double>(t5_bias_params{4, true, 16, 12}, 181u, 0.3));
    REQUIRE_THROWS_WITH(g += other_layer.make_gradients(),
                        std::string(w) + "other.table shape is (16, 4), expected (8, 4) (this one's)");
    untouched();
  }
}
}  // namespace errors_multi_head_backward_tests
