// SPDX-License-Identifier: MIT
// parallel_for over an index range: OpenMP when the build enables it, serial otherwise.
#pragma once

#include <exception>

#include "posenc/core/span.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace posenc {

/// True when the library was compiled with OpenMP.
inline constexpr bool has_openmp() noexcept {
#ifdef _OPENMP
  return true;
#else
  return false;
#endif
}

/// Threads a call with `threads == 0` uses: OpenMP's default, or 1.
inline int default_threads() noexcept {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

/// Clamps a requested thread count (0 = default) to [1, default_threads()].
inline int resolve_threads(int requested) noexcept {
  int const avail = default_threads();
  if (requested <= 0) return avail;
  return requested < avail ? requested : avail;
}

/// Threads a parallel_for asked for `requested` threads runs on from here:
/// resolve_threads(requested), or 1 inside another parallel region.
inline int loop_threads(int requested) noexcept {
#ifdef _OPENMP
  if (omp_in_parallel()) return 1;
#endif
  return resolve_threads(requested);
}

/// Calls f(i) for i in [0, n) on up to `threads` threads (0 = default),
/// dynamic scheduling; serially when called inside another parallel region
/// (see loop_threads). f must not throw (kernels are noexcept; arguments are
/// validated before the loop).
template <class F>
void parallel_for(index_t n, int threads, F&& f) {
  if (n <= 0) return;
  int const t = loop_threads(threads);
#ifdef _OPENMP
  if (t > 1 && n > 1) {
#pragma omp parallel for num_threads(t) schedule(dynamic, 1)
    for (index_t i = 0; i < n; ++i) f(i);
    return;
  }
#endif
  (void)t;
  for (index_t i = 0; i < n; ++i) f(i);
}

/// Index of the calling thread inside parallel_for (0 when serial).
inline int thread_index() noexcept {
#ifdef _OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}

}  // namespace posenc
