// SPDX-License-Identifier: MIT
// The forward (contiguous) kernels posenc::compiled holds: their declarations, and which
// calls reach them. Included by attention/fused.hpp where POSENC_COMPILED is defined.
#pragma once

#include "posenc/attention/plan.hpp"
#include "posenc/compiled/check.hpp"
#include "posenc/compiled/list.hpp"
#include "posenc/core/view.hpp"

namespace posenc::detail::compiled_kernels {

// has_forward (declared in attention/plan.hpp, false) is true for the types below.
#define POSENC_COMPILED_X(Q, KV, O, E)                                                                    \
  template <>                                                                                             \
  inline constexpr bool has_forward<Q, KV, O, E> = true;                                                  \
  void forward(attention_plan<float> const& p, view<const Q> q, view<const KV> k, view<const KV> v, view<O> out, \
               E const& enc, rotation_ids const* rot);
POSENC_COMPILED_FORWARD(POSENC_COMPILED_X)
#undef POSENC_COMPILED_X

/// The library's entries: a listed call whole (validation, plan, rotation, kernel call),
/// src/compiled/entry.hpp. With dispatch they are built for the baseline instruction set in an
/// object of their own (cmake/posenc_isolate.sh): no inline function they compile is one the
/// consumer's translation units share.
namespace entry {
#define POSENC_COMPILED_X(Q, KV, O, E)                                                                \
  void attention_call(view<const Q> q, view<const KV> k, view<const KV> v, view<O> out, E const& enc, \
                      attention_options<float> const& opt, half_masks const& masks16);
POSENC_COMPILED_FORWARD(POSENC_COMPILED_X)
#undef POSENC_COMPILED_X
}  // namespace entry

}  // namespace posenc::detail::compiled_kernels
