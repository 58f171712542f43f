// SPDX-License-Identifier: MIT
// Packed variable-length attention equals each sequence run alone on a contiguous layout.
#include <posenc/attention/packed.hpp>
#include <posenc/encoding/alibi.hpp>
#include <posenc/encoding/clipped_bias.hpp>
#include <posenc/encoding/compose.hpp>
#include <posenc/encoding/none.hpp>
#include <posenc/encoding/rope.hpp>
#include <posenc/encoding/shaw.hpp>
#include <posenc/encoding/t5_bias.hpp>
#include <posenc/encoding/transformer_xl.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "support/catch.hpp"
#include "support/random.hpp"
#include "support/transformer_xl.hpp"

namespace attention_packed_tests {

using posenc::index_t;

namespace {

constexpr index_t Hq = 4, Hkv = 2, D = 8;

/// Query and key lengths of the sequences of one packed call.
struct layout {
  char const* name;
  std::vector<index_t> q_lens, k_lens;
  bool queries_are_keys() const { return q_lens == k_lens; }
};

std::vector<layout> layouts() {
  return {{"prefill", {5, 0, 1, 37, 12, 1}, {5, 0, 1, 37, 12, 1}},
          {"decode and chunks", {1, 0, 3, 1, 2, 1}, {9, 4, 3, 17, 2, 1}}};
}

/// An option set, as the packed call reads it and as each sequence alone reads it.
template <class T>
struct variant {
  std::string name;
  std::function<void(layout const&, posenc::attention_options<T>&)> packed;
  std::function<void(layout const&, index_t, posenc::attention_options<T>&)> alone;
  bool needs_causal_rows = false;  // may place rows before position 0: only under causal
};

/// Storage the variants point into; sized for the layout before use.
template <class T>
struct variant_data {
  std::vector<index_t> key_lengths, q_firsts, q_ids, k_ids, one;
  std::vector<T> mask;
  std::unique_ptr<bool[]> bool_mask;
  std::vector<T> mask_alone;
  std::unique_ptr<bool[]> bool_alone;
};

template <class T>
std::vector<variant<T>> variants(variant_data<T>& d) {
  using opts = posenc::attention_options<T>;
  std::vector<variant<T>> out;
  auto nothing = [](layout const&, index_t, opts&) {};
  out.push_back({"defaults", [](layout const&, opts&) {}, nothing});
  out.push_back({"causal", [](layout const&, opts& o) { o.causal = true; },
                 [](layout const&, index_t, opts& o) { o.causal = true; }});
  out.push_back({"window 4", [](layout const&, opts& o) { o.sliding_window = 4; },
                 [](layout const&, index_t, opts& o) { o.sliding_window = 4; }});
  out.push_back({"scale and softcap",
                 [](layout const&, opts& o) {
                   o.scale = 0.7;
                   o.softcap = 1.5;
                 },
                 [](layout const&, index_t, opts& o) {
                   o.scale = 0.7;
                   o.softcap = 1.5;
                 }});
  out.push_back({"key lengths, causal",
                 [&d](layout const& l, opts& o) {
                   d.key_lengths.clear();
                   for (index_t L : l.k_lens) d.key_lengths.push_back(std::max<index_t>(0, L - 2));
                   o.key_lengths = d.key_lengths;
                   o.causal = true;
                 },
                 [&d](layout const&, index_t s, opts& o) {
                   o.key_lengths = posenc::span<const index_t>(d.key_lengths.data() + s, 1);
                   o.causal = true;
                 }});
  out.push_back({"per-sequence query offsets, key offset",
                 [&d](layout const& l, opts& o) {
                   d.q_firsts.clear();
                   for (std::size_t s = 0; s < l.q_lens.size(); ++s)
                     d.q_firsts.push_back(l.k_lens[s] + 2 - l.q_lens[s] + static_cast<index_t>(s % 3));
                   o.q_positions = posenc::position_span::per_batch(d.q_firsts);
                   o.k_positions = posenc::position_span(3);
                   o.causal = true;
                 },
                 [&d](layout const&, index_t s, opts& o) {
                   o.q_positions = posenc::position_span(d.q_firsts[static_cast<std::size_t>(s)]);
                   o.k_positions = posenc::position_span(3);
                   o.causal = true;
                 }});
  out.push_back({"explicit ids",
                 [&d](layout const& l, opts& o) {
                   d.q_ids.clear();
                   d.k_ids.clear();
                   for (std::size_t s = 0; s < l.q_lens.size(); ++s) {
                     // keys at 2j (gaps), queries at the positions of their last keys
                     for (index_t j = 0; j < l.k_lens[s]; ++j) d.k_ids.push_back(2 * j);
                     for (index_t i = 0; i < l.q_lens[s]; ++i)
                       d.q_ids.push_back(std::max<index_t>(0, 2 * (l.k_lens[s] - l.q_lens[s] + i)));
                   }
                   o.q_positions = posenc::position_span::ids(d.q_ids.data(), 1, static_cast<index_t>(d.q_ids.size()));
                   o.k_positions = posenc::position_span::ids(d.k_ids.data(), 1, static_cast<index_t>(d.k_ids.size()));
                   o.causal = true;
                 },
                 [&d](layout const& l, index_t s, opts& o) {
                   index_t q0 = 0, k0 = 0;
                   for (index_t t = 0; t < s; ++t) {
                     q0 += l.q_lens[static_cast<std::size_t>(t)];
                     k0 += l.k_lens[static_cast<std::size_t>(t)];
                   }
                   o.q_positions = posenc::position_span::ids(d.q_ids.data() + q0, 1, l.q_lens[static_cast<std::size_t>(s)]);
                   o.k_positions = posenc::position_span::ids(d.k_ids.data() + k0, 1, l.k_lens[static_cast<std::size_t>(s)]);
                   o.causal = true;
                 }});
  out.push_back({"additive key mask and boolean per-query mask",
                 [&d](layout const& l, opts& o) {
                   index_t Sq = 0, Sk = 0;
                   for (index_t x : l.q_lens) Sq += x;
                   for (index_t x : l.k_lens) Sk += x;
                   d.mask.assign(static_cast<std::size_t>(Sk), T(0));
                   for (index_t j = 0; j < Sk; ++j)
                     d.mask[static_cast<std::size_t>(j)] =
                         j % 5 == 3 ? -std::numeric_limits<T>::infinity() : static_cast<T>(0.1 * static_cast<double>(j % 3));
                   d.bool_mask.reset(new bool[static_cast<std::size_t>(Hq * Sq * Sk)]);
                   for (index_t t = 0; t < Hq * Sq * Sk; ++t) d.bool_mask[static_cast<std::size_t>(t)] = (t * 7) % 11 != 4;
                   o.mask = posenc::make_mask<T>(d.mask.data(), 1, 1, 1, Sk);
                   o.bool_mask = posenc::make_mask<bool>(d.bool_mask.get(), 1, Hq, Sq, Sk);
                 },
                 [&d](layout const& l, index_t s, opts& o) {
                   index_t Sq = 0, Sk = 0, q0 = 0, k0 = 0;
                   for (index_t x : l.q_lens) Sq += x;
                   for (index_t x : l.k_lens) Sk += x;
                   for (index_t t = 0; t < s; ++t) {
                     q0 += l.q_lens[static_cast<std::size_t>(t)];
                     k0 += l.k_lens[static_cast<std::size_t>(t)];
                   }
                   index_t const sq = l.q_lens[static_cast<std::size_t>(s)], sk = l.k_lens[static_cast<std::size_t>(s)];
                   d.mask_alone.assign(d.mask.begin() + k0, d.mask.begin() + k0 + sk);
                   d.bool_alone.reset(new bool[static_cast<std::size_t>(std::max<index_t>(1, Hq * sq * sk))]);
                   for (index_t h = 0; h < Hq; ++h)
                     for (index_t i = 0; i < sq; ++i)
                       for (index_t j = 0; j < sk; ++j)
                         d.bool_alone[static_cast<std::size_t>((h * sq + i) * sk + j)] =
                             d.bool_mask[static_cast<std::size_t>((h * Sq + q0 + i) * Sk + k0 + j)];
                   o.mask = posenc::make_mask<T>(d.mask_alone.data(), 1, 1, 1, sk);
                   o.bool_mask = posenc::make_mask<bool>(d.bool_alone.get(), 1, Hq, sq, sk);
                 }});
  return out;
}

/// Runs one packed call and every sequence alone (on contiguous copies), and compares out and lse:
/// bit for bit with one thread, and within a few float ulps when the packed call uses two.
template <class Path, class T, class E>
void check_packed(E const& enc, std::string const& enc_name) {
  variant_data<T> data;
  for (layout const& l : layouts()) {
    index_t const n = static_cast<index_t>(l.q_lens.size());
    std::vector<index_t> const cu_q = posenc::cumulative_lengths(l.q_lens), cu_k = posenc::cumulative_lengths(l.k_lens);
    index_t const Sq = cu_q.back(), Sk = cu_k.back();
    std::vector<T> const q = posenc_test::random_vector<T>(static_cast<std::size_t>(Sq * Hq * D), 41);
    std::vector<T> const k = posenc_test::random_vector<T>(static_cast<std::size_t>(Sk * Hkv * D), 42);
    std::vector<T> const v = posenc_test::random_vector<T>(static_cast<std::size_t>(Sk * Hkv * D), 43);
    for (variant<T> const& var : variants(data)) {
      for (int threads : {1, 2}) {
        std::vector<T> out(static_cast<std::size_t>(Sq * Hq * D), T(-7)), lse(static_cast<std::size_t>(Hq * Sq), T(-7));
        posenc::attention_options<T> opt;
        var.packed(l, opt);
        opt.lse = lse;
        opt.threads = threads;
        posenc::attention<Path, T>(posenc::make_bshd(q.data(), 1, Sq, Hq, D), posenc::make_bshd(k.data(), 1, Sk, Hkv, D),
                                   posenc::make_bshd(v.data(), 1, Sk, Hkv, D), posenc::make_bshd(out.data(), 1, Sq, Hq, D),
                                   posenc::packed_sequences{cu_q, cu_k}, enc, opt);
        for (index_t s = 0; s < n; ++s) {
          index_t const sq = l.q_lens[static_cast<std::size_t>(s)], sk = l.k_lens[static_cast<std::size_t>(s)];
          index_t const q0 = cu_q[static_cast<std::size_t>(s)], k0 = cu_k[static_cast<std::size_t>(s)];
          std::vector<T> const qs(q.begin() + q0 * Hq * D, q.begin() + (q0 + sq) * Hq * D);
          std::vector<T> const ks(k.begin() + k0 * Hkv * D, k.begin() + (k0 + sk) * Hkv * D);
          std::vector<T> const vs(v.begin() + k0 * Hkv * D, v.begin() + (k0 + sk) * Hkv * D);
          std::vector<T> want(static_cast<std::size_t>(sq * Hq * D), T(5)), want_lse(static_cast<std::size_t>(Hq * sq));
          posenc::attention_options<T> one;
          var.alone(l, s, one);
          one.lse = want_lse;
          one.threads = 1;
          posenc::attention<Path, T>(posenc::make_bshd(qs.data(), 1, sq, Hq, D), posenc::make_bshd(ks.data(), 1, sk, Hkv, D),
                                     posenc::make_bshd(vs.data(), 1, sk, Hkv, D),
                                     posenc::make_bshd(want.data(), 1, sq, Hq, D), enc, one);
          double worst = 0, worst_lse = 0;
          bool same_inf = true;
          for (std::size_t t = 0; t < want.size(); ++t)
            worst = std::max(worst, std::abs(static_cast<double>(out[static_cast<std::size_t>(q0 * Hq * D) + t] - want[t])));
          for (index_t h = 0; h < Hq; ++h)
            for (index_t i = 0; i < sq; ++i) {
              T const g = lse[static_cast<std::size_t>(h * Sq + q0 + i)], e = want_lse[static_cast<std::size_t>(h * sq + i)];
              if (std::isinf(e) || std::isinf(g))
                same_inf = same_inf && g == e;
              else
                worst_lse = std::max(worst_lse, std::abs(static_cast<double>(g - e)));
            }
          // One thread: the same kernel on the same rows, bit for bit (the reference and fused paths). Eigen's
          // GEMM (materialized) blocks its sums by the operands' alignment, which differs between a packed
          // row and a fresh buffer, and two threads may split a sequence's keys: both reorder sums, a few
          // ulps of the values (all below 1 here).
          bool const exact = threads == 1 && !std::is_same_v<Path, posenc::path::materialized>;
          double const tol = exact ? 0.0 : 16 * static_cast<double>(std::numeric_limits<T>::epsilon());
          INFO("max difference " << worst << ", of lse " << worst_lse);
          INFO(enc_name << ", " << l.name << ", " << var.name << ", threads " << threads << ", sequence " << s << " ("
                        << sq << " queries, " << sk << " keys)");
          CHECK(worst <= tol);
          CHECK(worst_lse <= tol * 64);
          CHECK(same_inf);
        }
      }
    }
  }
}

template <class Path, class T>
void check_every_encoder() {
  using posenc::rope_layout;
  using posenc::rope_scaling;
  check_packed<Path, T>(posenc::none{}, "none");
  check_packed<Path, T>(posenc::rope<T>(rope_layout::half_split, D), "rope");
  check_packed<Path, T>(posenc::rope<T>(rope_layout::interleaved, D, {D / 2, 500.0}), "rope interleaved partial");
  check_packed<Path, T>(posenc::rope<T>(rope_layout::half_split, D, {std::nullopt, 10000.0, rope_scaling::linear(4.0)}),
                        "rope linear");
  check_packed<Path, T>(
      posenc::rope<T>(rope_layout::half_split, D, {std::nullopt, 10000.0, rope_scaling::dynamic_ntk(2.0, 8)}),
      "rope dynamic NTK (frequencies from each sequence's own length)");
  check_packed<Path, T>(posenc::rope<T>(rope_layout::half_split, D, {std::nullopt, 10000.0, rope_scaling::yarn(4.0, 16)}),
                        "rope yarn");
  check_packed<Path, T>(
      posenc::rope<T>(rope_layout::half_split, D, {std::nullopt, 10000.0, rope_scaling::llama3(8, 1, 4, 16)}),
      "rope llama3");
  check_packed<Path, T>(
      posenc::rope<T>(rope_layout::half_split, D,
                      {std::nullopt, 10000.0, rope_scaling::longrope({1.0, 1.5, 2.0, 3.0}, {2.0, 3.0, 5.0, 8.0}, 16, 128)}),
      "rope longrope (short and long factors per sequence)");
  check_packed<Path, T>(posenc::alibi<T>(posenc::alibi_form::paper, Hq), "alibi");
  check_packed<Path, T>(posenc::t5_bias<T>({Hq, true, 32, 128}, std::uint64_t{5}, 0.5), "t5 bidirectional");
  check_packed<Path, T>(posenc::t5_bias<T>({Hq, false, 32, 128}, std::uint64_t{6}, 0.5), "t5 causal");
  check_packed<Path, T>(posenc::clipped_bias<T>(3, Hq, std::uint64_t{7}, 0.5), "clipped");
  check_packed<Path, T>(posenc::shaw<T>(3, D, posenc::shaw_terms::keys_and_values, std::uint64_t{8}, 0.5), "shaw");
  check_packed<Path, T>(posenc::compose(posenc::rope<T>(rope_layout::half_split, D), posenc::alibi<T>(posenc::alibi_form::paper, Hq)),
                        "rope + alibi");
  check_packed<Path, T>(posenc_test::random_transformer_xl<T>(Hq, D, 6, 256, 9), "transformer-xl");
}

}  // namespace

TEMPLATE_TEST_CASE("packed attention: every sequence equals its contiguous call alone, every option and encoder",
                   "[attention][packed]", posenc::path::reference, posenc::path::materialized, posenc::path::fused) {
  check_every_encoder<TestType, float>();
  check_every_encoder<TestType, double>();
}

TEST_CASE("packed attention: path::best and a batched decode step of many sequences", "[attention][packed]") {
  // 40 sequences decoding one token (a few three) over 1 .. 200 keys: one call.
  index_t const n = 40;
  std::vector<index_t> q_lens, k_lens;
  for (index_t s = 0; s < n; ++s) {
    q_lens.push_back(s % 7 == 0 ? 3 : 1);
    k_lens.push_back(1 + (s * 37) % 200);
  }
  std::vector<index_t> const cu_q = posenc::cumulative_lengths(q_lens), cu_k = posenc::cumulative_lengths(k_lens);
  index_t const Sq = cu_q.back(), Sk = cu_k.back();
  std::vector<float> const q = posenc_test::random_vector<float>(static_cast<std::size_t>(Sq * Hq * D), 51);
  std::vector<float> const k = posenc_test::random_vector<float>(static_cast<std::size_t>(Sk * Hkv * D), 52);
  std::vector<float> const v = posenc_test::random_vector<float>(static_cast<std::size_t>(Sk * Hkv * D), 53);
  posenc::rope<float> const rope(posenc::rope_layout::half_split, D);
  std::vector<float> out(static_cast<std::size_t>(Sq * Hq * D));
  posenc::attention_options<float> opt;
  opt.causal = true;
  opt.threads = 1;
  posenc::attention(posenc::make_bshd(q.data(), 1, Sq, Hq, D), posenc::make_bshd(k.data(), 1, Sk, Hkv, D),
                    posenc::make_bshd(v.data(), 1, Sk, Hkv, D), posenc::make_bshd(out.data(), 1, Sq, Hq, D),
                    posenc::packed_sequences{cu_q, cu_k}, rope, opt);
  for (index_t s = 0; s < n; ++s) {
    std::size_t const u = static_cast<std::size_t>(s);
    std::vector<float> want(static_cast<std::size_t>(q_lens[u] * Hq * D));
    posenc::attention(posenc::make_bshd(q.data() + cu_q[u] * Hq * D, 1, q_lens[u], Hq, D),
                      posenc::make_bshd(k.data() + cu_k[u] * Hkv * D, 1, k_lens[u], Hkv, D),
                      posenc::make_bshd(v.data() + cu_k[u] * Hkv * D, 1, k_lens[u], Hkv, D),
                      posenc::make_bshd(want.data(), 1, q_lens[u], Hq, D), rope, opt);
    INFO("sequence " << s);
    CHECK(std::equal(want.begin(), want.end(), out.begin() + cu_q[u] * Hq * D));
  }
}

TEMPLATE_TEST_CASE("packed attention: the scores output holds each sequence's block back to back",
                   "[attention][packed]", posenc::path::reference, posenc::path::materialized) {
  std::vector<index_t> const q_lens{3, 0, 1, 6}, k_lens{5, 2, 1, 6};
  std::vector<index_t> const cu_q = posenc::cumulative_lengths(q_lens), cu_k = posenc::cumulative_lengths(k_lens);
  index_t const Sq = cu_q.back(), Sk = cu_k.back();
  std::vector<double> const q = posenc_test::random_vector<double>(static_cast<std::size_t>(Sq * Hq * D), 61);
  std::vector<double> const k = posenc_test::random_vector<double>(static_cast<std::size_t>(Sk * Hkv * D), 62);
  std::vector<double> const v = posenc_test::random_vector<double>(static_cast<std::size_t>(Sk * Hkv * D), 63);
  posenc::alibi<double> const alibi(posenc::alibi_form::paper, Hq);
  index_t blocks = 0;
  for (std::size_t s = 0; s < q_lens.size(); ++s) blocks += Hq * q_lens[s] * k_lens[s];
  for (auto stage : {posenc::score_stage::raw, posenc::score_stage::biased, posenc::score_stage::probabilities}) {
    std::vector<double> out(static_cast<std::size_t>(Sq * Hq * D)), scores(static_cast<std::size_t>(blocks), -9.0);
    posenc::attention_options<double> opt;
    opt.causal = true;
    opt.scores = scores;
    opt.scores_stage = stage;
    posenc::attention<TestType, double>(posenc::make_bshd(q.data(), 1, Sq, Hq, D), posenc::make_bshd(k.data(), 1, Sk, Hkv, D),
                                        posenc::make_bshd(v.data(), 1, Sk, Hkv, D),
                                        posenc::make_bshd(out.data(), 1, Sq, Hq, D), posenc::packed_sequences{cu_q, cu_k},
                                        alibi, opt);
    index_t at = 0;
    for (std::size_t s = 0; s < q_lens.size(); ++s) {
      index_t const sq = q_lens[s], sk = k_lens[s];
      std::vector<double> want_out(static_cast<std::size_t>(sq * Hq * D)), want(static_cast<std::size_t>(Hq * sq * sk));
      posenc::attention_options<double> one = opt;
      one.scores = want;
      posenc::attention<TestType, double>(posenc::make_bshd(q.data() + cu_q[s] * Hq * D, 1, sq, Hq, D),
                                          posenc::make_bshd(k.data() + cu_k[s] * Hkv * D, 1, sk, Hkv, D),
                                          posenc::make_bshd(v.data() + cu_k[s] * Hkv * D, 1, sk, Hkv, D),
                                          posenc::make_bshd(want_out.data(), 1, sq, Hq, D), alibi, one);
      INFO("sequence " << s << ", stage " << static_cast<int>(stage));
      CHECK(std::equal(want.begin(), want.end(), scores.begin() + at));
      at += Hq * sq * sk;
    }
    CHECK(at == blocks);
  }
}

TEST_CASE("docs/serving.md: a packed causal prefill with RoPE, then one decode step of the same sequences",
          "[docs][packed]") {
  // Three prompts of 5, 1 and 7 tokens back to back: nothing is padded.
  std::vector<index_t> const lengths{5, 1, 7};
  std::vector<index_t> const cu = posenc::cumulative_lengths(lengths);  // {0, 5, 6, 13}
  index_t const total = cu.back(), heads = 4, head_dim = 8;
  auto uniform = [](index_t n, unsigned seed) {  // n seeded values in [-1, 1)
    std::mt19937_64 gen(seed);
    std::uniform_real_distribution<double> dist(-1.0, 1.0);
    std::vector<float> x(static_cast<std::size_t>(n));
    for (float& e : x) e = static_cast<float>(dist(gen));
    return x;
  };
  auto q = uniform(total * heads * head_dim, 1);
  auto k = uniform(total * heads * head_dim, 2);
  auto v = uniform(total * heads * head_dim, 3);
  std::vector<float> out(q.size()), lse(heads * total);
  posenc::rope<float> rope(posenc::rope_layout::half_split, head_dim);
  posenc::attention_options<float> opt;
  opt.causal = true;
  opt.lse = lse;  // (heads, total): row h, packed token t at lse[h * total + t]
  posenc::attention(posenc::make_bshd<const float>(q.data(), 1, total, heads, head_dim),
                    posenc::make_bshd<const float>(k.data(), 1, total, heads, head_dim),
                    posenc::make_bshd<const float>(v.data(), 1, total, heads, head_dim),
                    posenc::make_bshd(out.data(), 1, total, heads, head_dim), posenc::packed_sequences{cu, cu}, rope,
                    opt);
  // The second prompt (one token) sees only itself: its output is its value row.
  for (index_t h = 0; h < heads; ++h)
    for (index_t d = 0; d < head_dim; ++d)
      CHECK(out[static_cast<std::size_t>((5 * heads + h) * head_dim + d)] ==
            v[static_cast<std::size_t>((5 * heads + h) * head_dim + d)]);

  // A decode step: one new query per sequence over its keys (here the prompts' own keys),
  // each query at the position after its sequence's last key (the default: bottom-right).
  std::vector<index_t> const cu_q{0, 1, 2, 3};
  auto q1 = uniform(3 * heads * head_dim, 4);
  std::vector<float> out1(q1.size());
  posenc::attention_options<float> step;
  step.q_positions = posenc::position_span::per_batch(lengths);  // token i of sequence s at lengths[s] + i
  posenc::attention(posenc::make_bshd<const float>(q1.data(), 1, 3, heads, head_dim),
                    posenc::make_bshd<const float>(k.data(), 1, total, heads, head_dim),
                    posenc::make_bshd<const float>(v.data(), 1, total, heads, head_dim),
                    posenc::make_bshd(out1.data(), 1, 3, heads, head_dim), posenc::packed_sequences{cu_q, cu}, rope,
                    step);
  for (float x : out1) CHECK(std::isfinite(x));
}

TEMPLATE_TEST_CASE("packed attention: queries of a sequence without keys give zeros and lse -inf, the others are untouched by them",
                   "[attention][packed]", posenc::path::reference, posenc::path::materialized, posenc::path::fused) {
  // Sequence 0: 2 queries, no key; sequence 1: 1 query over 3 keys; sequence 2: nothing at all.
  std::vector<index_t> const cu_q{0, 2, 3, 3}, cu_k{0, 0, 3, 3};
  std::vector<float> const q = posenc_test::random_vector<float>(3 * Hq * D, 71);
  std::vector<float> const k = posenc_test::random_vector<float>(3 * Hkv * D, 72);
  std::vector<float> const v = posenc_test::random_vector<float>(3 * Hkv * D, 73);
  posenc::alibi<float> const alibi(posenc::alibi_form::paper, Hq);
  for (int threads : {1, 2}) {
    std::vector<float> out(3 * Hq * D, 9.0f), lse(Hq * 3, 9.0f), want(Hq * D), want_lse(Hq);
    posenc::attention_options<float> opt;
    opt.causal = true;  // sequence 0's rows sit before position 0 (bottom-right against no key)
    opt.lse = lse;
    opt.threads = threads;
    posenc::attention<TestType, float>(posenc::make_bshd(q.data(), 1, 3, Hq, D), posenc::make_bshd(k.data(), 1, 3, Hkv, D),
                                       posenc::make_bshd(v.data(), 1, 3, Hkv, D), posenc::make_bshd(out.data(), 1, 3, Hq, D),
                                       posenc::packed_sequences{cu_q, cu_k}, alibi, opt);
    posenc::attention_options<float> one = opt;
    one.lse = want_lse;
    posenc::attention<TestType, float>(posenc::make_bshd(q.data() + 2 * Hq * D, 1, 1, Hq, D),
                                       posenc::make_bshd(k.data(), 1, 3, Hkv, D), posenc::make_bshd(v.data(), 1, 3, Hkv, D),
                                       posenc::make_bshd(want.data(), 1, 1, Hq, D), alibi, one);
    INFO("threads " << threads);
    for (index_t t = 0; t < 2 * Hq * D; ++t) CHECK(out[static_cast<std::size_t>(t)] == 0.0f);
    for (index_t h = 0; h < Hq; ++h) {
      CHECK(lse[static_cast<std::size_t>(h * 3)] == -std::numeric_limits<float>::infinity());
      CHECK(lse[static_cast<std::size_t>(h * 3 + 1)] == -std::numeric_limits<float>::infinity());
      CHECK(lse[static_cast<std::size_t>(h * 3 + 2)] == want_lse[static_cast<std::size_t>(h)]);
    }
    CHECK(std::equal(want.begin(), want.end(), out.begin() + 2 * Hq * D));
  }
}
}  // namespace attention_packed_tests
