// SPDX-License-Identifier: MIT
// Positions at the edge of the accepted range (position_limit) give the results of the same problem at small positions.
#include <posenc/attention/attention.hpp>
#include <posenc/attention/fused.hpp>
#include <posenc/encoding/alibi.hpp>
#include <posenc/encoding/clipped_bias.hpp>
#include <posenc/encoding/none.hpp>
#include <posenc/encoding/shaw.hpp>
#include <posenc/encoding/t5_bias.hpp>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/random.hpp"

namespace properties_position_range_tests {

using posenc::index_t;

namespace {

constexpr index_t B = 2, Sq = 5, Sk = 19, Hq = 4, Hkv = 2, D = 8;

struct variant {
  char const* name;
  bool causal;
  index_t window;
};

/// out of attention<Path> with key b, j at k_first[b] + j and query b, i at q_first[b] + i.
template <class Path, class E>
std::vector<float> run(E const& enc, variant const& var, index_t shift) {
  std::vector<float> q = posenc_test::random_vector<float>(B * Sq * Hq * D, 11);
  std::vector<float> k = posenc_test::random_vector<float>(B * Sk * Hkv * D, 12);
  std::vector<float> v = posenc_test::random_vector<float>(B * Sk * Hkv * D, 13);
  std::vector<float> out(B * Sq * Hq * D, 42.0f);
  // Small problem: keys of batch b at 1 + b .. Sk + b, queries at the last Sq key positions
  // and beyond (Sq - 2 of them see keys, the others sit past the keys).
  std::vector<index_t> kpos(B * Sk);
  index_t q_first[B];
  for (index_t b = 0; b < B; ++b) {
    for (index_t j = 0; j < Sk; ++j) kpos[b * Sk + j] = shift + 1 + b + j;
    q_first[b] = shift + Sk - Sq + 3 + b;
  }
  posenc::attention_options<float> opt;
  opt.causal = var.causal;
  opt.sliding_window = var.window;
  opt.k_positions = posenc::position_span::ids(kpos.data(), B, Sk);
  opt.q_positions = posenc::position_span::per_batch({q_first, B});
  posenc::attention<Path>(posenc::make_bshd<const float>(q.data(), B, Sq, Hq, D),
                          posenc::make_bshd<const float>(k.data(), B, Sk, Hkv, D),
                          posenc::make_bshd<const float>(v.data(), B, Sk, Hkv, D),
                          posenc::make_bshd(out.data(), B, Sq, Hq, D), enc, opt);
  return out;
}

/// Calls f(name, encoder) for the encoders that see positions only through p_j - p_i.
template <class F>
void for_each_relative(F&& f) {
  f("none", posenc::none{});
  f("alibi paper", posenc::alibi<float>(posenc::alibi_form::paper, Hq));
  f("alibi symmetric", posenc::alibi<float>(posenc::alibi_form::symmetric, Hq));
  f("t5 bidirectional", posenc::t5_bias<float>({Hq, true, 32, 128}, std::uint64_t{5}, 0.5));
  f("t5 causal", posenc::t5_bias<float>({Hq, false, 32, 128}, std::uint64_t{6}, 0.5));
  f("clipped", posenc::clipped_bias<float>(3, Hq, std::uint64_t{7}, 0.5));
  f("shaw keys and values", posenc::shaw<float>(3, D, posenc::shaw_terms::keys_and_values, std::uint64_t{8}, 0.5));
}

}  // namespace

TEST_CASE("positions at the top of the accepted range give the results at small positions", "[properties]") {
  // The largest position of the problem (the last query of the last batch entry:
  // shift + Sk - Sq + 3 + (B - 1) + (Sq - 1) = shift + Sk + B + 1) lands on position_limit.
  index_t const top = posenc::position_limit - (Sk + B + 1);
  index_t const shifts[] = {top, top / 2, posenc::position_limit / 3};
  variant const variants[] = {{"bidirectional", false, 0},
                              {"causal", true, 0},
                              {"sliding window 4", false, 4},
                              {"sliding window INT64_MAX", false, std::numeric_limits<index_t>::max()}};
  for_each_relative([&](char const* enc_name, auto const& enc) {
    for (variant const& var : variants) {
      for (index_t shift : shifts) {
        SECTION(std::string(enc_name) + ", " + var.name + ", shift " + std::to_string(shift)) {
          std::vector<float> const ref_small = run<posenc::path::reference>(enc, var, 0);
          std::vector<float> const ref_big = run<posenc::path::reference>(enc, var, shift);
          CHECK(ref_big == ref_small);
          std::vector<float> const fused_small = run<posenc::path::fused>(enc, var, 0);
          std::vector<float> const fused_big = run<posenc::path::fused>(enc, var, shift);
          CHECK(fused_big == fused_small);
          std::vector<float> const mat_big = run<posenc::path::materialized>(enc, var, shift);
          CHECK(mat_big == run<posenc::path::materialized>(enc, var, 0));
          bool changed = false;
          for (float x : ref_small) changed = changed || x != 42.0f;
          CHECK(changed);
        }
      }
    }
  });
}
}  // namespace properties_position_range_tests
