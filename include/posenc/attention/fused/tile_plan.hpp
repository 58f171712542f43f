// SPDX-License-Identifier: MIT
// path::fused, room 5: what a key tile is for a query block (skipped, full, bounded, diagonal, per-key), decided once.
#pragma once

// What this room holds: `block_keys` (the visible key ranges of one query
// block of the lane kernel, gathered row by row), `tile_kind` (how the logits
// of one (block, key tile) pair are formed) and `plan_tile`, the one function
// that decides it. The lane kernel switches on the kind; nothing else
// re-derives it. May include: attention/plan.hpp, fused/traits.hpp and core/.

#include <algorithm>

#include "posenc/attention/fused/traits.hpp"
#include "posenc/attention/plan.hpp"
#include "posenc/core/span.hpp"

namespace posenc::detail::fused {

/// How the logits of one (query block, key tile) pair are formed from the raw scores.
enum class tile_kind {
  skipped,           ///< no row of the block sees a key of the tile: nothing is computed
  full,              ///< every row sees every key, no bias, no mask: logit = scaled score
  bounded,           ///< no bias, no mask; lane l sees the keys [lo[l], hi[l]): per-lane bounds
  diagonal,          ///< shift-invariant bias as one diagonal of the tile; every key visible
  diagonal_bounded,  ///< the diagonal bias, and per-lane bounds
  per_key,           ///< bias, masks or irregular visibility per (row, key): computed row by row
};

/// The tile plan: its kind and how many of its keys are computed (keys past
/// the block's last visible key are not: with GQA a block spans fewer query
/// positions than a tile has keys).
struct tile_plan {
  tile_kind kind = tile_kind::skipped;
  index_t keys = 0;
  bool adds_diagonal() const noexcept { return kind == tile_kind::diagonal || kind == tile_kind::diagonal_bounded; }
  bool has_bounds() const noexcept { return kind == tile_kind::bounded || kind == tile_kind::diagonal_bounded; }
};

/// The keys the rows of one query block see. Lanes past `rows` (padding) see none.
template <class Tr>
struct block_keys {
  index_t row0 = 0, rows = 0;           // rows of this block within the (b, kv head) rows
  index_t first = 0, last = 0;          // union of the visible key ranges of its rows
  index_t all_first = 0, all_last = 0;  // every row sees [all_first, all_last)
  bool exact = true;                    // the ranges are exact (no per-key test)
  bool shifts = false;                  // rows = one head at positions q0, q0 + 1, ... (q0 >= 0)
  index_t q0 = 0;
  index_t lo[Tr::block_q_v], hi[Tr::block_q_v];  // per-lane visible key range [lo, hi)

  /// Starts a block of `n` rows at row `r0`: no lane sees any key yet.
  void reset(index_t r0, index_t n) noexcept {
    row0 = r0;
    rows = n;
    first = far_key_v;
    last = 0;
    all_first = 0;
    all_last = far_key_v;
    exact = true;
    shifts = false;
    q0 = 0;
    std::fill(lo, lo + Tr::block_q_v, far_key_v);
    std::fill(hi, hi + Tr::block_q_v, -far_key_v);
  }
  /// Lane l sees the keys of `kr` (a range from attention_plan::visible_range).
  void add_row(index_t l, key_range const& kr) noexcept {
    exact = exact && kr.all;
    if (kr.empty()) {
      all_last = 0;
      return;
    }
    lo[l] = kr.first;
    hi[l] = kr.last;
    first = std::min(first, kr.first);
    last = std::max(last, kr.last);
    all_first = std::max(all_first, kr.first);
    all_last = std::min(all_last, kr.last);
  }
  /// After the last row: padding lanes mean no key is seen by all lanes.
  void close() noexcept {
    if (rows < Tr::block_q_v) all_last = 0;
  }
  /// Lane l sees every key of [t0, t0 + n) and needs no per-key test.
  bool lane_covers(index_t l, index_t t0, index_t n) const noexcept {
    return exact && lo[l] <= t0 && hi[l] >= t0 + n;
  }
};

/// Keys t0 .. t0 + n - 1 of batch entry b sit at consecutive positions.
template <class T>
bool keys_consecutive(attention_plan<T> const& p, index_t b, index_t t0, index_t n) noexcept {
  if (p.keys_are_indices) return true;
  index_t const k0 = p.k_position(b, t0);
  for (index_t j = 1; j < n; ++j)
    if (p.k_position(b, t0 + j) != k0 + j) return false;
  return true;
}

/// Decides the tile [t0, t0 + nk) for a block. `per_key_terms`: the call has
/// a bias or masks, computed per (row, key) unless the diagonal applies;
/// `diagonal_ready`: a shift-invariant bias without masks whose tile keys sit
/// at consecutive positions (the block must also be one head at consecutive
/// positions with exact ranges).
template <class Tr>
tile_plan plan_tile(block_keys<Tr> const& bk, index_t t0, index_t nk, bool per_key_terms,
                    bool diagonal_ready) noexcept {
  if (bk.first >= bk.last || t0 >= bk.last || t0 + nk <= bk.first) return {tile_kind::skipped, 0};
  index_t const keys = std::min(nk, bk.last - t0);
  bool const full = bk.exact && bk.all_first <= t0 && bk.all_last >= t0 + keys;
  if (diagonal_ready && bk.shifts && bk.exact)
    return {full ? tile_kind::diagonal : tile_kind::diagonal_bounded, keys};
  if (per_key_terms || !bk.exact) return {tile_kind::per_key, keys};
  return {full ? tile_kind::full : tile_kind::bounded, keys};
}

}  // namespace posenc::detail::fused
