// SPDX-License-Identifier: MIT
// The in-run baselines alone: memcpy, streaming read-modify-write, GEMM, FMA peak.
#include "support/baselines.hpp"

int main(int argc, char** argv) {
  posenc_bench::register_fma_peak();
  posenc_bench::register_memcpy("64MiB", 64ll << 20);
  posenc_bench::register_stream("64MiB", 64ll << 20);
  posenc_bench::register_gemm("512x512x512", 512, 512, 512);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
