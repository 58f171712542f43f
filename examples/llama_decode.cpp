// SPDX-License-Identifier: MIT
// LLaMA-style decoding: RoPE (half-split) + grouped-query attention + a KV cache, checked against a full recompute.
#include <posenc/posenc.hpp>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

int main() {
  using posenc::index_t;
  // A small LLaMA-shaped layer: 8 query heads share 2 key/value heads.
  index_t const model = 64, q_heads = 8, kv_heads = 2, head_dim = 8;
  index_t const prompt = 12, new_tokens = 16, total = prompt + new_tokens;

  posenc::rope<float> rope(posenc::rope_layout::half_split, head_dim, {std::nullopt, 500000.0});
  posenc::multi_head_attention<posenc::rope<float>, float> layer({model, q_heads, kv_heads, head_dim}, rope);

  std::mt19937_64 gen(42);
  std::normal_distribution<float> normal(0.0f, 0.1f);
  auto random = [&](index_t n) {
    std::vector<float> v(static_cast<std::size_t>(n));
    for (auto& x : v) x = normal(gen);
    return v;
  };
  auto wq = random(q_heads * head_dim * model), wk = random(kv_heads * head_dim * model);
  auto wv = random(kv_heads * head_dim * model), wo = random(model * q_heads * head_dim);
  layer.load(wq.data(), wk.data(), wv.data(), wo.data());

  // Token embeddings of the whole sequence (one batch entry).
  auto x = random(total * model);
  posenc::attention_options<float> causal;
  causal.causal = true;

  // Prefill the prompt into a cache, then decode one token at a time. Each step appends the
  // new keys (rotated once, at their positions) and values, then attends over the cache with
  // posenc::attention(q, cache, out, rope, opt): rotation state and positions come from the cache.
  auto cache = layer.make_cache(1);
  std::vector<float> y_steps(x.size());
  layer.forward(posenc::make_bsd<const float>(x.data(), 1, prompt, model),
                posenc::make_bsd(y_steps.data(), 1, prompt, model), cache, causal);
  for (index_t t = prompt; t < total; ++t) {
    layer.forward(posenc::make_bsd<const float>(x.data() + t * model, 1, 1, model),
                  posenc::make_bsd(y_steps.data() + t * model, 1, 1, model), cache, causal);
  }

  // Full recompute over all tokens.
  std::vector<float> y_full(x.size());
  layer.forward(posenc::make_bsd<const float>(x.data(), 1, total, model),
                posenc::make_bsd(y_full.data(), 1, total, model), causal);

  double err = 0;
  for (std::size_t i = 0; i < x.size(); ++i)
    err = std::max(err, static_cast<double>(std::abs(y_steps[i] - y_full[i])));
  std::printf("prefill %lld tokens, decoded %lld tokens, cache holds %lld\n", static_cast<long long>(prompt),
              static_cast<long long>(new_tokens), static_cast<long long>(cache.length()));
  std::printf("max |decode - full recompute| = %.3g\n", err);
  if (err > 1e-5) {
    std::printf("MISMATCH\n");
    return 1;
  }
  std::printf("ok\n");
  return 0;
}
