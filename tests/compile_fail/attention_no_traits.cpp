// expect: posenc::attention: E is not an encoder; specialize posenc::encoder_traits<E>
// A type without encoder_traits handed to posenc::attention is one compile error that says what to do.
#include <posenc/attention/attention.hpp>

#include <vector>

struct not_an_encoder {};

int main() {
  std::vector<float> x(8);
  auto v = posenc::make_bshd(x.data(), 1, 2, 1, 4);
  posenc::attention<posenc::path::reference>(v, v, v, v, not_an_encoder{});
  return 0;
}
