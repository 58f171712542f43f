// SPDX-License-Identifier: MIT
// The 76 ONNX Attention backend cases (opsets 23 and 24) through every attention path.
#include <posenc/attention/attention.hpp>
#include <posenc/core/half.hpp>
#include <posenc/encoding/none.hpp>

#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "support/catch.hpp"
#include "support/onnx_case.hpp"

using posenc::index_t;

namespace {

struct case_result {
  bool ran = false;
  bool fp16 = false;      // a float16 case
  bool native16 = false;  // run on Eigen::half tensors
  std::string skipped;  // why the case was not run on this path
  double max_error = 0;
  double tolerance = 0;
  std::string where;  // the output with the largest error
};

std::vector<float> as_float(posenc_test::onnx_tensor const& t) {
  return std::vector<float>(t.values.begin(), t.values.end());
}

/// Concatenates past (B, H, P, d) and new (B, H, S, d) along seq: (B, H, P + S, d).
std::vector<float> concat_bhsd(std::vector<float> const& past, std::vector<float> const& now, index_t B,
                               index_t H, index_t P, index_t S, index_t d) {
  std::vector<float> r(static_cast<std::size_t>(B * H * (P + S) * d));
  for (index_t b = 0; b < B; ++b)
    for (index_t h = 0; h < H; ++h) {
      for (index_t s = 0; s < P; ++s)
        for (index_t t = 0; t < d; ++t)
          r[static_cast<std::size_t>((((b * H + h) * (P + S)) + s) * d + t)] =
              past[static_cast<std::size_t>(((b * H + h) * P + s) * d + t)];
      for (index_t s = 0; s < S; ++s)
        for (index_t t = 0; t < d; ++t)
          r[static_cast<std::size_t>((((b * H + h) * (P + S)) + P + s) * d + t)] =
              now[static_cast<std::size_t>(((b * H + h) * S + s) * d + t)];
    }
  return r;
}

template <class Path>
case_result run_case(posenc_test::onnx_case const& c) {
  case_result res;
  auto const& Qt = *c.input(0);
  auto const& Kt = *c.input(1);
  auto const& Vt = *c.input(2);
  bool const is3d = Qt.dims.size() == 3;
  index_t B = Qt.dims[0], Hq, Hkv, Sq, Skv, D, Dv;
  if (is3d) {
    Hq = static_cast<index_t>(c.attr_num("q_num_heads", 0));
    Hkv = static_cast<index_t>(c.attr_num("kv_num_heads", 0));
    Sq = Qt.dims[1];
    Skv = Kt.dims[1];
    D = Qt.dims[2] / Hq;
    Dv = Vt.dims[2] / Hkv;
  } else {
    Hq = Qt.dims[1];
    Hkv = Kt.dims[1];
    Sq = Qt.dims[2];
    Skv = Kt.dims[2];
    D = Qt.dims[3];
    Dv = Vt.dims[3];
  }
  std::vector<float> q = as_float(Qt), k = as_float(Kt), v = as_float(Vt);
  // Keys and values as (B, Hkv, T, d), the new tokens after the past ones.
  index_t P = 0;
  if (is3d) {  // (B, S, H*d) -> (B, H, S, d) so that past and new concatenate simply
    auto to_bhsd = [&](std::vector<float> const& x, index_t H, index_t S, index_t d) {
      std::vector<float> r(x.size());
      for (index_t b = 0; b < B; ++b)
        for (index_t s = 0; s < S; ++s)
          for (index_t h = 0; h < H; ++h)
            for (index_t t = 0; t < d; ++t)
              r[static_cast<std::size_t>(((b * H + h) * S + s) * d + t)] =
                  x[static_cast<std::size_t>(((b * S + s) * H + h) * d + t)];
      return r;
    };
    k = to_bhsd(k, Hkv, Skv, D);
    v = to_bhsd(v, Hkv, Skv, Dv);
  }
  if (auto const* pk = c.input(4)) {
    P = pk->dims[2];
    k = concat_bhsd(as_float(*pk), k, B, Hkv, P, Skv, D);
    v = concat_bhsd(as_float(*c.input(5)), v, B, Hkv, P, Skv, Dv);
  }
  index_t const T = P + Skv;

  posenc::attention_options<float> opt;
  if (c.has_attr("scale")) opt.scale = c.attr_num("scale", 0);
  opt.softcap = c.attr_num("softcap", 0);
  opt.causal = c.attr_num("is_causal", 0) != 0;
  std::vector<index_t> key_lengths, q_first;
  if (auto const* np = c.input(6)) {
    for (double x : np->values) key_lengths.push_back(static_cast<index_t>(x));
    opt.key_lengths = key_lengths;
  }
  // ONNX aligns the causal frontier at the past length (P, or 0 without a
  // cache: top-left); with nonpad_kv_seqlen at nonpad[b] - Sq (bottom-right
  // against each entry's key length, the library's default when Sq != T; with
  // Sq == T the default puts the queries on the keys' own tokens, so it is spelled out).
  if (key_lengths.empty()) {
    opt.q_positions = posenc::position_span(P);
  } else {
    for (index_t L : key_lengths) q_first.push_back(L - Sq);
    opt.q_positions = posenc::position_span::per_batch(q_first);
  }

  std::vector<float> fmask;
  std::unique_ptr<bool[]> bmask;
  if (auto const* m = c.input(3)) {
    std::vector<index_t> dims(4, 1);
    for (std::size_t t = 0; t < m->dims.size(); ++t) dims[4 - m->dims.size() + t] = m->dims[t];
    if (m->dtype == "bool") {
      bmask.reset(new bool[m->values.size()]);
      for (std::size_t t = 0; t < m->values.size(); ++t) bmask[t] = m->values[t] != 0;
      opt.bool_mask = posenc::make_mask<bool>(bmask.get(), dims[0], dims[1], dims[2], dims[3]);
    } else {
      fmask = as_float(*m);
      opt.mask = posenc::make_mask<float>(fmask.data(), dims[0], dims[1], dims[2], dims[3]);
    }
  }
  std::vector<float> scores;
  auto const* qk_out = c.output(3);
  if (qk_out) {
    if (!posenc::detail::kernel<Path>::provides_scores) {
      res.skipped = "this path does not provide the scores output";
      return res;
    }
    scores.assign(static_cast<std::size_t>(B * Hq * Sq * T), std::nanf(""));
    opt.scores = scores;
    int const mode = static_cast<int>(c.attr_num("qk_matmul_output_mode", 0));
    opt.scores_stage = mode == 0   ? posenc::score_stage::raw
                       : mode == 1 ? posenc::score_stage::softcapped
                       : mode == 2 ? posenc::score_stage::biased
                                   : posenc::score_stage::probabilities;
  }

  auto qv = is3d ? posenc::make_bshd<const float>(q.data(), B, Sq, Hq, D)
                 : posenc::make_bhsd<const float>(q.data(), B, Hq, Sq, D);
  auto kv = posenc::make_bhsd<const float>(k.data(), B, Hkv, T, D);
  auto vv = posenc::make_bhsd<const float>(v.data(), B, Hkv, T, Dv);
  std::vector<float> y(static_cast<std::size_t>(B * Hq * Sq * Dv), std::nanf(""));
  bool const fp16 = Qt.dtype == "float16";
  res.fp16 = fp16;
  // float16 cases run in 16 bits where the path takes 16-bit tensors: q, k, v
  // and Y as Eigen::half (every input value is a float16 value, so the
  // conversion below is exact), Y rounded once by the library.
  // path::materialized takes float or double tensors only.
  auto const run_float = [&] {
    auto yv = is3d ? posenc::make_bshd(y.data(), B, Sq, Hq, Dv) : posenc::make_bhsd(y.data(), B, Hq, Sq, Dv);
    posenc::attention<Path>(qv, kv, vv, yv, posenc::none{}, opt);
  };
  if constexpr (std::is_same_v<Path, posenc::path::materialized>) {
    run_float();
  } else if (fp16) {
    auto const to16 = [](std::vector<float> const& x) {
      std::vector<Eigen::half> r(x.size());
      for (std::size_t t = 0; t < x.size(); ++t) {
        r[t] = posenc::detail::to_storage<Eigen::half>(x[t]);
        REQUIRE(posenc::detail::stored_value<float>(r[t]) == x[t]);
      }
      return r;
    };
    std::vector<Eigen::half> const q16 = to16(q), k16 = to16(k), v16 = to16(v);
    std::vector<Eigen::half> y16(y.size(), posenc::detail::to_storage<Eigen::half>(-7.0f));
    auto qv16 = is3d ? posenc::make_bshd<const Eigen::half>(q16.data(), B, Sq, Hq, D)
                     : posenc::make_bhsd<const Eigen::half>(q16.data(), B, Hq, Sq, D);
    auto yv16 = is3d ? posenc::make_bshd(y16.data(), B, Sq, Hq, Dv) : posenc::make_bhsd(y16.data(), B, Hq, Sq, Dv);
    posenc::attention<Path>(qv16, posenc::make_bhsd<const Eigen::half>(k16.data(), B, Hkv, T, D),
                            posenc::make_bhsd<const Eigen::half>(v16.data(), B, Hkv, T, Dv), yv16, posenc::none{},
                            opt);
    for (std::size_t t = 0; t < y.size(); ++t) y[t] = posenc::detail::stored_value<float>(y16[t]);
    res.native16 = true;
  } else {
    run_float();
  }

  res.tolerance = fp16 ? 2e-3 : 1e-5;
  res.ran = true;
  auto compare = [&](char const* name, std::vector<float> const& got, posenc_test::onnx_tensor const& want) {
    REQUIRE(got.size() == want.values.size());
    for (std::size_t t = 0; t < got.size(); ++t) {
      double const g = got[t], w = want.values[t];
      double const e = (std::isfinite(w) || std::isfinite(g)) ? std::abs(g - w) : (g == w ? 0.0 : INFINITY);
      if (!(e <= res.max_error)) {
        res.max_error = std::isnan(e) ? INFINITY : e;
        res.where = name;
      }
    }
  };
  compare("Y", y, *c.output(0));
  if (auto const* pk = c.output(1)) {  // present_key / present_value: the adapter's concatenation
    compare("present_key", k, *pk);
    compare("present_value", v, *c.output(2));
  }
  if (qk_out) compare("qk_matmul_output", scores, *qk_out);
  return res;
}

}  // namespace

TEMPLATE_TEST_CASE("onnx conformance: every Attention case", "[conformance][onnx]", posenc::path::reference,
                   posenc::path::materialized, posenc::path::fused) {
  std::string const dir = posenc_test::onnx_dir_or_skip();
  auto const names = posenc_test::onnx_case_names(dir, "test_attention");
  REQUIRE(names.size() == 76);
  int ran = 0, fp16 = 0, native16 = 0;
  for (auto const& name : names) {
    INFO("case " << name);
    auto const c = posenc_test::read_onnx_case(dir + "/" + name + ".txt");
    REQUIRE(c.op == "Attention");
    auto const r = run_case<TestType>(c);
    if (!r.ran) continue;
    ++ran;
    fp16 += r.fp16 ? 1 : 0;
    native16 += r.native16 ? 1 : 0;
    INFO("largest error " << r.max_error << " in " << r.where << ", tolerance " << r.tolerance);
    CHECK(r.max_error <= r.tolerance);
  }
  if (posenc::detail::kernel<TestType>::provides_scores) CHECK(ran == 76);
  // Every float16 case a path runs (four with the scores output, three
  // without) runs natively in 16 bits on the paths that take 16-bit tensors.
  CHECK(fp16 >= 3);
  CHECK(native16 == (std::is_same_v<TestType, posenc::path::materialized> ? 0 : fp16));
}
