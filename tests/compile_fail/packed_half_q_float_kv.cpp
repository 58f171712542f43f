// expect: posenc::attention: q and out are float or the 16-bit type of k and v \(all-16-bit tensors\)
// The packed call takes the 16-bit mixes of the contiguous call only: 16-bit q and out over float k and v is
// the same sentence, not an overload error.
#include <posenc/attention/packed.hpp>
#include <posenc/encoding/none.hpp>

#include <vector>

int main() {
  std::vector<float> x(16);
  std::vector<Eigen::half> h(16);
  std::vector<posenc::index_t> const cu{0, 2};
  auto q = posenc::make_bshd(h.data(), 1, 2, 1, 8);
  auto k = posenc::make_bshd<const float>(x.data(), 1, 2, 1, 8);
  posenc::attention(posenc::view<const Eigen::half>(q), k, k, q, posenc::packed_sequences{cu, cu}, posenc::none{});
  return 0;
}
