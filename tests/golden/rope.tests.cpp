// SPDX-License-Identifier: MIT
// RoPE against golden values from tests/golden/gen_rope.py (numpy float64, written from docs/formulas.md 3).
#include <posenc/encoding/rope.hpp>

#include <cfloat>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/golden.hpp"

namespace golden_rope_tests {

using posenc::index_t;
using posenc::rope;
using posenc::rope_layout;
using posenc::rope_options;
using posenc::rope_scaling;

namespace {

struct config {
  std::string name;
  std::vector<index_t> lengths;
};

/// The scalings of gen_rope.py CONFIGS, built through the typed API.
rope_scaling make_scaling(std::string const& name, index_t r, posenc_test::golden_file const& g) {
  if (name == "none") return rope_scaling::none();
  if (name == "linear") return rope_scaling::linear(4.0);
  if (name == "dynamic") return rope_scaling::dynamic_ntk(2.0, 4096);
  if (name == "yarn") return rope_scaling::yarn(8.0, 4096);
  if (name == "yarn_mscale") {
    auto s = rope_scaling::yarn(40.0, 4096);
    s.mscale = 1.0;
    s.mscale_all_dim = 0.5;
    return s;
  }
  if (name == "yarn_notrunc") {
    auto s = rope_scaling::yarn(32.0, 4096);
    s.truncate = false;
    return s;
  }
  if (name == "llama3") return rope_scaling::llama3(8.0, 1.0, 4.0, 8192);
  if (name == "longrope")
    return rope_scaling::longrope(posenc_test::golden_record(g, "longrope_short/r" + std::to_string(r)),
                                  posenc_test::golden_record(g, "longrope_long/r" + std::to_string(r)), 4096, 131072);
  FAIL("unknown config " << name);
  return {};
}

std::vector<config> const& configs() {
  static std::vector<config> const c = {{"none", {1048576}},        {"linear", {1048576}},
                                        {"dynamic", {4096, 1048576}}, {"yarn", {1048576}},
                                        {"yarn_mscale", {1048576}}, {"yarn_notrunc", {1048576}},
                                        {"llama3", {1048576}},      {"longrope", {4096, 1048576}}};
  return c;
}

std::string base_tag(double base) { return "b" + std::to_string(static_cast<long long>(base)); }

}  // namespace

TEST_CASE("rope golden: YaRN example of docs/formulas.md 3.5", "[rope][golden]") {
  auto const g = posenc_test::read_golden("rope.txt");
  auto const& ex = posenc_test::golden_record(g, "yarn_example");
  auto [lo, hi] = posenc::yarn_correction_range(64, 10000.0, 32.0, 1.0, 4096, true);
  CHECK(lo == 10.0);
  CHECK(hi == 23.0);
  CHECK(lo == ex[1]);
  CHECK(hi == ex[2]);
  rope_options o;
  o.scaling = rope_scaling::yarn(8.0, 4096);
  rope<double> const r(rope_layout::half_split, 64, o);
  CHECK(r.frequencies(1).attention_factor == 1.2079441541679836);
  CHECK(ex[0] == 1.2079441541679836);
}

TEST_CASE("rope golden: frequencies and attention factor of every scaling", "[rope][golden]") {
  auto const g = posenc_test::read_golden("rope.txt");
  for (auto const& c : configs())
    for (double base : {10000.0, 500000.0})
      for (index_t r : {32, 64, 128})
        for (index_t len : c.lengths) {
          std::string const tag = c.name + "/" + base_tag(base) + "/r" + std::to_string(r) + "/L" + std::to_string(len);
          rope_options o;
          o.base = base;
          o.scaling = make_scaling(c.name, r, g);
          rope<double> const rp(rope_layout::half_split, r, o);
          auto const f = rp.frequencies(len);
          auto const& want = posenc_test::golden_record(g, "freq/" + tag);
          auto const& a = posenc_test::golden_record(g, "attn/" + tag);
          INFO(tag);
          REQUIRE(want.size() == f.inv_freq.size());
          double worst = 0;
          for (std::size_t k = 0; k < want.size(); ++k)
            worst = std::max(worst, std::abs(f.inv_freq[k] - want[k]) / want[k]);
          CHECK(worst <= 4 * DBL_EPSILON);  // numpy's double formula vs our long double one
          CHECK(f.attention_factor == posenc_test::Approx(a[0]).epsilon(1e-15));
        }
}

TEMPLATE_TEST_CASE("rope golden: rotated heads, both layouts, bases 1e4 and 5e5, head_dim 64 and 128",
                   "[rope][golden]", float, double) {
  using T = TestType;
  auto const g = posenc_test::read_golden("rope.txt");
  auto const& positions = posenc_test::golden_record(g, "positions");
  struct shape {
    index_t d, r;
  };
  int records = 0;
  for (auto const& c : configs())
    for (double base : {10000.0, 500000.0})
      for (shape sh : {shape{64, 64}, shape{128, 128}, shape{128, 32}})
        for (index_t len : c.lengths)
          for (rope_layout layout : {rope_layout::half_split, rope_layout::interleaved}) {
            std::string const tag = "out/" + c.name + "/" + (layout == rope_layout::half_split ? "half" : "interleaved") +
                                    "/" + base_tag(base) + "/d" + std::to_string(sh.d) + "/r" + std::to_string(sh.r) +
                                    "/L" + std::to_string(len);
            auto const& want = posenc_test::golden_record(g, tag);
            auto const& x = posenc_test::golden_record(g, "x/d" + std::to_string(sh.d));
            rope_options o;
            o.base = base;
            o.rotary_dim = sh.r;
            o.scaling = make_scaling(c.name, sh.r, g);
            rope<T> const rp(layout, sh.d, o);
            // Every position < len of the list, one token each, in one call with the record's length.
            std::vector<index_t> ids;
            for (double p : positions)
              if (static_cast<index_t>(p) < len) ids.push_back(static_cast<index_t>(p));
            index_t const n = static_cast<index_t>(ids.size());
            std::vector<T> buf(static_cast<std::size_t>(n * sh.d));
            for (index_t t = 0; t < n; ++t)
              for (index_t i = 0; i < sh.d; ++i) buf[static_cast<std::size_t>(t * sh.d + i)] = static_cast<T>(x[static_cast<std::size_t>(i)]);
            rp.rotate(posenc::make_bshd(buf.data(), 1, n, 1, sh.d), posenc::position_span::ids(ids.data(), 1, n), len);
            INFO(tag);
            REQUIRE(want.size() == buf.size());
            double const a = rp.frequencies(len).attention_factor;
            bool ok = true;
            for (index_t t = 0; t < n; ++t)
              for (index_t i = 0; i < sh.d; ++i) {
                std::size_t const j = static_cast<std::size_t>(t * sh.d + i);
                // double: numpy's theta and angle are double (1-2 ulp of theta, i.e. ~5e-10 of phase at
                // p ~ 1e6). float: cos/sin rounded to float (u each), b*s and the fma (u each): 3u(|a|+|b|)*af.
                double const tol = std::is_same<T, float>::value ? 3 * (FLT_EPSILON / 2) * 2 * a + 1e-9 : 1e-9;
                if (std::abs(static_cast<double>(buf[j]) - want[j]) > tol) ok = false;
              }
            CHECK(ok);
            ++records;
          }
  CHECK(records == 2 * 3 * 2 * 10);  // bases x shapes x layouts x (config, length)
}
}  // namespace golden_rope_tests
