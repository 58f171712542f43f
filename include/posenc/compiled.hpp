// SPDX-License-Identifier: MIT
// posenc::compiled, the compiled mode: a static library holding the common fused kernels
// (compiled/list.hpp). Link the CMake target posenc::compiled and every call of the list runs
// the library's kernel instead of compiling it; other calls compile header-only as before.
// On x86-64 the library holds each kernel for several instruction sets and runs the best one
// the CPU has (docs/integration.md, "Compiled mode").
#pragma once

#include <string>
#include <vector>

namespace posenc::compiled {

/// The instruction set whose kernels the library runs now: "sse2", "avx2", "avx512" or
/// "avx512_bf16" (x86-64 with dispatch; "avx512_bf16" runs the bfloat16 product mode with
/// AVX-512 BF16 and the rest as "avx512"), or the one xsimd name the library was built for
/// (without dispatch). Chosen at the first call: the environment variable POSENC_ISA when
/// set, else the best the CPU runs. Throws posenc::error when POSENC_ISA names a level that
/// is unknown or that the CPU lacks (naming both).
std::string isa();

/// The xsimd architecture of the kernels isa() runs (posenc::simd::arch_name() of their build):
/// "sse2", "fma3+avx2", "avx512bw", ...
std::string arch();

/// The levels isa() can be, lowest first: those the library holds and the CPU runs.
std::vector<std::string> isas();

/// Runs the library's kernels of `level` from now on (one of isas(); "best": the last of
/// them). Throws posenc::error naming the level and the CPU's best otherwise. Not for calls
/// running at the same time on other threads.
void set_isa(std::string const& level);

}  // namespace posenc::compiled
