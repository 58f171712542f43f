// SPDX-License-Identifier: MIT
// rope<float> on 16-bit q and k (Eigen::half, Eigen::bfloat16): the float rotation of the widened input, rounded once.
//
// The rule tested. A 16-bit rotation loads each element, widens it exactly,
// rotates it with the float kernels and rounds the result once to nearest
// even. So, bit for bit and on every instruction set:
//   rotate16(x) == to_storage(rope<float>::rotate(widen(x)))            (1)
// The float SIMD kernels equal the scalar reference (rope_rotate_scalar) bit
// for bit where the instruction set has FMA (both fuse the same
// multiply-adds; nothing else can be contracted: each FMA's addend is a
// rounded product, and the 1 / a^2 factor multiplies a rounded FMA), so there
//   rotate16(x) == to_storage(rope_rotate_scalar(widen(x)))             (2)
// bit for bit too. Without FMA (the SSE2 build) xsimd's fma is a multiply and
// an add, two roundings: the float rotation then differs from the scalar one
// by at most 8 float eps of the largest value (the bound tests/encoding/rope
// uses), and (2) holds within one 16-bit ulp of the reference plus that float
// bound (rounding once more can move a value across one 16-bit rounding
// boundary, no further). Test values are in [-1, 1], so no result is a float
// subnormal (where the AVX-512 BF16 store flushes to zero; core/simd.hpp).
#include <posenc/core/half.hpp>
#include <posenc/encoding/rope.hpp>

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

namespace encoding_rope_half_tests {

using posenc::index_t;
using posenc::position_span;
using posenc::rope;
using posenc::rope_layout;
using posenc::rope_options;
using posenc::rope_scaling;

namespace {

using posenc_test::bits;
using posenc_test::strided_buffer;
using posenc_test::widen;

/// Float copy of a 16-bit buffer (exact).
template <class S>
strided_buffer<float> widened(strided_buffer<S> const& x) {
  return strided_buffer<float>(x, [](S h) { return widen(h); });
}

/// 16-bit copy of a float buffer (each value rounded once).
template <class S>
strided_buffer<S> narrowed(strided_buffer<float> const& x) {
  return strided_buffer<S>(x, [](float f) { return posenc::detail::to_storage<S>(f); });
}

/// Elements whose 16-bit encodings differ.
template <class S>
std::size_t count_diff(std::vector<S> const& a, std::vector<S> const& b) {
  std::size_t n = 0;
  for (std::size_t i = 0; i < a.size(); ++i) n += bits(a[i]) != bits(b[i]) ? 1 : 0;
  return n;
}

/// One 16-bit ulp of a value of magnitude up to |x| (at least the smallest subnormal step).
template <class S>
double ulp16(double x) {
  int const p = std::is_same_v<S, Eigen::bfloat16> ? 8 : 11;  // significand bits
  int const emin = std::is_same_v<S, Eigen::bfloat16> ? -126 : -14;
  int e = 0;
  std::frexp(std::max(std::abs(x), 1e-300), &e);  // |x| < 2^e
  return std::ldexp(1.0, std::max(e - 1, emin) - (p - 1));
}

/// Elements of `got` farther from the float `want` than one 16-bit ulp plus `extra`.
template <class S>
std::size_t count_outside(std::vector<S> const& got, std::vector<float> const& want, double extra) {
  std::size_t n = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    n += std::abs(double(widen(got[i])) - double(want[i])) > ulp16<S>(want[i]) + extra ? 1 : 0;
  return n;
}

double max_abs(std::vector<float> const& v) {
  double m = 0;
  for (float x : v) m = std::max(m, std::abs(double(x)));
  return m;
}

/// rotate (or rotate_inverse) of 16-bit x against rules (1) and (2) above.
template <class S>
void check_rule(rope<float> const& r, strided_buffer<S> const& x, position_span pos, index_t len, bool inverse,
                std::string const& what) {
  INFO(what);
  strided_buffer<S> got = x;
  strided_buffer<float> simd_f = widened(x), ref_f = widened(x);
  if (!inverse) {
    r.rotate(got.v, pos, len);
    r.rotate(simd_f.v, pos, len);
  } else {
    r.rotate_inverse(got.v, pos, len);
    r.rotate_inverse(simd_f.v, pos, len);
  }
  strided_buffer<float> const in_f = widened(x);
  posenc_test::rope_reference<float>(r, in_f.v, ref_f.v, pos, len, inverse);
  CHECK(count_diff(got.buf, narrowed<S>(simd_f).buf) == 0);  // (1)
  if (posenc_test::rope_kernels_bitwise_equal()) {
    CHECK(count_diff(got.buf, narrowed<S>(ref_f).buf) == 0);  // (2)
  } else {
    double const float_bound = 8 * double(std::numeric_limits<float>::epsilon()) * max_abs(ref_f.buf);
    CHECK(count_outside(got.buf, ref_f.buf, float_bound) == 0);
  }
}

rope_options scaled(index_t rotary_dim, int which) {
  rope_options o;
  o.rotary_dim = rotary_dim;
  switch (which % 4) {
    case 1: o.scaling = rope_scaling::yarn(8.0, 64); break;  // attention factor != 1: the inverse's 1 / a^2
    case 2: o.scaling = rope_scaling::llama3(8.0, 1.0, 4.0, 64); break;
    case 3:  // dynamic NTK needs rotary_dim > 2
      if (rotary_dim > 2) o.scaling = rope_scaling::dynamic_ntk(2.0, 16);
      break;
    default: break;
  }
  return o;
}

}  // namespace

TEMPLATE_TEST_CASE("rope 16-bit: rotate == the float rotation of the widened input, rounded once (every shape)",
                   "[rope][half]", Eigen::half, Eigen::bfloat16) {
  using S = TestType;
  std::vector<index_t> dims;
  for (index_t d = 2; d <= 40; ++d) dims.push_back(d);
  for (index_t d : {63, 64, 65, 127, 128, 129, 256}) dims.push_back(d);
  for (rope_layout layout : {rope_layout::half_split, rope_layout::interleaved}) {
    for (index_t d : dims) {
      std::vector<index_t> rs;
      if (d <= 40) {
        for (index_t r = 2; r <= d; r += 2) rs.push_back(r);
      } else {
        for (index_t r : {index_t(2), d / 4 * 2 / 2 * 2, d - d % 2 - 2, d - d % 2}) rs.push_back(r);
      }
      for (index_t r : rs) {
        rope<float> const rp(layout, d, scaled(r, static_cast<int>(d + r / 2)));
        strided_buffer<S> const x(2, 3, 2, d, (d + r) % 3, static_cast<std::uint64_t>(d * 1000 + r));
        std::string const what = std::string(layout == rope_layout::half_split ? "half_split" : "interleaved") +
                                 " d " + std::to_string(d) + " r " + std::to_string(r);
        check_rule(rp, x, position_span(900 + d), 900 + d + 3, false, what);
        check_rule(rp, x, position_span(900 + d), 900 + d + 3, true, what + " inverse");
      }
    }
  }
}

TEMPLATE_TEST_CASE("rope 16-bit: reserved table, computed rows, threads, longrope, transpose", "[rope][half]",
                   Eigen::half, Eigen::bfloat16) {
  using S = TestType;
  for (rope_layout layout : {rope_layout::half_split, rope_layout::interleaved}) {
    std::string const tag = layout == rope_layout::half_split ? " (half-split)" : " (interleaved)";
    for (int which = 0; which < 5; ++which) {
      rope_options o = scaled(48, which);
      if (which == 4) {  // LongRoPE, at a length past L0: the long factors
        std::vector<double> sf(24, 1.0), lf(24, 1.5);
        for (std::size_t k = 0; k < 24; ++k) sf[k] = 1.0 + 0.05 * double(k);
        o.scaling = rope_scaling::longrope(sf, lf, 32, 256);
      }
      rope<float> plain(layout, 64, o);
      rope<float> table = plain;
      table.reserve(50);  // covers part of the positions below
      rope<float> threaded = table;
      threaded.set_threads(2);
      strided_buffer<S> const x(2, 37, 3, 64, 1, 11 + static_cast<std::uint64_t>(which));
      position_span const pos(20);  // positions 20..56: some in the table, some past it
      for (rope<float> const* r : {&plain, &table, &threaded}) {
        std::string const what = "scaling " + std::to_string(which) + tag + " table " + std::to_string(r->reserved()) +
                                 " threads " + std::to_string(r->threads());
        check_rule(*r, x, pos, 57, false, what);
        check_rule(*r, x, pos, 57, true, what);
      }
      // The transpose: the float transpose of the widened input, rounded once.
      strided_buffer<S> got = x;
      strided_buffer<float> f = widened(x);
      threaded.rotate_transpose(got.v, pos, 57);
      threaded.rotate_transpose(f.v, pos, 57);
      CHECK(count_diff(got.buf, narrowed<S>(f).buf) == 0);
    }
  }
}

TEMPLATE_TEST_CASE("rope 16-bit: rotate_copy, rotate_qk, position forms, caller caches", "[rope][half]", Eigen::half,
                   Eigen::bfloat16) {
  using S = TestType;
  rope_options o;
  o.rotary_dim = 24;
  o.scaling = rope_scaling::yarn(4.0, 128);
  for (rope_layout layout : {rope_layout::half_split, rope_layout::interleaved}) {
    std::string const tag = layout == rope_layout::half_split ? " (half-split)" : " (interleaved)";
    rope<float> const r(layout, 40, o);
    strided_buffer<S> const x(2, 9, 4, 40, 1, 21);

    SECTION("rotate_copy == rotate in place; the input untouched; the tail and the gaps kept" + tag) {
      strided_buffer<S> inplace = x;
      r.rotate(inplace.v, position_span(5));
      strided_buffer<S> out(2, 9, 4, 40, 2, 99, 1, 2, 3);
      strided_buffer<S> const out_before = out;
      strided_buffer<S> in = x;
      r.rotate_copy(posenc::view<S const>(in.v), out.v, position_span(5));
      CHECK(count_diff(in.buf, x.buf) == 0);
      std::size_t bad = 0, touched = 0;
      std::vector<char> inside(out.buf.size(), 0);
      for (index_t b = 0; b < 2; ++b)
        for (index_t s = 0; s < 9; ++s)
          for (index_t h = 0; h < 4; ++h)
            for (index_t d = 0; d < 40; ++d) {
              bad += bits(out.v(b, s, h, d)) != bits(inplace.v(b, s, h, d)) ? 1 : 0;
              inside[static_cast<std::size_t>(&out.v(b, s, h, d) - out.buf.data())] = 1;
            }
      for (std::size_t i = 0; i < out.buf.size(); ++i)
        touched += !inside[i] && bits(out.buf[i]) != bits(out_before.buf[i]) ? 1 : 0;
      CHECK(bad == 0);
      CHECK(touched == 0);
      strided_buffer<S> out2(2, 9, 4, 40, 0, 98);
      r.rotate_copy(in.v, out2.v, position_span(5), 14);  // non-const input, explicit length
      bad = 0;
      for (index_t b = 0; b < 2; ++b)
        for (index_t s = 0; s < 9; ++s)
          for (index_t h = 0; h < 4; ++h)
            for (index_t d = 0; d < 40; ++d) bad += bits(out2.v(b, s, h, d)) != bits(inplace.v(b, s, h, d)) ? 1 : 0;
      CHECK(bad == 0);
    }
    SECTION("rotate_qk == rotate q then rotate k (GQA head counts)" + tag) {
      strided_buffer<S> q = x, k(2, 9, 2, 40, 0, 22);
      strided_buffer<S> q1 = x, k1 = k;
      r.rotate_qk(q.v, k.v, position_span(3), 100);
      r.rotate(q1.v, position_span(3), 100);
      r.rotate(k1.v, position_span(3), 100);
      CHECK(count_diff(q.buf, q1.buf) == 0);
      CHECK(count_diff(k.buf, k1.buf) == 0);
      strided_buffer<S> q2 = x, k2 = strided_buffer<S>(2, 9, 2, 40, 0, 22);
      r.rotate_qk(q2.v, k2.v, position_span(3));
      strided_buffer<S> q3 = x;
      r.rotate(q3.v, position_span(3));
      CHECK(count_diff(q2.buf, q3.buf) == 0);
      CHECK(count_diff(q2.buf, x.buf) > 0);
    }
    SECTION("per-batch offsets and explicit ids == the same positions token by token" + tag) {
      std::vector<index_t> firsts = {4, 70};
      std::vector<index_t> ids(18);
      for (index_t s = 0; s < 9; ++s) {
        ids[static_cast<std::size_t>(s)] = 4 + s;
        ids[static_cast<std::size_t>(9 + s)] = 70 + s;
      }
      strided_buffer<S> a = x, b = x;
      r.rotate(a.v, position_span::per_batch(firsts), 200);
      r.rotate(b.v, position_span::ids(ids.data(), 2, 9), 200);
      CHECK(count_diff(a.buf, b.buf) == 0);
      check_rule(r, x, position_span::ids(ids.data(), 2, 9), 200, false, "ids" + tag);
    }
    SECTION("caller caches: the float rotation with the same cache, rounded once" + tag) {
      index_t const h = 12;
      std::vector<float> const cs = posenc_test::random_vector<float>(static_cast<std::size_t>(2 * 90 * h), 5);
      auto const by_pos = posenc::rope_cache<float>::by_position(cs.data(), cs.data() + 90 * h, 90, h);
      auto const per_tok = posenc::rope_cache<float>::per_token(cs.data(), cs.data() + 90 * h, 2, 9, h);
      strided_buffer<S> a = x, b = x;
      strided_buffer<float> fa = widened(x), fb = widened(x);
      r.rotate(a.v, position_span(60), by_pos);
      r.rotate(fa.v, position_span(60), by_pos);
      r.rotate(b.v, per_tok);
      r.rotate(fb.v, per_tok);
      CHECK(count_diff(a.buf, narrowed<S>(fa).buf) == 0);
      CHECK(count_diff(b.buf, narrowed<S>(fb).buf) == 0);
    }
  }
}

TEMPLATE_TEST_CASE("rope 16-bit: rotate_inverse after rotate returns the input within 1.25 16-bit ulp of each pair",
                   "[rope][half][property]", Eigen::half, Eigen::bfloat16) {
  // The bound. For a pair (a, b) of norm n < 2^E, let U be the 16-bit ulp of
  // [2^(E-1), 2^E). Rotating (norm kept, attention factor 1) and rounding
  // moves each component by at most U / 2, a vector of norm <= U / sqrt(2);
  // the inverse rotation keeps that norm, so each component is off by at
  // most 0.71 U before the second rounding adds at most U / 2: 1.21 U, plus
  // float rounding (about 2^-13 U). The test allows 1.25 U.
  using S = TestType;
  for (rope_layout layout : {rope_layout::half_split, rope_layout::interleaved}) {
    for (index_t d : {8, 16, 30, 64, 100, 128}) {
      for (int which : {0, 2}) {  // no scaling, llama3: attention factor 1
        rope_options o = scaled(d - (d / 3) % 2 * 2, which);
        rope<float> const r(layout, d, o);
        strided_buffer<S> const x(2, 5, 3, d, 1, static_cast<std::uint64_t>(7 * d + which));
        strided_buffer<S> y = x;
        r.rotate(y.v, position_span(12345), 20000);
        CHECK(count_diff(y.buf, x.buf) > 0);
        r.rotate_inverse(y.v, position_span(12345), 20000);
        index_t const rd = r.rotary_dim(), hh = rd / 2;
        std::size_t bad = 0, tail_changed = 0;
        for (index_t b = 0; b < 2; ++b)
          for (index_t s = 0; s < 5; ++s)
            for (index_t hd = 0; hd < 3; ++hd) {
              for (index_t k = 0; k < hh; ++k) {
                index_t const i0 = layout == rope_layout::half_split ? k : 2 * k;
                index_t const i1 = layout == rope_layout::half_split ? k + hh : 2 * k + 1;
                double const a = widen(x.v(b, s, hd, i0)), bb = widen(x.v(b, s, hd, i1));
                double const u = ulp16<S>(std::hypot(a, bb) * (1 + 1e-6));
                bad += std::abs(widen(y.v(b, s, hd, i0)) - a) > 1.25 * u ? 1 : 0;
                bad += std::abs(widen(y.v(b, s, hd, i1)) - bb) > 1.25 * u ? 1 : 0;
              }
              for (index_t i = rd; i < d; ++i) tail_changed += bits(y.v(b, s, hd, i)) != bits(x.v(b, s, hd, i)) ? 1 : 0;
            }
        INFO("d " << d << " r " << rd);
        CHECK(bad == 0);
        CHECK(tail_changed == 0);
      }
    }
  }
}

TEMPLATE_TEST_CASE("rope 16-bit: bad input throws the float call's error before writing", "[rope][half][errors]",
                   Eigen::half, Eigen::bfloat16) {
  using S = TestType;
  rope<float> const r(rope_layout::half_split, 16);
  strided_buffer<S> x(1, 4, 2, 16, 0, 3), k(2, 4, 2, 16, 0, 4), wrong_dim(1, 4, 2, 12, 0, 5);
  strided_buffer<float> fx = widened(x), fk = widened(k), fw = widened(wrong_dim);
  strided_buffer<S> const x0 = x, k0 = k, w0 = wrong_dim;
  auto message = [](auto&& f) {
    try {
      f();
    } catch (posenc::error const& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  std::string const m_dim = message([&] { r.rotate(fw.v, position_span(0)); });
  std::string const m_len = message([&] { r.rotate(fx.v, position_span(10), 5); });
  std::string const m_neg = message([&] { r.rotate_inverse(fx.v, position_span(-1)); });
  std::string const m_qk = message([&] { r.rotate_qk(fx.v, fk.v, position_span(0)); });
  std::string const m_copy = message([&] { r.rotate_copy(fx.v, fw.v, position_span(0)); });
  auto strided_dim = fx.v;
  strided_dim.dim_stride = 2;
  std::string const m_stride = message([&] { r.rotate(strided_dim, position_span(0)); });
  for (std::string const* m : {&m_dim, &m_len, &m_neg, &m_qk, &m_copy, &m_stride}) {
    INFO(*m);
    CHECK(m->rfind("posenc::rope::", 0) == 0);
  }
  REQUIRE_THROWS_WITH(r.rotate(wrong_dim.v, position_span(0)), m_dim);
  REQUIRE_THROWS_WITH(r.rotate(x.v, position_span(10), 5), m_len);
  REQUIRE_THROWS_WITH(r.rotate_inverse(x.v, position_span(-1)), m_neg);
  REQUIRE_THROWS_WITH(r.rotate_qk(x.v, k.v, position_span(0)), m_qk);
  REQUIRE_THROWS_WITH(r.rotate_copy(x.v, wrong_dim.v, position_span(0)), m_copy);
  auto half_strided = x.v;
  half_strided.dim_stride = 2;
  REQUIRE_THROWS_WITH(r.rotate(half_strided, position_span(0)), m_stride);
  CHECK(count_diff(x.buf, x0.buf) == 0);
  CHECK(count_diff(k.buf, k0.buf) == 0);
  CHECK(count_diff(wrong_dim.buf, w0.buf) == 0);
}

TEST_CASE("docs/encoders/rope.md: rotating 16-bit q and k in place", "[rope][half][docs]") {
  index_t const B = 2, S = 5, H = 4, Hkv = 2, D = 16, past_len = 7;
  auto const qf = posenc_test::random_vector<float>(static_cast<std::size_t>(B * S * H * D), 21);
  auto const kf = posenc_test::random_vector<float>(static_cast<std::size_t>(B * S * Hkv * D), 22);
  std::vector<Eigen::half> q16(B * S * H * D), k16(B * S * Hkv * D);
  for (std::size_t i = 0; i < q16.size(); ++i) q16[i] = posenc::detail::to_storage<Eigen::half>(qf[i]);
  for (std::size_t i = 0; i < k16.size(); ++i) k16[i] = posenc::detail::to_storage<Eigen::half>(kf[i]);
  // The float rotation of the widened values, for the check below.
  std::vector<float> qw(q16.size()), kw(k16.size());
  for (std::size_t i = 0; i < q16.size(); ++i) qw[i] = posenc::detail::stored_value<float>(q16[i]);
  for (std::size_t i = 0; i < k16.size(); ++i) kw[i] = posenc::detail::stored_value<float>(k16[i]);
  // q16: (B, S, H, D) and k16: (B, S, Hkv, D), std::vector<Eigen::half>
  posenc::rope<float> rope(posenc::rope_layout::half_split, D);
  rope.reserve(4096);
  rope.rotate_qk(posenc::make_bshd(q16.data(), B, S, H, D), posenc::make_bshd(k16.data(), B, S, Hkv, D),
                 posenc::position_span(past_len));
  rope.rotate_qk(posenc::make_bshd(qw.data(), B, S, H, D), posenc::make_bshd(kw.data(), B, S, Hkv, D),
                 posenc::position_span(past_len));
  std::size_t differ = 0;
  for (std::size_t i = 0; i < q16.size(); ++i)
    differ += Eigen::numext::bit_cast<std::uint16_t>(q16[i]) !=
              Eigen::numext::bit_cast<std::uint16_t>(posenc::detail::to_storage<Eigen::half>(qw[i]));
  for (std::size_t i = 0; i < k16.size(); ++i)
    differ += Eigen::numext::bit_cast<std::uint16_t>(k16[i]) !=
              Eigen::numext::bit_cast<std::uint16_t>(posenc::detail::to_storage<Eigen::half>(kw[i]));
  CHECK(differ == 0);
}
}  // namespace encoding_rope_half_tests
