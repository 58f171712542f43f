// expect: posenc::attention: the encoder's value_type is not the element type of q, k, v and out
// compose<> is checked part by part: one part built for double with float views is the same sentence.
#include <posenc/attention/attention.hpp>
#include <posenc/encoding/alibi.hpp>
#include <posenc/encoding/compose.hpp>
#include <posenc/encoding/rope.hpp>

#include <vector>

int main() {
  std::vector<float> x(16);
  auto v = posenc::make_bshd(x.data(), 1, 2, 1, 8);
  posenc::compose enc(posenc::rope<float>(posenc::rope_layout::half_split, 8),
                      posenc::alibi<double>(posenc::alibi_form::paper, 1));
  posenc::attention(v, v, v, v, enc);
  return 0;
}
