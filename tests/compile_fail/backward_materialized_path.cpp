// expect: posenc::attention_backward: this path has no backward pass yet; use path::reference
// The materialized path has no backward pass yet: asking for it is one sentence, not an error from a kernel.
#include <posenc/attention/backward.hpp>
#include <posenc/encoding/none.hpp>

#include <vector>

int main() {
  std::vector<float> q(16), k(16), v(16), out(16), dout(16), dq(16), dk(16), dv(16);
  auto at = [](std::vector<float>& x) { return posenc::make_bshd(x.data(), 1, 2, 1, 8); };
  posenc::no_gradients none;
  posenc::attention_backward<posenc::path::materialized>(at(q), at(k), at(v), at(out), at(dout), at(dq), at(dk), at(dv),
                                                         posenc::none{}, posenc::attention_options<float>{}, none);
  return 0;
}
