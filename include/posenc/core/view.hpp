// SPDX-License-Identifier: MIT
// Strided, non-owning tensor views in logical order and the checks kernels run on them.
#pragma once

#include <type_traits>

#include "posenc/core/checked.hpp"
#include "posenc/core/error.hpp"
#include "posenc/core/span.hpp"

namespace posenc {

/// A 4-D view in logical order (batch, seq, head, dim) over someone else's
/// buffer. Strides are in elements and may be anything; kernels require
/// `dim_stride == 1` (checked, with a clear error). `T` may be const.
template <class T>
struct view {
  T* data = nullptr;
  index_t batch = 0, seq = 0, heads = 0, dim = 0;
  index_t batch_stride = 0, seq_stride = 0, head_stride = 0, dim_stride = 1;

  /// Pointer to element (b, s, h, 0).
  T* ptr(index_t b, index_t s, index_t h) const noexcept {
    return data + b * batch_stride + s * seq_stride + h * head_stride;
  }
  T& operator()(index_t b, index_t s, index_t h, index_t d) const noexcept {
    return ptr(b, s, h)[d * dim_stride];
  }
  index_t size() const noexcept { return batch * seq * heads * dim; }
  bool empty() const noexcept { return size() == 0; }

  /// A view of the same data as const.
  operator view<const T>() const noexcept {  // NOLINT: implicit like T* -> const T*
    return {data, batch, seq, heads, dim, batch_stride, seq_stride, head_stride, dim_stride};
  }
};

/// A 3-D view (batch, seq, dim) of token embeddings; `dim_stride` must be 1.
template <class T>
struct token_view {
  T* data = nullptr;
  index_t batch = 0, seq = 0, dim = 0;
  index_t batch_stride = 0, seq_stride = 0, dim_stride = 1;

  T* ptr(index_t b, index_t s) const noexcept { return data + b * batch_stride + s * seq_stride; }
  T& operator()(index_t b, index_t s, index_t d) const noexcept { return ptr(b, s)[d * dim_stride]; }
  index_t size() const noexcept { return batch * seq * dim; }
  bool empty() const noexcept { return size() == 0; }
  operator token_view<const T>() const noexcept {  // NOLINT
    return {data, batch, seq, dim, batch_stride, seq_stride, dim_stride};
  }
};

/// View over a contiguous buffer laid out (batch, seq, head, dim).
template <class T>
view<T> make_bshd(T* data, index_t batch, index_t seq, index_t heads, index_t dim) noexcept {
  using detail::wrapping_mul;  // huge extents wrap here; check_view rejects them
  return {data, batch, seq, heads, dim, wrapping_mul(wrapping_mul(seq, heads), dim), wrapping_mul(heads, dim), dim, 1};
}

/// View over a contiguous buffer laid out (batch, head, seq, dim).
template <class T>
view<T> make_bhsd(T* data, index_t batch, index_t heads, index_t seq, index_t dim) noexcept {
  using detail::wrapping_mul;  // huge extents wrap here; check_view rejects them
  return {data, batch, seq, heads, dim, wrapping_mul(wrapping_mul(heads, seq), dim), dim, wrapping_mul(seq, dim), 1};
}

/// View over a contiguous buffer laid out (batch, seq, dim).
template <class T>
token_view<T> make_bsd(T* data, index_t batch, index_t seq, index_t dim) noexcept {
  return {data, batch, seq, dim, detail::wrapping_mul(seq, dim), dim, 1};
}

namespace detail {

/// Checks sizes, the contiguous last dim and null data of a 4-D view, and that
/// the element count (batch x seq x heads x dim, each partial product) and the
/// largest strided offset (sum of (extent - 1) x |stride|) fit index_t.
/// `where` is "posenc::<function>", `name` the argument ("q", "k", ...).
template <class T>
void check_view(char const* where, char const* name, view<T> const& v) {
  require(v.batch >= 0, where, name, ".batch is ", v.batch, ", expected >= 0");
  require(v.seq >= 0, where, name, ".seq is ", v.seq, ", expected >= 0");
  require(v.heads >= 0, where, name, ".heads is ", v.heads, ", expected >= 0");
  require(v.dim >= 0, where, name, ".dim is ", v.dim, ", expected >= 0");
  require(v.dim_stride == 1 || v.dim <= 1, where, name, ".dim_stride is ", v.dim_stride,
          ", expected 1 (the last dim must be contiguous)");
  // Every partial product of the extents and the largest strided offset fit index_t,
  // so that neither the element count nor any ptr(b, s, h) can wrap around.
  index_t n = checked_mul(where, v.batch, v.seq, name, ".batch x ", name, ".seq");
  n = checked_mul(where, n, v.heads, name, ".batch x ", name, ".seq x ", name, ".heads");
  n = checked_mul(where, n, v.dim, name, ".batch x ", name, ".seq x ", name, ".heads x ", name, ".dim");
  index_t off = checked_span_of(where, v.batch, v.batch_stride, "(", name, ".batch - 1) x |", name, ".batch_stride|");
  off = checked_add(where, off, checked_span_of(where, v.seq, v.seq_stride, "(", name, ".seq - 1) x |", name,
                                                ".seq_stride|"),
                    "the largest offset of ", name, " (batch and seq terms)");
  off = checked_add(where, off, checked_span_of(where, v.heads, v.head_stride, "(", name, ".heads - 1) x |", name,
                                                ".head_stride|"),
                    "the largest offset of ", name, " (batch, seq and head terms)");
  checked_add(where, off, checked_span_of(where, v.dim, v.dim_stride, "(", name, ".dim - 1) x |", name, ".dim_stride|"),
              "the largest offset of ", name);
  require(v.data != nullptr || n == 0, where, name, ".data is null, expected a buffer of ", n, " elements");
}

template <class T>
void check_view(char const* where, char const* name, token_view<T> const& v) {
  require(v.batch >= 0, where, name, ".batch is ", v.batch, ", expected >= 0");
  require(v.seq >= 0, where, name, ".seq is ", v.seq, ", expected >= 0");
  require(v.dim >= 0, where, name, ".dim is ", v.dim, ", expected >= 0");
  require(v.dim_stride == 1 || v.dim <= 1, where, name, ".dim_stride is ", v.dim_stride,
          ", expected 1 (the last dim must be contiguous)");
  index_t n = checked_mul(where, v.batch, v.seq, name, ".batch x ", name, ".seq");
  n = checked_mul(where, n, v.dim, name, ".batch x ", name, ".seq x ", name, ".dim");
  index_t off = checked_span_of(where, v.batch, v.batch_stride, "(", name, ".batch - 1) x |", name, ".batch_stride|");
  off = checked_add(where, off, checked_span_of(where, v.seq, v.seq_stride, "(", name, ".seq - 1) x |", name,
                                                ".seq_stride|"),
                    "the largest offset of ", name, " (batch and seq terms)");
  checked_add(where, off, checked_span_of(where, v.dim, v.dim_stride, "(", name, ".dim - 1) x |", name, ".dim_stride|"),
              "the largest offset of ", name);
  require(v.data != nullptr || n == 0, where, name, ".data is null, expected a buffer of ", n, " elements");
}

/// Requires `got == expected`, naming both: "k.seq is 7, expected 9 (v.seq)".
inline void check_equal(char const* where, char const* what, index_t got, index_t expected,
                        char const* expected_what) {
  require(got == expected, where, what, " is ", got, ", expected ", expected, " (", expected_what,
          ")");
}

}  // namespace detail
}  // namespace posenc
