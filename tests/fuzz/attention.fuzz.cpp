// SPDX-License-Identifier: MIT
// Fuzzes attention configurations: reference, materialized and fused agree (tolerance rule), errors leave outputs untouched.
#include <posenc/attention/attention.hpp>
#include <posenc/core/error.hpp>
#include <posenc/encoding/alibi.hpp>
#include <posenc/encoding/clipped_bias.hpp>
#include <posenc/encoding/compose.hpp>
#include <posenc/encoding/none.hpp>
#include <posenc/encoding/rope.hpp>
#include <posenc/encoding/shaw.hpp>
#include <posenc/encoding/t5_bias.hpp>
#include <posenc/encoding/transformer_xl.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "fuzz/fuzz_input.hpp"
#include "support/tolerance.hpp"

namespace {

using posenc::index_t;
using posenc_fuzz::finding;
using posenc_fuzz::fuzz_input;

constexpr float inf = std::numeric_limits<float>::infinity();

/// One attention call decoded from the input: shapes, layouts, values and options.
struct config {
  index_t B = 1, Sq = 1, Sk = 1, Hkv = 1, Hq = 1, D = 1, Dv = 1;
  std::vector<float> qb, kb, vb;           // buffers as given (may hold NaN / Inf)
  std::vector<float> qc, kc, vc;           // the same with every non-finite value replaced by 0
  posenc::view<const float> q, k, v;       // over qb, kb, vb
  posenc::view<const float> qcv, kcv, vcv;  // over qc, kc, vc, same strides
  std::vector<float> fmask;
  std::unique_ptr<bool[]> bmask;
  std::vector<index_t> q_first, lens, q_ids, k_ids;
  posenc::attention_options<float> opt;
  bool want_lse = false;
  bool finite_inputs = true;

  /// One line naming the configuration, printed with a finding.
  void describe() const {
    std::fprintf(stderr,
                 "B %ld Sq %ld Sk %ld Hq %ld Hkv %ld D %ld Dv %ld causal %d window %ld softcap %g scale %g "
                 "q_positions %s k_positions %s key_lengths %zu mask %d bool_mask %d keys_rotated %d lse %d "
                 "finite inputs %d\n",
                 static_cast<long>(B), static_cast<long>(Sq), static_cast<long>(Sk), static_cast<long>(Hq),
                 static_cast<long>(Hkv), static_cast<long>(D), static_cast<long>(Dv), opt.causal ? 1 : 0,
                 static_cast<long>(opt.sliding_window), opt.softcap, opt.scale ? *opt.scale : -0.0,
                 !opt.q_positions ? "default" : opt.q_positions->is_explicit() ? "ids"
                                  : opt.q_positions->is_per_batch() ? "per_batch" : "offset",
                 !opt.k_positions ? "default" : opt.k_positions->is_explicit() ? "ids" : "offset", lens.size(),
                 opt.mask.empty() ? 0 : 1, opt.bool_mask.empty() ? 0 : 1, opt.keys_rotated ? 1 : 0, want_lse ? 1 : 0,
                 finite_inputs ? 1 : 0);
  }

  /// A (b, s, h, d) view in layout 0 (BSHD), 1 (BHSD) or 2 (BSHD rows padded), `shift` elements in.
  static posenc::view<float> shape(float* base, index_t b, index_t s, index_t h, index_t d, int layout) {
    if (layout == 1) return posenc::make_bhsd(base, b, h, s, d);
    index_t const rd = d + (layout == 2 ? 3 : 0);
    return {base, b, s, h, d, s * h * rd, h * rd, rd, 1};
  }

  void make(fuzz_input& in, std::vector<float>& buf, std::vector<float>& clean, posenc::view<const float>& x,
            posenc::view<const float>& xc, index_t b, index_t s, index_t h, index_t d) {
    int const layout = static_cast<int>(in.below(3));
    index_t const shift = in.below(2), rd = d + (layout == 2 ? 3 : 0);
    double const amp = in.below(4) == 0 ? 8.0 : 1.0;
    std::uint64_t st = in.word() | 1;
    buf.resize(static_cast<std::size_t>(shift + b * s * h * rd));
    for (auto& e : buf) {
      st ^= st << 13, st ^= st >> 7, st ^= st << 17;
      e = static_cast<float>(amp * (static_cast<double>(st >> 11) / 4503599627370496.0 - 1.0));
    }
    // A few non-finite values anywhere in the buffer (padding included).
    index_t const bad = in.below(8) == 0 ? 1 + in.below(3) : 0;
    for (index_t i = 0; i < bad && !buf.empty(); ++i) {
      float const kinds[] = {std::nanf(""), inf, -inf};
      buf[in.below(static_cast<std::uint32_t>(buf.size()))] = kinds[in.below(3)];
    }
    clean = buf;
    for (auto& e : clean)
      if (!std::isfinite(e)) e = 0;
    x = shape(buf.data() + shift, b, s, h, d, layout);
    xc = shape(clean.data() + shift, b, s, h, d, layout);
  }

  bool row_finite(posenc::view<const float> x, index_t b, index_t s, index_t h) const {
    for (index_t d = 0; d < x.dim; ++d)
      if (!std::isfinite(x(b, s, h, d))) return false;
    return true;
  }

  explicit config(fuzz_input& in) {
    B = 1 + in.below(2);
    Sq = in.below(32) == 0 ? 0 : in.range(1, 80);
    Sk = in.below(32) == 0 ? 0 : in.range(1, 80);
    static index_t const kv_heads[] = {1, 2, 4};
    Hkv = kv_heads[in.below(3)];
    Hq = Hkv * (1 + in.below(static_cast<std::uint32_t>(4 / Hkv)));
    D = in.range(1, 40);
    Dv = in.coin() ? D : in.range(1, 40);
    make(in, qb, qc, q, qcv, B, Sq, Hq, D);
    make(in, kb, kc, k, kcv, B, Sk, Hkv, D);
    make(in, vb, vc, v, vcv, B, Sk, Hkv, Dv);
    for (index_t b = 0; b < B; ++b)
      for (index_t s = 0; s < Sq; ++s)
        for (index_t h = 0; h < Hq; ++h) finite_inputs = finite_inputs && row_finite(q, b, s, h);
    for (index_t b = 0; b < B; ++b)
      for (index_t s = 0; s < Sk; ++s)
        for (index_t h = 0; h < Hkv; ++h)
          finite_inputs = finite_inputs && row_finite(k, b, s, h) && row_finite(v, b, s, h);

    static double const scales[] = {0.125, 0.5, 1.0, 2.0, 0.01, 8.0, 0.0, -1.0, std::nan(""), INFINITY};
    if (in.coin()) opt.scale = scales[in.below(10)];
    opt.causal = in.coin();
    if (in.below(4) == 0) opt.sliding_window = in.range(in.below(8) == 0 ? -1 : 1, 12);
    static double const caps[] = {0.5, 1.0, 5.0, 30.0, 50.0, -1.0, std::nan("")};
    if (in.below(3) == 0) opt.softcap = caps[in.below(7)];
    auto pos = [&] { return in.below(16) == 0 ? static_cast<index_t>(in.word()) : in.range(-10, 100); };
    switch (in.below(5)) {
      case 1: opt.q_positions = posenc::position_span(pos()); break;
      case 2:
        for (index_t b = 0; b < B; ++b) q_first.push_back(pos());
        opt.q_positions = posenc::position_span::per_batch(q_first);
        break;
      case 3: {
        index_t const ib = in.coin() ? 1 : B;
        for (index_t n = 0; n < ib * Sq; ++n) q_ids.push_back(in.below(4) == 0 ? pos() : in.range(-5, 100));
        opt.q_positions = posenc::position_span::ids(q_ids.data(), ib, Sq);
        break;
      }
      default: break;
    }
    switch (in.below(4)) {
      case 1: opt.k_positions = posenc::position_span(pos()); break;
      case 2: {
        index_t const ib = in.coin() ? 1 : B;
        for (index_t n = 0; n < ib * Sk; ++n) k_ids.push_back(in.range(-5, 100));
        opt.k_positions = posenc::position_span::ids(k_ids.data(), ib, Sk);
        break;
      }
      default: break;
    }
    if (in.below(3) == 0) {
      for (index_t b = 0; b < B; ++b) lens.push_back(in.below(16) == 0 ? in.range(-1, Sk + 1) : in.range(0, Sk));
      opt.key_lengths = lens;
    }
    int const masks = static_cast<int>(in.below(4));  // bit 0: additive, bit 1: boolean
    index_t const mb = in.coin() ? 1 : B, mh = in.coin() ? 1 : Hq, mq = in.coin() ? 1 : Sq;
    index_t const mk = in.coin() ? Sk : in.range(0, Sk);
    std::size_t const mn = static_cast<std::size_t>(mb * mh * mq * mk);
    if (masks & 1) {
      fmask.resize(mn);
      std::uint32_t const drop = in.below(4);
      for (auto& x : fmask) x = in.below(8) < drop ? -inf : static_cast<float>(in.range(-20, 20)) / 10.0f;
      opt.mask = posenc::make_mask<float>(fmask.data(), mb, mh, mq, mk);
    }
    if (masks & 2) {
      bmask.reset(new bool[mn + 1]);
      for (std::size_t i = 0; i < mn; ++i) bmask[i] = in.below(4) != 0;
      opt.bool_mask = posenc::make_mask<bool>(bmask.get(), mb, mh, mq, mk);
    }
    opt.keys_rotated = in.below(8) == 0;
    want_lse = in.coin();
    opt.threads = static_cast<int>(in.below(3));
  }
};

struct outputs {
  std::vector<float> out, lse;
};

constexpr float sentinel = 1234.5f;

/// Runs one path; false when it threw posenc::error, which must leave out and lse untouched.
template <class Path, class E>
bool run(config const& c, E const& enc, outputs& r, bool clean = false, float* scores = nullptr,
         posenc::score_stage stage = posenc::score_stage::biased) {
  r.out.assign(static_cast<std::size_t>(c.B * c.Sq * c.Hq * c.Dv), sentinel);
  r.lse.assign(static_cast<std::size_t>(c.B * c.Hq * c.Sq), sentinel);
  posenc::attention_options<float> o = c.opt;
  if (c.want_lse) o.lse = r.lse;
  if (scores) {
    o.scores = {scores, c.B * c.Hq * c.Sq * c.Sk};
    o.scores_stage = stage;
  }
  try {
    posenc::attention<Path>(clean ? c.qcv : c.q, clean ? c.kcv : c.k, clean ? c.vcv : c.v,
                            posenc::make_bshd(r.out.data(), c.B, c.Sq, c.Hq, c.Dv), enc, o);
  } catch (posenc::error const&) {
    for (float x : r.out)
      if (std::memcmp(&x, &sentinel, sizeof x) != 0) finding("posenc::error thrown after writing out");
    for (float x : r.lse)
      if (std::memcmp(&x, &sentinel, sizeof x) != 0) finding("posenc::error thrown after writing lse");
    return false;
  }
  return true;
}

/// What a row must give: the tolerance rule (it sees only finite inputs), the reference's
/// non-finite pattern (it sees NaN or Inf), or either (see `check`).
enum class row_rule : char { finite, non_finite, either };

/// Compares `got` against the reference over the selected rows: the tolerance rule on rows
/// that see only finite inputs (which must be finite), the same non-finite pattern on rows
/// that see NaN or Inf, nothing on rows whose rule is `either`. Returns the first failing
/// row, or -1.
long compare(std::vector<float> const& got, std::vector<float> const& ref, std::vector<float> const& plain,
             std::vector<row_rule> const& rule, std::size_t width, double floor) {
  std::vector<float> g, e, p;
  std::vector<std::size_t> rows;
  for (std::size_t row = 0; row < rule.size() / width; ++row)
    for (std::size_t d = 0; d < width; ++d) {
      std::size_t const i = row * width + d;
      if (rule[i] == row_rule::either) continue;
      if (rule[i] == row_rule::non_finite) {
        if (std::isfinite(got[i]) != std::isfinite(ref[i])) return static_cast<long>(row);
      } else {
        g.push_back(got[i]);
        e.push_back(ref[i]);
        p.push_back(plain[i]);
        rows.push_back(row);
      }
    }
  auto const r = posenc_test::within_tolerance(g, e, p, 1e-6, floor);
  if (r.ok) return -1;
  std::fprintf(stderr, "%s\n", r.describe().c_str());
  for (std::size_t i = 0; i < g.size(); ++i)
    if (!(g[i] == e[i]) && !(std::abs(static_cast<double>(g[i]) - e[i]) <= r.bound))
      return static_cast<long>(rows[i]);
  return 0;
}

/// What one output row (b, i, h) saw, and each path's values there.
void explain(config const& c, std::vector<float> const& scores, index_t b, index_t i, index_t h,
             std::vector<float> const* paths[3], std::size_t at, std::size_t width) {
  std::fprintf(stderr, "row b %ld i %ld h %ld, query finite %d\n", static_cast<long>(b), static_cast<long>(i),
               static_cast<long>(h), c.row_finite(c.q, b, i, h) ? 1 : 0);
  index_t const group = c.Hq / c.Hkv;
  if (c.finite_inputs) std::fprintf(stderr, "  every input is finite\n");
  for (index_t j = 0; j < c.Sk && !c.finite_inputs; ++j) {
    float const s = scores[static_cast<std::size_t>(((b * c.Hq + h) * c.Sq + i) * c.Sk + j)];
    if (std::isfinite(s))
      std::fprintf(stderr, "  visible key %ld: biased score of the finite copy %g, k finite %d, v finite %d\n",
                   static_cast<long>(j), s, c.row_finite(c.k, b, j, h / group) ? 1 : 0,
                   c.row_finite(c.v, b, j, h / group) ? 1 : 0);
  }
  char const* names[3] = {"reference", "materialized", "fused"};
  for (int n = 0; n < 3; ++n) {
    std::fprintf(stderr, "  %s:", names[n]);
    for (std::size_t d = 0; d < width; ++d) std::fprintf(stderr, " %g", (*paths[n])[at + d]);
    std::fprintf(stderr, "\n");
  }
}

/// |q_i + u_h|: the query Transformer-XL's kernels multiply (content_bias shifts it by u_h).
double shifted_norm(config const& c, posenc::transformer_xl<float> const& enc, index_t b, index_t i, index_t h) {
  float const* u = enc.content_bias(h);
  double n = 0;
  for (index_t d = 0; d < c.D; ++d) {
    double const x = double(c.qcv(b, i, h, d)) + double(u[d]);
    n += x * x;
  }
  return std::sqrt(n);
}

/// max_d |R_h(d)| over the encoder's table.
double max_r_norm(posenc::transformer_xl<float> const& enc, index_t h) {
  double best = 0;
  for (index_t d = -enc.distance_limit(); d <= enc.distance_limit(); ++d) {
    double n = 0;
    for (index_t t = 0; t < enc.head_dim(); ++t) n += double(enc.relative_key(h, d, t)) * double(enc.relative_key(h, d, t));
    best = std::max(best, std::sqrt(n));
  }
  return best;
}

/// max_d |(v_h - u_h) . R_h(d)|, the per-distance term the kernels add as one rounded float.
double max_c(posenc::transformer_xl<float> const& enc, index_t h) {
  double best = 0;
  for (index_t d = -enc.distance_limit(); d <= enc.distance_limit(); ++d)
    best = std::max(best, std::abs(double(enc.position_bias(h, d))));
  return best;
}

template <class E>
void check(config const& c, E const& enc) {
  outputs ref, plain, mat, fus;
  bool const r = run<posenc::path::reference>(c, enc, ref);
  bool const p = run<posenc_test::plain_path>(c, enc, plain);
  bool const m = run<posenc::path::materialized>(c, enc, mat);
  bool const f = run<posenc::path::fused>(c, enc, fus);
  if (r != p || r != m || r != f) {
    c.describe();
    std::fprintf(stderr, "accepted: reference %d plain %d materialized %d fused %d\n", r, p, m, f);
    finding("paths disagree on whether the arguments are valid");
  }
  if (!r) return;

  // Which keys each query row sees: the biased scores of the finite copy are -inf exactly there.
  // A row that sees a non-finite q or k, or a non-finite v at a key of probability >= the
  // smallest normal float, must be non-finite where the reference is. A key of probability 0
  // adds nothing on any path (docs/attention.md), but whether a tiny probability is 0 depends
  // on the precision (double in the reference, float elsewhere) and on how exp treats
  // subnormal results: a row whose only non-finite input is a v at keys below that limit may
  // be finite or not.
  // Per output element (a non-finite v poisons only its own dimensions), per lse.
  std::vector<row_rule> out_rule(static_cast<std::size_t>(c.B * c.Sq * c.Hq * c.Dv), row_rule::finite),
      lse_rule(static_cast<std::size_t>(c.B * c.Hq * c.Sq), row_rule::finite);
  std::vector<float> scores(static_cast<std::size_t>(c.B * c.Hq * c.Sq * c.Sk) + 1), probs;
  outputs tmp;
  if (!run<posenc::path::reference>(c, enc, tmp, true, scores.data()))
    finding("the reference rejects the finite copy of valid inputs");
  // The error floor of the tolerance rule, to first order in eps = 2^-24:
  // - every float path rounds each logit s at least once, which moves a
  //   log-sum-exp by up to eps max |s| (the bound allows two roundings) and an
  //   output, sum_j p_j (v_j - out) ds_j, by up to eps max |s| 2 max |v|;
  // - every float path sums the raw score q . k in float, in its own order:
  //   an error of up to D eps |q| |k| (|q_d k_d| summed, bounded by the norms,
  //   which a rotation keeps), times the scale, passed on by a softcap c as
  //   sech^2(r / c) at the raw score r. Where q . k cancels, this is far above
  //   eps |s|, and the paths' orders give errors of that size, not of the
  //   plain implementation's.
  double max_logit = 0, max_value = 0, max_dot = 0;
  for (float s : scores)
    if (std::isfinite(s)) max_logit = std::max(max_logit, std::abs(static_cast<double>(s)));
  {
    std::vector<float> raw(scores.size());
    bool const capped = c.opt.softcap > 0;
    if (capped && !run<posenc::path::reference>(c, enc, tmp, true, raw.data(), posenc::score_stage::raw))
      finding("the reference rejects the finite copy of valid inputs");
    double const scale = c.opt.scale ? std::abs(static_cast<double>(*c.opt.scale)) : 1.0 / std::sqrt(double(c.D));
    double const gamma = double(c.D) * (std::numeric_limits<float>::epsilon() / 2);
    auto norm = [&](posenc::view<const float> const& x, index_t b, index_t t, index_t h) {
      double n = 0;
      for (index_t d = 0; d < c.D; ++d) n += double(x(b, t, h, d)) * double(x(b, t, h, d));
      return std::sqrt(n);
    };
    index_t const group = c.Hq / c.Hkv;
    std::vector<double> xl_q, xl_r, xl_c;  // Transformer-XL: |q + u| per row, max |R_h|, max |c_h| per head
    if constexpr (std::is_same_v<E, posenc::transformer_xl<float>>) {
      for (index_t b = 0; b < c.B; ++b)
        for (index_t h = 0; h < c.Hq; ++h)
          for (index_t i = 0; i < c.Sq; ++i) xl_q.push_back(shifted_norm(c, enc, b, i, h));
      for (index_t h = 0; h < c.Hq; ++h) {
        xl_r.push_back(max_r_norm(enc, h));
        xl_c.push_back(max_c(enc, h));
      }
    }
    for (index_t b = 0; b < c.B; ++b)
      for (index_t h = 0; h < c.Hq; ++h)
        for (index_t i = 0; i < c.Sq; ++i) {
          double const nq = norm(c.qcv, b, i, h);
          for (index_t j = 0; j < c.Sk; ++j) {
            auto const at = static_cast<std::size_t>(((b * c.Hq + h) * c.Sq + i) * c.Sk + j);
            if (!std::isfinite(scores[at])) continue;
            double e = scale * gamma * nq * norm(c.kcv, b, j, h / group);
            if constexpr (std::is_same_v<E, posenc::transformer_xl<float>>) {
              // Transformer-XL sums (q + u) . k and (q + u) . R(d) in float, plus (v - u) . R(d)
              // rounded once: the same first-order error with the shifted query, and max |R| for |k|.
              e = scale * (gamma * xl_q[static_cast<std::size_t>((b * c.Hq + h) * c.Sq + i)] *
                               (norm(c.kcv, b, j, h / group) + xl_r[static_cast<std::size_t>(h)]) +
                           (std::numeric_limits<float>::epsilon() / 2) * xl_c[static_cast<std::size_t>(h)]);
            }
            if (capped) {
              double const ch = std::cosh(double(raw[at]) / c.opt.softcap);
              e = std::isfinite(ch) ? e / (ch * ch) : 0.0;
            }
            max_dot = std::max(max_dot, e);
          }
        }
  }
  for (float x : c.vc) max_value = std::max(max_value, std::abs(static_cast<double>(x)));
  double const eps = std::numeric_limits<float>::epsilon() / 2;
  double const lse_floor = 2 * eps * max_logit + max_dot, out_floor = (2 * eps * max_logit + 2 * max_dot) * max_value;
  if (!c.finite_inputs) {
    probs.resize(scores.size());
    if (!run<posenc::path::reference>(c, enc, tmp, true, probs.data(), posenc::score_stage::probabilities))
      finding("the reference rejects the finite copy of valid inputs");
    index_t const group = c.Hq / c.Hkv;
    for (index_t b = 0; b < c.B; ++b)
      for (index_t h = 0; h < c.Hq; ++h)
        for (index_t i = 0; i < c.Sq; ++i) {
          bool sees = false, bad_qk = false;
          std::vector<char> bad_v(static_cast<std::size_t>(c.Dv)), tiny_bad_v(static_cast<std::size_t>(c.Dv));
          for (index_t j = 0; j < c.Sk; ++j) {
            auto const at = static_cast<std::size_t>(((b * c.Hq + h) * c.Sq + i) * c.Sk + j);
            if (!std::isfinite(scores[at])) continue;
            sees = true;
            bad_qk = bad_qk || !c.row_finite(c.k, b, j, h / group);
            bool const tiny = probs[at] < std::numeric_limits<float>::min();
            for (index_t d = 0; d < c.Dv; ++d)
              if (!std::isfinite(c.v(b, j, h / group, d))) (tiny ? tiny_bad_v : bad_v)[static_cast<std::size_t>(d)] = 1;
          }
          bad_qk = bad_qk || (sees && !c.row_finite(c.q, b, i, h));
          for (index_t d = 0; d < c.Dv; ++d) {
            auto const e = static_cast<std::size_t>(d);
            // A non-finite q or k poisons the row only if its score is not -inf: a -inf
            // score masks the key like any other, and the row keeps the pattern of its
            // values, where a non-finite v at a tiny probability may or may not show.
            out_rule[static_cast<std::size_t>(((b * c.Sq + i) * c.Hq + h) * c.Dv + d)] =
                bad_v[e] ? row_rule::non_finite
                : tiny_bad_v[e] ? row_rule::either
                : bad_qk ? row_rule::non_finite
                : row_rule::finite;
          }
          // The log-sum-exp does not read v.
          lse_rule[static_cast<std::size_t>((b * c.Hq + h) * c.Sq + i)] =
              bad_qk ? row_rule::non_finite : row_rule::finite;
        }
  }
  auto const w = static_cast<std::size_t>(c.Dv);
  struct comparison {
    std::vector<float> const* got;
    bool is_lse;
    char const* what;
  };
  comparison const all[] = {{&mat.out, false, "materialized out differs from the reference"},
                            {&fus.out, false, "fused out differs from the reference"},
                            {&mat.lse, true, "materialized lse differs from the reference"},
                            {&fus.lse, true, "fused lse differs from the reference"}};
  for (auto const& cmp : all) {
    if (cmp.is_lse && !c.want_lse) continue;
    auto const& base = cmp.is_lse ? ref.lse : ref.out;
    long const row = compare(*cmp.got, base, cmp.is_lse ? plain.lse : plain.out, cmp.is_lse ? lse_rule : out_rule,
                             cmp.is_lse ? 1 : w, cmp.is_lse ? lse_floor : out_floor);
    if (row < 0) continue;
    c.describe();
    index_t b, i, h;
    if (cmp.is_lse) {
      i = row % c.Sq, h = (row / c.Sq) % c.Hq, b = row / (c.Sq * c.Hq);
    } else {
      h = row % c.Hq, i = (row / c.Hq) % c.Sq, b = row / (c.Hq * c.Sq);
    }
    std::vector<float> const* vals[3] = {&base, cmp.is_lse ? &mat.lse : &mat.out, cmp.is_lse ? &fus.lse : &fus.out};
    std::size_t const width = cmp.is_lse ? 1 : w;
    explain(c, scores, b, i, h, vals, static_cast<std::size_t>(row) * width, width);
    finding(cmp.what);
  }
}

/// Transformer-XL with seeded u, v (heads, head_dim) and W_R (heads x head_dim, an even pos_dim),
/// a distance limit that the call's positions may exceed (a rejection every path must share)
/// and sometimes a memory length. The memory length never cuts here: a call that cuts its
/// memory has no scores output, which check() reads to find each row's visible keys (the cut
/// is tested against the uncut call on the kept keys in tests/paths/transformer_xl.tests.cpp).
posenc::transformer_xl<float> make_transformer_xl(fuzz_input& in, config const& c) {
  index_t const m = 2 * in.range(1, 8);
  index_t const limit = in.coin() ? in.range(0, 12) : in.range(100, 240);
  index_t const memory = in.coin() ? 0 : in.range(c.Sk, c.Sk + 40);
  std::uint64_t st = in.word() | 1;
  auto table = [&](index_t rows, index_t cols) {
    posenc::relative_table<float> t(rows, cols);
    for (index_t r = 0; r < rows; ++r)
      for (index_t q = 0; q < cols; ++q) {
        st ^= st << 13, st ^= st >> 7, st ^= st << 17;
        t(r, q) = static_cast<float>(static_cast<double>(st >> 11) / 9007199254740992.0 - 0.5);
      }
    return t;
  };
  auto const u = table(c.Hq, c.D), v = table(c.Hq, c.D), w = table(c.Hq * c.D, m);
  return posenc::transformer_xl<float>(limit, u, v, w, memory);
}

posenc::rope<float> make_rope(fuzz_input& in, config const& c) {
  posenc::rope_options o;
  if (in.below(4) == 0) o.rotary_dim = 2 * in.range(1, c.D / 2 > 0 ? c.D / 2 : 1);
  if (in.coin()) o.base = in.coin() ? 500000.0 : 100.0;
  double const factor = static_cast<double>(in.range(1, 16)) / 2.0;
  index_t const l0 = in.range(1, 64);
  index_t const half = (o.rotary_dim ? *o.rotary_dim : c.D) / 2;
  switch (in.below(6)) {
    case 1: o.scaling = posenc::rope_scaling::linear(factor); break;
    case 2: o.scaling = posenc::rope_scaling::dynamic_ntk(factor, l0); break;
    case 3: o.scaling = posenc::rope_scaling::yarn(factor, l0); break;
    case 4: o.scaling = posenc::rope_scaling::llama3(factor, 1.0, 4.0, l0); break;
    case 5:
      o.scaling = posenc::rope_scaling::longrope(std::vector<double>(static_cast<std::size_t>(half), 1.0),
                                                 std::vector<double>(static_cast<std::size_t>(half), factor), l0,
                                                 4 * l0);
      break;
    default: break;
  }
  return posenc::rope<float>(in.coin() ? posenc::rope_layout::half_split : posenc::rope_layout::interleaved, c.D, o);
}

posenc::alibi<float> make_alibi(fuzz_input& in, config const& c) {
  auto const form = static_cast<posenc::alibi_form>(in.below(4));
  return posenc::alibi<float>(form, c.Hq, in.coin() ? 0 : in.range(0, c.Sk + 2));
}

posenc::t5_bias<float> make_t5(fuzz_input& in, config const& c) {
  posenc::t5_bias_params p{c.Hq, !c.opt.causal, 2 * in.range(2, 16), in.range(8, 128)};
  return posenc::t5_bias<float>(p, in.word(), 0.5);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(std::uint8_t const* data, std::size_t size) {
  fuzz_input in(data, size);
  config const c(in);
  try {
    // One byte picks the encoder: 248 and above Transformer-XL, else byte % 8 as before (the
    // saved inputs keep their encoder).
    std::uint8_t const pick = in.byte();
    if (pick >= 248) {
      check(c, make_transformer_xl(in, c));
      return 0;
    }
    switch (pick % 8) {
      case 0: check(c, posenc::none{}); break;
      case 1: check(c, make_rope(in, c)); break;
      case 2: check(c, make_alibi(in, c)); break;
      case 3: check(c, make_t5(in, c)); break;
      case 4: check(c, posenc::clipped_bias<float>(in.range(0, 6), c.Hq, in.word(), 0.5)); break;
      case 5:
        check(c, posenc::shaw<float>(in.range(1, 6), c.D,
                                     in.coin() ? posenc::shaw_terms::keys : posenc::shaw_terms::keys_and_values,
                                     in.word(), 0.5));
        break;
      case 6: {
        auto r = make_rope(in, c);
        check(c, posenc::compose<posenc::rope<float>, posenc::alibi<float>>(r, make_alibi(in, c)));
        break;
      }
      default: {
        auto t = make_t5(in, c);
        check(c, posenc::compose<posenc::t5_bias<float>, posenc::clipped_bias<float>>(
                     t, posenc::clipped_bias<float>(in.range(0, 6), c.Hq, in.word(), 0.5)));
        break;
      }
    }
  } catch (posenc::error const&) {
    // The encoder rejected its parameters (e.g. an odd head_dim for RoPE): skipped.
  }
  return 0;
}
