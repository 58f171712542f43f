// SPDX-License-Identifier: MIT
// posenc::compiled: the paged entries of POSENC_COMPILED_PAGED_CALLS (compiled/list.hpp).
#include "entry.hpp"

namespace posenc::detail::compiled_kernels::entry {
POSENC_COMPILED_PAGED_CALLS(POSENC_COMPILED_DEFINE_PAGED_ENTRY)
}  // namespace posenc::detail::compiled_kernels::entry
