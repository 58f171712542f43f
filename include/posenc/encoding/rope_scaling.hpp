// SPDX-License-Identifier: MIT
// RoPE scaling rules (none, linear, dynamic NTK, YaRN, Llama 3, LongRoPE) -> inverse frequencies and attention factor.
//
// Everything here is double precision: the frequencies theta'_k and the
// attention factor a of docs/formulas.md 3.5. The rotation itself lives in rope.hpp.
#pragma once

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "posenc/core/error.hpp"
#include "posenc/core/span.hpp"
#include "posenc/encoding/identity.hpp"

namespace posenc {

/// Which components of a head form rotation pair k (docs/formulas.md 3.2). There is
/// no default: a layout that does not match the checkpoint silently ruins
/// the model.
enum class rope_layout {
  /// pair k = (x[k], x[k + r/2]): GPT-NeoX, HF LLaMA and every HF-format checkpoint (`rotate_half`).
  half_split,
  /// pair k = (x[2k], x[2k+1]): GPT-J, RoFormer, Meta's LLaMA reference code (`rotate_every_two`).
  interleaved,
};

/// The scaling rule of a RoPE (HF `rope_type`).
enum class rope_scaling_type { none, linear, dynamic, yarn, llama3, longrope };

/// Name of a scaling type as HF spells it ("default", "linear", "dynamic", "yarn", "llama3", "longrope").
inline char const* to_string(rope_scaling_type t) noexcept {
  switch (t) {
    case rope_scaling_type::none: return "default";
    case rope_scaling_type::linear: return "linear";
    case rope_scaling_type::dynamic: return "dynamic";
    case rope_scaling_type::yarn: return "yarn";
    case rope_scaling_type::llama3: return "llama3";
    case rope_scaling_type::longrope: return "longrope";
  }
  return "?";
}

/// Typed parameters of a scaling rule (docs/formulas.md 3.5). Build it with one of
/// the named factories, which take every length the rule needs: there are no
/// hidden defaults for lengths. Fields that are not lengths carry HF's
/// defaults (beta_fast 32, beta_slow 1, truncate true) and may be changed
/// after the factory call. Checked by the rope constructor.
struct rope_scaling {
  rope_scaling_type type = rope_scaling_type::none;
  /// s: linear, dynamic, yarn, llama3; optional for longrope (then M / L0).
  double factor = 1.0;
  /// M: dynamic (threshold length) and longrope (s = M / L0 when factor is not given).
  index_t max_position_embeddings = 0;
  /// L0: yarn, llama3, longrope.
  index_t original_max_position_embeddings = 0;
  /// yarn
  double beta_fast = 32.0, beta_slow = 1.0;
  bool truncate = true;
  std::optional<double> mscale, mscale_all_dim;
  /// yarn and longrope: overrides the computed attention factor.
  std::optional<double> attention_factor;
  /// llama3
  double low_freq_factor = 1.0, high_freq_factor = 4.0;
  /// longrope: r/2 divisors each; long_factor is used when length > L0.
  std::vector<double> short_factor, long_factor;
  /// longrope: true when `factor` was given (else s = M / L0).
  bool has_factor = false;

  /// No scaling: theta' = theta, a = 1.
  static rope_scaling none() { return {}; }
  /// Position interpolation: theta' = theta / factor (Vicuna-v1.5-16k: 4).
  static rope_scaling linear(double factor) {
    rope_scaling s;
    s.type = rope_scaling_type::linear;
    s.factor = factor;
    return s;
  }
  /// Dynamic NTK: the base grows with the current length once it exceeds
  /// `max_position_embeddings` (the config value M).
  static rope_scaling dynamic_ntk(double factor, index_t max_position_embeddings) {
    rope_scaling s;
    s.type = rope_scaling_type::dynamic;
    s.factor = factor;
    s.max_position_embeddings = max_position_embeddings;
    return s;
  }
  /// YaRN with the original training length L0 (Qwen2.5: 4, 32768; DeepSeek-V3: 40, 4096).
  static rope_scaling yarn(double factor, index_t original_max_position_embeddings) {
    rope_scaling s;
    s.type = rope_scaling_type::yarn;
    s.factor = factor;
    s.original_max_position_embeddings = original_max_position_embeddings;
    return s;
  }
  /// Llama 3 (3.1: 8, 1, 4, 8192).
  static rope_scaling llama3(double factor, double low_freq_factor, double high_freq_factor,
                             index_t original_max_position_embeddings) {
    rope_scaling s;
    s.type = rope_scaling_type::llama3;
    s.factor = factor;
    s.low_freq_factor = low_freq_factor;
    s.high_freq_factor = high_freq_factor;
    s.original_max_position_embeddings = original_max_position_embeddings;
    return s;
  }
  /// LongRoPE (Phi-3 128k: L0 4096, M 131072). s = M / L0 unless `with_factor` is called.
  static rope_scaling longrope(std::vector<double> short_factor, std::vector<double> long_factor,
                               index_t original_max_position_embeddings, index_t max_position_embeddings) {
    rope_scaling s;
    s.type = rope_scaling_type::longrope;
    s.short_factor = std::move(short_factor);
    s.long_factor = std::move(long_factor);
    s.original_max_position_embeddings = original_max_position_embeddings;
    s.max_position_embeddings = max_position_embeddings;
    return s;
  }
  /// Sets an explicit factor (longrope: instead of M / L0).
  rope_scaling& with_factor(double f) {
    factor = f;
    has_factor = true;
    return *this;
  }

  /// The type and each parameter that type reads (compute_rope_frequencies,
  /// rope_attention_factor): fields another type ignores are not part of it.
  encoder_identity identity() const {
    encoder_identity id(to_string(type));
    auto optional = [&](char const* name, std::optional<double> const& v) {
      if (v)
        id.add(name, *v);
      else
        id.add(name, "unset");
    };
    switch (type) {
      case rope_scaling_type::none: break;
      case rope_scaling_type::linear: id.add("factor", factor); break;
      case rope_scaling_type::dynamic: id.add("factor", factor).add("max_position_embeddings", max_position_embeddings); break;
      case rope_scaling_type::yarn:
        id.add("factor", factor).add("original_max_position_embeddings", original_max_position_embeddings);
        id.add("beta_fast", beta_fast).add("beta_slow", beta_slow).add("truncate", truncate);
        optional("mscale", mscale);
        optional("mscale_all_dim", mscale_all_dim);
        optional("attention_factor", attention_factor);
        break;
      case rope_scaling_type::llama3:
        id.add("factor", factor).add("low_freq_factor", low_freq_factor).add("high_freq_factor", high_freq_factor);
        id.add("original_max_position_embeddings", original_max_position_embeddings);
        break;
      case rope_scaling_type::longrope:
        id.add("original_max_position_embeddings", original_max_position_embeddings);
        if (has_factor)
          id.add("factor", factor);
        else
          id.add("max_position_embeddings", max_position_embeddings);
        optional("attention_factor", attention_factor);
        id.add_table("short_factor", short_factor.data(), 1, static_cast<std::int64_t>(short_factor.size()),
                     static_cast<std::int64_t>(short_factor.size()));
        id.add_table("long_factor", long_factor.data(), 1, static_cast<std::int64_t>(long_factor.size()),
                     static_cast<std::int64_t>(long_factor.size()));
        break;
    }
    return id;
  }
};

/// Frequencies of one call: theta'_k (k = 0 .. r/2-1) and the attention factor.
/// theta'_k is derived in long double and kept as a double-double pair
/// (inv_freq + inv_freq_lo), so that the angle pos * theta'_k stays exact to
/// ~1e-16 even at pos ~ 1e6 (a plain double product is off by up to 6e-11
/// there, more than a float ulp of a cos near zero).
struct rope_frequencies {
  std::vector<double> inv_freq;     ///< theta'_k rounded to double
  std::vector<double> inv_freq_lo;  ///< theta'_k - inv_freq[k] (0 where long double is double)
  double attention_factor = 1.0;
  bool operator==(rope_frequencies const& o) const {
    return attention_factor == o.attention_factor && inv_freq == o.inv_freq && inv_freq_lo == o.inv_freq_lo;
  }
  bool operator!=(rope_frequencies const& o) const { return !(*this == o); }
};

/// YaRN's correction range (lo, hi) over the pair index, after truncation and
/// clamping (docs/formulas.md 3.5): r = 64, base 1e4, L0 4096 gives (10, 23).
inline std::pair<double, double> yarn_correction_range(index_t rotary_dim, double base, double beta_fast,
                                                       double beta_slow, index_t original_max_position_embeddings,
                                                       bool truncate) {
  double const r = static_cast<double>(rotary_dim);
  double const l0 = static_cast<double>(original_max_position_embeddings);
  double const pi = 3.141592653589793238462643383279502884;
  auto corr = [&](double n) { return r * std::log(l0 / (2.0 * pi * n)) / (2.0 * std::log(base)); };
  double lo = corr(beta_fast), hi = corr(beta_slow);
  if (truncate) {
    lo = std::floor(lo);
    hi = std::ceil(hi);
  }
  lo = std::max(lo, 0.0);
  hi = std::min(hi, r - 1.0);
  return {lo, hi};
}

/// g(s, m) of YaRN: 1 when s <= 1, else 0.1 m ln(s) + 1.
inline double yarn_get_mscale(double s, double m) noexcept { return s <= 1.0 ? 1.0 : 0.1 * m * std::log(s) + 1.0; }

/// The attention factor a of a scaling (1 for none, linear, dynamic, llama3).
inline double rope_attention_factor(rope_scaling const& sc) {
  switch (sc.type) {
    case rope_scaling_type::yarn:
      if (sc.attention_factor) return *sc.attention_factor;
      if (sc.mscale && sc.mscale_all_dim && *sc.mscale != 0.0 && *sc.mscale_all_dim != 0.0)
        return yarn_get_mscale(sc.factor, *sc.mscale) / yarn_get_mscale(sc.factor, *sc.mscale_all_dim);
      return yarn_get_mscale(sc.factor, 1.0);
    case rope_scaling_type::longrope: {
      if (sc.attention_factor) return *sc.attention_factor;
      double const l0 = static_cast<double>(sc.original_max_position_embeddings);
      double const s = sc.has_factor ? sc.factor : static_cast<double>(sc.max_position_embeddings) / l0;
      return s <= 1.0 ? 1.0 : std::sqrt(1.0 + std::log(s) / std::log(l0));
    }
    default: return 1.0;
  }
}

namespace detail {

inline bool finite_positive(double x) noexcept { return std::isfinite(x) && x > 0.0; }
/// Finite, > 0 and not subnormal: a value whose quotients and logarithms stay finite.
inline bool normal_positive(double x) noexcept {
  return std::isfinite(x) && x >= std::numeric_limits<double>::min();
}

/// Checks the parameters a user gives (not the derived values: see
/// check_rope_derived); throws posenc::error naming the field.
inline void check_rope_scaling(char const* where, rope_scaling const& sc, index_t rotary_dim) {
  auto need_factor = [&] {
    require(normal_positive(sc.factor), where, "scaling.factor is ", sc.factor,
            ", expected a finite normal number > 0 (factor < 1 is allowed)");
  };
  auto need_l0 = [&] {
    require(sc.original_max_position_embeddings > 0, where, "scaling.original_max_position_embeddings is ",
            sc.original_max_position_embeddings, ", expected > 0 (", to_string(sc.type),
            " needs the original training length)");
  };
  auto need_positive = [&](double v, char const* name) {
    require(normal_positive(v), where, "scaling.", name, " is ", v, ", expected a finite normal number > 0");
  };
  auto optional_positive = [&](std::optional<double> const& v, char const* name) {
    if (v) need_positive(*v, name);
  };
  switch (sc.type) {
    case rope_scaling_type::none: break;
    case rope_scaling_type::linear: need_factor(); break;
    case rope_scaling_type::dynamic:
      need_factor();
      require(sc.max_position_embeddings > 0, where, "scaling.max_position_embeddings is ",
              sc.max_position_embeddings, ", expected > 0 (dynamic needs the threshold length)");
      require(rotary_dim > 2, where, "rotary_dim is ", rotary_dim,
              ", expected > 2 for dynamic scaling (the exponent is r / (r - 2))");
      break;
    case rope_scaling_type::yarn:
      need_factor();
      need_l0();
      need_positive(sc.beta_fast, "beta_fast");
      need_positive(sc.beta_slow, "beta_slow");
      optional_positive(sc.attention_factor, "attention_factor");
      if (sc.mscale) require(std::isfinite(*sc.mscale), where, "scaling.mscale is ", *sc.mscale, ", expected finite");
      if (sc.mscale_all_dim)
        require(std::isfinite(*sc.mscale_all_dim), where, "scaling.mscale_all_dim is ", *sc.mscale_all_dim,
                ", expected finite");
      break;
    case rope_scaling_type::llama3:
      need_factor();
      need_l0();
      need_positive(sc.low_freq_factor, "low_freq_factor");
      need_positive(sc.high_freq_factor, "high_freq_factor");
      require(sc.low_freq_factor < sc.high_freq_factor, where, "scaling.low_freq_factor is ", sc.low_freq_factor,
              ", expected < high_freq_factor (", sc.high_freq_factor, ")");
      break;
    case rope_scaling_type::longrope: {
      need_l0();
      if (sc.has_factor) {
        need_factor();
      } else {
        require(sc.max_position_embeddings > 0, where, "scaling.max_position_embeddings is ",
                sc.max_position_embeddings, ", expected > 0 (longrope without a factor uses M / L0)");
      }
      optional_positive(sc.attention_factor, "attention_factor");
      index_t const half = rotary_dim / 2;
      require(static_cast<index_t>(sc.short_factor.size()) == half, where, "scaling.short_factor has ",
              sc.short_factor.size(), " values, expected ", half, " (rotary_dim / 2)");
      require(static_cast<index_t>(sc.long_factor.size()) == half, where, "scaling.long_factor has ",
              sc.long_factor.size(), " values, expected ", half, " (rotary_dim / 2)");
      for (std::size_t k = 0; k < sc.short_factor.size(); ++k)
        require(normal_positive(sc.short_factor[k]), where, "scaling.short_factor[", k, "] is ", sc.short_factor[k],
                ", expected a finite normal number > 0");
      for (std::size_t k = 0; k < sc.long_factor.size(); ++k)
        require(normal_positive(sc.long_factor[k]), where, "scaling.long_factor[", k, "] is ", sc.long_factor[k],
                ", expected a finite normal number > 0");
      break;
    }
  }
}

}  // namespace detail

/// theta'_k and a for a scaling at the current length L (docs/formulas.md 3.1, 3.5).
/// `length` matters only for dynamic (L > M) and longrope (L > L0).
/// Computed in long double (double where that is all there is).
/// Preconditions: the scaling passed detail::check_rope_scaling; base > 1; r even >= 2.
inline rope_frequencies compute_rope_frequencies(rope_scaling const& sc, index_t rotary_dim, double base,
                                                 index_t length) {
  using F = long double;
  index_t const half = rotary_dim / 2;
  F const r = static_cast<F>(rotary_dim);
  F const pi = 3.141592653589793238462643383279502884L;
  std::vector<F> th(static_cast<std::size_t>(half));
  F b = base;
  if (sc.type == rope_scaling_type::dynamic && length > sc.max_position_embeddings) {
    F const lm = static_cast<F>(length) / static_cast<F>(sc.max_position_embeddings);
    F const s = sc.factor;
    b = b * std::pow(s * lm - (s - 1), r / (r - 2));
  }
  if (std::numeric_limits<F>::digits >= 64) {
    // theta_k = q^k with q = b^(-2/r): one pow instead of r/2 (powl costs ~1 us); the
    // product drifts by ~k * 2^-64, far below a double ulp.
    F const q = std::pow(b, F(-2) / r);
    F t = 1;
    for (index_t k = 0; k < half; ++k, t *= q) th[static_cast<std::size_t>(k)] = t;
  } else {
    for (index_t k = 0; k < half; ++k) th[static_cast<std::size_t>(k)] = 1 / std::pow(b, static_cast<F>(2 * k) / r);
  }

  switch (sc.type) {
    case rope_scaling_type::none:
    case rope_scaling_type::dynamic: break;
    case rope_scaling_type::linear:
      for (auto& t : th) t /= sc.factor;
      break;
    case rope_scaling_type::yarn: {
      auto [lo, hi] = yarn_correction_range(rotary_dim, base, sc.beta_fast, sc.beta_slow,
                                            sc.original_max_position_embeddings, sc.truncate);
      if (lo == hi) hi += 0.001;
      for (index_t k = 0; k < half; ++k) {
        F& t = th[static_cast<std::size_t>(k)];
        F ramp = (static_cast<F>(k) - lo) / (static_cast<F>(hi) - lo);
        ramp = std::min(std::max(ramp, F(0)), F(1));
        F const w = 1 - ramp;  // extrapolation weight
        t = (t / sc.factor) * (1 - w) + t * w;
      }
      break;
    }
    case rope_scaling_type::llama3: {
      F const l0 = static_cast<F>(sc.original_max_position_embeddings);
      F const lf = sc.low_freq_factor, hf = sc.high_freq_factor;
      for (auto& t : th) {
        F const wavelen = 2 * pi / t;
        if (wavelen < l0 / hf) continue;  // high frequency: unchanged
        if (wavelen > l0 / lf) {          // low frequency: interpolated
          t = t / sc.factor;
          continue;
        }
        F const g = (l0 / wavelen - lf) / (hf - lf);  // middle band, edges included
        t = (1 - g) * t / sc.factor + g * t;
      }
      break;
    }
    case rope_scaling_type::longrope: {
      auto const& e = length > sc.original_max_position_embeddings ? sc.long_factor : sc.short_factor;
      for (index_t k = 0; k < half; ++k) th[static_cast<std::size_t>(k)] /= e[static_cast<std::size_t>(k)];
      break;
    }
  }
  rope_frequencies f;
  f.inv_freq.resize(th.size());
  f.inv_freq_lo.resize(th.size());
  for (std::size_t k = 0; k < th.size(); ++k) {
    f.inv_freq[k] = static_cast<double>(th[k]);
    f.inv_freq_lo[k] = static_cast<double>(th[k] - static_cast<F>(f.inv_freq[k]));
  }
  f.attention_factor = rope_attention_factor(sc);
  return f;
}

/// cos and sin of pos * theta' where theta' = hi + lo (a rope_frequencies
/// pair). The product is formed as a double-double a + e with an FMA (error
/// below |angle| * 2^-104); cos(a), sin(a) are libm's; e enters to first order
/// while |e| <= 2^-27 (the dropped e^2 / 2 is below 2^-55) and through cos(e),
/// sin(e) beyond that. For pos < 2^53 and an angle below 2^53 (the range rope
/// accepts) the result is within 2^-50 of the exact cos/sin of that theta'
/// (measured: docs/encoders/rope.md "Accuracy and range").
inline void rope_angle_cos_sin(index_t pos, double hi, double lo, double& c, double& s) noexcept {
  double const p = static_cast<double>(pos);
  double const a = p * hi;
  double const e = std::fma(p, hi, -a) + p * lo;  // a + e = p * (hi + lo) to ~2^-104 relative
  double const ca = std::cos(a), sa = std::sin(a);
  if (std::abs(e) <= 0x1p-27) {
    c = ca - sa * e;
    s = sa + ca * e;
  } else {
    double const ce = std::cos(e), se = std::sin(e);
    c = ca * ce - sa * se;
    s = sa * ce + ca * se;
  }
}

/// True when the frequencies of a scaling depend on the current length (dynamic, longrope).
inline bool rope_depends_on_length(rope_scaling const& sc) noexcept {
  return sc.type == rope_scaling_type::dynamic || sc.type == rope_scaling_type::longrope;
}

namespace detail {

/// The largest angle p * theta'_k rope accepts, exclusive: 2^53. Below it, and
/// with p < 2^53 (exact in double), rope_angle_cos_sin keeps its error bound.
inline constexpr double rope_max_angle = 9007199254740992.0;

/// Checks the values a scaling derives from its parameters (docs/formulas.md
/// 3.5) once each, after check_rope_scaling passed: YaRN's correction range and
/// mscale denominator, Llama 3's wavelength bounds and band width, LongRoPE's
/// ln(L0), and the attention factor of every rule. Throws posenc::error naming
/// the derived value and the fields it comes from.
inline void check_rope_derived(char const* where, rope_scaling const& sc, index_t rotary_dim, double base) {
  index_t const l0 = sc.original_max_position_embeddings;
  switch (sc.type) {
    case rope_scaling_type::yarn: {
      auto [lo, hi] = yarn_correction_range(rotary_dim, base, sc.beta_fast, sc.beta_slow, l0, sc.truncate);
      if (lo == hi) hi += 0.001;  // as compute_rope_frequencies does
      require(std::isfinite(lo) && std::isfinite(hi) && lo < hi, where, "yarn correction range is (", lo, ", ", hi,
              "), expected finite bounds with low < high (from beta_fast ", sc.beta_fast, ", beta_slow ", sc.beta_slow,
              ", original_max_position_embeddings ", l0, ", base ", base, ", rotary_dim ", rotary_dim, ")");
      if (!sc.attention_factor && sc.mscale && sc.mscale_all_dim && *sc.mscale != 0.0 && *sc.mscale_all_dim != 0.0) {
        // g(s, mscale_all_dim) = 0.1 m ln(s) + 1 divides: zero, or zero up to the
        // rounding of its terms (a few ulps of 0.1 m ln(s)), leaves a quotient of noise.
        double const term = sc.factor <= 1.0 ? 0.0 : 0.1 * *sc.mscale_all_dim * std::log(sc.factor);
        double const den = yarn_get_mscale(sc.factor, *sc.mscale_all_dim);
        require(std::isfinite(den) &&
                    std::abs(den) > 8 * std::numeric_limits<double>::epsilon() * std::max(1.0, std::abs(term)),
                where, "scaling.mscale_all_dim is ", *sc.mscale_all_dim,
                ", expected 0.1 * mscale_all_dim * ln(factor) + 1 != 0 (it divides the attention factor; factor ",
                sc.factor, ")");
      }
      break;
    }
    case rope_scaling_type::llama3: {
      double const l = static_cast<double>(l0);
      require(normal_positive(l / sc.high_freq_factor), where, "scaling.high_freq_factor is ", sc.high_freq_factor,
              ", expected original_max_position_embeddings (", l0,
              ") / high_freq_factor, the high-frequency wavelength bound, to be finite and normal");
      require(normal_positive(l / sc.low_freq_factor), where, "scaling.low_freq_factor is ", sc.low_freq_factor,
              ", expected original_max_position_embeddings (", l0,
              ") / low_freq_factor, the low-frequency wavelength bound, to be finite and normal");
      require(normal_positive(sc.high_freq_factor - sc.low_freq_factor), where,
              "scaling.high_freq_factor - low_freq_factor is ", sc.high_freq_factor - sc.low_freq_factor,
              ", expected a finite normal number > 0 (it divides the middle-band weight)");
      break;
    }
    case rope_scaling_type::longrope: {
      if (sc.attention_factor) break;
      double const s = sc.has_factor ? sc.factor
                                     : static_cast<double>(sc.max_position_embeddings) / static_cast<double>(l0);
      require(s <= 1.0 || l0 >= 2, where, "scaling.original_max_position_embeddings is ", l0,
              ", expected >= 2 (the attention factor divides by ln(original_max_position_embeddings); or give "
              "scaling.attention_factor)");
      break;
    }
    default: break;
  }
  double const a = rope_attention_factor(sc);
  require(normal_positive(a), where, "attention factor is ", a, ", expected a finite normal number > 0 (derived by ",
          to_string(sc.type), " scaling from its parameters)");
}

/// Checks derived frequencies: every theta'_k finite, normal, > 0 and below
/// 2^53 (so that position 1 still has an accepted angle).
inline void check_rope_frequencies(char const* where, rope_frequencies const& f, index_t length) {
  for (std::size_t k = 0; k < f.inv_freq.size(); ++k) {
    double const t = f.inv_freq[k];
    require(normal_positive(t) && t < rope_max_angle, where, "frequency theta'_", k, " is ", t, " at length ", length,
            ", expected a finite normal number > 0 and < 2^53 (from base and scaling)");
  }
}

}  // namespace detail

// ---------------------------------------------------------------------------
// Hugging Face style parameters

/// One value of a Hugging Face style parameter map: a number, a bool, a
/// string or a list of numbers (no JSON dependency).
class hf_value {
 public:
  enum class kind { number, boolean, string, list };

  hf_value(double v) : kind_(kind::number), number_(v) {}  // NOLINT: implicit on purpose
  template <class I, std::enable_if_t<std::is_integral_v<I> && !std::is_same_v<I, bool>, int> = 0>
  hf_value(I v) : kind_(kind::number), number_(static_cast<double>(v)) {}  // NOLINT
  hf_value(bool v) : kind_(kind::boolean), boolean_(v) {}                   // NOLINT
  hf_value(char const* s) : kind_(kind::string), string_(s) {}              // NOLINT
  hf_value(std::string s) : kind_(kind::string), string_(std::move(s)) {}  // NOLINT
  hf_value(std::vector<double> v) : kind_(kind::list), list_(std::move(v)) {}  // NOLINT
  hf_value(std::initializer_list<double> v) : kind_(kind::list), list_(v) {}   // NOLINT

  kind type() const noexcept { return kind_; }
  double number() const noexcept { return number_; }
  bool boolean() const noexcept { return boolean_; }
  std::string const& string() const noexcept { return string_; }
  std::vector<double> const& list() const noexcept { return list_; }

 private:
  kind kind_;
  double number_ = 0.0;
  bool boolean_ = false;
  std::string string_;
  std::vector<double> list_;
};

/// A Hugging Face style RoPE parameter map: the `rope_scaling` /
/// `rope_parameters` entries plus the few top-level config keys RoPE reads.
/// Accepted keys: rope_type (or legacy type), rope_theta, partial_rotary_factor,
/// factor, max_position_embeddings, original_max_position_embeddings,
/// beta_fast, beta_slow, truncate, attention_factor, mscale, mscale_all_dim,
/// low_freq_factor, high_freq_factor, short_factor, long_factor.
using hf_rope_params = std::map<std::string, hf_value>;

/// Everything a rope is built from besides its layout and head_dim.
struct rope_options {
  /// Rotated leading components of each head (even, >= 2); unset means head_dim.
  std::optional<index_t> rotary_dim;
  /// theta (HF rope_theta).
  double base = 10000.0;
  rope_scaling scaling = rope_scaling::none();
  /// Threads of one rotate call (0 = OpenMP default). 1 by default: the
  /// attention kernels that call rotate already run in parallel.
  int threads = 1;
};

namespace detail {

inline char const* hf_kind_name(hf_value::kind k) noexcept {
  switch (k) {
    case hf_value::kind::number: return "a number";
    case hf_value::kind::boolean: return "a bool";
    case hf_value::kind::string: return "a string";
    case hf_value::kind::list: return "a list";
  }
  return "?";
}

class hf_reader {
 public:
  hf_reader(char const* where, hf_rope_params const& p) : where_(where), p_(p) {}

  bool has(char const* key) const { return p_.count(key) != 0; }
  hf_value const& get(char const* key, hf_value::kind k, char const* expected) const {
    auto it = p_.find(key);
    require(it != p_.end(), where_, key, " is missing, expected ", expected);
    require(it->second.type() == k, where_, key, " is ", hf_kind_name(it->second.type()), ", expected ", expected);
    return it->second;
  }
  double positive(char const* key) const {
    double v = get(key, hf_value::kind::number, "a finite normal number > 0").number();
    require(normal_positive(v), where_, key, " is ", v, ", expected a finite normal number > 0");
    return v;
  }
  double finite(char const* key) const {
    double v = get(key, hf_value::kind::number, "a finite number").number();
    require(std::isfinite(v), where_, key, " is ", v, ", expected a finite number");
    return v;
  }
  index_t length(char const* key) const {
    double v = get(key, hf_value::kind::number, "a positive integer").number();
    require(std::isfinite(v) && v >= 1.0 && v == std::floor(v) && v < 9.0e15, where_, key, " is ", v,
            ", expected a positive integer");
    return static_cast<index_t>(v);
  }
  std::vector<double> list(char const* key) const {
    return get(key, hf_value::kind::list, "a list of numbers").list();
  }
  bool boolean(char const* key) const { return get(key, hf_value::kind::boolean, "true or false").boolean(); }
  std::string const& string(char const* key) const { return get(key, hf_value::kind::string, "a string").string(); }

 private:
  char const* where_;
  hf_rope_params const& p_;
};

}  // namespace detail

/// Translates Hugging Face style parameters into rope_options, applying HF's
/// defaults where HF has them (docs/formulas.md 3.5, HF v5 precedence):
/// - no rope_type / type: no scaling (an error if scaling keys are given);
/// - rope_theta defaults to 10000; partial_rotary_factor f gives rotary_dim = int(head_dim * f);
/// - dynamic: factor and max_position_embeddings required;
/// - yarn: original_max_position_embeddings defaults to max_position_embeddings;
///   factor defaults to max_position_embeddings / original_max_position_embeddings;
///   beta_fast 32, beta_slow 1, truncate true;
/// - llama3: factor, low_freq_factor, high_freq_factor, original_max_position_embeddings required;
/// - longrope: short_factor, long_factor required; original_max_position_embeddings
///   defaults to max_position_embeddings; factor defaults to M / L0.
/// A missing or invalid key, or an unknown one, throws posenc::error naming it.
inline rope_options rope_options_from_hf(hf_rope_params const& p, index_t head_dim) {
  char const* const where = "posenc::rope_options_from_hf";
  static char const* const known[] = {"rope_type", "type", "rope_theta", "partial_rotary_factor", "factor",
                                      "max_position_embeddings", "original_max_position_embeddings", "beta_fast",
                                      "beta_slow", "truncate", "attention_factor", "mscale", "mscale_all_dim",
                                      "low_freq_factor", "high_freq_factor", "short_factor", "long_factor"};
  for (auto const& kv : p) {
    bool ok = false;
    for (char const* k : known) ok = ok || kv.first == k;
    detail::require(ok, where, kv.first,
            " is not a known key, expected one of rope_type, type, rope_theta, partial_rotary_factor, factor, "
            "max_position_embeddings, original_max_position_embeddings, beta_fast, beta_slow, truncate, "
            "attention_factor, mscale, mscale_all_dim, low_freq_factor, high_freq_factor, short_factor, long_factor");
  }
  // A known key holds one kind of value whichever rope_type reads it: a wrong
  // kind is an error even for a key the chosen rule ignores.
  for (auto const& kv : p) {
    std::string const& k = kv.first;
    hf_value::kind want = hf_value::kind::number;
    char const* expected = "a number";
    if (k == "rope_type" || k == "type") {
      want = hf_value::kind::string;
      expected = "a string";
    } else if (k == "truncate") {
      want = hf_value::kind::boolean;
      expected = "true or false";
    } else if (k == "short_factor" || k == "long_factor") {
      want = hf_value::kind::list;
      expected = "a list of numbers";
    }
    detail::require(kv.second.type() == want, where, k, " is ", detail::hf_kind_name(kv.second.type()), ", expected ",
                    expected);
  }
  detail::hf_reader in(where, p);
  rope_options o;
  detail::require(head_dim > 0, where, "head_dim is ", head_dim, ", expected > 0");
  if (in.has("rope_theta")) o.base = in.finite("rope_theta");
  o.rotary_dim = head_dim;
  if (in.has("partial_rotary_factor")) {
    double f = in.positive("partial_rotary_factor");
    detail::require(f <= 1.0, where, "partial_rotary_factor is ", f, ", expected a number in (0, 1]");
    o.rotary_dim = static_cast<index_t>(static_cast<double>(head_dim) * f);
  }

  std::string type = "default";
  if (in.has("rope_type")) {
    type = in.string("rope_type");
  } else if (in.has("type")) {
    type = in.string("type");
  } else {
    for (char const* k : {"factor", "original_max_position_embeddings", "short_factor", "long_factor",
                          "low_freq_factor", "high_freq_factor", "beta_fast", "beta_slow", "attention_factor"})
      detail::require(!in.has(k), where, "rope_type is missing, expected one of default, linear, dynamic, yarn, llama3, "
              "longrope (", k, " is given)");
  }

  rope_scaling& s = o.scaling;
  if (type == "default") {
    s = rope_scaling::none();
  } else if (type == "linear") {
    s = rope_scaling::linear(in.positive("factor"));
  } else if (type == "dynamic") {
    s = rope_scaling::dynamic_ntk(in.positive("factor"), in.length("max_position_embeddings"));
  } else if (type == "yarn") {
    index_t const l0 = in.has("original_max_position_embeddings") ? in.length("original_max_position_embeddings")
                                                                   : in.length("max_position_embeddings");
    double factor = 0.0;
    if (in.has("factor")) {
      factor = in.positive("factor");
    } else {
      detail::require(in.has("max_position_embeddings"), where,
              "factor is missing, expected a number > 0 (or max_position_embeddings to use "
              "max_position_embeddings / original_max_position_embeddings)");
      factor = static_cast<double>(in.length("max_position_embeddings")) / static_cast<double>(l0);
    }
    s = rope_scaling::yarn(factor, l0);
    if (in.has("beta_fast")) s.beta_fast = in.positive("beta_fast");
    if (in.has("beta_slow")) s.beta_slow = in.positive("beta_slow");
    if (in.has("truncate")) s.truncate = in.boolean("truncate");
    if (in.has("attention_factor")) s.attention_factor = in.positive("attention_factor");
    if (in.has("mscale")) s.mscale = in.finite("mscale");
    if (in.has("mscale_all_dim")) s.mscale_all_dim = in.finite("mscale_all_dim");
  } else if (type == "llama3") {
    s = rope_scaling::llama3(in.positive("factor"), in.positive("low_freq_factor"), in.positive("high_freq_factor"),
                             in.length("original_max_position_embeddings"));
  } else if (type == "longrope") {
    auto sf = in.list("short_factor");
    auto lf = in.list("long_factor");
    index_t const l0 = in.has("original_max_position_embeddings") ? in.length("original_max_position_embeddings")
                                                                   : in.length("max_position_embeddings");
    index_t const m = in.has("max_position_embeddings") ? in.length("max_position_embeddings") : 0;
    s = rope_scaling::longrope(std::move(sf), std::move(lf), l0, m);
    if (in.has("factor")) {
      s.with_factor(in.positive("factor"));
    } else {
      detail::require(m > 0, where, "max_position_embeddings is missing, expected a positive integer (longrope without a "
              "factor uses max_position_embeddings / original_max_position_embeddings)");
    }
    if (in.has("attention_factor")) s.attention_factor = in.positive("attention_factor");
  } else {
    detail::fail(where, in.has("rope_type") ? "rope_type" : "type", " is \"", type,
         "\", expected one of default, linear, dynamic, yarn, llama3, longrope");
  }
  return o;
}

}  // namespace posenc
