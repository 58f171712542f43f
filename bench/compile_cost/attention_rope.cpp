// SPDX-License-Identifier: MIT
// Compile-cost unit: one float attention call with RoPE (the default path).
#include <posenc/posenc.hpp>

#include <cstdio>
#include <vector>

int main() {
  posenc::index_t const B = 1, S = 64, H = 2, D = 64;
  std::vector<float> q(B * S * H * D, 0.1f), k(q), v(q), out(q.size());
  auto view = [&](std::vector<float>& x) { return posenc::make_bshd(x.data(), B, S, H, D); };
  posenc::rope<float> rope(posenc::rope_layout::half_split, D);
  posenc::attention_options<float> opt;
  opt.causal = true;
  posenc::attention(view(q), view(k), view(v), view(out), rope, opt);
  std::printf("%f\n", static_cast<double>(out[0]));
  return 0;
}
