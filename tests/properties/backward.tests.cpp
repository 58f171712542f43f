// SPDX-License-Identifier: MIT
// Properties of the gradients: shift invariance, RoPE's transpose, GQA as repeated heads summed over the group.
#include <posenc/posenc.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "support/backward_check.hpp"
#include "support/catch.hpp"
#include "support/transformer_xl.hpp"

namespace properties_backward_tests {

using namespace posenc;
using posenc_test::attention_problem;
using posenc_test::max_abs_diff;

namespace {

template <class E>
struct shifted_run {
  std::vector<double> dq, dk, dv;
  encoder_gradients_t<E> g;
};

/// Gradients of one problem with queries at q0 + i and keys at k0 + j.
template <class E>
shifted_run<E> gradients_at(E const& enc, index_t q0, index_t k0, encoder_gradients_t<E> g) {
  attention_problem<double> p(2, 5, 7, 2, 2, 4, 4, 101);
  p.opt.q_positions = position_span(q0);
  p.opt.k_positions = position_span(k0);
  p.opt.causal = true;
  p.gradients(enc, g);
  return {p.dq, p.dk, p.dv, g};
}

double inner(std::vector<double> const& a, std::vector<double> const& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

}  // namespace

TEST_CASE("backward property 1: relative encoders' gradients do not change when every position shifts",
          "[properties][backward]") {
  auto same = [](auto const& a, auto const& b, double tol) {
    return max_abs_diff(a.dq, b.dq) <= tol && max_abs_diff(a.dk, b.dk) <= tol && max_abs_diff(a.dv, b.dv) <= tol;
  };
  for (index_t shift : {1, 17, 1000}) {
    SECTION("T5 buckets, shift " + std::to_string(shift)) {
      t5_bias<double> enc(t5_bias_params{2, false, 8, 16}, 3u, 0.5);
      auto a = gradients_at(enc, 2, 0, enc.make_gradients());
      auto b = gradients_at(enc, 2 + shift, shift, enc.make_gradients());
      CHECK(same(a, b, 0.0));  // the same buckets, the same arithmetic
      CHECK(a.g.table == b.g.table);
    }
    SECTION("clipped bias, shift " + std::to_string(shift)) {
      clipped_bias<double> enc(2, 2, 4u, 0.5);
      auto a = gradients_at(enc, 2, 0, enc.make_gradients());
      auto b = gradients_at(enc, 2 + shift, shift, enc.make_gradients());
      CHECK(same(a, b, 0.0));
      CHECK(a.g.table == b.g.table);
    }
    SECTION("ALiBi (paper form, slopes learned), shift " + std::to_string(shift)) {
      alibi<double> enc(alibi_form::paper, 2);
      auto a = gradients_at(enc, 2, 0, enc.make_gradients(true));
      auto b = gradients_at(enc, 2 + shift, shift, enc.make_gradients(true));
      CHECK(same(a, b, 0.0));
      CHECK(a.g.slopes == b.g.slopes);
    }
    SECTION("Shaw, shift " + std::to_string(shift)) {
      shaw<double> enc(2, 4, shaw_terms::keys_and_values, 5u, 0.5);
      auto a = gradients_at(enc, 2, 0, enc.make_gradients());
      auto b = gradients_at(enc, 2 + shift, shift, enc.make_gradients());
      CHECK(same(a, b, 0.0));
      CHECK(a.g.key == b.g.key);
      CHECK(a.g.value == b.g.value);
    }
    SECTION("Transformer-XL, shift " + std::to_string(shift)) {
      auto const enc = posenc_test::random_transformer_xl<double>(2, 4, 6, 8, 7);
      auto a = gradients_at(enc, 2, 0, enc.make_gradients());
      auto b = gradients_at(enc, 2 + shift, shift, enc.make_gradients());
      CHECK(same(a, b, 0.0));  // the same distances, the same arithmetic
      CHECK(a.g.u == b.g.u);
      CHECK(a.g.v == b.g.v);
      CHECK(a.g.r == b.g.r);
      CHECK(enc.w_r_gradient(a.g) == enc.w_r_gradient(b.g));
    }
    SECTION("RoPE, shift " + std::to_string(shift)) {
      rope<double> enc(rope_layout::half_split, 4);
      auto a = gradients_at(enc, 2, 0, no_gradients{});
      auto b = gradients_at(enc, 2 + shift, shift, no_gradients{});
      CHECK(same(a, b, 1e-11));  // rotations by other angles: equal up to rounding
    }
  }
}

TEST_CASE("backward property 2: RoPE's input gradient is the inverse rotation of the output gradient",
          "[properties][backward]") {
  index_t const B = 2, S = 6, H = 3, D = 8;
  struct rope_case {
    char const* name;
    rope_scaling scaling;
    index_t rotary_dim;
  };
  std::vector<rope_case> cases = {
      {"none", rope_scaling::none(), D},
      {"partial rotary", rope_scaling::none(), 6},
      {"linear", rope_scaling::linear(2.0), D},
      {"dynamic NTK", rope_scaling::dynamic_ntk(2.0, 4), D},
      {"YaRN", rope_scaling::yarn(4.0, 4), D},
      {"Llama 3", rope_scaling::llama3(8.0, 1.0, 4.0, 4), D},
      {"LongRoPE", rope_scaling::longrope({1.0, 1.5, 2.0, 3.0}, {2.0, 3.0, 5.0, 8.0}, 4, 32), D},
  };
  std::vector<index_t> ids = {0, 3, 1, 5, 2, 4, 7, 0, 2, 6, 1, 3};
  position_span pos = position_span::ids(ids.data(), B, S);
  for (auto const& c : cases) {
    for (rope_layout layout : {rope_layout::half_split, rope_layout::interleaved}) {
      rope_options o;
      o.rotary_dim = c.rotary_dim;
      o.scaling = c.scaling;
      rope<double> enc(layout, D, o);
      std::string const name = std::string(c.name) + (layout == rope_layout::half_split ? ", half-split" : ", interleaved");
      std::vector<double> x = posenc_test::random_vector<double>(static_cast<std::size_t>(B * S * H * D), 111);
      std::vector<double> y = posenc_test::random_vector<double>(x.size(), 112);
      auto view_of = [&](std::vector<double>& t) { return make_bshd(t.data(), B, S, H, D); };
      std::vector<double> rx = x, ty = y, inv = y;
      enc.rotate(view_of(rx), pos, 8);
      enc.rotate_transpose(view_of(ty), pos, 8);
      enc.rotate_inverse(view_of(inv), pos, 8);
      double const a2 = std::pow(enc.frequencies(8).attention_factor, 2);
      SECTION("2a. <R x, y> == <x, R^T y>: " + name) {
        CHECK(std::abs(inner(rx, y) - inner(x, ty)) <= 1e-12 * (1 + std::abs(inner(rx, y))));
      }
      SECTION("2b. R^T == a^2 R^-1 (R^-1 itself when a = 1): " + name) {
        for (auto& t : inv) t *= a2;
        CHECK(max_abs_diff(ty, inv) <= 1e-14);
      }
    }
  }
  SECTION("2c. caller caches, by position and per token: <R x, y> == <x, R^T y>") {
    index_t const h = D / 2;
    std::vector<double> cs = posenc_test::random_vector<double>(static_cast<std::size_t>(8 * h), 113);
    std::vector<double> sn = posenc_test::random_vector<double>(cs.size(), 114);
    std::vector<double> cs_t = posenc_test::random_vector<double>(static_cast<std::size_t>(B * S * h), 115);
    std::vector<double> sn_t = posenc_test::random_vector<double>(cs_t.size(), 116);
    rope<double> enc(rope_layout::interleaved, D);
    auto by_pos = rope_cache<double>::by_position(cs.data(), sn.data(), 8, h);
    auto per_tok = rope_cache<double>::per_token(cs_t.data(), sn_t.data(), B, S, h);
    std::vector<double> x = posenc_test::random_vector<double>(static_cast<std::size_t>(B * S * H * D), 117);
    std::vector<double> y = posenc_test::random_vector<double>(x.size(), 118);
    auto view_of = [&](std::vector<double>& t) { return make_bshd(t.data(), B, S, H, D); };
    std::vector<double> rx = x, ty = y;
    enc.rotate(view_of(rx), pos, by_pos);
    enc.rotate_transpose(view_of(ty), pos, by_pos);
    CHECK(std::abs(inner(rx, y) - inner(x, ty)) <= 1e-12 * (1 + std::abs(inner(rx, y))));
    rx = x;
    ty = y;
    enc.rotate(view_of(rx), per_tok);
    enc.rotate_transpose(view_of(ty), per_tok);
    CHECK(std::abs(inner(rx, y) - inner(x, ty)) <= 1e-12 * (1 + std::abs(inner(rx, y))));
  }
  SECTION("2d. attention with RoPE: dq, dk are the plain problem's on rotated q, k, rotated back") {
    rope<double> enc(rope_layout::half_split, 4);
    attention_problem<double> p(1, 5, 5, 2, 2, 4, 4, 119);
    p.opt.causal = true;
    no_gradients g;
    p.gradients(enc, g);
    attention_problem<double> r = p;
    enc.rotate(r.vq(), position_span(0), 5);
    enc.rotate(r.vk(), position_span(0), 5);
    r.gradients(none{}, g);
    enc.rotate_inverse(r.vdq(), position_span(0), 5);
    enc.rotate_inverse(r.vdk(), position_span(0), 5);
    CHECK(max_abs_diff(p.dq, r.dq) <= 1e-14);
    CHECK(max_abs_diff(p.dk, r.dk) <= 1e-14);
    CHECK(max_abs_diff(p.dv, r.dv) <= 1e-14);
  }
}

TEST_CASE("backward property 3: the GQA gradient is the repeated-heads problem's, summed over the group",
          "[properties][backward]") {
  index_t const B = 2, Sq = 5, Sk = 6, Hq = 6, Hkv = 2, D = 4, group = Hq / Hkv;
  clipped_bias<double> enc(2, Hq, 7u, 0.5);
  attention_problem<double> gqa(B, Sq, Sk, Hq, Hkv, D, D, 121);
  gqa.opt.causal = true;
  auto g1 = enc.make_gradients();
  gqa.gradients(enc, g1);
  // The same problem with every kv head repeated for each query head of its group.
  attention_problem<double> rep(B, Sq, Sk, Hq, Hq, D, D, 121);
  rep.q = gqa.q;
  rep.dout = gqa.dout;
  rep.opt = gqa.opt;
  for (index_t b = 0; b < B; ++b)
    for (index_t j = 0; j < Sk; ++j)
      for (index_t h = 0; h < Hq; ++h)
        for (index_t d = 0; d < D; ++d) {
          rep.vk()(b, j, h, d) = gqa.vk()(b, j, h / group, d);
          rep.vv()(b, j, h, d) = gqa.vv()(b, j, h / group, d);
        }
  auto g2 = enc.make_gradients();
  rep.gradients(enc, g2);
  CHECK(max_abs_diff(gqa.dq, rep.dq) <= 1e-14);
  double worst = 0;
  for (index_t b = 0; b < B; ++b)
    for (index_t j = 0; j < Sk; ++j)
      for (index_t hk = 0; hk < Hkv; ++hk)
        for (index_t d = 0; d < D; ++d) {
          double sk = 0, sv = 0;
          for (index_t h = hk * group; h < (hk + 1) * group; ++h) {
            sk += rep.vdk()(b, j, h, d);
            sv += rep.vdv()(b, j, h, d);
          }
          worst = std::max({worst, std::abs(sk - gqa.vdk()(b, j, hk, d)), std::abs(sv - gqa.vdv()(b, j, hk, d))});
        }
  CHECK(worst <= 1e-14);
  CHECK(max_abs_diff(std::vector<double>(g1.table.data(), g1.table.data() + g1.table.size()),
                     std::vector<double>(g2.table.data(), g2.table.data() + g2.table.size())) <= 1e-14);
}
}  // namespace properties_backward_tests
