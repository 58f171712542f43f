// SPDX-License-Identifier: MIT
// multi_head_attention::backward: every weight, bias, input and encoder parameter against central differences.
#include <posenc/posenc.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "support/backward_check.hpp"
#include "support/catch.hpp"
#include "support/random.hpp"

namespace attention_multi_head_backward_tests {

using namespace posenc;
using posenc_test::central_differences;
using posenc_test::fd_report;
using posenc_test::random_vector;

namespace {

using table = relative_table<double>;
Eigen::Map<const table> as_table(std::vector<double> const& v, index_t rows, index_t cols) {
  return Eigen::Map<const table>(v.data(), rows, cols);
}
template <class M>
std::vector<double> flat(M const& t) {
  return std::vector<double>(t.data(), t.data() + t.size());
}

/// A layer's parameters and data as flat vectors, the loss L = sum(r * y) of
/// its forward pass, and the analytic gradients of that loss.
struct module_problem {
  mha_config cfg;
  index_t B, S;
  std::vector<double> w[4], b[4], x, r;
  bool borrowed;

  module_problem(mha_config c, index_t batch, index_t seq, bool borrow, std::uint64_t seed)
      : cfg(c), B(batch), S(seq), borrowed(borrow) {
    index_t const Dv = cfg.value_dim ? cfg.value_dim : cfg.head_dim;
    index_t const rows[4] = {cfg.q_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim, cfg.kv_heads * Dv,
                             cfg.model_dim};
    index_t const cols[4] = {cfg.model_dim, cfg.model_dim, cfg.model_dim, cfg.q_heads * Dv};
    for (int i = 0; i < 4; ++i) {
      w[i] = random_vector<double>(static_cast<std::size_t>(rows[i] * cols[i]), seed + 2 * i, -0.6, 0.6);
      b[i] = random_vector<double>(static_cast<std::size_t>(rows[i]), seed + 2 * i + 1, -0.3, 0.3);
    }
    x = random_vector<double>(static_cast<std::size_t>(B * S * cfg.model_dim), seed + 9);
    r = random_vector<double>(x.size(), seed + 10);
  }
  template <class E>
  void load(multi_head_attention<E, double>& layer) const {
    if (borrowed)
      layer.load_borrowed(w[0].data(), w[1].data(), w[2].data(), w[3].data(), b[0].data(), b[1].data(), b[2].data(),
                          b[3].data());
    else
      layer.load(w[0].data(), w[1].data(), w[2].data(), w[3].data(), b[0].data(), b[1].data(), b[2].data(),
                 b[3].data());
  }
  template <class E>
  double loss(E const& enc, attention_options<double> const& opt) const {
    multi_head_attention<E, double> layer(cfg, enc);
    load(layer);
    std::vector<double> y(x.size());
    layer.forward(make_bsd(x.data(), B, S, cfg.model_dim), make_bsd(y.data(), B, S, cfg.model_dim), opt);
    double l = 0;
    for (std::size_t i = 0; i < y.size(); ++i) l += r[i] * y[i];
    return l;
  }
  /// Checks every weight, bias and x, and the encoder parameters `theta`
  /// (rebuilt by make) against `encoder_grad` of the analytic gradients.
  template <class Make, class Grads, class EncGrad>
  fd_report check(Make make, attention_options<double> const& opt, std::vector<double>* theta, Grads init,
                  EncGrad encoder_grad) {
    auto enc = make();
    multi_head_attention<decltype(enc), double> layer(cfg, enc);
    load(layer);
    typename multi_head_attention<decltype(enc), double>::saved s;
    std::vector<double> y(x.size()), dx(x.size(), 7.0);
    layer.forward(make_bsd(x.data(), B, S, cfg.model_dim), make_bsd(y.data(), B, S, cfg.model_dim), opt, s);
    auto g = layer.make_gradients();
    init(enc, g.encoder);
    layer.backward(make_bsd(x.data(), B, S, cfg.model_dim), make_bsd(r.data(), B, S, cfg.model_dim),
                   make_bsd(dx.data(), B, S, cfg.model_dim), s, g, opt);
    fd_report rep;
    std::function<double()> const l = [&] { return loss(make(), opt); };
    char const* const names[4] = {"dWq", "dWk", "dWv", "dWo"};
    char const* const bnames[4] = {"dbq", "dbk", "dbv", "dbo"};
    std::vector<std::vector<double>> aw = {flat(g.w_q), flat(g.w_k), flat(g.w_v), flat(g.w_o)};
    std::vector<std::vector<double>> ab = {flat(g.b_q), flat(g.b_k), flat(g.b_v), flat(g.b_o)};
    for (int i = 0; i < 4; ++i) {
      central_differences(rep, names[i], w[i], aw[static_cast<std::size_t>(i)], l);
      central_differences(rep, bnames[i], b[i], ab[static_cast<std::size_t>(i)], l);
    }
    central_differences(rep, "dx", x, dx, l);
    if (theta) central_differences(rep, "d(encoder)", *theta, encoder_grad(enc, g.encoder), l);
    return rep;
  }
};

auto no_init = [](auto const&, auto&) {};
auto no_grad = [](auto const&, auto const&) { return std::vector<double>(); };

}  // namespace

TEST_CASE("multi_head_attention::backward: central differences of every parameter and the input",
          "[module][backward]") {
  // GQA (4 query heads over 2 kv heads) and Dv != D throughout; step and
  // tolerance as in support/backward_check.hpp.
  mha_config const gqa{6, 4, 2, 3, 2};
  SECTION("T5 buckets, causal, borrowed weights") {
    module_problem p(gqa, 2, 5, true, 100);
    attention_options<double> opt;
    opt.causal = true;
    std::vector<double> theta = random_vector<double>(8 * 4, 101, -0.5, 0.5);
    auto make = [&] { return t5_bias<double>(t5_bias_params{4, false, 8, 12}, as_table(theta, 8, 4)); };
    fd_report r = p.check(make, opt, &theta, no_init, [](auto const&, auto const& g) { return flat(g.table); });
    INFO(r.describe());
    CHECK(r.ok());
  }
  SECTION("clipped bias, bidirectional, softcap, owned weights, 2 threads") {
    module_problem p(gqa, 2, 4, false, 110);
    attention_options<double> opt;
    opt.softcap = 1.5;
    opt.threads = 2;
    std::vector<double> theta = random_vector<double>(5 * 4, 111, -0.5, 0.5);
    auto make = [&] { return clipped_bias<double>(2, 4, as_table(theta, 5, 4)); };
    fd_report r = p.check(make, opt, &theta, no_init, [](auto const&, auto const& g) { return flat(g.table); });
    INFO(r.describe());
    CHECK(r.ok());
  }
  SECTION("ALiBi with learnable slopes, causal") {
    module_problem p(gqa, 1, 5, false, 120);
    attention_options<double> opt;
    opt.causal = true;
    std::vector<double> slopes = {0.4, 0.2, 0.1, 0.05};
    auto make = [&] { return alibi<double>(alibi_form::paper, 4, span<const double>(slopes.data(), 4)); };
    fd_report r = p.check(
        make, opt, &slopes, [](auto const& enc, auto& g) { g = enc.make_gradients(true); },
        [](auto const&, auto const& g) { return flat(g.slopes); });
    INFO(r.describe());
    CHECK(r.ok());
  }
  SECTION("RoPE, causal, positions from an offset") {
    module_problem p(mha_config{6, 4, 2, 4, 2}, 2, 4, true, 130);
    attention_options<double> opt;
    opt.causal = true;
    position_span const pos(3);
    opt.q_positions = pos;
    auto make = [] { return rope<double>(rope_layout::half_split, 4); };
    fd_report r = p.check(make, opt, nullptr, no_init, no_grad);
    INFO(r.describe());
    CHECK(r.ok());
  }
  SECTION("Shaw's key and value embeddings (Dv = D)") {
    module_problem p(mha_config{6, 2, 2, 3, 0}, 2, 4, false, 140);
    attention_options<double> opt;
    std::vector<double> ak = random_vector<double>(5 * 3, 141, -0.5, 0.5), av = random_vector<double>(5 * 3, 142);
    std::vector<double> both(ak);
    both.insert(both.end(), av.begin(), av.end());
    auto make = [&] {
      std::vector<double> k(both.begin(), both.begin() + 15), v(both.begin() + 15, both.end());
      return shaw<double>(2, as_table(k, 5, 3), as_table(v, 5, 3));
    };
    fd_report r = p.check(make, opt, &both, no_init, [](auto const&, auto const& g) {
      std::vector<double> out = flat(g.key), vv = flat(g.value);
      out.insert(out.end(), vv.begin(), vv.end());
      return out;
    });
    INFO(r.describe());
    CHECK(r.ok());
  }
  SECTION("Transformer-XL: u, v and W_R") {
    module_problem p(mha_config{6, 2, 2, 3, 2}, 2, 4, false, 150);
    attention_options<double> opt;
    opt.causal = true;
    std::vector<double> theta = random_vector<double>(2 * 3 + 2 * 3 + 6 * 4, 151, -0.5, 0.5);
    auto make = [&] {
      std::vector<double> u(theta.begin(), theta.begin() + 6), v(theta.begin() + 6, theta.begin() + 12),
          wr(theta.begin() + 12, theta.end());
      return transformer_xl<double>(6, as_table(u, 2, 3), as_table(v, 2, 3), as_table(wr, 6, 4));
    };
    fd_report r = p.check(make, opt, &theta, no_init, [](auto const& enc, auto const& g) {
      std::vector<double> out = flat(g.u), v = flat(g.v), w = flat(enc.w_r_gradient(g));
      out.insert(out.end(), v.begin(), v.end());
      out.insert(out.end(), w.begin(), w.end());
      return out;
    });
    INFO(r.describe());
    CHECK(r.ok());
  }
  SECTION("RoPE and T5 composed, no encoder parameters beyond T5's") {
    module_problem p(mha_config{8, 2, 1, 4, 3}, 1, 5, false, 160);
    attention_options<double> opt;
    opt.causal = true;
    std::vector<double> theta = random_vector<double>(8 * 2, 161, -0.5, 0.5);
    auto make = [&] {
      return compose<rope<double>, t5_bias<double>>(rope<double>(rope_layout::interleaved, 4),
                                                    t5_bias<double>(t5_bias_params{2, false, 8, 12}, as_table(theta, 8, 2)));
    };
    fd_report r = p.check(make, opt, &theta, no_init, [](auto const&, auto const& g) { return flat(g.template get<1>().table); });
    INFO(r.describe());
    CHECK(r.ok());
  }
}

TEST_CASE("multi_head_attention::backward adds into the gradients and gives the same bits for 1 and 2 threads",
          "[module][backward]") {
  module_problem p(mha_config{6, 4, 2, 3, 2}, 2, 5, false, 170);
  t5_bias<double> t5(t5_bias_params{4, true, 8, 12}, 171u, 0.3);
  multi_head_attention<t5_bias<double>, double> layer(p.cfg, t5);
  p.load(layer);
  multi_head_attention<t5_bias<double>, double>::saved s;
  std::vector<double> y(p.x.size()), dx1(p.x.size()), dx2(p.x.size());
  auto tv = [&](std::vector<double>& v) { return make_bsd(v.data(), p.B, p.S, p.cfg.model_dim); };
  attention_options<double> opt;
  layer.forward(tv(p.x), tv(y), opt, s);
  auto g1 = layer.make_gradients(), g2 = layer.make_gradients();
  layer.backward(tv(p.x), tv(p.r), tv(dx1), s, g1, opt);
  opt.threads = 2;
  layer.backward(tv(p.x), tv(p.r), tv(dx2), s, g2, opt);
  CHECK(dx1 == dx2);
  CHECK(flat(g1.w_q) == flat(g2.w_q));
  CHECK(flat(g1.encoder.table) == flat(g2.encoder.table));
  layer.backward(tv(p.x), tv(p.r), tv(dx2), s, g2, opt);  // a second call adds
  for (Eigen::Index i = 0; i < g1.w_k.size(); ++i) CHECK(g2.w_k.data()[i] == 2 * g1.w_k.data()[i]);
  // The encoder's gradients gather per-task sums, so the second call's adds
  // round differently from a doubling: equal to 1e-12 relative.
  for (Eigen::Index i = 0; i < g1.encoder.table.size(); ++i)
    CHECK(std::abs(g2.encoder.table.data()[i] - 2 * g1.encoder.table.data()[i]) <=
          1e-12 * std::abs(g1.encoder.table.data()[i]));
  CHECK(dx1 == dx2);  // written, not added
}

TEST_CASE("multi_head_attention::gradients: two half batches added with += equal the whole batch's gradients",
          "[module][backward]") {
  // GQA, Dv != D, causal, RoPE composed with T5: every tensor of the struct and
  // a composed encoder's gradients take part. Halves are separate sequences,
  // so the whole batch's gradient is the sum of theirs; the two differ only in
  // the order of the sums over tokens: equal to 1e-12 relative.
  module_problem p(mha_config{6, 4, 2, 4, 2}, 4, 5, false, 190);
  using enc_t = compose<rope<double>, t5_bias<double>>;
  enc_t const enc(rope<double>(rope_layout::interleaved, 4),
                  t5_bias<double>(t5_bias_params{4, false, 8, 12}, 191u, 0.3));
  multi_head_attention<enc_t, double> layer(p.cfg, enc);
  p.load(layer);
  attention_options<double> opt;
  opt.causal = true;
  index_t const d = p.cfg.model_dim, half = p.B / 2;
  auto tv = [&](double* data, index_t batch) { return make_bsd(data, batch, p.S, d); };
  std::size_t const shift = static_cast<std::size_t>(half * p.S * d);
  std::vector<double> y(p.x.size()), dx(p.x.size());
  auto backward_of = [&](std::size_t first, index_t batch, decltype(layer.make_gradients())& g) {
    typename multi_head_attention<enc_t, double>::saved s;
    layer.forward(tv(p.x.data() + first, batch), tv(y.data() + first, batch), opt, s);
    layer.backward(tv(p.x.data() + first, batch), tv(p.r.data() + first, batch), tv(dx.data() + first, batch), s, g,
                   opt);
  };
  auto whole = layer.make_gradients(), first = layer.make_gradients(), second = layer.make_gradients();
  backward_of(0, p.B, whole);
  backward_of(0, half, first);
  backward_of(shift, half, second);
  auto sum = first;
  auto& returned = (sum += second);
  CHECK(&returned == &sum);
  auto same = [](auto const& a, auto const& b, auto const& part) {
    REQUIRE(a.size() == b.size());
    double scale = 0;
    for (Eigen::Index i = 0; i < b.size(); ++i) scale = std::max(scale, std::abs(b.data()[i]));
    REQUIRE(scale > 0);
    for (Eigen::Index i = 0; i < b.size(); ++i) {
      INFO(part << " [" << i << "]: " << a.data()[i] << " vs " << b.data()[i]);
      CHECK(std::abs(a.data()[i] - b.data()[i]) <= 1e-12 * scale);
    }
  };
  same(sum.w_q, whole.w_q, "w_q");
  same(sum.w_k, whole.w_k, "w_k");
  same(sum.w_v, whole.w_v, "w_v");
  same(sum.w_o, whole.w_o, "w_o");
  same(sum.b_q, whole.b_q, "b_q");
  same(sum.b_k, whole.b_k, "b_k");
  same(sum.b_v, whole.b_v, "b_v");
  same(sum.b_o, whole.b_o, "b_o");
  same(sum.encoder.get<1>().table, whole.encoder.get<1>().table, "t5 table");
  // Each half alone is far from the whole: the sum is not a copy of either.
  CHECK((first.w_q - whole.w_q).cwiseAbs().maxCoeff() > 1e-3 * whole.w_q.cwiseAbs().maxCoeff());
  CHECK((second.encoder.get<1>().table - whole.encoder.get<1>().table).cwiseAbs().maxCoeff() > 0);
  // backward() into one struct gathers the same sums as += (the other way to accumulate).
  auto gathered = layer.make_gradients();
  backward_of(0, half, gathered);
  backward_of(shift, half, gathered);
  same(gathered.w_o, sum.w_o, "w_o gathered");
  same(gathered.encoder.get<1>().table, sum.encoder.get<1>().table, "t5 table gathered");
}

TEST_CASE("multi_head_attention::backward: the example of docs/backward.md", "[module][backward][docs]") {
  index_t const batch = 2, seq = 6, heads = 4, model = 16;
  posenc::mha_config const cfg{model, heads};
  std::vector<float> wq = random_vector<float>(model * model, 1), wk = random_vector<float>(model * model, 2),
                     wv = random_vector<float>(model * model, 3), wo = random_vector<float>(model * model, 4);
  std::vector<float> xs = random_vector<float>(batch * seq * model, 5), dys = random_vector<float>(xs.size(), 6),
                     ys(xs.size()), dxs(xs.size());
  auto x = posenc::make_bsd(xs.data(), batch, seq, model), y = posenc::make_bsd(ys.data(), batch, seq, model);
  auto dy = posenc::make_bsd(dys.data(), batch, seq, model), dx = posenc::make_bsd(dxs.data(), batch, seq, model);
  posenc::t5_bias<float> t5(posenc::t5_bias_params{heads}, 7u);
  posenc::attention_options<float> opt;
  opt.causal = true;
  // --- as in docs/backward.md ---
  posenc::multi_head_attention<posenc::t5_bias<float>, float> layer(cfg, t5);
  layer.load(wq.data(), wk.data(), wv.data(), wo.data());
  decltype(layer)::saved s;                            // the caller owns the activations
  layer.forward(x, y, opt, s);                         // prefill; fills s
  auto g = layer.make_gradients();                     // zeros shaped like the weights
  layer.backward(x, dy, dx, s, g, opt);                // writes dx, adds into g
  // g.w_q .. g.w_o (out_features, in_features), g.b_q .. g.b_o, g.encoder (t5: g.encoder.table)
  // ---
  std::vector<float> y2(ys.size());
  layer.forward(x, posenc::make_bsd(y2.data(), batch, seq, model), opt);
  CHECK(ys == y2);  // the saving forward gives the same output
  CHECK(g.encoder.table.rows() == 32);
  CHECK(posenc_test::all_finite(dxs));
  CHECK(g.w_q.cwiseAbs().maxCoeff() > 0.0f);
  CHECK(g.encoder.table.cwiseAbs().maxCoeff() > 0.0f);
}
}  // namespace attention_multi_head_backward_tests
