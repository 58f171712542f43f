// SPDX-License-Identifier: MIT
// Compile-cost baseline: Eigen and xsimd, one GEMM and one SIMD reduction.
#include <Eigen/Dense>
#include <xsimd/xsimd.hpp>

#include <cstdio>

int main() {
  Eigen::MatrixXf a = Eigen::MatrixXf::Random(64, 64), b = Eigen::MatrixXf::Random(64, 64);
  Eigen::MatrixXf c = a * b;
  xsimd::batch<float> x(c(0, 0));
  std::printf("%f %f\n", static_cast<double>(c(0, 0)), static_cast<double>(xsimd::hadd(x)));
  return 0;
}
