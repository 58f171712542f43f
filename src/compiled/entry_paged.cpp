// SPDX-License-Identifier: MIT
// posenc::compiled: the paged entries of POSENC_COMPILED_PAGED_CALLS (compiled/list.hpp).
#include "entry.hpp"

namespace POSENC_COMPILED_ENTRY_NAMESPACE {
POSENC_COMPILED_PAGED_CALLS(POSENC_COMPILED_DEFINE_PAGED_ENTRY)
}  // namespace POSENC_COMPILED_ENTRY_NAMESPACE
