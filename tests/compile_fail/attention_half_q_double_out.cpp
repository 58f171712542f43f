// expect: posenc::attention: q and out must have the same element type
// 16-bit q with a double out (over 16-bit k and v) is not a supported mix: one sentence, not an overload error.
#include <posenc/attention/attention.hpp>
#include <posenc/encoding/none.hpp>

#include <vector>

int main() {
  std::vector<double> x(16);
  std::vector<Eigen::half> h(16);
  auto q = posenc::make_bshd<const Eigen::half>(h.data(), 1, 2, 1, 8);
  auto out = posenc::make_bshd(x.data(), 1, 2, 1, 8);
  posenc::attention(q, q, q, out, posenc::none{});
  return 0;
}
