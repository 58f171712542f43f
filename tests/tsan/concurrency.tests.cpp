// SPDX-License-Identifier: MIT
// Shared encoders, kv caches and modules used from several std::threads at once (built for ThreadSanitizer).
#include <posenc/attention/attention.hpp>
#include <posenc/attention/kv_cache.hpp>
#include <posenc/attention/multi_head.hpp>
#include <posenc/encoding/alibi.hpp>
#include <posenc/encoding/compose.hpp>
#include <posenc/encoding/rope.hpp>
#include <posenc/encoding/t5_bias.hpp>

#include <atomic>
#include <thread>
#include <vector>

#include "support/catch.hpp"
#include "support/random.hpp"

using posenc::index_t;

namespace {

constexpr int thread_count = 4;

/// Runs f(t) on thread_count threads at once and returns how many calls returned true.
template <class F>
int on_threads(F const& f) {
  std::atomic<int> ok{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < thread_count; ++t)
    pool.emplace_back([&, t] {
      if (f(t)) ok.fetch_add(1);
    });
  for (auto& th : pool) th.join();
  return ok.load();
}

/// Attention of shared q, k, v with a shared encoder, on one path: every thread
/// must reproduce the result computed before the threads started, bit for bit.
template <class Path, class E>
void same_result_on_threads(E const& enc, bool causal) {
  index_t const B = 2, Sq = 19, Sk = 37, Hq = 4, Hkv = 2, D = 16;
  auto const qb = posenc_test::random_vector<float>(B * Sq * Hq * D, 1);
  auto const kb = posenc_test::random_vector<float>(B * Sk * Hkv * D, 2);
  auto const vb = posenc_test::random_vector<float>(B * Sk * Hkv * D, 3);
  auto const q = posenc::make_bshd(qb.data(), B, Sq, Hq, D);
  auto const k = posenc::make_bshd(kb.data(), B, Sk, Hkv, D);
  auto const v = posenc::make_bshd(vb.data(), B, Sk, Hkv, D);
  posenc::attention_options<float> opt;
  opt.causal = causal;
  opt.threads = 1;
  std::vector<float> want(qb.size());
  posenc::attention<Path>(q, k, v, posenc::make_bshd(want.data(), B, Sq, Hq, D), enc, opt);
  int const ok = on_threads([&](int) {
    std::vector<float> out(qb.size(), -1.0f);
    posenc::attention<Path>(q, k, v, posenc::make_bshd(out.data(), B, Sq, Hq, D), enc, opt);
    return out == want;
  });
  CHECK(ok == thread_count);
}

template <class E>
void every_path(E const& enc, bool causal) {
  same_result_on_threads<posenc::path::fused>(enc, causal);
  same_result_on_threads<posenc::path::materialized>(enc, causal);
  same_result_on_threads<posenc::path::reference>(enc, causal);
}

}  // namespace

TEST_CASE("shared encoders: attention from several threads gives the serial result", "[tsan]") {
  posenc::rope<float> rope(posenc::rope_layout::half_split, 16);
  rope.reserve(24);  // before sharing: queries and keys past position 23 are computed per token
  SECTION("rope (reserved table and per-token rows)") { every_path(rope, true); }
  SECTION("t5") { every_path(posenc::t5_bias<float>({4, true, 32, 128}, 7, 0.5), false); }
  SECTION("alibi") { every_path(posenc::alibi<float>(posenc::alibi_form::paper, 4), true); }
  SECTION("compose rope + alibi") {
    every_path(posenc::compose<posenc::rope<float>, posenc::alibi<float>>(
                   rope, posenc::alibi<float>(posenc::alibi_form::shifted, 4, 37)),
               true);
  }
}

TEST_CASE("shared rope: concurrent rotate calls match the serial rotation", "[tsan]") {
  index_t const S = 40, H = 3, D = 32;
  posenc::rope<float> rope(posenc::rope_layout::interleaved, D, posenc::rope_options{{}, 10000.0,
                                                                                       posenc::rope_scaling::yarn(4, 16)});
  rope.reserve(32);
  auto const x = posenc_test::random_vector<float>(S * H * D, 9);
  std::vector<float> want = x;
  rope.rotate(posenc::make_bshd(want.data(), 1, S, H, D), posenc::position_span(5));
  int const ok = on_threads([&](int) {
    std::vector<float> y = x;
    rope.rotate(posenc::make_bshd(y.data(), 1, S, H, D), posenc::position_span(5));
    return y == want;
  });
  CHECK(ok == thread_count);
}

TEST_CASE("shared kv cache: readers attend to it concurrently", "[tsan]") {
  index_t const B = 1, Hq = 4, Hkv = 2, D = 16, prompt = 33;
  posenc::rope<float> rope(posenc::rope_layout::half_split, D);
  posenc::kv_cache<float> cache(B, Hkv, D);
  auto const kb = posenc_test::random_vector<float>(B * prompt * Hkv * D, 4);
  auto const vb = posenc_test::random_vector<float>(B * prompt * Hkv * D, 5);
  cache.append(posenc::make_bshd(kb.data(), B, prompt, Hkv, D), posenc::make_bshd(vb.data(), B, prompt, Hkv, D), rope);
  auto const qb = posenc_test::random_vector<float>(B * Hq * D, 6);
  auto const q = posenc::make_bshd(qb.data(), B, 1, Hq, D);
  posenc::attention_options<float> opt;
  opt.keys_rotated = true;
  opt.causal = true;
  opt.threads = 1;
  std::vector<float> want(qb.size());
  posenc::attention(q, cache.keys(), cache.values(), posenc::make_bshd(want.data(), B, 1, Hq, D), rope, opt);
  int const ok = on_threads([&](int t) {
    std::vector<float> out(qb.size());
    auto o = opt;
    if (t % 2 == 1) {
      posenc::attention<posenc::path::materialized>(q, cache.keys(), cache.values(),
                                                    posenc::make_bshd(out.data(), B, 1, Hq, D), rope, o);
      return posenc_test::max_abs_diff(out, want) < 1e-5;
    }
    posenc::attention(q, cache.keys(), cache.values(), posenc::make_bshd(out.data(), B, 1, Hq, D), rope, o);
    return out == want;
  });
  CHECK(ok == thread_count);
}

TEST_CASE("shared module: forward and decoding with per-thread caches from several threads", "[tsan]") {
  index_t const M = 32, S = 12;
  posenc::mha_config cfg{M, 4, 2, 0, 0};
  posenc::multi_head_attention<posenc::rope<float>, float> mha(cfg, posenc::rope<float>(posenc::rope_layout::half_split, 8));
  auto const wq = posenc_test::random_vector<float>(32 * M, 11), wk = posenc_test::random_vector<float>(16 * M, 12);
  auto const wv = posenc_test::random_vector<float>(16 * M, 13), wo = posenc_test::random_vector<float>(M * 32, 14);
  mha.load(wq.data(), wk.data(), wv.data(), wo.data());
  auto const x = posenc_test::random_vector<float>(S * M, 15);
  posenc::attention_options<float> opt;
  opt.causal = true;
  opt.threads = 1;
  std::vector<float> want(x.size());
  mha.forward(posenc::make_bsd(x.data(), 1, S, M), posenc::make_bsd(want.data(), 1, S, M), opt);
  int const ok = on_threads([&](int t) {
    std::vector<float> y(x.size());
    if (t % 2 == 0) {
      mha.forward(posenc::make_bsd(x.data(), 1, S, M), posenc::make_bsd(y.data(), 1, S, M), opt);
      return y == want;
    }
    auto cache = mha.make_cache(1);  // token by token: decode == prefill within float rounding
    for (index_t s = 0; s < S; ++s)
      mha.forward(posenc::make_bsd(x.data() + s * M, 1, 1, M), posenc::make_bsd(y.data() + s * M, 1, 1, M), cache, opt);
    return posenc_test::max_abs_diff(y, want) < 1e-4;
  });
  CHECK(ok == thread_count);
}
