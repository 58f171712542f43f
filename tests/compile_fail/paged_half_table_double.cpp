// expect: posenc::attention: an encoder with a 16-bit table .Eigen::half, Eigen::bfloat16. computes in float
// A 16-bit T5 table over a double paged cache: the sentence of the contiguous call, not a contract error.
#include <posenc/attention/paged_attention.hpp>
#include <posenc/encoding/t5_bias.hpp>

#include <vector>

int main() {
  posenc::paged_kv_cache<double> cache(4, 16, 1, 8);
  std::vector<posenc::index_t> ids = {cache.add_sequence()};
  std::vector<double> x(8);
  posenc::t5_bias<Eigen::half> const enc({1, true, 32, 128}, 5);
  posenc::attention(posenc::make_bshd<const double>(x.data(), 1, 1, 1, 8), cache, ids,
                    posenc::make_bshd(x.data(), 1, 1, 1, 8), enc);
  return 0;
}
