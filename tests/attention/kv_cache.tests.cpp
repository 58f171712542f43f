// SPDX-License-Identifier: MIT
// kv_cache<T>: appends keys and values, tracks positions, stores keys rotated when the encoder rotates.
#include <posenc/attention/attention.hpp>
#include <posenc/attention/kv_cache.hpp>
#include <posenc/encoding/none.hpp>
#include <posenc/encoding/rope.hpp>

#include <vector>

#include "support/catch.hpp"
#include "support/random.hpp"

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
