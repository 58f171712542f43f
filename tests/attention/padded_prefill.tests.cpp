// SPDX-License-Identifier: MIT
// Default query positions: a right-padded prefill (Sq == Sk) gives each entry's own result; decode keeps bottom-right.
#include <posenc/attention/attention.hpp>
#include <posenc/encoding/alibi.hpp>
#include <posenc/encoding/none.hpp>
#include <posenc/encoding/rope.hpp>

#include <algorithm>
#include <cmath>
#include <vector>

#include "support/catch.hpp"
#include "support/random.hpp"

namespace attention_padded_prefill_tests {

using posenc::index_t;

namespace {

/// A batch of right-padded entries (lengths `lens`, padded to S) against each entry run alone.
template <class Path, class E>
void check_padded_prefill(E const& enc, bool causal) {
  index_t const B = 3, S = 37, H = 4, Hkv = 2, D = 8;
  std::vector<index_t> const lens{37, 20, 5};
  std::vector<float> const q = posenc_test::random_vector<float>(static_cast<std::size_t>(B * S * H * D), 21);
  std::vector<float> const k = posenc_test::random_vector<float>(static_cast<std::size_t>(B * S * Hkv * D), 22);
  std::vector<float> const v = posenc_test::random_vector<float>(static_cast<std::size_t>(B * S * Hkv * D), 23);
  std::vector<float> out(q.size(), -5.0f);
  posenc::attention_options<float> opt;
  opt.causal = causal;
  opt.key_lengths = lens;
  posenc::attention<Path>(posenc::make_bshd(q.data(), B, S, H, D), posenc::make_bshd(k.data(), B, S, Hkv, D),
                          posenc::make_bshd(v.data(), B, S, Hkv, D), posenc::make_bshd(out.data(), B, S, H, D), enc,
                          opt);
  for (index_t b = 0; b < B; ++b) {
    index_t const L = lens[static_cast<std::size_t>(b)];
    std::vector<float> alone(static_cast<std::size_t>(L * H * D));
    posenc::attention_options<float> one;
    one.causal = causal;
    posenc::attention<Path>(posenc::make_bshd(q.data() + b * S * H * D, 1, L, H, D),
                            posenc::make_bshd(k.data() + b * S * Hkv * D, 1, L, Hkv, D),
                            posenc::make_bshd(v.data() + b * S * Hkv * D, 1, L, Hkv, D),
                            posenc::make_bshd(alone.data(), 1, L, H, D), enc, one);
    double worst = 0;
    for (index_t t = 0; t < L * H * D; ++t)
      worst = std::max(worst, static_cast<double>(std::abs(out[static_cast<std::size_t>(b * S * H * D + t)] -
                                                           alone[static_cast<std::size_t>(t)])));
    INFO("entry " << b << " of length " << L << ", causal " << causal);
    CHECK(worst <= 1e-5);
  }
}

}  // namespace

TEMPLATE_TEST_CASE("attention defaults: a right-padded prefill equals each entry run alone", "[attention]",
                   posenc::path::reference, posenc::path::materialized, posenc::path::fused) {
  for (bool causal : {true, false}) {
    check_padded_prefill<TestType>(posenc::none{}, causal);
    check_padded_prefill<TestType>(posenc::rope<float>(posenc::rope_layout::half_split, 8), causal);
    check_padded_prefill<TestType>(posenc::alibi<float>(posenc::alibi_form::paper, 4), causal);
  }
}

TEMPLATE_TEST_CASE("attention defaults: decode over a static cache stays bottom-right", "[attention]",
                   posenc::path::reference, posenc::path::materialized, posenc::path::fused) {
  // Sq = 1 and Sq = 3 new tokens at the end of each entry's valid keys of a cache of capacity 16.
  index_t const B = 3, Sk = 16, H = 2, D = 8;
  std::vector<index_t> const lens{16, 9, 4};
  posenc::rope<float> const rope(posenc::rope_layout::half_split, D);
  for (index_t Sq : {index_t{1}, index_t{3}}) {
    std::vector<float> const q = posenc_test::random_vector<float>(static_cast<std::size_t>(B * Sq * H * D), 31);
    std::vector<float> const k = posenc_test::random_vector<float>(static_cast<std::size_t>(B * Sk * H * D), 32);
    std::vector<float> const v = posenc_test::random_vector<float>(static_cast<std::size_t>(B * Sk * H * D), 33);
    std::vector<float> got(q.size()), want(q.size());
    std::vector<index_t> firsts;
    for (index_t L : lens) firsts.push_back(L - Sq);
    posenc::attention_options<float> opt;
    opt.causal = true;
    opt.key_lengths = lens;
    auto run = [&](std::vector<float>& out, posenc::attention_options<float> const& o) {
      posenc::attention<TestType>(posenc::make_bshd(q.data(), B, Sq, H, D), posenc::make_bshd(k.data(), B, Sk, H, D),
                                  posenc::make_bshd(v.data(), B, Sk, H, D), posenc::make_bshd(out.data(), B, Sq, H, D),
                                  rope, o);
    };
    run(got, opt);
    opt.q_positions = posenc::position_span::per_batch(firsts);
    run(want, opt);
    INFO("Sq " << Sq);
    CHECK(got == want);
  }
}
}  // namespace attention_padded_prefill_tests
