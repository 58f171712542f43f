// SPDX-License-Identifier: MIT
// posenc::compiled: what an instruction set's build of the kernels tells the dispatcher.
#include "kernels.hpp"

namespace POSENC_COMPILED_NAMESPACE {

/// Rows per (batch, kv head) from which the lane kernel runs (the paged call's choice).
index_t lane_min_rows() { return fused_default_traits<float>::lane_kernel_min_rows_v; }

/// The xsimd architecture these kernels are built for.
char const* arch() { return simd::arch_name(); }

}  // namespace POSENC_COMPILED_NAMESPACE
