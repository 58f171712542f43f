// SPDX-License-Identifier: MIT
// T5 relative position buckets in encoder (bidirectional) and decoder (causal, cached) self-attention.
#include <posenc/posenc.hpp>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

int main() {
  using posenc::index_t;
  index_t const model = 32, heads = 4, len = 10, batch = 2;

  // The buckets of the default T5 setting (32 buckets, max distance 128).
  posenc::t5_bias<float> enc_bias({heads, true, 32, 128}, 1, 0.5);
  posenc::t5_bias<float> dec_bias({heads, false, 32, 128}, 2, 0.5);
  std::printf("delta = key - query:");
  for (index_t d : {-200, -91, -90, -16, -8, -1, 0, 1, 8, 16, 91}) std::printf(" %lld", static_cast<long long>(d));
  std::printf("\nencoder bucket     :");
  for (index_t d : {-200, -91, -90, -16, -8, -1, 0, 1, 8, 16, 91})
    std::printf(" %lld", static_cast<long long>(enc_bias.bucket(d)));
  std::printf("\ndecoder bucket     :");
  for (index_t d : {-200, -91, -90, -16, -8, -1, 0, 1, 8, 16, 91})
    std::printf(" %lld", static_cast<long long>(dec_bias.bucket(d)));
  std::printf("\n");

  std::mt19937_64 gen(7);
  std::normal_distribution<float> normal(0.0f, 0.2f);
  std::vector<float> w(static_cast<std::size_t>(4 * model * model));
  for (auto& v : w) v = normal(gen);
  std::vector<float> x(static_cast<std::size_t>(batch * len * model));
  for (auto& v : x) v = normal(gen);

  // T5 attention has no 1/sqrt(d) scaling: scale = 1.
  posenc::attention_options<float> enc_opt;
  enc_opt.scale = 1.0;
  posenc::multi_head_attention<posenc::t5_bias<float>, float> encoder({model, heads}, enc_bias);
  encoder.load(w.data(), w.data() + model * model, w.data() + 2 * model * model, w.data() + 3 * model * model);
  std::vector<float> y(x.size());
  encoder.forward(posenc::make_bsd<const float>(x.data(), batch, len, model), posenc::make_bsd(y.data(), batch, len, model),
                  enc_opt);
  std::printf("encoder self-attention output[0][0][0..3]: %.5f %.5f %.5f %.5f\n", y[0], y[1], y[2], y[3]);

  // Decoder: causal, token by token with a cache, equal to the full pass.
  posenc::attention_options<float> dec_opt = enc_opt;
  dec_opt.causal = true;
  posenc::multi_head_attention<posenc::t5_bias<float>, float> decoder({model, heads}, dec_bias);
  decoder.load(w.data(), w.data() + model * model, w.data() + 2 * model * model, w.data() + 3 * model * model);
  std::vector<float> full(x.size()), steps(x.size());
  decoder.forward(posenc::make_bsd<const float>(x.data(), batch, len, model),
                  posenc::make_bsd(full.data(), batch, len, model), dec_opt);
  auto cache = decoder.make_cache(batch);
  for (index_t t = 0; t < len; ++t) {
    posenc::token_view<const float> xt{x.data() + t * model, batch, 1, model, len * model, model, 1};
    posenc::token_view<float> yt{steps.data() + t * model, batch, 1, model, len * model, model, 1};
    decoder.forward(xt, yt, cache, dec_opt);
  }
  double err = 0;
  for (std::size_t i = 0; i < x.size(); ++i) err = std::max(err, static_cast<double>(std::abs(full[i] - steps[i])));
  std::printf("decoder: max |cached decode - full pass| = %.3g\n", err);
  if (err > 1e-5) return 1;
  std::printf("ok\n");
  return 0;
}
