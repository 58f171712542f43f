// SPDX-License-Identifier: MIT
// 16-bit tensors (Eigen::half, Eigen::bfloat16): K and V with float q and out, and all-16-bit q, k, v and out;
// fused and reference paths, 16-bit kv_cache and packed sequences.
#include <posenc/attention/attention.hpp>
#include <posenc/attention/fused.hpp>
#include <posenc/attention/packed.hpp>
#include <posenc/core/half.hpp>
#include <posenc/encoding/alibi.hpp>
#include <posenc/encoding/none.hpp>
#include <posenc/encoding/rope.hpp>
#include <posenc/encoding/t5_bias.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "support/catch.hpp"
#include "support/random.hpp"
#include "support/strided_views.hpp"
#include "support/tolerance.hpp"

namespace attention_half_storage_tests {

using posenc::index_t;

namespace {

constexpr index_t W = posenc::simd::width<float>;

using posenc_test::shape;

/// q in float; k and v drawn in float, rounded once to S and kept both as S
/// and as the float values of those S (the same rounded inputs for the
/// reference). qh and qf: q rounded to S, and the float values of qh.
template <class S>
struct problem {
  shape s;
  std::vector<float> q, kf, vf, qf;
  std::vector<S> kh, vh, qh;

  problem(shape const& sh, std::uint64_t seed) : s(sh) {
    q = posenc_test::random_vector<float>(static_cast<std::size_t>(extent(s.Sq, s.Hq, s.D)), seed, -2, 2);
    kf = posenc_test::random_vector<float>(static_cast<std::size_t>(extent(s.Sk, s.Hkv, s.D)), seed + 1, -2, 2);
    vf = posenc_test::random_vector<float>(static_cast<std::size_t>(extent(s.Sk, s.Hkv, s.Dv)), seed + 2);
    round(kf, kh);
    round(vf, vh);
    qf = q;
    round(qf, qh);
  }
  static void round(std::vector<float>& f, std::vector<S>& h) {
    h.resize(f.size());
    for (std::size_t n = 0; n < f.size(); ++n) {
      h[n] = posenc::detail::to_storage<S>(f[n]);
      f[n] = posenc::detail::stored_value<float>(h[n]);
    }
  }
  index_t extent(index_t seq, index_t heads, index_t dim) const {
    return posenc_test::strided_extent(s, seq, heads, dim);
  }
  template <class U>
  posenc::view<U> make(U* data, index_t seq, index_t heads, index_t dim) const {
    return posenc_test::strided_view(s, data, seq, heads, dim);
  }
  posenc::view<const float> qv() const { return make<const float>(q.data(), s.Sq, s.Hq, s.D); }
};

/// Runs Path with k and v of element type KV (float: the rounded values;
/// S: the 16-bit storage) into a fresh strided output; returns out + lse.
template <class Path, class KV, class S, class E>
std::vector<float> run(problem<S> const& pb, E const& enc, posenc::attention_options<float> opt) {
  shape const& s = pb.s;
  std::vector<float> out(static_cast<std::size_t>(pb.extent(s.Sq, s.Hq, s.Dv)), -7.0f);
  std::vector<float> lse(static_cast<std::size_t>(s.B * s.Hq * s.Sq), -7.0f);
  opt.lse = lse;
  posenc::view<float> const o = pb.template make<float>(out.data(), s.Sq, s.Hq, s.Dv);
  if constexpr (std::is_same_v<KV, float>)
    posenc::attention<Path>(pb.qv(), pb.template make<const float>(pb.kf.data(), s.Sk, s.Hkv, s.D),
                            pb.template make<const float>(pb.vf.data(), s.Sk, s.Hkv, s.Dv), o, enc, opt);
  else
    posenc::attention<Path>(pb.qv(), pb.template make<const S>(pb.kh.data(), s.Sk, s.Hkv, s.D),
                            pb.template make<const S>(pb.vh.data(), s.Sk, s.Hkv, s.Dv), o, enc, opt);
  out.insert(out.end(), lse.begin(), lse.end());
  return out;
}

/// One 16-bit ulp at 1 for S: 2^-10 (binary16), 2^-7 (bfloat16).
template <class S>
constexpr double epsilon16_v = std::is_same_v<S, Eigen::bfloat16> ? 1.0 / 128 : 1.0 / 1024;

/// Runs Path with q, k, v and out all of S (QS = S) or with q the float
/// values of qh and out float (QS = float), k and v S; returns out (widened)
/// and lse (float, its own part of the vector from index `out_size`).
template <class Path, class QS, class S, class E>
std::vector<float> run16(problem<S> const& pb, E const& enc, posenc::attention_options<float> opt) {
  shape const& s = pb.s;
  std::size_t const n = static_cast<std::size_t>(pb.extent(s.Sq, s.Hq, s.Dv));
  std::vector<QS> out(n, posenc::detail::to_storage<QS>(-7.0f));
  std::vector<float> lse(static_cast<std::size_t>(s.B * s.Hq * s.Sq), -7.0f);
  opt.lse = lse;
  posenc::view<QS> const o = pb.template make<QS>(out.data(), s.Sq, s.Hq, s.Dv);
  QS const* qd;
  if constexpr (std::is_same_v<QS, float>)
    qd = pb.qf.data();
  else
    qd = pb.qh.data();
  posenc::attention<Path>(pb.template make<const QS>(qd, s.Sq, s.Hq, s.D),
                          pb.template make<const S>(pb.kh.data(), s.Sk, s.Hkv, s.D),
                          pb.template make<const S>(pb.vh.data(), s.Sk, s.Hkv, s.Dv), o, enc, opt);
  std::vector<float> r(n);
  for (std::size_t i = 0; i < n; ++i) r[i] = posenc::detail::stored_value<float>(out[i]);
  r.insert(r.end(), lse.begin(), lse.end());
  return r;
}

/// Bits of x rounded once to S (NaN compares by NaN-ness).
template <class S>
bool same16(float got, float want) {
  if (std::isnan(got) || std::isnan(want)) return std::isnan(got) && std::isnan(want);
  return Eigen::numext::bit_cast<std::uint16_t>(posenc::detail::to_storage<S>(got)) ==
             Eigen::numext::bit_cast<std::uint16_t>(posenc::detail::to_storage<S>(want)) &&
         got == posenc::detail::stored_value<float>(posenc::detail::to_storage<S>(got));
}

/// True if the float x lies exactly halfway between two adjacent values of S.
template <class S>
bool midpoint16(float x) {
  if (!std::isfinite(x)) return false;
  double const a = posenc::detail::stored_value<double>(posenc::detail::to_storage<S>(x));
  double const b = 2.0 * static_cast<double>(x) - a;  // the other neighbour if x is a midpoint
  return a != static_cast<double>(x) &&
         posenc::detail::stored_value<double>(posenc::detail::to_storage<S>(static_cast<float>(b))) == b;
}

/// The rule for all-16-bit tensors: q, k, v and out of S. The fused and
/// reference results against the double reference on the same rounded inputs
/// (float q and out), within 2x the error of the plain implementation doing
/// the same in float (16-bit inputs, output rounded once) + one 16-bit ulp of
/// the output; lse (float) by the float rule. Exact: the fused 16-bit output
/// is the fused float-output result on the same inputs rounded once, the
/// reference's likewise unless that float is a 16-bit midpoint (the reference
/// rounds its double, not the float: see the midpoint test below);
/// path::best is the fused path.
template <class S, class E>
void check_agrees16(problem<S> const& pb, E const& enc, posenc::attention_options<float> const& opt,
                    std::string const& what) {
  std::size_t const n = static_cast<std::size_t>(pb.extent(pb.s.Sq, pb.s.Hq, pb.s.Dv));
  auto const ref = run16<posenc::path::reference, float>(pb, enc, opt);
  auto const ref16 = run16<posenc::path::reference, S>(pb, enc, opt);
  auto const plain = run16<posenc_test::plain_path, S>(pb, enc, opt);
  auto const got = run16<posenc::path::fused, S>(pb, enc, opt);
  auto const got32 = run16<posenc::path::fused, float>(pb, enc, opt);
  auto const best = run16<posenc::path::best, S>(pb, enc, opt);
  auto part = [&](std::vector<float> const& x, bool lse) {
    return lse ? std::vector<float>(x.begin() + static_cast<std::ptrdiff_t>(n), x.end())
               : std::vector<float>(x.begin(), x.begin() + static_cast<std::ptrdiff_t>(n));
  };
  auto const rep = posenc_test::within_tolerance(part(got, false), part(ref, false), part(plain, false), epsilon16_v<S>);
  auto const rep_ref = posenc_test::within_tolerance(part(ref16, false), part(ref, false), part(plain, false),
                                                     epsilon16_v<S>);
  auto const rep_lse = posenc_test::within_tolerance(part(got, true), part(ref, true), part(plain, true), 1e-6);
  INFO(what << " (all 16-bit): out " << rep.describe() << "; reference out " << rep_ref.describe() << "; lse "
            << rep_lse.describe());
  CHECK(rep.ok);
  CHECK(rep_ref.ok);
  CHECK(rep_lse.ok);
  bool once_fused = true, once_ref = true, same_best = true, same_lse = true, untouched = true;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    same_best = same_best && (best[i] == got[i] || (std::isnan(best[i]) && std::isnan(got[i])));
    if (i < n) {
      once_fused = once_fused && same16<S>(got[i], got32[i]);
      once_ref = once_ref && (same16<S>(ref16[i], ref[i]) || midpoint16<S>(ref[i]));
      // -7 marks elements no view covers: no path may write them.
      if (ref[i] == -7.0f) untouched = untouched && got[i] == -7.0f && ref16[i] == -7.0f;
    } else {
      same_lse = same_lse && (got[i] == got32[i] || (std::isnan(got[i]) && std::isnan(got32[i])));
    }
  }
  CHECK(once_fused);
  CHECK(once_ref);
  CHECK(same_best);
  CHECK(same_lse);
  CHECK(untouched);
}

/// The rule of the tests: the 16-bit fused result against the double
/// reference on the same rounded inputs, within 2x the error of a plain float
/// implementation on the 16-bit inputs (+ atol); the padding of the strided
/// output stays untouched. The reference reading 16-bit K and V equals the
/// reference on their float values exactly, unless the call rotates the keys
/// (`rounds_rotated_keys`: rotated 16-bit keys are rounded once more to 16
/// bits, so only the 16-bit reference holds the same inputs). Prefill with
/// at least a lane block (W rows) per kv head runs the lane kernel for 16-bit
/// and float K and V alike, through the same micro-kernels on exactly widened
/// tiles: without that extra rounding its result equals the fused result on
/// the float values bit for bit.
template <class S, class E>
void check_agrees(problem<S> const& pb, E const& enc, posenc::attention_options<float> const& opt,
                  std::string const& what, bool rounds_rotated_keys = false) {
  auto const ref = run<posenc::path::reference, S>(pb, enc, opt);
  auto const ref16 = rounds_rotated_keys ? ref : run<posenc::path::reference, float>(pb, enc, opt);
  auto const plain = run<posenc_test::plain_path, S>(pb, enc, opt);
  auto const got = run<posenc::path::fused, S>(pb, enc, opt);
  bool const lanes = pb.s.Sq * (pb.s.Hq / pb.s.Hkv) >= W && !rounds_rotated_keys;
  auto const got32 = lanes ? run<posenc::path::fused, float>(pb, enc, opt) : got;
  auto const best = run<posenc::path::best, S>(pb, enc, opt);
  auto const rep = posenc_test::within_tolerance(got, ref, plain, 1e-6);
  INFO(what << ": " << rep.describe());
  CHECK(rep.ok);
  bool same_ref = true, same_best = true, same_fused = true, untouched = true;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    same_ref = same_ref && (ref16[i] == ref[i] || (std::isnan(ref16[i]) && std::isnan(ref[i])));
    same_fused = same_fused && (got32[i] == got[i] || (std::isnan(got32[i]) && std::isnan(got[i])));
    same_best = same_best && (best[i] == got[i] || (std::isnan(best[i]) && std::isnan(got[i])));
    // -7 marks elements no view covers: no path may write them.
    if (ref[i] == -7.0f) untouched = untouched && got[i] == -7.0f;
  }
  CHECK(same_ref);
  CHECK(same_fused);
  CHECK(same_best);
  CHECK(untouched);
  check_agrees16(pb, enc, opt, what);
}

std::string describe(shape const& s) {
  return "B" + std::to_string(s.B) + " Sq" + std::to_string(s.Sq) + " Sk" + std::to_string(s.Sk) + " Hq" +
         std::to_string(s.Hq) + " Hkv" + std::to_string(s.Hkv) + " D" + std::to_string(s.D) + " Dv" +
         std::to_string(s.Dv) + " pad" + std::to_string(s.pad) + " off" + std::to_string(s.offset) +
         (s.bhsd ? " bhsd" : "");
}

/// Shapes around the vector width, the row group and the key tile (64).
std::vector<shape> shapes() {
  std::vector<shape> v;
  v.push_back({1, 1, 1, 1, 1, 8, 8});
  v.push_back({2, 1, 65, 8, 2, 2 * W, 2 * W, 0, 0});      // decode, GQA 8/2
  v.push_back({1, 3, 64, 4, 4, W + 3, W - 1, 3, 1});      // head dims off the width, strided
  v.push_back({2, 5, 130, 4, 1, 64, 64, 2, 3, true});     // BHSD, MQA, two tiles and a tail
  v.push_back({2, 1, 130, 8, 2, 2 * W, 2 * W, 1, 2, true});  // BHSD decode (head by head), GQA 8/2
  v.push_back({1, 1, 77, 2, 2, W + 3, W, 0, 1, true});     // BHSD decode, one row per kv head, dims off the width
  v.push_back({1, 1, 75, 3, 3, 5 * W + 3, 9 * W + 3, 1, 0, true});  // BHSD decode, one row per kv head, wide dims
  v.push_back({2, 1, 66, 2, 2, 4 * W, 8 * W, 0, 0});       // decode, one row per kv head, dims of whole vector pairs
  v.push_back({1, 2, 70, 4, 2, W, W, 0, 0, true});         // BHSD, two query tokens: 4 rows per kv head
  v.push_back({1, 17, 63, 2, 2, W - 1, 2 * W + 1, 1, 0}); // prefill, just over a lane block of rows
  v.push_back({1, 3, 40, 2, 1, W, W});                    // prefill rows through the row kernel (6 < W)
  v.push_back({1, 64, 64, 2, 1, 32, 32});                 // Sq == Sk prefill
  return v;
}

/// Prefill shapes of the lane kernel (at least a lane block, W rows, per kv
/// head): lengths one below, at and above the key tile (64), head dims around
/// the vector width, strided, misaligned (odd offsets and pads) and BHSD views.
std::vector<shape> lane_shapes() {
  std::vector<shape> v;
  v.push_back({1, 63, 63, 1, 1, W - 1, W + 1, 1, 1});
  v.push_back({1, 64, 64, 2, 2, W, W, 0, 0});
  v.push_back({2, 65, 65, 2, 1, W + 1, W - 1, 2, 3, true});
  v.push_back({1, 65, 129, 4, 2, 2 * W, 2 * W + 1, 0, 1});   // more keys than queries, GQA 4/2
  v.push_back({1, W - 1, 64, 2, 1, 2 * W - 1, 2 * W, 3, 0});  // 2W - 2 rows from a group of 2
  return v;
}

template <class S>
void check_all_options(char const* format, std::vector<shape> const& list = shapes()) {
  std::uint64_t seed = 100;
  for (shape const& s : list) {
    ++seed;
    problem<S> const pb(s, seed);
    std::string const d = std::string(format) + " " + describe(s);
    posenc::attention_options<float> opt;
    check_agrees(pb, posenc::none{}, opt, d + " plain");
    opt.causal = true;
    check_agrees(pb, posenc::none{}, opt, d + " causal");
    opt.sliding_window = 7;
    check_agrees(pb, posenc::none{}, opt, d + " window 7");
    opt.sliding_window = 0;
    opt.causal = false;
    opt.softcap = 5;
    check_agrees(pb, posenc::none{}, opt, d + " softcap");
    opt.softcap = 0;
    std::vector<index_t> lens(static_cast<std::size_t>(s.B));
    for (index_t b = 0; b < s.B; ++b) lens[static_cast<std::size_t>(b)] = std::max<index_t>(0, s.Sk - 1 - 7 * b);
    opt.key_lengths = posenc::span<const index_t>(lens.data(), s.B);
    check_agrees(pb, posenc::none{}, opt, d + " key_lengths");
    opt.key_lengths = {};
    opt.causal = seed % 2 == 0;
    check_agrees(pb, posenc::alibi<float>(posenc::alibi_form::symmetric, s.Hq), opt, d + " alibi");
    check_agrees(pb, posenc::t5_bias<float>(posenc::t5_bias_params{s.Hq, true, 32, 128}, seed, 0.5), opt,
                 d + " t5");
    if (s.D % 2 == 0) {
      posenc::rope<float> rope(posenc::rope_layout::half_split, s.D);
      check_agrees(pb, rope, opt, d + " rope (rotated copies)", true);
      opt.keys_rotated = true;
      check_agrees(pb, rope, opt, d + " rope, keys already rotated");
      opt.keys_rotated = false;
      rope.reserve(512);
      check_agrees(pb, rope, opt, d + " rope (rotated in the kernel)", true);
    }
  }
}

}  // namespace

TEST_CASE("16-bit K and V, and all-16-bit tensors, agree with the reference on the same rounded inputs", "[half]") {
  SECTION("binary16") { check_all_options<Eigen::half>("binary16"); }
  SECTION("bfloat16") { check_all_options<Eigen::bfloat16>("bfloat16"); }
}

TEST_CASE("16-bit K and V, and all-16-bit tensors, in the lane kernel (prefill) agree with the reference", "[half][lanes]") {
  SECTION("binary16") { check_all_options<Eigen::half>("binary16 lanes", lane_shapes()); }
  SECTION("bfloat16") { check_all_options<Eigen::bfloat16>("bfloat16 lanes", lane_shapes()); }
}

TEST_CASE("16-bit K and V: non-finite values and a fully masked row", "[half]") {
  shape s{1, 2, 70, 2, 1, W, W};
  problem<Eigen::half> pb(s, 7);
  posenc::attention_options<float> opt;
  opt.causal = true;
  opt.q_positions = posenc::position_span(-1);  // row 0 sees no key: zeros, lse = -inf
  // An Inf in V at a key no row sees adds nothing (probability 0).
  pb.vh[static_cast<std::size_t>(69 * s.Dv)] = Eigen::half(INFINITY);
  pb.vf[static_cast<std::size_t>(69 * s.Dv)] = INFINITY;
  check_agrees(pb, posenc::none{}, opt, "inf in an unseen value");
  auto const got = run<posenc::path::fused, Eigen::half>(pb, posenc::none{}, opt);
  for (index_t d = 0; d < s.Dv; ++d) CHECK(got[static_cast<std::size_t>(d)] == 0.0f);
}

TEST_CASE("16-bit K and V in the lane kernel: an Inf in a value no row sees", "[half][lanes]") {
  shape s{1, 70, 70, 2, 1, W, W + 1, 1, 1};
  problem<Eigen::bfloat16> pb(s, 9);
  posenc::attention_options<float> opt;
  index_t const len = 69;  // key 69 is hidden from every row; its tile is guarded
  opt.key_lengths = posenc::span<const index_t>(&len, 1);
  std::size_t const at = static_cast<std::size_t>(s.offset + 69 * (s.Hkv * (s.Dv + s.pad) + s.pad) + 2);
  pb.vh[at] = Eigen::bfloat16(INFINITY);
  pb.vf[at] = INFINITY;
  check_agrees(pb, posenc::none{}, opt, "inf in an unseen value (lanes)");
  auto const got = run<posenc::path::fused, Eigen::bfloat16>(pb, posenc::none{}, opt);
  bool finite = true;
  for (std::size_t n = 0; n < got.size(); ++n) finite = finite && std::isfinite(got[n]);
  CHECK(finite);
}

namespace {

/// Float keys and values of `n` tokens (batch, n, Hkv, D).
struct tokens {
  std::vector<float> k, v;
};

template <class S>
void check_cache(char const* format) {
  index_t const B = 2, Hq = 8, Hkv = 2, D = 2 * W + 2, Dv = W, S0 = 37;
  posenc::rope<float> rope(posenc::rope_layout::interleaved, D);
  std::vector<float> k = posenc_test::random_vector<float>(static_cast<std::size_t>(B * S0 * Hkv * D), 11, -2, 2);
  std::vector<float> v = posenc_test::random_vector<float>(static_cast<std::size_t>(B * S0 * Hkv * Dv), 12);
  std::vector<float> q = posenc_test::random_vector<float>(static_cast<std::size_t>(B * S0 * Hq * D), 13, -2, 2);
  auto kview = [&](index_t s0, index_t n) {
    posenc::view<const float> x = posenc::make_bshd(static_cast<float const*>(k.data()), B, S0, Hkv, D);
    x.data += s0 * x.seq_stride;
    x.seq = n;
    return x;
  };
  auto vview = [&](index_t s0, index_t n) {
    posenc::view<const float> x = posenc::make_bshd(static_cast<float const*>(v.data()), B, S0, Hkv, Dv);
    x.data += s0 * x.seq_stride;
    x.seq = n;
    return x;
  };
  auto qview = [&](index_t s0, index_t n) {
    posenc::view<const float> x = posenc::make_bshd(static_cast<float const*>(q.data()), B, S0, Hq, D);
    x.data += s0 * x.seq_stride;
    x.seq = n;
    return x;
  };

  // Prefill: one append of every token, one call over every query.
  posenc::kv_cache<S> full(B, Hkv, D, Dv);
  full.append(kview(0, S0), vview(0, S0), rope);
  REQUIRE(full.keys_rotated());
  // The keys are rotated in float and rounded once: the float cache's keys, narrowed.
  posenc::kv_cache<float> wide(B, Hkv, D, Dv);
  wide.append(kview(0, S0), vview(0, S0), rope);
  bool once = true;
  for (index_t b = 0; b < B; ++b)
    for (index_t t = 0; t < S0; ++t)
      for (index_t h = 0; h < Hkv; ++h)
        for (index_t d = 0; d < D; ++d) {
          S const want = posenc::detail::to_storage<S>(wide.keys()(b, t, h, d));
          once = once && Eigen::numext::bit_cast<std::uint16_t>(want) ==
                             Eigen::numext::bit_cast<std::uint16_t>(full.keys()(b, t, h, d));
        }
  CHECK(once);

  posenc::attention_options<float> opt;
  opt.causal = true;
  std::vector<float> pre(static_cast<std::size_t>(B * S0 * Hq * Dv));
  posenc::attention(qview(0, S0), full, posenc::make_bshd(pre.data(), B, S0, Hq, Dv), rope, opt);

  // The reference on the float values of the cached 16-bit keys and values.
  std::vector<float> kr(static_cast<std::size_t>(B * S0 * Hkv * D)), vr(static_cast<std::size_t>(B * S0 * Hkv * Dv));
  for (index_t b = 0; b < B; ++b)
    for (index_t t = 0; t < S0; ++t)
      for (index_t h = 0; h < Hkv; ++h) {
        posenc::detail::widen_row(full.keys().ptr(b, t, h), D, kr.data() + ((b * S0 + t) * Hkv + h) * D);
        posenc::detail::widen_row(full.values().ptr(b, t, h), Dv, vr.data() + ((b * S0 + t) * Hkv + h) * Dv);
      }
  auto on_rounded = [&](auto path, std::vector<float>& out) {
    posenc::attention_options<float> o = opt;
    o.keys_rotated = true;
    posenc::attention<decltype(path)>(qview(0, S0), posenc::make_bshd(static_cast<float const*>(kr.data()), B, S0, Hkv, D),
                                      posenc::make_bshd(static_cast<float const*>(vr.data()), B, S0, Hkv, Dv),
                                      posenc::make_bshd(out.data(), B, S0, Hq, Dv), rope, o);
  };
  std::vector<float> ref(pre.size()), plain(pre.size());
  on_rounded(posenc::path::reference{}, ref);
  on_rounded(posenc_test::plain_path{}, plain);
  auto const rep = posenc_test::within_tolerance(pre, ref, plain, 1e-6);
  INFO(format << " prefill over the 16-bit cache: " << rep.describe());
  CHECK(rep.ok);

  // Decode: token by token, each query over the cache so far == that prefill row.
  posenc::kv_cache<S> step(B, Hkv, D, Dv);
  std::vector<float> dec(pre.size());
  for (index_t t = 0; t < S0; ++t) {
    step.append(kview(t, 1), vview(t, 1), rope);
    posenc::view<float> o = posenc::make_bshd(dec.data(), B, S0, Hq, Dv);
    o.data += t * o.seq_stride;
    o.seq = 1;
    posenc::attention(qview(t, 1), step, o, rope);
  }
  auto const drep = posenc_test::within_tolerance(dec, ref, plain, 1e-6);
  INFO(format << " decode == prefill: " << drep.describe());
  CHECK(drep.ok);
  float dmax = 0;
  for (std::size_t n = 0; n < pre.size(); ++n) dmax = std::max(dmax, std::abs(dec[n] - pre[n]));
  CHECK(dmax <= 1e-5f);

  // All 16-bit: q and out of S over the same caches. q rounded to S; the
  // reference on the float values of that q and of the cached K and V; the
  // plain implementation on the 16-bit tensors, its output rounded once.
  std::vector<S> qh(q.size());
  std::vector<float> qr(q.size());
  for (std::size_t n = 0; n < q.size(); ++n) {
    qh[n] = posenc::detail::to_storage<S>(q[n]);
    qr[n] = posenc::detail::stored_value<float>(qh[n]);
  }
  auto qhview = [&](index_t s0, index_t n) {
    posenc::view<const S> x = posenc::make_bshd(static_cast<S const*>(qh.data()), B, S0, Hq, D);
    x.data += s0 * x.seq_stride;
    x.seq = n;
    return x;
  };
  std::vector<S> pre16(pre.size()), dec16(pre.size()), plain16(pre.size());
  posenc::attention(qhview(0, S0), full, posenc::make_bshd(pre16.data(), B, S0, Hq, Dv), rope, opt);
  posenc::kv_cache<S> step16(B, Hkv, D, Dv);
  for (index_t t = 0; t < S0; ++t) {
    step16.append(kview(t, 1), vview(t, 1), rope);
    posenc::view<S> o = posenc::make_bshd(dec16.data(), B, S0, Hq, Dv);
    o.data += t * o.seq_stride;
    o.seq = 1;
    posenc::attention(qhview(t, 1), step16, o, rope);
  }
  {
    posenc::attention_options<float> o = opt;
    o.keys_rotated = true;
    posenc::attention<posenc_test::plain_path>(qhview(0, S0), full.keys(), full.values(),
                                               posenc::make_bshd(plain16.data(), B, S0, Hq, Dv), rope, o);
    std::vector<float> qsave = q;
    q = qr;  // the reference on the rounded q
    on_rounded(posenc::path::reference{}, ref);
    q = qsave;
  }
  std::vector<float> p16(pre.size()), d16(pre.size()), l16(pre.size());
  for (std::size_t n = 0; n < pre.size(); ++n) {
    p16[n] = posenc::detail::stored_value<float>(pre16[n]);
    d16[n] = posenc::detail::stored_value<float>(dec16[n]);
    l16[n] = posenc::detail::stored_value<float>(plain16[n]);
  }
  double const eps = std::is_same_v<S, Eigen::bfloat16> ? 1.0 / 128 : 1.0 / 1024;
  auto const prep16 = posenc_test::within_tolerance(p16, ref, l16, eps);
  auto const drep16 = posenc_test::within_tolerance(d16, ref, l16, eps);
  INFO(format << " all 16-bit prefill over the cache: " << prep16.describe() << "; decode: " << drep16.describe());
  CHECK(prep16.ok);
  CHECK(drep16.ok);
  // Decode == prefill up to the one rounding of out: their float results are
  // within 1e-5 (above), each rounded once (half an ulp each).
  // The ulp of a subnormal 16-bit value is the smallest positive one.
  float const tiny = posenc::detail::stored_value<float>(Eigen::numext::bit_cast<S>(std::uint16_t{1}));
  bool within_ulp = true;
  for (std::size_t n = 0; n < pre.size(); ++n) {
    float const a = p16[n], b = d16[n];
    float const ulp = std::max(tiny, static_cast<float>(eps) * std::max(std::abs(a), std::abs(b)));
    within_ulp = within_ulp && std::abs(a - b) <= 1e-5f + ulp;
  }
  CHECK(within_ulp);
}

/// x rounded to nearest even into S, the slow way: of the three 16-bit
/// values around x rounded through float, the nearest to x (their distances
/// to x are exact in double), the one with an even last bit on a tie.
template <class S>
std::uint16_t nearest16(double x) {
  auto const c = Eigen::numext::bit_cast<std::uint16_t>(posenc::detail::to_storage<S>(static_cast<float>(x)));
  std::uint16_t best = c;
  double best_d = std::numeric_limits<double>::infinity();
  for (int step : {-1, 0, 1}) {
    auto const u = static_cast<std::uint16_t>(c + step);
    double const d = std::abs(x - posenc::detail::stored_value<double>(Eigen::numext::bit_cast<S>(u)));
    if (std::isnan(d)) continue;
    if (d < best_d || (d == best_d && (u & 1u) == 0)) best = u, best_d = d;
  }
  return best;
}

/// The reference with all-16-bit q, k, v and out (one row per (b, i, h), one
/// kv head) and, on the same values widened to double, the reference in
/// double; returns (16-bit out bits, double out).
template <class S>
std::pair<std::vector<std::uint16_t>, std::vector<double>> reference16_and_double(
    std::vector<S> const& q, std::vector<S> const& k, std::vector<S> const& v, index_t Sq, index_t Sk, index_t H,
    index_t D, index_t Dv, double scale) {
  auto widen = [](std::vector<S> const& x) {
    std::vector<double> r(x.size());
    for (std::size_t n = 0; n < x.size(); ++n) r[n] = posenc::detail::stored_value<double>(x[n]);
    return r;
  };
  std::vector<double> const qd = widen(q), kd = widen(k), vd = widen(v);
  std::size_t const n = static_cast<std::size_t>(Sq * H * Dv);
  std::vector<S> out16(n, posenc::detail::to_storage<S>(-7.0f));
  std::vector<double> outd(n, -7.0);
  posenc::attention_options<float> opt;
  opt.scale = scale;
  posenc::attention_options<double> optd;
  optd.scale = scale;
  posenc::attention<posenc::path::reference>(
      posenc::make_bshd(q.data(), 1, Sq, H, D), posenc::make_bshd(k.data(), 1, Sk, H, D),
      posenc::make_bshd(v.data(), 1, Sk, H, Dv), posenc::make_bshd(out16.data(), 1, Sq, H, Dv), posenc::none{}, opt);
  posenc::attention<posenc::path::reference>(
      posenc::make_bshd(qd.data(), 1, Sq, H, D), posenc::make_bshd(kd.data(), 1, Sk, H, D),
      posenc::make_bshd(vd.data(), 1, Sk, H, Dv), posenc::make_bshd(outd.data(), 1, Sq, H, Dv), posenc::none{}, optd);
  std::vector<std::uint16_t> bits(n);
  for (std::size_t i = 0; i < n; ++i) bits[i] = Eigen::numext::bit_cast<std::uint16_t>(out16[i]);
  return {bits, outd};
}

/// A 16-bit output of path::reference is its double result rounded once to
/// nearest even: on random inputs, and on outputs built to lie just above a
/// 16-bit midpoint m by less than half a float ulp, where rounding through
/// float gives m and then (tie to even) the value below, the wrong one.
/// Two keys with scores 0 and g = 2^-17 weigh values v (even last bit) and
/// v' (the next 16-bit value) by 1 - p and p = 1 / (1 + e^-g) = 1/2 + g/4 - ...,
/// so out = m + (g/4) (v' - v) + ..., above m by 2^-19 16-bit ulps: 2^-29
/// (binary16) or 2^-26 (bfloat16) relative to m, under float's 2^-24.
template <class S>
void check_reference_rounds_once(std::initializer_list<std::uint16_t> evens) {
  std::size_t bad = 0, cases = 0, twice_differs = 0;
  for (std::uint16_t h : evens) {
    for (std::uint16_t sign : {std::uint16_t(0), std::uint16_t(0x8000)}) {
      auto const bits_of = [](std::uint16_t u) { return Eigen::numext::bit_cast<S>(u); };
      std::vector<S> const q{posenc::detail::to_storage<S>(1.0f)};
      std::vector<S> const k{posenc::detail::to_storage<S>(0.0f), posenc::detail::to_storage<S>(0x1p-17f)};
      std::vector<S> const v{bits_of(static_cast<std::uint16_t>(h | sign)),
                             bits_of(static_cast<std::uint16_t>((h + 1) | sign))};
      auto const [got, want] = reference16_and_double(q, k, v, 1, 2, 1, 1, 1, 1.0);
      // The construction: through float, the value below; once, the value above.
      auto const twice = Eigen::numext::bit_cast<std::uint16_t>(
          posenc::detail::to_storage<S>(static_cast<float>(want[0])));
      twice_differs += twice == (h | sign) && nearest16<S>(want[0]) == ((h + 1) | sign) ? 1 : 0;
      bad += got[0] != ((h + 1) | sign) ? 1 : 0;
      ++cases;
    }
  }
  CHECK(twice_differs == cases);
  CHECK(bad == 0);

  index_t const Sq = 3, Sk = 37, H = 2, D = 24, Dv = 40;
  auto draw = [](std::size_t n, std::uint64_t seed, float lo, float hi) {
    std::vector<float> const f = posenc_test::random_vector<float>(n, seed, lo, hi);
    std::vector<S> r(n);
    for (std::size_t i = 0; i < n; ++i) r[i] = posenc::detail::to_storage<S>(f[i]);
    return r;
  };
  auto const [got, want] = reference16_and_double(draw(Sq * H * D, 11, -2, 2), draw(Sk * H * D, 12, -2, 2),
                                                   draw(Sk * H * Dv, 13, -1, 1), Sq, Sk, H, D, Dv, 0.2);
  std::size_t bad_random = 0;
  for (std::size_t i = 0; i < got.size(); ++i) bad_random += got[i] != nearest16<S>(want[i]) ? 1 : 0;
  CHECK(got.size() == static_cast<std::size_t>(Sq * H * Dv));
  CHECK(bad_random == 0);
}

/// Packed 16-bit tensors: q and out of QS (float, or S for all-16-bit), k
/// and v of S, n sequences back to back with GQA, key lengths and lse. Every
/// sequence's out rows and lse must be those of the contiguous 16-bit call on
/// its rows alone, bit for bit; returns the number of elements that differ.
template <class Path, class QS, class S, class E>
std::size_t packed16_mismatches(E const& enc, bool causal) {
  index_t const Hq = 4, Hkv = 2, D = 16, n = 4;
  index_t const lq[n] = {4, 1, 0, 6}, lk[n] = {9, 5, 3, 11}, keys[n] = {9, 3, 2, 10};
  std::vector<index_t> const cq = posenc::cumulative_lengths(posenc::span<const index_t>(lq, n));
  std::vector<index_t> const ck = posenc::cumulative_lengths(posenc::span<const index_t>(lk, n));
  index_t const Qt = cq.back(), Kt = ck.back();
  auto draw = [](auto tag, index_t count, std::uint64_t seed) {
    using X = decltype(tag);
    std::vector<float> const f = posenc_test::random_vector<float>(static_cast<std::size_t>(count), seed, -2, 2);
    std::vector<X> x(f.size());
    for (std::size_t i = 0; i < f.size(); ++i) x[i] = posenc::detail::to_storage<X>(f[i]);
    return x;
  };
  std::vector<QS> const qd = draw(QS{}, Qt * Hq * D, 41);
  std::vector<S> const kd = draw(S{}, Kt * Hkv * D, 42), vd = draw(S{}, Kt * Hkv * D, 43);
  std::vector<QS> out(qd.size(), posenc::detail::to_storage<QS>(-7.0f));
  std::vector<float> lse(static_cast<std::size_t>(Hq * Qt), -7.0f);
  posenc::attention_options<float> opt;
  opt.causal = causal;
  opt.key_lengths = posenc::span<const index_t>(keys, n);
  opt.lse = lse;
  opt.threads = 2;
  posenc::packed_sequences const seqs{posenc::span<const index_t>(cq.data(), n + 1),
                                      posenc::span<const index_t>(ck.data(), n + 1)};
  posenc::attention<Path>(posenc::make_bshd(qd.data(), 1, Qt, Hq, D), posenc::make_bshd(kd.data(), 1, Kt, Hkv, D),
                          posenc::make_bshd(vd.data(), 1, Kt, Hkv, D), posenc::make_bshd(out.data(), 1, Qt, Hq, D),
                          seqs, enc, opt);
  std::size_t bad = 0;
  for (index_t s = 0; s < n; ++s) {
    index_t const q0 = cq[static_cast<std::size_t>(s)], k0 = ck[static_cast<std::size_t>(s)];
    std::vector<QS> one(static_cast<std::size_t>(lq[s] * Hq * D), posenc::detail::to_storage<QS>(-7.0f));
    std::vector<float> one_lse(static_cast<std::size_t>(Hq * lq[s]), -7.0f);
    posenc::attention_options<float> o = opt;
    o.key_lengths = posenc::span<const index_t>(keys + s, 1);
    o.lse = one_lse;
    o.threads = 1;
    posenc::attention<Path>(posenc::make_bshd(qd.data() + q0 * Hq * D, 1, lq[s], Hq, D),
                            posenc::make_bshd(kd.data() + k0 * Hkv * D, 1, lk[s], Hkv, D),
                            posenc::make_bshd(vd.data() + k0 * Hkv * D, 1, lk[s], Hkv, D),
                            posenc::make_bshd(one.data(), 1, lq[s], Hq, D), enc, o);
    for (std::size_t i = 0; i < one.size(); ++i)
      bad += std::memcmp(&one[i], &out[static_cast<std::size_t>(q0 * Hq * D) + i], sizeof(QS)) != 0 ? 1 : 0;
    for (index_t h = 0; h < Hq; ++h)
      for (index_t i = 0; i < lq[s]; ++i)
        bad += std::memcmp(&one_lse[static_cast<std::size_t>(h * lq[s] + i)],
                           &lse[static_cast<std::size_t>(h * Qt + q0 + i)], sizeof(float)) != 0
                   ? 1
                   : 0;
  }
  return bad;
}

template <class S>
void check_packed16() {
  posenc::alibi<float> const alibi(posenc::alibi_form::symmetric, 4);
  CHECK(packed16_mismatches<posenc::path::fused, float, S>(posenc::none{}, false) == 0);
  CHECK(packed16_mismatches<posenc::path::fused, float, S>(alibi, true) == 0);
  CHECK(packed16_mismatches<posenc::path::fused, S, S>(posenc::none{}, true) == 0);
  CHECK(packed16_mismatches<posenc::path::fused, S, S>(alibi, false) == 0);
  CHECK(packed16_mismatches<posenc::path::reference, float, S>(posenc::none{}, true) == 0);
  CHECK(packed16_mismatches<posenc::path::reference, float, S>(alibi, false) == 0);
  CHECK(packed16_mismatches<posenc::path::reference, S, S>(posenc::none{}, false) == 0);
  CHECK(packed16_mismatches<posenc::path::reference, S, S>(alibi, true) == 0);
}

}  // namespace

TEST_CASE("packed sequences with 16-bit tensors: each sequence is the contiguous 16-bit call on its rows alone",
          "[half][packed]") {
  SECTION("binary16") { check_packed16<Eigen::half>(); }
  SECTION("bfloat16") { check_packed16<Eigen::bfloat16>(); }
}

TEST_CASE("16-bit output of the reference: the double result rounded once, also just above a midpoint", "[half]") {
  SECTION("binary16") { check_reference_rounds_once<Eigen::half>({0x3c00, 0x3c02, 0x4100, 0x0402, 0x5000}); }
  SECTION("bfloat16") { check_reference_rounds_once<Eigen::bfloat16>({0x3f80, 0x4000, 0x3e00, 0x4120}); }
}

TEST_CASE("kv_cache<half> and kv_cache<bfloat16>: rotated keys rounded once, decode == prefill (float and 16-bit q)", "[half][kv_cache]") {
  SECTION("binary16") { check_cache<Eigen::half>("binary16"); }
  SECTION("bfloat16") { check_cache<Eigen::bfloat16>("bfloat16"); }
}

TEST_CASE("16-bit K and V: bad arguments throw before anything is written", "[half][errors]") {
  shape s{1, 1, 4, 2, 1, 8, 8};
  problem<Eigen::bfloat16> pb(s, 3);
  std::vector<float> out(64, -7.0f);
  posenc::view<float> o = pb.make<float>(out.data(), 1, 2, 8);
  posenc::view<const Eigen::bfloat16> k = pb.make<const Eigen::bfloat16>(pb.kh.data(), 4, 1, 8);
  posenc::view<const Eigen::bfloat16> v = pb.make<const Eigen::bfloat16>(pb.vh.data(), 3, 1, 8);
  REQUIRE_THROWS_WITH(posenc::attention(pb.qv(), k, v, o, posenc::none{}),
                      posenc_test::contains("posenc::attention: v.seq is 3, expected 4 (k.seq)"));
  CHECK(out[0] == -7.0f);
  posenc::kv_cache<Eigen::half> cache(1, 1, 8);
  std::vector<float> kk(8, 1.0f);
  posenc::view<const float> kv1 = posenc::make_bshd(static_cast<float const*>(kk.data()), 1, 1, 1, 8);
  cache.append(kv1, kv1, posenc::none{});
  posenc::rope<float> rope(posenc::rope_layout::half_split, 8);
  REQUIRE_THROWS_WITH(posenc::attention(pb.qv(), cache, o, rope),
                      posenc_test::contains("rotates_queries_keys is true, expected false"));
}

namespace {

/// One query row over the key rows of a kv_cache (each head's rows laid end
/// to end) is read in memory order, a row at a time; over token-major K and
/// V (rows a whole token apart) side by side, 8 rows at a time. Both keep
/// one sum per key over its dims in the same order (bfloat16: the dims in
/// pairs of vectors, as loaded), so both give the same bits: head dims
/// around the vector width, its pairs and the 8-vector chunks of the memory
/// order, key counts around the width.
template <class S>
void check_row_orders(char const* format) {
  index_t const Hkv = 2;
  for (index_t D : {index_t{1}, index_t{3}, W, W + 3, 2 * W, 3 * W, 3 * W + 5, 4 * W, 5 * W, 7 * W, 8 * W, 9 * W,
                    11 * W, 11 * W + 2})
    for (index_t Sk : {index_t{1}, index_t{5}, W + 1, 3 * W + 7})
      for (index_t group : {1, 2}) {
        index_t const Hq = Hkv * group;
        INFO(format << ": D " << D << ", Sk " << Sk << ", " << group << " query heads per kv head");
        std::vector<float> const k = posenc_test::random_vector<float>(static_cast<std::size_t>(Sk * Hkv * D), 11, -2, 2);
        std::vector<float> const v = posenc_test::random_vector<float>(static_cast<std::size_t>(Sk * Hkv * D), 12);
        std::vector<float> const q = posenc_test::random_vector<float>(static_cast<std::size_t>(Hq * D), 13, -2, 2);
        posenc::kv_cache<S> cache(1, Hkv, D);
        cache.append(posenc::make_bshd(k.data(), 1, Sk, Hkv, D), posenc::make_bshd(v.data(), 1, Sk, Hkv, D),
                     posenc::none{});
        std::vector<S> kt(k.size()), vt(v.size());  // the cached values, token-major
        for (index_t t = 0; t < Sk; ++t)
          for (index_t h = 0; h < Hkv; ++h)
            for (index_t d = 0; d < D; ++d) {
              kt[static_cast<std::size_t>((t * Hkv + h) * D + d)] = cache.keys()(0, t, h, d);
              vt[static_cast<std::size_t>((t * Hkv + h) * D + d)] = cache.values()(0, t, h, d);
            }
        auto const qv = posenc::make_bshd(q.data(), 1, 1, Hq, D);
        std::vector<float> in_order(static_cast<std::size_t>(Hq * D), 7.0f), side(in_order.size(), -7.0f);
        posenc::attention<posenc::path::fused>(qv, cache, posenc::make_bshd(in_order.data(), 1, 1, Hq, D),
                                               posenc::none{});
        posenc::attention<posenc::path::fused>(qv, posenc::make_bshd(static_cast<S const*>(kt.data()), 1, Sk, Hkv, D),
                                               posenc::make_bshd(static_cast<S const*>(vt.data()), 1, Sk, Hkv, D),
                                               posenc::make_bshd(side.data(), 1, 1, Hq, D), posenc::none{});
        std::size_t differ = 0;
        for (std::size_t i = 0; i < side.size(); ++i)
          differ += std::memcmp(&in_order[i], &side[i], sizeof(float)) != 0 ? 1 : 0;
        CHECK(differ == 0);
      }
}

}  // namespace

TEST_CASE("fused decode: key rows in memory order (kv_cache) and side by side (token-major) give the same bits",
          "[half][kv_cache]") {
  SECTION("float") { check_row_orders<float>("float"); }
  SECTION("binary16") { check_row_orders<Eigen::half>("binary16"); }
  SECTION("bfloat16") { check_row_orders<Eigen::bfloat16>("bfloat16"); }
}
}  // namespace attention_half_storage_tests
