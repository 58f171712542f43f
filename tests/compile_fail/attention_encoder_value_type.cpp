// expect: posenc::attention: the encoder's value_type is not the element type of q, k, v and out
// An encoder built for double handed float views is one sentence, not an overload error from inside the kernel.
#include <posenc/attention/attention.hpp>
#include <posenc/encoding/rope.hpp>

#include <vector>

int main() {
  std::vector<float> x(16);
  auto v = posenc::make_bshd(x.data(), 1, 2, 1, 8);
  posenc::rope<double> enc(posenc::rope_layout::half_split, 8);
  posenc::attention(v, v, v, v, enc);
  return 0;
}
