// SPDX-License-Identifier: MIT
// encoder_identity of every encoder: each parameter changes it (and its text names that parameter), equal copies agree.
#include <posenc/encoding/alibi.hpp>
#include <posenc/encoding/clipped_bias.hpp>
#include <posenc/encoding/compose.hpp>
#include <posenc/encoding/learned.hpp>
#include <posenc/encoding/none.hpp>
#include <posenc/encoding/rope.hpp>
#include <posenc/encoding/shaw.hpp>
#include <posenc/encoding/sinusoidal.hpp>
#include <posenc/encoding/t5_bias.hpp>
#include <posenc/encoding/transformer_xl.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "support/catch.hpp"

namespace encoding_identity_tests {

using posenc::index_t;

namespace {

/// a and b differ only in parameter `name`: their identities and digests
/// differ, and the first character where the texts differ lies inside the
/// value of `name` (between "name " and the next ", ").
template <class A, class B>
void check_differs(A const& a, B const& b, std::string const& name) {
  posenc::encoder_identity const ia = posenc::identity_of(a), ib = posenc::identity_of(b);
  std::string const ta = ia.text(), tb = ib.text();
  INFO(name << ":\n  " << ta << "\n  " << tb);
  CHECK(ia != ib);
  CHECK(ia.digest() != ib.digest());
  std::size_t d = 0;
  while (d < ta.size() && d < tb.size() && ta[d] == tb[d]) ++d;
  REQUIRE(d < std::max(ta.size(), tb.size()));
  std::size_t const at = tb.rfind(name + " ", d);
  REQUIRE(at != std::string::npos);
  CHECK(tb.substr(at, d - at).find(", ") == std::string::npos);
}

/// a and b are built alike: equal identities, digests and texts.
template <class A, class B>
void check_same(A const& a, B const& b) {
  posenc::encoder_identity const ia = posenc::identity_of(a), ib = posenc::identity_of(b);
  INFO(ia.text() << "\n" << ib.text());
  CHECK(ia == ib);
  CHECK(ia.digest() == ib.digest());
  CHECK(ia.text() == ib.text());
}

template <class T>
posenc::relative_table<T> table(index_t rows, index_t cols, double scale = 0.01) {
  posenc::relative_table<T> t(rows, cols);
  for (index_t r = 0; r < rows; ++r)
    for (index_t c = 0; c < cols; ++c) t(r, c) = static_cast<T>(scale * static_cast<double>(r * cols + c + 1));
  return t;
}

}  // namespace

TEST_CASE("identity: none and sinusoidal", "[identity]") {
  check_same(posenc::none{}, posenc::none{});
  CHECK(posenc::none{}.identity().text() == "none()");

  using posenc::sinusoidal;
  using posenc::sinusoidal_frequency;
  using posenc::sinusoidal_layout;
  posenc::sinusoidal_params p;
  p.d_model = 16;
  p.layout = sinusoidal_layout::concatenated;
  sinusoidal<float> const base(p);
  posenc::sinusoidal_params same = p;
  same.cache_positions = 7;  // the cache holds the same values
  check_same(base, sinusoidal<float>(same));
  auto with = [&](auto change) {
    posenc::sinusoidal_params q = p;
    change(q);
    return sinusoidal<float>(q);
  };
  check_differs(base, sinusoidal<double>(p), "type");
  check_differs(base, with([](auto& q) { q.d_model = 18; }), "d_model");
  check_differs(base, with([](auto& q) { q.layout = sinusoidal_layout::interleaved; }), "layout");
  check_differs(base, with([](auto& q) { q.frequency = sinusoidal_frequency::tensor2tensor; }), "frequency");
  check_differs(base, with([](auto& q) { q.base = 10001.0; }), "base");
  check_differs(base, with([](auto& q) { q.padding_idx = 1; }), "padding_idx");
}

TEST_CASE("identity: learned covers rows, d_model, offset, the table's values and its type", "[identity]") {
  using posenc::learned;
  std::vector<float> t(6 * 4);
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = 0.1f * static_cast<float>(i);
  posenc::span<const float> const all(t.data(), 24);
  auto const base = learned<float>::copy_of(all, 6, 4, 1);
  check_same(base, learned<float>::copy_of(all, 6, 4, 1));
  check_same(base, learned<float>::view_of(all, 6, 4, 1));  // owned or borrowed: the same numbers
  check_differs(base, learned<float>::copy_of(all, 4, 6, 1), "rows");
  check_differs(base, learned<float>::copy_of(all, 6, 4, 2), "offset");
  check_differs(learned<float>::copy_of(all, 8, 3, 1), learned<float>::copy_of(all, 8, 3, 1).extended(5), "rows");
  std::vector<double> td(t.begin(), t.end());
  check_differs(base, learned<double>::copy_of(posenc::span<const double>(td.data(), 24), 6, 4, 1), "type");
  std::vector<float> t2 = t;
  t2[23] += 1e-6f;
  check_differs(base, learned<float>::copy_of(posenc::span<const float>(t2.data(), 24), 6, 4, 1), "table");
  // A borrowed table is hashed when asked: a change of the caller's buffer shows.
  auto const borrowed = learned<float>::view_of(posenc::span<const float>(t2.data(), 24), 6, 4, 1);
  auto const before = borrowed.identity();
  t2[0] = 5.f;
  CHECK(borrowed.identity() != before);
}

TEST_CASE("identity: rope covers layout, extents, base, every scaling and each of its parameters", "[identity]") {
  using posenc::rope;
  using posenc::rope_layout;
  using posenc::rope_options;
  using posenc::rope_scaling;
  index_t const D = 16;
  auto make = [&](rope_scaling s, rope_layout l = rope_layout::half_split) {
    rope_options o;
    o.scaling = std::move(s);
    return rope<float>(l, D, o);
  };
  rope<float> const plain(rope_layout::half_split, D);
  check_same(plain, rope<float>(rope_layout::half_split, D));
  check_differs(plain, rope<double>(rope_layout::half_split, D), "type");
  check_differs(plain, rope<float>(rope_layout::interleaved, D), "layout");
  check_differs(plain, rope<float>(rope_layout::half_split, D + 2), "head_dim");
  {
    rope_options o;
    o.rotary_dim = D - 4;
    check_differs(plain, rope<float>(rope_layout::half_split, D, o), "rotary_dim");
    o = {};
    o.base = 500000.0;
    check_differs(plain, rope<float>(rope_layout::half_split, D, o), "base");
    o = {};
    o.threads = 3;  // threads change no value
    check_same(plain, rope<float>(rope_layout::half_split, D, o));
  }
  check_differs(plain, make(rope_scaling::linear(4.0)), "scaling");
  check_differs(make(rope_scaling::linear(4.0)), make(rope_scaling::linear(2.0)), "factor");
  check_differs(make(rope_scaling::linear(4.0)), make(rope_scaling::dynamic_ntk(4.0, 64)), "scaling");

  auto const dyn = make(rope_scaling::dynamic_ntk(4.0, 64));
  check_same(dyn, make(rope_scaling::dynamic_ntk(4.0, 64)));
  check_differs(dyn, make(rope_scaling::dynamic_ntk(3.0, 64)), "factor");
  check_differs(dyn, make(rope_scaling::dynamic_ntk(4.0, 65)), "max_position_embeddings");

  rope_scaling const y = rope_scaling::yarn(4.0, 256);
  auto const yarn = make(y);
  auto yarn_with = [&](auto change) {
    rope_scaling s = y;
    change(s);
    return make(s);
  };
  check_same(yarn, make(y));
  check_differs(yarn, yarn_with([](rope_scaling& s) { s.factor = 8.0; }), "factor");
  check_differs(yarn, yarn_with([](rope_scaling& s) { s.original_max_position_embeddings = 512; }),
                "original_max_position_embeddings");
  check_differs(yarn, yarn_with([](rope_scaling& s) { s.beta_fast = 16.0; }), "beta_fast");
  check_differs(yarn, yarn_with([](rope_scaling& s) { s.beta_slow = 2.0; }), "beta_slow");
  check_differs(yarn, yarn_with([](rope_scaling& s) { s.truncate = false; }), "truncate");
  check_differs(yarn, yarn_with([](rope_scaling& s) { s.mscale = 0.5; }), "mscale");
  check_differs(yarn, yarn_with([](rope_scaling& s) { s.mscale_all_dim = 0.5; }), "mscale_all_dim");
  check_differs(yarn, yarn_with([](rope_scaling& s) { s.attention_factor = 1.25; }), "attention_factor");

  rope_scaling const l3 = rope_scaling::llama3(8.0, 1.0, 4.0, 128);
  auto const llama3 = make(l3);
  auto l3_with = [&](auto change) {
    rope_scaling s = l3;
    change(s);
    return make(s);
  };
  check_differs(llama3, l3_with([](rope_scaling& s) { s.factor = 4.0; }), "factor");
  check_differs(llama3, l3_with([](rope_scaling& s) { s.low_freq_factor = 2.0; }), "low_freq_factor");
  check_differs(llama3, l3_with([](rope_scaling& s) { s.high_freq_factor = 3.0; }), "high_freq_factor");
  check_differs(llama3, l3_with([](rope_scaling& s) { s.original_max_position_embeddings = 256; }),
                "original_max_position_embeddings");

  std::vector<double> sf(static_cast<std::size_t>(D / 2), 1.5), lf(sf.size(), 3.0);
  rope_scaling const lr = rope_scaling::longrope(sf, lf, 128, 1024);
  auto const longrope = make(lr);
  auto lr_with = [&](auto change) {
    rope_scaling s = lr;
    change(s);
    return make(s);
  };
  check_same(longrope, make(lr));
  check_differs(longrope, lr_with([](rope_scaling& s) { s.original_max_position_embeddings = 256; }),
                "original_max_position_embeddings");
  check_differs(longrope, lr_with([](rope_scaling& s) { s.max_position_embeddings = 2048; }),
                "max_position_embeddings");
  check_differs(lr_with([](rope_scaling& s) { s.with_factor(8.0); }),
                lr_with([](rope_scaling& s) { s.with_factor(4.0); }), "factor");
  check_differs(longrope, lr_with([](rope_scaling& s) { s.attention_factor = 1.1; }), "attention_factor");
  check_differs(longrope, lr_with([](rope_scaling& s) { s.short_factor.back() = 1.5000001; }), "short_factor");
  check_differs(longrope, lr_with([](rope_scaling& s) { s.long_factor.front() = 3.0000001; }), "long_factor");
}

TEST_CASE("identity: rope::reserve and set_threads leave it unchanged; caller caches by their values",
          "[identity]") {
  using posenc::rope;
  index_t const D = 8;
  rope<float> r(posenc::rope_layout::interleaved, D, posenc::rope_options{});
  posenc::encoder_identity const before = r.identity();
  r.reserve(64);
  r.set_threads(2);
  CHECK(r.identity() == before);
  CHECK(posenc::rotation_identity_of(r) == before);
  r.reserve(128, 256);
  CHECK(r.identity() == before);

  std::vector<float> c(static_cast<std::size_t>(10 * D / 2), 0.5f), s(c.size(), 0.25f);
  auto const cache = posenc::rope_cache<float>::by_position(c.data(), s.data(), 10, D / 2);
  posenc::encoder_identity const a = r.identity(cache);
  CHECK(a == r.identity(cache));
  CHECK(a != r.identity());
  c[17] = 0.5000001f;
  posenc::encoder_identity const b = r.identity(cache);
  CHECK(a.digest() != b.digest());
  CHECK(b.text().find("cos") != std::string::npos);
  c[17] = 0.5f;
  s[0] = -0.25f;
  CHECK(r.identity(cache).digest() != a.digest());
  s[0] = 0.25f;
  CHECK(r.identity(cache) == a);
  auto const per_token = posenc::rope_cache<float>::per_token(c.data(), s.data(), 2, 5, D / 2);
  CHECK(r.identity(per_token) != a);
  REQUIRE_THROWS_WITH(r.identity(posenc::rope_cache<float>::by_position(c.data(), s.data(), 10, D)),
                      posenc_test::contains("posenc::rope::identity: cache.width is 8, expected 4"));
}

TEST_CASE("identity: alibi covers form, heads, key length and the slopes", "[identity]") {
  using posenc::alibi;
  using posenc::alibi_form;
  alibi<float> const base(alibi_form::paper, 8);
  check_same(base, alibi<float>(alibi_form::paper, 8));
  check_differs(base, alibi<double>(alibi_form::paper, 8), "type");
  check_differs(base, alibi<float>(alibi_form::symmetric, 8), "form");
  check_differs(base, alibi<float>(alibi_form::paper, 4), "heads");
  check_differs(alibi<float>(alibi_form::shifted, 8, 10), alibi<float>(alibi_form::shifted, 8, 11), "key_length");
  check_differs(base, alibi<float>(alibi_form::paper, 8, posenc::head_shard{0, 16}), "slopes");
  check_differs(alibi<float>(alibi_form::paper, 4, posenc::head_shard{0, 8}),
                alibi<float>(alibi_form::paper, 4, posenc::head_shard{4, 8}), "slopes");
  std::vector<float> sl(8);
  for (std::size_t h = 0; h < sl.size(); ++h) sl[h] = base.slope(static_cast<index_t>(h));
  check_same(base, alibi<float>(alibi_form::paper, 8, posenc::span<const float>(sl.data(), 8)));
  sl[7] *= 1.0000001f;
  check_differs(base, alibi<float>(alibi_form::paper, 8, posenc::span<const float>(sl.data(), 8)), "slopes");
}

TEST_CASE("identity: T5 and clipped bias cover their parameters and every table entry", "[identity]") {
  using posenc::t5_bias;
  using posenc::t5_bias_params;
  t5_bias_params const p{4, true, 32, 128};
  auto const tab = table<float>(32, 4);
  t5_bias<float> const base(p, tab);
  check_same(base, t5_bias<float>(p, tab));
  check_differs(base, t5_bias<double>(p, table<double>(32, 4)), "type");
  check_differs(base, t5_bias<Eigen::half>::rounded_from(base), "type");
  check_differs(base, t5_bias<float>(t5_bias_params{4, false, 32, 128}, tab), "bidirectional");
  check_differs(base, t5_bias<float>(t5_bias_params{4, true, 32, 256}, tab), "max_distance");
  check_differs(base, t5_bias<float>(t5_bias_params{2, true, 64, 128}, table<float>(64, 2)), "heads");
  check_differs(t5_bias<float>(t5_bias_params{2, true, 32, 128}, table<float>(32, 2)),
                t5_bias<float>(t5_bias_params{2, true, 64, 128}, table<float>(64, 2)), "num_buckets");
  // Only the last head's largest-distance bucket differs.
  auto t2 = tab;
  t2(31, 3) += 1.f;
  check_differs(base, t5_bias<float>(p, t2), "table");

  using posenc::clipped_bias;
  auto const ct = table<float>(9, 4);
  clipped_bias<float> const cb(4, 4, ct);
  check_same(cb, clipped_bias<float>(4, 4, ct));
  check_differs(cb, clipped_bias<double>(4, 4, table<double>(9, 4)), "type");
  check_differs(cb, clipped_bias<float>(3, 4, table<float>(7, 4)), "max_distance");
  check_differs(cb, clipped_bias<float>(4, 3, table<float>(9, 3)), "heads");
  auto ct2 = ct;
  ct2(0, 3) = -ct2(0, 3);
  check_differs(cb, clipped_bias<float>(4, 4, ct2), "table");
}

TEST_CASE("identity: Shaw covers its extents, terms and both tables", "[identity]") {
  using posenc::shaw;
  auto const ak = table<float>(7, 8), av = table<float>(7, 8, 0.02);
  shaw<float> const base(3, ak, av);
  check_same(base, shaw<float>(3, ak, av));
  check_differs(base, shaw<double>(3, table<double>(7, 8), table<double>(7, 8, 0.02)), "type");
  check_differs(base, shaw<float>(2, table<float>(5, 8), table<float>(5, 8, 0.02)), "max_distance");
  check_differs(base, shaw<float>(3, table<float>(7, 6), table<float>(7, 6, 0.02)), "head_dim");
  check_differs(base, shaw<float>(3, ak), "terms");
  auto ak2 = ak;
  ak2(6, 7) += 0.5f;
  check_differs(base, shaw<float>(3, ak2, av), "key_table");
  auto av2 = av;
  av2(0, 0) += 0.5f;
  check_differs(base, shaw<float>(3, ak, av2), "value_table");
}

TEST_CASE("identity: Transformer-XL covers its extents, memory, u, v and W_R", "[identity]") {
  using posenc::transformer_xl;
  index_t const H = 2, d = 4, P = 6, K = 5;
  auto const u = table<float>(H, d), v = table<float>(H, d, 0.03), w = table<float>(H * d, P, 0.001);
  transformer_xl<float> const base(K, u, v, w);
  check_same(base, transformer_xl<float>(K, u, v, w));
  check_differs(base, transformer_xl<double>(K, table<double>(H, d), table<double>(H, d, 0.03),
                                             table<double>(H * d, P, 0.001)),
                "type");
  check_differs(base, transformer_xl<float>(K + 1, u, v, w), "distance_limit");
  check_differs(base, transformer_xl<float>(K, u, v, w, 16), "memory_length");
  check_differs(base, transformer_xl<float>(K, table<float>(H + 1, d), table<float>(H + 1, d, 0.03),
                                            table<float>((H + 1) * d, P, 0.001)),
                "heads");
  check_differs(base, transformer_xl<float>(K, table<float>(H, d + 2), table<float>(H, d + 2, 0.03),
                                            table<float>(H * (d + 2), P, 0.001)),
                "head_dim");
  check_differs(base, transformer_xl<float>(K, u, v, table<float>(H * d, P + 2, 0.001)), "pos_dim");
  auto u2 = u, v2 = v, w2 = w;
  u2(1, 3) += 1.f;
  v2(0, 0) += 1.f;
  w2(H * d - 1, P - 1) += 1.f;
  check_differs(base, transformer_xl<float>(K, u2, v, w), "u");
  check_differs(base, transformer_xl<float>(K, u, v2, w), "v");
  check_differs(base, transformer_xl<float>(K, u, v, w2), "w_r");
}

TEST_CASE("identity: Transformer-XL from R by distance covers its form, extents, memory, u, v and R", "[identity]") {
  using posenc::transformer_xl;
  index_t const H = 2, d = 4, P = 6, K = 5;
  auto const u = table<float>(H, d), v = table<float>(H, d, 0.03), r = table<float>(2 * K + 1, H * d, 0.001);
  auto const base = transformer_xl<float>::from_distances(K, u, v, r);
  check_same(base, transformer_xl<float>::from_distances(K, u, v, r));
  CHECK(base.identity().text().find("form r") != std::string::npos);
  // The same R as a W_R encoder's table: same numbers, another form.
  transformer_xl<float> const by_w(K, u, v, table<float>(H * d, P, 0.001));
  posenc::relative_table<float> tab(2 * K + 1, H * d);
  for (index_t dist = -K; dist <= K; ++dist)
    for (index_t h = 0; h < H; ++h)
      for (index_t t = 0; t < d; ++t) tab(dist + K, h * d + t) = by_w.relative_key(h, dist, t);
  check_differs(by_w, transformer_xl<float>::from_distances(K, u, v, tab), "form");
  check_differs(base, transformer_xl<double>::from_distances(K, table<double>(H, d), table<double>(H, d, 0.03),
                                                             table<double>(2 * K + 1, H * d, 0.001)),
                "type");
  check_differs(base, transformer_xl<float>::from_distances(K + 1, u, v, table<float>(2 * K + 3, H * d, 0.001)),
                "distance_limit");
  check_differs(base, transformer_xl<float>::from_distances(K, u, v, r, 16), "memory_length");
  check_differs(base, transformer_xl<float>::from_distances(K, table<float>(H + 1, d), table<float>(H + 1, d, 0.03),
                                                            table<float>(2 * K + 1, (H + 1) * d, 0.001)),
                "heads");
  check_differs(base, transformer_xl<float>::from_distances(K, table<float>(H, d + 2), table<float>(H, d + 2, 0.03),
                                                            table<float>(2 * K + 1, H * (d + 2), 0.001)),
                "head_dim");
  auto u2 = u, v2 = v, r2 = r;
  u2(1, 3) += 1.f;
  v2(0, 0) += 1.f;
  r2(2 * K, H * d - 1) += 1.f;
  check_differs(base, transformer_xl<float>::from_distances(K, u2, v, r), "u");
  check_differs(base, transformer_xl<float>::from_distances(K, u, v2, r), "v");
  check_differs(base, transformer_xl<float>::from_distances(K, u, v, r2), "r");
  auto r3 = r;
  r3(0, 0) = -r3(0, 0);
  check_differs(base, transformer_xl<float>::from_distances(K, u, v, r3), "r");
}

TEST_CASE("identity: compose names every part; its rotation identity only the rotating ones", "[identity]") {
  using posenc::alibi;
  using posenc::alibi_form;
  using posenc::compose;
  using posenc::rope;
  using posenc::rope_layout;
  rope<float> const r(rope_layout::half_split, 8);
  alibi<float> const a(alibi_form::paper, 4);
  compose const c(r, a);
  check_same(c, compose(rope<float>(rope_layout::half_split, 8), alibi<float>(alibi_form::paper, 4)));
  CHECK(c.identity().text() == "compose(part0 " + r.identity().text() + ", part1 " + a.identity().text() + ")");
  compose const other_alibi(r, alibi<float>(alibi_form::symmetric, 4));
  check_differs(c, other_alibi, "form");
  compose const other_rope(rope<float>(rope_layout::interleaved, 8), a);
  check_differs(c, other_rope, "layout");

  // One rotating part: the rotation identity is that part's, whatever the biases.
  CHECK(c.rotation_identity() == r.identity());
  CHECK(posenc::rotation_identity_of(c) == r.identity());
  CHECK(other_alibi.rotation_identity() == c.rotation_identity());
  CHECK(compose(a, r).rotation_identity() == r.identity());
  CHECK(other_rope.rotation_identity() != c.rotation_identity());
  CHECK(other_rope.rotation_identity() == rope<float>(rope_layout::interleaved, 8).identity());

  // Two rotating parts: both, by index, and no other part.
  compose const two(r, a, rope<float>(rope_layout::interleaved, 8));
  std::string const t = two.rotation_identity().text();
  CHECK(t == "compose(part0 " + r.identity().text() + ", part2 " +
                 rope<float>(rope_layout::interleaved, 8).identity().text() + ")");
  CHECK(t.find("alibi") == std::string::npos);
  CHECK(compose(r, alibi<float>(alibi_form::symmetric, 4), rope<float>(rope_layout::interleaved, 8))
            .rotation_identity() == two.rotation_identity());
}

TEST_CASE("identity: an encoder without identity() is known by its type", "[identity]") {
  struct opaque {
    index_t max_positions() const noexcept { return 0; }
  };
  posenc::encoder_identity const id = posenc::identity_of(opaque{});
  CHECK(id.text().find("not compared") != std::string::npos);
  CHECK(id == posenc::identity_of(opaque{}));
  CHECK(id != posenc::identity_of(posenc::none{}));
}
}  // namespace encoding_identity_tests
