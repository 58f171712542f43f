// SPDX-License-Identifier: MIT
// Every bad input of Transformer-XL: posenc::error naming the argument, before any output is written.
#include <posenc/attention/attention.hpp>
#include <posenc/encoding/transformer_xl.hpp>

#include <cmath>
#include <limits>
#include <vector>

#include "support/catch.hpp"
#include "support/error_of.hpp"
#include "support/transformer_xl.hpp"

using posenc::index_t;
using posenc_test::contains;
using posenc_test::error_of;
using table = posenc::relative_table<float>;

TEST_CASE("errors: transformer_xl parameters", "[errors][transformer_xl]") {
  table const u = table::Zero(2, 4), v = table::Zero(2, 4), wr = table::Zero(8, 6);
  REQUIRE_NOTHROW(posenc::transformer_xl<float>(10, u, v, wr));
  CHECK(error_of([&] { posenc::transformer_xl<float>(10, u, table::Zero(2, 5), wr); }) ==
        "posenc::transformer_xl: v shape is (2, 5), expected (2, 4) (heads, head_dim) of u");
  REQUIRE_THROWS_WITH(posenc::transformer_xl<float>(10, u, table::Zero(3, 4), wr), contains("v shape is (3, 4)"));
  REQUIRE_THROWS_WITH(posenc::transformer_xl<float>(10, table::Zero(0, 4), v, wr),
                      contains("u shape is (0, 4), expected (heads >= 1, head_dim >= 1)"));
  // W_R must have heads x head_dim rows (one head_dim block per head).
  CHECK(error_of([&] { posenc::transformer_xl<float>(10, u, v, table::Zero(6, 6)); }) ==
        "posenc::transformer_xl: w_r shape is (6, 6), expected (8, 6) (heads x head_dim of u, pos_dim)");
  REQUIRE_THROWS_WITH(posenc::transformer_xl<float>(10, u, v, table::Zero(8, 5)),
                      contains("w_r shape is (8, 5), expected (8, an even pos_dim >= 2)"));
  REQUIRE_THROWS_WITH(posenc::transformer_xl<float>(-1, u, v, wr), contains("distance_limit is -1"));
  REQUIRE_THROWS_WITH(posenc::transformer_xl<float>(10, u, v, wr, -2), contains("memory_length is -2"));
  table bad = u;
  bad(1, 2) = std::numeric_limits<float>::quiet_NaN();
  REQUIRE_THROWS_WITH(posenc::transformer_xl<float>(10, bad, v, wr), contains("u(1, 2) is nan, expected a finite"));
  auto const enc = posenc::transformer_xl<float>(10, u, v, wr);
  REQUIRE_THROWS_WITH(enc.relative_key(2, 0, 0), contains("head is 2, expected 0 .. 1"));
  REQUIRE_THROWS_WITH(enc.relative_key(0, 11, 0), contains("distance is 11, expected -10 .. 10"));
  REQUIRE_THROWS_WITH(enc.position_bias(0, -11), contains("distance is -11"));
}

TEST_CASE("errors: transformer_xl in attention, nothing written", "[errors][transformer_xl]") {
  index_t const B = 1, Sq = 4, Sk = 9, H = 2, D = 4;
  posenc_test::txl_buffers<float> bf(B, Sq, Sk, H, H, D, 1);
  std::vector<float> out(static_cast<std::size_t>(B * Sq * H * D), 5.0f);
  auto outv = posenc::make_bshd(out.data(), B, Sq, H, D);
  auto call = [&](auto const& enc, posenc::attention_options<float> const& opt) {
    return error_of([&] { posenc::attention(bf.qv(), bf.kv(), bf.vv(), outv, enc, opt); });
  };
  posenc::attention_options<float> opt;
  opt.causal = true;
  // head_dim of u, v and W_R against q.dim.
  CHECK(call(posenc_test::random_transformer_xl<float>(H, D + 1, 6, Sk, 2), opt) ==
        "posenc::attention: encoder head_dim() is 5, expected 4 (q.dim)");
  // Heads of u, v and W_R against q.heads.
  CHECK(call(posenc_test::random_transformer_xl<float>(H + 1, D, 6, Sk, 2), opt) ==
        "posenc::attention: encoder heads() is 3, expected 2 (q.heads)");
  // A visible key further away than the table.
  REQUIRE_THROWS_WITH(
      posenc::attention(bf.qv(), bf.kv(), bf.vv(), outv, posenc_test::random_transformer_xl<float>(H, D, 6, 7, 2), opt),
      contains("query position of batch 0 row 3 is 8 with keys at 0 .. 8, expected every visible key within 7"));
  // Not causal: keys after the query count too (row 0 at 5 sees key 8 at distance -3).
  posenc::attention_options<float> bi;
  REQUIRE_THROWS_WITH(
      posenc::attention(bf.qv(), bf.kv(), bf.vv(), outv, posenc_test::random_transformer_xl<float>(H, D, 6, 2, 2), bi),
      contains("query position of batch 0 row 0 is 5 with keys at 0 .. 8, expected every visible key within 2"));
  // A segment longer than the keys (memory of negative length).
  {
    posenc_test::txl_buffers<float> longq(B, Sk + 1, Sk, H, H, D, 1);
    std::vector<float> o2(static_cast<std::size_t>(B * (Sk + 1) * H * D), 5.0f);
    CHECK(error_of([&] {
            posenc::attention(longq.qv(), longq.kv(), longq.vv(), posenc::make_bshd(o2.data(), B, Sk + 1, H, D),
                              posenc_test::random_transformer_xl<float>(H, D, 6, 40, 2), opt);
          }) == "posenc::attention: q.seq is 10, expected <= 9 (k.seq: the keys are the segment memory followed "
                "by the queries' own segment)");
    for (float x : o2) REQUIRE(x == 5.0f);
  }
  // A cut memory (memory_length 2 < 5 memory keys) with a scores output, and
  // bad key_lengths: the whole call is checked before the cut.
  auto const cut = posenc_test::random_transformer_xl<float>(H, D, 6, Sk, 2, 2);
  std::vector<float> scores(static_cast<std::size_t>(B * H * Sq * Sk), 5.0f);
  posenc::attention_options<float> so = opt;
  so.scores = scores.data();
  REQUIRE_THROWS_WITH(posenc::attention<posenc::path::materialized>(bf.qv(), bf.kv(), bf.vv(), outv, cut, so),
                      contains("scores is set with a memory of 5 keys, expected null (the encoder's memory_length() "
                               "is 2"));
  for (float x : scores) REQUIRE(x == 5.0f);
  std::vector<index_t> const lens = {Sk + 1};
  posenc::attention_options<float> lo = opt;
  lo.key_lengths = posenc::span<const index_t>(lens.data(), 1);
  REQUIRE_THROWS_WITH(posenc::attention(bf.qv(), bf.kv(), bf.vv(), outv, cut, lo),
                      contains("key_lengths[0] is 10, expected 0 .. 9 (k.seq)"));
  for (float x : out) REQUIRE(x == 5.0f);
}
