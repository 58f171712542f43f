// expect: posenc::attention_backward: the fused path has no backward for an encoder with a content bias
// Transformer-XL's content bias has a backward on the reference path only: the fused path says so in one sentence.
#include <posenc/attention/backward.hpp>
#include <posenc/encoding/transformer_xl.hpp>

#include <vector>

int main() {
  std::vector<float> q(16), k(16), v(16), out(16), dout(16), dq(16), dk(16), dv(16);
  auto at = [](std::vector<float>& x) { return posenc::make_bshd(x.data(), 1, 2, 1, 8); };
  posenc::relative_table<float> u = posenc::relative_table<float>::Zero(1, 8), w_r = posenc::relative_table<float>::Zero(8, 4);
  posenc::transformer_xl<float> enc(4, u, u, w_r);
  auto g = enc.make_gradients();
  posenc::attention_backward<posenc::path::fused>(at(q), at(k), at(v), at(out), at(dout), at(dq), at(dk), at(dv), enc,
                                                  posenc::attention_options<float>{}, g);
  return 0;
}
