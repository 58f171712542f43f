// expect: adds to embeddings.*call its add_to\(\).*or use multi_head_attention
// An additive (absolute) encoder handed to the bare attention kernel is a compile error that says what to do.
#include <posenc/attention/attention.hpp>

#include <vector>

struct additive {
  posenc::index_t max_positions() const noexcept { return 0; }
  void add_to(posenc::token_view<float>, posenc::position_span) const {}
};
namespace posenc {
template <>
struct encoder_traits<additive> {
  static constexpr bool adds_to_embeddings = true, rotates_queries_keys = false;
  static constexpr bool biases_scores = false, relative_key_value = false, is_relative = false;
};
}  // namespace posenc

int main() {
  std::vector<float> x(8);
  auto v = posenc::make_bshd(x.data(), 1, 2, 1, 4);
  posenc::attention<posenc::path::reference>(v, v, v, v, additive{});
  return 0;
}
