// SPDX-License-Identifier: MIT
// rope<T>: SIMD kernels == scalar reference on every shape, strided/misaligned views, tables, caches, precision.
#include <posenc/encoding/rope.hpp>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/random.hpp"
#include "support/rope_reference.hpp"
#include "support/strided_buffer.hpp"

namespace encoding_rope_tests {

using posenc::index_t;
using posenc::position_span;
using posenc::rope;
using posenc::rope_layout;
using posenc::rope_options;
using posenc::rope_scaling;

namespace {

using posenc_test::strided_buffer;

template <class T>
bool same(std::vector<T> const& a, std::vector<T> const& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

/// Largest |a - b| relative to the largest |b|.
template <class T>
double rel_diff(std::vector<T> const& a, std::vector<T> const& b) {
  double m = 0, n = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    m = std::max(m, std::abs(double(a[i]) - double(b[i])));
    n = std::max(n, std::abs(double(b[i])));
  }
  return n > 0 ? m / n : m;
}

/// Checks rotate() and rotate_inverse() of rope `r` on a strided view against the scalar reference.
template <class T>
void check_against_reference(rope<T> const& r, index_t offset, index_t first_pos, index_t batch = 2, index_t seq = 3) {
  strided_buffer<T> x(batch, seq, 2, r.head_dim(), offset,
                      static_cast<std::uint64_t>(r.head_dim() * 1000 + r.rotary_dim()));
  strided_buffer<T> want = x;
  position_span const pos(first_pos);
  index_t const len = first_pos + seq;
  posenc_test::rope_reference<T>(r, x.v, want.v, pos, len);
  r.rotate(x.v, pos);
  if (posenc_test::rope_kernels_bitwise_equal()) {
    REQUIRE(same(x.buf, want.buf));
  } else {
    REQUIRE(rel_diff(x.buf, want.buf) < 8 * std::numeric_limits<T>::epsilon());
  }
  strided_buffer<T> back = x;
  posenc_test::rope_reference<T>(r, x.v, back.v, pos, len, true);
  r.rotate_inverse(x.v, pos);
  if (posenc_test::rope_kernels_bitwise_equal()) {
    REQUIRE(same(x.buf, back.buf));
  } else {
    REQUIRE(rel_diff(x.buf, back.buf) < 8 * std::numeric_limits<T>::epsilon());
  }
}

}  // namespace

TEST_CASE("rope: float SIMD == scalar for head_dim 2..256 and every even rotary_dim", "[rope][simd]") {
  for (rope_layout layout : {rope_layout::half_split, rope_layout::interleaved}) {
    for (index_t d = 2; d <= 256; ++d) {
      for (index_t r = 2; r <= d; r += 2) {
        rope_options o;
        o.rotary_dim = r;
        // Alternate plain and YaRN (attention factor != 1, so the inverse's 1/a^2 is exercised).
        if ((d + r / 2) % 2 == 1) o.scaling = rope_scaling::yarn(8.0, 64);
        rope<float> const rp(layout, d, o);
        check_against_reference(rp, (d + r) % 3, 1000 + d, 1, 2);  // 2 tokens x 2 heads, gaps between them
      }
    }
  }
}

TEST_CASE("rope: double SIMD == scalar around the vector width", "[rope][simd]") {
  std::vector<index_t> dims;
  for (index_t d = 2; d <= 40; ++d) dims.push_back(d);
  for (index_t d : {63, 64, 65, 127, 128, 129, 255, 256}) dims.push_back(d);
  for (rope_layout layout : {rope_layout::half_split, rope_layout::interleaved}) {
    for (index_t d : dims) {
      for (index_t r = 2; r <= d; r += 2) {
        rope_options o;
        o.rotary_dim = r;
        o.base = 500000.0;
        rope<double> const rp(layout, d, o);
        check_against_reference(rp, d % 2, 7 * d);
      }
    }
  }
}

TEMPLATE_TEST_CASE("rope: reserved table, threads and on-the-fly rows agree exactly", "[rope]", float, double) {
  using T = TestType;
  for (rope_layout layout : {rope_layout::half_split, rope_layout::interleaved}) {
    rope_options o;
    o.scaling = rope_scaling::llama3(8.0, 1.0, 4.0, 64);
    rope<T> plain(layout, 40, o);
    rope<T> table = plain;
    table.reserve(50);  // covers part of the positions below
    REQUIRE(table.reserved() == 50);
    rope<T> threaded = table;
    threaded.set_threads(2);
    strided_buffer<T> a(3, 37, 3, 40, 1, 11);
    strided_buffer<T> b = a, c = a;
    position_span const pos(20);  // positions 20..56: some in the table, some past it
    plain.rotate(a.v, pos);
    table.rotate(b.v, pos);
    threaded.rotate(c.v, pos);
    CHECK(same(a.buf, b.buf));
    CHECK(same(a.buf, c.buf));
  }
}

TEST_CASE("rope: a table built for another length is not used for dynamic scaling", "[rope]") {
  rope_options o;
  o.scaling = rope_scaling::dynamic_ntk(2.0, 16);
  rope<double> r(rope_layout::half_split, 32, o);
  rope<double> t = r;
  t.reserve(64);  // frequencies of length 64 (> M: scaled base)
  strided_buffer<double> a(1, 10, 2, 32, 0, 3);
  strided_buffer<double> b = a;
  r.rotate(a.v, position_span(0), 10);  // length 10 <= M: original base
  t.rotate(b.v, position_span(0), 10);
  CHECK(same(a.buf, b.buf));
  strided_buffer<double> c = b;
  t.rotate(c.v, position_span(0), 64);  // length 64: table frequencies; differs from length 10
  CHECK(!same(b.buf, c.buf));
  // With the table at length 64 == computing at length 64.
  strided_buffer<double> d = b;
  r.rotate(d.v, position_span(0), 64);
  CHECK(same(c.buf, d.buf));
}

TEMPLATE_TEST_CASE("rope: out-of-place, q and k together, position forms", "[rope]", float, double) {
  using T = TestType;
  rope_options o;
  o.rotary_dim = 24;
  o.scaling = rope_scaling::yarn(4.0, 128);
  for (rope_layout layout : {rope_layout::half_split, rope_layout::interleaved}) {
    // Sections inside a loop need a name per iteration, or they run for the first one only.
    std::string const tag = layout == rope_layout::half_split ? " (half-split)" : " (interleaved)";
    rope<T> const r(layout, 40, o);
    strided_buffer<T> x(2, 9, 4, 40, 1, 21);

    SECTION("rotate_copy == rotate in place; the input is untouched; the tail is copied" + tag) {
      strided_buffer<T> inplace = x;
      r.rotate(inplace.v, position_span(5));
      strided_buffer<T> out(2, 9, 4, 40, 2, 99, 1, 2, 3);
      std::vector<T> const in_before = x.buf;
      r.rotate_copy(x.v, out.v, position_span(5));
      CHECK(same(x.buf, in_before));
      bool ok = true;
      for (index_t b = 0; b < 2; ++b)
        for (index_t s = 0; s < 9; ++s)
          for (index_t h = 0; h < 4; ++h)
            for (index_t d = 0; d < 40; ++d) ok = ok && out.v(b, s, h, d) == inplace.v(b, s, h, d);
      CHECK(ok);
    }
    SECTION("rotate_qk == rotate q then rotate k (GQA head counts)" + tag) {
      strided_buffer<T> k(2, 9, 2, 40, 0, 22);
      strided_buffer<T> q1 = x, k1 = k;
      r.rotate_qk(x.v, k.v, position_span(3), 100);
      r.rotate(q1.v, position_span(3), 100);
      r.rotate(k1.v, position_span(3), 100);
      CHECK(same(x.buf, q1.buf));
      CHECK(same(k.buf, k1.buf));
    }
    SECTION("per-batch offsets and explicit ids == the same positions token by token" + tag) {
      std::vector<index_t> firsts = {4, 70};
      std::vector<index_t> ids(18);
      for (index_t s = 0; s < 9; ++s) {
        ids[static_cast<std::size_t>(s)] = 4 + s;
        ids[static_cast<std::size_t>(9 + s)] = 70 + s;
      }
      strided_buffer<T> a = x, b = x, want = x;
      r.rotate(a.v, position_span::per_batch(firsts), 200);
      r.rotate(b.v, position_span::ids(ids.data(), 2, 9), 200);
      posenc_test::rope_reference<T>(r, x.v, want.v, position_span::ids(ids.data(), 2, 9), 200);
      CHECK(same(a.buf, b.buf));
      CHECK(rel_diff(a.buf, want.buf) <= 8 * std::numeric_limits<T>::epsilon());
      // ids with batch 1 broadcast over the batch.
      strided_buffer<T> c = x, d = x;
      r.rotate(c.v, position_span::ids(ids.data(), 1, 9));
      r.rotate(d.v, position_span(4));
      CHECK(same(c.buf, d.buf));
    }
  }
}

TEMPLATE_TEST_CASE("rope: caller caches by position and per token", "[rope][cache]", float, double) {
  using T = TestType;
  for (rope_layout layout : {rope_layout::half_split, rope_layout::interleaved}) {
    std::string const tag = layout == rope_layout::half_split ? " (half-split)" : " (interleaved)";
    rope_options o;
    o.rotary_dim = 20;
    rope<T> const r(layout, 34, o);
    index_t const w = 10, rows = 64;
    // Arbitrary numbers, not cos/sin of anything (as in the ONNX tests).
    auto cosv = posenc_test::random_vector<T>(static_cast<std::size_t>(rows * w), 5);
    auto sinv = posenc_test::random_vector<T>(static_cast<std::size_t>(rows * w), 6);
    std::vector<index_t> ids = {3, 63, 0, 17, 17, 40, 1, 2};  // (batch 2, seq 4)
    strided_buffer<T> x(2, 4, 3, 34, 1, 31);

    SECTION("by position == scalar reference with the same rows" + tag) {
      strided_buffer<T> got = x, want = x;
      auto cache = posenc::rope_cache<T>::by_position(cosv.data(), sinv.data(), rows, w);
      auto pos = position_span::ids(ids.data(), 2, 4);
      r.rotate(got.v, pos, cache);
      posenc_test::rope_reference_rows<T>(r, x.v, want.v, [&](index_t b, index_t s) {
        index_t const p = ids[static_cast<std::size_t>(b * 4 + s)];
        return std::make_pair(cosv.data() + p * w, sinv.data() + p * w);
      });
      if (posenc_test::rope_kernels_bitwise_equal()) CHECK(same(got.buf, want.buf));
      CHECK(rel_diff(got.buf, want.buf) <= 8 * std::numeric_limits<T>::epsilon());
      // inverse = transpose with the cache values
      strided_buffer<T> back = got, want_back = got;
      r.rotate_inverse(back.v, pos, cache);
      posenc_test::rope_reference_rows<T>(
          r, got.v, want_back.v,
          [&](index_t b, index_t s) {
            index_t const p = ids[static_cast<std::size_t>(b * 4 + s)];
            return std::make_pair(cosv.data() + p * w, sinv.data() + p * w);
          },
          true);
      CHECK(rel_diff(back.buf, want_back.buf) <= 8 * std::numeric_limits<T>::epsilon());
    }
    SECTION("per token == by position with the rows gathered" + tag) {
      std::vector<T> ct(static_cast<std::size_t>(8 * w)), st(ct.size());
      for (std::size_t t = 0; t < 8; ++t)
        for (index_t k = 0; k < w; ++k) {
          ct[t * static_cast<std::size_t>(w) + static_cast<std::size_t>(k)] = cosv[static_cast<std::size_t>(ids[t] * w + k)];
          st[t * static_cast<std::size_t>(w) + static_cast<std::size_t>(k)] = sinv[static_cast<std::size_t>(ids[t] * w + k)];
        }
      strided_buffer<T> a = x, b = x;
      r.rotate(a.v, position_span::ids(ids.data(), 2, 4),
               posenc::rope_cache<T>::by_position(cosv.data(), sinv.data(), rows, w));
      r.rotate(b.v, posenc::rope_cache<T>::per_token(ct.data(), st.data(), 2, 4, w));
      CHECK(same(a.buf, b.buf));
      strided_buffer<T> out(2, 4, 3, 34, 0, 77);
      r.rotate_copy(x.v, out.v, posenc::rope_cache<T>::per_token(ct.data(), st.data(), 2, 4, w));
      bool ok = true;
      for (index_t bb = 0; bb < 2; ++bb)
        for (index_t s = 0; s < 4; ++s)
          for (index_t h = 0; h < 3; ++h)
            for (index_t d = 0; d < 34; ++d) ok = ok && out.v(bb, s, h, d) == a.v(bb, s, h, d);
      CHECK(ok);
    }
    SECTION("a cache holding the rope's own cos/sin == computed angles" + tag) {
      std::vector<T> cc(static_cast<std::size_t>(rows * w)), ss(cc.size());
      for (index_t p = 0; p < rows; ++p) r.cos_sin(p, rows, cc.data() + p * w, ss.data() + p * w);
      strided_buffer<T> a = x, b = x;
      r.rotate(a.v, position_span(30), posenc::rope_cache<T>::by_position(cc.data(), ss.data(), rows, w));
      r.rotate(b.v, position_span(30));
      CHECK(same(a.buf, b.buf));
    }
  }
}

TEST_CASE("rope: float cos/sin within 1 ulp of long double at 65536 and 1048576; rotation within 1e-6", "[rope][precision]") {
  using ld = long double;
  struct cfg {
    char const* name;
    double base;
    rope_scaling sc;
  };
  std::vector<cfg> cfgs = {{"none 1e4", 1e4, rope_scaling::none()},
                           {"none 5e5", 5e5, rope_scaling::none()},
                           {"linear 4", 1e4, rope_scaling::linear(4.0)},
                           {"llama3", 5e5, rope_scaling::llama3(8.0, 1.0, 4.0, 8192)},
                           {"yarn", 1e4, rope_scaling::yarn(8.0, 4096)}};
  index_t const r = 128;
  auto x = posenc_test::random_vector<float>(static_cast<std::size_t>(r), 4242);
  for (auto const& c : cfgs) {
    // Long double theta'_k straight from docs/formulas.md 3.1 / 3.5.
    std::vector<ld> th(r / 2);
    ld a = 1;
    for (index_t k = 0; k < r / 2; ++k) {
      ld t = 1.0L / std::pow(static_cast<ld>(c.base), static_cast<ld>(2 * k) / r);
      if (c.sc.type == posenc::rope_scaling_type::linear) t /= 4;
      if (c.sc.type == posenc::rope_scaling_type::llama3) {
        ld const wl = 2 * 3.141592653589793238462643383279502884L / t;
        if (wl > 8192.0L) {
          t /= 8;
        } else if (wl >= 2048.0L) {
          ld const g = (8192.0L / wl - 1) / 3;
          t = (1 - g) * t / 8 + g * t;
        }
      }
      if (c.sc.type == posenc::rope_scaling_type::yarn) {  // range (10, 23) for r = 64; recompute for r = 128
        auto [lo, hi] = posenc::yarn_correction_range(r, c.base, 32, 1, 4096, true);
        ld ramp = std::min<ld>(std::max<ld>((k - static_cast<ld>(lo)) / (static_cast<ld>(hi) - lo), 0), 1);
        t = (t / 8) * ramp + t * (1 - ramp);
        a = 0.1L * std::log(8.0L) + 1;
      }
      th[static_cast<std::size_t>(k)] = t;
    }
    for (rope_layout layout : {rope_layout::half_split, rope_layout::interleaved}) {
      rope_options o;
      o.base = c.base;
      o.scaling = c.sc;
      rope<float> const rp(layout, r, o);
      for (index_t p : {index_t(65536), index_t(1048576)}) {
        std::vector<float> cf(r / 2), sf(r / 2);
        rp.cos_sin(p, p + 1, cf.data(), sf.data());
        int bad = 0;
        for (index_t k = 0; k < r / 2; ++k) {
          ld const phi = static_cast<ld>(p) * th[static_cast<std::size_t>(k)];
          ld const ce = a * std::cos(phi), se = a * std::sin(phi);
          auto ulp = [](ld v) {
            float const f = static_cast<float>(std::abs(v));
            return static_cast<ld>(std::nextafter(f, FLT_MAX)) - static_cast<ld>(f);
          };
          if (std::abs(cf[static_cast<std::size_t>(k)] - ce) > ulp(ce)) ++bad;
          if (std::abs(sf[static_cast<std::size_t>(k)] - se) > ulp(se)) ++bad;
        }
        INFO(c.name << " position " << p);
        CHECK(bad == 0);
        // Rotated vector against the long double rotation of the same float input.
        std::vector<float> y = x;
        auto v = posenc::make_bshd(y.data(), 1, 1, 1, r);
        rp.rotate(v, position_span(p));
        ld err = 0, norm = 0;
        for (index_t k = 0; k < r / 2; ++k) {
          index_t const i0 = layout == rope_layout::half_split ? k : 2 * k;
          index_t const i1 = layout == rope_layout::half_split ? k + r / 2 : 2 * k + 1;
          ld const phi = static_cast<ld>(p) * th[static_cast<std::size_t>(k)];
          ld const ce = a * std::cos(phi), se = a * std::sin(phi);
          ld const xa = x[static_cast<std::size_t>(i0)], xb = x[static_cast<std::size_t>(i1)];
          ld const ya = xa * ce - xb * se, yb = xa * se + xb * ce;
          err = std::max(err, std::max(std::abs(ya - y[static_cast<std::size_t>(i0)]),
                                       std::abs(yb - y[static_cast<std::size_t>(i1)])));
          norm += ya * ya + yb * yb;
        }
        CHECK(static_cast<double>(err / std::sqrt(norm)) <= 1e-6);
      }
    }
  }
}

TEST_CASE("rope: Hugging Face parameters give the typed configuration", "[rope][hf]") {
  using posenc::hf_rope_params;
  auto same_freqs = [](rope<double> const& a, rope<double> const& b, index_t length) {
    return a.frequencies(length) == b.frequencies(length) && a.rotary_dim() == b.rotary_dim() &&
           a.base() == b.base();
  };
  SECTION("llama3 (Llama 3.1)") {
    hf_rope_params p = {{"rope_type", "llama3"},       {"factor", 8.0},
                        {"low_freq_factor", 1.0},      {"high_freq_factor", 4.0},
                        {"original_max_position_embeddings", 8192}, {"rope_theta", 500000.0}};
    rope_options o;
    o.base = 500000.0;
    o.scaling = rope_scaling::llama3(8.0, 1.0, 4.0, 8192);
    CHECK(same_freqs(rope<double>(rope_layout::half_split, 128, p), rope<double>(rope_layout::half_split, 128, o), 1));
  }
  SECTION("yarn: original length defaults to max_position_embeddings; explicit factor wins") {
    hf_rope_params p = {{"rope_type", "yarn"}, {"factor", 4.0}, {"max_position_embeddings", 32768}};
    rope_options o;
    o.scaling = rope_scaling::yarn(4.0, 32768);
    CHECK(same_freqs(rope<double>(rope_layout::half_split, 128, p), rope<double>(rope_layout::half_split, 128, o), 1));
    hf_rope_params q = {{"rope_type", "yarn"},
                        {"max_position_embeddings", 163840},
                        {"original_max_position_embeddings", 4096},
                        {"mscale", 1.0},
                        {"mscale_all_dim", 1.0}};  // no factor: 163840 / 4096 = 40 (DeepSeek-V3)
    rope_options o2;
    o2.scaling = rope_scaling::yarn(40.0, 4096);
    o2.scaling.mscale = 1.0;
    o2.scaling.mscale_all_dim = 1.0;
    rope<double> const a(rope_layout::interleaved, 64, q), b(rope_layout::interleaved, 64, o2);
    CHECK(same_freqs(a, b, 1));
    CHECK(a.frequencies(1).attention_factor == 1.0);
  }
  SECTION("legacy key `type`, linear, dynamic, partial_rotary_factor") {
    hf_rope_params p = {{"type", "linear"}, {"factor", 4.0}, {"partial_rotary_factor", 0.4}};
    rope<double> const a(rope_layout::half_split, 80, p);  // Phi-2: 80 * 0.4 = 32
    CHECK(a.rotary_dim() == 32);
    rope_options o;
    o.rotary_dim = 32;
    o.scaling = rope_scaling::linear(4.0);
    CHECK(same_freqs(a, rope<double>(rope_layout::half_split, 80, o), 1));
    hf_rope_params d = {{"rope_type", "dynamic"}, {"factor", 2.0}, {"max_position_embeddings", 2048}};
    rope_options od;
    od.scaling = rope_scaling::dynamic_ntk(2.0, 2048);
    CHECK(same_freqs(rope<double>(rope_layout::half_split, 64, d), rope<double>(rope_layout::half_split, 64, od), 5000));
  }
  SECTION("longrope (Phi-3-mini-128k shape): attention factor 1.1902380714238083, long list past L0") {
    std::vector<double> sf(48, 1.0), lf(48, 2.0);
    hf_rope_params p = {{"rope_type", "longrope"},
                        {"short_factor", sf},
                        {"long_factor", lf},
                        {"original_max_position_embeddings", 4096},
                        {"max_position_embeddings", 131072}};
    rope<double> const a(rope_layout::half_split, 96, p);
    CHECK(a.frequencies(4096).attention_factor == posenc_test::Approx(1.1902380714238083).epsilon(1e-15));
    CHECK(a.frequencies(4096).inv_freq[5] == 2.0 * a.frequencies(4097).inv_freq[5]);
  }
  SECTION("no rope_type: no scaling") {
    rope<double> const a(rope_layout::half_split, 64, hf_rope_params{{"rope_theta", 1e6}});
    CHECK(a.scaling().type == posenc::rope_scaling_type::none);
    CHECK(a.base() == 1e6);
  }
}

TEST_CASE("rope: traits", "[rope]") {
  STATIC_REQUIRE(posenc::rotates_queries_keys_v<rope<float>>);
  STATIC_REQUIRE(posenc::is_relative_v<rope<double>>);
  STATIC_REQUIRE(!posenc::adds_to_embeddings_v<rope<float>>);
  STATIC_REQUIRE(!posenc::biases_scores_v<rope<float>>);
  STATIC_REQUIRE(!posenc::relative_key_value_v<rope<float>>);
  rope<float> const r(rope_layout::half_split, 8);
  CHECK(r.max_positions() == (index_t(1) << 53));  // positions exact in double, angles below 2^53
}

// The usage example of docs/encoders/rope.md, compiled and run here.
TEST_CASE("rope: docs/encoders/rope.md usage", "[rope][docs]") {
  // --- docs begin
  // Llama 3.1 8B: 32 query heads, 8 kv heads, head_dim 128, HF-format weights (half-split).
  posenc::rope_options opt;
  opt.base = 500000.0;
  opt.scaling = posenc::rope_scaling::llama3(/*factor=*/8.0, /*low_freq_factor=*/1.0,
                                             /*high_freq_factor=*/4.0, /*original_max=*/8192);
  posenc::rope<float> rope(posenc::rope_layout::half_split, 128, opt);
  rope.reserve(4096);  // optional: pre-build cos/sin rows for positions 0..4095

  posenc::index_t const batch = 1, seq = 16, past_len = 100;
  std::vector<float> q(batch * seq * 32 * 128, 0.5f), k(batch * seq * 8 * 128, 0.25f);
  auto qv = posenc::make_bshd(q.data(), batch, seq, 32, 128);  // (batch, seq, head, dim)
  auto kv = posenc::make_bshd(k.data(), batch, seq, 8, 128);
  // Decode step after 100 cached tokens: positions 100..115.
  rope.rotate_qk(qv, kv, posenc::position_span(past_len));

  // The same from Hugging Face config values.
  posenc::hf_rope_params hf = {{"rope_type", "llama3"},
                               {"factor", 8.0},
                               {"low_freq_factor", 1.0},
                               {"high_freq_factor", 4.0},
                               {"original_max_position_embeddings", 8192},
                               {"rope_theta", 500000.0}};
  posenc::rope<float> same_rope(posenc::rope_layout::half_split, 128, hf);
  // --- docs end
  std::vector<float> q2(q.size(), 0.5f);
  same_rope.rotate(posenc::make_bshd(q2.data(), batch, seq, 32, 128), posenc::position_span(past_len));
  CHECK(q2 == q);
  CHECK(q[0] != 0.5f);
}

namespace {

#if defined(__SIZEOF_FLOAT128__)
using quad = __float128;

/// cos and sin of p * theta in binary128, theta = hi + lo exactly: the product
/// is within 2^-113 relative, 2 pi is carried to ~2^-160, and the reduced
/// angle goes through Taylor series, so the result is within ~1e-30 for
/// angles below 2^53 (docs/encoders/rope.md "Accuracy and range").
void quad_cos_sin(index_t p, double hi, double lo, double& c, double& s) {
  quad const two_pi_hi = quad(6.283185307179586) + quad(2.4492935982947064e-16);
  quad const two_pi_lo = quad(-5.989539619436679e-33);
  quad const angle = quad(p) * (quad(hi) + quad(lo));
  quad const n = quad(std::llround(static_cast<long double>(angle / two_pi_hi)));  // angle >= 0
  quad const x = (angle - n * two_pi_hi) - n * two_pi_lo;  // |x| <= ~pi
  quad term = 1, cs = 1, sn = 0;
  for (int i = 1; i < 80; ++i) {  // term = x^i / i!
    term = term * x / quad(i);
    switch (i % 4) {
      case 1: sn += term; break;
      case 2: cs -= term; break;
      case 3: sn -= term; break;
      default: cs += term; break;
    }
  }
  c = static_cast<double>(cs);
  s = static_cast<double>(sn);
}
#endif

}  // namespace

TEST_CASE("rope: cos/sin within the documented bound at every accepted position (2^20 .. 2^53 - 1)",
          "[rope][precision]") {
#if !defined(__SIZEOF_FLOAT128__)
  WARN("no __float128 on this compiler: the long-range accuracy reference is unavailable");
#else
  // The bound of docs/encoders/rope.md: |error| <= 2^-50 on the double values,
  // plus half an ulp of T when rounded to T (attention factor 1 here).
  double const bound = std::ldexp(1.0, -50);
  auto check = [&](auto tag, rope<decltype(tag)> const& r, index_t p, std::vector<int> const& ks, bool table) {
    using T = decltype(tag);
    index_t const h = r.rotary_dim() / 2;
    auto const f = r.frequencies(p + 1);
    // One rotation of x = [1 .. 1, 0 .. 0] (half-split) returns [cos | sin] rounded to T exactly.
    std::vector<T> x(static_cast<std::size_t>(2 * h), T(0));
    for (index_t k = 0; k < h; ++k) x[static_cast<std::size_t>(k)] = T(1);
    r.rotate(posenc::make_bshd(x.data(), 1, 1, 1, 2 * h), position_span(p));
    std::vector<T> c(static_cast<std::size_t>(h)), s(c.size());
    r.cos_sin(p, p + 1, c.data(), s.data());
    for (int k : ks) {
      auto const kk = static_cast<std::size_t>(k);
      double ce = 0, se = 0;
      quad_cos_sin(p, f.inv_freq[kk], f.inv_freq_lo[kk], ce, se);
      auto half_ulp = [](double v) {
        T const t = static_cast<T>(std::abs(v));
        return 0.5 * (static_cast<double>(std::nextafter(t, std::numeric_limits<T>::max())) - static_cast<double>(t));
      };
      double const ec = std::abs(static_cast<double>(c[kk]) - ce), es = std::abs(static_cast<double>(s[kk]) - se);
      INFO((sizeof(T) == 4 ? "float" : "double") << (table ? " table" : " per call") << " position " << p << " k "
                                                 << k << " theta " << f.inv_freq[kk] << ": |cos error| " << ec
                                                 << ", |sin error| " << es);
      CHECK(ec <= bound + half_ulp(ce));
      CHECK(es <= bound + half_ulp(se));
      CHECK(x[kk] == c[kk]);  // the rotation uses the same row
      CHECK(x[kk + static_cast<std::size_t>(h)] == s[kk]);
    }
  };
  auto run = [&](auto tag) {
    using T = decltype(tag);
    // theta_0 = 1 (the highest frequency), theta_1 = 0.75 (lo != 0), theta_31 = 1.3e-4 (a low one).
    rope<T> const r(rope_layout::half_split, 64);
    REQUIRE(r.max_positions() == (index_t(1) << 53));
    for (index_t p : {index_t(1) << 20, index_t(1) << 31, index_t(1) << 40, index_t(1) << 50, (index_t(1) << 53) - 1})
      check(tag, r, p, {0, 1, 31}, false);
    std::vector<T> c(32), s(32);
    REQUIRE_THROWS_WITH(r.cos_sin(index_t(1) << 53, (index_t(1) << 53) + 1, c.data(), s.data()),
                        posenc_test::contains("position is 9007199254740992, expected 0 .. 9007199254740991"));
    // theta_0 = 4 (linear factor 0.25): the angle, not the position, reaches 2^53 first.
    rope_options o;
    o.scaling = rope_scaling::linear(0.25);
    rope<T> const fast(rope_layout::half_split, 64, o);
    REQUIRE(fast.max_positions() == (index_t(1) << 51));
    check(tag, fast, (index_t(1) << 51) - 1, {0, 1, 31}, false);
    REQUIRE_THROWS_WITH(fast.cos_sin(index_t(1) << 51, (index_t(1) << 51) + 1, c.data(), s.data()),
                        posenc_test::contains("position is 2251799813685248, expected 0 .. 2251799813685247"));
    // The reserved table (the same rows, stored) at 2^20: rotary_dim 4, thetas 1 and 1e-4.
    rope_options t;
    t.base = 1e8;
    rope<T> table(rope_layout::half_split, 4, t);
    table.reserve((index_t(1) << 20) + 1);
    REQUIRE(table.reserved_for((index_t(1) << 20) + 1));
    check(tag, table, index_t(1) << 20, {0, 1}, true);
  };
  run(float{});
  run(double{});
#endif
}
}  // namespace encoding_rope_tests
