// SPDX-License-Identifier: MIT
// Which tokens of a sequence each rank holds: contiguous shards or the causal zig-zag.
#pragma once

#include <algorithm>
#include <vector>

#include "posenc/core/checked.hpp"
#include "posenc/core/error.hpp"
#include "posenc/core/span.hpp"

namespace posenc::distributed {

/// How the sequence is cut into the ranks' shards.
enum class shard_layout {
  /// Rank r holds one run of tokens, after those of ranks 0 .. r-1; any lengths.
  contiguous,
  /// The sequence is cut into 2R near-equal chunks; rank r holds chunks r and
  /// 2R-1-r, in that order, so that under a causal mask every rank has about
  /// the same number of visible (query, key) pairs.
  zigzag,
};

/// A run of tokens [first, first + count) of the whole sequence.
struct segment {
  index_t first = 0;  ///< global index of the run's first token
  index_t count = 0;  ///< number of tokens
};

/// Chunk c of `chunks` near-equal chunks of `total` tokens: the first
/// total % chunks chunks hold one token more.
/// @pre 0 <= c < chunks, total >= 0
inline segment even_chunk(index_t total, index_t chunks, index_t c) noexcept {
  index_t const base = total / chunks, extra = total % chunks;
  return {c * base + std::min(c, extra), base + (c < extra ? 1 : 0)};
}

/// The runs of rank `rank` (of `ranks`) under the zig-zag layout of `total`
/// tokens: chunk rank, then chunk 2 * ranks - 1 - rank.
inline std::vector<segment> zigzag_segments(index_t total, index_t ranks, index_t rank) {
  return {even_chunk(total, 2 * ranks, rank), even_chunk(total, 2 * ranks, 2 * ranks - 1 - rank)};
}

/// Where every rank's tokens sit in the whole sequence.
struct shard_map {
  index_t total = 0;                          ///< tokens of the whole sequence
  std::vector<std::vector<segment>> runs;     ///< per rank: its runs, in shard order
  std::vector<index_t> lengths;               ///< per rank: its shard length

  /// Global index of token s of rank r's shard.
  index_t global_index(index_t r, index_t s) const noexcept {
    for (segment const& g : runs[static_cast<std::size_t>(r)]) {
      if (s < g.count) return g.first + s;
      s -= g.count;
    }
    return -1;
  }
};

/// The shard map of ranks holding `lengths[r]` tokens each. Contiguous: any
/// lengths >= 0. Zig-zag: the lengths must be those of zigzag_segments of
/// their sum; throws posenc::error naming the first rank that differs (and
/// the call `w`: ring_attention passes its own name).
inline shard_map make_shard_map(shard_layout layout, span<const index_t> lengths,
                                char const* w = "posenc::distributed::make_shard_map") {
  shard_map m;
  index_t const ranks = lengths.size();
  posenc::detail::require(ranks >= 1, w, "the rank count is ", ranks, ", expected >= 1");
  for (index_t r = 0; r < ranks; ++r) {
    posenc::detail::require(lengths[r] >= 0, w, "the shard length of rank ", r, " is ", lengths[r], ", expected >= 0");
    m.total = posenc::detail::checked_add(w, m.total, lengths[r], "the sum of the shard lengths");
  }
  m.lengths.assign(lengths.begin(), lengths.end());
  index_t first = 0;
  for (index_t r = 0; r < ranks; ++r) {
    if (layout == shard_layout::contiguous) {
      m.runs.push_back({segment{first, lengths[r]}});
      first += lengths[r];
      continue;
    }
    std::vector<segment> z = zigzag_segments(m.total, ranks, r);
    index_t const want = z[0].count + z[1].count;
    posenc::detail::require(lengths[r] == want, w, "q.seq of rank ", r, " is ", lengths[r], ", expected ", want,
                    " (chunks ", r, " and ", 2 * ranks - 1 - r, " of the zig-zag layout of ", m.total,
                    " tokens over ", ranks, " ranks)");
    m.runs.push_back(std::move(z));
  }
  return m;
}

}  // namespace posenc::distributed
