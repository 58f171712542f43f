// SPDX-License-Identifier: MIT
// The fused kernel's scratch: laid out from one description, and a take() past the end is caught.
#include <cstdint>
#include <stdexcept>
#include <string>

namespace {
/// The assertion a debug build makes, turned into an exception so that the
/// test can observe it (in any build type).
struct scratch_assert : std::logic_error {
  using std::logic_error::logic_error;
};
}  // namespace

#define POSENC_ASSERT(cond, msg) ((cond) ? (void)0 : throw scratch_assert(msg))

#include <posenc/attention/fused.hpp>

#include "support/catch.hpp"

using posenc::index_t;
namespace fused = posenc::detail::fused;

TEST_CASE("fused scratch: carve hands out aligned pieces and catches a take past the end", "[fused][scratch]") {
  alignas(64) float buf[64];
  fused::carve<float> c(buf, 64);
  float* a = c.take(5);  // 16 elements
  float* b = c.take(16);
  CHECK(a == buf);
  CHECK(b == buf + 16);
  CHECK(reinterpret_cast<std::uintptr_t>(b) % 64 == 0);
  CHECK(c.left() == 32);
  CHECK_NOTHROW(c.take(32));
  CHECK(c.left() == 0);
  REQUIRE_THROWS_AS(c.take(1), scratch_assert);
  fused::carve<float> d(buf, 64);
  REQUIRE_THROWS_AS(d.take(65), scratch_assert);
  REQUIRE_THROWS_AS(d.take(-1), scratch_assert);
}

TEST_CASE("fused scratch: each layout fits the size computed from its own description", "[fused][scratch]") {
  using tr = posenc::detail::fused_default_traits<float>;
  for (index_t D : {1, 7, 64, 128, 257}) {
    for (index_t Dv : {1, 16, 130}) {
      index_t const n = fused::scratch_elements<fused::lane_scratch<tr>>(D, Dv);
      posenc::aligned_buffer<float> mem(n);
      auto const s = fused::carve_scratch<fused::lane_scratch<tr>>(mem.data(), n, D, Dv);
      CHECK(s.blocks[0].qt == mem.data());
      CHECK(s.diag + tr::block_kv_v + tr::block_q_v <= mem.data() + n);
      // One element fewer: the description no longer fits and the carve says so.
      REQUIRE_THROWS_AS((fused::carve_scratch<fused::lane_scratch<tr>>(mem.data(), n - 1, D, Dv)), scratch_assert);
    }
    for (index_t rows : {index_t{4}, index_t{64}}) {
      index_t const n = fused::scratch_elements<fused::row_scratch<tr>>(D, rows);
      posenc::aligned_buffer<float> mem(n);
      auto const s = fused::carve_scratch<fused::row_scratch<tr>>(mem.data(), n, D, rows);
      CHECK(s.qbuf + rows * D <= mem.data() + n);
      REQUIRE_THROWS_AS((fused::carve_scratch<fused::row_scratch<tr>>(mem.data(), n - 1, D, rows)), scratch_assert);
    }
  }
  // The public per-thread bound covers every layout the kernel carves.
  CHECK(posenc::detail::fused_scratch_elements<float>(128, 128, 8) >=
        fused::scratch_elements<fused::row_scratch<tr>>(128, 8 * tr::max_decode_groups_v * tr::row_group_v));
}
