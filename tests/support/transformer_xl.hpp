// SPDX-License-Identifier: MIT
// Seeded Transformer-XL encoders and BSHD buffers for the tests of tests/paths and tests/properties.
#pragma once

#include <posenc/attention/attention.hpp>
#include <posenc/encoding/transformer_xl.hpp>

#include <cstdint>
#include <vector>

#include "support/random.hpp"

namespace posenc_test {

/// A (rows, cols) table of seeded uniform values in [lo, hi).
template <class T>
posenc::relative_table<T> random_table(posenc::index_t rows, posenc::index_t cols, std::uint64_t seed,
                                       double lo = -0.5, double hi = 0.5) {
  auto const v = random_vector<double>(static_cast<std::size_t>(rows * cols), seed, lo, hi);
  posenc::relative_table<T> t(rows, cols);
  for (posenc::index_t r = 0; r < rows; ++r)
    for (posenc::index_t c = 0; c < cols; ++c) t(r, c) = static_cast<T>(v[static_cast<std::size_t>(r * cols + c)]);
  return t;
}

/// transformer_xl<T> with seeded u, v (heads, head_dim) and W_R (heads x head_dim, pos_dim).
template <class T>
posenc::transformer_xl<T> random_transformer_xl(posenc::index_t heads, posenc::index_t head_dim,
                                                posenc::index_t pos_dim, posenc::index_t limit, std::uint64_t seed,
                                                posenc::index_t memory_length = 0) {
  return posenc::transformer_xl<T>(limit, random_table<T>(heads, head_dim, seed),
                                   random_table<T>(heads, head_dim, seed + 1),
                                   random_table<T>(heads * head_dim, pos_dim, seed + 2), memory_length);
}

/// Packed (batch, seq, heads, dim) q, k, v of seeded values.
template <class T>
struct txl_buffers {
  posenc::index_t B, Sq, Sk, Hq, Hkv, D;
  std::vector<T> q, k, v;
  txl_buffers(posenc::index_t b, posenc::index_t sq, posenc::index_t sk, posenc::index_t hq, posenc::index_t hkv,
              posenc::index_t d, std::uint64_t seed)
      : B(b), Sq(sq), Sk(sk), Hq(hq), Hkv(hkv), D(d) {
    q = random_vector<T>(static_cast<std::size_t>(B * Sq * Hq * D), seed, -2, 2);
    k = random_vector<T>(static_cast<std::size_t>(B * Sk * Hkv * D), seed + 1, -2, 2);
    v = random_vector<T>(static_cast<std::size_t>(B * Sk * Hkv * D), seed + 2);
  }
  posenc::view<const T> qv() const { return posenc::make_bshd(q.data(), B, Sq, Hq, D); }
  posenc::view<const T> kv() const { return posenc::make_bshd(k.data(), B, Sk, Hkv, D); }
  posenc::view<const T> vv() const { return posenc::make_bshd(v.data(), B, Sk, Hkv, D); }

  /// Runs Path; returns out (batch, Sq, Hq, D) followed by lse (batch, Hq, Sq).
  template <class Path, class E>
  std::vector<T> run(E const& enc, posenc::attention_options<T> opt) const {
    std::vector<T> out(static_cast<std::size_t>(B * Sq * Hq * D), T(-7));
    std::vector<T> lse(static_cast<std::size_t>(B * Hq * Sq), T(-7));
    opt.lse = lse;
    posenc::attention<Path>(qv(), kv(), vv(), posenc::make_bshd(out.data(), B, Sq, Hq, D), enc, opt);
    out.insert(out.end(), lse.begin(), lse.end());
    return out;
  }
};

}  // namespace posenc_test
