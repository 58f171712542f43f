// SPDX-License-Identifier: MIT
// Every bad argument of posenc::attention, kv_cache and multi_head_attention throws posenc::error naming it, outputs untouched.
#include <posenc/attention/attention.hpp>
#include <posenc/attention/kv_cache.hpp>
#include <posenc/attention/multi_head.hpp>
#include <posenc/encoding/none.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/fake_encoders.hpp"
#include "support/random.hpp"

using posenc::index_t;

namespace {

/// A valid call (B=2, Sq=3, Sk=4, Hq=4, Hkv=2, D=4, Dv=2) that a test breaks in one place.
struct call {
  std::vector<float> q = posenc_test::random_vector<float>(2 * 3 * 4 * 4, 1);
  std::vector<float> k = posenc_test::random_vector<float>(2 * 4 * 2 * 4, 2);
  std::vector<float> v = posenc_test::random_vector<float>(2 * 4 * 2 * 2, 3);
  std::vector<float> out = std::vector<float>(2 * 3 * 4 * 2, 42.0f);
  std::vector<float> lse = std::vector<float>(2 * 4 * 3, 42.0f);
  std::vector<float> scores = std::vector<float>(2 * 4 * 3 * 4, 42.0f);
  posenc::view<float> qv = posenc::make_bshd(q.data(), 2, 3, 4, 4);
  posenc::view<float> kv = posenc::make_bshd(k.data(), 2, 4, 2, 4);
  posenc::view<float> vv = posenc::make_bshd(v.data(), 2, 4, 2, 2);
  posenc::view<float> ov = posenc::make_bshd(out.data(), 2, 3, 4, 2);
  posenc::attention_options<float> opt;
  call() {
    opt.lse = lse;
    opt.scores = scores;
  }
  bool untouched() const {
    for (float x : out)
      if (x != 42.0f) return false;
    for (float x : lse)
      if (x != 42.0f) return false;
    for (float x : scores)
      if (x != 42.0f) return false;
    return true;
  }
};

template <class Path, class E = posenc::none>
void expect_error(std::function<void(call&)> const& breaker, std::string const& message, E const& enc = {}) {
  call c;
  breaker(c);
  INFO("expected message containing: " << message);
  REQUIRE_THROWS_AS(posenc::attention<Path>(c.qv, c.kv, c.vv, c.ov, enc, c.opt), posenc::error);
  REQUIRE_THROWS_WITH(posenc::attention<Path>(c.qv, c.kv, c.vv, c.ov, enc, c.opt),
                      posenc_test::contains("posenc::attention: " + message));
  CHECK(c.untouched());
}

}  // namespace

TEMPLATE_TEST_CASE("attention errors: shapes", "[errors]", posenc::path::reference, posenc::path::materialized,
                   posenc::path::best) {
  if constexpr (std::is_same_v<TestType, posenc::path::best>) {
    // path::best is the fused path: the scores output, asked of it, is an error after every other check
    expect_error<TestType>([](call&) {}, "scores is set, expected null (path::fused and path::best do not produce "
                                         "the scores output; use path::materialized or path::reference)");
  }
  {
    call c;  // the unbroken call works and writes
    if constexpr (std::is_same_v<TestType, posenc::path::best>) c.opt.scores = nullptr;
    posenc::attention<TestType>(c.qv, c.kv, c.vv, c.ov, posenc::none{}, c.opt);
    CHECK(!c.untouched());
  }
  expect_error<TestType>([](call& c) { c.kv.batch = 1; }, "k.batch is 1, expected 2 (q.batch)");
  expect_error<TestType>([](call& c) { c.vv.batch = 1; }, "v.batch is 1, expected 2 (q.batch)");
  expect_error<TestType>([](call& c) { c.vv.seq = 3; }, "v.seq is 3, expected 4 (k.seq)");
  expect_error<TestType>([](call& c) { c.kv.dim = 2; }, "k.dim is 2, expected 4 (q.dim)");
  expect_error<TestType>([](call& c) { c.vv.heads = 1; }, "v.heads is 1, expected 2 (k.heads)");
  expect_error<TestType>([](call& c) { c.ov.batch = 1; }, "out.batch is 1, expected 2 (q.batch)");
  expect_error<TestType>([](call& c) { c.ov.seq = 2; }, "out.seq is 2, expected 3 (q.seq)");
  expect_error<TestType>([](call& c) { c.ov.heads = 2; }, "out.heads is 2, expected 4 (q.heads)");
  expect_error<TestType>([](call& c) { c.ov.dim = 1; }, "out.dim is 1, expected 2 (v.dim)");
  expect_error<TestType>(
      [](call& c) {
        c.kv.heads = 3;
        c.vv.heads = 3;
      },
      "q.heads is 4, expected a multiple of k.heads (3)");
  expect_error<TestType>([](call& c) { c.kv.dim_stride = 2; }, "k.dim_stride is 2, expected 1");
  expect_error<TestType>([](call& c) { c.ov.dim_stride = 3; }, "out.dim_stride is 3, expected 1");
  expect_error<TestType>([](call& c) { c.qv.data = nullptr; }, "q.data is null");
  expect_error<TestType>([](call& c) { c.vv.data = nullptr; }, "v.data is null");
  expect_error<TestType>([](call& c) { c.qv.seq = -1; }, "q.seq is -1, expected >= 0");
}

TEMPLATE_TEST_CASE("attention errors: options", "[errors]", posenc::path::reference, posenc::path::materialized,
                   posenc::path::best) {
  float const inf = std::numeric_limits<float>::infinity();
  expect_error<TestType>([](call& c) { c.opt.scale = -1.0; }, "scale is -1, expected a finite value >= 0");
  expect_error<TestType>([](call& c) { c.opt.scale = std::nan(""); }, "scale is nan");
  expect_error<TestType>([&](call& c) { c.opt.scale = inf; }, "scale is inf");
  expect_error<TestType>([](call& c) { c.opt.softcap = -2.0; }, "softcap is -2, expected a finite value >= 0");
  expect_error<TestType>([&](call& c) { c.opt.softcap = inf; }, "softcap is inf");
  expect_error<TestType>([](call& c) { c.opt.sliding_window = -1; }, "sliding_window is -1, expected >= 0");
  static std::vector<index_t> lens3{1, 2, 3}, lens_long{4, 5}, lens_neg{-1, 2};
  expect_error<TestType>([](call& c) { c.opt.key_lengths = lens3; }, "key_lengths has 3 entries, expected 2");
  expect_error<TestType>([](call& c) { c.opt.key_lengths = lens_long; }, "key_lengths[1] is 5, expected 0 .. 4");
  expect_error<TestType>([](call& c) { c.opt.key_lengths = lens_neg; }, "key_lengths[0] is -1");
  static std::vector<float> m(2 * 4 * 3 * 4);
  expect_error<TestType>([](call& c) { c.opt.mask = posenc::make_mask<float>(m.data(), 3, 1, 3, 4); },
                         "mask.batch is 3, expected 1 or 2");
  expect_error<TestType>([](call& c) { c.opt.mask = posenc::make_mask<float>(m.data(), 1, 2, 3, 4); },
                         "mask.heads is 2, expected 1 or 4");
  expect_error<TestType>([](call& c) { c.opt.mask = posenc::make_mask<float>(m.data(), 1, 1, 2, 4); },
                         "mask.q is 2, expected 1 or 3");
  expect_error<TestType>([](call& c) { c.opt.mask = posenc::make_mask<float>(m.data(), 1, 1, 3, 5); },
                         "mask.k is 5, expected 0 .. 4");
  static bool bm[64] = {};
  expect_error<TestType>([](call& c) { c.opt.bool_mask = posenc::make_mask<bool>(bm, 1, 3, 1, 4); },
                         "bool_mask.heads is 3, expected 1 or 4");
  static std::vector<index_t> ids(2 * 5), negk{0, -1, 2, 3};
  expect_error<TestType>([](call& c) { c.opt.q_positions = posenc::position_span::ids(ids.data(), 2, 5); },
                         "q_positions seq is 5, expected 3");
  expect_error<TestType>([](call& c) { c.opt.k_positions = posenc::position_span::ids(negk.data(), 1, 4); },
                         "k_positions position of batch 0 token 1 is -1, expected >= 0");
  // an encoder that needs positions cannot place a visible query before 0
  expect_error<TestType>([](call& c) { c.opt.q_positions = posenc::position_span(-2); },
                         "query position of batch 0 row 0 is -2, expected >= 0", posenc_test::fake_bias{});
  // the bias encoder was built for another head count
  expect_error<TestType>([](call&) {}, "encoder heads() is 8, expected 4", posenc_test::fake_bias{8});
  expect_error<TestType>([](call&) {}, "encoder head_dim() is 3, expected 4",
                         posenc_test::fake_shaw<float>(2, 3, false, 1));
  expect_error<TestType>([](call&) {}, "v.dim is 2, expected 4 (the encoder's head_dim",
                         posenc_test::fake_shaw<float>(2, 4, true, 1));
}

// The bfloat16 product mode is compiled only where POSENC_BF16_PRODUCTS=1 (the default is 0).
static_assert(POSENC_BF16_PRODUCTS == 0, "errors/attention is built without the bfloat16 product mode");

TEMPLATE_TEST_CASE("attention errors: bfloat16 products in a build that leaves them out (the default)",
                   "[errors]", posenc::path::fused, posenc::path::best) {
  std::string const msg = "products is bfloat16, expected float32: bfloat16 products are compiled only where "
                          "POSENC_BF16_PRODUCTS=1 is defined (in every translation unit of the program)";
  auto const bf16 = [](call& c) {
    c.opt.scores = nullptr;  // path::fused and path::best give no scores
    c.opt.products = posenc::product_precision::bfloat16;
  };
  expect_error<TestType>(bf16, msg);
  // also where a float32 call of the same shape runs the lane kernel (many rows)
  std::vector<float> q(64 * 16, 0.25f), out(64 * 16, 42.0f);
  auto const x = posenc::make_bshd(static_cast<float const*>(q.data()), 1, 64, 1, 16);
  posenc::attention_options<float> opt;
  opt.products = posenc::product_precision::bfloat16;
  REQUIRE_THROWS_WITH(posenc::attention<TestType>(x, x, x, posenc::make_bshd(out.data(), 1, 64, 1, 16),
                                                  posenc::none{}, opt),
                      posenc_test::contains("posenc::attention: " + msg));
  CHECK(std::all_of(out.begin(), out.end(), [](float e) { return e == 42.0f; }));
  opt.products = posenc::product_precision::float32;
  posenc::attention<TestType>(x, x, x, posenc::make_bshd(out.data(), 1, 64, 1, 16), posenc::none{}, opt);
  CHECK(std::all_of(out.begin(), out.end(), [](float e) { return std::abs(e - 0.25f) < 1e-6f; }));
}

TEMPLATE_TEST_CASE("attention errors: scale and softcap must be usable as T (float)", "[errors]",
                   posenc::path::reference, posenc::path::materialized, posenc::path::best) {
  // Finite as double, but in float: inf (1e39), 0 (1e-50), subnormal (1e-39), or a subnormal
  // reciprocal (softcap 1e38: 1 / softcap underflows) that turns s * (1 / softcap) into noise.
  std::string const scale_range = ", expected a finite value >= 0 that is 0 or normal as float (1.1754944e-38 .. 3.4028235e+38)";
  expect_error<TestType>([](call& c) { c.opt.scale = 1e39; }, "scale is 1e+39" + scale_range);
  expect_error<TestType>([](call& c) { c.opt.scale = 1e-50; }, "scale is 1e-50" + scale_range);
  expect_error<TestType>([](call& c) { c.opt.scale = 1e-39; }, "scale is 1e-39" + scale_range);
  std::string const cap_range =
      ", expected a finite value >= 0 (0 = off) that is 0 or normal as float with a normal reciprocal (1.1754944e-38 .. "
      "8.507059e+37)";
  expect_error<TestType>([](call& c) { c.opt.softcap = 1e39; }, "softcap is 1e+39" + cap_range);
  expect_error<TestType>([](call& c) { c.opt.softcap = 1e38; }, "softcap is 1e+38" + cap_range);
  expect_error<TestType>([](call& c) { c.opt.softcap = 1e-39; }, "softcap is 1e-39" + cap_range);
  expect_error<TestType>([](call& c) { c.opt.softcap = 1e-50; }, "softcap is 1e-50" + cap_range);
}

TEST_CASE("attention: scale and softcap that only double can hold work for T = double", "[errors]") {
  // (batch 1, seq 3, heads 2, dim 4): the same values that float rejects.
  auto q = posenc_test::random_vector<double>(24, 11), k = posenc_test::random_vector<double>(24, 12),
       v = posenc_test::random_vector<double>(24, 13);
  auto view = [](std::vector<double>& x) { return posenc::make_bshd(x.data(), 1, 3, 2, 4); };
  for (double s : {1e39, 1e-39}) {
    for (double cap : {0.0, 1e39, 1e-39}) {
      posenc::attention_options<double> opt;
      opt.scale = s;
      opt.softcap = cap;
      std::vector<double> out(24, 42.0), ref(24, 42.0);
      REQUIRE_NOTHROW(posenc::attention(view(q), view(k), view(v), view(out), posenc::none{}, opt));
      REQUIRE_NOTHROW(posenc::attention<posenc::path::reference>(view(q), view(k), view(v), view(ref), posenc::none{}, opt));
      for (std::size_t i = 0; i < out.size(); ++i) {
        INFO("scale " << s << " softcap " << cap << " element " << i);
        REQUIRE(std::isfinite(out[i]));
        CHECK(std::abs(out[i] - ref[i]) <= 1e-12);
      }
    }
  }
}

TEST_CASE("attention errors: negative query positions are fine where no key is visible", "[errors]") {
  call c;
  c.opt.q_positions = posenc::position_span(-2);
  c.opt.causal = true;
  posenc::attention<posenc::path::reference>(c.qv, c.kv, c.vv, c.ov, posenc_test::fake_bias{}, c.opt);
  for (index_t n = 0; n < 2 * 4 * 2; ++n) CHECK(c.out[static_cast<std::size_t>(n)] == 0.0f);  // rows 0, 1 of batch 0
}

TEST_CASE("kv_cache and multi_head_attention errors", "[errors]") {
  posenc::kv_cache<float> cache(2, 2, 4, 2);
  std::vector<float> k(2 * 3 * 2 * 4), v(2 * 3 * 2 * 2);
  auto kv = posenc::make_bshd<const float>(k.data(), 2, 3, 2, 4);
  auto vv = posenc::make_bshd<const float>(v.data(), 2, 3, 2, 2);
  auto bad_k = posenc::make_bshd<const float>(k.data(), 2, 3, 1, 4);
  REQUIRE_THROWS_WITH(cache.append(bad_k, vv, posenc::none{}),
                      posenc_test::contains("posenc::kv_cache::append: k.heads is 1, expected 2 (cache kv_heads)"));
  auto short_v = posenc::make_bshd<const float>(v.data(), 2, 2, 2, 2);
  REQUIRE_THROWS_WITH(cache.append(kv, short_v, posenc::none{}),
                      posenc_test::contains("v.seq is 2, expected 3 (k.seq)"));
  CHECK(cache.length() == 0);
  REQUIRE_THROWS_WITH(posenc::kv_cache<float>(1, 1, 4, 0, -1), posenc_test::contains("first_position is -1"));

  REQUIRE_THROWS_WITH((posenc::multi_head_attention<posenc::none, float>({8, 3, 2, 0, 0}, {})),
                      posenc_test::contains("kv_heads is 2, expected a divisor of q_heads (3)"));
  REQUIRE_THROWS_WITH((posenc::multi_head_attention<posenc::none, float>({10, 4, 0, 0, 0}, {})),
                      posenc_test::contains("model_dim is 10, expected a multiple of q_heads (4)"));
  posenc::multi_head_attention<posenc::none, float> mha({8, 2, 1, 4, 4}, {});
  std::vector<float> x(2 * 3 * 8), y(2 * 3 * 8, 42.0f);
  auto xv = posenc::make_bsd<const float>(x.data(), 2, 3, 8);
  REQUIRE_THROWS_WITH(mha.forward(xv, posenc::make_bsd(y.data(), 2, 3, 6)),
                      posenc_test::contains("y.dim is 6, expected 8 (model_dim)"));
  auto wrong_cache = posenc::kv_cache<float>(2, 2, 4, 4);
  REQUIRE_THROWS_WITH(mha.forward(xv, posenc::make_bsd(y.data(), 2, 3, 8), wrong_cache),
                      posenc_test::contains("cache.kv_heads is 2, expected 1 (kv_heads)"));
  for (float t : y) CHECK(t == 42.0f);
}

TEMPLATE_TEST_CASE("attention errors: lse and scores know their size, checked before anything is written", "[errors]",
                   posenc::path::reference, posenc::path::materialized, posenc::path::best) {
  constexpr bool has_scores = !std::is_same_v<TestType, posenc::path::best>;
  auto no_scores = [](call& c) {
    if constexpr (!has_scores) c.opt.scores = nullptr;
  };
  // lse: exactly q.batch x q.heads x q.seq = 24 values.
  expect_error<TestType>(
      [&](call& c) {
        no_scores(c);
        c.opt.lse = {c.lse.data(), 23};
      },
      "lse has 23 values, expected 24 (q.batch x q.heads x q.seq)");
  expect_error<TestType>(
      [&](call& c) {
        no_scores(c);
        c.lse.push_back(42.0f);
        c.opt.lse = c.lse;
      },
      "lse has 25 values, expected 24 (q.batch x q.heads x q.seq)");
  // An empty vector is a given lse of 0 values, not "no lse".
  std::vector<float> none;
  expect_error<TestType>(
      [&](call& c) {
        no_scores(c);
        c.opt.lse = none;
      },
      "lse has 0 values, expected 24 (q.batch x q.heads x q.seq)");
  expect_error<TestType>(
      [&](call& c) {
        no_scores(c);
        c.opt.lse = {nullptr, 24};
      },
      "lse is given with 24 values and a null data pointer, expected a buffer (or nullptr for no lse)");
  if constexpr (has_scores) {
    // scores: exactly q.batch x q.heads x q.seq x k.seq = 96 values.
    expect_error<TestType>([](call& c) { c.opt.scores = {c.scores.data(), 95}; },
                           "scores has 95 values, expected 96 (q.batch x q.heads x q.seq x k.seq)");
    expect_error<TestType>([](call& c) { c.opt.scores = {c.scores.data(), 24}; },
                           "scores has 24 values, expected 96 (q.batch x q.heads x q.seq x k.seq)");
  }
  {
    call c;  // nullptr: no lse, no scores; out is still written
    c.opt.lse = nullptr;
    c.opt.scores = nullptr;
    CHECK_FALSE(c.opt.lse.given());
    posenc::attention<TestType>(c.qv, c.kv, c.vv, c.ov, posenc::none{}, c.opt);
    for (float x : c.lse) CHECK(x == 42.0f);
    CHECK(c.out[0] != 42.0f);
  }
  {
    call c;  // {data, size} of the right size is written like the container
    no_scores(c);
    std::vector<float> lse2(c.lse.size() + 4, 7.0f);
    c.opt.lse = {lse2.data() + 2, static_cast<index_t>(c.lse.size())};
    posenc::attention<TestType>(c.qv, c.kv, c.vv, c.ov, posenc::none{}, c.opt);
    CHECK(lse2[0] == 7.0f);
    CHECK(lse2[1] == 7.0f);
    CHECK(lse2[lse2.size() - 2] == 7.0f);
    CHECK(lse2[lse2.size() - 1] == 7.0f);
    for (std::size_t i = 2; i < lse2.size() - 2; ++i) CHECK(std::isfinite(lse2[i]));
  }
}

TEST_CASE("multi_head_attention errors: a given lse beside the saved state has the saved lse's size", "[errors]") {
  posenc::multi_head_attention<posenc::none, float> mha({8, 2, 1, 4, 4}, {});
  std::vector<float> x = posenc_test::random_vector<float>(2 * 3 * 8, 4), y(2 * 3 * 8, 42.0f);
  auto xv = posenc::make_bsd<const float>(x.data(), 2, 3, 8);
  posenc::multi_head_attention<posenc::none, float>::saved s;
  posenc::attention_options<float> opt;
  std::vector<float> lse(2 * 2 * 3 - 1, 42.0f);
  opt.lse = lse;
  REQUIRE_THROWS_WITH(mha.forward(xv, posenc::make_bsd(y.data(), 2, 3, 8), opt, s),
                      posenc_test::contains("posenc::multi_head_attention: opt.lse has 11 values, expected 12 "
                                            "(batch x q_heads x seq)"));
  for (float t : y) CHECK(t == 42.0f);
  for (float t : lse) CHECK(t == 42.0f);
  lse.push_back(42.0f);
  opt.lse = lse;
  mha.forward(xv, posenc::make_bsd(y.data(), 2, 3, 8), opt, s);
  REQUIRE(s.lse.size() == lse.size());
  for (std::size_t i = 0; i < lse.size(); ++i) CHECK(lse[i] == s.lse[i]);
}
