// SPDX-License-Identifier: MIT
// posenc::compiled: the paged kernels of POSENC_COMPILED_PAGED_HALF (compiled/list.hpp).
#include "kernels.hpp"

namespace POSENC_COMPILED_NAMESPACE {
POSENC_COMPILED_PAGED_HALF(POSENC_COMPILED_DEFINE_PAGED)
}  // namespace POSENC_COMPILED_NAMESPACE
