// SPDX-License-Identifier: MIT
// Every bad input of the relative encoders: posenc::error naming the argument, outputs untouched.
#include <cmath>
#include <limits>
#include <posenc/core/half.hpp>
#include <posenc/encoding/alibi.hpp>
#include <posenc/encoding/clipped_bias.hpp>
#include <posenc/encoding/shaw.hpp>
#include <posenc/encoding/t5_bias.hpp>
#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/error_of.hpp"

namespace errors_relative_bias_tests {

using posenc::alibi;
using posenc::alibi_form;
using posenc::index_t;
using posenc_test::contains;

namespace {

using posenc_test::error_of;


using table = posenc::relative_table<float>;

}  // namespace

TEST_CASE("errors: t5_bias parameters", "[errors][t5]") {
  auto make = [](bool bi, index_t nb, index_t md, index_t heads = 2) {
    return posenc::t5_bias<float>({heads, bi, nb, md}, 1);
  };
  // Bidirectional: N even and >= 4.
  CHECK(error_of([&] { make(true, 2, 128); }) ==
        "posenc::t5_bias: num_buckets is 2, expected an even number >= 4 (bidirectional)");
  REQUIRE_THROWS_WITH(make(true, 3, 128), contains("num_buckets is 3"));
  REQUIRE_THROWS_WITH(make(true, 33, 128), contains("num_buckets is 33"));
  // Unidirectional: N >= 2 (odd is fine).
  REQUIRE_THROWS_WITH(make(false, 1, 128), contains("num_buckets is 1, expected >= 2 (unidirectional)"));
  REQUIRE_THROWS_WITH(make(false, 0, 128), contains("num_buckets is 0"));
  REQUIRE_NOTHROW(make(false, 3, 128));
  // max_distance must exceed max_exact (N/4 bidirectional, N/2 unidirectional).
  REQUIRE_THROWS_WITH(make(true, 32, 8), contains("max_distance is 8, expected > 8"));
  REQUIRE_NOTHROW(make(true, 32, 9));
  REQUIRE_THROWS_WITH(make(false, 32, 16), contains("max_distance is 16, expected > 16"));
  REQUIRE_NOTHROW(make(false, 32, 17));
  REQUIRE_THROWS_WITH(make(false, 32, -5), contains("max_distance is -5"));
  REQUIRE_THROWS_WITH(make(true, 32, 128, 0), contains("heads is 0, expected >= 1"));
  REQUIRE_THROWS_AS(make(true, 32, 128, -1), posenc::error);
  REQUIRE_THROWS_WITH((posenc::t5_bias<float>({2}, 1, -1.0)), contains("stddev is -1"));
  REQUIRE_THROWS_WITH((posenc::t5_bias<float>({2}, 1, std::nan(""))), contains("stddev is nan"));
}

TEST_CASE("errors: t5_bias table shape and values", "[errors][t5]") {
  REQUIRE_THROWS_WITH((posenc::t5_bias<float>({3}, table::Zero(32, 2))),
                      contains("posenc::t5_bias: table shape is (32, 2), expected (32, 3) (num_buckets, heads)"));
  REQUIRE_THROWS_WITH((posenc::t5_bias<float>({3}, table::Zero(3, 32))), contains("table shape is (3, 32)"));
  REQUIRE_THROWS_WITH((posenc::t5_bias<float>({3, false, 16}, table::Zero(32, 3))),
                      contains("table shape is (32, 3), expected (16, 3)"));
  table bad = table::Zero(32, 3);
  bad(4, 1) = std::numeric_limits<float>::infinity();
  REQUIRE_THROWS_WITH((posenc::t5_bias<float>({3}, bad)), contains("table(4, 1) is inf, expected a finite number"));
}

TEST_CASE("errors: t5_bias calls; outputs untouched", "[errors][t5]") {
  posenc::t5_bias<float> t({4}, 2);
  std::vector<float> out(8, 5.0f);
  std::vector<float> const before = out;
  REQUIRE_THROWS_WITH(t.add_bias(4, 0, 0, posenc::span<float>(out)),
                      contains("posenc::t5_bias::add_bias: head is 4, expected 0 .. 3"));
  REQUIRE_THROWS_WITH(t.add_bias(-1, 0, 0, posenc::span<float>(out)), contains("head is -1"));
  REQUIRE_THROWS_WITH(t.add_bias(0, -1, 0, posenc::span<float>(out)), contains("q_pos is -1, expected >= 0"));
  REQUIRE_THROWS_WITH(t.add_bias(0, 0, -3, posenc::span<float>(out)), contains("k_pos is -3, expected >= 0"));
  CHECK(out == before);
  REQUIRE_THROWS_WITH(t.bias(0, -2, 0), contains("posenc::t5_bias::bias: q_pos is -2"));
  REQUIRE_THROWS_WITH(t.bias(0, 0, -2), contains("k_pos is -2"));
  REQUIRE_THROWS_WITH(t.bias(9, 0, 0), contains("head is 9"));
  REQUIRE_THROWS_WITH(t.weight(32, 0), contains("bucket is 32, expected 0 .. 31"));
  REQUIRE_THROWS_WITH(t.weight(0, 4), contains("head is 4"));
}

TEST_CASE("errors: clipped_bias", "[errors][clipped]") {
  REQUIRE_THROWS_WITH((posenc::clipped_bias<float>(-1, 2, 1)),
                      contains("posenc::clipped_bias: max_distance is -1, expected >= 0"));
  REQUIRE_THROWS_WITH((posenc::clipped_bias<float>(-1, 2, table::Zero(1, 2))), contains("max_distance is -1"));
  REQUIRE_THROWS_WITH((posenc::clipped_bias<float>(2, 0, 1)), contains("heads is 0, expected >= 1"));
  REQUIRE_THROWS_WITH((posenc::clipped_bias<float>(2, 3, table::Zero(4, 3))),
                      contains("table shape is (4, 3), expected (5, 3) (2 * max_distance + 1, heads)"));
  REQUIRE_THROWS_WITH((posenc::clipped_bias<float>(2, 3, table::Zero(5, 2))), contains("table shape is (5, 2)"));
  table bad = table::Zero(5, 3);
  bad(0, 0) = std::nanf("");
  REQUIRE_THROWS_WITH((posenc::clipped_bias<float>(2, 3, bad)), contains("table(0, 0) is nan"));
  REQUIRE_NOTHROW(posenc::clipped_bias<float>(0, 3, table::Zero(1, 3)));

  posenc::clipped_bias<float> c(2, 3, 1);
  std::vector<float> out(6, -1.0f);
  std::vector<float> const before = out;
  REQUIRE_THROWS_WITH(c.add_bias(3, 0, 0, posenc::span<float>(out)),
                      contains("posenc::clipped_bias::add_bias: head is 3, expected 0 .. 2"));
  REQUIRE_THROWS_WITH(c.add_bias(0, -1, 0, posenc::span<float>(out)), contains("q_pos is -1"));
  REQUIRE_THROWS_WITH(c.add_bias(0, 0, -1, posenc::span<float>(out)), contains("k_pos is -1"));
  CHECK(out == before);
  REQUIRE_THROWS_WITH(c.bias(0, 0, -7), contains("posenc::clipped_bias::bias: k_pos is -7"));
  REQUIRE_THROWS_WITH(c.weight(5, 0), contains("row is 5, expected 0 .. 4"));
}

TEST_CASE("errors: alibi parameters", "[errors][alibi]") {
  REQUIRE_THROWS_WITH((alibi<float>(alibi_form::paper, 0)), contains("posenc::alibi: heads is 0, expected >= 1"));
  REQUIRE_THROWS_WITH(posenc::alibi_slopes(0), contains("posenc::alibi_slopes: heads is 0, expected >= 1"));
  // Slope count != heads.
  std::vector<float> three = {0.5f, 0.25f, 0.125f};
  REQUIRE_THROWS_WITH((alibi<float>(alibi_form::paper, 4, posenc::span<const float>(three))),
                      contains("posenc::alibi: slopes has 3 values, expected 4 (one per head of the model)"));
  REQUIRE_THROWS_WITH((alibi<float>(alibi_form::paper, 2, posenc::head_shard{0, 4}, posenc::span<const float>(three))),
                      contains("slopes has 3 values, expected 4"));
  three[1] = std::numeric_limits<float>::infinity();
  REQUIRE_THROWS_WITH((alibi<float>(alibi_form::paper, 3, posenc::span<const float>(three))),
                      contains("slopes[1] is inf, expected a finite number"));
  // Shards.
  REQUIRE_THROWS_WITH((alibi<float>(alibi_form::paper, 4, posenc::head_shard{-1, 8})),
                      contains("shard.first is -1, expected >= 0"));
  REQUIRE_THROWS_WITH((alibi<float>(alibi_form::paper, 4, posenc::head_shard{6, 8})),
                      contains("shard.total is 8, expected >= 10 (shard.first + heads)"));
  REQUIRE_THROWS_WITH((alibi<float>(alibi_form::paper, 4, posenc::head_shard{2, 0})), contains("shard.total is 0"));
  // Key length: required by shifted, rejected by the others.
  REQUIRE_THROWS_WITH((alibi<float>(alibi_form::shifted, 4)),
                      contains("key_length is 0, expected >= 1 (the shifted form needs the key length L)"));
  REQUIRE_THROWS_WITH((alibi<float>(alibi_form::shifted, 4, -3)), contains("key_length is -3"));
  REQUIRE_THROWS_WITH((alibi<float>(alibi_form::paper, 4, 10)),
                      contains("key_length is 10, expected 0 (only alibi_form::shifted uses it)"));
  alibi<float> sh(alibi_form::shifted, 4, 10);
  REQUIRE_THROWS_WITH(sh.with_key_length(0), contains("posenc::alibi::with_key_length: key_length is 0"));
}

TEST_CASE("errors: alibi calls; outputs untouched", "[errors][alibi]") {
  alibi<float> a(alibi_form::paper, 4);
  alibi<float> sh(alibi_form::shifted, 4, 10);
  std::vector<float> out(5, 3.0f);
  std::vector<float> const before = out;
  REQUIRE_THROWS_WITH(a.add_bias(4, 0, 0, posenc::span<float>(out)),
                      contains("posenc::alibi::add_bias: head is 4, expected 0 .. 3"));
  REQUIRE_THROWS_WITH(a.add_bias(0, -1, 0, posenc::span<float>(out)), contains("q_pos is -1, expected >= 0"));
  REQUIRE_THROWS_WITH(a.add_bias(0, 0, -1, posenc::span<float>(out)), contains("k_pos is -1, expected >= 0"));
  REQUIRE_THROWS_WITH(sh.add_bias(0, 10, 0, posenc::span<float>(out)),
                      contains("q_pos is 10, expected < 10 (key_length)"));
  REQUIRE_THROWS_WITH(sh.add_bias(0, 9, 6, posenc::span<float>(out)), contains("last k_pos is 10, expected < 10"));
  CHECK(out == before);
  REQUIRE_THROWS_WITH(a.bias(-1, 0, 0), contains("posenc::alibi::bias: head is -1"));
  REQUIRE_THROWS_WITH(a.bias(0, 0, -4), contains("k_pos is -4"));
  REQUIRE_THROWS_WITH(a.slope(7), contains("posenc::alibi::slope: head is 7"));
}

TEST_CASE("errors: shaw", "[errors][shaw]") {
  REQUIRE_THROWS_WITH((posenc::shaw<float>(0, table::Zero(1, 4))),
                      contains("posenc::shaw: max_distance is 0, expected >= 1"));
  REQUIRE_THROWS_WITH((posenc::shaw<float>(-2, 4, posenc::shaw_terms::keys, 1)), contains("max_distance is -2"));
  REQUIRE_THROWS_WITH((posenc::shaw<float>(2, 0, posenc::shaw_terms::keys, 1)),
                      contains("head_dim is 0, expected >= 1"));
  REQUIRE_THROWS_WITH((posenc::shaw<float>(2, table::Zero(4, 8))),
                      contains("key_table shape is (4, 8), expected (5, 8) (2 * max_distance + 1, head_dim)"));
  REQUIRE_THROWS_WITH((posenc::shaw<float>(2, table::Zero(5, 0))), contains("key_table shape is (5, 0)"));
  REQUIRE_THROWS_WITH((posenc::shaw<float>(2, table::Zero(5, 8), table::Zero(5, 7))),
                      contains("value_table shape is (5, 7), expected (5, 8)"));
  REQUIRE_THROWS_WITH((posenc::shaw<float>(2, table::Zero(5, 8), table::Zero(3, 8))),
                      contains("value_table shape is (3, 8)"));

  posenc::shaw<float> s(2, 4, posenc::shaw_terms::keys_and_values, 1);
  posenc::shaw<float> keys_only(2, 4, posenc::shaw_terms::keys, 1);
  std::vector<float> q(4, 1.0f), q_short(3, 1.0f), scores(6, 2.0f), p(6, 0.1f), z(4, 7.0f), z_long(5, 7.0f);
  auto const s_before = scores;
  auto const z_before = z;
  using cspan = posenc::span<const float>;
  using mspan = posenc::span<float>;
  REQUIRE_THROWS_WITH(s.add_scores(cspan(q_short), 0, 0, 1.0f, mspan(scores)),
                      contains("posenc::shaw::add_scores: q has 3 values, expected 4 (head_dim)"));
  REQUIRE_THROWS_WITH(s.add_scores(cspan(q), -1, 0, 1.0f, mspan(scores)), contains("q_pos is -1"));
  REQUIRE_THROWS_WITH(s.add_scores(cspan(q), 0, -1, 1.0f, mspan(scores)), contains("k_pos is -1"));
  REQUIRE_THROWS_WITH(s.add_scores(cspan(q), 0, 0, std::numeric_limits<float>::infinity(), mspan(scores)),
                      contains("scale is inf, expected a finite number"));
  CHECK(scores == s_before);
  REQUIRE_THROWS_WITH(s.add_values(cspan(p), 0, 0, mspan(z_long)),
                      contains("posenc::shaw::add_values: out has 5 values, expected 4 (head_dim)"));
  REQUIRE_THROWS_WITH(s.add_values(cspan(p), -1, 0, mspan(z)), contains("q_pos is -1"));
  REQUIRE_THROWS_WITH(s.add_values(cspan(p), 0, -1, mspan(z)), contains("k_pos is -1"));
  REQUIRE_THROWS_WITH(keys_only.add_values(cspan(p), 0, 0, mspan(z)),
                      contains("value table is absent, expected shaw_terms::keys_and_values"));
  CHECK(z == z_before);
  REQUIRE_THROWS_WITH(s.row(-1, 0), contains("posenc::shaw::row: q_pos is -1"));
  REQUIRE_THROWS_WITH(s.key_weight(5, 0), contains("row is 5, expected 0 .. 4"));
  REQUIRE_THROWS_WITH(s.key_weight(0, 4), contains("dim is 4, expected 0 .. 3"));
  REQUIRE_THROWS_WITH(keys_only.value_weight(0, 0), contains("value table is absent"));
}

TEST_CASE("errors: t5_bias::view_of names the argument and the expected value", "[errors][t5][view]") {
  using cspan = posenc::span<const float>;
  std::vector<float> buf(32 * 3, 0.0f);
  auto view = [](posenc::t5_bias_params const& p, cspan t) { return posenc::t5_bias<float>::view_of(p, t); };
  CHECK(error_of([&] { view({3}, cspan(buf.data(), 95)); }) ==
        "posenc::t5_bias::view_of: table.size is 95, expected 96 (num_buckets 32 * heads 3)");
  REQUIRE_THROWS_WITH(view({2}, cspan(buf)), contains("table.size is 96, expected 64 (num_buckets 32 * heads 2)"));
  REQUIRE_THROWS_WITH(view({3, false, 16}, cspan(buf)),
                      contains("table.size is 96, expected 48 (num_buckets 16 * heads 3)"));
  CHECK(error_of([&] { view({3}, cspan(nullptr, 96)); }) ==
        "posenc::t5_bias::view_of: table.data is null, expected a buffer of 96 elements");
  REQUIRE_THROWS_WITH(view({0}, cspan(buf)), contains("posenc::t5_bias::view_of: heads is 0, expected >= 1"));
  REQUIRE_THROWS_WITH(view({3, true, 5}, cspan(buf)),
                      contains("posenc::t5_bias::view_of: num_buckets is 5, expected an even number >= 4 (bidirectional)"));
  REQUIRE_THROWS_WITH(view({3, false, 1}, cspan(buf)), contains("num_buckets is 1, expected >= 2 (unidirectional)"));
  REQUIRE_THROWS_WITH(view({3, true, 32, 8}, cspan(buf)),
                      contains("posenc::t5_bias::view_of: max_distance is 8, expected > 8"));
  REQUIRE_THROWS_WITH(view({std::numeric_limits<index_t>::max() / 4}, cspan(buf)),
                      contains("posenc::t5_bias::view_of"));
  REQUIRE_THROWS_WITH(view({std::numeric_limits<index_t>::max() / 4}, cspan(buf)), contains("num_buckets x heads"));
  buf[4 * 3 + 1] = std::numeric_limits<float>::infinity();
  CHECK(error_of([&] { view({3}, cspan(buf)); }) ==
        "posenc::t5_bias::view_of: table(4, 1) is inf, expected a finite number");
  buf[4 * 3 + 1] = 0.0f;
  REQUIRE_NOTHROW(view({3}, cspan(buf)));
  // 16-bit tables: the same checks, values widened.
  std::vector<Eigen::half> h(32 * 3, Eigen::half(0.0f));
  using hspan = posenc::span<const Eigen::half>;
  REQUIRE_THROWS_WITH(posenc::t5_bias<Eigen::half>::view_of({3}, hspan(h.data(), 90)),
                      contains("posenc::t5_bias::view_of: table.size is 90, expected 96 (num_buckets 32 * heads 3)"));
  h[31 * 3 + 2] = Eigen::half(std::nanf(""));
  REQUIRE_THROWS_WITH(posenc::t5_bias<Eigen::half>::view_of({3}, hspan(h)),
                      contains("table(31, 2) is nan, expected a finite number"));
}

TEST_CASE("errors: clipped_bias::view_of names the argument and the expected value", "[errors][clipped][view]") {
  using cspan = posenc::span<const float>;
  std::vector<float> buf(5 * 3, 0.0f);
  auto view = [](index_t k, index_t heads, cspan t) { return posenc::clipped_bias<float>::view_of(k, heads, t); };
  CHECK(error_of([&] { view(2, 3, cspan(buf.data(), 14)); }) ==
        "posenc::clipped_bias::view_of: table.size is 14, expected 15 (2 * max_distance + 1 = 5 rows * heads 3)");
  REQUIRE_THROWS_WITH(view(1, 3, cspan(buf)),
                      contains("table.size is 15, expected 9 (2 * max_distance + 1 = 3 rows * heads 3)"));
  REQUIRE_THROWS_WITH(view(2, 2, cspan(buf)), contains("table.size is 15, expected 10"));
  CHECK(error_of([&] { view(2, 3, cspan(nullptr, 15)); }) ==
        "posenc::clipped_bias::view_of: table.data is null, expected a buffer of 15 elements");
  REQUIRE_THROWS_WITH(view(-1, 3, cspan(buf)), contains("posenc::clipped_bias::view_of: max_distance is -1, expected >= 0"));
  REQUIRE_THROWS_WITH(view(2, 0, cspan(buf)), contains("posenc::clipped_bias::view_of: heads is 0, expected >= 1"));
  REQUIRE_THROWS_WITH(view(std::numeric_limits<index_t>::max() / 2, 3, cspan(buf)),
                      contains("posenc::clipped_bias::view_of"));
  buf[0] = std::nanf("");
  CHECK(error_of([&] { view(2, 3, cspan(buf)); }) ==
        "posenc::clipped_bias::view_of: table(0, 0) is nan, expected a finite number");
  buf[0] = 0.0f;
  REQUIRE_NOTHROW(view(2, 3, cspan(buf)));
  REQUIRE_NOTHROW(view(0, 15, cspan(buf)));
  std::vector<Eigen::bfloat16> b(5 * 3, Eigen::bfloat16(0.0f));
  using bspan = posenc::span<const Eigen::bfloat16>;
  REQUIRE_THROWS_WITH(posenc::clipped_bias<Eigen::bfloat16>::view_of(2, 3, bspan(b.data(), 16)),
                      contains("table.size is 16, expected 15"));
  b[4 * 3 + 2] = Eigen::bfloat16(-std::numeric_limits<float>::infinity());
  REQUIRE_THROWS_WITH(posenc::clipped_bias<Eigen::bfloat16>::view_of(2, 3, bspan(b)),
                      contains("posenc::clipped_bias::view_of: table(4, 2) is -inf, expected a finite number"));
}

TEST_CASE("errors: shaw::view_of names the argument and the expected value", "[errors][shaw][view]") {
  using cspan = posenc::span<const float>;
  using posenc::shaw;
  std::vector<float> ak(5 * 4, 0.0f), av(5 * 4, 0.0f);
  CHECK(error_of([&] { shaw<float>::view_of(2, 4, cspan(ak.data(), 19)); }) ==
        "posenc::shaw::view_of: key_table.size is 19, expected 20 (2 * max_distance + 1 = 5 rows * head_dim 4)");
  REQUIRE_THROWS_WITH(shaw<float>::view_of(2, 5, cspan(ak)),
                      contains("key_table.size is 20, expected 25 (2 * max_distance + 1 = 5 rows * head_dim 5)"));
  REQUIRE_THROWS_WITH(shaw<float>::view_of(1, 4, cspan(ak), cspan(av)),
                      contains("key_table.size is 20, expected 12"));
  CHECK(error_of([&] { shaw<float>::view_of(2, 4, cspan(nullptr, 20)); }) ==
        "posenc::shaw::view_of: key_table.data is null, expected a buffer of 20 elements");
  CHECK(error_of([&] { shaw<float>::view_of(2, 4, cspan(ak), cspan(av.data(), 16)); }) ==
        "posenc::shaw::view_of: value_table.size is 16, expected 20 (2 * max_distance + 1 = 5 rows * head_dim 4)");
  REQUIRE_THROWS_WITH(shaw<float>::view_of(2, 4, cspan(ak), cspan()), contains("value_table.size is 0, expected 20"));
  REQUIRE_THROWS_WITH(shaw<float>::view_of(2, 4, cspan(ak), cspan(nullptr, 20)),
                      contains("posenc::shaw::view_of: value_table.data is null, expected a buffer of 20 elements"));
  REQUIRE_THROWS_WITH(shaw<float>::view_of(0, 4, cspan(ak)),
                      contains("posenc::shaw::view_of: max_distance is 0, expected >= 1"));
  REQUIRE_THROWS_WITH(shaw<float>::view_of(2, 0, cspan(ak)), contains("posenc::shaw::view_of: head_dim is 0, expected >= 1"));
  REQUIRE_THROWS_WITH(shaw<float>::view_of(2, -3, cspan(ak), cspan(av)), contains("head_dim is -3, expected >= 1"));
  REQUIRE_THROWS_WITH(shaw<float>::view_of(2, std::numeric_limits<index_t>::max() / 2, cspan(ak)),
                      contains("posenc::shaw::view_of"));
  ak[7] = std::numeric_limits<float>::infinity();
  CHECK(error_of([&] { shaw<float>::view_of(2, 4, cspan(ak)); }) ==
        "posenc::shaw::view_of: key_table(1, 3) is inf, expected a finite number");
  ak[7] = 0.0f;
  av[2 * 4 + 3] = std::nanf("");
  CHECK(error_of([&] { shaw<float>::view_of(2, 4, cspan(ak), cspan(av)); }) ==
        "posenc::shaw::view_of: value_table(2, 3) is nan, expected a finite number");
  REQUIRE_NOTHROW(shaw<float>::view_of(2, 4, cspan(ak)));  // aV is not read without value embeddings
  av[2 * 4 + 3] = 0.0f;
  REQUIRE_NOTHROW(shaw<float>::view_of(2, 4, cspan(ak), cspan(av)));
  std::vector<Eigen::half> h(5 * 4, Eigen::half(0.0f));
  using hspan = posenc::span<const Eigen::half>;
  REQUIRE_THROWS_WITH(shaw<Eigen::half>::view_of(2, 4, hspan(h), hspan(h.data(), 4)),
                      contains("value_table.size is 4, expected 20"));
  h[0] = Eigen::half(std::numeric_limits<float>::infinity());
  REQUIRE_THROWS_WITH(shaw<Eigen::half>::view_of(2, 4, hspan(h)), contains("key_table(0, 0) is inf"));
}
}  // namespace errors_relative_bias_tests
