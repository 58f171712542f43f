// SPDX-License-Identifier: MIT
// posenc_lab: train small byte-level language models with every encoding and compare them.
//
//   posenc_lab compare  [--quick] [--out DIR] [--corpus DIR] [--threads N] [--seeds N] [--embedding SETUP]
//                       [--encodings A,B,...] [--quiet]
//   posenc_lab controls [...same options]
//   posenc_lab pictures [...same options]
//   posenc_lab all      [...same options]
//   posenc_lab bench    [--quick] [--encoding NAME] [--embedding SETUP] [--threads N] [--warmup N] [--steps N] [--corpus DIR]
//   posenc_lab config   [--quick] [--encoding NAME] [--embedding SETUP]
//   posenc_lab study --plan [--steps N] [--budget-minutes M] [--corpus DIR] [--threads N]
// Every command also takes --eigen-threads N (threads of Eigen's products; default 1).
// Long commands print one line per finished run to stderr (--quiet: none).
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
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {
int usage() {
  std::fprintf(stderr,
               "usage: posenc_lab compare|controls|pictures|all [--quick] [--out DIR] [--corpus DIR] [--threads N]\n"
               "                  [--seeds N] [--embedding sqrt_d|unscaled|bert|matched] [--encodings A,B,...] [--quiet]\n"
               "       posenc_lab bench|config [--quick] [--encoding NAME] [--embedding SETUP] [--threads N] [--warmup N]\n"
               "                  [--steps N] [--corpus DIR]\n"
               "       posenc_lab study --plan [--steps N] [--budget-minutes M] [--corpus DIR] [--threads N]\n"
               "       (every command: --eigen-threads N, threads of Eigen's products, default 1)\n");
  return 2;
}

/// The value of option `name` as an integer >= lo; throws std::invalid_argument naming both otherwise.
int parse_int(std::string const& name, std::string const& value, int lo) {
  std::size_t used = 0;
  int v = 0;
  try {
    v = std::stoi(value, &used);
  } catch (std::exception const&) {
    used = 0;
  }
  if (used != value.size() || used == 0 || v < lo)
    throw std::invalid_argument(name + " is \"" + value + "\", expected an integer >= " + std::to_string(lo));
  return v;
}

/// "a,b,c" as {"a", "b", "c"}.
std::vector<std::string> split_list(std::string const& s) {
  std::vector<std::string> out;
  std::size_t start = 0;
  for (std::size_t i = 0; i <= s.size(); ++i)
    if (i == s.size() || s[i] == ',') {
      out.push_back(s.substr(start, i - start));
      start = i + 1;
    }
  return out;
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage();
  std::string const cmd = argv[1];
  lab::experiment_options o;
  std::string encoding = "rope";
  int warmup = 20, steps = 200, eigen_threads = 1;
  bool quiet = false, plan = false, steps_given = false;
  int budget_minutes = 60;
  try {
    for (int i = 2; i < argc; ++i) {
      std::string a = argv[i];
      bool has_value = i + 1 < argc;
      if (a == "--quick") o.quick = true;
      else if (a == "--quiet") quiet = true;
      else if (a == "--plan") plan = true;
      else if (a == "--budget-minutes" && has_value) budget_minutes = parse_int(a, argv[++i], 1);
      else if (a == "--out" && has_value) o.out = argv[++i];
      else if (a == "--corpus" && has_value) o.corpus_dir = argv[++i];
      else if (a == "--threads" && has_value) o.threads = parse_int(a, argv[++i], 1);
      else if (a == "--seeds" && has_value) o.seeds = parse_int(a, argv[++i], 1);
      else if (a == "--embedding" && has_value) o.embedding = lab::parse_embedding_setup(argv[++i]);
      else if (a == "--encodings" && has_value) o.encodings = split_list(argv[++i]);
      else if (a == "--encoding" && has_value) encoding = argv[++i];
      else if (a == "--warmup" && has_value) warmup = parse_int(a, argv[++i], 0);
      else if (a == "--steps" && has_value) {
        steps = parse_int(a, argv[++i], 0);
        steps_given = true;
      }
      else if (a == "--eigen-threads" && has_value) eigen_threads = parse_int(a, argv[++i], 1);
      else return usage();
    }
  } catch (std::exception const& e) {
    std::fprintf(stderr, "posenc_lab: %s\n", e.what());
    return 2;
  }
  if (!quiet) o.log = &std::cerr;
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
    if (cmd == "study") {
      if (!plan) {
        std::fprintf(stderr, "posenc_lab: study runs only with --plan (the plan and its checks); its training runs are not part of the lab yet\n");
        return 2;
      }
      lab::run_study_plan(o, steps_given ? steps : 0, budget_minutes);
    }
    if (cmd != "compare" && cmd != "controls" && cmd != "pictures" && cmd != "all" && cmd != "bench" && cmd != "config" &&
        cmd != "study")
      return usage();
  } catch (std::exception const& e) {
    std::fprintf(stderr, "posenc_lab: %s\n", e.what());
    return 1;
  }
  return 0;
}
