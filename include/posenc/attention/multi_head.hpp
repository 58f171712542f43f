// SPDX-License-Identifier: MIT
// multi_head_attention<Encoder, T>: projections (Eigen), the encoder wherever it acts, prefill and cached decode.
#pragma once


#include "posenc/attention/attention.hpp"
#include "posenc/attention/kv_cache.hpp"
#include "posenc/core/eigen.hpp"
#include "posenc/core/error.hpp"
#include "posenc/core/view.hpp"
#include "posenc/encoding/traits.hpp"

namespace posenc {

/// Sizes of a multi-head attention layer.
struct mha_config {
  index_t model_dim = 0;  ///< width of the input and output tokens
  index_t q_heads = 0;    ///< query heads
  index_t kv_heads = 0;   ///< key/value heads (0 = q_heads; fewer = grouped-query attention)
  index_t head_dim = 0;   ///< query/key head width (0 = model_dim / q_heads)
  index_t value_dim = 0;  ///< value head width (0 = head_dim)
};

/// A multi-head self-attention layer:
///   x' = x + pe(pos)                      (encoders that add to embeddings)
///   q = x' Wq^T + bq, k = x' Wk^T + bk, v = x' Wv^T + bv   (per head slices)
///   o = attention(q, k, v) with the encoder's rotation / bias / Shaw terms
///   y = o Wo^T + bo
/// Weights use the nn.Linear layout (out_features, in_features), row-major.
/// `forward(x, y, cache)` decodes with a kv_cache: it appends the new keys
/// (rotated) and values and attends over everything cached; token by token it
/// gives the same result as one prefill over the whole sequence with causal
/// attention (for dynamic NTK / LongRoPE only while their length rule keeps
/// the frequencies fixed).
/// @tparam Encoder any encoder (additive ones included)
/// @tparam T float or double
template <class Encoder, class T = float>
class multi_head_attention {
  // The encoder contract (encoding/traits.hpp), additive encoders included: at most one fires.
  static_assert(has_encoder_traits_v<Encoder>,
                "posenc::multi_head_attention: Encoder is not an encoder; specialize "
                "posenc::encoder_traits<Encoder> (see posenc/encoding/traits.hpp)");
  static constexpr detail::contract_problem problem_ = detail::encoder_contract_problem<Encoder, T>();
  static_assert(problem_ != detail::contract_problem::value_type,
                "posenc::multi_head_attention: the encoder's value_type is not T; build the encoder with "
                "the layer's element type (e.g. multi_head_attention<rope<float>, float>)");
  static_assert(problem_ != detail::contract_problem::max_positions,
                "posenc::multi_head_attention: the encoder has no `index_t max_positions() const`; every "
                "encoder needs one (return 0 when any position works)");
  static_assert(problem_ != detail::contract_problem::add_to,
                "posenc::multi_head_attention: encoder_traits<Encoder>::adds_to_embeddings is true but the "
                "encoder has no `add_to(token_view<T>, position_span) const`");
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
    wq_ = matrix::Zero(cfg_.q_heads * cfg_.head_dim, m);
    wk_ = matrix::Zero(cfg_.kv_heads * cfg_.head_dim, m);
    wv_ = matrix::Zero(cfg_.kv_heads * cfg_.value_dim, m);
    wo_ = matrix::Zero(m, cfg_.q_heads * cfg_.value_dim);
    bq_ = vector::Zero(wq_.rows());
    bk_ = vector::Zero(wk_.rows());
    bv_ = vector::Zero(wv_.rows());
    bo_ = vector::Zero(m);
  }

  /// Copies the projection weights from caller buffers, each (out_features,
  /// in_features) row-major: wq (Hq*D, model), wk (Hkv*D, model), wv (Hkv*Dv,
  /// model), wo (model, Hq*Dv). Biases are optional (null = zero).
  void load(T const* wq, T const* wk, T const* wv, T const* wo, T const* bq = nullptr,
            T const* bk = nullptr, T const* bv = nullptr, T const* bo = nullptr) {
    char const* w = "posenc::multi_head_attention::load";
    detail::require(wq && wk && wv && wo, w, "a weight pointer is null, expected wq, wk, wv, wo");
    copy_into(wq_, wq);
    copy_into(wk_, wk);
    copy_into(wv_, wv);
    copy_into(wo_, wo);
    load_bias(bq_, bq);
    load_bias(bk_, bk);
    load_bias(bv_, bv);
    load_bias(bo_, bo);
  }

  /// Prefill / encoder self-attention over x (batch, seq, model_dim) into y
  /// (same shape). Positions: opt.q_positions (also used for the keys), else 0..seq-1.
  template <class Path = path::best>
  void forward(token_view<const T> x, token_view<T> y, attention_options<T> opt = {}) const {
    check_io(x, y);
    position_span const pos = opt.q_positions ? *opt.q_positions : position_span(0);
    opt.q_positions = pos;
    if (!opt.k_positions) opt.k_positions = pos;
    index_t const B = x.batch, S = x.seq;
    matrix X = embed(x, pos);
    matrix Q = project(X, wq_, bq_), K = project(X, wk_, bk_), V = project(X, wv_, bv_);
    matrix O(B * S, cfg_.q_heads * cfg_.value_dim);
    detail::run_attention<Path, true, T>(
        make_bshd<const T>(Q.data(), B, S, cfg_.q_heads, cfg_.head_dim),
        make_bshd<const T>(K.data(), B, S, cfg_.kv_heads, cfg_.head_dim),
        make_bshd<const T>(V.data(), B, S, cfg_.kv_heads, cfg_.value_dim),
        make_bshd<T>(O.data(), B, S, cfg_.q_heads, cfg_.value_dim), enc_, opt);
    write_out(O, y);
  }

  /// Decode (or prefill into a cache): x (batch, S, model_dim) are the next S
  /// tokens after the cached ones, at positions cache.next_position() + s.
  /// Their keys and values are appended to the cache; queries attend over the
  /// whole cache (set opt.causal for decoder self-attention).
  template <class Path = path::best>
  void forward(token_view<const T> x, token_view<T> y, kv_cache<T>& cache,
               attention_options<T> opt = {}) const {
    char const* w = "posenc::multi_head_attention::forward";
    check_io(x, y);
    detail::require(!opt.q_positions && !opt.k_positions, w,
                    "q_positions/k_positions are set, expected unset with a cache (it tracks positions)");
    detail::check_equal(w, "cache.batch", cache.batch(), x.batch, "x.batch");
    detail::check_equal(w, "cache.kv_heads", cache.kv_heads(), cfg_.kv_heads, "kv_heads");
    detail::check_equal(w, "cache.head_dim", cache.head_dim(), cfg_.head_dim, "head_dim");
    detail::check_equal(w, "cache.value_dim", cache.value_dim(), cfg_.value_dim, "value_dim");
    index_t const B = x.batch, S = x.seq;
    position_span const pos(cache.next_position());
    matrix X = embed(x, pos);
    matrix Q = project(X, wq_, bq_), K = project(X, wk_, bk_), V = project(X, wv_, bv_);
    cache.append(make_bshd<const T>(K.data(), B, S, cfg_.kv_heads, cfg_.head_dim),
                 make_bshd<const T>(V.data(), B, S, cfg_.kv_heads, cfg_.value_dim), enc_);
    opt.q_positions = pos;
    opt.k_positions = position_span(cache.first_position());
    opt.keys_rotated = true;
    matrix O(B * S, cfg_.q_heads * cfg_.value_dim);
    detail::run_attention<Path, true, T>(make_bshd<const T>(Q.data(), B, S, cfg_.q_heads, cfg_.head_dim),
                                         cache.keys(), cache.values(),
                                         make_bshd<T>(O.data(), B, S, cfg_.q_heads, cfg_.value_dim),
                                         enc_, opt);
    write_out(O, y);
  }

  /// An empty cache shaped for this layer.
  kv_cache<T> make_cache(index_t batch, index_t first_position = 0) const {
    return kv_cache<T>(batch, cfg_.kv_heads, cfg_.head_dim, cfg_.value_dim, first_position);
  }

  mha_config const& config() const noexcept { return cfg_; }
  Encoder const& encoder() const noexcept { return enc_; }
  matrix const& w_q() const noexcept { return wq_; }
  matrix const& w_k() const noexcept { return wk_; }
  matrix const& w_v() const noexcept { return wv_; }
  matrix const& w_o() const noexcept { return wo_; }

 private:
  static void copy_into(matrix& m, T const* src) {
    m = Eigen::Map<const matrix>(src, m.rows(), m.cols());
  }
  static void load_bias(vector& b, T const* src) {
    if (src) {
      b = Eigen::Map<const vector>(src, b.rows());
    } else {
      b.setZero();
    }
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
  /// x packed into (batch * seq, model_dim), plus the additive encoding.
  matrix embed(token_view<const T> x, position_span pos) const {
    matrix X(x.batch * x.seq, cfg_.model_dim);
    for (index_t b = 0; b < x.batch; ++b)
      for (index_t s = 0; s < x.seq; ++s)
        for (index_t d = 0; d < x.dim; ++d) X(b * x.seq + s, d) = x.ptr(b, s)[d];
    if constexpr (encoder_traits<Encoder>::adds_to_embeddings) {
      if (X.size() > 0) enc_.add_to(make_bsd<T>(X.data(), x.batch, x.seq, cfg_.model_dim), pos);
    } else {
      (void)pos;
    }
    return X;
  }
  static matrix project(matrix const& X, matrix const& W, vector const& bias) {
    matrix R(X.rows(), W.rows());
    if (X.rows() > 0) {
      R.noalias() = X * W.transpose();
      R.rowwise() += bias.transpose();
    }
    return R;
  }
  void write_out(matrix const& O, token_view<T> y) const {
    if (O.rows() == 0) return;
    matrix Y(O.rows(), cfg_.model_dim);
    Y.noalias() = O * wo_.transpose();
    Y.rowwise() += bo_.transpose();
    for (index_t b = 0; b < y.batch; ++b)
      for (index_t s = 0; s < y.seq; ++s)
        for (index_t d = 0; d < y.dim; ++d) y.ptr(b, s)[d] = Y(b * y.seq + s, d);
  }

  mha_config cfg_;
  Encoder enc_;
  matrix wq_, wk_, wv_, wo_;
  vector bq_, bk_, bv_, bo_;
};

}  // namespace posenc
