// expect: a raw pointer carries no size
// attention_options::lse knows its size: a raw pointer, whose size cannot be checked, does not convert.
#include <posenc/attention/options.hpp>

#include <vector>

int main() {
  std::vector<float> lse(12);
  posenc::attention_options<float> opt;
  opt.lse = lse.data();
  return opt.lse ? 0 : 1;
}
