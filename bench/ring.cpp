// SPDX-License-Identifier: MIT
// Ring attention over MPI against one process on one thread, in the same run: speedup and time waiting for blocks.
//
// mpirun -np 2 ./posenc_bench_ring [--seq 16384] [--dim 128] [--heads 8] [--reps 3] [--layout zigzag|contiguous]
//                                  [--backward]
// One untimed call of each first; then each rep runs, alternately, posenc::attention over the whole sequence on rank 0 with one thread
// (the other ranks wait) and ring_attention on every rank (opt.threads = 1: one thread per rank).
// Prints per rep and the medians: seconds, GFLOP/s, the speedup, and the fraction of the ring call
// spent in MPI_Waitall for the next key/value block (the largest over the ranks); the same speedup
// in CPU seconds (robust to a machine shared with other work); and one ring step's transfer alone.
// --backward times the gradients instead: attention_backward<path::fused> on rank 0 against
// ring_attention_backward, both from their forward pass's output and log-sum-exp (computed once, untimed),
// counting 2.5x the forward's flops.
#include <posenc/distributed/ring.hpp>
#include <posenc/distributed/ring_backward.hpp>
#include <posenc/posenc.hpp>

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <time.h>

namespace {

/// A barrier whose waiting ranks sleep instead of spinning, so that they leave the cores to
/// the single-process baseline (MPI_Barrier polls, which takes a core on a shared machine).
void quiet_barrier() {
  MPI_Request rq;
  MPI_Ibarrier(MPI_COMM_WORLD, &rq);
  int done = 0;
  while (true) {
    MPI_Test(&rq, &done, MPI_STATUS_IGNORE);
    if (done) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

/// CPU seconds of the calling thread (every rank computes on its main thread: threads = 1).
double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double median(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  return x.empty() ? 0 : x[x.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int ranks = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  using posenc::index_t;
  namespace dist = posenc::distributed;
  index_t S = 16384, D = 128, H = 8;
  int reps = 3;
  bool single = true, backward = false;
  dist::shard_layout layout = dist::shard_layout::zigzag;
  for (int i = 1; i < argc; ++i) {
    std::string const a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::atoll(argv[++i]) : 0; };
    if (a == "--seq") S = next();
    else if (a == "--dim") D = next();
    else if (a == "--heads") H = next();
    else if (a == "--reps") reps = static_cast<int>(next());
    else if (a == "--no-single") single = false;
    else if (a == "--backward") backward = true;
    else if (a == "--layout" && i + 1 < argc)
      layout = std::strcmp(argv[++i], "contiguous") == 0 ? dist::shard_layout::contiguous : dist::shard_layout::zigzag;
  }
  // Causal: half of the S x S scores, 2 flops per multiply-add in q.k and in p v.
  double const flops = (backward ? 2.5 : 1.0) * 4.0 * static_cast<double>(S) * static_cast<double>(S) / 2 *
                       static_cast<double>(H * D);

  // This rank's shard (random data: the speed does not depend on it).
  std::vector<dist::segment> runs;
  if (layout == dist::shard_layout::zigzag)
    runs = dist::zigzag_segments(S, ranks, rank);
  else
    runs = {dist::even_chunk(S, ranks, rank)};
  index_t n = 0;
  for (auto const& g : runs) n += g.count;
  auto const data = [](index_t count, std::uint64_t seed) {
    std::vector<float> x(static_cast<std::size_t>(count));
    std::uint64_t s = seed;
    for (auto& e : x) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      e = static_cast<float>(static_cast<double>(s >> 40) / static_cast<double>(1ull << 24)) - 0.5f;
    }
    return x;
  };
  std::vector<float> q = data(n * H * D, 1 + static_cast<std::uint64_t>(rank)), k = data(n * H * D, 11),
                     v = data(n * H * D, 21), out(q.size());
  // RoPE with its cos/sin table built for the whole sequence: the single-process call rotates
  // inside its tiles (no rotated copies), the ring rotates its shard once per call.
  posenc::rope<float> rope(posenc::rope_layout::half_split, D);
  rope.reserve(S);
  dist::ring_workspace<float> ws;  // buffers reused from call to call, as from layer to layer
  dist::ring_options<float> opt;
  opt.causal = true;
  opt.threads = 1;
  opt.layout = layout;
  opt.workspace = &ws;

  std::vector<float> fq, fk, fv, fo;
  if (single && rank == 0) {
    fq = data(S * H * D, 2), fk = data(S * H * D, 12), fv = data(S * H * D, 22);
    fo.resize(fq.size());
  }
  // --backward: the forward passes' outputs and log-sum-exp, once; the gradients' buffers.
  std::vector<float> flse, lse, dout = data(n * H * D, 31), dq(q.size()), dk(k.size()), dv(v.size()), fdo, fdq, fdk, fdv;
  if (backward) {
    lse.resize(static_cast<std::size_t>(H * n));
    opt.lse = lse;
    dist::ring_attention(MPI_COMM_WORLD, posenc::make_bshd(q.data(), 1, n, H, D), posenc::make_bshd(k.data(), 1, n, H, D),
                         posenc::make_bshd(v.data(), 1, n, H, D), posenc::make_bshd(out.data(), 1, n, H, D), rope, opt);
    if (single && rank == 0) {
      flse.resize(static_cast<std::size_t>(H * S));
      fdo = data(S * H * D, 32);
      fdq.resize(fq.size()), fdk.resize(fq.size()), fdv.resize(fq.size());
      posenc::attention_options<float> fo_opt = opt;
      fo_opt.lse = flse;
      posenc::attention(posenc::make_bshd(fq.data(), 1, S, H, D), posenc::make_bshd(fk.data(), 1, S, H, D),
                        posenc::make_bshd(fv.data(), 1, S, H, D), posenc::make_bshd(fo.data(), 1, S, H, D), rope, fo_opt);
    }
  }
  auto const whole = [&](std::vector<float>& x) { return posenc::make_bshd(x.data(), 1, S, H, D); };
  auto const mine = [&](std::vector<float>& x) { return posenc::make_bshd(x.data(), 1, n, H, D); };
  auto const run_single = [&] {
    posenc::attention_options<float> so = opt;
    if (!backward) {
      so.lse = nullptr;
      posenc::attention(whole(fq), whole(fk), whole(fv), whole(fo), rope, so);
      return;
    }
    so.lse = flse;
    posenc::no_gradients g;
    posenc::attention_backward<posenc::path::fused>(whole(fq), whole(fk), whole(fv), whole(fo), whole(fdo), whole(fdq),
                                                    whole(fdk), whole(fdv), rope, so, g);
  };
  auto const run_ring = [&] {
    if (!backward) return dist::ring_attention(MPI_COMM_WORLD, mine(q), mine(k), mine(v), mine(out), rope, opt);
    posenc::no_gradients g;
    return dist::ring_attention_backward(MPI_COMM_WORLD, mine(q), mine(k), mine(v), mine(out), mine(dout), mine(dq),
                                         mine(dk), mine(dv), rope, opt, g);
  };
  std::vector<double> t_single, t_ring, waits, c_single, c_ring;
  if (rank == 0)
    std::printf("%s: ranks %d, S %lld, D %lld, H %lld, causal RoPE, layout %s, 1 thread per rank\n",
                backward ? "backward" : "forward", ranks,
                static_cast<long long>(S), static_cast<long long>(D), static_cast<long long>(H),
                layout == dist::shard_layout::zigzag ? "zigzag" : "contiguous");
  for (int rep = -1; rep < reps; ++rep) {  // rep -1: warm-up, not reported
    if (single) {
      quiet_barrier();
      if (rank == 0) {
        double const c0 = thread_cpu_seconds();
        auto const t0 = std::chrono::steady_clock::now();
        run_single();
        double const ts = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (rep >= 0) {
          t_single.push_back(ts);
          c_single.push_back(thread_cpu_seconds() - c0);
        }
      }
    }
    quiet_barrier();
    double const c0 = thread_cpu_seconds();
    auto const t0 = std::chrono::steady_clock::now();
    dist::ring_stats const st = run_ring();
    MPI_Barrier(MPI_COMM_WORLD);  // the ring is done when its last rank is
    double const t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    double const cpu = thread_cpu_seconds() - c0;
    double cpu_max = 0;
    MPI_Reduce(&cpu, &cpu_max, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    double const wf = st.wait_fraction();
    double wf_max = 0, compute_max = 0;
    MPI_Reduce(&wf, &wf_max, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    MPI_Reduce(&st.compute_seconds, &compute_max, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    if (rank == 0 && rep >= 0) {
      t_ring.push_back(t);
      waits.push_back(wf_max);
      c_ring.push_back(cpu_max);
      std::printf("rep %d: single %.3f s (%.1f GFLOP/s), ring %.3f s (%.1f GFLOP/s), compute %.3f s, wait %.2f%%\n",
                  rep, single ? t_single.back() : 0.0, single ? flops / t_single.back() * 1e-9 : 0.0, t,
                  flops / t * 1e-9, compute_max, 100 * wf_max);
    }
  }
  // The transfer alone: one ring step (each rank sends its key/value block to the next and
  // receives the previous one's) with nothing to compute.
  std::vector<double> t_step;
  if (ranks > 1) {
    std::vector<float> a(static_cast<std::size_t>(n * H * 2 * D), 1.0f), b(a.size());
    for (int rep = -1; rep < 5; ++rep) {
      MPI_Barrier(MPI_COMM_WORLD);
      auto const t0 = std::chrono::steady_clock::now();
      MPI_Request rq[2];
      MPI_Irecv(b.data(), static_cast<int>(b.size()), MPI_FLOAT, (rank + ranks - 1) % ranks, 0, MPI_COMM_WORLD, &rq[0]);
      MPI_Isend(a.data(), static_cast<int>(a.size()), MPI_FLOAT, (rank + 1) % ranks, 0, MPI_COMM_WORLD, &rq[1]);
      MPI_Waitall(2, rq, MPI_STATUSES_IGNORE);
      double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), tmax = 0;
      MPI_Reduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
      if (rep >= 0) t_step.push_back(tmax);
    }
  }
  if (rank == 0) {
    double const ts = median(t_single), tr = median(t_ring);
    if (!t_step.empty()) {
      double const bytes = static_cast<double>(n * H * 2 * D) * sizeof(float);
      std::printf("transfer alone: %.1f MiB per step in %.4f s (%.2f GB/s per rank); ring time per step %.3f s\n",
                  bytes / (1 << 20), median(t_step), bytes / median(t_step) * 1e-9, tr / ranks);
    }
    std::printf("median: single %.3f s, ring %.3f s on %d ranks, speedup %.2fx, wait fraction %.2f%%\n", ts, tr,
                ranks, single ? ts / tr : 0.0, 100 * median(waits));
    // CPU time: what each rank computed (and polled), whatever share of a core the machine gave it.
    std::printf("median CPU seconds: single %.3f s, ring %.3f s (the busiest rank), speedup %.2fx\n",
                median(c_single), median(c_ring), single ? median(c_single) / median(c_ring) : 0.0);
  }
  MPI_Finalize();
  return 0;
}
