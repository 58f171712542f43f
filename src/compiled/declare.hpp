// SPDX-License-Identifier: MIT
// posenc::compiled with dispatch: declarations of one level's kernels (namespace
// posenc::detail::compiled_kernels::<level>), for the dispatcher and for the avx512_bf16
// level, which hands the calls it does not run to the avx512 level.
#pragma once

#include "posenc/attention/backward/plan.hpp"
#include "posenc/attention/fused/paged_rows.hpp"
#include "posenc/attention/options.hpp"
#include "posenc/attention/paged_kv_cache.hpp"
#include "posenc/attention/plan.hpp"
#include "posenc/compiled/list.hpp"

#define POSENC_COMPILED_DECLARE_FORWARD(Q, KV, O, E)                                                    \
  void forward(attention_plan<float> const& p, view<const Q> q, view<const KV> k, view<const KV> v,     \
               view<O> out, E const& enc, rotation_ids const* rot);
#define POSENC_COMPILED_DECLARE_PAGED(S, Q, O, E)                                                        \
  void paged(bool lanes, fused::paged_work<float, S>& w, index_t entries, view<const Q> q, view<O> out,  \
             E const& enc, rotation_ids const* rots, fused::paged_strides const& ps, int threads);
#define POSENC_COMPILED_DECLARE_BACKWARD(T, E)                                                         \
  void backward(attention_plan<T> const& p, backward_views<T> const& io, E const& enc,                 \
                encoder_gradients_t<E>& grads);

#define POSENC_COMPILED_DECLARE_ENTRY(Q, KV, O, E)                                                      \
  void attention_call(view<const Q> q, view<const KV> k, view<const KV> v, view<O> out, E const& enc,   \
                      attention_options<float> const& opt, half_masks const& masks16);
#define POSENC_COMPILED_DECLARE_BACKWARD_ENTRY(T, E)                                                    \
  void attention_backward_call(view<const T> q, view<const T> k, view<const T> v, view<const T> out,   \
                               view<const T> dout, view<T> dq, view<T> dk, view<T> dv, E const& enc,   \
                               attention_options<T> const& opt, encoder_gradients_t<E>& grads,        \
                               half_masks const& masks16);
#define POSENC_COMPILED_DECLARE_PAGED_ENTRY(S, Q, E)                                                    \
  void paged_attention_call(view<const Q> q, paged_kv_cache<S> const& cache, span<const index_t> seq_ids, \
                            view<Q> out, E const& enc, attention_options<float> const& opt,             \
                            half_masks const& masks16, fused::paged_work<float, S>& work);

/// Namespace posenc::detail::compiled_kernels::L with every kernel and entry of level L.
#define POSENC_COMPILED_DECLARE_LEVEL(L)                            \
  namespace L {                                                     \
  POSENC_COMPILED_FORWARD(POSENC_COMPILED_DECLARE_FORWARD)            \
  POSENC_COMPILED_PAGED(POSENC_COMPILED_DECLARE_PAGED)                \
  POSENC_COMPILED_BACKWARD(POSENC_COMPILED_DECLARE_BACKWARD)          \
  POSENC_COMPILED_FORWARD(POSENC_COMPILED_DECLARE_ENTRY)              \
  POSENC_COMPILED_BACKWARD(POSENC_COMPILED_DECLARE_BACKWARD_ENTRY)    \
  POSENC_COMPILED_PAGED_CALLS(POSENC_COMPILED_DECLARE_PAGED_ENTRY)    \
  index_t lane_min_rows();                                 \
  char const* arch();                                      \
  }
