// SPDX-License-Identifier: MIT
// Runs over several seeds and their spread: every number the experiments report is the mean of
// the seeds with its min .. max.
#pragma once

#include "progress.hpp"
#include "report.hpp"
#include "train.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

namespace lab {

/// The mean and the range of a set of numbers (NaN when empty or any of them is NaN).
struct spread {
  double mean = std::nan(""), min = std::nan(""), max = std::nan("");
  /// "mean (min..max)" with format f; just the mean for one value; "n/a" for NaN.
  std::string str(char const* f = "%.2f") const {
    if (std::isnan(mean)) return "n/a";
    if (min == max) return fmt(f, mean);
    return fmt(f, mean) + " (" + fmt(f, min) + ".." + fmt(f, max) + ")";
  }
  /// True when v lies outside [min, max].
  bool excludes(double v) const { return v < min || v > max; }
};

inline spread spread_of(std::vector<double> const& v) {
  spread s;
  if (v.empty() || std::any_of(v.begin(), v.end(), [](double x) { return std::isnan(x); })) return s;
  s.mean = 0;
  for (double x : v) s.mean += x / static_cast<double>(v.size());
  s.min = *std::min_element(v.begin(), v.end());
  s.max = *std::max_element(v.begin(), v.end());
  return s;
}

/// The configuration c with seed k (k = 1, 2, ...): the model's initialization and its batches.
inline config with_seed(config c, int k) {
  c.seed = static_cast<std::uint64_t>(k);
  return c;
}

/// Trains configuration c for `steps` steps with seeds 1 .. seeds on `train_text` and returns
/// each run's validation loss (nats per byte, at the training length). `name` labels the
/// progress line of each run; after(model, seed), when given, runs after each training run.
inline std::vector<double> validation_losses(config const& c, std::string const& name, std::string const& train_text,
                                             std::string const& validation_text, int steps, int seeds, progress* p,
                                             std::function<void(model<float>&, int)> const& after = {}) {
  std::vector<double> out;
  for (int k = 1; k <= seeds; ++k) {
    model<float> m(with_seed(c, k));
    train(m, train_text, steps);
    out.push_back(evaluate(m, validation_text, eval_mode{}));
    if (after) after(m, k);
    if (p) p->done(name + " seed " + std::to_string(k), "val loss " + fmt("%.3f", out.back()));
  }
  return out;
}

}  // namespace lab
