// SPDX-License-Identifier: MIT
// The study's plan: its configuration (corpus, model, lengths, seeds, runs), the steps that fit
// its time budget at a measured step rate, its memory, and the checks made before any run.
#pragma once

#include "modes.hpp"
#include "report.hpp"
#include "model.hpp"

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace lab {

/// The study's model: 5 layers, d_model 128, 4 heads, trained at 128 bytes, batch 8 (about 1M parameters).
inline config study_config() {
  config c;
  c.layers = 5;
  c.d_model = 128;
  c.heads = 4;
  c.seq = 128;
  c.batch = 8;
  c.split = c.layers;
  return c;
}

/// The study's runs, each trained once per seed: (encoding, embedding setup).
inline std::vector<std::pair<std::string, embedding_setup>> study_runs() {
  std::vector<std::pair<std::string, embedding_setup>> r;
  for (std::string n : {"none", "sinusoidal", "learned", "rope", "alibi", "t5", "rope/none", "integer", "zero"})
    r.push_back({n, embedding_setup::sqrt_d});
  for (std::string n : {"sinusoidal", "learned", "integer", "zero"}) r.push_back({n, embedding_setup::unscaled});
  return r;
}

/// Evaluation lengths as multiples of the training length: 0.5x .. 16x.
inline std::vector<double> study_length_factors() { return {0.5, 1, 2, 4, 8, 16}; }

/// What the study will do and what it costs.
struct study_plan {
  config model;
  int runs = 0, seeds = default_seeds, steps = 0;
  double steps_per_second = 0;      ///< measured on this machine
  double eval_seconds_per_run = 0;  ///< estimated: every length over the whole validation split
  double budget_minutes = 60;
  double memory_mib = 0, memory_budget_mib = 0;
  std::size_t parameters = 0, train_bytes = 0;

  double minutes() const { return runs * seeds * (steps / steps_per_second + eval_seconds_per_run) / 60.0; }
  double tokens() const { return static_cast<double>(steps) * model.batch * model.seq; }
  double epochs() const { return train_bytes ? tokens() / static_cast<double>(train_bytes) : 0.0; }
  /// The most steps per run that fit the time budget.
  int steps_that_fit() const {
    double per_run = budget_minutes * 60.0 / (runs * seeds) - eval_seconds_per_run;
    return per_run > 0 ? static_cast<int>(std::floor(per_run * steps_per_second)) : 0;
  }
};

/// Bytes of memory the study's largest step needs, estimated: parameters, gradients and Adam's
/// two moments (float, float, double, double), plus the forward caches of one training batch (20
/// values of d_model per token and layer, MLP included) and one evaluation batch at `longest`
/// bytes (the same, without keeping them: 4 values per token and layer).
inline double study_memory_mib(config const& c, std::size_t parameters, int longest) {
  double const p = static_cast<double>(parameters) * (4 + 4 + 8 + 8);
  double const train = static_cast<double>(c.batch) * c.seq * c.layers * 20.0 * c.d_model * 4;
  double const eval = static_cast<double>(c.batch) * longest * c.layers * 4.0 * c.d_model * 4;
  return (p + train + eval) / (1024.0 * 1024.0);
}

/// The plan for a step rate measured on this machine. steps = 0 chooses the most that fit.
inline study_plan plan_study(double steps_per_second, double eval_seconds_per_run, std::size_t train_bytes, int steps,
                             double budget_minutes, double memory_budget_mib) {
  study_plan p;
  p.model = study_config();
  p.runs = static_cast<int>(study_runs().size());
  p.steps_per_second = steps_per_second;
  p.eval_seconds_per_run = eval_seconds_per_run;
  p.budget_minutes = budget_minutes;
  p.memory_budget_mib = memory_budget_mib;
  p.train_bytes = train_bytes;
  p.parameters = model<float>(p.model).params().size();
  p.memory_mib = study_memory_mib(p.model, p.parameters, static_cast<int>(study_length_factors().back() * p.model.seq));
  p.steps = steps > 0 ? steps : p.steps_that_fit();
  return p;
}

/// Throws std::runtime_error, before any run starts, when the plan exceeds its time or memory
/// budget, saying by how much and what would fit.
inline void check_study_plan(study_plan const& p) {
  if (p.steps <= 0)
    throw std::runtime_error("lab: the study's evaluations alone (" + fmt("%.0f", p.eval_seconds_per_run) + " s per run, " +
                             std::to_string(p.runs * p.seeds) + " runs) exceed the time budget of " +
                             fmt("%.0f", p.budget_minutes) + " minutes (--budget-minutes)");
  if (p.minutes() > p.budget_minutes)
    throw std::runtime_error("lab: the study needs about " + fmt("%.0f", p.minutes()) + " minutes (" +
                             std::to_string(p.runs * p.seeds) + " runs of " + std::to_string(p.steps) + " steps at " +
                             fmt("%.1f", p.steps_per_second) + " steps/s), over the time budget of " +
                             fmt("%.0f", p.budget_minutes) + " minutes (--budget-minutes); --steps " +
                             std::to_string(p.steps_that_fit()) + " would fit");
  if (p.memory_budget_mib > 0 && p.memory_mib > p.memory_budget_mib)
    throw std::runtime_error("lab: the study needs about " + fmt("%.0f", p.memory_mib) + " MiB, over the " +
                             fmt("%.0f", p.memory_budget_mib) + " MiB of memory available");
}

/// The plan as the lines `posenc_lab study --plan` prints.
inline std::string describe(study_plan const& p) {
  std::string s;
  s += "model: " + std::to_string(p.model.layers) + " layers, d_model " + std::to_string(p.model.d_model) + ", " +
       std::to_string(p.model.heads) + " heads, trained at " + std::to_string(p.model.seq) + " bytes, batch " +
       std::to_string(p.model.batch) + ", " + std::to_string(p.parameters) + " parameters without position tables\n";
  s += "lengths:";
  for (double f : study_length_factors()) s += " " + std::to_string(static_cast<int>(f * p.model.seq));
  s += " bytes, each over the whole validation split\n";
  s += "runs: " + std::to_string(p.runs) + " configurations x " + std::to_string(p.seeds) + " seeds:";
  for (auto const& [n, e] : study_runs()) s += " " + n + (e == embedding_setup::sqrt_d ? "" : "(" + embedding_setup_name(e) + ")");
  s += "\n";
  s += "steps: " + std::to_string(p.steps) + " per run at " + fmt("%.1f", p.steps_per_second) + " steps/s (measured), " +
       fmt("%.3g", p.tokens()) + " tokens, " + fmt("%.1f", p.epochs()) + " epochs of the training split\n";
  s += "time: about " + fmt("%.0f", p.minutes()) + " minutes (budget " + fmt("%.0f", p.budget_minutes) + "); memory: about " +
       fmt("%.0f", p.memory_mib) + " MiB (available " + fmt("%.0f", p.memory_budget_mib) + ")\n";
  return s;
}

}  // namespace lab
