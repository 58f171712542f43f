// SPDX-License-Identifier: MIT
// Sizes, offsets and positions that would overflow index_t, null masks with extents, and
// kv_cache::append's strong guarantee: each is an error before anything is allocated or written.
#include <posenc/attention/attention.hpp>
#include <posenc/attention/kv_cache.hpp>
#include <posenc/core/aligned_buffer.hpp>
#include <posenc/core/checked.hpp>
#include <posenc/core/positions.hpp>
#include <posenc/core/view.hpp>
#include <posenc/encoding/absolute_common.hpp>
#include <posenc/encoding/alibi.hpp>
#include <posenc/encoding/clipped_bias.hpp>
#include <posenc/encoding/learned.hpp>
#include <posenc/encoding/none.hpp>
#include <posenc/encoding/rope.hpp>
#include <posenc/encoding/shaw.hpp>
#include <posenc/encoding/sinusoidal.hpp>
#include <posenc/encoding/t5_bias.hpp>

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/fake_encoders.hpp"
#include "support/random.hpp"

namespace errors_overflow_tests {

using posenc::index_t;

namespace {

// Read through a volatile: the compiler cannot propagate the huge values into
// the code past the checks and warn about loops that never run.
index_t opaque(index_t x) {
  volatile index_t v = x;
  return v;
}
index_t const big = opaque(index_t{1} << 62);
index_t const max_index = opaque(std::numeric_limits<index_t>::max());
index_t const lim = opaque(posenc::position_limit);

/// A valid attention call (B=2, Sq=3, Sk=4, Hq=Hkv=2, D=Dv=4) that a test breaks in one place.
struct call {
  std::vector<float> q = posenc_test::random_vector<float>(2 * 3 * 2 * 4, 1);
  std::vector<float> k = posenc_test::random_vector<float>(2 * 4 * 2 * 4, 2);
  std::vector<float> v = posenc_test::random_vector<float>(2 * 4 * 2 * 4, 3);
  std::vector<float> out = std::vector<float>(2 * 3 * 2 * 4, 42.0f);
  posenc::view<const float> qv = posenc::make_bshd<const float>(q.data(), 2, 3, 2, 4);
  posenc::view<const float> kv = posenc::make_bshd<const float>(k.data(), 2, 4, 2, 4);
  posenc::view<const float> vv = posenc::make_bshd<const float>(v.data(), 2, 4, 2, 4);
  posenc::view<float> ov = posenc::make_bshd(out.data(), 2, 3, 2, 4);
  posenc::attention_options<float> opt;
  bool untouched() const {
    for (float x : out)
      if (x != 42.0f) return false;
    return true;
  }
};

/// Breaks a valid call, runs it on every path and checks the message and that out is untouched.
template <class E = posenc::none>
void expect_attention_error(std::function<void(call&)> const& breaker, std::string const& message, E const& enc = {}) {
  INFO("expected message containing: " << message);
  {
    call c;
    breaker(c);
    REQUIRE_THROWS_WITH(posenc::attention<posenc::path::reference>(c.qv, c.kv, c.vv, c.ov, enc, c.opt),
                        posenc_test::contains("posenc::attention: " + message));
    CHECK(c.untouched());
  }
  {
    call c;
    breaker(c);
    REQUIRE_THROWS_WITH(posenc::attention<posenc::path::materialized>(c.qv, c.kv, c.vv, c.ov, enc, c.opt),
                        posenc_test::contains("posenc::attention: " + message));
    CHECK(c.untouched());
  }
  {
    call c;
    breaker(c);
    REQUIRE_THROWS_WITH(posenc::attention<posenc::path::fused>(c.qv, c.kv, c.vv, c.ov, enc, c.opt),
                        posenc_test::contains("posenc::attention: " + message));
    CHECK(c.untouched());
  }
}

}  // namespace

TEST_CASE("checked arithmetic reports the expression and its operands", "[errors]") {
  using posenc::detail::checked_add;
  using posenc::detail::checked_mul;
  using posenc::detail::checked_sub;
  CHECK(checked_mul("posenc::f", 3, -4, "a x b") == -12);
  CHECK(checked_mul("posenc::f", max_index, 1, "a x b") == max_index);
  CHECK(checked_mul("posenc::f", std::numeric_limits<index_t>::min(), 1, "a x b") ==
        std::numeric_limits<index_t>::min());
  CHECK(checked_add("posenc::f", max_index - 1, 1, "a + b") == max_index);
  CHECK(checked_sub("posenc::f", -max_index, 1, "a - b") == std::numeric_limits<index_t>::min());
  REQUIRE_THROWS_WITH(checked_mul("posenc::f", big, 2, "x.heads x x.dim"),
                      "posenc::f: x.heads x x.dim is 4611686018427387904 x 2, expected a product that fits "
                      "index_t (|x| <= 9223372036854775807)");
  REQUIRE_THROWS_WITH(checked_add("posenc::f", max_index, 1, "offset + ", "seq"),
                      posenc_test::contains("posenc::f: offset + seq is 9223372036854775807 + 1, expected a sum"));
  REQUIRE_THROWS_WITH(checked_sub("posenc::f", std::numeric_limits<index_t>::min(), 1, "p - w"),
                      posenc_test::contains("expected a difference that fits index_t"));
  REQUIRE_THROWS_WITH(checked_mul("posenc::f", -big, 4, "a x b"), posenc_test::contains("a x b is"));
}

TEST_CASE("sizes that overflow index_t are rejected before any allocation", "[errors]") {
  SECTION("attention views: the element count wraps to 0 with a null data pointer") {
    expect_attention_error([](call& c) { c.qv = posenc::view<const float>{nullptr, 1, 1, big, 4, 0, 0, 4, 1}; },
                           "q.batch x q.seq x q.heads x q.dim is 4611686018427387904 x 4, expected a product");
    expect_attention_error([](call& c) { c.kv = posenc::make_bshd<const float>(nullptr, 2, big, 2, 4); },
                           "k.batch x k.seq is 2 x 4611686018427387904");
    expect_attention_error([](call& c) { c.ov = posenc::make_bhsd<float>(nullptr, 2, big, 3, 4); },
                           "out.batch x out.seq x out.heads is 6 x 4611686018427387904");
  }
  SECTION("attention views: the largest strided offset") {
    expect_attention_error([](call& c) { c.kv.seq_stride = big; }, "(k.seq - 1) x |k.seq_stride| is 3 x ");
    expect_attention_error([](call& c) { c.vv.batch_stride = std::numeric_limits<index_t>::min(); },
                           "(v.batch - 1) x |v.batch_stride| is 0 - -9223372036854775808");
    expect_attention_error(
        [](call& c) {
          c.qv.batch_stride = big;
          c.qv.head_stride = -big;
        },
        "the largest offset of q (batch, seq and head terms) is 4611686018427387920 + 4611686018427387904");
  }
  SECTION("attention: the Sq x Sk scores and the scores output") {
    expect_attention_error(
        [](call& c) {
          c.qv = posenc::view<const float>{nullptr, 2, lim, 2, 0, 0, 0, 0, 1};
          c.kv = posenc::view<const float>{nullptr, 2, lim, 2, 0, 0, 0, 0, 1};
          c.vv = posenc::view<const float>{nullptr, 2, lim, 2, 0, 0, 0, 0, 1};
          c.ov = posenc::view<float>{nullptr, 2, lim, 2, 0, 0, 0, 0, 1};
        },
        "q.seq x k.seq is 1152921504606846976 x 1152921504606846976, expected a product");
    std::vector<float> scores(4);
    expect_attention_error(
        [&](call& c) {
          c.qv = posenc::view<const float>{nullptr, 2, index_t{1} << 31, 2, 0, 0, 0, 0, 1};
          c.kv = posenc::view<const float>{nullptr, 2, index_t{1} << 31, 2, 0, 0, 0, 0, 1};
          c.vv = posenc::view<const float>{nullptr, 2, index_t{1} << 31, 2, 0, 0, 0, 0, 1};
          c.ov = posenc::view<float>{nullptr, 2, index_t{1} << 31, 2, 0, 0, 0, 0, 1};
          c.opt.scores = scores;
        },
        "scores size q.batch x q.heads x q.seq x k.seq is 8589934592 x 2147483648");
  }
  SECTION("masks: strides") {
    std::vector<float> m(2 * 2 * 3 * 4);
    static bool const bm[2 * 2 * 3 * 4] = {};
    expect_attention_error(
        [&](call& c) {
          c.opt.mask = posenc::make_mask<float>(m.data(), 2, 2, 3, 4);
          c.opt.mask.q_stride = big;
        },
        "(mask.q - 1) x |mask.q_stride| is 2 x 4611686018427387904");
    expect_attention_error(
        [&](call& c) {
          c.opt.bool_mask = posenc::make_mask<bool>(bm, 2, 2, 3, 4);
          c.opt.bool_mask.head_stride = max_index;
          c.opt.bool_mask.batch_stride = 1;
        },
        "the largest offset of bool_mask (batch and head terms) is 1 + 9223372036854775807");
  }
  SECTION("token views, learned and sinusoidal tables") {
    auto enc = posenc::learned<float>::random(8, 4, 1);
    posenc::token_view<float> x{nullptr, 2, big, 4, 0, 4, 1};
    REQUIRE_THROWS_WITH(enc.add_to(x, posenc::position_span(0)),
                        posenc_test::contains("posenc::learned::add_to: x.batch x x.seq is 2 x 4611686018427387904"));
    REQUIRE_THROWS_WITH(posenc::learned<float>::random(big, 4, 1),
                        posenc_test::contains("posenc::learned::random: rows x d_model is 4611686018427387904 x 4"));
    REQUIRE_THROWS_WITH(posenc::learned<float>::view_of({nullptr, 0}, big, 8),
                        posenc_test::contains("posenc::learned::view_of: rows x d_model is"));
    auto enc2 = posenc::learned<float>::random(8, 4, 1, 2);
    REQUIRE_THROWS_WITH(enc2.extended(max_index - 1),
                        posenc_test::contains("offset + new_positions is 2 + 9223372036854775806"));
    REQUIRE_THROWS_WITH(enc.extended(big), posenc_test::contains("(offset + new_positions) x d_model is"));
    REQUIRE_THROWS_WITH(enc.fill(0, big, {nullptr, 0}),
                        posenc_test::contains("posenc::learned::fill: count x d_model is 4611686018427387904 x 4"));
    posenc::sinusoidal<float> sin(8);
    REQUIRE_THROWS_WITH(sin.reserve(big),
                        posenc_test::contains("posenc::sinusoidal::reserve: positions x d_model is"));
    REQUIRE_THROWS_WITH(sin.fill(0, big, {nullptr, 0}),
                        posenc_test::contains("posenc::sinusoidal::fill: count x d_model is"));
    std::vector<float> two(16);
    REQUIRE_THROWS_WITH(sin.fill(max_index, 2, {two.data(), 16}),
                        posenc_test::contains("posenc::sinusoidal::fill: first_pos + count - 1 is 9223372036854775807 + 1"));
  }
  SECTION("aligned_buffer: n x sizeof(T) and its rounding to the alignment") {
    REQUIRE_THROWS_WITH(posenc::aligned_buffer<float>(big),
                        "posenc::aligned_buffer: n x sizeof(T) is 4611686018427387904 x 4, expected a product "
                        "that fits index_t (|x| <= 9223372036854775807)");
    REQUIRE_THROWS_WITH(posenc::aligned_buffer<char>(max_index - 10),
                        posenc_test::contains("n x sizeof(T) + alignment - 1 is 9223372036854775797 + 63"));
    REQUIRE_THROWS_WITH(posenc::aligned_buffer<double>::uninitialized(big),
                        posenc_test::contains("n x sizeof(T) is 4611686018427387904 x 8"));
  }
  SECTION("kv_cache: batch x capacity x kv_heads x dim") {
    REQUIRE_THROWS_WITH(posenc::kv_cache<float>(big, 4, 8),
                        posenc_test::contains("posenc::kv_cache: batch x capacity x kv_heads is"));
    posenc::kv_cache<float> cache(2, 2, 4, 8);
    REQUIRE_THROWS_WITH(cache.reserve(big),
                        posenc_test::contains("posenc::kv_cache::reserve: batch x capacity is 2 x 4611686018427387904"));
    REQUIRE_THROWS_WITH(cache.reserve(big / 8),
                        posenc_test::contains("batch x capacity x kv_heads x value_dim is"));
    REQUIRE_THROWS_WITH(cache.reserve(-1), posenc_test::contains("tokens is -1, expected >= 0"));
    CHECK(cache.keys().data == nullptr);
  }
  SECTION("relative bias and Shaw tables") {
    REQUIRE_THROWS_WITH(posenc::t5_bias<float>({big, true, 32, 128}, std::uint64_t{1}),
                        posenc_test::contains("posenc::t5_bias: num_buckets x heads is 32 x 4611686018427387904"));
    REQUIRE_THROWS_WITH(posenc::clipped_bias<float>(big, 2, std::uint64_t{1}),
                        posenc_test::contains("posenc::clipped_bias: 2 x max_distance is 2 x 4611686018427387904"));
    REQUIRE_THROWS_WITH(posenc::clipped_bias<float>(big / 2, 4, std::uint64_t{1}),
                        posenc_test::contains("(2 x max_distance + 1) x heads is 4611686018427387905 x 4"));
    REQUIRE_THROWS_WITH(posenc::shaw<float>(big, 8, posenc::shaw_terms::keys, 1),
                        posenc_test::contains("posenc::shaw: 2 x max_distance is"));
    REQUIRE_THROWS_WITH(posenc::shaw<float>(big / 4, 8, posenc::shaw_terms::keys, 1),
                        posenc_test::contains("posenc::shaw: table rows x columns is 2305843009213693953 x 8"));
    REQUIRE_THROWS_WITH(posenc::alibi<float>(posenc::alibi_form::paper, 4, posenc::head_shard{max_index - 1, 4}),
                        posenc_test::contains("posenc::alibi: shard.first + heads is 9223372036854775806 + 4"));
  }
  SECTION("position ids helpers: batch x seq") {
    std::vector<index_t> ids(4);
    REQUIRE_THROWS_WITH(posenc::fairseq_positions({ids.data(), 4}, big, 4, 1, {ids.data(), 4}),
                        posenc_test::contains("posenc::fairseq_positions: batch x seq is 4611686018427387904 x 4"));
    std::vector<float> mask(4);
    REQUIRE_THROWS_WITH(posenc::positions_from_mask<float>({mask.data(), 4}, 4, big, 1, {ids.data(), 4}),
                        posenc_test::contains("posenc::positions_from_mask: batch x total is 4 x"));
  }
}

TEST_CASE("kv_cache grows geometrically only while the doubled storage fits index_t", "[errors]") {
  using posenc::detail::kv_grown_capacity;
  index_t const max_index = std::numeric_limits<index_t>::max();
  // Ordinary growth: double, or exactly what is asked when that is more.
  CHECK(kv_grown_capacity(16, 17, 2, 4, 8) == 32);
  CHECK(kv_grown_capacity(16, 40, 2, 4, 8) == 40);
  CHECK(kv_grown_capacity(0, 1, 2, 4, 8) == 1);
  // 2 x cap itself overflows: exactly `tokens`.
  CHECK(kv_grown_capacity(max_index / 2 + 1, max_index / 2 + 2, 1, 1, 1) == max_index / 2 + 2);
  // 2 x cap fits, its storage does not (in each factor of batch x capacity x heads x dim).
  index_t const cap = index_t(1) << 59;
  CHECK(kv_grown_capacity(cap, cap + 1, 1, 1, 1) == 2 * cap);
  CHECK(kv_grown_capacity(cap, cap + 1, 8, 1, 1) == cap + 1);
  CHECK(kv_grown_capacity(cap, cap + 1, 1, 8, 1) == cap + 1);
  CHECK(kv_grown_capacity(cap, cap + 1, 1, 1, 8) == cap + 1);
  CHECK(kv_grown_capacity(cap, cap + 1, 2, 2, 1) == 2 * cap);
}

TEST_CASE("positions outside position_limit are rejected before any arithmetic on them", "[errors]") {
  SECTION("attention query positions: an offset near INT64_MAX no longer wraps and zeroes causal rows") {
    expect_attention_error(
        [](call& c) {
          c.opt.causal = true;
          c.opt.q_positions = posenc::position_span(max_index - 1);
        },
        "q_positions offset is 9223372036854775806, expected |offset| <= 1152921504606846976 (position_limit)");
    expect_attention_error([](call& c) { c.opt.q_positions = posenc::position_span(lim - 1); },
                           "q_positions last position is 1152921504606846975 + 2 (offset + seq - 1), expected <= "
                           "1152921504606846976 (position_limit)");
    expect_attention_error([](call& c) { c.opt.q_positions = posenc::position_span(-lim - 1); },
                           "q_positions offset is -1152921504606846977, expected |offset| <= ");
  }
  SECTION("attention: per-batch offsets, explicit ids, key positions") {
    static index_t const firsts[2] = {0, 9223372036854775000};
    expect_attention_error(
        [](call& c) { c.opt.q_positions = posenc::position_span::per_batch({firsts, 2}); },
        "q_positions offset of batch 1 is 9223372036854775000, expected |offset| <= 1152921504606846976");
    static index_t const near[2] = {0, lim - 1};
    expect_attention_error([](call& c) { c.opt.q_positions = posenc::position_span::per_batch({near, 2}); },
                           "q_positions last position of batch 1 is 1152921504606846975 + 2");
    static index_t const ids[4] = {0, 1, max_index, 3};
    expect_attention_error(
        [](call& c) { c.opt.k_positions = posenc::position_span::ids(ids, 1, 4); },
        "k_positions position of batch 0 token 2 is 9223372036854775807, expected |position| <= ");
    static index_t const qids[6] = {0, 1, 2, 3, std::numeric_limits<index_t>::min(), 5};
    expect_attention_error(
        [](call& c) {
          c.opt.causal = true;
          c.opt.q_positions = posenc::position_span::ids(qids, 2, 3);
        },
        "q_positions position of batch 1 token 1 is -9223372036854775808", posenc_test::fake_bias{});
  }
  SECTION("attention: sequence lengths stay inside the position range") {
    expect_attention_error(
        [](call& c) {
          c.kv = posenc::view<const float>{nullptr, 2, lim + 1, 2, 0, 0, 0, 0, 1};
          c.vv = posenc::view<const float>{nullptr, 2, lim + 1, 2, 0, 0, 0, 0, 1};
          c.qv.dim = 0;
          c.ov.dim = 0;
        },
        "k.seq is 1152921504606846977, expected <= 1152921504606846976 (position_limit)");
  }
  SECTION("encoders and the kv_cache") {
    REQUIRE_THROWS_WITH(posenc::kv_cache<float>(1, 1, 4, 0, lim + 1),
                        posenc_test::contains("posenc::kv_cache: first_position is 1152921504606846977, expected 0 .. "
                                              "1152921504606846976 (position_limit)"));
    posenc::alibi<float> a(posenc::alibi_form::paper, 2);
    std::vector<float> row(4, 0.0f);
    REQUIRE_THROWS_WITH(a.add_bias(0, 3, max_index - 1, {row.data(), 4}),
                        posenc_test::contains("posenc::alibi::add_bias: k_pos is 9223372036854775806, expected <= 1152921504606846976 (position_limit)"));
    REQUIRE_THROWS_WITH(a.add_bias(0, 3, lim - 1, {row.data(), 4}),
                        posenc_test::contains("last k_pos is 1152921504606846978, expected <= "));
    for (float x : row) CHECK(x == 0.0f);
    posenc::clipped_bias<float> cb(2, 2, std::uint64_t{1});
    REQUIRE_THROWS_WITH(cb.add_bias(0, max_index, 0, {row.data(), 4}),
                        posenc_test::contains("posenc::clipped_bias::add_bias: q_pos is 9223372036854775807"));
    posenc::sinusoidal<float> sin(4);
    std::vector<float> x(4);
    REQUIRE_THROWS_WITH(sin.add_to(posenc::make_bsd(x.data(), 1, 1, 4), posenc::position_span(max_index)),
                        posenc_test::contains("posenc::sinusoidal::add_to: positions offset is 9223372036854775807"));
    std::vector<index_t> tokens = {5, 6}, out(2);
    REQUIRE_THROWS_WITH(posenc::fairseq_positions(tokens, 1, 2, 1, out, max_index - 2),
                        posenc_test::contains("padding_idx + past_len + seq is 1 + 9223372036854775805 + 2"));
  }
}

TEST_CASE("a sliding window wider than any distance behaves as causal at the edges of the position range",
          "[errors]") {
  // p_i - window + 1 with window = INT64_MAX and p_i < 0 would overflow; the plan
  // clamps the window to 2 * position_limit + 1, which every accepted distance is below.
  call a, b;
  a.opt.causal = true;
  b.opt.sliding_window = max_index;
  for (call* c : {&a, &b}) c->opt.q_positions = posenc::position_span(-2);
  posenc::attention<posenc::path::reference>(a.qv, a.kv, a.vv, a.ov, posenc::none{}, a.opt);
  posenc::attention<posenc::path::reference>(b.qv, b.kv, b.vv, b.ov, posenc::none{}, b.opt);
  CHECK(a.out == b.out);
  CHECK(a.out[0] == 0.0f);  // the query at -2 sees no key
}

TEST_CASE("a mask with extents but a null data pointer is an error, not 'no mask'", "[errors]") {
  expect_attention_error([](call& c) { c.opt.mask = posenc::make_mask<float>(nullptr, 2, 1, 3, 4); },
                         "mask.data is null, expected a buffer of 24 elements, or a default-constructed "
                         "mask_view for no mask (extents 2 x 1 x 3 x 4)");
  expect_attention_error([](call& c) { c.opt.bool_mask = posenc::make_mask<bool>(nullptr, 1, 2, 1, 4); },
                         "bool_mask.data is null, expected a buffer of 8 elements");
  expect_attention_error(
      [](call& c) {
        c.opt.mask = posenc::make_mask<float>(nullptr, 1, 1, 1, 4);
        c.opt.mask.q_stride = big;
      },
      "mask.data is null, expected a buffer of 4 elements");
  // A default-constructed mask is still "no mask"; one without elements (key
  // extent 0, e.g. over an empty std::vector) masks every key, on every path.
  call c;
  posenc::attention<posenc::path::reference>(c.qv, c.kv, c.vv, c.ov, posenc::none{}, c.opt);
  CHECK(!c.untouched());
  CHECK(c.opt.mask.empty());
  CHECK(c.opt.bool_mask.empty());
  call r, m, f;
  for (call* x : {&r, &m, &f}) {
    x->opt.mask = posenc::make_mask<float>(nullptr, 2, 2, 3, 0);
    x->opt.mask.q_stride = 5;  // never applied to the null pointer
  }
  posenc::attention<posenc::path::reference>(r.qv, r.kv, r.vv, r.ov, posenc::none{}, r.opt);
  posenc::attention<posenc::path::materialized>(m.qv, m.kv, m.vv, m.ov, posenc::none{}, m.opt);
  posenc::attention<posenc::path::fused>(f.qv, f.kv, f.vv, f.ov, posenc::none{}, f.opt);
  for (call* x : {&r, &m, &f})
    for (float o : x->out) CHECK(o == 0.0f);
}

TEST_CASE("kv_cache::append gives the strong guarantee", "[errors]") {
  using cview = posenc::view<const float>;
  // Cache (batch 2, kv_heads 2, head_dim 4, value_dim 2) holding 2 tokens at capacity 2,
  // so that the next append would reallocate.
  // Filled with RoPE (keys stored rotated), or with no encoder where the positions lie past
  // RoPE's own range (max_positions() = 2^53) on the way to position_limit.
  auto make = [](index_t first_position, bool rotated) {
    posenc::kv_cache<float> cache(2, 2, 4, 2, first_position);
    std::vector<float> k = posenc_test::random_vector<float>(2 * 2 * 2 * 4, 7);
    std::vector<float> v = posenc_test::random_vector<float>(2 * 2 * 2 * 2, 8);
    auto const kk = posenc::make_bshd<const float>(k.data(), 2, 2, 2, 4);
    auto const vv2 = posenc::make_bshd<const float>(v.data(), 2, 2, 2, 2);
    if (rotated)
      cache.append(kk, vv2, posenc::rope<float>(posenc::rope_layout::half_split, 4));
    else
      cache.append(kk, vv2, posenc::none{});
    return cache;
  };
  std::vector<float> k = posenc_test::random_vector<float>(2 * 3 * 2 * 4, 9);
  std::vector<float> v = posenc_test::random_vector<float>(2 * 3 * 2 * 2, 10);
  cview const kv = posenc::make_bshd<const float>(k.data(), 2, 3, 2, 4);
  cview const vv = posenc::make_bshd<const float>(v.data(), 2, 3, 2, 2);
  posenc::rope<float> const rope4(posenc::rope_layout::half_split, 4);

  struct failure {
    char const* name;
    index_t first_position;
    std::function<void(posenc::kv_cache<float>&)> append;
    char const* message;
  };
  std::vector<failure> const failures = {
      {"k.heads", 0, [&](auto& c) { c.append(posenc::make_bshd<const float>(k.data(), 2, 3, 1, 4), vv, rope4); },
       "k.heads is 1, expected 2"},
      {"v.dim", 0, [&](auto& c) { c.append(kv, posenc::make_bshd<const float>(v.data(), 2, 3, 2, 1), rope4); },
       "v.dim is 1, expected 2"},
      {"v.seq", 0, [&](auto& c) { c.append(kv, posenc::make_bshd<const float>(v.data(), 2, 2, 2, 2), rope4); },
       "v.seq is 2, expected 3"},
      {"k.batch", 0, [&](auto& c) { c.append(posenc::make_bshd<const float>(k.data(), 1, 3, 2, 4), vv, rope4); },
       "k.batch is 1, expected 2"},
      {"k.data", 0, [&](auto& c) { c.append(posenc::make_bshd<const float>(nullptr, 2, 3, 2, 4), vv, rope4); },
       "k.data is null"},
      {"k size", 0, [&](auto& c) { c.append(posenc::make_bshd<const float>(nullptr, 2, big, 2, 4), vv, rope4); },
       "k.batch x k.seq is"},
      {"rotary dim of the encoder", 0,
       [&](auto& c) { c.append(kv, vv, posenc::rope<float>(posenc::rope_layout::half_split, 8)); }, "posenc::rope"},
      {"positions past the encoder's max_positions()", (index_t{1} << 53) - 3, [&](auto& c) { c.append(kv, vv, rope4); },
       "posenc::rope"},
      {"positions past position_limit, no encoder", lim - 3, [&](auto& c) { c.append(kv, vv, posenc::none{}); },
       "last new position is 1152921504606846975 + 2 (next_position() + k.seq - 1), expected <= "},
  };
  for (failure const& f : failures) {
    SECTION(std::string("append fails on ") + f.name) {
      posenc::kv_cache<float> cache = make(f.first_position, f.first_position <= (index_t{1} << 53) - 3);
      cview const keys = cache.keys(), values = cache.values();
      std::vector<float> keys_before, values_before;
      for (index_t b = 0; b < 2; ++b)
        for (index_t s = 0; s < 2; ++s)
          for (index_t h = 0; h < 2; ++h) {
            for (index_t d = 0; d < 4; ++d) keys_before.push_back(keys(b, s, h, d));
            for (index_t d = 0; d < 2; ++d) values_before.push_back(values(b, s, h, d));
          }
      REQUIRE_THROWS_WITH(f.append(cache), posenc_test::contains(f.message));
      CHECK(cache.length() == 2);
      CHECK(cache.next_position() == f.first_position + 2);
      CHECK(cache.keys().data == keys.data);
      CHECK(cache.values().data == values.data);
      std::vector<float> keys_after, values_after;
      for (index_t b = 0; b < 2; ++b)
        for (index_t s = 0; s < 2; ++s)
          for (index_t h = 0; h < 2; ++h) {
            for (index_t d = 0; d < 4; ++d) keys_after.push_back(keys(b, s, h, d));
            for (index_t d = 0; d < 2; ++d) values_after.push_back(values(b, s, h, d));
          }
      CHECK(keys_after == keys_before);
      CHECK(values_after == values_before);
    }
  }
}
}  // namespace errors_overflow_tests
