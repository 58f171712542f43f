// SPDX-License-Identifier: MIT
// multi_head_attention::backward and Transformer-XL's gradients against torch autograd, at double and float.
#include <posenc/posenc.hpp>

#include <string>
#include <vector>

#include "support/backward_check.hpp"
#include "support/catch.hpp"
#include "support/golden.hpp"
#include "support/tolerance.hpp"

namespace golden_multi_head_backward_tests {

using namespace posenc;

namespace {

index_t const B = 2, S = 5;

posenc_test::golden_file const& golden() {
  static posenc_test::golden_file const g = posenc_test::read_golden("multi_head_backward.txt");
  return g;
}
template <class T>
std::vector<T> rec(std::string const& name) {
  auto const& r = posenc_test::golden_record(golden(), name);
  return std::vector<T>(r.begin(), r.end());
}
template <class M>
void append(std::vector<typename M::Scalar>& all, M const& m) {
  all.insert(all.end(), m.data(), m.data() + m.size());
}
template <class T>
Eigen::Map<const relative_table<T>> as_table(std::vector<T> const& v, index_t rows, index_t cols) {
  return Eigen::Map<const relative_table<T>>(v.data(), rows, cols);
}
/// Concatenated torch records of case c.
std::vector<double> expected(std::string const& c, std::vector<std::string> const& names) {
  std::vector<double> all;
  for (auto const& n : names) {
    auto const x = rec<double>(c + "/" + n);
    all.insert(all.end(), x.begin(), x.end());
  }
  return all;
}

/// Layer case c: forward on the reference path, backward on Path; returns
/// dx, dWq..dWo, dbq..dbo and the encoder's gradients (params(enc, g)).
template <class Path, class T, class Make, class Params>
std::vector<T> run_layer(std::string const& c, mha_config cfg, Make make, Params params) {
  auto enc = make(T{});
  multi_head_attention<decltype(enc), T> layer(cfg, enc);
  std::vector<T> w[4], b[4];
  char const* const tags[4] = {"q", "k", "v", "o"};
  for (int i = 0; i < 4; ++i) {
    w[i] = rec<T>(c + "/w" + tags[i]);
    b[i] = rec<T>(c + "/b" + tags[i]);
  }
  layer.load(w[0].data(), w[1].data(), w[2].data(), w[3].data(), b[0].data(), b[1].data(), b[2].data(), b[3].data());
  std::vector<T> x = rec<T>(c + "/x"), dy = rec<T>(c + "/dy"), y(x.size()), dx(x.size());
  index_t const M = cfg.model_dim;
  attention_options<T> opt;
  opt.causal = true;
  typename multi_head_attention<decltype(enc), T>::saved s;
  layer.template forward<path::reference>(make_bsd(x.data(), B, S, M), make_bsd(y.data(), B, S, M), opt, s);
  auto g = layer.make_gradients();
  layer.template backward<Path>(make_bsd(x.data(), B, S, M), make_bsd(dy.data(), B, S, M),
                                make_bsd(dx.data(), B, S, M), s, g, opt);
  std::vector<T> all = dx;
  for (auto const* m : {&g.w_q, &g.w_k, &g.w_v, &g.w_o}) append(all, *m);
  for (auto const* m : {&g.b_q, &g.b_k, &g.b_v, &g.b_o}) append(all, *m);
  std::vector<T> const pg = params(enc, g.encoder);
  all.insert(all.end(), pg.begin(), pg.end());
  return all;
}

/// Transformer-XL attention case c: dq, dk, dv, d(u), d(v), d(W_R) on Path.
template <class Path, class T>
std::vector<T> run_txl(std::string const& c, index_t qlen, index_t mlen, index_t memory_length) {
  index_t const H = 2, D = 4, P = 6, Sk = qlen + mlen;
  std::vector<T> const u = rec<T>(c + "/u"), vb = rec<T>(c + "/vb"), wr = rec<T>(c + "/wr");
  transformer_xl<T> enc(Sk, as_table(u, H, D), as_table(vb, H, D), as_table(wr, H * D, P), memory_length);
  std::vector<T> q = rec<T>(c + "/q"), k = rec<T>(c + "/k"), v = rec<T>(c + "/v"), dout = rec<T>(c + "/dout");
  std::vector<T> out(dout.size()), dq(q.size()), dk(k.size(), T(9)), dv(v.size(), T(9));
  attention_options<T> opt;
  opt.causal = true;
  auto vq = make_bshd(q.data(), B, qlen, H, D), vk = make_bshd(k.data(), B, Sk, H, D),
       vv = make_bshd(v.data(), B, Sk, H, D), vo = make_bshd(out.data(), B, qlen, H, D);
  attention<path::reference>(vq, vk, vv, vo, enc, opt);
  auto g = enc.make_gradients();
  attention_backward<Path>(vq, vk, vv, vo, make_bshd(dout.data(), B, qlen, H, D), make_bshd(dq.data(), B, qlen, H, D),
                           make_bshd(dk.data(), B, Sk, H, D), make_bshd(dv.data(), B, Sk, H, D), enc, opt, g);
  std::vector<T> all = dq;
  all.insert(all.end(), dk.begin(), dk.end());
  all.insert(all.end(), dv.begin(), dv.end());
  append(all, g.u);
  append(all, g.v);
  append(all, enc.w_r_gradient(g));
  return all;
}

/// At double: 1e-12 of torch's float64; at float: the tolerance rule (2x the
/// plain float backward's error + 1e-6).
template <class Run>
void check_against(std::vector<double> const& want, Run run) {
  auto const got = run(double{}, path::reference{});
  REQUIRE(got.size() == want.size());
  double const err = posenc_test::max_abs_diff(got, want);
  INFO("double: max error " << err);
  CHECK(err <= 1e-12);
  auto const gotf = run(float{}, path::reference{});
  auto const plain = run(float{}, posenc_test::plain_backward_path{});
  auto const r = posenc_test::within_tolerance(gotf, want, plain);
  INFO("float: " << r.describe());
  CHECK(r.ok);
}

std::vector<std::string> layer_records(std::vector<std::string> const& params) {
  std::vector<std::string> n = {"dx", "dwq", "dwk", "dwv", "dwo", "dbq", "dbk", "dbv", "dbo"};
  for (auto const& p : params) n.push_back("d" + p);
  return n;
}

}  // namespace

TEST_CASE("golden backward: multi_head_attention with a clipped bias, GQA, Dv != D, causal",
          "[golden][backward][module]") {
  mha_config const cfg{6, 4, 2, 3, 2};
  auto make = [](auto t) {
    using T = decltype(t);
    return clipped_bias<T>(2, 4, as_table(rec<T>("mha_clipped/table"), 5, 4));
  };
  auto params = [](auto const&, auto const& g) {
    using T = typename std::decay_t<decltype(g.table)>::Scalar;
    return std::vector<T>(g.table.data(), g.table.data() + g.table.size());
  };
  check_against(expected("mha_clipped", layer_records({"table"})), [&](auto t, auto p) {
    return run_layer<decltype(p), decltype(t)>("mha_clipped", cfg, make, params);
  });
}

TEST_CASE("golden backward: multi_head_attention with Transformer-XL, causal", "[golden][backward][module]") {
  mha_config const cfg{6, 2, 2, 3, 3};
  auto make = [](auto t) {
    using T = decltype(t);
    return transformer_xl<T>(S, as_table(rec<T>("mha_txl/u"), 2, 3), as_table(rec<T>("mha_txl/vb"), 2, 3),
                             as_table(rec<T>("mha_txl/wr"), 6, 4));
  };
  auto params = [](auto const& enc, auto const& g) {
    using T = typename std::decay_t<decltype(g.u)>::Scalar;
    std::vector<T> all;
    append(all, g.u);
    append(all, g.v);
    append(all, enc.w_r_gradient(g));
    return all;
  };
  check_against(expected("mha_txl", layer_records({"u", "vb", "wr"})), [&](auto t, auto p) {
    return run_layer<decltype(p), decltype(t)>("mha_txl", cfg, make, params);
  });
}

TEST_CASE("golden backward: Transformer-XL over a segment memory, and a memory cut to memory_length",
          "[golden][backward][transformer_xl]") {
  std::vector<std::string> const names = {"dq", "dk", "dv", "du", "dvb", "dwr"};
  SECTION("memory of 3") {
    check_against(expected("txl_mem", names),
                  [](auto t, auto p) { return run_txl<decltype(p), decltype(t)>("txl_mem", 4, 3, 0); });
  }
  SECTION("memory of 4 cut to 2: the cut keys get zero gradients") {
    check_against(expected("txl_cut", names),
                  [](auto t, auto p) { return run_txl<decltype(p), decltype(t)>("txl_cut", 3, 4, 2); });
  }
}
}  // namespace golden_multi_head_backward_tests
