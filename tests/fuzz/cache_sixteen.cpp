// SPDX-License-Identifier: MIT
// The cache harness's 16-bit runs (paged_kv_cache<Eigen::half> and <Eigen::bfloat16>, packed calls
// with 16-bit k and v): cache.fuzz.cpp compiled a second time for them alone, a unit of its own
// that builds in parallel with the float one (tests/fuzz/CMakeLists.txt).
#define POSENC_FUZZ_CACHE_SIXTEEN_UNIT 1
#include "cache.fuzz.cpp"
