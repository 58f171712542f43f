// SPDX-License-Identifier: MIT
// posenc::attention(q, cache, out, enc, opt): rotation state, key positions and lengths read from the kv_cache.
#include <posenc/attention/attention.hpp>
#include <posenc/attention/kv_cache.hpp>
#include <posenc/attention/packed.hpp>
#include <posenc/attention/paged_attention.hpp>
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
#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/random.hpp"
#include "support/transformer_xl.hpp"

namespace attention_cache_attention_tests {

using posenc::index_t;
using posenc_test::random_vector;

namespace {

// (batch, seq, heads, dim) sizes of one decode test.
index_t const B = 2, S = 9, Hq = 4, Hkv = 2, D = 8;

struct sequence {
  std::vector<float> q, k, v;
  explicit sequence(std::uint64_t seed)
      : q(random_vector<float>(static_cast<std::size_t>(B * S * Hq * D), seed)),
        k(random_vector<float>(static_cast<std::size_t>(B * S * Hkv * D), seed + 1)),
        v(random_vector<float>(static_cast<std::size_t>(B * S * Hkv * D), seed + 2)) {}
  // Tokens [s, s + n) of x (heads h) as a strided view of the whole sequence.
  static posenc::view<const float> part(std::vector<float> const& x, index_t s, index_t n, index_t h) {
    return {x.data() + s * h * D, B, n, h, D, S * h * D, h * D, D, 1};
  }
};

// One causal prefill over all S tokens at positions first + i.
template <class Path, class E>
std::vector<float> prefill(sequence const& x, E const& enc, index_t first) {
  std::vector<float> out(x.q.size());
  posenc::attention_options<float> opt;
  opt.causal = true;
  opt.q_positions = posenc::position_span(first);
  opt.k_positions = posenc::position_span(first);
  posenc::attention<Path>(sequence::part(x.q, 0, S, Hq), sequence::part(x.k, 0, S, Hkv),
                          sequence::part(x.v, 0, S, Hkv), posenc::make_bshd(out.data(), B, S, Hq, D), enc, opt);
  return out;
}

// The same tokens appended to a cache starting at `first` (a prompt of 3, then one at a time),
// each step attending over the cache with the cache overload.
template <class Path, class E>
std::vector<float> decode(sequence const& x, E const& enc, index_t first) {
  std::vector<float> out(x.q.size());
  posenc::kv_cache<float> cache(B, Hkv, D, 0, first);
  posenc::attention_options<float> opt;
  opt.causal = true;
  for (index_t s = 0; s < S;) {
    index_t const n = s == 0 ? 3 : 1;
    cache.append(sequence::part(x.k, s, n, Hkv), sequence::part(x.v, s, n, Hkv), enc);
    posenc::view<float> o{out.data() + s * Hq * D, B, n, Hq, D, S * Hq * D, Hq * D, D, 1};
    posenc::attention<Path>(sequence::part(x.q, s, n, Hq), cache, o, enc, opt);
    s += n;
  }
  return out;
}

template <class F>
void for_each_cached_encoder(F&& f) {
  f("rope", posenc::rope<float>(posenc::rope_layout::half_split, D));
  posenc::rope<float> reserved(posenc::rope_layout::interleaved, D);
  reserved.reserve(4096);
  f("rope reserved", reserved);
  f("alibi", posenc::alibi<float>(posenc::alibi_form::paper, Hq));
  f("t5 causal", posenc::t5_bias<float>({Hq, false, 32, 128}, 5, 0.5));
  f("t5 bidirectional", posenc::t5_bias<float>({Hq, true, 32, 128}, 6, 0.5));
  f("rope + alibi", posenc::compose(posenc::rope<float>(posenc::rope_layout::half_split, D),
                                    posenc::alibi<float>(posenc::alibi_form::paper, Hq)));
  f("none", posenc::none{});
}

}  // namespace

TEMPLATE_TEST_CASE("attention over a kv_cache: decode step by step equals one prefill", "[kv_cache]",
                   posenc::path::reference, posenc::path::materialized, posenc::path::fused) {
  sequence const x(11);
  for (index_t first : {0, 1000}) {
    for_each_cached_encoder([&](std::string const& name, auto const& enc) {
      INFO(name << ", first_position " << first);
      auto const want = prefill<TestType>(x, enc, first);
      auto const got = decode<TestType>(x, enc, first);
      CHECK(posenc_test::max_abs_diff(want, got) < 2e-5);
    });
  }
}

TEST_CASE("attention over a kv_cache: positions come from the cache, not from key indices", "[kv_cache]") {
  // first_position > 0: query i of the last step sits at next_position() - Sq + i, key j at
  // first_position() + j. ALiBi's key_only form sees absolute key positions, so a wrong offset shows.
  sequence const x(21);
  posenc::alibi<float> enc(posenc::alibi_form::key_only, Hq);
  posenc::kv_cache<float> cache(B, Hkv, D, 0, 40);
  cache.append(sequence::part(x.k, 0, S, Hkv), sequence::part(x.v, 0, S, Hkv), enc);
  std::vector<float> got(static_cast<std::size_t>(B * 2 * Hq * D)), want(got.size());
  posenc::attention_options<float> opt;
  opt.causal = true;
  posenc::attention<posenc::path::reference>(sequence::part(x.q, S - 2, 2, Hq), cache,
                                             posenc::make_bshd(got.data(), B, 2, Hq, D), enc, opt);
  opt.q_positions = posenc::position_span(40 + S - 2);
  opt.k_positions = posenc::position_span(40);
  posenc::attention<posenc::path::reference>(sequence::part(x.q, S - 2, 2, Hq), cache.keys(), cache.values(),
                                             posenc::make_bshd(want.data(), B, 2, Hq, D), enc, opt);
  CHECK(posenc_test::max_abs_diff(want, got) < 1e-6);
  CHECK(cache.first_position() == 40);
  CHECK(cache.next_position() == 40 + S);

  SECTION("explicit q_positions are kept") {
    // The first query placed at the cache's first position sees only key 0 under causal: out = v_0.
    std::vector<float> one(static_cast<std::size_t>(B * 1 * Hq * D));
    posenc::attention_options<float> o;
    o.causal = true;
    o.q_positions = posenc::position_span(40);
    posenc::attention<posenc::path::reference>(sequence::part(x.q, 0, 1, Hq), cache,
                                               posenc::make_bshd(one.data(), B, 1, Hq, D), enc, o);
    for (index_t b = 0; b < B; ++b)
      for (index_t h = 0; h < Hq; ++h)
        for (index_t t = 0; t < D; ++t)
          CHECK(one[static_cast<std::size_t>((b * Hq + h) * D + t)] ==
                posenc_test::Approx(cache.values()(b, 0, h / (Hq / Hkv), t)).margin(1e-6));
  }
}

TEST_CASE("attention over a kv_cache: the manual form without keys_rotated is wrong, the overload right",
          "[kv_cache]") {
  sequence const x(31);
  posenc::rope<float> rope(posenc::rope_layout::half_split, D);
  auto const want = prefill<posenc::path::reference>(x, rope, 0);
  posenc::kv_cache<float> cache(B, Hkv, D);
  cache.append(sequence::part(x.k, 0, S, Hkv), sequence::part(x.v, 0, S, Hkv), rope);
  CHECK(cache.keys_rotated());
  std::vector<float> manual(x.q.size()), overload(x.q.size());
  posenc::attention_options<float> opt;
  opt.causal = true;
  // keys_rotated forgotten: the cached keys are rotated a second time.
  posenc::attention<posenc::path::reference>(sequence::part(x.q, 0, S, Hq), cache.keys(), cache.values(),
                                             posenc::make_bshd(manual.data(), B, S, Hq, D), rope, opt);
  posenc::attention<posenc::path::reference>(sequence::part(x.q, 0, S, Hq), cache,
                                             posenc::make_bshd(overload.data(), B, S, Hq, D), rope, opt);
  CHECK(posenc_test::max_abs_diff(want, manual) > 1e-2);
  CHECK(posenc_test::max_abs_diff(want, overload) < 1e-6);
}

TEST_CASE("attention over a kv_cache: options and encoders that contradict the cache throw", "[kv_cache][errors]") {
  sequence const x(41);
  posenc::rope<float> rope(posenc::rope_layout::half_split, D);
  posenc::kv_cache<float> rotated(B, Hkv, D), plain(B, Hkv, D);
  rotated.append(sequence::part(x.k, 0, 4, Hkv), sequence::part(x.v, 0, 4, Hkv), rope);
  plain.append(sequence::part(x.k, 0, 4, Hkv), sequence::part(x.v, 0, 4, Hkv), posenc::none{});
  CHECK(!plain.keys_rotated());
  std::vector<float> out(static_cast<std::size_t>(B * 1 * Hq * D), 42.0f);
  auto const q = sequence::part(x.q, 4, 1, Hq);
  auto const o = posenc::make_bshd(out.data(), B, 1, Hq, D);
  posenc::attention_options<float> opt;

  SECTION("k_positions") {
    opt.k_positions = posenc::position_span(0);
    REQUIRE_THROWS_WITH(posenc::attention(q, rotated, o, rope, opt),
                        posenc_test::contains("posenc::attention: k_positions is set, expected unset with a kv_cache"));
  }
  SECTION("key_lengths") {
    std::vector<index_t> lengths{4, 3};
    opt.key_lengths = lengths;
    REQUIRE_THROWS_WITH(posenc::attention(q, rotated, o, rope, opt),
                        posenc_test::contains("posenc::attention: key_lengths has 2 entries, expected none"));
  }
  SECTION("keys_rotated over unrotated keys") {
    opt.keys_rotated = true;
    REQUIRE_THROWS_WITH(posenc::attention(q, plain, o, posenc::none{}, opt),
                        posenc_test::contains("posenc::attention: keys_rotated is true, expected false (the 4 "
                                              "cached keys are stored unrotated)"));
  }
  SECTION("a rotating encoder over unrotated keys") {
    REQUIRE_THROWS_WITH(posenc::attention(q, plain, o, rope, opt),
                        posenc_test::contains("posenc::attention: the encoder's rotates_queries_keys is true, "
                                              "expected false (the 4 cached keys are stored unrotated"));
  }
  SECTION("an encoder that does not rotate over rotated keys") {
    REQUIRE_THROWS_WITH(posenc::attention(q, rotated, o, posenc::alibi<float>(posenc::alibi_form::paper, Hq), opt),
                        posenc_test::contains("posenc::attention: the encoder's rotates_queries_keys is false, "
                                              "expected true (the 4 cached keys are stored rotated"));
  }
  SECTION("an encoder built for another head_dim, alone or in a compose") {
    posenc::rope<float> narrow(posenc::rope_layout::half_split, D / 2);
    REQUIRE_THROWS_WITH(posenc::attention(q, rotated, o, narrow, opt),
                        posenc_test::contains("posenc::attention: encoder head_dim() is 4, expected 8 (cache.head_dim())"));
    auto both = posenc::compose(posenc::alibi<float>(posenc::alibi_form::paper, Hq), narrow);
    REQUIRE_THROWS_WITH(posenc::attention(q, rotated, o, both, opt),
                        posenc_test::contains("posenc::attention: encoder head_dim() is 4, expected 8 (cache.head_dim())"));
  }
  SECTION("q that does not fit the cache") {
    std::vector<float> q3(static_cast<std::size_t>(3 * Hq * D));
    REQUIRE_THROWS_WITH(posenc::attention(posenc::make_bshd<const float>(q3.data(), 3, 1, Hq, D), rotated, o, rope, opt),
                        posenc_test::contains("posenc::attention: q.batch is 3, expected 2 (cache.batch())"));
    REQUIRE_THROWS_WITH(posenc::attention(posenc::make_bshd<const float>(q3.data(), B, 1, Hq, 6), rotated, o, rope, opt),
                        posenc_test::contains("posenc::attention: q.dim is 6, expected 8 (cache.head_dim())"));
  }
  SECTION("append with a rotating encoder onto unrotated keys") {
    REQUIRE_THROWS_WITH(plain.append(sequence::part(x.k, 4, 1, Hkv), sequence::part(x.v, 4, 1, Hkv), rope),
                        posenc_test::contains("posenc::kv_cache::append: the encoder's rotates_queries_keys is true, "
                                              "expected false (the 4 cached keys are stored unrotated"));
    CHECK(plain.length() == 4);
    plain.clear();  // an empty cache takes either encoder
    plain.append(sequence::part(x.k, 4, 1, Hkv), sequence::part(x.v, 4, 1, Hkv), rope);
    CHECK(plain.keys_rotated());
  }
  for (float t : out) CHECK(t == 42.0f);
}

namespace {

// Tokens of one sequence of `len` tokens: q (len, Hq, D), k and v (len, Hkv, D).
struct sequence_tokens {
  std::vector<float> q, k, v;
  sequence_tokens(index_t len, std::uint64_t seed)
      : q(random_vector<float>(static_cast<std::size_t>(len * Hq * D), seed)),
        k(random_vector<float>(static_cast<std::size_t>(len * Hkv * D), seed + 1)),
        v(random_vector<float>(static_cast<std::size_t>(len * Hkv * D), seed + 2)) {}
  static posenc::view<const float> rows(std::vector<float> const& x, index_t s, index_t n, index_t h) {
    return posenc::make_bshd<const float>(x.data() + s * h * D, 1, n, h, D);
  }
};

// Sequences of a paged_kv_cache at first positions 0, 37 and 1000 (lengths 20, 45, 30),
// each attended by its last Sq tokens.
index_t const n_seq = 3;
index_t const seq_first[n_seq] = {0, 37, 1000}, seq_len[n_seq] = {20, 45, 30};

template <class F>
void for_each_offset_encoder(F&& f) {
  f("none", posenc::none{});
  f("rope", posenc::rope<float>(posenc::rope_layout::half_split, D));
  f("alibi paper", posenc::alibi<float>(posenc::alibi_form::paper, Hq));
  f("alibi symmetric", posenc::alibi<float>(posenc::alibi_form::symmetric, Hq));
  f("alibi key_only", posenc::alibi<float>(posenc::alibi_form::key_only, Hq));
  f("alibi shifted", posenc::alibi<float>(posenc::alibi_form::shifted, Hq, 2048));
  f("t5", posenc::t5_bias<float>({Hq, true, 32, 128}, 6, 0.5));
  f("clipped", posenc::clipped_bias<float>(6, Hq, 7, 0.5));
  f("shaw keys+values", posenc::shaw<float>(4, D, posenc::shaw_terms::keys_and_values, 8, 0.5));
  f("transformer-xl", posenc_test::random_transformer_xl<float>(Hq, D, 6, 64, 9));
  // Memory cut to 8 keys: every kept key within 8 + Sq - 1 <= 19 positions, less than the sequences.
  f("transformer-xl memory 8", posenc_test::random_transformer_xl<float>(Hq, D, 6, 19, 10, 8));
  f("rope + alibi key_only", posenc::compose(posenc::rope<float>(posenc::rope_layout::half_split, D),
                                             posenc::alibi<float>(posenc::alibi_form::key_only, Hq)));
  f("t5 + alibi paper", posenc::compose(posenc::t5_bias<float>({Hq, false, 32, 128}, 5, 0.5),
                                        posenc::alibi<float>(posenc::alibi_form::paper, Hq)));
}

// |want - got| within 2e-5 (out) or 2e-5 relative (lse, which grows with the positions under
// ALiBi's key-only form: about slope x 1000).
bool close_values(std::vector<float> const& want, std::vector<float> const& got) {
  for (std::size_t i = 0; i < want.size(); ++i) {
    double const w = want[i], g = got[i];
    if (std::isinf(w) && w == g) continue;
    if (!(std::abs(w - g) <= 2e-5 * std::max(1.0, std::abs(w)))) return false;
  }
  return true;
}

// Paged (n_seq entries of Sq queries) and packed calls against posenc::attention on each
// sequence at the same positions: out and lse.
template <class Path, class E>
void check_offset_positions(E const& enc, index_t Sq, posenc::attention_options<float> const& opt) {
  std::vector<sequence_tokens> tok;
  posenc::paged_kv_cache<float> cache(40, 8, Hkv, D);
  std::vector<index_t> ids;
  std::vector<float> q;
  std::vector<float> want_out, want_lse(static_cast<std::size_t>(n_seq * Hq * Sq));
  for (index_t s = 0; s < n_seq; ++s) {
    index_t const L = seq_len[s], first = seq_first[s];
    tok.emplace_back(L, 500 + 10 * static_cast<std::uint64_t>(s));
    sequence_tokens const& t = tok.back();
    ids.push_back(cache.add_sequence(first));
    cache.append(ids.back(), t.rows(t.k, 0, L, Hkv), t.rows(t.v, 0, L, Hkv), enc);
    q.insert(q.end(), t.q.begin() + (L - Sq) * Hq * D, t.q.end());
    std::vector<float> out(static_cast<std::size_t>(Sq * Hq * D));
    posenc::attention_options<float> o = opt;
    o.q_positions = posenc::position_span(first + L - Sq);
    o.k_positions = posenc::position_span(first);
    o.lse = {want_lse.data() + s * Hq * Sq, Hq * Sq};
    posenc::attention<Path>(t.rows(t.q, L - Sq, Sq, Hq), t.rows(t.k, 0, L, Hkv), t.rows(t.v, 0, L, Hkv),
                            posenc::make_bshd(out.data(), 1, Sq, Hq, D), enc, o);
    want_out.insert(want_out.end(), out.begin(), out.end());
  }
  auto const qv = posenc::make_bshd<const float>(q.data(), n_seq, Sq, Hq, D);

  std::vector<float> out(want_out.size(), -7.0f), lse(want_lse.size(), -7.0f);
  posenc::attention_options<float> o = opt;
  o.lse = lse;
  posenc::attention<Path>(qv, cache, ids, posenc::make_bshd(out.data(), n_seq, Sq, Hq, D), enc, o);
  CHECK(close_values(want_out, out));
  CHECK(close_values(want_lse, lse));

  // Packed: the sequences back to back, each at its own first position; lse is (Hq, total queries).
  std::vector<float> pk, pv;
  std::vector<index_t> lens_q(n_seq, Sq), lens_k(seq_len, seq_len + n_seq);
  for (auto const& t : tok) {
    pk.insert(pk.end(), t.k.begin(), t.k.end());
    pv.insert(pv.end(), t.v.begin(), t.v.end());
  }
  std::vector<index_t> const cu_q = posenc::cumulative_lengths(lens_q), cu_k = posenc::cumulative_lengths(lens_k);
  std::vector<index_t> const q_first = {seq_first[0] + seq_len[0] - Sq, seq_first[1] + seq_len[1] - Sq,
                                        seq_first[2] + seq_len[2] - Sq};
  index_t const keys = cu_k.back();
  std::vector<float> pout(want_out.size(), -7.0f), plse(want_lse.size(), -7.0f);
  posenc::attention_options<float> po = opt;
  po.q_positions = posenc::position_span::per_batch(q_first);
  po.k_positions = posenc::position_span::per_batch(posenc::span<const index_t>(seq_first, n_seq));
  po.lse = plse;
  posenc::attention<Path>(posenc::make_bshd<const float>(q.data(), 1, n_seq * Sq, Hq, D),
                          posenc::make_bshd<const float>(pk.data(), 1, keys, Hkv, D),
                          posenc::make_bshd<const float>(pv.data(), 1, keys, Hkv, D),
                          posenc::make_bshd(pout.data(), 1, n_seq * Sq, Hq, D), posenc::packed_sequences{cu_q, cu_k},
                          enc, po);
  std::vector<float> plse_by_seq;  // (n_seq, Hq, Sq), as want_lse
  for (index_t s = 0; s < n_seq; ++s)
    for (index_t h = 0; h < Hq; ++h)
      for (index_t i = 0; i < Sq; ++i)
        plse_by_seq.push_back(plse[static_cast<std::size_t>(h * n_seq * Sq + s * Sq + i)]);
  CHECK(close_values(want_out, pout));
  CHECK(close_values(want_lse, plse_by_seq));
}

}  // namespace

TEMPLATE_TEST_CASE("paged and packed at offset positions: out and lse of the contiguous call", "[paged][packed]",
                   posenc::path::reference, posenc::path::fused) {
  for (bool causal : {true, false}) {
    posenc::attention_options<float> opt;
    opt.causal = causal;
    // A decode step (the row kernel), a speculative step of 3, and a prefill chunk of 12 queries
    // (12 x 2 query heads per kv head: the lane kernel where the encoder has no relative key terms).
    for (index_t Sq : {1, 3, 12}) {
      for_each_offset_encoder([&](std::string const& name, auto const& enc) {
        INFO(name << ", Sq " << Sq << (causal ? ", causal" : ", bidirectional"));
        check_offset_positions<TestType>(enc, Sq, opt);
      });
    }
  }
}
}  // namespace attention_cache_attention_tests
