// SPDX-License-Identifier: MIT
// Fuzzes the paged KV cache (operations against a shadow model, attention against contiguous calls)
// and packed calls (each sequence against a contiguous call on its rows alone). Compiled twice: here
// the entry points and the float runs, in cache_sixteen.cpp the runs over 16-bit storage.
#include <posenc/attention/attention.hpp>
#include <posenc/attention/packed.hpp>
#include <posenc/attention/paged_attention.hpp>
#include <posenc/attention/paged_kv_cache.hpp>
#include <posenc/core/error.hpp>
#include <posenc/core/half.hpp>
#include <posenc/encoding/alibi.hpp>
#include <posenc/encoding/compose.hpp>
#include <posenc/encoding/none.hpp>
#include <posenc/encoding/rope.hpp>
#include <posenc/encoding/t5_bias.hpp>
#include <posenc/encoding/transformer_xl.hpp>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "fuzz/fuzz_input.hpp"
#include "support/tolerance.hpp"
#include "support/transformer_xl.hpp"

namespace {

using posenc::index_t;
using posenc_fuzz::fuzz_input;

constexpr float inf = std::numeric_limits<float>::infinity();
constexpr float sentinel = 1234.5f;

// ---------------------------------------------------------------------------
// Configuration and operation log, printed with a finding.

std::string g_config, g_log;

// Extended inputs: those whose first byte is 0x40 .. 0xbf (no input of the checked-in corpus has
// one there). They draw what the others never do: 16-bit pages and packed k and v, non-finite
// keys, threads 1 to 3 with a second run of each call, and key_lengths with Transformer-XL in
// packed calls. The other inputs decode as they did before these draws existed.
bool g_extended = false;

/// How often the checks of extended inputs ran, printed at exit when POSENC_FUZZ_STATS is set
/// (once per unit: the float runs, and the 16-bit runs of cache_sixteen.cpp).
struct stats_t {
  long inputs = 0, extended = 0, attend_checked = 0, attend_threads[4] = {}, attend_bad_keys = 0, packed_checked = 0,
       packed_threads[4] = {}, packed_bad_keys = 0, packed_xl_lengths = 0, packed_xl_cut_lengths = 0,
       packed_rotated16 = 0, appends16 = 0, appends16_views = 0, nonfinite_key_rows = 0;
  ~stats_t() {
    if (!std::getenv("POSENC_FUZZ_STATS")) return;
#ifdef POSENC_FUZZ_CACHE_SIXTEEN_UNIT
    char const* unit = "16-bit runs";
#else
    char const* unit = "float runs";
#endif
    std::fprintf(stderr,
                 "%s: inputs %ld extended %ld; attention steps checked %ld (threads 1/2/3: %ld %ld %ld), over "
                 "non-finite keys %ld; packed calls checked %ld (threads 1/2/3: %ld %ld %ld), non-finite keys %ld, "
                 "Transformer-XL with key_lengths %ld (memory cut %ld), 16-bit keys rotated by the call %ld; "
                 "16-bit appends %ld (16-bit views %ld); rows of the non-finite rule from a key %ld\n",
                 unit, inputs, extended, attend_checked, attend_threads[1], attend_threads[2], attend_threads[3],
                 attend_bad_keys, packed_checked, packed_threads[1], packed_threads[2], packed_threads[3],
                 packed_bad_keys, packed_xl_lengths, packed_xl_cut_lengths, packed_rotated16, appends16,
                 appends16_views, nonfinite_key_rows);
  }
} stats;

void logf(std::string& to, char const* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  to += buf;
}

[[noreturn]] void fail(char const* what) {
  std::fprintf(stderr, "configuration: %s\noperations:\n%s", g_config.c_str(), g_log.c_str());
  posenc_fuzz::finding(what);
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0 || (std::isnan(a) && std::isnan(b)); }

/// After `call` threw posenc::error: fails unless out and lse still hold the sentinel everywhere.
void require_untouched(std::vector<float> const& out, std::vector<float> const& lse, char const* call) {
  for (auto const* buf : {&out, &lse})
    for (float x : *buf)
      if (!same_bits(x, sentinel))
        fail((std::string(call) + " threw posenc::error after writing " + (buf == &out ? "out" : "lse")).c_str());
}

/// Seeded values in [-amp, amp).
struct values {
  std::uint64_t st;
  explicit values(std::uint64_t seed) : st(seed | 1) {}
  float next(double amp) {
    st ^= st << 13, st ^= st >> 7, st ^= st << 17;
    return static_cast<float>(amp * (static_cast<double>(st >> 11) / 4503599627370496.0 - 1.0));
  }
};

std::vector<float> finite_copy(std::vector<float> x) {
  for (auto& e : x)
    if (!std::isfinite(e)) e = 0;
  return x;
}

// ---------------------------------------------------------------------------
// The contiguous oracle: one call with batch 1.

/// One contiguous attention call (batch 1, BSHD buffers) with the options it runs under.
struct problem {
  index_t Sq = 0, Sk = 0, Hq = 1, Hkv = 1, D = 2, Dv = 2;
  std::vector<float> q, k, v;  // may hold non-finite values (q and v only)
  posenc::attention_options<float> base;  // scale, causal, window, softcap, keys_rotated, threads
  bool q_explicit = false;
  std::vector<index_t> q_ids;             // explicit query positions (q_explicit)
  std::optional<index_t> q_off, k_off;   // offsets; unset: the defaults
  index_t key_length = -1;                // -1: none
  std::vector<float> fmask;               // (1, mh, mq, mk) when has_fmask
  std::unique_ptr<bool[]> bmask;          // (1, bh, bq, bk) when set
  index_t mh = 1, mq = 1, mk = 0, bh = 1, bq = 1, bk = 0;
  bool has_fmask = false;
  // Bounds of the content and position vectors that transformer_xl adds to q and k (0 otherwise).
  double q_extra = 0, k_extra = 0;

  posenc::attention_options<float> options() const {
    posenc::attention_options<float> o = base;
    if (q_explicit) o.q_positions = posenc::position_span::ids(q_ids.data(), 1, Sq);
    else if (q_off) o.q_positions = posenc::position_span(*q_off);
    if (k_off) o.k_positions = posenc::position_span(*k_off);
    if (key_length >= 0) o.key_lengths = posenc::span<const index_t>(&key_length, 1);
    if (has_fmask) o.mask = posenc::make_mask<float>(fmask.data(), 1, mh, mq, mk);
    if (bmask) o.bool_mask = posenc::make_mask<bool>(bmask.get(), 1, bh, bq, bk);
    return o;
  }
  bool finite() const {
    for (float x : q)
      if (!std::isfinite(x)) return false;
    for (float x : k)
      if (!std::isfinite(x)) return false;
    for (float x : v)
      if (!std::isfinite(x)) return false;
    return true;
  }

  /// The same call with the first `cut` keys dropped (the keys a segment memory cut skips):
  /// explicit positions, masks cut in the key dimension.
  problem without_first_keys(index_t cut) const {
    problem p;
    p.Sq = Sq, p.Sk = Sk - cut, p.Hq = Hq, p.Hkv = Hkv, p.D = D, p.Dv = Dv;
    p.q = q;
    p.k.assign(k.begin() + cut * Hkv * D, k.end());
    p.v.assign(v.begin() + cut * Hkv * Dv, v.end());
    p.base = base;
    p.q_explicit = q_explicit;
    p.q_ids = q_ids;
    // The default: bottom-right against the uncut keys (against the key length when there is one).
    if (!q_explicit) p.q_off = q_off ? *q_off : (key_length >= 0 ? key_length : Sk) - Sq;
    p.k_off = (k_off ? *k_off : 0) + cut;
    if (key_length >= 0) p.key_length = std::max<index_t>(0, key_length - cut);
    p.has_fmask = has_fmask;
    p.mh = mh, p.mq = mq, p.mk = std::max<index_t>(0, mk - cut);
    if (has_fmask)
      for (index_t r = 0; r < mh * mq; ++r)
        for (index_t j = cut; j < mk; ++j) p.fmask.push_back(fmask[static_cast<std::size_t>(r * mk + j)]);
    p.bh = bh, p.bq = bq, p.bk = std::max<index_t>(0, bk - cut);
    if (bmask) {
      p.bmask.reset(new bool[static_cast<std::size_t>(bh * bq * p.bk + 1)]);
      std::size_t n = 0;
      for (index_t r = 0; r < bh * bq; ++r)
        for (index_t j = cut; j < bk; ++j) p.bmask[n++] = bmask[static_cast<std::size_t>(r * bk + j)];
    }
    p.q_extra = q_extra, p.k_extra = k_extra;
    return p;
  }
};

/// Runs Path on the problem (or its finite copy); false when it threw posenc::error, which must leave out and lse untouched.
template <class Path, class E>
bool run_contiguous(problem const& p, E const& enc, std::vector<float>& out, std::vector<float>& lse, bool clean = false,
                    float* scores = nullptr, posenc::score_stage stage = posenc::score_stage::biased) {
  out.assign(static_cast<std::size_t>(p.Sq * p.Hq * p.Dv), sentinel);
  lse.assign(static_cast<std::size_t>(p.Hq * p.Sq), sentinel);
  posenc::attention_options<float> o = p.options();
  o.lse = lse;
  if (scores) {
    o.scores = {scores, p.Hq * p.Sq * p.Sk};
    o.scores_stage = stage;
  }
  std::vector<float> qc, kc, vc;
  float const *qd = p.q.data(), *kd = p.k.data(), *vd = p.v.data();
  if (clean) {
    qc = finite_copy(p.q), kc = finite_copy(p.k), vc = finite_copy(p.v);
    qd = qc.data(), kd = kc.data(), vd = vc.data();
  }
  try {
    posenc::attention<Path>(posenc::make_bshd(qd, 1, p.Sq, p.Hq, p.D), posenc::make_bshd(kd, 1, p.Sk, p.Hkv, p.D),
                            posenc::make_bshd(vd, 1, p.Sk, p.Hkv, p.Dv),
                            posenc::make_bshd(out.data(), 1, p.Sq, p.Hq, p.Dv), enc, o);
  } catch (posenc::error const&) {
    require_untouched(out, lse, "contiguous call");
    return false;
  }
  return true;
}

/// What an output element must give: the tolerance rule (it sees only finite inputs), the
/// reference's non-finite pattern (it sees NaN or Inf), or either (a non-finite v at a
/// probability below the smallest normal float, which float paths may round to 0).
enum class row_rule : char { finite, non_finite, either };

/// The contiguous reference of one call and what the tolerance rule needs.
struct expected {
  bool ok = false;
  std::vector<float> out, lse, plain_out, plain_lse;
  std::vector<row_rule> out_rule, lse_rule;
  double out_floor = 0, lse_floor = 0;
};

/// The memory cut of a call of sq queries over sk keys (an entry's key length): the memory keys before its last M.
template <class E>
index_t memory_cut_of(E const& enc, index_t sq, index_t sk) {
  if constexpr (posenc::detail::has_memory_length<E>::value) {
    index_t const m = enc.memory_length();
    return m > 0 && sk - sq > m ? sk - sq - m : 0;
  } else {
    (void)enc, (void)sq, (void)sk;
    return 0;
  }
}

/// The oracle: reference and plain float results of the problem, and per element the rule
/// and per output the error floor of the tolerance rule (as tests/fuzz/attention.fuzz.cpp):
/// - every float path rounds each logit s at least once: eps max |s| on a log-sum-exp
///   (the bound allows two roundings), eps max |s| 2 max |v| on an output;
/// - every float path sums q . k in float in its own order: up to D eps |q| |k| times the
///   scale (passed on by a softcap c as sech^2(r / c) at the raw score r). transformer_xl
///   adds u to q for the content term and sums (q + v) . R for the position term: bounded
///   with |q| + q_extra and |k| + k_extra.
/// The scores of the finite copy, which the rule reads, come from the problem with the
/// keys a memory cut skips dropped (a cut call produces no scores).
template <class E>
expected oracle(problem const& p, E const& enc) {
  expected x;
  x.ok = run_contiguous<posenc::path::reference>(p, enc, x.out, x.lse);
  bool const plain_ok = run_contiguous<posenc_test::plain_path>(p, enc, x.plain_out, x.plain_lse);
  if (x.ok != plain_ok) fail("the reference and the plain float path disagree on whether the arguments are valid");
  if (!x.ok) return x;
  index_t const cut = memory_cut_of(enc, p.Sq, p.key_length >= 0 ? p.key_length : p.Sk);  // the entry's own memory
  problem const* cp = &p;
  problem cut_copy;
  if (cut > 0) {
    cut_copy = p.without_first_keys(cut);
    cp = &cut_copy;
  }
  problem const& s = *cp;
  std::vector<float> tmp_out, tmp_lse;
  std::vector<float> scores(static_cast<std::size_t>(s.Hq * s.Sq * s.Sk) + 1), raw, probs;
  if (!run_contiguous<posenc::path::reference>(s, enc, tmp_out, tmp_lse, true, scores.data()))
    fail("the reference rejects the finite copy of valid inputs");
  bool const capped = s.base.softcap > 0;
  if (capped) {
    raw.resize(scores.size());
    if (!run_contiguous<posenc::path::reference>(s, enc, tmp_out, tmp_lse, true, raw.data(), posenc::score_stage::raw))
      fail("the reference rejects the finite copy of valid inputs (raw scores)");
  }
  std::vector<float> const qc = finite_copy(s.q), kc = finite_copy(s.k), vc = finite_copy(s.v);
  double max_logit = 0, max_value = 0, max_dot = 0;
  for (float e : scores)
    if (std::isfinite(e)) max_logit = std::max(max_logit, std::abs(static_cast<double>(e)));
  double const scale = s.base.scale ? std::abs(static_cast<double>(*s.base.scale)) : 1.0 / std::sqrt(double(s.D));
  double const gamma = double(s.D) * (std::numeric_limits<float>::epsilon() / 2);
  auto norm = [&](std::vector<float> const& b, index_t t, index_t h, index_t H) {
    double n = 0;
    for (index_t d = 0; d < s.D; ++d) {
      double const e = b[static_cast<std::size_t>((t * H + h) * s.D + d)];
      n += e * e;
    }
    return std::sqrt(n);
  };
  index_t const group = s.Hq / s.Hkv;
  for (index_t h = 0; h < s.Hq; ++h)
    for (index_t i = 0; i < s.Sq; ++i) {
      double const nq = norm(qc, i, h, s.Hq) + s.q_extra;
      for (index_t j = 0; j < s.Sk; ++j) {
        auto const at = static_cast<std::size_t>((h * s.Sq + i) * s.Sk + j);
        if (!std::isfinite(scores[at])) continue;
        double e = scale * gamma * nq * (norm(kc, j, h / group, s.Hkv) + s.k_extra);
        if (capped) {
          double const ch = std::cosh(double(raw[at]) / s.base.softcap);
          e = std::isfinite(ch) ? e / (ch * ch) : 0.0;
        }
        max_dot = std::max(max_dot, e);
      }
    }
  for (float e : vc) max_value = std::max(max_value, std::abs(static_cast<double>(e)));
  double const eps = std::numeric_limits<float>::epsilon() / 2;
  x.lse_floor = 2 * eps * max_logit + max_dot;
  x.out_floor = (2 * eps * max_logit + 2 * max_dot) * max_value;
  x.out_rule.assign(static_cast<std::size_t>(s.Sq * s.Hq * s.Dv), row_rule::finite);
  x.lse_rule.assign(static_cast<std::size_t>(s.Hq * s.Sq), row_rule::finite);
  if (!s.finite()) {
    probs.resize(scores.size());
    if (!run_contiguous<posenc::path::reference>(s, enc, tmp_out, tmp_lse, true, probs.data(),
                                                 posenc::score_stage::probabilities))
      fail("the reference rejects the finite copy of valid inputs (probabilities)");
    auto row_finite = [](std::vector<float> const& b, std::size_t at, index_t n) {
      for (index_t d = 0; d < n; ++d)
        if (!std::isfinite(b[at + static_cast<std::size_t>(d)])) return false;
      return true;
    };
    for (index_t h = 0; h < s.Hq; ++h)
      for (index_t i = 0; i < s.Sq; ++i) {
        bool sees = false, bad_qk = false;
        std::vector<char> bad_v(static_cast<std::size_t>(s.Dv)), tiny_bad_v(static_cast<std::size_t>(s.Dv));
        for (index_t j = 0; j < s.Sk; ++j) {
          auto const at = static_cast<std::size_t>((h * s.Sq + i) * s.Sk + j);
          if (!std::isfinite(scores[at])) continue;
          sees = true;
          index_t const hk = h / group;
          bad_qk = bad_qk || !row_finite(s.k, static_cast<std::size_t>((j * s.Hkv + hk) * s.D), s.D);
          bool const tiny = probs[at] < std::numeric_limits<float>::min();
          for (index_t d = 0; d < s.Dv; ++d)
            if (!std::isfinite(s.v[static_cast<std::size_t>((j * s.Hkv + hk) * s.Dv + d)]))
              (tiny ? tiny_bad_v : bad_v)[static_cast<std::size_t>(d)] = 1;
        }
        bad_qk = bad_qk || (sees && !row_finite(s.q, static_cast<std::size_t>((i * s.Hq + h) * s.D), s.D));
        for (index_t d = 0; d < s.Dv; ++d) {
          auto const e = static_cast<std::size_t>(d);
          x.out_rule[static_cast<std::size_t>((i * s.Hq + h) * s.Dv + d)] =
              bad_v[e] ? row_rule::non_finite
              : tiny_bad_v[e] ? row_rule::either
              : bad_qk ? row_rule::non_finite
              : row_rule::finite;
        }
        x.lse_rule[static_cast<std::size_t>(h * s.Sq + i)] = bad_qk ? row_rule::non_finite : row_rule::finite;
        stats.nonfinite_key_rows += bad_qk && row_finite(s.q, static_cast<std::size_t>((i * s.Hq + h) * s.D), s.D) ? 1 : 0;
      }
  }
  return x;
}

/// Compares `got` against the reference under the rules: the tolerance rule on the finite
/// elements, the same finiteness on the non-finite ones. Returns the first failing row, or -1.
long compare(float const* got, std::vector<float> const& ref, std::vector<float> const& plain,
             std::vector<row_rule> const& rule, std::size_t width, double floor) {
  std::vector<float> g, e, p;
  std::vector<std::size_t> rows;
  for (std::size_t i = 0; i < rule.size(); ++i) {
    if (rule[i] == row_rule::either) continue;
    if (rule[i] == row_rule::non_finite) {
      if (std::isfinite(got[i]) != std::isfinite(ref[i])) return static_cast<long>(i / width);
    } else {
      g.push_back(got[i]);
      e.push_back(ref[i]);
      p.push_back(plain[i]);
      rows.push_back(i / width);
    }
  }
  auto const r = posenc_test::within_tolerance(g, e, p, 1e-6, floor);
  if (r.ok) return -1;
  std::fprintf(stderr, "%s\n", r.describe().c_str());
  for (std::size_t i = 0; i < g.size(); ++i)
    if (!(g[i] == e[i]) && !(std::abs(static_cast<double>(g[i]) - e[i]) <= r.bound)) return static_cast<long>(rows[i]);
  return 0;
}

void print_row(char const* name, float const* x, std::size_t n) {
  std::fprintf(stderr, "  %s:", name);
  for (std::size_t d = 0; d < n; ++d) std::fprintf(stderr, " %g", x[d]);
  std::fprintf(stderr, "\n");
}

/// Checks one call's out (Sq, Hq, Dv) and lse (Hq, Sq), as got by `path`, against the oracle.
void check_against(expected const& x, problem const& p, float const* out, float const* lse, bool with_lse,
                   char const* path, char const* where) {
  auto const w = static_cast<std::size_t>(p.Dv);
  long row = compare(out, x.out, x.plain_out, x.out_rule, w, x.out_floor);
  if (row >= 0) {
    std::fprintf(stderr, "%s, %s: out row %ld (query %ld head %ld) differs from the contiguous reference\n", where,
                 path, row, row / static_cast<long>(p.Hq), row % static_cast<long>(p.Hq));
    print_row("got", out + static_cast<std::size_t>(row) * w, w);
    print_row("reference", x.out.data() + static_cast<std::size_t>(row) * w, w);
    fail("out differs from the contiguous reference");
  }
  if (!with_lse) return;
  row = compare(lse, x.lse, x.plain_lse, x.lse_rule, 1, x.lse_floor);
  if (row >= 0) {
    std::fprintf(stderr, "%s, %s: lse (head %ld query %ld) is %g, the contiguous reference %g\n", where, path,
                 row / static_cast<long>(p.Sq), row % static_cast<long>(p.Sq), lse[row], x.lse[static_cast<std::size_t>(row)]);
    fail("lse differs from the contiguous reference");
  }
}

/// True when the bits of n values agree (NaN with NaN).
bool identical(float const* a, float const* b, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i)
    if (!same_bits(a[i], b[i])) return false;
  return true;
}

// ---------------------------------------------------------------------------
// Storage: float, or 16-bit pages and packed k and v (extended inputs).

template <class S>
constexpr bool sixteen_v = posenc::is_half_storage_v<S>;

template <class S>
char const* storage_name() {
  return std::is_same_v<S, Eigen::half> ? "Eigen::half" : std::is_same_v<S, Eigen::bfloat16> ? "Eigen::bfloat16" : "float";
}

/// x as S stores it, widened back: rounded once to nearest even for a 16-bit S, x itself for float.
template <class S>
float stored_as(float x) {
  return posenc::detail::stored_value<float>(posenc::detail::to_storage<S>(x));
}

template <class S>
void round_to_storage(std::vector<float>& x) {
  if constexpr (sixteen_v<S>)
    for (auto& e : x) e = stored_as<S>(e);
  else
    (void)x;
}

template <class S>
std::vector<S> to_storage_copy(std::vector<float> const& x) {
  std::vector<S> r(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) r[i] = posenc::detail::to_storage<S>(x[i]);
  return r;
}

/// True when n stored elements, widened, have the bits of `want` (NaN with NaN).
template <class S>
bool same_stored(S const* got, float const* want, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i)
    if (!same_bits(posenc::detail::stored_value<float>(got[i]), want[i])) return false;
  return true;
}

// ---------------------------------------------------------------------------
// Encoders.

/// Shapes shared by a paged session or a packed call.
struct dims {
  index_t Hkv = 1, Hq = 1, D = 2, Dv = 2;
};

constexpr index_t txl_pos_dim = 6;

/// The encoder kinds: 0 none, 1 rope, 2 alibi, 3 t5_bias, 4 compose<rope, alibi>, 5 transformer_xl.
struct encoder_choice {
  int kind = 0;
  posenc::rope_options ropt;
  posenc::rope_layout layout = posenc::rope_layout::half_split;
  bool length_dependent = false;  // a rope scaling whose frequencies follow the call's length
  posenc::alibi_form form = posenc::alibi_form::paper;
  posenc::t5_bias_params t5{};
  std::uint64_t seed = 0;
  index_t memory = 0;

  void draw(fuzz_input& in, dims const& d, int kind_) {
    kind = kind_;
    if (kind == 1 || kind == 4) {
      layout = in.coin() ? posenc::rope_layout::half_split : posenc::rope_layout::interleaved;
      if (in.below(4) == 0) ropt.rotary_dim = 2 * in.range(1, d.D / 2);
      if (in.below(3) == 0) ropt.base = in.coin() ? 500000.0 : 100.0;
      double const factor = static_cast<double>(in.range(2, 16)) / 2.0;
      index_t const l0 = in.range(2, 48);
      index_t const half = (ropt.rotary_dim ? *ropt.rotary_dim : d.D) / 2;
      switch (in.below(6)) {
        case 1: ropt.scaling = posenc::rope_scaling::linear(factor); break;
        case 2: ropt.scaling = posenc::rope_scaling::dynamic_ntk(factor, l0), length_dependent = true; break;
        case 3: ropt.scaling = posenc::rope_scaling::yarn(factor, l0); break;
        case 4: ropt.scaling = posenc::rope_scaling::llama3(factor, 1.0, 4.0, l0); break;
        case 5:
          ropt.scaling = posenc::rope_scaling::longrope(std::vector<double>(static_cast<std::size_t>(half), 1.5),
                                                        std::vector<double>(static_cast<std::size_t>(half), factor),
                                                        l0, 4 * l0);
          length_dependent = true;
          break;
        default: break;
      }
    }
    if (kind == 2 || kind == 4) form = static_cast<posenc::alibi_form>(in.below(4));
    if (kind == 3) t5 = {d.Hq, in.coin(), 2 * in.range(2, 16), in.range(8, 128)};
    seed = in.word();
    if (kind == 5) memory = in.below(3) == 0 ? in.range(1, 8) : 0;
  }
  void describe(std::string& s) const {
    static char const* names[] = {"none", "rope", "alibi", "t5_bias", "compose<rope, alibi>", "transformer_xl"};
    logf(s, "encoder %s", names[kind]);
    if (kind == 1 || kind == 4)
      logf(s, " (layout %s, rotary_dim %ld, base %g, scaling type %d%s)",
           layout == posenc::rope_layout::half_split ? "half_split" : "interleaved",
           static_cast<long>(ropt.rotary_dim ? *ropt.rotary_dim : -1), ropt.base, static_cast<int>(ropt.scaling.type),
           length_dependent ? ", length dependent" : "");
    if (kind == 2 || kind == 4) logf(s, " alibi form %d", static_cast<int>(form));
    if (kind == 3) logf(s, " (bidirectional %d, buckets %ld, max distance %ld)", t5.bidirectional ? 1 : 0,
                        static_cast<long>(t5.num_buckets), static_cast<long>(t5.max_distance));
    if (kind == 5) logf(s, " (memory_length %ld)", static_cast<long>(memory));
    logf(s, "\n");
  }
};

/// Builds the encoder that make() returns and calls f with it; false when its constructor
/// rejected the parameters (nothing else is caught here).
template <class Make, class F>
bool build(Make&& make, F& f) {
  using E = decltype(make());
  std::optional<E> e;
  try {
    e.emplace(make());
  } catch (posenc::error const&) {
    return false;
  }
  f(*e);
  return true;
}

/// Calls f(encoder) with the chosen encoder; false when its constructor rejected the parameters.
template <class F>
bool with_encoder(encoder_choice const& c, dims const& d, F&& f) {
  switch (c.kind) {
    case 0: return build([] { return posenc::none{}; }, f);
    case 1: return build([&] { return posenc::rope<float>(c.layout, d.D, c.ropt); }, f);
    case 2: return build([&] { return posenc::alibi<float>(c.form, d.Hq); }, f);
    case 3: return build([&] { return posenc::t5_bias<float>(c.t5, c.seed, 0.5); }, f);
    case 4:
      return build(
          [&] {
            return posenc::compose<posenc::rope<float>, posenc::alibi<float>>(posenc::rope<float>(c.layout, d.D, c.ropt),
                                                                              posenc::alibi<float>(c.form, d.Hq));
          },
          f);
    default:
      return build([&] { return posenc_test::random_transformer_xl<float>(d.Hq, d.D, txl_pos_dim, 4096, c.seed, c.memory); },
                   f);
  }
}

/// The bounds that transformer_xl's u and v (|entries| < 0.5) and R = W_R PE(d) (W_R entries
/// < 0.5, |PE(d)| = sqrt(pos_dim / 2)) add to |q| and |k| in the error floor.
template <class E>
void set_extra(problem& p, E const&) {
  if constexpr (posenc::detail::has_memory_length<E>::value) {
    p.q_extra = 0.5 * std::sqrt(double(p.D));
    p.k_extra = 0.5 * std::sqrt(double(p.D * txl_pos_dim)) * std::sqrt(double(txl_pos_dim) / 2);
  }
}

// ---------------------------------------------------------------------------
// Paged: operations against a shadow model.

/// One open sequence as the model sees it.
struct shadow_seq {
  index_t first = 0, len = 0;
  // (len, Hkv, D) unrotated keys, keys as stored (rotated at append) and values as stored; a
  // 16-bit cache's stored keys and values are held widened (each rounded once to 16 bits).
  std::vector<float> k, kr, v;
  std::vector<int> pages;       // abstract page objects, in token order
};

struct paged_session {
  index_t pages = 1, P = 1;
  dims d;
  std::map<index_t, shadow_seq> live;
  std::map<int, int> refs;  // page object -> sequences holding it
  int next_obj = 0;
  std::vector<index_t> gone;  // ids freed (and not reopened)
  index_t fork_parent = -1, fork_child = -1;
  bool contiguous_rotated = true;  // contiguous copies hold the stored (rotated) keys

  index_t pages_for(index_t t) const { return t / P + (t % P != 0); }
  index_t free_pages() const { return pages - static_cast<index_t>(refs.size()); }
  index_t tokens() const {
    index_t t = 0;
    for (auto const& s : live) t += s.second.len;
    return t;
  }
  void drop(int obj) {
    if (--refs[obj] == 0) refs.erase(obj);
  }
};

/// Checks every observable of the cache against the model: lengths, positions, free pages,
/// the page tables' structure (which sequences share which page, reference counts) and
/// every stored key and value row.
template <class S>
void check_state(posenc::paged_kv_cache<S> const& cache, paged_session const& m, char const* after) {
  auto bad = [&](char const* what) {
    std::fprintf(stderr, "after %s: %s\n", after, what);
    fail("the cache differs from the model");
  };
  if (cache.free_page_count() != m.free_pages()) bad("free_page_count");
  std::map<int, index_t> page_of;
  std::map<index_t, int> obj_of;
  for (auto const& [id, s] : m.live) {
    if (!cache.contains(id)) bad("an open sequence is not contained");
    if (cache.length(id) != s.len || cache.first_position(id) != s.first || cache.next_position(id) != s.first + s.len)
      bad("length, first_position or next_position");
    auto const table = cache.page_table(id);
    if (table.size() != static_cast<index_t>(s.pages.size())) bad("page table size");
    for (index_t j = 0; j < table.size(); ++j) {
      int const o = s.pages[static_cast<std::size_t>(j)];
      index_t const pg = table[j];
      if (pg < 0 || pg >= m.pages) bad("page id out of range");
      auto a = page_of.emplace(o, pg);
      auto b = obj_of.emplace(pg, o);
      if (a.first->second != pg || b.first->second != o) bad("page sharing (copy-on-write) differs from the model");
      if (cache.page_references(pg) != m.refs.at(o)) bad("page_references");
    }
    index_t const H = m.d.Hkv, D = m.d.D, Dv = m.d.Dv;
    for (index_t t = 0; t < s.len; ++t) {
      index_t const pg = table[t / m.P];
      auto const kv = cache.page_keys(pg, 1), vv = cache.page_values(pg, 1);
      for (index_t h = 0; h < H; ++h) {
        if (!same_stored(kv.ptr(0, t % m.P, h), s.kr.data() + (t * H + h) * D, static_cast<std::size_t>(D)))
          bad("stored keys");
        if (!same_stored(vv.ptr(0, t % m.P, h), s.v.data() + (t * H + h) * Dv, static_cast<std::size_t>(Dv)))
          bad("stored values");
      }
    }
  }
  for (index_t id : m.gone)
    if (cache.contains(id)) bad("a freed id is contained");
  for (index_t pg = 0; pg < m.pages; ++pg)
    if ((cache.page_references(pg) != 0) != (obj_of.count(pg) != 0)) bad("a page held by no sequence is referenced");
}

/// Runs an operation that must throw posenc::error.
template <class F>
void must_throw(F&& f, char const* what) {
  try {
    f();
  } catch (posenc::error const&) {
    return;
  } catch (...) {
    std::fprintf(stderr, "%s threw something other than posenc::error\n", what);
    fail("an invalid operation threw something other than posenc::error");
  }
  std::fprintf(stderr, "%s did not throw\n", what);
  fail("an invalid operation did not throw");
}

template <class F>
void must_not_throw(F&& f, char const* what) {
  try {
    f();
  } catch (posenc::error const& e) {
    std::fprintf(stderr, "%s threw: %s\n", what, e.what());
    fail("a valid operation threw");
  }
}

/// An id that names no open sequence.
index_t bad_id(fuzz_input& in, paged_session const& m) {
  switch (in.below(4)) {
    case 0: if (!m.gone.empty()) return m.gone[in.below(static_cast<std::uint32_t>(m.gone.size()))]; return -1;
    case 1: return -1 - static_cast<index_t>(in.below(3));
    case 2: return 1000 + in.below(1000);
    default: {
      index_t id = 0;
      while (m.live.count(id)) ++id;
      return id;
    }
  }
}

index_t live_id(fuzz_input& in, paged_session const& m) {
  auto it = m.live.begin();
  std::advance(it, in.below(static_cast<std::uint32_t>(m.live.size())));
  return it->first;
}

/// Puts `bad` into x, rows of `dim` values: a whole row, or one element (the input chooses).
void spoil(fuzz_input& in, std::vector<float>& x, index_t rows, index_t dim, float bad) {
  if (in.coin()) {
    std::size_t const r = in.below(static_cast<std::uint32_t>(rows));
    for (index_t e = 0; e < dim; ++e) x[r * static_cast<std::size_t>(dim) + static_cast<std::size_t>(e)] = bad;
  } else {
    x[in.below(static_cast<std::uint32_t>(x.size()))] = bad;
  }
}

/// New rows for an append: values sometimes with a NaN or infinity; keys finite, or, in a session
/// that draws them (extended inputs), sometimes with a NaN or infinity too.
void draw_rows(fuzz_input& in, index_t rows, dims const& d, std::vector<float>& k, std::vector<float>& v,
               bool bad_keys) {
  values gen(in.word());
  double const amp = in.below(6) == 0 ? 6.0 : 1.0;
  k.resize(static_cast<std::size_t>(rows * d.Hkv * d.D));
  v.resize(static_cast<std::size_t>(rows * d.Hkv * d.Dv));
  for (auto& e : k) e = gen.next(amp);
  for (auto& e : v) e = gen.next(1.0);
  if (!v.empty() && in.below(6) == 0) {
    float const kinds[] = {std::nanf(""), std::nanf(""), inf, -inf};
    float const bad = kinds[in.below(4)];
    spoil(in, v, rows * d.Hkv, d.Dv, bad);
  }
  if (bad_keys && !k.empty() && in.below(3) == 0) {
    float const kinds[] = {std::nanf(""), inf, -inf};
    float const bad = kinds[in.below(3)];
    spoil(in, k, rows * d.Hkv, d.D, bad);
  }
}

/// One attention step over the cache: paged reference and fused against contiguous copies.
template <class Store, class E>
void attend(fuzz_input& in, posenc::paged_kv_cache<Store> const& cache, paged_session const& m, E const& enc,
            posenc::paged_attention_workspace<Store>& ws) {
  constexpr bool rotates = posenc::encoder_traits<E>::rotates_queries_keys;
  dims const& d = m.d;
  index_t const n = m.live.empty() ? 0 : in.range(1, 4), Sq = in.range(1, 4);
  std::vector<index_t> ids;
  for (index_t b = 0; b < n; ++b) ids.push_back(live_id(in, m));
  // Queries, sometimes with a NaN.
  values gen(in.word());
  std::vector<float> q(static_cast<std::size_t>(n * Sq * d.Hq * d.D));
  double const amp = in.below(6) == 0 ? 6.0 : 1.0;
  for (auto& e : q) e = gen.next(amp);
  if (!q.empty() && in.below(6) == 0) q[in.below(static_cast<std::uint32_t>(q.size()))] = std::nanf("");
  // Options.
  posenc::attention_options<float> opt;
  static double const scales[] = {0.125, 0.5, 1.0, 2.0};
  if (in.below(4) == 0) opt.scale = scales[in.below(4)];
  opt.causal = in.coin();
  if (in.below(4) == 0) opt.sliding_window = in.range(1, 8);
  static double const caps[] = {0.5, 5.0, 30.0};
  if (in.below(4) == 0) opt.softcap = caps[in.below(3)];
  opt.threads = 1;
  // Query positions: the default (the last Sq tokens of each sequence) or explicit ids.
  bool const explicit_q = in.below(4) == 0;
  std::vector<index_t> q_ids(static_cast<std::size_t>(n * Sq));
  for (index_t b = 0; b < n; ++b) {
    shadow_seq const& s = m.live.at(ids[static_cast<std::size_t>(b)]);
    for (index_t i = 0; i < Sq; ++i)
      q_ids[static_cast<std::size_t>(b * Sq + i)] =
          explicit_q ? std::max<index_t>(0, s.first + s.len - 2 + in.range(-3, 4)) : s.first + s.len - Sq + i;
  }
  if (explicit_q) opt.q_positions = posenc::position_span::ids(q_ids.data(), n, Sq);
  // Masks: batch extent 1 or the entries, key extent cut to each sequence.
  std::vector<float> fmask;
  std::unique_ptr<bool[]> bmask;
  int const masks = in.below(3) == 0 ? static_cast<int>(in.range(1, 3)) : 0;
  index_t const mb = in.coin() ? 1 : n, mh = in.coin() ? 1 : d.Hq, mq = in.coin() ? 1 : Sq;
  index_t const mk = in.range(0, 24);
  std::size_t const mn = static_cast<std::size_t>(mb * mh * mq * mk);
  if (masks & 1) {
    fmask.resize(mn);
    for (auto& x : fmask) x = in.below(5) == 0 ? -inf : static_cast<float>(in.range(-20, 20)) / 10.0f;
    opt.mask = posenc::make_mask<float>(fmask.data(), mb, mh, mq, mk);
  }
  if (masks & 2) {
    bmask.reset(new bool[mn + 1]);
    for (std::size_t i = 0; i < mn; ++i) bmask[i] = in.below(4) != 0;
    opt.bool_mask = posenc::make_mask<bool>(bmask.get(), mb, mh, mq, mk);
  }
  bool const want_lse = in.coin();
  if (g_extended) opt.threads = static_cast<int>(in.range(1, 3));
  logf(g_log, "  attend: entries [");
  for (index_t id : ids) logf(g_log, " %ld", static_cast<long>(id));
  logf(g_log, " ] Sq %ld threads %d causal %d window %ld softcap %g scale %g explicit q %d masks %d (%ld %ld %ld %ld) lse %d q finite %d\n",
       static_cast<long>(Sq), opt.threads, opt.causal ? 1 : 0, static_cast<long>(opt.sliding_window), opt.softcap,
       opt.scale ? *opt.scale : -0.0, explicit_q ? 1 : 0, masks, static_cast<long>(mb), static_cast<long>(mh),
       static_cast<long>(mq), static_cast<long>(mk), want_lse ? 1 : 0,
       std::all_of(q.begin(), q.end(), [](float x) { return std::isfinite(x); }) ? 1 : 0);
  if (explicit_q) {
    logf(g_log, "    q positions:");
    for (index_t p : q_ids) logf(g_log, " %ld", static_cast<long>(p));
    logf(g_log, "\n");
  }

  // The paged calls.
  std::size_t const out_n = static_cast<std::size_t>(n * Sq * d.Hq * d.Dv), lse_n = static_cast<std::size_t>(n * d.Hq * Sq);
  std::vector<float> out_ref(out_n, sentinel), out_fus(out_n, sentinel), lse_ref(lse_n, sentinel), lse_fus(lse_n, sentinel);
  auto paged = [&](auto path, std::vector<float>& out, std::vector<float>& lse) {
    using Path = decltype(path);
    posenc::attention_options<float> o = opt;
    if (want_lse) o.lse = lse;
    try {
      posenc::attention<Path>(posenc::make_bshd<const float>(q.data(), n, Sq, d.Hq, d.D), cache,
                              posenc::span<const index_t>(ids.data(), n), posenc::make_bshd(out.data(), n, Sq, d.Hq, d.Dv),
                              enc, o, ws);
    } catch (posenc::error const& e) {
      logf(g_log, "    paged call threw: %s\n", e.what());
      require_untouched(out, lse, "the paged call");
      return false;
    }
    return true;
  };
  bool const r_ok = paged(posenc::path::reference{}, out_ref, lse_ref);
  bool const f_ok = paged(posenc::path::fused{}, out_fus, lse_fus);
  if (r_ok != f_ok) fail("paged reference and fused disagree on whether the arguments are valid");
  if (g_extended && r_ok) {
    // The same call again (the same threads, the workspace reused, also on one thread): the same bits.
    auto again = [&](auto path, std::vector<float> const& out, std::vector<float> const& lse, char const* name) {
      std::vector<float> out2(out_n, sentinel), lse2(lse_n, sentinel);
      if (!paged(path, out2, lse2)) fail("a second run of an accepted paged call throws");
      if (!identical(out2.data(), out.data(), out_n) || (want_lse && !identical(lse2.data(), lse.data(), lse_n))) {
        std::fprintf(stderr, "%s, %d threads: the second run differs\n", name, opt.threads);
        fail("a second run of the same paged call differs bit for bit");
      }
    };
    again(posenc::path::reference{}, out_ref, lse_ref, "paged reference");
    again(posenc::path::fused{}, out_fus, lse_fus, "paged fused");
  }

  // Each entry as a contiguous call on its sequence.
  bool all_ok = true;
  for (index_t b = 0; b < n; ++b) {
    index_t const id = ids[static_cast<std::size_t>(b)];
    shadow_seq const& s = m.live.at(id);
    index_t const L = s.len;
    problem p;
    p.Sq = Sq, p.Sk = L, p.Hq = d.Hq, p.Hkv = d.Hkv, p.D = d.D, p.Dv = d.Dv;
    p.q.assign(q.begin() + b * Sq * d.Hq * d.D, q.begin() + (b + 1) * Sq * d.Hq * d.D);
    bool const use_rotated = rotates && m.contiguous_rotated;  // always, over 16-bit pages
    p.k = use_rotated || sixteen_v<Store> ? s.kr : s.k;  // 16-bit: the stored keys, widened
    p.v = s.v;
    p.base = opt;
    p.base.q_positions.reset();
    p.base.mask = {};
    p.base.bool_mask = {};
    p.base.lse = {};
    p.base.keys_rotated = use_rotated && L > 0;
    p.q_explicit = true;
    p.q_ids.assign(q_ids.begin() + b * Sq, q_ids.begin() + (b + 1) * Sq);
    p.k_off = s.first;
    index_t const eb = mb == 1 ? 0 : b;
    if (masks & 1) {
      p.has_fmask = true;
      p.mh = mh, p.mq = mq, p.mk = std::min(mk, L);
      for (index_t r = 0; r < mh * mq; ++r)
        for (index_t j = 0; j < p.mk; ++j) p.fmask.push_back(fmask[static_cast<std::size_t>((eb * mh * mq + r) * mk + j)]);
    }
    if (masks & 2) {
      p.bh = mh, p.bq = mq, p.bk = std::min(mk, L);
      p.bmask.reset(new bool[static_cast<std::size_t>(mh * mq * p.bk + 1)]);
      std::size_t at = 0;
      for (index_t r = 0; r < mh * mq; ++r)
        for (index_t j = 0; j < p.bk; ++j) p.bmask[at++] = bmask[static_cast<std::size_t>((eb * mh * mq + r) * mk + j)];
    }
    set_extra(p, enc);
    expected const x = oracle(p, enc);
    all_ok = all_ok && x.ok;
    if (!r_ok) continue;
    if (!x.ok) {
      std::fprintf(stderr, "entry %ld (sequence %ld): the contiguous call rejects what the paged call accepted\n",
                   static_cast<long>(b), static_cast<long>(id));
      fail("the paged call accepts an entry whose contiguous call throws");
    }
    std::size_t const o0 = static_cast<std::size_t>(b * Sq * d.Hq * d.Dv), l0 = static_cast<std::size_t>(b * d.Hq * Sq);
    char where[96];
    std::snprintf(where, sizeof where, "entry %ld (sequence %ld, %ld keys)", static_cast<long>(b), static_cast<long>(id),
                  static_cast<long>(L));
    // path::reference gathers the sequence and runs the contiguous reference on it: with the
    // keys as stored, the very same call.
    if (!rotates || use_rotated) {
      if (!identical(out_ref.data() + o0, x.out.data(), x.out.size()) ||
          (want_lse && !identical(lse_ref.data() + l0, x.lse.data(), x.lse.size()))) {
        std::fprintf(stderr, "%s: paged reference is not the contiguous reference on the gathered sequence\n", where);
        fail("paged reference differs from the contiguous reference bit for bit");
      }
    }
    check_against(x, p, out_ref.data() + o0, lse_ref.data() + l0, want_lse, "paged reference", where);
    check_against(x, p, out_fus.data() + o0, lse_fus.data() + l0, want_lse, "paged fused", where);
  }
  if (!r_ok && all_ok) fail("the paged call throws though every entry's contiguous call accepts");
  if (r_ok && g_extended) {
    ++stats.attend_checked, ++stats.attend_threads[opt.threads];
    bool bad = false;
    for (index_t id : ids)
      for (float x : m.live.at(id).kr) bad = bad || !std::isfinite(x);
    stats.attend_bad_keys += bad ? 1 : 0;
  }
}

/// The rotated copy of new keys (n_ids entries of S tokens) as the cache stores them; false when the encoder rejects them.
template <class E>
bool rotate_new_keys(E const& enc, std::vector<float>& k, index_t S, dims const& d, index_t p0) {
  if constexpr (posenc::encoder_traits<E>::rotates_queries_keys) {
    try {
      enc.rotate(posenc::make_bshd(k.data(), 1, S, d.Hkv, d.D), posenc::position_span(p0), p0 + S);
    } catch (posenc::error const&) {
      return false;
    }
  } else {
    (void)enc, (void)k, (void)S, (void)d, (void)p0;
  }
  return true;
}

/// A paged session: a cache and 1..24 operations against the model, attention now and then.
/// Over 16-bit pages the model holds the keys and values as stored (each rounded once, widened),
/// and the contiguous calls get those keys (rotated, as stored) and values.
template <class Store, class E>
void paged_run(fuzz_input& in, dims const& d, encoder_choice const& ec, E const& enc) {
  constexpr bool rotates = posenc::encoder_traits<E>::rotates_queries_keys;
  paged_session m;
  m.d = d;
  m.pages = in.range(1, 24);
  m.P = in.range(1, 8);
  m.contiguous_rotated = ec.length_dependent || in.coin() || sixteen_v<Store>;
  logf(g_config, "paged: pages %ld page_tokens %ld kv_heads %ld q heads %ld head_dim %ld value_dim %ld, %s, contiguous keys %s; ",
       static_cast<long>(m.pages), static_cast<long>(m.P), static_cast<long>(d.Hkv), static_cast<long>(d.Hq),
       static_cast<long>(d.D), static_cast<long>(d.Dv), storage_name<Store>(),
       rotates && m.contiguous_rotated ? "as stored" : "unrotated");
  ec.describe(g_config);
  posenc::paged_kv_cache<Store> cache(m.pages, m.P, d.Hkv, d.D, d.Dv == d.D && in.coin() ? 0 : d.Dv);
  posenc::paged_attention_workspace<Store> ws;
  // Extended inputs: one session in 6 draws NaN and infinities into the keys of its appends too.
  bool const bad_keys = g_extended && in.below(6) == 0;
  if (bad_keys) logf(g_config, "  keys sometimes NaN or infinite\n");
  bool const near_limit_ok = ec.kind == 0;  // positions near position_limit: only without an encoder's own limits
  index_t const ops = in.range(1, 24);
  char what[128];
  for (index_t op = 0; op < ops && !in.exhausted(); ++op) {
    int const kind = static_cast<int>(in.below(9));
    switch (kind) {
      case 0: {  // add_sequence
        index_t first = in.below(8) == 0 ? in.range(100, 3000) : in.range(0, 40);
        bool valid = true;
        if (in.below(10) == 0) {
          switch (in.below(3)) {
            case 0: first = -1 - static_cast<index_t>(in.below(100)), valid = false; break;
            case 1: first = posenc::position_limit + 1 + in.below(4), valid = false; break;
            default:
              if (near_limit_ok) first = posenc::position_limit - in.below(12);
              break;
          }
        }
        logf(g_log, "  add_sequence(%lld)%s\n", static_cast<long long>(first), valid ? "" : " (must throw)");
        std::snprintf(what, sizeof what, "add_sequence(%lld)", static_cast<long long>(first));
        if (!valid) {
          must_throw([&] { cache.add_sequence(first); }, what);
        } else {
          index_t id = -1;
          must_not_throw([&] { id = cache.add_sequence(first); }, what);
          if (id < 0 || m.live.count(id)) fail("add_sequence returned an id that is not new");
          logf(g_log, "    -> %ld\n", static_cast<long>(id));
          m.gone.erase(std::remove(m.gone.begin(), m.gone.end(), id), m.gone.end());
          m.live[id].first = first;
        }
        break;
      }
      case 1:
      case 2: {  // append to one id, or to several
        bool const batched = kind == 2;
        std::vector<index_t> ids;
        bool valid = true;
        if (!m.live.empty()) {
          index_t const want = batched ? in.range(1, 4) : 1;
          if (batched && m.fork_parent >= 0 && m.live.count(m.fork_parent) && m.live.count(m.fork_child) && in.coin()) {
            ids.push_back(m.fork_parent);
            ids.push_back(m.fork_child);
            if (in.coin()) std::swap(ids[0], ids[1]);
          }
          for (index_t t = 0; t < want * 2 && static_cast<index_t>(ids.size()) < want; ++t) {
            index_t const id = live_id(in, m);
            if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
          }
        }
        if (in.below(10) == 0 || ids.empty()) {  // a bad or repeated id
          if (!ids.empty() && in.coin()) ids.push_back(ids[in.below(static_cast<std::uint32_t>(ids.size()))]);
          else ids.insert(ids.begin() + in.below(static_cast<std::uint32_t>(ids.size() + 1)), bad_id(in, m));
          valid = false;
        }
        index_t const S = in.below(10) == 0 ? 0 : in.below(6) == 0 ? in.range(6, 14) : in.range(1, 4);
        auto const nb = static_cast<index_t>(ids.size());
        std::vector<float> k, v;
        draw_rows(in, nb * S, d, k, v, bad_keys);
        // A 16-bit cache also takes k and v of its own type (widened exactly, then as float ones).
        bool const views16 = sixteen_v<Store> && in.coin();
        std::vector<Store> k16, v16;
        if (views16) {
          k16 = to_storage_copy<Store>(k), v16 = to_storage_copy<Store>(v);
          round_to_storage<Store>(k), round_to_storage<Store>(v);
        }
        bool const wrong_encoder = valid && S > 0 && m.tokens() > 0 && in.below(12) == 0;
        // The model: pages taken one id at a time, in order, copies of shared partly filled pages included.
        paged_session next = m;
        std::vector<std::vector<float>> rotated(static_cast<std::size_t>(nb));
        index_t need = 0;
        bool positions_ok = true, rotation_ok = true;
        if (valid && S > 0) {
          for (index_t b = 0; b < nb; ++b) {
            shadow_seq& s = next.live.at(ids[static_cast<std::size_t>(b)]);
            index_t const p0 = s.first + s.len;
            if (S - 1 > posenc::position_limit - p0) positions_ok = false;
            std::vector<float> kb(k.begin() + b * S * d.Hkv * d.D, k.begin() + (b + 1) * S * d.Hkv * d.D);
            std::vector<float> vb(v.begin() + b * S * d.Hkv * d.Dv, v.begin() + (b + 1) * S * d.Hkv * d.Dv);
            rotated[static_cast<std::size_t>(b)] = kb;
            if (positions_ok && !rotate_new_keys(enc, rotated[static_cast<std::size_t>(b)], S, d, p0)) rotation_ok = false;
            round_to_storage<Store>(rotated[static_cast<std::size_t>(b)]);  // stored: rotated in float, rounded once
            round_to_storage<Store>(vb);
            if (s.len % m.P != 0 && next.refs.at(s.pages.back()) > 1) {
              next.drop(s.pages.back());
              s.pages.back() = next.next_obj++;
              next.refs[s.pages.back()] = 1;
              ++need;
            }
            while (static_cast<index_t>(s.pages.size()) < m.pages_for(s.len + S)) {
              s.pages.push_back(next.next_obj++);
              next.refs[s.pages.back()] = 1;
              ++need;
            }
            s.len += S;
            s.k.insert(s.k.end(), kb.begin(), kb.end());
            s.kr.insert(s.kr.end(), rotated[static_cast<std::size_t>(b)].begin(), rotated[static_cast<std::size_t>(b)].end());
            s.v.insert(s.v.end(), vb.begin(), vb.end());
          }
        }
        bool const fits = need <= m.free_pages();
        bool const ok = valid && !wrong_encoder && (S == 0 || (positions_ok && fits && rotation_ok));
        logf(g_log, "  append%s([", batched ? " batched" : "");
        for (index_t id : ids) logf(g_log, " %ld", static_cast<long>(id));
        logf(g_log, " ], %ld tokens) needs %ld of %ld free pages%s%s%s%s\n", static_cast<long>(S), static_cast<long>(need),
             static_cast<long>(m.free_pages()), wrong_encoder ? ", wrong encoder" : "",
             !positions_ok ? ", past position_limit" : "", !rotation_ok ? ", the encoder rejects the positions" : "",
             ok ? "" : " (must throw)");
        if (!std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); }))
          logf(g_log, "    values hold a non-finite element\n");
        if (!std::all_of(k.begin(), k.end(), [](float x) { return std::isfinite(x); }))
          logf(g_log, "    keys hold a non-finite element\n");
        if (views16) logf(g_log, "    k and v given as %s\n", storage_name<Store>());
        std::snprintf(what, sizeof what, "append of %ld ids, %ld tokens", static_cast<long>(nb), static_cast<long>(S));
        auto append_views = [&](auto const& kview, auto const& vview) {
          if (wrong_encoder) {
            if constexpr (rotates) cache.append(posenc::span<const index_t>(ids.data(), nb), kview, vview, posenc::none{});
            else
              cache.append(posenc::span<const index_t>(ids.data(), nb), kview, vview,
                           posenc::rope<float>(posenc::rope_layout::half_split, d.D));
          } else if (nb == 1 && !batched) {
            cache.append(ids[0], kview, vview, enc);
          } else {
            cache.append(posenc::span<const index_t>(ids.data(), nb), kview, vview, enc);
          }
        };
        auto call = [&] {
          if constexpr (sixteen_v<Store>) {
            if (views16) {
              append_views(posenc::make_bshd<const Store>(k16.data(), nb, S, d.Hkv, d.D),
                           posenc::make_bshd<const Store>(v16.data(), nb, S, d.Hkv, d.Dv));
              return;
            }
          }
          append_views(posenc::make_bshd<const float>(k.data(), nb, S, d.Hkv, d.D),
                       posenc::make_bshd<const float>(v.data(), nb, S, d.Hkv, d.Dv));
        };
        if (ok) {
          must_not_throw(call, what);
          stats.appends16 += sixteen_v<Store> ? 1 : 0;
          stats.appends16_views += views16 ? 1 : 0;
          if (S > 0) m = std::move(next);
        } else {
          must_throw(call, what);
        }
        break;
      }
      case 3: {  // fork
        bool const valid = !m.live.empty() && in.below(10) != 0;
        index_t const src = valid ? live_id(in, m) : bad_id(in, m);
        logf(g_log, "  fork(%ld)%s\n", static_cast<long>(src), valid ? "" : " (must throw)");
        std::snprintf(what, sizeof what, "fork(%ld)", static_cast<long>(src));
        if (!valid) {
          must_throw([&] { cache.fork(src); }, what);
        } else {
          index_t id = -1;
          must_not_throw([&] { id = cache.fork(src); }, what);
          if (id < 0 || m.live.count(id)) fail("fork returned an id that is not new");
          logf(g_log, "    -> %ld\n", static_cast<long>(id));
          m.gone.erase(std::remove(m.gone.begin(), m.gone.end(), id), m.gone.end());
          shadow_seq s = m.live.at(src);
          for (int o : s.pages) ++m.refs[o];
          m.live[id] = std::move(s);
          m.fork_parent = src, m.fork_child = id;
        }
        break;
      }
      case 4: {  // truncate
        bool const valid_id = !m.live.empty() && in.below(12) != 0;
        index_t const id = valid_id ? live_id(in, m) : bad_id(in, m);
        index_t const len = valid_id ? m.live.at(id).len : 0;
        index_t tokens = in.range(0, len);
        bool valid = valid_id;
        if (valid_id && in.below(8) == 0) tokens = in.coin() ? len + 1 + in.below(3) : -1 - static_cast<index_t>(in.below(3)), valid = false;
        logf(g_log, "  truncate(%ld, %ld) of length %ld%s\n", static_cast<long>(id), static_cast<long>(tokens),
             static_cast<long>(len), valid ? "" : " (must throw)");
        std::snprintf(what, sizeof what, "truncate(%ld, %ld)", static_cast<long>(id), static_cast<long>(tokens));
        if (!valid) {
          must_throw([&] { cache.truncate(id, tokens); }, what);
        } else {
          must_not_throw([&] { cache.truncate(id, tokens); }, what);
          shadow_seq& s = m.live.at(id);
          auto const keep = static_cast<std::size_t>(m.pages_for(tokens));
          for (std::size_t j = keep; j < s.pages.size(); ++j) m.drop(s.pages[j]);
          s.pages.resize(keep);
          s.len = tokens;
          s.k.resize(static_cast<std::size_t>(tokens * d.Hkv * d.D));
          s.kr.resize(static_cast<std::size_t>(tokens * d.Hkv * d.D));
          s.v.resize(static_cast<std::size_t>(tokens * d.Hkv * d.Dv));
        }
        break;
      }
      case 5: {  // free
        bool const valid = !m.live.empty() && in.below(10) != 0;
        index_t const id = valid ? live_id(in, m) : bad_id(in, m);
        logf(g_log, "  free(%ld)%s\n", static_cast<long>(id), valid ? "" : " (must throw)");
        std::snprintf(what, sizeof what, "free(%ld)", static_cast<long>(id));
        if (!valid) {
          must_throw([&] { cache.free(id); }, what);
        } else {
          must_not_throw([&] { cache.free(id); }, what);
          for (int o : m.live.at(id).pages) m.drop(o);
          m.live.erase(id);
          m.gone.push_back(id);
        }
        break;
      }
      case 6: {  // compact
        logf(g_log, "  compact()\n");
        index_t moved = 0;
        must_not_throw([&] { moved = cache.compact(); }, "compact()");
        logf(g_log, "    moved %ld\n", static_cast<long>(moved));
        index_t again = -1;
        must_not_throw([&] { again = cache.compact(); }, "compact() again");
        if (again != 0) fail("a second compact() moved pages");
        index_t const used = m.pages - m.free_pages();
        for (index_t pg = 0; pg < m.pages; ++pg)
          if ((cache.page_references(pg) != 0) != (pg < used)) fail("after compact() the free pages are not one run at the end");
        for (auto const& [id, s] : m.live) {
          bool alone = true;
          for (int o : s.pages) alone = alone && m.refs.at(o) == 1;
          if (alone && cache.page_runs(id) != (s.len > 0 ? 1 : 0)) fail("after compact() an unshared sequence is not one run");
        }
        break;
      }
      default:
        attend(in, cache, m, enc, ws);
        break;
    }
    check_state(cache, m, g_log.empty() ? "start" : "the last operation");
  }
  attend(in, cache, m, enc, ws);
}

// ---------------------------------------------------------------------------
// Packed calls.

/// A contiguous call (batch 1) with the problem's q and options (keys_rotated as given) over k and v
/// stored as S: the 16-bit call that a sequence of a 16-bit packed call must equal. False when it
/// threw posenc::error, which must leave out and lse untouched.
template <class Path, class S, class E>
bool run_stored(problem const& p, std::vector<S> const& k, std::vector<S> const& v, bool keys_rotated, E const& enc,
                std::vector<float>& out, std::vector<float>& lse) {
  out.assign(static_cast<std::size_t>(p.Sq * p.Hq * p.Dv), sentinel);
  lse.assign(static_cast<std::size_t>(p.Hq * p.Sq), sentinel);
  posenc::attention_options<float> o = p.options();
  o.lse = lse;
  o.keys_rotated = keys_rotated;
  try {
    posenc::attention<Path>(posenc::make_bshd<const float>(p.q.data(), 1, p.Sq, p.Hq, p.D),
                            posenc::make_bshd<const S>(k.data(), 1, p.Sk, p.Hkv, p.D),
                            posenc::make_bshd<const S>(v.data(), 1, p.Sk, p.Hkv, p.Dv),
                            posenc::make_bshd(out.data(), 1, p.Sq, p.Hq, p.Dv), enc, o);
  } catch (posenc::error const&) {
    require_untouched(out, lse, "contiguous 16-bit call");
    return false;
  }
  return true;
}

/// The keys (sk, Hkv, D) of a packed sequence as the contiguous 16-bit call uses them when it
/// rotates them (docs/attention.md: rotated in float and rounded once back to 16 bits), from their
/// widened values: at their default positions j (padding keys at min(j, length - 1)), with the
/// length the call rotates with (the largest key position that is not padding, or the largest
/// one when every key is padding, or a larger query position, plus 1). False when the encoder
/// rejects the rotation.
template <class S, class E>
bool rotate_as_stored(E const& enc, std::vector<float>& k, index_t sq, index_t sk, index_t key_length, dims const& d) {
  if (sk == 0) return true;
  index_t const L = key_length >= 0 ? key_length : sk;
  index_t const kmax = L > 0 ? std::min(L, sk) - 1 : sk - 1;
  index_t const qmax = sq == 0 ? -1 : sq == sk ? sq - 1 : L - 1;
  index_t const length = std::max(kmax, qmax) + 1;
  std::vector<index_t> ids(static_cast<std::size_t>(sk));
  for (index_t j = 0; j < sk; ++j) ids[static_cast<std::size_t>(j)] = j < L ? j : std::min(j, length - 1);
  try {
    enc.rotate(posenc::make_bshd(k.data(), 1, sk, d.Hkv, d.D), posenc::position_span::ids(ids.data(), 1, sk), length);
  } catch (posenc::error const&) {
    return false;
  }
  round_to_storage<S>(k);
  return true;
}

/// A packed call of 1 to 5 sequences against each sequence's contiguous call. With 16-bit k and v
/// (extended inputs) the packed reference and fused calls (q and out float) must equal the
/// contiguous 16-bit call on the sequence's rows (bit for bit on one thread), and meet the
/// tolerance rule against the float reference on the widened k and v (keys rotated as the
/// 16-bit call stores them, for a rotating encoder).
template <class Store, class E>
void packed_run(fuzz_input& in, dims const& d, encoder_choice const& ec, E const& enc) {
  constexpr bool has_memory = posenc::detail::has_memory_length<E>::value;
  constexpr bool rotates = posenc::encoder_traits<E>::rotates_queries_keys;
  constexpr bool sixteen = sixteen_v<Store>;
  index_t const n = in.range(1, 5);
  // Extended inputs with a Transformer-XL memory_length() M > 0: half the time every sequence of
  // more than M + 1 keys has more than M before its queries (a memory the call cuts).
  index_t memory = 0;
  if constexpr (has_memory) memory = enc.memory_length();
  bool const cut_all = g_extended && memory > 0 && in.coin();
  std::vector<index_t> ql, kl;
  for (index_t s = 0; s < n; ++s) {
    index_t const k = in.below(6) == 0 ? 0 : in.range(1, 12), q_min = std::min<index_t>(1, k);
    kl.push_back(k);
    ql.push_back(in.below(6) == 0 ? 0 : in.range(q_min, cut_all ? std::max(q_min, k - memory - 1) : k));
  }
  std::vector<index_t> const cu_q = posenc::cumulative_lengths(ql), cu_k = posenc::cumulative_lengths(kl);
  index_t const Tq = cu_q.back(), Tk = cu_k.back();
  values gen(in.word());
  double const amp = in.below(6) == 0 ? 6.0 : 1.0;
  std::vector<float> q(static_cast<std::size_t>(Tq * d.Hq * d.D)), k(static_cast<std::size_t>(Tk * d.Hkv * d.D)),
      v(static_cast<std::size_t>(Tk * d.Hkv * d.Dv));
  for (auto& e : q) e = gen.next(amp);
  for (auto& e : k) e = gen.next(amp);
  for (auto& e : v) e = gen.next(1.0);
  if (!q.empty() && in.below(6) == 0) q[in.below(static_cast<std::uint32_t>(q.size()))] = std::nanf("");
  if (!v.empty() && in.below(6) == 0) {
    float const kinds[] = {std::nanf(""), inf, -inf};
    v[in.below(static_cast<std::uint32_t>(v.size()))] = kinds[in.below(3)];
  }
  posenc::attention_options<float> opt;
  opt.causal = in.coin();
  if (in.below(4) == 0) opt.sliding_window = in.range(1, 6);
  static double const caps[] = {0.5, 5.0, 30.0};
  if (in.below(4) == 0) opt.softcap = caps[in.below(3)];
  if (in.below(4) == 0) opt.scale = in.coin() ? 0.5 : 2.0;
  opt.threads = 1;
  // key_lengths: with Transformer-XL (and its memory cut) on extended inputs only.
  std::vector<index_t> key_lengths;
  if ((!has_memory || g_extended) && in.below(3) == 0) {
    for (index_t s = 0; s < n; ++s)
      key_lengths.push_back(in.below(12) == 0 ? kl[static_cast<std::size_t>(s)] + 1 : in.range(0, kl[static_cast<std::size_t>(s)]));
    opt.key_lengths = key_lengths;
  }
  std::vector<float> fmask;
  std::unique_ptr<bool[]> bmask;
  int const masks = in.below(3) == 0 ? static_cast<int>(in.range(1, 3)) : 0;
  index_t const mh = in.coin() ? 1 : d.Hq, mq = in.coin() || Tq == 0 ? 1 : Tq, mk = in.coin() ? Tk : in.range(0, Tk);
  std::size_t const mn = static_cast<std::size_t>(mh * mq * mk);
  if (masks & 1) {
    fmask.resize(mn);
    for (auto& x : fmask) x = in.below(5) == 0 ? -inf : static_cast<float>(in.range(-20, 20)) / 10.0f;
    opt.mask = posenc::make_mask<float>(fmask.data(), 1, mh, mq, mk);
  }
  if (masks & 2) {
    bmask.reset(new bool[mn + 1]);
    for (std::size_t i = 0; i < mn; ++i) bmask[i] = in.below(4) != 0;
    opt.bool_mask = posenc::make_mask<bool>(bmask.get(), 1, mh, mq, mk);
  }
  bool const want_lse = in.coin();
  // Extended inputs: threads 1 to 3, and sometimes a NaN or an infinity in the keys.
  if (g_extended) {
    opt.threads = static_cast<int>(in.range(1, 3));
    if (!k.empty() && in.below(8) == 0) {
      float const kinds[] = {std::nanf(""), inf, -inf};
      float const bad = kinds[in.below(3)];
      spoil(in, k, Tk * d.Hkv, d.D, bad);
    }
  }
  // 16-bit k and v: the packed call's, and their widened values (float: k and v themselves).
  std::vector<Store> k16, v16;
  if constexpr (sixteen) k16 = to_storage_copy<Store>(k), v16 = to_storage_copy<Store>(v);
  std::vector<float> kw = k, vw = v;
  round_to_storage<Store>(kw), round_to_storage<Store>(vw);
  logf(g_config, "packed: %ld sequences, kv_heads %ld q heads %ld head_dim %ld value_dim %ld, k and v %s; ",
       static_cast<long>(n), static_cast<long>(d.Hkv), static_cast<long>(d.Hq), static_cast<long>(d.D),
       static_cast<long>(d.Dv), storage_name<Store>());
  ec.describe(g_config);
  logf(g_log, "  q/k lengths:");
  for (index_t s = 0; s < n; ++s)
    logf(g_log, " %ld/%ld", static_cast<long>(ql[static_cast<std::size_t>(s)]), static_cast<long>(kl[static_cast<std::size_t>(s)]));
  logf(g_log, "\n  threads %d causal %d window %ld softcap %g scale %g key_lengths %zu masks %d (1 %ld %ld %ld) lse %d keys finite %d\n",
       opt.threads, opt.causal ? 1 : 0, static_cast<long>(opt.sliding_window), opt.softcap, opt.scale ? *opt.scale : -0.0,
       key_lengths.size(), masks, static_cast<long>(mh), static_cast<long>(mq), static_cast<long>(mk), want_lse ? 1 : 0,
       std::all_of(k.begin(), k.end(), [](float x) { return std::isfinite(x); }) ? 1 : 0);
  if (!key_lengths.empty()) {
    logf(g_log, "  key_lengths:");
    for (index_t x : key_lengths) logf(g_log, " %ld", static_cast<long>(x));
    logf(g_log, "\n");
  }

  // The sequences alone: the oracle (over the widened k and v), and the contiguous calls a
  // sequence of the packed call must equal bit for bit on one thread: the contiguous fused
  // call, and for 16-bit k and v the contiguous 16-bit reference and fused calls.
  std::vector<problem> alone(static_cast<std::size_t>(n));
  std::vector<expected> want(static_cast<std::size_t>(n));
  std::vector<std::vector<float>> fused_out(static_cast<std::size_t>(n)), fused_lse(static_cast<std::size_t>(n)),
      ref16_out(static_cast<std::size_t>(n)), ref16_lse(static_cast<std::size_t>(n));
  bool all_ok = true;
  for (index_t s = 0; s < n; ++s) {
    problem& p = alone[static_cast<std::size_t>(s)];
    index_t const sq = ql[static_cast<std::size_t>(s)], sk = kl[static_cast<std::size_t>(s)];
    index_t const q0 = cu_q[static_cast<std::size_t>(s)], k0 = cu_k[static_cast<std::size_t>(s)];
    p.Sq = sq, p.Sk = sk, p.Hq = d.Hq, p.Hkv = d.Hkv, p.D = d.D, p.Dv = d.Dv;
    p.q.assign(q.begin() + q0 * d.Hq * d.D, q.begin() + (q0 + sq) * d.Hq * d.D);
    p.k.assign(kw.begin() + k0 * d.Hkv * d.D, kw.begin() + (k0 + sk) * d.Hkv * d.D);
    p.v.assign(vw.begin() + k0 * d.Hkv * d.Dv, vw.begin() + (k0 + sk) * d.Hkv * d.Dv);
    p.base = opt;
    p.base.key_lengths = {};
    p.base.mask = {};
    p.base.bool_mask = {};
    p.base.lse = {};
    if (!key_lengths.empty()) p.key_length = key_lengths[static_cast<std::size_t>(s)];
    // The diagonal block of the masks: rows q0.. (or the broadcast row), keys k0 .. min(mk, k0 + sk).
    // A sequence without queries gets one broadcast row (never read).
    index_t const kk = std::max<index_t>(0, std::min(mk, k0 + sk) - k0), rows = mq == 1 || sq == 0 ? 1 : sq;
    auto at = [&](index_t h, index_t i, index_t j) {
      return static_cast<std::size_t>((h * mq + (mq == 1 || sq == 0 ? 0 : q0 + i)) * mk + k0 + j);
    };
    if (masks & 1) {
      p.has_fmask = true;
      p.mh = mh, p.mq = rows, p.mk = kk;
      for (index_t h = 0; h < mh; ++h)
        for (index_t i = 0; i < rows; ++i)
          for (index_t j = 0; j < kk; ++j) p.fmask.push_back(fmask[at(h, i, j)]);
    }
    if (masks & 2) {
      p.bh = mh, p.bq = rows, p.bk = kk;
      p.bmask.reset(new bool[static_cast<std::size_t>(mh * rows * kk + 1)]);
      std::size_t t = 0;
      for (index_t h = 0; h < mh; ++h)
        for (index_t i = 0; i < rows; ++i)
          for (index_t j = 0; j < kk; ++j) p.bmask[t++] = bmask[at(h, i, j)];
    }
    set_extra(p, enc);
    auto& x = want[static_cast<std::size_t>(s)];
    auto& fo = fused_out[static_cast<std::size_t>(s)];
    auto& fl = fused_lse[static_cast<std::size_t>(s)];
    if constexpr (sixteen) {
      std::vector<Store> const ks(k16.begin() + k0 * d.Hkv * d.D, k16.begin() + (k0 + sk) * d.Hkv * d.D);
      std::vector<Store> const vs(v16.begin() + k0 * d.Hkv * d.Dv, v16.begin() + (k0 + sk) * d.Hkv * d.Dv);
      bool const f16_ok = run_stored<posenc::path::fused>(p, ks, vs, opt.keys_rotated, enc, fo, fl);
      bool const r16_ok = run_stored<posenc::path::reference>(p, ks, vs, opt.keys_rotated, enc,
                                                              ref16_out[static_cast<std::size_t>(s)],
                                                              ref16_lse[static_cast<std::size_t>(s)]);
      if (f16_ok != r16_ok) fail("the contiguous 16-bit reference and fused calls disagree on whether the arguments are valid");
      bool rotation_ok = true;
      if constexpr (rotates) {
        rotation_ok = rotate_as_stored<Store>(enc, p.k, sq, sk, p.key_length, d);
        p.base.keys_rotated = sk > 0;
      }
      if (rotation_ok) x = oracle(p, enc);
      if (r16_ok != (rotation_ok && x.ok)) {
        std::fprintf(stderr, "sequence %ld: the 16-bit call %s, the float call on its widened k and v %s\n",
                     static_cast<long>(s), r16_ok ? "accepts" : "throws",
                     !rotation_ok ? "cannot rotate its keys" : x.ok ? "accepts" : "throws");
        fail("the contiguous 16-bit call and the float call on its widened k and v disagree on validity");
      }
      x.ok = r16_ok;
      // The reference reads each 16-bit element widened exactly, in double: the float reference's bits.
      if (x.ok && opt.threads == 1 &&
          (!identical(ref16_out[static_cast<std::size_t>(s)].data(), x.out.data(), x.out.size()) ||
           !identical(ref16_lse[static_cast<std::size_t>(s)].data(), x.lse.data(), x.lse.size()))) {
        std::fprintf(stderr, "sequence %ld: the contiguous 16-bit reference is not the float reference on the widened k and v\n",
                     static_cast<long>(s));
        fail("the 16-bit reference differs from the float reference on the widened values bit for bit");
      }
    } else {
      x = oracle(p, enc);
      if (x.ok && !run_contiguous<posenc::path::fused>(p, enc, fo, fl))
        fail("the contiguous fused call rejects what the contiguous reference accepts");
    }
    all_ok = all_ok && x.ok;
  }

  std::size_t const out_n = static_cast<std::size_t>(Tq * d.Hq * d.Dv), lse_n = static_cast<std::size_t>(d.Hq * Tq);
  auto call = [&](auto path, std::vector<float>& out, std::vector<float>& lse, char const* name) {
    using Path = decltype(path);
    out.assign(out_n, sentinel), lse.assign(lse_n, sentinel);
    posenc::attention_options<float> o = opt;
    if (want_lse) o.lse = lse;
    posenc::packed_sequences const seqs{cu_q, cu_k};
    try {
      if constexpr (sixteen) {
        posenc::attention<Path>(posenc::make_bshd<const float>(q.data(), 1, Tq, d.Hq, d.D),
                                posenc::make_bshd<const Store>(k16.data(), 1, Tk, d.Hkv, d.D),
                                posenc::make_bshd<const Store>(v16.data(), 1, Tk, d.Hkv, d.Dv),
                                posenc::make_bshd(out.data(), 1, Tq, d.Hq, d.Dv), seqs, enc, o);
      } else {
        posenc::attention<Path>(posenc::make_bshd<const float>(q.data(), 1, Tq, d.Hq, d.D),
                                posenc::make_bshd<const float>(k.data(), 1, Tk, d.Hkv, d.D),
                                posenc::make_bshd<const float>(v.data(), 1, Tk, d.Hkv, d.Dv),
                                posenc::make_bshd(out.data(), 1, Tq, d.Hq, d.Dv), seqs, enc, o);
      }
    } catch (posenc::error const& e) {
      logf(g_log, "  %s threw: %s\n", name, e.what());
      require_untouched(out, lse, "the packed call");
      return false;
    }
    return true;
  };
  auto packed = [&](auto path, char const* name) {
    using Path = decltype(path);
    std::vector<float> out, lse;
    if (!call(path, out, lse, name)) {
      if (all_ok) fail("the packed call throws though every sequence's contiguous call accepts");
      return;
    }
    if (!all_ok) fail("the packed call accepts a sequence whose contiguous call throws");
    if (opt.threads > 1) {  // the same call again, the same threads: the same bits
      std::vector<float> out2, lse2;
      if (!call(path, out2, lse2, name)) fail("a second run of an accepted packed call throws");
      if (!identical(out2.data(), out.data(), out_n) || (want_lse && !identical(lse2.data(), lse.data(), lse_n))) {
        std::fprintf(stderr, "%s, %d threads: the second run differs\n", name, opt.threads);
        fail("a second run of the same packed call differs bit for bit");
      }
    }
    for (index_t s = 0; s < n; ++s) {
      problem const& p = alone[static_cast<std::size_t>(s)];
      expected const& x = want[static_cast<std::size_t>(s)];
      index_t const q0 = cu_q[static_cast<std::size_t>(s)];
      std::vector<float> l(static_cast<std::size_t>(d.Hq * p.Sq));
      for (index_t h = 0; h < d.Hq; ++h)
        for (index_t i = 0; i < p.Sq; ++i) l[static_cast<std::size_t>(h * p.Sq + i)] = lse[static_cast<std::size_t>(h * Tq + q0 + i)];
      float const* o0 = out.data() + q0 * d.Hq * d.Dv;
      char where[64];
      std::snprintf(where, sizeof where, "sequence %ld (%ld queries, %ld keys)", static_cast<long>(s),
                    static_cast<long>(p.Sq), static_cast<long>(p.Sk));
      check_against(x, p, o0, l.data(), want_lse, name, where);
      // One thread: the path's own kernel on the sequence's rows, as the contiguous call of the
      // same tensor types (bit for bit).
      std::vector<float> const* same_out = nullptr;
      std::vector<float> const* same_lse = nullptr;
      if (std::is_same_v<Path, posenc::path::reference>) {
        same_out = sixteen ? &ref16_out[static_cast<std::size_t>(s)] : &x.out;
        same_lse = sixteen ? &ref16_lse[static_cast<std::size_t>(s)] : &x.lse;
      }
      if (std::is_same_v<Path, posenc::path::fused>)
        same_out = &fused_out[static_cast<std::size_t>(s)], same_lse = &fused_lse[static_cast<std::size_t>(s)];
      if (opt.threads == 1 && same_out &&
          (!identical(o0, same_out->data(), same_out->size()) ||
           (want_lse && !identical(l.data(), same_lse->data(), same_lse->size())))) {
        std::fprintf(stderr, "%s, %s: not the contiguous call on the sequence's rows bit for bit\n", where, name);
        fail("packed call differs from the contiguous call of the same path bit for bit");
      }
    }
  };
  if (all_ok && g_extended) {
    ++stats.packed_checked, ++stats.packed_threads[opt.threads];
    stats.packed_bad_keys += std::all_of(k.begin(), k.end(), [](float x) { return std::isfinite(x); }) ? 0 : 1;
    if (has_memory && !key_lengths.empty()) {
      ++stats.packed_xl_lengths;
      bool cut = false;
      for (index_t s = 0; s < n; ++s)
        cut = cut || memory_cut_of(enc, ql[static_cast<std::size_t>(s)], key_lengths[static_cast<std::size_t>(s)]) > 0;
      stats.packed_xl_cut_lengths += cut ? 1 : 0;
    }
    stats.packed_rotated16 += sixteen && rotates ? 1 : 0;
  }
  packed(posenc::path::reference{}, "packed reference");
  if constexpr (!sixteen) packed(posenc::path::materialized{}, "packed materialized");
  packed(posenc::path::fused{}, "packed fused");
}

/// The 16-bit type of an encoder's 16-bit pages and packed k and v: Eigen::half or
/// Eigen::bfloat16, one per encoder (both for all six encoders would add as much build time
/// again), each of them under a rotation (rope; rope + alibi) and under a bias (alibi; t5_bias).
template <class E>
struct sixteen_of {
  using type = Eigen::bfloat16;  // none, t5_bias, compose<rope, alibi>
};
template <>
struct sixteen_of<posenc::rope<float>> {
  using type = Eigen::half;
};
template <>
struct sixteen_of<posenc::alibi<float>> {
  using type = Eigen::half;
};
template <>
struct sixteen_of<posenc::transformer_xl<float>> {
  using type = Eigen::half;
};

/// Decodes and runs one input: its float runs (Sixteen false) or its 16-bit runs (Sixteen true,
/// instantiated only in cache_sixteen.cpp). Returns false when the input asks for the runs of the
/// other kind, having decoded nothing else.
template <bool Sixteen>
bool run_input(std::uint8_t const* data, std::size_t size) {
  fuzz_input in(data, size);
  g_config.clear();
  g_log.clear();
  std::uint8_t const first = in.byte();
  bool const packed = first % 4 == 0;
  g_extended = first >= 0x40 && first < 0xc0;
  if (!Sixteen) ++stats.inputs, stats.extended += g_extended ? 1 : 0;
  dims d;
  d.Hkv = in.range(1, 2);
  d.Hq = d.Hkv * in.range(1, 2);
  d.D = 2 * in.range(1, 8);
  d.Dv = in.below(3) == 0 ? in.range(1, 12) : d.D;
  encoder_choice ec;
  ec.draw(in, d, static_cast<int>(in.below(6)));
  // Extended inputs: pages (or packed k and v) of float or of the encoder's 16-bit type.
  bool const sixteen = g_extended && in.coin();
  if (sixteen != Sixteen) return false;
  with_encoder(ec, d, [&](auto const& enc) {
    using S = std::conditional_t<Sixteen, typename sixteen_of<std::decay_t<decltype(enc)>>::type, float>;
    if (packed) packed_run<S>(in, d, ec, enc);
    else paged_run<S>(in, d, ec, enc);
  });
  return true;
}

}  // namespace

#ifdef POSENC_FUZZ_CACHE_SIXTEEN_UNIT
// cache_sixteen.cpp: the 16-bit runs, a unit of their own so that their kernels compile in
// parallel with the float ones.
void posenc_fuzz_cache_sixteen(std::uint8_t const* data, std::size_t size) {
  if (!run_input<true>(data, size)) posenc_fuzz::finding("an input of the float runs reached the 16-bit unit");
}
#else
void posenc_fuzz_cache_sixteen(std::uint8_t const* data, std::size_t size);

// With OpenMP (tests/fuzz/CMakeLists.txt), threads > 1 run on OpenMP threads; passive waiting
// keeps them from spinning between calls on the cores the other harnesses fuzz on.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  setenv("OMP_WAIT_POLICY", "passive", 0);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(std::uint8_t const* data, std::size_t size) {
  if (!run_input<false>(data, size)) posenc_fuzz_cache_sixteen(data, size);
  return 0;
}
#endif
