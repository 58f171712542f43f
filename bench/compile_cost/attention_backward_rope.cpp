// SPDX-License-Identifier: MIT
// Compile-cost unit: a float attention call with RoPE and its backward (the default paths).
#include <posenc/posenc.hpp>

#include <cstdio>
#include <vector>

int main() {
  posenc::index_t const B = 1, S = 64, H = 2, D = 64;
  std::vector<float> q(B * S * H * D, 0.1f), k(q), v(q), out(q.size()), dout(q.size(), 1.0f);
  std::vector<float> dq(q.size()), dk(q.size()), dv(q.size()), lse(B * H * S);
  auto view = [&](std::vector<float>& x) { return posenc::make_bshd(x.data(), B, S, H, D); };
  posenc::rope<float> rope(posenc::rope_layout::half_split, D);
  posenc::attention_options<float> opt;
  opt.causal = true;
  opt.lse = lse;
  posenc::attention(view(q), view(k), view(v), view(out), rope, opt);
  auto g = posenc::make_gradients(rope);
  posenc::attention_backward(view(q), view(k), view(v), view(out), view(dout), view(dq), view(dk), view(dv), rope,
                             opt, g);
  std::printf("%f %f\n", static_cast<double>(out[0]), static_cast<double>(dq[0]));
  return 0;
}
