// SPDX-License-Identifier: MIT
// The fused backward's accumulating products (dV += P^T dO, dK += dS^T Q, dQ += dS K): register tiles that load each value once.
#pragma once

#include <type_traits>

#include "posenc/attention/fused/micro_kernels.hpp"
#include "posenc/core/simd.hpp"

namespace posenc::detail::fused_backward {

/// Rows per register tile of the backward's products: six rows by four vectors fill 31 of 32 registers.
template <class Tr>
inline constexpr int product_rows_v = Tr::registers_v >= 32 ? 6 : static_cast<int>(Tr::row_group_v);

/// o_g += sum_j p_g[j * ps] x_j over `len` dims for NG rows (o_g at o + g * len), j < n, x_j at x + j * ldx.
/// With ps = 1 the p_g are rows; with ps = the row length of a row-major P they are its columns (P^T
/// without a transposed copy).
/// The same sums in the same order as fused::row_values with alpha 1, but each vector of x_j is pinned
/// in a register and feeds the NG FMAs (GCC otherwise folds it into each FMA and loads it NG times).
/// `Guarded`: keys with p_g[j] = 0 add nothing, even when x_j is NaN or Inf.
template <class Tr, int NG, bool Guarded = false>
POSENC_ALWAYS_INLINE void add_row_products(typename Tr::value_type const* const* pr, index_t ps,
                                           typename Tr::value_type const* x, index_t ldx, index_t n, index_t len,
                                           typename Tr::value_type* o) noexcept {
  using T = typename Tr::value_type;
  using B = typename Tr::batch;
  using A = typename Tr::arch;
  constexpr index_t w_v = Tr::width_v;
  constexpr int cw_v = fused::register_block<Tr>(NG, NG + 2, 8);
  auto chunk = [&](index_t d, auto cw) {
    constexpr int C = decltype(cw)::value;
    B acc[fused::size_v<NG>][fused::size_v<C>];
    for (int g = 0; g < NG; ++g)
      for (int c = 0; c < C; ++c) acc[g][c] = simd::load<T, A>(o + g * len + d + c * w_v);
    for (index_t j = 0; j < n; ++j) {
      T const* xj = x + j * ldx + d;
      B pj[fused::size_v<NG>];
      for (int g = 0; g < NG; ++g) pj[g] = B(pr[g][j * ps]);
      for (int c = 0; c < C; ++c) {
        B xv = simd::load<T, A>(xj + c * w_v);
        simd::keep_in_register(xv);  // one load for the NG FMAs
        for (int g = 0; g < NG; ++g) {
          if constexpr (Guarded)
            acc[g][c] = pr[g][j * ps] != T(0) ? simd::fma(pj[g], xv, acc[g][c]) : acc[g][c];
          else
            acc[g][c] = simd::fma(pj[g], xv, acc[g][c]);
        }
      }
    }
    for (int g = 0; g < NG; ++g)
      for (int c = 0; c < C; ++c) simd::store(o + g * len + d + c * w_v, acc[g][c]);
  };
  index_t d = 0;
  for (; d + cw_v * w_v <= len; d += cw_v * w_v) chunk(d, std::integral_constant<int, cw_v>{});
  for (; d + w_v <= len; d += w_v) chunk(d, std::integral_constant<int, 1>{});
  for (; d < len; ++d) {
    for (int g = 0; g < NG; ++g) {
      T a = o[g * len + d];
      for (index_t j = 0; j < n; ++j)
        if (!Guarded || pr[g][j * ps] != T(0)) a += pr[g][j * ps] * x[j * ldx + d];
      o[g * len + d] = a;
    }
  }
}

}  // namespace posenc::detail::fused_backward
