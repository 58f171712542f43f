// SPDX-License-Identifier: MIT
// Replaces the global operator new/delete of one test executable to count allocations while asked to.
#pragma once
// Include in ONE translation unit of an executable (the replacements are
// global definitions). While `g_counting` is true, every operator new adds
// one to `g_allocations`, its size to `g_bytes` and keeps the largest size in
// `g_largest`: the tests prove with it that a kernel allocates nothing that
// grows with the problem, or nothing at all once warm.

#include <atomic>
#include <cstdlib>
#include <new>

namespace posenc_test {

inline std::atomic<bool> g_counting{false};
inline std::atomic<long long> g_allocations{0};
inline std::atomic<long long> g_bytes{0};
inline std::atomic<long long> g_largest{0};
/// While counting: the allocation that finds `g_allocations` equal to this
/// number throws std::bad_alloc (-1: none), so that a test can fail each
/// allocation of a call in turn and check what the call left behind.
inline std::atomic<long long> g_fail_at{-1};

/// Sets every counter to zero (call before turning counting on).
inline void reset_allocation_counters() noexcept {
  g_allocations = 0;
  g_bytes = 0;
  g_largest = 0;
}

namespace counting_new_detail {
// Counts one allocation; true when it is the one to fail.
inline bool note(std::size_t n) noexcept {
  if (!g_counting.load(std::memory_order_relaxed)) return false;
  bool const fail = g_allocations++ == g_fail_at.load();
  g_bytes += static_cast<long long>(n);
  long long prev = g_largest.load();
  while (static_cast<long long>(n) > prev && !g_largest.compare_exchange_weak(prev, static_cast<long long>(n))) {
  }
  return fail;
}
// Out of line so that the compiler does not pair a visible malloc with delete.
__attribute__((noinline)) inline void release(void* p) noexcept { std::free(p); }
}  // namespace counting_new_detail

}  // namespace posenc_test

// The replacements pair malloc with free; AddressSanitizer's own new/delete
// bookkeeping would call that a mismatch.
#if defined(__SANITIZE_ADDRESS__)
#define POSENC_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define POSENC_TEST_ASAN 1
#endif
#endif
#ifdef POSENC_TEST_ASAN
extern "C" const char* __asan_default_options() { return "alloc_dealloc_mismatch=0"; }
#endif

void* operator new(std::size_t n) {
  if (posenc_test::counting_new_detail::note(n)) throw std::bad_alloc();
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return operator new(n); }
void* operator new(std::size_t n, std::align_val_t a) {
  if (posenc_test::counting_new_detail::note(n)) throw std::bad_alloc();
  std::size_t const al = static_cast<std::size_t>(a);
  if (void* p = std::aligned_alloc(al, (n + al - 1) / al * al)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n, std::align_val_t a) { return operator new(n, a); }
void operator delete(void* p) noexcept { posenc_test::counting_new_detail::release(p); }
void operator delete[](void* p) noexcept { posenc_test::counting_new_detail::release(p); }
void operator delete(void* p, std::size_t) noexcept { posenc_test::counting_new_detail::release(p); }
void operator delete[](void* p, std::size_t) noexcept { posenc_test::counting_new_detail::release(p); }
void operator delete(void* p, std::align_val_t) noexcept { posenc_test::counting_new_detail::release(p); }
void operator delete[](void* p, std::align_val_t) noexcept { posenc_test::counting_new_detail::release(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { posenc_test::counting_new_detail::release(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { posenc_test::counting_new_detail::release(p); }
