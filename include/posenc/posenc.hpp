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

#include "posenc/encoding/absolute_common.hpp"
#include "posenc/encoding/alibi.hpp"
#include "posenc/encoding/bias_kernels.hpp"
#include "posenc/encoding/clipped_bias.hpp"
#include "posenc/encoding/compose.hpp"
#include "posenc/encoding/learned.hpp"
#include "posenc/encoding/none.hpp"
#include "posenc/encoding/rope.hpp"
#include "posenc/encoding/rope_scaling.hpp"
#include "posenc/encoding/shaw.hpp"
#include "posenc/encoding/sinusoidal.hpp"
#include "posenc/encoding/t5_bias.hpp"
#include "posenc/encoding/traits.hpp"

#include "posenc/attention/attention.hpp"
#include "posenc/attention/kv_cache.hpp"
#include "posenc/attention/materialized.hpp"
#include "posenc/attention/multi_head.hpp"
#include "posenc/attention/options.hpp"
#include "posenc/attention/plan.hpp"
#include "posenc/attention/reference.hpp"
