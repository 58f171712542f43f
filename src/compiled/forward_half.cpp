// SPDX-License-Identifier: MIT
// posenc::compiled: the forward kernels of POSENC_COMPILED_FORWARD_HALF (compiled/list.hpp).
#include "kernels.hpp"

namespace POSENC_COMPILED_NAMESPACE {
POSENC_COMPILED_FORWARD_HALF(POSENC_COMPILED_DEFINE_FORWARD)
}  // namespace POSENC_COMPILED_NAMESPACE
