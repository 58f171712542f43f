// expect: posenc::attention: encoder_traits<E>::relative_key_value is true but the encoder lacks one of
// A relative key/value encoder missing has_values() is one sentence listing the hooks it needs.
#include <posenc/attention/attention.hpp>

#include <vector>

struct relative_kv {
  posenc::index_t max_positions() const noexcept { return 0; }
  posenc::index_t head_dim() const noexcept { return 8; }
  void score_row(float const*, posenc::index_t, posenc::index_t, posenc::index_t, float, float*) const noexcept {}
  void value_row(float const*, posenc::index_t, posenc::index_t, posenc::index_t, float*) const noexcept {}
};
namespace posenc {
template <>
struct encoder_traits<relative_kv> {
  static constexpr bool adds_to_embeddings = false, rotates_queries_keys = false;
  static constexpr bool biases_scores = false, relative_key_value = true, is_relative = true;
};
}  // namespace posenc

int main() {
  std::vector<float> x(16);
  auto v = posenc::make_bshd(x.data(), 1, 2, 1, 8);
  posenc::attention(v, v, v, v, relative_kv{});
  return 0;
}
