// SPDX-License-Identifier: MIT
// Adam (Kingma and Ba 2015) with bias correction, global-norm clipping and linear warmup.
#pragma once

#include "config.hpp"
#include "params.hpp"

#include <cmath>
#include <vector>

namespace lab {

/// Plain Adam over one flat parameter vector.
template <class T>
class adam {
 public:
  adam(config const& c, std::size_t size) : c_(c), m_(size, 0.0), v_(size, 0.0) {}

  /// One update of `params` from `grads` (grads clipped to global norm c.clip first).
  void step(param_vector<T>& params, param_vector<T> const& grads) {
    ++t_;
    double norm = 0;
    for (T g : grads) norm += static_cast<double>(g) * static_cast<double>(g);
    norm = std::sqrt(norm);
    double const scale = norm > c_.clip ? c_.clip / norm : 1.0;
    double const lr = c_.lr * std::min(1.0, static_cast<double>(t_) / std::max(1, c_.warmup));
    double const bc1 = 1 - std::pow(c_.beta1, t_), bc2 = 1 - std::pow(c_.beta2, t_);
    for (std::size_t i = 0; i < params.size(); ++i) {
      double g = scale * static_cast<double>(grads[i]);
      m_[i] = c_.beta1 * m_[i] + (1 - c_.beta1) * g;
      v_[i] = c_.beta2 * v_[i] + (1 - c_.beta2) * g * g;
      params[i] -= static_cast<T>(lr * (m_[i] / bc1) / (std::sqrt(v_[i] / bc2) + c_.eps));
    }
  }
  int steps() const { return t_; }

 private:
  config c_;
  std::vector<double> m_, v_;
  int t_ = 0;
};

}  // namespace lab
