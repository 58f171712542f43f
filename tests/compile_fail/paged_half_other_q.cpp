// expect: posenc::attention: over a 16-bit paged_kv_cache, q and out are float or of the cache's 16-bit type; q of the other 16-bit type
// bfloat16 q and out over an Eigen::half paged cache is not a supported mix: one sentence.
#include <posenc/attention/paged_attention.hpp>
#include <posenc/encoding/none.hpp>

#include <vector>

int main() {
  posenc::paged_kv_cache<Eigen::half> cache(4, 16, 1, 8);
  std::vector<posenc::index_t> ids = {cache.add_sequence()};
  std::vector<Eigen::bfloat16> x(8);
  auto q = posenc::make_bshd(x.data(), 1, 1, 1, 8);
  posenc::attention(q, cache, ids, q, posenc::none{});
  return 0;
}
