// SPDX-License-Identifier: MIT
// Parameters in one flat vector with named (rows, cols) blocks: what Adam and checkpoints see.
#pragma once

#include "layers.hpp"

#include <Eigen/Core>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace lab {

/// The flat parameter (and gradient) storage, aligned to Eigen's largest packet: where a
/// vectorized loop starts its aligned part, and so the order of its sums, is then the same
/// for every model of one configuration, and equal runs give equal bits.
template <class T>
using param_vector = std::vector<T, Eigen::aligned_allocator<T>>;

/// A named (rows, cols) block of the flat parameter vector.
struct block {
  std::string name;
  std::size_t offset = 0;
  Eigen::Index rows = 0, cols = 0;
  std::size_t size() const { return static_cast<std::size_t>(rows * cols); }
};

/// The layout of the flat vector: blocks in the order they were added.
class param_layout {
 public:
  /// Adds a block and returns its index.
  int add(std::string name, Eigen::Index rows, Eigen::Index cols) {
    blocks_.push_back({std::move(name), size_, rows, cols});
    size_ += blocks_.back().size();
    return static_cast<int>(blocks_.size()) - 1;
  }
  block const& operator[](int i) const { return blocks_[static_cast<std::size_t>(i)]; }
  std::size_t size() const { return size_; }
  std::vector<block> const& blocks() const { return blocks_; }

 private:
  std::vector<block> blocks_;
  std::size_t size_ = 0;
};

/// The block `b` of `data` as a row-major matrix.
template <class T>
matrix_map<T> as_matrix(param_vector<T>& data, block const& b) {
  return matrix_map<T>(data.data() + b.offset, b.rows, b.cols);
}
/// The block `b` of `data` as a row vector (rows * cols values).
template <class T>
row_map<T> as_row(param_vector<T>& data, block const& b) {
  return row_map<T>(data.data() + b.offset, static_cast<Eigen::Index>(b.size()));
}

/// A seeded normal generator (Box-Muller on 53-bit uniforms: the same numbers everywhere).
class normal_source {
 public:
  explicit normal_source(std::uint64_t seed) : gen_(seed) {}
  double operator()() {
    double u1 = (static_cast<double>(gen_() >> 11) + 1.0) * 0x1.0p-53, u2 = static_cast<double>(gen_() >> 11) * 0x1.0p-53;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
  /// Uniform integer in [0, n).
  std::uint64_t below(std::uint64_t n) { return gen_() % n; }

 private:
  std::mt19937_64 gen_;
};

}  // namespace lab
