// SPDX-License-Identifier: MIT
// The experiments of the lab: comparison table, controls, pictures, and the study's plan.
#pragma once

#include "config.hpp"

#include <ostream>
#include <string>
#include <vector>

namespace lab {

/// Options shared by the experiments (main.cpp reads them from the command line).
struct experiment_options {
  bool quick = false;        ///< the small version (ctest)
  std::string out = "lab-out";  ///< output folder (created)
  std::string corpus_dir;    ///< empty: default_corpus_dir()
  int threads = 1;           ///< attention threads
  int seeds = 0;             ///< seeds per configuration; 0: default_seeds (modes.hpp)
  embedding_setup embedding = embedding_setup::sqrt_d;  ///< token and position scaling (config.hpp)
  std::vector<std::string> encodings;  ///< compare: these encodings only (empty: all)
  std::ostream* log = nullptr;         ///< one progress line per finished run (nullptr: none)
};

/// (a) every encoding: perplexity and bits per byte at 1x, 2x, 4x, 8x the training length,
/// steps per second, peak memory, parameters, each the mean over the seeds with min .. max;
/// writes compare.md, compare_ppl.png, <name>.seed<k>.ckpt.
void run_compare(experiment_options const& o);
/// The training-throughput mode: prints the model configuration of `encoding` at this size
/// (`lab-config {json}`), then, when steps > 0, the rate of `steps` training steps after
/// `warmup` untimed ones (`lab-bench {json}`); bench/lab_torch.py reads both lines.
void run_bench(experiment_options const& o, std::string const& encoding, int warmup, int steps);
/// (b) sin/cos, learned, increasing integer, zero vectors, noise, in the sqrt_d and the unscaled
/// embedding setups, with learned in bert and sinusoidal in matched: losses after a small and a
/// larger number of steps over the seeds; writes controls.md, controls_loss.png.
void run_controls(experiment_options const& o);
/// The study's plan: loads its corpus (load_study_corpus), measures the step rate and the
/// evaluation time here, prints the plan and checks it against the budgets (check_study_plan).
/// steps = 0 chooses the most steps that fit. The study's runs themselves are not part of the lab yet.
void run_study_plan(experiment_options const& o, int steps, double budget_minutes);
/// (c) validation loss by position, perplexity against length, attention maps and mean
/// attended distance per head; writes pictures.md and PNGs (reuses compare's checkpoints).
void run_pictures(experiment_options const& o);

}  // namespace lab
