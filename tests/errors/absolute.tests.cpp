// SPDX-License-Identifier: MIT
// Bad inputs to the absolute encoders and their position helpers: posenc::error naming the argument, outputs untouched.
#include <posenc/encoding/learned.hpp>
#include <posenc/encoding/sinusoidal.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "support/catch.hpp"
#include "support/random.hpp"

namespace errors_absolute_tests {

using posenc::index_t;
using posenc::position_span;
using posenc::sinusoidal_params;

namespace {
// A buffer plus a pristine copy: `untouched()` is true when no byte changed.
template <class T>
struct guarded {
  std::vector<T> data, copy;
  explicit guarded(std::size_t n, std::uint64_t seed = 3)
      : data(posenc_test::random_vector<T>(n, seed)), copy(data) {}
  bool untouched() const { return std::memcmp(data.data(), copy.data(), data.size() * sizeof(T)) == 0; }
};
using posenc_test::contains;
double const inf = std::numeric_limits<double>::infinity();
double const qnan = std::numeric_limits<double>::quiet_NaN();
}  // namespace

TEST_CASE("errors: sinusoidal parameters", "[errors][sinusoidal]") {
  using S = posenc::sinusoidal<float>;
  REQUIRE_THROWS_AS(S(0), posenc::error);
  REQUIRE_THROWS_WITH(S(0), contains("posenc::sinusoidal: d_model is 0, expected > 0"));
  REQUIRE_THROWS_WITH(S(-3), contains("d_model is -3"));
  for (double b : {0.0, -1.0, inf, -inf, qnan}) {
    REQUIRE_THROWS_AS(S(8, posenc::sinusoidal_layout::interleaved, posenc::sinusoidal_frequency::paper, b),
                      posenc::error);
    REQUIRE_THROWS_WITH(S(8, posenc::sinusoidal_layout::interleaved, posenc::sinusoidal_frequency::paper, b),
                        contains("posenc::sinusoidal: base is"));
  }
  REQUIRE_THROWS_WITH(S(8, posenc::sinusoidal_layout::interleaved, posenc::sinusoidal_frequency::tensor2tensor),
                      contains("frequency is tensor2tensor, expected paper with the interleaved layout"));
  sinusoidal_params p;
  p.d_model = 8;
  p.padding_idx = -2;
  REQUIRE_THROWS_WITH(S(p), contains("padding_idx is -2"));
  p.padding_idx = -1;
  p.cache_positions = -1;
  REQUIRE_THROWS_WITH(S(p), contains("cache_positions is -1"));
  S ok(8);
  REQUIRE_THROWS_WITH(ok.reserve(-5), contains("posenc::sinusoidal::reserve: positions is -5"));
  REQUIRE_THROWS_WITH(ok.value(-1, 0), contains("posenc::sinusoidal::value: pos is -1, expected >= 0"));
  REQUIRE_THROWS_WITH(ok.value(0, 8), contains("column is 8, expected in [0, 8)"));
  REQUIRE_THROWS_WITH(ok.value(0, -1), contains("column is -1"));
}

TEST_CASE("errors: sinusoidal fill and add_to leave outputs untouched", "[errors][sinusoidal]") {
  posenc::sinusoidal<float> enc(8);
  guarded<float> out(3 * 8);
  REQUIRE_THROWS_WITH(enc.fill(-1, 3, out.data), contains("posenc::sinusoidal::fill: first_pos is -1"));
  REQUIRE_THROWS_WITH(enc.fill(0, -3, out.data), contains("count is -3"));
  REQUIRE_THROWS_WITH(enc.fill(0, 4, out.data), contains("out.size is 24, expected 32 (count * d_model)"));
  CHECK(out.untouched());

  guarded<float> x(2 * 4 * 8);
  auto xv = posenc::make_bsd(x.data.data(), 2, 4, 8);
  // negative positions: an offset, and one explicit id after valid ones
  REQUIRE_THROWS_AS(enc.add_to(xv, position_span(-1)), posenc::error);
  REQUIRE_THROWS_WITH(enc.add_to(xv, position_span(-1)), contains("positions position of batch 0 token 0 is -1"));
  std::vector<index_t> ids = {0, 1, 2, 3, 4, 5, 6, -7};
  REQUIRE_THROWS_WITH(enc.add_to(xv, position_span::ids(ids.data(), 2, 4)), contains("token 3 is -7, expected >= 0"));
  std::vector<index_t> firsts = {3, -1};
  REQUIRE_THROWS_WITH(enc.add_to(xv, position_span::per_batch(firsts)), contains("batch 1 token 0 is -1"));
  // position shapes
  REQUIRE_THROWS_WITH(enc.add_to(xv, position_span::ids(ids.data(), 2, 3)), contains("positions seq is 3, expected 4"));
  std::vector<index_t> one = {0};
  REQUIRE_THROWS_WITH(enc.add_to(xv, position_span::per_batch(one)), contains("has 1 per-batch offsets, expected 2"));
  // x's last dim
  auto bad_dim = posenc::make_bsd(x.data.data(), 2, 4, 7);
  REQUIRE_THROWS_WITH(enc.add_to(bad_dim, position_span(0)),
                      contains("posenc::sinusoidal::add_to: x.dim is 7, expected 8 (d_model)"));
  auto strided = xv;
  strided.dim_stride = 2;
  REQUIRE_THROWS_WITH(enc.add_to(strided, position_span(0)), contains("x.dim_stride is 2"));
  auto null = xv;
  null.data = nullptr;
  REQUIRE_THROWS_WITH(enc.add_to(null, position_span(0)), contains("x.data is null"));
  auto neg = xv;
  neg.seq = -1;
  REQUIRE_THROWS_WITH(enc.add_to(neg, position_span(0)), contains("x.seq is -1"));
  REQUIRE_THROWS_WITH(enc.add_to(xv, position_span(0), std::numeric_limits<float>::quiet_NaN()),
                      contains("x_scale is nan"));
  CHECK(x.untouched());
}

TEST_CASE("errors: learned construction", "[errors][learned]") {
  using L = posenc::learned<float>;
  std::vector<float> t(10 * 4, 0.5f);
  REQUIRE_THROWS_AS(L::copy_of(t, 10, 5), posenc::error);
  REQUIRE_THROWS_WITH(L::copy_of(t, 10, 5),
                      contains("posenc::learned::copy_of: table.size is 40, expected 50 (rows 10 * d_model 5)"));
  REQUIRE_THROWS_WITH(L::view_of(t, 11, 4), contains("posenc::learned::view_of: table.size is 40, expected 44"));
  REQUIRE_THROWS_WITH(L::copy_of(t, 10, 0), contains("d_model is 0, expected > 0"));
  REQUIRE_THROWS_WITH(L::copy_of(t, 0, 4), contains("rows is 0, expected > 0"));
  REQUIRE_THROWS_WITH(L::copy_of(t, 10, 4, 10), contains("offset is 10, expected in [0, 10) (rows)"));
  REQUIRE_THROWS_WITH(L::copy_of(t, 10, 4, -1), contains("offset is -1"));
  REQUIRE_THROWS_WITH(L::view_of(posenc::span<const float>(nullptr, 40), 10, 4), contains("table.data is null"));
  REQUIRE_THROWS_WITH(L::random(10, 4, 1, 0, -0.1), contains("posenc::learned::random: stddev is -0.1"));
  REQUIRE_THROWS_WITH(L::random(10, 4, 1, 0, qnan), contains("stddev is nan"));
  REQUIRE_THROWS_WITH(L::random(10, 4, 1, 0, 0.02, 10), contains("padding_row is 10"));
  REQUIRE_THROWS_WITH(L::random(0, 4, 1), contains("rows is 0"));
  auto ok = L::copy_of(t, 10, 4, 2);
  REQUIRE_THROWS_WITH(ok.with_offset(10), contains("posenc::learned::with_offset: offset is 10"));
  REQUIRE_THROWS_WITH(ok.extended(0), contains("posenc::learned::extended: new_positions is 0, expected > 0"));
  REQUIRE_THROWS_WITH(ok.extended(-4, true), contains("new_positions is -4"));
  REQUIRE_THROWS_WITH(ok.value(8, 0), contains("posenc::learned::value: pos is 8, expected in [-2, 8) (table length 10, offset 2)"));
  REQUIRE_THROWS_WITH(ok.value(-3, 0), contains("pos is -3, expected in [-2, 8)"));
  REQUIRE_THROWS_WITH(ok.value(0, 4), contains("column is 4, expected in [0, 4)"));
}

TEST_CASE("errors: learned fill and add_to leave outputs untouched", "[errors][learned]") {
  std::vector<float> t(10 * 4, 0.5f);
  auto enc = posenc::learned<float>::copy_of(t, 10, 4, 2);
  guarded<float> out(3 * 4);
  REQUIRE_THROWS_WITH(enc.fill(6, 3, out.data), contains("posenc::learned::fill: last position is 8, expected in [-2, 8) (table length 10"));
  REQUIRE_THROWS_WITH(enc.fill(-3, 3, out.data), contains("first_pos is -3"));
  REQUIRE_THROWS_WITH(enc.fill(0, 2, out.data), contains("out.size is 12, expected 8"));
  REQUIRE_THROWS_WITH(enc.fill(0, -1, out.data), contains("count is -1"));
  CHECK(out.untouched());

  guarded<float> x(2 * 3 * 4);
  auto xv = posenc::make_bsd(x.data.data(), 2, 3, 4);
  // past the table: the last token of the last batch entry is the bad one
  std::vector<index_t> ids = {0, 1, 2, 3, 4, 8};
  REQUIRE_THROWS_AS(enc.add_to(xv, position_span::ids(ids.data(), 2, 3)), posenc::error);
  REQUIRE_THROWS_WITH(enc.add_to(xv, position_span::ids(ids.data(), 2, 3)),
                      contains("posenc::learned::add_to: position of batch 1 token 2 is 8, expected in [-2, 8) "
                               "(table length 10, offset 2)"));
  REQUIRE_THROWS_WITH(enc.add_to(xv, position_span(6)), contains("token 2 is 8"));
  std::vector<index_t> firsts = {0, 7};
  REQUIRE_THROWS_WITH(enc.add_to(xv, position_span::per_batch(firsts)), contains("batch 1 token 1 is 8"));
  // negative: below -offset
  std::vector<index_t> neg = {0, -3, 0, 0, 0, 0};
  REQUIRE_THROWS_WITH(enc.add_to(xv, position_span::ids(neg.data(), 2, 3)), contains("token 1 is -3, expected in [-2"));
  auto plain = enc.with_offset(0);
  REQUIRE_THROWS_WITH(plain.add_to(xv, position_span(-1)), contains("token 0 is -1, expected in [0, 10)"));
  // shapes
  REQUIRE_THROWS_WITH(enc.add_to(posenc::make_bsd(x.data.data(), 2, 4, 3), position_span(0)),
                      contains("posenc::learned::add_to: x.dim is 3, expected 4 (d_model)"));
  REQUIRE_THROWS_WITH(enc.add_to(xv, position_span::ids(ids.data(), 3, 2)), contains("positions batch is 3"));
  REQUIRE_THROWS_WITH(enc.add_to(xv, position_span(0), std::numeric_limits<float>::infinity()),
                      contains("x_scale is inf"));
  CHECK(x.untouched());
}

TEST_CASE("errors: position helpers leave outputs untouched", "[errors]") {
  std::vector<index_t> tokens = {5, 6, 1, 1, 7, 8};
  std::vector<index_t> out(6, 42), copy = out;
  REQUIRE_THROWS_WITH(posenc::fairseq_positions(tokens, 2, 4, 1, out),
                      contains("posenc::fairseq_positions: tokens.size is 6, expected 8 (batch * seq)"));
  std::vector<index_t> small(5, 42);
  REQUIRE_THROWS_WITH(posenc::fairseq_positions(tokens, 2, 3, 1, small), contains("out.size is 5, expected 6"));
  REQUIRE_THROWS_WITH(posenc::fairseq_positions(tokens, 2, 3, -1, out), contains("padding_idx is -1"));
  REQUIRE_THROWS_WITH(posenc::fairseq_positions(tokens, 2, 3, 1, out, -2), contains("past_len is -2"));
  REQUIRE_THROWS_WITH(posenc::fairseq_positions(tokens, -2, -3, 1, out), contains("batch is -2"));
  std::vector<int> mask = {1, 1, 0, 1, 1, 1};
  REQUIRE_THROWS_WITH(posenc::positions_from_mask<int>(mask, 2, 3, 4, out),
                      contains("posenc::positions_from_mask: seq is 4, expected in [0, 3] (total)"));
  REQUIRE_THROWS_WITH(posenc::positions_from_mask<int>(mask, 2, 4, 4, out), contains("mask.size is 6, expected 8"));
  REQUIRE_THROWS_WITH(posenc::positions_from_mask<int>(mask, 2, 3, 2, out), contains("out.size is 6, expected 4"));
  CHECK(out == copy);
  CHECK(small == std::vector<index_t>(5, 42));
}
}  // namespace errors_absolute_tests
