// SPDX-License-Identifier: MIT
// posenc::compiled: the forward entries of POSENC_COMPILED_FORWARD (compiled/list.hpp).
#include "entry.hpp"

namespace POSENC_COMPILED_ENTRY_NAMESPACE {
POSENC_COMPILED_FORWARD(POSENC_COMPILED_DEFINE_ENTRY)
}  // namespace POSENC_COMPILED_ENTRY_NAMESPACE
