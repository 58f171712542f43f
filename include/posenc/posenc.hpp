// SPDX-License-Identifier: MIT
// Umbrella header: everything posenc offers.
#pragma once

#include "posenc/core/aligned_buffer.hpp"
#include "posenc/core/error.hpp"
#include "posenc/core/positions.hpp"
#include "posenc/core/simd.hpp"
#include "posenc/core/span.hpp"
#include "posenc/core/threading.hpp"
#include "posenc/core/version.hpp"
#include "posenc/core/view.hpp"

#include "posenc/encoding/compose.hpp"
#include "posenc/encoding/none.hpp"
#include "posenc/encoding/traits.hpp"

#include "posenc/attention/options.hpp"
