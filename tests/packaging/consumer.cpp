// SPDX-License-Identifier: MIT
// A downstream program: includes the umbrella header and calls into the library.
#include <posenc/posenc.hpp>

#include <cstdio>
#include <string>
#include <vector>

int main() {
  // A strided view and the SIMD shim: sum 1..16 through a batch reduction.
  std::vector<float> x(16);
  for (int i = 0; i < 16; ++i) x[static_cast<std::size_t>(i)] = static_cast<float>(i + 1);
  auto v = posenc::make_bshd(x.data(), 1, 2, 1, 8);
  float sum = 0;
  for (posenc::index_t s = 0; s < v.seq; ++s)
    for (posenc::index_t d = 0; d < v.dim; ++d) sum += v(0, s, 0, d);
  if (sum != 136.0f) return 1;
  static_assert(posenc::is_relative_v<posenc::compose<posenc::none>>, "none is relative");
  // Attention through the reference path: with all-zero keys every score is
  // 0, so each query gets the mean of the values.
  std::vector<float> q{1, 2, 3, 4}, k(4, 0.0f), val{1, 2, 3, 6}, out(4, -1.0f);
  posenc::attention<posenc::path::reference>(posenc::make_bshd<const float>(q.data(), 1, 2, 1, 2),
                                             posenc::make_bshd<const float>(k.data(), 1, 2, 1, 2),
                                             posenc::make_bshd<const float>(val.data(), 1, 2, 1, 2),
                                             posenc::make_bshd(out.data(), 1, 2, 1, 2), posenc::none{});
  if (out[0] != 2.0f || out[1] != 4.0f || out[2] != 2.0f || out[3] != 4.0f) return 2;
#if POSENC_COMPILED
  // The compiled mode: a call of posenc::compiled's list runs the library's kernel (the fused
  // path with RoPE, float), which must agree with the reference path compiled here.
  {
    posenc::index_t const S = 20, H = 2, D = 16;
    std::vector<float> qq(S * H * D), kk(qq.size()), vv(qq.size()), o1(qq.size()), o2(qq.size());
    for (std::size_t i = 0; i < qq.size(); ++i) {
      qq[i] = static_cast<float>(i % 7) * 0.1f;
      kk[i] = static_cast<float>(i % 5) * 0.2f - 0.4f;
      vv[i] = static_cast<float>(i % 3);
    }
    auto c = [&](std::vector<float>& x) { return posenc::make_bshd<const float>(x.data(), 1, S, H, D); };
    posenc::rope<float> rope(posenc::rope_layout::half_split, D);
    posenc::attention(c(qq), c(kk), c(vv), posenc::make_bshd(o1.data(), 1, S, H, D), rope);
    posenc::attention<posenc::path::reference>(c(qq), c(kk), c(vv), posenc::make_bshd(o2.data(), 1, S, H, D), rope);
    for (std::size_t i = 0; i < o1.size(); ++i)
      if (o1[i] - o2[i] > 1e-5f || o2[i] - o1[i] > 1e-5f) return 3;
    std::printf("posenc::compiled runs its %s kernels (%s)\n", posenc::compiled::isa().c_str(),
                posenc::compiled::arch().c_str());
#ifdef CONSUMER_COMPILED_LEVELS
    // A library built with some levels: it runs the highest it holds, offers only those, and
    // rejects a level it does not hold by name.
    std::string const held = std::string(",") + CONSUMER_COMPILED_LEVELS + ",";
    for (std::string const& l : posenc::compiled::isas())
      if (held.find("," + l + ",") == std::string::npos) return 4;
    if (posenc::compiled::isa() != posenc::compiled::isas().back()) return 5;
    for (char const* l : {"avx2", "avx512", "avx512_bf16"}) {
      if (held.find(std::string(",") + l + ",") != std::string::npos) continue;
      try {
        posenc::compiled::set_isa(l);
        return 6;
      } catch (posenc::error const& e) {
        if (std::string(e.what()).find("expected a level the library holds") == std::string::npos) return 7;
      }
    }
    std::printf("posenc::compiled holds %s\n", CONSUMER_COMPILED_LEVELS);
#endif
  }
#endif
  std::printf("posenc %s on %s ok\n", posenc::version_string(), posenc::simd::arch_name());
  return 0;
}
