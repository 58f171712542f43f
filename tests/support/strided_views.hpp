// SPDX-License-Identifier: MIT
// The tests' strided attention problems: a shape and the BSHD / BHSD views over padded, offset buffers.
#pragma once

#include <posenc/core/view.hpp>

namespace posenc_test {

using posenc::index_t;

/// Shapes of one case; buffers are BSHD (or BHSD) with `pad` elements after
/// every row and a leading `offset` (strided, misaligned views).
struct shape {
  index_t B = 1, Sq = 1, Sk = 1, Hq = 1, Hkv = 1, D = 8, Dv = 8;
  index_t pad = 0, offset = 0;
  bool bhsd = false;
};

/// Elements a buffer of (B, seq, heads, dim) needs under `s`'s layout: the
/// pad after every row and after every token or head block, in every batch
/// entry, the leading offset, and 8 spare elements.
inline index_t strided_extent(shape const& s, index_t seq, index_t heads, index_t dim) {
  return s.offset + s.B * (seq * heads * (dim + s.pad) + (seq + heads) * s.pad) + 8;
}

/// The (B, seq, heads, dim) view of `data` under `s`'s layout.
template <class U>
posenc::view<U> strided_view(shape const& s, U* data, index_t seq, index_t heads, index_t dim) {
  index_t const hs = dim + s.pad;
  posenc::view<U> x;
  x.data = data + s.offset;
  x.batch = s.B;
  x.seq = seq;
  x.heads = heads;
  x.dim = dim;
  if (s.bhsd) {
    x.seq_stride = hs;
    x.head_stride = seq * hs + s.pad;
    x.batch_stride = heads * x.head_stride;
  } else {
    x.head_stride = hs;
    x.seq_stride = heads * hs + s.pad;
    x.batch_stride = seq * x.seq_stride;
  }
  return x;
}

}  // namespace posenc_test
