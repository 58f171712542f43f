// SPDX-License-Identifier: MIT
// RoPE postconditions: (1) norm preserved (times the attention factor), (2) inverse(rotate(x)) == x,
// (3) <R_m q, R_n k> depends only on m - n, (4) the layouts agree under the pair permutation,
// (5) the partial-rotary tail is untouched.
#include <posenc/encoding/rope.hpp>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/random.hpp"

namespace properties_rope_tests {

using posenc::index_t;
using posenc::position_span;
using posenc::rope;
using posenc::rope_layout;
using posenc::rope_options;
using posenc::rope_scaling;

namespace {

struct named_scaling {
  std::string name;
  rope_scaling sc;
  index_t length;  // fixed length passed to every call (matters for dynamic and longrope)
};

std::vector<named_scaling> scalings(index_t r) {
  std::vector<double> sf, lf;
  for (index_t k = 0; k < r / 2; ++k) {
    sf.push_back(1.0 + 0.01 * static_cast<double>(k));
    lf.push_back(1.0 + 0.5 * static_cast<double>(k));
  }
  rope_scaling yarn_ds = rope_scaling::yarn(40.0, 4096);
  yarn_ds.mscale = 0.707;
  yarn_ds.mscale_all_dim = 0.5;
  return {{"none", rope_scaling::none(), 0},
          {"linear", rope_scaling::linear(4.0), 0},
          {"linear < 1", rope_scaling::linear(0.5), 0},
          {"yarn", rope_scaling::yarn(8.0, 4096), 0},
          {"yarn mscale", yarn_ds, 0},
          {"llama3", rope_scaling::llama3(8.0, 1.0, 4.0, 8192), 0},
          {"dynamic at 3e6", rope_scaling::dynamic_ntk(2.0, 4096), 3000000},
          {"longrope short", rope_scaling::longrope(sf, lf, 4096, 131072), 4096},
          {"longrope long", rope_scaling::longrope(sf, lf, 4096, 131072), 3000000}};
}

double dot(std::vector<double> const& a, std::vector<double> const& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

/// Rotates one head vector at position p.
std::vector<double> rotated(rope<double> const& r, std::vector<double> x, index_t p, index_t length) {
  auto v = posenc::make_bshd(x.data(), 1, 1, 1, r.head_dim());
  r.rotate(v, position_span(p), length > 0 ? length : p + 1);
  return x;
}

}  // namespace

TEST_CASE("rope property 1, 2: norm scales by the attention factor; inverse(rotate(x)) == x", "[rope][properties]") {
  index_t const d = 96, r = 64;
  for (auto const& s : scalings(r)) {
    for (rope_layout layout : {rope_layout::half_split, rope_layout::interleaved}) {
      rope_options o;
      o.rotary_dim = r;
      o.scaling = s.sc;
      rope<double> const rp(layout, d, o);
      std::mt19937_64 gen(17);
      // A fixed length bounds the positions (length >= largest position + 1).
      std::uniform_int_distribution<index_t> pos(0, s.length > 0 ? s.length - 1 : 2000000);
      for (int trial = 0; trial < 20; ++trial) {
        auto x = posenc_test::random_vector<double>(static_cast<std::size_t>(d), 100 + static_cast<std::uint64_t>(trial));
        index_t const p = pos(gen);
        index_t const len = s.length > 0 ? s.length : p + 1;
        double const a = rp.frequencies(len).attention_factor;
        auto y = rotated(rp, x, p, len);
        std::vector<double> xr(x.begin(), x.begin() + r), yr(y.begin(), y.begin() + r);
        INFO(s.name << " p=" << p);
        CHECK(std::sqrt(dot(yr, yr)) == posenc_test::Approx(a * std::sqrt(dot(xr, xr))).epsilon(1e-13));
        auto v = posenc::make_bshd(y.data(), 1, 1, 1, d);
        rp.rotate_inverse(v, position_span(p), len);
        CHECK(posenc_test::max_abs_diff(y, x) < 1e-14);
      }
    }
  }
}

TEST_CASE("rope property 1, 2 in float", "[rope][properties]") {
  rope_options o;
  o.scaling = rope_scaling::yarn(16.0, 2048);
  rope<float> const rp(rope_layout::interleaved, 128, o);
  auto x = posenc_test::random_vector<float>(3 * 5 * 4 * 128, 9);
  auto y = x;
  auto v = posenc::make_bshd(y.data(), 3, 5, 4, 128);
  rp.rotate(v, position_span(123456));
  double const a = rp.frequencies(1).attention_factor;
  for (std::size_t h = 0; h < 60; ++h) {
    double nx = 0, ny = 0;
    for (std::size_t i = 0; i < 128; ++i) {
      nx += double(x[h * 128 + i]) * x[h * 128 + i];
      ny += double(y[h * 128 + i]) * y[h * 128 + i];
    }
    CHECK(std::sqrt(ny) == posenc_test::Approx(a * std::sqrt(nx)).epsilon(1e-6));
  }
  rp.rotate_inverse(v, position_span(123456));
  CHECK(posenc_test::max_abs_diff(y, x) < 1e-6);
}

TEST_CASE("rope property 3: <R_m q, R_n k> depends only on m - n (shifts up to 1e6)", "[rope][properties]") {
  index_t const d = 128;
  for (auto const& s : scalings(d)) {
    for (rope_layout layout : {rope_layout::half_split, rope_layout::interleaved}) {
      rope_options o;
      o.scaling = s.sc;
      rope<double> const rp(layout, d, o);
      std::mt19937_64 gen(5);
      index_t const len = s.length > 0 ? s.length : 2100000;  // every position below stays < len
      index_t const top = std::min<index_t>(1000000, len / 2);
      std::uniform_int_distribution<index_t> pos(0, top), shift(-top, top);
      for (int trial = 0; trial < 12; ++trial) {
        auto q = posenc_test::random_vector<double>(static_cast<std::size_t>(d), 200 + static_cast<std::uint64_t>(trial));
        auto k = posenc_test::random_vector<double>(static_cast<std::size_t>(d), 300 + static_cast<std::uint64_t>(trial));
        index_t const m = pos(gen), n = pos(gen);
        index_t t = shift(gen);
        t = std::max(t, -std::min(m, n));  // positions stay >= 0
        double const s0 = dot(rotated(rp, q, m, len), rotated(rp, k, n, len));
        double const s1 = dot(rotated(rp, q, m + t, len), rotated(rp, k, n + t, len));
        double const scale = std::sqrt(dot(q, q) * dot(k, k));
        INFO(s.name << " m=" << m << " n=" << n << " shift=" << t);
        // Angles near 2e6 carry ~2e-16 * 2e6 = 4e-10 of rounding.
        CHECK(std::abs(s0 - s1) <= 1e-8 * scale);
      }
    }
  }
}

TEST_CASE("rope property 3 fails for a dynamic scaling across lengths (the documented caveat)", "[rope][properties]") {
  rope_options o;
  o.scaling = rope_scaling::dynamic_ntk(4.0, 1024);
  rope<double> const rp(rope_layout::half_split, 64, o);
  auto q = posenc_test::random_vector<double>(64, 1), k = posenc_test::random_vector<double>(64, 2);
  double const short_len = dot(rotated(rp, q, 900, 1000), rotated(rp, k, 100, 1000));
  double const long_len = dot(rotated(rp, q, 900, 5000), rotated(rp, k, 100, 5000));
  CHECK(std::abs(short_len - long_len) > 1e-6);
}

TEST_CASE("rope property 4: interleaved(x) == P^-1 half_split(P x), bit for bit", "[rope][properties]") {
  for (index_t r : {2, 6, 32, 64, 128}) {
    index_t const d = r + 10;
    for (auto const& s : scalings(r)) {
      if (s.sc.type == posenc::rope_scaling_type::dynamic && r == 2) continue;  // dynamic needs r > 2
      rope_options o;
      o.rotary_dim = r;
      o.scaling = s.sc;
      rope<float> const half(rope_layout::half_split, d, o), inter(rope_layout::interleaved, d, o);
      auto x = posenc_test::random_vector<float>(static_cast<std::size_t>(4 * d), 77);
      std::vector<float> px = x;  // P x: component 2k -> k, 2k+1 -> k + r/2, per head
      for (index_t h = 0; h < 4; ++h)
        for (index_t k = 0; k < r / 2; ++k) {
          px[static_cast<std::size_t>(h * d + k)] = x[static_cast<std::size_t>(h * d + 2 * k)];
          px[static_cast<std::size_t>(h * d + k + r / 2)] = x[static_cast<std::size_t>(h * d + 2 * k + 1)];
        }
      index_t const len = s.length > 0 ? s.length : 1000000;
      inter.rotate(posenc::make_bshd(x.data(), 1, 2, 2, d), position_span(len - 2), len);
      half.rotate(posenc::make_bshd(px.data(), 1, 2, 2, d), position_span(len - 2), len);
      bool ok = true;
      for (index_t h = 0; h < 4; ++h) {
        for (index_t k = 0; k < r / 2; ++k) {
          ok = ok && x[static_cast<std::size_t>(h * d + 2 * k)] == px[static_cast<std::size_t>(h * d + k)];
          ok = ok && x[static_cast<std::size_t>(h * d + 2 * k + 1)] == px[static_cast<std::size_t>(h * d + k + r / 2)];
        }
        for (index_t i = r; i < d; ++i) ok = ok && x[static_cast<std::size_t>(h * d + i)] == px[static_cast<std::size_t>(h * d + i)];
      }
      INFO(s.name << " r=" << r);
      CHECK(ok);
    }
  }
}

TEST_CASE("rope property 5: the partial-rotary tail is untouched (in place, inverse, out of place)", "[rope][properties]") {
  for (rope_layout layout : {rope_layout::half_split, rope_layout::interleaved}) {
    rope_options o;
    o.rotary_dim = 20;  // StableLM-like: 80 * 0.25
    o.scaling = rope_scaling::yarn(4.0, 512);
    rope<float> const rp(layout, 80, o);
    auto x = posenc_test::random_vector<float>(2 * 7 * 3 * 80, 3);
    auto y = x;
    auto v = posenc::make_bshd(y.data(), 2, 7, 3, 80);
    rp.rotate(v, position_span(11));
    bool tail = true, head_changed = false;
    for (std::size_t h = 0; h < 42; ++h) {
      for (std::size_t i = 20; i < 80; ++i) tail = tail && y[h * 80 + i] == x[h * 80 + i];
      for (std::size_t i = 0; i < 20; ++i) head_changed = head_changed || y[h * 80 + i] != x[h * 80 + i];
    }
    CHECK(tail);
    CHECK(head_changed);
    rp.rotate_inverse(v, position_span(11));
    for (std::size_t h = 0; h < 42; ++h)
      for (std::size_t i = 20; i < 80; ++i) tail = tail && y[h * 80 + i] == x[h * 80 + i];
    CHECK(tail);
  }
}
}  // namespace properties_rope_tests
