// SPDX-License-Identifier: MIT
// A (batch, seq, heads, dim) view over a gapped, offset buffer of random values, for the rotation tests.
#pragma once

#include <posenc/core/half.hpp>
#include <posenc/core/view.hpp>

#include <cstdint>
#include <vector>

#include "support/random.hpp"

namespace posenc_test {

/// A (batch, seq, heads, dim) view over a buffer with gaps between heads,
/// tokens and batch entries, starting `offset` elements in (misaligned). The
/// gaps hold values too: a rotation must leave them as they are. Values are
/// random: drawn in T for float and double, drawn in float and rounded once
/// for a 16-bit type.
template <class T>
struct strided_buffer {
  std::vector<T> buf;
  posenc::view<T> v;
  strided_buffer(posenc::index_t batch, posenc::index_t seq, posenc::index_t heads, posenc::index_t dim,
                 posenc::index_t offset, std::uint64_t seed, posenc::index_t head_gap = 3, posenc::index_t seq_gap = 5,
                 posenc::index_t batch_gap = 7) {
    posenc::index_t const hs = dim + head_gap, ss = heads * hs + seq_gap, bs = seq * ss + batch_gap;
    auto const n = static_cast<std::size_t>(offset + batch * bs + 1);
    if constexpr (posenc::is_half_storage_v<T>) {
      std::vector<float> const f = random_vector<float>(n, seed);
      buf.resize(n);
      for (std::size_t i = 0; i < n; ++i) buf[i] = posenc::detail::to_storage<T>(f[i]);
    } else {
      buf = random_vector<T>(n, seed);
    }
    v = {buf.data() + offset, batch, seq, heads, dim, bs, ss, hs, 1};
  }
  /// The same layout over another element type, with values converted by `conv`.
  template <class U, class Conv>
  strided_buffer(strided_buffer<U> const& o, Conv conv) : buf(o.buf.size()), v() {
    for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = conv(o.buf[i]);
    v = {buf.data() + (o.v.data - o.buf.data()), o.v.batch, o.v.seq, o.v.heads, o.v.dim,
         o.v.batch_stride, o.v.seq_stride, o.v.head_stride, 1};
  }
  strided_buffer(strided_buffer const& o) : buf(o.buf), v(o.v) { v.data = buf.data() + (o.v.data - o.buf.data()); }
};

/// The raw bits of a 16-bit value.
template <class S>
std::uint16_t bits(S x) {
  return Eigen::numext::bit_cast<std::uint16_t>(x);
}

/// A 16-bit value widened (exactly) to float.
template <class S>
float widen(S x) {
  return posenc::detail::stored_value<float>(x);
}

}  // namespace posenc_test
