// SPDX-License-Identifier: MIT
// paged_kv_cache and attention over it: bad sizes, ids, exhausted pools and contradicting options throw, nothing changed.
#include <posenc/attention/paged_attention.hpp>
#include <posenc/attention/paged_kv_cache.hpp>
#include <posenc/encoding/none.hpp>
#include <posenc/encoding/rope.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/error_of.hpp"
#include "support/random.hpp"

namespace errors_paged_kv_cache_tests {

using posenc::index_t;
using posenc_test::contains;
using posenc_test::random_vector;

namespace {

index_t const H = 2, D = 4;

// Everything observable about a cache's sequences: lengths, page tables, the keys and values they hold.
std::vector<float> state_of(posenc::paged_kv_cache<float> const& c, std::vector<index_t> const& ids) {
  std::vector<float> s;
  s.push_back(static_cast<float>(c.free_page_count()));
  for (index_t id : ids) {
    s.push_back(static_cast<float>(c.length(id)));
    auto const table = c.page_table(id);
    for (index_t p = 0; p < table.size(); ++p) {
      s.push_back(static_cast<float>(table[p]));
      s.push_back(static_cast<float>(c.page_references(table[p])));
    }
    for (index_t j = 0; j < c.length(id); ++j) {
      auto const k = c.page_keys(table[j / c.page_tokens()], 1);
      auto const v = c.page_values(table[j / c.page_tokens()], 1);
      for (index_t h = 0; h < H; ++h) {
        s.insert(s.end(), k.ptr(0, j % c.page_tokens(), h), k.ptr(0, j % c.page_tokens(), h) + D);
        s.insert(s.end(), v.ptr(0, j % c.page_tokens(), h), v.ptr(0, j % c.page_tokens(), h) + D);
      }
    }
  }
  return s;
}

posenc::view<const float> tokens_view(std::vector<float> const& x, index_t batch, index_t n) {
  return posenc::make_bshd<const float>(x.data(), batch, n, H, D);
}

}  // namespace

TEST_CASE("paged_kv_cache: bad sizes throw", "[paged][errors]") {
  REQUIRE_THROWS_WITH(posenc::paged_kv_cache<float>(4, 0, H, D), contains("page_tokens is 0, expected 1 .. 65536"));
  REQUIRE_THROWS_WITH(posenc::paged_kv_cache<float>(4, -3, H, D), contains("page_tokens is -3"));
  REQUIRE_THROWS_WITH(posenc::paged_kv_cache<float>(4, 65537, H, D), contains("page_tokens is 65537"));
  REQUIRE_THROWS_WITH(posenc::paged_kv_cache<float>(-1, 16, H, D), contains("pages is -1, expected >= 0"));
  REQUIRE_THROWS_WITH(posenc::paged_kv_cache<float>(4, 16, -1, D), contains("kv_heads is -1"));
  REQUIRE_THROWS_WITH(posenc::paged_kv_cache<float>(4, 16, H, D, -2), contains("value_dim is -2"));
  index_t const big = index_t{1} << 50;
  REQUIRE_THROWS_WITH(posenc::paged_kv_cache<float>(big, 65536, H, D), contains("pages x page_tokens"));
  REQUIRE_THROWS_WITH(posenc::paged_kv_cache<float>(4, 16, H, D).add_sequence(-1),
                      contains("first_position is -1"));
}

TEST_CASE("paged_kv_cache: out of pages throws with nothing changed", "[paged][errors]") {
  for (index_t page : {1, 16, 100}) {
    INFO("page " << page);
    posenc::paged_kv_cache<float> cache(5, page, H, D);
    std::vector<float> k = random_vector<float>(static_cast<std::size_t>(6 * page * H * D), 1);
    index_t const a = cache.add_sequence(), b = cache.add_sequence();
    cache.append(a, tokens_view(k, 1, 2 * page), tokens_view(k, 1, 2 * page), posenc::none{});
    cache.append(b, tokens_view(k, 1, page + (page > 1 ? 1 : 0)), tokens_view(k, 1, page + (page > 1 ? 1 : 0)),
                 posenc::none{});
    std::vector<index_t> const ids = {a, b};
    index_t const free_pages = cache.free_page_count();
    auto const before = state_of(cache, ids);
    // One sequence asking for more pages than are free.
    index_t const too_many = (free_pages + 1) * page;
    std::vector<float> big = random_vector<float>(static_cast<std::size_t>(too_many * H * D), 2);
    REQUIRE_THROWS_WITH(cache.append(a, tokens_view(big, 1, too_many), tokens_view(big, 1, too_many), posenc::none{}),
                        contains("pages needed is " + std::to_string(free_pages + 1) + ", expected <= " +
                                 std::to_string(free_pages)));
    CHECK(state_of(cache, ids) == before);
    // Many sequences at once: together they do not fit although each would alone.
    index_t const n = free_pages * page;
    std::vector<float> two = random_vector<float>(static_cast<std::size_t>(2 * n * H * D), 3);
    REQUIRE_THROWS_WITH(cache.append(ids, tokens_view(two, 2, n), tokens_view(two, 2, n), posenc::none{}),
                        contains("pages needed is"));
    CHECK(state_of(cache, ids) == before);
  }
}

TEST_CASE("paged_kv_cache: copy-on-write of a shared page counts against the pool", "[paged][errors]") {
  posenc::paged_kv_cache<float> cache(2, 16, H, D);
  std::vector<float> k = random_vector<float>(static_cast<std::size_t>(32 * H * D), 4);
  index_t const a = cache.add_sequence();
  cache.append(a, tokens_view(k, 1, 17), tokens_view(k, 1, 17), posenc::none{});  // both pages, the last one partly
  index_t const b = cache.fork(a);
  std::vector<index_t> const ids = {a, b};
  auto const before = state_of(cache, ids);
  // One more token for b fits the last page, but that page is shared: it needs a copy, and no page is free.
  REQUIRE_THROWS_WITH(cache.append(b, tokens_view(k, 1, 1), tokens_view(k, 1, 1), posenc::none{}),
                      contains("pages needed is 1, expected <= 0"));
  CHECK(state_of(cache, ids) == before);
  cache.free(a);  // b alone holds the pages now: no copy, the append fits
  cache.append(b, tokens_view(k, 1, 1), tokens_view(k, 1, 1), posenc::none{});
  CHECK(cache.length(b) == 18);
}

TEST_CASE("paged_kv_cache: bad sequence ids and positions throw with nothing changed", "[paged][errors]") {
  posenc::paged_kv_cache<float> cache(8, 4, H, D);
  std::vector<float> k = random_vector<float>(static_cast<std::size_t>(2 * 3 * H * D), 5);
  index_t const a = cache.add_sequence(), b = cache.add_sequence();
  cache.append(a, tokens_view(k, 1, 3), tokens_view(k, 1, 3), posenc::none{});
  index_t const gone = cache.add_sequence();
  cache.free(gone);
  std::vector<index_t> const ids = {a, b};
  auto const before = state_of(cache, ids);
  REQUIRE_THROWS_WITH(cache.append(gone, tokens_view(k, 1, 1), tokens_view(k, 1, 1), posenc::none{}),
                      contains("ids[b] is " + std::to_string(gone) + ", expected the id of an open sequence"));
  REQUIRE_THROWS_WITH(cache.append(17, tokens_view(k, 1, 1), tokens_view(k, 1, 1), posenc::none{}),
                      contains("ids[b] is 17"));
  REQUIRE_THROWS_WITH(cache.fork(-1), contains("posenc::paged_kv_cache::fork: id is -1"));
  REQUIRE_THROWS_WITH(cache.free(gone), contains("posenc::paged_kv_cache::free: id is"));
  REQUIRE_THROWS_WITH(cache.length(gone), contains("id is"));
  REQUIRE_THROWS_WITH(cache.page_runs(gone), contains("posenc::paged_kv_cache::page_runs: id is " +
                                                      std::to_string(gone) + ", expected the id of an open sequence"));
  std::vector<index_t> const twice = {a, a};
  REQUIRE_THROWS_WITH(cache.append(twice, tokens_view(k, 2, 1), tokens_view(k, 2, 1), posenc::none{}),
                      contains("ids[1] is 0, expected distinct ids"));
  // A batch that does not match the ids, and an encoder that contradicts the stored keys.
  REQUIRE_THROWS_WITH(cache.append(ids, tokens_view(k, 1, 1), tokens_view(k, 1, 1), posenc::none{}),
                      contains("k.batch is 1, expected 2 (ids.size())"));
  posenc::rope<float> const rope(posenc::rope_layout::half_split, D);
  REQUIRE_THROWS_WITH(cache.append(b, tokens_view(k, 1, 1), tokens_view(k, 1, 1), rope),
                      contains("rotates_queries_keys is true, expected false"));
  CHECK(state_of(cache, ids) == before);
  // Positions past position_limit.
  index_t const late = cache.add_sequence(posenc::position_limit);
  REQUIRE_THROWS_WITH(cache.append(late, tokens_view(k, 1, 2), tokens_view(k, 1, 2), posenc::none{}),
                      contains("expected <= " + std::to_string(posenc::position_limit)));
  CHECK(cache.length(late) == 0);
  CHECK(state_of(cache, ids) == before);
}

TEST_CASE("attention over a paged_kv_cache: bad ids and contradicting options throw before out is written",
          "[paged][errors]") {
  posenc::paged_kv_cache<float> cache(8, 4, H, D);
  std::vector<float> k = random_vector<float>(static_cast<std::size_t>(5 * H * D), 6);
  index_t const a = cache.add_sequence(), b = cache.add_sequence(3);
  cache.append(a, tokens_view(k, 1, 5), tokens_view(k, 1, 5), posenc::none{});
  cache.append(b, tokens_view(k, 1, 2), tokens_view(k, 1, 2), posenc::none{});
  index_t const Hq = 4;
  std::vector<float> q = random_vector<float>(static_cast<std::size_t>(2 * Hq * D), 7);
  std::vector<float> out(q.size(), 42.0f);
  auto qv = posenc::make_bshd<const float>(q.data(), 2, 1, Hq, D);
  auto ov = posenc::make_bshd(out.data(), 2, 1, Hq, D);
  std::vector<index_t> ids = {a, b};
  auto run = [&](posenc::attention_options<float> const& opt, auto const& enc) {
    posenc::attention(qv, cache, ids, ov, enc, opt);
  };
  posenc::attention_options<float> opt;
  std::vector<index_t> const bad = {a, 9};
  ids = bad;
  REQUIRE_THROWS_WITH(run(opt, posenc::none{}), contains("seq_ids[1] is 9, expected the id of an open sequence"));
  ids = {a};
  REQUIRE_THROWS_WITH(run(opt, posenc::none{}), contains("q.batch is 2, expected 1 (seq_ids.size())"));
  ids = {a, b};
  std::vector<index_t> lens = {5, 2};
  opt.key_lengths = posenc::span<const index_t>(lens.data(), 2);
  REQUIRE_THROWS_WITH(run(opt, posenc::none{}), contains("key_lengths has 2 entries, expected none"));
  opt = {};
  opt.k_positions = posenc::position_span(0);
  REQUIRE_THROWS_WITH(run(opt, posenc::none{}), contains("k_positions is set, expected unset"));
  opt = {};
  std::vector<float> scores(100);
  opt.scores = scores;
  REQUIRE_THROWS_WITH(run(opt, posenc::none{}), contains("scores is set, expected null"));
  opt = {};
  std::vector<float> lse(2 * Hq + 1, 42.0f);  // (entries, Hq, Sq) is 8 values
  opt.lse = lse;
  REQUIRE_THROWS_WITH(run(opt, posenc::none{}), contains("posenc::attention: lse has 9 values, expected 8 "
                                                         "(seq_ids.size() x q.heads x q.seq)"));
  for (float x : out) CHECK(x == 42.0f);
  for (float x : lse) CHECK(x == 42.0f);
  lse.pop_back();
  opt.lse = lse;
  run(opt, posenc::none{});
  for (float x : lse) CHECK(std::isfinite(x));
  std::fill(out.begin(), out.end(), 42.0f);
  opt = {};
  std::vector<float> mask(3 * Hq * 5);
  opt.mask = posenc::make_mask<float>(mask.data(), 3, Hq, 1, 5);
  REQUIRE_THROWS_WITH(run(opt, posenc::none{}), contains("mask.batch is 3, expected 1 or 2"));
  opt = {};
  opt.keys_rotated = true;
  REQUIRE_THROWS_WITH(run(opt, posenc::none{}), contains("keys_rotated is true, expected false"));
  opt = {};
  posenc::rope<float> const rope(posenc::rope_layout::half_split, D);
  REQUIRE_THROWS_WITH(run(opt, rope), contains("rotates_queries_keys is true, expected false"));
  // An entry whose own check fails (a query position the encoder cannot take) stops the call before any entry is written.
  std::vector<index_t> qpos = {4, -1};
  opt.q_positions = posenc::position_span::ids(qpos.data(), 2, 1);
  posenc::paged_kv_cache<float> rc(8, 4, H, D);
  index_t const r0 = rc.add_sequence(), r1 = rc.add_sequence();
  rc.append(r0, tokens_view(k, 1, 5), tokens_view(k, 1, 5), rope);
  rc.append(r1, tokens_view(k, 1, 2), tokens_view(k, 1, 2), rope);
  std::vector<index_t> const rids = {r0, r1};
  posenc::rope<float> const wide(posenc::rope_layout::half_split, 2 * D);
  REQUIRE_THROWS_WITH(posenc::attention(qv, rc, rids, ov, wide, {}), contains("encoder head_dim() is 8, expected 4"));
  REQUIRE_THROWS_WITH(posenc::attention(qv, rc, rids, ov, rope, opt), contains("query position of batch 0 row 0 is -1"));
  for (float x : out) CHECK(x == 42.0f);
}

TEST_CASE("paged_kv_cache: a batch sharing a partly filled last page counts only the copies it makes",
          "[paged][errors]") {
  std::vector<float> k = random_vector<float>(static_cast<std::size_t>(8 * H * D), 8);
  {
    // a and its fork b share a partly filled last page; one page is free. a copies
    // the page, then b holds it alone and writes in place: one page, as one at a time.
    posenc::paged_kv_cache<float> cache(3, 4, H, D);
    index_t const a = cache.add_sequence();
    cache.append(a, tokens_view(k, 1, 6), tokens_view(k, 1, 6), posenc::none{});
    index_t const b = cache.fork(a);
    REQUIRE(cache.free_page_count() == 1);
    std::vector<index_t> const ids = {a, b};
    cache.append(ids, tokens_view(k, 2, 1), tokens_view(k, 2, 1), posenc::none{});
    CHECK(cache.free_page_count() == 0);
    CHECK(cache.length(a) == 7);
    CHECK(cache.length(b) == 7);
    // No page left: the next batch sharing nothing partly filled still needs its growth pages.
    auto const before = state_of(cache, ids);
    REQUIRE_THROWS_WITH(cache.append(ids, tokens_view(k, 2, 2), tokens_view(k, 2, 2), posenc::none{}),
                        contains("pages needed is 2, expected <= 0"));
    CHECK(state_of(cache, ids) == before);
  }
  {
    // a third sharer c outside the batch keeps the page shared: a and b both copy.
    posenc::paged_kv_cache<float> cache(4, 4, H, D);
    index_t const a = cache.add_sequence();
    cache.append(a, tokens_view(k, 1, 6), tokens_view(k, 1, 6), posenc::none{});
    index_t const b = cache.fork(a), c = cache.fork(a), d = cache.add_sequence();
    cache.append(d, tokens_view(k, 1, 1), tokens_view(k, 1, 1), posenc::none{});
    REQUIRE(cache.free_page_count() == 1);
    std::vector<index_t> const ids = {a, b}, all = {a, b, c, d};
    auto const before = state_of(cache, all);
    REQUIRE_THROWS_WITH(cache.append(ids, tokens_view(k, 2, 1), tokens_view(k, 2, 1), posenc::none{}),
                        contains("pages needed is 2, expected <= 1"));
    CHECK(state_of(cache, all) == before);
    // all three in the batch: two copies, the last writes in place.
    cache.free(d);
    std::vector<index_t> const abc = {a, b, c};
    cache.append(abc, tokens_view(k, 3, 1), tokens_view(k, 3, 1), posenc::none{});
    CHECK(cache.free_page_count() == 0);
  }
}

TEST_CASE("paged_kv_cache::truncate: bad ids and lengths throw with nothing changed", "[paged][errors]") {
  posenc::paged_kv_cache<float> cache(8, 4, H, D);
  std::vector<float> k = random_vector<float>(static_cast<std::size_t>(6 * H * D), 9);
  index_t const a = cache.add_sequence();
  cache.append(a, tokens_view(k, 1, 6), tokens_view(k, 1, 6), posenc::none{});
  index_t const b = cache.fork(a), gone = cache.add_sequence();
  cache.free(gone);
  std::vector<index_t> const ids = {a, b};
  auto const before = state_of(cache, ids);
  REQUIRE_THROWS_WITH(cache.truncate(a, 7),
                      contains("posenc::paged_kv_cache::truncate: tokens is 7, expected 0 <= tokens <= length(id) (6)"));
  REQUIRE_THROWS_WITH(cache.truncate(b, -1), contains("tokens is -1, expected 0 <= tokens <= length(id) (6)"));
  REQUIRE_THROWS_WITH(cache.truncate(gone, 0), contains("posenc::paged_kv_cache::truncate: id is " +
                                                        std::to_string(gone) + ", expected the id of an open sequence"));
  REQUIRE_THROWS_WITH(cache.truncate(-2, 0), contains("id is -2"));
  CHECK(state_of(cache, ids) == before);
  cache.truncate(a, 6);  // the whole length: nothing changes
  CHECK(state_of(cache, ids) == before);
}

TEST_CASE("paged_kv_cache: page_keys and page_values check the page run", "[paged][errors]") {
  posenc::paged_kv_cache<float> cache(5, 4, H, D);
  for (bool values : {false, true}) {
    INFO((values ? "page_values" : "page_keys"));
    std::string const w = values ? "posenc::paged_kv_cache::page_values: " : "posenc::paged_kv_cache::page_keys: ";
    auto view_of = [&](index_t page, index_t count) {
      return values ? cache.page_values(page, count) : cache.page_keys(page, count);
    };
    REQUIRE_THROWS_WITH(view_of(-1, 1), contains(w + "page is -1, expected 0 .. 5 (pages())"));
    REQUIRE_THROWS_WITH(view_of(6, 0), contains(w + "page is 6, expected 0 .. 5 (pages())"));
    REQUIRE_THROWS_WITH(view_of(5, 1), contains(w + "count is 1, expected 0 .. 0 (pages() - page)"));
    REQUIRE_THROWS_WITH(view_of(2, 4), contains(w + "count is 4, expected 0 .. 3 (pages() - page)"));
    REQUIRE_THROWS_WITH(view_of(0, -1), contains(w + "count is -1, expected 0 .. 5 (pages() - page)"));
    index_t const big = index_t{1} << 62;
    REQUIRE_THROWS_WITH(view_of(1, big), contains(w + "count is " + std::to_string(big)));
    // the whole pool, a run at its end and an empty run past the last page are views
    CHECK(view_of(0, 5).seq == 5 * 4);
    CHECK(view_of(3, 2).seq == 2 * 4);
    CHECK(view_of(5, 0).seq == 0);
  }
  posenc::paged_kv_cache<float> empty(0, 4, H, D);
  CHECK(empty.page_keys(0, 0).seq == 0);
  REQUIRE_THROWS_WITH(empty.page_keys(0, 1), contains("count is 1, expected 0 .. 0"));
}
}  // namespace errors_paged_kv_cache_tests
