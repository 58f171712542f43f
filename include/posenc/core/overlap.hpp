// SPDX-License-Identifier: MIT
// The bytes a strided view can touch, and whether two such sets share a byte.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>

#include "posenc/core/span.hpp"
#include "posenc/core/view.hpp"

namespace posenc::detail {

/// The bytes of a strided tensor whose innermost run is contiguous:
/// base + sum_k i_k * stride[k] + [0, run) for 0 <= i_k < extent[k].
/// Normalised: strides in bytes, > 0, descending; dims of extent 1 or stride 0
/// dropped (a stride-0 dim repeats the same bytes). `run == 0`: no byte.
/// Arithmetic is unsigned (wraps, never undefined) on addresses.
struct byte_set {
  static constexpr int max_rank_v = 4;
  std::uint64_t base = 0;  // lowest address
  std::uint64_t run = 0;   // bytes of one contiguous row
  int rank = 0;
  bool repeats = false;  // a dropped dim of extent > 1 and stride 0 touches the same bytes again
  std::uint64_t extent[max_rank_v] = {};
  std::uint64_t stride[max_rank_v] = {};
  /// Bytes from the start of a block of dims [level, rank) to its end.
  std::uint64_t tail(int level) const noexcept {
    std::uint64_t t = run;
    for (int d = level; d < rank; ++d) t += (extent[d] - 1) * stride[d];
    return t;
  }
  bool empty() const noexcept { return run == 0; }
  /// First byte past the set's bounding interval.
  std::uint64_t end() const noexcept { return base + tail(0); }
};

/// Builds the byte set of `rank` dims (extents and element strides, any sign)
/// and a contiguous row of `row` elements of `bytes` bytes at `data`.
inline byte_set make_byte_set(void const* data, std::size_t bytes, int rank, index_t const* extents,
                              index_t const* strides, index_t row) noexcept {
  byte_set s;
  if (data == nullptr || row <= 0) return s;
  for (int d = 0; d < rank; ++d)
    if (extents[d] <= 0) return s;
  s.base = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(data));
  s.run = static_cast<std::uint64_t>(row) * bytes;
  for (int d = 0; d < rank; ++d) {
    if (extents[d] == 1) continue;
    if (strides[d] == 0) {
      s.repeats = true;
      continue;
    }
    std::uint64_t const e = static_cast<std::uint64_t>(extents[d]);
    std::uint64_t const mag = static_cast<std::uint64_t>(strides[d] < 0 ? -strides[d] : strides[d]) * bytes;
    if (strides[d] < 0) s.base -= (e - 1) * mag;  // the lowest address is at the last index
    s.extent[s.rank] = e;
    s.stride[s.rank] = mag;
    ++s.rank;
  }
  // Descending strides (insertion sort of at most 4 dims).
  for (int a = 1; a < s.rank; ++a)
    for (int b = a; b > 0 && s.stride[b] > s.stride[b - 1]; --b) {
      std::swap(s.stride[b], s.stride[b - 1]);
      std::swap(s.extent[b], s.extent[b - 1]);
    }
  return s;
}

/// The byte set of a (batch, seq, head, dim) view.
template <class T>
byte_set bytes_of(view<T> const& v) noexcept {
  index_t const ext[3] = {v.batch, v.seq, v.heads};
  index_t const str[3] = {v.batch_stride, v.seq_stride, v.head_stride};
  return make_byte_set(v.data, sizeof(T), 3, ext, str, v.dim);
}

/// The byte set of `n` contiguous elements at `data`.
template <class T>
byte_set bytes_of(T const* data, index_t n) noexcept {
  return make_byte_set(data, sizeof(T), 0, nullptr, nullptr, n);
}

/// Whether the blocks a_base + dims [al, a.rank) of a and b_base + dims
/// [bl, b.rank) of b share a byte. Splits the block with the larger outer
/// stride into its children and visits only those that meet the other
/// block's bounding interval, so interleaved layouts (q, k and v sharing one
/// packed buffer) cost one visit per row, and separate buffers one test.
inline bool blocks_overlap(byte_set const& a, std::uint64_t a_base, int al, byte_set const& b, std::uint64_t b_base,
                           int bl) noexcept {
  std::uint64_t const a_end = a_base + a.tail(al), b_end = b_base + b.tail(bl);
  if (a_end <= b_base || b_end <= a_base) return false;
  bool const a_leaf = al == a.rank, b_leaf = bl == b.rank;
  if (a_leaf && b_leaf) return true;
  bool const split_a = b_leaf || (!a_leaf && a.stride[al] >= b.stride[bl]);
  byte_set const& s = split_a ? a : b;
  std::uint64_t const s_base = split_a ? a_base : b_base;
  int const level = split_a ? al : bl;
  std::uint64_t const o_base = split_a ? b_base : a_base, o_end = split_a ? b_end : a_end;
  // Child i spans [s_base + i * st, s_base + i * st + child): it meets
  // [o_base, o_end) for i in [first, last).
  std::uint64_t const st = s.stride[level], child = s.tail(level + 1);
  std::uint64_t const last = std::min(s.extent[level], (o_end - s_base + st - 1) / st);
  std::uint64_t const first = s_base + child > o_base ? 0 : (o_base - s_base - child) / st + 1;
  for (std::uint64_t i = first; i < last; ++i) {
    bool const hit = split_a ? blocks_overlap(a, a_base + i * st, al + 1, b, b_base, bl)
                             : blocks_overlap(a, a_base, al, b, b_base + i * st, bl + 1);
    if (hit) return true;
  }
  return false;
}

/// Whether two byte sets share a byte.
inline bool overlaps(byte_set const& a, byte_set const& b) noexcept {
  if (a.empty() || b.empty()) return false;
  return blocks_overlap(a, a.base, 0, b, b.base, 0);
}

/// Whether two elements of the set can share a byte: true for a stride-0 dim
/// of extent > 1; false when each stride
/// covers the whole block of the dims inside it (every row-major or
/// transposed layout); a set that interleaves otherwise counts as overlapping.
inline bool overlaps_itself(byte_set const& s) noexcept {
  if (s.repeats) return true;
  for (int d = s.rank - 1; d >= 0; --d)
    if (s.stride[d] < s.tail(d + 1)) return true;
  return false;
}

/// "[0x1000, 0x1400)": the bounding byte interval, for error messages.
inline std::string byte_range(byte_set const& s) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "[%#llx, %#llx)", static_cast<unsigned long long>(s.base),
                static_cast<unsigned long long>(s.end()));
  return buf;
}

}  // namespace posenc::detail
