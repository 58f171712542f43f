// SPDX-License-Identifier: MIT
// path::fused: tiled attention with an online softmax and xsimd FMA micro-kernels; never holds Sq x Sk.
#pragma once

// This header only dispatches: a call with at least a lane block of rows per
// (batch, kv head) and no Shaw terms (Transformer-XL's position term is fine)
// runs the lane kernel, every other call the row kernel. The kernel itself
// lives in rooms under attention/fused/, each including only the rooms above it:
//
//   traits.hpp         tile constants, derived and checked once
//   scratch.hpp        per-thread scratch from one description, bounds-checked
//   storage.hpp        K and V loads: T as it is, 16-bit rows widened in registers,
//                      16-bit tiles widened into scratch (lane kernel)
//   micro_kernels.hpp  register tiles of q.k and p v (lane layout); tile walks, line fetches
//   bf16_products.hpp  the lane kernel's products in bfloat16 (opt-in product_precision)
//   row_products.hpp   q.k and p v of the row layout, over strided or gathered rows
//   softmax.hpp        online softmax (lane and row layouts), normalisation
//   tile_plan.hpp      what a key tile is for a query block: one enum, one function
//   rotary.hpp         RoPE of query rows and key tiles as they are loaded
//   lane_context.hpp   the lane kernel's scratch, per-item context and query row helpers
//   lane_tiles.hpp     the lane kernel's steps over one key tile for one query block
//   lane_kernel.hpp    prefill: query rows along the lanes (block setup, tile walk, finish)
//   row_kernel.hpp     few rows or Shaw: keys along the lanes
//   decode.hpp         the row kernel's items, key split and log-sum-exp merge
//   paged_rows.hpp     a paged call's runs, chunks and workspace; the row walk over pages
//   paged.hpp          key chunks in the pages of a paged cache, merged (used by
//                      attention/paged_attention.hpp, not dispatched from here)
//
// Semantics: docs/formulas.md 5 and attention/plan.hpp. Scratch: one buffer
// per thread, sized by the tile constants, the head dims and the kv head
// count only (fused_scratch_elements); nothing grows with Sq x Sk.

#include <algorithm>
#include <type_traits>

#include "posenc/attention/fused/decode.hpp"
#include "posenc/attention/fused/lane_kernel.hpp"
#include "posenc/attention/fused/row_kernel.hpp"
#include "posenc/attention/fused/scratch.hpp"
#include "posenc/attention/fused/traits.hpp"
#include "posenc/attention/plan.hpp"
#if POSENC_COMPILED
#include "posenc/compiled/forward.hpp"
#endif

namespace posenc::detail {

/// Elements of T of the per-thread scratch of path::fused for head dims
/// `head_dim` and `value_dim` and `kv_heads` kv heads: depends on the tile
/// constants, the head dims and the head count only, never on the sequence lengths.
/// (K and V stored in 16 bits add one widened value tile to the lane kernel's scratch;
/// bfloat16 products, float only, their pair operands.)
template <class T>
index_t fused_scratch_elements(index_t head_dim, index_t value_dim, index_t kv_heads = 1) noexcept {
  using Tr = fused_default_traits<T>;
  constexpr index_t rg_v = Tr::row_group_v;
  index_t lanes = fused::scratch_elements<fused::lane_scratch<Tr>>(head_dim, value_dim);
  if constexpr (std::is_same_v<T, float>)
    lanes = fused::scratch_elements<fused::lane_scratch<fused::bf16_product_traits<Tr>>>(head_dim, value_dim);
  return std::max({lanes,
                   fused::scratch_elements<fused::row_scratch<Tr>>(head_dim, rg_v),
                   fused::scratch_elements<fused::row_scratch<Tr>>(
                       head_dim, kv_heads * Tr::max_decode_groups_v * rg_v)});
}

/// Whether path::fused runs a call on the lane kernel (else the row kernel): at least a lane
/// block of rows per (batch, kv head), and no relative keys unless the encoder hands the lane
/// kernel its table by distance (transformer_xl; no value term).
template <class Tr, class E>
bool takes_lane_kernel(attention_plan<typename Tr::value_type> const& p) noexcept {
  constexpr bool lanes_v =
      !encoder_traits<E>::relative_key_value || has_distance_columns<E, typename Tr::value_type>::value;
  return lanes_v && p.q_len * p.group >= Tr::lane_kernel_min_rows_v;
}

/// Runs path::fused on a validated plan. `rot`: rotate q and k tiles in the
/// kernel (RoPE fused); null: q and k arrive rotated (or need no rotation).
/// K and V stored in a 16-bit type (KV) take the same route: the row kernel
/// widens their rows in registers as it loads them, the lane kernel widens
/// each key and value tile once into float scratch for all its query blocks.
/// A 16-bit q (Q) is widened into float scratch as its rows are read (and
/// rotated there), a 16-bit out (O) rounded once as each row is finished.
template <class Tr, class T, class Q, class KV, class O, class E>
void fused_attention(attention_plan<T> const& p, view<const Q> q, view<const KV> k, view<const KV> v, view<O> out,
                     E const& enc, rotation_ids const* rot = nullptr) {
  if (takes_lane_kernel<Tr, E>(p)) {
#if POSENC_BF16_PRODUCTS
    if constexpr (std::is_same_v<T, float>) {
      if (p.products == product_precision::bfloat16) {  // opt-in: an instantiation of its own
        fused::run_lane_kernel<fused::bf16_product_traits<Tr>>(p, q, k, v, out, enc, rot);
        return;
      }
    }
#endif
    fused::run_lane_kernel<Tr>(p, q, k, v, out, enc, rot);
  } else {
    fused::run_row_kernel<Tr>(p, q, k, v, out, enc, rot);  // float products (decode, few rows, Shaw)
  }
}

/// path::fused: see the top of this file.
template <>
struct kernel<path::fused> {
  static constexpr bool available = true;
  static constexpr bool provides_scores = false;
  /// With an encoder whose rotation is reserved for the call's length (rope
  /// after reserve), q blocks and key tiles are rotated here as they are
  /// loaded (a key tile once per work item, for all its query blocks); else
  /// the entry point passes rotated copies.
  static constexpr bool rotates_itself = true;
  template <class T, class Q, class KV, class O, class E>
  static void run(attention_plan<T> const& p, view<const Q> q, view<const KV> k, view<const KV> v, view<O> out,
                  E const& enc, rotation_ids const* rot = nullptr) {
#if POSENC_COMPILED
    // posenc::compiled holds this kernel (compiled/list.hpp): call it there.
    if constexpr (std::is_same_v<T, float> && compiled_kernels::has_forward<Q, KV, O, E>) {
      compiled_kernels::check_once();
      compiled_kernels::forward(p, q, k, v, out, enc, rot);
      return;
    }
#endif
    fused_attention<fused_default_traits<T>>(p, q, k, v, out, enc, rot);
  }
};

}  // namespace posenc::detail
