// SPDX-License-Identifier: MIT
// Property: a key a query row cannot see has no influence on that row, even when its k or v holds NaN or Inf.
#include <posenc/attention/attention.hpp>
#include <posenc/encoding/alibi.hpp>
#include <posenc/encoding/none.hpp>
#include <posenc/encoding/shaw.hpp>

#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/random.hpp"

namespace properties_invisible_keys_tests {

using posenc::index_t;

namespace {

/// How a key is hidden from some rows.
enum class hide { causal, window, key_lengths, bool_mask, additive_mask };

char const* name_of(hide h) {
  switch (h) {
    case hide::causal: return "causal";
    case hide::window: return "window";
    case hide::key_lengths: return "key_lengths";
    case hide::bool_mask: return "bool_mask";
    case hide::additive_mask: return "additive_mask";
  }
  return "?";
}

struct shape {
  index_t B, Sq, Sk, Hq, Hkv, D;
};

/// One problem, its options, and which (b, h, i, j) are visible, decided here
/// independently of the library.
struct problem {
  shape s;
  hide how;
  std::vector<float> q, k, v;
  std::vector<index_t> lengths;
  std::vector<float> add_mask;          // (B, Hq, Sq, Sk)
  std::unique_ptr<bool[]> bool_mask;    // (B, Hq, Sq, Sk)
  posenc::attention_options<float> opt;

  problem(shape sh, hide h, std::uint64_t seed) : s(sh), how(h) {
    q = posenc_test::random_vector<float>(static_cast<std::size_t>(s.B * s.Sq * s.Hq * s.D), seed);
    k = posenc_test::random_vector<float>(static_cast<std::size_t>(s.B * s.Sk * s.Hkv * s.D), seed + 1);
    v = posenc_test::random_vector<float>(static_cast<std::size_t>(s.B * s.Sk * s.Hkv * s.D), seed + 2);
    index_t const nm = s.B * s.Hq * s.Sq * s.Sk;
    add_mask.assign(static_cast<std::size_t>(nm), 0.0f);
    bool_mask.reset(new bool[static_cast<std::size_t>(nm)]);
    for (index_t b = 0; b < s.B; ++b) lengths.push_back(s.Sk - 1 - (b * 5) % s.Sk);
    for (index_t t = 0; t < nm; ++t) {
      index_t const j = t % s.Sk, i = t / s.Sk % s.Sq;
      bool const keep = (j * 7 + i * 3) % 5 != 0 || j == 0;  // scattered holes, key 0 always kept
      bool_mask[static_cast<std::size_t>(t)] = keep;
      add_mask[static_cast<std::size_t>(t)] = keep ? 0.25f * static_cast<float>(j % 3) : -INFINITY;
    }
    switch (how) {
      case hide::causal: opt.causal = true; break;
      case hide::window: opt.sliding_window = 5; break;
      case hide::key_lengths:  // positions as if every entry had Sk keys (encoders need them >= 0)
        opt.key_lengths = posenc::span<const index_t>(lengths.data(), s.B);
        opt.q_positions = posenc::position_span(s.Sk - s.Sq);
        break;
      case hide::bool_mask: opt.bool_mask = posenc::make_mask<bool>(bool_mask.get(), s.B, s.Hq, s.Sq, s.Sk); break;
      case hide::additive_mask: opt.mask = posenc::make_mask<float>(add_mask.data(), s.B, s.Hq, s.Sq, s.Sk); break;
    }
  }
  /// Key j visible to query (b, h, i) (default bottom-right query positions).
  bool visible(index_t b, index_t h, index_t i, index_t j) const {
    index_t const L = how == hide::key_lengths ? lengths[static_cast<std::size_t>(b)] : s.Sk;
    index_t const pi = L - s.Sq + i;
    std::size_t const t = static_cast<std::size_t>(((b * s.Hq + h) * s.Sq + i) * s.Sk + j);
    switch (how) {
      case hide::causal: return j <= pi;
      case hide::window: return j <= pi && j > pi - 5;
      case hide::key_lengths: return j < L;
      case hide::bool_mask: return bool_mask[t];
      case hide::additive_mask: return add_mask[t] != -INFINITY;
    }
    return true;
  }
  template <class Path, class E>
  std::vector<float> run(E const& enc, std::vector<float> const& kk, std::vector<float> const& vv) const {
    std::vector<float> out(static_cast<std::size_t>(s.B * s.Sq * s.Hq * s.D), -7.0f);
    posenc::attention<Path>(posenc::make_bshd(q.data(), s.B, s.Sq, s.Hq, s.D),
                            posenc::make_bshd(kk.data(), s.B, s.Sk, s.Hkv, s.D),
                            posenc::make_bshd(vv.data(), s.B, s.Sk, s.Hkv, s.D),
                            posenc::make_bshd(out.data(), s.B, s.Sq, s.Hq, s.D), enc, opt);
    return out;
  }
};

/// Poisons key (b, j, hk) in k or v with `bad` and checks that every row that
/// cannot see it is unchanged (and finite).
template <class Path, class E>
void check_poisoned_keys(problem const& p, E const& enc, std::string const& what) {
  shape const s = p.s;
  std::vector<float> const clean = p.run<Path>(enc, p.k, p.v);
  index_t const group = s.Hq / s.Hkv;
  // A few keys of each batch entry: first, one inside, near a tile edge, last.
  for (index_t b = 0; b < s.B; ++b)
  for (index_t j : {index_t{0}, s.Sk / 3, std::min<index_t>(s.Sk - 1, 63), s.Sk - 1})
  for (int target = 0; target < 2; ++target)
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    index_t const hk = j % s.Hkv;
    bool hidden_somewhere = false;
    for (index_t g = 0; g < group; ++g)
      for (index_t i = 0; i < s.Sq; ++i) hidden_somewhere = hidden_somewhere || !p.visible(b, hk * group + g, i, j);
    if (!hidden_somewhere) continue;
    std::vector<float> kk = p.k, vv = p.v;
    std::vector<float>& x = target == 0 ? kk : vv;
    float* row = x.data() + ((b * s.Sk + j) * s.Hkv + hk) * s.D;
    for (index_t d = 0; d < s.D; d += 3) row[d] = bad;
    std::vector<float> const out = p.run<Path>(enc, kk, vv);
    for (index_t g = 0; g < group; ++g)
      for (index_t i = 0; i < s.Sq; ++i) {
        index_t const h = hk * group + g;
        if (p.visible(b, h, i, j)) continue;
        for (index_t d = 0; d < s.D; ++d) {
          std::size_t const t = static_cast<std::size_t>(((b * s.Sq + i) * s.Hq + h) * s.D + d);
          INFO(what << " " << name_of(p.how) << ": " << (target == 0 ? "k" : "v") << "[" << b << ", " << j << ", " << hk
                    << "] = " << bad << ", row (b " << b << ", i " << i << ", h " << h << ") dim " << d);
          REQUIRE(std::isfinite(out[t]));
          REQUIRE(out[t] == clean[t]);
        }
      }
  }
}

template <class Path>
void check_path(std::string const& path) {
  // Lane kernel (a block of rows per kv head, GQA), the row kernel (decode),
  // and Shaw terms (row kernel with prefill).
  std::vector<shape> const shapes = {{2, 70, 70, 2, 1, 16}, {2, 1, 130, 4, 2, 16}, {1, 20, 20, 2, 2, 16}};
  for (std::size_t n = 0; n < shapes.size(); ++n)
    for (hide how : {hide::causal, hide::window, hide::key_lengths, hide::bool_mask, hide::additive_mask}) {
      problem const p(shapes[n], how, 11 + n);
      std::string const what = path + " shape " + std::to_string(n);
      check_poisoned_keys<Path>(p, posenc::none{}, what + " none");
      check_poisoned_keys<Path>(p, posenc::alibi<float>(posenc::alibi_form::paper, shapes[n].Hq), what + " alibi");
      if (n == 2)
        check_poisoned_keys<Path>(p, posenc::shaw<float>(4, 16, posenc::shaw_terms::keys_and_values, 3, 0.5),
                                  what + " shaw");
    }
}

}  // namespace

TEST_CASE("a key a row cannot see has no influence on it, even holding NaN or Inf: reference", "[properties]") {
  check_path<posenc::path::reference>("reference");
}
TEST_CASE("a key a row cannot see has no influence on it, even holding NaN or Inf: materialized", "[properties]") {
  check_path<posenc::path::materialized>("materialized");
}
TEST_CASE("a key a row cannot see has no influence on it, even holding NaN or Inf: fused", "[properties]") {
  check_path<posenc::path::fused>("fused");
}
}  // namespace properties_invisible_keys_tests
