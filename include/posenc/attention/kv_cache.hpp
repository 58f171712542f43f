// SPDX-License-Identifier: MIT
// kv_cache<T>: keys and values of past tokens for token-by-token decoding, keys stored rotated.
#pragma once

#include <algorithm>
#include <limits>
#include <type_traits>
#include <vector>

#include "posenc/core/checked.hpp"
#include "posenc/core/error.hpp"
#include "posenc/core/half.hpp"
#include "posenc/core/positions.hpp"
#include "posenc/core/view.hpp"
#include "posenc/encoding/identity.hpp"
#include "posenc/encoding/traits.hpp"

namespace posenc {

namespace detail {
/// The capacity a cache holding `cap` tokens grows to for `tokens` > cap:
/// twice `cap` when that is more than `tokens` and its storage (batch x
/// capacity x heads x dim) fits index_t, else exactly `tokens` (whose storage
/// the caller has checked).
inline index_t kv_grown_capacity(index_t cap, index_t tokens, index_t batch, index_t heads, index_t dim) noexcept {
  index_t const doubled = cap <= std::numeric_limits<index_t>::max() / 2 ? 2 * cap : tokens;
  if (doubled <= tokens) return tokens;
  index_t n = 0;
  if (!overflow_free<'*'>(batch, doubled, n) || !overflow_free<'*'>(n, heads, n) || !overflow_free<'*'>(n, dim, n))
    return tokens;
  return doubled;
}
}  // namespace detail

/// Keys and values of the tokens seen so far, for a batch of sequences that
/// advance together. Token s of the cache sits at position `first_position() + s`.
/// When the encoder rotates queries and keys, append() stores the keys rotated
/// (at their positions, with length = the new cache length) and records it
/// (`keys_rotated()`) with the identity of the rotation (`key_rotation()`);
/// `posenc::attention(q, cache, out, enc, opt)` reads the keys, values, their
/// positions and that record from the cache.
///
/// Storage: head-major, (batch, kv_heads, capacity, dim), grown
/// geometrically: the keys of one kv head lie one after another, so that a
/// decode step reads each head's keys and values as plain runs through memory
/// (the fused path walks head-major K and V head by head; docs/performance-log.md).
/// keys() and values() are strided views of it, indexed (batch, token, head, dim)
/// as every view is.
/// @tparam T float or double, or a 16-bit storage type (Eigen::half,
///         Eigen::bfloat16): append() then takes float k and v, rotates the
///         keys in float when the encoder rotates and rounds each element
///         once (to nearest even) into the cache.
template <class T>
class kv_cache {
 public:
  /// Element type of the k and v that append() takes: T, or float for a 16-bit cache.
  using input_type = std::conditional_t<is_half_storage_v<T>, float, T>;

  /// @param batch sequences in the batch
  /// @param kv_heads key/value heads
  /// @param head_dim key dim; @param value_dim value dim (0 = head_dim)
  /// @param first_position position of the first cached token (0 for a fresh prompt)
  kv_cache(index_t batch, index_t kv_heads, index_t head_dim, index_t value_dim = 0,
           index_t first_position = 0)
      : batch_(batch), heads_(kv_heads), dim_(head_dim), vdim_(value_dim > 0 ? value_dim : head_dim),
        first_(first_position) {
    char const* w = "posenc::kv_cache";
    detail::require(batch >= 0, w, "batch is ", batch, ", expected >= 0");
    detail::require(kv_heads >= 0, w, "kv_heads is ", kv_heads, ", expected >= 0");
    detail::require(head_dim >= 0, w, "head_dim is ", head_dim, ", expected >= 0");
    detail::require(value_dim >= 0, w, "value_dim is ", value_dim, ", expected >= 0");
    detail::require(first_position >= 0 && first_position <= position_limit, w, "first_position is ",
                    first_position, ", expected 0 .. ", position_limit, " (position_limit)");
    token_elements(w, "capacity", 1);  // one token of keys and of values fits index_t
  }

  /// Appends k (batch, S, kv_heads, head_dim) and v (batch, S, kv_heads, value_dim)
  /// as the next S tokens; rotates the stored keys when the encoder rotates.
  ///
  /// Every append to a non-empty cache uses an encoder that rotates exactly
  /// when the cached keys are rotated (`keys_rotated()`), and rotates as the
  /// one that rotated them (the same `rotation_identity_of`: RoPE's base,
  /// layout, rotary dim, scaling and caller tables): a cache never holds keys
  /// rotated two ways side by side.
  ///
  /// Strong guarantee: every check (shapes, sizes, positions, and the encoder's
  /// own checks, which run on a rotated copy of the new keys) happens before
  /// the storage is reallocated or written; after a failed append the cache
  /// and every view taken from it are unchanged.
  template <class E>
  void append(view<const input_type> k, view<const input_type> v, E const& enc) {
    char const* w = "posenc::kv_cache::append";
    detail::check_view(w, "k", k);
    detail::check_view(w, "v", v);
    detail::check_equal(w, "k.batch", k.batch, batch_, "cache batch");
    detail::check_equal(w, "v.batch", v.batch, batch_, "cache batch");
    detail::check_equal(w, "k.heads", k.heads, heads_, "cache kv_heads");
    detail::check_equal(w, "v.heads", v.heads, heads_, "cache kv_heads");
    detail::check_equal(w, "k.dim", k.dim, dim_, "cache head_dim");
    detail::check_equal(w, "v.dim", v.dim, vdim_, "cache value_dim");
    detail::check_equal(w, "v.seq", v.seq, k.seq, "k.seq");
    constexpr bool rotates = encoder_traits<E>::rotates_queries_keys;
    detail::require(len_ == 0 || rotates == rotated_, w, "the encoder's rotates_queries_keys is ",
                    rotates ? "true" : "false", ", expected ", rotated_ ? "true" : "false", " (the ", len_, " cached keys are stored ",
                    rotated_ ? "rotated" : "unrotated", "; clear() the cache to change the encoder)");
    index_t const n = k.seq;
    if (n == 0) return;
    index_t const len = detail::checked_add(w, len_, n, "length() + k.seq");
    index_t const p0 = first_ + len_;  // <= position_limit: checked by the previous append
    detail::require(n - 1 <= position_limit - p0, w, "last new position is ", p0, " + ", n - 1,
                    " (next_position() + k.seq - 1), expected <= ", position_limit, " (position_limit)");
    grown_capacity(w, len);  // the storage size for `len` tokens fits index_t
    // The new keys, rotated in a scratch copy (batch, n, kv_heads, head_dim):
    // the encoder checks the view and the positions before the storage changes.
    std::vector<input_type> fresh;
    encoder_identity rotation;  // of the encoder, when it rotates
    view<const input_type> src = k;
    if constexpr (encoder_traits<E>::rotates_queries_keys) {
      fresh.resize(static_cast<std::size_t>(batch_ * n * heads_ * dim_));  // fits: k passed check_view
      view<input_type> f = make_bshd(fresh.data(), batch_, n, heads_, dim_);
      for (index_t b = 0; b < batch_; ++b)
        for (index_t s = 0; s < n; ++s)
          for (index_t h = 0; h < heads_; ++h) std::copy(k.ptr(b, s, h), k.ptr(b, s, h) + dim_, f.ptr(b, s, h));
      enc.rotate(f, position_span(p0), p0 + n);
      src = f;
      // After the encoder's own checks (a head_dim that does not fit is the plainer fault).
      rotation = rotation_identity_of(enc);
      if (len_ > 0 && rotation != rotation_)
        detail::fail(w, "the encoder rotates as ", rotation.text(), ", expected ", rotation_.text(), " (the ", len_,
                     " cached keys were rotated so; clear() the cache to change the encoder)");
    } else {
      (void)enc;
    }
    reserve_checked(w, len);
    view<T> kd = key_storage(), vd = value_storage();
    for (index_t b = 0; b < batch_; ++b)
      for (index_t s = 0; s < n; ++s)
        for (index_t h = 0; h < heads_; ++h) {
          store_row(src.ptr(b, s, h), dim_, kd.ptr(b, len_ + s, h));
          store_row(v.ptr(b, s, h), vdim_, vd.ptr(b, len_ + s, h));
        }
    if (len_ == 0) {
      rotated_ = rotates;
      rotation_ = std::move(rotation);
    }
    len_ = len;
  }

  /// Cached keys (batch, length(), kv_heads, head_dim), rotated when the encoder rotates.
  view<const T> keys() const noexcept { return const_view(keys_.data(), dim_); }
  /// Cached values (batch, length(), kv_heads, value_dim).
  view<const T> values() const noexcept { return const_view(values_.data(), vdim_); }
  /// Number of cached tokens.
  index_t length() const noexcept { return len_; }
  /// True when the cached keys are stored rotated (they were appended with an
  /// encoder that rotates queries and keys); false for an empty cache.
  bool keys_rotated() const noexcept { return len_ > 0 && rotated_; }
  /// The identity of the rotation that rotated the cached keys
  /// (`rotation_identity_of` the encoder of the first append); empty when
  /// the keys are not rotated.
  encoder_identity const& key_rotation() const noexcept {
    static encoder_identity const none;
    return keys_rotated() ? rotation_ : none;
  }
  /// Position of cached token 0.
  index_t first_position() const noexcept { return first_; }
  /// Position the next appended token gets.
  index_t next_position() const noexcept { return first_ + len_; }
  index_t batch() const noexcept { return batch_; }
  index_t kv_heads() const noexcept { return heads_; }
  index_t head_dim() const noexcept { return dim_; }
  index_t value_dim() const noexcept { return vdim_; }
  /// Forgets every token (keeps the storage).
  void clear() noexcept { len_ = 0; }
  /// Keeps the first `tokens` tokens and forgets the rest (storage kept), e.g.
  /// to drop rejected draft tokens. Throws posenc::error unless
  /// 0 <= tokens <= length().
  void truncate(index_t tokens) {
    detail::require(tokens >= 0 && tokens <= len_, "posenc::kv_cache::truncate", "tokens is ", tokens,
                    ", expected 0 <= tokens <= length() (", len_, ")");
    len_ = tokens;
  }

  /// Makes room for `tokens` tokens without reallocating on append. Throws
  /// posenc::error (cache unchanged) when tokens < 0 or the storage size
  /// batch x tokens x kv_heads x head_dim (or value_dim) overflows index_t.
  void reserve(index_t tokens) {
    char const* w = "posenc::kv_cache::reserve";
    detail::require(tokens >= 0, w, "tokens is ", tokens, ", expected >= 0");
    reserve_checked(w, tokens);
  }

 private:
  // Copies n input elements into the storage, each rounded once for a 16-bit cache.
  static void store_row(input_type const* src, index_t n, T* dst) noexcept {
    if constexpr (std::is_same_v<input_type, T>) {
      std::copy(src, src + n, dst);
    } else {
      for (index_t d = 0; d < n; ++d) dst[d] = detail::to_storage<T>(src[d]);
    }
  }
  // Elements of `tokens` tokens of keys and of values (the larger of the two),
  // checked: batch x tokens x kv_heads x max(head_dim, value_dim).
  index_t token_elements(char const* w, char const* what, index_t tokens) const {
    index_t const d = std::max(dim_, vdim_);
    index_t n = detail::checked_mul(w, batch_, tokens, "batch x ", what);
    n = detail::checked_mul(w, n, heads_, "batch x ", what, " x kv_heads");
    return detail::checked_mul(w, n, d, "batch x ", what, " x kv_heads x ", dim_ >= vdim_ ? "head_dim" : "value_dim");
  }
  // Capacity after making room for `tokens`: geometric growth, never past what
  // fits index_t; throws when `tokens` itself does not fit.
  index_t grown_capacity(char const* w, index_t tokens) const {
    if (tokens <= cap_) return cap_;
    token_elements(w, "capacity", tokens);
    return detail::kv_grown_capacity(cap_, tokens, batch_, heads_, std::max(dim_, vdim_));
  }
  // Grows the storage to at least `tokens` (sizes checked first); the old
  // storage is replaced only after the new one is filled.
  void reserve_checked(char const* w, index_t tokens) {
    if (tokens <= cap_) return;
    index_t const cap = grown_capacity(w, tokens);
    std::vector<T> nk(static_cast<std::size_t>(batch_ * cap * heads_ * dim_));
    std::vector<T> nv(static_cast<std::size_t>(batch_ * cap * heads_ * vdim_));
    for (index_t bh = 0; bh < batch_ * heads_; ++bh) {  // each (sequence, kv head): its len_ tokens
      std::copy_n(keys_.begin() + bh * cap_ * dim_, len_ * dim_, nk.begin() + bh * cap * dim_);
      std::copy_n(values_.begin() + bh * cap_ * vdim_, len_ * vdim_, nv.begin() + bh * cap * vdim_);
    }
    keys_.swap(nk);
    values_.swap(nv);
    cap_ = cap;
  }

  // (batch, token, head, dim) over the head-major storage.
  view<T> storage(T* data, index_t d) noexcept {
    return {data, batch_, len_, heads_, d, heads_ * cap_ * d, d, cap_ * d, 1};
  }
  view<T> key_storage() noexcept { return storage(keys_.data(), dim_); }
  view<T> value_storage() noexcept { return storage(values_.data(), vdim_); }
  view<const T> const_view(T const* data, index_t d) const noexcept {
    return {data, batch_, len_, heads_, d, heads_ * cap_ * d, d, cap_ * d, 1};
  }

  index_t batch_, heads_, dim_, vdim_, first_;
  index_t len_ = 0, cap_ = 0;
  bool rotated_ = false;  // how the cached keys are stored; meaningful while len_ > 0
  encoder_identity rotation_;  // what rotated them, when rotated_
  std::vector<T> keys_, values_;
};

}  // namespace posenc
