// SPDX-License-Identifier: MIT
// posenc::compiled: the backward kernels of POSENC_COMPILED_BACKWARD (compiled/list.hpp).
#include "kernels.hpp"

namespace POSENC_COMPILED_NAMESPACE {
POSENC_COMPILED_BACKWARD(POSENC_COMPILED_DEFINE_BACKWARD)
}  // namespace POSENC_COMPILED_NAMESPACE
