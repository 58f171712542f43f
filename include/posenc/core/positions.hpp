// SPDX-License-Identifier: MIT
// position_span: the position id of every (batch, token), as an offset or explicit ids.
#pragma once

#include <algorithm>

#include "posenc/core/checked.hpp"
#include "posenc/core/error.hpp"
#include "posenc/core/span.hpp"

namespace posenc {

/// Largest |position| the library accepts: 2^60. Validation rejects any
/// position (an offset, a per-batch offset, an explicit id, or the last
/// position offset + seq - 1) outside [-position_limit, position_limit], with
/// an error naming it. Inside that range every sum or difference the library
/// forms from positions, sequence lengths and a sliding window (p_j - p_i,
/// p_i - window + 1, key_length - Sq + i, ...) stays below 2^62, far from
/// index_t overflow (2^63) and from the fused kernel's internal key sentinel
/// (INT64_MAX / 4, about 2^61, compared with key indices only).
inline constexpr index_t position_limit = index_t{1} << 60;

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
  /// The positions of batch entry b alone, as a span of batch 1.
  position_span entry(index_t b) const noexcept {
    if (ids_) return ids(ids_ + (ids_batch_ == 1 ? 0 : b) * ids_seq_, 1, ids_seq_);
    if (firsts_) return position_span(firsts_[b]);
    return *this;
  }
  bool is_explicit() const noexcept { return ids_ != nullptr; }
  bool is_per_batch() const noexcept { return firsts_ != nullptr; }

  /// Checks that the span covers (batch, seq) and that every position is in
  /// [-position_limit, position_limit]; ids may be negative (attention query
  /// positions before the first key).
  void validate_shape(char const* where, char const* name, index_t batch, index_t seq) const {
    if (ids_) {
      detail::require(ids_batch_ == batch || ids_batch_ == 1, where, name, " batch is ", ids_batch_,
                      ", expected ", batch, " or 1");
      detail::require(ids_seq_ == seq, where, name, " seq is ", ids_seq_, ", expected ", seq);
      detail::checked_mul(where, ids_batch_, ids_seq_, name, " batch x ", name, " seq");
    }
    if (firsts_) {
      detail::require(firsts_size_ == batch, where, name, " has ", firsts_size_,
                      " per-batch offsets, expected ", batch);
    }
    validate_range(where, name, batch, seq);
  }

  /// Checks the span covers (batch, seq) and that every position is in [0, position_limit].
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

  /// Checks that every position of (batch, seq) is in [-position_limit,
  /// position_limit]: each explicit id, or an offset and offset + seq - 1.
  void validate_range(char const* where, char const* name, index_t batch, index_t seq) const {
    constexpr index_t lim = position_limit;
    if (seq <= 0 || batch <= 0) return;
    if (ids_) {
      for (index_t b = 0; b < (ids_batch_ == 1 ? 1 : batch); ++b)
        for (index_t s = 0; s < seq; ++s) {
          index_t const p = at(b, s);
          detail::require(p >= -lim && p <= lim, where, name, " position of batch ", b, " token ", s, " is ", p,
                          ", expected |position| <= ", lim, " (position_limit)");
        }
      return;
    }
    for (index_t b = 0; b < (firsts_ ? batch : 1); ++b) {
      index_t const first = firsts_ ? firsts_[b] : first_;
      if (firsts_) {
        detail::require(first >= -lim && first <= lim, where, name, " offset of batch ", b, " is ", first,
                        ", expected |offset| <= ", lim, " (position_limit)");
        detail::require(seq - 1 <= lim - first, where, name, " last position of batch ", b, " is ", first, " + ",
                        seq - 1, " (offset + seq - 1), expected <= ", lim, " (position_limit)");
      } else {
        detail::require(first >= -lim && first <= lim, where, name, " offset is ", first,
                        ", expected |offset| <= ", lim, " (position_limit)");
        detail::require(seq - 1 <= lim - first, where, name, " last position is ", first, " + ", seq - 1,
                        " (offset + seq - 1), expected <= ", lim, " (position_limit)");
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
