// expect: posenc::multi_head_attention: the encoder adds to embeddings, which reference models do once, to the token embeddings before the first layer; call its add_to\(embeddings, positions\) there
// An encoder that adds to embeddings, here inside a compose, is one sentence: the layer leaves absolute positions to the embeddings.
#include <posenc/attention/multi_head.hpp>
#include <posenc/encoding/compose.hpp>
#include <posenc/encoding/learned.hpp>
#include <posenc/encoding/t5_bias.hpp>

int main() {
  posenc::mha_config cfg;
  cfg.model_dim = 8;
  cfg.q_heads = 2;
  auto enc = posenc::compose(posenc::learned<float>::random(16, 8, 1), posenc::t5_bias<float>({2, true, 32, 128}, 2));
  posenc::multi_head_attention<decltype(enc), float> mha(cfg, enc);
  return 0;
}
