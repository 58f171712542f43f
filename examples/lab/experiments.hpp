// SPDX-License-Identifier: MIT
// The three experiments of the lab: comparison table, controls, pictures.
#pragma once

#include <string>

namespace lab {

/// Options shared by the experiments (main.cpp reads them from the command line).
struct experiment_options {
  bool quick = false;        ///< the small version (ctest)
  std::string out = "lab-out";  ///< output folder (created)
  std::string corpus_dir;    ///< empty: default_corpus_dir()
  int threads = 1;           ///< attention threads
};

/// (a) every encoding: perplexity and bits per byte at 1x, 2x, 4x, 8x the training length,
/// steps per second, peak memory, parameters; writes compare.md, compare_ppl.png, <name>.ckpt.
void run_compare(experiment_options const& o);
/// The training-throughput mode: prints the model configuration of `encoding` at this size
/// (`lab-config {json}`), then, when steps > 0, the rate of `steps` training steps after
/// `warmup` untimed ones (`lab-bench {json}`); bench/lab_torch.py reads both lines.
void run_bench(experiment_options const& o, std::string const& encoding, int warmup, int steps);
/// (b) sin/cos, learned, increasing integer, zero vectors, noise: losses after a small and a
/// larger number of steps; writes controls.md, controls_loss.png.
void run_controls(experiment_options const& o);
/// (c) validation loss by position, perplexity against length, attention maps and mean
/// attended distance per head; writes pictures.md and PNGs (reuses compare's checkpoints).
void run_pictures(experiment_options const& o);

}  // namespace lab
