// SPDX-License-Identifier: MIT
// shaw: score_row and value_row against the direct formulas of Shaw et al. (docs/formulas.md 4.3).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <posenc/core/half.hpp>
#include <posenc/encoding/shaw.hpp>
#include <random>
#include <vector>

#include "support/catch.hpp"
#include "support/encoder_runs.hpp"
#include "support/random.hpp"

namespace encoding_shaw_tests {

using posenc_test::random_buffer;
using posenc_test::as_table;

using posenc::index_t;
using posenc::shaw;

static_assert(posenc::relative_key_value_v<shaw<float>> && posenc::is_relative_v<shaw<float>>);
static_assert(!posenc::biases_scores_v<shaw<double>> && !posenc::adds_to_embeddings_v<shaw<double>>);

namespace {

template <class T>
posenc::relative_table<T> random_table(index_t rows, index_t cols, std::uint64_t seed) {
  auto v = posenc_test::random_vector<T>(static_cast<std::size_t>(rows * cols), seed);
  return Eigen::Map<posenc::relative_table<T>>(v.data(), rows, cols);
}

// Tolerance of a float sum of n products of values <= 1 in magnitude, against double.
template <class T>
double tol(index_t n) {
  return 4.0 * static_cast<double>(std::numeric_limits<T>::epsilon()) * static_cast<double>(n + 1) + 1e-30;
}

}  // namespace

TEMPLATE_TEST_CASE("shaw: score_row and value_row against the direct formulas", "[shaw]", float, double) {
  using T = TestType;
  std::mt19937_64 gen(8);
  for (index_t k : {1, 2, 4, 16}) {
    for (index_t dh : {1, 5, 16, 33}) {
      auto ak = random_table<T>(2 * k + 1, dh, 100 + static_cast<std::uint64_t>(k * 64 + dh));
      auto av = random_table<T>(2 * k + 1, dh, 200 + static_cast<std::uint64_t>(k * 64 + dh));
      shaw<T> s(k, ak, av);
      REQUIRE(s.has_values());
      REQUIRE(s.head_dim() == dh);
      for (int trial = 0; trial < 30; ++trial) {
        index_t const count = std::uniform_int_distribution<index_t>(0, 70)(gen);
        index_t const base = trial % 4 == 0 ? 123456789 : 0;
        index_t const q_pos = base + std::uniform_int_distribution<index_t>(0, 60)(gen);
        index_t const k_first = base + std::uniform_int_distribution<index_t>(0, 60)(gen);
        auto q = posenc_test::random_vector<T>(static_cast<std::size_t>(dh), static_cast<std::uint64_t>(trial));
        auto p = posenc_test::random_vector<T>(static_cast<std::size_t>(count) + 1,
                                               50u + static_cast<std::uint64_t>(trial), 0.0, 1.0);
        T const scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(dh)));
        // Direct formulas in double.
        std::vector<double> want_s(static_cast<std::size_t>(count)), want_v(static_cast<std::size_t>(dh), 0.5);
        for (index_t j = 0; j < count; ++j) {
          index_t const r = std::clamp<index_t>(k_first + j - q_pos, -k, k) + k;
          REQUIRE(s.row(q_pos, k_first + j) == r);
          double dotv = 0;
          for (index_t d = 0; d < dh; ++d) dotv += static_cast<double>(q[static_cast<std::size_t>(d)]) * ak(r, d);
          want_s[static_cast<std::size_t>(j)] = 0.25 + static_cast<double>(scale) * dotv;
          for (index_t d = 0; d < dh; ++d)
            want_v[static_cast<std::size_t>(d)] += static_cast<double>(p[static_cast<std::size_t>(j)]) * av(r, d);
        }
        std::vector<T> scores(static_cast<std::size_t>(count) + 1, T(0.25)),
            values(static_cast<std::size_t>(dh) + 1, T(0.5));
        scores[static_cast<std::size_t>(count)] = values[static_cast<std::size_t>(dh)] = T(-3);
        s.score_row(q.data(), q_pos, k_first, count, scale, scores.data());
        s.value_row(p.data(), q_pos, k_first, count, values.data());
        INFO("K " << k << " head_dim " << dh << " q " << q_pos << " k " << k_first << " count " << count);
        for (index_t j = 0; j < count; ++j)
          CHECK(std::abs(scores[static_cast<std::size_t>(j)] - want_s[static_cast<std::size_t>(j)]) <= tol<T>(dh));
        for (index_t d = 0; d < dh; ++d)
          CHECK(std::abs(values[static_cast<std::size_t>(d)] - want_v[static_cast<std::size_t>(d)]) <= tol<T>(count));
        CHECK(scores[static_cast<std::size_t>(count)] == T(-3));
        CHECK(values[static_cast<std::size_t>(dh)] == T(-3));
      }
    }
  }
}

TEST_CASE("shaw: far keys share one row; keys-only encoders add no values", "[shaw]") {
  auto ak = random_table<float>(5, 8, 1);
  shaw<float> s(2, ak);
  CHECK_FALSE(s.has_values());
  std::vector<float> q(8, 0.5f), row(40, 0.0f), out(8, 1.0f), p(40, 0.25f);
  s.score_row(q.data(), 20, 0, 40, 1.0f, row.data());
  for (index_t j = 0; j <= 18; ++j) CHECK(row[static_cast<std::size_t>(j)] == row[0]);   // distance <= -2
  for (index_t j = 22; j < 40; ++j) CHECK(row[static_cast<std::size_t>(j)] == row[39]);  // distance >= 2
  s.value_row(p.data(), 20, 0, 40, out.data());
  for (float x : out) CHECK(x == 1.0f);
  // Seeded tables: deterministic, both terms.
  shaw<double> a(3, 4, posenc::shaw_terms::keys_and_values, 9), b(3, 4, posenc::shaw_terms::keys_and_values, 9);
  shaw<double> c(3, 4, posenc::shaw_terms::keys, 9);
  CHECK(a.has_values());
  CHECK_FALSE(c.has_values());
  for (index_t r = 0; r < 7; ++r)
    for (index_t d = 0; d < 4; ++d) {
      CHECK(a.key_weight(r, d) == b.key_weight(r, d));
      CHECK(a.value_weight(r, d) == b.value_weight(r, d));
      CHECK(a.key_weight(r, d) == c.key_weight(r, d));
      CHECK(std::abs(a.value_weight(r, d)) <= 0.04);
    }
}

TEST_CASE("shaw: usage code of docs/encoders/relative.md", "[shaw][docs]") {
  // --- docs/encoders/relative.md: shaw ---
  // Clip distance K = 4, head_dim 64: aK and aV are (2K + 1, head_dim), shared by the heads.
  posenc::index_t const k = 4, head_dim = 64;
  posenc::relative_table<float> a_k = posenc::relative_table<float>::Constant(2 * k + 1, head_dim, 0.01f);
  posenc::relative_table<float> a_v = posenc::relative_table<float>::Constant(2 * k + 1, head_dim, 0.02f);
  posenc::shaw<float> rel(k, a_k, a_v);
  // One query vector at position 10 against keys 0..15: scores gain scale * q . aK(j - i).
  std::vector<float> q(head_dim, 1.0f), scores(16, 0.0f);
  float const scale = 1.0f / 8.0f;  // 1 / sqrt(head_dim)
  rel.add_scores(posenc::span<const float>(q), 10, 0, scale, posenc::span<float>(scores));
  // One row of probabilities over the same keys: the output gains sum_j p_j aV(j - i).
  std::vector<float> p(16, 1.0f / 16.0f), z(head_dim, 0.0f);
  rel.add_values(posenc::span<const float>(p), 10, 0, posenc::span<float>(z));
  // --- end ---
  CHECK(scores[0] == posenc_test::Approx(0.08f));
  CHECK(z[0] == posenc_test::Approx(0.02f));
}

namespace {

/// score_row and value_row of a and b over many (q_pos, k_pos_first, count):
/// the number of elements that differ.
template <class A, class B>
std::size_t row_mismatches(A const& a, B const& b, index_t d) {
  std::size_t bad = 0;
  auto const qrow = posenc_test::random_vector<float>(static_cast<std::size_t>(d), 21);
  for (index_t q : {0, 3, 30})
    for (index_t k0 : {0, 2, 25})
      for (index_t n : {1, 6, 20}) {
        auto x = posenc_test::random_vector<float>(static_cast<std::size_t>(n), static_cast<std::uint64_t>(3 + n));
        auto y = x;
        a.score_row(qrow.data(), q, k0, n, 0.375f, x.data());
        b.score_row(qrow.data(), q, k0, n, 0.375f, y.data());
        for (std::size_t j = 0; j < x.size(); ++j) bad += x[j] != y[j] ? 1 : 0;
        auto const pr = posenc_test::random_vector<float>(static_cast<std::size_t>(n), static_cast<std::uint64_t>(5 + n), 0.0);
        auto u = posenc_test::random_vector<float>(static_cast<std::size_t>(d), 6);
        auto w = u;
        a.value_row(pr.data(), q, k0, n, u.data());
        b.value_row(pr.data(), q, k0, n, w.data());
        for (std::size_t c = 0; c < u.size(); ++c) bad += u[c] != w[c] ? 1 : 0;
      }
  return bad;
}

/// The owned encoder of aK (and aV when `values`), as the constructors take them.
template <class T>
shaw<T> owned_of(index_t k, index_t d, std::vector<T> const& ak, std::vector<T> const& av, bool values) {
  index_t const rows = 2 * k + 1;
  return values ? shaw<T>(k, as_table(ak, rows, d), as_table(av, rows, d)) : shaw<T>(k, as_table(ak, rows, d));
}

/// view_of over aK (and aV when `values`).
template <class T>
shaw<T> view_of(index_t k, index_t d, std::vector<T> const& ak, std::vector<T> const& av, bool values) {
  return values ? shaw<T>::view_of(k, d, posenc::span<const T>(ak), posenc::span<const T>(av))
                : shaw<T>::view_of(k, d, posenc::span<const T>(ak));
}

/// x -= lr * g, elementwise over a row-major buffer, in T.
template <class T>
std::size_t step(std::vector<T>& x, posenc::relative_table<float> const& g, float lr) {
  std::size_t changed = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    float const old = posenc::detail::stored_value<float>(x[i]);
    x[i] = static_cast<T>(old - lr * g.data()[i]);
    changed += posenc::detail::stored_value<float>(x[i]) != old ? 1 : 0;
  }
  return changed;
}

}  // namespace

TEMPLATE_TEST_CASE("shaw: view_of reads the caller's tables in place, bit for bit an owned copy of them",
                   "[shaw][view]", float, Eigen::half) {
  using T = TestType;
  index_t const k = 4, rows = 2 * k + 1;
  for (index_t d : {8, 37}) {  // 37: SIMD batches and a tail
    for (bool values : {false, true}) {
      INFO("head_dim " << d << " values " << values);
      std::vector<T> ak = random_buffer<T>(rows, d, 7), av = random_buffer<T>(rows, d, 8);
      shaw<T> const view = view_of(k, d, ak, av, values);
      shaw<T> const owned = owned_of(k, d, ak, av, values);
      CHECK_FALSE(view.owns_tables());
      CHECK(owned.owns_tables());
      CHECK(view.has_values() == values);
      CHECK(view.head_dim() == d);
      std::size_t bad = 0;
      for (index_t r = 0; r < rows; ++r)
        for (index_t c = 0; c < d; ++c) {
          auto const i = static_cast<std::size_t>(r * d + c);
          bad += view.key_weight(r, c) != owned.key_weight(r, c) ? 1 : 0;
          bad += view.key_weight(r, c) != posenc::detail::stored_value<float>(ak[i]) ? 1 : 0;
          if (values) bad += view.value_weight(r, c) != posenc::detail::stored_value<float>(av[i]) ? 1 : 0;
        }
      CHECK(bad == 0);
      CHECK(row_mismatches(view, owned, d) == 0);
      CHECK(view.identity() == owned.identity());

      posenc_test::encoder_run_shape const s{2, d};
      auto const fused = posenc_test::attention_output<posenc::path::fused>(view, s);
      CHECK(fused == posenc_test::attention_output<posenc::path::fused>(owned, s));
      CHECK(posenc_test::attention_output<posenc::path::reference>(view, s) ==
            posenc_test::attention_output<posenc::path::reference>(owned, s));

      // The gradients have the tables' shapes: an optimiser step on the buffers in place.
      auto const g = posenc_test::attention_encoder_gradients<posenc::path::fused>(view, s);
      auto const go = posenc_test::attention_encoder_gradients<posenc::path::fused>(owned, s);
      CHECK(g.key == go.key);
      CHECK(g.value == go.value);
      auto const gr = posenc_test::attention_encoder_gradients<posenc::path::reference>(view, s);
      auto const gro = posenc_test::attention_encoder_gradients<posenc::path::reference>(owned, s);
      CHECK(gr.key == gro.key);
      CHECK(gr.value == gro.value);
      REQUIRE(g.key.rows() == rows);
      REQUIRE(g.key.cols() == d);
      REQUIRE(g.value.rows() == (values ? rows : 0));
      auto const id_before = view.identity();
      REQUIRE(step(ak, g.key, 4.0f) > 0);
      if (values) REQUIRE(step(av, g.value, 4.0f) > 0);
      shaw<T> const fresh = owned_of(k, d, ak, av, values);
      auto const fused_after = posenc_test::attention_output<posenc::path::fused>(view, s);
      CHECK(fused_after == posenc_test::attention_output<posenc::path::fused>(fresh, s));
      CHECK(fused_after != fused);
      CHECK(posenc_test::attention_output<posenc::path::reference>(view, s) ==
            posenc_test::attention_output<posenc::path::reference>(fresh, s));
      CHECK(row_mismatches(view, fresh, d) == 0);
      CHECK(view.identity() == fresh.identity());
      CHECK(view.identity() != id_before);
      // The owned copy kept the old values.
      CHECK(owned.identity() == id_before);
      CHECK(posenc_test::attention_output<posenc::path::fused>(owned, s) == fused);
      if (values) {  // a step on aV alone shows too
        auto const id_keys = view.identity();
        av[0] = static_cast<T>(posenc::detail::stored_value<float>(av[0]) + 0.5f);
        CHECK(view.identity() != id_keys);
        CHECK(view.value_weight(0, 0) == posenc::detail::stored_value<float>(av[0]));
      }
    }
  }
}

TEMPLATE_TEST_CASE("shaw: copies outlive an owned original; copies of a view read the buffers", "[shaw][view]", float,
                   Eigen::half) {
  using T = TestType;
  index_t const k = 3, d = 8, rows = 2 * k + 1;
  std::vector<T> ak = random_buffer<T>(rows, d, 4), av = random_buffer<T>(rows, d, 5);
  shaw<T> const expect = owned_of(k, d, ak, av, true);
  {  // Owned: copy-constructed and copy-assigned, then the original goes.
    auto original = std::make_unique<shaw<T>>(owned_of(k, d, ak, av, true));
    shaw<T> copy = *original;
    shaw<T> assigned(k, d, posenc::shaw_terms::keys, 99);
    assigned = *original;
    original.reset();
    std::vector<T>(ak.size(), T(0)).swap(ak);  // the caller's tables change: owned copies keep theirs
    std::vector<T>(av.size(), T(0)).swap(av);
    CHECK(copy.owns_tables());
    CHECK(assigned.has_values());
    CHECK(row_mismatches(copy, expect, d) == 0);
    CHECK(row_mismatches(assigned, expect, d) == 0);
    CHECK(copy.identity() == expect.identity());
    CHECK(assigned.identity() == expect.identity());
  }
  ak = random_buffer<T>(rows, d, 4);
  av = random_buffer<T>(rows, d, 5);
  {  // Borrowed: the copies read the same buffers, after the original goes too.
    auto original = std::make_unique<shaw<T>>(view_of(k, d, ak, av, true));
    shaw<T> copy = *original;
    shaw<T> assigned(k, d, posenc::shaw_terms::keys, 99);
    assigned = *original;
    original.reset();
    CHECK_FALSE(copy.owns_tables());
    CHECK_FALSE(assigned.owns_tables());
    CHECK(row_mismatches(copy, expect, d) == 0);
    for (auto& x : ak) x = static_cast<T>(-posenc::detail::stored_value<float>(x) + 0.25f);
    for (auto& x : av) x = static_cast<T>(posenc::detail::stored_value<float>(x) * 0.5f);
    shaw<T> const changed = owned_of(k, d, ak, av, true);
    CHECK(row_mismatches(copy, changed, d) == 0);
    CHECK(row_mismatches(assigned, changed, d) == 0);
    CHECK(row_mismatches(copy, expect, d) > 0);
    CHECK(copy.identity() == changed.identity());
  }
}
}  // namespace encoding_shaw_tests
