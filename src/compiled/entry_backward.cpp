// SPDX-License-Identifier: MIT
// posenc::compiled: the backward entries of POSENC_COMPILED_BACKWARD (compiled/list.hpp).
#include "entry.hpp"

namespace POSENC_COMPILED_ENTRY_NAMESPACE {
POSENC_COMPILED_BACKWARD(POSENC_COMPILED_DEFINE_BACKWARD_ENTRY)
}  // namespace POSENC_COMPILED_ENTRY_NAMESPACE
