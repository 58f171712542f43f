// SPDX-License-Identifier: MIT
// The paged kernels posenc::compiled holds: their declarations, and which calls reach them.
// Included by attention/fused/paged.hpp where POSENC_COMPILED is defined.
#pragma once

#include "posenc/attention/fused/paged_rows.hpp"
#include "posenc/attention/plan.hpp"
#include "posenc/compiled/check.hpp"
#include "posenc/compiled/list.hpp"
#include "posenc/core/view.hpp"

namespace posenc::detail::compiled_kernels {

/// True for the (page storage, q, out, encoder) types whose paged kernels the library holds.
template <class S, class Q, class O, class E>
inline constexpr bool has_paged = false;

/// `lanes`: the lane kernel over one chunk per entry (run_paged_lanes), else the row walk
/// (run_paged).
#define POSENC_COMPILED_X(S, Q, O, E)                                                                \
  template <>                                                                                        \
  inline constexpr bool has_paged<S, Q, O, E> = true;                                                \
  void paged(bool lanes, fused::paged_work<float, S>& w, index_t entries, view<const Q> q, view<O> out, \
             E const& enc, rotation_ids const* rots, fused::paged_strides const& ps, int threads);
POSENC_COMPILED_PAGED(POSENC_COMPILED_X)
#undef POSENC_COMPILED_X

/// Rows per (batch, kv head) from which the library's paged lane kernel runs: the SIMD width
/// of the instruction set it runs now.
index_t lane_min_rows();

}  // namespace posenc::detail::compiled_kernels
