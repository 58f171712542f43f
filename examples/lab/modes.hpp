// SPDX-License-Identifier: MIT
// The lab's two sizes: quick (ctest, about a minute and a half for every experiment) and full.
#pragma once

#include "config.hpp"

namespace lab {

/// Model shape of a mode; one encoding everywhere until the caller sets another.
inline config mode_config(bool quick) {
  config c;
  c.layers = 2;
  c.d_model = quick ? 32 : 64;
  c.heads = quick ? 2 : 4;
  c.seq = quick ? 32 : 64;
  c.batch = 8;
  c.split = c.layers;
  return c;
}

/// Training steps per run of a mode: 600 in both (the modes differ in the model's size). In
/// quick mode (about 1 s per run) `none` and `rope` end far apart: docs/experiments.md.
inline int mode_steps(bool /*quick*/) { return 600; }

/// Seeds per configuration (every reported number is their mean with min .. max).
inline constexpr int default_seeds = 3;

}  // namespace lab
