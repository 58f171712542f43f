// SPDX-License-Identifier: MIT
// kv_cache<T>: appends keys and values, tracks positions, stores keys rotated when the encoder rotates.
#include <posenc/attention/attention.hpp>
#include <posenc/attention/kv_cache.hpp>
#include <posenc/attention/paged_attention.hpp>
#include <posenc/attention/paged_kv_cache.hpp>
#include <posenc/encoding/alibi.hpp>
#include <posenc/encoding/compose.hpp>
#include <posenc/encoding/none.hpp>
#include <posenc/encoding/rope.hpp>

#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/error_of.hpp"
#include "support/random.hpp"

namespace attention_kv_cache_tests {

using posenc::index_t;

TEST_CASE("kv_cache: appended tokens are stored in order, across growth", "[kv_cache]") {
  index_t const B = 2, H = 3, D = 4, Dv = 5;
  posenc::kv_cache<float> cache(B, H, D, Dv, 7);
  CHECK(cache.length() == 0);
  CHECK(cache.next_position() == 7);
  std::vector<float> all_k, all_v;
  index_t total = 0;
  for (index_t n : {3, 1, 1, 6, 1}) {
    auto k = posenc_test::random_vector<float>(static_cast<std::size_t>(B * n * H * D), 10 + total);
    auto v = posenc_test::random_vector<float>(static_cast<std::size_t>(B * n * H * Dv), 20 + total);
    cache.append(posenc::make_bshd<const float>(k.data(), B, n, H, D),
                 posenc::make_bshd<const float>(v.data(), B, n, H, Dv), posenc::none{});
    // check every token of the cache against the inputs
    for (index_t b = 0; b < B; ++b)
      for (index_t s = 0; s < n; ++s)
        for (index_t h = 0; h < H; ++h) {
          for (index_t t = 0; t < D; ++t)
            CHECK(cache.keys()(b, total + s, h, t) == k[static_cast<std::size_t>(((b * n + s) * H + h) * D + t)]);
          for (index_t t = 0; t < Dv; ++t)
            CHECK(cache.values()(b, total + s, h, t) == v[static_cast<std::size_t>(((b * n + s) * H + h) * Dv + t)]);
        }
    total += n;
    CHECK(cache.length() == total);
  }
  // earlier tokens survive the reallocations
  CHECK(cache.keys().seq == total);
  CHECK(cache.next_position() == 7 + total);
  cache.clear();
  CHECK(cache.length() == 0);
}

TEST_CASE("kv_cache: storage is head-major, each kv head's tokens one after another, across growth", "[kv_cache]") {
  index_t const B = 2, H = 3, D = 4, Dv = 6;
  posenc::kv_cache<float> cache(B, H, D, Dv);
  std::vector<float> all_k;  // every appended key, (token, b, h, d) in append order
  index_t total = 0;
  for (index_t n : {1, 2, 5}) {
    auto k = posenc_test::random_vector<float>(static_cast<std::size_t>(B * n * H * D), 30 + total);
    auto v = posenc_test::random_vector<float>(static_cast<std::size_t>(B * n * H * Dv), 40 + total);
    cache.append(posenc::make_bshd<const float>(k.data(), B, n, H, D),
                 posenc::make_bshd<const float>(v.data(), B, n, H, Dv), posenc::none{});
    total += n;
    posenc::view<const float> const kv = cache.keys(), vv = cache.values();
    // Token after token of one head, heads of one sequence one after another.
    CHECK(kv.dim_stride == 1);
    CHECK(kv.seq_stride == D);
    CHECK(vv.seq_stride == Dv);
    CHECK(kv.head_stride >= total * D);
    CHECK(vv.head_stride >= total * Dv);
    CHECK(kv.batch_stride == H * kv.head_stride);
    CHECK(vv.batch_stride == H * vv.head_stride);
    // The last appended token of every (b, h) sits right after the one before it.
    for (index_t b = 0; b < B; ++b)
      for (index_t h = 0; h < H; ++h) {
        CHECK(kv.ptr(b, total - 1, h) == kv.ptr(b, 0, h) + (total - 1) * D);
        for (index_t t = 0; t < D; ++t)
          CHECK(kv(b, total - 1, h, t) == k[static_cast<std::size_t>(((b * n + n - 1) * H + h) * D + t)]);
      }
  }
}

TEST_CASE("kv_cache: keys are rotated at their positions on append", "[kv_cache]") {
  index_t const B = 1, H = 2, D = 8, n = 5;
  posenc::rope<double> rope(posenc::rope_layout::half_split, D);
  posenc::kv_cache<double> cache(B, H, D, 0, 3);
  auto k = posenc_test::random_vector<double>(static_cast<std::size_t>(B * n * H * D), 1);
  auto v = posenc_test::random_vector<double>(static_cast<std::size_t>(B * n * H * D), 2);
  cache.append(posenc::make_bshd<const double>(k.data(), B, 2, H, D),
               posenc::make_bshd<const double>(v.data(), B, 2, H, D), rope);
  cache.append(posenc::make_bshd<const double>(k.data() + 2 * H * D, B, 3, H, D),
               posenc::make_bshd<const double>(v.data() + 2 * H * D, B, 3, H, D), rope);
  auto expected = k;
  rope.rotate(posenc::make_bshd(expected.data(), B, n, H, D), posenc::position_span(3), 3 + n);
  for (index_t s = 0; s < n; ++s)
    for (index_t h = 0; h < H; ++h)
      for (index_t t = 0; t < D; ++t)
        CHECK(cache.keys()(0, s, h, t) == posenc_test::Approx(expected[static_cast<std::size_t>((s * H + h) * D + t)]).margin(1e-14));
  // values are not rotated
  CHECK(cache.values()(0, 4, 1, 3) == v[static_cast<std::size_t>((4 * H + 1) * D + 3)]);

  // attention over the cache with keys_rotated equals attention over raw keys
  auto q = posenc_test::random_vector<double>(static_cast<std::size_t>(2 * H * D), 3);
  std::vector<double> o1(q.size()), o2(q.size());
  posenc::attention_options<double> opt;
  opt.causal = true;
  opt.k_positions = posenc::position_span(3);
  posenc::attention<posenc::path::reference>(posenc::make_bshd<const double>(q.data(), 1, 2, H, D),
                                             posenc::make_bshd<const double>(k.data(), 1, n, H, D),
                                             posenc::make_bshd<const double>(v.data(), 1, n, H, D),
                                             posenc::make_bshd(o1.data(), 1, 2, H, D), rope, opt);
  opt.keys_rotated = true;
  posenc::attention<posenc::path::reference>(posenc::make_bshd<const double>(q.data(), 1, 2, H, D), cache.keys(),
                                             cache.values(), posenc::make_bshd(o2.data(), 1, 2, H, D), rope, opt);
  CHECK(posenc_test::max_abs_diff(o1, o2) < 1e-14);
}

namespace {

// RoPE variants that each differ from the first in one parameter of their rotation.
std::vector<posenc::rope<float>> rotations_differing_by_one(index_t D) {
  using posenc::rope_layout;
  using posenc::rope_options;
  using posenc::rope_scaling;
  std::vector<posenc::rope<float>> r;
  r.emplace_back(rope_layout::half_split, D);
  rope_options base;
  base.base = 500000.0;
  r.emplace_back(rope_layout::half_split, D, base);
  r.emplace_back(rope_layout::interleaved, D);
  rope_options partial;
  partial.rotary_dim = D / 2;
  r.emplace_back(rope_layout::half_split, D, partial);
  rope_options linear;
  linear.scaling = rope_scaling::linear(2.0);
  r.emplace_back(rope_layout::half_split, D, linear);
  rope_options linear3;
  linear3.scaling = rope_scaling::linear(3.0);
  r.emplace_back(rope_layout::half_split, D, linear3);
  rope_options yarn;
  yarn.scaling = rope_scaling::yarn(2.0, 64);
  r.emplace_back(rope_layout::half_split, D, yarn);
  return r;
}

}  // namespace

TEST_CASE("kv_cache: keys rotated one way are never appended to or attended with another rotation",
          "[kv_cache][identity]") {
  index_t const H = 2, D = 8, n = 3;
  auto const k = posenc_test::random_vector<float>(static_cast<std::size_t>(n * H * D), 31);
  auto const v = posenc_test::random_vector<float>(static_cast<std::size_t>(n * H * D), 32);
  auto const q = posenc_test::random_vector<float>(static_cast<std::size_t>(H * D), 33);
  auto const kv = [&](std::vector<float> const& x) { return posenc::make_bshd<const float>(x.data(), 1, n, H, D); };
  auto const rotations = rotations_differing_by_one(D);
  for (std::size_t first = 0; first < rotations.size(); ++first) {
    posenc::kv_cache<float> cache(1, H, D);
    cache.append(kv(k), kv(v), rotations[first]);
    CHECK(cache.key_rotation() == posenc::rotation_identity_of(rotations[first]));
    std::vector<float> out(q.size(), -7.0f);
    for (std::size_t other = 0; other < rotations.size(); ++other) {
      CAPTURE(first, other, rotations[first].identity().text(), rotations[other].identity().text());
      auto const append = posenc_test::error_of([&] { cache.append(kv(k), kv(v), rotations[other]); });
      auto const attend = posenc_test::error_of([&] {
        posenc::attention(posenc::make_bshd<const float>(q.data(), 1, 1, H, D), cache,
                          posenc::make_bshd(out.data(), 1, 1, H, D), rotations[other]);
      });
      if (other == first) {
        CHECK(append == "<no error>");
        CHECK(attend == "<no error>");
        cache.truncate(n);
      } else {
        CHECK_THAT(append, posenc_test::contains("the encoder rotates as " + rotations[other].identity().text() +
                                                ", expected " + rotations[first].identity().text()));
        CHECK_THAT(attend, posenc_test::contains("the encoder rotates as " + rotations[other].identity().text()));
        CHECK(cache.length() == n);
      }
    }
    // A rejected call wrote nothing; clear() lets another rotation fill the cache.
    cache.clear();
    cache.append(kv(k), kv(v), rotations[(first + 1) % rotations.size()]);
    CHECK(cache.key_rotation() == posenc::rotation_identity_of(rotations[(first + 1) % rotations.size()]));
  }
  // An equal encoder built separately is the same rotation.
  posenc::kv_cache<float> cache(1, H, D);
  cache.append(kv(k), kv(v), rotations_differing_by_one(D)[1]);
  std::vector<float> out(q.size());
  CHECK_NOTHROW(posenc::attention(posenc::make_bshd<const float>(q.data(), 1, 1, H, D), cache,
                                  posenc::make_bshd(out.data(), 1, 1, H, D), rotations[1]));
}

TEST_CASE("kv_cache: a composition is compared by its rotation, so its bias may change", "[kv_cache][identity]") {
  index_t const H = 2, D = 8, n = 4;
  auto const k = posenc_test::random_vector<float>(static_cast<std::size_t>(n * H * D), 41);
  auto const v = posenc_test::random_vector<float>(static_cast<std::size_t>(n * H * D), 42);
  auto const q = posenc_test::random_vector<float>(static_cast<std::size_t>(H * D), 43);
  auto const kv = [&](std::vector<float> const& x) { return posenc::make_bshd<const float>(x.data(), 1, n, H, D); };
  auto const rotations = rotations_differing_by_one(D);
  std::vector<float> const slopes_a{0.5f, 0.25f}, slopes_b{0.125f, 0.0625f};
  posenc::alibi<float> alibi_a(posenc::alibi_form::paper, H, posenc::span<const float>(slopes_a.data(), H));
  posenc::alibi<float> alibi_b(posenc::alibi_form::paper, H, posenc::span<const float>(slopes_b.data(), H));
  posenc::compose<posenc::rope<float>, posenc::alibi<float>> filled(rotations[0], alibi_a);
  posenc::compose<posenc::rope<float>, posenc::alibi<float>> other_bias(rotations[0], alibi_b);
  posenc::compose<posenc::rope<float>, posenc::alibi<float>> other_rotation(rotations[1], alibi_a);
  posenc::kv_cache<float> cache(1, H, D);
  cache.append(kv(k), kv(v), filled);
  std::vector<float> out(q.size()), expected(q.size());
  auto const qv = posenc::make_bshd<const float>(q.data(), 1, 1, H, D);
  posenc::attention(qv, cache, posenc::make_bshd(out.data(), 1, 1, H, D), other_bias);
  // The same call over the unrotated keys, rotated by the call.
  posenc::attention_options<float> opt;
  opt.q_positions = posenc::position_span(n - 1);
  posenc::attention(qv, kv(k), kv(v), posenc::make_bshd(expected.data(), 1, 1, H, D), other_bias, opt);
  CHECK(posenc_test::max_abs_diff(out, expected) < 1e-5);
  auto const e = posenc_test::error_of(
      [&] { posenc::attention(qv, cache, posenc::make_bshd(out.data(), 1, 1, H, D), other_rotation); });
  CHECK_THAT(e, posenc_test::contains("the encoder rotates as "));
  CHECK_THAT(e, posenc_test::contains("500000"));
}

TEST_CASE("paged_kv_cache: keys rotated one way are never appended to or attended with another rotation",
          "[paged_kv_cache][identity]") {
  index_t const H = 2, D = 8, n = 3;
  auto const k = posenc_test::random_vector<float>(static_cast<std::size_t>(n * H * D), 51);
  auto const v = posenc_test::random_vector<float>(static_cast<std::size_t>(n * H * D), 52);
  auto const q = posenc_test::random_vector<float>(static_cast<std::size_t>(H * D), 53);
  auto const kv = [&](std::vector<float> const& x) { return posenc::make_bshd<const float>(x.data(), 1, n, H, D); };
  auto const rotations = rotations_differing_by_one(D);
  posenc::paged_attention_workspace<float> ws;
  for (std::size_t first = 0; first < rotations.size(); ++first) {
    posenc::paged_kv_cache<float> cache(8, 4, H, D);
    index_t const a = cache.add_sequence(), b = cache.add_sequence(5);
    index_t const ida[] = {a}, idb[] = {b};
    cache.append(posenc::span<const index_t>(ida, 1), kv(k), kv(v), rotations[first]);
    CHECK(cache.key_rotation() == posenc::rotation_identity_of(rotations[first]));
    std::vector<float> out(q.size(), -7.0f);
    for (std::size_t other = 0; other < rotations.size(); ++other) {
      CAPTURE(first, other);
      // Another sequence of the same cache holds keys rotated by the first encoder.
      auto const append = posenc_test::error_of(
          [&] { cache.append(posenc::span<const index_t>(idb, 1), kv(k), kv(v), rotations[other]); });
      auto const attend = posenc_test::error_of([&] {
        posenc::attention(posenc::make_bshd<const float>(q.data(), 1, 1, H, D), cache,
                          posenc::span<const index_t>(ida, 1), posenc::make_bshd(out.data(), 1, 1, H, D),
                          rotations[other], posenc::attention_options<float>{}, ws);
      });
      if (other == first) {
        CHECK(append == "<no error>");
        CHECK(attend == "<no error>");
      } else {
        CHECK_THAT(append, posenc_test::contains("the encoder rotates as " + rotations[other].identity().text() +
                                                ", expected " + rotations[first].identity().text()));
        CHECK_THAT(attend, posenc_test::contains("the encoder rotates as " + rotations[other].identity().text()));
        CHECK(cache.length(b) == (other > first ? n : 0));
      }
    }
  }
}
}  // namespace attention_kv_cache_tests
