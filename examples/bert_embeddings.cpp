// SPDX-License-Identifier: MIT
// BERT-style encoder layer: learned absolute position embeddings added by the attention module, padded batch.
#include <posenc/posenc.hpp>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

int main() {
  using posenc::index_t;
  index_t const model = 32, heads = 4, max_len = 64, batch = 2, len = 7;

  // A learned (max_len, model) table, as loaded from a checkpoint (here seeded).
  auto positions = posenc::learned<float>::random(max_len, model, 2024);

  std::mt19937_64 gen(3);
  std::normal_distribution<float> normal(0.0f, 0.2f);
  std::vector<float> w(static_cast<std::size_t>(4 * model * model));
  for (auto& v : w) v = normal(gen);
  posenc::multi_head_attention<posenc::learned<float>, float> layer({model, heads}, positions);
  layer.load(w.data(), w.data() + model * model, w.data() + 2 * model * model, w.data() + 3 * model * model);

  // Two sentences of 7 and 4 tokens, right-padded to 7; padding keys are masked.
  std::vector<float> x(static_cast<std::size_t>(batch * len * model));
  for (auto& v : x) v = normal(gen);
  std::vector<index_t> lengths{7, 4};
  posenc::attention_options<float> opt;
  opt.key_lengths = lengths;
  std::vector<float> y(x.size());
  layer.forward(posenc::make_bsd<const float>(x.data(), batch, len, model), posenc::make_bsd(y.data(), batch, len, model),
                opt);

  // The short sentence alone gives the same outputs for its real tokens.
  std::vector<float> y_alone(static_cast<std::size_t>(4 * model));
  layer.forward(posenc::make_bsd<const float>(x.data() + len * model, 1, 4, model),
                posenc::make_bsd(y_alone.data(), 1, 4, model));
  double err = 0;
  for (index_t i = 0; i < 4 * model; ++i)
    err = std::max(err, static_cast<double>(std::abs(y_alone[static_cast<std::size_t>(i)] -
                                                     y[static_cast<std::size_t>(len * model + i)])));
  std::printf("padded batch vs sentence alone: max difference %.3g\n", err);

  // Positions matter: swapping two tokens changes more than their two rows.
  std::vector<float> xs = x;
  for (index_t d = 0; d < model; ++d) std::swap(xs[static_cast<std::size_t>(d)], xs[static_cast<std::size_t>(model + d)]);
  std::vector<float> ys(x.size());
  layer.forward(posenc::make_bsd<const float>(xs.data(), batch, len, model), posenc::make_bsd(ys.data(), batch, len, model),
                opt);
  double moved = 0;
  for (index_t d = 0; d < model; ++d)
    moved = std::max(moved, static_cast<double>(std::abs(ys[static_cast<std::size_t>(model + d)] - y[static_cast<std::size_t>(d)])));
  std::printf("token 0 moved to position 1: its output changes by %.3g (absolute positions are seen)\n", moved);
  if (err > 1e-5 || moved < 1e-4) return 1;
  std::printf("ok\n");
  return 0;
}
