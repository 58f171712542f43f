// SPDX-License-Identifier: MIT
// t5_bias, clipped_bias and shaw with 16-bit tables: rounded once, then exactly the float encoder of the widened table
// (forward, attention_backward and multi_head_attention).
#include <posenc/attention/attention.hpp>
#include <posenc/attention/backward.hpp>
#include <posenc/attention/multi_head.hpp>
#include <posenc/core/half.hpp>
#include <posenc/encoding/clipped_bias.hpp>
#include <posenc/encoding/shaw.hpp>
#include <posenc/encoding/t5_bias.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "support/catch.hpp"
#include "support/encoder_runs.hpp"
#include "support/random.hpp"
#include "support/strided_buffer.hpp"

using posenc::index_t;
using posenc::relative_table;

namespace {

using posenc_test::bits;
using posenc_test::widen;
using posenc_test::bias_row_mismatches;

/// True when h is the 16-bit value nearest to x (ties to the even encoding),
/// by comparing with both neighbours of h.
template <class S>
bool is_nearest(S h, float x) {
  std::uint16_t const b = bits(h);
  double const e = std::abs(double(widen(h)) - double(x));
  for (int delta : {-1, 1}) {
    S const c = Eigen::numext::bit_cast<S>(static_cast<std::uint16_t>(b + delta));
    double const ec = std::abs(double(widen(c)) - double(x));
    if (ec < e || (ec == e && (b & 1u) != 0)) return false;
  }
  return true;
}

/// A (rows, cols) float table with values of every magnitude a 16-bit type rounds.
relative_table<float> random_table(index_t rows, index_t cols, std::uint64_t seed) {
  std::vector<float> const v = posenc_test::random_vector<float>(static_cast<std::size_t>(rows * cols), seed, -3.0, 3.0);
  relative_table<float> t(rows, cols);
  for (index_t r = 0; r < rows; ++r)
    for (index_t c = 0; c < cols; ++c) t(r, c) = v[static_cast<std::size_t>(r * cols + c)] * 1.0e-3f * float(1 + r);
  return t;
}

/// Attention outputs of two encoders on one random problem (causal), with
/// float tensors, 16-bit K/V and all-16-bit tensors, on path P: the number
/// of output elements whose bits differ.
template <class P, class S, class E1, class E2>
std::size_t attention_mismatches(E1 const& e1, E2 const& e2, index_t heads, index_t d) {
  index_t const B = 2, Sq = 19, Sk = 19;
  auto const qv = posenc_test::random_vector<float>(static_cast<std::size_t>(B * Sq * heads * d), 1);
  auto const kv = posenc_test::random_vector<float>(static_cast<std::size_t>(B * Sk * heads * d), 2);
  auto const vv = posenc_test::random_vector<float>(static_cast<std::size_t>(B * Sk * heads * d), 3);
  std::vector<S> qh(qv.size()), kh(kv.size()), vh(vv.size());
  for (std::size_t i = 0; i < qv.size(); ++i) qh[i] = posenc::detail::to_storage<S>(qv[i]);
  for (std::size_t i = 0; i < kv.size(); ++i) kh[i] = posenc::detail::to_storage<S>(kv[i]);
  for (std::size_t i = 0; i < vv.size(); ++i) vh[i] = posenc::detail::to_storage<S>(vv[i]);
  posenc::attention_options<float> opt;
  opt.causal = true;
  opt.threads = 1;
  std::size_t bad = 0;
  auto q = posenc::make_bshd(qv.data(), B, Sq, heads, d);
  auto k = posenc::make_bshd(kv.data(), B, Sk, heads, d);
  auto v = posenc::make_bshd(vv.data(), B, Sk, heads, d);
  auto qs = posenc::make_bshd(qh.data(), B, Sq, heads, d);
  auto ks = posenc::make_bshd(kh.data(), B, Sk, heads, d);
  auto vs = posenc::make_bshd(vh.data(), B, Sk, heads, d);
  {  // float tensors
    std::vector<float> o1(qv.size()), o2(qv.size());
    posenc::attention<P>(q, k, v, posenc::make_bshd(o1.data(), B, Sq, heads, d), e1, opt);
    posenc::attention<P>(q, k, v, posenc::make_bshd(o2.data(), B, Sq, heads, d), e2, opt);
    for (std::size_t i = 0; i < o1.size(); ++i) bad += o1[i] != o2[i] || std::isnan(o1[i]) ? 1 : 0;
  }
  {  // 16-bit K and V
    std::vector<float> o1(qv.size()), o2(qv.size());
    posenc::attention<P>(q, ks, vs, posenc::make_bshd(o1.data(), B, Sq, heads, d), e1, opt);
    posenc::attention<P>(q, ks, vs, posenc::make_bshd(o2.data(), B, Sq, heads, d), e2, opt);
    for (std::size_t i = 0; i < o1.size(); ++i) bad += o1[i] != o2[i] || std::isnan(o1[i]) ? 1 : 0;
  }
  {  // all-16-bit
    std::vector<S> o1(qv.size()), o2(qv.size());
    posenc::attention<P>(qs, ks, vs, posenc::make_bshd(o1.data(), B, Sq, heads, d), e1, opt);
    posenc::attention<P>(qs, ks, vs, posenc::make_bshd(o2.data(), B, Sq, heads, d), e2, opt);
    for (std::size_t i = 0; i < o1.size(); ++i) bad += bits(o1[i]) != bits(o2[i]) ? 1 : 0;
  }
  return bad;
}

/// Elements whose bits differ between a and b, plus any NaN (a size
/// difference counts as one).
template <class A, class B>
std::size_t float_mismatches(A const& a, B const& b) {
  if (a.size() != b.size()) return 1;
  std::size_t bad = 0;
  for (std::size_t i = 0; i < static_cast<std::size_t>(a.size()); ++i)
    bad += a.data()[i] != b.data()[i] || std::isnan(a.data()[i]) ? 1 : 0;
  return bad;
}

template <class G, class = void>
struct has_table : std::false_type {};
template <class G>
struct has_table<G, std::void_t<decltype(std::declval<G const&>().table)>> : std::true_type {};

/// The table gradients of t5_bias and clipped_bias (`table`) or of shaw (`key`, `value`).
template <class G>
std::vector<relative_table<float>> table_gradients(G const& g) {
  if constexpr (has_table<G>::value) {
    return {g.table};
  } else {
    return {g.key, g.value};
  }
}

/// Table gradients of e1 (16-bit tables) and e2 (the float encoder of the
/// widened tables): mismatching elements, plus one when the first table's
/// gradient is all zero (nothing would have been checked).
template <class G1, class G2>
std::size_t table_mismatches(G1 const& g1, G2 const& g2) {
  std::vector<relative_table<float>> const t1 = table_gradients(g1), t2 = table_gradients(g2);
  std::size_t bad = t1.size() == t2.size() && t1[0].cwiseAbs().sum() > 0.0f ? 0 : 1;
  for (std::size_t i = 0; i < std::min(t1.size(), t2.size()); ++i) bad += float_mismatches(t1[i], t2[i]);
  return bad;
}

/// attention_backward<P> with e1 and with e2 on one float problem (causal,
/// one thread): the elements of dq, dk, dv and the table gradients whose
/// bits differ.
template <class P, class E1, class E2>
std::size_t backward_mismatches(E1 const& e1, E2 const& e2, index_t heads, index_t d) {
  index_t const B = 2, S = 19;
  std::size_t const n = static_cast<std::size_t>(B * S * heads * d);
  std::vector<float> q = posenc_test::random_vector<float>(n, 1), k = posenc_test::random_vector<float>(n, 2),
                     v = posenc_test::random_vector<float>(n, 3), dout = posenc_test::random_vector<float>(n, 4);
  std::vector<float> out(n), lse(static_cast<std::size_t>(B * heads * S));
  auto at = [&](std::vector<float>& x) { return posenc::make_bshd(x.data(), B, S, heads, d); };
  posenc::attention_options<float> opt;
  opt.causal = true;
  opt.threads = 1;
  opt.lse = lse;
  posenc::attention<P>(at(q), at(k), at(v), at(out), e2, opt);
  std::vector<float> dq1(n), dk1(n), dv1(n), dq2(n), dk2(n), dv2(n);
  auto g1 = posenc::make_gradients(e1);
  auto g2 = posenc::make_gradients(e2);
  posenc::attention_backward<P>(at(q), at(k), at(v), at(out), at(dout), at(dq1), at(dk1), at(dv1), e1, opt, g1);
  posenc::attention_backward<P>(at(q), at(k), at(v), at(out), at(dout), at(dq2), at(dk2), at(dv2), e2, opt, g2);
  return float_mismatches(dq1, dq2) + float_mismatches(dk1, dk2) + float_mismatches(dv1, dv2) +
         table_mismatches(g1, g2);
}

/// multi_head_attention<E1> and <E2> (same weights, model_dim = heads * d):
/// the elements of y (forward), dx and every weight, bias and table gradient
/// (backward) whose bits differ.
template <class E1, class E2>
std::size_t module_mismatches(E1 const& e1, E2 const& e2, index_t heads, index_t d) {
  index_t const B = 2, S = 13, m = heads * d;
  posenc::mha_config cfg;
  cfg.model_dim = m;
  cfg.q_heads = heads;
  posenc::multi_head_attention<E1> l1(cfg, e1);
  posenc::multi_head_attention<E2> l2(cfg, e2);
  std::vector<std::vector<float>> w;
  for (std::uint64_t i = 0; i < 4; ++i) w.push_back(posenc_test::random_vector<float>(static_cast<std::size_t>(m * m), 30 + i, -0.5, 0.5));
  l1.load(w[0].data(), w[1].data(), w[2].data(), w[3].data());
  l2.load(w[0].data(), w[1].data(), w[2].data(), w[3].data());
  std::size_t const n = static_cast<std::size_t>(B * S * m);
  std::vector<float> x = posenc_test::random_vector<float>(n, 40), dy = posenc_test::random_vector<float>(n, 41);
  std::vector<float> y1(n), y2(n), dx1(n), dx2(n);
  auto at = [&](std::vector<float>& t) { return posenc::make_bsd(t.data(), B, S, m); };
  posenc::attention_options<float> opt;
  opt.causal = true;
  opt.threads = 1;
  typename posenc::multi_head_attention<E1>::saved s1;
  typename posenc::multi_head_attention<E2>::saved s2;
  l1.forward(at(x), at(y1), opt, s1);
  l2.forward(at(x), at(y2), opt, s2);
  auto g1 = l1.make_gradients();
  auto g2 = l2.make_gradients();
  l1.backward(at(x), at(dy), at(dx1), s1, g1, opt);
  l2.backward(at(x), at(dy), at(dx2), s2, g2, opt);
  return float_mismatches(y1, y2) + float_mismatches(dx1, dx2) + float_mismatches(g1.w_q, g2.w_q) +
         float_mismatches(g1.w_k, g2.w_k) + float_mismatches(g1.w_v, g2.w_v) + float_mismatches(g1.w_o, g2.w_o) +
         float_mismatches(g1.b_q, g2.b_q) + float_mismatches(g1.b_o, g2.b_o) + table_mismatches(g1.encoder, g2.encoder);
}

/// backward_mismatches on the fused and reference paths, and module_mismatches.
template <class E1, class E2>
void check_gradients(E1 const& e1, E2 const& e2, index_t heads, index_t d) {
  CHECK(backward_mismatches<posenc::path::fused>(e1, e2, heads, d) == 0);
  CHECK(backward_mismatches<posenc::path::reference>(e1, e2, heads, d) == 0);
  CHECK(module_mismatches(e1, e2, heads, d) == 0);
}

}  // namespace

static_assert(std::is_same_v<posenc::t5_bias<Eigen::half>::compute_type, float>);
static_assert(std::is_same_v<posenc::shaw<Eigen::bfloat16>::compute_type, float>);
static_assert(posenc::keeps_encoder_contract_v<posenc::clipped_bias<Eigen::half>, float>);
static_assert(!posenc::keeps_encoder_contract_v<posenc::clipped_bias<Eigen::half>, double>);

TEMPLATE_TEST_CASE("t5_bias 16-bit: the table rounded once, then exactly the float encoder of the widened table",
                   "[t5][half]", Eigen::half, Eigen::bfloat16) {
  using S = TestType;
  index_t const heads = 3;
  posenc::t5_bias_params const p{heads, true, 32, 128};
  posenc::t5_bias<float> const f(p, random_table(32, heads, 5));
  auto const h = posenc::t5_bias<S>::rounded_from(f);
  relative_table<float> w(32, heads);
  std::size_t bad_round = 0;
  for (index_t b = 0; b < 32; ++b)
    for (index_t hd = 0; hd < heads; ++hd) {
      w(b, hd) = h.weight(b, hd);
      S const stored = posenc::detail::to_storage<S>(w(b, hd));
      bad_round += bits(stored) != bits(posenc::detail::to_storage<S>(f.weight(b, hd))) ||
                           !is_nearest(stored, f.weight(b, hd))
                       ? 1
                       : 0;
    }
  CHECK(bad_round == 0);
  posenc::t5_bias<float> const fw(p, w);  // the float encoder of the widened table
  CHECK(bias_row_mismatches(h, fw, heads, 11) == 0);
  CHECK(h.bias(1, 40, 3) == fw.bias(1, 40, 3));
  // Seeded: the float encoder's draws, each rounded once.
  posenc::t5_bias<S> const hs(p, 9);
  posenc::t5_bias<float> const fs(p, 9);
  std::size_t bad_seed = 0;
  for (index_t b = 0; b < 32; ++b)
    for (index_t hd = 0; hd < heads; ++hd)
      bad_seed += hs.weight(b, hd) != widen(posenc::detail::to_storage<S>(fs.weight(b, hd))) ? 1 : 0;
  CHECK(bad_seed == 0);
  // A 16-bit table given directly: its values as they are.
  relative_table<S> t16(32, heads);
  for (index_t b = 0; b < 32; ++b)
    for (index_t hd = 0; hd < heads; ++hd) t16(b, hd) = posenc::detail::to_storage<S>(w(b, hd));
  posenc::t5_bias<S> const hd16(p, t16);
  CHECK(bias_row_mismatches(hd16, fw, heads, 11) == 0);
  CHECK(attention_mismatches<posenc::path::fused, S>(h, fw, heads, 16) == 0);
  CHECK(attention_mismatches<posenc::path::reference, S>(h, fw, heads, 16) == 0);
  check_gradients(h, fw, heads, 16);
}

TEMPLATE_TEST_CASE("clipped_bias 16-bit: the table rounded once, then exactly the float encoder of the widened table",
                   "[clipped][half]", Eigen::half, Eigen::bfloat16) {
  using S = TestType;
  index_t const heads = 2;
  for (index_t K : {0, 3, 40}) {  // 40: a window longer than a SIMD batch, with a tail
    posenc::clipped_bias<float> const f(K, heads, random_table(2 * K + 1, heads, static_cast<std::uint64_t>(6 + K)));
    auto const h = posenc::clipped_bias<S>::rounded_from(f);
    relative_table<float> w(2 * K + 1, heads);
    std::size_t bad_round = 0;
    for (index_t r = 0; r <= 2 * K; ++r)
      for (index_t hd = 0; hd < heads; ++hd) {
        w(r, hd) = h.weight(r, hd);
        bad_round += !is_nearest(posenc::detail::to_storage<S>(w(r, hd)), f.weight(r, hd)) ? 1 : 0;
      }
    CHECK(bad_round == 0);
    posenc::clipped_bias<float> const fw(K, heads, w);
    CHECK(bias_row_mismatches(h, fw, heads, 11) == 0);
    posenc::clipped_bias<S> const hs(K, heads, 4);
    posenc::clipped_bias<float> const fs(K, heads, 4);
    std::size_t bad_seed = 0;
    for (index_t r = 0; r <= 2 * K; ++r)
      for (index_t hd = 0; hd < heads; ++hd)
        bad_seed += hs.weight(r, hd) != widen(posenc::detail::to_storage<S>(fs.weight(r, hd))) ? 1 : 0;
    CHECK(bad_seed == 0);
    CHECK(attention_mismatches<posenc::path::fused, S>(h, fw, heads, 16) == 0);
    CHECK(attention_mismatches<posenc::path::reference, S>(h, fw, heads, 16) == 0);
    check_gradients(h, fw, heads, 16);
  }
}

TEMPLATE_TEST_CASE("shaw 16-bit: the tables rounded once, then exactly the float encoder's key and value terms",
                   "[shaw][half]", Eigen::half, Eigen::bfloat16) {
  using S = TestType;
  for (index_t d : {8, 37}) {  // 37: SIMD batches and a tail
    index_t const K = 4, rows = 2 * K + 1;
    posenc::shaw<float> const f(K, random_table(rows, d, 7), random_table(rows, d, 8));
    auto const h = posenc::shaw<S>::rounded_from(f);
    relative_table<float> ak(rows, d), av(rows, d);
    std::size_t bad_round = 0;
    for (index_t r = 0; r < rows; ++r)
      for (index_t c = 0; c < d; ++c) {
        ak(r, c) = h.key_weight(r, c);
        av(r, c) = h.value_weight(r, c);
        bad_round += !is_nearest(posenc::detail::to_storage<S>(ak(r, c)), f.key_weight(r, c)) ? 1 : 0;
        bad_round += !is_nearest(posenc::detail::to_storage<S>(av(r, c)), f.value_weight(r, c)) ? 1 : 0;
      }
    CHECK(bad_round == 0);
    posenc::shaw<float> const fw(K, ak, av);
    std::size_t bad = 0;
    std::vector<float> const qrow = posenc_test::random_vector<float>(static_cast<std::size_t>(d), 21);
    for (index_t q : {0, 3, 30})
      for (index_t k0 : {0, 2, 25})
        for (index_t n : {1, 6, 20}) {
          std::vector<float> x = posenc_test::random_vector<float>(static_cast<std::size_t>(n), static_cast<std::uint64_t>(3 + n)), y = x;
          h.score_row(qrow.data(), q, k0, n, 0.375f, x.data());
          fw.score_row(qrow.data(), q, k0, n, 0.375f, y.data());
          for (std::size_t j = 0; j < x.size(); ++j) bad += x[j] != y[j] ? 1 : 0;
          std::vector<float> const pr = posenc_test::random_vector<float>(static_cast<std::size_t>(n), static_cast<std::uint64_t>(5 + n), 0.0);
          std::vector<float> a = posenc_test::random_vector<float>(static_cast<std::size_t>(d), 6), b = a;
          h.value_row(pr.data(), q, k0, n, a.data());
          fw.value_row(pr.data(), q, k0, n, b.data());
          for (std::size_t c = 0; c < a.size(); ++c) bad += a[c] != b[c] ? 1 : 0;
        }
    CHECK(bad == 0);
    posenc::shaw<S> const hs(K, d, posenc::shaw_terms::keys_and_values, 12);
    posenc::shaw<float> const fs(K, d, posenc::shaw_terms::keys_and_values, 12);
    std::size_t bad_seed = 0;
    for (index_t r = 0; r < rows; ++r)
      for (index_t c = 0; c < d; ++c) {
        bad_seed += hs.key_weight(r, c) != widen(posenc::detail::to_storage<S>(fs.key_weight(r, c))) ? 1 : 0;
        bad_seed += hs.value_weight(r, c) != widen(posenc::detail::to_storage<S>(fs.value_weight(r, c))) ? 1 : 0;
      }
    CHECK(bad_seed == 0);
    CHECK(attention_mismatches<posenc::path::fused, S>(h, fw, 2, d) == 0);
    CHECK(attention_mismatches<posenc::path::reference, S>(h, fw, 2, d) == 0);
    check_gradients(h, fw, 2, d);
  }
}
