// SPDX-License-Identifier: MIT
// Which kernel path::fused runs a paged or cached call on, for the tests whose bit-for-bit
// claims hold on one kernel only.
//
// The row kernel runs below a SIMD width of query rows per (batch, kv head) (queries x group:
// 16 floats with AVX-512, 8 with AVX2, 4 with SSE2 and NEON; half as many doubles); the lane
// kernel from there. The row kernel walks the keys in the same steps whatever their layout
// (pages, runs, a contiguous cache), so its results agree bit for bit across layouts; the lane
// kernel lays its key tiles from each run of consecutive pages, so a layout with other runs
// (another page size, a compaction, a truncation) gives other tiles and may change the last
// bits. Which kernel a given call takes depends on the instruction set: a test that assumes a
// width (a 3-query call is a row-kernel call only where 6 rows are below the width) is wrong on
// a narrower one, so the tests ask here.
#pragma once

#include <posenc/attention/paged_attention.hpp>
#include <posenc/encoding/none.hpp>

namespace posenc_test {

/// Whether a paged call (compute type T, pages of S, output O, encoder E) with `rows` query
/// rows per (entry, kv head) runs the row kernel (posenc::compiled's choice where it holds the
/// kernel; relative key or value terms, Shaw's, always run it).
template <class T, class S = T, class O = T, class E = posenc::none>
bool paged_row_kernel(posenc::index_t rows) {
  return posenc::encoder_traits<E>::relative_key_value ||
         rows < posenc::detail::fused::paged_lane_min_rows<T, S, O, E>();
}

}  // namespace posenc_test
