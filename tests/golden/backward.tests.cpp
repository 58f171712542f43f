// SPDX-License-Identifier: MIT
// attention_backward against torch autograd (tests/golden/gen_backward.py): every encoder, at double and float.
#include <posenc/posenc.hpp>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "support/backward_check.hpp"
#include "support/catch.hpp"
#include "support/golden.hpp"
#include "support/tolerance.hpp"

namespace golden_backward_tests {

using namespace posenc;

namespace {

index_t const B = 2, S = 5, H = 2, D = 4;

posenc_test::golden_file const& golden() {
  static posenc_test::golden_file const g = posenc_test::read_golden("backward.txt");
  return g;
}
template <class T>
std::vector<T> rec(std::string const& name) {
  auto const& r = posenc_test::golden_record(golden(), name);
  return std::vector<T>(r.begin(), r.end());
}
template <class T>
std::vector<T> flat(relative_table<T> const& t) {
  return std::vector<T>(t.data(), t.data() + t.size());
}
template <class T>
Eigen::Map<const relative_table<T>> as_table(std::vector<T> const& v, index_t rows, index_t cols) {
  return Eigen::Map<const relative_table<T>>(v.data(), rows, cols);
}

/// One golden case: its name and shapes.
struct golden_case {
  std::string name;
  index_t hq = H, hkv = H, dv = D;
};

/// The options gen_backward.py used for case `name`.
template <class T>
void set_options(std::string const& name, attention_options<T>& o) {
  o.causal = name != "t5" && name != "softcap_mask";
  if (name == "softcap_mask") {
    o.softcap = 0.7;
    o.scale = 1.3;
  }
}

/// dq, dk, dv and the encoder gradients (flattened by params(g, T{})) of case c on Path.
template <class Path, class T, class E, class P>
std::vector<T> run_case(golden_case const& c, E const& enc, encoder_gradients_t<E> g, P params) {
  std::vector<T> q = rec<T>(c.name + "/q"), k = rec<T>(c.name + "/k"), v = rec<T>(c.name + "/v"),
                 dout = rec<T>(c.name + "/dout");
  std::vector<T> out(dout.size()), dq(q.size()), dk(k.size()), dv(v.size()), mask;
  attention_options<T> opt;
  set_options(c.name, opt);
  if (c.name == "softcap_mask") {
    mask = rec<T>("softcap_mask/mask");
    opt.mask = make_mask<T>(mask.data(), 1, 1, S, S);
  }
  auto vq = make_bshd(q.data(), B, S, c.hq, D), vk = make_bshd(k.data(), B, S, c.hkv, D),
       vv = make_bshd(v.data(), B, S, c.hkv, c.dv), vo = make_bshd(out.data(), B, S, c.hq, c.dv);
  attention<path::reference>(vq, vk, vv, vo, enc, opt);
  attention_backward<Path>(vq, vk, vv, vo, make_bshd(dout.data(), B, S, c.hq, c.dv),
                           make_bshd(dq.data(), B, S, c.hq, D), make_bshd(dk.data(), B, S, c.hkv, D),
                           make_bshd(dv.data(), B, S, c.hkv, c.dv), enc, opt, g);
  std::vector<T> all = dq;
  all.insert(all.end(), dk.begin(), dk.end());
  all.insert(all.end(), dv.begin(), dv.end());
  std::vector<T> const pg = params(g, T{});
  all.insert(all.end(), pg.begin(), pg.end());
  return all;
}

/// torch's dq, dk, dv and parameter gradients of case `name`, concatenated.
std::vector<double> expected(std::string const& name, std::vector<std::string> const& params) {
  std::vector<double> all = rec<double>(name + "/dq");
  for (auto const& r : {"/dk", "/dv"}) {
    auto x = rec<double>(name + r);
    all.insert(all.end(), x.begin(), x.end());
  }
  for (auto const& p : params) {
    auto x = rec<double>(name + "/d" + p);
    all.insert(all.end(), x.begin(), x.end());
  }
  return all;
}

/// Gradients to start from: make_gradients(enc), with ALiBi's slopes learned.
template <class E>
encoder_gradients_t<E> start_gradients(E const& enc) {
  if constexpr (std::is_same_v<E, alibi<float>> || std::is_same_v<E, alibi<double>>)
    return enc.make_gradients(true);
  else
    return make_gradients(enc);
}

/// Runs case c at double (agreement 1e-12 with torch's float64) and at float
/// (the tolerance rule: error <= 2x the plain float backward's + 1e-6), with
/// the encoder make(T{}) builds; params(g, T{}) flattens its gradients in the
/// order of `param_names`.
template <class Path, class Make, class Params>
void check_path(golden_case const& c, std::vector<double> const& want, Make make, Params params) {
  char const* const path_name = std::is_same_v<Path, path::fused> ? " (fused)" : " (reference)";
  {
    auto enc = make(double{});
    auto got = run_case<Path, double>(c, enc, start_gradients(enc), params);
    REQUIRE(got.size() == want.size());
    double const err = posenc_test::max_abs_diff(got, want);
    INFO(c.name << path_name << " double: max error " << err);
    CHECK(err <= 1e-12);
  }
  {
    auto enc = make(float{});
    auto got = run_case<Path, float>(c, enc, start_gradients(enc), params);
    auto plain = run_case<posenc_test::plain_backward_for<Path>, float>(c, enc, start_gradients(enc), params);
    REQUIRE(got.size() == want.size());
    auto const r = posenc_test::within_tolerance(got, want, plain);
    INFO(c.name << path_name << " float: " << r.describe());
    CHECK(r.ok);
  }
}

/// check_path on the reference and the fused paths.
template <class Make, class Params>
void check_case(golden_case const& c, std::vector<std::string> const& param_names, Make make, Params params) {
  std::vector<double> const want = expected(c.name, param_names);
  check_path<path::reference>(c, want, make, params);
  check_path<path::fused>(c, want, make, params);
}

auto const no_params = [](no_gradients const&, auto t) { return std::vector<decltype(t)>{}; };
auto const none_encoder = [](auto) { return none{}; };

}  // namespace

TEST_CASE("golden backward: plain causal, softcap with an additive mask, GQA with Dv != D", "[golden][backward]") {
  check_case({"plain"}, {}, none_encoder, no_params);
  check_case({"softcap_mask"}, {}, none_encoder, no_params);
  check_case({"gqa", 4, 2, 3}, {}, none_encoder, no_params);
}

TEST_CASE("golden backward: T5, clipped, ALiBi and Shaw parameter gradients", "[golden][backward]") {
  check_case({"t5"}, {"table"},
             [](auto t) {
               using T = decltype(t);
               return t5_bias<T>(t5_bias_params{H, true, 8, 12}, as_table(rec<T>("t5/table"), 8, H));
             },
             [](auto const& g, auto) { return flat(g.table); });
  check_case({"clipped"}, {"table"},
             [](auto t) {
               using T = decltype(t);
               return clipped_bias<T>(2, H, as_table(rec<T>("clipped/table"), 5, H));
             },
             [](auto const& g, auto) { return flat(g.table); });
  check_case({"alibi"}, {"slopes"},
             [](auto t) {
               using T = decltype(t);
               std::vector<T> const slopes = rec<T>("alibi/slopes");
               return alibi<T>(alibi_form::paper, H, span<const T>(slopes.data(), H));
             },
             [](auto const& g, auto) { return flat(g.slopes); });
  check_case({"shaw"}, {"aK", "aV"},
             [](auto t) {
               using T = decltype(t);
               return shaw<T>(2, as_table(rec<T>("shaw/aK"), 5, D), as_table(rec<T>("shaw/aV"), 5, D));
             },
             [](auto const& g, auto) {
               auto all = flat(g.key);
               auto const v = flat(g.value);
               all.insert(all.end(), v.begin(), v.end());
               return all;
             });
}

TEST_CASE("golden backward: RoPE, both layouts", "[golden][backward]") {
  check_case({"rope_half"}, {}, [](auto t) { return rope<decltype(t)>(rope_layout::half_split, D); }, no_params);
  check_case({"rope_interleaved"}, {}, [](auto t) { return rope<decltype(t)>(rope_layout::interleaved, D); },
             no_params);
}

namespace {
/// The learned case: x + W[pos + 2] (pos from a left-padded mask, -1 at
/// padding), q = k = v = x split into heads, causal; returns d(table).
template <class Path, class T>
std::vector<T> learned_table_gradient() {
  index_t const dm = H * D, rows = S + 3;
  std::vector<T> const table = rec<T>("learned/table");
  auto enc = learned<T>::copy_of(table, rows, dm, 2);
  std::vector<T> x = rec<T>("learned/x"), dout = rec<T>("learned/dout");
  std::vector<index_t> const ids = {0, 1, 2, 3, 4, -1, 0, 1, 2, 3};
  position_span const pos = position_span::ids(ids.data(), B, S);
  enc.add_to(make_bsd(x.data(), B, S, dm), pos);
  std::vector<T> out(x.size()), dq(x.size()), dk(x.size()), dv(x.size());
  auto xv = make_bshd(x.data(), B, S, H, D);
  attention_options<T> opt;
  opt.causal = true;
  attention<path::reference>(xv, xv, xv, make_bshd(out.data(), B, S, H, D), none{}, opt);
  no_gradients ng;
  attention_backward<Path>(xv, xv, xv, make_bshd(out.data(), B, S, H, D), make_bshd(dout.data(), B, S, H, D),
                           make_bshd(dq.data(), B, S, H, D), make_bshd(dk.data(), B, S, H, D),
                           make_bshd(dv.data(), B, S, H, D), none{}, opt, ng);
  for (std::size_t i = 0; i < dq.size(); ++i) dq[i] += dk[i] + dv[i];
  auto g = enc.make_gradients();
  enc.add_to_backward(make_bsd(static_cast<T const*>(dq.data()), B, S, dm), pos, g);
  return flat(g.table);  // (rows, d_model), row-major as the table
}
}  // namespace

TEST_CASE("golden backward: learned table by scatter-add", "[golden][backward]") {
  std::vector<double> const want = rec<double>("learned/dtable");
  auto const got = learned_table_gradient<path::reference, double>();
  CHECK(posenc_test::max_abs_diff(got, want) <= 1e-12);
  auto const gotf = learned_table_gradient<path::reference, float>();
  auto const plain = learned_table_gradient<posenc_test::plain_backward_path, float>();
  auto const r = posenc_test::within_tolerance(gotf, want, plain);
  INFO(r.describe());
  CHECK(r.ok);
}

TEST_CASE("golden backward: learned table by scatter-add, through the fused path", "[golden][backward]") {
  std::vector<double> const want = rec<double>("learned/dtable");
  auto const got = learned_table_gradient<path::fused, double>();
  CHECK(posenc_test::max_abs_diff(got, want) <= 1e-12);
  auto const gotf = learned_table_gradient<path::fused, float>();
  auto const plain = learned_table_gradient<posenc_test::plain_backward_path, float>();
  auto const r = posenc_test::within_tolerance(gotf, want, plain);
  INFO(r.describe());
  CHECK(r.ok);
}
}  // namespace golden_backward_tests
