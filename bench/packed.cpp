// SPDX-License-Identifier: MIT
// Packed variable-length attention against one sequence of the same token count and the padded batch it replaces.
//
// GFLOP/s counts 4 * D * H per visible (query, key) pair of the work asked for:
// causal prefill of sequences of lengths L_s is sum_s L_s (L_s + 1) / 2 pairs for
// the packed call and the padded batch alike (the padded batch's extra work on
// padding rows is not counted: its rate is the useful rate), T (T + 1) / 2 for
// one sequence of T = sum_s L_s tokens. Batched decode: one query per
// sequence, x_stream = call time / time to read every sequence's K and V once.
#include <posenc/attention/attention.hpp>
#include <posenc/attention/packed.hpp>
#include <posenc/core/simd.hpp>
#include <posenc/core/threading.hpp>
#include <posenc/encoding/none.hpp>
#include <posenc/encoding/rope.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "support/baselines.hpp"

namespace {

using posenc::index_t;

constexpr index_t H = 8, D = 64;

/// Prefill lengths spread between 64 and 2048 (sum 6336).
std::vector<index_t> const prefill_lengths{2048, 64, 768, 256, 1536, 128, 1024, 512};
/// Decode key lengths spread between 256 and 4096 (16 sequences).
std::vector<index_t> decode_lengths() {
  std::vector<index_t> l;
  for (index_t s = 0; s < 16; ++s) l.push_back(256 + (s * 7 % 16) * 256);
  return l;
}

posenc::aligned_buffer<float>& random_floats(std::string const& key, index_t n, std::uint32_t seed) {
  return posenc_bench::persistent_buffer_filled<float>(key, n, [seed](auto& b) {
    std::mt19937 gen(seed);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    for (auto& x : b) x = dist(gen);
  });
}

double causal_pairs(std::vector<index_t> const& lens) {
  double p = 0;
  for (index_t L : lens) p += 0.5 * static_cast<double>(L) * static_cast<double>(L + 1);
  return p;
}

enum class layout { packed, one_sequence, padded };

/// Causal prefill with RoPE (reserved, as a model does at load) in one of the three layouts.
void prefill_bench(benchmark::State& state, layout lay, int threads) {
  std::vector<index_t> const& lens = prefill_lengths;
  index_t total = 0, longest = 0;
  for (index_t L : lens) total += L, longest = std::max(longest, L);
  index_t const B = lay == layout::padded ? static_cast<index_t>(lens.size()) : 1;
  index_t const S = lay == layout::padded ? longest : total;
  auto& q = random_floats("packed/q/" + std::to_string(B * S), B * S * H * D, 1);
  auto& k = random_floats("packed/k/" + std::to_string(B * S), B * S * H * D, 2);
  auto& v = random_floats("packed/v/" + std::to_string(B * S), B * S * H * D, 3);
  auto& out = posenc_bench::persistent_buffer<float>("packed/out/" + std::to_string(B * S), B * S * H * D, 0.0f);
  posenc::rope<float> rope(posenc::rope_layout::half_split, D);
  rope.reserve(S);
  std::vector<index_t> const cu = posenc::cumulative_lengths(lens);
  posenc::attention_options<float> opt;
  opt.causal = true;
  opt.threads = threads;
  if (lay == layout::padded) opt.key_lengths = lens;
  auto qv = posenc::make_bshd<const float>(q.data(), B, S, H, D);
  auto kv = posenc::make_bshd<const float>(k.data(), B, S, H, D);
  auto vv = posenc::make_bshd<const float>(v.data(), B, S, H, D);
  auto ov = posenc::make_bshd(out.data(), B, S, H, D);
  auto call = [&] {
    if (lay == layout::packed)
      posenc::attention(qv, kv, vv, ov, posenc::packed_sequences{cu, cu}, rope, opt);
    else
      posenc::attention(qv, kv, vv, ov, rope, opt);
  };
  call();  // warm-up, untimed
  for (auto _ : state) {
    call();
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  double const pairs = lay == layout::one_sequence ? causal_pairs({total}) : causal_pairs(lens);
  state.counters["GFLOP/s"] = benchmark::Counter(4.0 * D * H * pairs * 1e-9 * static_cast<double>(state.iterations()),
                                                 benchmark::Counter::kIsRate);
  state.counters["tokens"] = static_cast<double>(total);
  state.counters["threads"] = threads;
}

/// One decode step of 16 sequences (one query each over 256 .. 4096 keys, H = 8, D = 128) in one packed call;
/// x_stream: its time over the time to read all their K and V once, both measured in this loop.
void decode_bench(benchmark::State& state, int threads) {
  constexpr index_t Dd = 128;
  std::vector<index_t> const lens = decode_lengths();
  std::vector<index_t> ones(lens.size(), 1);
  std::vector<index_t> const cu_q = posenc::cumulative_lengths(ones), cu_k = posenc::cumulative_lengths(lens);
  index_t const n = static_cast<index_t>(lens.size()), Sk = cu_k.back();
  auto& q = random_floats("decode/q", n * H * Dd, 4);
  auto& k = random_floats("decode/k", Sk * H * Dd, 5);
  auto& v = random_floats("decode/v", Sk * H * Dd, 6);
  auto& out = posenc_bench::persistent_buffer<float>("decode/out", n * H * Dd, 0.0f);
  posenc::attention_options<float> opt;
  opt.causal = true;
  opt.threads = threads;
  auto call = [&] {
    posenc::attention(posenc::make_bshd<const float>(q.data(), 1, n, H, Dd),
                      posenc::make_bshd<const float>(k.data(), 1, Sk, H, Dd),
                      posenc::make_bshd<const float>(v.data(), 1, Sk, H, Dd), posenc::make_bshd(out.data(), 1, n, H, Dd),
                      posenc::packed_sequences{cu_q, cu_k}, posenc::none{}, opt);
  };
  // Reads K and V once, split over the threads (4 vector accumulators per array).
  auto read = [&] {
    using V = posenc::simd::batch<float>;
    constexpr index_t W = posenc::simd::width<float>;
    std::vector<float> part(static_cast<std::size_t>(threads), 0.0f);
    index_t const len = k.size(), chunk = (len / threads + W - 1) / W * W;
    posenc::parallel_for(threads, threads, [&](index_t t) {
      index_t const lo = t * chunk, hi = std::min(len, lo + chunk);
      float s = 0;
      for (float const* x : {k.data(), v.data()}) {
        V a0(0.0f), a1(0.0f), a2(0.0f), a3(0.0f);
        index_t i = lo;
        for (; i + 4 * W <= hi; i += 4 * W) {
          a0 = a0 + posenc::simd::load(x + i);
          a1 = a1 + posenc::simd::load(x + i + W);
          a2 = a2 + posenc::simd::load(x + i + 2 * W);
          a3 = a3 + posenc::simd::load(x + i + 3 * W);
        }
        s += posenc::simd::reduce_add((a0 + a1) + (a2 + a3));
        for (; i < hi; ++i) s += x[i];
      }
      part[static_cast<std::size_t>(t)] = s;
    });
    return part;
  };
  auto& evict = posenc_bench::persistent_buffer<float>("decode/evict", index_t{64} << 20, 1.0f);
  auto flush = [&] {
    float s = 0;
    for (index_t i = 0; i < evict.size(); i += 16) s += evict[i];
    return s;
  };
  call();
  benchmark::DoNotOptimize(read());
  double attn_s = 0, read_s = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(flush());
    auto const t0 = std::chrono::steady_clock::now();
    call();
    benchmark::ClobberMemory();
    auto const t1 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(flush());
    auto const t2 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(read());
    auto const t3 = std::chrono::steady_clock::now();
    attn_s += std::chrono::duration<double>(t1 - t0).count();
    read_s += std::chrono::duration<double>(t3 - t2).count();
    state.SetIterationTime(std::chrono::duration<double>(t1 - t0).count());
  }
  state.counters["x_stream"] = read_s > 0 ? attn_s / read_s : 0.0;
  state.counters["threads"] = threads;
  state.SetBytesProcessed(state.iterations() * 2 * Sk * H * Dd * static_cast<std::int64_t>(sizeof(float)));
}

}  // namespace

int main(int argc, char** argv) {
  Eigen::setNbThreads(1);
  posenc_bench::register_fma_peak();
  for (int t : {1, 2}) {
    std::string const suffix = "/H8_D64_rope/threads:" + std::to_string(t);
    benchmark::RegisterBenchmark(("packed/prefill_64..2048x8" + suffix).c_str(),
                                 [t](benchmark::State& s) { prefill_bench(s, layout::packed, t); })
        ->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(0.5);
    benchmark::RegisterBenchmark(("packed/one_sequence_6336" + suffix).c_str(),
                                 [t](benchmark::State& s) { prefill_bench(s, layout::one_sequence, t); })
        ->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(0.5);
    benchmark::RegisterBenchmark(("packed/padded_8x2048" + suffix).c_str(),
                                 [t](benchmark::State& s) { prefill_bench(s, layout::padded, t); })
        ->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(0.5);
    benchmark::RegisterBenchmark(("packed/decode_16x256..4096/H8_D128/threads:" + std::to_string(t)).c_str(),
                                 [t](benchmark::State& s) { decode_bench(s, t); })
        ->Unit(benchmark::kMicrosecond)->UseManualTime();
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
