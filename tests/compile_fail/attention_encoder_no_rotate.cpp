// expect: posenc::attention: encoder_traits<E>::rotates_queries_keys is true but the encoder has no `rotate\(view<T>, position_span, index_t\) const`
// A rotating encoder whose rotate() has the wrong signature (no length argument) is one sentence.
#include <posenc/attention/attention.hpp>

#include <vector>

struct rotating {
  posenc::index_t max_positions() const noexcept { return 0; }
  void rotate(posenc::view<float>, posenc::position_span) const {}
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
