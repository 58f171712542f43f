// SPDX-License-Identifier: MIT
// multi_head_attention<Encoder, T>: projections (Eigen), the encoder wherever it acts, prefill and cached decode.
#pragma once

#include <algorithm>
#include <array>
#include <type_traits>
#include <utility>
#include <vector>

#include "posenc/attention/attention.hpp"
#include "posenc/attention/backward.hpp"
#include "posenc/attention/kv_cache.hpp"
#include "posenc/core/eigen.hpp"
#include "posenc/core/error.hpp"
#include "posenc/core/view.hpp"
#include "posenc/encoding/traits.hpp"

namespace posenc {

/// Sizes of a multi-head attention layer (docs/attention.md, "mha_config").
/// A 0 in kv_heads, head_dim or value_dim asks for the default written beside it.
struct mha_config {
  index_t model_dim = 0;  ///< width of the input and output tokens; must be > 0
  index_t q_heads = 0;    ///< query heads; must be > 0
  index_t kv_heads = 0;   ///< key/value heads (0 = q_heads; fewer = grouped-query attention); must divide q_heads
  index_t head_dim = 0;   ///< query/key head width (0 = model_dim / q_heads, which must then divide evenly)
  index_t value_dim = 0;  ///< value head width (0 = head_dim)
};

/// A multi-head self-attention layer:
///   q = x Wq^T + bq, k = x Wk^T + bk, v = x Wv^T + bv   (per head slices)
///   o = attention(q, k, v) with the encoder's rotation / bias / Shaw terms
///   y = o Wo^T + bo
/// Weights use the nn.Linear layout (out_features, in_features), row-major,
/// copied by `load` or borrowed from the caller by `load_borrowed`.
///
/// Absolute encodings (sinusoidal, learned) are not the layer's business: the
/// reference models (BERT, GPT-2, RoBERTa) add them once, to the token
/// embeddings before the first LayerNorm / block, so that they flow through
/// the residual stream of every layer. Do that with the encoder's own call,
///   pe.add_to(embeddings, positions);   // (batch, seq, model_dim), in place
/// and build the layer with the encoder's relative part (or posenc::none). An
/// encoder that adds to embeddings, alone or inside a compose, is a compile
/// error here rather than being applied at a place no reference model uses
/// or dropped without a word.
///
/// `forward(x, y, cache)` decodes with a kv_cache: it appends the new keys
/// (rotated) and values and attends over everything cached through
/// `posenc::attention(q, cache, out, enc, opt)`; token by token it gives the
/// same result as one prefill over the whole sequence with causal attention
/// (for dynamic NTK / LongRoPE only while their length rule keeps the
/// frequencies fixed).
/// @tparam Encoder an encoder that does not add to embeddings (rotation, bias, Shaw, none, or a compose of them)
/// @tparam T float or double
template <class Encoder, class T = float>
class multi_head_attention {
  // The encoder contract (encoding/traits.hpp): at most one fires.
  static_assert(has_encoder_traits_v<Encoder>,
                "posenc::multi_head_attention: Encoder is not an encoder; specialize "
                "posenc::encoder_traits<Encoder> (see posenc/encoding/traits.hpp)");
  static_assert(!std::conditional_t<has_encoder_traits_v<Encoder>, encoder_traits<Encoder>,
                                    detail::no_traits>::adds_to_embeddings,
                "posenc::multi_head_attention: the encoder adds to embeddings, which reference models do once, "
                "to the token embeddings before the first layer; call its add_to(embeddings, positions) there "
                "and give the layer only the encoder's relative part (or posenc::none)");
  static constexpr detail::contract_problem problem_ = detail::encoder_contract_problem<Encoder, T>();
  static_assert(problem_ != detail::contract_problem::value_type,
                "posenc::multi_head_attention: the encoder's value_type is not T; build the encoder with "
                "the layer's element type (e.g. multi_head_attention<rope<float>, float>)");
  static_assert(problem_ != detail::contract_problem::max_positions,
                "posenc::multi_head_attention: the encoder has no `index_t max_positions() const`; every "
                "encoder needs one (return 0 when any position works)");
  static_assert(problem_ != detail::contract_problem::rotate,
                "posenc::multi_head_attention: encoder_traits<Encoder>::rotates_queries_keys is true but the "
                "encoder has no `rotate(view<T>, position_span, index_t) const`");
  static_assert(problem_ != detail::contract_problem::bias_row,
                "posenc::multi_head_attention: encoder_traits<Encoder>::biases_scores is true but the encoder "
                "has no `bias_row(index_t, index_t, index_t, index_t, T*) const`");
  static_assert(problem_ != detail::contract_problem::heads,
                "posenc::multi_head_attention: encoder_traits<Encoder>::biases_scores is true but the encoder "
                "has no `index_t heads() const` (return 0 when any head count works)");
  static_assert(problem_ != detail::contract_problem::relative_key_value,
                "posenc::multi_head_attention: encoder_traits<Encoder>::relative_key_value is true but the "
                "encoder lacks one of `score_row(T const*, index_t, index_t, index_t, T, T*) const`, "
                "`value_row(T const*, index_t, index_t, index_t, T*) const`, `bool has_values() const`, "
                "`index_t head_dim() const`");

 public:
  using matrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using vector = Eigen::Matrix<T, Eigen::Dynamic, 1>;

  multi_head_attention(mha_config cfg, Encoder enc) : cfg_(cfg), enc_(std::move(enc)) {
    char const* w = "posenc::multi_head_attention";
    detail::require(cfg_.model_dim > 0, w, "model_dim is ", cfg_.model_dim, ", expected > 0");
    detail::require(cfg_.q_heads > 0, w, "q_heads is ", cfg_.q_heads, ", expected > 0");
    if (cfg_.kv_heads == 0) cfg_.kv_heads = cfg_.q_heads;
    detail::require(cfg_.kv_heads > 0 && cfg_.q_heads % cfg_.kv_heads == 0, w, "kv_heads is ",
                    cfg_.kv_heads, ", expected a divisor of q_heads (", cfg_.q_heads, ")");
    if (cfg_.head_dim == 0) {
      detail::require(cfg_.model_dim % cfg_.q_heads == 0, w, "model_dim is ", cfg_.model_dim,
                      ", expected a multiple of q_heads (", cfg_.q_heads, ") when head_dim is 0");
      cfg_.head_dim = cfg_.model_dim / cfg_.q_heads;
    }
    detail::require(cfg_.head_dim > 0, w, "head_dim is ", cfg_.head_dim, ", expected > 0");
    if (cfg_.value_dim == 0) cfg_.value_dim = cfg_.head_dim;
    detail::require(cfg_.value_dim > 0, w, "value_dim is ", cfg_.value_dim, ", expected > 0");
    index_t const m = cfg_.model_dim;
    index_t const rows[4] = {cfg_.q_heads * cfg_.head_dim, cfg_.kv_heads * cfg_.head_dim,
                             cfg_.kv_heads * cfg_.value_dim, m};
    index_t const cols[4] = {m, m, m, cfg_.q_heads * cfg_.value_dim};
    for (int i = 0; i < 4; ++i) {
      rows_[i] = rows[i];
      cols_[i] = cols[i];
      weights_[i] = matrix::Zero(rows[i], cols[i]);
      biases_[i] = vector::Zero(rows[i]);
    }
  }

  /// Copies the projection weights from caller buffers, each (out_features,
  /// in_features) row-major: wq (Hq*D, model), wk (Hkv*D, model), wv (Hkv*Dv,
  /// model), wo (model, Hq*Dv). Biases are optional (null = zero): bq (Hq*D),
  /// bk (Hkv*D), bv (Hkv*Dv), bo (model). The buffers may be freed afterwards.
  void load(T const* wq, T const* wk, T const* wv, T const* wo, T const* bq = nullptr,
            T const* bk = nullptr, T const* bv = nullptr, T const* bo = nullptr) {
    T const* const src[8] = {wq, wk, wv, wo, bq, bk, bv, bo};
    check_weights("posenc::multi_head_attention::load", src);
    for (int i = 0; i < 4; ++i) {
      weights_[i] = Eigen::Map<const matrix>(src[i], rows_[i], cols_[i]);
      if (src[4 + i]) {
        biases_[i] = Eigen::Map<const vector>(src[4 + i], rows_[i]);
      } else {
        biases_[i].setZero(rows_[i]);
      }
      borrowed_[i] = borrowed_[4 + i] = nullptr;
    }
  }

  /// Borrows the projection weights: the layer reads the caller's buffers
  /// (same layouts as load(); Eigen::Map over them) and copies nothing, so a
  /// memory-mapped checkpoint is used in place. Null biases are zero.
  ///
  /// Lifetime: every buffer must stay valid and unchanged while any forward()
  /// runs, until the layer (and every copy of it: copies borrow the same
  /// buffers) is destroyed or loads other weights with load() or
  /// load_borrowed(). Changes written to the buffers between calls are seen
  /// by the next forward().
  void load_borrowed(T const* wq, T const* wk, T const* wv, T const* wo, T const* bq = nullptr,
                     T const* bk = nullptr, T const* bv = nullptr, T const* bo = nullptr) {
    T const* const src[8] = {wq, wk, wv, wo, bq, bk, bv, bo};
    check_weights("posenc::multi_head_attention::load_borrowed", src);
    for (int i = 0; i < 4; ++i) {
      weights_[i] = matrix();  // the owned copy is not needed while borrowing
      biases_[i].setZero(rows_[i]);
      borrowed_[i] = src[i];
      borrowed_[4 + i] = src[4 + i];
    }
  }

  /// True when the weights are borrowed (load_borrowed), false when owned.
  bool borrows_weights() const noexcept { return borrowed_[0] != nullptr; }

  /// Prefill / encoder self-attention over x (batch, seq, model_dim) into y
  /// (same shape). Positions: opt.q_positions (also used for the keys), else 0..seq-1.
  /// x already holds any absolute encoding (added to the embeddings).
  template <class Path = path::best>
  void forward(token_view<const T> x, token_view<T> y, attention_options<T> opt = {}) const {
    prefill<Path>(x, y, opt, nullptr);
  }

  /// The activations a prefill keeps for backward(): the projections q, k, v
  /// (before any rotation, (batch * seq, heads * dim) row-major), the
  /// attention output o and its log-sum-exp (batch, q_heads, seq). The caller
  /// owns it; forward(x, y, opt, saved) fills it. Keeping them rather than
  /// recomputing them in backward costs batch x seq x (Hq D + Hkv D + Hkv Dv +
  /// Hq Dv) values plus the lse, and spares backward the three projections and
  /// a second forward attention (docs/backward.md).
  struct saved {
    matrix q, k, v, o;
    std::vector<T> lse;
    index_t batch = -1, seq = -1;  ///< -1: not filled by a forward pass
    /// True once a forward pass filled it.
    bool filled() const noexcept { return batch >= 0; }
  };

  /// Gradients of the layer's parameters, shaped like them (nn.Linear layout),
  /// and the encoder's (`encoder_gradients_t<Encoder>`; start from
  /// make_gradients(), which gives every encoder gradient, ALiBi's slopes
  /// included; `encoder = enc.make_gradients(false)` skips fixed slopes).
  /// backward() adds into them.
  struct gradients {
    matrix w_q, w_k, w_v, w_o;
    vector b_q, b_k, b_v, b_o;
    encoder_gradients_t<Encoder> encoder;
    /// Zeros every gradient.
    void set_zero() {
      for (matrix* m : {&w_q, &w_k, &w_v, &w_o}) m->setZero();
      for (vector* b : {&b_q, &b_k, &b_v, &b_o}) b->setZero();
      encoder.set_zero();
    }
    /// Throws posenc::error unless every tensor of o (the encoder's included)
    /// has the shape of this one's.
    void check_same_shape(char const* where, gradients const& o) const {
      char const* const wn[4] = {"w_q", "w_k", "w_v", "w_o"};
      char const* const bn[4] = {"b_q", "b_k", "b_v", "b_o"};
      for (int i = 0; i < 4; ++i) {
        detail::check_same_gradient_shape(where, wn[i], *weights(*this)[i], *weights(o)[i]);
        detail::check_same_gradient_shape(where, bn[i], *biases(*this)[i], *biases(o)[i]);
      }
      detail::check_same_encoder_gradients(where, encoder, o.encoder);
    }
    /// Adds o elementwise, e.g. the gradients of another micro-batch or of
    /// another worker's share of the batch. Throws posenc::error, before
    /// anything is added, when a shape differs (a layer of another config).
    gradients& operator+=(gradients const& o) {
      check_same_shape("posenc::multi_head_attention::gradients::operator+=", o);
      for (int i = 0; i < 4; ++i) {
        *weights(*this)[i] += *weights(o)[i];
        *biases(*this)[i] += *biases(o)[i];
      }
      encoder += o.encoder;
      return *this;
    }

   private:
    // The weights and biases in q, k, v, o order.
    template <class G>
    static auto weights(G& g) {
      return std::array<decltype(&g.w_q), 4>{&g.w_q, &g.w_k, &g.w_v, &g.w_o};
    }
    template <class G>
    static auto biases(G& g) {
      return std::array<decltype(&g.b_q), 4>{&g.b_q, &g.b_k, &g.b_v, &g.b_o};
    }
  };

  /// Zeroed gradients of this layer's shapes (the encoder's from posenc::make_gradients).
  gradients make_gradients() const {
    gradients g;
    matrix* const w[4] = {&g.w_q, &g.w_k, &g.w_v, &g.w_o};
    vector* const b[4] = {&g.b_q, &g.b_k, &g.b_v, &g.b_o};
    for (int i = 0; i < 4; ++i) {
      *w[i] = matrix::Zero(rows_[i], cols_[i]);
      *b[i] = vector::Zero(rows_[i]);
    }
    g.encoder = posenc::make_gradients(enc_);
    return g;
  }

  /// Prefill as forward(x, y, opt) that also fills `s` for backward(). When
  /// opt.lse is set it receives the log-sum-exp as well. `s` is only written
  /// when the call succeeds.
  template <class Path = path::best>
  void forward(token_view<const T> x, token_view<T> y, attention_options<T> opt, saved& s) const {
    prefill<Path>(x, y, opt, &s);
  }

  /// Gradients of a prefill (no cache; training is not token by token): given
  /// the forward pass's input x, the state `s` it saved and dy, the gradient
  /// of a loss with respect to its output y, writes dx (the shape of x) and
  /// adds the gradients of every weight and bias and of the encoder's
  /// parameters into `g` (docs/backward.md):
  ///   dWo += dY^T O, dbo += sum dY, dO = dY Wo;
  ///   dQ, dK, dV, d(encoder) = attention_backward<Path>(Q, K, V, O, dO);
  ///   dWq += dQ^T X, dbq += sum dQ (k, v alike); dX = dQ Wq + dK Wk + dV Wv.
  /// `opt` must be the forward pass's options (masks, positions, causal,
  /// threads, ...); its lse is not read (the saved one is) and its scores must
  /// be null. dx may share memory with x or dy (both are read first).
  /// @throws posenc::error on bad shapes, a state not filled by forward() or of
  ///         another shape, gradients of the wrong shapes, or any argument
  ///         attention_backward rejects; before anything is written.
  template <class Path = path::best>
  void backward(token_view<const T> x, token_view<const T> dy, token_view<T> dx, saved const& s, gradients& g,
                attention_options<T> opt = {}) const {
    char const* w = "posenc::multi_head_attention::backward";
    detail::check_view(w, "x", x);
    detail::check_view(w, "dy", dy);
    detail::check_view(w, "dx", dx);
    detail::check_equal(w, "x.dim", x.dim, cfg_.model_dim, "model_dim");
    detail::check_equal(w, "dy.batch", dy.batch, x.batch, "x.batch");
    detail::check_equal(w, "dy.seq", dy.seq, x.seq, "x.seq");
    detail::check_equal(w, "dy.dim", dy.dim, cfg_.model_dim, "model_dim");
    detail::check_equal(w, "dx.batch", dx.batch, x.batch, "x.batch");
    detail::check_equal(w, "dx.seq", dx.seq, x.seq, "x.seq");
    detail::check_equal(w, "dx.dim", dx.dim, cfg_.model_dim, "model_dim");
    detail::require(s.filled(), w, "saved is empty, expected the state filled by forward(x, y, opt, saved)");
    detail::require(s.batch == x.batch && s.seq == x.seq, w, "saved holds (batch ", s.batch, ", seq ", s.seq,
                    "), expected (batch ", x.batch, ", seq ", x.seq, ") of x");
    index_t const B = x.batch, S = x.seq, N = B * S;
    index_t const cols[4] = {rows_[0], rows_[1], rows_[2], cfg_.q_heads * cfg_.value_dim};
    matrix const* const st[4] = {&s.q, &s.k, &s.v, &s.o};
    char const* const st_names[4] = {"saved.q", "saved.k", "saved.v", "saved.o"};
    for (int i = 0; i < 4; ++i)
      detail::require(st[i]->rows() == N && st[i]->cols() == cols[i], w, st_names[i], " shape is (", st[i]->rows(),
                      ", ", st[i]->cols(), "), expected (", N, ", ", cols[i], ") (a forward pass of this layer)");
    index_t const lse_n = B * cfg_.q_heads * S;
    detail::require(static_cast<index_t>(s.lse.size()) == lse_n, w, "saved.lse has ", s.lse.size(),
                    " values, expected ", lse_n, " (batch x q_heads x seq)");
    check_gradients(w, g);

    position_span const pos = opt.q_positions ? *opt.q_positions : position_span(0);
    opt.q_positions = pos;
    if (!opt.k_positions) opt.k_positions = pos;
    opt.lse = {const_cast<T*>(s.lse.data()), lse_n};  // read only by attention_backward
    matrix const X = pack(x), DY = pack(dy);
    matrix DO(N, cols[3]);
    if (N > 0) DO.noalias() = DY * weight(3);
    matrix DQ = matrix::Zero(N, cols[0]), DK = matrix::Zero(N, cols[1]), DV = matrix::Zero(N, cols[2]);
    // Validates everything it reads, then adds into g.encoder: the last call that can throw.
    posenc::attention_backward<Path, T>(
        make_bshd<const T>(s.q.data(), B, S, cfg_.q_heads, cfg_.head_dim),
        make_bshd<const T>(s.k.data(), B, S, cfg_.kv_heads, cfg_.head_dim),
        make_bshd<const T>(s.v.data(), B, S, cfg_.kv_heads, cfg_.value_dim),
        make_bshd<const T>(s.o.data(), B, S, cfg_.q_heads, cfg_.value_dim),
        make_bshd<const T>(DO.data(), B, S, cfg_.q_heads, cfg_.value_dim),
        make_bshd<T>(DQ.data(), B, S, cfg_.q_heads, cfg_.head_dim), make_bshd<T>(DK.data(), B, S, cfg_.kv_heads, cfg_.head_dim),
        make_bshd<T>(DV.data(), B, S, cfg_.kv_heads, cfg_.value_dim), enc_, opt, g.encoder);
    if (N == 0) {
      return;
    }
    g.w_o.noalias() += DY.transpose() * s.o;
    g.b_o += DY.colwise().sum().transpose();
    matrix const* const d[3] = {&DQ, &DK, &DV};
    matrix* const gw[3] = {&g.w_q, &g.w_k, &g.w_v};
    vector* const gb[3] = {&g.b_q, &g.b_k, &g.b_v};
    matrix DX = matrix::Zero(N, cfg_.model_dim);
    for (int i = 0; i < 3; ++i) {
      gw[i]->noalias() += d[i]->transpose() * X;
      *gb[i] += d[i]->colwise().sum().transpose();
      DX.noalias() += *d[i] * weight(i);
    }
    for (index_t b = 0; b < B; ++b)
      for (index_t t = 0; t < S; ++t)
        for (index_t c = 0; c < cfg_.model_dim; ++c) dx.ptr(b, t)[c] = DX(b * S + t, c);
  }

  /// Decode (or prefill into a cache): x (batch, S, model_dim) are the next S
  /// tokens after the cached ones, at positions cache.next_position() + s.
  /// Their keys and values are appended to the cache; the queries attend over
  /// the whole cache with `posenc::attention(q, cache, out, enc, opt)` (set
  /// opt.causal for decoder self-attention). Positions and key lengths come
  /// from the cache: opt.q_positions, opt.k_positions and opt.key_lengths must
  /// be unset.
  template <class Path = path::best>
  void forward(token_view<const T> x, token_view<T> y, kv_cache<T>& cache,
               attention_options<T> opt = {}) const {
    char const* w = "posenc::multi_head_attention::forward";
    check_io(x, y);
    detail::require(!opt.q_positions && !opt.k_positions, w,
                    "q_positions/k_positions are set, expected unset with a cache (it tracks positions)");
    detail::require(opt.key_lengths.empty() && opt.key_lengths.data() == nullptr, w, "key_lengths has ",
                    opt.key_lengths.size(), " entries, expected none with a cache (it holds length() keys "
                    "per sequence)");
    detail::check_equal(w, "cache.batch", cache.batch(), x.batch, "x.batch");
    detail::check_equal(w, "cache.kv_heads", cache.kv_heads(), cfg_.kv_heads, "kv_heads");
    detail::check_equal(w, "cache.head_dim", cache.head_dim(), cfg_.head_dim, "head_dim");
    detail::check_equal(w, "cache.value_dim", cache.value_dim(), cfg_.value_dim, "value_dim");
    index_t const B = x.batch, S = x.seq;
    matrix X = pack(x);
    matrix Q = project(X, 0), K = project(X, 1), V = project(X, 2);
    index_t const before = cache.length();
    cache.append(make_bshd<const T>(K.data(), B, S, cfg_.kv_heads, cfg_.head_dim),
                 make_bshd<const T>(V.data(), B, S, cfg_.kv_heads, cfg_.value_dim), enc_);
    // Should attention reject its options, the cache drops the new tokens
    // again: a call that throws leaves the cache as it was.
    struct undo_append {
      kv_cache<T>& cache;
      index_t length;
      bool done = false;
      ~undo_append() {
        if (!done) cache.truncate(length);
      }
    } undo{cache, before};
    matrix O(B * S, cfg_.q_heads * cfg_.value_dim);
    // The new tokens were appended last: the default query positions are
    // cache.next_position() - S + s, the positions their keys got.
    posenc::attention<Path, T>(make_bshd<const T>(Q.data(), B, S, cfg_.q_heads, cfg_.head_dim), cache,
                               make_bshd<T>(O.data(), B, S, cfg_.q_heads, cfg_.value_dim), enc_, opt);
    undo.done = true;
    write_out(O, y);
  }

  /// An empty cache shaped for this layer.
  kv_cache<T> make_cache(index_t batch, index_t first_position = 0) const {
    return kv_cache<T>(batch, cfg_.kv_heads, cfg_.head_dim, cfg_.value_dim, first_position);
  }

  using const_matrix_map = Eigen::Map<const matrix>;
  using const_vector_map = Eigen::Map<const vector>;

  mha_config const& config() const noexcept { return cfg_; }
  Encoder const& encoder() const noexcept { return enc_; }
  /// The weights in use (owned or borrowed), (out_features, in_features).
  const_matrix_map w_q() const noexcept { return weight(0); }
  const_matrix_map w_k() const noexcept { return weight(1); }
  const_matrix_map w_v() const noexcept { return weight(2); }
  const_matrix_map w_o() const noexcept { return weight(3); }

 private:
  const_matrix_map weight(int i) const noexcept {
    return const_matrix_map(borrowed_[i] ? borrowed_[i] : weights_[i].data(), rows_[i], cols_[i]);
  }
  const_vector_map bias(int i) const noexcept {
    return const_vector_map(borrowed_[4 + i] ? borrowed_[4 + i] : biases_[i].data(), rows_[i]);
  }
  // Weights wq, wk, wv, wo must be non-null; biases may be null.
  void check_weights(char const* w, T const* const (&src)[8]) const {
    char const* const names[4] = {"wq", "wk", "wv", "wo"};
    for (int i = 0; i < 4; ++i)
      detail::require(src[i] != nullptr, w, names[i], " is null, expected a row-major (", rows_[i], " x ", cols_[i],
                      ") weight buffer");
  }
  // Prefill over x into y; fills *s (when given) only once attention succeeded.
  template <class Path>
  void prefill(token_view<const T> x, token_view<T> y, attention_options<T> opt, saved* s) const {
    check_io(x, y);
    position_span const pos = opt.q_positions ? *opt.q_positions : position_span(0);
    opt.q_positions = pos;
    if (!opt.k_positions) opt.k_positions = pos;
    index_t const B = x.batch, S = x.seq;
    matrix X = pack(x);
    matrix Q = project(X, 0), K = project(X, 1), V = project(X, 2);
    matrix O(B * S, cfg_.q_heads * cfg_.value_dim);
    std::vector<T> lse;
    output_span<T> const user_lse = opt.lse;
    if (s) {
      // The call writes the saved lse; a given opt.lse receives a copy, checked first.
      detail::check_output_span("posenc::multi_head_attention", "opt.lse", user_lse, B * cfg_.q_heads * S,
                                "batch x q_heads x seq");
      lse.assign(static_cast<std::size_t>(B * cfg_.q_heads * S), T(0));
      opt.lse = lse;
    }
    posenc::attention<Path, T>(make_bshd<const T>(Q.data(), B, S, cfg_.q_heads, cfg_.head_dim),
                               make_bshd<const T>(K.data(), B, S, cfg_.kv_heads, cfg_.head_dim),
                               make_bshd<const T>(V.data(), B, S, cfg_.kv_heads, cfg_.value_dim),
                               make_bshd<T>(O.data(), B, S, cfg_.q_heads, cfg_.value_dim), enc_, opt);
    write_out(O, y);
    if (s) {
      if (user_lse) std::copy(lse.begin(), lse.end(), user_lse.data());
      s->q = std::move(Q);
      s->k = std::move(K);
      s->v = std::move(V);
      s->o = std::move(O);
      s->lse = std::move(lse);
      s->batch = B;
      s->seq = S;
    }
  }
  // Throws unless g has make_gradients()'s shapes (the encoder's checked by attention_backward).
  void check_gradients(char const* w, gradients const& g) const {
    matrix const* const gw[4] = {&g.w_q, &g.w_k, &g.w_v, &g.w_o};
    vector const* const gb[4] = {&g.b_q, &g.b_k, &g.b_v, &g.b_o};
    char const* const wn[4] = {"grads.w_q", "grads.w_k", "grads.w_v", "grads.w_o"};
    char const* const bn[4] = {"grads.b_q", "grads.b_k", "grads.b_v", "grads.b_o"};
    for (int i = 0; i < 4; ++i) {
      detail::require(gw[i]->rows() == rows_[i] && gw[i]->cols() == cols_[i], w, wn[i], " shape is (", gw[i]->rows(),
                      ", ", gw[i]->cols(), "), expected (", rows_[i], ", ", cols_[i], ") (the weight's)");
      detail::require(gb[i]->size() == rows_[i], w, bn[i], " has ", gb[i]->size(), " values, expected ", rows_[i]);
    }
    detail::check_encoder_gradients(w, enc_, g.encoder);
  }
  void check_io(token_view<const T> x, token_view<T> y) const {
    char const* w = "posenc::multi_head_attention::forward";
    detail::check_view(w, "x", x);
    detail::check_view(w, "y", y);
    detail::check_equal(w, "x.dim", x.dim, cfg_.model_dim, "model_dim");
    detail::check_equal(w, "y.batch", y.batch, x.batch, "x.batch");
    detail::check_equal(w, "y.seq", y.seq, x.seq, "x.seq");
    detail::check_equal(w, "y.dim", y.dim, cfg_.model_dim, "model_dim");
  }
  /// x packed into (batch * seq, model_dim).
  matrix pack(token_view<const T> x) const {
    matrix X(x.batch * x.seq, cfg_.model_dim);
    for (index_t b = 0; b < x.batch; ++b)
      for (index_t s = 0; s < x.seq; ++s)
        for (index_t d = 0; d < x.dim; ++d) X(b * x.seq + s, d) = x.ptr(b, s)[d];
    return X;
  }
  /// X W_i^T + b_i for projection i (0 q, 1 k, 2 v).
  matrix project(matrix const& X, int i) const {
    matrix R(X.rows(), rows_[i]);
    if (X.rows() > 0) {
      R.noalias() = X * weight(i).transpose();
      R.rowwise() += bias(i).transpose();
    }
    return R;
  }
  void write_out(matrix const& O, token_view<T> y) const {
    if (O.rows() == 0) return;
    matrix Y(O.rows(), cfg_.model_dim);
    Y.noalias() = O * weight(3).transpose();
    Y.rowwise() += bias(3).transpose();
    for (index_t b = 0; b < y.batch; ++b)
      for (index_t s = 0; s < y.seq; ++s)
        for (index_t d = 0; d < y.dim; ++d) y.ptr(b, s)[d] = Y(b * y.seq + s, d);
  }

  mha_config cfg_;
  Encoder enc_;
  // Projections 0..3 = q, k, v, o: (rows_, cols_) = (out_features, in_features).
  index_t rows_[4] = {}, cols_[4] = {};
  matrix weights_[4];                  // owned weights (empty while borrowing)
  vector biases_[4];                   // owned biases (zeros where none is given)
  T const* borrowed_[8] = {};          // borrowed wq, wk, wv, wo, bq, bk, bv, bo (null: owned / zero)
};

}  // namespace posenc
