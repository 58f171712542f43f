// SPDX-License-Identifier: MIT
// Additive masks stored in 16 bits: exactly the float mask of the widened values, on every path and tensor type,
// through the contiguous, kv_cache and packed calls.
#include <posenc/attention/attention.hpp>
#include <posenc/attention/kv_cache.hpp>
#include <posenc/attention/packed.hpp>
#include <posenc/core/half.hpp>
#include <posenc/encoding/alibi.hpp>
#include <posenc/encoding/none.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "support/catch.hpp"
#include "support/random.hpp"
#include "support/strided_buffer.hpp"

namespace attention_half_masks_tests {

using posenc::index_t;
using posenc::mask_view;

namespace {

using posenc_test::bits;
using posenc_test::widen;

struct shape {
  index_t batch, heads, q, k;
};

constexpr index_t B = 2, H = 3, Sq = 7, Sk = 21, D = 16;

/// A 16-bit mask of the given extents: finite values of both signs, some -inf, some 0.
template <class S>
std::vector<S> random_mask(shape m, std::uint64_t seed) {
  std::size_t const n = static_cast<std::size_t>(m.batch * m.heads * m.q * m.k);
  std::vector<float> const v = posenc_test::random_vector<float>(n, seed, -4.0, 4.0);
  std::vector<S> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    float x = v[i];
    if (i % 5 == 1) x = -std::numeric_limits<float>::infinity();
    if (i % 7 == 2) x = 0.0f;
    out[i] = posenc::detail::to_storage<S>(x);
  }
  return out;
}

/// The float values of a 16-bit mask (exact).
template <class S>
std::vector<float> widened(std::vector<S> const& m) {
  std::vector<float> f(m.size());
  for (std::size_t i = 0; i < m.size(); ++i) f[i] = widen(m[i]);
  return f;
}

/// Random values (float) rounded to X.
template <class X>
std::vector<X> random_x(std::size_t n, std::uint64_t seed) {
  std::vector<float> const f = posenc_test::random_vector<float>(n, seed);
  std::vector<X> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = posenc::detail::to_storage<X>(f[i]);
  return x;
}

/// Elements of out (X) and lse (float) whose bits differ between two runs, plus any NaN out.
template <class X>
std::size_t bit_mismatches(std::vector<X> const& o16, std::vector<X> const& o32, std::vector<float> const& l16,
                           std::vector<float> const& l32) {
  std::size_t bad = 0;
  for (std::size_t i = 0; i < o16.size(); ++i)
    bad += std::memcmp(&o16[i], &o32[i], sizeof(X)) != 0 || std::isnan(widen(o16[i])) || std::isnan(widen(o32[i]))
               ? 1
               : 0;
  for (std::size_t i = 0; i < l16.size(); ++i) bad += std::memcmp(&l16[i], &l32[i], sizeof(float)) != 0 ? 1 : 0;
  return bad;
}

/// Runs `call(opt, out, mask16)` twice on one thread: with the 16-bit mask
/// (mask16 true), then with opt.mask the float mask of its widened values
/// (mask16 false, the call sets opt.mask), each with its own out (`outs`
/// elements of X) and lse (`rows` floats); returns the elements whose bits
/// differ between the two, plus any NaN out.
template <class X, class Call>
std::size_t masked_twice(std::size_t outs, std::size_t rows, bool causal, int threads, Call const& call) {
  std::vector<X> o16(outs), o32(outs);
  std::vector<float> l16(rows), l32(rows);
  posenc::attention_options<float> opt;
  opt.causal = causal;
  opt.threads = threads;
  opt.lse = l16;
  call(opt, o16.data(), true);
  opt.lse = l32;
  call(opt, o32.data(), false);
  return bit_mismatches(o16, o32, l16, l32);
}

/// out of `attention<P>` with the 16-bit mask and with the float mask of its
/// widened values (same problem, same encoder): the number of elements whose
/// bits differ, plus any NaN; q and out of element type Q, k and v of KV
/// (float tensors, float q and out with S k and v, or all-S tensors).
template <class P, class Q, class KV, class S, class E>
std::size_t mask_mismatches(shape ms, E const& enc, bool causal) {
  std::vector<S> const m16 = random_mask<S>(ms, 31 + static_cast<std::uint64_t>(ms.batch * 8 + ms.heads * 4 + ms.q));
  std::vector<float> const m32 = widened(m16);
  auto const qx = random_x<Q>(static_cast<std::size_t>(B * Sq * H * D), 1);
  auto const kx = random_x<KV>(static_cast<std::size_t>(B * Sk * H * D), 2);
  auto const vx = random_x<KV>(static_cast<std::size_t>(B * Sk * H * D), 3);
  auto q = posenc::make_bshd(qx.data(), B, Sq, H, D);
  auto k = posenc::make_bshd(kx.data(), B, Sk, H, D);
  auto v = posenc::make_bshd(vx.data(), B, Sk, H, D);
  return masked_twice<Q>(qx.size(), static_cast<std::size_t>(B * H * Sq), causal, 1,
                         [&](posenc::attention_options<float>& opt, Q* out, bool mask16) {
                           auto const o = posenc::make_bshd(out, B, Sq, H, D);
                           if (mask16) {
                             posenc::attention<P>(q, k, v, o, enc, opt,
                                                  posenc::make_mask(m16.data(), ms.batch, ms.heads, ms.q, ms.k));
                           } else {
                             opt.mask = posenc::make_mask(m32.data(), ms.batch, ms.heads, ms.q, ms.k);
                             posenc::attention<P>(q, k, v, o, enc, opt);
                           }
                         });
}

template <class P, class Q, class KV, class S>
void check_shapes() {
  posenc::alibi<float> const enc(posenc::alibi_form::paper, H);
  for (shape ms : {shape{1, 1, 1, Sk}, shape{B, 1, Sq, Sk}, shape{1, H, 1, Sk}, shape{B, H, Sq, Sk},
                   shape{1, 1, Sq, Sk - 4}}) {  // the last: a short key extent masks the keys past it
    CAPTURE(ms.batch, ms.heads, ms.q, ms.k);
    CHECK(mask_mismatches<P, Q, KV, S>(ms, posenc::none{}, false) == 0);
    CHECK(mask_mismatches<P, Q, KV, S>(ms, enc, true) == 0);
  }
}

/// A kv_cache of X (float, or a 16-bit S with q and out S) holding Sk tokens
/// from position 5, appended in two steps.
template <class X>
posenc::kv_cache<X> filled_cache() {
  posenc::kv_cache<X> cache(B, H, D, 0, 5);
  auto const k = posenc_test::random_vector<float>(static_cast<std::size_t>(B * Sk * H * D), 12);
  auto const v = posenc_test::random_vector<float>(static_cast<std::size_t>(B * Sk * H * D), 13);
  index_t const first = 12;
  auto part = [&](std::vector<float> const& x, index_t s0, index_t n) {
    return posenc::view<const float>{x.data() + s0 * H * D, B, n, H, D, Sk * H * D, H * D, D};
  };
  cache.append(part(k, 0, first), part(v, 0, first), posenc::none{});
  cache.append(part(k, first, Sk - first), part(v, first, Sk - first), posenc::none{});
  return cache;
}

/// As mask_mismatches, through the kv_cache call: `attention<P>(q, cache, out,
/// enc, opt, mask16)` against the same call with opt.mask the widened values.
/// Q and KV as there (the cache a kv_cache<KV>).
template <class P, class Q, class KV, class S, class E>
std::size_t cache_mask_mismatches(shape ms, E const& enc, bool causal) {
  std::vector<S> const m16 = random_mask<S>(ms, 71 + static_cast<std::uint64_t>(ms.batch * 8 + ms.heads * 4 + ms.q));
  std::vector<float> const m32 = widened(m16);
  posenc::kv_cache<KV> const cache = filled_cache<KV>();
  auto const qx = random_x<Q>(static_cast<std::size_t>(B * Sq * H * D), 11);
  auto q = posenc::make_bshd(qx.data(), B, Sq, H, D);
  return masked_twice<Q>(qx.size(), static_cast<std::size_t>(B * H * Sq), causal, 1,
                         [&](posenc::attention_options<float>& opt, Q* out, bool mask16) {
                           auto const o = posenc::make_bshd(out, B, Sq, H, D);
                           if (mask16) {
                             posenc::attention<P>(q, cache, o, enc, opt,
                                                  posenc::make_mask(m16.data(), ms.batch, ms.heads, ms.q, ms.k));
                           } else {
                             opt.mask = posenc::make_mask(m32.data(), ms.batch, ms.heads, ms.q, ms.k);
                             posenc::attention<P>(q, cache, o, enc, opt);
                           }
                         });
}

/// Packed sequences: queries and keys of each (one without queries; with
/// causal, each its own bottom-right alignment).
constexpr index_t packed_q[] = {3, 0, 5, 1}, packed_k[] = {7, 4, 6, 9};
constexpr index_t Qt = 9, Kt = 26;  // their sums

/// As mask_mismatches, through the packed call: (1, 1 or H, 1 or Qt, <= Kt)
/// masks in packed coordinates; Q and KV as there.
template <class P, class Q, class KV, class S, class E>
std::size_t packed_mask_mismatches(shape ms, E const& enc, bool causal) {
  std::vector<S> const m16 = random_mask<S>(ms, 91 + static_cast<std::uint64_t>(ms.heads * 4 + ms.q + ms.k));
  std::vector<float> const m32 = widened(m16);
  std::vector<index_t> const cq = posenc::cumulative_lengths(posenc::span<const index_t>(packed_q, 4));
  std::vector<index_t> const ck = posenc::cumulative_lengths(posenc::span<const index_t>(packed_k, 4));
  posenc::packed_sequences const seqs{posenc::span<const index_t>(cq.data(), 5),
                                      posenc::span<const index_t>(ck.data(), 5)};
  auto const qx = random_x<Q>(static_cast<std::size_t>(Qt * H * D), 21);
  auto const kx = random_x<KV>(static_cast<std::size_t>(Kt * H * D), 22);
  auto const vx = random_x<KV>(static_cast<std::size_t>(Kt * H * D), 23);
  auto q = posenc::make_bshd(qx.data(), 1, Qt, H, D);
  auto k = posenc::make_bshd(kx.data(), 1, Kt, H, D);
  auto v = posenc::make_bshd(vx.data(), 1, Kt, H, D);
  // Sequences on two threads: each result is the same.
  return masked_twice<Q>(qx.size(), static_cast<std::size_t>(H * Qt), causal, 2,
                         [&](posenc::attention_options<float>& opt, Q* out, bool mask16) {
                           auto const o = posenc::make_bshd(out, 1, Qt, H, D);
                           if (mask16) {
                             posenc::attention<P>(q, k, v, o, seqs, enc, opt,
                                                  posenc::make_mask(m16.data(), ms.batch, ms.heads, ms.q, ms.k));
                           } else {
                             opt.mask = posenc::make_mask(m32.data(), ms.batch, ms.heads, ms.q, ms.k);
                             posenc::attention<P>(q, k, v, o, seqs, enc, opt);
                           }
                         });
}

template <class P, class Q, class KV, class S>
void check_calls() {
  posenc::alibi<float> const enc(posenc::alibi_form::paper, H);
  // The last cache shape: a key extent shorter than cache.length() masks the cached keys past it.
  for (shape ms : {shape{1, 1, 1, Sk}, shape{B, H, Sq, Sk}, shape{1, H, 1, Sk}, shape{1, 1, Sq, Sk - 4}}) {
    CAPTURE(ms.batch, ms.heads, ms.q, ms.k);
    CHECK(cache_mask_mismatches<P, Q, KV, S>(ms, posenc::none{}, false) == 0);
    CHECK(cache_mask_mismatches<P, Q, KV, S>(ms, enc, true) == 0);
  }
  // Packed: key extents ending inside the last sequence's keys (18) and
  // inside sequence 2's (13: sequence 3 fully masked, zero rows, lse -inf).
  for (shape ms : {shape{1, 1, 1, Kt}, shape{1, H, Qt, Kt}, shape{1, 1, Qt, Kt - 8}, shape{1, H, 1, 13}}) {
    CAPTURE(ms.batch, ms.heads, ms.q, ms.k);
    CHECK(packed_mask_mismatches<P, Q, KV, S>(ms, posenc::none{}, false) == 0);
    CHECK(packed_mask_mismatches<P, Q, KV, S>(ms, enc, true) == 0);
  }
}

}  // namespace

TEMPLATE_TEST_CASE("16-bit mask: exactly the float mask of the widened values, broadcast shapes, every path",
                   "[mask][half]", Eigen::half, Eigen::bfloat16) {
  using S = TestType;
  SECTION("float tensors") {
    check_shapes<posenc::path::fused, float, float, S>();
    check_shapes<posenc::path::reference, float, float, S>();
    check_shapes<posenc::path::materialized, float, float, S>();
  }
  SECTION("16-bit K and V, and all-16-bit tensors") {
    check_shapes<posenc::path::fused, float, S, S>();
    check_shapes<posenc::path::reference, float, S, S>();
    check_shapes<posenc::path::fused, S, S, S>();
    check_shapes<posenc::path::reference, S, S, S>();
  }
}

TEMPLATE_TEST_CASE("16-bit mask: -inf on every key of a row gives a zero row and lse -inf, no NaN", "[mask][half]",
                   Eigen::half, Eigen::bfloat16) {
  using S = TestType;
  std::vector<S> m(static_cast<std::size_t>(Sq * Sk), posenc::detail::to_storage<S>(0.5f));
  index_t const dead = 3;  // query row 3: every key -inf
  for (index_t j = 0; j < Sk; ++j) m[static_cast<std::size_t>(dead * Sk + j)] = S(-std::numeric_limits<float>::infinity());
  auto const qv = posenc_test::random_vector<float>(static_cast<std::size_t>(B * Sq * H * D), 4);
  auto const kv = posenc_test::random_vector<float>(static_cast<std::size_t>(B * Sk * H * D), 5);
  auto q = posenc::make_bshd(qv.data(), B, Sq, H, D);
  auto k = posenc::make_bshd(kv.data(), B, Sk, H, D);
  auto run = [&](auto path) {
    using P = decltype(path);
    std::vector<float> out(qv.size(), 7.0f), lse(static_cast<std::size_t>(B * H * Sq), 7.0f);
    posenc::attention_options<float> opt;
    opt.lse = lse;
    posenc::attention<P>(q, k, k, posenc::make_bshd(out.data(), B, Sq, H, D), posenc::none{}, opt,
                         posenc::make_mask(static_cast<S const*>(m.data()), 1, 1, Sq, Sk));
    std::size_t nonzero = 0, nan = 0, bad_lse = 0;
    for (index_t b = 0; b < B; ++b)
      for (index_t i = 0; i < Sq; ++i)
        for (index_t h = 0; h < H; ++h) {
          float const l = lse[static_cast<std::size_t>((b * H + h) * Sq + i)];
          bad_lse += (i == dead) != (l == -std::numeric_limits<float>::infinity()) ? 1 : 0;
          for (index_t d = 0; d < D; ++d) {
            float const o = out[static_cast<std::size_t>(((b * Sq + i) * H + h) * D + d)];
            nan += std::isnan(o) ? 1 : 0;
            nonzero += i == dead && o != 0.0f ? 1 : 0;
          }
        }
    CHECK(nonzero == 0);
    CHECK(nan == 0);
    CHECK(bad_lse == 0);
  };
  run(posenc::path::fused{});
  run(posenc::path::reference{});
  run(posenc::path::materialized{});
}

TEST_CASE("16-bit mask: a bad shape or an output over the mask throws before anything is written", "[mask][half]") {
  std::vector<Eigen::half> m(static_cast<std::size_t>(Sq * Sk));
  auto const qv = posenc_test::random_vector<float>(static_cast<std::size_t>(B * Sq * H * D), 4);
  auto q = posenc::make_bshd(qv.data(), B, Sq, H, D);
  std::vector<float> out(qv.size(), 7.0f);
  posenc::attention_options<float> opt;
  CHECK_THROWS_WITH(posenc::attention(q, q, q, posenc::make_bshd(out.data(), B, Sq, H, D), posenc::none{}, opt,
                                      posenc::make_mask(static_cast<Eigen::half const*>(m.data()), 1, 1, Sq + 1, Sq)),
                    posenc_test::contains("mask (16-bit).q is 8, expected 1 or 7"));
  std::vector<float> lse(static_cast<std::size_t>(B * H * Sq));  // the mask lives inside lse's bytes
  opt.lse = lse;
  CHECK_THROWS_WITH(posenc::attention(q, q, q, posenc::make_bshd(out.data(), B, Sq, H, D), posenc::none{}, opt,
                                      posenc::make_mask(reinterpret_cast<Eigen::half const*>(lse.data()), 1, 1, Sq, Sq)),
                    posenc_test::contains("overlaps mask (16-bit)"));
  std::size_t touched = 0;
  for (float o : out) touched += o != 7.0f ? 1 : 0;
  CHECK(touched == 0);
}

TEMPLATE_TEST_CASE("16-bit mask over a kv_cache and packed sequences: exactly the float mask of the widened values",
                   "[mask][half][kv_cache][packed]", Eigen::half, Eigen::bfloat16) {
  using S = TestType;
  SECTION("float tensors, kv_cache<float>") {
    check_calls<posenc::path::fused, float, float, S>();
    check_calls<posenc::path::reference, float, float, S>();
  }
  SECTION("float q and out, 16-bit K and V, kv_cache<S>") {
    check_calls<posenc::path::fused, float, S, S>();
    check_calls<posenc::path::reference, float, S, S>();
  }
  SECTION("all-16-bit tensors, kv_cache<S>") {
    check_calls<posenc::path::fused, S, S, S>();
    check_calls<posenc::path::reference, S, S, S>();
  }
}

TEST_CASE("16-bit mask over a kv_cache or packed sequences: a bad shape or overlap throws before anything is written",
          "[mask][half][kv_cache][packed]") {
  using bf16 = Eigen::bfloat16;
  std::vector<bf16> m(static_cast<std::size_t>(H * Qt * Kt));
  auto mask = [&](index_t b, index_t h, index_t q, index_t k) {
    return posenc::make_mask(static_cast<bf16 const*>(m.data()), b, h, q, k);
  };
  posenc::attention_options<float> opt;
  std::size_t touched = 0;
  {
    posenc::kv_cache<float> const cache = filled_cache<float>();
    posenc::kv_cache<Eigen::half> const cache16 = filled_cache<Eigen::half>();
    auto const qv = random_x<float>(static_cast<std::size_t>(B * Sq * H * D), 4);
    auto const qh = random_x<Eigen::half>(qv.size(), 4);
    auto q = posenc::make_bshd(qv.data(), B, Sq, H, D);
    auto q16 = posenc::make_bshd(qh.data(), B, Sq, H, D);
    std::vector<float> out(qv.size(), 7.0f);
    std::vector<Eigen::half> out16(qv.size(), Eigen::half(7.0f));
    auto o = posenc::make_bshd(out.data(), B, Sq, H, D);
    auto o16 = posenc::make_bshd(out16.data(), B, Sq, H, D);
    CHECK_THROWS_WITH(posenc::attention(q, cache, o, posenc::none{}, opt, mask(1, 1, Sq, Sk + 1)),
                      posenc_test::contains("posenc::attention: mask (16-bit).k is 22, expected 0 .. 21 (cache.length()"));
    CHECK_THROWS_WITH(posenc::attention(q16, cache16, o16, posenc::none{}, opt, mask(1, 1, Sq, Sk + 1)),
                      posenc_test::contains("posenc::attention: mask (16-bit).k is 22, expected 0 .. 21 (cache.length()"));
    CHECK_THROWS_WITH(posenc::attention(q, cache, o, posenc::none{}, opt, mask(1, 1, Sq + 1, Sk)),
                      posenc_test::contains("mask (16-bit).q is 8, expected 1 or 7"));
    CHECK_THROWS_WITH(posenc::attention(q16, cache16, o16, posenc::none{}, opt, mask(1, H + 1, 1, Sk)),
                      posenc_test::contains("mask (16-bit).heads is 4, expected 1 or 3"));
    std::vector<float> lse(static_cast<std::size_t>(B * H * Sq));  // the mask lives inside lse's bytes
    opt.lse = lse;
    CHECK_THROWS_WITH(posenc::attention(q, cache, o, posenc::none{}, opt,
                                        posenc::make_mask(reinterpret_cast<bf16 const*>(lse.data()), 1, 1, 1, Sk)),
                      posenc_test::contains("overlaps mask (16-bit)"));
    opt.lse = nullptr;
    for (float x : out) touched += x != 7.0f ? 1 : 0;
    for (Eigen::half x : out16) touched += widen(x) != 7.0f ? 1 : 0;
  }
  {
    std::vector<index_t> const cq = posenc::cumulative_lengths(posenc::span<const index_t>(packed_q, 4));
    std::vector<index_t> const ck = posenc::cumulative_lengths(posenc::span<const index_t>(packed_k, 4));
    posenc::packed_sequences const seqs{posenc::span<const index_t>(cq.data(), 5),
                                        posenc::span<const index_t>(ck.data(), 5)};
    auto const qv = random_x<float>(static_cast<std::size_t>(Kt * H * D), 5);
    auto const qh = random_x<Eigen::half>(qv.size(), 5);
    auto q = posenc::make_bshd(qv.data(), 1, Qt, H, D);
    auto k = posenc::make_bshd(qv.data(), 1, Kt, H, D);
    auto q16 = posenc::make_bshd(qh.data(), 1, Qt, H, D);
    auto k16 = posenc::make_bshd(qh.data(), 1, Kt, H, D);
    std::vector<float> out(static_cast<std::size_t>(Qt * H * D), 7.0f);
    std::vector<Eigen::half> out16(out.size(), Eigen::half(7.0f));
    auto o = posenc::make_bshd(out.data(), 1, Qt, H, D);
    auto o16 = posenc::make_bshd(out16.data(), 1, Qt, H, D);
    CHECK_THROWS_WITH(posenc::attention(q, k, k, o, seqs, posenc::none{}, opt, mask(1, 1, Qt, Kt + 1)),
                      posenc_test::contains("posenc::attention: mask (16-bit).k is 27, expected 0 .. 26"));
    CHECK_THROWS_WITH(posenc::attention(q16, k16, k16, o16, seqs, posenc::none{}, opt, mask(1, 1, Qt, Kt + 1)),
                      posenc_test::contains("posenc::attention: mask (16-bit).k is 27, expected 0 .. 26"));
    CHECK_THROWS_WITH(posenc::attention(q, k, k, o, seqs, posenc::none{}, opt, mask(2, 1, 1, Kt)),
                      posenc_test::contains("mask (16-bit).batch is 2, expected 1 or 1"));
    CHECK_THROWS_WITH(posenc::attention(q16, k16, k16, o16, seqs, posenc::none{}, opt, mask(1, 1, Sq, Kt)),
                      posenc_test::contains("mask (16-bit).q is 7, expected 1 or 9"));
    std::vector<float> lse(static_cast<std::size_t>(H * Qt));
    opt.lse = lse;
    CHECK_THROWS_WITH(posenc::attention(q, k, k, o, seqs, posenc::none{}, opt,
                                        posenc::make_mask(reinterpret_cast<bf16 const*>(lse.data()), 1, 1, 1, Kt)),
                      posenc_test::contains("overlaps mask (16-bit)"));
    opt.lse = nullptr;
    CHECK_THROWS_WITH(posenc::attention(q16, k16, k16, o16, seqs, posenc::none{}, opt,
                                        posenc::make_mask(reinterpret_cast<bf16 const*>(out16.data()), 1, 1, 1, Kt)),
                      posenc_test::contains("out is at bytes"));
    for (float x : out) touched += x != 7.0f ? 1 : 0;
    for (Eigen::half x : out16) touched += widen(x) != 7.0f ? 1 : 0;
  }
  CHECK(touched == 0);
}
}  // namespace attention_half_masks_tests
