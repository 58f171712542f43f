// SPDX-License-Identifier: MIT
// attention_backward on path::fused in float beside the in-run FMA peak; the learned table's scatter-add beside a stream.
//
// GFLOP/s counts 2.5x the forward FLOPs, as flash-attention's papers do: five
// products of 2 D per visible (query, key) pair and head (q.k, dO.v, P^T dO,
// dS^T Q, dS K; full: Sq * Sk pairs, causal: Sk (Sk + 1) / 2). The
// probabilities are recomputed from the forward pass's lse (given here, as a
// training step has it).
#include <posenc/attention/attention.hpp>
#include <posenc/attention/backward.hpp>
#include <posenc/attention/fused.hpp>
#include <posenc/encoding/learned.hpp>
#include <posenc/encoding/none.hpp>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "support/baselines.hpp"

namespace {

using posenc::index_t;

struct config {
  index_t S, H, D;
  bool causal;
  int threads;
};

posenc::aligned_buffer<float>& random_floats(std::string const& key, std::size_t n, std::uint32_t seed) {
  return posenc_bench::persistent_buffer_filled<float>(key, static_cast<std::int64_t>(n), [seed](auto& b) {
    std::mt19937 gen(seed);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    for (auto& x : b) x = dist(gen);
  });
}

/// One fused backward call per iteration on (1, S, H, D) tensors; out and lse from one untimed forward pass.
void backward_bench(benchmark::State& state, config c) {
  std::size_t const n = static_cast<std::size_t>(c.S * c.H * c.D);
  std::string const key = std::to_string(c.S) + "x" + std::to_string(c.H) + "x" + std::to_string(c.D);
  auto& q = random_floats("bwd/q" + key, n, 1);
  auto& k = random_floats("bwd/k" + key, n, 2);
  auto& v = random_floats("bwd/v" + key, n, 3);
  auto& dout = random_floats("bwd/dout" + key, n, 4);
  std::vector<float> out(n), dq(n), dk(n), dv(n), lse(static_cast<std::size_t>(c.S * c.H));
  auto at = [&](float const* p) { return posenc::make_bshd<const float>(p, 1, c.S, c.H, c.D); };
  auto mut = [&](std::vector<float>& x) { return posenc::make_bshd(x.data(), 1, c.S, c.H, c.D); };
  posenc::attention_options<float> opt;
  opt.causal = c.causal;
  opt.threads = c.threads;
  opt.lse = lse;
  posenc::attention<posenc::path::fused>(at(q.data()), at(k.data()), at(v.data()), mut(out), posenc::none{}, opt);
  posenc::no_gradients g;
  auto call = [&] {
    posenc::attention_backward<posenc::path::fused>(at(q.data()), at(k.data()), at(v.data()), at(out.data()),
                                                    at(dout.data()), mut(dq), mut(dk), mut(dv), posenc::none{}, opt,
                                                    g);
  };
  call();  // warm-up, untimed
  for (auto _ : state) {
    call();
    benchmark::DoNotOptimize(dq.data());
    benchmark::ClobberMemory();
  }
  double const S = static_cast<double>(c.S);
  double const pairs = c.causal ? S * (S + 1) / 2 : S * S;
  double const flops = 2.5 * 4.0 * static_cast<double>(c.D) * static_cast<double>(c.H) * pairs;
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops * 1e-9 * static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
  state.counters["threads"] = c.threads;
}

constexpr index_t table_seq = 4096, table_dim = 4096;

/// learned::add_to_backward of (1, 4096, 4096) into a (4096, 4096) table: reads d(x) and
/// read-modify-writes the table, the bytes of stream_rmw over 64 MiB plus a 64 MiB read.
void scatter_add_bench(benchmark::State& state) {
  static auto const lrn = posenc::learned<float>::random(table_seq, table_dim, 7);
  auto& dx = random_floats("bwd/dx", static_cast<std::size_t>(table_seq * table_dim), 9);
  auto g = lrn.make_gradients();
  auto dxv = posenc::make_bsd<const float>(dx.data(), 1, table_seq, table_dim);
  lrn.add_to_backward(dxv, posenc::position_span(0), g);  // warm-up, untimed
  for (auto _ : state) {
    lrn.add_to_backward(dxv, posenc::position_span(0), g);
    benchmark::DoNotOptimize(g.table.data());
    benchmark::ClobberMemory();
  }
  std::int64_t const bytes = table_seq * table_dim * 4;
  state.SetBytesProcessed(state.iterations() * 3 * bytes);
}

void add(config c) {
  std::string const name = std::string("attention_backward/fused/") + (c.causal ? "causal" : "full") + "/H" +
                           std::to_string(c.H) + "/S" + std::to_string(c.S) + "/D" + std::to_string(c.D) +
                           "/threads:" + std::to_string(c.threads);
  benchmark::RegisterBenchmark(name.c_str(), [c](benchmark::State& s) { backward_bench(s, c); })
      ->Unit(benchmark::kMillisecond)
      ->MinTime(0.3)
      ->UseRealTime();
}

}  // namespace

int main(int argc, char** argv) {
  posenc_bench::register_fma_peak();
  for (bool causal : {false, true}) add({4096, 8, 128, causal, 1});
  add({4096, 8, 64, false, 1});
  for (bool causal : {false, true}) add({4096, 8, 128, causal, 2});
  std::int64_t const bytes = table_seq * table_dim * 4;
  posenc_bench::register_stream("x64MiB+dx64MiB", bytes, bytes);
  benchmark::RegisterBenchmark("learned/add_to_backward/1x4096x4096", [](benchmark::State& s) { scatter_add_bench(s); })
      ->Unit(benchmark::kMicrosecond)
      ->UseRealTime();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
