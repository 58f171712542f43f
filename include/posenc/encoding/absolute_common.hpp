// SPDX-License-Identifier: MIT
// Shared by the absolute encoders: position ids from padded token ids or an attention mask, and the row add.
#pragma once

#include "posenc/core/checked.hpp"
#include "posenc/core/error.hpp"
#include "posenc/core/positions.hpp"
#include "posenc/core/simd.hpp"
#include "posenc/core/span.hpp"

namespace posenc {

/// Position ids of fairseq and RoBERTa (docs/formulas.md 1.4 and 2.1): for a real
/// token (`tokens[b, s] != padding_idx`) the id is
/// `padding_idx + past_len + (number of real tokens of row b up to and including s)`,
/// for a padding token it is `padding_idx`. So the first real token gets
/// `padding_idx + 1`, left and right padding give real tokens the same ids,
/// and padding reads the (zero) padding row.
///
/// `tokens` and `out` are row-major (batch, seq); `out` may not alias `tokens`.
/// Use the ids with `sinusoidal` built with the same `padding_idx`, or with a
/// RoBERTa-style `learned` table at offset 0.
inline void fairseq_positions(span<const index_t> tokens, index_t batch, index_t seq, index_t padding_idx,
                              span<index_t> out, index_t past_len = 0) {
  constexpr char const* where = "posenc::fairseq_positions";
  detail::require(batch >= 0, where, "batch is ", batch, ", expected >= 0");
  detail::require(seq >= 0, where, "seq is ", seq, ", expected >= 0");
  detail::require(padding_idx >= 0, where, "padding_idx is ", padding_idx, ", expected >= 0");
  detail::require(past_len >= 0, where, "past_len is ", past_len, ", expected >= 0");
  index_t const n = detail::checked_mul(where, batch, seq, "batch x seq");
  detail::require(tokens.size() == n, where, "tokens.size is ", tokens.size(), ", expected ", n, " (batch * seq)");
  detail::require(out.size() == n, where, "out.size is ", out.size(), ", expected ", n, " (batch * seq)");
  // The largest id, padding_idx + past_len + seq, stays in the accepted position range.
  detail::require(padding_idx <= position_limit && past_len <= position_limit - padding_idx &&
                      seq <= position_limit - padding_idx - past_len,
                  where, "padding_idx + past_len + seq is ", padding_idx, " + ", past_len, " + ", seq,
                  ", expected <= ", position_limit, " (position_limit)");
  for (index_t b = 0; b < batch; ++b) {
    index_t real = 0;
    for (index_t s = 0; s < seq; ++s) {
      index_t const i = b * seq + s;
      if (tokens[i] != padding_idx) {
        ++real;
        out[i] = padding_idx + past_len + real;
      } else {
        out[i] = padding_idx;
      }
    }
  }
}

/// Position ids from an attention mask for left-padded batches (HF GPT-2
/// generation, OPT; docs/formulas.md 2.1 and 3.4): for an attended slot
/// (`mask[b, t] != 0`) the id is `cumsum(mask[b, :t+1]) - 1`, for a masked
/// slot it is `padding_position`. The mask covers the `total` = past + new
/// tokens (row-major (batch, total)); the ids are those of the last `seq`
/// tokens, row-major (batch, seq), so a decode step with a KV cache passes the
/// whole mask and `seq` = 1.
///
/// GPT-2 writes 1 at padding (`padding_position = 1`, the default). OPT
/// computes `cumsum * mask - 1`, i.e. -1 at padding, then adds its offset 2:
/// pass `padding_position = -1` and use a `learned` table with offset 2 (the
/// padding slots read row 1, as in OPT).
template <class M>
void positions_from_mask(span<const M> mask, index_t batch, index_t total, index_t seq, span<index_t> out,
                         index_t padding_position = 1) {
  constexpr char const* where = "posenc::positions_from_mask";
  detail::require(batch >= 0, where, "batch is ", batch, ", expected >= 0");
  detail::require(total >= 0, where, "total is ", total, ", expected >= 0");
  detail::require(seq >= 0 && seq <= total, where, "seq is ", seq, ", expected in [0, ", total, "] (total)");
  index_t const nm = detail::checked_mul(where, batch, total, "batch x total");
  detail::require(mask.size() == nm, where, "mask.size is ", mask.size(), ", expected ", nm, " (batch * total)");
  index_t const no = batch * seq;  // <= batch * total
  detail::require(out.size() == no, where, "out.size is ", out.size(), ", expected ", no, " (batch * seq)");
  index_t const past = total - seq;
  for (index_t b = 0; b < batch; ++b) {
    index_t count = 0;
    for (index_t t = 0; t < total; ++t) {
      bool const on = mask[b * total + t] != M(0);
      if (on) ++count;
      if (t >= past) out[b * seq + (t - past)] = on ? count - 1 : padding_position;
    }
  }
}

namespace detail {

/// x[0..d) = x * scale + row, vectorised (FMA) with a partial tail. With
/// scale == 1 this is exactly x + row.
template <class T>
inline void add_scaled_row(T* x, T const* row, index_t d, T scale) noexcept {
  constexpr index_t w = simd::width<T>;
  auto const s = simd::broadcast<T>(scale);
  index_t i = 0;
  for (; i + 4 * w <= d; i += 4 * w) {
    auto const a0 = simd::fma(simd::load(x + i), s, simd::load(row + i));
    auto const a1 = simd::fma(simd::load(x + i + w), s, simd::load(row + i + w));
    auto const a2 = simd::fma(simd::load(x + i + 2 * w), s, simd::load(row + i + 2 * w));
    auto const a3 = simd::fma(simd::load(x + i + 3 * w), s, simd::load(row + i + 3 * w));
    simd::store(x + i, a0);
    simd::store(x + i + w, a1);
    simd::store(x + i + 2 * w, a2);
    simd::store(x + i + 3 * w, a3);
  }
  for (; i + w <= d; i += w) simd::store(x + i, simd::fma(simd::load(x + i), s, simd::load(row + i)));
  if (i < d) {
    index_t const n = d - i;
    simd::store_partial(x + i, simd::fma(simd::load_partial(x + i, n), s, simd::load_partial(row + i, n)), n);
  }
}

}  // namespace detail
}  // namespace posenc
