// SPDX-License-Identifier: MIT
// RoPE rotation of q and k in place, beside an in-run in-place streaming baseline of the same bytes.
//
// Cases: batch 1, 4096 tokens, 32 q heads + 32 k heads, head_dim 128, f32:
// both layouts, no scaling and YaRN, and partial rotary 25% (r = 32); batch 1,
// 1024 tokens, 8 + 8 heads, head_dim 64. Each on 1 and 2 threads. The same
// rotations of 16-bit q and k ("rope_f16", "rope_bf16": widened, rotated in
// float, rounded once) against an in-place stream of the same 16-bit bytes and
// against the conversion round trip of those bytes (x_convert). The cos/sin
// table is reserved before timing (one row per token, shared by all heads);
// "rows_per_call" variants compute the rows inside the call instead.
// Baselines: stream_rmw (x = x * a + b over the same bytes) on 1 thread and,
// written here, on 2 threads with the same task split as the rotation; and,
// inside every rope case, a streaming pass after each rotation whose time
// gives the counter x_stream = rope time / streaming time of the same bytes.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include <posenc/core/half.hpp>
#include <posenc/core/threading.hpp>
#include <posenc/encoding/rope.hpp>

#include "support/baselines.hpp"

namespace {

using posenc::index_t;

struct shape {
  index_t seq, heads, dim;
  std::string label() const {
    return "S" + std::to_string(seq) + "xH" + std::to_string(heads) + "xD" + std::to_string(dim);
  }
  std::int64_t bytes() const { return 2 * seq * heads * dim * static_cast<std::int64_t>(sizeof(float)); }  // q + k
};

/// One in-place streaming pass (x = x * a + b) over q and k, split like the rotation.
void stream_pass(float* q, float* k, index_t seq, index_t row, int threads) noexcept {
  index_t const blocks = (seq + 15) / 16;
  posenc::parallel_for(blocks, threads, [&](index_t b) noexcept {
    index_t const first = b * 16 * row, m = std::min<index_t>(16, seq - b * 16) * row;
    for (float* x : {q, k}) {
      float* __restrict xp = x + first;
      for (index_t i = 0; i < m; ++i) xp[i] = xp[i] * 0.999f + 0.001f;
    }
  });
}

/// The same over 16-bit q and k: every element read and written (its lowest
/// significand bit flipped, so the values stay near where they were).
void stream_pass(std::uint16_t* q, std::uint16_t* k, index_t seq, index_t row, int threads) noexcept {
  index_t const blocks = (seq + 15) / 16;
  posenc::parallel_for(blocks, threads, [&](index_t b) noexcept {
    index_t const first = b * 16 * row, m = std::min<index_t>(16, seq - b * 16) * row;
    for (std::uint16_t* x : {q, k}) {
      std::uint16_t* __restrict xp = x + first;
      for (index_t i = 0; i < m; ++i) xp[i] = static_cast<std::uint16_t>(xp[i] ^ 1u);
    }
  });
}

/// The least any rotation of 16-bit q and k executes: every vector of the
/// same bytes widened to float and narrowed back in place (simd::load_widen,
/// simd::store_narrow, the conversions the rotation uses), no arithmetic. The
/// values come back unchanged. Split like the rotation.
template <class E>
void convert_pass(std::uint16_t* q, std::uint16_t* k, index_t seq, index_t row, int threads) noexcept {
  namespace simd = posenc::simd;
  constexpr auto f = posenc::detail::half_format_of_v<E>;
  constexpr index_t w = simd::width<float>;
  index_t const blocks = (seq + 15) / 16;
  posenc::parallel_for(blocks, threads, [&](index_t b) noexcept {
    index_t const first = b * 16 * row, m = std::min<index_t>(16, seq - b * 16) * row;
    for (std::uint16_t* x : {q, k}) {
      std::uint16_t* xp = x + first;
      index_t i = 0;
      for (; i + w <= m; i += w) simd::store_narrow<f>(xp + i, simd::load_widen<f>(xp + i));
      for (; i < m; ++i) xp[i] = simd::narrow<f>(simd::widen<f>(xp[i]));
    }
  });
}

/// Times rotate_qk; every iteration is followed by a streaming pass over the
/// same bytes on the same threads, and the counter `x_stream` is the ratio of
/// the two summed times. Measured back to back, the ratio holds up when other
/// processes load the machine, which a separate baseline run does not.
/// E: the element type of q and k (float, Eigen::half or Eigen::bfloat16); a
/// 16-bit case also runs convert_pass after the stream, and `x_convert` is
/// rope time / the time of that conversion round trip.
template <class E = float>
void rope_case(benchmark::State& state, shape sh, posenc::rope_layout layout, bool yarn, index_t rotary_dim,
               int threads, bool reserve) {
  // 16-bit tensors live in uint16_t buffers, viewed as E.
  using raw = std::conditional_t<std::is_same_v<E, float>, float, std::uint16_t>;
  posenc::rope_options o;
  o.rotary_dim = rotary_dim;
  o.threads = threads;
  if (yarn) o.scaling = posenc::rope_scaling::yarn(8.0, 4096);
  posenc::rope<float> rope(layout, sh.dim, o);
  if (reserve) rope.reserve(sh.seq);
  // q and k are allocated and written once for the program, shared by every run
  // (posenc_bench::persistent_buffer); one untimed rotation and streaming pass
  // precede the timed loop. The streaming pass keeps the values near 1.
  auto fill = [](posenc::aligned_buffer<raw>& b) {
    for (index_t i = 0; i < b.size(); ++i) {
      E const e = posenc::detail::to_storage<E>(0.001f * static_cast<float>(i % 1000));
      std::memcpy(&b[i], &e, sizeof e);
    }
  };
  std::string const key =
      std::is_same_v<E, float> ? "rope/" : std::is_same_v<E, Eigen::half> ? "rope_f16/" : "rope_bf16/";
  auto& q = posenc_bench::persistent_buffer_filled<raw>(key + "q", sh.seq * sh.heads * sh.dim, fill);
  auto& k = posenc_bench::persistent_buffer_filled<raw>(key + "k", sh.seq * sh.heads * sh.dim, fill);
  auto qv = posenc::make_bshd(reinterpret_cast<E*>(q.data()), 1, sh.seq, sh.heads, sh.dim);
  auto kv = posenc::make_bshd(reinterpret_cast<E*>(k.data()), 1, sh.seq, sh.heads, sh.dim);
  rope.rotate_qk(qv, kv, posenc::position_span(0));
  stream_pass(q.data(), k.data(), sh.seq, sh.heads * sh.dim, threads);
  using clock = std::chrono::steady_clock;
  double rope_s = 0, stream_s = 0, convert_s = 0;
  for (auto _ : state) {
    auto const t0 = clock::now();
    rope.rotate_qk(qv, kv, posenc::position_span(0));
    benchmark::DoNotOptimize(q.data());
    benchmark::DoNotOptimize(k.data());
    benchmark::ClobberMemory();
    auto const t1 = clock::now();
    stream_pass(q.data(), k.data(), sh.seq, sh.heads * sh.dim, threads);
    benchmark::DoNotOptimize(q.data());
    benchmark::ClobberMemory();
    auto const t2 = clock::now();
    double const r = std::chrono::duration<double>(t1 - t0).count();
    rope_s += r;
    stream_s += std::chrono::duration<double>(t2 - t1).count();
    if constexpr (!std::is_same_v<E, float>) {
      convert_pass<E>(q.data(), k.data(), sh.seq, sh.heads * sh.dim, threads);
      benchmark::DoNotOptimize(q.data());
      benchmark::ClobberMemory();
      convert_s += std::chrono::duration<double>(clock::now() - t2).count();
    }
    state.SetIterationTime(r);
  }
  state.SetBytesProcessed(state.iterations() * 2 * sh.bytes() * static_cast<std::int64_t>(sizeof(E)) /
                          static_cast<std::int64_t>(sizeof(float)));
  state.counters["x_stream"] = stream_s > 0 ? rope_s / stream_s : 0.0;
  if (convert_s > 0) state.counters["x_convert"] = rope_s / convert_s;
}

/// The streaming baseline split like the rotation: tasks of 16 tokens over `threads` threads.
void stream_threads(benchmark::State& state, shape sh, int threads) {
  index_t const row = 2 * sh.heads * sh.dim, n = sh.seq * row;
  auto& x = posenc_bench::persistent_buffer<float>("rope/stream_x", n, 1.0f);
  index_t const blocks = (sh.seq + 15) / 16;
  auto pass = [&] {
    posenc::parallel_for(blocks, threads, [&](index_t b) noexcept {
      float* __restrict xp = x.data() + b * 16 * row;
      index_t const m = std::min<index_t>(16, sh.seq - b * 16) * row;
      for (index_t i = 0; i < m; ++i) xp[i] = xp[i] * 0.999f + 0.001f;
    });
  };
  pass();  // warm-up, untimed
  for (auto _ : state) {
    pass();
    benchmark::DoNotOptimize(x.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * 2 * n * static_cast<std::int64_t>(sizeof(float)));
}

void add(std::string const& name, std::function<void(benchmark::State&)> f) {
  benchmark::RegisterBenchmark(name.c_str(), std::move(f))->Unit(benchmark::kMicrosecond)->UseRealTime();
}
void add_manual(std::string const& name, std::function<void(benchmark::State&)> f) {
  benchmark::RegisterBenchmark(name.c_str(), std::move(f))->Unit(benchmark::kMicrosecond)->UseManualTime();
}

}  // namespace

int main(int argc, char** argv) {
  using posenc::rope_layout;
  shape const big{4096, 32, 128}, small{1024, 8, 64};
  for (shape sh : {big, small}) {
    posenc_bench::register_stream(sh.label(), sh.bytes());
    for (int t : {1, 2})
      add("baseline/stream_rmw_threads/" + sh.label() + "/threads:" + std::to_string(t),
          [sh, t](benchmark::State& s) { stream_threads(s, sh, t); });
  }
  struct variant {
    shape sh;
    bool yarn;
    index_t r;
  };
  std::vector<variant> const variants = {{big, false, 128}, {big, true, 128}, {big, false, 32}, {small, false, 64}};
  for (auto const& v : variants)
    for (rope_layout layout : {rope_layout::half_split, rope_layout::interleaved})
      for (int t : {1, 2}) {
        std::string const name = std::string("rope/") + (layout == rope_layout::half_split ? "half" : "interleaved") +
                                 (v.yarn ? "/yarn/" : "/none/") + v.sh.label() + "/r" + std::to_string(v.r) +
                                 "/threads:" + std::to_string(t);
        add_manual(name, [v, layout, t](benchmark::State& s) { rope_case(s, v.sh, layout, v.yarn, v.r, t, true); });
      }
  // 16-bit q and k: no scaling, full and partial rotary.
  std::vector<variant> const variants16 = {{big, false, 128}, {big, false, 32}, {small, false, 64}};
  for (auto const& v : variants16)
    for (rope_layout layout : {rope_layout::half_split, rope_layout::interleaved})
      for (int t : {1, 2})
        for (bool bf : {false, true}) {
          std::string const name = std::string(bf ? "rope_bf16/" : "rope_f16/") +
                                   (layout == rope_layout::half_split ? "half" : "interleaved") + "/none/" +
                                   v.sh.label() + "/r" + std::to_string(v.r) + "/threads:" + std::to_string(t);
          if (bf)
            add_manual(name, [v, layout, t](benchmark::State& s) {
              rope_case<Eigen::bfloat16>(s, v.sh, layout, false, v.r, t, true);
            });
          else
            add_manual(name, [v, layout, t](benchmark::State& s) {
              rope_case<Eigen::half>(s, v.sh, layout, false, v.r, t, true);
            });
        }
  for (rope_layout layout : {rope_layout::half_split, rope_layout::interleaved})
    add_manual(std::string("rope_rows_per_call/") + (layout == rope_layout::half_split ? "half" : "interleaved") + "/none/" +
            big.label() + "/r128/threads:1",
        [big, layout](benchmark::State& s) { rope_case(s, big, layout, false, 128, 1, false); });
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
