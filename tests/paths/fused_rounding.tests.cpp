// SPDX-License-Identifier: MIT
// The fused path's rounding rules that must hold on every instruction set (this file is also built
// for SSE2 and AVX2 + FMA, tests/CMakeLists.txt): a scalar sum that stands beside vector lanes
// rounds as they do.
#include <posenc/attention/attention.hpp>
#include <posenc/attention/backward.hpp>
#include <posenc/core/simd.hpp>
#include <posenc/encoding/alibi.hpp>
#include <posenc/encoding/none.hpp>

#include <cmath>
#include <cstdint>
#include <vector>

#include "support/catch.hpp"
#include "support/random.hpp"

namespace paths_fused_rounding_tests {

using namespace posenc;

// A row that sees one key has P = 1 and dS = dP - Delta with Delta = dO . O = dO . v = dP: exactly
// 0 when Delta's scalar sum rounds as dP's vector lanes (simd::fma_scalar beside simd::fma), on
// every instruction set; with a mixed rounding (x86 without FMA) such rows got dq of order 1e-7.
TEST_CASE("fused backward: a row that sees one key gets dq exactly 0", "[fused][backward]") {
  for (index_t D : {index_t(8), index_t(13), index_t(64), index_t(100)})
    for (index_t Dv : {D, index_t(24)})
      for (int enc_kind = 0; enc_kind < 2; ++enc_kind) {
        index_t const S = 9, H = 2;
        auto q = posenc_test::random_vector<float>(static_cast<std::size_t>(S * H * D), 900 + static_cast<std::uint64_t>(D), -2, 2);
        auto k = posenc_test::random_vector<float>(q.size(), 901 + static_cast<std::uint64_t>(D), -2, 2);
        auto v = posenc_test::random_vector<float>(static_cast<std::size_t>(S * H * Dv), 902 + static_cast<std::uint64_t>(Dv), -2, 2);
        auto dout = posenc_test::random_vector<float>(v.size(), 903 + static_cast<std::uint64_t>(Dv), -2, 2);
        std::vector<float> o(v.size()), dq(q.size(), -7.f), dk(q.size()), dv(v.size());
        auto mk = [&](std::vector<float>& x, index_t d) { return make_bshd(x.data(), 1, S, H, d); };
        attention_options<float> opt;
        opt.causal = true;  // row 0 sees key 0 alone
        auto run = [&](auto const& enc) {
          attention<path::fused>(view<const float>(mk(q, D)), view<const float>(mk(k, D)), view<const float>(mk(v, Dv)),
                                 mk(o, Dv), enc, opt);
          auto g = make_gradients(enc);
          attention_backward<path::fused>(view<const float>(mk(q, D)), view<const float>(mk(k, D)),
                                          view<const float>(mk(v, Dv)), view<const float>(mk(o, Dv)),
                                          view<const float>(mk(dout, Dv)), mk(dq, D), mk(dk, D), mk(dv, Dv), enc, opt, g);
        };
        if (enc_kind == 0)
          run(none{});
        else
          run(alibi<float>(alibi_form::paper, H));
        INFO("D " << D << " Dv " << Dv << (enc_kind == 0 ? " none" : " alibi") << " on " << simd::arch_name());
        int nonzero = 0;
        for (index_t h = 0; h < H; ++h)
          for (index_t d = 0; d < D; ++d) nonzero += dq[static_cast<std::size_t>(h * D + d)] != 0.0f;
        CHECK(nonzero == 0);
        for (float x : dq) CHECK(std::isfinite(x));
      }
}

}  // namespace paths_fused_rounding_tests
