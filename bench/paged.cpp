// SPDX-License-Identifier: MIT
// Decode over a paged_kv_cache beside the contiguous kv_cache decode and a stream read of the same K and V.
//
// Every iteration times the paged call and its baseline in the same loop (each
// after an untimed pass over a large buffer that evicts K and V from every
// cache level), so the ratio counters hold up when the machine is busy:
//   x_contiguous = paged decode time / contiguous kv_cache decode time (same sequence)
//   x_read_layout = time to read the sequence's K and V once in its pages / the same read
//                   of K and V laid contiguously (what the page layout alone costs the memory system)
//   x_stream     = paged batched decode time / time to read all its K and V once (a contiguous copy)
//   x_read_pages = paged batched decode time / time to read the same K and V in place in their pages
//   compact: x_copy = paged_kv_cache::compact() of a fragmented pool / memcpy of the bytes of the pages it moved
//   x_contiguous (prefill) = causal prefill of a prompt over its pages / the same prefill on contiguous K and V
//   16-bit decode (fp16, bf16), pages of Eigen::half / Eigen::bfloat16 read in place:
//   x_contiguous = paged decode time / kv_cache<same type> decode time (same sequence)
//   x_stream     = paged decode time / time to read its 16-bit K and V once (widened to float and summed)
#include <posenc/attention/attention.hpp>
#include <posenc/attention/kv_cache.hpp>
#include <posenc/attention/paged_attention.hpp>
#include <posenc/attention/paged_kv_cache.hpp>
#include <posenc/core/half.hpp>
#include <posenc/encoding/none.hpp>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "support/baselines.hpp"

namespace {

using posenc::index_t;
index_t const H = 8, D = 128;

std::vector<float> random_floats(std::size_t n, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> x(n);
  for (auto& v : x) v = dist(gen);
  return x;
}

float evict_caches(posenc::aligned_buffer<float> const& buf) {
  float s = 0;
  for (index_t i = 0; i < buf.size(); i += 16) s += buf[i];
  return s;
}

/// Sums n floats once on `threads` threads (a read of K and V).
float read_once(float const* x, std::int64_t n, int threads) {
  using B = posenc::simd::batch<float>;
  constexpr std::int64_t W = posenc::simd::width<float>;
  std::vector<float> part(static_cast<std::size_t>(threads), 0.0f);
  std::int64_t const chunk = (n / threads + W - 1) / W * W;
  posenc::parallel_for(threads, threads, [&](index_t t) {
    std::int64_t const lo = t * chunk, hi = std::min(n, lo + chunk);
    B a0(0.0f), a1(0.0f), a2(0.0f), a3(0.0f);
    std::int64_t i = lo;
    for (; i + 4 * W <= hi; i += 4 * W) {
      a0 = a0 + posenc::simd::load(x + i);
      a1 = a1 + posenc::simd::load(x + i + W);
      a2 = a2 + posenc::simd::load(x + i + 2 * W);
      a3 = a3 + posenc::simd::load(x + i + 3 * W);
    }
    float s = posenc::simd::reduce_add((a0 + a1) + (a2 + a3));
    for (; i < hi; ++i) s += x[i];
    part[static_cast<std::size_t>(t)] = s;
  });
  float s = 0;
  for (float v : part) s += v;
  return s;
}

/// Sums every key and value of the pages in `table` once, in place, kv head
/// by kv head (the pool is head-major: each kv head's rows of a page are one
/// block), the heads split evenly over `threads` threads (a read of K and V
/// in the pages' layout, in the order attention reads them).
float read_pages(posenc::paged_kv_cache<float> const& cache, posenc::span<const index_t> table, int threads) {
  using B = posenc::simd::batch<float>;
  constexpr index_t W = posenc::simd::width<float>;
  index_t const n = static_cast<index_t>(table.size());
  index_t const len = cache.page_tokens() * D;  // elements of one kv head's block of a page
  std::vector<float> part(static_cast<std::size_t>(threads), 0.0f);
  posenc::parallel_for(threads, threads, [&](index_t t) {
    B acc(0.0f);
    for (index_t h = t * H / threads; h < (t + 1) * H / threads; ++h)
      for (index_t i = 0; i < n; ++i)
        for (float const* x : {cache.page_keys(table[i], 1).ptr(0, 0, h), cache.page_values(table[i], 1).ptr(0, 0, h)})
          for (index_t e = 0; e + W <= len; e += W) acc = acc + posenc::simd::load(x + e);
    part[static_cast<std::size_t>(t)] = posenc::simd::reduce_add(acc);
  });
  float s = 0;
  for (float v : part) s += v;
  return s;
}

/// Sums n 16-bit values of format S once on `threads` threads, each widened
/// to float (a read of 16-bit K and V).
template <class S>
float read_once_16(S const* x, std::int64_t n, int threads) {
  using B = posenc::simd::batch<float>;
  constexpr std::int64_t W = posenc::simd::width<float>;
  constexpr auto f_v = posenc::detail::half_format_of_v<S>;
  std::uint16_t const* bits = posenc::detail::half_bits(x);
  std::vector<float> part(static_cast<std::size_t>(threads), 0.0f);
  std::int64_t const chunk = (n / threads + W - 1) / W * W;
  posenc::parallel_for(threads, threads, [&](index_t t) {
    std::int64_t const lo = t * chunk, hi = std::min(n, lo + chunk);
    B a0(0.0f), a1(0.0f);
    std::int64_t i = lo;
    for (; i + 2 * W <= hi; i += 2 * W) {
      a0 = a0 + posenc::simd::load_widen<f_v>(bits + i);
      a1 = a1 + posenc::simd::load_widen<f_v>(bits + i + W);
    }
    float s = posenc::simd::reduce_add(a0 + a1);
    for (; i < hi; ++i) s += posenc::detail::stored_value<float>(x[i]);
    part[static_cast<std::size_t>(t)] = s;
  });
  float s = 0;
  for (float v : part) s += v;
  return s;
}

/// How the measured sequence's pages lie in the pool.
enum class page_order { consecutive, scattered, compacted, after_frees, interleaved };

/// Fragments a fresh pool: one-page sequences fill it, then those holding an
/// even page are freed, so that every free page lies between used ones and a
/// sequence that takes pages gets every page as its own run.
template <class T>
void fragment_pool(posenc::paged_kv_cache<T>& paged, std::vector<float> const& k, std::vector<float> const& v) {
  std::vector<index_t> fillers;
  for (index_t n = 0; n < paged.pages(); ++n) {
    fillers.push_back(paged.add_sequence());
    paged.append(fillers.back(), posenc::make_bshd<const float>(k.data(), 1, 1, H, D),
                 posenc::make_bshd<const float>(v.data(), 1, 1, H, D), posenc::none{});
  }
  for (index_t id : fillers)
    if (paged.page_table(id)[0] % 2 == 0) paged.free(id);
}

/// One sequence of 4096 tokens, 16-token pages. `scattered`: the pool was
/// fragmented first (every page of the sequence its own run);
/// `interleaved`: the sequence and another grow together, a page each in
/// turn (as sequences of a decode batch do; the pool keeps each one's pages
/// consecutive where it can); `compacted`: as `scattered`, then
/// `compact()` moved the pages into one run; `after_frees`: two sequences filled the pool
/// alternately and were freed, then the measured one takes the freed pages;
/// else consecutive. Baseline: the same decode over a contiguous kv_cache.
void decode_vs_contiguous(benchmark::State& state, page_order order, int threads) {
  bool const interleaved = order == page_order::interleaved;
  index_t const S = 4096, P = 16;
  auto const k = random_floats(static_cast<std::size_t>(S * H * D), 2);
  auto const v = random_floats(static_cast<std::size_t>(S * H * D), 3);
  auto const q = random_floats(static_cast<std::size_t>(H * D), 1);
  std::vector<float> out(q.size());
  posenc::paged_kv_cache<float> paged(2 * S / P + 2, P, H, D);
  if (order == page_order::scattered || order == page_order::compacted) fragment_pool(paged, k, v);
  if (order == page_order::after_frees) {
    index_t const a = paged.add_sequence(), b = paged.add_sequence();
    for (index_t s = 0; s < S; s += P)
      for (index_t x : {a, b})
        paged.append(x, posenc::make_bshd<const float>(k.data() + s * H * D, 1, P, H, D),
                     posenc::make_bshd<const float>(v.data() + s * H * D, 1, P, H, D), posenc::none{});
    paged.free(a);
    paged.free(b);
  }
  index_t const id = paged.add_sequence(), other = paged.add_sequence();
  for (index_t s = 0; s < S; s += P) {
    auto const kp = posenc::make_bshd<const float>(k.data() + s * H * D, 1, P, H, D);
    auto const vp = posenc::make_bshd<const float>(v.data() + s * H * D, 1, P, H, D);
    paged.append(id, kp, vp, posenc::none{});
    if (interleaved) paged.append(other, kp, vp, posenc::none{});
  }
  if (order == page_order::compacted) paged.compact();
  posenc::kv_cache<float> contiguous(1, H, D);
  contiguous.append(posenc::make_bshd<const float>(k.data(), 1, S, H, D),
                    posenc::make_bshd<const float>(v.data(), 1, S, H, D), posenc::none{});
  auto& evict = posenc_bench::persistent_buffer<float>("paged/evict", index_t{64} << 20, 1.0f);
  posenc::attention_options<float> opt;
  opt.causal = true;
  opt.threads = threads;
  posenc::paged_attention_workspace<float> ws;
  std::vector<index_t> const ids = {id};
  auto const qv = posenc::make_bshd<const float>(q.data(), 1, 1, H, D);
  auto const ov = posenc::make_bshd(out.data(), 1, 1, H, D);
  auto run_paged = [&] { posenc::attention<posenc::path::fused>(qv, paged, ids, ov, posenc::none{}, opt, ws); };
  auto run_contiguous = [&] { posenc::attention<posenc::path::fused>(qv, contiguous, ov, posenc::none{}, opt); };
  run_paged();
  run_contiguous();
  double paged_s = 0, contiguous_s = 0, pages_read_s = 0, read_s = 0;
  auto const table = paged.page_table(id);
  for (auto _ : state) {
    benchmark::DoNotOptimize(evict_caches(evict));
    auto const t0 = std::chrono::steady_clock::now();
    run_paged();
    benchmark::ClobberMemory();
    auto const t1 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(evict_caches(evict));
    auto const t2 = std::chrono::steady_clock::now();
    run_contiguous();
    benchmark::ClobberMemory();
    auto const t3 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(evict_caches(evict));
    auto const t4 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(read_pages(paged, table, threads));
    auto const t5 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(evict_caches(evict));
    auto const t6 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(read_once(k.data(), S * H * D, threads) + read_once(v.data(), S * H * D, threads));
    auto const t7 = std::chrono::steady_clock::now();
    paged_s += std::chrono::duration<double>(t1 - t0).count();
    contiguous_s += std::chrono::duration<double>(t3 - t2).count();
    pages_read_s += std::chrono::duration<double>(t5 - t4).count();
    read_s += std::chrono::duration<double>(t7 - t6).count();
    state.SetIterationTime(std::chrono::duration<double>(t1 - t0).count());
  }
  state.counters["x_contiguous"] = contiguous_s > 0 ? paged_s / contiguous_s : 0.0;
  state.counters["x_read_layout"] = read_s > 0 ? pages_read_s / read_s : 0.0;
  state.counters["threads"] = threads;
}

/// Decode over a 16-bit paged cache (S = Eigen::half or Eigen::bfloat16): one
/// sequence of 4096 tokens in consecutive 16-token pages (`scattered`: in a
/// pool fragmented first, every page its own run), float q and out.
/// Baselines in the same loop: the same decode over a contiguous kv_cache<S>,
/// and a read of as many 16-bit K and V bytes once (the pool's first pages:
/// the sequence's own when consecutive).
template <class S>
void half_decode_vs_contiguous(benchmark::State& state, int threads, bool scattered) {
  index_t const S_len = 4096, P = 16;
  auto const k = random_floats(static_cast<std::size_t>(S_len * H * D), 2);
  auto const v = random_floats(static_cast<std::size_t>(S_len * H * D), 3);
  auto const q = random_floats(static_cast<std::size_t>(H * D), 1);
  std::vector<float> out(q.size());
  posenc::paged_kv_cache<S> paged(scattered ? 2 * S_len / P + 2 : S_len / P, P, H, D);
  if (scattered) fragment_pool(paged, k, v);
  index_t const id = paged.add_sequence();
  for (index_t s = 0; s < S_len; s += P)
    paged.append(id, posenc::make_bshd<const float>(k.data() + s * H * D, 1, P, H, D),
                 posenc::make_bshd<const float>(v.data() + s * H * D, 1, P, H, D), posenc::none{});
  posenc::kv_cache<S> contiguous(1, H, D);
  contiguous.append(posenc::make_bshd<const float>(k.data(), 1, S_len, H, D),
                    posenc::make_bshd<const float>(v.data(), 1, S_len, H, D), posenc::none{});
  auto& evict = posenc_bench::persistent_buffer<float>("paged/evict", index_t{64} << 20, 1.0f);
  posenc::attention_options<float> opt;
  opt.causal = true;
  opt.threads = threads;
  posenc::paged_attention_workspace<S> ws;
  std::vector<index_t> const ids = {id};
  auto const qv = posenc::make_bshd<const float>(q.data(), 1, 1, H, D);
  auto const ov = posenc::make_bshd(out.data(), 1, 1, H, D);
  auto run_paged = [&] { posenc::attention<posenc::path::fused>(qv, paged, ids, ov, posenc::none{}, opt, ws); };
  auto run_contiguous = [&] { posenc::attention<posenc::path::fused>(qv, contiguous, ov, posenc::none{}, opt); };
  run_paged();
  run_contiguous();
  // Consecutive pages: the pool's keys and values are the sequence's, in order.
  S const* const pk = paged.page_keys(0, S_len / P).data;
  S const* const pv = paged.page_values(0, S_len / P).data;
  double paged_s = 0, contiguous_s = 0, read_s = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(evict_caches(evict));
    auto const t0 = std::chrono::steady_clock::now();
    run_paged();
    benchmark::ClobberMemory();
    auto const t1 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(evict_caches(evict));
    auto const t2 = std::chrono::steady_clock::now();
    run_contiguous();
    benchmark::ClobberMemory();
    auto const t3 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(evict_caches(evict));
    auto const t4 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(read_once_16(pk, S_len * H * D, threads) + read_once_16(pv, S_len * H * D, threads));
    auto const t5 = std::chrono::steady_clock::now();
    paged_s += std::chrono::duration<double>(t1 - t0).count();
    contiguous_s += std::chrono::duration<double>(t3 - t2).count();
    read_s += std::chrono::duration<double>(t5 - t4).count();
    state.SetIterationTime(std::chrono::duration<double>(t1 - t0).count());
  }
  state.counters["x_contiguous"] = contiguous_s > 0 ? paged_s / contiguous_s : 0.0;
  state.counters["x_stream"] = read_s > 0 ? paged_s / read_s : 0.0;
  state.counters["threads"] = threads;
  state.SetBytesProcessed(state.iterations() * 2 * S_len * H * D * static_cast<std::int64_t>(sizeof(S)));
}

/// 16 sequences of lengths spread evenly over 256 .. 4096, 16-token pages,
/// one decode step for all in one call. Baseline: reading all their K and V once.
void batched_decode(benchmark::State& state, int threads) {
  index_t const N = 16, P = 16;
  std::vector<index_t> lens;
  index_t total = 0;
  for (index_t i = 0; i < N; ++i) {
    lens.push_back(256 + i * (4096 - 256) / (N - 1));
    total += lens.back();
  }
  auto const k = random_floats(static_cast<std::size_t>(4096 * H * D), 2);
  auto const v = random_floats(static_cast<std::size_t>(4096 * H * D), 3);
  auto const q = random_floats(static_cast<std::size_t>(N * H * D), 1);
  std::vector<float> out(q.size());
  posenc::paged_kv_cache<float> paged(total / P + N, P, H, D);
  std::vector<index_t> ids;
  for (index_t i = 0; i < N; ++i) {
    ids.push_back(paged.add_sequence());
    index_t const L = lens[static_cast<std::size_t>(i)];
    paged.append(ids.back(), posenc::make_bshd<const float>(k.data(), 1, L, H, D),
                 posenc::make_bshd<const float>(v.data(), 1, L, H, D), posenc::none{});
  }
  std::int64_t const elements = 2 * total * H * D;
  auto const kv_all = random_floats(static_cast<std::size_t>(elements), 4);
  auto& evict = posenc_bench::persistent_buffer<float>("paged/evict", index_t{64} << 20, 1.0f);
  posenc::attention_options<float> opt;
  opt.causal = true;
  opt.threads = threads;
  posenc::paged_attention_workspace<float> ws;
  auto const qv = posenc::make_bshd<const float>(q.data(), N, 1, H, D);
  auto const ov = posenc::make_bshd(out.data(), N, 1, H, D);
  auto run_paged = [&] { posenc::attention<posenc::path::fused>(qv, paged, ids, ov, posenc::none{}, opt, ws); };
  run_paged();
  // The same K and V read in place in their pages, sequence by sequence.
  auto read_in_pages = [&] {
    float x = 0;
    for (index_t id : ids) x += read_pages(paged, paged.page_table(id), threads);
    return x;
  };
  double paged_s = 0, read_s = 0, pages_s = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(evict_caches(evict));
    auto const t0 = std::chrono::steady_clock::now();
    run_paged();
    benchmark::ClobberMemory();
    auto const t1 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(evict_caches(evict));
    auto const t2 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(read_once(kv_all.data(), elements, threads));
    auto const t3 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(evict_caches(evict));
    auto const t4 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(read_in_pages());
    auto const t5 = std::chrono::steady_clock::now();
    paged_s += std::chrono::duration<double>(t1 - t0).count();
    read_s += std::chrono::duration<double>(t3 - t2).count();
    pages_s += std::chrono::duration<double>(t5 - t4).count();
    state.SetIterationTime(std::chrono::duration<double>(t1 - t0).count());
  }
  state.counters["x_stream"] = read_s > 0 ? paged_s / read_s : 0.0;
  state.counters["x_read_pages"] = pages_s > 0 ? paged_s / pages_s : 0.0;
  state.counters["tokens"] = static_cast<double>(total);
  state.counters["threads"] = threads;
}

/// Causal prefill of a 2048-token prompt (H = 8, D = 128) whose keys and
/// values sit in 16-token pages (`scattered`: in a fragmented pool, every
/// page its own run), all 2048 queries in one call.
/// Baseline: the same prefill over contiguous K and V, in the same loop.
void prefill_vs_contiguous(benchmark::State& state, bool scattered, int threads) {
  index_t const S = 2048, P = 16;
  auto const k = random_floats(static_cast<std::size_t>(S * H * D), 2);
  auto const v = random_floats(static_cast<std::size_t>(S * H * D), 3);
  auto const q = random_floats(static_cast<std::size_t>(S * H * D), 1);
  std::vector<float> out(q.size());
  posenc::paged_kv_cache<float> paged(2 * S / P + 2, P, H, D);
  if (scattered) fragment_pool(paged, k, v);
  index_t const id = paged.add_sequence();
  for (index_t s = 0; s < S; s += P) {
    auto const kp = posenc::make_bshd<const float>(k.data() + s * H * D, 1, P, H, D);
    auto const vp = posenc::make_bshd<const float>(v.data() + s * H * D, 1, P, H, D);
    paged.append(id, kp, vp, posenc::none{});
  }
  posenc::attention_options<float> opt;
  opt.causal = true;
  opt.threads = threads;
  posenc::paged_attention_workspace<float> ws;
  std::vector<index_t> const ids = {id};
  auto const qv = posenc::make_bshd<const float>(q.data(), 1, S, H, D);
  auto const kv = posenc::make_bshd<const float>(k.data(), 1, S, H, D);
  auto const vv = posenc::make_bshd<const float>(v.data(), 1, S, H, D);
  auto const ov = posenc::make_bshd(out.data(), 1, S, H, D);
  auto run_paged = [&] { posenc::attention<posenc::path::fused>(qv, paged, ids, ov, posenc::none{}, opt, ws); };
  auto run_contiguous = [&] { posenc::attention<posenc::path::fused>(qv, kv, vv, ov, posenc::none{}, opt); };
  run_paged();
  run_contiguous();
  double paged_s = 0, contiguous_s = 0;
  for (auto _ : state) {
    auto const t0 = std::chrono::steady_clock::now();
    run_paged();
    benchmark::ClobberMemory();
    auto const t1 = std::chrono::steady_clock::now();
    run_contiguous();
    benchmark::ClobberMemory();
    auto const t2 = std::chrono::steady_clock::now();
    paged_s += std::chrono::duration<double>(t1 - t0).count();
    contiguous_s += std::chrono::duration<double>(t2 - t1).count();
    state.SetIterationTime(std::chrono::duration<double>(t1 - t0).count());
  }
  state.counters["x_contiguous"] = contiguous_s > 0 ? paged_s / contiguous_s : 0.0;
  state.counters["threads"] = threads;
}

/// Registers half_decode_vs_contiguous<S> as paged/decode_vs_contiguous/<what>[_scattered]_pages/...
template <class S>
void register_half_decode(char const* what, int t, bool scattered) {
  std::string const name = std::string("paged/decode_vs_contiguous/") + what +
                           (scattered ? "_scattered_pages" : "_pages") + "/H8_D128_S4096_page16/threads:" +
                           std::to_string(t);
  benchmark::RegisterBenchmark(name.c_str(), [t, scattered](benchmark::State& s) {
    half_decode_vs_contiguous<S>(s, t, scattered);
  })->Unit(benchmark::kMicrosecond)->UseManualTime()->MinTime(0.5);
}

/// compact() of a fragmented pool (the pool of decode_vs_contiguous
/// `scattered`: one-page fillers on every other page, one sequence of 4096
/// tokens on the pages between them), restored from a copy before each
/// iteration. Baseline in the same loop: memcpy of as many bytes as the pages
/// it moves hold (K and V of every kv head), between two other buffers.
void compact_fragmented(benchmark::State& state) {
  index_t const S = 4096, P = 16;
  auto const k = random_floats(static_cast<std::size_t>(S * H * D), 2);
  auto const v = random_floats(static_cast<std::size_t>(S * H * D), 3);
  posenc::paged_kv_cache<float> fragmented(2 * S / P + 2, P, H, D);
  fragment_pool(fragmented, k, v);
  index_t const id = fragmented.add_sequence();
  fragmented.append(id, posenc::make_bshd<const float>(k.data(), 1, S, H, D),
                    posenc::make_bshd<const float>(v.data(), 1, S, H, D), posenc::none{});
  posenc::paged_kv_cache<float> work = fragmented;
  index_t const moved = work.compact();
  auto const bytes = static_cast<std::size_t>(moved * P * H * 2 * D) * sizeof(float);
  std::vector<char> from(bytes, 1), to(bytes, 0);
  auto& evict = posenc_bench::persistent_buffer<float>("paged/evict", index_t{64} << 20, 1.0f);
  double compact_s = 0, copy_s = 0;
  for (auto _ : state) {
    work = fragmented;
    benchmark::DoNotOptimize(evict_caches(evict));
    auto const t0 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(work.compact());
    benchmark::ClobberMemory();
    auto const t1 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(evict_caches(evict));
    auto const t2 = std::chrono::steady_clock::now();
    std::memcpy(to.data(), from.data(), bytes);
    benchmark::ClobberMemory();
    auto const t3 = std::chrono::steady_clock::now();
    compact_s += std::chrono::duration<double>(t1 - t0).count();
    copy_s += std::chrono::duration<double>(t3 - t2).count();
    state.SetIterationTime(std::chrono::duration<double>(t1 - t0).count());
  }
  state.counters["x_copy"] = copy_s > 0 ? compact_s / copy_s : 0.0;
  state.counters["pages_moved"] = static_cast<double>(moved);
}

}  // namespace

int main(int argc, char** argv) {
  for (int t : {1, 2}) {
    for (page_order order :
         {page_order::consecutive, page_order::scattered, page_order::compacted, page_order::after_frees,
          page_order::interleaved}) {
      char const* what = order == page_order::consecutive ? "consecutive"
                         : order == page_order::scattered ? "scattered"
                         : order == page_order::compacted ? "compacted"
                         : order == page_order::interleaved ? "interleaved"
                                                            : "after_frees";
      std::string const name = std::string("paged/decode_vs_contiguous/") + what +
                               "_pages/H8_D128_S4096_page16/threads:" + std::to_string(t);
      benchmark::RegisterBenchmark(name.c_str(), [order, t](benchmark::State& s) {
        decode_vs_contiguous(s, order, t);
      })->Unit(benchmark::kMicrosecond)->UseManualTime()->MinTime(0.5);
    }
    for (bool scattered : {false, true}) {
      register_half_decode<Eigen::half>("fp16", t, scattered);
      register_half_decode<Eigen::bfloat16>("bf16", t, scattered);
    }
    benchmark::RegisterBenchmark(("paged/batched_decode/16_seqs_256_to_4096/H8_D128_page16/threads:" +
                                  std::to_string(t)).c_str(),
                                 [t](benchmark::State& s) { batched_decode(s, t); })
        ->Unit(benchmark::kMicrosecond)
        ->UseManualTime()
        ->MinTime(0.5);
  }
  for (int t : {1, 2})
    for (bool scattered : {false, true})
      benchmark::RegisterBenchmark(("paged/prefill_vs_contiguous/" + std::string(scattered ? "scattered" : "consecutive") +
                                    "_pages/H8_D128_S2048_page16/threads:" + std::to_string(t)).c_str(),
                                   [scattered, t](benchmark::State& s) { prefill_vs_contiguous(s, scattered, t); })
          ->Unit(benchmark::kMillisecond)
          ->UseManualTime()
          ->MinTime(0.5);
  benchmark::RegisterBenchmark("paged/compact/fragmented_pool_S4096/H8_D128_page16", compact_fragmented)
      ->Unit(benchmark::kMillisecond)
      ->UseManualTime()
      ->MinTime(0.5);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
