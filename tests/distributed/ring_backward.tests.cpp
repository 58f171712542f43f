// SPDX-License-Identifier: MIT
// ring_attention_backward on 1..4 ranks: the gathered gradients equal single-process attention_backward.
#include <posenc/distributed/ring_backward.hpp>
#include <posenc/posenc.hpp>

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "support/backward_check.hpp"
#include "support/catch.hpp"
#include "support/random.hpp"
#include "support/ring_problem.hpp"
#include "support/tolerance.hpp"

using posenc::index_t;
namespace dist = posenc::distributed;
using posenc_test::problem;

namespace {

/// The values of an encoder's parameter gradients, flattened (empty: none).
template <class G>
std::vector<float> gradient_values(G const& g) {
  std::vector<float> x;
  auto add_matrix = [&](auto const& m) {
    for (index_t i = 0; i < static_cast<index_t>(m.rows()); ++i)
      for (index_t j = 0; j < static_cast<index_t>(m.cols()); ++j) x.push_back(static_cast<float>(m(i, j)));
  };
  if constexpr (std::is_same_v<G, posenc::t5_bias<float>::gradients> ||
                std::is_same_v<G, posenc::clipped_bias<float>::gradients>) {
    add_matrix(g.table);
  } else if constexpr (std::is_same_v<G, posenc::shaw<float>::gradients>) {
    add_matrix(g.key);
    add_matrix(g.value);
  } else if constexpr (std::is_same_v<G, posenc::alibi<float>::gradients>) {
    add_matrix(g.slopes);  // (heads, 1)
  }
  return x;
}

/// Forward ring, then backward ring on this rank's shard; the gathered dq, dk,
/// dv and the encoder's gradients (summed over the ranks) against the double
/// reference attention_backward over the whole sequence, under the tests'
/// rule (<= 2x the plain float backward's error + 1e-6).
template <class E>
void check_ring_backward(problem const& p, E const& enc, dist::ring_options<float> opt, std::string const& what,
                         std::uint64_t seed) {
  index_t const R = posenc_test::world_size(), me = posenc_test::world_rank();
  auto q = posenc_test::random_vector<float>(static_cast<std::size_t>(p.B * p.S * p.Hq * p.D), seed, -2, 2);
  auto k = posenc_test::random_vector<float>(static_cast<std::size_t>(p.B * p.S * p.Hkv * p.D), seed + 1, -2, 2);
  auto v = posenc_test::random_vector<float>(static_cast<std::size_t>(p.B * p.S * p.Hkv * p.Dv), seed + 2);
  auto dout = posenc_test::random_vector<float>(static_cast<std::size_t>(p.B * p.S * p.Hq * p.Dv), seed + 3);
  opt.layout = p.layout;
  std::vector<index_t> const lengths = posenc_test::shard_lengths(p, R);
  dist::shard_map const map = dist::make_shard_map(p.layout, posenc::span<const index_t>(lengths.data(), R));
  std::vector<index_t> rows;
  for (index_t s = 0; s < lengths[static_cast<std::size_t>(me)]; ++s) rows.push_back(map.global_index(me, s));
  index_t const n = static_cast<index_t>(rows.size());
  auto shard = [&](std::vector<float> const& x, index_t H, index_t dim) {
    return posenc_test::take_rows(x, p.B, p.S, H, dim, rows);
  };
  auto ql = shard(q, p.Hq, p.D), kl = shard(k, p.Hkv, p.D), vl = shard(v, p.Hkv, p.Dv), dol = shard(dout, p.Hq, p.Dv);
  std::vector<float> ol(static_cast<std::size_t>(p.B * n * p.Hq * p.Dv)), lsel(static_cast<std::size_t>(p.B * p.Hq * n));
  opt.lse = lsel;  // a rank without tokens gives an empty one (0 values, a null data pointer)
  auto bshd = [&](std::vector<float>& x, index_t H, index_t dim) { return posenc::make_bshd(x.data(), p.B, n, H, dim); };
  dist::ring_attention(MPI_COMM_WORLD, posenc::view<const float>(bshd(ql, p.Hq, p.D)),
                       posenc::view<const float>(bshd(kl, p.Hkv, p.D)), posenc::view<const float>(bshd(vl, p.Hkv, p.Dv)),
                       bshd(ol, p.Hq, p.Dv), enc, opt);
  std::vector<float> dql(ql.size(), -7.f), dkl(kl.size(), -7.f), dvl(vl.size(), -7.f);
  posenc::encoder_gradients_t<E> g = posenc::make_gradients(enc);
  dist::ring_stats const st = dist::ring_attention_backward(
      MPI_COMM_WORLD, posenc::view<const float>(bshd(ql, p.Hq, p.D)), posenc::view<const float>(bshd(kl, p.Hkv, p.D)),
      posenc::view<const float>(bshd(vl, p.Hkv, p.Dv)), posenc::view<const float>(bshd(ol, p.Hq, p.Dv)),
      posenc::view<const float>(bshd(dol, p.Hq, p.Dv)), bshd(dql, p.Hq, p.D), bshd(dkl, p.Hkv, p.D),
      bshd(dvl, p.Hkv, p.Dv), enc, opt, g);
  CHECK(st.steps == R);

  // Every rank's shard back in token order; the encoder's gradient summed over the ranks.
  auto global = [&](std::vector<float> const& mine, index_t H, index_t dim) {
    return posenc_test::to_global(posenc_test::gather_all(mine), p, map, lengths, H, dim);
  };
  std::vector<float> got = global(dql, p.Hq, p.D), dk_all = global(dkl, p.Hkv, p.D), dv_all = global(dvl, p.Hkv, p.Dv);
  got.insert(got.end(), dk_all.begin(), dk_all.end());
  got.insert(got.end(), dv_all.begin(), dv_all.end());
  std::vector<float> gv = gradient_values(g);
  if (!gv.empty())
    MPI_Allreduce(MPI_IN_PLACE, gv.data(), static_cast<int>(gv.size()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  got.insert(got.end(), gv.begin(), gv.end());

  auto single = [&](auto path) {
    using P = decltype(path);
    std::vector<float> o(static_cast<std::size_t>(p.B * p.S * p.Hq * p.Dv));
    posenc::attention_options<float> ao = opt;
    ao.lse = nullptr;
    auto whole = [&](std::vector<float>& x, index_t H, index_t dim) {
      return posenc::make_bshd(x.data(), p.B, p.S, H, dim);
    };
    posenc::attention<posenc::path::reference>(posenc::view<const float>(whole(q, p.Hq, p.D)),
                                               posenc::view<const float>(whole(k, p.Hkv, p.D)),
                                               posenc::view<const float>(whole(v, p.Hkv, p.Dv)),
                                               whole(o, p.Hq, p.Dv), enc, ao);
    std::vector<float> dq(q.size()), dk(k.size()), dv(v.size());
    posenc::encoder_gradients_t<E> gs = posenc::make_gradients(enc);
    posenc::attention_backward<P>(
        posenc::view<const float>(whole(q, p.Hq, p.D)), posenc::view<const float>(whole(k, p.Hkv, p.D)),
        posenc::view<const float>(whole(v, p.Hkv, p.Dv)), posenc::view<const float>(whole(o, p.Hq, p.Dv)),
        posenc::view<const float>(whole(dout, p.Hq, p.Dv)), whole(dq, p.Hq, p.D), whole(dk, p.Hkv, p.D),
        whole(dv, p.Hkv, p.Dv), enc, ao, gs);
    dq.insert(dq.end(), dk.begin(), dk.end());
    dq.insert(dq.end(), dv.begin(), dv.end());
    std::vector<float> const gsv = gradient_values(gs);
    dq.insert(dq.end(), gsv.begin(), gsv.end());
    return dq;
  };
  auto const ref = single(posenc::path::reference{});
  auto const plain = single(posenc_test::plain_flash_backward_path{});  // the blocks run the fused path
  REQUIRE(got.size() == ref.size());
  auto const rep = posenc_test::within_tolerance(got, ref, plain, 1e-6);
  INFO(what << " on " << R << " ranks: " << rep.describe());
  CHECK(rep.ok);
}

}  // namespace

TEST_CASE("ring backward == single-process backward for every encoder, causal and full, both layouts",
          "[ring][backward]") {
  std::uint64_t seed = 500;
  for (auto layout : {dist::shard_layout::zigzag, dist::shard_layout::contiguous}) {
    problem p;
    p.layout = layout;
    p.uneven = layout == dist::shard_layout::contiguous;
    for (int mode = 0; mode < 2; ++mode) {
      dist::ring_options<float> opt;
      opt.causal = mode == 0;
      std::string const how = std::string(opt.causal ? "causal" : "full") +
                              (layout == dist::shard_layout::zigzag ? ", zig-zag" : ", contiguous uneven");
      posenc_test::for_each_encoder(p, [&](auto const& enc, char const* name) {
        check_ring_backward(p, enc, opt, std::string(name) + ", " + how, seed += 10);
      });
    }
  }
}

TEST_CASE("ring backward with GQA, windows, key lengths, offsets, softcap, Dv != D, keys given rotated",
          "[ring][backward]") {
  problem p;
  p.B = 2;
  p.S = 41;
  p.Hq = 4;
  p.Hkv = 2;
  p.D = 16;
  p.Dv = 8;
  dist::ring_options<float> opt;
  opt.causal = true;
  opt.sliding_window = 9;
  std::vector<index_t> const kl = {41, 29};
  opt.key_lengths = posenc::span<const index_t>(kl.data(), 2);
  opt.softcap = 3.0f;
  opt.scale = 0.3f;
  check_ring_backward(p, posenc::none{}, opt, "none, GQA, window, key lengths, softcap, scale", 900);
  check_ring_backward(p, posenc::alibi<float>(posenc::alibi_form::paper, p.Hq), opt, "alibi, same options", 910);
  check_ring_backward(p, posenc::rope<float>(posenc::rope_layout::half_split, p.D), opt, "rope, same options", 920);

  dist::ring_options<float> off;
  off.causal = true;
  off.q_positions = posenc::position_span(5);
  off.k_positions = posenc::position_span(5);
  check_ring_backward(p, posenc::t5_bias<float>(posenc::t5_bias_params{p.Hq, false, 32, 128}, 4, 0.5), off,
                      "t5 causal, offset 5", 930);
  check_ring_backward(p, posenc::rope<float>(posenc::rope_layout::interleaved, p.D), off, "rope, offset 5", 940);
}

TEST_CASE("ring backward with a rank that holds no token (contiguous): null zero-length buffers",
          "[ring][backward]") {
  problem p;
  p.layout = dist::shard_layout::contiguous;
  p.uneven = true;
  p.empty_first = true;
  std::uint64_t seed = 1300;
  for (int causal = 0; causal < 2; ++causal) {
    dist::ring_options<float> opt;
    opt.causal = causal == 1;
    std::string const c = std::string("rank 0 empty") + (opt.causal ? ", causal, " : ", full, ");
    check_ring_backward(p, posenc::none{}, opt, c + "none", seed += 10);
    check_ring_backward(p, posenc::rope<float>(posenc::rope_layout::half_split, p.D), opt, c + "rope", seed += 10);
    check_ring_backward(p, posenc::alibi<float>(posenc::alibi_form::key_only, p.Hq), opt, c + "alibi key-only",
                        seed += 10);
    check_ring_backward(p, posenc::t5_bias<float>(posenc::t5_bias_params{p.Hq, true, 32, 128}, 4, 0.5), opt,
                        c + "t5", seed += 10);
  }
}

TEST_CASE("ring backward without the forward log-sum-exp throws on every rank, nothing written",
          "[ring][backward][errors]") {
  index_t const n = 5;
  std::vector<float> x(static_cast<std::size_t>(n * 2 * 8), 0.5f), out(x.size(), 0.1f), dout(x.size(), 1.f);
  std::vector<float> dq(x.size(), -7.f), dk(x.size(), -7.f), dv(x.size(), -7.f);
  auto view_of = [&](std::vector<float>& b) { return posenc::make_bshd(b.data(), 1, n, 2, 8); };
  auto cview = [&](std::vector<float>& b) { return posenc::view<const float>(view_of(b)); };
  dist::ring_options<float> opt;
  posenc::no_gradients g;
  // Every rank sees the same bad argument (no lse): the same error everywhere.
  REQUIRE_THROWS_WITH(dist::ring_attention_backward(MPI_COMM_WORLD, cview(x), cview(x), cview(x), cview(out),
                                                    cview(dout), view_of(dq), view_of(dk), view_of(dv), posenc::none{},
                                                    opt, g),
                      Catch::Matchers::Contains("lse is null"));
  // Only rank 0 passes a dq of the wrong shape: every rank throws, naming it.
  std::vector<float> lse(static_cast<std::size_t>(2 * n), 0.f);
  opt.lse = lse;
  std::vector<float> small(static_cast<std::size_t>(n * 2 * 4), -7.f);
  auto const bad_dq = posenc_test::world_rank() == 0 ? posenc::make_bshd(small.data(), 1, n, 2, 4) : view_of(dq);
  REQUIRE_THROWS_WITH(dist::ring_attention_backward(MPI_COMM_WORLD, cview(x), cview(x), cview(x), cview(out),
                                                    cview(dout), bad_dq, view_of(dk), view_of(dv), posenc::none{}, opt,
                                                    g),
                      Catch::Matchers::Contains("dq"));
  // Every rank names the failing call: rank 0 its own argument, the others rank 0.
  std::string const want = posenc_test::world_rank() == 0
                               ? "posenc::ring_attention_backward: dq.dim is 4, expected 8"
                               : "posenc::ring_attention_backward: rank 0 rejected its arguments";
  REQUIRE_THROWS_WITH(dist::ring_attention_backward(MPI_COMM_WORLD, cview(x), cview(x), cview(x), cview(out),
                                                    cview(dout), bad_dq, view_of(dk), view_of(dv), posenc::none{}, opt,
                                                    g),
                      posenc_test::contains(want));
  for (float e : dq) CHECK(e == -7.f);
  for (float e : dk) CHECK(e == -7.f);
  for (float e : small) CHECK(e == -7.f);
}

TEST_CASE("ring backward errors of the later phases name ring_attention_backward on every rank",
          "[ring][backward][errors]") {
  index_t const R = posenc_test::world_size(), me = posenc_test::world_rank(), n = 6, H = 2, D = 8;
  std::vector<float> x(static_cast<std::size_t>(n * H * D), 0.5f), out(x.size(), 0.1f), dout(x.size(), 1.f);
  std::vector<float> dq(x.size(), -7.f), dk(x.size(), -7.f), dv(x.size(), -7.f), lse(static_cast<std::size_t>(H * n), 0.f);
  auto view_of = [&](std::vector<float>& b) { return posenc::make_bshd(b.data(), 1, n, H, D); };
  auto cview = [&](std::vector<float>& b) { return posenc::view<const float>(view_of(b)); };
  dist::ring_options<float> opt;
  opt.lse = lse;
  auto run = [&](dist::ring_options<float> const& o, auto const& enc) {
    auto g = posenc::make_gradients(enc);
    dist::ring_attention_backward(MPI_COMM_WORLD, cview(x), cview(x), cview(x), cview(out), cview(dout), view_of(dq),
                                  view_of(dk), view_of(dv), enc, o, g);
  };
  std::string const last = std::to_string(R - 1);
  // First phase (options): the last rank asks for causal.
  if (R > 1) {
    dist::ring_options<float> o = opt;
    o.causal = me == R - 1;
    REQUIRE_THROWS_WITH(run(o, posenc::none{}),
                        posenc_test::contains("posenc::ring_attention_backward: causal is 1 on rank " + last));
  }
  // First phase, a rank's own argument: the last rank passes a mask.
  {
    dist::ring_options<float> o = opt;
    bool const mask = true;
    if (me == R - 1) o.bool_mask = posenc::make_mask(&mask, 1, 1, 1, 1);
    REQUIRE_THROWS_WITH(run(o, posenc::none{}), posenc_test::contains("posenc::ring_attention_backward: "));
  }
  // Second phase: ALiBi for another head count on the last rank.
  {
    posenc::alibi<float> const al(posenc::alibi_form::paper, me == R - 1 ? H + 1 : H);
    std::string const want = me == R - 1 ? "posenc::ring_attention_backward: " :
                                           "posenc::ring_attention_backward: rank " + last + " rejected its arguments";
    REQUIRE_THROWS_WITH(run(opt, al), posenc_test::contains(want));
  }
  // The encoders differ in one T5 table entry (last head, largest distances).
  if (R > 1) {
    posenc::relative_table<float> t(32, H);
    for (index_t b = 0; b < 32; ++b)
      for (index_t h = 0; h < H; ++h) t(b, h) = 0.02f * static_cast<float>(b - h);
    if (me == R - 1) t(31, H - 1) = 5.f;
    posenc::t5_bias<float> const t5(posenc::t5_bias_params{H, true, 32, 128}, t);
    REQUIRE_THROWS_WITH(run(opt, t5), posenc_test::contains("posenc::ring_attention_backward: the encoder differs "
                                                            "between ranks"));
    REQUIRE_THROWS_WITH(run(opt, t5),
                        posenc_test::contains("rank " + std::to_string(me) + " has " + t5.identity().text()));
  }
  for (float e : dq) CHECK(e == -7.f);
  for (float e : dk) CHECK(e == -7.f);
  for (float e : dv) CHECK(e == -7.f);
}

// The given lse is checked over each row's whole key sequence (the blocks' shares summed), so a
// backward call whose options differ from the forward's throws on every rank before writing.
TEST_CASE("ring backward checks the forward's lse over every key of the ring, nothing written",
          "[ring][backward][errors]") {
  index_t const me = posenc_test::world_rank(), n = 6, H = 2, D = 8;
  auto q = posenc_test::random_vector<float>(static_cast<std::size_t>(n * H * D), 1700 + static_cast<std::uint64_t>(me), -2, 2);
  auto k = posenc_test::random_vector<float>(q.size(), 1800 + static_cast<std::uint64_t>(me), -2, 2);
  auto v = posenc_test::random_vector<float>(q.size(), 1900 + static_cast<std::uint64_t>(me));
  auto dout = posenc_test::random_vector<float>(q.size(), 2000 + static_cast<std::uint64_t>(me));
  std::vector<float> out(q.size()), lse(static_cast<std::size_t>(H * n));
  auto view_of = [&](std::vector<float>& b) { return posenc::make_bshd(b.data(), 1, n, H, D); };
  auto cview = [&](std::vector<float>& b) { return posenc::view<const float>(view_of(b)); };
  dist::ring_options<float> fwd;
  fwd.layout = dist::shard_layout::contiguous;
  fwd.causal = true;
  fwd.lse = lse;
  posenc::alibi<float> const al(posenc::alibi_form::paper, H);
  dist::ring_attention(MPI_COMM_WORLD, cview(q), cview(k), cview(v), view_of(out), al, fwd);
  std::vector<float> dq(q.size(), -7.f), dk(q.size(), -7.f), dv(q.size(), -7.f);
  auto run = [&](dist::ring_options<float> const& o) {
    auto g = posenc::make_gradients(al);
    dist::ring_attention_backward(MPI_COMM_WORLD, cview(q), cview(k), cview(v), cview(out), cview(dout),
                                  view_of(dq), view_of(dk), view_of(dv), al, o, g);
  };
  auto untouched = [&] {
    int changed = 0;
    for (auto const* b : {&dq, &dk, &dv})
      for (float e : *b) changed += e != -7.f;
    return changed;
  };
  // Causal dropped, or another scale: some row of every rank sees other keys or scores.
  {
    dist::ring_options<float> o = fwd;
    o.causal = false;
    REQUIRE_THROWS_WITH(run(o), posenc_test::contains("posenc::ring_attention_backward: ") &&
                                    posenc_test::contains("lse does not match the scores") &&
                                    posenc_test::contains("causal, scale, mask, encoder or positions differ"));
    CHECK(untouched() == 0);
  }
  {
    dist::ring_options<float> o = fwd;
    o.scale = 0.5f;
    REQUIRE_THROWS_WITH(run(o), posenc_test::contains("lse does not match the scores"));
    CHECK(untouched() == 0);
  }
  // A given value beyond what float can carry precisely enough (rank 0's first row only): every
  // rank throws in the first phase, naming the limit.
  {
    std::vector<float> big = lse;
    if (me == 0) big[0] = 3000.f;
    dist::ring_options<float> o = fwd;
    o.lse = big;
    REQUIRE_THROWS_WITH(run(o), posenc_test::contains("lse of batch entry 0, head 0, row 0 is 3000, expected |lse| <= 2048"));
    CHECK(untouched() == 0);
  }
  // The forward's own options pass the check and write every gradient.
  REQUIRE_NOTHROW(run(fwd));
  CHECK(untouched() == static_cast<int>(3 * q.size()));
  for (auto const* b : {&dq, &dk, &dv})
    for (float e : *b) CHECK(std::isfinite(e));
}
