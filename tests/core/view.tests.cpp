// SPDX-License-Identifier: MIT
// Strided views: BSHD/BHSD/BSD layouts, custom strides, const conversion, check_view messages.
#include <posenc/core/view.hpp>

#include <string>
#include <type_traits>
#include <vector>

#include "support/catch.hpp"
#include "support/error_of.hpp"

namespace core_view_tests {

using posenc::index_t;

namespace {

using posenc_test::error_of;

/// The message of the posenc::error thrown by f, or "<no error>".

/// Sum of a view's elements through the const overload (tests the implicit conversion).
double sum_const(posenc::view<const float> v) {
  double s = 0;
  for (index_t b = 0; b < v.batch; ++b)
    for (index_t i = 0; i < v.seq; ++i)
      for (index_t h = 0; h < v.heads; ++h)
        for (index_t d = 0; d < v.dim; ++d) s += v(b, i, h, d);
  return s;
}

}  // namespace

TEST_CASE("view: make_bshd addresses (batch, seq, head, dim) row-major", "[view]") {
  index_t const B = 2, S = 3, H = 4, D = 5;
  std::vector<float> buf(static_cast<std::size_t>(B * S * H * D));
  for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<float>(i);
  auto v = posenc::make_bshd(buf.data(), B, S, H, D);
  CHECK(v.batch == B);
  CHECK(v.seq == S);
  CHECK(v.heads == H);
  CHECK(v.dim == D);
  CHECK(v.batch_stride == S * H * D);
  CHECK(v.seq_stride == H * D);
  CHECK(v.head_stride == D);
  CHECK(v.dim_stride == 1);
  CHECK(v.size() == B * S * H * D);
  CHECK_FALSE(v.empty());
  for (index_t b = 0; b < B; ++b)
    for (index_t s = 0; s < S; ++s)
      for (index_t h = 0; h < H; ++h) {
        CHECK(v.ptr(b, s, h) == buf.data() + ((b * S + s) * H + h) * D);
        for (index_t d = 0; d < D; ++d) CHECK(v(b, s, h, d) == static_cast<float>(((b * S + s) * H + h) * D + d));
      }
}

TEST_CASE("view: make_bhsd addresses (batch, head, seq, dim) in logical order", "[view]") {
  index_t const B = 2, S = 3, H = 4, D = 5;
  std::vector<double> buf(static_cast<std::size_t>(B * H * S * D));
  for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<double>(i);
  auto v = posenc::make_bhsd(buf.data(), B, H, S, D);
  CHECK(v.seq == S);
  CHECK(v.heads == H);
  CHECK(v.batch_stride == H * S * D);
  CHECK(v.seq_stride == D);
  CHECK(v.head_stride == S * D);
  for (index_t b = 0; b < B; ++b)
    for (index_t s = 0; s < S; ++s)
      for (index_t h = 0; h < H; ++h)
        for (index_t d = 0; d < D; ++d) CHECK(v(b, s, h, d) == static_cast<double>(((b * H + h) * S + s) * D + d));
}

TEST_CASE("view: a BSHD and a BHSD copy of one tensor read the same logical elements", "[view]") {
  index_t const B = 3, S = 5, H = 2, D = 7;
  std::vector<float> bshd(static_cast<std::size_t>(B * S * H * D)), bhsd(bshd.size());
  for (index_t b = 0; b < B; ++b)
    for (index_t s = 0; s < S; ++s)
      for (index_t h = 0; h < H; ++h)
        for (index_t d = 0; d < D; ++d) {
          float x = static_cast<float>(1000 * b + 100 * s + 10 * h + d);
          bshd[static_cast<std::size_t>(((b * S + s) * H + h) * D + d)] = x;
          bhsd[static_cast<std::size_t>(((b * H + h) * S + s) * D + d)] = x;
        }
  auto x = posenc::make_bshd(bshd.data(), B, S, H, D);
  auto y = posenc::make_bhsd(bhsd.data(), B, H, S, D);
  int mismatches = 0;
  for (index_t b = 0; b < B; ++b)
    for (index_t s = 0; s < S; ++s)
      for (index_t h = 0; h < H; ++h)
        for (index_t d = 0; d < D; ++d) mismatches += x(b, s, h, d) != y(b, s, h, d);
  CHECK(mismatches == 0);
  CHECK(sum_const(x) == sum_const(y));
}

TEST_CASE("view: custom strides select a slice of a packed QKV buffer", "[view]") {
  // Packed (batch, seq, 3, heads, dim): q, k, v interleaved per token. The k view
  // starts at slot 1 and steps over the whole token.
  index_t const B = 2, S = 4, H = 3, D = 8;
  std::vector<float> qkv(static_cast<std::size_t>(B * S * 3 * H * D));
  for (std::size_t i = 0; i < qkv.size(); ++i) qkv[i] = static_cast<float>(i);
  posenc::view<float> k{qkv.data() + H * D, B, S, H, D, S * 3 * H * D, 3 * H * D, D, 1};
  for (index_t b = 0; b < B; ++b)
    for (index_t s = 0; s < S; ++s)
      for (index_t h = 0; h < H; ++h)
        for (index_t d = 0; d < D; ++d)
          CHECK(k(b, s, h, d) == static_cast<float>((((b * S + s) * 3 + 1) * H + h) * D + d));
  // Writes go through to the buffer and nowhere else.
  std::vector<float> before = qkv;
  k(1, 2, 0, 5) = -1.0f;
  index_t const at = (((1 * S + 2) * 3 + 1) * H + 0) * D + 5;
  for (std::size_t i = 0; i < qkv.size(); ++i)
    CHECK(qkv[i] == (static_cast<index_t>(i) == at ? -1.0f : before[i]));
  posenc::detail::check_view("posenc::test", "k", k);  // any strides are fine with dim contiguous
}

TEST_CASE("view: views convert to const, never back", "[view]") {
  static_assert(std::is_convertible_v<posenc::view<float>, posenc::view<const float>>);
  static_assert(!std::is_convertible_v<posenc::view<const float>, posenc::view<float>>);
  static_assert(std::is_convertible_v<posenc::token_view<double>, posenc::token_view<const double>>);
  static_assert(!std::is_convertible_v<posenc::token_view<const double>, posenc::token_view<double>>);
  static_assert(!std::is_convertible_v<posenc::view<float>, posenc::view<const double>>);

  std::vector<float> buf(2 * 3 * 4 * 5);
  for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<float>(i % 7);
  auto v = posenc::make_bhsd(buf.data(), 2, 4, 3, 5);
  posenc::view<const float> c = v;
  CHECK(c.data == v.data);
  CHECK(c.batch == v.batch);
  CHECK(c.seq == v.seq);
  CHECK(c.heads == v.heads);
  CHECK(c.dim == v.dim);
  CHECK(c.batch_stride == v.batch_stride);
  CHECK(c.seq_stride == v.seq_stride);
  CHECK(c.head_stride == v.head_stride);
  CHECK(c.dim_stride == v.dim_stride);
  double expected = 0;
  for (float x : buf) expected += x;
  CHECK(sum_const(v) == expected);

  auto t = posenc::make_bsd(buf.data(), 2, 6, 10);
  posenc::token_view<const float> tc = t;
  CHECK(tc.data == t.data);
  CHECK(tc.seq_stride == t.seq_stride);
  CHECK(tc.batch_stride == t.batch_stride);
  CHECK(&tc(1, 2, 3) == &t(1, 2, 3));
}

TEST_CASE("view: make_bsd addresses (batch, seq, dim)", "[view]") {
  index_t const B = 2, S = 3, D = 4;
  std::vector<int> buf(static_cast<std::size_t>(B * S * D));
  for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<int>(i);
  auto t = posenc::make_bsd(buf.data(), B, S, D);
  CHECK(t.size() == B * S * D);
  CHECK(t.ptr(1, 2) == buf.data() + (1 * S + 2) * D);
  for (index_t b = 0; b < B; ++b)
    for (index_t s = 0; s < S; ++s)
      for (index_t d = 0; d < D; ++d) CHECK(t(b, s, d) == static_cast<int>((b * S + s) * D + d));
}

TEST_CASE("view: empty views", "[view]") {
  posenc::view<float> v;
  CHECK(v.empty());
  CHECK(v.size() == 0);
  std::vector<float> buf(12);
  CHECK(posenc::make_bshd(buf.data(), 0, 3, 2, 2).empty());
  CHECK(posenc::make_bshd(buf.data(), 1, 0, 2, 2).empty());
  CHECK(posenc::make_bsd(buf.data(), 1, 3, 0).empty());
  // A null empty view is valid; so is a null view with zero-size dims.
  CHECK(error_of([&] { posenc::detail::check_view("posenc::f", "q", v); }) == "<no error>");
  CHECK(error_of([&] { posenc::detail::check_view("posenc::f", "x", posenc::token_view<float>{}); }) ==
        "<no error>");
}

TEST_CASE("view: check_view names the function, the argument, its value and the expectation", "[view]") {
  std::vector<float> buf(64);
  auto good = posenc::make_bshd(buf.data(), 2, 2, 2, 4);
  CHECK(error_of([&] { posenc::detail::check_view("posenc::attention", "q", good); }) == "<no error>");

  auto v = good;
  v.batch = -1;
  CHECK(error_of([&] { posenc::detail::check_view("posenc::attention", "q", v); }) ==
        "posenc::attention: q.batch is -1, expected >= 0");
  v = good;
  v.seq = -3;
  CHECK(error_of([&] { posenc::detail::check_view("posenc::attention", "k", v); }) ==
        "posenc::attention: k.seq is -3, expected >= 0");
  v = good;
  v.heads = -2;
  CHECK(error_of([&] { posenc::detail::check_view("posenc::attention", "v", v); }) ==
        "posenc::attention: v.heads is -2, expected >= 0");
  v = good;
  v.dim = -4;
  CHECK(error_of([&] { posenc::detail::check_view("posenc::rope::rotate", "x", v); }) ==
        "posenc::rope::rotate: x.dim is -4, expected >= 0");
  v = good;
  v.dim_stride = 2;
  CHECK(error_of([&] { posenc::detail::check_view("posenc::attention", "out", v); }) ==
        "posenc::attention: out.dim_stride is 2, expected 1 (the last dim must be contiguous)");
  v.dim = 1;  // a single element per row has no stride to speak of
  CHECK(error_of([&] { posenc::detail::check_view("posenc::attention", "out", v); }) == "<no error>");
  v = good;
  v.data = nullptr;
  CHECK(error_of([&] { posenc::detail::check_view("posenc::attention", "q", v); }) ==
        "posenc::attention: q.data is null, expected a buffer of 32 elements");

  posenc::token_view<float> t = posenc::make_bsd(buf.data(), 2, 4, 8);
  CHECK(error_of([&] { posenc::detail::check_view("posenc::sinusoidal::add_to", "x", t); }) == "<no error>");
  t.seq = -1;
  CHECK(error_of([&] { posenc::detail::check_view("posenc::sinusoidal::add_to", "x", t); }) ==
        "posenc::sinusoidal::add_to: x.seq is -1, expected >= 0");
  t = posenc::make_bsd(buf.data(), 2, 4, 8);
  t.dim_stride = 3;
  CHECK(error_of([&] { posenc::detail::check_view("posenc::sinusoidal::add_to", "x", t); }) ==
        "posenc::sinusoidal::add_to: x.dim_stride is 3, expected 1 (the last dim must be contiguous)");
  t = posenc::make_bsd(static_cast<float*>(nullptr), 1, 2, 3);
  CHECK(error_of([&] { posenc::detail::check_view("posenc::learned::add_to", "x", t); }) ==
        "posenc::learned::add_to: x.data is null, expected a buffer of 6 elements");

  // Const views are checked alike.
  posenc::view<const float> c = good;
  c.dim_stride = 0;
  CHECK(error_of([&] { posenc::detail::check_view("posenc::attention", "k", c); }) ==
        "posenc::attention: k.dim_stride is 0, expected 1 (the last dim must be contiguous)");
}

TEST_CASE("view: check_equal names both sides", "[view]") {
  CHECK(error_of([] { posenc::detail::check_equal("posenc::attention", "k.seq", 9, 9, "v.seq"); }) ==
        "<no error>");
  CHECK(error_of([] { posenc::detail::check_equal("posenc::attention", "k.seq", 7, 9, "v.seq"); }) ==
        "posenc::attention: k.seq is 7, expected 9 (v.seq)");
}
}  // namespace core_view_tests
