// SPDX-License-Identifier: MIT
// Property: NaN or Inf in an input a row sees reaches that row by one rule on every path (docs/attention.md).
#include <posenc/attention/attention.hpp>
#include <posenc/encoding/none.hpp>

#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/random.hpp"

namespace properties_non_finite_tests {

using posenc::index_t;

namespace {

constexpr float nan_v = std::numeric_limits<float>::quiet_NaN();
constexpr float inf_v = std::numeric_limits<float>::infinity();

/// One problem in BSHD, all keys visible unless `causal`; `dead` keys (those
/// the rule says add nothing) can be hidden with a boolean mask.
struct problem {
  index_t B, Sq, Sk, Hq, Hkv, D;
  bool causal = false;
  float softcap = 0;
  int threads = 1;
  std::vector<float> q, k, v;

  problem(index_t b, index_t sq, index_t sk, index_t hq, index_t hkv, index_t d, std::uint64_t seed)
      : B(b), Sq(sq), Sk(sk), Hq(hq), Hkv(hkv), D(d) {
    q = posenc_test::random_vector<float>(static_cast<std::size_t>(B * Sq * Hq * D), seed);
    k = posenc_test::random_vector<float>(static_cast<std::size_t>(B * Sk * Hkv * D), seed + 1);
    v = posenc_test::random_vector<float>(static_cast<std::size_t>(B * Sk * Hkv * D), seed + 2);
  }
  float& at(std::vector<float>& x, index_t heads, index_t b, index_t s, index_t h, index_t d) const {
    index_t const seq = &x == &q ? Sq : Sk;
    return x[static_cast<std::size_t>(((b * seq + s) * heads + h) * D + d)];
  }
  std::size_t out_at(index_t b, index_t i, index_t h, index_t d) const {
    return static_cast<std::size_t>(((b * Sq + i) * Hq + h) * D + d);
  }
  std::size_t lse_at(index_t b, index_t i, index_t h) const { return static_cast<std::size_t>((b * Hq + h) * Sq + i); }
  index_t kv_head(index_t h) const { return h / (Hq / Hkv); }

  struct result {
    std::vector<float> out, lse;
  };
  /// Runs Path; `hidden(b, h, i, j)` true hides key j from row (b, i, h) with a boolean mask.
  template <class Path, class Hidden>
  result run(problem const& in, Hidden const& hidden) const {
    result r;
    r.out.assign(static_cast<std::size_t>(B * Sq * Hq * D), -7.0f);
    r.lse.assign(static_cast<std::size_t>(B * Hq * Sq), -7.0f);
    std::unique_ptr<bool[]> mask(new bool[static_cast<std::size_t>(B * Hq * Sq * Sk) + 1]);
    bool any_hidden = false;
    for (index_t b = 0; b < B; ++b)
      for (index_t h = 0; h < Hq; ++h)
        for (index_t i = 0; i < Sq; ++i)
          for (index_t j = 0; j < Sk; ++j) {
            bool const hide = hidden(b, h, i, j);
            mask[static_cast<std::size_t>(((b * Hq + h) * Sq + i) * Sk + j)] = !hide;
            any_hidden = any_hidden || hide;
          }
    posenc::attention_options<float> opt;
    opt.causal = causal;
    opt.softcap = softcap;
    opt.threads = threads;
    opt.lse = r.lse;
    if (any_hidden) opt.bool_mask = posenc::make_mask<bool>(mask.get(), B, Hq, Sq, Sk);
    posenc::attention<Path>(posenc::make_bshd(in.q.data(), B, Sq, Hq, D), posenc::make_bshd(in.k.data(), B, Sk, Hkv, D),
                            posenc::make_bshd(in.v.data(), B, Sk, Hkv, D), posenc::make_bshd(r.out.data(), B, Sq, Hq, D),
                            posenc::none{}, opt);
    return r;
  }
  template <class Path>
  result run(problem const& in) const {
    return run<Path>(in, [](index_t, index_t, index_t, index_t) { return false; });
  }
  /// Key j visible to row i under the causal rule (default bottom-right positions).
  bool sees(index_t i, index_t j) const { return !causal || j <= Sk - Sq + i; }
};

/// The shapes of the fused path's kernels: lane kernel (many rows, GQA), row
/// kernel (few rows), decode with the keys split over two threads (merged by
/// log-sum-exp), and tiles cut at odd lengths.
std::vector<problem> problems() {
  std::vector<problem> ps;
  ps.emplace_back(1, 70, 70, 4, 2, 16, 101);
  ps.emplace_back(2, 3, 45, 2, 2, 24, 202);
  ps.emplace_back(1, 1, 2000, 2, 1, 32, 303);
  ps.back().threads = 2;
  ps.emplace_back(1, 33, 129, 2, 1, 8, 404);
  ps.back().causal = true;
  return ps;
}

template <class Path>
void check_nan_query(std::string const& path) {
  for (problem const& base : problems()) {
    problem p = base;
    index_t const b = p.B - 1, i = p.Sq - 1, h = p.Hq - 1;
    p.at(p.q, p.Hq, b, i, h, p.D / 2) = nan_v;
    auto const clean = base.run<Path>(base);
    auto const got = p.run<Path>(p);
    for (index_t bb = 0; bb < p.B; ++bb)
      for (index_t ii = 0; ii < p.Sq; ++ii)
        for (index_t hh = 0; hh < p.Hq; ++hh) {
          bool const poisoned = bb == b && ii == i && hh == h;
          INFO(path << " Sq " << p.Sq << " Sk " << p.Sk << ": row (b " << bb << ", i " << ii << ", h " << hh << ")");
          for (index_t d = 0; d < p.D; ++d) {
            float const x = got.out[p.out_at(bb, ii, hh, d)];
            if (poisoned)
              REQUIRE(std::isnan(x));
            else
              REQUIRE(x == clean.out[p.out_at(bb, ii, hh, d)]);
          }
          float const l = got.lse[p.lse_at(bb, ii, hh)];
          if (poisoned)
            REQUIRE(std::isnan(l));
          else
            REQUIRE(l == clean.lse[p.lse_at(bb, ii, hh)]);
        }
  }
}

/// k[j] gets +Inf in dimension d: rows with q_d > 0 score +inf (NaN row), rows
/// with q_d < 0 score -inf (key j has probability 0: the row equals the run
/// with key j hidden up to summation order, even with NaN in v[j]); a NaN in k[j] makes every row
/// that sees j NaN. Rows that cannot see j are unchanged.
template <class Path>
void check_bad_key(std::string const& path) {
  for (problem const& base : problems()) {
    index_t const b = 0, hk = base.Hkv - 1, d = 1;
    index_t const j = base.Sk > 40 ? 37 : base.Sk - 1;
    for (int kind = 0; kind < 2; ++kind) {
      problem p = base;
      p.at(p.k, p.Hkv, b, j, hk, d) = kind == 0 ? inf_v : nan_v;
      for (index_t e = 0; e < p.D; e += 2) p.at(p.v, p.Hkv, b, j, hk, e) = nan_v;
      auto const hide_j = [&](index_t bb, index_t h, index_t, index_t jj) {
        return bb == b && p.kv_head(h) == hk && jj == j;
      };
      auto const masked = base.run<Path>(base, hide_j);
      auto const got = p.run<Path>(p);
      for (index_t bb = 0; bb < p.B; ++bb)
        for (index_t i = 0; i < p.Sq; ++i)
          for (index_t h = 0; h < p.Hq; ++h) {
            bool const sees = bb == b && p.kv_head(h) == hk && p.sees(i, j);
            float const qd = p.at(p.q, p.Hq, bb, i, h, d);
            bool const nan_row = sees && (kind == 1 || qd >= 0);
            INFO(path << " Sq " << p.Sq << " Sk " << p.Sk << ": k[" << j << "][" << d << "] = "
                      << (kind == 0 ? "inf" : "nan") << ", row (b " << bb << ", i " << i << ", h " << h
                      << "), sees " << sees << ", q_d " << qd);
            for (index_t e = 0; e < p.D; ++e) {
              float const x = got.out[p.out_at(bb, i, h, e)];
              if (nan_row)
                REQUIRE(std::isnan(x));
              else  // the same sums, perhaps in another order (the fused path guards values holding NaN)
                REQUIRE(std::abs(x - masked.out[p.out_at(bb, i, h, e)]) <=
                        2e-6f * (1 + std::abs(masked.out[p.out_at(bb, i, h, e)])));
            }
            float const l = got.lse[p.lse_at(bb, i, h)];
            if (nan_row)
              REQUIRE(std::isnan(l));
            else
              REQUIRE(std::abs(l - masked.lse[p.lse_at(bb, i, h)]) <= 2e-6f * (1 + std::abs(masked.lse[p.lse_at(bb, i, h)])));
          }
    }
  }
}

/// v[j] gets +Inf in dimension 0 and NaN in dimension 1: rows that see j get
/// +Inf and NaN there (probability > 0) and finite values elsewhere.
template <class Path>
void check_bad_value(std::string const& path) {
  for (problem const& base : problems()) {
    problem p = base;
    index_t const b = p.B - 1, hk = 0, j = p.Sk / 2;
    p.at(p.v, p.Hkv, b, j, hk, 0) = inf_v;
    p.at(p.v, p.Hkv, b, j, hk, 1) = nan_v;
    auto const got = p.run<Path>(p);
    for (index_t bb = 0; bb < p.B; ++bb)
      for (index_t i = 0; i < p.Sq; ++i)
        for (index_t h = 0; h < p.Hq; ++h) {
          bool const sees = bb == b && p.kv_head(h) == hk && p.sees(i, j);
          INFO(path << " Sq " << p.Sq << " Sk " << p.Sk << ": row (b " << bb << ", i " << i << ", h " << h
                    << "), sees " << sees);
          REQUIRE(std::isfinite(got.lse[p.lse_at(bb, i, h)]));
          for (index_t e = 0; e < p.D; ++e) {
            float const x = got.out[p.out_at(bb, i, h, e)];
            if (sees && e == 0)
              REQUIRE(x == inf_v);
            else if (sees && e == 1)
              REQUIRE(std::isnan(x));
            else
              REQUIRE(std::isfinite(x));
          }
        }
  }
}

/// With a softcap, an infinite score is capped to +-softcap: the row stays
/// finite, and every path gives the reference's values.
template <class Path>
void check_softcapped_infinite_score(std::string const& path) {
  for (problem const& base : problems()) {
    problem p = base;
    p.softcap = 20;
    index_t const b = 0, hk = 0, j = p.Sk / 3, d = 2;
    p.at(p.k, p.Hkv, b, j, hk, d) = inf_v;
    // Rows that see j with q_d = 0 would score 0 * Inf = NaN: keep q_d away from 0.
    for (index_t i = 0; i < p.Sq; ++i)
      for (index_t h = 0; h < p.Hq; ++h) {
        float& x = p.at(p.q, p.Hq, b, i, h, d);
        if (x == 0) x = 0.5f;
      }
    auto const want = p.run<posenc::path::reference>(p);
    auto const got = p.run<Path>(p);
    for (std::size_t t = 0; t < got.out.size(); ++t) {
      INFO(path << " Sq " << p.Sq << " Sk " << p.Sk << ": output element " << t);
      REQUIRE(std::isfinite(got.out[t]));
      REQUIRE(std::abs(got.out[t] - want.out[t]) <= 1e-5f * (1 + std::abs(want.out[t])));
    }
    for (std::size_t t = 0; t < got.lse.size(); ++t) {
      INFO(path << " Sq " << p.Sq << " Sk " << p.Sk << ": lse element " << t);
      REQUIRE(std::isfinite(got.lse[t]));
      REQUIRE(std::abs(got.lse[t] - want.lse[t]) <= 1e-5f * (1 + std::abs(want.lse[t])));
    }
  }
}

template <class Path>
void check_path(std::string const& path) {
  check_nan_query<Path>(path);
  check_bad_key<Path>(path);
  check_bad_value<Path>(path);
  check_softcapped_infinite_score<Path>(path);
}

}  // namespace

TEST_CASE("NaN or Inf a row sees reaches it by one rule: reference", "[properties]") {
  check_path<posenc::path::reference>("reference");
}
TEST_CASE("NaN or Inf a row sees reaches it by one rule: materialized", "[properties]") {
  check_path<posenc::path::materialized>("materialized");
}
TEST_CASE("NaN or Inf a row sees reaches it by one rule: fused", "[properties]") {
  check_path<posenc::path::fused>("fused");
}
}  // namespace properties_non_finite_tests
