// SPDX-License-Identifier: MIT
// bias_row of ALiBi, T5 and clipped over 8 heads x 4096 queries x 4096 keys, beside memcpy of the same bytes.
//
// Three access patterns, each covering the whole (8, 4096, 4096) float bias once per iteration:
//   row     one bias_row call per query row of 4096 keys into a reused row buffer (in L1);
//   tile    calls of 128 keys, as the fused kernel adds the bias to one score tile;
//   matrix  rows written into a full (4096, 4096) matrix per head (64 MiB, streamed from DRAM).
// Baselines in the same run: memcpy of the 512 MiB of bias bytes, and an in-place streaming
// read-modify-write of 512 MiB (what the matrix pattern does at best).
#include <posenc/encoding/alibi.hpp>
#include <posenc/encoding/clipped_bias.hpp>
#include <posenc/encoding/t5_bias.hpp>
#include <string>

#include "support/baselines.hpp"

namespace {

constexpr posenc::index_t heads = 8, seq = 4096, tile_keys = 128;
constexpr std::int64_t bias_bytes = heads * seq * seq * static_cast<std::int64_t>(sizeof(float));

enum class pattern { row, tile, matrix };

// The output buffers are allocated and written once for the program
// (posenc_bench::persistent_buffer) and one head is biased untimed before the
// timed loop, so no run pays for fresh pages or a cold start.
template <class E>
void run_bias(benchmark::State& state, E const& enc, pattern pat) {
  auto& row = posenc_bench::persistent_buffer<float>("bias/row", seq, 0.0f);
  auto& matrix = posenc_bench::persistent_buffer<float>("bias/matrix", pat == pattern::matrix ? seq * seq : 1, 0.0f);
  auto one_head = [&](posenc::index_t h) {
    for (posenc::index_t q = 0; q < seq; ++q) {
      switch (pat) {
        case pattern::row:
          enc.bias_row(h, q, 0, seq, row.data());
          break;
        case pattern::tile:
          for (posenc::index_t k = 0; k < seq; k += tile_keys) enc.bias_row(h, q, k, tile_keys, row.data() + k);
          break;
        case pattern::matrix:
          enc.bias_row(h, q, 0, seq, matrix.data() + q * seq);
          break;
      }
    }
    benchmark::DoNotOptimize(row.data());
    benchmark::DoNotOptimize(matrix.data());
    benchmark::ClobberMemory();
  };
  one_head(0);  // warm-up, untimed
  for (auto _ : state) {
    for (posenc::index_t h = 0; h < heads; ++h) one_head(h);
  }
  state.SetBytesProcessed(state.iterations() * bias_bytes);
}

template <class E>
void register_encoder(std::string const& name, E const& enc) {
  char const* names[] = {"row", "tile128", "matrix"};
  pattern const pats[] = {pattern::row, pattern::tile, pattern::matrix};
  for (int i = 0; i < 3; ++i) {
    pattern const p = pats[i];
    benchmark::RegisterBenchmark(("bias/" + name + "/" + names[i]).c_str(),
                                 [enc, p](benchmark::State& s) { run_bias(s, enc, p); })
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
  }
}

}  // namespace

int main(int argc, char** argv) {
  posenc_bench::register_memcpy("512MiB", bias_bytes);
  posenc_bench::register_stream("512MiB", bias_bytes);
  register_encoder("alibi_paper", posenc::alibi<float>(posenc::alibi_form::paper, heads));
  register_encoder("alibi_symmetric", posenc::alibi<float>(posenc::alibi_form::symmetric, heads));
  posenc::t5_bias_params bi;
  bi.heads = heads;
  register_encoder("t5_bidirectional", posenc::t5_bias<float>(bi, 1));
  posenc::t5_bias_params uni = bi;
  uni.bidirectional = false;
  register_encoder("t5_unidirectional", posenc::t5_bias<float>(uni, 1));
  register_encoder("clipped_k64", posenc::clipped_bias<float>(64, heads, 1));
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
