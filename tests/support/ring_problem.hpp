// SPDX-License-Identifier: MIT
// The MPI tests' shared pieces: one problem over the whole sequence, its shards, gathering, every encoder.
#pragma once

#include <mpi.h>

#include <posenc/distributed/shards.hpp>
#include <posenc/posenc.hpp>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace posenc_test {

using posenc::index_t;
namespace dist = posenc::distributed;

inline int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}
inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

/// One problem over the whole sequence, and how it is cut.
struct problem {
  index_t B = 2, S = 37, Hq = 4, Hkv = 4, D = 16, Dv = 16;
  dist::shard_layout layout = dist::shard_layout::zigzag;
  bool uneven = false;       // contiguous: shard r gets a different length per rank
  bool empty_first = false;  // contiguous: rank 0 holds no token (with more than one rank)
};

/// Shard lengths of every rank for problem p over R ranks.
inline std::vector<index_t> shard_lengths(problem const& p, index_t R) {
  std::vector<index_t> len(static_cast<std::size_t>(R));
  if (p.layout == dist::shard_layout::zigzag) {
    for (index_t r = 0; r < R; ++r) {
      auto z = dist::zigzag_segments(p.S, R, r);
      len[static_cast<std::size_t>(r)] = z[0].count + z[1].count;
    }
    return len;
  }
  // Uneven: weights 1, 3, 2, 5, ... of the ranks (a rank may get few tokens).
  index_t const w[4] = {1, 3, 2, 5};
  index_t wsum = 0, given = 0;
  auto weight = [&](index_t r) { return p.empty_first && r == 0 && R > 1 ? 0 : p.uneven ? w[r % 4] : 1; };
  for (index_t r = 0; r < R; ++r) wsum += weight(r);
  for (index_t r = 0; r < R; ++r) {
    len[static_cast<std::size_t>(r)] = r + 1 == R ? p.S - given : p.S * weight(r) / wsum;
    given += len[static_cast<std::size_t>(r)];
  }
  return len;
}

/// Rows of a (B, S, H, dim) BSHD buffer at the global token indices `rows`.
inline std::vector<float> take_rows(std::vector<float> const& x, index_t B, index_t S, index_t H, index_t dim,
                             std::vector<index_t> const& rows) {
  index_t const n = static_cast<index_t>(rows.size());
  std::vector<float> y(static_cast<std::size_t>(B * n * H * dim));
  for (index_t b = 0; b < B; ++b)
    for (index_t s = 0; s < n; ++s)
      for (index_t e = 0; e < H * dim; ++e)
        y[static_cast<std::size_t>((b * n + s) * H * dim + e)] =
            x[static_cast<std::size_t>((b * S + rows[static_cast<std::size_t>(s)]) * H * dim + e)];
  return y;
}

/// Every rank's shard of a per-rank buffer gathered on every rank.
inline std::vector<std::vector<float>> gather_all(std::vector<float> const& mine) {
  int const R = world_size();
  int const n = static_cast<int>(mine.size());
  std::vector<int> counts(static_cast<std::size_t>(R)), displs(static_cast<std::size_t>(R));
  MPI_Allgather(&n, 1, MPI_INT, counts.data(), 1, MPI_INT, MPI_COMM_WORLD);
  int total = 0;
  for (int r = 0; r < R; ++r) {
    displs[static_cast<std::size_t>(r)] = total;
    total += counts[static_cast<std::size_t>(r)];
  }
  std::vector<float> flat(static_cast<std::size_t>(total) + 1);
  MPI_Allgatherv(mine.data(), n, MPI_FLOAT, flat.data(), counts.data(), displs.data(), MPI_FLOAT, MPI_COMM_WORLD);
  std::vector<std::vector<float>> per(static_cast<std::size_t>(R));
  for (int r = 0; r < R; ++r)
    per[static_cast<std::size_t>(r)].assign(flat.begin() + displs[static_cast<std::size_t>(r)],
                                            flat.begin() + displs[static_cast<std::size_t>(r)] +
                                                counts[static_cast<std::size_t>(r)]);
  return per;
}

/// The inverse of take_rows over every rank: per-rank (B, n_r, H, dim) buffers
/// put back at their global token indices, (B, S, H, dim).
inline std::vector<float> to_global(std::vector<std::vector<float>> const& per, problem const& p,
                                    dist::shard_map const& map, std::vector<index_t> const& lengths, index_t H,
                                    index_t dim) {
  std::vector<float> y(static_cast<std::size_t>(p.B * p.S * H * dim));
  for (std::size_t r = 0; r < per.size(); ++r) {
    index_t const nr = lengths[r];
    for (index_t b = 0; b < p.B; ++b)
      for (index_t s = 0; s < nr; ++s) {
        index_t const g = map.global_index(static_cast<index_t>(r), s);
        for (index_t e = 0; e < H * dim; ++e)
          y[static_cast<std::size_t>((b * p.S + g) * H * dim + e)] = per[r][static_cast<std::size_t>((b * nr + s) * H * dim + e)];
      }
  }
  return y;
}

/// Every encoder family, RoPE with every scaling, and a composition.
template <class F>
void for_each_encoder(problem const& p, F const& f) {
  using posenc::rope;
  using posenc::rope_layout;
  using posenc::rope_scaling;
  auto rope_with = [&](rope_scaling s, rope_layout l = rope_layout::half_split) {
    posenc::rope_options o;
    o.scaling = std::move(s);
    return rope<float>(l, p.D, o);
  };
  std::vector<double> sf(static_cast<std::size_t>(p.D / 2)), lf(sf.size());
  for (std::size_t i = 0; i < sf.size(); ++i) {
    sf[i] = 1.0 + 0.1 * static_cast<double>(i);
    lf[i] = 2.0 + 0.3 * static_cast<double>(i);
  }
  f(posenc::none{}, "none");
  f(rope<float>(rope_layout::interleaved, p.D), "rope interleaved");
  f(rope_with(rope_scaling::linear(2.0)), "rope linear");
  f(rope_with(rope_scaling::dynamic_ntk(2.0, 16)), "rope dynamic NTK (past its 16 positions)");
  f(rope_with(rope_scaling::yarn(4.0, 16)), "rope YaRN");
  f(rope_with(rope_scaling::llama3(8.0, 1.0, 4.0, 16)), "rope Llama 3");
  f(rope_with(rope_scaling::longrope(sf, lf, 16, 64)), "rope LongRoPE (long factors)");
  f(posenc::alibi<float>(posenc::alibi_form::paper, p.Hq), "alibi");
  f(posenc::alibi<float>(posenc::alibi_form::key_only, p.Hq), "alibi key-only (absolute key positions)");
  f(posenc::t5_bias<float>(posenc::t5_bias_params{p.Hq, true, 32, 128}, 3, 0.5), "t5 bidirectional");
  f(posenc::t5_bias<float>(posenc::t5_bias_params{p.Hq, false, 32, 128}, 4, 0.5), "t5 causal");
  f(posenc::clipped_bias<float>(6, p.Hq, 5, 0.5), "clipped");
  if (p.Dv == p.D)
    f(posenc::shaw<float>(4, p.D, posenc::shaw_terms::keys_and_values, 6, 0.5), "shaw keys+values");
  else
    f(posenc::shaw<float>(4, p.D, posenc::shaw_terms::keys, 6, 0.5), "shaw keys");
  f(posenc::compose(rope<float>(rope_layout::half_split, p.D), posenc::alibi<float>(posenc::alibi_form::paper, p.Hq)),
    "rope+alibi");
}

}  // namespace posenc_test
