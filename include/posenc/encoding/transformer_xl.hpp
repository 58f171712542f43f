// SPDX-License-Identifier: MIT
// Transformer-XL (Dai et al. 2019) relative attention: per-head u, v and projected sinusoidal distances, segment memory.
#pragma once

#include <cmath>
#include <cstddef>
#include <type_traits>
#include <vector>

#include "posenc/core/checked.hpp"
#include "posenc/core/eigen.hpp"
#include "posenc/core/error.hpp"
#include "posenc/core/span.hpp"
#include "posenc/encoding/bias_kernels.hpp"
#include "posenc/encoding/traits.hpp"

namespace posenc {

/// Relative attention of Transformer-XL (Dai et al. 2019; docs/encoders/relative.md,
/// docs/formulas.md 4.5), as in the reference code and Hugging Face's TransfoXL
/// (`RelPartialLearnableMultiHeadAttn`). For head h, query i at position p_i and
/// key j at p_j, with distance d = p_i - p_j:
///
///     e_ij = scale * ( (q_i + u_h) . k_j  +  (q_i + v_h) . R_h(d) )
///     R_h(d) = W_R[h * head_dim .. (h + 1) * head_dim, :] * PE(d)
///     PE(d)  = [sin(d w_0) .. sin(d w_{m/2-1}), cos(d w_0) .. cos(d w_{m/2-1})],
///     w_k    = 1 / 10000^(2k / m),  m = pos_dim (W_R's column count, even)
///
/// u and v are (heads, head_dim), W_R is (heads * head_dim, pos_dim) like the
/// weight of HF's `r_net`. R is indexed by the distance directly (no
/// pad-and-shift): the constructor tabulates R_h(d) and the per-distance term
/// (v_h - u_h) . R_h(d) for |d| <= distance_limit().
///
/// How the kernels apply it (encoding/traits.hpp): the content term is the
/// kernel's own q . k with the query shifted by u_h (`content_bias`); the
/// position term is the relative-key hook `score_row(head, ...)`, which gets
/// the shifted query q + u and adds scale * ((q + u) . R_h(d) + (v_h - u_h) . R_h(d)).
///
/// A checkpoint that stores R already given by distance (and not W_R) builds
/// the encoder with from_distances(): the same formula with R_h(d) read from
/// the given table; pos_dim() is then 0 and w_r_gradient() is unavailable
/// (r_gradient() gives d(R) in the table's shape).
///
/// Segment memory: the keys and values of attention are [memory ; current
/// segment], so that with q.seq < k.seq query i sits at position mem + i (the
/// default bottom-right positions). With memory_length() = M > 0, a memory
/// longer than M keys is cut to its most recent M keys before attention, and
/// distance_limit() need only cover the kept keys (every call form checks the
/// distances after the cut: direct, kv_cache, paged, packed and backward).
/// @tparam T float or double.
template <class T = float>
class transformer_xl {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "posenc::transformer_xl: T must be float or double");

 public:
  using value_type = T;
  using table_type = relative_table<T>;

  /// @param distance_limit largest |p_i - p_j| of a visible pair the call may have (>= 0)
  /// @param u (heads, head_dim): content bias, `r_w_bias`
  /// @param v (heads, head_dim): position bias, `r_r_bias`
  /// @param w_r (heads * head_dim, pos_dim): projection of the sinusoids, pos_dim even >= 2
  /// @param memory_length M: a longer memory is cut to its last M keys (0 = keep every key)
  transformer_xl(index_t distance_limit, Eigen::Ref<const table_type> const& u, Eigen::Ref<const table_type> const& v,
                 Eigen::Ref<const table_type> const& w_r, index_t memory_length = 0)
      : limit_(distance_limit), heads_(u.rows()), head_dim_(u.cols()), pos_dim_(w_r.cols()), mem_(memory_length) {
    char const* w = "posenc::transformer_xl";
    index_t const rows = check_common(w, u, v);
    detail::require(pos_dim_ >= 2 && pos_dim_ % 2 == 0, w, "w_r shape is (", w_r.rows(), ", ", w_r.cols(),
                    "), expected (", rows, ", an even pos_dim >= 2)");
    detail::rel::check_table_shape<T>(w, "w_r", w_r, rows, pos_dim_, "(heads x head_dim of u, pos_dim)");
    index_t const dists = detail::rel::clipped_rows(w, limit_);
    detail::checked_mul(w, detail::checked_mul(w, dists, rows, "(2 x distance_limit + 1) x heads"), pos_dim_,
                        "(2 x distance_limit + 1) x heads x head_dim x pos_dim");
    u_ = detail::rel::copy_table<T>(u);
    v_ = detail::rel::copy_table<T>(v);
    build_tables(u, v, sinusoids() * w_r.template cast<double>().transpose());  // R_h(d) = W_R,h PE(d)
    start_identity("w_r", u, v);
    identity_.add_table("w_r", w_r.data(), w_r.rows(), w_r.cols(), w_r.outerStride());
  }

  /// The encoder from R given by distance instead of W_R, for checkpoints that
  /// store R itself: row d + distance_limit of `r` holds R(d) for every head
  /// (head h at columns h head_dim .. (h + 1) head_dim), d = -distance_limit
  /// .. distance_limit. The attention is the formula above with this R_h(d);
  /// the constructor tabulates (v_h - u_h) . R_h(d) in double from the given
  /// values. pos_dim() is 0, and the parameter gradient of R is r_gradient(g)
  /// (w_r_gradient throws).
  ///
  /// A checkpoint with R for the distances klen - 1 down to 0 (Hugging Face
  /// TransfoXL's `r_head_k`, (klen, heads x head_dim), non-negative distances
  /// only) maps to distance_limit = klen - 1 with its rows reversed into rows
  /// distance_limit .. 2 distance_limit (row distance_limit + d holds
  /// r_head_k[klen - 1 - d]). The rows 0 .. distance_limit - 1 of negative
  /// distances are only read without causal masking (keys after the query);
  /// what they hold is the caller's choice, e.g. zeros:
  ///
  ///     table r = table::Zero(2 * (klen - 1) + 1, heads * head_dim);
  ///     r.bottomRows(klen) = r_head_k.colwise().reverse();
  ///     auto enc = posenc::transformer_xl<float>::from_distances(klen - 1, u, v, r);
  ///
  /// @param distance_limit largest |p_i - p_j| of a visible pair the call may have (>= 0)
  /// @param u (heads, head_dim): content bias, `r_w_bias`
  /// @param v (heads, head_dim): position bias, `r_r_bias`
  /// @param r (2 distance_limit + 1, heads x head_dim): R by distance, row d + distance_limit
  /// @param memory_length M: a longer memory is cut to its last M keys (0 = keep every key)
  static transformer_xl from_distances(index_t distance_limit, Eigen::Ref<const table_type> const& u,
                                       Eigen::Ref<const table_type> const& v, Eigen::Ref<const table_type> const& r,
                                       index_t memory_length = 0) {
    return transformer_xl(by_distance{}, distance_limit, u, v, r, memory_length);
  }

  /// Query heads the encoder was built for.
  index_t heads() const noexcept { return heads_; }
  /// Width of u, v and R (the attention head_dim).
  index_t head_dim() const noexcept { return head_dim_; }
  /// Width of the sinusoidal encoding PE (W_R's column count); 0 for an
  /// encoder built from R by distance (from_distances), which has no W_R.
  index_t pos_dim() const noexcept { return pos_dim_; }
  /// True for an encoder built from R by distance (from_distances).
  bool from_r() const noexcept { return pos_dim_ == 0; }
  /// Largest |p_i - p_j| of a visible query-key pair; posenc::attention checks it
  /// on the keys kept after the memory cut.
  index_t distance_limit() const noexcept { return limit_; }
  /// M: a memory longer than M keys is cut to its last M (0 = keep every key).
  index_t memory_length() const noexcept { return mem_; }
  /// Any position works (only distances are limited).
  index_t max_positions() const noexcept { return 0; }
  /// No value term: the outputs are plain sum_j p_ij v_j.
  bool has_values() const noexcept { return false; }
  /// Element type, form (`w_r`, or `r` for from_distances), heads, head_dim,
  /// pos_dim, distance_limit, memory_length and digests of u, v and W_R (or
  /// of from_distances' R table): computed at construction (W_R is not kept).
  encoder_identity const& identity() const noexcept { return identity_; }

  /// R_h(distance)[dim], |distance| <= distance_limit().
  T relative_key(index_t head, index_t distance, index_t dim) const {
    char const* w = "posenc::transformer_xl::relative_key";
    detail::rel::check_head(w, head, heads_);
    check_distance(w, distance);
    detail::require(dim >= 0 && dim < head_dim_, w, "dim is ", dim, ", expected 0 .. ", head_dim_ - 1);
    return r_row(head, distance)[dim];
  }
  /// The per-distance term (v_h - u_h) . R_h(distance), |distance| <= distance_limit().
  T position_bias(index_t head, index_t distance) const {
    char const* w = "posenc::transformer_xl::position_bias";
    detail::rel::check_head(w, head, heads_);
    check_distance(w, distance);
    return c_[static_cast<std::size_t>(head * dists() + distance + limit_)];
  }

  /// Hook (optional, encoding/traits.hpp): u_h, head_dim values, added to every
  /// query of head h before the kernel's q . k and the position term.
  T const* content_bias(index_t head) const noexcept { return u_.data() + head * head_dim_; }

  /// Hook (optional, encoding/traits.hpp): R_h and (v_h - u_h) . R_h by
  /// distance, transposed, for the fused path's tile products.
  distance_columns<T> columns(index_t head) const noexcept {
    index_t const n = dists();
    return {rt_.data() + head * head_dim_ * n, c_.data() + head * n, n, limit_, n};
  }

  /// Hook: out[j] += scale * (q . R_h(d) + (v_h - u_h) . R_h(d)), d = q_pos -
  /// (k_pos_first + j), j in [0, count), where q is the query shifted by u_h
  /// (head_dim values). Keys at |d| > distance_limit() get nothing (the
  /// attention checks make every such key invisible). Unchecked.
  POSENC_ROW_NOINLINE void score_row(index_t head, T const* q, index_t q_pos, index_t k_pos_first, index_t count,
                                     T scale, T* out) const noexcept {
    T const* r = r_.data() + head * dists() * head_dim_;
    T const* c = c_.data() + head * dists();
    for (index_t j = 0; j < count; ++j) {
      index_t const d = q_pos - k_pos_first - j;  // positions are within +-position_limit: no overflow
      if (d < -limit_ || d > limit_) continue;
      index_t const row = d + limit_;
      out[j] += scale * (detail::rel::dot(q, r + row * head_dim_, head_dim_) + c[row]);
    }
  }

  /// Hook: no value term (has_values() is false); does nothing.
  void value_row(T const*, index_t, index_t, index_t, T*) const noexcept {}

  /// Gradients of the parameters (docs/backward.md): `u` and `v` are
  /// (heads, head_dim) like u and v; `r` is the gradient of the tabulated
  /// R_h(d), (heads x (2 distance_limit + 1), head_dim) with R_h(d) at row
  /// h (2 distance_limit + 1) + d + distance_limit. r_gradient(g) gives it in
  /// the shape of from_distances' r; d(W_R) is linear in it: w_r_gradient(g)
  /// gives it in W_R's shape (for an encoder built from W_R).
  struct gradient_tensors {
    gradient_tensor<T> u, v, r;
    static constexpr char const* add_where = "posenc::transformer_xl::gradients::operator+=";
    /// f("u", ...), f("v", ...), then f("r", ...) (see gradient_set).
    template <class F, class... G>
    static void each(F&& f, G&... g) {
      f("u", g.u...);
      f("v", g.v...);
      f("r", g.r...);
    }
  };
  using gradients = gradient_set<gradient_tensors>;
  /// Zeros of the gradients' shapes.
  gradients make_gradients() const {
    using G = gradient_tensor<T>;
    return {G::Zero(heads_, head_dim_), G::Zero(heads_, head_dim_), G::Zero(heads_ * dists(), head_dim_)};
  }
  /// Throws unless g's tables have the shapes make_gradients() gives.
  void check_gradients(char const* where, gradients const& g) const {
    auto one = [&](char const* name, gradient_tensor<T> const& t, index_t rows, char const* what) {
      detail::require(t.rows() == rows && t.cols() == head_dim_, where, "grads.", name, " shape is (", t.rows(), ", ",
                      t.cols(), "), expected (", rows, ", ", head_dim_, ") ", what);
    };
    one("u", g.u, heads_, "(heads, head_dim)");
    one("v", g.v, heads_, "(heads, head_dim)");
    one("r", g.r, heads_ * dists(), "(heads x (2 x distance_limit + 1), head_dim)");
  }
  /// d(R) in the shape of from_distances' r, (2 distance_limit + 1, heads x
  /// head_dim): row d + distance_limit, columns h head_dim .. (h + 1) head_dim
  /// hold g.r's row h (2 distance_limit + 1) + d + distance_limit. For either form.
  table_type r_gradient(gradients const& g) const {
    check_gradients("posenc::transformer_xl::r_gradient", g);
    index_t const n = dists();
    table_type out(n, heads_ * head_dim_);
    for (index_t h = 0; h < heads_; ++h) out.block(0, h * head_dim_, n, head_dim_) = g.r.block(h * n, 0, n, head_dim_);
    return out;
  }
  /// d(W_R) from the gradient of R: d(W_R)[h head_dim + t][m] = sum_d g.r(h, d)[t] PE(d)[m]
  /// (accumulated in double); the shape of W_R, (heads x head_dim, pos_dim).
  /// Throws for an encoder built from R by distance (no W_R: use r_gradient).
  table_type w_r_gradient(gradients const& g) const {
    char const* w = "posenc::transformer_xl::w_r_gradient";
    detail::require(!from_r(), w,
                    "the encoder was built from R by distance (from_distances) and has no W_R, expected "
                    "r_gradient(g) for the gradient of R");
    check_gradients(w, g);
    dmat const pe = sinusoids();
    index_t const n = dists();
    table_type out(heads_ * head_dim_, pos_dim_);
    for (index_t h = 0; h < heads_; ++h) {
      dmat const gr = g.r.block(h * n, 0, n, head_dim_).template cast<double>();  // (distances, head_dim)
      out.block(h * head_dim_, 0, head_dim_, pos_dim_) = (gr.transpose() * pe).template cast<T>();
    }
    return out;
  }

  /// Hook (optional, encoding/traits.hpp), the transpose of content_bias:
  /// g.u.row(head) += dq, the gradient (head_dim values) of one query row of
  /// that head as the kernel saw it (q + u_h). Unchecked.
  void content_bias_backward(index_t head, T const* dq, gradients& g) const noexcept {
    T* gu = g.u.data() + head * head_dim_;  // row-major
    for (index_t t = 0; t < head_dim_; ++t) gu[t] += dq[t];
  }

  /// Hook, the transpose of score_row: for j in [0, count) at distance
  /// d = q_pos - (k_pos_first + j) within the limit, with ds = scale * dscore[j]
  /// and q the shifted query q + u_h: dq += ds R_h(d); g.v.row(head) += ds R_h(d)
  /// and g.u.row(head) -= ds R_h(d) (the (v_h - u_h) . R_h(d) term; u's share
  /// through the shifted query comes from content_bias_backward); g.r at
  /// (head, d) += ds (q + v_h - u_h). Unchecked.
  void score_row_backward(index_t head, T const* q, index_t q_pos, index_t k_pos_first, index_t count, T scale,
                          T const* dscore, T* dq, gradients& g) const noexcept {
    T const* r = r_.data() + head * dists() * head_dim_;
    T const* uh = u_.data() + head * head_dim_;
    T const* vh = v_.data() + head * head_dim_;
    T* gu = g.u.data() + head * head_dim_;
    T* gv = g.v.data() + head * head_dim_;
    T* gr = g.r.data() + head * dists() * head_dim_;
    for (index_t j = 0; j < count; ++j) {
      index_t const d = q_pos - k_pos_first - j;
      if (d < -limit_ || d > limit_) continue;
      T const ds = scale * dscore[j];
      if (ds == T(0)) continue;
      index_t const row = d + limit_;
      T const* rr = r + row * head_dim_;
      T* grr = gr + row * head_dim_;
      for (index_t t = 0; t < head_dim_; ++t) {
        T const x = ds * rr[t];
        dq[t] += x;
        gv[t] += x;
        gu[t] -= x;
        grr[t] += ds * (q[t] + vh[t] - uh[t]);
      }
    }
  }

  /// Hook: no value term, so no gradient through it; does nothing.
  void value_row_backward(T const*, T const*, index_t, index_t, index_t, T*, gradients&) const noexcept {}

  /// Checked score_row for the unshifted query q: adds the position term
  /// scale * (q + v_h) . R_h(q_pos - k_pos) for out.size() keys from k_pos_first;
  /// throws posenc::error before writing anything.
  void add_position_scores(index_t head, span<const T> q, index_t q_pos, index_t k_pos_first, T scale,
                           span<T> out) const {
    char const* w = "posenc::transformer_xl::add_position_scores";
    detail::rel::check_head(w, head, heads_);
    detail::require(q.size() == head_dim_, w, "q has ", q.size(), " values, expected ", head_dim_, " (head_dim)");
    detail::require(std::isfinite(static_cast<double>(scale)), w, "scale is ", scale, ", expected a finite number");
    detail::rel::check_position(w, "q_pos", q_pos);
    detail::rel::check_position(w, "k_pos", k_pos_first);
    if (out.size() > 0) {
      check_distance(w, q_pos - k_pos_first);
      check_distance(w, q_pos - (k_pos_first + out.size() - 1));
    }
    std::vector<T> shifted(static_cast<std::size_t>(head_dim_));
    T const* ub = content_bias(head);
    for (index_t t = 0; t < head_dim_; ++t) shifted[static_cast<std::size_t>(t)] = q[t] + ub[t];
    score_row(head, shifted.data(), q_pos, k_pos_first, out.size(), scale, out.data());
  }

 private:
  using dmat = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  struct by_distance {};

  transformer_xl(by_distance, index_t distance_limit, Eigen::Ref<const table_type> const& u,
                 Eigen::Ref<const table_type> const& v, Eigen::Ref<const table_type> const& r, index_t memory_length)
      : limit_(distance_limit), heads_(u.rows()), head_dim_(u.cols()), pos_dim_(0), mem_(memory_length) {
    char const* w = "posenc::transformer_xl::from_distances";
    index_t const cols = check_common(w, u, v);
    index_t const dists = detail::rel::clipped_rows(w, limit_);
    detail::checked_mul(w, dists, cols, "(2 x distance_limit + 1) x heads x head_dim");
    detail::rel::check_table_shape<T>(w, "r", r, dists, cols, "(2 x distance_limit + 1, heads x head_dim of u)");
    u_ = detail::rel::copy_table<T>(u);
    v_ = detail::rel::copy_table<T>(v);
    build_tables(u, v, r.template cast<double>());
    start_identity("r", u, v);
    identity_.add_table("r", r.data(), r.rows(), r.cols(), r.outerStride());
  }

  // The checks both forms share (distance_limit, memory_length, u, v); returns heads x head_dim.
  index_t check_common(char const* w, Eigen::Ref<const table_type> const& u, Eigen::Ref<const table_type> const& v) {
    detail::require(limit_ >= 0 && limit_ <= position_limit, w, "distance_limit is ", limit_, ", expected 0 .. ",
                    position_limit, " (position_limit)");
    detail::require(mem_ >= 0 && mem_ <= position_limit, w, "memory_length is ", mem_, ", expected 0 .. ",
                    position_limit, " (position_limit; 0 = keep every memory key)");
    detail::require(heads_ >= 1 && head_dim_ >= 1, w, "u shape is (", u.rows(), ", ", u.cols(),
                    "), expected (heads >= 1, head_dim >= 1)");
    detail::rel::check_table_shape<T>(w, "u", u, heads_, head_dim_, "(heads, head_dim)");
    detail::rel::check_table_shape<T>(w, "v", v, heads_, head_dim_, "(heads, head_dim) of u");
    return detail::checked_mul(w, heads_, head_dim_, "heads x head_dim");
  }

  // The identity's parameters up to u and v; the caller adds its W_R or R table.
  void start_identity(char const* form, Eigen::Ref<const table_type> const& u, Eigen::Ref<const table_type> const& v) {
    identity_ = encoder_identity("transformer_xl");
    identity_.add("type", detail::element_name<T>()).add("form", form).add("heads", heads_).add("head_dim", head_dim_);
    identity_.add("pos_dim", pos_dim_).add("distance_limit", limit_).add("memory_length", mem_);
    identity_.add_table("u", u.data(), u.rows(), u.cols(), u.outerStride());
    identity_.add_table("v", v.data(), v.rows(), v.cols(), v.outerStride());
  }

  index_t dists() const noexcept { return 2 * limit_ + 1; }
  T const* r_row(index_t head, index_t distance) const noexcept {
    return r_.data() + (head * dists() + distance + limit_) * head_dim_;
  }
  void check_distance(char const* where, index_t distance) const {
    detail::require(distance >= -limit_ && distance <= limit_, where, "distance is ", distance, ", expected -",
                    limit_, " .. ", limit_, " (distance_limit)");
  }

  // PE(d) for |d| <= limit, (distances, pos_dim) in double, row d + limit.
  dmat sinusoids() const {
    index_t const n = dists(), half = pos_dim_ / 2;
    dmat pe(n, pos_dim_);
    for (index_t k = 0; k < half; ++k) {
      double const inv_freq = 1.0 / std::pow(10000.0, static_cast<double>(2 * k) / static_cast<double>(pos_dim_));
      for (index_t r = 0; r < n; ++r) {
        double const a = static_cast<double>(r - limit_) * inv_freq;
        pe(r, k) = std::sin(a);
        pe(r, half + k) = std::cos(a);
      }
    }
    return pe;
  }

  // From R by distance in double, rel (distances, heads x head_dim) with
  // R_h(d) at row d + limit, columns h head_dim .. (h + 1) head_dim (W_R,h
  // PE(d) from one GEMM for the W_R form, the given table for from_distances):
  // R stored as (heads, distances, head_dim) so that one head's rows are
  // contiguous, its transpose, and c_h(d) = (v_h - u_h) . R_h(d), also from
  // the double values.
  void build_tables(Eigen::Ref<const table_type> const& u, Eigen::Ref<const table_type> const& v, dmat const& rel) {
    index_t const n = dists();
    r_.assign(static_cast<std::size_t>(heads_ * n * head_dim_), T(0));
    rt_.assign(r_.size(), T(0));
    c_.assign(static_cast<std::size_t>(heads_ * n), T(0));
    for (index_t h = 0; h < heads_; ++h)
      for (index_t r = 0; r < n; ++r) {
        double c = 0.0;
        for (index_t t = 0; t < head_dim_; ++t) {
          double const x = rel(r, h * head_dim_ + t);
          r_[static_cast<std::size_t>((h * n + r) * head_dim_ + t)] = static_cast<T>(x);
          rt_[static_cast<std::size_t>((h * head_dim_ + t) * n + r)] = static_cast<T>(x);
          c += (static_cast<double>(v(h, t)) - static_cast<double>(u(h, t))) * x;
        }
        c_[static_cast<std::size_t>(h * n + r)] = static_cast<T>(c);
      }
  }

  index_t limit_, heads_, head_dim_, pos_dim_, mem_;
  std::vector<T> u_;  // (heads, head_dim)
  std::vector<T> v_;  // (heads, head_dim)
  std::vector<T> r_;  // (heads, 2 * limit + 1, head_dim): R_h(d) at row d + limit
  std::vector<T> rt_;  // (heads, head_dim, 2 * limit + 1): R_h transposed
  std::vector<T> c_;  // (heads, 2 * limit + 1): (v_h - u_h) . R_h(d)
  encoder_identity identity_;  // identity(): the parameters as given to the constructor or from_distances
};

template <class T>
struct encoder_traits<transformer_xl<T>> {
  static constexpr bool adds_to_embeddings = false, rotates_queries_keys = false;
  static constexpr bool biases_scores = false, relative_key_value = true;
  static constexpr bool is_relative = true;
};

}  // namespace posenc
