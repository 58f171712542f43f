// SPDX-License-Identifier: MIT
// Transformer-XL on path::fused and path::materialized against the double reference, around every tile and option.
#include <posenc/attention/attention.hpp>
#include <posenc/encoding/transformer_xl.hpp>

#include <limits>
#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/tolerance.hpp"
#include "support/transformer_xl.hpp"

namespace paths_transformer_xl_tests {

using posenc::index_t;

namespace {

constexpr index_t W = posenc::simd::width<float>;
using tile = posenc::detail::fused_default_traits<float>;

template <class T>
std::string describe(posenc_test::txl_buffers<T> const& b) {
  return "B" + std::to_string(b.B) + " Sq" + std::to_string(b.Sq) + " Sk" + std::to_string(b.Sk) + " Hq" +
         std::to_string(b.Hq) + " Hkv" + std::to_string(b.Hkv) + " D" + std::to_string(b.D);
}

/// fused and materialized vs the double reference, each within 2x the plain float error + atol.
template <class T, class E>
void check_paths(posenc_test::txl_buffers<T> const& bf, E const& enc, posenc::attention_options<T> const& opt,
                 std::string const& what) {
  auto const ref = bf.template run<posenc::path::reference>(enc, opt);
  auto const plain = bf.template run<posenc_test::plain_path>(enc, opt);
  auto const fused = bf.template run<posenc::path::fused>(enc, opt);
  auto const mat = bf.template run<posenc::path::materialized>(enc, opt);
  auto const rf = posenc_test::within_tolerance(fused, ref, plain, 1e-6);
  auto const rm = posenc_test::within_tolerance(mat, ref, plain, 1e-6);
  INFO(what << ": fused " << rf.describe() << "; materialized " << rm.describe());
  CHECK(rf.ok);
  CHECK(rm.ok);
}

}  // namespace

TEST_CASE("Transformer-XL: fused == reference around every tile and vector width", "[paths][transformer_xl]") {
  // Lengths N-1, N, N+1 around the SIMD width, the row group and the key tile;
  // memories of 0 and a few keys, causal (the model's mask) and not.
  std::vector<index_t> const sqs = {1, W - 1, W, W + 1, tile::row_group_v + 1, tile::block_q_v + 1};
  std::vector<index_t> const mems = {0, 1, tile::block_kv_v - 1, tile::block_kv_v, tile::block_kv_v + 1};
  std::vector<index_t> const dims = {1, 5, W - 1, W, W + 1, 2 * W + 3};
  std::uint64_t seed = 7;
  for (index_t sq : sqs) {
    for (index_t mem : mems) {
      index_t const d = dims[static_cast<std::size_t>(seed % dims.size())];
      index_t const hkv = seed % 2 == 0 ? 1 : 2;
      posenc_test::txl_buffers<float> bf(1 + static_cast<index_t>(seed % 2), sq, mem + sq, 2, hkv, d, seed);
      auto const enc = posenc_test::random_transformer_xl<float>(2, d, 2 * (1 + d / 2), mem + sq, seed + 3);
      posenc::attention_options<float> opt;
      opt.causal = true;
      check_paths(bf, enc, opt, describe(bf) + " causal");
      opt.causal = false;
      check_paths(bf, enc, opt, describe(bf) + " bidirectional");
      ++seed;
    }
  }
}

TEST_CASE("Transformer-XL: fused == reference with every option", "[paths][transformer_xl]") {
  std::uint64_t seed = 301;
  for (int trial = 0; trial < 4; ++trial) {
    std::string const tag = ", trial " + std::to_string(trial);
    index_t const sq = trial % 2 == 0 ? 37 : 3, mem = 20 + 11 * trial, hkv = trial % 2 == 0 ? 1 : 2;
    posenc_test::txl_buffers<float> bf(2, sq, mem + sq, 4, hkv, 16 + 4 * trial, seed);
    auto const enc = posenc_test::random_transformer_xl<float>(4, bf.D, 10, mem + sq, seed + 3);
    std::string const d = describe(bf);
    ++seed;
    SECTION("padding (key_lengths)" + tag) {
      std::vector<index_t> const lens = {bf.Sk - 4, bf.Sk};
      posenc::attention_options<float> opt;
      opt.causal = true;
      opt.key_lengths = posenc::span<const index_t>(lens.data(), 2);
      check_paths(bf, enc, opt, d + " key_lengths");
    }
    SECTION("softcap and scale" + tag) {
      posenc::attention_options<float> opt;
      opt.causal = true;
      opt.softcap = 2.0;
      opt.scale = 0.7;
      check_paths(bf, enc, opt, d + " softcap");
    }
    SECTION("masks and sliding window" + tag) {
      auto mask = posenc_test::random_vector<float>(static_cast<std::size_t>(bf.Sq * bf.Sk), seed, -2, 1);
      for (std::size_t t = 0; t < mask.size(); t += 5) mask[t] = -std::numeric_limits<float>::infinity();
      posenc::attention_options<float> opt;
      opt.causal = true;
      opt.mask = posenc::make_mask<float>(mask.data(), 1, 1, bf.Sq, bf.Sk);
      check_paths(bf, enc, opt, d + " mask");
      opt.mask = {};
      opt.sliding_window = 9;
      check_paths(bf, enc, opt, d + " window");
    }
    SECTION("memory cut to memory_length" + tag) {
      auto const cut = posenc_test::random_transformer_xl<float>(4, bf.D, 10, mem + sq, seed + 3, 5 + trial);
      posenc::attention_options<float> opt;
      opt.causal = true;
      check_paths(bf, cut, opt, d + " cut");
      opt.threads = 2;
      check_paths(bf, cut, opt, d + " cut, 2 threads");
    }
  }
}

TEST_CASE("Transformer-XL: fused == reference in double", "[paths][transformer_xl]") {
  for (index_t sq : {index_t{1}, index_t{9}, index_t{40}}) {
    posenc_test::txl_buffers<double> bf(2, sq, sq + 50, 4, 2, 24, 50 + static_cast<std::uint64_t>(sq));
    auto const enc = posenc_test::random_transformer_xl<double>(4, 24, 16, sq + 50, 9);
    posenc::attention_options<double> opt;
    opt.causal = true;
    check_paths(bf, enc, opt, describe(bf) + " double");
  }
}

TEST_CASE("Transformer-XL: in-place attention (out is q) on every path", "[paths][transformer_xl]") {
  // The query shift by u is a copy, so out may be q itself.
  index_t const B = 1, S = 21, H = 2, D = 8;
  posenc_test::txl_buffers<float> bf(B, S, S, H, H, D, 77);
  auto const enc = posenc_test::random_transformer_xl<float>(H, D, 6, S, 78);
  posenc::attention_options<float> opt;
  opt.causal = true;
  auto const want = bf.run<posenc::path::reference>(enc, opt);
  auto run_in_place = [&](auto path) {
    std::vector<float> x = bf.q;
    auto const xv = posenc::make_bshd(x.data(), B, S, H, D);
    posenc::attention<decltype(path)>(posenc::view<const float>(xv), bf.kv(), bf.vv(), xv, enc, opt);
    return x;
  };
  std::vector<float> const ref_out(want.begin(), want.begin() + static_cast<std::ptrdiff_t>(B * S * H * D));
  CHECK(posenc_test::max_abs_diff(run_in_place(posenc::path::reference{}), ref_out) == 0.0);
  CHECK(posenc_test::max_abs_diff(run_in_place(posenc::path::fused{}), ref_out) < 1e-5);
  CHECK(posenc_test::max_abs_diff(run_in_place(posenc::path::materialized{}), ref_out) < 1e-5);
}
}  // namespace paths_transformer_xl_tests
