// expect: posenc::multi_head_attention: encoder_traits<Encoder>::adds_to_embeddings is true but the encoder has no `add_to\(token_view<T>, position_span\) const`
// An additive encoder whose add_to() is not const is one sentence.
#include <posenc/attention/multi_head.hpp>

struct additive {
  posenc::index_t max_positions() const noexcept { return 0; }
  void add_to(posenc::token_view<float>, posenc::position_span) {}
};
namespace posenc {
template <>
struct encoder_traits<additive> {
  static constexpr bool adds_to_embeddings = true, rotates_queries_keys = false;
  static constexpr bool biases_scores = false, relative_key_value = false, is_relative = false;
};
}  // namespace posenc

int main() {
  posenc::mha_config cfg;
  cfg.model_dim = 8;
  cfg.q_heads = 1;
  posenc::multi_head_attention<additive, float> mha(cfg, additive{});
  return 0;
}
