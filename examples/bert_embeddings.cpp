// SPDX-License-Identifier: MIT
// BERT-style input: word + learned position + token type embeddings, LayerNorm, then a self-attention layer over a padded batch.
#include <posenc/posenc.hpp>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

namespace {

using posenc::index_t;

/// LayerNorm over the last dim of rows (n, d), in place (gamma 1, beta 0; BERT's eps 1e-12).
void layer_norm(std::vector<float>& x, index_t d) {
  for (std::size_t r = 0; r < x.size() / static_cast<std::size_t>(d); ++r) {
    float* row = x.data() + r * static_cast<std::size_t>(d);
    float mean = 0, var = 0;
    for (index_t t = 0; t < d; ++t) mean += row[t];
    mean /= static_cast<float>(d);
    for (index_t t = 0; t < d; ++t) var += (row[t] - mean) * (row[t] - mean);
    float const inv = 1.0f / std::sqrt(var / static_cast<float>(d) + 1e-12f);
    for (index_t t = 0; t < d; ++t) row[t] = (row[t] - mean) * inv;
  }
}

}  // namespace

int main() {
  index_t const model = 32, heads = 4, vocab = 100, max_len = 64, batch = 2, len = 7;

  // The three embedding tables of a checkpoint (here seeded): words, positions, token types.
  std::mt19937_64 gen(3);
  std::normal_distribution<float> normal(0.0f, 0.2f);
  auto random = [&](index_t n) {
    std::vector<float> v(static_cast<std::size_t>(n));
    for (auto& x : v) x = normal(gen);
    return v;
  };
  auto const word_table = random(vocab * model), type_table = random(2 * model);
  auto const positions = posenc::learned<float>::random(max_len, model, 2024);

  // The attention layer encodes no positions itself: BERT adds them once, to the embeddings.
  auto const w = random(4 * model * model);
  posenc::multi_head_attention<posenc::none, float> layer({model, heads}, posenc::none{});
  layer.load(w.data(), w.data() + model * model, w.data() + 2 * model * model, w.data() + 3 * model * model);

  // Two sentences of 7 and 4 tokens (segments A then B), right-padded to 7 with token 0.
  std::vector<int> const ids{12, 7, 55, 3, 9, 81, 40, 5, 16, 2, 33, 0, 0, 0};
  std::vector<int> const segment{0, 0, 0, 1, 1, 1, 1, 0, 0, 1, 1, 0, 0, 0};
  std::vector<index_t> lengths{7, 4};

  // embeddings = LayerNorm(word[id] + position[p] + type[segment]), positions 0..len-1.
  auto embed = [&](std::vector<int> const& tokens, index_t b_count) {
    std::vector<float> x(static_cast<std::size_t>(b_count * len * model));
    for (std::size_t r = 0; r < tokens.size(); ++r)
      for (index_t t = 0; t < model; ++t)
        x[r * model + t] = word_table[static_cast<std::size_t>(tokens[r] * model + t)] +
                           type_table[static_cast<std::size_t>(segment[r] * model + t)];
    positions.add_to(posenc::make_bsd(x.data(), b_count, len, model), posenc::position_span(0));
    layer_norm(x, model);
    return x;
  };
  auto const x = embed(ids, batch);

  // Self-attention over the batch; padding keys are masked.
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

  // Positions are in the embeddings: swapping the first two words changes the output of the
  // word now at position 1 (a bag of words would give it the old row 0).
  std::vector<int> swapped = ids;
  std::swap(swapped[0], swapped[1]);
  auto const xs = embed(swapped, batch);
  std::vector<float> ys(x.size());
  layer.forward(posenc::make_bsd<const float>(xs.data(), batch, len, model), posenc::make_bsd(ys.data(), batch, len, model),
                opt);
  double moved = 0;
  for (index_t d = 0; d < model; ++d)
    moved = std::max(moved, static_cast<double>(std::abs(ys[static_cast<std::size_t>(model + d)] - y[static_cast<std::size_t>(d)])));
  std::printf("word 0 moved to position 1: its output changes by %.3g (absolute positions are seen)\n", moved);
  if (err > 1e-5 || moved < 1e-4) return 1;
  std::printf("ok\n");
  return 0;
}
