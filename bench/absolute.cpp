// SPDX-License-Identifier: MIT
// add_to of the absolute encoders on (1, 4096, 4096) f32 beside a streaming baseline that moves the same bytes.
//
// add_to reads and writes x (64 MiB) and reads one table row per token
// (64 MiB): the baseline stream_rmw with extra_read_bytes = the table rows is
// the memory-bound floor. Goal: each encoder within 1.3x of it.
#include <cstdint>
#include <string>
#include <vector>

#include <posenc/encoding/learned.hpp>
#include <posenc/encoding/sinusoidal.hpp>

#include "support/baselines.hpp"

namespace {

constexpr posenc::index_t seq = 4096, d_model = 4096;
constexpr std::int64_t x_bytes = seq * d_model * 4, table_bytes = seq * d_model * 4;

// Setup stays out of every run: x is allocated and written once for the whole
// program (posenc_bench::persistent_buffer), the encoders are built in main, and
// one untimed add_to precedes the timed loop. x only grows away from zero
// (x += PE each call), so its values never reach the subnormals.
template <class Encoder>
void add_to_bench(benchmark::State& state, Encoder const& enc) {
  auto& x = posenc_bench::persistent_buffer<float>("absolute/x", seq * d_model, 1.0f);
  auto xv = posenc::make_bsd(x.data(), 1, seq, d_model);
  enc.add_to(xv, posenc::position_span(0));  // warm-up, untimed
  for (auto _ : state) {
    enc.add_to(xv, posenc::position_span(0));
    benchmark::DoNotOptimize(x.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * (2 * x_bytes + table_bytes));
}

}  // namespace

int main(int argc, char** argv) {
  posenc::sinusoidal_params sp;
  sp.d_model = d_model;
  sp.cache_positions = seq;  // the whole (4096, 4096) table is cached
  posenc::sinusoidal<float> const sin_enc(sp);
  auto const lrn = posenc::learned<float>::random(seq, d_model, 7);

  posenc_bench::register_stream("x64MiB+table64MiB", x_bytes, table_bytes);
  benchmark::RegisterBenchmark("sinusoidal/add_to/1x4096x4096",
                               [&](benchmark::State& s) { add_to_bench(s, sin_enc); })
      ->Unit(benchmark::kMicrosecond)
      ->UseRealTime();
  benchmark::RegisterBenchmark("learned/add_to/1x4096x4096", [&](benchmark::State& s) { add_to_bench(s, lrn); })
      ->Unit(benchmark::kMicrosecond)
      ->UseRealTime();
  posenc_bench::register_memcpy("128MiB", 2 * x_bytes);

  // Rows past the cache are computed on the fly (one sin or cos in double per value).
  posenc::sinusoidal_params up = sp;
  up.cache_positions = 0;
  posenc::sinusoidal<float> const uncached(up);
  benchmark::RegisterBenchmark("sinusoidal/add_to_uncached/1x64x4096",
                               [&](benchmark::State& s) {
                                 auto& x = posenc_bench::persistent_buffer<float>("absolute/x64", 64 * d_model, 1.0f);
                                 auto xv = posenc::make_bsd(x.data(), 1, 64, d_model);
                                 uncached.add_to(xv, posenc::position_span(0));  // warm-up, untimed
                                 for (auto _ : s) {
                                   uncached.add_to(xv, posenc::position_span(0));
                                   benchmark::DoNotOptimize(x.data());
                                 }
                                 s.SetItemsProcessed(s.iterations() * 64 * d_model);
                               })
      ->Unit(benchmark::kMicrosecond)
      ->UseRealTime();

  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
