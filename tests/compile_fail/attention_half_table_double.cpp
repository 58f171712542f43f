// expect: posenc::attention: an encoder with a 16-bit table .Eigen::half, Eigen::bfloat16. computes in float
// A 16-bit T5 table with double tensors is one sentence: the table computes in float, not double.
#include <posenc/attention/attention.hpp>
#include <posenc/encoding/t5_bias.hpp>

#include <vector>

int main() {
  std::vector<double> x(16);
  auto v = posenc::make_bshd(x.data(), 1, 2, 1, 8);
  posenc::t5_bias<Eigen::half> enc({1, true, 32, 128}, 0);
  posenc::attention(v, v, v, v, enc);
  return 0;
}
