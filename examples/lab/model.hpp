// SPDX-License-Identifier: MIT
// A small decoder-only byte language model: forward, backward, and the encodings of each layer.
//
//   tokens (batch, seq) bytes -> x = s_tok E[token] (E: (256, d); s_tok = sqrt(d) in the
//                                   sqrt_d setup, else 1; config.hpp embedding_setup)
//   each layer l:  x += s_pos PE_l (absolute encodings, at the first layer of a run using one;
//                                   s_pos = 1 except for fixed signals in the matched setup)
//                  x += Wo attention(LN1(x) Wq, LN1(x) Wk, LN1(x) Wv; encoder of layer l, causal)
//                  x += W2 gelu(LN2(x) W1 + b1) + b2
//   logits = LNf(x) E^T   (output tied to the embedding), mean cross-entropy over every position.
// Attention runs through posenc::attention and posenc::attention_backward<path::best>; the
// projections, norms and MLP are Eigen products written here.
#pragma once

#include "config.hpp"
#include "encoders.hpp"
#include "layers.hpp"
#include "params.hpp"

#include <posenc/posenc.hpp>

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

namespace lab {

/// Thrown when an encoding cannot run at a length (a learned table past its rows).
struct not_applicable : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Inputs and next-byte targets of one batch, each (batch, seq) row-major.
struct batch_tokens {
  std::vector<int> inputs, targets;
  int batch = 0, seq = 0;
};

/// The blocks of one layer in the flat parameter vector (-1: absent).
struct layer_blocks {
  int ln1_g, ln1_b, wq, wk, wv, wo, ln2_g, ln2_b, w1, b1, w2, b2;
  int absolute_table = -1, relative_a = -1, relative_b = -1;
};

/// The number of buckets and the clipping distance of the relative encodings.
inline constexpr int t5_buckets = 32, t5_max_distance = 128, relative_clip = 16;

template <class T>
class model {
 public:
  explicit model(config const& c) : cfg_(c) {
    cfg_.check();
    build_layout();
    params_.assign(layout_.size(), T(0));
    grads_.assign(layout_.size(), T(0));
    initialize();
    set_position_scales();
  }

  config const& cfg() const { return cfg_; }
  param_layout const& layout() const { return layout_; }
  param_vector<T>& params() { return params_; }
  param_vector<T> const& params() const { return params_; }
  param_vector<T>& grads() { return grads_; }

  /// Mean cross-entropy (nats per byte) and its gradient in grads() (overwritten).
  double loss_and_grad(batch_tokens const& b) {
    std::fill(grads_.begin(), grads_.end(), T(0));
    forward_state st;
    double loss = forward(b, eval_mode{}, st, true, nullptr);
    backward(b, st);
    return loss;
  }

  /// Mean cross-entropy without gradients; row_loss gets each token's loss ((batch, seq) order).
  double loss(batch_tokens const& b, eval_mode const& m = {}, std::vector<double>* row_loss = nullptr) {
    forward_state st;
    return forward(b, m, st, false, row_loss);
  }

  /// The residual stream entering layer 0 ((batch * seq, d_model) rows): the scaled token
  /// embeddings plus layer 0's absolute encoding, when it has one.
  matrix<T> input_stream(batch_tokens const& b, eval_mode const& m = {}) {
    matrix<T> x = embed_tokens(b);
    if (adds_here(0)) add_absolute(0, x, b.batch, b.seq, m);
    return x;
  }

  /// The factor the token embeddings are multiplied by: sqrt(d_model) in the sqrt_d setup, else 1.
  T token_scale() const {
    return cfg_.embedding == embedding_setup::sqrt_d ? static_cast<T>(std::sqrt(static_cast<double>(cfg_.d_model))) : T(1);
  }
  /// The factor layer l's absolute encoding is multiplied by (1 except in the matched setup).
  double position_scale(int l) const { return position_scale_[static_cast<std::size_t>(l)]; }

  /// Attention probabilities of layer l, (batch, heads, seq, seq), for pictures.
  std::vector<T> attention_map(batch_tokens const& b, int layer, eval_mode const& m = {}) {
    forward_state st;
    st.probe_layer = layer;
    forward(b, m, st, false, nullptr);
    return st.probe;
  }

 private:
  struct layer_cache {
    matrix<T> x_in, h1, q, k, v, att, x_mid, h2, u, t, g;  // t: tanh inside GELU
    norm_cache<T> n1, n2;
  };
  struct forward_state {
    std::vector<layer_cache> layers;
    matrix<T> x_final, xf, dlogits;
    norm_cache<T> nf;
    int probe_layer = -1;
    std::vector<T> probe;
  };

  // ---- layout and initialization ----------------------------------------------------------
  void build_layout() {
    auto d = cfg_.d_model, hid = cfg_.mlp * cfg_.d_model;
    embedding_ = layout_.add("embedding", 256, d);
    for (int l = 0; l < cfg_.layers; ++l) {
      auto p = "layer" + std::to_string(l) + ".";
      layer_blocks lb{layout_.add(p + "ln1.gain", 1, d), layout_.add(p + "ln1.bias", 1, d),
                      layout_.add(p + "wq", d, d),       layout_.add(p + "wk", d, d),
                      layout_.add(p + "wv", d, d),       layout_.add(p + "wo", d, d),
                      layout_.add(p + "ln2.gain", 1, d), layout_.add(p + "ln2.bias", 1, d),
                      layout_.add(p + "w1", d, hid),     layout_.add(p + "b1", 1, hid),
                      layout_.add(p + "w2", hid, d),     layout_.add(p + "b2", 1, d)};
      add_encoding_blocks(l, p, lb);
      layers_.push_back(lb);
    }
    final_gain_ = layout_.add("final.gain", 1, d);
    final_bias_ = layout_.add("final.bias", 1, d);
  }

  void add_encoding_blocks(int l, std::string const& p, layer_blocks& lb) {
    encoding e = cfg_.layer_encoding(l);
    if (e.absolute == absolute_kind::learned && adds_here(l)) lb.absolute_table = layout_.add(p + "learned", cfg_.seq, cfg_.d_model);
    auto k = 2 * relative_clip + 1;
    if (e.attention == attention_kind::t5) lb.relative_a = layout_.add(p + "t5", t5_buckets, cfg_.heads);
    if (e.attention == attention_kind::clipped) lb.relative_a = layout_.add(p + "clipped", k, cfg_.heads);
    if (e.attention == attention_kind::shaw) {
      lb.relative_a = layout_.add(p + "shaw.key", k, cfg_.head_dim());
      lb.relative_b = layout_.add(p + "shaw.value", k, cfg_.head_dim());
    }
  }

  /// Normal(0, 0.02) for the relative tables, 1/sqrt(fan_in) for projections (the residual
  /// outputs Wo, W2 also / sqrt(2 layers)), ones for gains, zeros for biases. The token
  /// embedding and a learned table follow the embedding setup: N(0, 1/sqrt(d_model)) for
  /// sqrt_d, N(0, 0.02) otherwise, truncated at two standard deviations for bert.
  void initialize() {
    normal_source rng(cfg_.seed);
    bool const sqrt_d = cfg_.embedding == embedding_setup::sqrt_d, bert = cfg_.embedding == embedding_setup::bert;
    for (auto const& b : layout_.blocks()) {
      auto w = as_matrix(params_, b);
      bool gain = b.name.find("gain") != std::string::npos, bias = b.name.find("bias") != std::string::npos ||
                                                                   b.name.find(".b") != std::string::npos;
      bool token_or_table = b.name == "embedding" || b.name.find(".learned") != std::string::npos;
      double sd = b.name.find(".w") != std::string::npos ? 1.0 / std::sqrt(static_cast<double>(b.rows)) : 0.02;
      if (b.name.find(".wo") != std::string::npos || b.name.find(".w2") != std::string::npos)
        sd /= std::sqrt(2.0 * cfg_.layers);
      if (token_or_table && sqrt_d) sd = 1.0 / std::sqrt(static_cast<double>(cfg_.d_model));
      bool const truncate = token_or_table && bert;
      for (Eigen::Index i = 0; i < w.size(); ++i) {
        double z = gain || bias ? 0.0 : rng();
        while (truncate && std::abs(z) > 2.0) z = rng();
        w.data()[i] = gain ? T(1) : bias ? T(0) : static_cast<T>(sd * z);
      }
    }
  }

  /// In the matched setup, each fixed position signal gets the factor that makes its mean row
  /// norm over positions 0 .. seq - 1 equal 0.02 sqrt(d_model), the root-mean-square norm of a
  /// token embedding at initialization. Learned tables, zero vectors and the other setups: 1.
  void set_position_scales() {
    position_scale_.assign(static_cast<std::size_t>(cfg_.layers), 1.0);
    if (cfg_.embedding != embedding_setup::matched) return;
    int const S = cfg_.seq, d = cfg_.d_model;
    for (int l = 0; l < cfg_.layers; ++l) {
      if (!adds_here(l) || cfg_.layer_encoding(l).absolute == absolute_kind::learned) continue;
      matrix<T> p = matrix<T>::Zero(S, d);
      with_absolute(l, S, eval_mode{}, [&](auto const& enc) { enc.add_to(posenc::make_bsd(p.data(), 1, S, d), posenc::position_span(0)); });
      double mean_norm = 0;
      for (int s = 0; s < S; ++s) mean_norm += static_cast<double>(p.row(s).norm()) / S;
      if (mean_norm > 0) position_scale_[static_cast<std::size_t>(l)] = 0.02 * std::sqrt(static_cast<double>(d)) / mean_norm;
    }
  }

  /// True when layer l starts a run of layers with its absolute encoding.
  bool adds_here(int l) const {
    auto a = cfg_.layer_encoding(l).absolute;
    return a != absolute_kind::none && (l == 0 || cfg_.layer_encoding(l - 1).absolute != a);
  }

  matrix_map<T> w(int id) { return as_matrix(params_, layout_[id]); }
  matrix_map<T> dw(int id) { return as_matrix(grads_, layout_[id]); }
  row_map<T> r(int id) { return as_row(params_, layout_[id]); }
  row_map<T> dr(int id) { return as_row(grads_, layout_[id]); }

  // ---- the encoders of a layer ----------------------------------------------------------------
  /// Calls f(encoder) with layer l's absolute encoder at sequence length s.
  template <class F>
  void with_absolute(int l, int s, eval_mode const& m, F&& f) {
    auto d = cfg_.d_model;
    switch (cfg_.layer_encoding(l).absolute) {
      case absolute_kind::sinusoidal: return f(posenc::sinusoidal<T>(d));
      case absolute_kind::integer: return f(integer_position<T>(d));
      case absolute_kind::zero: return f(zero_position<T>(d));
      case absolute_kind::noise: return f(noise_position<T>(16 * cfg_.seq, d, cfg_.seed + 1000 + l));
      case absolute_kind::learned: {
        auto const& b = layout_[layers_[static_cast<std::size_t>(l)].absolute_table];
        auto table = posenc::learned<T>::view_of(posenc::span<const T>(params_.data() + b.offset, static_cast<posenc::index_t>(b.size())), b.rows, d);
        if (s <= b.rows) return f(table);
        if (!m.extend_learned) throw not_applicable("learned table of " + std::to_string(b.rows) + " rows at length " + std::to_string(s));
        return f(table.extended(s));
      }
      case absolute_kind::none: return;
    }
  }

  /// x += position_scale(l) * (layer l's absolute encoding at positions 0 .. S - 1).
  void add_absolute(int l, matrix<T>& x, int B, int S, eval_mode const& m) {
    double const scale = position_scale(l);
    with_absolute(l, S, m, [&](auto const& enc) {
      if (scale == 1.0) return enc.add_to(posenc::make_bsd(x.data(), B, S, cfg_.d_model), posenc::position_span(0));
      matrix<T> p = matrix<T>::Zero(B * S, cfg_.d_model);
      enc.add_to(posenc::make_bsd(p.data(), B, S, cfg_.d_model), posenc::position_span(0));
      x += static_cast<T>(scale) * p;
    });
  }

  /// token_scale() * E[token] for every token of the batch, (batch * seq, d_model).
  matrix<T> embed_tokens(batch_tokens const& bt) {
    matrix<T> x(bt.batch * bt.seq, cfg_.d_model);
    T const s = token_scale();
    for (int i = 0; i < bt.batch * bt.seq; ++i) x.row(i) = s * w(embedding_).row(bt.inputs[static_cast<std::size_t>(i)]);
    return x;
  }

  posenc::rope<T> make_rope(int s, eval_mode const& m) const {
    posenc::rope_options o;
    double factor = static_cast<double>(s) / cfg_.seq;
    if (factor > 1 && m.rope == rope_eval::linear) o.scaling = posenc::rope_scaling::linear(factor);
    if (factor > 1 && m.rope == rope_eval::dynamic_ntk) o.scaling = posenc::rope_scaling::dynamic_ntk(factor, cfg_.seq);
    if (factor > 1 && m.rope == rope_eval::yarn) o.scaling = posenc::rope_scaling::yarn(factor, cfg_.seq);
    return posenc::rope<T>(posenc::rope_layout::half_split, cfg_.head_dim(), o);
  }

  /// Calls f(encoder) with layer l's attention encoder at sequence length s.
  template <class F>
  void with_attention(int l, int s, eval_mode const& m, F&& f) {
    auto const& lb = layers_[static_cast<std::size_t>(l)];
    using table = typename posenc::t5_bias<T>::table_type;
    switch (cfg_.layer_encoding(l).attention) {
      case attention_kind::none: return f(posenc::none{});
      case attention_kind::rope: return f(make_rope(s, m));
      case attention_kind::alibi: return f(posenc::alibi<T>(posenc::alibi_form::paper, cfg_.heads));
      case attention_kind::rope_alibi:
        return f(posenc::compose<posenc::rope<T>, posenc::alibi<T>>(make_rope(s, m), posenc::alibi<T>(posenc::alibi_form::paper, cfg_.heads)));
      case attention_kind::t5: {
        posenc::t5_bias_params p{cfg_.heads, false, t5_buckets, t5_max_distance};
        return f(posenc::t5_bias<T>(p, table(w(lb.relative_a))));
      }
      case attention_kind::clipped: return f(posenc::clipped_bias<T>(relative_clip, cfg_.heads, table(w(lb.relative_a))));
      case attention_kind::shaw: return f(posenc::shaw<T>(relative_clip, table(w(lb.relative_a)), table(w(lb.relative_b))));
    }
  }

  /// Adds an encoder's parameter gradients into grads().
  template <class G>
  void collect(int l, G const& g) {
    auto const& lb = layers_[static_cast<std::size_t>(l)];
    if constexpr (std::is_same_v<G, typename posenc::t5_bias<T>::gradients> ||
                  std::is_same_v<G, typename posenc::clipped_bias<T>::gradients>) {
      dw(lb.relative_a) += g.table;
    } else if constexpr (std::is_same_v<G, typename posenc::shaw<T>::gradients>) {
      dw(lb.relative_a) += g.key;
      dw(lb.relative_b) += g.value;
    } else if constexpr (std::is_same_v<G, typename posenc::learned<T>::gradients>) {
      dw(lb.absolute_table) += g.table;  // (seq, d_model), the table's shape
    }
  }

  // ---- forward ------------------------------------------------------------------------------
  posenc::attention_options<T> attention_opts() const {
    posenc::attention_options<T> o;
    o.causal = true;
    o.threads = cfg_.threads;
    return o;
  }

  posenc::view<const T> heads_view(matrix<T> const& x, int b, int s) const {
    return posenc::make_bshd(x.data(), b, s, cfg_.heads, cfg_.head_dim());
  }
  posenc::view<T> heads_view(matrix<T>& x, int b, int s) const {
    return posenc::make_bshd(x.data(), b, s, cfg_.heads, cfg_.head_dim());
  }

  double forward(batch_tokens const& bt, eval_mode const& m, forward_state& st, bool keep, std::vector<double>* row_loss) {
    int const B = bt.batch, S = bt.seq;
    matrix<T> x = embed_tokens(bt);
    st.layers.resize(static_cast<std::size_t>(cfg_.layers));
    for (int l = 0; l < cfg_.layers; ++l) x = layer_forward(l, x, B, S, m, st.layers[static_cast<std::size_t>(l)], st);
    st.xf = layer_norm<T>(x, r(final_gain_), r(final_bias_), st.nf);
    matrix<T> logits = st.xf * w(embedding_).transpose();
    if (!keep) st.layers.clear();
    return cross_entropy<T>(logits, bt.targets, keep ? &st.dlogits : nullptr, row_loss);
  }

  matrix<T> layer_forward(int l, matrix<T> x, int B, int S, eval_mode const& m, layer_cache& c, forward_state& st);

  // ---- backward -----------------------------------------------------------------------------
  void backward(batch_tokens const& bt, forward_state& st) {
    int const B = bt.batch, S = bt.seq;
    dw(embedding_) += st.dlogits.transpose() * st.xf;
    matrix<T> dxf = st.dlogits * w(embedding_);
    matrix<T> dx = layer_norm_backward<T>(dxf, r(final_gain_), st.nf, dr(final_gain_), dr(final_bias_));
    for (int l = cfg_.layers - 1; l >= 0; --l) dx = layer_backward(l, dx, B, S, st.layers[static_cast<std::size_t>(l)]);
    T const s = token_scale();
    for (int i = 0; i < B * S; ++i) dw(embedding_).row(bt.inputs[static_cast<std::size_t>(i)]) += s * dx.row(i);
  }

  matrix<T> layer_backward(int l, matrix<T> dx, int B, int S, layer_cache& c);

  config cfg_;
  param_layout layout_;
  param_vector<T> params_, grads_;  // 64-byte aligned: SIMD loop peeling, hence rounding, is the same for every model
  std::vector<layer_blocks> layers_;
  std::vector<double> position_scale_;  // per layer, set_position_scales()
  int embedding_ = -1, final_gain_ = -1, final_bias_ = -1;
};

// A layer's attention forward and backward: out of the class, so that the two
// explicit instantiations below are the only places that compile them.

template <class T>
matrix<T> model<T>::layer_forward(int l, matrix<T> x, int B, int S, eval_mode const& m, layer_cache& c,
                                 forward_state& st) {
  auto const& lb = layers_[static_cast<std::size_t>(l)];
  if (adds_here(l)) add_absolute(l, x, B, S, m);
  c.x_in = x;
  c.h1 = layer_norm<T>(x, r(lb.ln1_g), r(lb.ln1_b), c.n1);
  c.q = c.h1 * w(lb.wq);
  c.k = c.h1 * w(lb.wk);
  c.v = c.h1 * w(lb.wv);
  c.att.resize(B * S, cfg_.d_model);
  auto opt = attention_opts();
  if (l == st.probe_layer) {
    st.probe.assign(static_cast<std::size_t>(B) * cfg_.heads * S * S, T(0));
    opt.scores = st.probe;
  }
  with_attention(l, S, m, [&](auto const& enc) {
    if (opt.scores)
      posenc::attention<posenc::path::reference>(heads_view(c.q, B, S), heads_view(c.k, B, S), heads_view(c.v, B, S), heads_view(c.att, B, S), enc, opt);
    else
      posenc::attention(heads_view(c.q, B, S), heads_view(c.k, B, S), heads_view(c.v, B, S), heads_view(c.att, B, S), enc, opt);
  });
  x += c.att * w(lb.wo);
  c.x_mid = x;
  c.h2 = layer_norm<T>(x, r(lb.ln2_g), r(lb.ln2_b), c.n2);
  c.u = (c.h2 * w(lb.w1)).rowwise() + r(lb.b1);
  c.g = gelu(c.u, c.t);
  x += (c.g * w(lb.w2)).rowwise() + r(lb.b2);
  return x;
}

template <class T>
matrix<T> model<T>::layer_backward(int l, matrix<T> dx, int B, int S, layer_cache& c) {
  auto const& lb = layers_[static_cast<std::size_t>(l)];
  // MLP: x_out = x_mid + W2 gelu(u) + b2
  dr(lb.b2) += dx.colwise().sum();
  dw(lb.w2) += c.g.transpose() * dx;
  matrix<T> du = gelu_backward<T>(dx * w(lb.w2).transpose(), c.u, c.t);
  dr(lb.b1) += du.colwise().sum();
  dw(lb.w1) += c.h2.transpose() * du;
  dx += layer_norm_backward<T>(du * w(lb.w1).transpose(), r(lb.ln2_g), c.n2, dr(lb.ln2_g), dr(lb.ln2_b));
  // attention: x_mid = x_in + att Wo
  dw(lb.wo) += c.att.transpose() * dx;
  matrix<T> datt = dx * w(lb.wo).transpose();
  matrix<T> dq = matrix<T>::Zero(B * S, cfg_.d_model), dk = dq, dv = dq;
  with_attention(l, S, eval_mode{}, [&](auto const& enc) {
    auto g = posenc::make_gradients(enc);
    posenc::attention_backward<posenc::path::best>(heads_view(c.q, B, S), heads_view(c.k, B, S), heads_view(c.v, B, S),
                                                   heads_view(c.att, B, S), heads_view(datt, B, S), heads_view(dq, B, S),
                                                   heads_view(dk, B, S), heads_view(dv, B, S), enc, attention_opts(), g);
    collect(l, g);
  });
  dw(lb.wq) += c.h1.transpose() * dq;
  dw(lb.wk) += c.h1.transpose() * dk;
  dw(lb.wv) += c.h1.transpose() * dv;
  matrix<T> dh1 = dq * w(lb.wq).transpose() + dk * w(lb.wk).transpose() + dv * w(lb.wv).transpose();
  dx += layer_norm_backward<T>(dh1, r(lb.ln1_g), c.n1, dr(lb.ln1_g), dr(lb.ln1_b));
  if (adds_here(l))
    with_absolute(l, S, eval_mode{}, [&](auto const& enc) {
      auto g = posenc::make_gradients(enc);
      enc.add_to_backward(posenc::make_bsd(static_cast<T const*>(dx.data()), B, S, cfg_.d_model), posenc::position_span(0), g);
      collect(l, g);
    });
  return dx;
}

// model<float> and model<double> are compiled once, in model.cpp (the posenc_lab_model
// library that the lab and its tests link): each attention call above instantiates the
// attention kernels for every encoding, the longest compile of the lab.
extern template class model<float>;
extern template class model<double>;

}  // namespace lab
