// SPDX-License-Identifier: MIT
// posenc::compiled: the backward entries of POSENC_COMPILED_BACKWARD (compiled/list.hpp).
#include "entry.hpp"

namespace posenc::detail::compiled_kernels::entry {
POSENC_COMPILED_BACKWARD(POSENC_COMPILED_DEFINE_BACKWARD_ENTRY)
}  // namespace posenc::detail::compiled_kernels::entry
