// SPDX-License-Identifier: MIT
// position_span: the position id of every (batch, token), as an offset or explicit ids.
#pragma once

#include <algorithm>

#include "posenc/core/error.hpp"
#include "posenc/core/span.hpp"

namespace posenc {

/// Position ids for a (batch, seq) grid of tokens. Three forms:
/// - `position_span(first)`: token s of every batch entry is at `first + s`
///   (prefill: 0; a KV-cache step: past_len);
/// - `position_span::per_batch(firsts)`: token s of entry b is at `firsts[b] + s`;
/// - `position_span::ids(p, batch, seq)`: explicit ids, row-major (batch, seq);
///   `batch == 1` broadcasts over the batch.
/// Non-owning: the arrays must outlive the span.
class position_span {
 public:
  constexpr position_span() noexcept = default;
  constexpr explicit position_span(index_t first) noexcept : first_(first) {}  // NOLINT

  static position_span per_batch(span<const index_t> firsts) noexcept {
    position_span p;
    p.firsts_ = firsts.data();
    p.firsts_size_ = firsts.size();
    return p;
  }
  static position_span ids(index_t const* ids, index_t batch, index_t seq) noexcept {
    position_span p;
    p.ids_ = ids;
    p.ids_batch_ = batch;
    p.ids_seq_ = seq;
    return p;
  }

  /// Position of token s of batch entry b.
  index_t at(index_t b, index_t s) const noexcept {
    if (ids_) return ids_[(ids_batch_ == 1 ? 0 : b) * ids_seq_ + s];
    if (firsts_) return firsts_[b] + s;
    return first_ + s;
  }
  bool is_explicit() const noexcept { return ids_ != nullptr; }
  bool is_per_batch() const noexcept { return firsts_ != nullptr; }

  /// Checks only that the span covers (batch, seq); ids may be negative
  /// (attention query positions before the first key).
  void validate_shape(char const* where, char const* name, index_t batch, index_t seq) const {
    if (ids_) {
      detail::require(ids_batch_ == batch || ids_batch_ == 1, where, name, " batch is ", ids_batch_,
                      ", expected ", batch, " or 1");
      detail::require(ids_seq_ == seq, where, name, " seq is ", ids_seq_, ", expected ", seq);
    }
    if (firsts_) {
      detail::require(firsts_size_ == batch, where, name, " has ", firsts_size_,
                      " per-batch offsets, expected ", batch);
    }
  }

  /// Checks the span covers (batch, seq) and that every id is >= 0.
  void validate(char const* where, char const* name, index_t batch, index_t seq) const {
    validate_shape(where, name, batch, seq);
    for (index_t b = 0; b < (ids_ && ids_batch_ == 1 ? std::min<index_t>(batch, 1) : batch); ++b) {
      if (seq == 0) break;
      if (!ids_) {
        index_t p = at(b, 0);
        detail::require(p >= 0, where, name, " position of batch ", b, " token 0 is ", p,
                        ", expected >= 0");
        continue;
      }
      for (index_t s = 0; s < seq; ++s) {
        index_t p = at(b, s);
        detail::require(p >= 0, where, name, " position of batch ", b, " token ", s, " is ", p,
                        ", expected >= 0");
      }
    }
  }

  /// Largest position over (batch, seq); -1 when empty.
  index_t max_position(index_t batch, index_t seq) const noexcept {
    index_t m = -1;
    if (seq == 0) return m;
    for (index_t b = 0; b < (ids_ && ids_batch_ == 1 ? std::min<index_t>(batch, 1) : batch); ++b) {
      if (ids_) {
        for (index_t s = 0; s < seq; ++s) m = std::max(m, at(b, s));
      } else {
        m = std::max(m, at(b, seq - 1));
      }
    }
    return m;
  }

 private:
  index_t first_ = 0;
  index_t const* firsts_ = nullptr;
  index_t firsts_size_ = 0;
  index_t const* ids_ = nullptr;
  index_t ids_batch_ = 0, ids_seq_ = 0;
};

}  // namespace posenc
