// SPDX-License-Identifier: MIT
// Transformer-XL properties: only p_i - p_j matters, shift invariance, decode over a memory cache == one pass.
#include <posenc/attention/attention.hpp>
#include <posenc/attention/kv_cache.hpp>
#include <posenc/encoding/transformer_xl.hpp>

#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/random.hpp"
#include "support/transformer_xl.hpp"

namespace properties_transformer_xl_tests {

using posenc::index_t;

TEST_CASE("Transformer-XL 1: the position term depends on positions only through p_i - p_j",
          "[properties][transformer_xl]") {
  index_t const H = 3, D = 6, n = 12;
  auto const enc = posenc_test::random_transformer_xl<double>(H, D, 8, 40, 5);
  auto const q = posenc_test::random_vector<double>(static_cast<std::size_t>(D), 9);
  for (index_t h = 0; h < H; ++h) {
    std::vector<double> a(static_cast<std::size_t>(n), 0.0), b(static_cast<std::size_t>(n), 0.0);
    enc.add_position_scores(h, q, 20, 15, 0.5, a);
    enc.add_position_scores(h, q, 20 + 1000, 15 + 1000, 0.5, b);
    for (index_t j = 0; j < n; ++j) CHECK(a[static_cast<std::size_t>(j)] == b[static_cast<std::size_t>(j)]);
    // And it is the table's (q + v) . R(d) with d = 20 - (15 + j).
    for (index_t j = 0; j < n; ++j) {
      index_t const d = 20 - 15 - j;
      double want = enc.position_bias(h, d);
      for (index_t t = 0; t < D; ++t) want += (q[static_cast<std::size_t>(t)]) * enc.relative_key(h, d, t);
      // (q + u) . R + (v - u) . R == q . R + v . R: position_bias holds (v - u) . R, so add u . R back.
      auto const u = posenc_test::random_table<double>(H, D, 5);
      for (index_t t = 0; t < D; ++t) want += u(h, t) * enc.relative_key(h, d, t);
      CHECK(std::abs(a[static_cast<std::size_t>(j)] - 0.5 * want) < 1e-12);
    }
  }
}

TEST_CASE("Transformer-XL 2: shifting every position leaves the output unchanged", "[properties][transformer_xl]") {
  index_t const B = 2, Sq = 9, mem = 14, Sk = mem + Sq;
  posenc_test::txl_buffers<float> bf(B, Sq, Sk, 4, 2, 16, 3);
  auto const enc = posenc_test::random_transformer_xl<float>(4, 16, 12, Sk, 4);
  for (bool causal : {true, false}) {
    posenc::attention_options<float> opt;
    opt.causal = causal;
    auto const base_ref = bf.run<posenc::path::reference>(enc, opt);
    auto const base = bf.run<posenc::path::fused>(enc, opt);
    for (index_t shift : {index_t{1}, index_t{57}, index_t{100000}}) {
      opt.q_positions = posenc::position_span(mem + shift);
      opt.k_positions = posenc::position_span(shift);
      auto const ref = bf.run<posenc::path::reference>(enc, opt);
      auto const got = bf.run<posenc::path::fused>(enc, opt);
      INFO("shift " << shift << (causal ? " causal" : ""));
      CHECK(posenc_test::max_abs_diff(ref, base_ref) == 0.0);
      CHECK(posenc_test::max_abs_diff(got, base) == 0.0);
    }
  }
}

TEST_CASE("Transformer-XL 3: decode over a memory cache == one pass over [memory ; segment]",
          "[properties][transformer_xl]") {
  // Segment 1 fills the cache; segment 2 is decoded token by token over it,
  // then compared with one causal pass over the concatenated keys.
  index_t const B = 2, Hq = 4, Hkv = 2, D = 8, S1 = 11, S2 = 7, Sk = S1 + S2;
  posenc_test::txl_buffers<float> bf(B, S2, Sk, Hq, Hkv, D, 21);
  auto const enc = posenc_test::random_transformer_xl<float>(Hq, D, 10, Sk, 22);
  posenc::attention_options<float> opt;
  opt.causal = true;
  auto const pass = bf.run<posenc::path::reference>(enc, opt);

  auto token = [&](std::vector<float> const& x, index_t seq, index_t heads, index_t s0, index_t n) {
    std::vector<float> y;
    for (index_t b = 0; b < B; ++b)
      for (index_t s = s0; s < s0 + n; ++s)
        for (index_t h = 0; h < heads; ++h)
          for (index_t d = 0; d < D; ++d) y.push_back(x[static_cast<std::size_t>(((b * seq + s) * heads + h) * D + d)]);
    return y;
  };
  for (int p = 0; p < 2; ++p) {
    std::string const name = p == 0 ? "reference" : "fused";
    SECTION("decode on the " + name + " path") {
      posenc::kv_cache<float> cache(B, Hkv, D);
      auto const k1 = token(bf.k, Sk, Hkv, 0, S1), v1 = token(bf.v, Sk, Hkv, 0, S1);
      cache.append(posenc::make_bshd(k1.data(), B, S1, Hkv, D), posenc::make_bshd(v1.data(), B, S1, Hkv, D), enc);
      std::vector<float> out(static_cast<std::size_t>(B * S2 * Hq * D));
      for (index_t t = 0; t < S2; ++t) {
        auto const kt = token(bf.k, Sk, Hkv, S1 + t, 1), vt = token(bf.v, Sk, Hkv, S1 + t, 1);
        cache.append(posenc::make_bshd(kt.data(), B, 1, Hkv, D), posenc::make_bshd(vt.data(), B, 1, Hkv, D), enc);
        auto const qt = token(bf.q, S2, Hq, t, 1);
        std::vector<float> ot(static_cast<std::size_t>(B * Hq * D));
        posenc::attention_options<float> o;
        o.causal = true;
        if (p == 0)
          posenc::attention<posenc::path::reference>(posenc::make_bshd<const float>(qt.data(), B, 1, Hq, D), cache,
                                                     posenc::make_bshd(ot.data(), B, 1, Hq, D), enc, o);
        else
          posenc::attention<posenc::path::fused>(posenc::make_bshd<const float>(qt.data(), B, 1, Hq, D), cache,
                                                 posenc::make_bshd(ot.data(), B, 1, Hq, D), enc, o);
        for (index_t b = 0; b < B; ++b)
          for (index_t x = 0; x < Hq * D; ++x)
            out[static_cast<std::size_t>((b * S2 + t) * Hq * D + x)] = ot[static_cast<std::size_t>(b * Hq * D + x)];
      }
      std::vector<float> const want(pass.begin(), pass.begin() + static_cast<std::ptrdiff_t>(out.size()));
      CHECK(posenc_test::max_abs_diff(out, want) < 2e-6);
    }
  }
}

TEST_CASE("Transformer-XL 4: a memory longer than memory_length is cut to its most recent keys",
          "[properties][transformer_xl]") {
  index_t const B = 2, Sq = 5, mem = 30, M = 8, Sk = mem + Sq;
  posenc_test::txl_buffers<float> bf(B, Sq, Sk, 2, 2, 8, 31);
  auto const cut = posenc_test::random_transformer_xl<float>(2, 8, 6, Sk, 32, M);
  auto const all = posenc_test::random_transformer_xl<float>(2, 8, 6, Sk, 32);
  // The same call over only the last M + Sq keys, with an encoder that keeps every key.
  posenc_test::txl_buffers<float> last(B, Sq, M + Sq, 2, 2, 8, 31);
  last.k.clear();
  last.v.clear();
  for (index_t b = 0; b < B; ++b) {
    auto const from = static_cast<std::size_t>((b * Sk + mem - M) * 2 * 8), to = static_cast<std::size_t>((b + 1) * Sk * 2 * 8);
    last.k.insert(last.k.end(), bf.k.begin() + static_cast<std::ptrdiff_t>(from), bf.k.begin() + static_cast<std::ptrdiff_t>(to));
    last.v.insert(last.v.end(), bf.v.begin() + static_cast<std::ptrdiff_t>(from), bf.v.begin() + static_cast<std::ptrdiff_t>(to));
  }
  for (bool causal : {true, false}) {
    posenc::attention_options<float> opt;
    opt.causal = causal;
    INFO((causal ? "causal" : "bidirectional"));
    CHECK(posenc_test::max_abs_diff(bf.run<posenc::path::reference>(cut, opt),
                                    last.run<posenc::path::reference>(all, opt)) == 0.0);
    CHECK(posenc_test::max_abs_diff(bf.run<posenc::path::fused>(cut, opt), last.run<posenc::path::fused>(all, opt)) ==
          0.0);
    // Without the cut the long memory changes the result.
    CHECK(posenc_test::max_abs_diff(bf.run<posenc::path::reference>(all, opt),
                                    last.run<posenc::path::reference>(all, opt)) > 1e-4);
  }
  SECTION("through a kv_cache holding the whole history") {
    posenc::kv_cache<float> cache(B, 2, 8);
    cache.append(bf.kv(), bf.vv(), cut);
    std::vector<float> a(static_cast<std::size_t>(B * Sq * 2 * 8)), want(a.size());
    posenc::attention_options<float> opt;
    opt.causal = true;
    posenc::attention<posenc::path::fused>(bf.qv(), cache, posenc::make_bshd(a.data(), B, Sq, 2, 8), cut, opt);
    posenc::attention<posenc::path::fused>(last.qv(), last.kv(), last.vv(), posenc::make_bshd(want.data(), B, Sq, 2, 8),
                                           all, opt);
    CHECK(posenc_test::max_abs_diff(a, want) == 0.0);
  }
}
}  // namespace properties_transformer_xl_tests
