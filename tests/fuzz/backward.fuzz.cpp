// SPDX-License-Identifier: MIT
// Fuzzes attention_backward: reference and fused agree (tolerance rule), with and without lse, on errors, NaN flow and mismatched lse.
#include <posenc/attention/attention.hpp>
#include <posenc/attention/backward.hpp>
#include <posenc/core/error.hpp>
#include <posenc/encoding/alibi.hpp>
#include <posenc/encoding/compose.hpp>
#include <posenc/encoding/clipped_bias.hpp>
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
#include <tuple>
#include <type_traits>
#include <vector>

#include "fuzz/fuzz_input.hpp"
#include "support/backward_check.hpp"
#include "support/tolerance.hpp"

namespace {

using posenc::index_t;
using posenc_fuzz::finding;
using posenc_fuzz::fuzz_input;

constexpr float inf = std::numeric_limits<float>::infinity();
constexpr double eps = std::numeric_limits<float>::epsilon() / 2;  // unit roundoff of float
constexpr float sentinel = 1234.5f;

/// What the encoder is, for the printed configuration and the rules that depend on it.
enum class enc_kind : int { none, rope, alibi, t5, clipped, shaw, rope_alibi, transformer_xl };
char const* const enc_names[] = {"none", "rope", "alibi", "t5_bias", "clipped_bias", "shaw", "rope+alibi",
                                 "transformer_xl"};

/// A tensor buffer with a (b, s, h, d) view over part of it: layout 0 (BSHD), 1 (BHSD) or
/// 2 (BSHD rows padded by 3), starting `shift` elements in. `inside` marks the viewed elements.
struct tensor {
  std::vector<float> buf;
  std::vector<char> inside;
  posenc::view<float> x;
  int layout = 0;
  index_t shift = 0;

  void shape(index_t b, index_t s, index_t h, index_t d, int lay, index_t sh) {
    layout = lay;
    shift = sh;
    index_t const rd = d + (layout == 2 ? 3 : 0);
    buf.assign(static_cast<std::size_t>(shift + b * s * h * rd), 0.0f);
    if (layout == 1)
      x = posenc::make_bhsd(buf.data() + shift, b, h, s, d);
    else
      x = {buf.data() + shift, b, s, h, d, s * h * rd, h * rd, rd, 1};
    inside.assign(buf.size(), 0);
    for (index_t i = 0; i < b; ++i)
      for (index_t j = 0; j < s; ++j)
        for (index_t k = 0; k < h; ++k)
          for (index_t e = 0; e < d; ++e) inside[static_cast<std::size_t>(&x(i, j, k, e) - buf.data())] = 1;
  }
  posenc::view<const float> cv() const { return x; }
  /// The viewed elements in (b, s, h, d) order.
  std::vector<float> logical() const {
    std::vector<float> r;
    for (index_t i = 0; i < x.batch; ++i)
      for (index_t j = 0; j < x.seq; ++j)
        for (index_t k = 0; k < x.heads; ++k)
          for (index_t e = 0; e < x.dim; ++e) r.push_back(x(i, j, k, e));
    return r;
  }
};

/// How often each check ran; printed at exit when POSENC_FUZZ_STATS is set.
struct stats_t {
  long inputs = 0, forward_ok = 0, accepted = 0, finite = 0, compared = 0, nonfinite = 0, mismatched = 0,
       mismatch_threw = 0, mismatch_equal = 0, mismatch_gray = 0, zero_rows = 0, poisoned_rows = 0;
  long per_kind[8] = {};
  ~stats_t() {
    if (!std::getenv("POSENC_FUZZ_STATS")) return;
    std::fprintf(stderr,
                 "inputs %ld forward ok %ld accepted %ld finite %ld compared %ld non-finite %ld rows: no key %ld "
                 "poisoned %ld; mismatched lse %ld (threw %ld, equal %ld, in between %ld); per encoder:",
                 inputs, forward_ok, accepted, finite, compared, nonfinite, zero_rows, poisoned_rows, mismatched,
                 mismatch_threw, mismatch_equal, mismatch_gray);
    for (long n : per_kind) std::fprintf(stderr, " %ld", n);
    std::fprintf(stderr, "\n");
  }
} stats;

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

/// One attention_backward call decoded from the input: shapes, layouts, values and options.
struct config {
  index_t B = 1, Sq = 1, Sk = 1, Hkv = 1, Hq = 1, D = 1, Dv = 1;
  tensor q, k, v, dout;                       // q, k, v may hold NaN / Inf; dout is finite
  tensor qc, kc, vc;                          // q, k, v with every non-finite value replaced by 0
  int dq_layout = 0, dk_layout = 0, dv_layout = 0;
  index_t dq_shift = 0, dk_shift = 0, dv_shift = 0;
  std::vector<float> fmask;
  std::unique_ptr<bool[]> bmask;
  std::vector<index_t> q_first, lens, q_ids, k_ids;
  posenc::attention_options<float> opt;
  bool finite_inputs = true;
  // The range every query and key position lies in (long double: offsets may be any 64-bit value).
  long double q_lo = 0, q_hi = 0, k_lo = 0, k_hi = 0;
  enc_kind kind = enc_kind::none;
  int mismatch = -1;  // which option the mismatched lse's forward pass changes (-1: none)

  void describe() const {
    std::fprintf(stderr,
                 "encoder %s B %ld Sq %ld Sk %ld Hq %ld Hkv %ld D %ld Dv %ld causal %d window %ld softcap %g "
                 "scale %g q_positions %s k_positions %s key_lengths %zu mask %d bool_mask %d keys_rotated %d "
                 "threads %d finite inputs %d layouts q %d k %d v %d dout %d dq %d dk %d dv %d mismatch %d\n",
                 enc_names[static_cast<int>(kind)], static_cast<long>(B), static_cast<long>(Sq),
                 static_cast<long>(Sk), static_cast<long>(Hq), static_cast<long>(Hkv), static_cast<long>(D),
                 static_cast<long>(Dv), opt.causal ? 1 : 0, static_cast<long>(opt.sliding_window), opt.softcap,
                 opt.scale ? *opt.scale : -0.0,
                 !opt.q_positions ? "default" : opt.q_positions->is_explicit() ? "ids"
                                  : opt.q_positions->is_per_batch() ? "per_batch" : "offset",
                 !opt.k_positions ? "default" : opt.k_positions->is_explicit() ? "ids" : "offset", lens.size(),
                 opt.mask.empty() ? 0 : 1, opt.bool_mask.empty() ? 0 : 1, opt.keys_rotated ? 1 : 0, opt.threads,
                 finite_inputs ? 1 : 0, q.layout, k.layout, v.layout, dout.layout, dq_layout, dk_layout, dv_layout,
                 mismatch);
  }

  void make(fuzz_input& in, tensor& t, tensor* clean, index_t b, index_t s, index_t h, index_t d) {
    int const layout = static_cast<int>(in.below(3));
    index_t const shift = in.below(2);
    double const amp = in.below(4) == 0 ? 8.0 : 1.0;
    std::uint64_t st = in.word() | 1;
    t.shape(b, s, h, d, layout, shift);
    for (auto& e : t.buf) {
      st ^= st << 13, st ^= st >> 7, st ^= st << 17;
      e = static_cast<float>(amp * (static_cast<double>(st >> 11) / 4503599627370496.0 - 1.0));
    }
    if (!clean) return;
    // A few non-finite values anywhere in the buffer (padding included).
    index_t const bad = in.below(8) == 0 ? 1 + in.below(3) : 0;
    for (index_t i = 0; i < bad && !t.buf.empty(); ++i) {
      float const kinds[] = {std::nanf(""), inf, -inf};
      t.buf[in.below(static_cast<std::uint32_t>(t.buf.size()))] = kinds[in.below(3)];
    }
    *clean = t;
    clean->x.data = clean->buf.data() + shift;
    for (auto& e : clean->buf)
      if (!std::isfinite(e)) e = 0;
  }

  static bool row_finite(posenc::view<const float> x, index_t b, index_t s, index_t h) {
    for (index_t d = 0; d < x.dim; ++d)
      if (!std::isfinite(x(b, s, h, d))) return false;
    return true;
  }
  static bool row_has_nan(posenc::view<const float> x, index_t b, index_t s, index_t h) {
    for (index_t d = 0; d < x.dim; ++d)
      if (std::isnan(x(b, s, h, d))) return true;
    return false;
  }

  explicit config(fuzz_input& in) {
    // The encoder first, so that short inputs reach every encoder.
    kind = static_cast<enc_kind>(in.below(8));
    B = 1 + in.below(2);
    Sq = in.below(32) == 31 ? 0 : in.range(1, 40);
    Sk = in.below(32) == 31 ? 0 : in.range(1, 40);
    static index_t const kv_heads[] = {1, 2, 4};
    Hkv = kv_heads[in.below(3)];
    Hq = Hkv * (1 + in.below(static_cast<std::uint32_t>(4 / Hkv)));
    D = in.range(1, 24);
    Dv = in.coin() ? D : in.range(1, 24);
    make(in, q, &qc, B, Sq, Hq, D);
    make(in, k, &kc, B, Sk, Hkv, D);
    make(in, v, &vc, B, Sk, Hkv, Dv);
    make(in, dout, nullptr, B, Sq, Hq, Dv);
    dq_layout = static_cast<int>(in.below(3)), dk_layout = static_cast<int>(in.below(3));
    dv_layout = static_cast<int>(in.below(3));
    dq_shift = in.below(2), dk_shift = in.below(2), dv_shift = in.below(2);
    for (index_t b = 0; b < B; ++b)
      for (index_t s = 0; s < Sq; ++s)
        for (index_t h = 0; h < Hq; ++h) finite_inputs = finite_inputs && row_finite(q.cv(), b, s, h);
    for (index_t b = 0; b < B; ++b)
      for (index_t s = 0; s < Sk; ++s)
        for (index_t h = 0; h < Hkv; ++h)
          finite_inputs = finite_inputs && row_finite(k.cv(), b, s, h) && row_finite(v.cv(), b, s, h);

    static double const scales[] = {0.125, 0.5, 1.0, 2.0, 0.01, 8.0, 0.0, -1.0, std::nan(""), INFINITY};
    if (in.coin()) opt.scale = scales[in.below(10)];
    opt.causal = in.coin();
    if (in.below(4) == 0) opt.sliding_window = in.range(in.below(8) == 0 ? -1 : 1, 12);
    static double const caps[] = {0.5, 1.0, 5.0, 30.0, 50.0, -1.0, std::nan("")};
    if (in.below(3) == 0) opt.softcap = caps[in.below(7)];
    auto pos = [&] { return in.below(16) == 0 ? static_cast<index_t>(in.word()) : in.range(-10, 100); };
    auto widen = [](long double& lo, long double& hi, long double a, long double b) {
      lo = std::min(lo, a);
      hi = std::max(hi, b);
    };
    // Default query positions: i (Sq == Sk) or key_length(b) - Sq + i, key_length in 0 .. Sk + 1.
    q_lo = -static_cast<long double>(Sq) - 1, q_hi = static_cast<long double>(Sk + Sq + 1);
    k_lo = 0, k_hi = static_cast<long double>(Sk);
    switch (in.below(5)) {
      case 1: {
        index_t const o = pos();
        opt.q_positions = posenc::position_span(o);
        q_lo = q_hi = static_cast<long double>(o);
        widen(q_lo, q_hi, o, static_cast<long double>(o) + Sq);
        break;
      }
      case 2:
        for (index_t b = 0; b < B; ++b) q_first.push_back(pos());
        opt.q_positions = posenc::position_span::per_batch(q_first);
        q_lo = q_hi = static_cast<long double>(q_first[0]);
        for (index_t f : q_first) widen(q_lo, q_hi, f, static_cast<long double>(f) + Sq);
        break;
      case 3: {
        index_t const ib = in.coin() ? 1 : B;
        for (index_t n = 0; n < ib * Sq; ++n) q_ids.push_back(in.below(4) == 0 ? pos() : in.range(-5, 100));
        opt.q_positions = posenc::position_span::ids(q_ids.data(), ib, Sq);
        q_lo = q_hi = 0;
        for (index_t f : q_ids) widen(q_lo, q_hi, f, f);
        break;
      }
      default: break;
    }
    switch (in.below(4)) {
      case 1: {
        index_t const o = pos();
        opt.k_positions = posenc::position_span(o);
        k_lo = k_hi = static_cast<long double>(o);
        widen(k_lo, k_hi, o, static_cast<long double>(o) + Sk);
        break;
      }
      case 2: {
        index_t const ib = in.coin() ? 1 : B;
        for (index_t n = 0; n < ib * Sk; ++n) k_ids.push_back(in.range(-5, 100));
        opt.k_positions = posenc::position_span::ids(k_ids.data(), ib, Sk);
        for (index_t f : k_ids) widen(k_lo, k_hi, f, f);
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
      // A mask with a zero extent has a null pointer (an empty vector): every call form must
      // take it without pointer arithmetic on null (UBSan checks).
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
    opt.threads = static_cast<int>(in.below(3));
    mismatch = in.below(3) == 0 ? static_cast<int>(in.below(4)) : -1;
  }

  /// The largest |q_pos - k_pos| and |position| any pair can have (a bound).
  long double max_distance() const { return std::max(q_hi - k_lo, k_hi - q_lo); }
  long double max_position() const {
    return std::max({std::fabs(q_lo), std::fabs(q_hi), std::fabs(k_lo), std::fabs(k_hi)});
  }
};

// ---- encoder gradients: visit every value, whatever the encoder's gradients type ----

template <class G, class F>
void each_value(G& g, F&& f) {  // every gradients type visits its tensors (traits.hpp)
  g.for_each_tensor([&](char const*, auto& t) {
    for (Eigen::Index i = 0; i < t.size(); ++i) f(t.data()[i]);
  });
}

/// -0.0: the encoder gradients' sentinel. Gradients are added into, and -0 + x is x exactly
/// (so the values are not disturbed), while an addition, even of +0, changes its bits.
template <class G>
void fill_sentinel(G& g) {
  each_value(g, [](auto& x) { x = -static_cast<std::decay_t<decltype(x)>>(0); });
}
template <class G>
bool untouched(G const& g) {
  bool ok = true;
  each_value(g, [&](auto const& x) { ok = ok && x == 0 && std::signbit(x); });
  return ok;
}
template <class G>
std::vector<double> flat(G const& g) {
  std::vector<double> r;
  each_value(g, [&](auto const& x) { r.push_back(static_cast<double>(x)); });
  return r;
}

/// Every gradient of one backward call, in logical order.
struct gradients {
  std::vector<float> dq, dk, dv;
  std::vector<double> enc;
};

/// The forward pass's results the backward pass reads.
struct forward {
  std::vector<float> out, lse;
};

enum class which { dq, dk, dv, enc };
char const* const which_names[] = {"dq", "dk", "dv", "encoder gradients"};

/// Runs attention_backward on Path with `lse` (null: none given). False when it threw
/// posenc::error, which must leave dq, dk, dv and the encoder gradients untouched; a call
/// that succeeds writes nothing outside the views and never writes the lse it reads.
template <class Path, class E, class G>
bool backward(config const& c, E const& enc, G const& g0, forward const& fw, std::vector<float> const* lse,
              gradients& r, char const* name) {
  tensor dq, dk, dv;
  dq.shape(c.B, c.Sq, c.Hq, c.D, c.dq_layout, c.dq_shift);
  dk.shape(c.B, c.Sk, c.Hkv, c.D, c.dk_layout, c.dk_shift);
  dv.shape(c.B, c.Sk, c.Hkv, c.Dv, c.dv_layout, c.dv_shift);
  for (tensor* t : {&dq, &dk, &dv}) std::fill(t->buf.begin(), t->buf.end(), sentinel);
  G g = g0;
  fill_sentinel(g);
  posenc::attention_options<float> o = c.opt;
  std::vector<float> lse_copy;
  if (lse) {
    lse_copy = *lse;
    o.lse = lse_copy;
  } else {
    o.lse = nullptr;
  }
  auto const out = posenc::make_bshd(static_cast<float const*>(fw.out.data()), c.B, c.Sq, c.Hq, c.Dv);
  posenc::view<const float> const d = c.dout.cv();
  bool ok = true;
  try {
    posenc::attention_backward<Path>(c.q.cv(), c.k.cv(), c.v.cv(), out, d, dq.x, dk.x, dv.x, enc, o, g);
  } catch (posenc::error const&) {
    ok = false;
  }
  auto untouched_buffers = [&](bool padding_only) {
    for (tensor const* t : {&dq, &dk, &dv})
      for (std::size_t i = 0; i < t->buf.size(); ++i)
        if ((!padding_only || !t->inside[i]) && !same_bits(t->buf[i], sentinel)) return false;
    return true;
  };
  if (!ok) {
    if (!untouched_buffers(false) || !untouched(g)) {
      c.describe();
      std::fprintf(stderr, "path %s, lse %s\n", name, lse ? "given" : "null");
      finding("posenc::error thrown after writing dq, dk, dv or the encoder gradients");
    }
    return false;
  }
  if (!untouched_buffers(true)) {
    c.describe();
    std::fprintf(stderr, "path %s, lse %s\n", name, lse ? "given" : "null");
    finding("attention_backward wrote outside dq, dk or dv");
  }
  if (lse)
    for (std::size_t i = 0; i < lse->size(); ++i)
      if (!same_bits((*lse)[i], lse_copy[i])) {
        c.describe();
        finding("attention_backward wrote into the given lse");
      }
  r.dq = dq.logical();
  r.dk = dk.logical();
  r.dv = dv.logical();
  r.enc = flat(g);
  return true;
}

/// The error floors of the tolerance rule for each gradient (see `floors`).
struct floors_t {
  double dq = 0, dk = 0, dv = 0, enc = 0;
  std::vector<double> row_p_rel;  // per row (b, h, i): the relative error bound of its probabilities
  double of(which w) const { return w == which::dq ? dq : w == which::dk ? dk : w == which::dv ? dv : enc; }
};

/// Compares `got` against `ref` under the tolerance rule of tests/support/tolerance.hpp:
/// |got - ref| <= 2 |plain - ref_plain| + max(1e-6 max(1, |ref|), floor), where `plain`
/// is the plain float implementation's result and `ref_plain` the double reference it is
/// measured against (the same as `ref` when `ref` is the reference). `doubled`: got and ref
/// are two results that each meet the rule against ref_plain (the with- and without-lse calls
/// of one path), so their difference is bounded by twice the rule. Elements non-finite in
/// either must be non-finite in both.
template <class A, class R, class P, class Q>
bool agree(A const& got, R const& ref, P const& plain, Q const& ref_plain, double floor, bool doubled,
           char const* what, config const& c, which w) {
  double err = 0, plain_err = 0, mag = 0;
  std::size_t worst = 0;
  bool bad_finite = false;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    double const g = static_cast<double>(got[i]), e = static_cast<double>(ref[i]);
    if (!std::isfinite(e) || !std::isfinite(g)) {
      // Only results of the same non-finite inputs meet here (NaN is not NaN's equal).
      if (std::isfinite(g) != std::isfinite(e)) bad_finite = true, worst = i;
      continue;
    }
    if (std::abs(g - e) > err) err = std::abs(g - e), worst = i;
    mag = std::max(mag, std::abs(e));
    double const p = static_cast<double>(plain[i]), rp = static_cast<double>(ref_plain[i]);
    if (std::isfinite(p) && std::isfinite(rp)) plain_err = std::max(plain_err, std::abs(p - rp));
  }
  double bound = 2 * plain_err + std::max(1e-6 * std::max(1.0, mag), floor);
  if (doubled) bound *= 2;
  if (!bad_finite && err <= bound) return true;
  c.describe();
  std::fprintf(stderr,
               "%s: %s: error %g, plain float error %g, magnitude %g, floor %g, bound %g; element %zu: %g vs %g\n",
               what, which_names[static_cast<int>(w)], err, plain_err, mag, floor, bound, worst,
               worst < ref.size() ? static_cast<double>(got[worst]) : 0.0,
               worst < ref.size() ? static_cast<double>(ref[worst]) : 0.0);
  return false;
}

/// What the forward pass gives on the finite copy of the inputs: biased scores (-inf exactly
/// at the pairs a row does not see), raw scores (before softcap) and probabilities, each
/// (B, Hq, Sq, Sk).
struct pairs {
  std::vector<float> biased, raw, prob;
  bool ok = false;
};

template <class E>
pairs clean_pairs(config const& c, E const& enc) {
  pairs p;
  std::size_t const n = static_cast<std::size_t>(c.B * c.Hq * c.Sq * c.Sk);
  std::vector<float> out(static_cast<std::size_t>(c.B * c.Sq * c.Hq * c.Dv) + 1);
  auto one = [&](std::vector<float>& s, posenc::score_stage stage) {
    s.assign(n + 1, 0.0f);
    posenc::attention_options<float> o = c.opt;
    o.scores = {s.data(), static_cast<index_t>(n)};
    o.scores_stage = stage;
    try {
      posenc::attention<posenc::path::reference>(c.qc.cv(), c.kc.cv(), c.vc.cv(),
                                                 posenc::make_bshd(out.data(), c.B, c.Sq, c.Hq, c.Dv), enc, o);
    } catch (posenc::error const&) {
      return false;
    }
    return true;
  };
  p.ok = one(p.biased, posenc::score_stage::biased) && one(p.raw, posenc::score_stage::raw) &&
         one(p.prob, posenc::score_stage::probabilities);
  return p;
}

/// Norm of row (b, s, h) of x over its first `dim` values, in double.
double norm(posenc::view<const float> x, index_t b, index_t s, index_t h) {
  double n = 0;
  for (index_t d = 0; d < x.dim; ++d) n += double(x(b, s, h, d)) * double(x(b, s, h, d));
  return std::sqrt(n);
}

/// The error floors of the tolerance rule, to first order in eps = 2^-24, from the magnitudes
/// of the terms each gradient sums (finite inputs only). No float implementation avoids them:
///
/// - the score s_ij: each path sums q . k in float in its own order, off by up to
///   D eps |q| |k| scale (|q_d k_d| summed, bounded by the norms, which a rotation keeps up
///   to the attention factor of YaRN or LongRoPE, hence `gain`), passed on by a softcap c as
///   sech^2(raw / c); plus one rounding of the logit and of the lse (2 eps (|s| + |lse|)).
///   Where q . k cancels this is far above eps |s|, and the paths' orders give errors of that
///   size, not of the plain implementation's. P_ij = exp(s_ij - lse_i) moves by that error
///   relative, twice (s_ij and lse_i): by up to expm1(2 max_j e_ij) =: pe_i;
/// - dP_ij = dO_i . v_j and Delta_i = dO_i . O_i are float sums over Dv: off by
///   Dv eps |dO_i| (|v_j| + max |v|) (O_i is a mean of the v_j);
/// - so dS_ij = P_ij (dP_ij - Delta_i) is off by
///   P_ij |dO_i| (|v_j| + max |v|) (pe_i + Dv eps (1 + pe_i)) and, under a softcap, the factor
///   1 - tanh^2(raw / c) by 2 e_raw / c; |dS_ij| <= P_ij |dO_i| (|v_j| + max |v|);
/// - each gradient sums such terms over n pairs in float: n eps times the sum of their
///   magnitudes, beside the propagated error. dq_i = scale sum_j dS_ij k_j (|k_j| for
///   |k_jd|: a rotation moves the dims), dk_j = scale sum_i dS_ij q_i, dv_j = sum_i P_ij dO_i,
///   and the encoders' parameter gradients sum dS_ij (bias tables, times the distance for
///   ALiBi's slopes), scale dS_ij q_i (Shaw's keys) or P_ij dO_i (Shaw's values) over all pairs.
/// Shaw's relative key and value rows add to |k_j| and |v_j| in these sums.
template <class E>
floors_t floors(config const& c, E const& enc, pairs const& pr, std::vector<float> const& lse) {
  floors_t f;
  f.row_p_rel.assign(static_cast<std::size_t>(c.B * c.Hq * c.Sq), 0.0);
  bool const capped = c.opt.softcap > 0;
  double const scale = c.opt.scale ? std::abs(*c.opt.scale) : 1.0 / std::sqrt(double(c.D));
  double const gain =
      c.kind == enc_kind::rope || c.kind == enc_kind::rope_alibi ? 2.0 : 1.0;  // attention factor of a rotation
  double ak = 0, av = 0;  // Shaw's largest relative key and value rows
  if constexpr (std::is_same_v<E, posenc::shaw<float>>) {
    for (index_t r = 0; r <= 2 * enc.max_distance(); ++r) {
      double nk = 0, nv = 0;
      for (index_t d = 0; d < enc.head_dim(); ++d) {
        nk += double(enc.key_weight(r, d)) * double(enc.key_weight(r, d));
        if (enc.has_values()) nv += double(enc.value_weight(r, d)) * double(enc.value_weight(r, d));
      }
      ak = std::max(ak, std::sqrt(nk)), av = std::max(av, std::sqrt(nv));
    }
  }
  double uq = 0;  // Transformer-XL: |u| added to q (entries of u, v, W_R in [-0.5, 0.5]), and |R_h(d)| <= 4 sqrt(D)
  if (c.kind == enc_kind::transformer_xl) {  // (pos_dim <= 8 sinusoids of modulus <= 1) beside k
    uq = 0.5 * std::sqrt(double(c.D));
    ak = 4 * std::sqrt(double(c.D)) + uq;
  }
  double const gd = double(c.D) * eps, gv = double(c.Dv) * eps;
  index_t const group = c.Hq / c.Hkv;
  std::vector<double> nq(static_cast<std::size_t>(c.B * c.Sq * c.Hq)), ndo(nq.size()),
      nk(static_cast<std::size_t>(c.B * c.Sk * c.Hkv)), nv(nk.size());
  double max_v = 0, max_do = 0;
  for (index_t b = 0; b < c.B; ++b)
    for (index_t i = 0; i < c.Sq; ++i)
      for (index_t h = 0; h < c.Hq; ++h) {
        auto const at = static_cast<std::size_t>((b * c.Sq + i) * c.Hq + h);
        nq[at] = gain * norm(c.qc.cv(), b, i, h) + uq;
        ndo[at] = norm(c.dout.cv(), b, i, h);
        for (index_t d = 0; d < c.Dv; ++d) max_do = std::max(max_do, std::abs(double(c.dout.cv()(b, i, h, d))));
      }
  for (index_t b = 0; b < c.B; ++b)
    for (index_t j = 0; j < c.Sk; ++j)
      for (index_t h = 0; h < c.Hkv; ++h) {
        auto const at = static_cast<std::size_t>((b * c.Sk + j) * c.Hkv + h);
        nk[at] = gain * norm(c.kc.cv(), b, j, h) + ak;
        nv[at] = norm(c.vc.cv(), b, j, h) + av;
        max_v = std::max(max_v, nv[at]);
      }
  // Pairs each gradient element sums over: rows of a kv group, keys of a row, all pairs.
  double const n_rows = double(c.Sq * group), n_keys = double(c.Sk), n_all = double(c.B * c.Hq * c.Sq * c.Sk);
  if (!pr.ok) {
    // No scores (Transformer-XL's cut memory, which only the reference path runs): bounds that
    // hold for any visibility, from sum_j P_ij <= 1 and the rounding of a float lse (relative
    // error eps |lse| of P, twice), the only difference between the reference's two calls.
    double lmax = 0, qmax = 0, kmax = 0, domax = 0;
    for (float x : lse)
      if (std::isfinite(x)) lmax = std::max(lmax, std::abs(double(x)));
    for (double x : nq) qmax = std::max(qmax, x);
    for (double x : nk) kmax = std::max(kmax, x);
    for (double x : ndo) domax = std::max(domax, x);
    double const pe = std::min(std::expm1(4 * eps * (lmax + std::log(n_keys + 1))), 1e30);
    double const ds = domax * 2 * max_v, err = 2 * pe + 2 * n_all * eps;
    f.dq = scale * ds * err * kmax;
    f.dk = scale * ds * err * qmax * n_rows;
    f.dv = err * max_do * n_rows;
    f.enc = std::max(scale * ds * err * (qmax + kmax) * n_all, err * max_do * n_all);
    return f;
  }
  std::vector<double> dk_err(nk.size()), dv_err(nk.size());
  double bias_err = 0, key_err = 0, value_err = 0;
  for (index_t b = 0; b < c.B; ++b)
    for (index_t h = 0; h < c.Hq; ++h)
      for (index_t i = 0; i < c.Sq; ++i) {
        auto const qi = static_cast<std::size_t>((b * c.Sq + i) * c.Hq + h);
        auto const row = static_cast<std::size_t>(((b * c.Hq + h) * c.Sq + i) * c.Sk);
        double const l = std::isfinite(lse[(b * c.Hq + h) * c.Sq + i]) ? std::abs(double(lse[(b * c.Hq + h) * c.Sq + i]))
                                                                        : 0.0;
        // Per pair: e_raw (raw score error), e (logit error after the softcap).
        double p_rel = 0;
        for (index_t j = 0; j < c.Sk; ++j) {
          if (!std::isfinite(pr.biased[row + j])) continue;
          auto const kj = static_cast<std::size_t>((b * c.Sk + j) * c.Hkv + h / group);
          double e = scale * gd * nq[qi] * nk[kj];
          if (capped) {
            double const ch = std::cosh(double(pr.raw[row + j]) / c.opt.softcap);
            e = std::isfinite(ch) ? e / (ch * ch) : 0.0;
          }
          p_rel = std::max(p_rel, 2 * (e + 2 * eps * (std::abs(double(pr.biased[row + j])) + l)));
        }
        f.row_p_rel[static_cast<std::size_t>((b * c.Hq + h) * c.Sq + i)] = p_rel;
        // exp(s + e) = exp(s) (1 + expm1(e)): the relative error of P, not first order once the
        // logits are so large that their rounding moves P by O(1) (no float path resolves
        // such probabilities; the floor then covers every answer). Capped so that 0 x cap is 0.
        double const pe = std::min(std::expm1(p_rel), 1e30);
        double dq_err = 0;
        for (index_t j = 0; j < c.Sk; ++j) {
          if (!std::isfinite(pr.biased[row + j])) continue;
          auto const kj = static_cast<std::size_t>((b * c.Sk + j) * c.Hkv + h / group);
          double const p = double(pr.prob[row + j]);
          double const ds = p * ndo[qi] * (nv[kj] + max_v);  // bound on |dS_ij|
          double dds = ds * (pe + gv * (1 + pe));             // error of dS_ij
          if (capped) dds += ds * 2 * scale * gd * nq[qi] * nk[kj] / c.opt.softcap;
          dq_err += scale * (dds + n_keys * eps * ds * (1 + pe)) * nk[kj];
          dk_err[kj] += scale * (dds + n_rows * eps * ds * (1 + pe)) * nq[qi];
          dv_err[kj] += (p * pe + n_rows * eps * p * (1 + pe)) * max_do;
          bias_err += dds + n_all * eps * ds * (1 + pe);
          key_err += scale * (dds + n_all * eps * ds * (1 + pe)) * nq[qi];
          value_err += (p * pe + n_all * eps * p * (1 + pe)) * max_do;
        }
        f.dq = std::max(f.dq, dq_err);
      }
  for (double x : dk_err) f.dk = std::max(f.dk, x);
  for (double x : dv_err) f.dv = std::max(f.dv, x);
  double dist = 1;
  if (c.kind == enc_kind::alibi || c.kind == enc_kind::rope_alibi)
    dist = static_cast<double>(std::max(c.max_distance(), c.max_position()) + c.Sk + 2);
  f.enc = std::max({bias_err * dist, key_err, value_err});
  return f;
}

/// Checks the gradients of a call that succeeded against the non-finite rule: a query row
/// that sees at least one key and reads a NaN in its q row or in the k row of a key it sees,
/// or a NaN or Inf in the v row of a key it sees with probability >= the smallest normal float
/// (a key of probability 0 may add nothing, and whether a tiny one is 0 depends on the
/// precision), has a non-finite dq row. An Inf in q or k may give a score of -inf (the key
/// then counts as masked, its v unread) or, under a softcap, a finite one, so it is required
/// to poison the row only where the score q . k it gives is NaN or +inf, which the harness
/// computes for encoders that do not rotate or add terms to q . k; and the finite copy's
/// probability of a key is the key's own only where its q and k rows are finite. A row with
/// no visible key has dq exactly 0. On finite inputs every gradient is finite.
template <class E>
void nonfinite_rule(config const& c, E const&, pairs const& pr, gradients const& g, char const* what) {
  index_t const group = c.Hq / c.Hkv;
  bool const plain_dot = c.opt.softcap <= 0 &&
                         (c.kind == enc_kind::none || c.kind == enc_kind::alibi || c.kind == enc_kind::t5 ||
                          c.kind == enc_kind::clipped);
  double const scale = c.opt.scale ? *c.opt.scale : 1.0 / std::sqrt(double(c.D));
  for (index_t b = 0; b < c.B && pr.ok; ++b)
    for (index_t h = 0; h < c.Hq; ++h)
      for (index_t i = 0; i < c.Sq; ++i) {
        auto const row = static_cast<std::size_t>(((b * c.Hq + h) * c.Sq + i) * c.Sk);
        bool sees = false, poisoned = false;
        for (index_t j = 0; j < c.Sk; ++j) {
          if (!std::isfinite(pr.biased[row + j])) continue;
          sees = true;
          index_t const hk = h / group;
          if (config::row_has_nan(c.k.cv(), b, j, hk)) poisoned = true;
          // The finite copy's probability is the key's own only where q and k are finite.
          if (pr.prob[row + j] >= std::numeric_limits<float>::min() && !config::row_finite(c.v.cv(), b, j, hk) &&
              config::row_finite(c.q.cv(), b, i, h) && config::row_finite(c.k.cv(), b, j, hk))
            poisoned = true;
          if (plain_dot && (!config::row_finite(c.q.cv(), b, i, h) || !config::row_finite(c.k.cv(), b, j, hk))) {
            double s = 0;
            for (index_t d = 0; d < c.D; ++d) s += double(c.q.cv()(b, i, h, d)) * double(c.k.cv()(b, j, hk, d));
            s *= scale;
            if (std::isnan(s) || s == INFINITY) poisoned = true;
          }
        }
        if (sees && config::row_has_nan(c.q.cv(), b, i, h)) poisoned = true;
        auto const at = static_cast<std::size_t>(((b * c.Sq + i) * c.Hq + h) * c.D);
        bool row_finite = true, row_zero = true;
        for (index_t d = 0; d < c.D; ++d) {
          float const x = g.dq[at + static_cast<std::size_t>(d)];
          row_finite = row_finite && std::isfinite(x);
          row_zero = row_zero && x == 0.0f;
        }
        char const* bad = nullptr;
        if (!sees && !row_zero) bad = "a row with no visible key has a dq row that is not 0";
        if (sees && poisoned && row_finite) bad = "a row that reads a NaN has a finite dq row";
        stats.zero_rows += sees ? 0 : 1;
        stats.poisoned_rows += sees && poisoned ? 1 : 0;
        if (!bad) continue;
        c.describe();
        std::fprintf(stderr, "%s: row b %ld i %ld h %ld sees %d, q finite %d; dq:", what, static_cast<long>(b),
                     static_cast<long>(i), static_cast<long>(h), sees ? 1 : 0,
                     config::row_finite(c.q.cv(), b, i, h) ? 1 : 0);
        for (index_t d = 0; d < c.D; ++d) std::fprintf(stderr, " %g", g.dq[at + static_cast<std::size_t>(d)]);
        std::fprintf(stderr, "\n");
        for (index_t j = 0; j < c.Sk; ++j)
          if (std::isfinite(pr.biased[row + j]))
            std::fprintf(stderr, "  visible key %ld: biased score of the finite copy %g, probability %g, k finite %d, "
                         "v finite %d\n",
                         static_cast<long>(j), pr.biased[row + j], pr.prob[row + j],
                         config::row_finite(c.k.cv(), b, j, h / group) ? 1 : 0,
                         config::row_finite(c.v.cv(), b, j, h / group) ? 1 : 0);
        finding(bad);
      }
  if (!c.finite_inputs) return;
  bool fin = true;
  for (float x : g.dq) fin = fin && std::isfinite(x);
  for (float x : g.dk) fin = fin && std::isfinite(x);
  for (float x : g.dv) fin = fin && std::isfinite(x);
  for (double x : g.enc) fin = fin && std::isfinite(x);
  if (!fin) {
    c.describe();
    std::fprintf(stderr, "%s\n", what);
    // The first element that is not finite of each gradient.
    auto first_bad = [](char const* name, auto const& x) {
      for (std::size_t i = 0; i < x.size(); ++i)
        if (!std::isfinite(static_cast<double>(x[i]))) {
          std::fprintf(stderr, "  %s[%zu] = %g (of %zu)\n", name, i, static_cast<double>(x[i]), x.size());
          return;
        }
    };
    first_bad("dq", g.dq), first_bad("dk", g.dk), first_bad("dv", g.dv), first_bad("encoder", g.enc);
    finding("a gradient is not finite although every input is");
  }
}

/// Compares every gradient of two results under the rule (see `agree`).
bool agree_all(gradients const& got, gradients const& ref, gradients const& plain, gradients const& ref_plain,
               floors_t const& fl, bool doubled, char const* what, config const& c) {
  return agree(got.dq, ref.dq, plain.dq, ref_plain.dq, fl.dq, doubled, what, c, which::dq) &&
         agree(got.dk, ref.dk, plain.dk, ref_plain.dk, fl.dk, doubled, what, c, which::dk) &&
         agree(got.dv, ref.dv, plain.dv, ref_plain.dv, fl.dv, doubled, what, c, which::dv) &&
         agree(got.enc, ref.enc, plain.enc, ref_plain.enc, fl.enc, doubled, what, c, which::enc);
}

/// The non-finite pattern (finite or not, per element) of two results is the same.
bool same_pattern(gradients const& a, gradients const& b) {
  auto one = [](auto const& x, auto const& y) {
    if (x.size() != y.size()) return false;
    for (std::size_t i = 0; i < x.size(); ++i)
      if (std::isfinite(static_cast<double>(x[i])) != std::isfinite(static_cast<double>(y[i]))) return false;
    return true;
  };
  return one(a.dq, b.dq) && one(a.dk, b.dk) && one(a.dv, b.dv) && one(a.enc, b.enc);
}

/// The options of a forward pass that differs from c.opt (c.mismatch says how), or false
/// when the change is not possible for this configuration.
bool mismatched_options(config const& c, posenc::attention_options<float>& o) {
  o = c.opt;
  o.lse = nullptr;
  switch (c.mismatch) {
    case 0: o.causal = !o.causal; return true;  // under a sliding window: the same function
    case 1: {
      double const s = c.opt.scale ? *c.opt.scale : 1.0 / std::sqrt(double(c.D));
      o.scale = 2 * s + 0.25;
      return true;
    }
    case 2: o.softcap = o.softcap > 0 ? 0.0 : 1.0; return true;
    case 3:
      if (o.mask.empty() && o.bool_mask.empty() && o.key_lengths.empty()) return false;
      o.mask = {}, o.bool_mask = {}, o.key_lengths = {};
      return true;
    default: return false;
  }
}

template <class E>
void check(config const& c, E const& enc) {
  using G = posenc::encoder_gradients_t<E>;
  constexpr bool fused = !posenc::detail::fused_backward_excluded<E>::value;
  G const g0 = posenc::make_gradients(enc);
  std::size_t const rows = static_cast<std::size_t>(c.B * c.Hq * c.Sq);

  // The forward pass (reference) for out and lse.
  forward fw;
  fw.out.assign(static_cast<std::size_t>(c.B * c.Sq * c.Hq * c.Dv), 0.0f);
  fw.lse.assign(rows, 0.0f);
  bool forward_ok = true;
  {
    posenc::attention_options<float> o = c.opt;
    o.lse = fw.lse;
    try {
      posenc::attention<posenc::path::reference>(c.q.cv(), c.k.cv(), c.v.cv(),
                                                 posenc::make_bshd(fw.out.data(), c.B, c.Sq, c.Hq, c.Dv), enc, o);
    } catch (posenc::error const&) {
      forward_ok = false;
    }
  }

  // The backward pass on both paths, lse given (index 0) and not (index 1).
  gradients ref[2], fus[2];
  bool r_ok[2] = {false, false}, f_ok[2] = {false, false};
  for (int m = 0; m < 2; ++m) {
    std::vector<float> const* lse = m == 0 ? &fw.lse : nullptr;
    r_ok[m] = backward<posenc::path::reference>(c, enc, g0, fw, lse, ref[m], "reference");
    if constexpr (fused) {
      f_ok[m] = backward<posenc::path::fused>(c, enc, g0, fw, lse, fus[m], "fused");
    } else {
      f_ok[m] = r_ok[m];
    }
    if (r_ok[m] != f_ok[m]) {
      c.describe();
      std::fprintf(stderr, "lse %s: reference accepts %d, fused accepts %d\n", m == 0 ? "given" : "null", r_ok[m],
                   f_ok[m]);
      finding("the paths disagree on whether the arguments are valid");
    }
    if (!forward_ok && r_ok[m]) {
      c.describe();
      finding("attention_backward accepts arguments the forward pass rejects");
    }
  }
  if (!forward_ok) return;
  ++stats.forward_ok;
  if (r_ok[0] != r_ok[1]) {
    c.describe();
    std::fprintf(stderr, "accepted with lse %d, without %d\n", r_ok[0], r_ok[1]);
    finding("the matched lse of the forward pass changes whether the call is valid");
  }
  if (!r_ok[1]) return;
  ++stats.accepted;
  ++stats.per_kind[static_cast<int>(c.kind)];
  if (c.finite_inputs) ++stats.finite;
  else ++stats.nonfinite;

  pairs const pr = clean_pairs(c, enc);
  index_t cut_keys = 0;  // Transformer-XL cut its memory: the forward pass has no scores output then
  if constexpr (std::is_same_v<E, posenc::transformer_xl<float>>)
    if (enc.memory_length() > 0 && c.Sk - c.Sq > enc.memory_length()) cut_keys = c.Sk - c.Sq - enc.memory_length();
  bool const cut = cut_keys > 0;
  if (!pr.ok && !cut) finding("the forward pass rejects the finite copy of valid inputs");
  if (cut) {
    // The cut keys get dk = dv = 0 exactly.
    index_t const n = cut_keys;
    for (int m = 0; m < 2; ++m)
      for (index_t b = 0; b < c.B; ++b)
        for (index_t j = 0; j < n; ++j)
          for (index_t h = 0; h < c.Hkv; ++h) {
            auto const at = static_cast<std::size_t>((b * c.Sk + j) * c.Hkv + h);
            bool zero = true;
            for (index_t d = 0; d < c.D; ++d) zero = zero && ref[m].dk[at * c.D + d] == 0.0f;
            for (index_t d = 0; d < c.Dv; ++d) zero = zero && ref[m].dv[at * c.Dv + d] == 0.0f;
            if (!zero) {
              c.describe();
              finding("a key cut from Transformer-XL's memory has dk or dv that is not 0");
            }
          }
  }
  for (int m = 0; m < 2; ++m) {
    nonfinite_rule(c, enc, pr, ref[m], m == 0 ? "reference, lse given" : "reference, lse null");
    if constexpr (fused) nonfinite_rule(c, enc, pr, fus[m], m == 0 ? "fused, lse given" : "fused, lse null");
  }

  // The plain float implementations the rule measures against: the reference formulas in
  // float (for the reference path's own with/without-lse agreement) and the same with
  // Delta = dO . O (the fused path's formulas: tests/support/backward_check.hpp).
  floors_t const fl = floors(c, enc, pr, fw.lse);
  if (c.finite_inputs) {
    for (int m = 0; m < 2; ++m) {
      std::vector<float> const* lse = m == 0 ? &fw.lse : nullptr;
      gradients plain, flash;
      // A plain float path may reject the matched lse (its sums are in float): then without lse.
      if (!backward<posenc_test::plain_backward_path>(c, enc, g0, fw, lse, plain, "plain") &&
          !backward<posenc_test::plain_backward_path>(c, enc, g0, fw, nullptr, plain, "plain"))
        finding("the plain float path rejects valid arguments");
      if (!backward<posenc_test::plain_flash_backward_path>(c, enc, g0, fw, lse, flash, "plain flash") &&
          !backward<posenc_test::plain_flash_backward_path>(c, enc, g0, fw, nullptr, flash, "plain flash"))
        finding("the plain float path rejects valid arguments");
      ++stats.compared;
      if constexpr (fused) {
        if (!agree_all(fus[m], ref[m], flash, ref[m], fl, false, m == 0 ? "fused vs reference, lse given"
                                                                        : "fused vs reference, lse null",
                       c))
          finding("the fused gradients differ from the reference's");
      }
      if (m == 1) {
        // With and without lse, on one path: each within the rule of the reference without lse.
        if (!agree_all(ref[0], ref[1], plain, ref[1], fl, true, "reference: lse given vs null", c))
          finding("the reference path's gradients with and without lse differ");
        if constexpr (fused) {
          if (!agree_all(fus[0], fus[1], flash, ref[1], fl, true, "fused: lse given vs null", c))
            finding("the fused path's gradients with and without lse differ");
        }
      }
    }
  }

  // A mismatched lse: that of a forward pass with other options. Each row's
  // sum_j exp(s_ij - lse'_i) is exp(lse_i - lse'_i) = r_i up to the score errors; the check
  // accepts |log r_i| <= tol_i = 2^12 eps_float (sqrt(Sk) + |lse'_i|). A row where log r_i is off
  // by more than twice that plus the score error must make the call throw. Where lse' equals
  // lse bit for bit (the options did not change the function) the call must give the
  // matched call's gradients within the rule. Between the two, the contract accepts an lse
  // off by up to tol_i, which scales each row's gradients by r_i: beyond the float rule, so
  // only the non-finite pattern is compared there.
  posenc::attention_options<float> mo;
  if (c.mismatch < 0 || !mismatched_options(c, mo)) return;
  std::vector<float> lse_w(rows, 0.0f), out_w(fw.out.size());
  mo.lse = lse_w;
  try {
    posenc::attention<posenc::path::reference>(c.q.cv(), c.k.cv(), c.v.cv(),
                                               posenc::make_bshd(out_w.data(), c.B, c.Sq, c.Hq, c.Dv), enc, mo);
  } catch (posenc::error const&) {
    return;  // the other options are not valid here
  }
  bool must_throw = false, equal = true;
  double const log_sk = std::log(double(c.Sk) + 1);
  for (std::size_t r = 0; r < rows; ++r) {
    double const a = fw.lse[r], w = lse_w[r];
    equal = equal && same_bits(fw.lse[r], lse_w[r]);
    if (std::isnan(a) || std::isnan(w)) continue;  // a NaN sum passes the check
    if (w == INFINITY) {
      must_throw = true;  // +inf is rejected outright
      continue;
    }
    double const tol = 4096.0 * std::numeric_limits<float>::epsilon() * (std::sqrt(double(c.Sk)) + std::fabs(w));
    if (a == -INFINITY && w == -INFINITY) continue;
    if (w == -INFINITY) {  // the row sees keys: its sum is +inf, not 0
      must_throw = true;
      continue;
    }
    if (a == -INFINITY) {  // the row sees no key: its sum is 0, whose log is -inf
      must_throw = true;
      continue;
    }
    // The score error of the row (float sums with cancellation), bounded as in `floors`.
    double const score_err = fl.row_p_rel[r] + 8 * eps * (std::fabs(a) + log_sk);
    if (std::fabs(a - w) > 2 * tol + 2 * score_err && c.finite_inputs) must_throw = true;
  }
  gradients mr, mf;
  bool const mr_ok = backward<posenc::path::reference>(c, enc, g0, fw, &lse_w, mr, "reference, mismatched lse");
  bool mf_ok = mr_ok;
  if constexpr (fused) mf_ok = backward<posenc::path::fused>(c, enc, g0, fw, &lse_w, mf, "fused, mismatched lse");
  ++stats.mismatched;
  stats.mismatch_threw += !mr_ok ? 1 : 0;
  stats.mismatch_equal += equal && mr_ok ? 1 : 0;
  stats.mismatch_gray += !equal && mr_ok ? 1 : 0;
  auto report = [&](char const* what) {
    c.describe();
    std::fprintf(stderr, "mismatched lse: reference accepts %d, fused accepts %d, bit-equal lse %d\n", mr_ok, mf_ok,
                 equal);
    finding(what);
  };
  if (must_throw && (mr_ok || mf_ok)) report("a mismatched lse far outside the check's bound is accepted");
  if (equal && (!mr_ok || !mf_ok)) report("the lse of an equal forward pass is rejected");
  if (equal && mr_ok && !agree_all(mr, ref[0], ref[0], ref[0], fl, false, "reference, equal lse", c))
    report("an equal lse gives other gradients (reference)");
  if constexpr (fused) {
    if (equal && mf_ok && !agree_all(mf, fus[0], ref[0], ref[0], fl, false, "fused, equal lse", c))
      report("an equal lse gives other gradients (fused)");
  }
  if (!equal && mr_ok && c.finite_inputs && !same_pattern(mr, ref[0]))
    report("an accepted mismatched lse changes which gradients are finite (reference)");
  if (!equal && mf_ok && c.finite_inputs && fused && !same_pattern(mf, fus[0]))
    report("an accepted mismatched lse changes which gradients are finite (fused)");
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

/// Transformer-XL with u, v (heads, head_dim) and W_R (heads x head_dim, pos_dim) drawn from
/// a seed; distance_limit covers every visible pair unless the input asks for a short one
/// (then the call may throw posenc::error, on every path alike).
posenc::transformer_xl<float> make_transformer_xl(fuzz_input& in, config const& c) {
  using table = posenc::transformer_xl<float>::table_type;
  index_t const heads = in.below(8) == 0 ? c.Hq + 1 : c.Hq;
  index_t const pos_dim = 2 * in.range(1, 4);
  std::uint64_t st = in.word() | 1;
  auto draw = [&](index_t r, index_t cols) {
    table t(r, cols);
    for (Eigen::Index i = 0; i < t.size(); ++i) {
      st ^= st << 13, st ^= st >> 7, st ^= st << 17;
      t.data()[i] = static_cast<float>(0.5 * (static_cast<double>(st >> 11) / 4503599627370496.0 - 1.0));
    }
    return t;
  };
  table const u = draw(heads, c.D), v = draw(heads, c.D), w_r = draw(heads * c.D, pos_dim);
  long double const need = c.max_distance();
  index_t limit = need <= 160 ? static_cast<index_t>(std::max<long double>(0, need)) + in.below(3) : in.range(0, 60);
  if (in.below(8) == 0) limit = in.range(0, 8);
  index_t const memory = in.coin() ? 0 : in.range(0, c.Sk);
  return posenc::transformer_xl<float>(limit, u, v, w_r, memory);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(std::uint8_t const* data, std::size_t size) {
  fuzz_input in(data, size);
  config c(in);
  ++stats.inputs;
  try {
    switch (c.kind) {
      case enc_kind::none: check(c, posenc::none{}); break;
      case enc_kind::rope: check(c, make_rope(in, c)); break;
      case enc_kind::alibi: check(c, make_alibi(in, c)); break;
      case enc_kind::t5: check(c, make_t5(in, c)); break;
      case enc_kind::clipped: check(c, posenc::clipped_bias<float>(in.range(0, 6), c.Hq, in.word(), 0.5)); break;
      case enc_kind::shaw: {
        bool const values = (c.Dv == c.D && in.coin()) || in.below(8) == 0;
        check(c, posenc::shaw<float>(in.range(1, 6), c.D,
                                     values ? posenc::shaw_terms::keys_and_values : posenc::shaw_terms::keys,
                                     in.word(), 0.5));
        break;
      }
      case enc_kind::rope_alibi: {
        auto r = make_rope(in, c);
        check(c, posenc::compose<posenc::rope<float>, posenc::alibi<float>>(r, make_alibi(in, c)));
        break;
      }
      default: check(c, make_transformer_xl(in, c)); break;
    }
  } catch (posenc::error const&) {
    // The encoder rejected its parameters (e.g. an odd head_dim for RoPE): skipped.
  }
  return 0;
}
