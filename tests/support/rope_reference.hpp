// SPDX-License-Identifier: MIT
// Scalar reference for rope<T>: per token cos_sin() + the scalar pair kernel, head by head.
#pragma once

#include <posenc/encoding/rope.hpp>

#include <vector>

namespace posenc_test {

/// out = rotate(in) (or its inverse) computed with rope::cos_sin and
/// detail::rope_rotate_scalar: no table, no SIMD, no threads. `out` gets the
/// whole head (the pass-through tail copied).
template <class T>
void rope_reference(posenc::rope<T> const& r, posenc::view<const T> in, posenc::view<T> out,
                    posenc::position_span pos, posenc::index_t length, bool inverse = false) {
  posenc::index_t const h = r.rotary_dim() / 2;
  std::vector<T> c(static_cast<std::size_t>(h)), s(static_cast<std::size_t>(h));
  double const a = r.frequencies(length).attention_factor;
  T const g = static_cast<T>(1.0 / (a * a));
  for (posenc::index_t b = 0; b < in.batch; ++b)
    for (posenc::index_t t = 0; t < in.seq; ++t) {
      r.cos_sin(pos.at(b, t), length, c.data(), s.data());
      for (posenc::index_t hd = 0; hd < in.heads; ++hd) {
        T const* src = in.ptr(b, t, hd);
        T* dst = out.ptr(b, t, hd);
        std::vector<T> tmp(src, src + in.dim);
        posenc::detail::rope_rotate_scalar(r.layout(), tmp.data(), tmp.data(), c.data(), s.data(), r.rotary_dim(),
                                           inverse, g);
        for (posenc::index_t d = 0; d < in.dim; ++d) dst[d] = tmp[static_cast<std::size_t>(d)];
      }
    }
}

/// The same with a caller cache row per token: rows[(b, t)] -> (cos, sin) pointers of r/2 values.
template <class T, class RowFn>
void rope_reference_rows(posenc::rope<T> const& r, posenc::view<const T> in, posenc::view<T> out, RowFn row_of,
                         bool inverse = false) {
  for (posenc::index_t b = 0; b < in.batch; ++b)
    for (posenc::index_t t = 0; t < in.seq; ++t) {
      auto cs = row_of(b, t);
      for (posenc::index_t hd = 0; hd < in.heads; ++hd) {
        T const* src = in.ptr(b, t, hd);
        T* dst = out.ptr(b, t, hd);
        std::vector<T> tmp(src, src + in.dim);
        posenc::detail::rope_rotate_scalar(r.layout(), tmp.data(), tmp.data(), cs.first, cs.second, r.rotary_dim(),
                                           inverse, T(1));
        for (posenc::index_t d = 0; d < in.dim; ++d) dst[d] = tmp[static_cast<std::size_t>(d)];
      }
    }
}

/// SIMD and scalar kernels agree bit for bit when the instruction set has
/// FMA (both use fused multiply-adds in the same order); otherwise xsimd's
/// fma is a multiply then an add and they agree to a few ulp.
inline constexpr bool rope_kernels_bitwise_equal() {
#if defined(__FMA__) || defined(__AVX512F__)
  return true;
#else
  return false;
#endif
}

}  // namespace posenc_test
