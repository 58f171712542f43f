// SPDX-License-Identifier: MIT
// Training and evaluation loops of the lab: seeded batches, Adam steps, validation loss.
#pragma once

#include "adam.hpp"
#include "corpus.hpp"
#include "model.hpp"

#include <chrono>
#include <functional>
#include <cmath>
#include <vector>

namespace lab {

/// What a training run gives back.
struct train_result {
  std::vector<double> losses;  ///< training loss of each step (nats per byte)
  double seconds = 0;          ///< wall time of the steps
  double steps_per_second() const { return seconds > 0 ? static_cast<double>(losses.size()) / seconds : 0; }
};

/// Trains m for `steps` steps on windows of `text` drawn with seed m.cfg().seed + 1.
/// The same configuration, text and thread count give the same losses, bit for bit.
/// after_step(s), when given, runs after step s (1-based), outside the timed steps' sum.
template <class T>
train_result train(model<T>& m, std::string const& text, int steps, std::function<void(int)> const& after_step = {}) {
  config const& c = m.cfg();
  adam<T> opt(c, m.params().size());
  normal_source rng(c.seed + 1);
  train_result r;
  for (int s = 0; s < steps; ++s) {
    auto t0 = std::chrono::steady_clock::now();
    batch_tokens b = sample_batch(text, c.batch, c.seq, rng);
    r.losses.push_back(m.loss_and_grad(b));
    opt.step(m.params(), m.grads());
    r.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (after_step) after_step(s + 1);
  }
  return r;
}

/// Mean loss (nats per byte) over the windows of `length` bytes of `text`; position_loss, when
/// given, gets the mean loss at each position 0 .. length - 1. Throws not_applicable.
template <class T>
double evaluate(model<T>& m, std::string const& text, eval_mode const& mode, std::vector<double>* position_loss = nullptr) {
  int const len = mode.length > 0 ? mode.length : m.cfg().seq;
  double total = 0;
  std::size_t count = 0;
  if (position_loss) position_loss->assign(static_cast<std::size_t>(len), 0.0);
  std::vector<double> rows;
  for (auto const& b : eval_batches(text, m.cfg().batch, len)) {
    total += m.loss(b, mode, &rows) * static_cast<double>(rows.size());
    count += rows.size();
    if (position_loss)
      for (std::size_t i = 0; i < rows.size(); ++i) (*position_loss)[i % static_cast<std::size_t>(len)] += rows[i];
  }
  if (position_loss)
    for (auto& v : *position_loss) v /= static_cast<double>(count / static_cast<std::size_t>(len));
  return count ? total / static_cast<double>(count) : std::nan("");
}

}  // namespace lab
