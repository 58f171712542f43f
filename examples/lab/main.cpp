// SPDX-License-Identifier: MIT
// posenc_lab: train small byte-level language models with every encoding and compare them.
//
//   posenc_lab compare  [--quick] [--out DIR] [--corpus DIR] [--threads N]
//   posenc_lab controls [...same options]
//   posenc_lab pictures [...same options]
//   posenc_lab all      [...same options]
//   posenc_lab bench    [--quick] [--encoding NAME] [--threads N] [--warmup N] [--steps N] [--corpus DIR]
//   posenc_lab config   [--quick] [--encoding NAME]
// Every command also takes --eigen-threads N (threads of Eigen's products; default 1).
// Results: DIR/*.md tables and DIR/*.png plots (docs/experiments.md). `bench` prints the model
// configuration and the training step rate as JSON lines (`config`: the configuration only);
// bench/lab_torch.py times the same model in PyTorch from them (docs/performance.md).
#include "experiments.hpp"

#include <Eigen/Core>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

namespace {
int usage() {
  std::fprintf(stderr,
               "usage: posenc_lab compare|controls|pictures|all [--quick] [--out DIR] [--corpus DIR] [--threads N]\n"
               "       posenc_lab bench|config [--quick] [--encoding NAME] [--threads N] [--warmup N] [--steps N] [--corpus DIR]\n"
               "       (every command: --eigen-threads N, threads of Eigen's products, default 1)\n");
  return 2;
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage();
  std::string const cmd = argv[1];
  lab::experiment_options o;
  std::string encoding = "rope";
  int warmup = 20, steps = 200, eigen_threads = 1;
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    bool has_value = i + 1 < argc;
    if (a == "--quick") o.quick = true;
    else if (a == "--out" && has_value) o.out = argv[++i];
    else if (a == "--corpus" && has_value) o.corpus_dir = argv[++i];
    else if (a == "--threads" && has_value) o.threads = std::atoi(argv[++i]);
    else if (a == "--encoding" && has_value) encoding = argv[++i];
    else if (a == "--warmup" && has_value) warmup = std::atoi(argv[++i]);
    else if (a == "--steps" && has_value) steps = std::atoi(argv[++i]);
    else if (a == "--eigen-threads" && has_value) eigen_threads = std::atoi(argv[++i]);
    else return usage();
  }
#if defined(__GLIBC__)
  // Every training step frees and allocates the same large activations: keep freed memory in the
  // heap (no mmap for blocks up to 32 MiB, no trimming) instead of faulting fresh pages in each step.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
#endif
  // The dense products are small: by default Eigen's own threads would only compete with
  // attention's (docs/performance.md measures --eigen-threads 2 against 1).
  Eigen::setNbThreads(eigen_threads < 1 ? 1 : eigen_threads);
  try {
    if (cmd == "compare" || cmd == "all") lab::run_compare(o);
    if (cmd == "controls" || cmd == "all") lab::run_controls(o);
    if (cmd == "pictures" || cmd == "all") lab::run_pictures(o);
    if (cmd == "bench") lab::run_bench(o, encoding, warmup, steps);
    if (cmd == "config") lab::run_bench(o, encoding, 0, 0);
    if (cmd != "compare" && cmd != "controls" && cmd != "pictures" && cmd != "all" && cmd != "bench" && cmd != "config")
      return usage();
  } catch (std::exception const& e) {
    std::fprintf(stderr, "posenc_lab: %s\n", e.what());
    return 1;
  }
  return 0;
}
