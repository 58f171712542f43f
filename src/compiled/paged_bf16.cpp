// SPDX-License-Identifier: MIT
// posenc::compiled: the paged kernels of POSENC_COMPILED_PAGED_BF16 (compiled/list.hpp).
#include "kernels.hpp"

namespace POSENC_COMPILED_NAMESPACE {
POSENC_COMPILED_PAGED_BF16(POSENC_COMPILED_DEFINE_PAGED)
}  // namespace POSENC_COMPILED_NAMESPACE
