// SPDX-License-Identifier: MIT
// Additive masks stored in 16 bits: exactly the float mask of the widened values, on every path and tensor type.
#include <posenc/attention/attention.hpp>
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

/// out of `attention<P>` with the 16-bit mask and with the float mask of its
/// widened values (same problem, same encoder): the number of elements whose
/// bits differ, plus any NaN; for tensors of element type X (float or S).
template <class P, class X, class S, class E>
std::size_t mask_mismatches(shape ms, E const& enc, bool causal) {
  std::vector<S> const m16 = random_mask<S>(ms, 31 + static_cast<std::uint64_t>(ms.batch * 8 + ms.heads * 4 + ms.q));
  std::vector<float> m32(m16.size());
  for (std::size_t i = 0; i < m16.size(); ++i) m32[i] = widen(m16[i]);
  auto to_x = [](std::vector<float> const& f) {
    std::vector<X> x(f.size());
    for (std::size_t i = 0; i < f.size(); ++i) x[i] = posenc::detail::to_storage<X>(f[i]);
    return x;
  };
  auto const qx = to_x(posenc_test::random_vector<float>(static_cast<std::size_t>(B * Sq * H * D), 1));
  auto const kx = to_x(posenc_test::random_vector<float>(static_cast<std::size_t>(B * Sk * H * D), 2));
  auto const vx = to_x(posenc_test::random_vector<float>(static_cast<std::size_t>(B * Sk * H * D), 3));
  auto q = posenc::make_bshd(qx.data(), B, Sq, H, D);
  auto k = posenc::make_bshd(kx.data(), B, Sk, H, D);
  auto v = posenc::make_bshd(vx.data(), B, Sk, H, D);
  std::vector<X> o16(qx.size()), o32(qx.size());
  std::vector<float> l16(static_cast<std::size_t>(B * H * Sq)), l32(l16.size());
  posenc::attention_options<float> opt;
  opt.causal = causal;
  opt.threads = 1;
  opt.lse = l16.data();
  posenc::attention<P>(q, k, v, posenc::make_bshd(o16.data(), B, Sq, H, D), enc, opt,
                       posenc::make_mask(m16.data(), ms.batch, ms.heads, ms.q, ms.k));
  opt.lse = l32.data();
  opt.mask = posenc::make_mask(static_cast<float const*>(m32.data()), ms.batch, ms.heads, ms.q, ms.k);
  posenc::attention<P>(q, k, v, posenc::make_bshd(o32.data(), B, Sq, H, D), enc, opt);
  std::size_t bad = 0;
  for (std::size_t i = 0; i < o16.size(); ++i) {
    float const a = widen(o16[i]), b = widen(o32[i]);
    bad += std::memcmp(&o16[i], &o32[i], sizeof(X)) != 0 || std::isnan(a) || std::isnan(b) ? 1 : 0;
  }
  for (std::size_t i = 0; i < l16.size(); ++i) bad += std::memcmp(&l16[i], &l32[i], sizeof(float)) != 0 ? 1 : 0;
  return bad;
}

template <class P, class X, class S>
void check_shapes() {
  posenc::alibi<float> const enc(posenc::alibi_form::paper, H);
  for (shape ms : {shape{1, 1, 1, Sk}, shape{B, 1, Sq, Sk}, shape{1, H, 1, Sk}, shape{B, H, Sq, Sk},
                   shape{1, 1, Sq, Sk - 4}}) {  // the last: a short key extent masks the keys past it
    CAPTURE(ms.batch, ms.heads, ms.q, ms.k);
    CHECK(mask_mismatches<P, X, S>(ms, posenc::none{}, false) == 0);
    CHECK(mask_mismatches<P, X, S>(ms, enc, true) == 0);
  }
}

}  // namespace

TEMPLATE_TEST_CASE("16-bit mask: exactly the float mask of the widened values, broadcast shapes, every path",
                   "[mask][half]", Eigen::half, Eigen::bfloat16) {
  using S = TestType;
  SECTION("float tensors") {
    check_shapes<posenc::path::fused, float, S>();
    check_shapes<posenc::path::reference, float, S>();
    check_shapes<posenc::path::materialized, float, S>();
  }
  SECTION("16-bit K and V, and all-16-bit tensors") {
    check_shapes<posenc::path::fused, S, S>();
    check_shapes<posenc::path::reference, S, S>();
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
    opt.lse = lse.data();
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
  opt.lse = lse.data();
  CHECK_THROWS_WITH(posenc::attention(q, q, q, posenc::make_bshd(out.data(), B, Sq, H, D), posenc::none{}, opt,
                                      posenc::make_mask(reinterpret_cast<Eigen::half const*>(lse.data()), 1, 1, Sq, Sq)),
                    posenc_test::contains("overlaps mask (16-bit)"));
  std::size_t touched = 0;
  for (float o : out) touched += o != 7.0f ? 1 : 0;
  CHECK(touched == 0);
}
