// SPDX-License-Identifier: MIT
// Every bad input of Transformer-XL: posenc::error naming the argument, before any output is written.
#include <posenc/attention/attention.hpp>
#include <posenc/attention/backward.hpp>
#include <posenc/attention/kv_cache.hpp>
#include <posenc/attention/packed.hpp>
#include <posenc/attention/paged_attention.hpp>
#include <posenc/encoding/transformer_xl.hpp>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/error_of.hpp"
#include "support/transformer_xl.hpp"

namespace errors_transformer_xl_tests {

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
  so.scores = scores;
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

namespace {

// A segment memory longer than memory_length(): B = 1, Sq = 4 queries over Sk = 40 keys
// (a memory of 36), Hq = 2, Hkv = 1, D = 4; M = 6 keeps the last Sq + M = 10 keys, whose
// distances to the queries are at most 9: distance_limit 10 fits them, not the 39 of the
// whole call.
index_t const cSq = 4, cSk = 40, cH = 2, cHkv = 1, cD = 4, cM = 6, cKept = cSq + cM, cCut = cSk - cKept;

using fview = posenc::view<const float>;

// Rows [first, first + n) of a (1, seq, heads, cD) buffer.
fview rows_of(std::vector<float> const& x, index_t first, index_t n, index_t heads) {
  return posenc::make_bshd<const float>(x.data() + first * heads * cD, 1, n, heads, cD);
}

// out (1, q.seq, cH, cD) followed by lse (1, cH, q.seq) of a direct call.
template <class Path, class E>
std::vector<float> direct(fview q, fview k, fview v, E const& enc, posenc::attention_options<float> opt) {
  std::vector<float> out(static_cast<std::size_t>(q.seq * cH * cD), -7.0f), lse(static_cast<std::size_t>(cH * q.seq));
  opt.lse = lse;
  posenc::attention<Path>(q, k, v, posenc::make_bshd(out.data(), 1, q.seq, cH, cD), enc, opt);
  out.insert(out.end(), lse.begin(), lse.end());
  return out;
}

template <class Path>
void check_memory_cut_call_forms() {
  posenc_test::txl_buffers<float> const bf(1, cSq, cSk, cH, cHkv, cD, 61);
  auto const enc = posenc_test::random_transformer_xl<float>(cH, cD, 6, 10, 62, cM);
  for (bool causal : {true, false}) {
    INFO((causal ? "causal" : "bidirectional"));
    posenc::attention_options<float> opt;
    opt.causal = causal;
    // The call on the already-cut keys: queries at M + i, the kept keys at 0 .. Sq + M - 1.
    auto const want = direct<Path>(bf.qv(), rows_of(bf.k, cCut, cKept, cHkv), rows_of(bf.v, cCut, cKept, cHkv), enc,
                                   opt);
    auto const want_decode = direct<Path>(rows_of(bf.q, cSq - 1, 1, cH), rows_of(bf.k, cSk - 1 - cM, 1 + cM, cHkv),
                                          rows_of(bf.v, cSk - 1 - cM, 1 + cM, cHkv), enc, opt);
    // Direct, with default and with explicit key positions (the queries keep their default ones).
    CHECK(posenc_test::max_abs_diff(want, direct<Path>(bf.qv(), bf.kv(), bf.vv(), enc, opt)) <= 1e-6);
    posenc::attention_options<float> kpos = opt;
    kpos.k_positions = posenc::position_span(0);
    CHECK(posenc_test::max_abs_diff(want, direct<Path>(bf.qv(), bf.kv(), bf.vv(), enc, kpos)) <= 1e-6);

    // kv_cache: a chunk of Sq queries, then a decode step of the last one.
    posenc::kv_cache<float> cache(1, cHkv, cD);
    cache.append(bf.kv(), bf.vv(), enc);
    auto over_cache = [&](fview q) {
      std::vector<float> out(static_cast<std::size_t>(q.seq * cH * cD), -7.0f),
          lse(static_cast<std::size_t>(cH * q.seq));
      posenc::attention_options<float> o = opt;
      o.lse = lse;
      posenc::attention<Path>(q, cache, posenc::make_bshd(out.data(), 1, q.seq, cH, cD), enc, o);
      out.insert(out.end(), lse.begin(), lse.end());
      return out;
    };
    CHECK(posenc_test::max_abs_diff(want, over_cache(bf.qv())) <= 1e-6);
    CHECK(posenc_test::max_abs_diff(want_decode, over_cache(rows_of(bf.q, cSq - 1, 1, cH))) <= 1e-6);

    // paged_kv_cache: the same sequence in pages of 8 tokens.
    posenc::paged_kv_cache<float> pages(8, 8, cHkv, cD);
    index_t const id = pages.add_sequence();
    pages.append(id, bf.kv(), bf.vv(), enc);
    auto over_pages = [&](fview q) {
      std::vector<float> out(static_cast<std::size_t>(q.seq * cH * cD), -7.0f),
          lse(static_cast<std::size_t>(cH * q.seq));
      posenc::attention_options<float> o = opt;
      o.lse = lse;
      posenc::attention<Path>(q, pages, posenc::span<const index_t>(&id, 1),
                              posenc::make_bshd(out.data(), 1, q.seq, cH, cD), enc, o);
      out.insert(out.end(), lse.begin(), lse.end());
      return out;
    };
    CHECK(posenc_test::max_abs_diff(want, over_pages(bf.qv())) <= 1e-6);
    CHECK(posenc_test::max_abs_diff(want_decode, over_pages(rows_of(bf.q, cSq - 1, 1, cH))) <= 1e-6);

    // Packed: the sequence twice, back to back; lse is (Hq, 2 Sq).
    std::vector<float> q2 = bf.q, k2 = bf.k, v2 = bf.v;
    q2.insert(q2.end(), bf.q.begin(), bf.q.end());
    k2.insert(k2.end(), bf.k.begin(), bf.k.end());
    v2.insert(v2.end(), bf.v.begin(), bf.v.end());
    std::vector<index_t> const cu_q = {0, cSq, 2 * cSq}, cu_k = {0, cSk, 2 * cSk};
    std::vector<float> out2(static_cast<std::size_t>(2 * cSq * cH * cD), -7.0f),
        lse2(static_cast<std::size_t>(cH * 2 * cSq));
    posenc::attention_options<float> o2 = opt;
    o2.lse = lse2;
    posenc::attention<Path>(rows_of(q2, 0, 2 * cSq, cH), rows_of(k2, 0, 2 * cSk, cHkv), rows_of(v2, 0, 2 * cSk, cHkv),
                            posenc::make_bshd(out2.data(), 1, 2 * cSq, cH, cD), posenc::packed_sequences{cu_q, cu_k},
                            enc, o2);
    for (index_t s = 0; s < 2; ++s) {
      std::vector<float> got(out2.begin() + s * cSq * cH * cD, out2.begin() + (s + 1) * cSq * cH * cD);
      for (index_t h = 0; h < cH; ++h)
        for (index_t i = 0; i < cSq; ++i) got.push_back(lse2[static_cast<std::size_t>(h * 2 * cSq + s * cSq + i)]);
      CHECK(posenc_test::max_abs_diff(want, got) <= 1e-6);
    }
  }
}

}  // namespace

namespace {

// key_lengths give each batch entry its own memory: entry b holds kLens[b] keys, its Sq = 4
// queries the last 4 of them, and a memory longer than M = 6 is cut to its last 6 (cuts 30,
// 15, 2 and none). Each entry must equal the batch-1 call over its own keys alone.
index_t const kB = 4, kSq = 4, kSk = 40, kH = 2, kHkv = 1, kD = 4, kM = 6;
std::vector<index_t> const kLens = {40, 25, 12, 8};

// Entry b's rows [first, first + n) of a (kB, seq, heads, kD) buffer, as a batch-1 view.
fview entry_rows(std::vector<float> const& x, index_t b, index_t seq, index_t first, index_t n, index_t heads) {
  return posenc::make_bshd<const float>(x.data() + (b * seq + first) * heads * kD, 1, n, heads, kD);
}

struct entry_results {
  std::vector<float> out, lse;  // (kB, kSq, kH, kD) and (kB, kH, kSq)
};

template <class Path>
void check_memory_cut_per_entry() {
  posenc_test::txl_buffers<float> const bf(kB, kSq, kSk, kH, kHkv, kD, 91);
  auto const enc = posenc_test::random_transformer_xl<float>(kH, kD, 6, kSq + kM, 92, kM);
  for (bool causal : {true, false})
    for (int threads : {1, 2}) {
      INFO((causal ? "causal" : "bidirectional") << ", threads " << threads);
      posenc::attention_options<float> opt;
      opt.causal = causal;
      opt.threads = threads;
      // What each entry must give: the call over its own kLens[b] keys.
      std::vector<std::vector<float>> want;
      for (index_t b = 0; b < kB; ++b)
        want.push_back(direct<Path>(entry_rows(bf.q, b, kSq, 0, kSq, kH), entry_rows(bf.k, b, kSk, 0, kLens[b], kHkv),
                                    entry_rows(bf.v, b, kSk, 0, kLens[b], kHkv), enc, opt));
      auto check = [&](entry_results const& got, char const* form) {
        INFO(form);
        for (index_t b = 0; b < kB; ++b) {
          INFO("entry " << b);
          std::vector<float> e(got.out.begin() + b * kSq * kH * kD, got.out.begin() + (b + 1) * kSq * kH * kD);
          e.insert(e.end(), got.lse.begin() + b * kH * kSq, got.lse.begin() + (b + 1) * kH * kSq);
          CHECK(posenc_test::max_abs_diff(want[static_cast<std::size_t>(b)], e) <= 1e-6);
        }
      };
      auto fresh = [] {
        return entry_results{std::vector<float>(static_cast<std::size_t>(kB * kSq * kH * kD), -7.0f),
                             std::vector<float>(static_cast<std::size_t>(kB * kH * kSq), -7.0f)};
      };

      // Contiguous, with key_lengths.
      entry_results r = fresh();
      posenc::attention_options<float> o = opt;
      o.key_lengths = kLens;
      o.lse = r.lse;
      posenc::attention<Path>(bf.qv(), bf.kv(), bf.vv(), posenc::make_bshd(r.out.data(), kB, kSq, kH, kD), enc, o);
      check(r, "contiguous");

      // Packed: the same entries back to back, with the same key_lengths.
      std::vector<index_t> cu_q, cu_k;
      for (index_t b = 0; b <= kB; ++b) cu_q.push_back(b * kSq), cu_k.push_back(b * kSk);
      entry_results p = fresh();
      std::vector<float> plse(p.lse.size());
      o.lse = plse;
      posenc::attention<Path>(posenc::make_bshd<const float>(bf.q.data(), 1, kB * kSq, kH, kD),
                              posenc::make_bshd<const float>(bf.k.data(), 1, kB * kSk, kHkv, kD),
                              posenc::make_bshd<const float>(bf.v.data(), 1, kB * kSk, kHkv, kD),
                              posenc::make_bshd(p.out.data(), 1, kB * kSq, kH, kD),
                              posenc::packed_sequences{cu_q, cu_k}, enc, o);
      for (index_t b = 0; b < kB; ++b)  // packed lse is (kH, kB kSq)
        for (index_t h = 0; h < kH; ++h)
          for (index_t i = 0; i < kSq; ++i)
            p.lse[static_cast<std::size_t>((b * kH + h) * kSq + i)] =
                plse[static_cast<std::size_t>(h * kB * kSq + b * kSq + i)];
      check(p, "packed");

      // Paged: entry b's kLens[b] keys in pages of 8 tokens.
      posenc::paged_kv_cache<float> pages(32, 8, kHkv, kD);
      std::vector<index_t> ids;
      for (index_t b = 0; b < kB; ++b) {
        ids.push_back(pages.add_sequence());
        index_t const L = kLens[static_cast<std::size_t>(b)];
        pages.append(ids.back(), entry_rows(bf.k, b, kSk, 0, L, kHkv), entry_rows(bf.v, b, kSk, 0, L, kHkv), enc);
      }
      entry_results g = fresh();
      posenc::attention_options<float> po = opt;
      po.lse = g.lse;
      posenc::attention<Path>(bf.qv(), pages, ids, posenc::make_bshd(g.out.data(), kB, kSq, kH, kD), enc, po);
      check(g, "paged");
    }
}

}  // namespace

TEMPLATE_TEST_CASE("transformer_xl: a memory cut to memory_length() is checked as cut, on every call form, and "
                   "with key_lengths each batch entry cuts its own memory",
                   "[errors][transformer_xl]", posenc::path::reference, posenc::path::materialized,
                   posenc::path::fused) {
  SECTION("one entry") { check_memory_cut_call_forms<TestType>(); }
  SECTION("entries of different key lengths") { check_memory_cut_per_entry<TestType>(); }
}

TEST_CASE("transformer_xl: the backward of a memory cut to memory_length() is checked as cut",
          "[errors][transformer_xl]") {
  posenc_test::txl_buffers<float> const bf(1, cSq, cSk, cH, cHkv, cD, 71);
  auto const enc = posenc_test::random_transformer_xl<float>(cH, cD, 6, 10, 72, cM);
  posenc::attention_options<float> opt;
  opt.causal = true;
  auto const dout = posenc_test::random_vector<float>(static_cast<std::size_t>(cSq * cH * cD), 73);
  struct result {
    std::vector<float> dq, dk, dv;
    posenc::transformer_xl<float>::gradients g;
  };
  auto backward = [&](fview k, fview v) {
    std::vector<float> out(static_cast<std::size_t>(cSq * cH * cD));
    posenc::attention<posenc::path::reference>(bf.qv(), k, v, posenc::make_bshd(out.data(), 1, cSq, cH, cD), enc, opt);
    auto const kv_size = static_cast<std::size_t>(k.seq * cHkv * cD);
    result r{std::vector<float>(bf.q.size(), 5.0f), std::vector<float>(kv_size, 5.0f),
             std::vector<float>(kv_size, 5.0f), enc.make_gradients()};
    posenc::attention_backward<posenc::path::reference>(
        bf.qv(), k, v, posenc::make_bshd<const float>(out.data(), 1, cSq, cH, cD),
        posenc::make_bshd<const float>(dout.data(), 1, cSq, cH, cD), posenc::make_bshd(r.dq.data(), 1, cSq, cH, cD),
        posenc::make_bshd(r.dk.data(), 1, k.seq, cHkv, cD), posenc::make_bshd(r.dv.data(), 1, k.seq, cHkv, cD), enc,
        opt, r.g);
    return r;
  };
  result const want = backward(rows_of(bf.k, cCut, cKept, cHkv), rows_of(bf.v, cCut, cKept, cHkv));
  result const got = backward(bf.kv(), bf.vv());
  CHECK(posenc_test::max_abs_diff(want.dq, got.dq) <= 1e-6);
  std::size_t const cut_elems = static_cast<std::size_t>(cCut * cHkv * cD);
  for (std::size_t n = 0; n < cut_elems; ++n) {
    REQUIRE(got.dk[n] == 0.0f);
    REQUIRE(got.dv[n] == 0.0f);
  }
  CHECK(posenc_test::max_abs_diff(want.dk, std::vector<float>(got.dk.begin() + static_cast<std::ptrdiff_t>(cut_elems),
                                                              got.dk.end())) <= 1e-6);
  CHECK(posenc_test::max_abs_diff(want.dv, std::vector<float>(got.dv.begin() + static_cast<std::ptrdiff_t>(cut_elems),
                                                              got.dv.end())) <= 1e-6);
  CHECK((want.g.u - got.g.u).cwiseAbs().maxCoeff() <= 1e-6f);
  CHECK((want.g.v - got.g.v).cwiseAbs().maxCoeff() <= 1e-6f);
  CHECK((want.g.r - got.g.r).cwiseAbs().maxCoeff() <= 1e-6f);
}

TEST_CASE("errors: transformer_xl keys still too far after the memory cut, nothing written",
          "[errors][transformer_xl]") {
  posenc_test::txl_buffers<float> const bf(1, cSq, cSk, cH, cHkv, cD, 81);
  // distance_limit 8: the kept keys reach distance 9 (query row 3 at 39, key 30).
  auto const enc = posenc_test::random_transformer_xl<float>(cH, cD, 6, 8, 82, cM);
  std::string const msg = "query position of batch 0 row 3 is 39 with keys at 30 .. 39, expected every visible key "
                          "within 8 positions (the encoder's distance_limit())";
  posenc::attention_options<float> opt;
  opt.causal = true;
  std::vector<float> out(static_cast<std::size_t>(cSq * cH * cD), 5.0f);
  auto const o = posenc::make_bshd(out.data(), 1, cSq, cH, cD);
  REQUIRE_THROWS_WITH(posenc::attention<posenc::path::fused>(bf.qv(), bf.kv(), bf.vv(), o, enc, opt), contains(msg));
  REQUIRE_THROWS_WITH(posenc::attention<posenc::path::reference>(bf.qv(), bf.kv(), bf.vv(), o, enc, opt),
                      contains(msg));
  posenc::kv_cache<float> cache(1, cHkv, cD);
  cache.append(bf.kv(), bf.vv(), enc);
  REQUIRE_THROWS_WITH(posenc::attention(bf.qv(), cache, o, enc, opt), contains(msg));
  posenc::paged_kv_cache<float> pages(8, 8, cHkv, cD);
  index_t const id = pages.add_sequence();
  pages.append(id, bf.kv(), bf.vv(), enc);
  REQUIRE_THROWS_WITH(posenc::attention(bf.qv(), pages, posenc::span<const index_t>(&id, 1), o, enc, opt),
                      contains(msg));
  std::vector<index_t> const cu_q = {0, cSq}, cu_k = {0, cSk};
  REQUIRE_THROWS_WITH(posenc::attention(bf.qv(), bf.kv(), bf.vv(), o, posenc::packed_sequences{cu_q, cu_k}, enc, opt),
                      contains(msg));
  std::vector<float> dq(bf.q.size(), 5.0f), dk(bf.k.size(), 5.0f), dv(bf.v.size(), 5.0f);
  auto g = enc.make_gradients();
  REQUIRE_THROWS_WITH(posenc::attention_backward<posenc::path::reference>(
                          bf.qv(), bf.kv(), bf.vv(), posenc::make_bshd<const float>(out.data(), 1, cSq, cH, cD),
                          posenc::make_bshd<const float>(out.data(), 1, cSq, cH, cD),
                          posenc::make_bshd(dq.data(), 1, cSq, cH, cD), posenc::make_bshd(dk.data(), 1, cSk, cHkv, cD),
                          posenc::make_bshd(dv.data(), 1, cSk, cHkv, cD), enc, opt, g),
                      contains(msg));
  for (float x : out) REQUIRE(x == 5.0f);
  for (float x : dq) REQUIRE(x == 5.0f);
  for (float x : dk) REQUIRE(x == 5.0f);
  CHECK(g.u.cwiseAbs().maxCoeff() == 0.0f);
}

TEST_CASE("docs/encoders/relative.md: Transformer-XL with a memory longer than memory_length()",
          "[errors][transformer_xl][docs]") {
  // The example of docs/encoders/relative.md over a memory of 2 x mem keys: cut to the last mem,
  // every kept key is within the distance_limit of mem + seg.
  posenc::index_t const heads = 4, head_dim = 16, d_model = 64, mem = 32, seg = 16;
  posenc::relative_table<float> u = posenc::relative_table<float>::Constant(heads, head_dim, 0.01f);
  posenc::relative_table<float> v = posenc::relative_table<float>::Constant(heads, head_dim, -0.01f);
  posenc::relative_table<float> w_r = posenc::relative_table<float>::Constant(heads * head_dim, d_model, 0.02f);
  posenc::transformer_xl<float> enc(mem + seg, u, v, w_r, mem);
  std::vector<float> q(seg * heads * head_dim, 0.1f), k((2 * mem + seg) * heads * head_dim, 0.2f);
  std::vector<float> val(k.size(), 0.3f), out(q.size(), 5.0f);
  posenc::attention_options<float> opt;
  opt.causal = true;
  posenc::attention(posenc::make_bshd<const float>(q.data(), 1, seg, heads, head_dim),
                    posenc::make_bshd<const float>(k.data(), 1, 2 * mem + seg, heads, head_dim),
                    posenc::make_bshd<const float>(val.data(), 1, 2 * mem + seg, heads, head_dim),
                    posenc::make_bshd(out.data(), 1, seg, heads, head_dim), enc, opt);
  for (float x : out) CHECK(std::abs(x - 0.3f) < 1e-6f);
}

TEST_CASE("transformer_xl: a memory cut with masks and views that hold no element (null data) works",
          "[errors][transformer_xl]") {
  // No query: q, out, dq, dout and a (1, 1, 0, 6) mask have no element and a null pointer. The
  // cut moves the key views and the mask by the cut keys: never a null pointer (UBSan checks).
  index_t const H = 2, D = 4, Sk = 6;
  auto const enc = posenc_test::random_transformer_xl<float>(H, D, 6, 64, 3, 2);  // memory_length 2
  std::vector<float> k = posenc_test::random_vector<float>(static_cast<std::size_t>(Sk * H * D), 5), v = k;
  std::vector<float> dk(k.size(), 7.0f), dv(k.size(), 7.0f);
  auto const qv = posenc::make_bshd<const float>(nullptr, 1, 0, H, D);
  auto const kv = posenc::make_bshd<const float>(k.data(), 1, Sk, H, D);
  auto const vv = posenc::make_bshd<const float>(v.data(), 1, Sk, H, D);
  posenc::attention_options<float> opt;
  opt.mask = posenc::make_mask<float>(nullptr, 1, 1, 0, Sk);
  opt.bool_mask = posenc::make_mask<bool>(nullptr, 1, 1, 0, Sk);
  posenc::attention<posenc::path::reference>(qv, kv, vv, posenc::make_bshd<float>(nullptr, 1, 0, H, D), enc, opt);
  posenc::attention<posenc::path::fused>(qv, kv, vv, posenc::make_bshd<float>(nullptr, 1, 0, H, D), enc, opt);
  auto g = enc.make_gradients();
  posenc::attention_backward<posenc::path::reference>(qv, kv, vv, qv, qv, posenc::make_bshd<float>(nullptr, 1, 0, H, D),
                                                      posenc::make_bshd(dk.data(), 1, Sk, H, D),
                                                      posenc::make_bshd(dv.data(), 1, Sk, H, D), enc, opt, g);
  for (float x : dk) CHECK(x == 0.0f);  // no query: no gradient reaches any key
  for (float x : dv) CHECK(x == 0.0f);
}


TEST_CASE("transformer_xl: explicit query positions before the cut keys are kept, not moved below 0",
          "[errors][transformer_xl]") {
  // One entry, Sq = 4 queries at given positions 0 .. 3 (no key positions) over Sk = 40 keys, M = 6:
  // the call keeps keys 30 .. 39 at their indices, and the queries at 0 .. 3 (bidirectional).
  posenc_test::txl_buffers<float> const bf(1, cSq, cSk, cH, cHkv, cD, 95);
  auto const enc = posenc_test::random_transformer_xl<float>(cH, cD, 6, 64, 96, cM);
  std::vector<index_t> const q_ids = {0, 1, 2, 3};
  std::vector<index_t> k_ids;
  for (index_t j = cCut; j < cSk; ++j) k_ids.push_back(j);
  posenc::attention_options<float> opt;
  opt.q_positions = posenc::position_span::ids(q_ids.data(), 1, cSq);
  posenc::attention_options<float> kept = opt;
  kept.k_positions = posenc::position_span::ids(k_ids.data(), 1, cKept);
  auto const want = direct<posenc::path::reference>(bf.qv(), rows_of(bf.k, cCut, cKept, cHkv),
                                                    rows_of(bf.v, cCut, cKept, cHkv), enc, kept);
  CHECK(posenc_test::max_abs_diff(want, direct<posenc::path::reference>(bf.qv(), bf.kv(), bf.vv(), enc, opt)) <= 1e-6);
  CHECK(posenc_test::max_abs_diff(want, direct<posenc::path::fused>(bf.qv(), bf.kv(), bf.vv(), enc, opt)) <= 1e-6);
}

TEST_CASE("transformer_xl: the backward with key_lengths cuts each entry's own memory; a bad lse writes nothing",
          "[errors][transformer_xl]") {
  posenc_test::txl_buffers<float> const bf(kB, kSq, kSk, kH, kHkv, kD, 97);
  auto const enc = posenc_test::random_transformer_xl<float>(kH, kD, 6, kSq + kM, 98, kM);
  auto const dout = posenc_test::random_vector<float>(static_cast<std::size_t>(kB * kSq * kH * kD), 99);
  posenc::attention_options<float> opt;
  opt.causal = true;
  struct result {
    std::vector<float> dq, dk, dv;
    posenc::transformer_xl<float>::gradients g;
  };
  // Entry b alone, over its own kLens[b] keys.
  result want{{}, {}, {}, enc.make_gradients()};
  for (index_t b = 0; b < kB; ++b) {
    index_t const L = kLens[static_cast<std::size_t>(b)];
    fview const q = entry_rows(bf.q, b, kSq, 0, kSq, kH), k = entry_rows(bf.k, b, kSk, 0, L, kHkv),
                v = entry_rows(bf.v, b, kSk, 0, L, kHkv), d = entry_rows(dout, b, kSq, 0, kSq, kH);
    std::vector<float> out(static_cast<std::size_t>(kSq * kH * kD)), dq(out.size()),
        dk(static_cast<std::size_t>(kSk * kHkv * kD), 0.0f), dv(dk.size(), 0.0f);  // keys past L: zero
    posenc::attention<posenc::path::reference>(q, k, v, posenc::make_bshd(out.data(), 1, kSq, kH, kD), enc, opt);
    posenc::attention_backward<posenc::path::reference>(
        q, k, v, posenc::make_bshd<const float>(out.data(), 1, kSq, kH, kD), d,
        posenc::make_bshd(dq.data(), 1, kSq, kH, kD), posenc::make_bshd(dk.data(), 1, L, kHkv, kD),
        posenc::make_bshd(dv.data(), 1, L, kHkv, kD), enc, opt, want.g);
    want.dq.insert(want.dq.end(), dq.begin(), dq.end());
    want.dk.insert(want.dk.end(), dk.begin(), dk.end());
    want.dv.insert(want.dv.end(), dv.begin(), dv.end());
  }
  posenc::attention_options<float> o = opt;
  o.key_lengths = kLens;
  std::vector<float> out(static_cast<std::size_t>(kB * kSq * kH * kD)), lse(static_cast<std::size_t>(kB * kH * kSq));
  o.lse = lse;
  posenc::attention<posenc::path::reference>(bf.qv(), bf.kv(), bf.vv(), posenc::make_bshd(out.data(), kB, kSq, kH, kD),
                                             enc, o);
  auto backward = [&](posenc::attention_options<float> const& bo, result& r) {
    posenc::attention_backward<posenc::path::best>(
        bf.qv(), bf.kv(), bf.vv(), posenc::make_bshd<const float>(out.data(), kB, kSq, kH, kD),
        posenc::make_bshd<const float>(dout.data(), kB, kSq, kH, kD), posenc::make_bshd(r.dq.data(), kB, kSq, kH, kD),
        posenc::make_bshd(r.dk.data(), kB, kSk, kHkv, kD), posenc::make_bshd(r.dv.data(), kB, kSk, kHkv, kD), enc, bo,
        r.g);
  };
  auto fresh = [&] {
    return result{std::vector<float>(bf.q.size(), 5.0f), std::vector<float>(bf.k.size(), 5.0f),
                  std::vector<float>(bf.v.size(), 5.0f), enc.make_gradients()};
  };
  for (bool with_lse : {true, false}) {
    INFO((with_lse ? "lse given" : "lse recomputed"));
    posenc::attention_options<float> bo = o;
    if (!with_lse) bo.lse = nullptr;
    result got = fresh();
    backward(bo, got);
    CHECK(posenc_test::max_abs_diff(want.dq, got.dq) <= 1e-6);
    CHECK(posenc_test::max_abs_diff(want.dk, got.dk) <= 1e-6);
    CHECK(posenc_test::max_abs_diff(want.dv, got.dv) <= 1e-6);
    CHECK((want.g.u - got.g.u).cwiseAbs().maxCoeff() <= 1e-5f);
    CHECK((want.g.v - got.g.v).cwiseAbs().maxCoeff() <= 1e-5f);
    CHECK((want.g.r - got.g.r).cwiseAbs().maxCoeff() <= 1e-5f);
  }
  // The last entry's lse shifted by 1 (another forward pass's): the error comes after the first
  // entries ran, and still nothing is written.
  std::vector<float> bad = lse;
  for (index_t n = (kB - 1) * kH * kSq; n < kB * kH * kSq; ++n) bad[static_cast<std::size_t>(n)] += 1.0f;
  posenc::attention_options<float> bo = o;
  bo.lse = bad;
  result got = fresh();
  REQUIRE_THROWS_WITH(backward(bo, got), contains("lse does not match the scores of batch entry 3, head 0, row 0"));
  for (float x : got.dq) REQUIRE(x == 5.0f);
  for (float x : got.dk) REQUIRE(x == 5.0f);
  for (float x : got.dv) REQUIRE(x == 5.0f);
  CHECK(got.g.u.cwiseAbs().maxCoeff() == 0.0f);
  CHECK(got.g.r.cwiseAbs().maxCoeff() == 0.0f);
}
}  // namespace errors_transformer_xl_tests
