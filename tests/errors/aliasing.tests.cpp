// SPDX-License-Identifier: MIT
// Outputs that share memory with an input or with each other are rejected before anything is written.
#include <posenc/attention/attention.hpp>
#include <posenc/encoding/none.hpp>

#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/random.hpp"

namespace errors_aliasing_tests {

using posenc::index_t;

namespace {

/// One buffer holding q, k, v, out, lse and a mask (B=2, Sq=3, Sk=4, Hq=4, Hkv=2, D=Dv=4),
/// so that a test can point an output anywhere inside it.
struct arena {
  static constexpr index_t B = 2, Sq = 3, Sk = 4, Hq = 4, Hkv = 2, D = 4;
  static constexpr index_t nq = B * Sq * Hq * D, nk = B * Sk * Hkv * D, nl = B * Hq * Sq, nm = Sq * Sk;
  // out's region is larger than out, so that a strided out can sit just below v.
  static constexpr index_t oq = 0, ok = oq + nq, oo = ok + nk, ov = oo + 256, ol = ov + nk, om = ol + nl;
  std::vector<float> buf = posenc_test::random_vector<float>(static_cast<std::size_t>(om + nm + 64), 5);
  std::vector<float> before;
  posenc::view<float> q = posenc::make_bshd(buf.data() + oq, B, Sq, Hq, D);
  posenc::view<float> k = posenc::make_bshd(buf.data() + ok, B, Sk, Hkv, D);
  posenc::view<float> v = posenc::make_bshd(buf.data() + ov, B, Sk, Hkv, D);
  posenc::view<float> out = posenc::make_bshd(buf.data() + oo, B, Sq, Hq, D);
  posenc::attention_options<float> opt;
  arena() {
    for (index_t t = 0; t < om; ++t) buf[static_cast<std::size_t>(t)] = 0.25f * static_cast<float>(t % 7);
    for (index_t t = om; t < om + nm; ++t) buf[static_cast<std::size_t>(t)] = 0.0f;  // additive mask: keep all
  }
  float* at(index_t offset) { return buf.data() + offset; }
  void snapshot() { before = buf; }
  bool untouched() const { return buf == before; }
};

template <class Path>
void expect_alias_error(arena& a, std::string const& message) {
  a.snapshot();
  INFO("expected message containing: " << message);
  REQUIRE_THROWS_AS(posenc::attention<Path>(a.q, a.k, a.v, a.out, posenc::none{}, a.opt), posenc::error);
  REQUIRE_THROWS_WITH(posenc::attention<Path>(a.q, a.k, a.v, a.out, posenc::none{}, a.opt),
                      posenc_test::contains(message));
  CHECK(a.untouched());
}

}  // namespace

TEMPLATE_TEST_CASE("attention aliasing: outputs overlapping inputs or each other are rejected", "[errors]",
                   posenc::path::reference, posenc::path::materialized, posenc::path::fused) {
  using A = arena;
  SECTION("the unbroken arena call works") {
    arena a;
    a.opt.lse = {a.at(A::ol), A::nl};
    a.opt.mask = posenc::make_mask<float>(a.at(A::om), 1, 1, A::Sq, A::Sk);
    a.snapshot();
    posenc::attention<TestType>(a.q, a.k, a.v, a.out, posenc::none{}, a.opt);
    CHECK(!a.untouched());
  }
  SECTION("out inside k") {
    arena a;
    a.out.data = a.at(A::ok + 8);
    a.out.batch = 1;
    a.out.seq = 1;
    a.q.batch = a.k.batch = a.v.batch = 1;
    a.q.seq = 1;
    expect_alias_error<TestType>(a, "overlaps k at");
  }
  SECTION("out partially over v, strided (only its last element)") {
    arena a;
    // out rows every 2 x 16 floats: the last row element ends exactly one element into v.
    a.out.data = a.at(A::ov - (A::B - 1) * 96 - (A::Sq - 1) * 32 - (A::Hq - 1) * 4 - 3);
    a.out.batch_stride = 96;
    a.out.seq_stride = 32;
    a.out.head_stride = 4;
    expect_alias_error<TestType>(a, "posenc::attention: out is at bytes");
    expect_alias_error<TestType>(a, "overlaps v at");
  }
  SECTION("out shifted by one row over q") {
    arena a;
    a.out.data = a.at(A::oq + A::D);
    expect_alias_error<TestType>(a, "overlaps q at");
    expect_alias_error<TestType>(a, "or out exactly q");
  }
  SECTION("out over q with other strides (same data pointer)") {
    arena a;
    a.out = posenc::make_bhsd(a.at(A::oq), A::B, A::Hq, A::Sq, A::D);
    expect_alias_error<TestType>(a, "posenc::attention: out is at bytes");
  }
  SECTION("out over the mask") {
    arena a;
    a.opt.mask = posenc::make_mask<float>(a.at(A::oo + 5), 1, 1, A::Sq, A::Sk);
    expect_alias_error<TestType>(a, "overlaps mask at");
  }
  SECTION("lse over out") {
    arena a;
    a.opt.lse = {a.at(A::oo + A::nq - 1), A::nl};
    expect_alias_error<TestType>(a, "posenc::attention: lse (q.batch x q.heads x q.seq elements) is at bytes");
    expect_alias_error<TestType>(a, "overlaps out at");
  }
  SECTION("lse over q, k and v") {
    arena a;
    a.opt.lse = {a.at(A::oq + 3), A::nl};
    expect_alias_error<TestType>(a, "posenc::attention: lse (q.batch x q.heads x q.seq elements) is at bytes");
    a.opt.lse = {a.at(A::ov + A::nk - 2), A::nl};
    expect_alias_error<TestType>(a, "overlaps v at");
  }
  SECTION("in place with rows that overlap each other") {
    arena a;
    a.q.seq_stride = 0;  // every query row reads the same memory
    a.out = a.q;
    a.out.data = a.q.data;
    expect_alias_error<TestType>(a, "posenc::attention: out is q (in-place attention) with elements that overlap each other");
  }
  SECTION("in place is accepted, a packed qkv buffer too") {
    arena a;
    // q, k and v interleaved per token in one buffer; out is q itself.
    index_t const tok = (A::Hq + 2 * A::Hkv) * A::D;
    std::vector<float> qkv = posenc_test::random_vector<float>(static_cast<std::size_t>(A::B * A::Sq * tok), 9);
    posenc::view<float> q{qkv.data(), A::B, A::Sq, A::Hq, A::D, A::Sq * tok, tok, A::D, 1};
    posenc::view<float> k{qkv.data() + A::Hq * A::D, A::B, A::Sq, A::Hkv, A::D, A::Sq * tok, tok, A::D, 1};
    posenc::view<float> v{qkv.data() + (A::Hq + A::Hkv) * A::D, A::B, A::Sq, A::Hkv, A::D, A::Sq * tok, tok, A::D, 1};
    std::vector<float> sep(static_cast<std::size_t>(A::B * A::Sq * A::Hq * A::D));
    posenc::view<float> o = posenc::make_bshd(sep.data(), A::B, A::Sq, A::Hq, A::D);
    posenc::attention<TestType>(q, k, v, o, posenc::none{}, a.opt);
    std::vector<float> const kv_before(qkv.begin(), qkv.end());
    posenc::attention<TestType>(q, k, v, q, posenc::none{}, a.opt);
    for (index_t b = 0; b < A::B; ++b)
      for (index_t s = 0; s < A::Sq; ++s)
        for (index_t h = 0; h < A::Hq; ++h)
          for (index_t d = 0; d < A::D; ++d) CHECK(q(b, s, h, d) == o(b, s, h, d));
    for (index_t b = 0; b < A::B; ++b)  // k and v untouched
      for (index_t s = 0; s < A::Sq; ++s)
        for (index_t t = A::Hq * A::D; t < tok; ++t) {
          std::size_t const e = static_cast<std::size_t>((b * A::Sq + s) * tok + t);
          CHECK(qkv[e] == kv_before[e]);
        }
  }
}

TEST_CASE("attention aliasing: scores over the inputs or the other outputs are rejected", "[errors]") {
  using A = arena;
  std::vector<float> scores(static_cast<std::size_t>(A::B * A::Hq * A::Sq * A::Sk));
  SECTION("scores over k") {
    arena a;
    a.opt.scores = {a.at(A::ok + 1), A::B * A::Hq * A::Sq * A::Sk};
    expect_alias_error<posenc::path::materialized>(a, "posenc::attention: scores (q.batch x q.heads x q.seq x k.seq elements) is at");
    expect_alias_error<posenc::path::reference>(a, "overlaps k at");
  }
  SECTION("lse over scores") {
    arena a;
    a.opt.scores = scores;
    a.opt.lse = {scores.data() + scores.size() - 1, A::nl};
    expect_alias_error<posenc::path::materialized>(a, "posenc::attention: scores (q.batch x q.heads x q.seq x k.seq elements) is at");
    expect_alias_error<posenc::path::reference>(a, "overlaps lse at");
  }
}
}  // namespace errors_aliasing_tests
