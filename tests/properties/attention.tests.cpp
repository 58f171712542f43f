// SPDX-License-Identifier: MIT
// The eight numbered postconditions of attention, each over many random cases and every encoder.
#include <posenc/attention/attention.hpp>
#include <posenc/attention/kv_cache.hpp>
#include <posenc/attention/multi_head.hpp>
#include <posenc/encoding/alibi.hpp>
#include <posenc/encoding/clipped_bias.hpp>
#include <posenc/encoding/compose.hpp>
#include <posenc/encoding/learned.hpp>
#include <posenc/encoding/none.hpp>
#include <posenc/encoding/rope.hpp>
#include <posenc/encoding/shaw.hpp>
#include <posenc/encoding/sinusoidal.hpp>
#include <posenc/encoding/t5_bias.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/fake_encoders.hpp"
#include "support/random.hpp"

namespace properties_attention_tests {

using posenc::index_t;
using posenc_test::random_vector;

namespace {

/// Calls f(name, encoder) for every relative encoder (double), built for H heads of width D.
template <class F>
void for_each_relative(index_t H, index_t D, std::uint64_t seed, F&& f) {
  f("none", posenc::none{});
  f("rope half-split", posenc::rope<double>(posenc::rope_layout::half_split, D));
  f("rope interleaved, partial", posenc::rope<double>(posenc::rope_layout::interleaved, D, {D / 2, 500.0}));
  f("rope linear", posenc::rope<double>(posenc::rope_layout::half_split, D,
                                        {std::nullopt, 10000.0, posenc::rope_scaling::linear(4.0)}));
  f("rope yarn", posenc::rope<double>(posenc::rope_layout::half_split, D,
                                      {std::nullopt, 10000.0, posenc::rope_scaling::yarn(4.0, 64)}));
  f("rope llama3", posenc::rope<double>(posenc::rope_layout::half_split, D,
                                        {std::nullopt, 10000.0, posenc::rope_scaling::llama3(8, 1, 4, 64)}));
  f("alibi paper", posenc::alibi<double>(posenc::alibi_form::paper, H));
  f("alibi key-only", posenc::alibi<double>(posenc::alibi_form::key_only, H));
  f("alibi symmetric", posenc::alibi<double>(posenc::alibi_form::symmetric, H));
  f("t5 bidirectional", posenc::t5_bias<double>({H, true, 32, 128}, seed, 0.5));
  f("t5 causal", posenc::t5_bias<double>({H, false, 32, 128}, seed, 0.5));
  f("clipped", posenc::clipped_bias<double>(3, H, seed, 0.5));
  f("shaw keys", posenc::shaw<double>(2, D, posenc::shaw_terms::keys, seed, 0.5));
  f("shaw keys and values", posenc::shaw<double>(3, D, posenc::shaw_terms::keys_and_values, seed, 0.5));
  f("rope + alibi", posenc::compose(posenc::rope<double>(posenc::rope_layout::half_split, D),
                                    posenc::alibi<double>(posenc::alibi_form::paper, H)));
}

template <class T>
struct qkv {
  index_t B, Sq, Sk, Hq, Hkv, D;
  std::vector<T> q, k, v, out;
  qkv(index_t b, index_t sq, index_t sk, index_t hq, index_t hkv, index_t d, std::uint64_t seed)
      : B(b), Sq(sq), Sk(sk), Hq(hq), Hkv(hkv), D(d),
        q(random_vector<T>(static_cast<std::size_t>(b * sq * hq * d), seed)),
        k(random_vector<T>(static_cast<std::size_t>(b * sk * hkv * d), seed + 1)),
        v(random_vector<T>(static_cast<std::size_t>(b * sk * hkv * d), seed + 2)),
        out(static_cast<std::size_t>(b * sq * hq * d)) {}
  template <class Path, class E>
  std::vector<T> run(E const& enc, posenc::attention_options<T> const& opt) {
    posenc::attention<Path>(posenc::make_bshd<const T>(q.data(), B, Sq, Hq, D),
                            posenc::make_bshd<const T>(k.data(), B, Sk, Hkv, D),
                            posenc::make_bshd<const T>(v.data(), B, Sk, Hkv, D),
                            posenc::make_bshd(out.data(), B, Sq, Hq, D), enc, opt);
    return out;
  }
};

template <class T>
std::vector<T> random_weights(index_t rows, index_t cols, std::uint64_t seed) {
  return random_vector<T>(static_cast<std::size_t>(rows * cols), seed, -0.5, 0.5);
}

template <class E, class T = double>
posenc::multi_head_attention<E, T> make_module(index_t model, index_t hq, index_t hkv, index_t d, E enc,
                                               std::uint64_t seed) {
  posenc::multi_head_attention<E, T> m({model, hq, hkv, d, d}, std::move(enc));
  auto wq = random_weights<T>(hq * d, model, seed), wk = random_weights<T>(hkv * d, model, seed + 1);
  auto wv = random_weights<T>(hkv * d, model, seed + 2), wo = random_weights<T>(model, hq * d, seed + 3);
  auto bq = random_weights<T>(hq * d, 1, seed + 4), bo = random_weights<T>(model, 1, seed + 5);
  m.load(wq.data(), wk.data(), wv.data(), wo.data(), bq.data(), nullptr, nullptr, bo.data());
  return m;
}

}  // namespace

// 1. Permutation equivariance: the module with `none`, not causal.
// 2. With an absolute encoder the same check fails: order is detected.
TEMPLATE_TEST_CASE("property 1-2: permutation equivariance without positions, broken by absolute encoders",
                   "[properties]", posenc::path::reference, posenc::path::materialized) {
  auto const seed = GENERATE(take(12, random(1, 1000000)));
  std::mt19937_64 gen(static_cast<std::uint64_t>(seed));
  index_t const B = 1 + static_cast<index_t>(gen() % 2), S = 3 + static_cast<index_t>(gen() % 6);
  index_t const hkv = 1 + static_cast<index_t>(gen() % 2), hq = hkv * (1 + static_cast<index_t>(gen() % 2));
  index_t const d = 4, model = 8;
  auto x = random_vector<double>(static_cast<std::size_t>(B * S * model), static_cast<std::uint64_t>(seed));
  std::vector<index_t> perm(static_cast<std::size_t>(S));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), gen);
  if (std::is_sorted(perm.begin(), perm.end())) std::swap(perm[0], perm[1]);
  std::vector<double> xp(x.size());
  for (index_t b = 0; b < B; ++b)
    for (index_t s = 0; s < S; ++s)
      std::copy_n(x.begin() + (b * S + perm[s]) * model, model, xp.begin() + (b * S + s) * model);
  // max |y_perm[s] - y[perm[s]]|
  // Absolute encoders act as the reference models place them: added to the
  // embeddings (positions 0..S-1) before the layer, which then encodes nothing.
  auto permutation_error = [&](auto const& module, auto const&... absolute) {
    std::vector<double> xe = x, xpe = xp, y(x.size()), yp(x.size());
    (absolute.add_to(posenc::make_bsd(xe.data(), B, S, model), posenc::position_span(0)), ...);
    (absolute.add_to(posenc::make_bsd(xpe.data(), B, S, model), posenc::position_span(0)), ...);
    module.template forward<TestType>(posenc::make_bsd<const double>(xe.data(), B, S, model),
                                      posenc::make_bsd(y.data(), B, S, model));
    module.template forward<TestType>(posenc::make_bsd<const double>(xpe.data(), B, S, model),
                                      posenc::make_bsd(yp.data(), B, S, model));
    double e = 0;
    for (index_t b = 0; b < B; ++b)
      for (index_t s = 0; s < S; ++s)
        for (index_t t = 0; t < model; ++t)
          e = std::max(e, std::abs(yp[(b * S + s) * model + t] - y[(b * S + perm[s]) * model + t]));
    return e;
  };
  auto const u = static_cast<std::uint64_t>(seed);
  CHECK(permutation_error(make_module(model, hq, hkv, d, posenc::none{}, u)) < 1e-12);
  auto const plain = make_module(model, hq, hkv, d, posenc::none{}, u);
  CHECK(permutation_error(plain, posenc::sinusoidal<double>(model)) > 1e-3);
  CHECK(permutation_error(plain, posenc::learned<double>::random(16, model, u)) > 1e-3);
  CHECK(permutation_error(plain, posenc_test::fake_absolute{}) > 1e-3);
  // relative encoders detect order too (scores depend on i - j)
  CHECK(permutation_error(make_module(model, hq, hkv, d, posenc::rope<double>(posenc::rope_layout::half_split, d), u)) > 1e-3);
}

// 3. Relative invariance: shifting every position by c leaves the outputs unchanged.
TEMPLATE_TEST_CASE("property 3: relative encoders are invariant under a global position shift", "[properties]",
                   posenc::path::reference, posenc::path::materialized) {
  auto const seed = GENERATE(take(6, random(1, 1000000)));
  std::mt19937_64 gen(static_cast<std::uint64_t>(seed));
  index_t const B = 2, Sq = 1 + static_cast<index_t>(gen() % 6), Sk = Sq + static_cast<index_t>(gen() % 5);
  index_t const H = 2 + static_cast<index_t>(gen() % 3), D = 8;
  index_t const c = 1 + static_cast<index_t>(gen() % 3000);
  bool const causal = gen() % 2 == 0;
  qkv<double> p(B, Sq, Sk, H, 1, D, static_cast<std::uint64_t>(seed));
  for_each_relative(H, D, static_cast<std::uint64_t>(seed), [&](std::string const& name, auto const& enc) {
    INFO(name << ", shift " << c << (causal ? ", causal" : ""));
    posenc::attention_options<double> opt;
    opt.causal = causal;
    auto const base = p.template run<TestType>(enc, opt);
    opt.q_positions = posenc::position_span(c + Sk - Sq);
    opt.k_positions = posenc::position_span(c);
    auto const shifted = p.template run<TestType>(enc, opt);
    CHECK(posenc_test::max_abs_diff(base, shifted) < 1e-9);
  });
}

// 4. Decode token by token with the cache equals prefill, for every encoder.
TEMPLATE_TEST_CASE("property 4: cached decode equals prefill", "[properties]", posenc::path::reference,
                   posenc::path::materialized) {
  auto const seed = GENERATE(take(3, random(1, 1000000)));
  std::mt19937_64 gen(static_cast<std::uint64_t>(seed));
  index_t const B = 1 + static_cast<index_t>(gen() % 2), S = 4 + static_cast<index_t>(gen() % 8);
  index_t const hkv = 1 + static_cast<index_t>(gen() % 2), hq = 2 * hkv, d = 8, model = 16;
  index_t const prompt = static_cast<index_t>(gen() % 3);  // tokens given in one first step
  auto const u = static_cast<std::uint64_t>(seed);
  auto const x_in = random_vector<double>(static_cast<std::size_t>(B * S * model), u);
  // `absolute...`: encoders added to the embeddings (positions 0..S-1) before the layer.
  auto check = [&](std::string const& name, auto enc, auto const&... absolute) {
    INFO(name << ": B " << B << " S " << S << " prompt " << prompt);
    auto m = make_module(model, hq, hkv, d, std::move(enc), u);
    auto x = x_in;
    (absolute.add_to(posenc::make_bsd(x.data(), B, S, model), posenc::position_span(0)), ...);
    posenc::attention_options<double> opt;
    opt.causal = true;
    std::vector<double> full(x.size()), steps(x.size());
    m.template forward<TestType>(posenc::make_bsd<const double>(x.data(), B, S, model),
                                 posenc::make_bsd(full.data(), B, S, model), opt);
    auto cache = m.make_cache(B);
    index_t s = 0;
    while (s < S) {
      index_t const n = s == 0 && prompt > 0 ? prompt : 1;
      posenc::token_view<const double> xs{x.data() + s * model, B, n, model, S * model, model, 1};
      posenc::token_view<double> ys{steps.data() + s * model, B, n, model, S * model, model, 1};
      m.template forward<TestType>(xs, ys, cache, opt);
      s += n;
    }
    CHECK(cache.length() == S);
    CHECK(posenc_test::max_abs_diff(full, steps) < 1e-10);
  };
  check("none", posenc::none{});
  check("sinusoidal", posenc::none{}, posenc::sinusoidal<double>(model));
  check("learned", posenc::none{}, posenc::learned<double>::random(32, model, u));
  for_each_relative(hq, d, u, [&](std::string const& name, auto const& enc) { check(name, enc); });
  check("rope dynamic NTK below its length", posenc::rope<double>(posenc::rope_layout::half_split, d,
        {std::nullopt, 10000.0, posenc::rope_scaling::dynamic_ntk(2.0, 64)}));
  std::vector<double> sf(static_cast<std::size_t>(d / 2), 1.5), lf(static_cast<std::size_t>(d / 2), 3.0);
  check("rope longrope below its length", posenc::rope<double>(posenc::rope_layout::half_split, d,
        {std::nullopt, 10000.0, posenc::rope_scaling::longrope(sf, lf, 64, 256)}));
  check("learned + t5", posenc::t5_bias<double>({hq, false, 32, 128}, u, 0.5),
        posenc::learned<double>::random(32, model, u));
  check("fake rotary", posenc_test::fake_rotary{});
  check("fake shaw", posenc_test::fake_shaw<double>(2, d, true, u));
}

// 5. GQA equals full multi-head attention with the K/V heads repeated.
TEMPLATE_TEST_CASE("property 5: grouped-query attention equals repeated K/V heads", "[properties]",
                   posenc::path::reference, posenc::path::materialized) {
  auto const seed = GENERATE(take(6, random(1, 1000000)));
  std::mt19937_64 gen(static_cast<std::uint64_t>(seed));
  index_t const B = 2, Sq = 1 + static_cast<index_t>(gen() % 5), Sk = Sq + static_cast<index_t>(gen() % 4);
  index_t const hkv = 1 + static_cast<index_t>(gen() % 3), rep = 2 + static_cast<index_t>(gen() % 2);
  index_t const hq = hkv * rep, D = 8;
  qkv<double> g(B, Sq, Sk, hq, hkv, D, static_cast<std::uint64_t>(seed));
  qkv<double> full(B, Sq, Sk, hq, hq, D, 0);
  full.q = g.q;
  for (index_t b = 0; b < B; ++b)
    for (index_t j = 0; j < Sk; ++j)
      for (index_t h = 0; h < hq; ++h)
        for (index_t t = 0; t < D; ++t) {
          full.k[static_cast<std::size_t>(((b * Sk + j) * hq + h) * D + t)] =
              g.k[static_cast<std::size_t>(((b * Sk + j) * hkv + h / rep) * D + t)];
          full.v[static_cast<std::size_t>(((b * Sk + j) * hq + h) * D + t)] =
              g.v[static_cast<std::size_t>(((b * Sk + j) * hkv + h / rep) * D + t)];
        }
  for_each_relative(hq, D, static_cast<std::uint64_t>(seed), [&](std::string const& name, auto const& enc) {
    INFO(name << " Hq " << hq << " Hkv " << hkv);
    posenc::attention_options<double> opt;
    opt.causal = true;
    CHECK(posenc_test::max_abs_diff(g.template run<TestType>(enc, opt), full.template run<TestType>(enc, opt)) < 1e-12);
  });
}

// 6. Causal attention with q_offset equals the matching rows of full-length causal attention.
TEMPLATE_TEST_CASE("property 6: causal with a query offset equals rows of the full causal attention",
                   "[properties]", posenc::path::reference, posenc::path::materialized) {
  auto const seed = GENERATE(take(6, random(1, 1000000)));
  std::mt19937_64 gen(static_cast<std::uint64_t>(seed));
  index_t const N = 3 + static_cast<index_t>(gen() % 8), H = 2, D = 8;
  index_t const off = static_cast<index_t>(gen() % static_cast<std::uint64_t>(N));
  index_t const m = 1 + static_cast<index_t>(gen() % static_cast<std::uint64_t>(N - off));
  qkv<double> full(2, N, N, H, 1, D, static_cast<std::uint64_t>(seed));
  qkv<double> part(2, m, N, H, 1, D, 0);
  part.k = full.k;
  part.v = full.v;
  for (index_t b = 0; b < 2; ++b)
    std::copy_n(full.q.begin() + (b * N + off) * H * D, m * H * D, part.q.begin() + b * m * H * D);
  index_t const W = static_cast<index_t>(gen() % 4);  // 0 = no window
  for_each_relative(H, D, static_cast<std::uint64_t>(seed), [&](std::string const& name, auto const& enc) {
    INFO(name << " N " << N << " offset " << off << " rows " << m << " window " << W);
    posenc::attention_options<double> opt;
    opt.causal = true;
    opt.sliding_window = W;
    auto const f = full.template run<TestType>(enc, opt);
    opt.q_positions = posenc::position_span(off);
    auto const r = part.template run<TestType>(enc, opt);
    double e = 0;
    for (index_t b = 0; b < 2; ++b)
      for (index_t n = 0; n < m * H * D; ++n)
        e = std::max(e, std::abs(r[static_cast<std::size_t>(b * m * H * D + n)] -
                                 f[static_cast<std::size_t>((b * N + off) * H * D + n)]));
    CHECK(e < 1e-12);
  });
}

// 7. Log-sum-exp merge of the two halves of the keys equals attention over all keys.
TEMPLATE_TEST_CASE("property 7: merging two key halves with their log-sum-exp", "[properties]",
                   posenc::path::reference, posenc::path::materialized) {
  auto const seed = GENERATE(take(6, random(1, 1000000)));
  std::mt19937_64 gen(static_cast<std::uint64_t>(seed));
  index_t const B = 2, Sq = 1 + static_cast<index_t>(gen() % 6), Sk = 2 + static_cast<index_t>(gen() % 9);
  index_t const H = 2, D = 8, half = Sk / 2;
  bool const causal = gen() % 2 == 0;
  qkv<double> all(B, Sq, Sk, H, H, D, static_cast<std::uint64_t>(seed));
  qkv<double> lo(B, Sq, half, H, H, D, 0), hi(B, Sq, Sk - half, H, H, D, 0);
  lo.q = hi.q = all.q;
  for (index_t b = 0; b < B; ++b) {
    std::copy_n(all.k.begin() + b * Sk * H * D, half * H * D, lo.k.begin() + b * half * H * D);
    std::copy_n(all.v.begin() + b * Sk * H * D, half * H * D, lo.v.begin() + b * half * H * D);
    std::copy_n(all.k.begin() + (b * Sk + half) * H * D, (Sk - half) * H * D, hi.k.begin() + b * (Sk - half) * H * D);
    std::copy_n(all.v.begin() + (b * Sk + half) * H * D, (Sk - half) * H * D, hi.v.begin() + b * (Sk - half) * H * D);
  }
  for_each_relative(H, D, static_cast<std::uint64_t>(seed), [&](std::string const& name, auto const& enc) {
    INFO(name << " Sq " << Sq << " Sk " << Sk << (causal ? " causal" : ""));
    std::vector<double> lse_all(static_cast<std::size_t>(B * H * Sq)), lse_lo(lse_all.size()), lse_hi(lse_all.size());
    posenc::attention_options<double> opt;
    opt.causal = causal;
    opt.q_positions = posenc::position_span(Sk - Sq);
    opt.lse = lse_all;
    auto const f = all.template run<TestType>(enc, opt);
    opt.lse = lse_lo;
    auto const a = lo.template run<TestType>(enc, opt);
    opt.lse = lse_hi;
    opt.k_positions = posenc::position_span(half);
    auto const c = hi.template run<TestType>(enc, opt);
    double e = 0, el = 0;
    for (index_t b = 0; b < B; ++b)
      for (index_t i = 0; i < Sq; ++i)
        for (index_t h = 0; h < H; ++h) {
          std::size_t const l = static_cast<std::size_t>((b * H + h) * Sq + i);
          double const m = std::max(lse_lo[l], lse_hi[l]);
          double const w1 = std::isinf(lse_lo[l]) ? 0.0 : std::exp(lse_lo[l] - m);
          double const w2 = std::isinf(lse_hi[l]) ? 0.0 : std::exp(lse_hi[l] - m);
          el = std::max(el, std::abs(m + std::log(w1 + w2) - lse_all[l]));
          for (index_t t = 0; t < D; ++t) {
            std::size_t const n = static_cast<std::size_t>(((b * Sq + i) * H + h) * D + t);
            e = std::max(e, std::abs((w1 * a[n] + w2 * c[n]) / (w1 + w2) - f[n]));
          }
        }
    CHECK(e < 1e-12);
    CHECK(el < 1e-12);
  });
}

// 8. A padded batch equals the sequences run one at a time.
TEMPLATE_TEST_CASE("property 8: a padded batch equals the sequences one at a time", "[properties]",
                   posenc::path::reference, posenc::path::materialized) {
  auto const seed = GENERATE(take(6, random(1, 1000000)));
  std::mt19937_64 gen(static_cast<std::uint64_t>(seed));
  index_t const B = 3, Lmax = 2 + static_cast<index_t>(gen() % 7), H = 2, D = 8;
  std::vector<index_t> lens(B);
  for (auto& l : lens) l = 1 + static_cast<index_t>(gen() % static_cast<std::uint64_t>(Lmax));
  lens[gen() % B] = Lmax;
  bool const causal = gen() % 2 == 0;
  qkv<double> batch(B, Lmax, Lmax, H, H, D, static_cast<std::uint64_t>(seed));
  for_each_relative(H, D, static_cast<std::uint64_t>(seed), [&](std::string const& name, auto const& enc) {
    INFO(name << (causal ? " causal" : ""));
    posenc::attention_options<double> opt;
    opt.causal = causal;
    opt.key_lengths = lens;
    opt.q_positions = posenc::position_span(0);  // right padding: real tokens start at 0
    auto const y = batch.template run<TestType>(enc, opt);
    double e = 0;
    for (index_t b = 0; b < B; ++b) {
      index_t const L = lens[b];
      qkv<double> one(1, L, L, H, H, D, 0);
      std::copy_n(batch.q.begin() + b * Lmax * H * D, L * H * D, one.q.begin());
      std::copy_n(batch.k.begin() + b * Lmax * H * D, L * H * D, one.k.begin());
      std::copy_n(batch.v.begin() + b * Lmax * H * D, L * H * D, one.v.begin());
      posenc::attention_options<double> o1;
      o1.causal = causal;
      auto const r = one.template run<TestType>(enc, o1);
      for (index_t n = 0; n < L * H * D; ++n)
        e = std::max(e, std::abs(r[static_cast<std::size_t>(n)] - y[static_cast<std::size_t>(b * Lmax * H * D + n)]));
    }
    CHECK(e < 1e-12);
  });
}
}  // namespace properties_attention_tests
