// SPDX-License-Identifier: MIT
// Fuzzes rope's Hugging Face map constructor, then checks rotations are finite and scale norms by the attention factor.
#include <posenc/core/error.hpp>
#include <posenc/encoding/rope.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <string>
#include <vector>

#include "fuzz/fuzz_input.hpp"

namespace {

using posenc::index_t;
using posenc_fuzz::finding;
using posenc_fuzz::fuzz_input;

char const* const keys[] = {"rope_type", "type", "rope_theta", "partial_rotary_factor", "factor",
                            "max_position_embeddings", "original_max_position_embeddings", "beta_fast",
                            "beta_slow", "truncate", "attention_factor", "mscale", "mscale_all_dim",
                            "low_freq_factor", "high_freq_factor", "short_factor", "long_factor",
                            "rope_scaling", ""};
char const* const types[] = {"default", "linear", "dynamic", "yarn", "llama3", "longrope", "", "YaRN", "su"};

/// A value of the kind the key expects most of the time, of another kind sometimes.
posenc::hf_value value_for(fuzz_input& in, std::string const& key, index_t head_dim) {
  int kind = static_cast<int>(in.below(8));
  if (kind >= 4) {  // the key's own kind
    if (key == "rope_type" || key == "type")
      kind = 2;
    else if (key == "truncate")
      kind = 1;
    else if (key == "short_factor" || key == "long_factor")
      kind = 3;
    else
      kind = 0;
  }
  switch (kind) {
    case 1: return in.coin();
    case 2: return std::string(types[in.below(sizeof types / sizeof types[0])]);
    case 3: {
      // Mostly the length longrope wants (rotary_dim / 2), sometimes another one.
      std::size_t n = static_cast<std::size_t>(std::max<index_t>(head_dim, 0) / 2);
      if (in.below(4) == 0) n = in.below(24);
      std::vector<double> xs(n);
      double const common = in.coin() ? 1.0 : in.number();
      for (auto& x : xs) x = in.below(4) == 0 ? in.number() : common;
      return xs;
    }
    default: return in.number();
  }
}

/// Rotates `tokens` tokens of `heads` heads at positions first.. and checks the result.
template <class T>
void check_rotation(fuzz_input& in, posenc::rope<T> const& r) {
  index_t const heads = 1 + in.below(3), tokens = 1 + in.below(4), D = r.head_dim();
  index_t const limit = r.max_positions();
  index_t first = 0;
  switch (in.below(4)) {
    case 0: first = 0; break;
    case 1: first = in.range(0, 5000); break;
    case 2: first = limit - tokens - in.range(0, 3); break;
    default: first = limit > 0 ? static_cast<index_t>(in.word() % static_cast<std::uint64_t>(limit)) : 0; break;
  }
  index_t length = first + tokens;
  if (in.below(4) == 0) length += in.range(0, 100000);
  std::vector<T> x(static_cast<std::size_t>(tokens * heads * D)), before;
  std::uint64_t s = in.word() | 1;
  for (auto& v : x) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;  // xorshift: values in [-1, 1)
    v = static_cast<T>(static_cast<double>(s >> 11) / 4503599627370496.0 - 1.0);
  }
  before = x;
  auto view = posenc::make_bshd(x.data(), 1, tokens, heads, D);
  double a = 0;
  try {
    a = r.frequencies(length).attention_factor;
    r.rotate(view, posenc::position_span(first), length);
  } catch (posenc::error const&) {
    for (std::size_t i = 0; i < x.size(); ++i)
      if (!(x[i] == before[i])) finding("rope::rotate threw posenc::error after writing its input");
    return;
  }
  // Each head: the rotated part's norm is a times the input's, the rest passes through unchanged.
  double const tol = std::is_same_v<T, float> ? 1e-5 : 1e-12;
  index_t const R = r.rotary_dim();
  for (index_t t = 0; t < tokens; ++t)
    for (index_t h = 0; h < heads; ++h) {
      T const* y = view.ptr(0, t, h);
      T const* x0 = before.data() + (t * heads + h) * D;
      double n0 = 0, n1 = 0;
      for (index_t d = 0; d < D; ++d) {
        if (!std::isfinite(static_cast<double>(y[d]))) finding("rope::rotate gave a non-finite value");
        if (d < R) {
          n0 += static_cast<double>(x0[d]) * x0[d];
          n1 += static_cast<double>(y[d]) * y[d];
        } else if (!(y[d] == x0[d])) {
          finding("rope::rotate changed a component past rotary_dim");
        }
      }
      double const want = a * std::sqrt(n0), got = std::sqrt(n1);
      if (!(std::abs(got - want) <= tol * want + 1e-30)) finding("rope::rotate changed the norm beyond a * |x|");
    }
}

template <class T>
void run(fuzz_input& in, posenc::rope_layout layout, index_t head_dim, posenc::hf_rope_params const& p) {
  try {
    posenc::rope<T> r(layout, head_dim, p);
    if (in.below(4) == 0) r.reserve(std::min<index_t>(in.range(0, 96), r.max_positions()));
    for (int i = 0; i < 3; ++i) check_rotation(in, r);
  } catch (posenc::error const&) {
    // A configuration the library rejects: fine.
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(std::uint8_t const* data, std::size_t size) {
  fuzz_input in(data, size);
  auto const layout = static_cast<posenc::rope_layout>(in.below(8) == 0 ? 2 : in.below(2));
  index_t const head_dim = in.below(16) == 0 ? in.range(-2, 0) : in.range(1, 40);
  bool const is_double = in.coin();
  posenc::hf_rope_params p;
  // rope_type first, usually a known rule, then up to 8 keys of any kind.
  if (in.below(8) != 0) p.insert_or_assign("rope_type", value_for(in, "rope_type", head_dim));
  index_t const n = in.below(9);
  for (index_t i = 0; i < n; ++i) {
    std::string const key = keys[in.below(sizeof keys / sizeof keys[0])];
    p.insert_or_assign(key, value_for(in, key, head_dim));
  }
  if (is_double)
    run<double>(in, layout, head_dim, p);
  else
    run<float>(in, layout, head_dim, p);
  return 0;
}
