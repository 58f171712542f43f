// SPDX-License-Identifier: MIT
// posenc::compiled: the forward entries of POSENC_COMPILED_FORWARD (compiled/list.hpp).
#include "entry.hpp"

namespace posenc::detail::compiled_kernels::entry {
POSENC_COMPILED_FORWARD(POSENC_COMPILED_DEFINE_ENTRY)
}  // namespace posenc::detail::compiled_kernels::entry
