// expect: posenc::rope: 16-bit tensors \(Eigen::half, Eigen::bfloat16\) rotate with rope<float>
// rope<double> on a 16-bit view: compute is float, so this is one sentence, not an overload error.
#include <posenc/core/half.hpp>
#include <posenc/encoding/rope.hpp>

#include <vector>

int main() {
  std::vector<Eigen::half> x(16);
  posenc::rope<double> r(posenc::rope_layout::half_split, 8);
  r.rotate(posenc::make_bshd(x.data(), 1, 2, 1, 8), posenc::position_span(0));
  return 0;
}
