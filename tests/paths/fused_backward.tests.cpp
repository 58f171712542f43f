// SPDX-License-Identifier: MIT
// attention_backward on path::fused against the double reference: shapes around every tile and width, every option and encoder.
#include <posenc/attention/backward.hpp>
#include <posenc/core/half.hpp>
#include <posenc/encoding/alibi.hpp>
#include <posenc/encoding/clipped_bias.hpp>
#include <posenc/encoding/compose.hpp>
#include <posenc/encoding/none.hpp>
#include <posenc/encoding/rope.hpp>
#include <posenc/encoding/shaw.hpp>
#include <posenc/encoding/t5_bias.hpp>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <string>
#include <tuple>
#include <vector>

#include "support/backward_check.hpp"
#include "support/catch.hpp"
#include "support/counting_new.hpp"
#include "support/random.hpp"
#include "support/tolerance.hpp"

namespace paths_fused_backward_tests {

// Allocation counter (tests/support/counting_new.hpp replaces operator new here).
using posenc_test::g_allocations;
using posenc_test::g_bytes;
using posenc_test::g_counting;
using posenc_test::g_largest;

using namespace posenc;
using posenc_test::attention_problem;
using posenc_test::plain_flash_backward_path;

namespace {

/// Every gradient of one backward call: dq, dk, dv, then the encoder's.
struct all_gradients {
  std::vector<double> dq, dk, dv, enc;
};

/// Runs the backward pass of problem p on Path (lse given or not), from a zeroed copy of g0.
template <class Path, class T, class E, class G>
all_gradients run(attention_problem<T>& p, E const& enc, G const& g0, bool with_lse) {
  G g = g0;
  g.set_zero();
  p.template gradients<Path>(enc, g, with_lse);
  all_gradients r;
  r.dq.assign(p.dq.begin(), p.dq.end());
  r.dk.assign(p.dk.begin(), p.dk.end());
  r.dv.assign(p.dv.begin(), p.dv.end());
  posenc_test::flatten_gradients(r.enc, g);
  return r;
}

/// fused == reference under the tests' rule (2x the plain float backward's error + 1e-6), for every
/// gradient; the fused result finite wherever the reference is.
template <class T, class E, class G>
void check_fused(attention_problem<T>& p, E const& enc, G const& g0, std::string const& what) {
  for (bool with_lse : {false, true}) {
    all_gradients const ref = run<path::reference>(p, enc, g0, with_lse);
    all_gradients const plain = run<plain_flash_backward_path>(p, enc, g0, with_lse);
    all_gradients const got = run<path::fused>(p, enc, g0, with_lse);
    auto one = [&](char const* name, std::vector<double> const& a, std::vector<double> const& r,
                   std::vector<double> const& pl) {
      auto const rep = posenc_test::within_tolerance(a, r, pl);
      INFO(what << (with_lse ? ", lse given" : ", lse recomputed") << ": " << name << ": " << rep.describe());
      CHECK(rep.ok);
      CHECK(posenc_test::all_finite(a));
    };
    one("dq", got.dq, ref.dq, plain.dq);
    one("dk", got.dk, ref.dk, plain.dk);
    one("dv", got.dv, ref.dv, plain.dv);
    one("encoder", got.enc, ref.enc, plain.enc);
  }
}

/// Bits of two gradient vectors that differ, plus any NaN.
inline std::size_t bit_mismatches(std::vector<double> const& a, std::vector<double> const& b) {
  std::size_t bad = a.size() != b.size() ? 1 : 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i)
    bad += std::memcmp(&a[i], &b[i], sizeof(double)) != 0 || std::isnan(a[i]) ? 1 : 0;
  return bad;
}

/// The backward pass on Path of a forward pass given a 16-bit mask (batch, 1,
/// Sq, mk) of S, against the same backward pass given the float mask of its
/// widened values: every gradient (dq, dk, dv, the encoder's) bit for bit.
/// Returns the number of elements that differ.
template <class Path, class S, class E, class G>
std::size_t mask16_gradient_mismatches(E const& enc, G const& g0, bool causal, index_t mk, bool with_lse) {
  attention_problem<float> p(2, 9, 23, 4, 2, 8, 8, 61);
  p.opt.causal = causal;
  std::vector<float> const f = posenc_test::random_vector<float>(static_cast<std::size_t>(2 * 9 * mk), 62, -4, 4);
  std::vector<S> m16(f.size());
  std::vector<float> m32(f.size());
  for (std::size_t i = 0; i < f.size(); ++i) {
    m16[i] = detail::to_storage<S>(i % 5 == 1 ? -std::numeric_limits<float>::infinity() : f[i]);
    m32[i] = detail::stored_value<float>(m16[i]);
  }
  attention_options<float> o = p.opt;
  o.mask = make_mask(static_cast<float const*>(m32.data()), 2, 1, 9, mk);
  p.lse.assign(static_cast<std::size_t>(2 * 4 * 9), 0.0f);
  o.lse = p.lse;
  attention<path::reference>(p.vq(), p.vk(), p.vv(), p.vout(), enc, o);  // out and lse of the masked forward
  if (!with_lse) o.lse = nullptr;
  auto grads = [&](bool half) {
    G g = g0;
    g.set_zero();
    std::fill(p.dq.begin(), p.dq.end(), 7.0f);
    std::fill(p.dk.begin(), p.dk.end(), 7.0f);
    std::fill(p.dv.begin(), p.dv.end(), 7.0f);
    if (half) {
      attention_options<float> oh = o;
      oh.mask = {};
      attention_backward<Path>(p.vq(), p.vk(), p.vv(), p.vout(), p.vdout(), p.vdq(), p.vdk(), p.vdv(), enc, oh,
                               make_mask(static_cast<S const*>(m16.data()), 2, 1, 9, mk), g);
    } else {
      attention_backward<Path>(p.vq(), p.vk(), p.vv(), p.vout(), p.vdout(), p.vdq(), p.vdk(), p.vdv(), enc, o, g);
    }
    std::vector<double> r(p.dq.begin(), p.dq.end());
    r.insert(r.end(), p.dk.begin(), p.dk.end());
    r.insert(r.end(), p.dv.begin(), p.dv.end());
    std::vector<double> e;
    posenc_test::flatten_gradients(e, g);
    r.insert(r.end(), e.begin(), e.end());
    return r;
  };
  std::vector<double> const got = grads(true), want = grads(false);
  return bit_mismatches(got, want);
}

template <class S>
void check_mask16_gradients() {
  alibi<float> const enc(alibi_form::paper, 4);
  for (bool with_lse : {false, true}) {
    CAPTURE(with_lse);
    // Key extents 23 (every key) and 17 (the keys past it masked).
    CHECK(mask16_gradient_mismatches<path::fused, S>(none{}, no_gradients{}, false, 23, with_lse) == 0);
    CHECK(mask16_gradient_mismatches<path::fused, S>(enc, enc.make_gradients(true), true, 17, with_lse) == 0);
    CHECK(mask16_gradient_mismatches<path::reference, S>(none{}, no_gradients{}, true, 17, with_lse) == 0);
    CHECK(mask16_gradient_mismatches<path::reference, S>(enc, enc.make_gradients(true), false, 23, with_lse) == 0);
  }
}

}  // namespace

TEST_CASE("backward with a 16-bit mask: the gradients of the float mask of its widened values, bit for bit",
          "[fused][backward][half]") {
  SECTION("binary16") { check_mask16_gradients<Eigen::half>(); }
  SECTION("bfloat16") { check_mask16_gradients<Eigen::bfloat16>(); }
}

TEST_CASE("backward with a 16-bit mask: a bad shape or an overlap throws before anything is written",
          "[fused][backward][half]") {
  attention_problem<float> p(2, 9, 23, 4, 2, 8, 8, 63);
  std::fill(p.dq.begin(), p.dq.end(), 7.0f);
  std::fill(p.dk.begin(), p.dk.end(), 7.0f);
  std::fill(p.dv.begin(), p.dv.end(), 7.0f);
  std::vector<Eigen::bfloat16> m(static_cast<std::size_t>(2 * 9 * 24));
  auto mask = [&](index_t b, index_t q, index_t k) {
    return make_mask(static_cast<Eigen::bfloat16 const*>(m.data()), b, 1, q, k);
  };
  no_gradients g;
  auto run_bw = [&](auto m16) {
    attention_backward<path::fused>(p.vq(), p.vk(), p.vv(), p.vout(), p.vdout(), p.vdq(), p.vdk(), p.vdv(), none{},
                                    p.opt, m16, g);
  };
  CHECK_THROWS_WITH(run_bw(mask(2, 9, 24)),
                    posenc_test::contains("posenc::attention_backward: mask (16-bit).k is 24, expected 0 .. 23"));
  CHECK_THROWS_WITH(run_bw(mask(3, 9, 23)),
                    posenc_test::contains("posenc::attention_backward: mask (16-bit).batch is 3, expected 1 or 2"));
  CHECK_THROWS_WITH(run_bw(make_mask(reinterpret_cast<Eigen::half const*>(p.dk.data()), 1, 1, 1, 23)),
                    posenc_test::contains("dk is at bytes"));
  CHECK_THROWS_WITH(run_bw(make_mask(reinterpret_cast<Eigen::half const*>(p.dk.data()), 1, 1, 1, 23)),
                    posenc_test::contains("overlaps mask (16-bit)"));
  std::size_t touched = 0;
  for (float x : p.dq) touched += x != 7.0f ? 1 : 0;
  for (float x : p.dk) touched += x != 7.0f ? 1 : 0;
  for (float x : p.dv) touched += x != 7.0f ? 1 : 0;
  CHECK(touched == 0);
}

TEST_CASE("fused backward: sizes around every tile and vector width", "[fused][backward]") {
  index_t const w = simd::width<float>;
  // 5, 6, 7, 12, 13: around the six-row register tiles of the products; 4w, 4w + 1: their four-vector chunks.
  std::vector<index_t> lengths = {1, 5, 6, 7, 12, 13, w - 1, w, w + 1, 63, 64, 65, 129};
  std::vector<index_t> dims = {1, w - 1, w, w + 1, 2 * w + 3, 4 * w, 4 * w + 1};
  std::uint64_t seed = 1000;
  for (index_t sq : lengths)
    for (index_t sk : {index_t{1}, index_t{2}, w + 1, index_t{64}, index_t{65}, sq})
      for (bool causal : {false, true}) {
        if (sq < 1 || sk < 1) continue;
        index_t const d = dims[static_cast<std::size_t>(seed % dims.size())];
        index_t const dv = dims[static_cast<std::size_t>((seed / 3) % dims.size())];
        attention_problem<float> p(2, sq, sk, 4, 2, std::max<index_t>(1, d), std::max<index_t>(1, dv), seed++);
        p.opt.causal = causal;
        check_fused(p, none{}, no_gradients{},
                    "Sq " + std::to_string(sq) + " Sk " + std::to_string(sk) + " D " + std::to_string(d) + " Dv " +
                        std::to_string(dv) + (causal ? " causal" : ""));
      }
}

TEST_CASE("fused backward: every option", "[fused][backward]") {
  float const ninf = -std::numeric_limits<float>::infinity();
  SECTION("scale, window, softcap") {
    attention_problem<float> p(2, 70, 70, 4, 2, 9, 9, 11);
    p.opt.scale = 0.7;
    p.opt.sliding_window = 20;
    p.opt.softcap = 2.0;
    check_fused(p, none{}, no_gradients{}, "scale, window, softcap");
  }
  SECTION("query and key offsets, negative positions under causal") {
    attention_problem<float> p(1, 40, 70, 2, 1, 8, 8, 12);
    p.opt.q_positions = position_span(-10);
    p.opt.causal = true;
    check_fused(p, none{}, no_gradients{}, "negative query offset");
  }
  SECTION("per-batch offsets and explicit ids") {
    attention_problem<float> p(2, 30, 67, 2, 2, 8, 8, 13);
    std::vector<index_t> firsts = {37, 5};
    std::vector<index_t> kid(2 * 67);
    for (index_t b = 0; b < 2; ++b)
      for (index_t j = 0; j < 67; ++j) kid[static_cast<std::size_t>(b * 67 + j)] = (j * 5) % 67;  // not consecutive
    p.opt.q_positions = position_span::per_batch(firsts);
    p.opt.k_positions = position_span::ids(kid.data(), 2, 67);
    p.opt.causal = true;
    check_fused(p, none{}, no_gradients{}, "per-batch query offsets, explicit key ids");
  }
  SECTION("key_lengths with non-finite padding keys and values") {
    attention_problem<float> p(2, 66, 66, 2, 1, 8, 8, 14);
    std::vector<index_t> lens = {13, 66};
    p.opt.key_lengths = lens;
    for (index_t j = 13; j < 66; ++j)
      for (index_t d = 0; d < 8; ++d) {
        p.vk()(0, j, 0, d) = std::numeric_limits<float>::quiet_NaN();
        p.vv()(0, j, 0, d) = std::numeric_limits<float>::infinity();
      }
    check_fused(p, none{}, no_gradients{}, "key lengths, NaN padding");
  }
  SECTION("additive and boolean masks with fully masked rows") {
    attention_problem<float> p(1, 20, 70, 2, 2, 8, 5, 15);
    std::vector<float> m = posenc_test::random_vector<float>(20 * 70, 77);
    for (index_t j = 0; j < 70; ++j) m[static_cast<std::size_t>(3 * 70 + j)] = ninf;
    m[5] = ninf;
    bool bmask[2 * 20 * 70];
    for (int t = 0; t < 2 * 20 * 70; ++t) bmask[t] = (t * 7) % 5 != 0;
    for (int j = 0; j < 70; ++j) bmask[20 * 70 + 9 * 70 + j] = false;
    p.opt.mask = make_mask<float>(m.data(), 1, 1, 20, 70);
    p.opt.bool_mask = make_mask<bool>(bmask, 1, 2, 20, 70);
    check_fused(p, none{}, no_gradients{}, "masks");
    no_gradients g;
    p.gradients<path::fused>(none{}, g);
    for (index_t d = 0; d < 8; ++d) {
      CHECK(p.vdq()(0, 3, 0, d) == 0.0f);
      CHECK(p.vdq()(0, 9, 1, d) == 0.0f);
    }
  }
  SECTION("non-finite query and dout rows that see no key") {
    attention_problem<float> p(1, 20, 70, 2, 1, 8, 8, 18);
    bool bmask[20 * 70];
    for (int t = 0; t < 20 * 70; ++t) bmask[t] = t % 3 != 0;
    for (int j = 0; j < 70; ++j) bmask[4 * 70 + j] = false;  // row 4 sees nothing
    p.opt.bool_mask = make_mask<bool>(bmask, 1, 1, 20, 70);
    for (index_t h = 0; h < 2; ++h)
      for (index_t d = 0; d < 8; ++d) {
        p.vq()(0, 4, h, d) = std::numeric_limits<float>::quiet_NaN();
        p.vdout()(0, 4, h, d) = std::numeric_limits<float>::infinity();
      }
    check_fused(p, none{}, no_gradients{}, "NaN rows that see no key");
  }
  SECTION("GQA with Dv != D") {
    attention_problem<float> p(2, 33, 65, 6, 2, 12, 5, 16);
    p.opt.causal = true;
    check_fused(p, none{}, no_gradients{}, "GQA 6/2, D 12, Dv 5");
  }
  SECTION("no query heads for a kv head, and Sq = 0") {
    attention_problem<float> p(1, 0, 9, 2, 2, 4, 4, 17);
    check_fused(p, none{}, no_gradients{}, "Sq 0");
  }
}

TEST_CASE("fused backward: every encoder", "[fused][backward]") {
  SECTION("T5 buckets") {
    t5_bias<float> enc(t5_bias_params{4, true, 16, 40}, 3u, 0.5);
    attention_problem<float> p(2, 67, 67, 4, 2, 8, 8, 21);
    p.opt.causal = true;
    check_fused(p, enc, enc.make_gradients(), "T5");
  }
  SECTION("clipped bias") {
    clipped_bias<float> enc(6, 4, 4u, 0.5);
    attention_problem<float> p(1, 65, 70, 4, 4, 9, 9, 22);
    check_fused(p, enc, enc.make_gradients(), "clipped");
  }
  SECTION("ALiBi with learned slopes, and softcap") {
    alibi<float> enc(alibi_form::paper, 4);
    attention_problem<float> p(1, 66, 66, 4, 1, 8, 8, 23);
    p.opt.causal = true;
    p.opt.softcap = 3.0;
    check_fused(p, enc, enc.make_gradients(true), "ALiBi");
  }
  SECTION("Shaw keys and values") {
    shaw<float> enc(5, 8, shaw_terms::keys_and_values, 5u, 0.5);
    attention_problem<float> p(2, 65, 66, 2, 1, 8, 8, 24);
    p.opt.causal = true;
    check_fused(p, enc, enc.make_gradients(), "Shaw");
  }
  SECTION("RoPE, and keys_rotated") {
    rope<float> enc(rope_layout::half_split, 16);
    attention_problem<float> p(1, 65, 65, 2, 1, 16, 8, 25);
    p.opt.causal = true;
    check_fused(p, enc, no_gradients{}, "RoPE");
    p.opt.keys_rotated = true;
    check_fused(p, enc, no_gradients{}, "RoPE keys_rotated");
  }
  SECTION("compose(RoPE, T5)") {
    rope<float> r(rope_layout::interleaved, 8);
    t5_bias<float> t5(t5_bias_params{2, false, 8, 20}, 6u, 0.5);
    auto enc = compose(r, t5);
    attention_problem<float> p(1, 64, 64, 2, 2, 8, 8, 26);
    check_fused(p, enc, enc.make_gradients(), "compose");
  }
}

TEST_CASE("fused backward: strided and misaligned views give the contiguous result", "[fused][backward]") {
  index_t const B = 2, Sq = 37, Sk = 70, Hq = 4, Hkv = 2, D = 9, Dv = 7;
  attention_problem<float> p(B, Sq, Sk, Hq, Hkv, D, Dv, 131);
  p.opt.causal = true;
  p.opt.threads = 1;
  no_gradients g;
  p.gradients<path::fused>(none{}, g);
  auto padded = [](std::vector<float>& buf, index_t b, index_t s, index_t h, index_t d) {
    index_t const hs = d + 3, ss = h * hs + 1, bs = s * ss + 2;
    buf.assign(static_cast<std::size_t>(b * bs + 1), -7.0f);
    return view<float>{buf.data() + 1, b, s, h, d, bs, ss, hs, 1};
  };
  auto copy_into = [](view<float> dst, view<float> src) {
    for (index_t b = 0; b < src.batch; ++b)
      for (index_t s = 0; s < src.seq; ++s)
        for (index_t h = 0; h < src.heads; ++h)
          for (index_t d = 0; d < src.dim; ++d) dst(b, s, h, d) = src(b, s, h, d);
  };
  std::vector<float> qb, kb, vb, ob, dob, dqb, dkb, dvb;
  view<float> q = padded(qb, B, Sq, Hq, D), k = padded(kb, B, Sk, Hkv, D), v = padded(vb, B, Sk, Hkv, Dv);
  view<float> out = padded(ob, B, Sq, Hq, Dv), dout = padded(dob, B, Sq, Hq, Dv);
  view<float> dq = padded(dqb, B, Sq, Hq, D), dk = padded(dkb, B, Sk, Hkv, D), dv = padded(dvb, B, Sk, Hkv, Dv);
  copy_into(q, p.vq());
  copy_into(k, p.vk());
  copy_into(v, p.vv());
  copy_into(out, p.vout());
  copy_into(dout, p.vdout());
  attention_backward<path::fused>(q, k, v, out, dout, dq, dk, dv, none{}, p.opt, g);
  // Misaligned, strided rows change no sum's order: the same bits.
  bool same = true;
  for (index_t b = 0; b < B; ++b)
    for (index_t s = 0; s < Sk; ++s) {
      for (index_t h = 0; h < Hq && s < Sq; ++h)
        for (index_t d = 0; d < D; ++d) same = same && dq(b, s, h, d) == p.vdq()(b, s, h, d);
      for (index_t h = 0; h < Hkv; ++h) {
        for (index_t d = 0; d < D; ++d) same = same && dk(b, s, h, d) == p.vdk()(b, s, h, d);
        for (index_t d = 0; d < Dv; ++d) same = same && dv(b, s, h, d) == p.vdv()(b, s, h, d);
      }
    }
  CHECK(same);
  CHECK(dkb[0] == -7.0f);  // padding between rows never written
  CHECK(dqb[0] == -7.0f);
}

TEST_CASE("fused backward: bit-identical reruns; 1 and 2 threads agree", "[fused][backward]") {
  t5_bias<float> t5(t5_bias_params{2, true, 16, 40}, 9u, 0.3);
  // One batch entry and one kv head: the key chunks give the second thread its work.
  attention_problem<float> p(1, 150, 300, 2, 1, 16, 16, 91);
  p.opt.causal = true;
  std::vector<std::vector<double>> runs[3];
  for (int threads : {1, 2, 1, 2}) {
    p.opt.threads = threads;
    all_gradients const r = run<path::fused>(p, t5, t5.make_gradients(), true);
    runs[threads].push_back(r.dq);
    runs[threads].back().insert(runs[threads].back().end(), r.dk.begin(), r.dk.end());
    runs[threads].back().insert(runs[threads].back().end(), r.dv.begin(), r.dv.end());
    runs[threads].back().insert(runs[threads].back().end(), r.enc.begin(), r.enc.end());
  }
  CHECK(runs[1][0] == runs[1][1]);
  CHECK(runs[2][0] == runs[2][1]);
  double worst = 0, largest = 0;
  for (std::size_t i = 0; i < runs[1][0].size(); ++i) {
    worst = std::max(worst, std::abs(runs[1][0][i] - runs[2][0][i]));
    largest = std::max(largest, std::abs(runs[1][0][i]));
  }
  INFO("worst difference " << worst << " of largest " << largest);
  CHECK(worst <= 1e-5 * std::max(1.0, largest));  // float reordering of the dq partial sums only
  // And both agree with the reference under the tests' rule.
  for (int threads : {1, 2}) {
    p.opt.threads = threads;
    check_fused(p, t5, t5.make_gradients(), "threads " + std::to_string(threads));
  }
}

TEST_CASE("fused backward: no allocation grows with Sq x Sk", "[fused][backward]") {
  alibi<float> enc(alibi_form::paper, 2);
  auto measure = [&](index_t S, bool with_lse) {
    attention_problem<float> p(1, S, S, 2, 1, 16, 16, 5);
    p.opt.causal = true;
    p.opt.threads = 2;
    p.lse.assign(static_cast<std::size_t>(2 * S), 0.0f);
    attention_options<float> o = p.opt;
    o.lse = p.lse;
    attention<path::fused>(p.vq(), p.vk(), p.vv(), p.vout(), enc, o);
    if (!with_lse) o.lse = nullptr;
    auto g = enc.make_gradients(true);
    g_bytes = 0;
    g_counting = true;
    attention_backward<path::fused>(p.vq(), p.vk(), p.vv(), p.vout(), p.vdout(), p.vdq(), p.vdk(), p.vdv(), enc, o,
                                    g);
    g_counting = false;
    return g_bytes.load();
  };
  for (bool with_lse : {false, true}) {
    long long const small = measure(1024, with_lse), large = measure(2048, with_lse);
    INFO((with_lse ? "lse given: " : "lse recomputed: ") << small << " -> " << large << " bytes");
    // 1024 more tokens: what grows is linear, per token 16 bytes of positions, 16 of row
    // statistics (lse and Delta of 2 heads) and 256 of dq partials (2 key chunks x 2 heads x
    // 16 floats): 288 bytes. A Sq x Sk buffer would grow by 12 MiB (2048^2 - 1024^2 floats).
    // With a given lse, until it is checked, dk and dv go to a scratch copy (128 bytes per token:
    // 1 kv head x 32 floats) beside each row's sum per key chunk (16 bytes: 2 chunks x 2 heads).
    long long const lse_check = with_lse ? 144 : 0;
    CHECK(large - small <= (288 + lse_check) * 1024 + 4096);
    // Everything together (per-task scratch included) stays under 1/16 of one 2048 x 2048
    // float score matrix, plus that linear copy.
    CHECK(large < 2048 * 2048 * 4 / 16 + lse_check * 2048);
  }
}
}  // namespace paths_fused_backward_tests
