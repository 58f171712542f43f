// SPDX-License-Identifier: MIT
// rope<T>: every bad argument throws posenc::error naming it, and leaves the output untouched.
#include <posenc/encoding/rope.hpp>

#include <cmath>
#include <limits>
#include <vector>

#include "support/catch.hpp"
#include "support/random.hpp"

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
    REQUIRE_THROWS_WITH(r.rotate(x, position_span(10), 12), contains("length is 12, expected >= 13"));
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
    REQUIRE_THROWS_WITH(r.cos_sin(5, 5, c.data(), s.data()), contains("length is 5, expected > 5"));
    rope<float> m = r;
    REQUIRE_THROWS_WITH(m.reserve(-1), contains("positions is -1"));
    REQUIRE_THROWS_WITH(m.set_threads(-2), contains("threads is -2"));
  }
}
