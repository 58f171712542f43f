// SPDX-License-Identifier: MIT
// path::fused, room 2: per-thread scratch, laid out from one description and bounds-checked.
#pragma once

// What this room holds: `carve` (hands out aligned pieces of one thread's
// buffer, checking its end in debug builds) and `scratch_counter` (the same
// calls, counting instead). A kernel describes its scratch once, as a
// `lay_out(taker, ...)` member that calls `take(n)` for every piece in order;
// the size comes from running that description with a counter, the pointers
// from running it with a carve, so the two cannot disagree.
// May include: core/ only.

#include "posenc/core/error.hpp"
#include "posenc/core/span.hpp"

namespace posenc::detail::fused {

/// Elements one piece of n elements occupies: a multiple of 16, so that every
/// piece starts 64-byte aligned for float and double.
constexpr index_t scratch_piece(index_t n) noexcept { return (n + 15) / 16 * 16; }

/// Consecutive pieces of one buffer of `size` elements. take() past the end
/// is a POSENC_ASSERT failure (debug builds; the sizes come from the same
/// description, so release builds do not test it).
template <class T>
class carve {
 public:
  carve(T* base, index_t size) noexcept : p_(base), end_(base + size) {}
  T* take(index_t n) {
    index_t const step = scratch_piece(n);
    POSENC_ASSERT(n >= 0 && step <= end_ - p_, "posenc::fused: scratch overflow (a piece past the carved buffer)");
    T* r = p_;
    p_ += step;
    return r;
  }
  /// Elements not handed out yet.
  index_t left() const noexcept { return static_cast<index_t>(end_ - p_); }

 private:
  T* p_;
  T* end_;
};

/// Counts the elements a layout takes: the same take() calls as carve.
template <class T>
struct scratch_counter {
  index_t total = 0;
  T* take(index_t n) noexcept {
    total += scratch_piece(n);
    return nullptr;
  }
};

/// Elements a scratch type S takes for `args`: runs S::lay_out with a counter.
template <class S, class... Args>
index_t scratch_elements(Args... args) noexcept {
  S s{};
  scratch_counter<typename S::value_type> c;
  s.lay_out(c, args...);
  return c.total;
}

/// A scratch S carved out of `base` (`size` elements) for `args`.
template <class S, class... Args>
S carve_scratch(typename S::value_type* base, index_t size, Args... args) {
  S s{};
  carve<typename S::value_type> c(base, size);
  s.lay_out(c, args...);
  return s;
}

}  // namespace posenc::detail::fused
