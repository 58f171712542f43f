// expect: posenc::attention: q and out are float or the 16-bit type of k and v \(all-16-bit tensors\)
// 16-bit q and out over float k and v is not a supported mix: one sentence, not an overload error.
#include <posenc/attention/attention.hpp>
#include <posenc/encoding/none.hpp>

#include <vector>

int main() {
  std::vector<float> x(16);
  std::vector<Eigen::half> h(16);
  auto q = posenc::make_bshd(h.data(), 1, 2, 1, 8);
  auto k = posenc::make_bshd<const float>(x.data(), 1, 2, 1, 8);
  posenc::attention(posenc::view<const Eigen::half>(q), k, k, q, posenc::none{});
  return 0;
}
