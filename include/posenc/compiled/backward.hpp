// SPDX-License-Identifier: MIT
// The backward kernels posenc::compiled holds: their declarations, and which calls reach
// them. Included by attention/backward/fused.hpp where POSENC_COMPILED is defined.
#pragma once

#include "posenc/attention/backward/plan.hpp"
#include "posenc/attention/plan.hpp"
#include "posenc/compiled/check.hpp"
#include "posenc/compiled/list.hpp"
#include "posenc/encoding/traits.hpp"

namespace posenc::detail::compiled_kernels {

/// True for the (compute type, encoder) whose fused backward kernel the library holds.
template <class T, class E>
inline constexpr bool has_backward = false;

#define POSENC_COMPILED_X(T, E)                                                                 \
  template <>                                                                                   \
  inline constexpr bool has_backward<T, E> = true;                                              \
  void backward(attention_plan<T> const& p, backward_views<T> const& io, E const& enc,           \
                encoder_gradients_t<E>& grads);
POSENC_COMPILED_BACKWARD(POSENC_COMPILED_X)
#undef POSENC_COMPILED_X

/// The library's backward entries (see compiled/forward.hpp).
namespace entry {
#define POSENC_COMPILED_X(T, E)                                                                        \
  void attention_backward_call(view<const T> q, view<const T> k, view<const T> v, view<const T> out,   \
                               view<const T> dout, view<T> dq, view<T> dk, view<T> dv, E const& enc,   \
                               attention_options<T> const& opt, encoder_gradients_t<E>& grads,        \
                               half_masks const& masks16);
POSENC_COMPILED_BACKWARD(POSENC_COMPILED_X)
#undef POSENC_COMPILED_X
}  // namespace entry

}  // namespace posenc::detail::compiled_kernels
