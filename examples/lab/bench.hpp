// SPDX-License-Identifier: MIT
// The lab's training-throughput mode: the model configuration as one machine-readable line, and
// the step rate of the same training steps as `compare` runs (bench/lab_torch.py reads both).
#pragma once

#include "adam.hpp"
#include "corpus.hpp"
#include "model.hpp"

#include <posenc/posenc.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <string>

namespace lab {

/// What the bench mode measures: `steps` training steps after `warmup` untimed ones.
struct bench_result {
  int threads = 1, warmup = 0, steps = 0;
  double seconds = 0;
  double steps_per_second() const { return seconds > 0 ? steps / seconds : 0; }
};

/// Everything another framework needs to build the same model and training step, as one JSON
/// object: shapes, the encoding and its constants, norm, activation, tying, optimizer, dtype,
/// and the parameter count (which the other model must match).
inline std::string config_json(config const& c) {
  std::ostringstream o;
  o.precision(17);
  auto q = [](std::string const& s) { return "\"" + s + "\""; };
  auto const e = c.layer_encoding(0);
  bool const uniform = c.split == 0 || c.split == c.layers || c.lower == c.upper;
  o << "{" << q("vocab") << ":256," << q("layers") << ":" << c.layers << "," << q("d_model") << ":" << c.d_model << ","
    << q("heads") << ":" << c.heads << "," << q("head_dim") << ":" << c.head_dim() << "," << q("mlp_hidden") << ":"
    << c.mlp * c.d_model << "," << q("seq") << ":" << c.seq << "," << q("batch") << ":" << c.batch << ","
    << q("encoding") << ":" << q(uniform ? encoding_name(e) : encoding_name(c.lower) + "/" + encoding_name(c.upper)) << ","
    << q("embedding") << ":" << q(embedding_setup_name(c.embedding)) << "," << q("token_scale") << ":"
    << (c.embedding == embedding_setup::sqrt_d ? std::sqrt(static_cast<double>(c.d_model)) : 1.0) << ","
    << q("rope_layout") << ":" << q("half_split") << "," << q("rope_base") << ":" << 10000.0 << ","
    << q("alibi_slopes") << ":[";
  auto slopes = posenc::alibi_slopes(c.heads);
  for (std::size_t h = 0; h < slopes.size(); ++h) o << (h ? "," : "") << slopes[h];
  o << "]," << q("sinusoidal_layout") << ":" << q("interleaved") << "," << q("attention_scale") << ":"
    << 1.0 / std::sqrt(static_cast<double>(c.head_dim())) << "," << q("causal") << ":true," << q("norm") << ":"
    << q("pre") << "," << q("final_norm") << ":true," << q("ln_eps") << ":" << 1e-5 << "," << q("gelu") << ":"
    << q("tanh") << "," << q("qkvo_bias") << ":false," << q("mlp_bias") << ":true," << q("tied_output") << ":true,"
    << q("loss") << ":" << q("mean_cross_entropy") << "," << q("optimizer") << ":" << q("adam") << "," << q("lr") << ":"
    << c.lr << "," << q("lr_warmup_steps") << ":" << c.warmup << "," << q("beta1") << ":" << c.beta1 << ","
    << q("beta2") << ":" << c.beta2 << "," << q("eps") << ":" << c.eps << "," << q("clip_global_norm") << ":" << c.clip
    << "," << q("dtype") << ":" << q("float32") << "," << q("seed") << ":" << c.seed << "," << q("parameters") << ":"
    << model<float>(c).params().size() << "}";
  return o.str();
}

/// Trains a fresh model of configuration c on windows of `text` (seeded as train() does):
/// `warmup` untimed steps, then the wall time of `steps` steps (batch sampling, forward,
/// backward, clipping and Adam: what one training step of the lab costs).
inline bench_result bench_training(config const& c, std::string const& text, int warmup, int steps) {
  model<float> m(c);
  adam<float> opt(c, m.params().size());
  normal_source rng(c.seed + 1);
  auto step = [&] {
    batch_tokens b = sample_batch(text, c.batch, c.seq, rng);
    m.loss_and_grad(b);
    opt.step(m.params(), m.grads());
  };
  for (int s = 0; s < warmup; ++s) step();
  auto t0 = std::chrono::steady_clock::now();
  for (int s = 0; s < steps; ++s) step();
  bench_result r;
  r.threads = c.threads;
  r.warmup = warmup;
  r.steps = steps;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

/// The bench result as one JSON object.
inline std::string bench_json(bench_result const& r) {
  std::ostringstream o;
  o.precision(6);
  o << "{\"threads\":" << r.threads << ",\"warmup\":" << r.warmup << ",\"steps\":" << r.steps << ",\"seconds\":" << r.seconds
    << ",\"steps_per_s\":" << r.steps_per_second() << "}";
  return o.str();
}

}  // namespace lab
