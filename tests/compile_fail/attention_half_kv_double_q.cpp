// expect: posenc::attention: with 16-bit k and v \(Eigen::half, Eigen::bfloat16\), q and out must be float
// Double q and out over 16-bit k and v is not a supported mix: one sentence, not an overload error.
#include <posenc/attention/attention.hpp>
#include <posenc/encoding/none.hpp>

#include <vector>

int main() {
  std::vector<double> x(16);
  std::vector<Eigen::half> h(16);
  auto q = posenc::make_bshd(x.data(), 1, 2, 1, 8);
  auto k = posenc::make_bshd<const Eigen::half>(h.data(), 1, 2, 1, 8);
  posenc::attention(q, k, k, q, posenc::none{});
  return 0;
}
