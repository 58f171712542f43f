// SPDX-License-Identifier: MIT
// path::fused, room 7: the lane kernel's per-thread scratch, per-item context and query row helpers.
#pragma once

// What this room holds: what every step of the lane kernel (fused/lane_tiles.hpp,
// fused/lane_kernel.hpp) shares: the per-thread scratch, described once by
// lay_out (lane_scratch: per query block the transposed queries qt, output ot
// and softmax statistics; per tile the scores st and the terms, bounds and
// widened K and V tiles), the context of one work item (lane_item_context),
// and the query row helpers (a row copied or widened into scratch, a row as T
// for an encoder hook).
// May include: the fused/ rooms above it, attention/plan.hpp, encoding/, core/.

#include <algorithm>
#include <type_traits>

#include "posenc/attention/fused/bf16_products.hpp"
#include "posenc/attention/fused/traits.hpp"
#include "posenc/attention/plan.hpp"
#include "posenc/core/half.hpp"
#include "posenc/core/simd.hpp"
#include "posenc/core/span.hpp"
#include "posenc/core/view.hpp"

namespace posenc::detail::fused {

/// Per-thread scratch of the lane kernel, described once by lay_out.
template <class Tr>
struct lane_scratch {
  using value_type = typename Tr::value_type;
  using T = value_type;
  struct block_buffers {
    T* qt;     // (head_dim, block_q_v) transposed queries
    T* ot;     // (value_dim, block_q_v) transposed unnormalised output
    T* m;      // (block_q_v) running max
    T* l;      // (block_q_v) running sum
    T* alpha;  // (block_q_v) rescale factor of the last tile
  };
  block_buffers blocks[Tr::blocks_per_item_v];
  T* st;     // (block_kv_v, block_q_v) scores, then probabilities
  T* bt;     // (block_kv_v, block_q_v) per-key terms, transposed
  T* brow;   // (block_q_v, block_kv_v) per-key terms, row by row
  T* rlo;    // (block_q_v) first visible key of each lane, tile-relative
  T* rhi;    // (block_q_v) end of the visible keys of each lane
  T* ktile;  // (block_kv_v, head_dim) a rotated or widened key tile
  T* vtile;  // (block_kv_v, widened_value_dim) a widened value tile (16-bit V only)
  T* qrows;  // (block_q_v, head_dim) query rows being rotated
  T* diag;   // (block_kv_v + block_q_v) one diagonal of a shift-invariant bias
  T* pairs;  // bfloat16 product operands (fused/bf16_products.hpp; nothing for float products)

  template <class Taker>
  void lay_out(Taker& c, index_t head_dim, index_t value_dim, index_t widened_value_dim = 0) {
    constexpr index_t bq_v = Tr::block_q_v, bk_v = Tr::block_kv_v;
    for (block_buffers& bb : blocks) {
      bb.qt = c.take(head_dim * bq_v);
      bb.ot = c.take(value_dim * bq_v);
      bb.m = c.take(bq_v);
      bb.l = c.take(bq_v);
      bb.alpha = c.take(bq_v);
    }
    st = c.take(bk_v * bq_v);
    bt = c.take(bk_v * bq_v);
    brow = c.take(bq_v * bk_v);
    rlo = c.take(bq_v);
    rhi = c.take(bq_v);
    ktile = c.take(bk_v * head_dim);
    vtile = c.take(bk_v * widened_value_dim);  // nothing for K and V stored as T
    qrows = c.take(bq_v * head_dim);
    diag = c.take(bk_v + bq_v);
    pairs = c.take(bf16_pair_elements<Tr>(head_dim, value_dim));
  }
};

/// What every step of one work item shares: the call, the item's (b, kv head)
/// and the per-call decisions. K and V are stored as KV: T, or a 16-bit type.
template <class Tr, class E, class KV = typename Tr::value_type, class Q = typename Tr::value_type,
          class O = typename Tr::value_type>
struct lane_item_context {
  using T = typename Tr::value_type;
  attention_plan<T> const& p;
  view<const Q> q;  // T, or a 16-bit type widened as its rows are read
  view<const KV> k, v;
  view<O> out;  // T, or a 16-bit type rounded once as each row is finished
  E const& enc;
  rotation_ids const* rot;  // rotate queries and key tiles here; null: they arrive rotated
  index_t b, hk;
  bool per_key_terms;  // a bias or masks, per (row, key) unless a diagonal applies
  bool diagonal_bias;  // a shift-invariant bias without masks
};

/// Query row copy into scratch: copied as T, or a 16-bit row widened (exactly).
template <class T, class Q>
POSENC_ALWAYS_INLINE void lane_query_row(Q const* qi, index_t head_dim, T* dst) noexcept {
  if constexpr (std::is_same_v<Q, T>)
    std::copy(qi, qi + head_dim, dst);
  else
    widen_row(qi, head_dim, dst);
}

/// A query row as T for an encoder hook: q itself, or a 16-bit row widened
/// into dst (head_dim elements of scratch no step holds at that point).
template <class T, class Q>
POSENC_ALWAYS_INLINE T const* lane_query_in(Q const* qi, index_t head_dim, T* dst) noexcept {
  if constexpr (std::is_same_v<Q, T>) {
    (void)head_dim, (void)dst;
    return qi;
  } else {
    widen_row(qi, head_dim, dst);
    return dst;
  }
}

/// The query row a bias hook receives (bias_row reads no query): q itself
/// when it is T, else null.
template <class T, class Q>
POSENC_ALWAYS_INLINE T const* lane_bias_query(Q const* qi) noexcept {
  if constexpr (std::is_same_v<Q, T>)
    return qi;
  else
    return (void)qi, static_cast<T const*>(nullptr);
}

}  // namespace posenc::detail::fused
