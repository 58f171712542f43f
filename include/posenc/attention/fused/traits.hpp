// SPDX-License-Identifier: MIT
// path::fused, room 1: every tile constant of the fused kernel, derived and checked once.
#pragma once

// What this room holds: `fused_traits` (the compile-time shape of a tile, a
// micro-tile and a work item) and `fused_default_traits<T>` (the configuration
// path::fused runs). Names of compile-time constants in the fused kernel end
// in `_v` (`block_q_v`, `width_v`); runtime sizes never do (`head_dim`,
// `rows`). May include: core/ only.

#include <cstddef>
#include <limits>
#include <type_traits>

#include "posenc/core/simd.hpp"
#include "posenc/core/span.hpp"

namespace posenc::detail {

/// Every tile constant of the fused path, derived and checked once.
/// @tparam T       float or double
/// @tparam BlockQ  query rows per block (the lanes of one tile), a multiple of
///                 the lane group of the micro-kernels
/// @tparam BlockKV keys per tile
/// @tparam Arch    xsimd architecture tag
template <class T, index_t BlockQ, index_t BlockKV, class Arch = simd::default_arch>
struct fused_traits {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "posenc::fused_traits: T must be float or double");
  using value_type = T;
  using arch = Arch;
  using batch = simd::batch<T, Arch>;

  /// Lanes of one vector.
  static constexpr index_t width_v = simd::width<T, Arch>;
  static constexpr index_t block_q_v = BlockQ;
  static constexpr index_t block_kv_v = BlockKV;
  /// Largest block_q_v: the per-row key bounds of a block live in fixed arrays.
  static constexpr index_t max_block_q_v = 256;
  /// Vectors across one block of query rows.
  static constexpr index_t q_vectors_v = BlockQ / width_v;
  /// Register file: 32 vector registers with AVX-512 and on AArch64, 16 otherwise.
  static constexpr int registers_v = simd::vector_registers<Arch>;
  /// Lane vectors of one micro-tile: 4 with 32 registers (64 float lanes on
  /// AVX-512, 16 with NEON), 2 with 16.
  static constexpr index_t micro_q_v = registers_v >= 32 ? 4 : 2;
  /// Rows (keys for scores, output dims for values) of one micro-tile:
  /// micro_rows_v * micro_q_v accumulators plus micro_q_v operands plus one
  /// broadcast must fit the register file: 6 * 4 + 4 + 1 = 29 of 32,
  /// 6 * 2 + 2 + 1 = 15 of 16.
  static constexpr index_t micro_rows_v = 6;
  /// Query blocks of one work item that share each key tile.
  static constexpr index_t blocks_per_item_v = 4;
  /// Rows handled together by the row kernel (each K/V row load serves them all).
  static constexpr index_t row_group_v = 4;
  /// Below this many rows per (batch, kv head) the row kernel runs: a lane
  /// block would be mostly empty lanes.
  static constexpr index_t lane_kernel_min_rows_v = width_v;
  /// Row groups per kv head on the decode path at most (fewer rows than a lane block).
  static constexpr index_t max_decode_groups_v = (lane_kernel_min_rows_v + row_group_v - 1) / row_group_v;
  /// Keys of one step of the decode walk over a 16-bit cache (a divisor of
  /// BlockKV; see fused/decode.hpp).
  static constexpr index_t half_decode_step_v = BlockKV % 16 == 0 ? 16 : BlockKV;

  static_assert(BlockQ <= max_block_q_v, "posenc::fused_traits: BlockQ must be <= 256");
  static_assert(BlockQ > 0 && BlockQ % width_v == 0,
                "posenc::fused_traits: BlockQ must be a multiple of the SIMD width");
  static_assert(q_vectors_v % micro_q_v == 0,
                "posenc::fused_traits: BlockQ must be a multiple of micro_q * width (the lanes of a micro-tile)");
  static_assert(BlockKV > 0 && BlockKV % width_v == 0,
                "posenc::fused_traits: BlockKV must be a multiple of the SIMD width");
  static_assert(micro_rows_v * micro_q_v + micro_q_v + 1 <= registers_v,
                "posenc::fused_traits: the micro-tile does not fit the register file");
};

/// The tile configuration path::fused uses for T on the compiled architecture.
/// 64 query rows (one micro-tile of 4 x 16 float lanes with AVX-512) by 64 keys.
template <class T>
using fused_default_traits = fused_traits<T, 64, 64>;

namespace fused {

/// A positive compile-time count as an array bound (std::size_t), so that
/// arrays sized by signed tile constants convert without a sign change.
template <auto N>
inline constexpr std::size_t size_v = static_cast<std::size_t>(N);

/// A key index no real key reaches: the empty bounds of a lane with no
/// visible key are [far_key_v, -far_key_v).
inline constexpr index_t far_key_v = std::numeric_limits<index_t>::max() / 4;

}  // namespace fused
}  // namespace posenc::detail
