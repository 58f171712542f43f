// SPDX-License-Identifier: MIT
// posenc_lab: train small byte-level language models with every encoding and compare them.
//
//   posenc_lab compare  [--quick] [--out DIR] [--corpus DIR] [--threads N]
//   posenc_lab controls [...same options]
//   posenc_lab pictures [...same options]
//   posenc_lab all      [...same options]
// Results: DIR/*.md tables and DIR/*.png plots (docs/experiments.md).
#include "experiments.hpp"

#include <Eigen/Core>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

namespace {
int usage() {
  std::fprintf(stderr, "usage: posenc_lab compare|controls|pictures|all [--quick] [--out DIR] [--corpus DIR] [--threads N]\n");
  return 2;
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage();
  std::string const cmd = argv[1];
  lab::experiment_options o;
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    bool has_value = i + 1 < argc;
    if (a == "--quick") o.quick = true;
    else if (a == "--out" && has_value) o.out = argv[++i];
    else if (a == "--corpus" && has_value) o.corpus_dir = argv[++i];
    else if (a == "--threads" && has_value) o.threads = std::atoi(argv[++i]);
    else return usage();
  }
  // The dense products are small: Eigen's own threads would only compete with attention's.
  Eigen::setNbThreads(1);
  try {
    if (cmd == "compare" || cmd == "all") lab::run_compare(o);
    if (cmd == "controls" || cmd == "all") lab::run_controls(o);
    if (cmd == "pictures" || cmd == "all") lab::run_pictures(o);
    if (cmd != "compare" && cmd != "controls" && cmd != "pictures" && cmd != "all") return usage();
  } catch (std::exception const& e) {
    std::fprintf(stderr, "posenc_lab: %s\n", e.what());
    return 1;
  }
  return 0;
}
