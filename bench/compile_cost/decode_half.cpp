// SPDX-License-Identifier: MIT
// Compile-cost unit: a bfloat16 kv_cache filled through RoPE and one decode step over it.
#include <posenc/posenc.hpp>

#include <cstdio>
#include <vector>

int main() {
  posenc::index_t const H = 2, D = 64, S = 32;
  posenc::rope<float> rope(posenc::rope_layout::half_split, D);
  posenc::kv_cache<Eigen::bfloat16> cache(1, H, D);
  std::vector<float> k(S * H * D, 0.1f), v(k), q(H * D, 0.2f), out(H * D);
  cache.append(posenc::make_bshd(k.data(), 1, S, H, D), posenc::make_bshd(v.data(), 1, S, H, D), rope);
  posenc::attention_options<float> opt;
  posenc::attention(posenc::make_bshd(q.data(), 1, 1, H, D), cache, posenc::make_bshd(out.data(), 1, 1, H, D), rope,
                    opt);
  std::printf("%f\n", static_cast<double>(out[0]));
  return 0;
}
