// SPDX-License-Identifier: MIT
// rope<T>: rotary position embedding, both pair layouts, partial rotary, every scaling, caller caches.
//
// Angles are computed at least in double (theta'_k in long double, the product
// pos * theta'_k as an exact double-double, cos/sin in double) and only the
// final cos/sin are rounded to T (docs/formulas.md 3.1). One cos/sin row per
// token is shared by all heads; the rotation of a head row is an xsimd kernel
// (see "Rotation kernels" below) with a scalar reference kept for the tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "posenc/core/aligned_buffer.hpp"
#include "posenc/core/checked.hpp"
#include "posenc/core/error.hpp"
#include "posenc/core/half.hpp"
#include "posenc/core/positions.hpp"
#include "posenc/core/simd.hpp"
#include "posenc/core/span.hpp"
#include "posenc/core/threading.hpp"
#include "posenc/core/view.hpp"
#include "posenc/encoding/rope_scaling.hpp"
#include "posenc/encoding/traits.hpp"

namespace posenc {

/// cos/sin values supplied by the caller instead of computed from theta, as
/// the ONNX RotaryEmbedding op and TensorRT take them. The values are used as
/// given (they need not satisfy cos^2 + sin^2 = 1, and no attention factor is
/// applied). Each row holds `width` = rotary_dim / 2 values, one per pair k,
/// row-major and contiguous. Non-owning.
template <class T>
struct rope_cache {
  T const* cos = nullptr;
  T const* sin = nullptr;
  /// Rows: positions covered (by position), or batch * seq (per token).
  index_t rows = 0;
  /// Values per row: rotary_dim / 2.
  index_t width = 0;
  /// Per token only: the (batch, seq) grid the rows follow.
  index_t batch = 0, seq = 0;
  bool is_per_token = false;

  /// Rows indexed by position id: (rows, width), row p used for a token at position p.
  static rope_cache by_position(T const* cos, T const* sin, index_t rows, index_t width) noexcept {
    rope_cache c;
    c.cos = cos;
    c.sin = sin;
    c.rows = rows;
    c.width = width;
    return c;
  }
  /// One row per token: (batch, seq, width). rows = batch * seq, or -1 when that overflows.
  static rope_cache per_token(T const* cos, T const* sin, index_t batch, index_t seq, index_t width) noexcept {
    rope_cache c;
    c.cos = cos;
    c.sin = sin;
    if (!detail::overflow_free<'*'>(batch, seq, c.rows)) c.rows = -1;
    c.width = width;
    c.batch = batch;
    c.seq = seq;
    c.is_per_token = true;
    return c;
  }
};

namespace detail {

// ---------------------------------------------------------------------------
// Rotation kernels. Every pair (a, b) with cos c and sin s becomes
//   a' = fma(a, c, -(b * s)),   b' = fma(b, c, a * s)
// and the inverse (angle -phi)
//   a' = fma(a, c,   b * s) * g,    b' = fma(b, c, -(a * s)) * g
// where g = 1 / a^2 undoes an attention factor a folded into c and s.
// fma is simd::fma in the vector bodies and simd::fma_scalar in the scalar
// code: one rounding where the instruction set has FMA, two (product, then
// sum) where it has not (x86 without -mfma). So the scalar reference and both
// SIMD layouts round identically on every instruction set: they agree bit for
// bit, and the two layouts agree exactly under the pair permutation.

/// Scalar reference for one head row: rotates the first r components of `in`
/// into `out` (may alias). c, s: r/2 values, one per pair. `g` scales the
/// inverse rotation only.
template <class T>
void rope_rotate_scalar(rope_layout layout, T* out, T const* in, T const* c, T const* s, index_t r, bool inverse,
                        T g = T(1)) noexcept {
  index_t const h = r / 2;
  for (index_t k = 0; k < h; ++k) {
    index_t const i0 = layout == rope_layout::half_split ? k : 2 * k;
    index_t const i1 = layout == rope_layout::half_split ? k + h : 2 * k + 1;
    T const a = in[i0], b = in[i1];
    if (!inverse) {
      out[i0] = simd::fma_scalar(a, c[k], -(b * s[k]));
      out[i1] = simd::fma_scalar(b, c[k], a * s[k]);
    } else {
      out[i0] = simd::fma_scalar(a, c[k], b * s[k]) * g;
      out[i1] = simd::fma_scalar(b, c[k], -(a * s[k])) * g;
    }
  }
}

// Storage. The kernels read and write elements of type S and compute in T.
// S is T (float, double), or a 16-bit type (Eigen::half, Eigen::bfloat16) with
// T = float: each element is widened exactly when loaded and rounded once, to
// nearest even, when stored (simd::load_widen / store_narrow). For S == T the
// helpers are the plain loads and stores, so those kernels are unchanged: the
// float and double instantiations compile to the same instructions as without
// the 16-bit path (objdump, GCC 12 -O2 -march=native). The helpers are plain
// `inline`; forcing them inline changed GCC's inlining order and its register
// allocation of the float kernels.

/// A stored element as T.
template <class T, class S>
inline T rope_get(S x) noexcept {
  if constexpr (std::is_same_v<S, T>)
    return x;
  else
    return stored_value<T>(x);
}

/// A T value as storage type S (rounded once for 16 bits).
template <class S, class T>
inline S rope_put(T x) noexcept {
  if constexpr (std::is_same_v<S, T>)
    return x;
  else
    return to_storage<S>(x);
}

/// One vector of T from S values at p (unaligned).
template <class T, class Arch, class S>
inline simd::batch<T, Arch> rope_load(S const* p) noexcept {
  if constexpr (std::is_same_v<S, T>)
    return simd::load<T, Arch>(p);
  else
    return simd::load_widen<half_format_of_v<S>, Arch>(half_bits(p));
}

/// Stores one vector of T as S values at p (unaligned).
template <class S, class T, class Arch>
inline void rope_store(S* p, simd::batch<T, Arch> const& b) noexcept {
  if constexpr (std::is_same_v<S, T>)
    simd::store(p, b);
  else
    simd::store_narrow<half_format_of_v<S>>(reinterpret_cast<std::uint16_t*>(p), b);
}

// The tails (rotary_dim not a multiple of the vector width) are scalar: the
// same rounding per element as the vector lanes (simd::fma_scalar), so a row gives the
// same bits whichever part of it a pair falls in; and no stack round trip
// (partial loads through a buffer cost more than the tail itself).

/// Pairs [k, h) of the half-split kernel, k > h - width.
template <bool Inverse, class T, class S>
inline void rope_rotate_half_tail(S* out, S const* in, T const* c, T const* s, index_t h, index_t k, T g) noexcept {
  for (; k < h; ++k) {
    T const a = rope_get<T>(in[k]), b = rope_get<T>(in[h + k]);
    if constexpr (!Inverse) {
      out[k] = rope_put<S>(simd::fma_scalar(a, c[k], -(b * s[k])));
      out[h + k] = rope_put<S>(simd::fma_scalar(b, c[k], a * s[k]));
    } else {
      out[k] = rope_put<S>(simd::fma_scalar(a, c[k], b * s[k]) * g);
      out[h + k] = rope_put<S>(simd::fma_scalar(b, c[k], -(a * s[k])) * g);
    }
  }
}

/// Components [k, r) of the interleaved kernel (whole pairs: r and the width are even).
/// c = [c0, c0, ...], s = [-s0, s0, ...] as in the vector kernel.
template <bool Inverse, class T, class S>
inline void rope_rotate_interleaved_tail(S* out, S const* in, T const* c, T const* s, index_t r, index_t k,
                                         T g) noexcept {
  for (; k < r; k += 2) {
    T const a = rope_get<T>(in[k]), b = rope_get<T>(in[k + 1]);
    if constexpr (!Inverse) {
      out[k] = rope_put<S>(simd::fma_scalar(a, c[k], b * s[k]));  // b * (-s) == -(b * s)
      out[k + 1] = rope_put<S>(simd::fma_scalar(b, c[k + 1], a * s[k + 1]));
    } else {
      out[k] = rope_put<S>(simd::fma_scalar(a, c[k], -(b * s[k])) * g);
      out[k + 1] = rope_put<S>(simd::fma_scalar(b, c[k + 1], -(a * s[k + 1])) * g);
    }
  }
}

/// Prefetches (for writing) the cache lines of [p, p + bytes). A hint: never faults.
template <class T>
inline void prefetch_span(T const* p, index_t bytes) noexcept {
#if defined(__GNUC__) || defined(__clang__)
  char const* c = reinterpret_cast<char const*>(p);
  for (index_t i = 0; i < bytes; i += 64) __builtin_prefetch(c + i, 1, 3);
#else
  (void)p;
  (void)bytes;
#endif
}

/// Half-split layout: two contiguous halves [0, h) and [h, 2h); c, s hold h values.
template <bool Inverse, class Arch, class T, class S>
void rope_rotate_half(S* out, S const* in, T const* c, T const* s, index_t h, T g) noexcept {
  using B = simd::batch<T, Arch>;
  constexpr index_t W = simd::width<T, Arch>;
  B const gg(g);
  auto step = [&](B const& a, B const& b, B const& cc, B const& ss, B& na, B& nb) {
    if constexpr (!Inverse) {
      na = simd::fma(a, cc, -(b * ss));
      nb = simd::fma(b, cc, a * ss);
    } else {
      na = simd::fma(a, cc, b * ss) * gg;
      nb = simd::fma(b, cc, -(a * ss)) * gg;
    }
  };
  index_t k = 0;
  for (; k + W <= h; k += W) {
    B const a = rope_load<T, Arch>(in + k), b = rope_load<T, Arch>(in + h + k);
    B const cc = simd::load<T, Arch>(c + k), ss = simd::load<T, Arch>(s + k);
    B na, nb;
    step(a, b, cc, ss, na, nb);
    rope_store(out + k, na);
    rope_store(out + h + k, nb);
  }
  if (k < h) rope_rotate_half_tail<Inverse>(out, in, c, s, h, k, g);
}

/// Interleaved layout: x' = fma(x, C, swap_pairs(x) * S) with C = [c0, c0, c1, c1, ...]
/// and S = [-s0, s0, -s1, s1, ...] (r values each: the expanded row that
/// rope_expand_interleaved writes from the compact one).
template <bool Inverse, class Arch, class T, class S>
void rope_rotate_interleaved(S* out, S const* in, T const* c, T const* s, index_t r, T g) noexcept {
  using B = simd::batch<T, Arch>;
  constexpr index_t W = simd::width<T, Arch>;
  B const gg(g);
  auto step = [&](B const& x, B const& cc, B const& ss) {
    B const sw = simd::swap_pairs(x);
    if constexpr (!Inverse) {
      return simd::fma(x, cc, sw * ss);
    } else {
      return simd::fma(x, cc, -(sw * ss)) * gg;
    }
  };
  index_t k = 0;
  for (; k + W <= r; k += W) {
    B x = rope_load<T, Arch>(in + k);
    simd::keep_in_register(x);  // one load for the shuffle and the FMA
    rope_store(out + k, step(x, simd::load<T, Arch>(c + k), simd::load<T, Arch>(s + k)));
  }
  if (k < r) rope_rotate_interleaved_tail<Inverse>(out, in, c, s, r, k, g);
}

/// The head rows of one token with that token's cos/sin row, when the rotated
/// part is NV whole vectors (per half for half-split, per row for interleaved):
/// the constructor loads the cos/sin vectors once and they stay in registers
/// for every head of every tensor of the token, so a head row costs its own
/// loads, FMAs and stores only. Same arithmetic as the one-row kernels.
template <rope_layout L, bool Inverse, class Arch, int NV, class T, class S = T>
struct rope_token_kernel {
  using B = simd::batch<T, Arch>;
  static constexpr index_t W = simd::width<T, Arch>;
  static constexpr index_t h = NV * W;  // half-split: pairs; interleaved: rotated components
  static constexpr index_t row_bytes = (L == rope_layout::half_split ? 2 * h : h) * static_cast<index_t>(sizeof(S));
  B cc[static_cast<std::size_t>(NV)], ss[static_cast<std::size_t>(NV)];
  B gg;

  /// c, s: the token's h cos and h sin values (one per pair). Interleaved
  /// expands them here, once per token: cc = [c0, c0, c1, c1, ...],
  /// ss = [-s0, s0, -s1, s1, ...].
  POSENC_ALWAYS_INLINE rope_token_kernel(T const* c, T const* s, T g) noexcept : gg(g) {
    if constexpr (L == rope_layout::half_split) {
      for (int j = 0; j < NV; ++j) {
        cc[j] = simd::load<T, Arch>(c + j * W);
        ss[j] = simd::load<T, Arch>(s + j * W);
      }
    } else {
      B const sign = simd::alternating_sign<T, Arch>();  // exact: only flips signs
      if constexpr (NV == 1) {
        // W / 2 values each: one vector [c, s], no load past either row.
        alignas(Arch::alignment()) T buf[static_cast<std::size_t>(W)];
        for (index_t k = 0; k < W / 2; ++k) {
          buf[k] = c[k];
          buf[W / 2 + k] = s[k];
        }
        B const v = B::load_aligned(buf);
        cc[0] = simd::duplicate_half<false>(v);
        ss[0] = simd::duplicate_half<true>(v) * sign;
      } else {
        static_assert(NV % 2 == 0, "rope_token_kernel: NV is 1 or even");
        for (int j = 0; j < NV; j += 2) {  // vector j / 2 of c and s gives vectors j and j + 1
          B const cv = simd::load<T, Arch>(c + j / 2 * W), sv = simd::load<T, Arch>(s + j / 2 * W);
          cc[j] = simd::duplicate_half<false>(cv);
          cc[j + 1] = simd::duplicate_half<true>(cv);
          ss[j] = simd::duplicate_half<false>(sv) * sign;
          ss[j + 1] = simd::duplicate_half<true>(sv) * sign;
        }
      }
    }
  }

  /// `heads` rows `in_stride` / `out_stride` apart; `pf` (elements): how far
  /// ahead of a row the next loads are prefetched (0: none).
  POSENC_ALWAYS_INLINE void operator()(S* out, index_t out_stride, S const* in, index_t in_stride, index_t heads,
                                       index_t pf) const noexcept {
    for (index_t hd = 0; hd < heads; ++hd, in += in_stride, out += out_stride) {
      if (pf != 0) prefetch_span(in + pf, row_bytes);
      if constexpr (L == rope_layout::half_split) {
        for (int j = 0; j < NV; ++j) {
          B const a = rope_load<T, Arch>(in + j * W), b = rope_load<T, Arch>(in + h + j * W);
          if constexpr (!Inverse) {
            rope_store(out + j * W, simd::fma(a, cc[j], -(b * ss[j])));
            rope_store(out + h + j * W, simd::fma(b, cc[j], a * ss[j]));
          } else {
            rope_store(out + j * W, simd::fma(a, cc[j], b * ss[j]) * gg);
            rope_store(out + h + j * W, simd::fma(b, cc[j], -(a * ss[j])) * gg);
          }
        }
      } else {
        for (int j = 0; j < NV; ++j) {
          B x = rope_load<T, Arch>(in + j * W);
          simd::keep_in_register(x);  // one load for the shuffle and the FMA
          B const sw = simd::swap_pairs(x);
          if constexpr (!Inverse)
            rope_store(out + j * W, simd::fma(x, cc[j], sw * ss[j]));
          else
            rope_store(out + j * W, simd::fma(x, cc[j], -(sw * ss[j])) * gg);
        }
      }
    }
  }
};

/// The expanded row of the any-size interleaved kernel, written to `out`
/// (2h values): C = [c0, c0, c1, c1, ...], S = [-s0, s0, -s1, s1, ...].
template <class T>
inline std::pair<T const*, T const*> rope_expand_interleaved(T const* c, T const* s, index_t h, T* out) noexcept {
  for (index_t k = 0; k < h; ++k) {
    out[2 * k] = out[2 * k + 1] = c[k];
    out[2 * h + 2 * k] = -s[k];
    out[2 * h + 2 * k + 1] = s[k];
  }
  return {out, out + 2 * h};
}

/// Every head row of one token with the one-row kernels (any rotary_dim, with tails).
template <rope_layout L, bool Inverse, class Arch, class T, class S>
void rope_rotate_heads_any(S* out, index_t out_stride, S const* in, index_t in_stride, index_t heads, T const* c,
                           T const* s, index_t r, T g, index_t pf) noexcept {
  for (index_t hd = 0; hd < heads; ++hd, in += in_stride, out += out_stride) {
    if (pf != 0) prefetch_span(in + pf, r * static_cast<index_t>(sizeof(S)));
    if constexpr (L == rope_layout::half_split)
      rope_rotate_half<Inverse, Arch>(out, in, c, s, r / 2, g);
    else
      rope_rotate_interleaved<Inverse, Arch>(out, in, c, s, r, g);
  }
}

/// Vectors per kernel row the register-resident kernel handles for rotary_dim
/// r (1, 2, 4 or 8), or 0: use rope_rotate_heads_any.
template <rope_layout L, class Arch, class T>
constexpr int rope_fixed_vectors(index_t r) noexcept {
  constexpr index_t W = simd::width<T, Arch>;
  index_t const n = L == rope_layout::half_split ? r / 2 : r;
  if (n % W != 0) return 0;
  index_t const v = n / W;
  return v == 1 || v == 2 || v == 4 || v == 8 ? static_cast<int>(v) : 0;
}

}  // namespace detail

/// Rotary position embedding (Su et al. 2021) for element type T (float or double).
///
/// Rotates the first `rotary_dim` components of every query/key head by
/// angles pos * theta'_k (docs/formulas.md 3), in the pair layout the checkpoint was
/// trained with; the remaining head_dim - rotary_dim components pass through.
/// A scaling rule gives theta'_k and an attention factor that multiplies cos
/// and sin.
///
/// The current length. Dynamic NTK and LongRoPE pick their frequencies from
/// the current sequence length L (HF: max(position_ids) + 1). posenc never
/// keeps it as hidden state: every call takes it (the overloads without it
/// use the largest position + 1). Keys already in a KV cache keep the
/// rotation they were given with the length of their own call; re-rotate them
/// with rotate_inverse(old length) + rotate(new length) to reproduce a full
/// prefill.
///
/// Threads and caching. rotate() is const and safe to call from many threads
/// at once. `reserve(n)` pre-builds the cos/sin rows of positions [0, n)
/// (call it before sharing the object: it is not safe during concurrent
/// rotate calls); without it, or for positions past the table or a length
/// that selects other frequencies, rows are computed per token in double.
///
/// 16-bit tensors. rope<float> also rotates Eigen::half and Eigen::bfloat16
/// views in place or into a copy: loaded and widened, rotated in float,
/// rounded once when stored (see "16-bit tensors" below).
///
/// @tparam T float or double (the compute and cos/sin type).
template <class T = float>
class rope {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "posenc::rope: T must be float or double; 16-bit tensors rotate with rope<float>");

 public:
  using value_type = T;

  /// @param layout pair layout of the checkpoint (required: no default).
  /// @param head_dim components per head.
  /// @param options rotary_dim (even, <= head_dim; default head_dim), base (> 1),
  ///        scaling, threads (>= 0). Everything is checked here.
  rope(rope_layout layout, index_t head_dim, rope_options const& options = {})
      : layout_(layout),
        head_dim_(head_dim),
        rotary_dim_(options.rotary_dim.value_or(head_dim)),
        base_(options.base),
        scaling_(options.scaling),
        threads_(options.threads) {
    char const* const where = "posenc::rope";
    detail::require(layout == rope_layout::half_split || layout == rope_layout::interleaved, where, "layout is ",
                    static_cast<int>(layout), ", expected rope_layout::half_split or rope_layout::interleaved");
    detail::require(head_dim > 0, where, "head_dim is ", head_dim, ", expected > 0");
    detail::require(rotary_dim_ > 0 && rotary_dim_ % 2 == 0, where, "rotary_dim is ", rotary_dim_,
                    ", expected an even number >= 2");
    detail::require(rotary_dim_ <= head_dim, where, "rotary_dim is ", rotary_dim_, ", expected <= head_dim (",
                    head_dim, ")");
    detail::require(std::isfinite(base_) && base_ > 1.0, where, "base is ", base_, ", expected a finite number > 1");
    detail::require(threads_ >= 0, where, "threads is ", threads_, ", expected >= 0 (0 = default)");
    detail::check_rope_scaling(where, scaling_, rotary_dim_);
    detail::check_rope_derived(where, scaling_, rotary_dim_, base_);
    fixed_ = compute_rope_frequencies(scaling_, rotary_dim_, base_, 0);
    detail::check_rope_frequencies(where, fixed_, 0);
    double theta_max = 0;
    for (double t : fixed_.inv_freq) theta_max = std::max(theta_max, t);
    if (scaling_.type == rope_scaling_type::longrope) {
      // Lengths never exceed max_positions() <= 2^53, so an L0 of index_t's maximum never selects long_factor.
      index_t const l0 = scaling_.original_max_position_embeddings;
      long_ = l0 < std::numeric_limits<index_t>::max() ? compute_rope_frequencies(scaling_, rotary_dim_, base_, l0 + 1)
                                                       : fixed_;
      detail::check_rope_frequencies(where, long_, l0 < std::numeric_limits<index_t>::max() ? l0 + 1 : l0);
      for (double t : long_.inv_freq) theta_max = std::max(theta_max, t);
    }
    // Positions p < 2^53 with every angle p * theta'_k < 2^53 (theta_max < 2^53 is checked above).
    position_limit_ = theta_max <= 1.0 ? static_cast<index_t>(detail::rope_max_angle)
                                       : static_cast<index_t>(std::floor(detail::rope_max_angle / theta_max));
    // Dynamic NTK: theta'_k falls as the length grows, so the longest accepted length is the extreme.
    if (scaling_.type == rope_scaling_type::dynamic)
      detail::check_rope_frequencies(where, compute_rope_frequencies(scaling_, rotary_dim_, base_, position_limit_),
                                     position_limit_);
    // cos and sin carry a (rounded to T) and the inverse rotation multiplies by 1 / a^2 in T.
    double const a = fixed_.attention_factor, a_min = std::sqrt(static_cast<double>(std::numeric_limits<T>::min()));
    detail::require(a >= a_min && a <= 1.0 / a_min, where, "attention factor is ", a, ", expected ", a_min, " .. ",
                    1.0 / a_min, " (a^2 and 1 / a^2 must be normal ", std::is_same_v<T, float> ? "float" : "double",
                    " values)");
    // Every parameter is fixed from here on (set_threads and reserve change no value).
    identity_ = encoder_identity("rope");
    identity_.add("type", detail::element_name<T>());
    identity_.add("layout", layout_ == rope_layout::half_split ? "half_split" : "interleaved");
    identity_.add("head_dim", head_dim_).add("rotary_dim", rotary_dim_).add("base", base_);
    identity_.add("scaling", scaling_.identity()).add("attention_factor", fixed_.attention_factor);
  }

  /// From Hugging Face style parameters (see rope_options_from_hf for the keys and defaults).
  rope(rope_layout layout, index_t head_dim, hf_rope_params const& params, int threads = 1)
      : rope(layout, head_dim, with_threads(rope_options_from_hf(params, head_dim), threads)) {}

  rope_layout layout() const noexcept { return layout_; }
  index_t head_dim() const noexcept { return head_dim_; }
  index_t rotary_dim() const noexcept { return rotary_dim_; }
  double base() const noexcept { return base_; }
  rope_scaling const& scaling() const noexcept { return scaling_; }
  int threads() const noexcept { return threads_; }
  /// Threads of one call (0 = OpenMP default, 1 = serial).
  void set_threads(int threads) {
    detail::require(threads >= 0, "posenc::rope::set_threads", "threads is ", threads, ", expected >= 0");
    threads_ = threads;
  }
  /// Element type, layout, head_dim, rotary_dim, base, the scaling with each
  /// of its parameters, and the attention factor; computed at construction
  /// (a copy per call costs no hashing). Threads and reserve() are not part
  /// of it: they change no value.
  encoder_identity const& identity() const noexcept { return identity_; }

  /// The identity of rotations with the caller's cos/sin `cache` (which
  /// replace base, scaling and attention factor): element type, layout,
  /// head_dim, rotary_dim, the cache's form and extents and a digest of its
  /// cos and sin values, read when called. Throws posenc::error when the
  /// cache does not fit this rope.
  encoder_identity identity(rope_cache<T> const& cache) const {
    char const* const where = "posenc::rope::identity";
    detail::require(cache.width == rotary_dim_ / 2, where, "cache.width is ", cache.width, ", expected ",
                    rotary_dim_ / 2, " (rotary_dim / 2)");
    detail::require(cache.rows >= 0, where, "cache.rows is ", cache.rows, ", expected >= 0");
    encoder_identity id("rope");
    id.add("type", detail::element_name<T>());
    id.add("layout", layout_ == rope_layout::half_split ? "half_split" : "interleaved");
    id.add("head_dim", head_dim_).add("rotary_dim", rotary_dim_);
    id.add("cache", cache.is_per_token ? "per_token" : "by_position");
    if (cache.is_per_token) id.add("cache.batch", cache.batch).add("cache.seq", cache.seq);
    id.add_table("cos", cache.cos, cache.rows, cache.width, cache.width);
    return id.add_table("sin", cache.sin, cache.rows, cache.width, cache.width);
  }

  /// Largest accepted position + 1: 2^53 when every theta'_k <= 1, else
  /// floor(2^53 / max theta'_k), so that positions are exact in double and every
  /// angle stays below 2^53, where cos/sin keep their error bound
  /// (docs/encoders/rope.md "Accuracy and range"). Larger positions and lengths are errors.
  index_t max_positions() const noexcept { return position_limit_; }

  /// theta'_k (k < rotary_dim / 2) and the attention factor at current length `length`.
  rope_frequencies frequencies(index_t length) const {
    rope_frequencies storage;
    return frequencies_into(length, storage);
  }

  /// The cos and sin (rotary_dim / 2 values each, attention factor applied,
  /// rounded to T) that rotate a token at `position` when the current length is `length`.
  void cos_sin(index_t position, index_t length, T* cos, T* sin) const {
    char const* const where = "posenc::rope::cos_sin";
    detail::require(position >= 0 && position < position_limit_, where, "position is ", position, ", expected 0 .. ",
                    position_limit_ - 1, " (max_positions() - 1)");
    detail::require(length > position && length <= position_limit_, where, "length is ", length, ", expected ",
                    position, " < length <= ", position_limit_, " (position < length <= max_positions())");
    rope_frequencies storage;
    auto const& f = frequencies_into(length, storage);
    for (index_t k = 0; k < rotary_dim_ / 2; ++k) {
      double c = 0, s = 0;
      rope_angle_cos_sin(position, f.inv_freq[static_cast<std::size_t>(k)], f.inv_freq_lo[static_cast<std::size_t>(k)],
                         c, s);
      cos[k] = static_cast<T>(f.attention_factor * c);
      sin[k] = static_cast<T>(f.attention_factor * s);
    }
  }

  /// Pre-builds the cos/sin rows of positions [0, positions) for calls whose
  /// frequencies equal those at `length` (default: positions). Not safe during
  /// concurrent rotate calls; rotate itself only reads the table.
  void reserve(index_t positions) { reserve(positions, positions); }
  void reserve(index_t positions, index_t length) {
    char const* const where = "posenc::rope::reserve";
    detail::require(positions >= 0 && positions <= position_limit_, where, "positions is ", positions, ", expected 0 .. ",
                    position_limit_, " (max_positions())");
    detail::require(length >= positions && length <= position_limit_, where, "length is ", length, ", expected ",
                    positions, " .. ", position_limit_, " (positions .. max_positions())");
    index_t const rl = row_len();
    index_t values = 0, bytes = 0;
    detail::require(detail::overflow_free<'*'>(positions, rl, values) &&
                        detail::overflow_free<'*'>(values, static_cast<index_t>(sizeof(T)), bytes),
                    where, "positions is ", positions, ", expected <= ",
                    std::numeric_limits<index_t>::max() / rl / static_cast<index_t>(sizeof(T)),
                    " (the table holds positions * rotary_dim values of ", sizeof(T), " bytes in an index_t)");
    rope_frequencies f = frequencies(length);
    aligned_buffer<T> table(values);
    T* const t = table.data();
    parallel_for((positions + 255) / 256, threads_, [&](index_t blk) {
      index_t const p1 = std::min(positions, (blk + 1) * 256);
      for (index_t p = blk * 256; p < p1; ++p) compute_row(p, f, t + p * rl);
    });
    table_ = std::move(table);
    table_rows_ = positions;
    table_freqs_ = std::move(f);
  }
  /// Positions covered by the reserved table.
  index_t reserved() const noexcept { return table_rows_; }
  /// True when a call at current length `length` finds every position
  /// < length in the reserved table (no trigonometry in rotate). Fused
  /// attention then rotates queries and key tiles inside its tiles instead of
  /// rotating copies of q and k first.
  bool reserved_for(index_t length) const {
    if (table_rows_ <= 0 || length > table_rows_) return false;
    rope_frequencies storage;
    return frequencies_into(length, storage) == table_freqs_;
  }

  // --- rotation with computed angles ------------------------------------

  /// In place on x (batch, seq, head, dim), dim contiguous, any other strides.
  /// `length`: the current sequence length (>= largest position + 1); it
  /// selects the frequencies of dynamic NTK and LongRoPE. This is the hook the
  /// attention kernels call.
  void rotate(view<T> x, position_span pos, index_t length) const {
    run<T>("posenc::rope::rotate", x, x, nullptr, pos, &length, false);
  }
  /// In place, length = largest position + 1.
  void rotate(view<T> x, position_span pos) const { run<T>("posenc::rope::rotate", x, x, nullptr, pos, nullptr, false); }

  /// Out of place: out = rotate(in); the pass-through tail is copied. `out`
  /// must have in's shape and may be `in` itself, but not partially overlap it.
  void rotate_copy(view<const T> in, view<T> out, position_span pos, index_t length) const {
    run<T>("posenc::rope::rotate_copy", in, out, nullptr, pos, &length, false);
  }
  void rotate_copy(view<const T> in, view<T> out, position_span pos) const {
    run<T>("posenc::rope::rotate_copy", in, out, nullptr, pos, nullptr, false);
  }

  /// Queries and keys in one call (same batch, seq and positions; head counts may differ, as in GQA).
  void rotate_qk(view<T> q, view<T> k, position_span pos, index_t length) const {
    run_qk<T>("posenc::rope::rotate_qk", q, k, pos, &length);
  }
  void rotate_qk(view<T> q, view<T> k, position_span pos) const {
    run_qk<T>("posenc::rope::rotate_qk", q, k, pos, nullptr);
  }

  /// Un-rotates (angle -phi, divided by a^2 where a is the attention factor):
  /// rotate_inverse(rotate(x)) == x up to rounding. Used to re-rotate cached
  /// keys under a new length, and for gradients (the transpose of rotate is
  /// a^2 * rotate_inverse; a = 1 except for YaRN and LongRoPE). With a caller
  /// cache it applies the transpose (angle -phi, values as given), the inverse
  /// when cos^2 + sin^2 = 1.
  void rotate_inverse(view<T> x, position_span pos, index_t length) const {
    run<T>("posenc::rope::rotate_inverse", x, x, nullptr, pos, &length, true);
  }
  void rotate_inverse(view<T> x, position_span pos) const {
    run<T>("posenc::rope::rotate_inverse", x, x, nullptr, pos, nullptr, true);
  }

  /// The transposed rotation, in place: x = R(pos)^T x (angle -phi, times a^2
  /// relative to rotate_inverse, where a is the attention factor). It maps the
  /// gradient of a rotated vector to the gradient of the vector before the
  /// rotation: the backward hook of rotate (posenc/encoding/traits.hpp).
  /// Frequencies are not trained. Same arguments and checks as rotate.
  void rotate_transpose(view<T> x, position_span pos, index_t length) const {
    run<T>("posenc::rope::rotate_transpose", x, x, nullptr, pos, &length, true, false, true);
  }
  void rotate_transpose(view<T> x, position_span pos) const {
    run<T>("posenc::rope::rotate_transpose", x, x, nullptr, pos, nullptr, true, false, true);
  }

  // --- rotation with caller-supplied cos/sin ----------------------------

  /// In place with a cache indexed by position id (rows must exceed the largest id).
  void rotate(view<T> x, position_span pos, rope_cache<T> const& cache) const {
    run<T>("posenc::rope::rotate", x, x, &cache, pos, nullptr, false);
  }
  /// In place with a per-token cache (batch, seq, rotary_dim / 2).
  void rotate(view<T> x, rope_cache<T> const& cache) const {
    run<T>("posenc::rope::rotate", x, x, &cache, position_span(0), nullptr, false, true);
  }
  void rotate_copy(view<const T> in, view<T> out, position_span pos, rope_cache<T> const& cache) const {
    run<T>("posenc::rope::rotate_copy", in, out, &cache, pos, nullptr, false);
  }
  void rotate_copy(view<const T> in, view<T> out, rope_cache<T> const& cache) const {
    run<T>("posenc::rope::rotate_copy", in, out, &cache, position_span(0), nullptr, false, true);
  }
  void rotate_inverse(view<T> x, position_span pos, rope_cache<T> const& cache) const {
    run<T>("posenc::rope::rotate_inverse", x, x, &cache, pos, nullptr, true);
  }
  void rotate_inverse(view<T> x, rope_cache<T> const& cache) const {
    run<T>("posenc::rope::rotate_inverse", x, x, &cache, position_span(0), nullptr, true, true);
  }
  /// The transposed rotation with a caller cache (values as given): the
  /// gradient of the input of rotate(x, pos, cache) from that of its output.
  void rotate_transpose(view<T> x, position_span pos, rope_cache<T> const& cache) const {
    run<T>("posenc::rope::rotate_transpose", x, x, &cache, pos, nullptr, true, false, true);
  }
  /// The transposed rotation with a per-token cache (batch, seq, rotary_dim / 2).
  void rotate_transpose(view<T> x, rope_cache<T> const& cache) const {
    run<T>("posenc::rope::rotate_transpose", x, x, &cache, position_span(0), nullptr, true, true, true);
  }

  // --- 16-bit tensors (Eigen::half, Eigen::bfloat16) -------------------

  /// The rotations above on 16-bit tensors, rope<float> only (S: Eigen::half
  /// or Eigen::bfloat16). Each element is widened exactly, rotated in float
  /// by the same kernels with the same cos/sin rows (reserved table or
  /// computed, every scaling, threads) as a float tensor, and rounded once to
  /// nearest even: the result is the float rotation of the widened input,
  /// narrowed (docs/encoders/rope.md "16-bit tensors"). Same arguments and checks.
  template <class S, std::enable_if_t<is_half_storage_v<S> && !std::is_const_v<S>, int> = 0>
  void rotate(view<S> x, position_span pos, index_t length) const {
    if constexpr (check_half<S>()) run<S>("posenc::rope::rotate", x, x, nullptr, pos, &length, false);
  }
  template <class S, std::enable_if_t<is_half_storage_v<S> && !std::is_const_v<S>, int> = 0>
  void rotate(view<S> x, position_span pos) const {
    if constexpr (check_half<S>()) run<S>("posenc::rope::rotate", x, x, nullptr, pos, nullptr, false);
  }
  /// Out of place, 16-bit in and out (`in` may be const); the pass-through tail is copied bit for bit.
  template <class In, class S,
            std::enable_if_t<is_half_storage_v<S> && std::is_same_v<std::remove_const_t<In>, S>, int> = 0>
  void rotate_copy(view<In> in, view<S> out, position_span pos, index_t length) const {
    if constexpr (check_half<S>())
      run<S>("posenc::rope::rotate_copy", view<const S>(in), out, nullptr, pos, &length, false);
  }
  template <class In, class S,
            std::enable_if_t<is_half_storage_v<S> && std::is_same_v<std::remove_const_t<In>, S>, int> = 0>
  void rotate_copy(view<In> in, view<S> out, position_span pos) const {
    if constexpr (check_half<S>())
      run<S>("posenc::rope::rotate_copy", view<const S>(in), out, nullptr, pos, nullptr, false);
  }
  /// 16-bit queries and keys in one call (same batch, seq and positions).
  template <class S, std::enable_if_t<is_half_storage_v<S> && !std::is_const_v<S>, int> = 0>
  void rotate_qk(view<S> q, view<S> k, position_span pos, index_t length) const {
    if constexpr (check_half<S>()) run_qk<S>("posenc::rope::rotate_qk", q, k, pos, &length);
  }
  template <class S, std::enable_if_t<is_half_storage_v<S> && !std::is_const_v<S>, int> = 0>
  void rotate_qk(view<S> q, view<S> k, position_span pos) const {
    if constexpr (check_half<S>()) run_qk<S>("posenc::rope::rotate_qk", q, k, pos, nullptr);
  }
  template <class S, std::enable_if_t<is_half_storage_v<S> && !std::is_const_v<S>, int> = 0>
  void rotate_inverse(view<S> x, position_span pos, index_t length) const {
    if constexpr (check_half<S>()) run<S>("posenc::rope::rotate_inverse", x, x, nullptr, pos, &length, true);
  }
  template <class S, std::enable_if_t<is_half_storage_v<S> && !std::is_const_v<S>, int> = 0>
  void rotate_inverse(view<S> x, position_span pos) const {
    if constexpr (check_half<S>()) run<S>("posenc::rope::rotate_inverse", x, x, nullptr, pos, nullptr, true);
  }
  template <class S, std::enable_if_t<is_half_storage_v<S> && !std::is_const_v<S>, int> = 0>
  void rotate_transpose(view<S> x, position_span pos, index_t length) const {
    if constexpr (check_half<S>())
      run<S>("posenc::rope::rotate_transpose", x, x, nullptr, pos, &length, true, false, true);
  }
  template <class S, std::enable_if_t<is_half_storage_v<S> && !std::is_const_v<S>, int> = 0>
  void rotate_transpose(view<S> x, position_span pos) const {
    if constexpr (check_half<S>())
      run<S>("posenc::rope::rotate_transpose", x, x, nullptr, pos, nullptr, true, false, true);
  }
  /// In place with a float caller cache, by position id or per token.
  template <class S, std::enable_if_t<is_half_storage_v<S> && !std::is_const_v<S>, int> = 0>
  void rotate(view<S> x, position_span pos, rope_cache<T> const& cache) const {
    if constexpr (check_half<S>()) run<S>("posenc::rope::rotate", x, x, &cache, pos, nullptr, false);
  }
  template <class S, std::enable_if_t<is_half_storage_v<S> && !std::is_const_v<S>, int> = 0>
  void rotate(view<S> x, rope_cache<T> const& cache) const {
    if constexpr (check_half<S>())
      run<S>("posenc::rope::rotate", x, x, &cache, position_span(0), nullptr, false, true);
  }

 private:
  /// 16-bit tensors compute in float: the compile-time sentence for rope<double>
  /// (and false there, so that nothing else is instantiated to add errors).
  template <class S>
  static constexpr bool check_half() noexcept {
    static_assert(std::is_same_v<T, float> && is_half_storage_v<S>,
                  "posenc::rope: 16-bit tensors (Eigen::half, Eigen::bfloat16) rotate with rope<float>: compute is "
                  "float");
    return std::is_same_v<T, float>;
  }

  /// One tensor of a call: read from `in`, written to `out` (the same view in place).
  template <class S>
  struct io {
    view<const S> in;
    view<S> out;
  };

  static rope_options with_threads(rope_options o, int threads) {
    o.threads = threads;
    return o;
  }

  index_t row_len() const noexcept { return rotary_dim_; }

  rope_frequencies const& frequencies_into(index_t length, rope_frequencies& storage) const {
    if (scaling_.type == rope_scaling_type::dynamic && length > scaling_.max_position_embeddings) {
      storage = compute_rope_frequencies(scaling_, rotary_dim_, base_, length);
      return storage;
    }
    if (scaling_.type == rope_scaling_type::longrope && length > scaling_.original_max_position_embeddings)
      return long_;
    return fixed_;
  }

  /// Row of position p, both layouts: [c (h), s (h)], one value per pair
  /// (the interleaved kernels expand it per token; the table stays r values
  /// per position either way).
  void compute_row(index_t p, rope_frequencies const& f, T* row) const noexcept {
    index_t const h = rotary_dim_ / 2;
    for (index_t k = 0; k < h; ++k) {
      double c = 0, s = 0;
      rope_angle_cos_sin(p, f.inv_freq[static_cast<std::size_t>(k)], f.inv_freq_lo[static_cast<std::size_t>(k)], c, s);
      row[k] = static_cast<T>(f.attention_factor * c);
      row[h + k] = static_cast<T>(f.attention_factor * s);
    }
  }

  /// (c, s) pointers of a row.
  std::pair<T const*, T const*> split(T const* row) const noexcept { return {row, row + rotary_dim_ / 2}; }

  /// (c, s) pointers of a caller cache row: used as they are.
  static std::pair<T const*, T const*> cache_row(rope_cache<T> const& c, index_t row) noexcept {
    return {c.cos + row * c.width, c.sin + row * c.width};
  }

  template <class S>
  void check_x(char const* where, char const* name, view<const S> const& v) const {
    detail::check_view(where, name, v);
    detail::require(v.dim == head_dim_, where, name, ".dim is ", v.dim, ", expected ", head_dim_, " (rope head_dim)");
  }

  void check_cache(char const* where, rope_cache<T> const& c, position_span const& pos, index_t batch, index_t seq,
                   bool by_position) const {
    detail::require(c.width == rotary_dim_ / 2, where, "cache.width is ", c.width, ", expected ", rotary_dim_ / 2,
                    " (rotary_dim / 2)");
    detail::require(c.rows >= 0, where, "cache.rows is ", c.rows, ", expected >= 0");
    index_t values = 0;
    detail::require(detail::overflow_free<'*'>(c.rows, c.width, values), where, "cache.rows is ", c.rows, ", expected <= ",
                    std::numeric_limits<index_t>::max() / std::max<index_t>(c.width, 1),
                    " (rows * width values must fit in index_t)");
    detail::require((c.cos != nullptr && c.sin != nullptr) || values == 0, where,
                    "cache.cos or cache.sin is null, expected ", values, " values each");
    if (by_position) {
      detail::require(!c.is_per_token, where,
                      "cache is per token, expected a cache by position (call the overload without positions)");
      index_t const m = pos.max_position(batch, seq);
      detail::require(m < c.rows, where, "cache.rows is ", c.rows, ", expected > ", m, " (the largest position id)");
    } else {
      detail::require(c.is_per_token, where,
                      "cache is by position, expected a per-token cache (or pass the position ids)");
      detail::require(c.batch == batch && c.seq == seq, where, "cache is (", c.batch, ", ", c.seq,
                      ") tokens, expected (", batch, ", ", seq, ") (x.batch, x.seq)");
    }
  }

  /// Positions in [0, max_positions()) without overflow (an offset form is
  /// checked through its first token: the others follow it by < seq), then the length.
  void check_positions(char const* where, position_span const& pos, index_t batch, index_t seq,
                       index_t const* length) const {
    pos.validate(where, "pos", batch, seq);
    index_t const lim = position_limit_;
    if (seq > 0) {
      if (pos.is_explicit()) {
        index_t const rows = pos.max_position(batch, seq) < lim ? 0 : batch;  // find the culprit only on failure
        for (index_t b = 0; b < rows; ++b)
          for (index_t s = 0; s < seq; ++s) {
            index_t const p = pos.at(b, s);
            detail::require(p < lim, where, "pos position of batch ", b, " token ", s, " is ", p, ", expected < ", lim,
                            " (max_positions(): larger positions lose the cos/sin accuracy bound)");
          }
      } else {
        for (index_t b = 0; b < batch; ++b) {
          index_t const p = pos.at(b, 0);
          detail::require(seq <= lim && p <= lim - seq, where, "pos position of batch ", b, " token 0 is ", p,
                          ", expected <= ", lim - std::min(seq, lim), " (its token ", seq - 1, " must be < ", lim,
                          ", max_positions(): larger positions lose the cos/sin accuracy bound)");
        }
      }
    }
    if (length) {
      index_t const m = pos.max_position(batch, seq);  // < lim: no overflow below
      detail::require(*length > m && *length <= lim, where, "length is ", *length, ", expected ", m + 1, " .. ", lim,
                      " (largest position + 1 .. max_positions())");
    }
  }

  /// `per_token_call`: the overload without positions (a per-token cache is expected).
  /// `transpose` (with `inverse`): R^T, the inverse without its division by a^2.
  template <class S>
  void run(char const* where, view<const S> in, view<S> out, rope_cache<T> const* cache, position_span pos,
           index_t const* length, bool inverse, bool per_token_call = false, bool transpose = false) const {
    bool const copy = static_cast<void const*>(in.data) != static_cast<void const*>(out.data);
    check_x<S>(where, copy ? "in" : "x", in);
    if (copy) {
      check_x<S>(where, "out", out);
      detail::check_equal(where, "out.batch", out.batch, in.batch, "in.batch");
      detail::check_equal(where, "out.seq", out.seq, in.seq, "in.seq");
      detail::check_equal(where, "out.heads", out.heads, in.heads, "in.heads");
    }
    io<S> const ios[1] = {{in, out}};
    dispatch(where, ios, 1, cache, per_token_call, pos, length, inverse, transpose);
  }

  template <class S>
  void run_qk(char const* where, view<S> q, view<S> k, position_span pos, index_t const* length) const {
    check_x<S>(where, "q", q);
    check_x<S>(where, "k", k);
    detail::check_equal(where, "k.batch", k.batch, q.batch, "q.batch");
    detail::check_equal(where, "k.seq", k.seq, q.seq, "q.seq");
    io<S> const ios[2] = {{q, q}, {k, k}};
    dispatch(where, ios, 2, nullptr, false, pos, length, false);
  }

  template <class S>
  void dispatch(char const* where, io<S> const* ios, int n_io, rope_cache<T> const* cache, bool per_token,
                position_span pos, index_t const* length, bool inverse, bool transpose = false) const {
    index_t const batch = ios[0].in.batch, seq = ios[0].in.seq;
    if (!per_token) check_positions(where, pos, batch, seq, length);
    if (cache) check_cache(where, *cache, pos, batch, seq, !per_token);
    // Everything is checked: nothing below throws except allocation of the per-thread scratch.
    if (batch == 0 || seq == 0) return;

    if (cache) {
      rope_cache<T> const c = *cache;
      if (per_token) {
        run_rows(ios, n_io, batch, seq, inverse, T(1),
                 [&](index_t b, index_t s, T*) noexcept { return cache_row(c, b * seq + s); });
      } else {
        run_rows(ios, n_io, batch, seq, inverse, T(1),
                 [&](index_t b, index_t s, T*) noexcept { return cache_row(c, pos.at(b, s)); });
      }
      return;
    }
    index_t const len = length ? *length : pos.max_position(batch, seq) + 1;
    rope_frequencies storage;
    rope_frequencies const& f = frequencies_into(len, storage);
    index_t const table_rows = (table_rows_ > 0 && f == table_freqs_) ? table_rows_ : 0;
    T const* const table = table_.data();
    index_t const rl = row_len();
    // The inverse divides by a^2: the rows carry the attention factor a. The
    // transpose does not.
    T const g = transpose ? T(1) : static_cast<T>(1.0 / (f.attention_factor * f.attention_factor));
    run_rows(ios, n_io, batch, seq, inverse, g, [&](index_t b, index_t s, T* scr) noexcept {
      index_t const p = pos.at(b, s);
      if (p < table_rows) return split(table + p * rl);
      compute_row(p, f, scr);
      return split(scr);
    });
  }

  template <class S, class RowFn>
  void run_rows(io<S> const* ios, int n_io, index_t batch, index_t seq, bool inverse, T g, RowFn const& row_of) const {
    if (layout_ == rope_layout::half_split) {
      if (inverse)
        run_layout<rope_layout::half_split, true>(ios, n_io, batch, seq, g, row_of);
      else
        run_layout<rope_layout::half_split, false>(ios, n_io, batch, seq, g, row_of);
    } else {
      if (inverse)
        run_layout<rope_layout::interleaved, true>(ios, n_io, batch, seq, g, row_of);
      else
        run_layout<rope_layout::interleaved, false>(ios, n_io, batch, seq, g, row_of);
    }
  }

  /// Picks the kernel for rotary_dim once per call (see run_layout_nv).
  template <rope_layout L, bool Inverse, class S, class RowFn>
  void run_layout(io<S> const* ios, int n_io, index_t batch, index_t seq, T g, RowFn const& row_of) const {
    using A = simd::default_arch;
    switch (detail::rope_fixed_vectors<L, A, T>(rotary_dim_)) {
      case 1: return run_layout_nv<L, Inverse, 1>(ios, n_io, batch, seq, g, row_of);
      case 2: return run_layout_nv<L, Inverse, 2>(ios, n_io, batch, seq, g, row_of);
      case 4: return run_layout_nv<L, Inverse, 4>(ios, n_io, batch, seq, g, row_of);
      case 8: return run_layout_nv<L, Inverse, 8>(ios, n_io, batch, seq, g, row_of);
      default: return run_layout_nv<L, Inverse, 0>(ios, n_io, batch, seq, g, row_of);
    }
  }

  /// Tasks of `block` consecutive tokens of one batch entry; each token gets
  /// its cos/sin row once and rotates every head of every io with it. NV: the
  /// register-resident kernel with NV vectors per row, 0: the any-size kernel.
  template <rope_layout L, bool Inverse, int NV, class S, class RowFn>
  void run_layout_nv(io<S> const* ios, int n_io, index_t batch, index_t seq, T g, RowFn const& row_of) const {
    using A = simd::default_arch;
    constexpr index_t block = 16;
    index_t const nblk = seq / block + (seq % block != 0 ? 1 : 0);
    int const t = loop_threads(threads_);
    // Per thread: a computed row (r values) and, for the any-size interleaved
    // kernel, its expanded form (2r); whole cache lines.
    constexpr bool expand = L == rope_layout::interleaved && NV == 0;
    index_t const scr_len = ((expand ? 3 : 1) * rotary_dim_ + 15) / 16 * 16;
    // Small calls (a key tile inside fused attention) keep the scratch on the stack.
    alignas(64) T local[256];
    aligned_buffer<T> heap;
    T* scratch = local;
    if (t * scr_len > 256) {
      heap = aligned_buffer<T>::uninitialized(static_cast<index_t>(t) * scr_len);
      scratch = heap.data();
    }
    index_t const r = rotary_dim_, d = head_dim_;
    // Prefetch distance in head rows: at least prefetch_rows, and at least
    // prefetch_bytes of rotated data.
    index_t const ahead = std::max<index_t>(prefetch_rows, prefetch_bytes / (r * static_cast<index_t>(sizeof(S))));
    parallel_for(batch * nblk, t, [&](index_t task) noexcept {
      index_t const b = task / nblk;
      index_t const s0 = (task % nblk) * block, s1 = std::min(seq, s0 + block);
      T* const scr = scratch + (t > 1 ? thread_index() : 0) * scr_len;
      for (index_t s = s0; s < s1; ++s) {
        auto cs = row_of(b, s, scr);
        if constexpr (expand) cs = detail::rope_expand_interleaved(cs.first, cs.second, r / 2, scr + r);
        [[maybe_unused]] auto const kernel = [&] {
          if constexpr (NV > 0)
            return detail::rope_token_kernel<L, Inverse, A, NV, T, S>(cs.first, cs.second, g);
          else
            return 0;
        }();
        for (int i = 0; i < n_io; ++i) {
          io<S> const& v = ios[i];
          // A head row is only r * sizeof(T) bytes; prefetch the rows a few
          // KiB ahead (the next heads, or the next token's) so their loads overlap.
          index_t const pf = ahead * v.in.head_stride;
          S const* src = v.in.ptr(b, s, 0);
          S* dst = v.out.ptr(b, s, 0);
          if constexpr (NV > 0)
            kernel(dst, v.out.head_stride, src, v.in.head_stride, v.in.heads, pf);
          else
            detail::rope_rotate_heads_any<L, Inverse, A>(dst, v.out.head_stride, src, v.in.head_stride, v.in.heads,
                                                         cs.first, cs.second, r, g, pf);
          if (dst != src && d > r)
            for (index_t hd = 0; hd < v.in.heads; ++hd)
              std::memcpy(dst + hd * v.out.head_stride + r, src + hd * v.in.head_stride + r,
                          static_cast<std::size_t>(d - r) * sizeof(S));
        }
      }
    });
  }

  /// How far ahead the kernels prefetch: max(prefetch_rows head rows,
  /// prefetch_bytes of rotated data) (measured best on the bench shapes).
  static constexpr index_t prefetch_rows = 4;
  static constexpr index_t prefetch_bytes = 2048;

  rope_layout layout_;
  index_t head_dim_;
  index_t rotary_dim_;
  double base_;
  rope_scaling scaling_;
  int threads_;
  rope_frequencies fixed_;  // every length for fixed scalings; L <= M (dynamic), L <= L0 (longrope)
  rope_frequencies long_;   // longrope, L > L0
  index_t position_limit_ = 0;  // max_positions()
  aligned_buffer<T> table_;
  index_t table_rows_ = 0;
  rope_frequencies table_freqs_;
  encoder_identity identity_;  // identity(): fixed at construction
};

template <class T>
struct encoder_traits<rope<T>> {
  static constexpr bool adds_to_embeddings = false, rotates_queries_keys = true;
  static constexpr bool biases_scores = false, relative_key_value = false;
  // q(p) . k(p') depends on p - p' only (for dynamic NTK and LongRoPE at a fixed length).
  static constexpr bool is_relative = true;
};

}  // namespace posenc
