// SPDX-License-Identifier: MIT
// product_precision::bfloat16: the fused path's bfloat16 products against the float path and the reference, within the derived bound.
#include <posenc/attention/attention.hpp>
#include <posenc/attention/backward.hpp>
#include <posenc/attention/fused.hpp>
#include <posenc/core/half.hpp>
#include <posenc/encoding/alibi.hpp>
#include <posenc/encoding/none.hpp>
#include <posenc/encoding/rope.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/random.hpp"

using posenc::index_t;

namespace {

/// One call's shape (batch 1, contiguous views).
struct dims {
  index_t Sq, Sk, Hq, Hkv, D;
};

struct inputs {
  dims s;
  std::vector<float> q, k, v;
  inputs(dims d, std::uint64_t seed) : s(d) {
    q = posenc_test::random_vector<float>(static_cast<std::size_t>(s.Sq * s.Hq * s.D), seed, -2, 2);
    k = posenc_test::random_vector<float>(static_cast<std::size_t>(s.Sk * s.Hkv * s.D), seed + 1, -2, 2);
    v = posenc_test::random_vector<float>(static_cast<std::size_t>(s.Sk * s.Hkv * s.D), seed + 2, -1, 1);
  }
};

/// out (Sq, Hq, D) of Path; `probs`, when given, receives the probabilities (Hq, Sq, Sk).
template <class Path, class E>
std::vector<float> run(inputs const& in, E const& enc, posenc::attention_options<float> opt,
                       std::vector<float>* probs = nullptr, std::vector<float>* lse = nullptr) {
  dims const& s = in.s;
  std::vector<float> out(static_cast<std::size_t>(s.Sq * s.Hq * s.D), -7.0f);
  if (probs) {
    probs->assign(static_cast<std::size_t>(s.Hq * s.Sq * s.Sk), 0.0f);
    opt.scores = *probs;
    opt.scores_stage = posenc::score_stage::probabilities;
  }
  if (lse) {
    lse->assign(static_cast<std::size_t>(s.Hq * s.Sq), 0.0f);
    opt.lse = *lse;
  }
  posenc::attention<Path>(posenc::make_bshd(in.q.data(), 1, s.Sq, s.Hq, s.D),
                          posenc::make_bshd(in.k.data(), 1, s.Sk, s.Hkv, s.D),
                          posenc::make_bshd(in.v.data(), 1, s.Sk, s.Hkv, s.D),
                          posenc::make_bshd(out.data(), 1, s.Sq, s.Hq, s.D), enc, opt);
  return out;
}

/// x rounded to bfloat16 (nearest even), as a float.
float bf16(float x) {
  return posenc::simd::widen<posenc::simd::half_format::bfloat16>(
      posenc::simd::narrow<posenc::simd::half_format::bfloat16>(x));
}

/// gamma(n) = n eps / (1 - n eps), eps = 2^-24: n float roundings.
double gamma_of(double n) {
  double const eps = std::ldexp(1.0, -24);
  return n * eps / (1 - n * eps);
}

/// The bound of docs/attention.md ("bfloat16 products") on |o - o_exact| per
/// output element (i, h, d), for both o = the float path and o = the
/// bfloat16 path (so their difference is within twice it, and each is
/// within it of the reference):
///   E_i   = scale * delta_s * max_j c(q_i, k_j),   delta_s = (1+u)^2 - 1 + 2 gamma(D) (1+u)^2,
///           c = sum_d |q_d k_d| (no rotation) or |q| |k| (a rotation keeps norms),
///   bound = (e^(2 E_i) (1+u)^2 (1 + gamma(n_v)) - 1) * sum_j w_ij |v_jd|,
///           n_v = Sk + 2 ceil(Sk / 64) + 8,   u = 2^-8,
/// w the reference's probabilities.
std::vector<double> output_bound(inputs const& in, std::vector<float> const& w, bool rotates) {
  dims const& s = in.s;
  double const u = std::ldexp(1.0, -8), scale = 1.0 / std::sqrt(static_cast<double>(s.D));
  double const delta_s = (1 + u) * (1 + u) - 1 + 2 * gamma_of(static_cast<double>(s.D)) * (1 + u) * (1 + u);
  double const g_v = gamma_of(static_cast<double>(s.Sk + 2 * ((s.Sk + 63) / 64) + 8));
  index_t const group = s.Hq / s.Hkv;
  std::vector<double> bound(static_cast<std::size_t>(s.Sq * s.Hq * s.D));
  for (index_t i = 0; i < s.Sq; ++i)
    for (index_t h = 0; h < s.Hq; ++h) {
      float const* qi = in.q.data() + (i * s.Hq + h) * s.D;
      double c = 0;
      for (index_t j = 0; j < s.Sk; ++j) {
        float const* kj = in.k.data() + (j * s.Hkv + h / group) * s.D;
        double a = 0, nq = 0, nk = 0;
        for (index_t d = 0; d < s.D; ++d) {
          a += std::abs(static_cast<double>(qi[d]) * kj[d]);
          nq += static_cast<double>(qi[d]) * qi[d];
          nk += static_cast<double>(kj[d]) * kj[d];
        }
        c = std::max(c, rotates ? std::sqrt(nq * nk) : a);
      }
      double const E = scale * delta_s * c;
      double const factor = std::exp(2 * E) * (1 + u) * (1 + u) * (1 + g_v) - 1;
      for (index_t d = 0; d < s.D; ++d) {
        double A = 0;
        for (index_t j = 0; j < s.Sk; ++j)
          A += static_cast<double>(w[static_cast<std::size_t>((h * s.Sq + i) * s.Sk + j)]) *
               std::abs(static_cast<double>(in.v[static_cast<std::size_t>((j * s.Hkv + h / group) * s.D + d)]));
        bound[static_cast<std::size_t>((i * s.Hq + h) * s.D + d)] = factor * A;
      }
    }
  return bound;
}

/// Counts the output elements of `got` farther than the bound from `ref`.
std::size_t outside(std::vector<float> const& got, std::vector<float> const& ref, std::vector<double> const& bound) {
  std::size_t n = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (!(std::abs(static_cast<double>(got[i]) - ref[i]) <= bound[i])) ++n;
  return n;
}

/// The bfloat16 fused result within the bound of the reference, and within
/// twice the bound of the float fused result (each is within one bound of the
/// exact result); path::best with the mode gives the fused result.
template <class E>
void check_bound(inputs const& in, E const& enc, posenc::attention_options<float> opt, bool rotates,
                 std::string const& what) {
  std::vector<float> w;
  auto const ref = run<posenc::path::reference>(in, enc, opt, &w);
  auto const f32 = run<posenc::path::fused>(in, enc, opt);
  opt.products = posenc::product_precision::bfloat16;
  auto const got = run<posenc::path::fused>(in, enc, opt);
  auto const best = run<posenc::path::best>(in, enc, opt);
  std::vector<double> bound = output_bound(in, w, rotates);
  std::size_t const off_ref = outside(got, ref, bound);
  for (double& b : bound) b *= 2;
  std::size_t const off_f32 = outside(got, f32, bound);
  INFO(what << ": " << off_ref << " elements outside the bound of the reference, " << off_f32
            << " outside twice it of the float path");
  CHECK(off_ref == 0);
  CHECK(off_f32 == 0);
  CHECK(best == got);
  CHECK(got != f32);  // the mode changes the result (the inputs are not bfloat16 values)
}

std::string describe(dims const& s) {
  return "Sq" + std::to_string(s.Sq) + " Sk" + std::to_string(s.Sk) + " Hq" + std::to_string(s.Hq) + " Hkv" +
         std::to_string(s.Hkv) + " D" + std::to_string(s.D);
}

}  // namespace

TEST_CASE("bf16 products: within the derived bound of the reference and the float path", "[bf16][attention]") {
  dims const s = GENERATE(dims{100, 100, 2, 2, 64}, dims{77, 150, 4, 2, 128}, dims{70, 70, 2, 1, 65},
                          dims{130, 130, 1, 1, 128});
  inputs const in(s, 0x5eed0 + static_cast<std::uint64_t>(s.D + s.Sk));
  std::string const d = describe(s);
  posenc::attention_options<float> opt;
  check_bound(in, posenc::none{}, opt, false, d + " full");
  opt.causal = true;
  check_bound(in, posenc::none{}, opt, false, d + " causal");
  opt.sliding_window = 20;
  check_bound(in, posenc::none{}, opt, false, d + " window 20");
  opt = {};
  opt.causal = true;
  check_bound(in, posenc::alibi<float>(posenc::alibi_form::paper, s.Hq), opt, false, d + " alibi causal");
  posenc::rope<float> rope(posenc::rope_layout::half_split, s.D - s.D % 2);
  if (s.D % 2 == 0) {
    check_bound(in, rope, opt, true, d + " rope (rotated copies)");
    rope.reserve(512);
    check_bound(in, rope, opt, true, d + " rope (rotated in the kernel)");
  }
}

TEST_CASE("bf16 products: one visible key gives its value rounded to bfloat16, and the bfloat16 dot product as lse",
          "[bf16][attention]") {
  // Row 0 under causal sees key 0 alone: p = 1 (exact in bfloat16), so the
  // output is bf16(v_0) exactly; its log-sum-exp is the logit
  // scale * sum_d bf16(q_d) bf16(k_d), summed in float (within gamma(D) of it).
  dims const s = GENERATE(dims{64, 64, 1, 1, 128}, dims{80, 80, 2, 1, 65});
  inputs const in(s, 0xb16);
  posenc::attention_options<float> opt;
  opt.causal = true;
  opt.products = posenc::product_precision::bfloat16;
  std::vector<float> lse;
  auto const got = run<posenc::path::fused>(in, posenc::none{}, opt, nullptr, &lse);
  std::size_t wrong_out = 0, wrong_lse = 0;
  double const scale = 1.0 / std::sqrt(static_cast<double>(s.D));
  index_t const group = s.Hq / s.Hkv;
  for (index_t h = 0; h < s.Hq; ++h) {
    float const* v0 = in.v.data() + (h / group) * s.D;
    for (index_t d = 0; d < s.D; ++d)
      if (got[static_cast<std::size_t>(h * s.D + d)] != bf16(v0[d])) ++wrong_out;
    double dot = 0, mag = 0;
    for (index_t d = 0; d < s.D; ++d) {
      double const t = static_cast<double>(bf16(in.q[static_cast<std::size_t>(h * s.D + d)])) *
                       bf16(in.k[static_cast<std::size_t>((h / group) * s.D + d)]);
      dot += t;
      mag += std::abs(t);
    }
    double const tol = scale * gamma_of(static_cast<double>(s.D)) * mag + std::abs(scale * dot) * gamma_of(2);
    if (!(std::abs(lse[static_cast<std::size_t>(h * s.Sq)] - scale * dot) <= tol)) ++wrong_lse;
  }
  INFO(describe(s) << ": " << wrong_out << " outputs differ from bf16(v_0), " << wrong_lse << " lse off");
  CHECK(wrong_out == 0);
  CHECK(wrong_lse == 0);
}

TEST_CASE("bf16 products: inputs already bfloat16 with one visible key give the float path's result",
          "[bf16][attention]") {
  dims const s{96, 96, 2, 2, 128};
  inputs in(s, 0xbf);
  for (auto* x : {&in.q, &in.k, &in.v})
    for (float& e : *x) e = bf16(e);
  posenc::attention_options<float> opt;
  std::vector<index_t> one{1};
  opt.key_lengths = posenc::span<const index_t>(one.data(), 1);
  auto const f32 = run<posenc::path::fused>(in, posenc::none{}, opt);
  opt.products = posenc::product_precision::bfloat16;
  auto const got = run<posenc::path::fused>(in, posenc::none{}, opt);
  CHECK(got == f32);
}

TEST_CASE("bf16 products: 16-bit tensors give the float call on their widened values, rounded once",
          "[bf16][attention][half]") {
  // Widening is exact and the mode packs the same float values into
  // bfloat16 pairs, so 16-bit K and V (float q, out) give, bit for bit, the
  // float call on the widened K and V; all-16-bit tensors give that result
  // rounded once to the output's type.
  dims const s = GENERATE(dims{130, 130, 4, 2, 64}, dims{70, 90, 2, 1, 65});
  inputs const in(s, 0x16b);
  auto const run_all = [&](auto tag, posenc::attention_options<float> const& opt, auto const& enc) {
    using S = decltype(tag);
    auto const narrow = [](std::vector<float> const& x) {
      std::vector<S> r(x.size());
      for (std::size_t i = 0; i < x.size(); ++i) r[i] = posenc::detail::to_storage<S>(x[i]);
      return r;
    };
    auto const widen = [](std::vector<S> const& x) {
      std::vector<float> r(x.size());
      for (std::size_t i = 0; i < x.size(); ++i) r[i] = posenc::detail::stored_value<float>(x[i]);
      return r;
    };
    std::vector<S> const q16 = narrow(in.q), k16 = narrow(in.k), v16 = narrow(in.v);
    inputs wide = in;
    wide.k = widen(k16);
    wide.v = widen(v16);
    // 16-bit K and V, float q and out.
    std::vector<float> mixed(in.q.size(), -7.0f);
    posenc::attention<posenc::path::fused>(posenc::make_bshd<const float>(in.q.data(), 1, s.Sq, s.Hq, s.D),
                                           posenc::make_bshd<const S>(k16.data(), 1, s.Sk, s.Hkv, s.D),
                                           posenc::make_bshd<const S>(v16.data(), 1, s.Sk, s.Hkv, s.D),
                                           posenc::make_bshd(mixed.data(), 1, s.Sq, s.Hq, s.D), enc, opt);
    CHECK(mixed == run<posenc::path::fused>(wide, enc, opt));
    // All four tensors 16-bit.
    wide.q = widen(q16);
    std::vector<S> out16(in.q.size(), posenc::detail::to_storage<S>(-7.0f));
    posenc::attention<posenc::path::fused>(posenc::make_bshd<const S>(q16.data(), 1, s.Sq, s.Hq, s.D),
                                           posenc::make_bshd<const S>(k16.data(), 1, s.Sk, s.Hkv, s.D),
                                           posenc::make_bshd<const S>(v16.data(), 1, s.Sk, s.Hkv, s.D),
                                           posenc::make_bshd(out16.data(), 1, s.Sq, s.Hq, s.D), enc, opt);
    std::vector<float> const f = run<posenc::path::fused>(wide, enc, opt);
    std::size_t differ = 0;
    for (std::size_t i = 0; i < f.size(); ++i)
      if (Eigen::numext::bit_cast<std::uint16_t>(out16[i]) !=
          Eigen::numext::bit_cast<std::uint16_t>(posenc::detail::to_storage<S>(f[i])))
        ++differ;
    INFO(describe(s) << ": " << differ << " 16-bit outputs differ from the float call rounded once");
    CHECK(differ == 0);
  };
  posenc::attention_options<float> opt;
  opt.products = posenc::product_precision::bfloat16;
  for (bool causal : {false, true}) {
    opt.causal = causal;
    run_all(Eigen::half{}, opt, posenc::none{});
    run_all(Eigen::bfloat16{}, opt, posenc::none{});
    run_all(Eigen::half{}, opt, posenc::alibi<float>(posenc::alibi_form::paper, s.Hq));
    run_all(Eigen::bfloat16{}, opt, posenc::alibi<float>(posenc::alibi_form::paper, s.Hq));
  }
}

TEST_CASE("bf16 products: off by default; float32 is the default call", "[bf16][attention]") {
  // compiled only where POSENC_BF16_PRODUCTS=1 (tests/CMakeLists.txt defines it for this program)
  static_assert(POSENC_BF16_PRODUCTS == 1, "this program is built with the bfloat16 product mode");
  dims const s{100, 100, 2, 2, 64};
  inputs const in(s, 7);
  posenc::attention_options<float> opt;
  opt.causal = true;
  CHECK(opt.products == posenc::product_precision::float32);
  auto const def = run<posenc::path::fused>(in, posenc::none{}, opt);
  opt.products = posenc::product_precision::float32;
  CHECK(run<posenc::path::fused>(in, posenc::none{}, opt) == def);
  opt.products = posenc::product_precision::bfloat16;
  CHECK(run<posenc::path::fused>(in, posenc::none{}, opt) != def);
}

TEST_CASE("bf16 products: V with Inf in a key no row sees still gives finite rows", "[bf16][attention]") {
  dims const s{64, 64, 1, 1, 64};
  inputs in(s, 11);
  in.v[static_cast<std::size_t>(63 * s.D + 5)] = std::numeric_limits<float>::infinity();  // key 63: seen by row 63 only
  posenc::attention_options<float> opt;
  opt.causal = true;
  opt.products = posenc::product_precision::bfloat16;
  auto const got = run<posenc::path::fused>(in, posenc::none{}, opt);
  bool finite = true;
  for (index_t i = 0; i < 63; ++i)
    for (index_t d = 0; d < s.D; ++d) finite = finite && std::isfinite(got[static_cast<std::size_t>(i * s.D + d)]);
  CHECK(finite);
  CHECK(std::isinf(got[static_cast<std::size_t>(63 * s.D + 5)]));
}

TEST_CASE("bf16 products: rejected where they do not run, before any write", "[bf16][attention][errors]") {
  dims const s{8, 8, 1, 1, 16};
  inputs const in(s, 3);
  posenc::attention_options<float> opt;
  opt.products = posenc::product_precision::bfloat16;
  REQUIRE_THROWS_WITH(run<posenc::path::reference>(in, posenc::none{}, opt),
                      "posenc::attention: products is bfloat16, expected float32 on this path (bfloat16 products "
                      "run on path::fused and path::best)");
  REQUIRE_THROWS_WITH(run<posenc::path::materialized>(in, posenc::none{}, opt),
                      "posenc::attention: products is bfloat16, expected float32 on this path (bfloat16 products "
                      "run on path::fused and path::best)");
  std::vector<float> probs;
  REQUIRE_THROWS_WITH(run<posenc::path::best>(in, posenc::none{}, opt, &probs),
                      posenc_test::contains("scores is set, expected null (path::fused and path::best"));
  opt.products = static_cast<posenc::product_precision>(7);
  REQUIRE_THROWS_WITH(run<posenc::path::fused>(in, posenc::none{}, opt),
                      "posenc::attention: products is 7, expected float32 or bfloat16");

  std::vector<double> qd(8 * 16, 0.5), od(8 * 16, -7.0);
  posenc::attention_options<double> dopt;
  dopt.products = posenc::product_precision::bfloat16;
  REQUIRE_THROWS_WITH(posenc::attention<posenc::path::fused>(
                          posenc::make_bshd(qd.data(), 1, 8, 1, 16), posenc::make_bshd(qd.data(), 1, 8, 1, 16),
                          posenc::make_bshd(qd.data(), 1, 8, 1, 16), posenc::make_bshd(od.data(), 1, 8, 1, 16),
                          posenc::none{}, dopt),
                      "posenc::attention: products is bfloat16 with double tensors, expected float32 (bfloat16 "
                      "products are a float mode)");
  CHECK(std::all_of(od.begin(), od.end(), [](double x) { return x == -7.0; }));

  std::vector<float> q(8 * 16, 0.5f), out(8 * 16, 0.0f);
  std::vector<std::vector<float>> g(3, std::vector<float>(8 * 16, -7.0f));
  auto const cv = posenc::make_bshd(static_cast<float const*>(q.data()), 1, 8, 1, 16);
  auto const ov = posenc::make_bshd(static_cast<float const*>(out.data()), 1, 8, 1, 16);
  opt.products = posenc::product_precision::bfloat16;
  posenc::no_gradients ng;
  REQUIRE_THROWS_WITH(posenc::attention_backward(cv, cv, cv, ov, cv, posenc::make_bshd(g[0].data(), 1, 8, 1, 16),
                                                 posenc::make_bshd(g[1].data(), 1, 8, 1, 16),
                                                 posenc::make_bshd(g[2].data(), 1, 8, 1, 16), posenc::none{}, opt, ng),
                      "posenc::attention_backward: products is bfloat16, expected float32 (the backward pass "
                      "computes float products)");
  for (auto const& x : g) CHECK(std::all_of(x.begin(), x.end(), [](float e) { return e == -7.0f; }));
}

TEST_CASE("bf16 products: the simd pair helpers round to nearest even and add odd then even", "[bf16][simd]") {
  using B = posenc::simd::batch<float>;
  constexpr std::size_t w = B::size;
  auto const bits = [](float x) {
    std::uint32_t u;
    std::memcpy(&u, &x, sizeof u);
    return u;
  };
  auto const from_bits = [](std::uint32_t u) {
    float x;
    std::memcpy(&x, &u, sizeof x);
    return x;
  };
  auto const pair_of = [&](float even, float odd) {
    return static_cast<std::uint32_t>(posenc::simd::narrow<posenc::simd::half_format::bfloat16>(even)) |
           (static_cast<std::uint32_t>(posenc::simd::narrow<posenc::simd::half_format::bfloat16>(odd)) << 16);
  };
  // Normal values, a third of them exact ties (a bfloat16 value + half its ulp) and their neighbours.
  auto const data = posenc_test::random_vector<float>(4096, 0xe1, -8, 8);
  std::vector<float> x(data);
  // Accumulators with full 24-bit significands: the two additions round, so their order shows.
  auto const acc = posenc_test::random_vector<float>(4096, 0xe2, -64, 64);
  for (std::size_t i = 0; i < x.size(); i += 3) x[i] = from_bits((bits(x[i]) & 0xffff0000u) | (0x8000u + static_cast<std::uint32_t>(i % 2)));
  std::size_t bad_pairs = 0, bad_row = 0, bad_dot = 0;
  for (std::size_t i = 0; i + 4 * w <= x.size(); i += 4 * w) {
    B const a = B::load_unaligned(x.data() + i), b = B::load_unaligned(x.data() + i + w);
    B const c = B::load_unaligned(x.data() + i + 2 * w), d = B::load_unaligned(x.data() + i + 3 * w);
    B const pa = posenc::simd::bf16_pairs(a, b), pc = posenc::simd::bf16_pairs(c, d);
    B const s = posenc::simd::dot_bf16_pairs(B::load_unaligned(acc.data() + i), pa, pc);
    float ra[w], rs[w];
    pa.store_unaligned(ra);
    s.store_unaligned(rs);
    for (std::size_t l = 0; l < w; ++l) {
      float const* p = x.data() + i + l;
      if (bits(ra[l]) != pair_of(p[0], p[w])) ++bad_pairs;
      float const t = acc[i + l] + bf16(p[w]) * bf16(p[3 * w]);  // odd products first, as vdpbf16ps adds them
      if (rs[l] != t + bf16(p[0]) * bf16(p[2 * w])) ++bad_dot;
    }
  }
  for (index_t n = 1; n <= 70; ++n) {  // every tail length, the slots past (n + 1) / 2 untouched
    std::vector<float> out(40, -7.0f);
    posenc::simd::store_bf16_row(out.data(), x.data() + n, n);
    for (index_t e = 0; e < 40; ++e) {
      std::uint32_t const want =
          e < (n + 1) / 2 ? pair_of(x[static_cast<std::size_t>(n + 2 * e)], 2 * e + 1 < n ? x[static_cast<std::size_t>(n + 2 * e + 1)] : 0.0f)
                          : bits(-7.0f);
      if (bits(out[static_cast<std::size_t>(e)]) != want) ++bad_row;
    }
  }
  INFO(bad_pairs << " pair lanes, " << bad_row << " row slots, " << bad_dot << " dot lanes differ from the scalar rule");
  CHECK(bad_pairs == 0);
  CHECK(bad_row == 0);
  CHECK(bad_dot == 0);
}
