// SPDX-License-Identifier: MIT
// Dense pieces of the lab's model with their backward passes: LayerNorm, GELU, cross-entropy.
#pragma once

#include <Eigen/Core>

#include <cmath>
#include <vector>

namespace lab {

template <class T>
using matrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using row_vector = Eigen::Matrix<T, 1, Eigen::Dynamic>;
template <class T>
using matrix_map = Eigen::Map<matrix<T>>;
template <class T>
using row_map = Eigen::Map<row_vector<T>>;

/// What LayerNorm's backward needs: the normalized input and 1 / std per row.
template <class T>
struct norm_cache {
  matrix<T> xhat;               // (rows, d)
  Eigen::Matrix<T, Eigen::Dynamic, 1> rstd;  // (rows)
};

/// y = (x - mean) / sqrt(var + 1e-5) * gain + bias, per row.
template <class T>
matrix<T> layer_norm(matrix<T> const& x, row_map<T> const& gain, row_map<T> const& bias, norm_cache<T>& c) {
  auto const d = static_cast<T>(x.cols());
  c.xhat.resize(x.rows(), x.cols());
  c.rstd.resize(x.rows());
  for (Eigen::Index r = 0; r < x.rows(); ++r) {
    T mean = x.row(r).sum() / d;
    T var = (x.row(r).array() - mean).square().sum() / d;
    c.rstd(r) = T(1) / std::sqrt(var + T(1e-5));
    c.xhat.row(r) = (x.row(r).array() - mean) * c.rstd(r);
  }
  return (c.xhat.array().rowwise() * gain.array()).rowwise() + bias.array();
}

/// Backward of layer_norm: returns d(x); adds d(gain), d(bias).
template <class T>
matrix<T> layer_norm_backward(matrix<T> const& dy, row_map<T> const& gain, norm_cache<T> const& c, row_map<T> dgain,
                              row_map<T> dbias) {
  dgain += (dy.array() * c.xhat.array()).colwise().sum().matrix();
  dbias += dy.colwise().sum();
  matrix<T> dxhat = dy.array().rowwise() * gain.array();
  auto const d = static_cast<T>(dy.cols());
  matrix<T> dx(dy.rows(), dy.cols());
  for (Eigen::Index r = 0; r < dy.rows(); ++r) {
    T m1 = dxhat.row(r).sum() / d, m2 = dxhat.row(r).dot(c.xhat.row(r)) / d;
    dx.row(r) = c.rstd(r) * (dxhat.row(r).array() - m1 - c.xhat.row(r).array() * m2);
  }
  return dx;
}

namespace detail {
inline constexpr double gelu_c = 0.7978845608028654;  // sqrt(2 / pi)
inline constexpr double gelu_a = 0.044715;
}  // namespace detail

/// GELU, tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). Writes the tanh of each
/// element into t (the backward pass reuses it). Eigen's tanh is vectorized for float.
template <class T>
matrix<T> gelu(matrix<T> const& u, matrix<T>& t) {
  auto x = u.array();
  t = (T(detail::gelu_c) * (x + T(detail::gelu_a) * x.cube())).tanh().matrix();
  return (T(0.5) * x * (T(1) + t.array())).matrix();
}

/// d(gelu(u)) = dy * gelu'(u), with t = tanh(...) from gelu(u, t); one fused elementwise pass.
template <class T>
matrix<T> gelu_backward(matrix<T> const& dy, matrix<T> const& u, matrix<T> const& t) {
  auto x = u.array();
  auto th = t.array();
  auto dt = (T(1) - th.square()) * T(detail::gelu_c) * (T(1) + T(3 * detail::gelu_a) * x.square());
  return (dy.array() * (T(0.5) * (T(1) + th) + T(0.5) * x * dt)).matrix();
}

/// Mean cross-entropy of logits (rows, vocab) against targets; writes d(loss)/d(logits)
/// into dlogits and each row's loss (natural log) into row_loss.
template <class T>
double cross_entropy(matrix<T> const& logits, std::vector<int> const& targets, matrix<T>* dlogits,
                     std::vector<double>* row_loss) {
  auto const n = logits.rows();
  if (dlogits) dlogits->resize(n, logits.cols());
  if (row_loss) row_loss->assign(static_cast<std::size_t>(n), 0.0);
  double total = 0;
  for (Eigen::Index r = 0; r < n; ++r) {
    T mx = logits.row(r).maxCoeff();
    row_vector<T> e = (logits.row(r).array() - mx).exp();
    T sum = e.sum();
    auto t = targets[static_cast<std::size_t>(r)];
    double loss = static_cast<double>(std::log(sum) + mx - logits(r, t));
    total += loss;
    if (row_loss) (*row_loss)[static_cast<std::size_t>(r)] = loss;
    if (dlogits) {
      dlogits->row(r) = e / (sum * static_cast<T>(n));
      (*dlogits)(r, t) -= T(1) / static_cast<T>(n);
    }
  }
  return total / static_cast<double>(n);
}

}  // namespace lab
