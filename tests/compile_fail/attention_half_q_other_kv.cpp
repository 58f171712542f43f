// expect: posenc::attention: q and out are float or the 16-bit type of k and v
// bfloat16 q and out over binary16 k and v is not a supported mix: one sentence, not an overload error.
#include <posenc/attention/attention.hpp>
#include <posenc/encoding/none.hpp>

#include <vector>

int main() {
  std::vector<Eigen::bfloat16> x(16);
  std::vector<Eigen::half> h(16);
  auto q = posenc::make_bshd(x.data(), 1, 2, 1, 8);
  auto k = posenc::make_bshd<const Eigen::half>(h.data(), 1, 2, 1, 8);
  posenc::attention(posenc::view<const Eigen::bfloat16>(q), k, k, q, posenc::none{});
  return 0;
}
