// SPDX-License-Identifier: MIT
// rope<T>: every bad argument throws posenc::error naming it, and leaves the output untouched.
#include <posenc/encoding/rope.hpp>

#include <cmath>
#include <limits>
#include <vector>

#include "support/catch.hpp"
#include "support/random.hpp"

namespace errors_rope_tests {

using posenc::index_t;
using posenc::position_span;
using posenc::rope;
using posenc::rope_layout;
using posenc::rope_options;
using posenc::rope_scaling;
using posenc_test::contains;

namespace {
rope_options with_rotary(index_t r) {
  rope_options o;
  o.rotary_dim = r;
  return o;
}
rope_options with_base(double b) {
  rope_options o;
  o.base = b;
  return o;
}
rope_options with_scaling(rope_scaling s) {
  rope_options o;
  o.scaling = std::move(s);
  return o;
}
}  // namespace

TEST_CASE("rope errors: constructor parameters", "[rope][errors]") {
  auto const H = rope_layout::half_split;
  REQUIRE_THROWS_WITH(rope<float>(H, 64, with_rotary(7)), contains("rotary_dim is 7, expected an even number"));
  REQUIRE_THROWS_WITH(rope<float>(H, 64, with_rotary(0)), contains("rotary_dim is 0"));
  REQUIRE_THROWS_WITH(rope<float>(H, 64, with_rotary(-2)), contains("rotary_dim is -2"));
  REQUIRE_THROWS_WITH(rope<float>(H, 7), contains("rotary_dim is 7"));  // default r = head_dim, odd
  REQUIRE_THROWS_WITH(rope<float>(H, 64, with_rotary(66)), contains("rotary_dim is 66, expected <= head_dim (64)"));
  REQUIRE_THROWS_WITH(rope<float>(H, 0), contains("head_dim is 0"));
  REQUIRE_THROWS_WITH(rope<float>(static_cast<rope_layout>(7), 64), contains("layout is 7"));
  for (double b : {1.0, 0.5, -3.0, std::numeric_limits<double>::infinity(), std::nan("")})
    REQUIRE_THROWS_WITH(rope<float>(H, 64, with_base(b)), contains("posenc::rope: base is"));
  rope_options t;
  t.threads = -1;
  REQUIRE_THROWS_WITH(rope<float>(H, 64, t), contains("threads is -1"));
  REQUIRE_THROWS_AS(rope<float>(H, 64, with_rotary(7)), posenc::error);
}

TEST_CASE("rope errors: scaling parameters", "[rope][errors]") {
  auto const H = rope_layout::interleaved;
  double const inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  for (double f : {0.0, -1.0, inf, nan}) {
    REQUIRE_THROWS_WITH(rope<float>(H, 64, with_scaling(rope_scaling::linear(f))), contains("scaling.factor is"));
    REQUIRE_THROWS_WITH(rope<float>(H, 64, with_scaling(rope_scaling::dynamic_ntk(f, 2048))), contains("scaling.factor is"));
    REQUIRE_THROWS_WITH(rope<float>(H, 64, with_scaling(rope_scaling::yarn(f, 4096))), contains("scaling.factor is"));
    REQUIRE_THROWS_WITH(rope<float>(H, 64, with_scaling(rope_scaling::llama3(f, 1, 4, 8192))), contains("scaling.factor is"));
  }
  // factor < 1 is allowed (docs/formulas.md 3.7)
  REQUIRE_NOTHROW(rope<float>(H, 64, with_scaling(rope_scaling::linear(0.5))));
  REQUIRE_NOTHROW(rope<float>(H, 64, with_scaling(rope_scaling::yarn(0.5, 4096))));
  REQUIRE_THROWS_WITH(rope<float>(H, 64, with_scaling(rope_scaling::llama3(8, 4, 4, 8192))),
                      contains("scaling.low_freq_factor is 4, expected < high_freq_factor (4)"));
  REQUIRE_THROWS_WITH(rope<float>(H, 64, with_scaling(rope_scaling::llama3(8, 5, 4, 8192))),
                      contains("scaling.low_freq_factor is 5"));
  REQUIRE_THROWS_WITH(rope<float>(H, 64, with_scaling(rope_scaling::yarn(8, 0))),
                      contains("scaling.original_max_position_embeddings is 0, expected > 0 (yarn"));
  REQUIRE_THROWS_WITH(rope<float>(H, 64, with_scaling(rope_scaling::llama3(8, 1, 4, 0))),
                      contains("scaling.original_max_position_embeddings is 0"));
  REQUIRE_THROWS_WITH(rope<float>(H, 64, with_scaling(rope_scaling::dynamic_ntk(2, 0))),
                      contains("scaling.max_position_embeddings is 0"));
  REQUIRE_THROWS_WITH(rope<float>(H, 2, with_scaling(rope_scaling::dynamic_ntk(2, 2048))),
                      contains("rotary_dim is 2, expected > 2 for dynamic"));
  std::vector<double> ok(32, 1.0), shorter(31, 1.0), bad(32, 1.0);
  bad[3] = 0.0;
  REQUIRE_NOTHROW(rope<float>(H, 64, with_scaling(rope_scaling::longrope(ok, ok, 4096, 131072))));
  REQUIRE_THROWS_WITH(rope<float>(H, 64, with_scaling(rope_scaling::longrope(shorter, ok, 4096, 131072))),
                      contains("scaling.short_factor has 31 values, expected 32 (rotary_dim / 2)"));
  REQUIRE_THROWS_WITH(rope<float>(H, 64, with_scaling(rope_scaling::longrope(ok, shorter, 4096, 131072))),
                      contains("scaling.long_factor has 31 values, expected 32"));
  REQUIRE_THROWS_WITH(rope<float>(H, 64, with_scaling(rope_scaling::longrope(ok, bad, 4096, 131072))),
                      contains("scaling.long_factor[3] is 0"));
  REQUIRE_THROWS_WITH(rope<float>(H, 64, with_scaling(rope_scaling::longrope(ok, ok, 0, 131072))),
                      contains("scaling.original_max_position_embeddings is 0"));
  auto y = rope_scaling::yarn(8, 4096);
  y.attention_factor = -1.0;
  REQUIRE_THROWS_WITH(rope<float>(H, 64, with_scaling(y)), contains("scaling.attention_factor is -1"));
  y = rope_scaling::yarn(8, 4096);
  y.beta_fast = 0;
  REQUIRE_THROWS_WITH(rope<float>(H, 64, with_scaling(y)), contains("scaling.beta_fast is 0"));
}

TEST_CASE("rope errors: Hugging Face parameters name the key", "[rope][errors][hf]") {
  using posenc::hf_rope_params;
  auto const H = rope_layout::half_split;
  REQUIRE_THROWS_WITH(rope<float>(H, 64, hf_rope_params{{"rope_type", "yarn"}, {"factor", 8.0}}),
                      contains("max_position_embeddings is missing"));
  REQUIRE_THROWS_WITH(rope<float>(H, 64, hf_rope_params{{"rope_type", "linear"}}), contains("factor is missing"));
  REQUIRE_THROWS_WITH(rope<float>(H, 64, hf_rope_params{{"rope_type", "linear"}, {"factor", "4"}}),
                      contains("factor is a string, expected"));
  REQUIRE_THROWS_WITH(rope<float>(H, 64, hf_rope_params{{"rope_type", "linear"}, {"factor", -4.0}}),
                      contains("factor is -4"));
  REQUIRE_THROWS_WITH(rope<float>(H, 64, hf_rope_params{{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                                                        {"high_freq_factor", 4.0}}),
                      contains("original_max_position_embeddings is missing"));
  REQUIRE_THROWS_WITH(rope<float>(H, 64, hf_rope_params{{"rope_type", "ntk-by-parts"}}),
                      contains("rope_type is \"ntk-by-parts\""));
  REQUIRE_THROWS_WITH(rope<float>(H, 64, hf_rope_params{{"rope_type", "linear"}, {"factr", 4.0}}),
                      contains("factr is not a known key"));
  REQUIRE_THROWS_WITH(rope<float>(H, 64, hf_rope_params{{"factor", 4.0}}), contains("rope_type is missing"));
  REQUIRE_THROWS_WITH(rope<float>(H, 64, hf_rope_params{{"rope_type", "yarn"}, {"factor", 8.0},
                                                        {"original_max_position_embeddings", 4096.5}}),
                      contains("original_max_position_embeddings is 4096.5, expected a positive integer"));
  REQUIRE_THROWS_WITH(rope<float>(H, 64, hf_rope_params{{"rope_type", "longrope"}, {"short_factor", {1.0, 2.0}},
                                                        {"long_factor", {1.0, 2.0}}, {"max_position_embeddings", 4096}}),
                      contains("scaling.short_factor has 2 values, expected 32"));
  REQUIRE_THROWS_WITH(rope<float>(H, 64, hf_rope_params{{"rope_type", "longrope"}, {"short_factor", 3.0}}),
                      contains("short_factor is a number, expected a list"));
  REQUIRE_THROWS_WITH(rope<float>(H, 64, hf_rope_params{{"partial_rotary_factor", 0.01}}), contains("rotary_dim is 0"));
}

TEST_CASE("rope errors: views, positions, lengths and caches; outputs untouched", "[rope][errors]") {
  rope<float> const r(rope_layout::half_split, 16, with_rotary(8));
  auto const orig = posenc_test::random_vector<float>(2 * 3 * 4 * 16, 1);
  auto buf = orig;
  auto x = posenc::make_bshd(buf.data(), 2, 3, 4, 16);
  auto untouched = [&] { return buf == orig; };

  SECTION("negative positions") {
    REQUIRE_THROWS_WITH(r.rotate(x, position_span(-1)), contains("pos position of batch 0 token 0 is -1, expected >= 0"));
    std::vector<index_t> firsts = {0, -5};
    REQUIRE_THROWS_WITH(r.rotate(x, position_span::per_batch(firsts)), contains("batch 1 token 0 is -5"));
    std::vector<index_t> ids = {0, 1, 2, 3, -4, 5};
    REQUIRE_THROWS_WITH(r.rotate(x, position_span::ids(ids.data(), 2, 3)), contains("batch 1 token 1 is -4"));
    REQUIRE(untouched());
  }
  SECTION("position ids of the wrong shape") {
    std::vector<index_t> ids = {0, 1, 2, 3};
    REQUIRE_THROWS_WITH(r.rotate(x, position_span::ids(ids.data(), 2, 2)), contains("pos seq is 2, expected 3"));
    REQUIRE(untouched());
  }
  SECTION("non-contiguous last dim") {
    auto bad = x;
    bad.dim_stride = 2;
    bad.dim = 16;
    REQUIRE_THROWS_WITH(r.rotate(bad, position_span(0)), contains("x.dim_stride is 2, expected 1"));
    REQUIRE(untouched());
  }
  SECTION("view head_dim != rope head_dim") {
    auto bad = posenc::make_bshd(buf.data(), 2, 3, 8, 8);
    REQUIRE_THROWS_WITH(r.rotate(bad, position_span(0)), contains("x.dim is 8, expected 16 (rope head_dim)"));
    REQUIRE(untouched());
  }
  SECTION("length below the largest position + 1") {
    REQUIRE_THROWS_WITH(r.rotate(x, position_span(10), 12), contains("length is 12, expected 13 .. 9007199254740992"));
    REQUIRE_THROWS_WITH(r.rotate_inverse(x, position_span(0), -1), contains("length is -1"));
    REQUIRE(untouched());
  }
  SECTION("out-of-place shape mismatch; q/k mismatch") {
    std::vector<float> o(2 * 3 * 4 * 16, 7.0f);
    auto out = posenc::make_bshd(o.data(), 2, 3, 2, 16);
    REQUIRE_THROWS_WITH(r.rotate_copy(x, out, position_span(0)), contains("out.heads is 2, expected 4 (in.heads)"));
    CHECK(o == std::vector<float>(o.size(), 7.0f));
    auto k = posenc::make_bshd(o.data(), 2, 2, 2, 16);
    REQUIRE_THROWS_WITH(r.rotate_qk(x, k, position_span(0)), contains("k.seq is 2, expected 3 (q.seq)"));
    CHECK(o == std::vector<float>(o.size(), 7.0f));
    REQUIRE(untouched());
  }
  SECTION("caches: too short, wrong width, wrong kind, wrong grid, null") {
    std::vector<float> c(10 * 4, 0.5f), s(10 * 4, 0.5f);
    auto pos = position_span(8);  // positions 8..10
    REQUIRE_THROWS_WITH(r.rotate(x, pos, posenc::rope_cache<float>::by_position(c.data(), s.data(), 10, 4)),
                        contains("cache.rows is 10, expected > 10 (the largest position id)"));
    REQUIRE_THROWS_WITH(r.rotate(x, position_span(0), posenc::rope_cache<float>::by_position(c.data(), s.data(), 5, 8)),
                        contains("cache.width is 8, expected 4 (rotary_dim / 2)"));
    REQUIRE_THROWS_WITH(r.rotate(x, posenc::rope_cache<float>::by_position(c.data(), s.data(), 10, 4)),
                        contains("cache is by position, expected a per-token cache"));
    REQUIRE_THROWS_WITH(r.rotate(x, position_span(0), posenc::rope_cache<float>::per_token(c.data(), s.data(), 2, 3, 4)),
                        contains("cache is per token, expected a cache by position"));
    REQUIRE_THROWS_WITH(r.rotate(x, posenc::rope_cache<float>::per_token(c.data(), s.data(), 2, 4, 4)),
                        contains("cache is (2, 4) tokens, expected (2, 3)"));
    REQUIRE_THROWS_WITH(r.rotate(x, position_span(0), posenc::rope_cache<float>::by_position(nullptr, s.data(), 10, 4)),
                        contains("cache.cos or cache.sin is null"));
    REQUIRE(untouched());
  }
  SECTION("cos_sin, reserve, set_threads") {
    std::vector<float> c(4), s(4);
    REQUIRE_THROWS_WITH(r.cos_sin(-1, 5, c.data(), s.data()), contains("position is -1"));
    REQUIRE_THROWS_WITH(r.cos_sin(5, 5, c.data(), s.data()), contains("length is 5, expected 5 < length <= 9007199254740992"));
    rope<float> m = r;
    REQUIRE_THROWS_WITH(m.reserve(-1), contains("positions is -1"));
    REQUIRE_THROWS_WITH(m.set_threads(-2), contains("threads is -2"));
  }
}

TEST_CASE("rope errors: sizes, positions and lengths never overflow index_t", "[rope][errors]") {
  index_t const big = std::numeric_limits<index_t>::max();
  rope<float> r(rope_layout::half_split, 16, with_rotary(8));
  // 2^58 + 1 rows of 8 values: 2^61 + 8 values, 2^63 + 32 bytes.
  REQUIRE_THROWS_WITH(r.reserve((index_t(1) << 58) + 1),
                      contains("posenc::rope::reserve: positions is 288230376151711745, expected 0 .. 9007199254740992"));
  // Within max_positions() but positions * rotary_dim * sizeof(T) overflows.
  rope<double> wide(rope_layout::half_split, 1 << 12);
  REQUIRE_THROWS_WITH(wide.reserve(index_t(1) << 53),
                      contains("positions is 9007199254740992, expected <= 281474976710655 (the table holds positions"));
  REQUIRE(r.reserved() == 0);
  REQUIRE(wide.reserved() == 0);

  auto const orig = posenc_test::random_vector<float>(2 * 3 * 4 * 16, 3);
  auto buf = orig;
  auto x = posenc::make_bshd(buf.data(), 2, 3, 4, 16);
  // An offset whose last token would pass index_t's maximum (first + s overflowed, and length =
  // max + 1 too): rejected by the position range every span checks (position_limit = 2^60).
  REQUIRE_THROWS_WITH(r.rotate(x, position_span(big - 1)),
                      contains("pos offset is 9223372036854775806, expected |offset| <= 1152921504606846976"));
  // Inside position_limit but past RoPE's own range (max_positions() = 2^53).
  REQUIRE_THROWS_WITH(r.rotate(x, position_span(index_t(1) << 54)),
                      contains("pos position of batch 0 token 0 is 18014398509481984, expected <= 9007199254740989"));
  std::vector<index_t> firsts = {0, big};
  REQUIRE_THROWS_WITH(r.rotate(x, position_span::per_batch(firsts), 10),
                      contains("pos offset of batch 1 is 9223372036854775807, expected |offset| <= 1152921504606846976"));
  std::vector<index_t> firsts_past_rope = {0, index_t(1) << 54};
  REQUIRE_THROWS_WITH(r.rotate(x, position_span::per_batch(firsts_past_rope), 10),
                      contains("pos position of batch 1 token 0 is 18014398509481984"));
  std::vector<index_t> ids = {0, 1, 2, 3, big, 5};
  REQUIRE_THROWS_WITH(r.rotate(x, position_span::ids(ids.data(), 2, 3)),
                      contains("pos position of batch 1 token 1 is 9223372036854775807, expected |position| <= 1152921504606846976"));
  std::vector<index_t> ids_past_rope = {0, 1, 2, 3, index_t(1) << 54, 5};
  REQUIRE_THROWS_WITH(r.rotate(x, position_span::ids(ids_past_rope.data(), 2, 3)),
                      contains("pos position of batch 1 token 1 is 18014398509481984, expected < 9007199254740992"));
  REQUIRE_THROWS_WITH(r.rotate(x, position_span(0), big), contains("length is 9223372036854775807, expected 3 .. "));
  std::vector<float> c(4), s(4);
  REQUIRE_THROWS_WITH(r.cos_sin(big, big, c.data(), s.data()), contains("position is 9223372036854775807"));
  REQUIRE_THROWS_WITH(r.cos_sin(0, big, c.data(), s.data()), contains("length is 9223372036854775807"));
  // A cache whose rows * width wraps around to a small number.
  REQUIRE_THROWS_WITH(
      r.rotate(x, position_span(0), posenc::rope_cache<float>::by_position(nullptr, nullptr, (index_t(1) << 62) + 1, 4)),
      contains("cache.rows is 4611686018427387905, expected <= 2305843009213693951"));
  REQUIRE(buf == orig);
}

TEST_CASE("rope errors: positions at or past max_positions() (cos/sin lose their accuracy bound)", "[rope][errors]") {
  rope<float> const r(rope_layout::interleaved, 8);
  index_t const lim = index_t(1) << 53;
  REQUIRE(r.max_positions() == lim);
  auto const orig = posenc_test::random_vector<float>(1 * 2 * 1 * 8, 4);
  auto buf = orig;
  auto x = posenc::make_bshd(buf.data(), 1, 2, 1, 8);
  REQUIRE_THROWS_WITH(r.rotate(x, position_span(lim - 1)),
                      contains("pos position of batch 0 token 0 is 9007199254740991, expected <= 9007199254740990"));
  std::vector<index_t> ids = {3, lim};
  REQUIRE_THROWS_WITH(r.rotate(x, position_span::ids(ids.data(), 1, 2)),
                      contains("pos position of batch 0 token 1 is 9007199254740992, expected < 9007199254740992"));
  REQUIRE(buf == orig);
  REQUIRE_NOTHROW(r.rotate(x, position_span(lim - 2)));
  // A frequency above 1 lowers the limit: the angle p * theta'_0 stays below 2^53.
  rope<float> const fast(rope_layout::interleaved, 8, with_scaling(rope_scaling::linear(0.5)));
  REQUIRE(fast.max_positions() == lim / 2);
  std::vector<float> c(4), s(4);
  REQUIRE_THROWS_WITH(fast.cos_sin(lim / 2, lim / 2 + 1, c.data(), s.data()),
                      contains("position is 4503599627370496, expected 0 .. 4503599627370495"));
}

TEST_CASE("rope errors: derived scaling values are finite, normal and positive", "[rope][errors]") {
  using posenc::hf_rope_params;
  auto const H = rope_layout::half_split;
  std::vector<double> ones(32, 1.0);
  SECTION("denormal inputs (YaRN betas, factors)") {
    auto y = rope_scaling::yarn(8, 4096);
    y.beta_fast = 1e-310;
    REQUIRE_THROWS_WITH(rope<float>(H, 64, with_scaling(y)), contains("scaling.beta_fast is 1e-310, expected a finite normal"));
    y = rope_scaling::yarn(8, 4096);
    y.beta_slow = 4e-320;
    REQUIRE_THROWS_WITH(rope<float>(H, 64, with_scaling(y)), contains("scaling.beta_slow is"));
    REQUIRE_THROWS_WITH(rope<float>(H, 64, hf_rope_params{{"rope_type", "yarn"}, {"factor", 8.0},
                                                          {"original_max_position_embeddings", 4096}, {"beta_fast", 1e-310}}),
                        contains("beta_fast is 1e-310, expected a finite normal number > 0"));
    REQUIRE_THROWS_WITH(rope<float>(H, 64, with_scaling(rope_scaling::linear(1e-310))), contains("scaling.factor is 1e-310"));
  }
  SECTION("YaRN correction range: low < high") {
    rope_options o = with_scaling(rope_scaling::yarn(8, 4096));  // r = 8, base 2: lo = 17, hi = 7
    o.base = 2;
    REQUIRE_THROWS_WITH(rope<float>(H, 8, o), contains("posenc::rope: yarn correction range is (17, 7), expected finite bounds with low < high"));
    REQUIRE_THROWS_WITH(rope<float>(H, 8, hf_rope_params{{"rope_type", "yarn"}, {"factor", 8.0}, {"rope_theta", 2.0},
                                                         {"original_max_position_embeddings", 4096}}),
                        contains("yarn correction range is (17, 7)"));
    auto y = rope_scaling::yarn(8, 4096);  // betas swapped
    y.beta_fast = 1;
    y.beta_slow = 32;
    REQUIRE_THROWS_WITH(rope<float>(H, 64, with_scaling(y)), contains("yarn correction range is (22, 11)"));
  }
  SECTION("YaRN mscale: zero denominator, negative attention factor") {
    // g(s, mscale_all_dim) = 0.1 * mscale_all_dim * ln(s) + 1 == 0 up to rounding.
    double const s = 8, m = -10.0 / std::log(8.0);
    REQUIRE(std::abs(posenc::yarn_get_mscale(s, m)) < 1e-15);
    auto y = rope_scaling::yarn(s, 4096);
    y.mscale = 1.0;
    y.mscale_all_dim = m;
    REQUIRE_THROWS_WITH(rope<float>(H, 64, with_scaling(y)), contains("scaling.mscale_all_dim is"));
    REQUIRE_THROWS_WITH(rope<float>(H, 64, with_scaling(y)), contains("it divides the attention factor"));
    y = rope_scaling::yarn(8, 4096);
    y.mscale = -20.0;
    y.mscale_all_dim = 1.0;
    REQUIRE_THROWS_WITH(rope<float>(H, 64, with_scaling(y)), contains("attention factor is -2.6"));
    REQUIRE_THROWS_WITH(rope<float>(H, 64, hf_rope_params{{"rope_type", "yarn"}, {"factor", 8.0}, {"mscale", -20.0},
                                                          {"mscale_all_dim", 1.0}, {"original_max_position_embeddings", 4096}}),
                        contains("attention factor is -2.6"));
  }
  SECTION("an attention factor whose square or inverse square is not a normal T") {
    for (double a : {1e20, 1e-20}) {
      auto y = rope_scaling::yarn(8, 4096);
      y.attention_factor = a;
      REQUIRE_THROWS_WITH(rope<float>(H, 64, with_scaling(y)), contains("attention factor is "));
      REQUIRE_THROWS_WITH(rope<float>(H, 64, with_scaling(y)), contains("(a^2 and 1 / a^2 must be normal float values)"));
      REQUIRE_NOTHROW(rope<double>(H, 64, with_scaling(y)));
    }
    auto l = rope_scaling::longrope(ones, ones, 4096, 131072);
    l.attention_factor = 1e200;
    REQUIRE_THROWS_WITH(rope<double>(H, 64, with_scaling(l)), contains("attention factor is 1e+200"));
  }
  SECTION("LongRoPE with original length 1 (ln 1 = 0 divides)") {
    REQUIRE_THROWS_WITH(rope<float>(H, 64, with_scaling(rope_scaling::longrope(ones, ones, 1, 4))),
                        contains("scaling.original_max_position_embeddings is 1, expected >= 2"));
    REQUIRE_THROWS_WITH(rope<float>(H, 64, hf_rope_params{{"rope_type", "longrope"}, {"short_factor", ones},
                                                          {"long_factor", ones}, {"original_max_position_embeddings", 1},
                                                          {"max_position_embeddings", 4}}),
                        contains("original_max_position_embeddings is 1, expected >= 2"));
    auto given = rope_scaling::longrope(ones, ones, 1, 4);
    given.attention_factor = 1.5;  // nothing divides by ln(L0)
    REQUIRE_NOTHROW(rope<float>(H, 64, with_scaling(given)));
  }
  SECTION("Llama 3 wavelength bounds") {
    REQUIRE_THROWS_WITH(rope<float>(H, 64, with_scaling(rope_scaling::llama3(8, 1e-305, 4, 8192))),
                        contains("scaling.low_freq_factor is 1e-305, expected original_max_position_embeddings (8192) / "
                                 "low_freq_factor, the low-frequency wavelength bound, to be finite"));
    REQUIRE_THROWS_WITH(rope<float>(H, 64, hf_rope_params{{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1e-305},
                                                          {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}}),
                        contains("low_freq_factor is 1e-305"));
    REQUIRE_THROWS_WITH(rope<float>(H, 64, with_scaling(rope_scaling::llama3(8, 1e-305, 2e-305, 8192))),
                        contains("scaling.high_freq_factor is 2e-305"));
  }
  SECTION("frequencies: finite, normal, below 2^53; dynamic NTK at the longest length") {
    REQUIRE_THROWS_WITH(rope<float>(H, 64, with_scaling(rope_scaling::linear(1e-300))),
                        contains("at length 0, expected a finite normal number > 0 and < 2^53"));
    REQUIRE_THROWS_WITH(rope<float>(H, 64, with_scaling(rope_scaling::linear(1e305))), contains("frequency theta'_22 is"));
    std::vector<double> tiny = ones;
    tiny[5] = 1e-300;
    REQUIRE_THROWS_WITH(rope<float>(H, 64, with_scaling(rope_scaling::longrope(ones, tiny, 4096, 131072))),
                        contains("frequency theta'_5 is"));
    rope_options o = with_scaling(rope_scaling::dynamic_ntk(2, 2048));
    o.base = 1e305;
    REQUIRE_THROWS_WITH(rope<float>(H, 64, o), contains("frequency theta'_31 is"));
    REQUIRE_THROWS_WITH(rope<float>(H, 64, o), contains("at length 9007199254740992"));
    REQUIRE_THROWS_WITH(rope<float>(H, 64, hf_rope_params{{"rope_type", "dynamic"}, {"factor", 2.0}, {"rope_theta", 1e305},
                                                          {"max_position_embeddings", 2048}}),
                        contains("frequency theta'_31 is"));
    o.base = 1e300;
    REQUIRE_NOTHROW(rope<float>(H, 64, o));
  }
}

TEST_CASE("rope errors: Hugging Face keys hold their kind even when the rule ignores them", "[rope][errors][hf]") {
  using posenc::hf_rope_params;
  auto const H = rope_layout::half_split;
  REQUIRE_THROWS_WITH(rope<float>(H, 64, hf_rope_params{{"rope_type", "linear"}, {"factor", 4.0}, {"beta_fast", "fast"}}),
                      contains("posenc::rope_options_from_hf: beta_fast is a string, expected a number"));
  REQUIRE_THROWS_WITH(rope<float>(H, 64, hf_rope_params{{"truncate", 1.0}}),
                      contains("truncate is a number, expected true or false"));
  REQUIRE_THROWS_WITH(rope<float>(H, 64, hf_rope_params{{"rope_type", "dynamic"}, {"factor", 2.0},
                                                        {"max_position_embeddings", 2048}, {"short_factor", 2.0}}),
                      contains("short_factor is a number, expected a list of numbers"));
  REQUIRE_THROWS_WITH(rope<float>(H, 64, hf_rope_params{{"rope_type", "default"}, {"type", 3.0}}),
                      contains("type is a number, expected a string"));
  REQUIRE_THROWS_WITH(rope<float>(H, 64, hf_rope_params{{"rope_type", "linear"}, {"factor", 4.0}, {"mscale", true}}),
                      contains("mscale is a bool, expected a number"));
  REQUIRE_NOTHROW(rope<float>(H, 64, hf_rope_params{{"rope_type", "linear"}, {"factor", 4.0}, {"beta_fast", 32.0}}));
}
}  // namespace errors_rope_tests
