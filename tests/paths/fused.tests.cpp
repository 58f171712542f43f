// SPDX-License-Identifier: MIT
// path::fused against the double reference: shapes around every tile and vector width, every option and encoder.
#include <posenc/attention/attention.hpp>
#include <posenc/attention/fused.hpp>
#include <posenc/encoding/alibi.hpp>
#include <posenc/encoding/clipped_bias.hpp>
#include <posenc/encoding/compose.hpp>
#include <posenc/encoding/none.hpp>
#include <posenc/encoding/rope.hpp>
#include <posenc/encoding/shaw.hpp>
#include <posenc/encoding/t5_bias.hpp>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <new>
#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/counting_new.hpp"
#include "support/fake_encoders.hpp"
#include "support/random.hpp"
#include "support/strided_views.hpp"
#include "support/tolerance.hpp"

namespace paths_fused_tests {

// Allocation counter (tests/support/counting_new.hpp replaces operator new here).
using posenc_test::g_allocations;
using posenc_test::g_bytes;
using posenc_test::g_counting;
using posenc_test::g_largest;


using posenc::index_t;

namespace {

constexpr index_t W = posenc::simd::width<float>;
using tile = posenc::detail::fused_default_traits<float>;

using posenc_test::shape;

template <class T>
struct buffers {
  shape s;
  std::vector<T> q, k, v;
  std::vector<index_t> key_len, qpos, kpos;
  std::vector<T> mask;
  std::vector<char> bmask_store;
  std::vector<T> lse;

  buffers(shape const& sh, std::uint64_t seed) : s(sh) {
    q = posenc_test::random_vector<T>(static_cast<std::size_t>(extent(s.Sq, s.Hq, s.D)), seed, -2, 2);
    k = posenc_test::random_vector<T>(static_cast<std::size_t>(extent(s.Sk, s.Hkv, s.D)), seed + 1, -2, 2);
    v = posenc_test::random_vector<T>(static_cast<std::size_t>(extent(s.Sk, s.Hkv, s.Dv)), seed + 2);
  }
  index_t extent(index_t seq, index_t heads, index_t dim) const {
    return posenc_test::strided_extent(s, seq, heads, dim);
  }
  template <class U>
  posenc::view<U> make(U* data, index_t seq, index_t heads, index_t dim) const {
    return posenc_test::strided_view(s, data, seq, heads, dim);
  }
  posenc::view<const T> qv() const { return make<const T>(q.data(), s.Sq, s.Hq, s.D); }
  posenc::view<const T> kv() const { return make<const T>(k.data(), s.Sk, s.Hkv, s.D); }
  posenc::view<const T> vv() const { return make<const T>(v.data(), s.Sk, s.Hkv, s.Dv); }
};

/// Runs Path into a fresh output (strided like the inputs); returns out + lse.
template <class Path, class T, class E>
std::vector<T> run(buffers<T>& bf, E const& enc, posenc::attention_options<T> opt) {
  shape const& s = bf.s;
  std::vector<T> out(static_cast<std::size_t>(bf.extent(s.Sq, s.Hq, s.Dv)), T(-7));
  std::vector<T> lse(static_cast<std::size_t>(s.B * s.Hq * s.Sq), T(-7));
  opt.lse = lse;
  posenc::attention<Path>(bf.qv(), bf.kv(), bf.vv(), bf.template make<T>(out.data(), s.Sq, s.Hq, s.Dv), enc, opt);
  out.insert(out.end(), lse.begin(), lse.end());
  return out;
}

/// fused vs the double reference, bounded by the plain float error (<= 2x the plain float error + atol).
template <class T, class E>
void check_agrees(buffers<T>& bf, E const& enc, posenc::attention_options<T> const& opt, std::string const& what) {
  auto ref = run<posenc::path::reference>(bf, enc, opt);
  auto plain = run<posenc_test::plain_path>(bf, enc, opt);
  auto got = run<posenc::path::fused>(bf, enc, opt);
  auto rep = posenc_test::within_tolerance(got, ref, plain, 1e-6);
  INFO(what << ": " << rep.describe());
  CHECK(rep.ok);
  // Untouched padding between rows stays untouched.
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (ref[i] == T(-7)) {
      CHECK(got[i] == T(-7));
      break;
    }
  }
}

std::string describe(shape const& s) {
  return "B" + std::to_string(s.B) + " Sq" + std::to_string(s.Sq) + " Sk" + std::to_string(s.Sk) + " Hq" +
         std::to_string(s.Hq) + " Hkv" + std::to_string(s.Hkv) + " D" + std::to_string(s.D) + " Dv" +
         std::to_string(s.Dv) + " pad" + std::to_string(s.pad) + " off" + std::to_string(s.offset) +
         (s.bhsd ? " bhsd" : " bshd");
}

}  // namespace

TEST_CASE("fused traits derive consistent tile constants", "[fused]") {
  STATIC_REQUIRE(tile::block_q_v % tile::width_v == 0);
  STATIC_REQUIRE(tile::q_vectors_v % tile::micro_q_v == 0);
  STATIC_REQUIRE(tile::micro_rows_v * tile::micro_q_v + tile::micro_q_v + 1 <= tile::registers_v);
  using dt = posenc::detail::fused_default_traits<double>;
  STATIC_REQUIRE(dt::width_v * 2 == tile::width_v);
}

TEST_CASE("fused == reference around every tile and vector width", "[fused]") {
  // Lengths N-1, N, N+1 around the SIMD width, the micro-tile rows, the key tile and the query block.
  std::vector<index_t> const lens = {1, W - 1, W, W + 1, tile::block_kv_v - 1, tile::block_kv_v, tile::block_kv_v + 1,
                                     tile::block_q_v + tile::block_q_v / 2 + 1};
  std::vector<index_t> const dims = {1, 5, W - 1, W, W + 1, 2 * W + 3};
  std::uint64_t seed = 11;
  for (index_t sq : lens) {
    for (index_t sk : {index_t{1}, W + 1, tile::block_kv_v - 1, tile::block_kv_v + 1, 2 * tile::block_kv_v + 5}) {
      shape s;
      s.Sq = sq;
      s.Sk = sk;
      s.D = dims[static_cast<std::size_t>(seed % dims.size())];
      s.Dv = dims[static_cast<std::size_t>((seed / 3) % dims.size())];
      s.Hq = 2;
      s.Hkv = seed % 2 == 0 ? 1 : 2;
      buffers<float> bf(s, seed++);
      posenc::attention_options<float> opt;
      check_agrees(bf, posenc::none{}, opt, describe(s) + " plain");
      opt.causal = true;
      check_agrees(bf, posenc::none{}, opt, describe(s) + " causal");
    }
  }
}

TEST_CASE("fused == reference with every option", "[fused]") {
  std::uint64_t seed = 101;
  for (int trial = 0; trial < 6; ++trial) {
    // Sections inside a loop need a name per iteration, or they run for the first one only.
    std::string const tag = ", trial " + std::to_string(trial);
    shape s;
    s.B = 2;
    s.Sq = trial % 2 == 0 ? 70 : 3;  // lane kernel and row kernel
    s.Sk = 71 + 13 * trial;  // >= Sq: default query positions are >= 0
    s.Hq = 4;
    s.Hkv = trial % 3 == 0 ? 1 : (trial % 3 == 1 ? 2 : 4);
    s.D = trial < 3 ? 32 : 20;
    s.Dv = trial < 3 ? 24 : 33;
    s.pad = trial % 2;
    s.offset = trial % 3;
    s.bhsd = trial >= 4;
    buffers<float> bf(s, seed++);
    std::string const d = describe(s);

    SECTION("window" + tag) {
      posenc::attention_options<float> opt;
      opt.sliding_window = 9 + trial;
      check_agrees(bf, posenc::none{}, opt, d + " window");
    }
    SECTION("key lengths, causal, negative query positions" + tag) {
      bf.key_len = {s.Sk - 5, 2};
      posenc::attention_options<float> opt;
      opt.key_lengths = posenc::span<const index_t>(bf.key_len.data(), 2);
      opt.causal = true;
      check_agrees(bf, posenc::none{}, opt, d + " key_lengths causal");
      opt.causal = false;
      check_agrees(bf, posenc::none{}, opt, d + " key_lengths");
      bf.qpos = {-3, s.Sk / 2};
      opt.causal = true;
      opt.q_positions = posenc::position_span::per_batch(posenc::span<const index_t>(bf.qpos.data(), 2));
      check_agrees(bf, posenc::none{}, opt, d + " per-batch q offsets");
    }
    SECTION("explicit positions" + tag) {
      bf.qpos.resize(static_cast<std::size_t>(s.B * s.Sq));
      bf.kpos.resize(static_cast<std::size_t>(s.B * s.Sk));
      for (std::size_t t = 0; t < bf.qpos.size(); ++t) bf.qpos[t] = static_cast<index_t>((t * 7) % 50);
      for (std::size_t t = 0; t < bf.kpos.size(); ++t) bf.kpos[t] = static_cast<index_t>((t * 5) % 61);
      posenc::attention_options<float> opt;
      opt.q_positions = posenc::position_span::ids(bf.qpos.data(), s.B, s.Sq);
      opt.k_positions = posenc::position_span::ids(bf.kpos.data(), s.B, s.Sk);
      opt.causal = true;
      check_agrees(bf, posenc::none{}, opt, d + " explicit causal");
      opt.sliding_window = 20;
      check_agrees(bf, posenc_test::fake_bias{}, opt, d + " explicit window bias");
    }
    SECTION("masks, broadcast, short key extent" + tag) {
      bf.mask = posenc_test::random_vector<float>(static_cast<std::size_t>(s.Hq * s.Sq * s.Sk), seed, -2, 1);
      for (std::size_t t = 0; t < bf.mask.size(); t += 3) bf.mask[t] = -std::numeric_limits<float>::infinity();
      bf.bmask_store.resize(static_cast<std::size_t>(s.B * s.Sk));
      for (std::size_t t = 0; t < bf.bmask_store.size(); ++t) bf.bmask_store[t] = (t % 4) != 1;
      posenc::attention_options<float> opt;
      opt.mask = posenc::make_mask<float>(bf.mask.data(), 1, s.Hq, s.Sq, s.Sk);
      check_agrees(bf, posenc::none{}, opt, d + " additive mask");
      opt.mask = {};
      opt.bool_mask = posenc::make_mask<bool>(reinterpret_cast<bool const*>(bf.bmask_store.data()), s.B, 1, 1,
                                              s.Sk - 3);
      opt.causal = true;
      check_agrees(bf, posenc::none{}, opt, d + " bool mask");
    }
    SECTION("softcap and scale" + tag) {
      posenc::attention_options<float> opt;
      opt.softcap = 2.5;
      opt.scale = 0.9;
      check_agrees(bf, posenc::none{}, opt, d + " softcap");
      opt.causal = true;
      check_agrees(bf, posenc_test::fake_bias{}, opt, d + " softcap bias");
    }
    SECTION("encoders" + tag) {
      posenc::attention_options<float> opt;
      opt.causal = trial % 2 == 1;
      check_agrees(bf, posenc::alibi<float>(posenc::alibi_form::symmetric, s.Hq), opt, d + " alibi");
      check_agrees(bf, posenc::alibi<float>(posenc::alibi_form::key_only, s.Hq), opt, d + " alibi key-only");
      check_agrees(bf, posenc::t5_bias<float>(posenc::t5_bias_params{s.Hq, true, 32, 128}, seed, 0.5), opt,
                   d + " t5");
      check_agrees(bf, posenc::clipped_bias<float>(6, s.Hq, seed, 0.5), opt, d + " clipped");
      posenc::rope<float> rope(posenc::rope_layout::half_split, s.D);
      check_agrees(bf, rope, opt, d + " rope");
      check_agrees(bf, posenc::compose(rope, posenc::alibi<float>(posenc::alibi_form::paper, s.Hq)), opt,
                   d + " rope+alibi");
      check_agrees(bf, posenc_test::fake_rotary{}, opt, d + " fake rotary");
      opt.keys_rotated = true;
      check_agrees(bf, rope, opt, d + " rope, keys already rotated");
      opt.keys_rotated = false;
      if (s.D == s.Dv || true) {
        check_agrees(bf, posenc::shaw<float>(4, s.D, posenc::shaw_terms::keys, seed, 0.5), opt, d + " shaw keys");
      }
      if (s.D == s.Dv) {
        check_agrees(bf, posenc::shaw<float>(4, s.D, posenc::shaw_terms::keys_and_values, seed, 0.5), opt,
                     d + " shaw keys+values");
      }
    }
  }
}

TEST_CASE("fused with a shift-invariant bias (one diagonal per tile) == reference", "[fused][bias]") {
  // The lane kernel computes a shift-invariant bias once per tile as a
  // diagonal when a block's rows are one head at consecutive positions; GQA,
  // masks, key_only ALiBi and scattered positions take the per-row path.
  posenc::alibi<float> const paper(posenc::alibi_form::paper, 4);
  posenc::alibi<float> const symmetric(posenc::alibi_form::symmetric, 4);
  posenc::alibi<float> const key_only(posenc::alibi_form::key_only, 4);
  posenc::t5_bias<float> const t5_bi(posenc::t5_bias_params{4, true, 32, 128}, 3, 0.5);
  posenc::t5_bias<float> const t5_causal(posenc::t5_bias_params{4, false, 32, 128}, 4, 0.5);
  posenc::clipped_bias<float> const clipped(6, 4, 5, 0.5);
  auto const both = posenc::compose(paper, t5_bi);
  CHECK(paper.shift_invariant());
  CHECK(symmetric.shift_invariant());
  CHECK_FALSE(key_only.shift_invariant());
  CHECK(t5_bi.shift_invariant());
  CHECK(clipped.shift_invariant());
  CHECK(both.shift_invariant());
  CHECK_FALSE(posenc::compose(paper, key_only).shift_invariant());

  std::uint64_t seed = 500;
  for (index_t sq : {tile::block_q_v - 1, tile::block_q_v, tile::block_q_v + 1, 2 * tile::block_q_v + 5}) {
    for (index_t extra : {index_t{0}, tile::block_kv_v + 3}) {
      shape s;
      s.B = 2;
      s.Sq = sq;
      s.Sk = sq + extra;
      s.Hq = 4;
      s.Hkv = seed % 3 == 0 ? 2 : 4;  // GQA: the per-row path
      s.D = 16;
      s.Dv = 12;
      s.pad = seed % 2;
      buffers<float> bf(s, seed++);
      std::string const d = describe(s);
      for (int causal = 0; causal < 2; ++causal) {
        posenc::attention_options<float> opt;
        opt.causal = causal == 1;
        std::string const c = d + (opt.causal ? " causal" : " full");
        check_agrees(bf, paper, opt, c + " alibi paper");
        check_agrees(bf, symmetric, opt, c + " alibi symmetric");
        check_agrees(bf, key_only, opt, c + " alibi key_only");
        check_agrees(bf, opt.causal ? t5_causal : t5_bi, opt, c + " t5");
        check_agrees(bf, clipped, opt, c + " clipped");
        check_agrees(bf, both, opt, c + " alibi+t5");
      }
      posenc::attention_options<float> opt;
      opt.causal = true;
      opt.sliding_window = 40;
      check_agrees(bf, t5_causal, opt, d + " window t5");
      opt.sliding_window = 0;
      bf.key_len = {s.Sk - 7, s.Sk / 2};
      opt.key_lengths = posenc::span<const index_t>(bf.key_len.data(), 2);
      check_agrees(bf, paper, opt, d + " key lengths alibi");
      bf.qpos = {-5, 3};  // per-batch offsets; a negative start takes the per-row path
      opt.q_positions = posenc::position_span::per_batch(posenc::span<const index_t>(bf.qpos.data(), 2));
      check_agrees(bf, clipped, opt, d + " per-batch offsets clipped");
      opt.key_lengths = {};
      opt.q_positions = {};
      // Explicit ids: consecutive in batch 0, scattered in batch 1.
      bf.qpos.assign(static_cast<std::size_t>(s.B * s.Sq), 0);
      bf.kpos.assign(static_cast<std::size_t>(s.B * s.Sk), 0);
      for (index_t i = 0; i < s.Sq; ++i) {
        bf.qpos[static_cast<std::size_t>(i)] = 100 + i;
        bf.qpos[static_cast<std::size_t>(s.Sq + i)] = (i * 7) % 50;
      }
      for (index_t j = 0; j < s.Sk; ++j) {
        bf.kpos[static_cast<std::size_t>(j)] = 100 + s.Sq - s.Sk + j;
        bf.kpos[static_cast<std::size_t>(s.Sk + j)] = (j * 5) % 61;
      }
      opt.q_positions = posenc::position_span::ids(bf.qpos.data(), s.B, s.Sq);
      opt.k_positions = posenc::position_span::ids(bf.kpos.data(), s.B, s.Sk);
      check_agrees(bf, both, opt, d + " explicit ids alibi+t5");
    }
  }
}

TEST_CASE("fused == reference for Shaw with values and softcap", "[fused]") {
  shape s;
  s.B = 1;
  s.Sq = 37;
  s.Sk = 70;
  s.Hq = 2;
  s.Hkv = 1;
  s.D = 12;
  s.Dv = 12;
  buffers<float> bf(s, 7);
  posenc::attention_options<float> opt;
  opt.softcap = 3;
  opt.causal = true;
  check_agrees(bf, posenc::shaw<float>(3, s.D, posenc::shaw_terms::keys_and_values, 5, 0.5), opt, "shaw softcap");
  check_agrees(bf, posenc_test::fake_shaw<float>(2, s.D, true, 9), opt, "fake shaw");
}

TEST_CASE("fused == reference in double", "[fused]") {
  for (index_t sq : {index_t{1}, index_t{7}, index_t{65}}) {
    shape s;
    s.B = 1;
    s.Sq = sq;
    s.Sk = 131;
    s.Hq = 4;
    s.Hkv = 2;
    s.D = 24;
    s.Dv = 17;
    buffers<double> bf(s, 3 + static_cast<std::uint64_t>(sq));
    posenc::attention_options<double> opt;
    opt.causal = true;
    check_agrees(bf, posenc_test::fake_bias{}, opt, describe(s) + " double");
    opt.causal = false;
    check_agrees(bf, posenc::none{}, opt, describe(s) + " double plain");
    // RoPE rotated inside the tiles (lane kernel, row kernel, decode path).
    posenc::rope<double> rope(posenc::rope_layout::half_split, s.D);
    rope.reserve(s.Sk);
    opt.causal = true;
    opt.threads = 2;
    check_agrees(bf, rope, opt, describe(s) + " double rope");
  }
}

TEST_CASE("fused decode: few queries against a long cache, split across threads", "[fused]") {
  // (Sq, Hq, Hkv, D, Dv): one row per kv head, a group of rows, and several
  // row groups per kv head (rows below a lane block) with head dims that are
  // not a multiple of the vector width.
  struct decode_shape {
    index_t sq, hq, hkv, d, dv;
  };
  std::uint64_t seed = 40;
  for (decode_shape const c : {decode_shape{1, 4, 1, 64, 64}, decode_shape{1, 4, 2, 64, 64},
                               decode_shape{3, 8, 2, 72, 40}, decode_shape{W - 1, 2, 2, W + 3, 2 * W - 1}}) {
    shape s;
    s.B = 2;
    s.Sq = c.sq;
    s.Sk = 1000;
    s.Hq = c.hq;
    s.Hkv = c.hkv;
    s.D = c.d;
    s.Dv = c.dv;
    buffers<float> bf(s, seed++);
    posenc::attention_options<float> opt;
    opt.threads = 2;
    check_agrees(bf, posenc::none{}, opt, describe(s) + " decode 2 threads");
    opt.causal = true;
    opt.sliding_window = 300;
    check_agrees(bf, posenc::none{}, opt, describe(s) + " decode window");
    opt.sliding_window = 0;
    check_agrees(bf, posenc::alibi<float>(posenc::alibi_form::paper, s.Hq), opt, describe(s) + " decode alibi");
    opt.threads = 1;
    auto one = run<posenc::path::fused>(bf, posenc::none{}, opt);
    opt.threads = 2;
    auto two = run<posenc::path::fused>(bf, posenc::none{}, opt);
    CHECK(posenc_test::max_abs_diff(one, two) < 1e-5);
  }
}

TEST_CASE("fused with a reserved RoPE rotates inside the tiles == reference", "[fused][rope]") {
  // reserved_for(length) holds: queries and key tiles are rotated in the
  // kernel (checked to happen by the allocation test below). Lane kernel,
  // row kernel and decode path; GQA, padding, explicit and negative positions,
  // keys given rotated, both layouts, partial rotary, YaRN, composed with ALiBi.
  std::uint64_t seed = 501;
  for (int trial = 0; trial < 6; ++trial) {
    shape s;
    s.B = 2;
    s.Sq = trial % 3 == 0 ? 70 : (trial % 3 == 1 ? 1 : 3);
    s.Sk = 75 + 11 * trial;
    s.Hq = 4;
    s.Hkv = trial % 2 == 0 ? 1 : 2;
    s.D = trial < 3 ? 32 : 20;
    s.Dv = 24;
    s.pad = trial % 2;
    s.offset = trial % 3;
    s.bhsd = trial >= 4;
    buffers<float> bf(s, seed++);
    std::string const d = describe(s);
    posenc::rope_options o;
    o.rotary_dim = trial % 2 == 0 ? s.D : s.D / 2;
    if (trial >= 3) o.scaling = posenc::rope_scaling::yarn(4.0, 64);
    posenc::rope<float> rope(trial % 2 == 0 ? posenc::rope_layout::half_split : posenc::rope_layout::interleaved,
                             s.D, o);
    rope.reserve(512);
    REQUIRE(rope.reserved_for(s.Sk));
    posenc::attention_options<float> opt;
    opt.threads = 1 + trial % 2;
    check_agrees(bf, rope, opt, d + " rope");
    opt.causal = true;
    check_agrees(bf, rope, opt, d + " rope causal");
    check_agrees(bf, posenc::compose(rope, posenc::alibi<float>(posenc::alibi_form::paper, s.Hq)), opt,
                 d + " rope+alibi causal");
    opt.keys_rotated = true;
    check_agrees(bf, rope, opt, d + " rope, keys already rotated");
    opt.keys_rotated = false;
    bf.key_len = {s.Sk - 5, 2};
    opt.key_lengths = posenc::span<const index_t>(bf.key_len.data(), 2);
    bf.qpos = {-2, s.Sk / 2};
    opt.q_positions = posenc::position_span::per_batch(posenc::span<const index_t>(bf.qpos.data(), 2));
    check_agrees(bf, rope, opt, d + " rope, key lengths, negative query positions");
    opt.q_positions = {};
    opt.key_lengths = {};
    bf.kpos.resize(static_cast<std::size_t>(s.B * s.Sk));
    for (std::size_t t = 0; t < bf.kpos.size(); ++t) bf.kpos[t] = static_cast<index_t>((t * 5) % 90);
    opt.k_positions = posenc::position_span::ids(bf.kpos.data(), s.B, s.Sk);
    opt.causal = false;
    check_agrees(bf, rope, opt, d + " rope, explicit key positions");
  }
}

TEST_CASE("fused with a RoPE table too short for the call rotates copies", "[fused][rope]") {
  shape s;
  s.Sq = 1;
  s.Sk = 200;
  s.Hq = 2;
  s.D = 16;
  s.Dv = 16;
  buffers<float> bf(s, 5);
  posenc::rope<float> rope(posenc::rope_layout::interleaved, s.D);
  rope.reserve(100);
  CHECK_FALSE(rope.reserved_for(200));
  check_agrees(bf, rope, posenc::attention_options<float>{}, describe(s) + " short table");
}

TEST_CASE("fused: 1 thread == 2 threads", "[fused]") {
  shape s;
  s.B = 2;
  s.Sq = 150;
  s.Sk = 150;
  s.Hq = 4;
  s.Hkv = 2;
  s.D = 32;
  s.Dv = 32;
  buffers<float> bf(s, 77);
  posenc::attention_options<float> opt;
  opt.causal = true;
  opt.threads = 1;
  auto one = run<posenc::path::fused>(bf, posenc_test::fake_bias{}, opt);
  opt.threads = 2;
  auto two = run<posenc::path::fused>(bf, posenc_test::fake_bias{}, opt);
  // The lane kernel gives every row the same key order whatever the thread count.
  CHECK(one == two);
}

TEMPLATE_TEST_CASE("fused: a rerun gives the same bits, prefill and decode, on 1 and 2 threads", "[fused]", float,
                   double) {
  // Nothing in a result depends on the run: no timing, no allocation address, no thread
  // schedule (each row's keys in a fixed order, key chunks merged in a fixed order). A decode
  // (rows below a lane block) split across threads, a few queries, a prefill; RoPE rotated in
  // the tiles, ALiBi added in them.
  struct call {
    index_t sq, sk;
  };
  std::uint64_t seed = 90;
  for (call const c : {call{1, 1000}, call{3, 700}, call{150, 150}}) {
    shape s;
    s.B = 2;
    s.Sq = c.sq;
    s.Sk = c.sk;
    s.Hq = 4;
    s.Hkv = 2;
    s.D = 24;
    s.Dv = 20;
    buffers<TestType> bf(s, seed++);
    posenc::rope<TestType> rope(posenc::rope_layout::half_split, s.D);
    rope.reserve(c.sk);
    auto const enc = posenc::compose(rope, posenc::alibi<TestType>(posenc::alibi_form::paper, s.Hq));
    for (int threads : {1, 2}) {
      posenc::attention_options<TestType> opt;
      opt.causal = true;
      opt.threads = threads;
      INFO(describe(s) << ", " << threads << " threads");
      auto const first = run<posenc::path::fused>(bf, enc, opt);
      auto const again = run<posenc::path::fused>(bf, enc, opt);
      CHECK(first == again);
    }
  }
}

TEST_CASE("fused: fully masked rows give zeros and lse = -inf", "[fused]") {
  shape s;
  s.Sq = 20;
  s.Sk = 20;
  s.Hq = 1;
  s.Hkv = 1;
  s.D = 16;
  s.Dv = 16;
  buffers<float> bf(s, 5);
  bf.qpos = {-5};
  posenc::attention_options<float> opt;
  opt.causal = true;
  opt.q_positions = posenc::position_span(-5);  // rows 0..4 see no key
  auto got = run<posenc::path::fused>(bf, posenc::none{}, opt);
  for (index_t i = 0; i < 5; ++i) {
    for (index_t d = 0; d < s.Dv; ++d) CHECK(got[static_cast<std::size_t>(i * s.Dv + d)] == 0.0f);
    float const lse = got[static_cast<std::size_t>(bf.extent(s.Sq, s.Hq, s.Dv) + i)];
    CHECK(std::isinf(lse));
    CHECK(lse < 0);
  }
  for (float x : got) CHECK(!std::isnan(x));
}

TEST_CASE("fused and path::best reject the scores output before any write; path::materialized gives it",
          "[fused]") {
  shape s;
  s.Sq = 4;
  s.Sk = 4;
  s.D = 8;
  s.Dv = 8;
  buffers<float> bf(s, 9);
  std::vector<float> scores(16, 0.0f), out(32, -7.0f);
  posenc::attention_options<float> opt;
  opt.scores = scores;
  auto ov = posenc::make_bshd(out.data(), 1, 4, 1, 8);
  REQUIRE_THROWS_WITH(posenc::attention<posenc::path::fused>(bf.qv(), bf.kv(), bf.vv(), ov, posenc::none{}, opt),
                      posenc_test::contains("scores"));
  for (float x : out) CHECK(x == -7.0f);
  // path::best is the fused path only (nothing else is compiled for the call): it names the paths to ask
  REQUIRE_THROWS_WITH(posenc::attention<posenc::path::best>(bf.qv(), bf.kv(), bf.vv(), ov, posenc::none{}, opt),
                      "posenc::attention: scores is set, expected null (path::fused and path::best do not produce "
                      "the scores output; use path::materialized or path::reference)");
  for (float x : out) CHECK(x == -7.0f);
  for (float x : scores) CHECK(x == 0.0f);
  posenc::attention<posenc::path::materialized>(bf.qv(), bf.kv(), bf.vv(), ov, posenc::none{}, opt);
  float sum = 0;
  for (float x : scores) sum += x;
  CHECK(sum == posenc_test::Approx(4.0f).epsilon(1e-5));  // probabilities: each row sums to 1
}

TEST_CASE("fused: no allocation grows with Sq x Sk", "[fused]") {
  // Scratch is a function of the tile constants, head dims and head count
  // (fused_scratch_elements); here the allocations of whole calls are counted.
  posenc::rope<float> rope(posenc::rope_layout::half_split, 16);
  rope.reserve(2048);
  auto measure = [&](index_t S, bool decode, bool with_rope) {
    shape s;
    s.Sq = decode ? 1 : S;
    s.Sk = S;
    s.Hq = 2;
    s.Hkv = 1;
    s.D = 16;
    s.Dv = 16;
    buffers<float> bf(s, 3);
    std::vector<float> out(static_cast<std::size_t>(s.Sq * s.Hq * s.Dv));
    posenc::attention_options<float> opt;
    opt.causal = true;
    opt.threads = 2;
    auto ov = posenc::make_bshd(out.data(), 1, s.Sq, s.Hq, s.Dv);
    posenc::alibi<float> enc(posenc::alibi_form::paper, 2);
    auto const rope_alibi = posenc::compose(rope, enc);  // copies the table: before counting
    g_bytes = 0;
    g_largest = 0;
    g_counting = true;
    if (with_rope)  // rotated inside the tiles: no copy of q or k
      posenc::attention<posenc::path::fused>(bf.qv(), bf.kv(), bf.vv(), ov, rope_alibi, opt);
    else
      posenc::attention<posenc::path::fused>(bf.qv(), bf.kv(), bf.vv(), ov, enc, opt);
    g_counting = false;
    return std::make_pair(g_bytes.load(), g_largest.load());
  };
  for (bool decode : {false, true})
  for (bool with_rope : {false, true}) {
    auto small = measure(512, decode, with_rope), large = measure(2048, decode, with_rope);
    INFO("decode " << decode << " rope " << with_rope << ": " << small.first << " -> " << large.first << " bytes, largest "
                   << small.second << " -> " << large.second);
    // 4x the length: a Sq x Sk buffer would grow 16x (2048^2 floats = 16 MiB);
    // what grows here is linear (positions: 8 bytes per token, and the
    // rotation ids of queries and keys with RoPE); copies of q and k
    // (2 x 2 heads x 16 floats = 256 bytes per token) would not fit.
    CHECK(large.first - small.first <= (with_rope ? 4 : 2) * 8 * (2048 - 512) + 4096);
    // Everything together (per-thread scratch included) stays under 1/16 of
    // one 2048 x 2048 float score matrix.
    CHECK(large.first < 2048 * 2048 * 4 / 16);
  }
}

TEST_CASE("simd::transpose transposes a width x width block", "[fused][simd]") {
  auto check = [](auto zero) {
    using T = decltype(zero);
    using B = posenc::simd::batch<T>;
    constexpr std::size_t n = B::size;
    T in[n * n], out[n * n];
    for (std::size_t i = 0; i < n * n; ++i) in[i] = static_cast<T>(i);
    B rows[n];
    for (std::size_t r = 0; r < n; ++r) rows[r] = posenc::simd::load(in + r * n);
    posenc::simd::transpose(rows);
    for (std::size_t r = 0; r < n; ++r) posenc::simd::store(out + r * n, rows[r]);
    for (std::size_t r = 0; r < n; ++r)
      for (std::size_t c = 0; c < n; ++c) CHECK(out[r * n + c] == in[c * n + r]);
  };
  check(0.0f);
  check(0.0);
}
}  // namespace paths_fused_tests
