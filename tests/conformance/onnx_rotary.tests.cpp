// SPDX-License-Identifier: MIT
// The 8 ONNX RotaryEmbedding (opset 23) backend cases, read at test time from ../shared/conformance/onnx.
//
// ONNX takes caller-supplied cos/sin caches (random numbers in these cases,
// not cos/sin of anything), by position id (max_pos + 1, rotary_dim / 2) or
// per token (batch, seq, rotary_dim / 2); 4-D X is (batch, heads, seq, dim),
// 3-D X is (batch, seq, heads * dim) with the num_heads attribute.
#include <posenc/encoding/rope.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/onnx_case.hpp"

using posenc::index_t;

namespace {

void run_case(std::string const& dir, std::string const& name) {
  auto const c = posenc_test::read_onnx_case(dir + "/" + name + ".txt");
  INFO("case " << name);
  REQUIRE(c.op == "RotaryEmbedding");
  auto const* X = c.input(0);
  auto const* cos_in = c.input(1);
  auto const* sin_in = c.input(2);
  auto const* ids_in = c.input(3);
  auto const* Y = c.output(0);
  REQUIRE(X != nullptr);
  REQUIRE(cos_in != nullptr);
  REQUIRE(sin_in != nullptr);
  REQUIRE(Y != nullptr);
  REQUIRE(X->dtype == "float32");

  index_t batch = 0, seq = 0, heads = 0, dim = 0;
  bool const four_d = X->dims.size() == 4;
  if (four_d) {  // (batch, heads, seq, dim)
    batch = X->dims[0];
    heads = X->dims[1];
    seq = X->dims[2];
    dim = X->dims[3];
  } else {  // (batch, seq, hidden), hidden = num_heads * dim
    REQUIRE(X->dims.size() == 3);
    REQUIRE(c.has_attr("num_heads"));
    batch = X->dims[0];
    seq = X->dims[1];
    heads = static_cast<index_t>(c.attr_num("num_heads", 0));
    dim = X->dims[2] / heads;
  }
  bool const interleaved = c.attr_num("interleaved", 0) != 0;
  index_t const rdim = static_cast<index_t>(c.attr_num("rotary_embedding_dim", 0));
  posenc::rope_options o;
  o.rotary_dim = rdim == 0 ? dim : rdim;
  posenc::rope<float> const rp(interleaved ? posenc::rope_layout::interleaved : posenc::rope_layout::half_split, dim, o);

  std::vector<float> x(X->values.begin(), X->values.end()), y(x.size(), -7.0f);
  std::vector<float> cs(cos_in->values.begin(), cos_in->values.end()), sn(sin_in->values.begin(), sin_in->values.end());
  auto in = four_d ? posenc::make_bhsd(x.data(), batch, heads, seq, dim) : posenc::make_bshd(x.data(), batch, seq, heads, dim);
  auto out = four_d ? posenc::make_bhsd(y.data(), batch, heads, seq, dim) : posenc::make_bshd(y.data(), batch, seq, heads, dim);
  index_t const width = cos_in->dims.back();
  REQUIRE(width == *o.rotary_dim / 2);

  std::vector<index_t> ids;
  if (ids_in) {  // caches (max_pos + 1, width) indexed by position_ids (batch, seq)
    REQUIRE(cos_in->dims.size() == 2);
    for (double v : ids_in->values) ids.push_back(static_cast<index_t>(v));
    auto const cache = posenc::rope_cache<float>::by_position(cs.data(), sn.data(), cos_in->dims[0], width);
    auto const pos = posenc::position_span::ids(ids.data(), batch, seq);
    rp.rotate_copy(in, out, pos, cache);
    std::vector<float> inplace = x;
    auto v = four_d ? posenc::make_bhsd(inplace.data(), batch, heads, seq, dim)
                    : posenc::make_bshd(inplace.data(), batch, seq, heads, dim);
    rp.rotate(v, pos, cache);
    CHECK(inplace == y);
  } else {  // per-token caches (batch, seq, width)
    REQUIRE(cos_in->dims.size() == 3);
    auto const cache = posenc::rope_cache<float>::per_token(cs.data(), sn.data(), batch, seq, width);
    rp.rotate_copy(in, out, cache);
    std::vector<float> inplace = x;
    auto v = four_d ? posenc::make_bhsd(inplace.data(), batch, heads, seq, dim)
                    : posenc::make_bshd(inplace.data(), batch, seq, heads, dim);
    rp.rotate(v, cache);
    CHECK(inplace == y);
  }

  REQUIRE(Y->values.size() == y.size());
  double worst = 0;
  for (std::size_t i = 0; i < y.size(); ++i)
    worst = std::max(worst, std::abs(static_cast<double>(y[i]) - Y->values[i]) / std::max(1.0, std::abs(Y->values[i])));
  CHECK(worst <= 1e-5);
}

}  // namespace

TEST_CASE("onnx RotaryEmbedding: the 8 backend cases at 1e-5", "[rope][onnx]") {
  std::string const dir = posenc_test::onnx_dir_or_skip();
  auto const names = posenc_test::onnx_case_names(dir, "test_rotary_embedding");
  REQUIRE(names.size() == 8);
  for (auto const& n : names) run_case(dir, n);
}
