// SPDX-License-Identifier: MIT
// One small attention problem run forward (outputs) or forward and backward (encoder
// gradients) with a given encoder: for comparing encoders that hold the same values.
#pragma once

#include <cstdint>
#include <vector>

#include <posenc/attention/attention.hpp>
#include <posenc/attention/backward.hpp>

#include "support/random.hpp"

namespace posenc_test {

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
