// SPDX-License-Identifier: MIT
// ring_attention on 1..4 ranks: the gathered output equals single-process attention; ranks that disagree all throw.
#include <posenc/distributed/ring.hpp>
#include <posenc/posenc.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/random.hpp"
#include "support/ring_problem.hpp"
#include "support/tolerance.hpp"
#include "support/transformer_xl.hpp"

using posenc::index_t;
namespace dist = posenc::distributed;

namespace {

using posenc_test::gather_all;
using posenc_test::problem;
using posenc_test::shard_lengths;
using posenc_test::take_rows;
using posenc_test::world_rank;
using posenc_test::world_size;
using posenc_test::for_each_encoder;

/// Runs the ring on this rank's shard, gathers every rank's output and
/// log-sum-exp into the whole sequence's order, and checks them against the
/// double reference under the tests' rule (<= 2x the plain float error + 1e-6).
template <class E>
void check_ring(problem const& p, E const& enc, dist::ring_options<float> opt, std::string const& what,
                std::uint64_t seed) {
  index_t const R = world_size(), me = world_rank();
  auto q = posenc_test::random_vector<float>(static_cast<std::size_t>(p.B * p.S * p.Hq * p.D), seed, -2, 2);
  auto k = posenc_test::random_vector<float>(static_cast<std::size_t>(p.B * p.S * p.Hkv * p.D), seed + 1, -2, 2);
  auto v = posenc_test::random_vector<float>(static_cast<std::size_t>(p.B * p.S * p.Hkv * p.Dv), seed + 2);
  opt.layout = p.layout;
  std::vector<index_t> const lengths = shard_lengths(p, R);
  dist::shard_map const map = dist::make_shard_map(p.layout, posenc::span<const index_t>(lengths.data(), R));
  std::vector<index_t> rows;
  for (index_t s = 0; s < lengths[static_cast<std::size_t>(me)]; ++s) rows.push_back(map.global_index(me, s));
  index_t const n = static_cast<index_t>(rows.size());
  auto ql = take_rows(q, p.B, p.S, p.Hq, p.D, rows), kl = take_rows(k, p.B, p.S, p.Hkv, p.D, rows);
  auto vl = take_rows(v, p.B, p.S, p.Hkv, p.Dv, rows);
  std::vector<float> ol(static_cast<std::size_t>(p.B * n * p.Hq * p.Dv), -7.f);
  std::vector<float> lsel(static_cast<std::size_t>(p.B * p.Hq * n), -7.f);
  opt.lse = lsel;
  dist::ring_stats const st = dist::ring_attention(
      MPI_COMM_WORLD, posenc::make_bshd(ql.data(), p.B, n, p.Hq, p.D), posenc::make_bshd(kl.data(), p.B, n, p.Hkv, p.D),
      posenc::make_bshd(vl.data(), p.B, n, p.Hkv, p.Dv), posenc::make_bshd(ol.data(), p.B, n, p.Hq, p.Dv), enc, opt);
  CHECK(st.steps == R);

  // The whole sequence, in token order: out (B, S, Hq, Dv) then lse (B, Hq, S).
  auto const outs = gather_all(ol), lses = gather_all(lsel);
  std::vector<float> got(static_cast<std::size_t>(p.B * p.S * p.Hq * p.Dv + p.B * p.Hq * p.S));
  float* const glse = got.data() + p.B * p.S * p.Hq * p.Dv;
  for (index_t r = 0; r < R; ++r) {
    index_t const nr = lengths[static_cast<std::size_t>(r)];
    for (index_t b = 0; b < p.B; ++b)
      for (index_t s = 0; s < nr; ++s) {
        index_t const g = map.global_index(r, s);
        for (index_t h = 0; h < p.Hq; ++h) {
          for (index_t d = 0; d < p.Dv; ++d)
            got[static_cast<std::size_t>(((b * p.S + g) * p.Hq + h) * p.Dv + d)] =
                outs[static_cast<std::size_t>(r)][static_cast<std::size_t>(((b * nr + s) * p.Hq + h) * p.Dv + d)];
          glse[(b * p.Hq + h) * p.S + g] = lses[static_cast<std::size_t>(r)][static_cast<std::size_t>((b * p.Hq + h) * nr + s)];
        }
      }
  }
  auto single = [&](auto path) {
    using P = decltype(path);
    std::vector<float> o(static_cast<std::size_t>(p.B * p.S * p.Hq * p.Dv + p.B * p.Hq * p.S));
    posenc::attention_options<float> ao = opt;
    ao.lse = {o.data() + p.B * p.S * p.Hq * p.Dv, p.B * p.Hq * p.S};
    posenc::attention<P>(posenc::make_bshd(q.data(), p.B, p.S, p.Hq, p.D),
                         posenc::make_bshd(k.data(), p.B, p.S, p.Hkv, p.D),
                         posenc::make_bshd(v.data(), p.B, p.S, p.Hkv, p.Dv),
                         posenc::make_bshd(o.data(), p.B, p.S, p.Hq, p.Dv), enc, ao);
    return o;
  };
  auto const ref = single(posenc::path::reference{});
  auto const plain = single(posenc_test::plain_path{});
  auto const rep = posenc_test::within_tolerance(got, ref, plain, 1e-6);
  INFO(what << " on " << R << " ranks: " << rep.describe());
  CHECK(rep.ok);
}

}  // namespace

TEST_CASE("ring == single-process attention for every encoder, causal and full, both layouts", "[ring]") {
  std::uint64_t seed = 100;
  for (auto layout : {dist::shard_layout::zigzag, dist::shard_layout::contiguous}) {
    problem p;
    p.layout = layout;
    p.uneven = layout == dist::shard_layout::contiguous;
    for (int mode = 0; mode < 2; ++mode) {
      dist::ring_options<float> opt;
      opt.causal = mode == 1;
      std::string const c = std::string(layout == dist::shard_layout::zigzag ? "zigzag" : "contiguous uneven") +
                            (opt.causal ? " causal " : " full ");
      for_each_encoder(p, [&](auto const& enc, char const* name) { check_ring(p, enc, opt, c + name, seed++); });
      // Transformer-XL (forward only: the ring's fused backward has no content bias), without a
      // segment memory: every block places its queries by position, whatever their count.
      check_ring(p, posenc_test::random_transformer_xl<float>(p.Hq, p.D, 8, 4096, seed, 0), opt, c + "transformer_xl",
                 seed + 1);
      seed += 2;
    }
  }
}

TEST_CASE("ring == single-process attention with GQA, windows, key lengths, offsets, softcap", "[ring]") {
  std::uint64_t seed = 500;
  for (auto layout : {dist::shard_layout::zigzag, dist::shard_layout::contiguous}) {
    problem p;
    p.layout = layout;
    p.uneven = layout == dist::shard_layout::contiguous;
    p.S = 53;
    p.Hq = 4;
    p.Hkv = 2;
    p.Dv = 12;
    std::string const c = layout == dist::shard_layout::zigzag ? "zigzag " : "contiguous uneven ";
    std::vector<index_t> const key_len = {41, 17};
    for (int mode = 0; mode < 5; ++mode) {
      dist::ring_options<float> opt;
      std::string m;
      if (mode == 0) m = "GQA causal", opt.causal = true;
      if (mode == 1) m = "GQA window 9", opt.sliding_window = 9;
      if (mode == 2) {
        m = "GQA causal key lengths";
        opt.causal = true;
        opt.key_lengths = posenc::span<const index_t>(key_len.data(), 2);
      }
      if (mode == 3) {
        m = "GQA full key lengths, softcap, scale";
        opt.key_lengths = posenc::span<const index_t>(key_len.data(), 2);
        opt.softcap = 3.0;
        opt.scale = 0.4;
      }
      if (mode == 4) {
        m = "GQA causal, query and key offsets";
        opt.causal = true;
        opt.q_positions = posenc::position_span(12);
        opt.k_positions = posenc::position_span(5);
      }
      for_each_encoder(p, [&](auto const& enc, char const* name) { check_ring(p, enc, opt, c + m + " " + name, seed++); });
    }
  }
}

TEST_CASE("ring with a rank that holds no token (contiguous)", "[ring]") {
  problem p;
  p.layout = dist::shard_layout::contiguous;
  p.uneven = true;
  p.empty_first = true;
  std::uint64_t seed = 900;
  for (int causal = 0; causal < 2; ++causal) {
    dist::ring_options<float> opt;
    opt.causal = causal == 1;
    std::string const c = std::string("rank 0 empty") + (opt.causal ? " causal " : " full ");
    check_ring(p, posenc::rope<float>(posenc::rope_layout::half_split, p.D), opt, c + "rope", seed++);
    check_ring(p, posenc::alibi<float>(posenc::alibi_form::key_only, p.Hq), opt, c + "alibi key-only", seed++);
    check_ring(p, posenc::shaw<float>(4, p.D, posenc::shaw_terms::keys_and_values, 6, 0.5), opt, c + "shaw", seed++);
  }
}

TEST_CASE("ring causal zig-zag skips the blocks in a rank's future and balances the rest", "[ring]") {
  index_t const R = world_size();
  problem p;
  p.S = 64 * R;
  std::vector<float> q(static_cast<std::size_t>(p.B * 2 * 32 * p.Hq * p.D), 0.5f), out(q.size());
  auto view = [&](std::vector<float>& x) { return posenc::make_bshd(x.data(), p.B, 64, p.Hq, p.D); };
  dist::ring_options<float> opt;
  opt.causal = true;
  auto const st = dist::ring_attention(MPI_COMM_WORLD, view(q), view(q), view(q), view(out), posenc::none{}, opt);
  // 4 (query chunk, key chunk) pairs per step; of the 4R per rank, 2R + 1 hold visible keys (every pair
  // with a lower key chunk, and the rank's two diagonal pairs).
  CHECK(st.blocks_run + st.blocks_skipped == 4 * R);
  CHECK(st.blocks_run == 2 * R + 1);
  CHECK(st.wait_seconds >= 0);
  CHECK(st.wait_seconds <= st.seconds);
}

TEST_CASE("ranks that disagree throw a clear posenc::error on every rank, out untouched", "[ring][errors]") {
  index_t const R = world_size(), me = world_rank();
  index_t const B = 1, S = 8, H = 2, D = 8;
  std::vector<float> q = posenc_test::random_vector<float>(static_cast<std::size_t>(B * (S + 2) * H * D), 7);
  std::vector<float> out(q.size(), -7.f);
  auto view = [&](std::vector<float>& x, index_t s) { return posenc::make_bshd(x.data(), B, s, H, D); };
  auto untouched = [&] {
    for (float x : out)
      if (x != -7.f) return false;
    return true;
  };
  posenc::rope<float> rope(posenc::rope_layout::half_split, D);
  auto run = [&](dist::ring_options<float> const& opt, index_t s, auto const& enc) {
    dist::ring_attention(MPI_COMM_WORLD, view(q, s), view(q, s), view(q, s), view(out, s), enc, opt);
  };
  std::string const last = std::to_string(R - 1);

  // An option that differs: the last rank asks for causal.
  dist::ring_options<float> base;
  dist::ring_options<float> causal_last = base;
  causal_last.causal = me == R - 1;
  if (R > 1) {
    REQUIRE_THROWS_WITH(run(causal_last, S, rope),
                        posenc_test::contains("posenc::ring_attention: causal is 1 on rank " + last + ", expected 0"));
    CHECK(untouched());
  }
  // A shape that differs: the last rank has another head_dim (its rope too).
  if (R > 1) {
    index_t const d = me == R - 1 ? 4 : D;
    posenc::rope<float> r2(posenc::rope_layout::half_split, d);
    REQUIRE_THROWS_WITH(dist::ring_attention(MPI_COMM_WORLD, posenc::make_bshd(q.data(), B, S, H, d),
                                             posenc::make_bshd(q.data(), B, S, H, d),
                                             posenc::make_bshd(q.data(), B, S, H, d),
                                             posenc::make_bshd(out.data(), B, S, H, d), r2, base),
                        posenc_test::contains("q.dim is 4 on rank " + last + ", expected 8"));
    CHECK(untouched());
  }
  // The same encoder type with other parameters: the last rank's RoPE base differs.
  if (R > 1) {
    posenc::rope_options o;
    o.base = me == R - 1 ? 500000.0 : 10000.0;
    posenc::rope<float> r2(posenc::rope_layout::half_split, D, o);
    REQUIRE_THROWS_WITH(run(base, S, r2),
                        posenc_test::contains("posenc::ring_attention: the encoder differs between ranks"));
    REQUIRE_THROWS_WITH(run(base, S, r2), posenc_test::contains("rank " + std::to_string(me) + " has " +
                                                                r2.identity().text()));
    CHECK(untouched());
  }
  // A T5 table that differs in one value only: the last head's bucket of the
  // largest distances, on the last rank (a sample of a few heads at short
  // distances cannot see it; the identity digests every entry).
  if (R > 1) {
    posenc::t5_bias_params const tp{H, true, 32, 128};
    posenc::relative_table<float> t(32, H);
    for (index_t b = 0; b < 32; ++b)
      for (index_t h = 0; h < H; ++h) t(b, h) = 0.01f * static_cast<float>(b * H + h);
    if (me == R - 1) t(31, H - 1) += 1e-3f;
    posenc::t5_bias<float> const t5(tp, t);
    std::string const want = "posenc::ring_attention: the encoder differs between ranks (identity digest #";
    REQUIRE_THROWS_WITH(run(base, S, t5), posenc_test::contains(want));
    REQUIRE_THROWS_WITH(run(base, S, t5), posenc_test::contains("on rank " + last + ", #"));
    REQUIRE_THROWS_WITH(run(base, S, t5),
                        posenc_test::contains("rank " + std::to_string(me) + " has " + t5.identity().text()));
    CHECK(untouched());
    // The same table everywhere: no error.
    posenc::relative_table<float> same = t;
    same(31, H - 1) = 0.01f * static_cast<float>(31 * H + H - 1);
    REQUIRE_NOTHROW(run(base, S, posenc::t5_bias<float>(tp, same)));
    std::fill(out.begin(), out.end(), -7.f);
  }
  // A bad argument on one rank (a mask, which the ring does not split): that rank
  // names it, the others name the rank.
  {
    dist::ring_options<float> opt = base;
    bool const mask = true;
    if (me == R - 1) opt.bool_mask = posenc::make_mask(&mask, 1, 1, 1, 1);
    std::string const want = me == R - 1 ? "posenc::ring_attention: bool_mask is set, expected none"
                                         : "posenc::ring_attention: rank " + last + " rejected its arguments";
    REQUIRE_THROWS_WITH(run(opt, S, rope), posenc_test::contains(want));
    CHECK(untouched());
  }
  // A bad argument found with the global positions (second phase): ALiBi built
  // for another head count on the last rank.
  {
    posenc::alibi<float> al(posenc::alibi_form::paper, me == R - 1 ? H + 1 : H);
    std::string const want = me == R - 1 ? "heads" : "posenc::ring_attention: rank " + last + " rejected its arguments";
    REQUIRE_THROWS_WITH(run(base, S, al), posenc_test::contains(want));
    CHECK(untouched());
  }
  // Zig-zag shards of the wrong length: rank 0 holds two tokens too many (with one rank any length is a zig-zag).
  if (R > 1) {
    index_t const s = me == 0 ? S + 2 : S;
    REQUIRE_THROWS_WITH(run(base, s, rope), posenc_test::contains("posenc::ring_attention: q.seq of rank 0 is " +
                                                                  std::to_string(S + 2) + ", expected "));
    CHECK(untouched());
  }
  // Transformer-XL with a segment memory to cut: the ring's sequence has none (its queries are
  // its keys), so memory_length() must be 0, on every rank alike.
  {
    auto const xl = posenc_test::random_transformer_xl<float>(H, D, 8, 64, 11, 2);
    REQUIRE_THROWS_WITH(run(base, S, xl), posenc_test::contains("posenc::ring_attention: the encoder's memory_length() "
                                                                "is 2, expected 0"));
    CHECK(untouched());
  }
  // Masks and explicit positions are refused on every rank alike.
  {
    dist::ring_options<float> opt = base;
    std::vector<index_t> ids(static_cast<std::size_t>(S), 0);
    opt.q_positions = posenc::position_span::ids(ids.data(), 1, S);
    REQUIRE_THROWS_WITH(run(opt, S, rope),
                        posenc_test::contains("q_positions is explicit ids, expected unset or one offset"));
    CHECK(untouched());
  }
}

TEST_CASE("shard maps: zig-zag chunks cover the sequence once, contiguous follows the lengths", "[ring][shards]") {
  for (index_t R = 1; R <= 5; ++R)
    for (index_t total : {index_t{0}, index_t{1}, 2 * R - 1, 2 * R, index_t{37}, index_t{1000}}) {
      std::vector<index_t> len;
      for (index_t r = 0; r < R; ++r) {
        auto z = dist::zigzag_segments(total, R, r);
        len.push_back(z[0].count + z[1].count);
        CHECK(z[0].count - z[1].count <= 1);
        CHECK(z[1].count - z[0].count <= 1);
      }
      auto const m = dist::make_shard_map(dist::shard_layout::zigzag, posenc::span<const index_t>(len.data(), R));
      std::vector<int> seen(static_cast<std::size_t>(total), 0);
      for (index_t r = 0; r < R; ++r)
        for (index_t s = 0; s < len[static_cast<std::size_t>(r)]; ++s) ++seen[static_cast<std::size_t>(m.global_index(r, s))];
      for (int c : seen) CHECK(c == 1);
    }
  std::vector<index_t> const len = {3, 0, 5};
  auto const m = dist::make_shard_map(dist::shard_layout::contiguous, posenc::span<const index_t>(len.data(), 3));
  CHECK(m.total == 8);
  CHECK(m.global_index(2, 0) == 3);
  CHECK(m.global_index(2, 4) == 7);
}
