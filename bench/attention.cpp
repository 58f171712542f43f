// SPDX-License-Identifier: MIT
// Attention paths (fused, materialized) in float and with 16-bit K/V beside the in-run FMA peak, Eigen GEMMs of the same shapes and a K/V stream read.
//
// GFLOP/s counts 4 * D * H per visible (query, key) pair: 2 D for q.k and 2 D
// for p.v (full: Sq * Sk pairs; causal: Sk (Sk + 1) / 2 when Sq == Sk).
#include <posenc/attention/attention.hpp>
#include <posenc/attention/fused.hpp>
#include <posenc/attention/kv_cache.hpp>
#include <posenc/core/half.hpp>
#include <posenc/encoding/alibi.hpp>
#include <posenc/encoding/none.hpp>
#include <posenc/encoding/rope.hpp>
#include <posenc/encoding/t5_bias.hpp>
#include <posenc/encoding/transformer_xl.hpp>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "support/baselines.hpp"

namespace {

using posenc::index_t;

struct config {
  index_t Sq, Sk, Hq, Hkv, D;
  bool causal;
  int threads;
  bool bhsd = false;  // q, k, v and out laid out (batch, head, seq, dim): rows D apart instead of H x D
};

/// Rows [first, first + rows) of a (1, S, H, D) tensor at `data`, in c's layout.
template <class T>
posenc::view<T> rows_of(T* data, config const& c, index_t S, index_t H, index_t first, index_t rows) {
  if (!c.bhsd) return posenc::make_bshd(data + first * H * c.D, 1, rows, H, c.D);
  posenc::view<T> v = posenc::make_bhsd(data, 1, H, S, c.D);
  v.data += first * c.D;
  v.seq = rows;
  return v;
}

double visible_pairs(config const& c) {
  if (!c.causal) return static_cast<double>(c.Sq) * static_cast<double>(c.Sk);
  double s = 0;  // bottom-right aligned: query i sees Sk - Sq + i + 1 keys
  for (index_t i = 0; i < c.Sq; ++i) s += static_cast<double>(c.Sk - c.Sq + i + 1);
  return s;
}

/// n uniform floats in [-1, 1) from `seed`, made once per (key, n) for the whole
/// program (posenc_bench::persistent_buffer): every run and repetition reads the
/// same memory, already mapped and written, and none pays to generate it.
posenc::aligned_buffer<float>& random_floats(std::string const& key, std::size_t n, std::uint32_t seed) {
  return posenc_bench::persistent_buffer_filled<float>(key, static_cast<std::int64_t>(n), [seed](auto& b) {
    std::mt19937 gen(seed);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    for (auto& x : b) x = dist(gen);
  });
}

/// Sums two float arrays of n elements once, split over `threads` threads (a read of K and V).
float read_once(float const* a, float const* b, std::int64_t n, int threads) {
  using B = posenc::simd::batch<float>;
  constexpr std::int64_t W = posenc::simd::width<float>;
  std::vector<float> part(static_cast<std::size_t>(threads), 0.0f);
  std::int64_t const chunk = (n / threads + W - 1) / W * W;
  posenc::parallel_for(threads, threads, [&](index_t t) {
    std::int64_t const lo = t * chunk, hi = std::min(n, lo + chunk);
    float s = 0;
    for (float const* x : {a, b}) {
      B a0(0.0f), a1(0.0f), a2(0.0f), a3(0.0f);
      std::int64_t i = lo;
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
  float s = 0;
  for (float x : part) s += x;
  return s;
}

/// Touches one float per cache line of `buf` (untimed): afterwards no cache
/// level holds data read before.
float evict_caches(posenc::aligned_buffer<float> const& buf) {
  float s = 0;
  for (index_t i = 0; i < buf.size(); i += 16) s += buf[i];
  return s;
}

enum class enc_kind { none, rope, rope_unreserved, alibi, t5, transformer_xl };

/// A Transformer-XL encoder for H heads of width D over distances up to S,
/// with d_model = H x D (W_R square, as in the model), built once per shape
/// for the whole program (its tables take a GEMM of (2S - 1, d_model) by (d_model, H x D)).
posenc::transformer_xl<float> const& transformer_xl_for(index_t H, index_t D, index_t S) {
  static std::map<std::string, std::unique_ptr<posenc::transformer_xl<float>>> made;
  auto& e = made[std::to_string(H) + "x" + std::to_string(D) + "x" + std::to_string(S)];
  if (!e) {
    std::mt19937 gen(11);
    std::uniform_real_distribution<float> dist(-0.05f, 0.05f);
    posenc::relative_table<float> u(H, D), v(H, D), w(H * D, H * D);
    for (auto* t : {&u, &v, &w})
      for (index_t i = 0; i < t->size(); ++i) t->data()[i] = dist(gen);
    e = std::make_unique<posenc::transformer_xl<float>>(S, u, v, w);
  }
  return *e;
}

template <class Path>
void attention_bench(benchmark::State& state, config c, enc_kind kind,
                     posenc::product_precision products = posenc::product_precision::float32) {
  auto& q = random_floats("attention/q", static_cast<std::size_t>(c.Sq * c.Hq * c.D), 1);
  auto& k = random_floats("attention/k", static_cast<std::size_t>(c.Sk * c.Hkv * c.D), 2);
  auto& v = random_floats("attention/v", static_cast<std::size_t>(c.Sk * c.Hkv * c.D), 3);
  auto& out = posenc_bench::persistent_buffer<float>("attention/out", c.Sq * c.Hq * c.D, 0.0f);
  auto qv = rows_of<const float>(q.data(), c, c.Sq, c.Hq, 0, c.Sq);
  auto kv = rows_of<const float>(k.data(), c, c.Sk, c.Hkv, 0, c.Sk);
  auto vv = rows_of<const float>(v.data(), c, c.Sk, c.Hkv, 0, c.Sk);
  auto ov = rows_of<float>(out.data(), c, c.Sq, c.Hq, 0, c.Sq);
  posenc::attention_options<float> opt;
  opt.causal = c.causal;
  opt.threads = c.threads;
  opt.products = products;
  // reserve() as a model does once at load: RoPE is then rotated inside the
  // tiles. Without it (rope_unreserved) the call rotates copies of q and k.
  posenc::rope<float> rope(posenc::rope_layout::half_split, c.D);
  posenc::rope<float> const rope_unreserved = rope;
  rope.reserve(c.Sk);
  posenc::alibi<float> alibi(posenc::alibi_form::paper, c.Hq);
  posenc::t5_bias<float> t5(posenc::t5_bias_params{c.Hq, !c.causal, 32, 128}, 7);
  posenc::transformer_xl<float> const* txl =
      kind == enc_kind::transformer_xl ? &transformer_xl_for(c.Hq, c.D, c.Sk) : nullptr;
  // Decode: every call is followed by a read of K and V (the same bytes, on
  // the same threads); x_stream = decode time / read time, both measured in
  // this loop, so the ratio holds up when the machine is busy. Before each
  // of the two, an untimed pass over a larger buffer evicts K and V from
  // every cache level: both stream them from memory, as a decode step over a
  // cache larger than the last-level cache does.
  bool const decode = c.Sq == 1;
  auto& evict = posenc_bench::persistent_buffer<float>("attention/evict", decode ? index_t{64} << 20 : 1, 1.0f);
  auto call = [&](posenc::view<const float> qs, posenc::view<float> os) {
    switch (kind) {
      case enc_kind::none: posenc::attention<Path>(qs, kv, vv, os, posenc::none{}, opt); break;
      case enc_kind::rope: posenc::attention<Path>(qs, kv, vv, os, rope, opt); break;
      case enc_kind::rope_unreserved: posenc::attention<Path>(qs, kv, vv, os, rope_unreserved, opt); break;
      case enc_kind::alibi: posenc::attention<Path>(qs, kv, vv, os, alibi, opt); break;
      case enc_kind::t5: posenc::attention<Path>(qs, kv, vv, os, t5, opt); break;
      case enc_kind::transformer_xl: posenc::attention<Path>(qs, kv, vv, os, *txl, opt); break;
    }
  };
  // Warm-up, untimed: the last 16 query rows (all of them for decode) against every
  // key, so the first timed call finds the threads started and K, V mapped, whatever
  // ran before it. (Rows from the end: with the default offset Sk - Sq they see the
  // same keys as in the full call.)
  {
    index_t const rows = std::min<index_t>(c.Sq, 16), first = c.Sq - rows;
    call(rows_of<const float>(q.data(), c, c.Sq, c.Hq, first, rows),
         rows_of<float>(out.data(), c, c.Sq, c.Hq, first, rows));
  }
  double attn_s = 0, read_s = 0;
  for (auto _ : state) {
    if (decode) benchmark::DoNotOptimize(evict_caches(evict));
    auto const t0 = std::chrono::steady_clock::now();
    call(qv, ov);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
    if (decode) {
      auto const t1 = std::chrono::steady_clock::now();
      benchmark::DoNotOptimize(evict_caches(evict));
      auto const t1r = std::chrono::steady_clock::now();
      benchmark::DoNotOptimize(read_once(k.data(), v.data(), k.size(), c.threads));
      auto const t2 = std::chrono::steady_clock::now();
      attn_s += std::chrono::duration<double>(t1 - t0).count();
      read_s += std::chrono::duration<double>(t2 - t1r).count();
      state.SetIterationTime(std::chrono::duration<double>(t1 - t0).count());
    }
  }
  if (decode) state.counters["x_stream"] = read_s > 0 ? attn_s / read_s : 0.0;
  double const flops = 4.0 * static_cast<double>(c.D) * static_cast<double>(c.Hq) * visible_pairs(c);
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops * 1e-9 * static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
  state.counters["S"] = static_cast<double>(c.Sk);
  state.counters["D"] = static_cast<double>(c.D);
  state.counters["threads"] = c.threads;
  // K and V read once per call (the decode lower bound).
  state.SetBytesProcessed(state.iterations() * 2 * c.Sk * c.Hkv * c.D * static_cast<std::int64_t>(sizeof(float)));
}

/// The floats of x rounded once per program to the 16-bit type S (kept under `key`).
template <class S>
std::vector<S> const& rounded(std::string const& key, posenc::aligned_buffer<float> const& x) {
  static std::map<std::string, std::vector<S>> made;
  auto& h = made[key + std::to_string(x.size())];
  if (h.empty())
    for (float f : x) h.push_back(posenc::detail::to_storage<S>(f));
  return h;
}

/// Prefill (Sq x Sk, no encoder) with K and V stored in the 16-bit type S:
/// the lane kernel widening each key and value tile once. q and out are float,
/// or (`all_16_bit`) stored in S as well: each query block widened once as it
/// is set up, each output row rounded once as it is finished.
template <class S>
void half_prefill_bench(benchmark::State& state, config c, bool all_16_bit) {
  auto& q = random_floats("attention/q", static_cast<std::size_t>(c.Sq * c.Hq * c.D), 1);
  auto const& q16 = rounded<S>("q", q);
  auto const& k = rounded<S>("k", random_floats("attention/k", static_cast<std::size_t>(c.Sk * c.Hkv * c.D), 2));
  auto const& v = rounded<S>("v", random_floats("attention/v", static_cast<std::size_t>(c.Sk * c.Hkv * c.D), 3));
  auto& out = posenc_bench::persistent_buffer<float>("attention/out", c.Sq * c.Hq * c.D, 0.0f);
  static std::vector<S> out16;
  out16.resize(static_cast<std::size_t>(c.Sq * c.Hq * c.D));
  auto kv = posenc::make_bshd<const S>(k.data(), 1, c.Sk, c.Hkv, c.D);
  auto vv = posenc::make_bshd<const S>(v.data(), 1, c.Sk, c.Hkv, c.D);
  posenc::attention_options<float> opt;
  opt.causal = c.causal;
  opt.threads = c.threads;
  // Rows [first, first + rows) of q against every key, into the same rows of out.
  auto call = [&](index_t first, index_t rows) {
    index_t const at = first * c.Hq * c.D;
    if (all_16_bit)
      posenc::attention<posenc::path::fused>(posenc::make_bshd<const S>(q16.data() + at, 1, rows, c.Hq, c.D), kv,
                                             vv, posenc::make_bshd(out16.data() + at, 1, rows, c.Hq, c.D),
                                             posenc::none{}, opt);
    else
      posenc::attention<posenc::path::fused>(posenc::make_bshd<const float>(q.data() + at, 1, rows, c.Hq, c.D), kv,
                                             vv, posenc::make_bshd(out.data() + at, 1, rows, c.Hq, c.D),
                                             posenc::none{}, opt);
  };
  {  // warm-up, untimed: the last 16 query rows against every key
    index_t const rows = std::min<index_t>(c.Sq, 16);
    call(c.Sq - rows, rows);
  }
  for (auto _ : state) {
    call(0, c.Sq);
    benchmark::DoNotOptimize(out.data());
    benchmark::DoNotOptimize(out16.data());
    benchmark::ClobberMemory();
  }
  double const flops = 4.0 * static_cast<double>(c.D) * static_cast<double>(c.Hq) * visible_pairs(c);
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops * 1e-9 * static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
  state.counters["S"] = static_cast<double>(c.Sk);
  state.counters["D"] = static_cast<double>(c.D);
  state.counters["threads"] = c.threads;
}

/// The timing loop of a decode case: every call of `decode` is followed by a
/// read of its K and V bytes (kb and vb, n floats each, on the same threads),
/// each after an eviction pass, as the float decode case does: x_stream =
/// decode time / read time.
template <class Decode>
void decode_stream_loop(benchmark::State& state, Decode const& decode, float const* kb, float const* vb,
                        std::int64_t n, int threads) {
  auto& evict = posenc_bench::persistent_buffer<float>("attention/evict", index_t{64} << 20, 1.0f);
  decode();  // warm-up, untimed
  double attn_s = 0, read_s = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(evict_caches(evict));
    auto const t0 = std::chrono::steady_clock::now();
    decode();
    benchmark::ClobberMemory();
    auto const t1 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(evict_caches(evict));
    auto const t1r = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(read_once(kb, vb, n, threads));
    auto const t2 = std::chrono::steady_clock::now();
    attn_s += std::chrono::duration<double>(t1 - t0).count();
    read_s += std::chrono::duration<double>(t2 - t1r).count();
    state.SetIterationTime(std::chrono::duration<double>(t1 - t0).count());
  }
  state.counters["x_stream"] = read_s > 0 ? attn_s / read_s : 0.0;
  state.counters["threads"] = threads;
}

/// Decode (1 query x Sk keys, causal) with K and V stored in the 16-bit type
/// S, token-major views (make_bshd); x_stream against the read of the same
/// 16-bit K and V bytes (as floats, half as many).
template <class S>
void half_decode_bench(benchmark::State& state, config c) {
  auto& q = random_floats("attention/q", static_cast<std::size_t>(c.Sq * c.Hq * c.D), 1);
  auto& k32 = random_floats("attention/k", static_cast<std::size_t>(c.Sk * c.Hkv * c.D), 2);
  auto& v32 = random_floats("attention/v", static_cast<std::size_t>(c.Sk * c.Hkv * c.D), 3);
  auto const& k = rounded<S>("k", k32);
  auto const& v = rounded<S>("v", v32);
  auto& out = posenc_bench::persistent_buffer<float>("attention/out", c.Sq * c.Hq * c.D, 0.0f);
  auto qv = posenc::make_bshd<const float>(q.data(), 1, c.Sq, c.Hq, c.D);
  auto kv = posenc::make_bshd<const S>(k.data(), 1, c.Sk, c.Hkv, c.D);
  auto vv = posenc::make_bshd<const S>(v.data(), 1, c.Sk, c.Hkv, c.D);
  auto ov = posenc::make_bshd(out.data(), 1, c.Sq, c.Hq, c.D);
  posenc::attention_options<float> opt;
  opt.causal = c.causal;
  opt.threads = c.threads;
  // The same bytes as floats: 2 x Sk x Hkv x D 16-bit values are Sk x Hkv x D floats.
  decode_stream_loop(
      state,
      [&] {
        posenc::attention<posenc::path::fused>(qv, kv, vv, ov, posenc::none{}, opt);
        benchmark::DoNotOptimize(out.data());
      },
      reinterpret_cast<float const*>(k.data()), reinterpret_cast<float const*>(v.data()),
      static_cast<std::int64_t>(k.size()) / 2, c.threads);
  state.SetBytesProcessed(state.iterations() * 2 * c.Sk * c.Hkv * c.D * static_cast<std::int64_t>(sizeof(S)));
}

/// Decode (1 query x Sk keys, causal) through a posenc::kv_cache<S> (S float
/// or a 16-bit type) holding exactly Sk tokens, as a model decodes: the
/// cache's storage is head-major; x_stream against the read of the cache's
/// own K and V bytes.
template <class S>
void cache_decode_bench(benchmark::State& state, config c) {
  auto& q = random_floats("attention/q", static_cast<std::size_t>(c.Sq * c.Hq * c.D), 1);
  auto& k32 = random_floats("attention/k", static_cast<std::size_t>(c.Sk * c.Hkv * c.D), 2);
  auto& v32 = random_floats("attention/v", static_cast<std::size_t>(c.Sk * c.Hkv * c.D), 3);
  auto& out = posenc_bench::persistent_buffer<float>("attention/out", c.Sq * c.Hq * c.D, 0.0f);
  // Built once per shape for the whole program, as the inputs are.
  static std::map<std::string, std::unique_ptr<posenc::kv_cache<S>>> made;
  auto& slot = made[std::to_string(c.Sk) + "x" + std::to_string(c.Hkv) + "x" + std::to_string(c.D)];
  if (!slot) {
    slot = std::make_unique<posenc::kv_cache<S>>(1, c.Hkv, c.D);
    slot->reserve(c.Sk);  // capacity Sk: the storage is the K and V bytes, nothing more
    slot->append(posenc::make_bshd<const float>(k32.data(), 1, c.Sk, c.Hkv, c.D),
                 posenc::make_bshd<const float>(v32.data(), 1, c.Sk, c.Hkv, c.D), posenc::none{});
  }
  posenc::kv_cache<S> const& cache = *slot;
  auto qv = posenc::make_bshd<const float>(q.data(), 1, c.Sq, c.Hq, c.D);
  auto ov = posenc::make_bshd(out.data(), 1, c.Sq, c.Hq, c.D);
  posenc::attention_options<float> opt;
  opt.causal = c.causal;
  opt.threads = c.threads;
  std::int64_t const bytes = c.Sk * c.Hkv * c.D * static_cast<std::int64_t>(sizeof(S));  // of K, and of V
  decode_stream_loop(
      state,
      [&] {
        posenc::attention<posenc::path::fused>(qv, cache, ov, posenc::none{}, opt);
        benchmark::DoNotOptimize(out.data());
      },
      reinterpret_cast<float const*>(cache.keys().data), reinterpret_cast<float const*>(cache.values().data),
      bytes / 4, c.threads);
  state.SetBytesProcessed(state.iterations() * 2 * bytes);
}

/// Reads `bytes` of float once (vector sum): the time to stream K and V.
void stream_read_baseline(benchmark::State& state, std::int64_t bytes, int threads) {
  std::int64_t const n = bytes / 4;
  auto& x = random_floats("stream_read/x", static_cast<std::size_t>(n), 5);
  using B = posenc::simd::batch<float>;
  constexpr std::int64_t W = posenc::simd::width<float>;
  auto pass = [&] {
    std::vector<float> part(static_cast<std::size_t>(threads), 0.0f);
    std::int64_t const chunk = (n / threads + W - 1) / W * W;
    posenc::parallel_for(threads, threads, [&](index_t t) {
      std::int64_t const lo = t * chunk, hi = std::min(n, lo + chunk);
      B a0(0.0f), a1(0.0f), a2(0.0f), a3(0.0f);
      std::int64_t i = lo;
      for (; i + 4 * W <= hi; i += 4 * W) {
        a0 = a0 + posenc::simd::load(x.data() + i);
        a1 = a1 + posenc::simd::load(x.data() + i + W);
        a2 = a2 + posenc::simd::load(x.data() + i + 2 * W);
        a3 = a3 + posenc::simd::load(x.data() + i + 3 * W);
      }
      float s = posenc::simd::reduce_add((a0 + a1) + (a2 + a3));
      for (; i < hi; ++i) s += x[i];
      part[static_cast<std::size_t>(t)] = s;
    });
    return part;
  };
  benchmark::DoNotOptimize(pass());  // warm-up, untimed
  for (auto _ : state) {
    auto part = pass();
    benchmark::DoNotOptimize(part.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * bytes);
}

std::string name_of(std::string const& path, config const& c, std::string const& extra = "") {
  return "attention/" + path + (extra.empty() ? "" : "_" + extra) + "/" + (c.causal ? "causal" : "full") +
         "/H" + std::to_string(c.Hq) + "_Hkv" + std::to_string(c.Hkv) + "/Sq" + std::to_string(c.Sq) + "_Sk" +
         std::to_string(c.Sk) + "/D" + std::to_string(c.D) + "/threads:" + std::to_string(c.threads);
}

template <class Path>
void add(std::string const& path, config c, enc_kind kind = enc_kind::none, std::string const& extra = "",
         posenc::product_precision products = posenc::product_precision::float32) {
  auto* b = benchmark::RegisterBenchmark(name_of(path, c, extra).c_str(), [c, kind, products](benchmark::State& s) {
    attention_bench<Path>(s, c, kind, products);
  });
  b->Unit(benchmark::kMillisecond)->MinTime(0.3);
  if (c.Sq == 1)
    b->UseManualTime();  // the decode call alone (the read after it is timed apart)
  else
    b->UseRealTime();
}

}  // namespace

int main(int argc, char** argv) {
  using posenc::path::fused;
  using posenc::path::materialized;
  // Eigen's own OpenMP threads stay off: every single-thread number is one core,
  // GEMM baselines included (the materialized path runs its GEMMs on one thread too).
  Eigen::setNbThreads(1);
  posenc_bench::register_fma_peak();
  for (index_t S : {512, 1024, 4096}) {
    for (index_t D : {64, 128}) {
      posenc_bench::register_gemm("qk/S" + std::to_string(S) + "_D" + std::to_string(D), S, S, D);
      posenc_bench::register_gemm("pv/S" + std::to_string(S) + "_D" + std::to_string(D), S, D, S);
      for (bool causal : {false, true}) {
        add<fused>("fused", {S, S, 8, 8, D, causal, 1});
        add<materialized>("materialized", {S, S, 8, 8, D, causal, 1});
      }
    }
  }
  // Two threads.
  for (bool causal : {false, true}) add<fused>("fused", {4096, 4096, 8, 8, 128, causal, 2});
  // The layout: (batch, head, seq, dim) buffers, whose K and V rows are D apart instead of H x D
  // (docs/performance.md, "Float prefill: where the time goes").
  for (bool causal : {false, true})
    add<fused>("fused", {4096, 4096, 8, 8, 128, causal, 1, true}, enc_kind::none, "bhsd");
  // Grouped-query attention: 32 query heads over 8 kv heads, against H = 8 above.
  add<fused>("fused", {1024, 1024, 32, 8, 128, false, 1});
  add<fused>("fused", {1024, 1024, 32, 8, 128, true, 1});
  // Decode: one query against 4096 cached keys, and the time to read K and V once;
  // with GQA (32 query heads over the same 8 kv heads: 4 rows per K/V load).
  add<fused>("fused", {1, 4096, 32, 8, 128, true, 1});
  for (int t : {1, 2}) {
    add<fused>("fused", {1, 4096, 8, 8, 128, true, t});
    std::int64_t bytes = 2ll * 4096 * 8 * 128 * 4;  // K and V of the decode case
    benchmark::RegisterBenchmark(("baseline/stream_read/K+V_4096x8x128/threads:" + std::to_string(t)).c_str(),
                                 [bytes, t](benchmark::State& s) { stream_read_baseline(s, bytes, t); })
        ->Unit(benchmark::kMicrosecond)
        ->UseRealTime();
  }
  // Decode with K and V stored in 16 bits (binary16, bfloat16), each against
  // the read of its own 16-bit K and V (x_stream), beside the float decode above.
  for (config const c : {config{1, 4096, 8, 8, 128, true, 1}, config{1, 4096, 8, 8, 128, true, 2},
                         config{1, 4096, 32, 8, 128, true, 1}}) {
    benchmark::RegisterBenchmark(name_of("fused_kv_f16", c).c_str(),
                                 [c](benchmark::State& s) { half_decode_bench<Eigen::half>(s, c); })
        ->Unit(benchmark::kMillisecond)->MinTime(0.3)->UseManualTime();
    benchmark::RegisterBenchmark(name_of("fused_kv_bf16", c).c_str(),
                                 [c](benchmark::State& s) { half_decode_bench<Eigen::bfloat16>(s, c); })
        ->Unit(benchmark::kMillisecond)->MinTime(0.3)->UseManualTime();
  }
  // Decode through a kv_cache (head-major storage) of float, binary16 and
  // bfloat16, each against the read of its own K and V (x_stream); and against
  // context length, at Sk from 1k to 32k keys, one thread (scripts/plot_bench.py
  // --decode draws those).
  std::vector<config> cache_decodes = {config{1, 4096, 8, 8, 128, true, 1}, config{1, 4096, 8, 8, 128, true, 2},
                                       config{1, 4096, 32, 8, 128, true, 1}};
  for (index_t Sk : {1024, 2048, 8192, 16384, 32768}) cache_decodes.push_back(config{1, Sk, 8, 8, 128, true, 1});
  for (config const c : cache_decodes) {
    benchmark::RegisterBenchmark(name_of("fused_cache", c).c_str(),
                                 [c](benchmark::State& s) { cache_decode_bench<float>(s, c); })
        ->Unit(benchmark::kMillisecond)->MinTime(0.3)->UseManualTime();
    benchmark::RegisterBenchmark(name_of("fused_cache_f16", c).c_str(),
                                 [c](benchmark::State& s) { cache_decode_bench<Eigen::half>(s, c); })
        ->Unit(benchmark::kMillisecond)->MinTime(0.3)->UseManualTime();
    benchmark::RegisterBenchmark(name_of("fused_cache_bf16", c).c_str(),
                                 [c](benchmark::State& s) { cache_decode_bench<Eigen::bfloat16>(s, c); })
        ->Unit(benchmark::kMillisecond)->MinTime(0.3)->UseManualTime();
  }
  // Prefill with K and V (fused_kv_*) or q, K, V and out (fused_all_*) stored in
  // 16 bits, beside the float fused rows of the same shape.
  auto add_half_prefill = [](config const c, bool all) {
    std::string const tag = all ? "_all" : "_kv";
    benchmark::RegisterBenchmark(name_of("fused" + tag + "_f16", c).c_str(),
                                 [c, all](benchmark::State& s) { half_prefill_bench<Eigen::half>(s, c, all); })
        ->Unit(benchmark::kMillisecond)->MinTime(0.3)->UseRealTime();
    benchmark::RegisterBenchmark(name_of("fused" + tag + "_bf16", c).c_str(),
                                 [c, all](benchmark::State& s) { half_prefill_bench<Eigen::bfloat16>(s, c, all); })
        ->Unit(benchmark::kMillisecond)->MinTime(0.3)->UseRealTime();
  };
  for (index_t S : {1024, 4096})
    for (bool causal : {false, true})
      for (bool all : {false, true}) add_half_prefill(config{S, S, 8, 8, 128, causal, 1}, all);
  // The shapes of the peer comparison (docs/performance.md, "Against ggml"), S 4096, D 128 unless
  // said, beside the rows above: GQA 32 / 8 full with float and with 16-bit K and V, and the
  // float rows (full H 8 and causal H 8 are above) at 2 threads too.
  add<fused>("fused", {4096, 4096, 8, 8, 64, false, 2});
  for (int t : {1, 2}) add<fused>("fused", {4096, 4096, 32, 8, 128, false, t});
  add_half_prefill(config{4096, 4096, 32, 8, 128, false, 1}, false);
  // bfloat16 products (opt-in), beside the float fused rows of the same shape.
  for (index_t S : {1024, 4096})
    for (bool causal : {false, true})
      add<fused>("fused", {S, S, 8, 8, 128, causal, 1}, enc_kind::none, "bf16_products",
                 posenc::product_precision::bfloat16);
  // Encoders fused in, against plain at the same shape.
  for (index_t S : {1024, 4096})
  for (bool causal : {false, true}) {
    add<fused>("fused", {S, S, 8, 8, 128, causal, 1}, enc_kind::rope, "rope");
    add<fused>("fused", {S, S, 8, 8, 128, causal, 1}, enc_kind::rope_unreserved, "rope_unreserved");
    add<fused>("fused", {S, S, 8, 8, 128, causal, 1}, enc_kind::alibi, "alibi");
    add<fused>("fused", {S, S, 8, 8, 128, causal, 1}, enc_kind::t5, "t5");
  }
  // Transformer-XL (position term per query-key pair), causal as in the model.
  for (index_t S : {1024, 4096}) add<fused>("fused", {S, S, 8, 8, 128, true, 1}, enc_kind::transformer_xl, "transformer_xl");
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
