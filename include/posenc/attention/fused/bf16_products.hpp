// SPDX-License-Identifier: MIT
// path::fused, room 3b: the lane kernel's two products with bfloat16 inputs and float accumulation (opt-in mode).
#pragma once

// What this room holds: the bfloat16 product mode of the lane kernel
// (product_precision::bfloat16). The kernel runs it as its own instantiation,
// with traits bf16_product_traits<Tr>: the float instantiations never see it.
// Operands are rounded to bfloat16 once and laid out in the pairs
// simd::dot_bf16_pairs multiplies (two bfloat16 in each 32-bit slot):
//   q    (head_dim / 2, block_q_v)  pairs of dims (2e, 2e + 1) per lane, per block
//   k    (block_kv_v, head_dim / 2) each key row rounded in order (its dims pair up)
//   v    (block_kv_v / 2, value_dim) pairs of keys (2u, 2u + 1) per output dim
//   p    (block_kv_v / 2, block_q_v) pairs of keys per lane, from the softmax's st
// (odd counts: the last pair's high half is 0). A score is then
// sum_e dot(q pair, k pair) and an output dim sum_u dot(p pair, v pair): half
// the multiply instructions of the float kernel, same register tiles.
// Softmax, masks, biases and the row sums stay float. Pair slots live in the
// float scratch: written and read only through core/simd.hpp's pair helpers
// and as 32-bit moves.
// May include: fused/traits.hpp, fused/micro_kernels.hpp, fused/scratch.hpp and core/.

#include <algorithm>
#include <type_traits>

#include "posenc/attention/fused/micro_kernels.hpp"
#include "posenc/attention/fused/scratch.hpp"
#include "posenc/attention/fused/traits.hpp"
#include "posenc/core/simd.hpp"
#include "posenc/core/span.hpp"

namespace posenc::detail::fused {

/// Traits Tr with the lane kernel's products in bfloat16 (a distinct type:
/// its own instantiation of every lane kernel step).
template <class Tr>
struct bf16_product_traits : Tr {
  static_assert(std::is_same_v<typename Tr::value_type, float>,
                "posenc::fused: bfloat16 products are a mode of the float kernel");
  static constexpr bool bf16_products_v = true;
};

/// True for traits whose lane kernel multiplies in bfloat16.
template <class Tr, class = void>
struct has_bf16_products : std::false_type {};
template <class Tr>
struct has_bf16_products<Tr, std::void_t<decltype(Tr::bf16_products_v)>> : std::bool_constant<Tr::bf16_products_v> {};
template <class Tr>
inline constexpr bool has_bf16_products_v = has_bf16_products<Tr>::value;

/// Pair slots (32 bits each) of n elements.
constexpr index_t bf16_pair_count(index_t n) noexcept { return (n + 1) / 2; }

/// Float scratch elements the pair operands of one work item take (0 for
/// float products: the float kernel's scratch is unchanged).
template <class Tr>
constexpr index_t bf16_pair_elements(index_t head_dim, index_t value_dim) noexcept {
  if constexpr (has_bf16_products_v<Tr>) {
    constexpr index_t bq_v = Tr::block_q_v, bk_v = Tr::block_kv_v;
    index_t const e = scratch_piece(bf16_pair_count(head_dim));
    return Tr::blocks_per_item_v * scratch_piece(e * bq_v) + scratch_piece(bk_v * e) +
           scratch_piece(bf16_pair_count(bk_v) * value_dim) + scratch_piece(bf16_pair_count(bk_v) * bq_v);
  } else {
    (void)head_dim, (void)value_dim;
    return 0;
  }
}

/// The pair operands of one work item, carved from its pair scratch.
struct bf16_operands {
  float* q[8];     // per query block: (pairs of head_dim, block_q_v)
  float* k;        // (block_kv_v, kpairs)
  float* v;        // (block_kv_v / 2, value_dim)
  float* p;        // (block_kv_v / 2, block_q_v)
  index_t kpairs;  // pair slots of a key row (leading dimension of k)
};

/// Carves the pair operands out of `base` (bf16_pair_elements of them).
template <class Tr>
bf16_operands bf16_carve(float* base, index_t head_dim, index_t value_dim) noexcept {
  static_assert(Tr::blocks_per_item_v <= 8, "posenc::fused: bf16_operands holds 8 query blocks");
  constexpr index_t bq_v = Tr::block_q_v, bk_v = Tr::block_kv_v;
  bf16_operands o{};
  o.kpairs = scratch_piece(bf16_pair_count(head_dim));
  for (index_t t = 0; t < Tr::blocks_per_item_v; ++t) {
    o.q[t] = base;
    base += scratch_piece(o.kpairs * bq_v);
  }
  o.k = base;
  base += scratch_piece(bk_v * o.kpairs);
  o.v = base;
  base += scratch_piece(bf16_pair_count(bk_v) * value_dim);
  o.p = base;
  return o;
}

/// Pairs of rows: dst[e][lanes] = (src[2e][lanes], src[2e + 1][lanes]) for
/// the first `rows` rows of src (`lds` apart; an odd count pairs the last with
/// 0), `lanes` a multiple of the width, dst rows `ldd` apart.
template <class Tr>
POSENC_ALWAYS_INLINE void bf16_pair_rows(float const* src, index_t lds, index_t rows, index_t lanes, float* dst,
                                         index_t ldd) noexcept {
  using A = typename Tr::arch;
  using B = typename Tr::batch;
  constexpr index_t w_v = Tr::width_v;
  for (index_t e = 0; e < bf16_pair_count(rows); ++e) {
    float const* r0 = src + 2 * e * lds;
    bool const has_odd = 2 * e + 1 < rows;
    for (index_t l = 0; l < lanes; l += w_v) {
      B const odd = has_odd ? simd::load<float, A>(r0 + lds + l) : B(0.0f);
      simd::store(dst + e * ldd + l, simd::bf16_pairs(simd::load<float, A>(r0 + l), odd));
    }
  }
}

/// Key and value pairs of one tile of nk keys: K rows (ldk apart) rounded in
/// order, V rows (ldv apart) paired by keys (keys past nk are 0).
template <class Tr>
void bf16_pack_tile(bf16_operands const& o, float const* kt, index_t ldk, float const* vt, index_t ldv, index_t nk,
                    index_t head_dim, index_t value_dim) noexcept {
  using A = typename Tr::arch;
  using B = typename Tr::batch;
  constexpr index_t w_v = Tr::width_v;
  for (index_t j = 0; j < nk; ++j) simd::store_bf16_row<A>(o.k + j * o.kpairs, kt + j * ldk, head_dim);
  index_t const dim_w = value_dim / w_v * w_v;
  for (index_t u = 0; u < bf16_pair_count(nk); ++u) {
    float const* r0 = vt + 2 * u * ldv;
    bool const has_odd = 2 * u + 1 < nk;
    float* d = o.v + u * value_dim;
    for (index_t c = 0; c < dim_w; c += w_v) {
      B const odd = has_odd ? simd::load<float, A>(r0 + ldv + c) : B(0.0f);
      simd::store(d + c, simd::bf16_pairs(simd::load<float, A>(r0 + c), odd));
    }
    if (dim_w < value_dim) {  // the last dims through one padded vector
      alignas(A::alignment()) float ev[static_cast<std::size_t>(w_v)] = {}, od[static_cast<std::size_t>(w_v)] = {},
                                    out[static_cast<std::size_t>(w_v)];
      std::copy(r0 + dim_w, r0 + value_dim, ev);
      if (has_odd) std::copy(r0 + ldv + dim_w, r0 + ldv + value_dim, od);
      simd::store(out, simd::bf16_pairs(simd::load<float, A>(ev), simd::load<float, A>(od)));
      std::copy(out, out + (value_dim - dim_w), d + dim_w);
    }
  }
}

/// st[r][lanes] = sum_e dot(k pair e of key r, q pair e of the lanes) for MR
/// keys and MQ lane vectors.
template <class Tr, int MR, int MQ>
POSENC_ALWAYS_INLINE void bf16_score_micro(float const* k, index_t ldk, float const* q, index_t ldq, index_t pairs,
                                           float* st, index_t lds) noexcept {
  using A = typename Tr::arch;
  using B = typename Tr::batch;
  constexpr index_t w_v = Tr::width_v;
  B acc[size_v<MR>][size_v<MQ>];
  for (int r = 0; r < MR; ++r)
    for (int m = 0; m < MQ; ++m) acc[r][m] = B(0.0f);
  for (index_t e = 0; e < pairs; ++e) {
    B qv[size_v<MQ>];
    for (int m = 0; m < MQ; ++m) qv[m] = simd::load<float, A>(q + e * ldq + m * w_v);
    for (int r = 0; r < MR; ++r) {
      B const kb(k[r * ldk + e]);  // one pair slot to every lane
      for (int m = 0; m < MQ; ++m) acc[r][m] = simd::dot_bf16_pairs(acc[r][m], qv[m], kb);
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int m = 0; m < MQ; ++m) simd::store(st + r * lds + m * w_v, acc[r][m]);
}

/// ot[r][lanes] = alpha[lanes] * ot[r][lanes] + sum_u dot(p pair u of the
/// lanes, v pair u of dim r) for MR output dims and MQ lane vectors.
template <class Tr, int MR, int MQ>
POSENC_ALWAYS_INLINE void bf16_value_micro(float const* v, index_t ldv, index_t pairs, float const* p, index_t ldp,
                                           float const* alpha, float* ot, index_t ldo) noexcept {
  using A = typename Tr::arch;
  using B = typename Tr::batch;
  constexpr index_t w_v = Tr::width_v;
  B acc[size_v<MR>][size_v<MQ>];
  B al[size_v<MQ>];
  for (int m = 0; m < MQ; ++m) al[m] = simd::load<float, A>(alpha + m * w_v);
  for (int r = 0; r < MR; ++r)
    for (int m = 0; m < MQ; ++m) acc[r][m] = simd::load<float, A>(ot + r * ldo + m * w_v) * al[m];
  for (index_t u = 0; u < pairs; ++u) {
    B pv[size_v<MQ>];
    for (int m = 0; m < MQ; ++m) pv[m] = simd::load<float, A>(p + u * ldp + m * w_v);
    for (int r = 0; r < MR; ++r) {
      B const vb(v[u * ldv + r]);  // one pair slot to every lane
      for (int m = 0; m < MQ; ++m) acc[r][m] = simd::dot_bf16_pairs(acc[r][m], pv[m], vb);
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int m = 0; m < MQ; ++m) simd::store(ot + r * ldo + m * w_v, acc[r][m]);
}

/// The bfloat16 score micro-tiles of one lane group (see score_tiles).
template <class Tr>
struct bf16_score_tiles {
  float const* k;
  index_t ldk, pairs;
  float const* q;
  float* st;
  template <class MR>
  POSENC_ALWAYS_INLINE void operator()(index_t r0, MR) const noexcept {
    constexpr index_t bq_v = Tr::block_q_v;
    bf16_score_micro<Tr, MR::value, Tr::micro_q_v>(k + r0 * ldk, ldk, q, bq_v, pairs, st + r0 * bq_v, bq_v);
  }
};

/// Item setup: carves the pair operands from the lane scratch sc and rounds
/// the transposed queries of its blocks [0, nb) into pairs, once per item.
template <class Tr, class S>
bf16_operands bf16_begin_item(S const& sc, index_t nb, index_t head_dim, index_t value_dim) noexcept {
  bf16_operands const o = bf16_carve<Tr>(sc.pairs, head_dim, value_dim);
  for (index_t t = 0; t < nb; ++t)
    bf16_pair_rows<Tr>(sc.blocks[t].qt, Tr::block_q_v, head_dim, Tr::block_q_v, o.q[t], Tr::block_q_v);
  return o;
}

/// Tile scores in bfloat16: st (keys, block_q_v) = K q for the lanes that
/// hold rows, from the tile's key pairs and block t's query pairs.
template <class Tr>
void bf16_tile_scores(bf16_operands const& o, index_t t, index_t keys, index_t head_dim, index_t nvec,
                      float* st) noexcept {
  constexpr index_t w_v = Tr::width_v, mq_v = Tr::micro_q_v;
  index_t const pairs = bf16_pair_count(head_dim);
  for (index_t g = 0; g < nvec / mq_v; ++g)
    row_blocks<Tr::micro_rows_v>(
        keys, bf16_score_tiles<Tr>{o.k, o.kpairs, pairs, o.q[t] + g * mq_v * w_v, st + g * mq_v * w_v});
}

/// Tile values in bfloat16: the probabilities in st (keys, block_q_v) rounded
/// into pairs, then ot = alpha * ot + V^T p for the lanes that hold rows.
template <class Tr>
void bf16_tile_values(bf16_operands const& o, index_t keys, index_t value_dim, float const* st, index_t nvec,
                      float const* alpha, float* ot) noexcept {
  constexpr index_t w_v = Tr::width_v, bq_v = Tr::block_q_v, mq_v = Tr::micro_q_v;
  bf16_pair_rows<Tr>(st, bq_v, keys, nvec * w_v, o.p, bq_v);
  index_t const pairs = bf16_pair_count(keys);
  for (index_t g = 0; g < nvec / mq_v; ++g) {
    row_blocks<Tr::micro_rows_v>(value_dim, [&](index_t d0, auto mr) {
      constexpr int mr_v = decltype(mr)::value;
      bf16_value_micro<Tr, mr_v, mq_v>(o.v + d0, value_dim, pairs, o.p + g * mq_v * w_v, bq_v, alpha + g * mq_v * w_v,
                                       ot + d0 * bq_v + g * mq_v * w_v, bq_v);
    });
  }
}

}  // namespace posenc::detail::fused
