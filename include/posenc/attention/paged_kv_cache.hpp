// SPDX-License-Identifier: MIT
// paged_kv_cache<T>: per-sequence keys and values in fixed-size pages of one pool, shared copy-on-write by forks.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <type_traits>
#include <vector>

#include "posenc/core/checked.hpp"
#include "posenc/core/error.hpp"
#include "posenc/core/half.hpp"
#include "posenc/core/positions.hpp"
#include "posenc/core/span.hpp"
#include "posenc/core/view.hpp"
#include "posenc/encoding/identity.hpp"
#include "posenc/encoding/traits.hpp"

namespace posenc {

/// Keys and values of many sequences of different lengths, each held in pages
/// of `page_tokens()` tokens taken from one pool of `pages()` pages allocated
/// once (nothing is reallocated; pages move only in `compact()`). Each sequence has a page
/// table, a length and the position of its first token (token s of sequence
/// `id` sits at `first_position(id) + s`).
///
/// - `add_sequence()` opens an empty sequence and returns its id; `free()`
///   closes it and returns its pages to the pool; ids are reused.
/// - `fork(id)` opens a sequence with the same tokens, sharing every page
///   (reference counts): a prompt prefix shared by several continuations. An
///   append into a shared, partly filled last page first copies that page, so
///   that no sequence ever sees another's appended keys.
/// - `append()` adds the next tokens of one or many sequences; when the
///   encoder rotates queries and keys, the keys are stored rotated (at their
///   positions, with length = the sequence's new next position), as in kv_cache.
/// - `posenc::attention(q, cache, seq_ids, out, enc, opt)` attends over the
///   pages in place (attention/paged_attention.hpp).
/// - `compact()` moves pages so that every sequence's pages form one run
///   again after frees have scattered the pool (`page_runs(id)` tells how
///   many runs a sequence's pages form).
///
/// Page storage: head-major across the pool, (kv_head, page, token, dim), so
/// that one kv head's rows of a run of pages with consecutive ids lie one
/// after another: the run is one head-major view (as kv_cache stores K and
/// V), and attention reads each kv head's keys and values as two plain runs
/// through memory.
/// @tparam T float or double, or a 16-bit storage type (Eigen::half,
///         Eigen::bfloat16): append() then takes float k and v (or k and v of
///         T), rotates the keys in float when the encoder rotates and rounds
///         each element once (to nearest even) into the pages, as kv_cache does.
template <class T>
class paged_kv_cache {
 public:
  /// Element type of the k and v that append() takes: T, or float for a 16-bit cache.
  using input_type = std::conditional_t<is_half_storage_v<T>, float, T>;

  /// @param pages pages in the pool (>= 0)
  /// @param page_tokens tokens per page (1 .. 65536)
  /// @param kv_heads key/value heads; @param head_dim key dim; @param value_dim value dim (0 = head_dim)
  /// @throws posenc::error on a bad argument or a pool size that overflows index_t.
  paged_kv_cache(index_t pages, index_t page_tokens, index_t kv_heads, index_t head_dim, index_t value_dim = 0)
      : pages_(pages), page_tokens_(page_tokens), heads_(kv_heads), dim_(head_dim),
        vdim_(value_dim > 0 ? value_dim : head_dim) {
    char const* w = "posenc::paged_kv_cache";
    detail::require(pages >= 0, w, "pages is ", pages, ", expected >= 0");
    detail::require(page_tokens >= 1 && page_tokens <= max_page_tokens, w, "page_tokens is ", page_tokens,
                    ", expected 1 .. ", max_page_tokens);
    detail::require(kv_heads >= 0, w, "kv_heads is ", kv_heads, ", expected >= 0");
    detail::require(head_dim >= 0, w, "head_dim is ", head_dim, ", expected >= 0");
    detail::require(value_dim >= 0, w, "value_dim is ", value_dim, ", expected >= 0");
    index_t const d = std::max(dim_, vdim_);
    index_t n = detail::checked_mul(w, pages, page_tokens, "pages x page_tokens");
    n = detail::checked_mul(w, n, kv_heads, "pages x page_tokens x kv_heads");
    detail::checked_mul(w, n, d, "pages x page_tokens x kv_heads x ", dim_ >= vdim_ ? "head_dim" : "value_dim");
    keys_.resize(static_cast<std::size_t>(n * dim_));
    values_.resize(static_cast<std::size_t>(n * vdim_));
    refs_.assign(static_cast<std::size_t>(pages), 0);
    free_count_ = pages;
  }

  /// Largest accepted page size.
  static constexpr index_t max_page_tokens = 65536;

  /// Opens an empty sequence whose first token will sit at `first_position`; returns its id.
  index_t add_sequence(index_t first_position = 0) {
    detail::require(first_position >= 0 && first_position <= position_limit, "posenc::paged_kv_cache::add_sequence",
                    "first_position is ", first_position, ", expected 0 .. ", position_limit, " (position_limit)");
    index_t const id = take_slot();
    seqs_[static_cast<std::size_t>(id)].first = first_position;
    return id;
  }

  /// Opens a sequence holding the same tokens as `id` (sharing its pages) and returns its id.
  index_t fork(index_t id) {
    check_id("posenc::paged_kv_cache::fork", "id", id);
    index_t const nid = take_slot();
    sequence& s = seqs_[static_cast<std::size_t>(nid)];
    sequence const& src = seqs_[static_cast<std::size_t>(id)];
    s.first = src.first;
    s.len = src.len;
    s.pages = src.pages;
    for (index_t p : s.pages) ++refs_[static_cast<std::size_t>(p)];
    tokens_ += s.len;
    return nid;
  }

  /// Closes sequence `id`; its pages no other sequence shares return to the pool.
  void free(index_t id) {
    check_id("posenc::paged_kv_cache::free", "id", id);
    sequence& s = seqs_[static_cast<std::size_t>(id)];
    for (index_t p : s.pages)
      if (--refs_[static_cast<std::size_t>(p)] == 0) ++free_count_;
    s.pages.clear();
    tokens_ -= s.len;
    s.len = 0;
    s.live = false;
    free_slots_.push_back(id);
  }

  /// Keeps the first `tokens` tokens of sequence `id` (0 <= tokens <= length(id)),
  /// as kv_cache::truncate: the next append continues at first_position(id) + tokens
  /// (dropping the tokens of a rejected speculative draft). The pages past the
  /// kept tokens leave the sequence's page table; those no other sequence holds
  /// return to the pool. Other sequences are unchanged: a page shared with a fork
  /// stays theirs, and a kept, partly filled last page that is shared is copied
  /// before the next append writes into it (as after fork()).
  /// @throws posenc::error naming the bad argument, the cache unchanged.
  void truncate(index_t id, index_t tokens) {
    char const* w = "posenc::paged_kv_cache::truncate";
    check_id(w, "id", id);
    sequence& s = seqs_[static_cast<std::size_t>(id)];
    detail::require(tokens >= 0 && tokens <= s.len, w, "tokens is ", tokens, ", expected 0 <= tokens <= length(id) (",
                    s.len, ")");
    auto const keep = static_cast<std::size_t>(pages_for(tokens));
    for (std::size_t j = keep; j < s.pages.size(); ++j)
      if (--refs_[static_cast<std::size_t>(s.pages[j])] == 0) ++free_count_;
    s.pages.resize(keep);
    tokens_ -= s.len - tokens;
    s.len = tokens;
  }

  /// Appends the next S tokens of one sequence: k (1, S, kv_heads, head_dim), v (1, S, kv_heads, value_dim).
  template <class E>
  void append(index_t id, view<const input_type> k, view<const input_type> v, E const& enc) {
    append(span<const index_t>(&id, 1), k, v, enc);
  }

  /// A 16-bit cache only: appends k and v of its own type (widened exactly,
  /// then as the float append: stored as they are, keys rotated in float and
  /// rounded once).
  template <class E, class S = T, std::enable_if_t<is_half_storage_v<S>, int> = 0>
  void append(index_t id, view<const T> k, view<const T> v, E const& enc) {
    append(span<const index_t>(&id, 1), k, v, enc);
  }
  template <class E, class S = T, std::enable_if_t<is_half_storage_v<S>, int> = 0>
  void append(span<const index_t> ids, view<const T> k, view<const T> v, E const& enc) {
    char const* w = "posenc::paged_kv_cache::append";
    detail::check_view(w, "k", k);
    detail::check_view(w, "v", v);
    std::vector<float> kw(static_cast<std::size_t>(k.size())), vw(static_cast<std::size_t>(v.size()));
    view<float> const kf = make_bshd(kw.data(), k.batch, k.seq, k.heads, k.dim);
    view<float> const vf = make_bshd(vw.data(), v.batch, v.seq, v.heads, v.dim);
    for (index_t b = 0; b < k.batch; ++b)
      for (index_t s = 0; s < k.seq; ++s)
        for (index_t h = 0; h < k.heads; ++h) detail::widen_row(k.ptr(b, s, h), k.dim, kf.ptr(b, s, h));
    for (index_t b = 0; b < v.batch; ++b)
      for (index_t s = 0; s < v.seq; ++s)
        for (index_t h = 0; h < v.heads; ++h) detail::widen_row(v.ptr(b, s, h), v.dim, vf.ptr(b, s, h));
    append(ids, view<const float>(kf), view<const float>(vf), enc);
  }

  /// Appends the next S tokens of each sequence of `ids` (distinct):
  /// k (ids.size(), S, kv_heads, head_dim), v (ids.size(), S, kv_heads, value_dim);
  /// entry b of k and v goes to sequence ids[b].
  ///
  /// An encoder that rotates queries and keys rotates the stored keys; every
  /// append to a cache holding tokens rotates exactly when the cached keys are
  /// rotated (`keys_rotated()`).
  ///
  /// Strong guarantee: every check (ids, shapes, positions, free pages for
  /// the new tokens and for copies of shared pages, the encoder's own checks on
  /// rotated copies of the new keys) happens before a page is taken or
  /// written; after a failed append the cache is unchanged. The pages counted
  /// are those the append takes: sequences of `ids` that share a partly filled
  /// last page make one copy fewer than their number when no sequence outside
  /// the batch shares it (the last one then holds the page alone and writes in
  /// place), so the batched append fits exactly when the appends one id at a
  /// time, in the order of `ids`, would all fit, and gives the same pages.
  template <class E>
  void append(span<const index_t> ids, view<const input_type> k, view<const input_type> v, E const& enc) {
    char const* w = "posenc::paged_kv_cache::append";
    index_t const n_ids = ids.size();
    detail::require(n_ids == 0 || ids.data() != nullptr, w, "ids.data is null, expected ", n_ids, " entries");
    for (index_t b = 0; b < n_ids; ++b) {
      check_id(w, "ids[b]", ids[b]);
      for (index_t c = 0; c < b; ++c)
        detail::require(ids[c] != ids[b], w, "ids[", b, "] is ", ids[b], ", expected distinct ids (ids[", c,
                        "] is the same)");
    }
    detail::check_view(w, "k", k);
    detail::check_view(w, "v", v);
    detail::check_equal(w, "k.batch", k.batch, n_ids, "ids.size()");
    detail::check_equal(w, "v.batch", v.batch, n_ids, "ids.size()");
    detail::check_equal(w, "k.heads", k.heads, heads_, "cache kv_heads");
    detail::check_equal(w, "v.heads", v.heads, heads_, "cache kv_heads");
    detail::check_equal(w, "k.dim", k.dim, dim_, "cache head_dim");
    detail::check_equal(w, "v.dim", v.dim, vdim_, "cache value_dim");
    detail::check_equal(w, "v.seq", v.seq, k.seq, "k.seq");
    constexpr bool rotates = encoder_traits<E>::rotates_queries_keys;
    detail::require(tokens_ == 0 || rotates == rotated_, w, "the encoder's rotates_queries_keys is ",
                    rotates ? "true" : "false", ", expected ", rotated_ ? "true" : "false", " (the ", tokens_,
                    " cached keys are stored ", rotated_ ? "rotated" : "unrotated",
                    "; free every sequence to change the encoder)");
    encoder_identity rotation;  // of the encoder, when it rotates
    index_t const n = k.seq;
    if (n == 0 || n_ids == 0) return;
    for (index_t b = 0; b < n_ids; ++b) {
      sequence const& s = seqs_[static_cast<std::size_t>(ids[b])];
      detail::checked_add(w, s.len, n, "length(ids[b]) + k.seq");
      index_t const p0 = s.first + s.len;
      detail::require(n - 1 <= position_limit - p0, w, "last new position of ids[", b, "] = ", ids[b], " is ", p0,
                      " + ", n - 1, " (next_position + k.seq - 1), expected <= ", position_limit, " (position_limit)");
    }
    index_t const need = pages_needed(ids, n);
    index_t const avail = free_count_;
    detail::require(need <= avail, w, "pages needed is ", need, ", expected <= ", avail,
                    " (free pages of ", pages_, "; the cache is unchanged: free sequences or use a larger pool)");
    // The new keys, rotated in a scratch copy: the encoder checks the view and
    // the positions before the cache changes.
    view<const input_type> src = k;
    if constexpr (rotates) {
      fresh_.resize(static_cast<std::size_t>(n_ids * n * heads_ * dim_));  // fits: k passed check_view
      view<input_type> f = make_bshd(fresh_.data(), n_ids, n, heads_, dim_);
      for (index_t b = 0; b < n_ids; ++b)
        for (index_t s = 0; s < n; ++s)
          for (index_t h = 0; h < heads_; ++h) std::copy(k.ptr(b, s, h), k.ptr(b, s, h) + dim_, f.ptr(b, s, h));
      for (index_t b = 0; b < n_ids; ++b) {
        index_t const p0 = next_position(ids[b]);
        view<input_type> fb = f;
        if (fb.data) fb.data += b * f.batch_stride;
        fb.batch = 1;
        enc.rotate(fb, position_span(p0), p0 + n);
      }
      // After the encoder's own checks (a head_dim that does not fit is the plainer fault).
      rotation = rotation_identity_of(enc);
      if (tokens_ > 0 && rotation != rotation_)
        detail::fail(w, "the encoder rotates as ", rotation.text(), ", expected ", rotation_.text(), " (the ",
                     tokens_, " cached keys were rotated so; free every sequence to change the encoder)");
      src = f;
    } else {
      (void)enc;
    }
    // Nothing below throws: pages were counted, storage exists.
    for (index_t b = 0; b < n_ids; ++b) write_tokens(seqs_[static_cast<std::size_t>(ids[b])], src, v, b);
    if (tokens_ == 0) {
      rotated_ = rotates;
      rotation_ = std::move(rotation);
    }
    tokens_ += n * n_ids;
  }

  /// Moves pages so that the open sequences' pages lie one sequence after
  /// another from page 0, each sequence's pages consecutive in token order,
  /// and the free pages form one run at the end of the pool. Sequences keep
  /// the order of their first pages; a page shared by forks goes with the
  /// first sequence that holds it (a fork's own pages then form a second
  /// run). Tokens, lengths, positions and sharing are unchanged; the page
  /// ids in page tables change, so page ids read before are stale. Returns
  /// the number of pages whose contents moved (0 when the pool is already
  /// compact). Costs one copy of every moved page; attention over
  /// consecutive pages reads each kv head's keys and values as one run.
  ///
  /// Strong guarantee: the scratch (page maps and one page of keys and values)
  /// is allocated before anything moves; after a failed compact() the cache is unchanged.
  index_t compact() {
    auto const np = static_cast<std::size_t>(pages_);
    std::vector<index_t> order;  // open sequences by first page
    for (std::size_t i = 0; i < seqs_.size(); ++i)
      if (seqs_[i].live && !seqs_[i].pages.empty()) order.push_back(static_cast<index_t>(i));
    std::sort(order.begin(), order.end(), [&](index_t x, index_t y) {
      index_t const px = seqs_[static_cast<std::size_t>(x)].pages[0], py = seqs_[static_cast<std::size_t>(y)].pages[0];
      return px != py ? px < py : x < y;  // forks sharing a first page: by id
    });
    std::vector<index_t> to(np, -1), from(np, -1);  // to[old page] = new page; from[new] = old
    index_t next = 0;
    for (index_t id : order)
      for (index_t p : seqs_[static_cast<std::size_t>(id)].pages)
        if (to[static_cast<std::size_t>(p)] < 0) to[static_cast<std::size_t>(p)] = next++;
    for (std::size_t p = 0; p < np; ++p)
      if (to[p] < 0) to[p] = next++;  // free pages, in pool order
    for (std::size_t p = 0; p < np; ++p) from[static_cast<std::size_t>(to[p])] = static_cast<index_t>(p);
    index_t moved = 0;
    for (std::size_t p = 0; p < np; ++p) moved += to[p] != static_cast<index_t>(p) && refs_[p] != 0;
    if (moved == 0) return 0;
    std::vector<T> held(static_cast<std::size_t>(page_tokens_ * heads_ * (dim_ + vdim_)));
    std::vector<bool> done(np, false);  // pages of the permutation already walked
    std::vector<index_t> refs(np);
    // Nothing below throws. Each cycle of the permutation is walked from its
    // first page: that page's contents wait in `held`, every other page of the
    // cycle takes the contents of the page that moves into it (a free page's
    // contents are not kept).
    for (std::size_t start = 0; start < np; ++start) {
      if (done[start] || from[start] == static_cast<index_t>(start)) continue;
      auto const first = static_cast<index_t>(start);
      bool const keep_first = refs_[start] != 0;
      if (keep_first) copy_page_out(first, held.data());
      index_t at = first;
      for (;;) {
        done[static_cast<std::size_t>(at)] = true;
        index_t const src = from[static_cast<std::size_t>(at)];
        if (src == first) {
          if (keep_first) copy_page_in(held.data(), at);
          break;
        }
        if (refs_[static_cast<std::size_t>(src)] != 0) copy_page(src, at, page_tokens_);
        at = src;
      }
    }
    for (std::size_t p = 0; p < np; ++p) refs[static_cast<std::size_t>(to[p])] = refs_[p];
    refs_.swap(refs);
    for (sequence& s : seqs_)
      for (index_t& p : s.pages) p = to[static_cast<std::size_t>(p)];
    return moved;
  }

  /// Number of runs of consecutive page ids that sequence `id`'s pages form
  /// (0 for an empty sequence, 1 when attention reads each kv head as one run).
  index_t page_runs(index_t id) const {
    check_id("posenc::paged_kv_cache::page_runs", "id", id);
    auto const& pages = seqs_[static_cast<std::size_t>(id)].pages;
    index_t runs = 0;
    for (std::size_t j = 0; j < pages.size(); ++j) runs += j == 0 || pages[j] != pages[j - 1] + 1;
    return runs;
  }

  /// Tokens of sequence `id`.
  index_t length(index_t id) const {
    check_id("posenc::paged_kv_cache::length", "id", id);
    return seqs_[static_cast<std::size_t>(id)].len;
  }
  /// Position of token 0 of sequence `id`.
  index_t first_position(index_t id) const {
    check_id("posenc::paged_kv_cache::first_position", "id", id);
    return seqs_[static_cast<std::size_t>(id)].first;
  }
  /// Position the next appended token of sequence `id` gets.
  index_t next_position(index_t id) const {
    check_id("posenc::paged_kv_cache::next_position", "id", id);
    sequence const& s = seqs_[static_cast<std::size_t>(id)];
    return s.first + s.len;
  }
  /// True when `id` names an open sequence.
  bool contains(index_t id) const noexcept {
    return id >= 0 && id < static_cast<index_t>(seqs_.size()) && seqs_[static_cast<std::size_t>(id)].live;
  }
  /// The page ids of sequence `id`, in token order (page t holds tokens
  /// t * page_tokens() .. of the sequence).
  span<const index_t> page_table(index_t id) const {
    check_id("posenc::paged_kv_cache::page_table", "id", id);
    return seqs_[static_cast<std::size_t>(id)].pages;
  }
  /// Sequences sharing page `page` (0 for a free page).
  index_t page_references(index_t page) const {
    detail::require(page >= 0 && page < pages_, "posenc::paged_kv_cache::page_references", "page is ", page,
                    ", expected 0 .. ", pages_ - 1);
    return refs_[static_cast<std::size_t>(page)];
  }
  /// True when the cached keys are stored rotated; false while the cache holds no token.
  bool keys_rotated() const noexcept { return tokens_ > 0 && rotated_; }
  /// The identity of the rotation that rotated the cached keys
  /// (`rotation_identity_of` the encoder of the first append); empty when
  /// the keys are not rotated.
  encoder_identity const& key_rotation() const noexcept {
    static encoder_identity const none;
    return keys_rotated() ? rotation_ : none;
  }
  index_t pages() const noexcept { return pages_; }
  index_t free_page_count() const noexcept { return free_count_; }
  index_t page_tokens() const noexcept { return page_tokens_; }
  index_t kv_heads() const noexcept { return heads_; }
  index_t head_dim() const noexcept { return dim_; }
  index_t value_dim() const noexcept { return vdim_; }

  /// Keys of pages [page, page + count) as one view (1, count x page_tokens(), kv_heads, head_dim),
  /// head-major: seq_stride = head_dim, head_stride = pages() x page_tokens() x head_dim.
  /// Any pages of the pool may be viewed; rows past a sequence's length and
  /// rows of free pages hold unspecified values.
  /// @throws posenc::error unless 0 <= page <= pages() and 0 <= count <= pages() - page.
  view<const T> page_keys(index_t page, index_t count) const {
    check_run("posenc::paged_kv_cache::page_keys", page, count);
    return run(keys_.data(), dim_, page, count);
  }
  /// Values of pages [page, page + count) as one view (1, count x page_tokens(), kv_heads, value_dim),
  /// head-major as page_keys(), checked as page_keys().
  view<const T> page_values(index_t page, index_t count) const {
    check_run("posenc::paged_kv_cache::page_values", page, count);
    return run(values_.data(), vdim_, page, count);
  }

 private:
  struct sequence {
    index_t first = 0, len = 0;
    std::vector<index_t> pages;
    bool live = false;
  };

  void check_id(char const* w, char const* name, index_t id) const {
    detail::require(contains(id), w, name, " is ", id, ", expected the id of an open sequence (0 .. ",
                    static_cast<index_t>(seqs_.size()) - 1, ", not freed)");
  }
  void check_run(char const* w, index_t page, index_t count) const {
    detail::require(page >= 0 && page <= pages_, w, "page is ", page, ", expected 0 .. ", pages_, " (pages())");
    detail::require(count >= 0 && count <= pages_ - page, w, "count is ", count, ", expected 0 .. ", pages_ - page,
                    " (pages() - page)");
  }
  index_t take_slot() {
    index_t id;
    if (!free_slots_.empty()) {
      id = free_slots_.back();
      free_slots_.pop_back();
    } else {
      seqs_.emplace_back();
      id = static_cast<index_t>(seqs_.size()) - 1;
    }
    sequence& s = seqs_[static_cast<std::size_t>(id)];
    s = sequence{};
    s.live = true;
    return id;
  }
  index_t pages_for(index_t tokens) const noexcept { return tokens / page_tokens_ + (tokens % page_tokens_ != 0); }
  // The last page is partly filled and shared: an append copies it first.
  bool shared_tail(sequence const& s) const noexcept {
    return s.len % page_tokens_ != 0 && refs_[static_cast<std::size_t>(s.pages.back())] > 1;
  }
  // Pages an append of n tokens to each of `ids` (in order) takes from the
  // pool, as write_tokens takes them: new pages for growth, plus a copy for
  // each sequence whose partly filled last page is still shared when its turn
  // comes. Each copy drops that page's count by one, so when m sequences before
  // it in the batch end in the same partly filled page, m copies were made
  // (each of them still shared it with this one) and this one copies only if
  // the count minus m is above 1: of the sequences sharing a page, all in
  // the batch, the last writes in place. Quadratic in ids.size(), as the
  // distinct-ids check; allocates nothing.
  index_t pages_needed(span<const index_t> ids, index_t n) const noexcept {
    index_t need = 0;
    for (index_t b = 0; b < ids.size(); ++b) {
      sequence const& s = seqs_[static_cast<std::size_t>(ids[b])];
      need += pages_for(s.len + n) - static_cast<index_t>(s.pages.size());
      if (s.len % page_tokens_ == 0) continue;
      index_t const tail = s.pages.back();
      index_t made = 0;
      for (index_t c = 0; c < b; ++c) {
        sequence const& o = seqs_[static_cast<std::size_t>(ids[c])];
        made += o.len % page_tokens_ != 0 && o.pages.back() == tail;
      }
      need += refs_[static_cast<std::size_t>(tail)] - made > 1;
    }
    return need;
  }
  // A free page for a sequence whose pages end at page `after` (-1: none yet).
  // Pages are handed out so that each sequence's pages stay consecutive where
  // the pool allows, so that attention reads them as one strided run: the page
  // right after `after` when it is free; otherwise a page of the longest run of
  // free pages (the lowest such run): its first page when the run starts the
  // pool, else its middle page, which leaves the first half of the run to the
  // sequence that may be growing from the page before it. Sequences that grow
  // at the same time (a decode batch) thus each get long runs instead of
  // alternating pages. Needs a free page (checked by the callers); no allocation.
  index_t take_page(index_t after) noexcept {
    index_t p = after + 1;
    if (after < 0 || p >= pages_ || refs_[static_cast<std::size_t>(p)] != 0) p = roomiest_free_page();
    refs_[static_cast<std::size_t>(p)] = 1;
    --free_count_;
    return p;
  }
  index_t roomiest_free_page() const noexcept {
    index_t best = 0, best_len = 0;
    for (index_t a = 0; a < pages_;) {
      if (refs_[static_cast<std::size_t>(a)] != 0) {
        ++a;
        continue;
      }
      index_t b = a + 1;
      while (b < pages_ && refs_[static_cast<std::size_t>(b)] == 0) ++b;
      if (b - a > best_len) {
        best = a;
        best_len = b - a;
      }
      a = b;
    }
    return best == 0 ? 0 : best + best_len / 2;
  }
  T* token_ptr(std::vector<T>& store, index_t d, index_t page, index_t t, index_t h) noexcept {
    return store.data() + ((h * pages_ + page) * page_tokens_ + t) * d;
  }
  // Writes the tokens of entry b of k and v after the sequence's last token,
  // copying a shared last page first and taking new pages as needed.
  void write_tokens(sequence& s, view<const input_type> k, view<const input_type> v, index_t b) {
    if (shared_tail(s)) {
      index_t const before = s.pages.size() > 1 ? s.pages[s.pages.size() - 2] : -1;
      index_t const old = s.pages.back(), fresh = take_page(before);
      --refs_[static_cast<std::size_t>(old)];
      copy_page(old, fresh, s.len % page_tokens_);
      s.pages.back() = fresh;
    }
    for (index_t t = 0; t < k.seq; ++t) {
      index_t const pos = s.len + t, slot = pos % page_tokens_;
      if (slot == 0) s.pages.push_back(take_page(s.pages.empty() ? -1 : s.pages.back()));
      index_t const page = s.pages.back();
      for (index_t h = 0; h < heads_; ++h) {
        store_row(k.ptr(b, t, h), dim_, token_ptr(keys_, dim_, page, slot, h));
        store_row(v.ptr(b, t, h), vdim_, token_ptr(values_, vdim_, page, slot, h));
      }
    }
    s.len += k.seq;
  }
  // Copies n input elements into the pages, each rounded once for a 16-bit cache.
  static void store_row(input_type const* src, index_t n, T* dst) noexcept {
    if constexpr (std::is_same_v<input_type, T>) {
      std::copy(src, src + n, dst);
    } else {
      for (index_t d = 0; d < n; ++d) dst[d] = detail::to_storage<T>(src[d]);
    }
  }
  // Page contents (every kv head's keys and values) to and from a scratch of
  // page_tokens x kv_heads x (head_dim + value_dim) elements.
  void copy_page_out(index_t page, T* dst) noexcept {
    index_t const nk = page_tokens_ * dim_, nv = page_tokens_ * vdim_;
    for (index_t h = 0; h < heads_; ++h) {
      std::copy_n(token_ptr(keys_, dim_, page, 0, h), nk, dst + h * nk);
      std::copy_n(token_ptr(values_, vdim_, page, 0, h), nv, dst + heads_ * nk + h * nv);
    }
  }
  void copy_page_in(T const* src, index_t page) noexcept {
    index_t const nk = page_tokens_ * dim_, nv = page_tokens_ * vdim_;
    for (index_t h = 0; h < heads_; ++h) {
      std::copy_n(src + h * nk, nk, token_ptr(keys_, dim_, page, 0, h));
      std::copy_n(src + heads_ * nk + h * nv, nv, token_ptr(values_, vdim_, page, 0, h));
    }
  }
  // The first `tokens` tokens of page src (every kv head) into page dst.
  void copy_page(index_t src, index_t dst, index_t tokens) noexcept {
    for (index_t h = 0; h < heads_; ++h) {
      std::copy_n(token_ptr(keys_, dim_, src, 0, h), tokens * dim_, token_ptr(keys_, dim_, dst, 0, h));
      std::copy_n(token_ptr(values_, vdim_, src, 0, h), tokens * vdim_, token_ptr(values_, vdim_, dst, 0, h));
    }
  }
  view<const T> run(T const* base, index_t d, index_t page, index_t count) const noexcept {
    index_t const head_stride = pages_ * page_tokens_ * d;
    return {base + page * page_tokens_ * d, 1, count * page_tokens_, heads_, d, heads_ * head_stride, d,
            head_stride, 1};
  }

  index_t pages_, page_tokens_, heads_, dim_, vdim_;
  index_t tokens_ = 0;    // sum of the lengths of the open sequences (0: no rotation recorded)
  bool rotated_ = false;  // how the cached keys are stored; meaningful while tokens_ > 0
  encoder_identity rotation_;  // what rotated them, when rotated_
  std::vector<T> keys_, values_;
  std::vector<index_t> refs_, free_slots_;  // refs_[p] == 0: page p is free
  index_t free_count_ = 0;
  std::vector<sequence> seqs_;
  std::vector<input_type> fresh_;  // rotated copy of the keys of one append (float for a 16-bit cache)
};

}  // namespace posenc
