// SPDX-License-Identifier: MIT
// posenc::compiled: the definitions of the kernels it holds (compiled/list.hpp), one source
// file per list. Built without POSENC_COMPILED (these are the header-only kernels, compiled
// once) and with POSENC_BF16_PRODUCTS=1 (the bfloat16 product mode is in the library).
#pragma once

#if POSENC_COMPILED
#error "posenc::compiled's own sources are built without POSENC_COMPILED"
#endif

#include "posenc/attention/backward/fused.hpp"
#include "posenc/attention/fused.hpp"
#include "posenc/attention/fused/paged.hpp"
#include "posenc/compiled/list.hpp"

// These sources call only functions whose bodies do not depend on POSENC_COMPILED
// (fused_attention, fused_attention_backward, run_paged_kernel), never the entries that
// route a consumer's call here (kernel<path::fused>::run, backward_kernel<path::fused>::run,
// fused::paged_kernel): without dispatch this build and its consumers share inline symbols,
// and an entry instantiated on both sides would have two bodies, one calling back here.

// With dispatch (POSENC_COMPILED_LEVEL set to the level's name), each instruction set's build
// of these sources defines its kernels in a namespace of its own, which src/compiled/dispatch.cpp
// calls; without, they are the declared ones.
#ifdef POSENC_COMPILED_LEVEL
#define POSENC_COMPILED_NAMESPACE posenc::detail::compiled_kernels::POSENC_COMPILED_LEVEL
#else
#define POSENC_COMPILED_NAMESPACE posenc::detail::compiled_kernels
#endif

#if POSENC_COMPILED_BF16_LEVEL
// The avx512_bf16 level runs the bfloat16 product mode's lane kernel with AVX-512 BF16 and
// hands every other call (the row kernel computes in float) to the avx512 level's kernel: its
// build holds nothing else.
#include "declare.hpp"
namespace posenc::detail::compiled_kernels {
POSENC_COMPILED_DECLARE_LEVEL(avx512)
}  // namespace posenc::detail::compiled_kernels
#define POSENC_COMPILED_DEFINE_FORWARD(Q, KV, O, E)                                                     \
  void forward(attention_plan<float> const& p, view<const Q> q, view<const KV> k, view<const KV> v,     \
               view<O> out, E const& enc, rotation_ids const* rot) {                                    \
    using Tr = fused_default_traits<float>;                                                             \
    if (p.products == product_precision::bfloat16 && takes_lane_kernel<Tr, E>(p)) {                     \
      fused::run_lane_kernel<fused::bf16_product_traits<Tr>>(p, q, k, v, out, enc, rot);                \
      return;                                                                                           \
    }                                                                                                   \
    avx512::forward(p, q, k, v, out, enc, rot);                                                         \
  }
#else
#define POSENC_COMPILED_DEFINE_FORWARD(Q, KV, O, E)                                                     \
  void forward(attention_plan<float> const& p, view<const Q> q, view<const KV> k, view<const KV> v,     \
               view<O> out, E const& enc, rotation_ids const* rot) {                                    \
    fused_attention<fused_default_traits<float>>(p, q, k, v, out, enc, rot);                            \
  }
#endif

#define POSENC_COMPILED_DEFINE_PAGED(S, Q, O, E)                                                         \
  void paged(bool lanes, fused::paged_work<float, S>& w, index_t entries, view<const Q> q, view<O> out,  \
             E const& enc, rotation_ids const* rots, fused::paged_strides const& ps, int threads) {        \
    fused::run_paged_kernel(lanes, w, entries, q, out, enc, rots, ps, threads);                          \
  }

#define POSENC_COMPILED_DEFINE_BACKWARD(T, E)                                                          \
  void backward(attention_plan<T> const& p, backward_views<T> const& io, E const& enc,                 \
                encoder_gradients_t<E>& grads) {                                                       \
    fused_backward::fused_attention_backward(p, io, enc, grads);                                       \
  }
