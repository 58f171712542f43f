// expect: posenc::attention: over a 16-bit paged_kv_cache, q and out must be float or of the cache's 16-bit type
// Double q and out over a 16-bit paged cache is not a supported mix: one sentence, not an overload error.
#include <posenc/attention/paged_attention.hpp>
#include <posenc/encoding/none.hpp>

#include <vector>

int main() {
  posenc::paged_kv_cache<Eigen::half> cache(4, 16, 1, 8);
  std::vector<posenc::index_t> ids = {cache.add_sequence()};
  std::vector<double> x(8);
  auto q = posenc::make_bshd(x.data(), 1, 1, 1, 8);
  posenc::attention(q, cache, ids, q, posenc::none{});
  return 0;
}
