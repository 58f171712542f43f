// SPDX-License-Identifier: MIT
// Comparing encoders that hold the same values: random tables, their bias rows element by
// element, and one small attention problem run forward (outputs) or forward and backward
// (encoder gradients).
#pragma once

#include <cstdint>
#include <vector>

#include <posenc/attention/attention.hpp>
#include <posenc/attention/backward.hpp>
#include <posenc/encoding/bias_kernels.hpp>

#include "support/random.hpp"

namespace posenc_test {

/// A row-major (rows, cols) buffer of T holding random values in [-1, 1) (rounded once to T).
template <class T>
std::vector<T> random_buffer(posenc::index_t rows, posenc::index_t cols, std::uint64_t seed) {
  auto const v = random_vector<float>(static_cast<std::size_t>(rows * cols), seed);
  std::vector<T> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = static_cast<T>(v[i]);
  return out;
}

/// The buffer b as a row-major (rows, cols) table, for the encoders' constructors.
template <class T>
Eigen::Map<const posenc::relative_table<T>> as_table(std::vector<T> const& b, posenc::index_t rows,
                                                     posenc::index_t cols) {
  return Eigen::Map<const posenc::relative_table<T>>(b.data(), rows, cols);
}

/// Bias rows of encoders a and b over many (head, q_pos, k_pos_first, count), windows and tiles
/// straddling them included, each added to the same random row (drawn from `seed` + count):
/// the number of elements whose values differ.
template <class A, class B>
std::size_t bias_row_mismatches(A const& a, B const& b, posenc::index_t heads, std::uint64_t seed = 0) {
  std::size_t bad = 0;
  for (posenc::index_t h = 0; h < heads; ++h)
    for (posenc::index_t q : {0, 5, 40, 300})
      for (posenc::index_t k0 : {0, 3, 37, 290})
        for (posenc::index_t n : {1, 7, 16, 33, 200}) {
          auto x = random_vector<float>(static_cast<std::size_t>(n), seed + static_cast<std::uint64_t>(n));
          auto y = x;
          a.bias_row(h, q, k0, n, x.data());
          b.bias_row(h, q, k0, n, y.data());
          for (std::size_t j = 0; j < x.size(); ++j) bad += x[j] != y[j] ? 1 : 0;
        }
  return bad;
}

/// Sizes of the problem: batch 2, 19 queries and keys (causal), `heads` heads of `head_dim`.
struct encoder_run_shape {
  posenc::index_t heads = 2, head_dim = 8;
  posenc::index_t batch = 2, seq = 19;
  std::size_t size() const { return static_cast<std::size_t>(batch * seq * heads * head_dim); }
};

/// The output of posenc::attention<P> with `enc` on fixed random float q, k, v
/// (causal, one thread).
template <class P, class E>
std::vector<float> attention_output(E const& enc, encoder_run_shape const& s) {
  std::size_t const n = s.size();
  std::vector<float> q = random_vector<float>(n, 1), k = random_vector<float>(n, 2), v = random_vector<float>(n, 3);
  std::vector<float> out(n);
  auto at = [&](std::vector<float>& x) { return posenc::make_bshd(x.data(), s.batch, s.seq, s.heads, s.head_dim); };
  posenc::attention_options<float> opt;
  opt.causal = true;
  opt.threads = 1;
  posenc::attention<P>(at(q), at(k), at(v), at(out), enc, opt);
  return out;
}

/// The encoder's parameter gradients of posenc::attention_backward<P> with
/// `enc` on the problem of attention_output and a fixed random dout.
template <class P, class E>
posenc::encoder_gradients_t<E> attention_encoder_gradients(E const& enc, encoder_run_shape const& s) {
  std::size_t const n = s.size();
  std::vector<float> q = random_vector<float>(n, 1), k = random_vector<float>(n, 2), v = random_vector<float>(n, 3);
  std::vector<float> dout = random_vector<float>(n, 4), out(n), dq(n), dk(n), dv(n);
  std::vector<float> lse(static_cast<std::size_t>(s.batch * s.heads * s.seq));
  auto at = [&](std::vector<float>& x) { return posenc::make_bshd(x.data(), s.batch, s.seq, s.heads, s.head_dim); };
  posenc::attention_options<float> opt;
  opt.causal = true;
  opt.threads = 1;
  opt.lse = lse;
  posenc::attention<P>(at(q), at(k), at(v), at(out), enc, opt);
  auto g = posenc::make_gradients(enc);
  posenc::attention_backward<P>(at(q), at(k), at(v), at(out), at(dout), at(dq), at(dk), at(dv), enc, opt, g);
  return g;
}

}  // namespace posenc_test
