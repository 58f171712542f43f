// SPDX-License-Identifier: MIT
// attention_options<T>, path tags and mask views: what every attention path accepts.
#pragma once

#include <cstddef>
#include <optional>
#include <type_traits>
#include <utility>

#include "posenc/core/checked.hpp"
#include "posenc/core/positions.hpp"
#include "posenc/core/span.hpp"

namespace posenc {

/// Path tags: the scalar double-accumulating oracle, the Eigen path that
/// materializes the scores, and the tiled online-softmax SIMD path.
namespace path {
struct reference {};
struct materialized {};
struct fused {};
/// The fastest path: the fused one (only it is compiled for the call). The
/// scores output, which the fused path does not produce, is asked of
/// path::materialized or path::reference by name.
struct best {};
}  // namespace path

/// Stage at which `attention_options::scores` is captured.
enum class score_stage {
  raw,            ///< scale * q.k (plus Shaw's q.aK term)
  softcapped,     ///< after the logit softcap
  biased,         ///< after softcap, encoder bias and masks (may hold -inf)
  probabilities,  ///< after the softmax (rows with no visible key are zeros)
};

/// Precision of the two products of the attention, q.k and p v.
/// `bfloat16` is an opt-in speed mode of path::fused (and path::best when it
/// runs the fused path) with float tensors: q (after rotation), k, v and the
/// unnormalised probabilities p are rounded to bfloat16 (to nearest even) and
/// multiplied pairwise, accumulated in float (AVX-512 BF16 `vdpbf16ps` where
/// compiled in, else emulated with the same rounding). Softmax, masks, biases,
/// softcap and the output stay float. Each rounding has a relative error of
/// at most u = 2^-8; docs/attention.md ("bfloat16 products") states the bound
/// on the output. Prefill rows (the lane kernel) use it; the row kernel
/// (decode, few rows, Shaw) and the paged call compute in float.
///
/// The bfloat16 mode is its own instantiation of the lane kernel. It is compiled
/// only where POSENC_BF16_PRODUCTS is defined to 1 (the same value in every
/// translation unit of a program): without it a float call of path::fused
/// compiles about a third faster, and `bfloat16` is rejected with an error
/// naming the macro, before any output is written.
#ifndef POSENC_BF16_PRODUCTS
#define POSENC_BF16_PRODUCTS 0
#endif
enum class product_precision {
  float32,   ///< float products (the default; every path)
  bfloat16,  ///< bfloat16 inputs, float accumulation (path::fused / path::best, float only)
};

/// A mask over (batch, head, q, k), broadcast along any dim given size 1
/// (stride ignored there). The key dim is contiguous. A key extent shorter
/// than the number of keys masks the keys past it (ONNX opset 24).
/// `T` is the float type (additive: 0 keeps, -inf drops) or `bool` (true = attend);
/// an additive mask stored in 16 bits (`Eigen::half`, `Eigen::bfloat16`) is
/// given to posenc::attention beside the options (see attention.hpp).
template <class T>
struct mask_view {
  T const* data = nullptr;
  index_t batch = 0, heads = 0, q = 0, k = 0;
  index_t batch_stride = 0, head_stride = 0, q_stride = 0;

  /// No mask: a default-constructed mask_view (null data, every extent 0).
  /// Validation rejects a null data pointer with elements to read; a null
  /// mask with extents but no elements (key extent 0) masks every key.
  bool empty() const noexcept { return data == nullptr && batch == 0 && heads == 0 && q == 0 && k == 0; }
  /// Pointer to the key row of (b, h, i); broadcast dims read index 0.
  T const* row(index_t b, index_t h, index_t i) const noexcept {
    return data + (batch == 1 ? 0 : b) * batch_stride + (heads == 1 ? 0 : h) * head_stride +
           (q == 1 ? 0 : i) * q_stride;
  }
};

/// Mask view over a contiguous (batch, heads, q, k) buffer; any of batch,
/// heads, q may be 1 to broadcast.
template <class T>
mask_view<T> make_mask(T const* data, index_t batch, index_t heads, index_t q, index_t k) noexcept {
  using detail::wrapping_mul;  // huge extents wrap here; the attention checks reject them
  return {data, batch, heads, q, k, wrapping_mul(wrapping_mul(heads, q), k), wrapping_mul(q, k), k};
}

/// Mask view over the first `k` keys of (batch, heads, q) rows of `row_stride`
/// elements each, laid one after another: a mask over a prefix of longer rows
/// (row_stride = k gives make_mask(data, batch, heads, q, k)).
/// @throws posenc::error unless row_stride >= k.
template <class T>
mask_view<T> make_mask(T const* data, index_t batch, index_t heads, index_t q, index_t k, index_t row_stride) {
  using detail::wrapping_mul;  // huge extents wrap here; the attention checks reject them
  detail::require(row_stride >= k, "posenc::make_mask", "row_stride is ", row_stride, ", expected >= ", k, " (k)");
  return {data, batch, heads, q, k, wrapping_mul(wrapping_mul(heads, q), row_stride), wrapping_mul(q, row_stride),
          row_stride};
}

/// An optional output buffer that knows its size: `attention_options::lse`
/// and `scores`. Not given by default (or from nullptr); given from
/// (data, size) or from a contiguous container such as std::vector<T> (its
/// data() and size()). A given buffer must have exactly the size of the output
/// it receives, checked before anything is written, like every other
/// argument. A raw pointer alone does not convert: its size cannot be checked.
template <class T>
class output_span {
 public:
  constexpr output_span() noexcept = default;
  constexpr output_span(std::nullptr_t) noexcept {}  // NOLINT: not given
  constexpr output_span(T* data, index_t size) noexcept : data_(data), size_(size), given_(true) {}
  constexpr output_span(span<T> s) noexcept : data_(s.data()), size_(s.size()), given_(true) {}  // NOLINT
  template <class C, class = std::enable_if_t<!std::is_same_v<std::decay_t<C>, output_span> &&
                                              std::is_convertible_v<decltype(std::declval<C&>().data()), T*> &&
                                              std::is_integral_v<decltype(std::declval<C&>().size())>>>
  output_span(C& c) noexcept  // NOLINT: implicit on purpose (a std::vector, an aligned_buffer)
      : data_(c.data()), size_(static_cast<index_t>(c.size())), given_(true) {}
  /// A raw pointer carries no size: give {data, size} or a container.
  template <class P, class = std::enable_if_t<std::is_pointer_v<P>>>
  output_span(P) {  // NOLINT
    static_assert(!std::is_pointer_v<P>,
                  "posenc::output_span: a raw pointer carries no size; give {data, size} or a container "
                  "(a std::vector), or nullptr for no output");
  }

  /// Whether the output was asked for.
  constexpr bool given() const noexcept { return given_; }
  constexpr explicit operator bool() const noexcept { return given_; }
  constexpr T* data() const noexcept { return data_; }
  constexpr index_t size() const noexcept { return size_; }
  /// Element i (unchecked), i in [0, size()).
  constexpr T& operator[](index_t i) const noexcept { return data_[i]; }

 private:
  T* data_ = nullptr;
  index_t size_ = 0;
  bool given_ = false;
};

namespace detail {
/// Checks a given lse or scores buffer against the element count the call
/// writes: `what` names the extents (e.g. "batch x heads x q.seq").
template <class T>
void check_output_span(char const* where, char const* name, output_span<T> const& o, index_t expected,
                       char const* what) {
  if (!o.given()) return;
  require(o.size() == expected, where, name, " has ", o.size(), " values, expected ", expected, " (", what, ")");
  require(o.data() != nullptr || expected == 0, where, name, " is given with ", o.size(),
          " values and a null data pointer, expected a buffer (or nullptr for no ", name, ")");
}
}  // namespace detail

/// Options of posenc::attention. Defaults give plain softmax(q k^T / sqrt(d)) v.
template <class T>
struct attention_options {
  /// Multiplies q.k; default 1/sqrt(head_dim of q). T5 uses 1.
  std::optional<double> scale;
  /// Key at position p_j is visible to query at p_i only if p_j <= p_i.
  bool causal = false;
  /// If > 0: keys with p_i - W < p_j <= p_i (W keys including the query). Implies causal.
  index_t sliding_window = 0;
  /// Query positions. Default: i when Sq == Sk (the queries are the keys'
  /// tokens; right-padded entries start at 0), else key_length(b) - Sq + i
  /// (bottom-right, the KV-cache convention). An offset, per-batch offsets or explicit ids; may be
  /// negative (under causal such rows see no key and give zeros).
  std::optional<position_span> q_positions;
  /// Key positions. Default: j.
  std::optional<position_span> k_positions;
  /// Per batch entry: keys j >= key_lengths[b] are padding.
  span<const index_t> key_lengths;
  /// Additive mask (0 keeps, -inf drops), broadcastable.
  mask_view<T> mask;
  /// Boolean mask (true = attend), broadcastable.
  mask_view<bool> bool_mask;
  /// If > 0: s = softcap * tanh(s / softcap), before bias and masks.
  double softcap = 0;
  /// The keys are already rotated by the encoder (a cache of rotated keys).
  bool keys_rotated = false;
  /// Optional log-sum-exp output, contiguous (batch, head, Sq), exactly
  /// batch x heads x Sq values; -inf for rows with no visible key.
  output_span<T> lse;
  /// Optional scores output, contiguous (batch, head, Sq, Sk), exactly
  /// batch x heads x Sq x Sk values, at `scores_stage`.
  output_span<T> scores;
  score_stage scores_stage = score_stage::probabilities;
  /// Thread count; 0 = default (OpenMP's), 1 = serial.
  int threads = 0;
  /// Precision of q.k and p v: float32 (default) or the opt-in bfloat16 mode
  /// (see product_precision; path::fused and path::best with float tensors,
  /// forward only).
  product_precision products = product_precision::float32;
};

}  // namespace posenc
