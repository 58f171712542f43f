// expect: posenc::attention: encoder_traits<E>::biases_scores is true but the encoder has no `bias_row\(index_t, index_t, index_t, index_t, T\*\) const`
// A biasing encoder whose bias_row() takes another element type than the views is one sentence.
#include <posenc/attention/attention.hpp>

#include <vector>

struct biasing {
  posenc::index_t max_positions() const noexcept { return 0; }
  posenc::index_t heads() const noexcept { return 0; }
  void bias_row(posenc::index_t, posenc::index_t, posenc::index_t, posenc::index_t, double*) const noexcept {}
};
namespace posenc {
template <>
struct encoder_traits<biasing> {
  static constexpr bool adds_to_embeddings = false, rotates_queries_keys = false;
  static constexpr bool biases_scores = true, relative_key_value = false, is_relative = true;
};
}  // namespace posenc

int main() {
  std::vector<float> x(16);
  auto v = posenc::make_bshd(x.data(), 1, 2, 1, 8);
  posenc::attention(v, v, v, v, biasing{});
  return 0;
}
