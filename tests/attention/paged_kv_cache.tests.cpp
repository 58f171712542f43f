// SPDX-License-Identifier: MIT
// paged_kv_cache<T> and attention over it: pages, forks, copy-on-write, and results equal to the contiguous cache.
#include <posenc/attention/attention.hpp>
#include <posenc/attention/kv_cache.hpp>
#include <posenc/attention/paged_attention.hpp>
#include <posenc/attention/paged_kv_cache.hpp>
#include <posenc/core/half.hpp>
#include <posenc/encoding/alibi.hpp>
#include <posenc/encoding/clipped_bias.hpp>
#include <posenc/encoding/compose.hpp>
#include <posenc/encoding/none.hpp>
#include <posenc/encoding/rope.hpp>
#include <posenc/encoding/shaw.hpp>
#include <posenc/encoding/t5_bias.hpp>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <new>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "support/catch.hpp"
#include "support/counting_new.hpp"
#include "support/kernel_choice.hpp"
#include "support/random.hpp"
#include "support/tolerance.hpp"
#include "support/transformer_xl.hpp"

// Allocation counter (tests/support/counting_new.hpp replaces operator new here).
using posenc_test::g_allocations;
using posenc_test::g_bytes;
using posenc_test::g_counting;
using posenc_test::g_largest;

using posenc::index_t;
using posenc_test::random_vector;

namespace {

index_t const Hq = 4, Hkv = 2, D = 8;

// Tokens of one sequence: keys and values (len, Hkv, D) and queries (len, Hq, D).
template <class T>
struct tokens {
  std::vector<T> q, k, v;
  tokens(index_t len, std::uint64_t seed)
      : q(random_vector<T>(static_cast<std::size_t>(len * Hq * D), seed)),
        k(random_vector<T>(static_cast<std::size_t>(len * Hkv * D), seed + 1)),
        v(random_vector<T>(static_cast<std::size_t>(len * Hkv * D), seed + 2)) {}
  static posenc::view<const T> part(std::vector<T> const& x, index_t s, index_t n, index_t h) {
    return posenc::make_bshd<const T>(x.data() + s * h * D, 1, n, h, D);
  }
};

template <class T, class F>
void for_each_encoder(F&& f) {
  f("none", posenc::none{});
  f("rope", posenc::rope<T>(posenc::rope_layout::half_split, D));
  posenc::rope<T> reserved(posenc::rope_layout::interleaved, D);
  reserved.reserve(4096);
  f("rope reserved", reserved);
  posenc::rope_options lin;
  lin.scaling = posenc::rope_scaling::linear(2.0);
  f("rope linear", posenc::rope<T>(posenc::rope_layout::half_split, D, lin));
  posenc::rope_options ntk;
  ntk.scaling = posenc::rope_scaling::dynamic_ntk(2.0, 64);
  f("rope dynamic ntk", posenc::rope<T>(posenc::rope_layout::half_split, D, ntk));
  posenc::rope_options yarn;
  yarn.scaling = posenc::rope_scaling::yarn(4.0, 64);
  yarn.rotary_dim = D / 2;
  f("rope yarn partial", posenc::rope<T>(posenc::rope_layout::interleaved, D, yarn));
  f("alibi", posenc::alibi<T>(posenc::alibi_form::paper, Hq));
  f("t5 causal", posenc::t5_bias<T>({Hq, false, 32, 128}, 5, 0.5));
  f("t5 bidirectional", posenc::t5_bias<T>({Hq, true, 32, 128}, 6, 0.5));
  f("clipped", posenc::clipped_bias<T>(6, Hq, 7, 0.5));
  f("shaw keys+values", posenc::shaw<T>(4, D, posenc::shaw_terms::keys_and_values, 8, 0.5));
  // Transformer-XL: the tokens before the queries are the segment memory; with
  // M = 50 an entry attends to its last 50 memory keys only (the rest skipped).
  f("transformer-xl", posenc_test::random_transformer_xl<T>(Hq, D, 6, 1024, 77));
  f("transformer-xl memory 50", posenc_test::random_transformer_xl<T>(Hq, D, 6, 1024, 78, 50));
  f("rope + alibi", posenc::compose(posenc::rope<T>(posenc::rope_layout::half_split, D),
                                    posenc::alibi<T>(posenc::alibi_form::paper, Hq)));
}

template <class T>
double max_diff(std::vector<T> const& a, std::vector<T> const& b) {
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::isinf(a[i]) && a[i] == b[i]) continue;
    double const d = std::abs(static_cast<double>(a[i]) - static_cast<double>(b[i]));
    m = d > m || d != d ? d : m;
  }
  return m;
}

// The option sets every paged result is checked under.
template <class T>
std::vector<std::pair<std::string, posenc::attention_options<T>>> option_sets() {
  std::vector<std::pair<std::string, posenc::attention_options<T>>> r;
  posenc::attention_options<T> o;
  r.emplace_back("plain", o);
  o.causal = true;
  r.emplace_back("causal", o);
  o.sliding_window = 40;
  r.emplace_back("window 40", o);
  o.sliding_window = 0;
  o.softcap = 3;
  o.scale = 0.7;
  r.emplace_back("causal softcap scale", o);
  o = {};
  o.causal = true;
  o.threads = 2;
  r.emplace_back("causal 2 threads", o);
  return r;
}

// Three sequences (first positions 0, 9, 0) built by interleaved appends so
// that their pages are not consecutive, then sequence 3 forked from 0 and both
// continued differently; each step checks paged attention (one entry per
// sequence, Sq queries each) against a contiguous kv_cache per sequence.
// `prefill` > 0: each step appends and queries prefill + step tokens per
// sequence (a prefill chunk over the pages: the lane kernel) instead of 1 or 3.
template <class T, class Path, class E>
void check_against_contiguous(E const& enc, index_t page, posenc::attention_options<T> const& opt,
                              std::string const& what, index_t prefill = 0) {
  std::vector<index_t> const lens = {150, 37, 260, 0};
  std::vector<index_t> const firsts = {0, 9, 0, 0};
  posenc::paged_kv_cache<T> cache(2000 / page + 40, page, Hkv, D);
  std::vector<tokens<T>> tok;
  std::vector<posenc::kv_cache<T>> ref;
  std::vector<index_t> ids, done(4, 0);
  for (index_t s = 0; s < 3; ++s) {
    tok.emplace_back(lens[static_cast<std::size_t>(s)] + 40 + 4 * prefill + 8, 100 + 10 * s);
    ref.emplace_back(1, Hkv, D, 0, firsts[static_cast<std::size_t>(s)]);
    ids.push_back(cache.add_sequence(firsts[static_cast<std::size_t>(s)]));
  }
  // Prefill in pieces of 13, round robin.
  for (bool more = true; more;) {
    more = false;
    for (std::size_t s = 0; s < 3; ++s) {
      index_t const n = std::min<index_t>(13, lens[s] - done[s]);
      if (n <= 0) continue;
      more = true;
      cache.append(ids[s], tokens<T>::part(tok[s].k, done[s], n, Hkv), tokens<T>::part(tok[s].v, done[s], n, Hkv),
                   enc);
      ref[s].append(tokens<T>::part(tok[s].k, done[s], n, Hkv), tokens<T>::part(tok[s].v, done[s], n, Hkv), enc);
      done[s] += n;
    }
  }
  // Sequence 3: a fork of sequence 0, continued with other tokens.
  ids.push_back(cache.fork(ids[0]));
  tok.emplace_back(lens[0] + 40 + 4 * prefill + 8, 900);
  tok[3].k = tok[0].k;
  tok[3].v = tok[0].v;
  for (std::size_t i = static_cast<std::size_t>(lens[0] * Hkv * D); i < tok[3].k.size(); ++i) {
    tok[3].k[i] = -tok[3].k[i] + T(0.25);
    tok[3].v[i] = T(0.5) * tok[3].v[i];
  }
  ref.push_back(ref[0]);
  done[3] = done[0];
  posenc::paged_attention_workspace<T> ws;
  for (index_t step = 0; step < 4; ++step) {
    index_t const sq = prefill > 0 ? prefill + step : step == 2 ? 3 : 1;  // a speculative step of 3 tokens
    std::vector<T> q(static_cast<std::size_t>(4 * sq * Hq * D)), want(q.size(), T(7)), got(q.size(), T(-7));
    std::vector<T> lse_want(static_cast<std::size_t>(4 * Hq * sq)), lse_got(lse_want.size());
    std::vector<index_t> order = {ids[2], ids[0], ids[3], ids[1]};  // entries in any order
    std::vector<std::size_t> slot = {2, 0, 3, 1};
    for (index_t b = 0; b < 4; ++b) {
      std::size_t const s = slot[static_cast<std::size_t>(b)];
      cache.append(order[static_cast<std::size_t>(b)], tokens<T>::part(tok[s].k, done[s], sq, Hkv),
                   tokens<T>::part(tok[s].v, done[s], sq, Hkv), enc);
      ref[s].append(tokens<T>::part(tok[s].k, done[s], sq, Hkv), tokens<T>::part(tok[s].v, done[s], sq, Hkv), enc);
      std::copy_n(tok[s].q.begin() + done[s] * Hq * D, sq * Hq * D, q.begin() + b * sq * Hq * D);
      done[s] += sq;
      posenc::attention_options<T> o = opt;
      o.lse = {lse_want.data() + b * Hq * sq, Hq * sq};
      posenc::attention<posenc::path::reference>(posenc::make_bshd<const T>(q.data() + b * sq * Hq * D, 1, sq, Hq, D),
                                                 ref[s], posenc::make_bshd(want.data() + b * sq * Hq * D, 1, sq, Hq, D),
                                                 enc, o);
    }
    posenc::attention_options<T> o = opt;
    o.lse = lse_got;
    posenc::attention<Path>(posenc::make_bshd<const T>(q.data(), 4, sq, Hq, D), cache, order,
                            posenc::make_bshd(got.data(), 4, sq, Hq, D), enc, o, ws);
    double const tol = std::is_same<T, float>::value ? 2e-5 : 1e-12;
    INFO(what << ", step " << step);
    CHECK(max_diff(want, got) < tol);
    CHECK(max_diff(lse_want, lse_got) < tol * 10);
  }
}

// Fragments a fresh pool: one-page sequences (one token each, appended with
// enc) fill it, then those holding an even page are freed, so that every free
// page lies between used ones: a sequence then gets every page as its own run.
template <class T, class E>
void fragment_pool(posenc::paged_kv_cache<T>& cache, E const& enc) {
  tokens<T> const one(1, 298);
  std::vector<index_t> fillers;
  for (index_t n = 0; n < cache.pages(); ++n) {
    fillers.push_back(cache.add_sequence());
    cache.append(fillers.back(), tokens<T>::part(one.k, 0, 1, Hkv), tokens<T>::part(one.v, 0, 1, Hkv), enc);
  }
  REQUIRE(cache.free_page_count() == 0);
  for (index_t id : fillers)
    if (cache.page_table(id)[0] % 2 == 0) cache.free(id);
}

// Decode over scattered pages: in a fragmented pool, four sequences (lengths
// at the call `lens`) and a filler take one page each in turn, so that every
// page of a sequence is its own run and a key tile spans several runs; the last page is partly
// filled unless the length is a multiple of the page. Then sq tokens (1, or a
// speculative 3) are appended to each and attended in one call, entries in a
// mixed order. `masked`: an additive mask per entry, checked against the
// reference path over the same cache (masks are in the call's coordinates);
// otherwise against a contiguous kv_cache per sequence.
template <class T, class E>
void check_scattered_decode(E const& enc, index_t page, index_t sq, posenc::attention_options<T> const& opt,
                            std::string const& what, bool masked = false) {
  std::vector<index_t> const lens = {63, 64, 65, page == 1 ? 129 : 250};
  index_t const n = 4, filler_len = 250;
  posenc::paged_kv_cache<T> cache(2 * 5 * (250 + page) / page + 8, page, Hkv, D);
  fragment_pool(cache, enc);
  std::vector<tokens<T>> tok;
  std::vector<posenc::kv_cache<T>> ref;
  std::vector<index_t> ids, done(static_cast<std::size_t>(n), 0);
  for (index_t s = 0; s < n; ++s) {
    tok.emplace_back(lens[static_cast<std::size_t>(s)], 300 + 10 * s);
    ref.emplace_back(1, Hkv, D, 0, 2 * s);
    ids.push_back(cache.add_sequence(2 * s));
  }
  tokens<T> const fill(filler_len, 299);
  index_t const filler = cache.add_sequence();
  // Prefill one page at a time, round robin, the filler taking a page after each round.
  for (index_t at = 0; at < filler_len; at += page) {
    for (std::size_t s = 0; s < static_cast<std::size_t>(n); ++s) {
      index_t const m = std::min(page, lens[s] - sq - done[s]);
      if (m <= 0) continue;
      cache.append(ids[s], tokens<T>::part(tok[s].k, done[s], m, Hkv), tokens<T>::part(tok[s].v, done[s], m, Hkv),
                   enc);
      ref[s].append(tokens<T>::part(tok[s].k, done[s], m, Hkv), tokens<T>::part(tok[s].v, done[s], m, Hkv), enc);
      done[s] += m;
    }
    index_t const m = std::min(page, filler_len - at);
    cache.append(filler, tokens<T>::part(fill.k, at, m, Hkv), tokens<T>::part(fill.v, at, m, Hkv), enc);
  }
  for (std::size_t s = 0; s < static_cast<std::size_t>(n); ++s) {
    auto const table = cache.page_table(ids[s]);
    for (index_t pg = 1; pg < table.size(); ++pg) REQUIRE(table[pg] != table[pg - 1] + 1);  // every page a run
  }
  std::vector<T> q(static_cast<std::size_t>(n * sq * Hq * D)), want(q.size(), T(7)), got(q.size(), T(-7));
  std::vector<T> lse_want(static_cast<std::size_t>(n * Hq * sq), T(7)), lse_got(lse_want.size(), T(-7));
  std::vector<index_t> const order = {ids[1], ids[3], ids[0], ids[2]};
  std::vector<std::size_t> const slot = {1, 3, 0, 2};
  index_t const K = 256;
  std::vector<T> mask(static_cast<std::size_t>(n * Hq * sq * K), T(0));
  for (std::size_t i = 0; i < mask.size(); i += 5) mask[i] = -std::numeric_limits<T>::infinity();
  for (std::size_t i = 2; i < mask.size(); i += 7) mask[i] = T(-0.75);
  posenc::attention_options<T> o = opt;
  if (masked) o.mask = posenc::make_mask<T>(mask.data(), n, Hq, sq, K);
  for (index_t b = 0; b < n; ++b) {
    std::size_t const s = slot[static_cast<std::size_t>(b)];
    cache.append(order[static_cast<std::size_t>(b)], tokens<T>::part(tok[s].k, done[s], sq, Hkv),
                 tokens<T>::part(tok[s].v, done[s], sq, Hkv), enc);
    ref[s].append(tokens<T>::part(tok[s].k, done[s], sq, Hkv), tokens<T>::part(tok[s].v, done[s], sq, Hkv), enc);
    REQUIRE(cache.length(order[static_cast<std::size_t>(b)]) == lens[s]);
    std::copy_n(tok[s].q.begin() + done[s] * Hq * D, sq * Hq * D, q.begin() + b * sq * Hq * D);
    done[s] += sq;
    if (masked) continue;
    posenc::attention_options<T> ob = opt;
    ob.lse = {lse_want.data() + b * Hq * sq, Hq * sq};
    posenc::attention<posenc::path::reference>(posenc::make_bshd<const T>(q.data() + b * sq * Hq * D, 1, sq, Hq, D),
                                               ref[s], posenc::make_bshd(want.data() + b * sq * Hq * D, 1, sq, Hq, D),
                                               enc, ob);
  }
  if (masked) {
    posenc::attention_options<T> ow = o;
    ow.lse = lse_want;
    posenc::attention<posenc::path::reference>(posenc::make_bshd<const T>(q.data(), n, sq, Hq, D), cache, order,
                                               posenc::make_bshd(want.data(), n, sq, Hq, D), enc, ow);
  }
  o.lse = lse_got;
  posenc::paged_attention_workspace<T> ws;
  posenc::attention<posenc::path::fused>(posenc::make_bshd<const T>(q.data(), n, sq, Hq, D), cache, order,
                                         posenc::make_bshd(got.data(), n, sq, Hq, D), enc, o, ws);
  double const tol = std::is_same<T, float>::value ? 2e-5 : 1e-12;
  INFO(what);
  CHECK(max_diff(want, got) < tol);
  CHECK(max_diff(lse_want, lse_got) < tol * 10);
}

}  // namespace

TEMPLATE_TEST_CASE("paged decode over scattered pages equals the contiguous cache: tiles across page runs",
                   "[paged]", float, double) {
  using T = TestType;
  // Page sizes below, at and above the key tile, and odd ones; lengths 63,
  // 64, 65 and 129 or 250 (tiles that end inside a page, and a partly filled
  // last page), 1 and 3 query tokens.
  for (index_t page : {1, 3, 16, 17, 64, 100}) {
    for (index_t sq : {1, 3}) {
      std::string const where = "page " + std::to_string(page) + ", " + std::to_string(sq) + " queries";
      for (auto const& [oname, opt] : option_sets<T>()) {
        for_each_encoder<T>([&, oname = oname, opt = opt](std::string const& ename, auto const& enc) {
          check_scattered_decode<T>(enc, page, sq, opt, ename + ", " + oname + ", " + where);
        });
      }
      posenc::attention_options<T> causal;
      causal.causal = true;
      for_each_encoder<T>([&](std::string const& ename, auto const& enc) {
        check_scattered_decode<T>(enc, page, sq, causal, ename + ", causal, masked, " + where, true);
      });
    }
  }
}

TEMPLATE_TEST_CASE("paged attention equals the contiguous cache: every encoder, option and page size",
                   "[paged]", float, double) {
  using T = TestType;
  for (index_t page : {1, 16, 64, 100}) {
    for (auto const& [oname, opt] : option_sets<T>()) {
      for_each_encoder<T>([&, oname = oname, opt = opt](std::string const& ename, auto const& enc) {
        std::string const what = ename + ", " + oname + ", page " + std::to_string(page);
        check_against_contiguous<T, posenc::path::fused>(enc, page, opt, what + ", fused");
        if (page == 16) check_against_contiguous<T, posenc::path::reference>(enc, page, opt, what + ", reference");
      });
    }
  }
}

TEMPLATE_TEST_CASE("paged prefill (lane kernel over the pages) equals the contiguous cache: every encoder and option",
                   "[paged]", float, double) {
  using T = TestType;
  // 16-token pages with 70 .. 73 queries (tiles that start inside a run of
  // pages); in float also 100-token pages and 1-token pages (every page its
  // own run) with 37 .. 40 queries (a partial lane block). The page walk does
  // not depend on the element type: double runs the 16-token case only.
  for (index_t page : {16, 100, 1}) {
    if (page != 16 && !std::is_same<T, float>::value) continue;
    index_t const prefill = page == 16 ? 70 : 37;
    for (auto const& [oname, opt] : option_sets<T>()) {
      for_each_encoder<T>([&, oname = oname, opt = opt](std::string const& ename, auto const& enc) {
        std::string const what = ename + ", " + oname + ", page " + std::to_string(page) + ", prefill " +
                                 std::to_string(prefill) + ", fused";
        check_against_contiguous<T, posenc::path::fused>(enc, page, opt, what, prefill);
      });
    }
  }
}

TEST_CASE("paged prefill (lane kernel over the pages) with masks", "[paged]") {
  // A per-query additive mask over 4 entries of 33 queries each: fused against the reference path.
  index_t const n = 4, sq = 33, K = 300;
  posenc::attention_options<float> opt;
  opt.causal = true;
  std::vector<float> mask(static_cast<std::size_t>(n * Hq * sq * K), 0.0f);
  for (std::size_t i = 0; i < mask.size(); i += 7) mask[i] = -std::numeric_limits<float>::infinity();
  for (std::size_t i = 3; i < mask.size(); i += 11) mask[i] = -0.5f;
  opt.mask = posenc::make_mask<float>(mask.data(), n, Hq, sq, K);
  posenc::alibi<float> const enc(posenc::alibi_form::paper, Hq);
  posenc::paged_kv_cache<float> cache(64, 16, Hkv, D);
  tokens<float> t(200, 5);
  std::vector<index_t> ids;
  for (index_t s = 0; s < n; ++s) {
    ids.push_back(cache.add_sequence(3 * s));
    cache.append(ids.back(), tokens<float>::part(t.k, 0, 50 + 40 * s, Hkv), tokens<float>::part(t.v, 0, 50 + 40 * s, Hkv),
                 enc);
  }
  std::vector<float> q = random_vector<float>(static_cast<std::size_t>(n * sq * Hq * D), 78);
  std::vector<float> want(q.size(), 7.0f), got(q.size(), -7.0f);
  posenc::attention<posenc::path::reference>(posenc::make_bshd<const float>(q.data(), n, sq, Hq, D), cache, ids,
                                             posenc::make_bshd(want.data(), n, sq, Hq, D), enc, opt);
  posenc::attention<posenc::path::fused>(posenc::make_bshd<const float>(q.data(), n, sq, Hq, D), cache, ids,
                                         posenc::make_bshd(got.data(), n, sq, Hq, D), enc, opt);
  CHECK(max_diff(want, got) < 2e-5);
}

TEST_CASE("paged attention equals the contiguous cache with masks", "[paged]") {
  // An additive mask per entry and a broadcast bool mask; key index j is the sequence's token j.
  posenc::attention_options<float> opt;
  opt.causal = true;
  index_t const K = 300;
  std::vector<float> mask(static_cast<std::size_t>(4 * Hq * 1 * K), 0.0f);
  for (std::size_t i = 0; i < mask.size(); i += 7) mask[i] = -std::numeric_limits<float>::infinity();
  opt.mask = posenc::make_mask<float>(mask.data(), 4, Hq, 1, K);
  // Masks are per entry of the paged call: the contiguous check runs entry by
  // entry with the slice of its entry, so compare through the reference path.
  posenc::paged_kv_cache<float> cache(64, 16, Hkv, D);
  tokens<float> t(200, 5);
  std::vector<index_t> ids;
  for (index_t s = 0; s < 4; ++s) {
    ids.push_back(cache.add_sequence(3 * s));
    cache.append(ids.back(), tokens<float>::part(t.k, 0, 50 + 40 * s, Hkv), tokens<float>::part(t.v, 0, 50 + 40 * s, Hkv),
                 posenc::alibi<float>(posenc::alibi_form::paper, Hq));
  }
  std::vector<float> q = random_vector<float>(static_cast<std::size_t>(4 * Hq * D), 77);
  std::vector<float> want(q.size()), got(q.size());
  posenc::alibi<float> const enc(posenc::alibi_form::paper, Hq);
  for (auto const& [name, o] : {std::make_pair(std::string("additive"), opt), [&] {
                                  posenc::attention_options<float> b = opt;
                                  b.mask = {};
                                  return std::make_pair(std::string("none"), b);
                                }()}) {
    INFO(name);
    posenc::attention<posenc::path::reference>(posenc::make_bshd<const float>(q.data(), 4, 1, Hq, D), cache, ids,
                                               posenc::make_bshd(want.data(), 4, 1, Hq, D), enc, o);
    posenc::attention<posenc::path::fused>(posenc::make_bshd<const float>(q.data(), 4, 1, Hq, D), cache, ids,
                                           posenc::make_bshd(got.data(), 4, 1, Hq, D), enc, o);
    CHECK(max_diff(want, got) < 2e-5);
    // and the reference over the paged cache equals a plain call on each gathered sequence
    for (index_t b = 0; b < 4; ++b) {
      std::vector<float> one(static_cast<std::size_t>(Hq * D));
      posenc::attention_options<float> ob = o;
      ob.k_positions = posenc::position_span(3 * b);
      ob.q_positions = posenc::position_span(3 * b + 50 + 40 * b - 1);
      if (!o.mask.empty()) {
        ob.mask = posenc::make_mask<float>(mask.data() + b * Hq * K, 1, Hq, 1, K);
        ob.mask.k = 50 + 40 * b;  // the sequence's keys
      }
      posenc::attention<posenc::path::reference>(posenc::make_bshd<const float>(q.data() + b * Hq * D, 1, 1, Hq, D),
                                                 tokens<float>::part(t.k, 0, 50 + 40 * b, Hkv),
                                                 tokens<float>::part(t.v, 0, 50 + 40 * b, Hkv),
                                                 posenc::make_bshd(one.data(), 1, 1, Hq, D), enc, ob);
      std::vector<float> part(want.begin() + b * Hq * D, want.begin() + (b + 1) * Hq * D);
      CHECK(max_diff(part, one) < 1e-6);
    }
  }
}

namespace {

/// out then lse of the paged call on Path (float cache, alibi): with the
/// 16-bit mask m16 when given, else with opt alone.
template <class Path, class M>
std::vector<float> paged_masked(posenc::paged_kv_cache<float> const& cache, std::vector<index_t> const& ids,
                                std::vector<float> const& q, index_t sq, posenc::alibi<float> const& enc,
                                posenc::attention_options<float> opt, posenc::mask_view<M> const* m16) {
  index_t const n = static_cast<index_t>(ids.size());
  std::vector<float> out(static_cast<std::size_t>(n * sq * Hq * D), 7.0f), lse(static_cast<std::size_t>(n * Hq * sq));
  opt.lse = lse;
  auto const qv = posenc::make_bshd<const float>(q.data(), n, sq, Hq, D);
  auto const ov = posenc::make_bshd(out.data(), n, sq, Hq, D);
  if (m16)
    posenc::attention<Path>(qv, cache, ids, ov, enc, opt, *m16);
  else
    posenc::attention<Path>(qv, cache, ids, ov, enc, opt);
  out.insert(out.end(), lse.begin(), lse.end());
  return out;
}

/// The 16-bit mask of type M against the float mask of its widened values
/// over a float paged cache: bit for bit (out and lse), fused and reference,
/// decode and prefill (lane kernel), one and two threads, per-entry and
/// broadcast shapes, a key extent past every sequence (cut) and a short one.
template <class M>
void check_half_mask_float_cache() {
  posenc::alibi<float> const enc(posenc::alibi_form::paper, Hq);
  posenc::paged_kv_cache<float> cache(64, 16, Hkv, D);
  tokens<float> t(200, 5);
  index_t const n = 4;
  std::vector<index_t> ids;
  for (index_t s = 0; s < n; ++s) {  // lengths 50, 90, 130, 170
    ids.push_back(cache.add_sequence(3 * s));
    cache.append(ids.back(), tokens<float>::part(t.k, 0, 50 + 40 * s, Hkv), tokens<float>::part(t.v, 0, 50 + 40 * s, Hkv),
                 enc);
  }
  struct shape {
    index_t batch, heads, q, k;
  };
  for (index_t sq : {index_t(1), index_t(33)})
    for (int threads : {1, 2})
      for (bool causal : {false, true})
        for (shape ms : {shape{n, Hq, sq, 300}, shape{1, 1, 1, 300}, shape{n, 1, sq, 100}, shape{1, Hq, 1, 170}}) {
          INFO("Sq " << sq << " threads " << threads << (causal ? " causal" : "") << " mask " << ms.batch << " x "
                     << ms.heads << " x " << ms.q << " x " << ms.k);
          std::size_t const count = static_cast<std::size_t>(ms.batch * ms.heads * ms.q * ms.k);
          std::vector<float> const v = random_vector<float>(count, 90 + static_cast<std::uint64_t>(sq), -4, 4);
          std::vector<M> m16(count);
          std::vector<float> m32(count);
          for (std::size_t i = 0; i < count; ++i) {
            float const x = i % 5 == 1 ? -std::numeric_limits<float>::infinity() : i % 7 == 2 ? 0.0f : v[i];
            m16[i] = posenc::detail::to_storage<M>(x);
            m32[i] = posenc::detail::stored_value<float>(m16[i]);
          }
          std::vector<float> const q = random_vector<float>(static_cast<std::size_t>(n * sq * Hq * D), 79);
          posenc::attention_options<float> opt;
          opt.causal = causal;
          opt.threads = threads;
          posenc::attention_options<float> ow = opt;
          ow.mask = posenc::make_mask<float>(m32.data(), ms.batch, ms.heads, ms.q, ms.k);
          posenc::mask_view<M> const mh = posenc::make_mask<M>(m16.data(), ms.batch, ms.heads, ms.q, ms.k);
          posenc::mask_view<M> const* none = nullptr;
          CHECK(paged_masked<posenc::path::fused>(cache, ids, q, sq, enc, opt, &mh) ==
                paged_masked<posenc::path::fused>(cache, ids, q, sq, enc, ow, none));
          CHECK(paged_masked<posenc::path::reference>(cache, ids, q, sq, enc, opt, &mh) ==
                paged_masked<posenc::path::reference>(cache, ids, q, sq, enc, ow, none));
        }
  // A bad 16-bit mask throws before out is written.
  std::vector<M> m16(static_cast<std::size_t>(n * Hq * 300));
  std::vector<float> const q = random_vector<float>(static_cast<std::size_t>(n * Hq * D), 80);
  std::vector<float> out(q.size(), 42.0f);
  CHECK_THROWS_WITH(posenc::attention(posenc::make_bshd<const float>(q.data(), n, 1, Hq, D), cache, ids,
                                      posenc::make_bshd(out.data(), n, 1, Hq, D), enc, {},
                                      posenc::make_mask<M>(m16.data(), 2, Hq, 1, 300)),
                    posenc_test::contains("mask (16-bit).batch is 2, expected 1 or 4 (seq_ids.size())"));
  for (float x : out) CHECK(x == 42.0f);
}

}  // namespace

TEST_CASE("paged attention with a 16-bit mask equals the float mask of its widened values, bit for bit",
          "[paged][mask][half]") {
  check_half_mask_float_cache<Eigen::half>();
  check_half_mask_float_cache<Eigen::bfloat16>();
}

TEST_CASE("paged_kv_cache: a fork shares pages; appends never change another sequence's keys", "[paged]") {
  for (index_t page : {1, 16, 100}) {
    INFO("page " << page);
    posenc::paged_kv_cache<float> cache(400, page, Hkv, D);
    tokens<float> t(300, 3), u(300, 4);
    posenc::rope<float> const rope(posenc::rope_layout::half_split, D);
    index_t const a = cache.add_sequence();
    index_t const L0 = 2 * page + page / 2 + 1;  // a partly filled last page
    cache.append(a, tokens<float>::part(t.k, 0, L0, Hkv), tokens<float>::part(t.v, 0, L0, Hkv), rope);
    index_t const b = cache.fork(a);
    index_t const c = cache.fork(b);
    CHECK(cache.length(b) == L0);
    for (index_t p : cache.page_table(a)) CHECK(cache.page_references(p) == 3);
    auto snapshot = [&](index_t id) {
      std::vector<float> k;
      auto const table = cache.page_table(id);
      for (index_t j = 0; j < cache.length(id); ++j) {
        auto const pk = cache.page_keys(table[j / page], 1);
        auto const pv = cache.page_values(table[j / page], 1);
        for (index_t h = 0; h < Hkv; ++h) {
          k.insert(k.end(), pk.ptr(0, j % page, h), pk.ptr(0, j % page, h) + D);
          k.insert(k.end(), pv.ptr(0, j % page, h), pv.ptr(0, j % page, h) + D);
        }
      }
      return k;
    };
    auto const before_a = snapshot(a), before_c = snapshot(c);
    // b appends different tokens into the shared last page, then many more.
    cache.append(b, tokens<float>::part(u.k, 0, 1, Hkv), tokens<float>::part(u.v, 0, 1, Hkv), rope);
    cache.append(b, tokens<float>::part(u.k, 1, 2 * page + 3, Hkv), tokens<float>::part(u.v, 1, 2 * page + 3, Hkv),
                 rope);
    CHECK(snapshot(a) == before_a);
    CHECK(snapshot(c) == before_c);
    // a appends too (many sequences at once with c): still no effect on b's copy of the prefix
    auto const b_prefix = snapshot(b);
    std::vector<float> k2 = random_vector<float>(static_cast<std::size_t>(2 * 5 * Hkv * D), 9);
    std::vector<index_t> ac = {a, c};
    cache.append(ac, posenc::make_bshd<const float>(k2.data(), 2, 5, Hkv, D),
                 posenc::make_bshd<const float>(k2.data(), 2, 5, Hkv, D), rope);
    CHECK(snapshot(b) == b_prefix);
    auto const sa = snapshot(a);
    CHECK(std::vector<float>(sa.begin(), sa.begin() + static_cast<std::ptrdiff_t>(before_a.size())) == before_a);
    CHECK(snapshot(a) != snapshot(c));
    // full shared pages stay shared: every sequence still points at the first page
    CHECK(cache.page_table(a)[0] == cache.page_table(b)[0]);
    CHECK(cache.page_table(a)[0] == cache.page_table(c)[0]);
    // freeing returns exactly the pages nobody shares
    index_t const free_before = cache.free_page_count();
    cache.free(b);
    CHECK(cache.free_page_count() > free_before);
    cache.free(a);
    cache.free(c);
    CHECK(cache.free_page_count() == cache.pages());
  }
}

// One batched decode step over 16 sequences of lengths 40 .. 640 after a first
// step has grown the workspace: `counted_append` counts the appends too (an
// encoder that rotates allocates inside its own rotate, which is its business).
// `reorder`: the counted steps take the sequences in reverse order, as a server
// whose batch changes does, so that each workspace entry meets a sequence
// 16 times longer than the one it was sized for.
template <class E>
long long decode_step_allocations(E const& enc, index_t first, int threads, bool counted_append,
                                  bool reorder = false) {
  posenc::paged_kv_cache<float> cache(1024, 16, Hkv, D);
  tokens<float> t(700, 11);
  std::vector<index_t> ids;
  for (index_t s = 0; s < 16; ++s) {
    ids.push_back(cache.add_sequence(first));
    index_t const n = 40 + 40 * s;
    cache.append(ids.back(), tokens<float>::part(t.k, 0, n, Hkv), tokens<float>::part(t.v, 0, n, Hkv), enc);
  }
  std::vector<float> q = random_vector<float>(static_cast<std::size_t>(16 * Hq * D), 12), out(q.size());
  std::vector<float> kn = random_vector<float>(static_cast<std::size_t>(16 * Hkv * D), 13);
  posenc::attention_options<float> opt;
  opt.causal = true;
  opt.threads = threads;
  posenc::paged_attention_workspace<float> ws;
  auto step = [&] {
    // one new token per sequence (no page boundary is crossed), then the attention of the step
    if (reorder) std::reverse(ids.begin(), ids.end());
    g_counting = counted_append;
    cache.append(ids, posenc::make_bshd<const float>(kn.data(), 16, 1, Hkv, D),
                 posenc::make_bshd<const float>(kn.data(), 16, 1, Hkv, D), enc);
    g_counting = true;
    posenc::attention(posenc::make_bshd<const float>(q.data(), 16, 1, Hq, D), cache, ids,
                      posenc::make_bshd(out.data(), 16, 1, Hq, D), enc, opt, ws);
    g_counting = false;
  };
  step();
  g_allocations = 0;
  step();
  step();
  g_counting = false;
  return g_allocations.load();
}

TEST_CASE("paged attention: a decode step allocates nothing once pages exist", "[paged]") {
  posenc::rope<float> rope(posenc::rope_layout::half_split, D);
  rope.reserve(4096);
  posenc::alibi<float> const alibi(posenc::alibi_form::paper, Hq);
  for (int threads : {1, 2}) {
    INFO(threads << " threads");
    CHECK(decode_step_allocations(posenc::none{}, 0, threads, true) == 0);
    CHECK(decode_step_allocations(alibi, 5, threads, true) == 0);
    CHECK(decode_step_allocations(rope, 0, threads, false) == 0);
    CHECK(decode_step_allocations(rope, 7, threads, false) == 0);
    // Transformer-XL: queries shifted by u in the workspace; a memory cut skips keys
    CHECK(decode_step_allocations(posenc_test::random_transformer_xl<float>(Hq, D, 6, 2048, 5), 0, threads, true) == 0);
    CHECK(decode_step_allocations(posenc_test::random_transformer_xl<float>(Hq, D, 6, 2048, 6, 100), 3, threads, true,
                                  true) == 0);
    // every first position, whatever sequence each entry held before
    for (index_t first : {0, 1, 5, 1000}) {
      INFO("first position " << first << ", entries reordered");
      CHECK(decode_step_allocations(posenc::none{}, first, threads, true, true) == 0);
      CHECK(decode_step_allocations(alibi, first, threads, true, true) == 0);
      CHECK(decode_step_allocations(rope, first, threads, false, true) == 0);
    }
  }
}

// True if the page table is one run of consecutive page ids.
bool one_run(posenc::span<const index_t> table) {
  for (index_t p = 1; p < table.size(); ++p)
    if (table[p] != table[p - 1] + 1) return false;
  return true;
}

TEST_CASE("paged_kv_cache: sequences growing together keep their pages consecutive; freed pages are reused in order",
          "[paged]") {
  index_t const page = 4;
  tokens<float> t(40, 5);
  auto appender = [&](posenc::paged_kv_cache<float>& cache) {
    return [&](index_t id, index_t n) {
      cache.append(id, tokens<float>::part(t.k, 0, n, Hkv), tokens<float>::part(t.v, 0, n, Hkv), posenc::none{});
    };
  };
  auto pages_of = [](posenc::paged_kv_cache<float> const& cache, index_t id) {
    auto const tb = cache.page_table(id);
    return std::vector<index_t>(tb.begin(), tb.end());
  };
  SECTION("growing together: each sequence continues after its last page; a new one starts mid free run") {
    posenc::paged_kv_cache<float> cache(40, page, Hkv, D);
    auto append = appender(cache);
    // Three sequences growing a page each in turn, as a decode batch does.
    index_t const a = cache.add_sequence(), b = cache.add_sequence(), c = cache.add_sequence();
    for (int round = 0; round < 6; ++round)
      for (index_t x : {a, b, c}) append(x, page);
    // a starts the pool; b the middle of the free run [1, 40); c the middle of
    // the lowest of the two longest free runs, [1, 20) and [21, 40).
    CHECK(pages_of(cache, a) == std::vector<index_t>{0, 1, 2, 3, 4, 5});
    CHECK(pages_of(cache, b) == std::vector<index_t>{20, 21, 22, 23, 24, 25});
    CHECK(pages_of(cache, c) == std::vector<index_t>{10, 11, 12, 13, 14, 15});
    // a grows up to c's first page, then continues in the middle of the
    // longest free run, [26, 40).
    append(a, 5 * page);
    CHECK(pages_of(cache, a) == std::vector<index_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 33});
    // Many sequences growing together: each keeps one run while the pool has room.
    posenc::paged_kv_cache<float> big(400, page, Hkv, D);
    auto append_big = appender(big);
    std::vector<index_t> ids;
    for (int s = 0; s < 8; ++s) ids.push_back(big.add_sequence());
    for (int round = 0; round < 10; ++round)
      for (index_t id : ids) append_big(id, round % 2 ? page : 3);  // page boundaries crossed at different steps
    for (index_t id : ids) {
      INFO("sequence " << id);
      CHECK(one_run(big.page_table(id)));
    }
  }
  SECTION("after frees and forks") {
    posenc::paged_kv_cache<float> cache(12, page, Hkv, D);
    auto append = appender(cache);
    index_t const a = cache.add_sequence(), b = cache.add_sequence(), c = cache.add_sequence();
    for (index_t x : {a, b, c}) append(x, 2 * page);
    CHECK(pages_of(cache, a) == std::vector<index_t>{0, 1});
    CHECK(pages_of(cache, b) == std::vector<index_t>{7, 8});  // the middle of [2, 12)
    CHECK(pages_of(cache, c) == std::vector<index_t>{4, 5});  // the middle of [2, 7)
    cache.free(a);
    cache.free(c);
    // The free runs are [0, 7) and [9, 12): a new sequence starts the pool and keeps going.
    index_t const d = cache.add_sequence();
    append(d, 16);
    CHECK(pages_of(cache, d) == std::vector<index_t>{0, 1, 2, 3});
    // A fork appending past its shared pages continues after them.
    index_t const e = cache.fork(b);
    append(e, 1);
    CHECK(pages_of(cache, e) == std::vector<index_t>{7, 8, 9});
    // A shared, partly filled last page is copied next to the page before it when that is free.
    cache.free(d);
    index_t const f = cache.add_sequence();
    append(f, page + 1);  // pages 0 and 1, the last one partly filled
    index_t const g = cache.fork(f);
    append(g, 1);  // copies page 1: the page after page 0 is page 1 itself (shared), so the middle of [2, 7)
    CHECK(pages_of(cache, f) == std::vector<index_t>{0, 1});
    CHECK(pages_of(cache, g) == std::vector<index_t>{0, 4});
  }
  SECTION("a fragmented pool still serves every free page") {
    posenc::paged_kv_cache<float> cache(10, page, Hkv, D);
    fragment_pool(cache, posenc::none{});
    CHECK(cache.free_page_count() == 5);
    index_t const x = cache.add_sequence();
    auto append = appender(cache);
    append(x, 5 * page);
    CHECK(pages_of(cache, x) == std::vector<index_t>{0, 2, 4, 6, 8});
    CHECK(cache.free_page_count() == 0);
  }
}

// What compact() must keep of one sequence: its keys and values in token
// order, length, first position, and how many sequences share each of its pages.
template <class T>
struct kept {
  std::vector<T> k, v;
  index_t length = 0, first = 0;
  std::vector<index_t> refs;
  bool operator==(kept const& o) const {
    return k == o.k && v == o.v && length == o.length && first == o.first && refs == o.refs;
  }
};
template <class T>
kept<T> kept_of(posenc::paged_kv_cache<T> const& cache, index_t id) {
  kept<T> r;
  r.length = cache.length(id);
  r.first = cache.first_position(id);
  auto const table = cache.page_table(id);
  index_t const P = cache.page_tokens();
  for (index_t p : table) r.refs.push_back(cache.page_references(p));
  for (index_t j = 0; j < r.length; ++j) {
    auto const pk = cache.page_keys(table[j / P], 1), pv = cache.page_values(table[j / P], 1);
    for (index_t h = 0; h < cache.kv_heads(); ++h) {
      r.k.insert(r.k.end(), pk.ptr(0, j % P, h), pk.ptr(0, j % P, h) + cache.head_dim());
      r.v.insert(r.v.end(), pv.ptr(0, j % P, h), pv.ptr(0, j % P, h) + cache.value_dim());
    }
  }
  return r;
}

// A pool fragmented first (one-page fillers, every other one freed), then
// sequences growing in turn, forks appending past a shared partly filled
// page, frees and a sequence taking the freed pages; compact()
// (each of its allocations failed in turn first: the cache stays as it was)
// must keep every sequence's tokens, sharing and attention output bit for bit,
// and leave each unshared sequence one run, the used pages first.
template <class T>
void check_compact(index_t page) {
  using I = typename posenc::paged_kv_cache<T>::input_type;
  index_t const Dv = D + 3, L = 12 * page + 5;
  posenc::paged_kv_cache<T> cache(240, page, Hkv, D, Dv);
  std::vector<I> const k = random_vector<I>(static_cast<std::size_t>(L * Hkv * D), 41);
  std::vector<I> const v = random_vector<I>(static_cast<std::size_t>(L * Hkv * Dv), 42);
  posenc::rope<I> const rope(posenc::rope_layout::half_split, D);
  auto append = [&](index_t id, index_t n) {
    index_t const at = cache.length(id) % (L - n + 1);
    cache.append(id, posenc::make_bshd<const I>(k.data() + at * Hkv * D, 1, n, Hkv, D),
                 posenc::make_bshd<const I>(v.data() + at * Hkv * Dv, 1, n, Hkv, Dv), rope);
  };
  std::vector<index_t> fillers, open;
  for (index_t p = 0; p < cache.pages(); ++p) {
    fillers.push_back(cache.add_sequence());
    append(fillers.back(), 1);
  }
  for (index_t id : fillers) {
    if (cache.page_table(id)[0] % 2 == 0)
      cache.free(id);
    else
      open.push_back(id);
  }
  std::vector<index_t> ids;
  for (index_t s = 0; s < 6; ++s) ids.push_back(cache.add_sequence(3 * s));
  for (index_t round = 0; round < 8; ++round)
    for (index_t s = 0; s < 6; ++s) append(ids[static_cast<std::size_t>(s)], 1 + (round * 7 + s * 5) % (2 * page));
  index_t const f1 = cache.fork(ids[1]);
  append(f1, page + 2);
  index_t const f2 = cache.fork(f1);
  append(f2, 1);
  cache.free(ids[0]);
  cache.free(ids[3]);
  index_t const late = cache.add_sequence(7);
  append(late, 5 * page + 1);
  append(ids[2], 2 * page);
  open.insert(open.end(), {ids[1], ids[2], ids[4], ids[5], f1, f2, late});
  REQUIRE(cache.page_runs(late) > 1);

  auto snapshot = [&] {
    std::vector<kept<T>> r;
    for (index_t id : open) r.push_back(kept_of(cache, id));
    return r;
  };
  auto tables = [&] {
    std::vector<std::vector<index_t>> r;
    for (index_t id : open) r.emplace_back(cache.page_table(id).begin(), cache.page_table(id).end());
    return r;
  };
  // One decode step over every open sequence (the query tokens alone), fused path.
  auto const n = static_cast<index_t>(open.size());
  std::vector<I> const q = random_vector<I>(static_cast<std::size_t>(n * Hq * D), 43);
  auto attend = [&](auto path) {
    std::vector<I> out(static_cast<std::size_t>(n * Hq * Dv));
    posenc::attention_options<I> opt;
    opt.causal = true;
    posenc::paged_attention_workspace<T> ws;
    posenc::attention<decltype(path)>(posenc::make_bshd<const I>(q.data(), n, 1, Hq, D), cache, open,
                                      posenc::make_bshd(out.data(), n, 1, Hq, Dv), rope, opt, ws);
    return out;
  };
  auto const before = snapshot();
  auto const tables_before = tables();
  auto const out_before = attend(posenc::path::fused{});
  index_t const free_before = cache.free_page_count();

  index_t moved = -1;
  for (long long fail = 0; moved < 0; ++fail) {
    INFO("allocation " << fail << " of compact() fails");
    REQUIRE(fail < 100);
    posenc_test::reset_allocation_counters();
    posenc_test::g_fail_at = fail;
    g_counting = true;
    try {
      moved = cache.compact();
    } catch (std::bad_alloc const&) {
      g_counting = false;
      CHECK(tables() == tables_before);
      CHECK(snapshot() == before);
      CHECK(cache.free_page_count() == free_before);
    }
    g_counting = false;
    posenc_test::g_fail_at = -1;
  }
  index_t const used = cache.pages() - cache.free_page_count();
  CHECK(moved > 0);
  CHECK(moved <= used);
  CHECK(cache.free_page_count() == free_before);
  CHECK(snapshot() == before);
  // The row kernel walks the same steps over any page layout: the same bits. The lane kernel
  // (from a SIMD width of query rows per kv head: here double with 2 lanes, SSE2 or NEON) lays
  // its tiles from each run of pages, which compaction changes: as accurate as before
  // (support/kernel_choice.hpp).
  if (posenc_test::paged_row_kernel<I, T, I, posenc::rope<I>>(Hq / Hkv)) {
    CHECK(attend(posenc::path::fused{}) == out_before);
  } else {
    auto const r = posenc_test::within_tolerance(attend(posenc::path::fused{}), attend(posenc::path::reference{}),
                                                 out_before, std::is_same_v<I, double> ? 1e-12 : 1e-6);
    INFO("after compaction, against before: " << r.describe());
    CHECK(r.ok);
  }
  for (index_t p = 0; p < cache.pages(); ++p) CHECK((cache.page_references(p) != 0) == (p < used));
  for (index_t id : open) {
    INFO("sequence " << id);
    auto const table = cache.page_table(id);
    bool shared = false;
    for (index_t p : table) shared = shared || cache.page_references(p) > 1;
    if (!shared) CHECK(cache.page_runs(id) == 1);
    CHECK(cache.page_runs(id) <= 3);  // a fork of a fork: its parents' pages, then its own
  }
  // Nothing left to move.
  auto const tables_after = tables();
  CHECK(cache.compact() == 0);
  CHECK(tables() == tables_after);
  // Copy-on-write still separates the forks, and the pool is whole again after freeing.
  auto const kept_f2 = kept_of(cache, f2), kept_parent = kept_of(cache, ids[1]);
  append(f1, page + 1);
  append(ids[1], 1);
  CHECK(kept_of(cache, f2) == kept_f2);
  auto const now_parent = kept_of(cache, ids[1]);
  CHECK(std::vector<T>(now_parent.k.begin(), now_parent.k.begin() + static_cast<std::ptrdiff_t>(kept_parent.k.size())) ==
        kept_parent.k);
  for (index_t id : open) cache.free(id);
  CHECK(cache.free_page_count() == cache.pages());
  CHECK(cache.compact() == 0);
}

TEST_CASE("paged_kv_cache: compact() makes every sequence one run and changes no token, share or result",
          "[paged]") {
  for (index_t page : {1, 3, 16}) {
    INFO("page_tokens " << page);
    check_compact<float>(page);
    check_compact<double>(page);
    check_compact<Eigen::bfloat16>(page);
    check_compact<Eigen::half>(page);
  }
  SECTION("runs with free pages between them close up; then nothing moves") {
    posenc::paged_kv_cache<float> cache(10, 4, Hkv, D);
    tokens<float> const t(12, 8);
    std::vector<index_t> ids;
    for (index_t s = 0; s < 2; ++s) {
      ids.push_back(cache.add_sequence());
      cache.append(ids.back(), tokens<float>::part(t.k, 0, 12, Hkv), tokens<float>::part(t.v, 0, 12, Hkv),
                   posenc::none{});
    }
    // the second sequence starts in the middle of the free run [3, 10)
    CHECK(std::vector<index_t>(cache.page_table(ids[1]).begin(), cache.page_table(ids[1]).end()) ==
          std::vector<index_t>{6, 7, 8});
    CHECK(cache.compact() == 3);
    CHECK(std::vector<index_t>(cache.page_table(ids[0]).begin(), cache.page_table(ids[0]).end()) ==
          std::vector<index_t>{0, 1, 2});
    CHECK(std::vector<index_t>(cache.page_table(ids[1]).begin(), cache.page_table(ids[1]).end()) ==
          std::vector<index_t>{3, 4, 5});
    CHECK(cache.compact() == 0);
    posenc::paged_kv_cache<float> none(0, 4, Hkv, D);
    CHECK(none.compact() == 0);
  }
  SECTION("a fragmented pool: every page its own run, then one run") {
    posenc::paged_kv_cache<float> cache(20, 4, Hkv, D);
    fragment_pool(cache, posenc::none{});
    tokens<float> const t(40, 9);
    index_t const x = cache.add_sequence();
    cache.append(x, tokens<float>::part(t.k, 0, 37, Hkv), tokens<float>::part(t.v, 0, 37, Hkv), posenc::none{});
    CHECK(cache.page_runs(x) == 10);
    auto const k = kept_of(cache, x);
    // x (first page 0) goes to pages 0 .. 9, the fillers (pages 1, 3, .. 19) to
    // 10 .. 19: every page but 0 and 19 moves.
    CHECK(cache.compact() == 18);
    CHECK(cache.page_runs(x) == 1);
    CHECK(kept_of(cache, x) == k);
    CHECK(cache.page_runs(cache.add_sequence()) == 0);
  }
}

TEST_CASE("paged_kv_cache: storage is head-major; a run of consecutive pages is one head-major view", "[paged]") {
  for (index_t page : {1, 3, 16}) {
    INFO("page_tokens " << page);
    index_t const pages = 12, Dv = D + 3;
    posenc::paged_kv_cache<float> cache(pages, page, Hkv, D, Dv);
    index_t const L = 4 * page + 1;  // five pages, the last partly filled
    std::vector<float> const k = random_vector<float>(static_cast<std::size_t>(L * Hkv * D), 31);
    std::vector<float> const v = random_vector<float>(static_cast<std::size_t>(L * Hkv * Dv), 32);
    index_t const id = cache.add_sequence();
    cache.append(id, posenc::make_bshd<const float>(k.data(), 1, L, Hkv, D),
                 posenc::make_bshd<const float>(v.data(), 1, L, Hkv, Dv), posenc::none{});
    auto const table = cache.page_table(id);
    REQUIRE(table.size() == 5);
    REQUIRE(one_run(table));
    auto const pk = cache.page_keys(table[0], table.size());
    auto const pv = cache.page_values(table[0], table.size());
    // kv_cache's head-major form: each head's tokens one after another, heads the pool apart
    CHECK(pk.seq_stride == D);
    CHECK(pk.head_stride == pages * page * D);
    CHECK(pv.seq_stride == Dv);
    CHECK(pv.head_stride == pages * page * Dv);
    CHECK(pk.seq == 5 * page);
    CHECK(pk.heads == Hkv);
    bool same = true, adjacent = true;
    for (index_t t = 0; t < L; ++t)
      for (index_t h = 0; h < Hkv; ++h) {
        // the view of the run and the view of the token's own page address the same element
        auto const own_k = cache.page_keys(table[t / page], 1), own_v = cache.page_values(table[t / page], 1);
        adjacent = adjacent && pk.ptr(0, t, h) == own_k.ptr(0, t % page, h) &&
                   pv.ptr(0, t, h) == own_v.ptr(0, t % page, h);
        for (index_t d = 0; d < D; ++d)
          same = same && pk(0, t, h, d) == k[static_cast<std::size_t>((t * Hkv + h) * D + d)];
        for (index_t d = 0; d < Dv; ++d)
          same = same && pv(0, t, h, d) == v[static_cast<std::size_t>((t * Hkv + h) * Dv + d)];
      }
    CHECK(adjacent);
    CHECK(same);
  }
}

// The fused decode over float pages walks each kv head as the fused decode over
// a head-major kv_cache does (the same steps from the same first key, each step's
// rows in one strided view or gathered across pages), so with the same chunks both
// give the same bits: pages in one run, and every page its own run in a fragmented pool.
TEST_CASE("paged fused decode over float pages equals the kv_cache fused decode bit for bit", "[paged]") {
  posenc::rope<float> rope(posenc::rope_layout::half_split, D);
  rope.reserve(4096);
  posenc::alibi<float> const alibi(posenc::alibi_form::paper, Hq);
  auto run = [&](auto const& enc, char const* name) {
    for (bool fragmented : {false, true})
      for (index_t page : {16, 5})
        for (index_t sq : {1, 3})
          for (int threads : {1, 2}) {
            INFO(name << (fragmented ? ", fragmented pool" : ", one run") << ", page " << page << ", Sq " << sq
                      << ", " << threads << " threads");
            index_t const L = 700;
            posenc::paged_kv_cache<float> cache(2 * (L / page + 2) + 4, page, Hkv, D);
            if (fragmented) fragment_pool(cache, enc);
            tokens<float> const t(L, 77);
            index_t const id = cache.add_sequence();
            cache.append(id, tokens<float>::part(t.k, 0, L, Hkv), tokens<float>::part(t.v, 0, L, Hkv), enc);
            REQUIRE(one_run(cache.page_table(id)) != fragmented);
            posenc::kv_cache<float> flat(1, Hkv, D);
            flat.append(tokens<float>::part(t.k, 0, L, Hkv), tokens<float>::part(t.v, 0, L, Hkv), enc);
            std::vector<float> const q(t.q.begin(), t.q.begin() + sq * Hq * D);
            std::vector<float> want(q.size(), 7.0f), got(q.size(), -7.0f);
            std::vector<float> lse_want(static_cast<std::size_t>(Hq * sq)), lse_got(lse_want.size());
            posenc::attention_options<float> opt;
            opt.causal = true;
            opt.threads = threads;
            opt.lse = lse_want;
            auto const qv = posenc::make_bshd<const float>(q.data(), 1, sq, Hq, D);
            posenc::attention<posenc::path::fused>(qv, flat, posenc::make_bshd(want.data(), 1, sq, Hq, D), enc, opt);
            opt.lse = lse_got;
            std::vector<index_t> const ids = {id};
            posenc::attention<posenc::path::fused>(qv, cache, ids, posenc::make_bshd(got.data(), 1, sq, Hq, D), enc,
                                                   opt);
            // A decode (the row kernel: below a SIMD width of query rows per kv head; 3 queries of
            // 2 heads are 6 rows, a lane-kernel call with 4 float lanes, SSE2 or NEON, whose tiles
            // follow the page runs: support/kernel_choice.hpp).
            if (posenc_test::paged_row_kernel<float, float, float, std::decay_t<decltype(enc)>>(sq * (Hq / Hkv))) {
              CHECK(want == got);
              CHECK(lse_want == lse_got);
            } else {
              std::vector<float> ref(q.size()), lse_ref(lse_want.size());
              opt.lse = lse_ref;
              posenc::attention<posenc::path::reference>(qv, cache, ids, posenc::make_bshd(ref.data(), 1, sq, Hq, D),
                                                         enc, opt);
              auto const r = posenc_test::within_tolerance(got, ref, want);
              auto const rl = posenc_test::within_tolerance(lse_got, lse_ref, lse_want);
              INFO("paged against the kv_cache decode: " << r.describe() << "; lse " << rl.describe());
              CHECK(r.ok);
              CHECK(rl.ok);
            }
          }
  };
  run(posenc::none{}, "none");
  run(rope, "rope");
  run(alibi, "alibi");
}

namespace {

// Everything observable about the sequences `ids` of a cache: free pages, and per
// sequence its length, first position, page table with reference counts, keys and values.
std::vector<float> cache_state(posenc::paged_kv_cache<float> const& c, std::vector<index_t> const& ids) {
  std::vector<float> s;
  s.push_back(static_cast<float>(c.free_page_count()));
  for (index_t id : ids) {
    s.push_back(static_cast<float>(c.length(id)));
    s.push_back(static_cast<float>(c.first_position(id)));
    auto const table = c.page_table(id);
    for (index_t p = 0; p < table.size(); ++p) {
      s.push_back(static_cast<float>(table[p]));
      s.push_back(static_cast<float>(c.page_references(table[p])));
    }
    index_t const P = c.page_tokens();
    for (index_t j = 0; j < c.length(id); ++j) {
      auto const k = c.page_keys(table[j / P], 1), v = c.page_values(table[j / P], 1);
      for (index_t h = 0; h < c.kv_heads(); ++h) {
        s.insert(s.end(), k.ptr(0, j % P, h), k.ptr(0, j % P, h) + c.head_dim());
        s.insert(s.end(), v.ptr(0, j % P, h), v.ptr(0, j % P, h) + c.value_dim());
      }
    }
  }
  return s;
}

// The tokens of sequence `id`: its length, first position, keys and values (not where they sit).
std::vector<float> sequence_tokens(posenc::paged_kv_cache<float> const& c, index_t id) {
  std::vector<float> s = cache_state(c, {id});
  s.erase(s.begin() + 3, s.begin() + 3 + 2 * static_cast<std::ptrdiff_t>(c.page_table(id).size()));
  s.erase(s.begin());  // the free page count
  return s;
}

// Pages that hold `tokens` tokens.
index_t page_count(index_t tokens, index_t page) { return (tokens + page - 1) / page; }

// Entry b of a (batch, n, Hkv, D) buffer as a (1, n, Hkv, D) view.
posenc::view<const float> entry(std::vector<float> const& x, index_t b, index_t n) {
  return posenc::make_bshd<const float>(x.data() + b * n * Hkv * D, 1, n, Hkv, D);
}

}  // namespace

TEST_CASE("paged_kv_cache: a batched append to a sequence and its fork sharing a partly filled page needs one copy",
          "[paged]") {
  posenc::rope<float> const rope(posenc::rope_layout::half_split, D);
  for (index_t page : {2, 4, 16}) {
    INFO("page " << page);
    tokens<float> t(2 * page, 21);
    index_t const L = page + page / 2;  // two pages, the last one partly filled
    posenc::paged_kv_cache<float> batched(3, page, Hkv, D);
    index_t const a = batched.add_sequence(5);
    batched.append(a, tokens<float>::part(t.k, 0, L, Hkv), tokens<float>::part(t.v, 0, L, Hkv), rope);
    index_t const b = batched.fork(a);
    REQUIRE(batched.free_page_count() == 1);
    posenc::paged_kv_cache<float> one_by_one = batched;
    std::vector<index_t> const ids = {a, b};
    std::vector<float> const k = random_vector<float>(static_cast<std::size_t>(2 * Hkv * D), 22);
    std::vector<float> const v = random_vector<float>(static_cast<std::size_t>(2 * Hkv * D), 23);
    batched.append(ids, posenc::make_bshd<const float>(k.data(), 2, 1, Hkv, D),
                   posenc::make_bshd<const float>(v.data(), 2, 1, Hkv, D), rope);
    one_by_one.append(a, entry(k, 0, 1), entry(v, 0, 1), rope);
    one_by_one.append(b, entry(k, 1, 1), entry(v, 1, 1), rope);
    CHECK(batched.free_page_count() == 0);
    CHECK(cache_state(batched, ids) == cache_state(one_by_one, ids));
    CHECK(batched.page_table(a)[0] == batched.page_table(b)[0]);  // the full page stays shared
  }
}

TEST_CASE("paged_kv_cache: a batched append fits exactly when the appends one at a time do, with the same result",
          "[paged]") {
  posenc::rope<float> const rope(posenc::rope_layout::half_split, D);
  std::mt19937_64 gen(20261206);
  // lo .. hi from the generator alone (the standard distributions differ between libraries)
  auto pick = [&](index_t lo, index_t hi) {
    return lo + static_cast<index_t>(gen() % static_cast<std::uint64_t>(hi - lo + 1));
  };
  index_t fitted = 0, refused = 0;
  for (int trial = 0; trial < 400; ++trial) {
    INFO("trial " << trial);
    index_t const P = pick(1, 4);
    posenc::paged_kv_cache<float> cache(pick(2, 9), P, Hkv, D);
    std::vector<index_t> live = {cache.add_sequence(pick(0, 3))};
    // A random fork tree: appends (when they fit), forks and truncations.
    for (index_t op = pick(2, 10); op > 0; --op) {
      index_t const id = live[static_cast<std::size_t>(pick(0, static_cast<index_t>(live.size()) - 1))];
      index_t const kind = pick(0, 5);
      if (kind <= 2) {
        index_t const n = pick(1, 2 * P);
        std::vector<float> const x = random_vector<float>(static_cast<std::size_t>(n * Hkv * D), gen());
        if (cache.free_page_count() * P >= n + P) cache.append(id, entry(x, 0, n), entry(x, 0, n), rope);
      } else if (kind <= 4) {
        live.push_back(cache.fork(id));
      } else {
        cache.truncate(id, pick(0, cache.length(id)));
      }
    }
    // A batch of distinct ids in random order, the same token count each.
    std::vector<index_t> ids = live;
    for (index_t i = static_cast<index_t>(ids.size()) - 1; i > 0; --i)
      std::swap(ids[static_cast<std::size_t>(i)], ids[static_cast<std::size_t>(pick(0, i))]);
    ids.resize(static_cast<std::size_t>(pick(1, static_cast<index_t>(ids.size()))));
    auto const m = static_cast<index_t>(ids.size());
    index_t const n = pick(1, 2 * P);
    std::vector<float> const k = random_vector<float>(static_cast<std::size_t>(m * n * Hkv * D), gen());
    std::vector<float> const v = random_vector<float>(static_cast<std::size_t>(m * n * Hkv * D), gen());
    posenc::paged_kv_cache<float> one_by_one = cache;
    auto const before = cache_state(cache, live);
    bool batched_ok = true, each_ok = true;
    try {
      cache.append(ids, posenc::make_bshd<const float>(k.data(), m, n, Hkv, D),
                   posenc::make_bshd<const float>(v.data(), m, n, Hkv, D), rope);
    } catch (posenc::error const&) {
      batched_ok = false;
    }
    for (index_t b = 0; b < m && each_ok; ++b) {
      try {
        one_by_one.append(ids[static_cast<std::size_t>(b)], entry(k, b, n), entry(v, b, n), rope);
      } catch (posenc::error const&) {
        each_ok = false;
      }
    }
    REQUIRE(batched_ok == each_ok);
    if (batched_ok) {
      ++fitted;
      CHECK(cache_state(cache, live) == cache_state(one_by_one, live));
    } else {
      ++refused;
      CHECK(cache_state(cache, live) == before);
    }
  }
  // both outcomes were exercised
  CHECK(fitted > 50);
  CHECK(refused > 50);
}

TEST_CASE("paged_kv_cache::truncate then append equals a cache that never held the dropped tokens", "[paged]") {
  posenc::rope<float> const rope(posenc::rope_layout::half_split, D);
  posenc::attention_options<float> opt;
  opt.causal = true;
  for (index_t page : {1, 4, 16}) {
    for (index_t keep : {index_t{0}, page, 2 * page + 1, 3 * page - 1}) {
      INFO("page " << page << ", keep " << keep);
      tokens<float> t(4 * page + 8, 31), draft(2 * page + 3, 32), next(5, 33);
      index_t const L = 3 * page;
      posenc::paged_kv_cache<float> cache(12, page, Hkv, D), fresh(12, page, Hkv, D);
      index_t const a = cache.add_sequence(7), f = fresh.add_sequence(7);
      index_t const other = cache.add_sequence();  // grows beside a, so that pages interleave
      cache.append(a, tokens<float>::part(t.k, 0, L, Hkv), tokens<float>::part(t.v, 0, L, Hkv), rope);
      cache.append(other, tokens<float>::part(t.k, 0, 2, Hkv), tokens<float>::part(t.v, 0, 2, Hkv), rope);
      index_t const free_kept = cache.free_page_count() + (page_count(L, page) - page_count(keep, page));
      index_t const nd = 2 * page + 3;
      cache.append(a, tokens<float>::part(draft.k, 0, nd, Hkv), tokens<float>::part(draft.v, 0, nd, Hkv), rope);
      cache.truncate(a, keep);
      CHECK(cache.length(a) == keep);
      CHECK(cache.next_position(a) == 7 + keep);
      CHECK(cache.free_page_count() == free_kept);
      CHECK(static_cast<index_t>(cache.page_table(a).size()) == page_count(keep, page));
      fresh.append(f, tokens<float>::part(t.k, 0, keep, Hkv), tokens<float>::part(t.v, 0, keep, Hkv), rope);
      cache.append(a, tokens<float>::part(next.k, 0, 5, Hkv), tokens<float>::part(next.v, 0, 5, Hkv), rope);
      fresh.append(f, tokens<float>::part(next.k, 0, 5, Hkv), tokens<float>::part(next.v, 0, 5, Hkv), rope);
      // the same length, positions, keys and values, token by token (page ids may differ)
      CHECK(sequence_tokens(cache, a) == sequence_tokens(fresh, f));
      // and the same attention output for the last 5 queries
      std::vector<float> out_c(static_cast<std::size_t>(5 * Hq * D)), out_f(out_c.size());
      std::vector<index_t> const ia = {a}, iff = {f};
      auto const q = posenc::make_bshd<const float>(next.q.data(), 1, 5, Hq, D);
      posenc::paged_attention_workspace<float> ws;
      posenc::attention(q, cache, ia, posenc::make_bshd(out_c.data(), 1, 5, Hq, D), rope, opt, ws);
      posenc::attention(q, fresh, iff, posenc::make_bshd(out_f.data(), 1, 5, Hq, D), rope, opt, ws);
      // Bit for bit on the row kernel; the lane kernel (10 rows per kv head reach a SIMD width of
      // 8 or less: AVX2, SSE2, NEON) lays its tiles from the page runs, which differ between the
      // two caches (support/kernel_choice.hpp).
      if (posenc_test::paged_row_kernel<float, float, float, posenc::rope<float>>(5 * (Hq / Hkv))) {
        CHECK(out_c == out_f);
      } else {
        std::vector<float> ref(out_c.size());
        posenc::attention<posenc::path::reference>(q, fresh, iff, posenc::make_bshd(ref.data(), 1, 5, Hq, D), rope,
                                                   opt, ws);
        auto const r = posenc_test::within_tolerance(out_c, ref, out_f);
        INFO("truncated cache against the fresh one: " << r.describe());
        CHECK(r.ok);
      }
    }
  }
}

TEST_CASE("paged_kv_cache::truncate leaves forks unchanged and returns the pages nobody holds", "[paged]") {
  posenc::rope<float> const rope(posenc::rope_layout::half_split, D);
  for (index_t page : {1, 4, 16}) {
    INFO("page " << page);
    tokens<float> t(4 * page, 41), u(4 * page, 42);
    posenc::paged_kv_cache<float> cache(16, page, Hkv, D);
    index_t const a = cache.add_sequence();
    index_t const L = 2 * page + page / 2 + 1;
    cache.append(a, tokens<float>::part(t.k, 0, L, Hkv), tokens<float>::part(t.v, 0, L, Hkv), rope);
    index_t const b = cache.fork(a);
    auto const a0 = sequence_tokens(cache, a);
    index_t const free0 = cache.free_page_count();
    // Truncating the fork inside a shared page: a keeps every token, no page returns.
    index_t const cut = page + page / 2;
    cache.truncate(b, cut);
    CHECK(cache.free_page_count() == free0);
    CHECK(cache.length(b) == cut);
    // b's tokens then diverge: its shared last page (if partly filled) is copied first.
    cache.append(b, tokens<float>::part(u.k, 0, 2 * page, Hkv), tokens<float>::part(u.v, 0, 2 * page, Hkv), rope);
    CHECK(sequence_tokens(cache, a) == a0);
    // Truncating a to nothing returns the pages only a held; b keeps its tokens.
    auto const b1 = sequence_tokens(cache, b);
    index_t const free1 = cache.free_page_count();
    index_t only_a = 0;
    for (index_t p : cache.page_table(a)) only_a += cache.page_references(p) == 1;
    cache.truncate(a, 0);
    CHECK(cache.free_page_count() == free1 + only_a);
    CHECK(cache.page_table(a).size() == 0);
    CHECK(sequence_tokens(cache, b) == b1);
    // a grows again from position 0, into fresh pages
    cache.append(a, tokens<float>::part(u.k, 0, 3, Hkv), tokens<float>::part(u.v, 0, 3, Hkv), rope);
    CHECK(cache.length(a) == 3);
    cache.free(a);
    cache.free(b);
    CHECK(cache.free_page_count() == cache.pages());
  }
}

TEST_CASE("paged attention: an empty sequence whose causal queries sit below 0 gives zeros on every path", "[paged]") {
  // Keys stored rotated by RoPE (unreserved: the fused path rotates q in a copy, with the
  // length the contiguous call would use); entry b is empty, its queries at -2 and -1.
  index_t const hd = 4;
  posenc::rope<float> const rope(posenc::rope_layout::half_split, hd);
  posenc::paged_kv_cache<float> cache(4, 2, 1, hd);
  index_t const a = cache.add_sequence(0), b = cache.add_sequence(0);
  std::vector<float> k = random_vector<float>(static_cast<std::size_t>(3 * hd), 41);
  cache.append(a, posenc::make_bshd<const float>(k.data(), 1, 3, 1, hd), posenc::make_bshd<const float>(k.data(), 1, 3, 1, hd),
               rope);
  std::vector<float> q = random_vector<float>(static_cast<std::size_t>(2 * 2 * hd), 42);
  std::vector<index_t> const ids = {b, a};
  posenc::attention_options<float> opt;
  opt.causal = true;
  auto run = [&](auto path, std::vector<float>& out, std::vector<float>& lse) {
    out.assign(q.size(), 7.0f);
    lse.assign(2 * 2, 7.0f);
    opt.lse = lse;
    posenc::attention<decltype(path)>(posenc::make_bshd<const float>(q.data(), 2, 2, 1, hd), cache, ids,
                                      posenc::make_bshd(out.data(), 2, 2, 1, hd), rope, opt);
  };
  std::vector<float> ro, rl, fo, fl;
  run(posenc::path::reference{}, ro, rl);
  run(posenc::path::fused{}, fo, fl);
  for (index_t i = 0; i < 2 * hd; ++i) {  // entry 0 (the empty sequence): zeros, lse -inf
    CHECK(ro[static_cast<std::size_t>(i)] == 0.0f);
    CHECK(fo[static_cast<std::size_t>(i)] == 0.0f);
  }
  for (index_t i = 0; i < 2; ++i) {
    CHECK(rl[static_cast<std::size_t>(i)] == -std::numeric_limits<float>::infinity());
    CHECK(fl[static_cast<std::size_t>(i)] == -std::numeric_limits<float>::infinity());
  }
  for (std::size_t i = 2 * hd; i < ro.size(); ++i) CHECK(fo[i] == Approx(ro[i]).margin(1e-5));  // entry 1 sees keys
  for (std::size_t i = 2; i < rl.size(); ++i) CHECK(fl[i] == Approx(rl[i]).margin(1e-5));
}
