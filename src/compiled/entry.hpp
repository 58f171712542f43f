// SPDX-License-Identifier: MIT
// posenc::compiled: the entries of its calls (compiled/list.hpp, namespace
// posenc::detail::compiled_kernels::entry), which a consumer's run_attention,
// run_attention_backward and paged_attention call instead of compiling them. Built with
// POSENC_COMPILED=1, as its consumers are: an entry validates, plans and rotates here, and its
// kernel call routes to the library's kernels (kernel<path::fused>::run,
// backward_kernel<path::fused>::run, fused::paged_kernel), every one of which must be in the
// lists (tests/compiled/entries_call_levels.cmake). With dispatch the entries are built without
// -march, as one isolated object (cmake/posenc_isolate.sh, level "entry"): the inline functions
// they compile for the baseline instruction set are theirs alone, never the ones of a consumer
// built with other flags (sharing them would let a function built for one vector width run
// with buffers sized for another). posenc::error is thrown from here as from a consumer's own
// call (a catch matches the type by name).
#pragma once

#if !POSENC_COMPILED
#error "posenc::compiled's entries are built with POSENC_COMPILED=1"
#endif

#include "posenc/attention/attention.hpp"
#include "posenc/attention/backward.hpp"
#include "posenc/attention/paged_attention.hpp"
#include "posenc/compiled/list.hpp"

#define POSENC_COMPILED_DEFINE_ENTRY(Q, KV, O, E)                                                        \
  void attention_call(view<const Q> q, view<const KV> k, view<const KV> v, view<O> out, E const& enc,     \
                      attention_options<float> const& opt, half_masks const& masks16) {                   \
    run_attention_here<path::fused, false>(q, k, v, out, enc, opt, masks16);                             \
  }

#define POSENC_COMPILED_DEFINE_BACKWARD_ENTRY(T, E)                                                      \
  void attention_backward_call(view<const T> q, view<const T> k, view<const T> v, view<const T> out,     \
                               view<const T> dout, view<T> dq, view<T> dk, view<T> dv, E const& enc,     \
                               attention_options<T> const& opt, encoder_gradients_t<E>& grads,          \
                               half_masks const& masks16) {                                             \
    run_attention_backward_here<path::fused>(q, k, v, out, dout, dq, dk, dv, enc, opt, grads, masks16); \
  }

#define POSENC_COMPILED_DEFINE_PAGED_ENTRY(S, Q, E)                                                     \
  void paged_attention_call(view<const Q> q, paged_kv_cache<S> const& cache, span<const index_t> seq_ids, \
                            view<Q> out, E const& enc, attention_options<float> const& opt,             \
                            half_masks const& masks16, fused::paged_work<float, S>& work) {             \
    paged_attention_here<path::fused>(q, cache, seq_ids, out, enc, opt, masks16, work);                  \
  }
