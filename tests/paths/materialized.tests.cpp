// SPDX-License-Identifier: MIT
// path::materialized agrees with path::reference over random shapes, layouts, encoders and every option.
#include <posenc/attention/attention.hpp>
#include <posenc/encoding/alibi.hpp>
#include <posenc/encoding/none.hpp>
#include <posenc/encoding/rope.hpp>
#include <posenc/encoding/shaw.hpp>
#include <posenc/encoding/t5_bias.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/random.hpp"
#include "support/tolerance.hpp"

namespace paths_materialized_tests {

using posenc::index_t;

namespace {

/// One random attention call in float: shapes around SIMD widths, strided and
/// misaligned views, and a random subset of the options.
struct random_case {
  std::mt19937_64 gen;
  index_t B, Sq, Sk, Hkv, Hq, D, Dv;
  std::vector<float> qb, kb, vb;
  posenc::view<const float> q, k, v;
  std::vector<float> fmask;
  std::unique_ptr<bool[]> bmask;
  std::vector<index_t> offsets, lens;
  posenc::attention_options<float> opt;
  bool want_lse, want_scores;
  std::string text;

  index_t pick(std::initializer_list<index_t> xs) {
    return *(xs.begin() + static_cast<std::ptrdiff_t>(gen() % xs.size()));
  }
  bool coin() { return gen() % 2 == 0; }

  /// A view of n = (batch, seq, heads, dim) random values in the layout `layout`,
  /// starting `shift` elements into its buffer.
  posenc::view<const float> make(std::vector<float>& buf, index_t b, index_t s, index_t h, index_t d, int layout,
                                 index_t shift, std::uint64_t seed) {
    index_t const rd = d + (layout == 2 ? 3 : 0);  // padded rows
    buf = posenc_test::random_vector<float>(static_cast<std::size_t>(shift + b * s * h * rd), seed);
    posenc::view<float> x;
    if (layout == 1) {
      x = posenc::make_bhsd(buf.data() + shift, b, h, s, d);
    } else {
      x = {buf.data() + shift, b, s, h, d, s * h * rd, h * rd, rd, 1};
    }
    return x;
  }

  explicit random_case(std::uint64_t seed) : gen(seed) {
    B = 1 + static_cast<index_t>(gen() % 2);
    Sq = pick({1, 2, 7, 8, 9, 15, 16, 17, 33});
    Sk = pick({1, 3, 7, 8, 9, 16, 17, 31, 32, 33, 65});
    Hkv = 1 + static_cast<index_t>(gen() % 2);
    Hq = Hkv * (1 + static_cast<index_t>(gen() % 3));
    D = pick({1, 4, 7, 8, 9, 15, 16, 17, 32, 64, 65});
    Dv = coin() ? D : pick({3, 8, 16, 17});
    q = make(qb, B, Sq, Hq, D, static_cast<int>(gen() % 3), static_cast<index_t>(gen() % 2), seed + 1);
    k = make(kb, B, Sk, Hkv, D, static_cast<int>(gen() % 3), static_cast<index_t>(gen() % 2), seed + 2);
    v = make(vb, B, Sk, Hkv, Dv, static_cast<int>(gen() % 3), static_cast<index_t>(gen() % 2), seed + 3);
    if (coin()) opt.scale = 0.05 + 0.5 * static_cast<double>(gen() % 100) / 100.0;
    if (coin()) opt.causal = true;
    if (gen() % 4 == 0) opt.sliding_window = 1 + static_cast<index_t>(gen() % 9);
    if (gen() % 3 == 0) opt.softcap = 0.5 + static_cast<double>(gen() % 50) / 10.0;
    int const pos_kind = static_cast<int>(gen() % 4);
    if (pos_kind == 1) opt.q_positions = posenc::position_span(static_cast<index_t>(gen() % 5));
    if (pos_kind == 2) {
      for (index_t b = 0; b < B; ++b) offsets.push_back(static_cast<index_t>(gen() % 7) - 3);
      opt.q_positions = posenc::position_span::per_batch(offsets);
      opt.causal = true;  // negative positions need a mask that hides them from every key
    }
    if (gen() % 3 == 0) {
      for (index_t b = 0; b < B; ++b) lens.push_back(static_cast<index_t>(gen() % static_cast<std::uint64_t>(Sk + 1)));
      opt.key_lengths = lens;
    }
    int const mask_kind = static_cast<int>(gen() % 4);
    index_t const mb = coin() ? 1 : B, mh = coin() ? 1 : Hq, mq = coin() ? 1 : Sq;
    index_t const mk = coin() ? Sk : static_cast<index_t>(gen() % static_cast<std::uint64_t>(Sk + 1));
    if (mask_kind == 1) {
      fmask = posenc_test::random_vector<float>(static_cast<std::size_t>(mb * mh * mq * mk), seed + 4, -2, 2);
      for (auto& x : fmask)
        if (gen() % 5 == 0) x = -std::numeric_limits<float>::infinity();
      opt.mask = posenc::make_mask<float>(fmask.data(), mb, mh, mq, mk);
    } else if (mask_kind == 2) {
      bmask.reset(new bool[static_cast<std::size_t>(mb * mh * mq * mk + 1)]);
      for (index_t n = 0; n < mb * mh * mq * mk; ++n) bmask[static_cast<std::size_t>(n)] = gen() % 4 != 0;
      opt.bool_mask = posenc::make_mask<bool>(bmask.get(), mb, mh, mq, mk);
    }
    if (!opt.causal && opt.sliding_window == 0 && !opt.q_positions) {
      // Default positions key_length - Sq + i may be negative; encoders need
      // positions >= 0 for rows that see keys.
      index_t shortest = Sk;
      for (index_t l : lens) shortest = std::min(shortest, l);
      if (shortest < Sq) opt.q_positions = posenc::position_span(0);
    }
    want_lse = coin();
    want_scores = coin();
    opt.scores_stage = static_cast<posenc::score_stage>(gen() % 4);
    opt.threads = static_cast<int>(gen() % 3);
    text = "B " + std::to_string(B) + " Sq " + std::to_string(Sq) + " Sk " + std::to_string(Sk) + " Hq " +
           std::to_string(Hq) + " Hkv " + std::to_string(Hkv) + " D " + std::to_string(D) + " Dv " +
           std::to_string(Dv) + (opt.causal ? " causal" : "") + " window " + std::to_string(opt.sliding_window) +
           " softcap " + std::to_string(opt.softcap) + " positions " + std::to_string(pos_kind) + " mask " +
           std::to_string(mask_kind) + (lens.empty() ? "" : " padded") + " stage " +
           std::to_string(static_cast<int>(opt.scores_stage));
  }

  struct outputs {
    std::vector<float> out, lse, scores;
  };

  template <class Path, class E>
  outputs run(E const& enc) {
    outputs r;
    r.out.assign(static_cast<std::size_t>(B * Sq * Hq * Dv), std::nanf(""));
    posenc::attention_options<float> o = opt;
    if (want_lse) {
      r.lse.assign(static_cast<std::size_t>(B * Hq * Sq), std::nanf(""));
      o.lse = r.lse;
    }
    if (want_scores) {
      r.scores.assign(static_cast<std::size_t>(B * Hq * Sq * Sk), std::nanf(""));
      o.scores = r.scores;
    }
    posenc::attention<Path>(q, k, v, posenc::make_bshd(r.out.data(), B, Sq, Hq, Dv), enc, o);
    return r;
  }
};

template <class Path, class E>
void check_agreement(random_case& c, E const& enc, std::string const& name) {
  INFO(name << ": " << c.text);
  auto const got = c.run<Path>(enc);
  auto const ref = c.run<posenc::path::reference>(enc);
  auto const plain = c.run<posenc_test::plain_path>(enc);
  auto const r = posenc_test::within_tolerance(got.out, ref.out, plain.out);
  INFO("out: " << r.describe());
  CHECK(r.ok);
  bool finite = true;
  for (float x : got.out) finite = finite && std::isfinite(x);
  CHECK(finite);
  if (c.want_lse) {
    auto const l = posenc_test::within_tolerance(got.lse, ref.lse, plain.lse);
    INFO("lse: " << l.describe());
    CHECK(l.ok);
  }
  if (c.want_scores) {
    auto const s = posenc_test::within_tolerance(got.scores, ref.scores, plain.scores);
    INFO("scores: " << s.describe());
    CHECK(s.ok);
  }
}

}  // namespace

TEST_CASE("materialized path agrees with the reference (tolerance rule: <= 2x the plain float error + atol)", "[paths]") {
  auto const seed = GENERATE(take(40, random(1, 1000000000)));
  random_case c(static_cast<std::uint64_t>(seed));
  check_agreement<posenc::path::materialized>(c, posenc::none{}, "none");
  check_agreement<posenc::path::materialized>(c, posenc::alibi<float>(posenc::alibi_form::paper, c.Hq), "alibi");
  check_agreement<posenc::path::materialized>(c, posenc::t5_bias<float>({c.Hq, !c.opt.causal, 32, 128}, 5, 0.5),
                                              "t5");
  if (c.D % 2 == 0) {
    check_agreement<posenc::path::materialized>(c, posenc::rope<float>(posenc::rope_layout::half_split, c.D), "rope");
  }
  if (c.D == c.Dv) {
    check_agreement<posenc::path::materialized>(
        c, posenc::shaw<float>(3, c.D, posenc::shaw_terms::keys_and_values, 9, 0.5), "shaw");
  }
}
}  // namespace paths_materialized_tests
