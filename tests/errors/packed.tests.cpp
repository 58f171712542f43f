// SPDX-License-Identifier: MIT
// Every bad argument of packed attention throws posenc::error naming it, with nothing written.
#include <posenc/attention/packed.hpp>
#include <posenc/encoding/alibi.hpp>
#include <posenc/encoding/none.hpp>

#include <functional>
#include <type_traits>
#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/random.hpp"

namespace errors_packed_tests {

using posenc::index_t;

namespace {

/// A valid packed call of 3 sequences (queries 2, 0, 3; keys 3, 2, 3; Hq 2, Hkv 1, D 4) that a test breaks.
struct packed_call {
  std::vector<index_t> cu_q{0, 2, 2, 5}, cu_k{0, 3, 5, 8};
  std::vector<float> q = posenc_test::random_vector<float>(5 * 2 * 4, 1);
  std::vector<float> k = posenc_test::random_vector<float>(8 * 1 * 4, 2);
  std::vector<float> v = posenc_test::random_vector<float>(8 * 1 * 4, 3);
  std::vector<float> out = std::vector<float>(5 * 2 * 4, 42.0f);
  std::vector<float> lse = std::vector<float>(2 * 5, 42.0f);
  std::vector<index_t> lengths{3, 2, 3}, firsts{0, 0, 0}, ids{0, 1, 0, 1, 2};
  std::vector<float> mask = std::vector<float>(8, 0.0f);
  posenc::view<float> qv = posenc::make_bshd(q.data(), 1, 5, 2, 4);
  posenc::view<float> kv = posenc::make_bshd(k.data(), 1, 8, 1, 4);
  posenc::view<float> vv = posenc::make_bshd(v.data(), 1, 8, 1, 4);
  posenc::view<float> ov = posenc::make_bshd(out.data(), 1, 5, 2, 4);
  posenc::attention_options<float> opt;
  packed_call() { opt.lse = lse; }
  posenc::packed_sequences seqs() const { return {cu_q, cu_k}; }
  bool untouched() const {
    for (float x : out)
      if (x != 42.0f) return false;
    for (float x : lse)
      if (x != 42.0f) return false;
    return true;
  }
};

template <class Path, class E = posenc::none>
void expect_error(std::function<void(packed_call&)> const& breaker, std::string const& message, E const& enc = {}) {
  packed_call c;
  breaker(c);
  INFO("expected message containing: " << message);
  REQUIRE_THROWS_AS(posenc::attention<Path>(c.qv, c.kv, c.vv, c.ov, c.seqs(), enc, c.opt), posenc::error);
  REQUIRE_THROWS_WITH(posenc::attention<Path>(c.qv, c.kv, c.vv, c.ov, c.seqs(), enc, c.opt),
                      posenc_test::contains(message));
  CHECK(c.untouched());
}

template <class Path>
void check_every_error() {
  // The valid call runs and writes.
  {
    packed_call c;
    posenc::attention<Path>(c.qv, c.kv, c.vv, c.ov, c.seqs(), posenc::none{}, c.opt);
    CHECK_FALSE(c.untouched());
  }
  std::string const w = "posenc::attention: ";
  expect_error<Path>([](packed_call& c) { c.cu_q = {1, 2, 2, 5}; }, w + "cu_seqlens_q[0] is 1, expected 0");
  expect_error<Path>([](packed_call& c) { c.cu_k = {0, 3, 2, 8}; },
                     w + "cu_seqlens_k[2] is 2, expected >= 3 (cu_seqlens_k[1]: offsets never decrease)");
  expect_error<Path>([](packed_call& c) { c.cu_q = {0, 2, 2, 4}; }, w + "cu_seqlens_q[3] is 4, expected 5 (q.seq)");
  expect_error<Path>([](packed_call& c) { c.cu_k = {0, 3, 5, 7}; }, w + "cu_seqlens_k[3] is 7, expected 8 (k.seq)");
  expect_error<Path>([](packed_call& c) { c.cu_k = {0, 8}; },
                     w + "cu_seqlens_k has 2 entries, expected 4 (cu_seqlens_q: one sequence count for queries and keys)");
  expect_error<Path>([](packed_call& c) { c.cu_q.clear(); },
                     w + "cu_seqlens_q has 0 entries, expected n + 1 >= 1 (n sequences)");
  expect_error<Path>([](packed_call& c) { c.qv.batch = 2; c.qv.seq = 2; },
                     w + "q.batch is 2, expected 1 (packed sequences lie back to back along seq)");
  expect_error<Path>([](packed_call& c) { c.ov.seq = 4; }, w + "out.seq is 4, expected 5 (q.seq)");
  expect_error<Path>(
      [](packed_call& c) {
        c.lengths.pop_back();
        c.opt.key_lengths = c.lengths;
      },
      w + "key_lengths has 2 entries, expected 3 (one per sequence)");
  expect_error<Path>(
      [](packed_call& c) {
        c.lengths[1] = 3;
        c.opt.key_lengths = c.lengths;
      },
      w + "key_lengths[1] is 3, expected 0 .. 2 (the keys of sequence 1)");
  expect_error<Path>(
      [](packed_call& c) {
        c.firsts.pop_back();
        c.opt.q_positions = posenc::position_span::per_batch(c.firsts);
      },
      w + "q_positions has 2 per-batch offsets, expected 3");
  expect_error<Path>(
      [](packed_call& c) { c.opt.k_positions = posenc::position_span::ids(c.ids.data(), 1, 5); },
      w + "k_positions seq is 5, expected 8");
  expect_error<Path>(
      [](packed_call& c) { c.opt.mask = posenc::make_mask<float>(c.mask.data(), 3, 1, 1, 8); },
      w + "mask.batch is 3, expected 1 or 1");
  expect_error<Path>([](packed_call& c) { c.opt.lse = {c.q.data() + 3, 2 * 5}; }, w + "lse is at bytes");
  expect_error<Path>([](packed_call& c) { c.opt.lse = {c.lse.data(), 9}; },
                     w + "lse has 9 values, expected 10 (q.heads x q.seq)");
  // Out of one sequence over the queries of another: caught over the whole packed buffers.
  expect_error<Path>(
      [](packed_call& c) {
        c.q.resize(7 * 2 * 4);
        c.qv.data = c.q.data();
        c.ov.data = c.q.data() + 2 * 2 * 4;
      },
                     w + "out is at bytes");
  // A problem of one sequence only (sequence 2's queries before position 0 for a position-dependent
  // encoder without causal) is found before sequence 0 is run.
  expect_error<Path>(
      [](packed_call& c) {
        c.firsts = {1, 0, -2};
        c.opt.q_positions = posenc::position_span::per_batch(c.firsts);
      },
      "posenc::attention (sequence 2): query position of batch 0 row 0 is -2, expected >= 0",
      posenc::alibi<float>(posenc::alibi_form::paper, 2));
  // The fused path has no scores output: said before any sequence runs.
  if constexpr (std::is_same_v<Path, posenc::path::fused>) {
    std::vector<float> scores(2 * (2 * 3 + 0 * 2 + 3 * 3), 42.0f);  // q.heads x Sq x Sk per sequence
    expect_error<Path>([&](packed_call& c) { c.opt.scores = scores; }, "scores is set, expected null");
  } else {
    std::vector<float> scores(2 * (2 * 3 + 0 * 2 + 3 * 3) - 1, 42.0f);
    expect_error<Path>([&](packed_call& c) { c.opt.scores = scores; },
                       w + "scores has 29 values, expected 30 (the sum over sequences of q.heads x Sq x Sk)");
  }
}

}  // namespace

TEMPLATE_TEST_CASE("packed attention: every bad argument throws naming it, nothing written", "[errors][packed]",
                   posenc::path::reference, posenc::path::materialized, posenc::path::fused) {
  check_every_error<TestType>();
}
}  // namespace errors_packed_tests
