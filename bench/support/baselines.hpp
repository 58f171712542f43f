// SPDX-License-Identifier: MIT
// In-run baselines every bench binary can register beside its own numbers, so
// results read as ratios measured in the same run: memcpy of N bytes, an
// in-place streaming read-modify-write of N bytes, an Eigen GEMM of a given
// shape, and a register-only FMA loop (the peak GFLOP/s of one core).
#pragma once

#include <benchmark/benchmark.h>

#include <Eigen/Core>
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <posenc/core/aligned_buffer.hpp>
#include <posenc/core/simd.hpp>

namespace posenc_bench {

/// A buffer of n elements filled by `fill(buffer)`, allocated on the first call for
/// `key` and handed out again, the same memory, on every later call for the same
/// key and size until the program ends.
///
/// Google Benchmark calls a benchmark function again for every run and every
/// repetition; under --benchmark_enable_random_interleaving those calls come
/// between runs of other benchmarks. A buffer allocated inside the function is
/// then freed and mapped afresh each time, on other physical pages, after other
/// benchmarks have evicted everything. Taking the inputs from here keeps setup
/// (allocation, first touch, filling) out of every run: a run starts on memory
/// already mapped and written, the same pages as the run before.
template <class T, class Fill>
posenc::aligned_buffer<T>& persistent_buffer_filled(std::string const& key, std::int64_t n, Fill&& fill) {
  static std::map<std::string, std::unique_ptr<posenc::aligned_buffer<T>>> buffers;
  auto& b = buffers[key + "/" + std::to_string(n)];
  if (!b) {
    b = std::make_unique<posenc::aligned_buffer<T>>(n);
    fill(*b);
  }
  return *b;
}
/// persistent_buffer_filled with every element `value`.
template <class T>
posenc::aligned_buffer<T>& persistent_buffer(std::string const& key, std::int64_t n, T value) {
  return persistent_buffer_filled<T>(key, n,
                                     [value](posenc::aligned_buffer<T>& b) { std::fill(b.begin(), b.end(), value); });
}

/// memcpy of `bytes` bytes (read `bytes`, write `bytes`).
inline void memcpy_baseline(benchmark::State& state, std::int64_t bytes) {
  auto& src = persistent_buffer<char>("memcpy/src", bytes, 1);
  auto& dst = persistent_buffer<char>("memcpy/dst", bytes, 0);
  std::memcpy(dst.data(), src.data(), static_cast<std::size_t>(bytes));  // warm-up, untimed
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), static_cast<std::size_t>(bytes));
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * 2 * bytes);
}

/// In-place streaming read-modify-write of `bytes` bytes of float (x = x * a + b),
/// plus `extra_read_bytes` read from a second buffer and added (e.g. a table).
inline void stream_rmw_baseline(benchmark::State& state, std::int64_t bytes, std::int64_t extra_read_bytes = 0) {
  std::int64_t const n = bytes / 4, m = extra_read_bytes / 4;
  // x converges to 1 (x * 0.999 + 0.001), never towards the subnormals, however
  // many runs share the buffer.
  auto& x = persistent_buffer<float>("stream/x", n, 1.0f);
  auto& t = persistent_buffer<float>("stream/table", m > 0 ? m : 1, 0.001f);
  auto pass = [&] {
    float* __restrict xp = x.data();
    float const* __restrict tp = t.data();
    if (m > 0) {
      // The table is read cyclically, chunk by chunk: a per-element i % m
      // (an integer division) would make this loop compute-bound.
      for (std::int64_t i0 = 0; i0 < n; i0 += m) {
        std::int64_t const len = n - i0 < m ? n - i0 : m;
        float* __restrict xc = xp + i0;
        for (std::int64_t j = 0; j < len; ++j) xc[j] = xc[j] * 0.999f + tp[j];
      }
    } else {
      for (std::int64_t i = 0; i < n; ++i) xp[i] = xp[i] * 0.999f + 0.001f;
    }
  };
  pass();  // warm-up, untimed
  for (auto _ : state) {
    pass();
    benchmark::DoNotOptimize(x.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * (2 * bytes + extra_read_bytes));
}

/// Eigen GEMM C(m x n) = A(m x k) * B(k x n), float; counts 2*m*n*k flops.
inline void gemm_baseline(benchmark::State& state, std::int64_t m, std::int64_t n, std::int64_t k) {
  using M = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  // Allocated and filled once per shape; one untimed product first.
  static std::map<std::string, std::unique_ptr<M>> mats;
  std::string const key = std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k);
  auto& pa = mats["a/" + key];
  auto& pb = mats["b/" + key];
  auto& pc = mats["c/" + key];
  if (!pa) {
    pa = std::make_unique<M>(M::Random(m, k));
    pb = std::make_unique<M>(M::Random(k, n));
    pc = std::make_unique<M>(M::Zero(m, n));
  }
  M const& a = *pa;
  M const& b = *pb;
  M& c = *pc;
  c.noalias() = a * b;
  for (auto _ : state) {
    c.noalias() = a * b;
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  state.counters["GFLOP/s"] = benchmark::Counter(static_cast<double>(2 * m * n * k) * 1e-9 *
                                                     static_cast<double>(state.iterations()),
                                                 benchmark::Counter::kIsRate);
}

/// Register-only FMA loop: 8 independent accumulators per lane group, the
/// peak floating-point rate of one core for float.
inline void fma_peak_baseline(benchmark::State& state) {
  using B = posenc::simd::batch<float>;
  constexpr int chains = 12;  // enough independent chains to cover 2 FMA ports x 4-cycle latency
  std::int64_t const iters = 1 << 16;
  for (auto _ : state) {
    B acc[chains];
    for (int c = 0; c < chains; ++c) acc[c] = B(1.0f + 0.001f * static_cast<float>(c));
    B const a(0.9999f), b(0.0001f);
    for (std::int64_t i = 0; i < iters; ++i)
      for (int c = 0; c < chains; ++c) acc[c] = posenc::simd::fma(acc[c], a, b);
    B s = acc[0];
    for (int c = 1; c < chains; ++c) s = s + acc[c];
    float r = posenc::simd::reduce_add(s);
    benchmark::DoNotOptimize(r);
  }
  double const flops = 2.0 * chains * static_cast<double>(B::size) * static_cast<double>(iters);
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops * 1e-9 * static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}

/// Registers the baselines by name: "baseline/memcpy/<bytes>", ...
inline void register_memcpy(std::string const& label, std::int64_t bytes) {
  benchmark::RegisterBenchmark(("baseline/memcpy/" + label).c_str(),
                               [bytes](benchmark::State& s) { memcpy_baseline(s, bytes); })
      ->Unit(benchmark::kMicrosecond)
      ->UseRealTime();
}
inline void register_stream(std::string const& label, std::int64_t bytes, std::int64_t extra_read_bytes = 0) {
  benchmark::RegisterBenchmark(("baseline/stream_rmw/" + label).c_str(),
                               [bytes, extra_read_bytes](benchmark::State& s) {
                                 stream_rmw_baseline(s, bytes, extra_read_bytes);
                               })
      ->Unit(benchmark::kMicrosecond)
      ->UseRealTime();
}
inline void register_gemm(std::string const& label, std::int64_t m, std::int64_t n, std::int64_t k) {
  benchmark::RegisterBenchmark(("baseline/gemm/" + label).c_str(),
                               [m, n, k](benchmark::State& s) { gemm_baseline(s, m, n, k); })
      ->Unit(benchmark::kMicrosecond)
      ->UseRealTime();
}
inline void register_fma_peak() {
  benchmark::RegisterBenchmark("baseline/fma_peak", [](benchmark::State& s) { fma_peak_baseline(s); })
      ->Unit(benchmark::kMicrosecond)
      ->UseRealTime();
}

}  // namespace posenc_bench
