// expect: posenc::multi_head_attention: the encoder's value_type is not T
// A layer of floats with an encoder built for double is one sentence.
#include <posenc/attention/multi_head.hpp>
#include <posenc/encoding/rope.hpp>

int main() {
  posenc::mha_config cfg;
  cfg.model_dim = 8;
  cfg.q_heads = 1;
  posenc::multi_head_attention<posenc::rope<double>, float> mha(
      cfg, posenc::rope<double>(posenc::rope_layout::half_split, 8));
  return 0;
}
