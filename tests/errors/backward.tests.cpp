// SPDX-License-Identifier: MIT
// attention_backward: every bad argument throws before dq, dk, dv or the encoder's gradients are written.
#include <posenc/posenc.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "support/backward_check.hpp"
#include "support/catch.hpp"
#include "support/error_of.hpp"
#include "support/transformer_xl.hpp"

using namespace posenc;

namespace posenc_test {
/// A path that needs the forward pass's lse (as a flash-style backward does):
/// used to check the entry point's lse check.
struct lse_path {};
}  // namespace posenc_test

namespace posenc::detail {
template <>
struct backward_kernel<posenc_test::lse_path> {
  static constexpr bool available = true;
  static constexpr bool needs_lse = true;
  template <class T, class E>
  static void run(attention_plan<T> const& p, backward_views<T> const& io, E const& enc,
                  encoder_gradients_t<E>& grads) {
    reference_attention_backward<double>(p, io, enc, grads);
  }
};
}  // namespace posenc::detail

namespace errors_backward_tests {

namespace {

/// q, k, v, out, dout, lse and the three gradients in ONE buffer, so a test can
/// point a gradient at any input. B=1, Sq=3, Sk=4, Hq=2, Hkv=1, D=Dv=4.
struct arena {
  static constexpr index_t B = 1, Sq = 3, Sk = 4, Hq = 2, Hkv = 1, D = 4;
  static constexpr index_t nq = B * Sq * Hq * D, nk = B * Sk * Hkv * D, nl = B * Hq * Sq;
  static constexpr index_t oq = 0, ok = oq + nq, ov = ok + nk, oo = ov + nk, odo = oo + nq, ol = odo + nq,
                           odq = ol + nl, odk = odq + nq, odv = odk + nk, end = odv + nk;
  std::vector<float> buf = posenc_test::random_vector<float>(static_cast<std::size_t>(end), 3);
  std::vector<float> before;
  view<float> q = make_bshd(buf.data() + oq, B, Sq, Hq, D);
  view<float> k = make_bshd(buf.data() + ok, B, Sk, Hkv, D);
  view<float> v = make_bshd(buf.data() + ov, B, Sk, Hkv, D);
  view<float> out = make_bshd(buf.data() + oo, B, Sq, Hq, D);
  view<float> dout = make_bshd(buf.data() + odo, B, Sq, Hq, D);
  view<float> dq = make_bshd(buf.data() + odq, B, Sq, Hq, D);
  view<float> dk = make_bshd(buf.data() + odk, B, Sk, Hkv, D);
  view<float> dv = make_bshd(buf.data() + odv, B, Sk, Hkv, D);
  attention_options<float> opt;
  t5_bias<float> enc{t5_bias_params{Hq, true, 8, 16}, 1u};
  t5_bias<float>::gradients g = enc.make_gradients();
  arena() {
    opt.lse = {buf.data() + ol, B * Hq * Sq};
    opt.causal = true;
    attention<path::reference>(q, k, v, out, enc, opt);
  }
  template <class Path = path::reference>
  std::string run() {
    before = buf;
    auto const g_before = g.table;
    std::string const m = posenc_test::error_of(
        [&] { attention_backward<Path>(q, k, v, out, dout, dq, dk, dv, enc, opt, g); });
    // Bitwise: the buffer may hold a NaN on purpose.
    untouched = std::memcmp(buf.data(), before.data(), buf.size() * sizeof(float)) == 0 && g.table.rows() == g_before.rows() && g.table.cols() == g_before.cols() &&
                (g.table.size() == 0 || g.table == g_before);
    return m;
  }
  bool untouched = false;
};

}  // namespace

TEST_CASE("attention_backward: bad arguments throw, nothing written", "[errors][backward]") {
  SECTION("the unbroken call works and writes") {
    arena a;
    CHECK(a.run() == "<no error>");
    CHECK(!a.untouched);
  }
  SECTION("gradient shapes") {
    arena a;
    a.dq.dim = 3;
    CHECK(a.run() == "posenc::attention_backward: dq.dim is 3, expected 4 (q.dim)");
    CHECK(a.untouched);
    arena b;
    b.dk.seq = 3;
    CHECK(b.run() == "posenc::attention_backward: dk.seq is 3, expected 4 (k.seq)");
    CHECK(b.untouched);
    arena c;
    c.dv.heads = 2;
    c.dv.dim = 2;
    CHECK(c.run() == "posenc::attention_backward: dv.heads is 2, expected 1 (v.heads)");
    CHECK(c.untouched);
    arena d;
    d.dout.seq = 2;
    CHECK(d.run() == "posenc::attention_backward: dout.seq is 2, expected 3 (out.seq)");
    CHECK(d.untouched);
  }
  SECTION("forward arguments are checked under the backward's name") {
    arena a;
    a.v.seq = 3;
    CHECK(a.run() == "posenc::attention_backward: v.seq is 3, expected 4 (k.seq)");
    CHECK(a.untouched);
  }
  SECTION("encoder gradients that do not fit the encoder") {
    arena a;
    a.g.table = relative_table<float>::Zero(4, 2);
    CHECK(a.run() == "posenc::attention_backward: grads.table shape is (4, 2), expected (8, 2) (num_buckets, heads)");
    CHECK(a.untouched);
  }
  SECTION("gradient buffers aliasing inputs or each other") {
    struct alias_case {
      char const* what;
      index_t dq_at, dk_at, dv_at;
      char const* message;
    };
    using A = arena;
    alias_case const cases[] = {
        {"dq over q", A::oq, A::odk, A::odv, "dq is at bytes"},
        {"dk over v (one element)", A::odq, A::ov - A::nk + 1, A::odv, "dk is at bytes"},
        {"dv over out", A::odq, A::odk, A::oo + 2, "dv is at bytes"},
        {"dv over dout", A::odq, A::odk, A::odo, "and overlaps dout"},
        {"dq over lse", A::ol, A::odk, A::odv, "and overlaps lse"},
        {"dk over dq", A::odq, A::odq + 4, A::odv, "and overlaps dq"},
    };
    for (auto const& c : cases) {
      arena a;
      a.dq.data = a.buf.data() + c.dq_at;
      a.dk.data = a.buf.data() + c.dk_at;
      a.dv.data = a.buf.data() + c.dv_at;
      std::string const m = a.run();
      INFO(c.what << ": " << m);
      CHECK(m.find(c.message) != std::string::npos);
      CHECK(m.find("expected no shared memory") != std::string::npos);
      CHECK(a.untouched);
    }
  }
  SECTION("lse holding +inf") {
    arena a;
    a.opt.lse[2] = std::numeric_limits<float>::infinity();
    CHECK(a.run() == "posenc::attention_backward: lse[2] is inf, expected a finite value, -inf or NaN (the "
                     "forward pass's log-sum-exp)");
    CHECK(a.untouched);
  }
  SECTION("missing lse on a path that needs it") {
    arena a;
    a.opt.lse = nullptr;
    CHECK(a.run<posenc_test::lse_path>() ==
          "posenc::attention_backward: lse is null, expected the forward pass's log-sum-exp (q.batch x q.heads x "
          "q.seq = 6 values; this path does not recompute it)");
    CHECK(a.untouched);
    arena b;
    CHECK(b.run<posenc_test::lse_path>() == "<no error>");
  }
  SECTION("an lse of another size") {
    arena a;
    a.opt.lse = {a.opt.lse.data(), 5};
    CHECK(a.run() == "posenc::attention_backward: lse has 5 values, expected 6 (q.batch x q.heads x q.seq)");
    CHECK(a.untouched);
    arena b;
    std::vector<float> empty;
    b.opt.lse = empty;
    CHECK(b.run() == "posenc::attention_backward: lse has 0 values, expected 6 (q.batch x q.heads x q.seq)");
    CHECK(b.untouched);
  }
  SECTION("a scores output") {
    arena a;
    std::vector<float> scores(64);
    a.opt.scores = scores;
    CHECK(a.run() == "posenc::attention_backward: scores is set, expected null (the backward pass has no scores "
                     "output)");
    CHECK(a.untouched);
  }
  SECTION("out is q (a forward pass run in place)") {
    arena a;
    a.out = a.q;
    CHECK(a.run().find("posenc::attention_backward: out is q (same data)") == 0);
    CHECK(a.untouched);
  }
}

TEST_CASE("attention_backward: an lse from a forward pass with other options throws, nothing written",
          "[errors][backward]") {
  // The arena's lse comes from a causal forward pass with its T5 encoder and the default scale.
  std::string const where = "posenc::attention_backward: lse does not match the scores of batch entry 0, head ";
  std::string const causes = "; the lse was computed with other options: causal, scale, mask, encoder or positions "
                             "differ from the forward's";
  auto both_paths = [&](auto change, std::string const& row) {
    for (int path = 0; path < 2; ++path) {
      INFO((path == 0 ? "reference" : "fused") << " path");
      arena a;
      change(a);
      std::string const m = path == 0 ? a.run<path::reference>() : a.run<path::fused>();
      INFO(m);
      CHECK(m.find(where + row) == 0);
      CHECK(m.find(": sum_j exp(s_ij - lse) is ") != std::string::npos);
      CHECK(m.find(causes) != std::string::npos);
      CHECK(a.untouched);
    }
  };
  SECTION("the matching call does not throw, on either path") {
    arena a, b;
    CHECK(a.run<path::reference>() == "<no error>");
    CHECK(b.run<path::fused>() == "<no error>");
  }
  SECTION("causal dropped: row 0 sees keys 2 and 3 as well") {
    both_paths([](arena& a) { a.opt.causal = false; }, "0, row 0");
  }
  SECTION("another scale") {
    both_paths([](arena& a) { a.opt.scale = 1.5; }, "");
  }
  SECTION("another encoder: a T5 table of another seed") {
    both_paths([](arena& a) { a.enc = t5_bias<float>{t5_bias_params{arena::Hq, true, 8, 16}, 2u}; }, "");
  }
  SECTION("a row whose lse is -inf (no visible key) but that sees keys") {
    for (int path = 0; path < 2; ++path) {
      arena a;
      a.opt.lse[4] = -std::numeric_limits<float>::infinity();  // head 1, row 1
      std::string const m = path == 0 ? a.run<path::reference>() : a.run<path::fused>();
      INFO(m);
      CHECK(m.find(where + "1, row 1: lse is -inf (no visible key) but the row sees keys") == 0);
      CHECK(m.find(causes) != std::string::npos);
      CHECK(a.untouched);
    }
  }
  SECTION("within the float rule: an lse off by 1e-5 is accepted") {
    for (int path = 0; path < 2; ++path) {
      arena a;
      for (index_t r = 0; r < arena::nl; ++r) a.opt.lse[r] += 1e-5f;
      CHECK((path == 0 ? a.run<path::reference>() : a.run<path::fused>()) == "<no error>");
    }
  }
}

TEST_CASE("attention_backward: bad ALiBi and Shaw gradients, learned add_to_backward", "[errors][backward]") {
  SECTION("ALiBi slopes of the wrong shape") {
    alibi<float> enc(alibi_form::paper, 2);
    auto g = enc.make_gradients(true);
    g.slopes = gradient_tensor<float>::Zero(3, 1);
    std::string m = posenc_test::error_of([&] { enc.check_gradients("posenc::attention_backward", g); });
    CHECK(m == "posenc::attention_backward: grads.slopes shape is (3, 1), expected (0, 0) (fixed slopes) or (2, 1) "
               "(heads, 1)");
    g.slopes = gradient_tensor<float>::Zero(1, 2);  // the right count as a row
    m = posenc_test::error_of([&] { enc.check_gradients("posenc::attention_backward", g); });
    CHECK(m == "posenc::attention_backward: grads.slopes shape is (1, 2), expected (0, 0) (fixed slopes) or (2, 1) "
               "(heads, 1)");
  }
  SECTION("Shaw value gradient without value embeddings") {
    shaw<float> enc(1, 4, shaw_terms::keys, 3u);
    auto g = enc.make_gradients();
    g.value = relative_table<float>::Zero(3, 4);
    std::string const m = posenc_test::error_of([&] { enc.check_gradients("posenc::attention_backward", g); });
    CHECK(m == "posenc::attention_backward: grads.value shape is (3, 4), expected (0, 0) (no value embeddings)");
  }
  SECTION("learned: position past the table, table gradient of the wrong shape") {
    auto enc = learned<float>::random(4, 2, 1u, 1);
    std::vector<float> dx(6, 1.0f);
    auto g = enc.make_gradients();
    auto const before = g.table;
    std::string m = posenc_test::error_of(
        [&] { enc.add_to_backward(make_bsd(static_cast<float const*>(dx.data()), 1, 3, 2), position_span(1), g); });
    CHECK(m == "posenc::learned::add_to_backward: position of batch 0 token 2 is 3, expected in [-1, 3) (table "
               "length 4, offset 1)");
    CHECK(g.table == before);
    g.table = gradient_tensor<float>::Zero(1, 8);  // the right count, flat
    m = posenc_test::error_of(
        [&] { enc.add_to_backward(make_bsd(static_cast<float const*>(dx.data()), 1, 3, 2), position_span(0), g); });
    CHECK(m == "posenc::learned::add_to_backward: grads.table shape is (1, 8), expected (4, 2) (rows, d_model)");
    CHECK(g.table.isZero());
  }
}

TEST_CASE("attention_backward: Transformer-XL gradients of the wrong shape, nothing written", "[errors][backward]") {
  auto const enc = posenc_test::random_transformer_xl<float>(2, 4, 6, 8, 3);
  index_t const B = 1, S = 4, H = 2, D = 4;
  std::vector<float> q = posenc_test::random_vector<float>(static_cast<std::size_t>(B * S * H * D), 5), k = q, v = q,
                     out(q.size()), dout = q, dq(q.size(), 7.0f), dk(q.size(), 7.0f), dv(q.size(), 7.0f);
  auto at = [&](std::vector<float>& x) { return make_bshd(x.data(), B, S, H, D); };
  attention_options<float> opt;
  opt.causal = true;
  attention<path::reference>(at(q), at(k), at(v), at(out), enc, opt);
  struct bad_case {
    char const* what;
    index_t which, rows, cols;
    char const* message;
  };
  bad_case const cases[] = {
      {"u", 0, 3, 4, "posenc::attention_backward: grads.u shape is (3, 4), expected (2, 4) (heads, head_dim)"},
      {"v", 1, 2, 5, "posenc::attention_backward: grads.v shape is (2, 5), expected (2, 4) (heads, head_dim)"},
      {"r", 2, 17, 4,
       "posenc::attention_backward: grads.r shape is (17, 4), expected (34, 4) (heads x (2 x distance_limit + 1), "
       "head_dim)"}};
  for (bad_case const& c : cases) {
    auto g = enc.make_gradients();
    relative_table<float>* const t[3] = {&g.u, &g.v, &g.r};
    *t[c.which] = relative_table<float>::Zero(c.rows, c.cols);
    auto const before = g;
    std::string const m = posenc_test::error_of([&] {
      attention_backward<path::reference>(at(q), at(k), at(v), at(out), at(dout), at(dq), at(dk), at(dv), enc, opt, g);
    });
    INFO(c.what);
    CHECK(m == c.message);
    CHECK(std::all_of(dq.begin(), dq.end(), [](float x) { return x == 7.0f; }));
    CHECK(std::all_of(dk.begin(), dk.end(), [](float x) { return x == 7.0f; }));
    CHECK(g.u == before.u);
    CHECK(g.v == before.v);
    CHECK(g.r == before.r);
    std::string const w = posenc_test::error_of([&] { (void)enc.w_r_gradient(g); });
    CHECK(w.rfind("posenc::transformer_xl::w_r_gradient: grads.", 0) == 0);
  }
  SECTION("a visible pair beyond distance_limit is an error, nothing written") {
    auto const short_enc = posenc_test::random_transformer_xl<float>(2, 4, 6, 2, 3);
    auto g = short_enc.make_gradients();
    attention_options<float> full;  // bidirectional: distance 3 is visible
    std::string const m = posenc_test::error_of([&] {
      attention_backward<path::reference>(at(q), at(k), at(v), at(out), at(dout), at(dq), at(dk), at(dv), short_enc,
                                          full, g);
    });
    CHECK(m.rfind("posenc::attention_backward: ", 0) == 0);
    CHECK(m.find("distance_limit") != std::string::npos);
    CHECK(std::all_of(dq.begin(), dq.end(), [](float x) { return x == 7.0f; }));
  }
}

TEST_CASE("attention_backward: a Transformer-XL memory cut with an lse of other options leaves every output",
          "[errors][backward]") {
  // memory_length 2: the memory of Sk - Sq = 4 keys is cut to its last 2 (keys 0 and 1 get zero dk, dv).
  auto const enc = posenc_test::random_transformer_xl<float>(2, 4, 6, 8, 3, 2);
  index_t const B = 1, Sq = 2, Sk = 6, H = 2, D = 4;
  std::vector<float> q = posenc_test::random_vector<float>(static_cast<std::size_t>(B * Sq * H * D), 5),
                     k = posenc_test::random_vector<float>(static_cast<std::size_t>(B * Sk * H * D), 6), v = k,
                     out(q.size()), dout = q, lse(static_cast<std::size_t>(B * H * Sq)), dq(q.size(), 7.0f),
                     dk(k.size(), 7.0f), dv(k.size(), 7.0f);
  auto atq = [&](std::vector<float>& x) { return make_bshd(x.data(), B, Sq, H, D); };
  auto atk = [&](std::vector<float>& x) { return make_bshd(x.data(), B, Sk, H, D); };
  attention_options<float> opt;
  opt.causal = true;
  opt.lse = lse;
  attention<path::reference>(atq(q), atk(k), atk(v), atq(out), enc, opt);
  auto g = enc.make_gradients();
  attention_options<float> other = opt;
  other.causal = false;  // the last memory key row 0 did not see (position 4 + 0 sees keys .. 4)
  std::string const m = posenc_test::error_of([&] {
    attention_backward<path::reference>(atq(q), atk(k), atk(v), atq(out), atq(dout), atq(dq), atk(dk), atk(dv), enc,
                                        other, g);
  });
  INFO(m);
  CHECK(m.find("posenc::attention_backward: lse does not match the scores of batch entry 0, head 0, row 0") == 0);
  CHECK(std::all_of(dq.begin(), dq.end(), [](float x) { return x == 7.0f; }));
  CHECK(std::all_of(dk.begin(), dk.end(), [](float x) { return x == 7.0f; }));  // the cut keys' rows too
  CHECK(std::all_of(dv.begin(), dv.end(), [](float x) { return x == 7.0f; }));
  CHECK(g.u.isZero());
  // The forward's options: no error, zeros for the cut keys.
  CHECK(posenc_test::error_of([&] {
          attention_backward<path::reference>(atq(q), atk(k), atk(v), atq(out), atq(dout), atq(dq), atk(dk), atk(dv),
                                              enc, opt, g);
        }) == "<no error>");
  CHECK(std::all_of(dk.begin(), dk.begin() + 2 * H * D, [](float x) { return x == 0.0f; }));
}

TEST_CASE("encoder gradients: operator+= of another shape throws before adding anything", "[errors][backward]") {
  SECTION("ALiBi: learnable slopes plus fixed ones") {
    alibi<float> enc(alibi_form::paper, 2);
    auto g = enc.make_gradients(), fixed = enc.make_gradients(false);
    g.slopes << 1.0f, 2.0f;
    CHECK(posenc_test::error_of([&] { g += fixed; }) ==
          "posenc::alibi::gradients::operator+=: other.slopes shape is (0, 0), expected (2, 1) (this one's)");
    CHECK(g.slopes(0, 0) == 1.0f);
    CHECK(g.slopes(1, 0) == 2.0f);
  }
  SECTION("learned: a table of another size") {
    auto g = learned<float>::random(4, 2, 1u, 1).make_gradients();
    auto const other = learned<float>::random(5, 2, 1u, 1).make_gradients();
    CHECK(posenc_test::error_of([&] { g += other; }) ==
          "posenc::learned::gradients::operator+=: other.table shape is (5, 2), expected (4, 2) (this one's)");
    CHECK(g.table.rows() == 4);
  }
  SECTION("T5, clipped, Shaw and Transformer-XL: tables of another shape") {
    auto t5 = t5_bias<float>(t5_bias_params{2}, 1u).make_gradients();
    CHECK(posenc_test::error_of([&] { t5 += t5_bias<float>(t5_bias_params{3}, 1u).make_gradients(); }) ==
          "posenc::t5_bias::gradients::operator+=: other.table shape is (32, 3), expected (32, 2) (this one's)");
    auto cb = clipped_bias<float>(2, 2, 1u).make_gradients();
    CHECK(posenc_test::error_of([&] { cb += clipped_bias<float>(3, 2, 1u).make_gradients(); }) ==
          "posenc::clipped_bias::gradients::operator+=: other.table shape is (7, 2), expected (5, 2) (this one's)");
    auto sh = shaw<float>(1, 4, shaw_terms::keys_and_values, 3u).make_gradients();
    sh.key.setConstant(1.0f);
    auto const keys_only = shaw<float>(1, 4, shaw_terms::keys, 3u).make_gradients();
    CHECK(posenc_test::error_of([&] { sh += keys_only; }) ==
          "posenc::shaw::gradients::operator+=: other.value shape is (0, 0), expected (3, 4) (this one's)");
    CHECK(sh.key.minCoeff() == 1.0f);  // the key table, whose shape matched, is not added either
    auto xl = posenc_test::random_transformer_xl<float>(2, 4, 6, 8, 3).make_gradients();
    auto const short_xl = posenc_test::random_transformer_xl<float>(2, 4, 6, 2, 3).make_gradients();
    CHECK(posenc_test::error_of([&] { xl += short_xl; }) ==
          "posenc::transformer_xl::gradients::operator+=: other.r shape is (10, 4), expected (34, 4) (this one's)");
  }
  SECTION("compose: the second part differs, the first is not added") {
    using both = compose<clipped_bias<float>, t5_bias<float>>;
    auto g = both(clipped_bias<float>(2, 2, 1u), t5_bias<float>(t5_bias_params{2}, 1u)).make_gradients();
    auto const other =
        both(clipped_bias<float>(2, 2, 1u), t5_bias<float>(t5_bias_params{2, true, 16}, 1u)).make_gradients();
    g.get<0>().table.setConstant(1.0f);
    CHECK(posenc_test::error_of([&] { g += other; }) ==
          "posenc::compose::gradients::operator+=: other.table shape is (16, 2), expected (32, 2) (this one's)");
    CHECK(g.get<0>().table.minCoeff() == 1.0f);
    CHECK(g.get<0>().table.maxCoeff() == 1.0f);
  }
}

TEMPLATE_TEST_CASE("attention_backward with named tensors: the positional call's results and checks", "[errors][backward]",
                   path::reference, path::fused) {
  arena a, b;
  auto const named = [](arena& x) {
    backward_inputs<float> in;
    in.q = x.q;
    in.k = x.k;
    in.v = x.v;
    in.out = x.out;
    in.dout = x.dout;
    backward_outputs<float> d;
    d.dq = x.dq;
    d.dk = x.dk;
    d.dv = x.dv;
    return posenc_test::error_of([&] { attention_backward<TestType>(in, d, x.enc, x.opt, x.g); });
  };
  CHECK(a.template run<TestType>() == "<no error>");
  CHECK(named(b) == "<no error>");
  CHECK(std::memcmp(a.buf.data(), b.buf.data(), a.buf.size() * sizeof(float)) == 0);  // dq, dk, dv bit for bit
  CHECK(a.g.table == b.g.table);
  // A shape mistake is named as in the positional form, before anything is written.
  arena c;
  c.dout.seq = 2;
  c.before = c.buf;
  CHECK(named(c) == "posenc::attention_backward: dout.seq is 2, expected 3 (out.seq)");
  CHECK(std::memcmp(c.buf.data(), c.before.data(), c.buf.size() * sizeof(float)) == 0);
}
}  // namespace errors_backward_tests
