// SPDX-License-Identifier: MIT
// 8-bit blocks (posenc::q8_block) against golden values from tests/golden/gen_q8.py (numpy, docs/formulas.md 7.1).
#include <posenc/core/q8.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/golden.hpp"

namespace golden_q8_tests {

using posenc::index_t;

namespace {

posenc_test::golden_file const& golden() {
  static posenc_test::golden_file const g = posenc_test::read_golden("q8.txt");
  return g;
}
std::vector<double> const& rec(std::string const& name) { return posenc_test::golden_record(golden(), name); }

}  // namespace

TEST_CASE("q8: quantize_q8 gives numpy's scales and values bit for bit, and dequantize_q8 their products",
          "[golden][q8]") {
  for (char const* name : {"gaussian", "outlier_channels", "zeros", "negative_zeros", "ties", "subnormal_scale",
                           "vanishing", "partial_80", "magnitudes"}) {
    INFO(name);
    std::string const base = std::string("q8.") + name;
    std::vector<float> x;
    for (double v : rec(base + ".x")) x.push_back(static_cast<float>(v));  // written from float32: exact
    index_t const n = static_cast<index_t>(x.size()), nb = posenc::q8_blocks(n);
    std::vector<double> const& scales = rec(base + ".scale");
    std::vector<double> const& q = rec(base + ".q");
    REQUIRE(static_cast<index_t>(scales.size()) == nb);
    REQUIRE(static_cast<index_t>(q.size()) == nb * posenc::q8_block_values);
    std::vector<posenc::q8_block> blocks(static_cast<std::size_t>(nb));
    posenc::q8_result const r = posenc::quantize_q8(x.data(), n, blocks.data());
    REQUIRE(r);
    for (index_t b = 0; b < nb; ++b) {
      INFO("block " << b);
      CHECK(static_cast<double>(static_cast<float>(blocks[static_cast<std::size_t>(b)].scale)) ==
            scales[static_cast<std::size_t>(b)]);
      for (index_t i = 0; i < posenc::q8_block_values; ++i)
        CHECK(static_cast<double>(blocks[static_cast<std::size_t>(b)].q[i]) ==
              q[static_cast<std::size_t>(b * posenc::q8_block_values + i)]);
    }
    std::vector<float> back(static_cast<std::size_t>(n), -7.0f);
    posenc::dequantize_q8(blocks.data(), n, back.data());
    for (index_t i = 0; i < n; ++i)
      CHECK(static_cast<double>(back[static_cast<std::size_t>(i)]) ==
            scales[static_cast<std::size_t>(i / posenc::q8_block_values)] * q[static_cast<std::size_t>(i)]);
  }
}

}  // namespace golden_q8_tests
