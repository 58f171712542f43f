// expect: posenc::attention_backward: the encoder biases scores but has no `bias_row_backward
// A biasing encoder without its backward hook is usable forward only: asking for its backward is one sentence.
#include <posenc/attention/backward.hpp>

#include <vector>

struct forward_only_bias {
  posenc::index_t max_positions() const noexcept { return 0; }
  posenc::index_t heads() const noexcept { return 0; }
  void bias_row(posenc::index_t, posenc::index_t, posenc::index_t, posenc::index_t, float*) const noexcept {}
};
namespace posenc {
template <>
struct encoder_traits<forward_only_bias> {
  static constexpr bool adds_to_embeddings = false, rotates_queries_keys = false;
  static constexpr bool biases_scores = true, relative_key_value = false, is_relative = true;
};
}  // namespace posenc

int main() {
  std::vector<float> x(16), g(16);
  auto v = posenc::make_bshd(x.data(), 1, 2, 1, 8);
  auto gv = posenc::make_bshd(g.data(), 1, 2, 1, 8);
  posenc::no_gradients none;
  posenc::attention_backward<posenc::path::reference>(v, v, v, v, v, gv, gv, gv, forward_only_bias{},
                                                      posenc::attention_options<float>{}, none);
  return 0;
}
