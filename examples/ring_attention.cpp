// SPDX-License-Identifier: MIT
// Ring attention over MPI: each rank holds a zig-zag shard of a causal RoPE sequence; checked against one process.
//
// Run: mpirun -np 2 ./posenc_example_ring_attention
// (on several machines: mpirun --hostfile hosts -np 8 ./posenc_example_ring_attention)
#include <posenc/distributed/ring.hpp>
#include <posenc/posenc.hpp>

#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int ranks = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  using posenc::index_t;
  namespace dist = posenc::distributed;

  // The whole sequence: (batch 1, 1000 tokens, 8 query heads over 2 key/value heads, head_dim 64).
  index_t const S = 1000, Hq = 8, Hkv = 2, D = 64;
  std::mt19937_64 gen(7);  // the same seed on every rank: every rank can build the whole sequence
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto random = [&](index_t n) {
    std::vector<float> x(static_cast<std::size_t>(n));
    for (auto& e : x) e = normal(gen);
    return x;
  };
  std::vector<float> q = random(S * Hq * D), k = random(S * Hkv * D), v = random(S * Hkv * D);

  // This rank's shard: chunks rank and 2R-1-rank of 2R (zig-zag), in that order.
  std::vector<dist::segment> const runs = dist::zigzag_segments(S, ranks, rank);
  auto take = [&](std::vector<float> const& x, index_t heads) {
    std::vector<float> y;
    for (dist::segment const& g : runs)
      y.insert(y.end(), x.begin() + g.first * heads * D, x.begin() + (g.first + g.count) * heads * D);
    return y;
  };
  std::vector<float> qs = take(q, Hq), ks = take(k, Hkv), vs = take(v, Hkv);
  index_t const n = static_cast<index_t>(qs.size()) / (Hq * D);
  std::vector<float> out(qs.size());

  posenc::rope<float> rope(posenc::rope_layout::half_split, D);
  dist::ring_options<float> opt;
  opt.causal = true;
  opt.layout = dist::shard_layout::zigzag;
  dist::ring_stats const st =
      dist::ring_attention(MPI_COMM_WORLD, posenc::make_bshd(qs.data(), 1, n, Hq, D), posenc::make_bshd(ks.data(), 1, n, Hkv, D),
                           posenc::make_bshd(vs.data(), 1, n, Hkv, D), posenc::make_bshd(out.data(), 1, n, Hq, D), rope, opt);

  // Check: the same rows of one process's attention over the whole sequence.
  std::vector<float> full(q.size());
  posenc::attention(posenc::make_bshd(q.data(), 1, S, Hq, D), posenc::make_bshd(k.data(), 1, S, Hkv, D),
                    posenc::make_bshd(v.data(), 1, S, Hkv, D), posenc::make_bshd(full.data(), 1, S, Hq, D), rope,
                    static_cast<posenc::attention_options<float> const&>(opt));
  float diff = 0;
  std::size_t i = 0;
  for (dist::segment const& g : runs)
    for (index_t e = g.first * Hq * D; e < (g.first + g.count) * Hq * D; ++e, ++i)
      diff = std::fmax(diff, std::fabs(out[i] - full[static_cast<std::size_t>(e)]));
  float worst = 0;
  MPI_Reduce(&diff, &worst, 1, MPI_FLOAT, MPI_MAX, 0, MPI_COMM_WORLD);
  std::printf("rank %d: tokens %lld, blocks run %lld, skipped %lld, waited %.1f%% of %.3f s\n", rank,
              static_cast<long long>(n), static_cast<long long>(st.blocks_run),
              static_cast<long long>(st.blocks_skipped), 100 * st.wait_fraction(), st.seconds);
  if (rank == 0) std::printf("%d ranks: max |ring - one process| = %.1e\n", ranks, static_cast<double>(worst));
  MPI_Finalize();
  return worst < 1e-5f ? 0 : 1;
}
