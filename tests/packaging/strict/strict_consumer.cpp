// SPDX-License-Identifier: MIT
// A consumer compiled with every warning a strict project turns on (-Werror): posenc's public
// headers must stay silent, at -march=native and at default flags, with g++ and clang.
#include <posenc/posenc.hpp>

#include <cstddef>
#include <vector>

namespace {

using posenc::index_t;

/// Buffers of one (batch 2, seq 9, heads 4 over 2 kv heads, dim 8) problem in T.
template <class T>
struct problem {
  static constexpr index_t b = 2, s = 9, hq = 4, hkv = 2, d = 8;
  std::vector<T> q, k, v, out, lse;
  problem()
      : q(static_cast<std::size_t>(b * s * hq * d), T(0.25)),
        k(static_cast<std::size_t>(b * s * hkv * d), T(0.5)),
        v(static_cast<std::size_t>(b * s * hkv * d), T(1)),
        out(static_cast<std::size_t>(b * s * hq * d)),
        lse(static_cast<std::size_t>(b * hq * s)) {}
};

/// Every path, with every option that reaches a kernel.
template <class T, class E>
void all_paths(E const& enc) {
  problem<T> p;
  auto q = posenc::make_bshd<const T>(p.q.data(), p.b, p.s, p.hq, p.d);
  auto k = posenc::make_bshd<const T>(p.k.data(), p.b, p.s, p.hkv, p.d);
  auto v = posenc::make_bshd<const T>(p.v.data(), p.b, p.s, p.hkv, p.d);
  auto o = posenc::make_bshd(p.out.data(), p.b, p.s, p.hq, p.d);
  std::vector<index_t> lengths{p.s, p.s - 2};
  std::vector<T> mask(static_cast<std::size_t>(p.s * p.s), T(0));
  posenc::attention_options<T> opt;
  opt.causal = true;
  opt.sliding_window = 4;
  opt.softcap = 30;
  opt.key_lengths = posenc::span<const index_t>(lengths.data(), p.b);
  opt.mask = posenc::make_mask<T>(mask.data(), 1, 1, p.s, p.s);
  opt.lse = p.lse;
  opt.threads = 2;
  posenc::attention<posenc::path::reference>(q, k, v, o, enc, opt);
  posenc::attention<posenc::path::materialized>(q, k, v, o, enc, opt);
  posenc::attention<posenc::path::fused>(q, k, v, o, enc, opt);
  // Decode shape (row kernel with a key split) and a lane-kernel shape.
  auto q1 = posenc::make_bshd<const T>(p.q.data(), p.b, 1, p.hq, p.d);
  auto o1 = posenc::make_bshd(p.out.data(), p.b, 1, p.hq, p.d);
  posenc::attention_options<T> dec;
  dec.threads = 2;
  posenc::attention(q1, k, v, o1, enc, dec);
}

template <class T>
void absolute_encoders() {
  std::vector<T> x(static_cast<std::size_t>(2 * 9 * 16), T(0.5));
  auto xv = posenc::make_bsd(x.data(), 2, 9, 16);
  posenc::sinusoidal<T>(16).add_to(xv, posenc::position_span(3));
  posenc::learned<T>::random(64, 16, 7, 0, 0.02).add_to(xv, posenc::position_span(0));
}

template <class T>
void encoders() {
  index_t const hq = problem<T>::hq, d = problem<T>::d;
  all_paths<T>(posenc::none{});
  posenc::rope<T> rope(posenc::rope_layout::half_split, d);
  all_paths<T>(rope);
  rope.reserve(64);
  all_paths<T>(rope);
  posenc::rope_options yarn;
  yarn.scaling = posenc::rope_scaling::yarn(4.0, 8);
  all_paths<T>(posenc::rope<T>(posenc::rope_layout::interleaved, d, yarn));
  all_paths<T>(posenc::alibi<T>(posenc::alibi_form::paper, hq));
  posenc::t5_bias_params t5;
  t5.heads = hq;
  all_paths<T>(posenc::t5_bias<T>(t5, 3, 0.5));
  all_paths<T>(posenc::clipped_bias<T>(4, hq, 5, 0.5));
  all_paths<T>(posenc::shaw<T>(4, d, posenc::shaw_terms::keys_and_values, 6, 0.5));
  all_paths<T>(posenc::compose<posenc::rope<T>, posenc::alibi<T>>(rope, posenc::alibi<T>(posenc::alibi_form::paper, hq)));
  absolute_encoders<T>();
}

template <class T>
void module_and_cache() {
  index_t const model = 16, heads = 4, kv_heads = 2, head_dim = 4;
  posenc::rope<T> rope(posenc::rope_layout::half_split, head_dim);
  posenc::multi_head_attention<posenc::rope<T>, T> layer({model, heads, kv_heads, head_dim}, rope);
  std::vector<T> w(static_cast<std::size_t>(model * heads * head_dim), T(0.01));
  layer.load(w.data(), w.data(), w.data(), w.data());
  std::vector<T> x(static_cast<std::size_t>(3 * model), T(0.1)), y(x.size());
  auto cache = layer.make_cache(1);
  posenc::attention_options<T> causal;
  causal.causal = true;
  layer.forward(posenc::make_bsd<const T>(x.data(), 1, 3, model), posenc::make_bsd(y.data(), 1, 3, model), cache,
                causal);
  layer.forward(posenc::make_bsd<const T>(x.data(), 1, 3, model), posenc::make_bsd(y.data(), 1, 3, model));
}

/// A paged cache: append, fork, batched decode over the pages, free, compact.
template <class T>
void paged_cache() {
  index_t const heads = 4, kv_heads = 2, head_dim = 8, page = 4;
  using I = typename posenc::paged_kv_cache<T>::input_type;
  posenc::paged_kv_cache<T> cache(16, page, kv_heads, head_dim);
  posenc::rope<I> rope(posenc::rope_layout::half_split, head_dim);
  std::vector<I> k(static_cast<std::size_t>(2 * 6 * kv_heads * head_dim), I(0.5));
  std::vector<I> q(static_cast<std::size_t>(2 * heads * head_dim), I(0.25)), out(q.size());
  index_t const a = cache.add_sequence(), gone = cache.add_sequence();
  cache.append(gone, posenc::make_bshd<const I>(k.data(), 1, 6, kv_heads, head_dim),
               posenc::make_bshd<const I>(k.data(), 1, 6, kv_heads, head_dim), rope);
  cache.append(a, posenc::make_bshd<const I>(k.data(), 1, 6, kv_heads, head_dim),
               posenc::make_bshd<const I>(k.data(), 1, 6, kv_heads, head_dim), rope);
  index_t const b = cache.fork(a);
  cache.free(gone);
  std::vector<index_t> ids{a, b};
  cache.append(ids, posenc::make_bshd<const I>(k.data(), 2, 1, kv_heads, head_dim),
               posenc::make_bshd<const I>(k.data(), 2, 1, kv_heads, head_dim), rope);
  if (cache.page_runs(a) > 1) cache.compact();
  posenc::attention_options<I> opt;
  opt.causal = true;
  posenc::paged_attention_workspace<T> ws;
  posenc::attention(posenc::make_bshd<const I>(q.data(), 2, 1, heads, head_dim), cache, ids,
                    posenc::make_bshd(out.data(), 2, 1, heads, head_dim), rope, opt, ws);
}

}  // namespace

int main() {
  paged_cache<float>();
  paged_cache<double>();
  paged_cache<Eigen::bfloat16>();
  encoders<float>();
  encoders<double>();
  module_and_cache<float>();
  module_and_cache<double>();
  return 0;
}
