// SPDX-License-Identifier: MIT
// In-place attention (out is q itself) gives what a separate out gives, on every path and kernel.
#include <posenc/attention/attention.hpp>
#include <posenc/encoding/alibi.hpp>
#include <posenc/encoding/none.hpp>
#include <posenc/encoding/rope.hpp>
#include <posenc/encoding/shaw.hpp>

#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/random.hpp"

namespace attention_in_place_tests {

using posenc::index_t;

namespace {

struct shape {
  char const* name;
  index_t B, Sq, Sk, Hq, Hkv, D;
  bool causal;
  int threads;
};

// Lane kernel (>= 16 rows per kv head), row kernel (1..3 rows), GQA, a key split over threads.
shape const shapes[] = {
    {"lane kernel, causal prefill", 2, 40, 40, 2, 2, 16, true, 1},
    {"lane kernel, GQA, queries after a cache", 1, 24, 57, 4, 2, 8, true, 1},
    {"row kernel, 1 row", 2, 1, 37, 4, 4, 8, true, 1},
    {"row kernel, 3 rows, GQA", 2, 3, 37, 8, 2, 8, false, 1},
    {"key split, 2 threads", 1, 1, 300, 2, 1, 16, true, 2},
    {"key split, 2 threads, GQA, 2 rows", 1, 2, 260, 4, 2, 8, false, 2},
};

template <class Path, class E>
void check_in_place(shape const& s, E const& enc) {
  std::vector<float> const q0 = posenc_test::random_vector<float>(static_cast<std::size_t>(s.B * s.Sq * s.Hq * s.D), 11);
  std::vector<float> const k = posenc_test::random_vector<float>(static_cast<std::size_t>(s.B * s.Sk * s.Hkv * s.D), 12);
  std::vector<float> const v = posenc_test::random_vector<float>(static_cast<std::size_t>(s.B * s.Sk * s.Hkv * s.D), 13);
  std::vector<float> q = q0, out(q0.size(), -3.0f), lse_sep(static_cast<std::size_t>(s.B * s.Hq * s.Sq)),
                     lse_in(lse_sep.size());
  posenc::attention_options<float> opt;
  opt.causal = s.causal;
  opt.threads = s.threads;
  auto view = [&](float const* p, index_t S, index_t H) { return posenc::make_bshd(p, s.B, S, H, s.D); };
  opt.lse = lse_sep;
  posenc::attention<Path>(view(q0.data(), s.Sq, s.Hq), view(k.data(), s.Sk, s.Hkv), view(v.data(), s.Sk, s.Hkv),
                          posenc::make_bshd(out.data(), s.B, s.Sq, s.Hq, s.D), enc, opt);
  opt.lse = lse_in;
  posenc::view<float> const qo = posenc::make_bshd(q.data(), s.B, s.Sq, s.Hq, s.D);
  posenc::attention<Path>(qo, view(k.data(), s.Sk, s.Hkv), view(v.data(), s.Sk, s.Hkv), qo, enc, opt);
  bool same = true;
  for (std::size_t t = 0; t < q.size(); ++t) same = same && q[t] == out[t];
  CHECK(same);
  CHECK(lse_in == lse_sep);
}

template <class Path>
void check_all_shapes() {
  for (shape const& s : shapes) {
    INFO("shape: " << s.name);
    check_in_place<Path>(s, posenc::none{});
    posenc::rope<float> rope(posenc::rope_layout::half_split, s.D);
    check_in_place<Path>(s, rope);  // rotated copies
    rope.reserve(s.Sk + s.Sq);
    check_in_place<Path>(s, rope);  // rotated in the kernel (fused)
    check_in_place<Path>(s, posenc::alibi<float>(posenc::alibi_form::paper, s.Hq));
    check_in_place<Path>(s, posenc::shaw<float>(4, s.D, posenc::shaw_terms::keys_and_values, 7, 0.5));
  }
}

}  // namespace

TEMPLATE_TEST_CASE("attention in place: out == q gives the separate out's result", "[attention]",
                   posenc::path::reference, posenc::path::materialized, posenc::path::fused) {
  check_all_shapes<TestType>();
}
}  // namespace attention_in_place_tests
