// expect: posenc::attention: the encoder has no `index_t max_positions\(\) const`
// An encoder without max_positions() is told that every encoder needs one.
#include <posenc/attention/attention.hpp>

#include <vector>

struct rotating {
  void rotate(posenc::view<float>, posenc::position_span, posenc::index_t) const {}
};
namespace posenc {
template <>
struct encoder_traits<rotating> {
  static constexpr bool adds_to_embeddings = false, rotates_queries_keys = true;
  static constexpr bool biases_scores = false, relative_key_value = false, is_relative = true;
};
}  // namespace posenc

int main() {
  std::vector<float> x(16);
  auto v = posenc::make_bshd(x.data(), 1, 2, 1, 8);
  posenc::attention(v, v, v, v, rotating{});
  return 0;
}
