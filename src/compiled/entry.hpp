// SPDX-License-Identifier: MIT
// posenc::compiled: the entries of its calls (compiled/list.hpp), which a consumer's
// run_attention, run_attention_backward and paged_attention call instead of compiling them.
// Built with POSENC_COMPILED=1, as its consumers are: an entry validates, plans and rotates,
// and its kernel call routes to the library's kernels (kernel<path::fused>::run,
// backward_kernel<path::fused>::run, fused::paged_kernel), every one of which must be in the
// lists (tests/compiled/entries_call_levels.cmake). With dispatch each level builds the
// entries beside its kernels (namespace compiled_kernels::<level>, isolated with them by
// cmake/posenc_isolate.sh), so RoPE's rotations run at the CPU's level too, and
// src/compiled/dispatch.cpp defines the entries consumers call (compiled_kernels::entry) by
// calling the active level's; without dispatch they are defined here, in compiled_kernels::entry.
// posenc::error thrown from a level's build is caught as any other (a catch matches the type by
// its name).
#pragma once

#if !POSENC_COMPILED
#error "posenc::compiled's entries are built with POSENC_COMPILED=1"
#endif

#include "posenc/attention/attention.hpp"
#include "posenc/attention/backward.hpp"
#include "posenc/attention/paged_attention.hpp"
#include "posenc/compiled/list.hpp"

#ifdef POSENC_COMPILED_LEVEL
#define POSENC_COMPILED_ENTRY_NAMESPACE posenc::detail::compiled_kernels::POSENC_COMPILED_LEVEL
#else
#define POSENC_COMPILED_ENTRY_NAMESPACE posenc::detail::compiled_kernels::entry
#endif

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
