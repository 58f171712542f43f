// SPDX-License-Identifier: MIT
// The README's usage snippet: causal attention with RoPE on two paths, and an error message.
#include <posenc/posenc.hpp>

#include <cmath>
#include <cstdio>
#include <vector>

int main() {
  // q, k, v and out: (batch 1, seq 6, heads 2, head_dim 8) in BSHD order, contiguous.
  posenc::index_t const B = 1, S = 6, H = 2, D = 8;
  std::vector<float> q(B * S * H * D), k(q.size()), v(q.size()), out(q.size()), ref(q.size());
  for (std::size_t i = 0; i < q.size(); ++i) {
    q[i] = std::sin(0.1f * static_cast<float>(i));
    k[i] = std::cos(0.2f * static_cast<float>(i));
    v[i] = 0.1f * static_cast<float>(i % 5);
  }
  auto view = [&](std::vector<float>& x) { return posenc::make_bshd(x.data(), B, S, H, D); };

  // RoPE with half-split pairs (GPT-NeoX, Hugging Face LLaMA), base 10000.
  posenc::rope<float> rope(posenc::rope_layout::half_split, D);
  posenc::attention_options<float> opt;
  opt.causal = true;

  // The default path (fused: tiled, online softmax, SIMD) and the scalar reference.
  posenc::attention(view(q), view(k), view(v), view(out), rope, opt);
  posenc::attention<posenc::path::reference>(view(q), view(k), view(v), view(ref), rope, opt);
  float diff = 0;
  for (std::size_t i = 0; i < out.size(); ++i) diff = std::fmax(diff, std::fabs(out[i] - ref[i]));
  std::printf("out[0, 5, 1, 0..1] = %.6f %.6f, max |fused - reference| = %.1e\n", view(out)(0, 5, 1, 0),
              view(out)(0, 5, 1, 1), diff);

  // Bad arguments throw posenc::error before anything is written.
  try {
    posenc::rope<float> odd(posenc::rope_layout::half_split, 7);
  } catch (posenc::error const& e) {
    std::printf("%s\n", e.what());  // posenc::rope: rotary_dim is 7, expected an even number >= 2
  }
  return diff < 1e-5f ? 0 : 1;
}
