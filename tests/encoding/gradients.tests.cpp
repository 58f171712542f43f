// SPDX-License-Identifier: MIT
// Every encoder's parameter gradients: gradient_tensor members of the parameter's shape, for_each_tensor,
// set_zero, operator+=, and an optimiser step through for_each_tensor on borrowed tables.
#include <posenc/core/half.hpp>
#include <posenc/encoding/alibi.hpp>
#include <posenc/encoding/clipped_bias.hpp>
#include <posenc/encoding/compose.hpp>
#include <posenc/encoding/learned.hpp>
#include <posenc/encoding/rope.hpp>
#include <posenc/encoding/shaw.hpp>
#include <posenc/encoding/t5_bias.hpp>
#include <posenc/encoding/transformer_xl.hpp>

#include <algorithm>
#include <cstddef>
#include <ostream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "support/catch.hpp"
#include "support/error_of.hpp"
#include "support/random.hpp"
#include "support/transformer_xl.hpp"

namespace encoding_gradients_tests {

using posenc::alibi;
using posenc::alibi_form;
using posenc::clipped_bias;
using posenc::compose;
using posenc::gradient_tensor;
using posenc::index_t;
using posenc::learned;
using posenc::rope;
using posenc::rope_layout;
using posenc::shaw;
using posenc::shaw_terms;
using posenc::t5_bias;
using posenc::t5_bias_params;
using posenc::transformer_xl;

// One type: the tables the relative encoders take and every gradient tensor.
static_assert(std::is_same_v<gradient_tensor<float>, posenc::relative_table<float>>);
static_assert(std::is_same_v<gradient_tensor<double>, posenc::relative_table<double>>);
static_assert(gradient_tensor<float>::IsRowMajor && !gradient_tensor<float>::IsVectorAtCompileTime);

// Every member, by its declared type (16-bit tables give float gradients).
static_assert(std::is_same_v<decltype(alibi<float>::gradients::slopes), gradient_tensor<float>>);
static_assert(std::is_same_v<decltype(alibi<double>::gradients::slopes), gradient_tensor<double>>);
static_assert(std::is_same_v<decltype(learned<float>::gradients::table), gradient_tensor<float>>);
static_assert(std::is_same_v<decltype(learned<Eigen::half>::gradients::table), gradient_tensor<float>>);
static_assert(std::is_same_v<decltype(t5_bias<double>::gradients::table), gradient_tensor<double>>);
static_assert(std::is_same_v<decltype(t5_bias<Eigen::bfloat16>::gradients::table), gradient_tensor<float>>);
static_assert(std::is_same_v<decltype(clipped_bias<float>::gradients::table), gradient_tensor<float>>);
static_assert(std::is_same_v<decltype(shaw<float>::gradients::key), gradient_tensor<float>>);
static_assert(std::is_same_v<decltype(shaw<Eigen::half>::gradients::value), gradient_tensor<float>>);
static_assert(std::is_same_v<decltype(transformer_xl<double>::gradients::u), gradient_tensor<double>>);
static_assert(std::is_same_v<decltype(transformer_xl<double>::gradients::v), gradient_tensor<double>>);
static_assert(std::is_same_v<decltype(transformer_xl<double>::gradients::r), gradient_tensor<double>>);
static_assert(std::is_same_v<posenc::encoder_gradients_t<rope<float>>, posenc::no_gradients>);

namespace {

struct visited {
  std::string name;
  index_t rows = 0, cols = 0;
  bool operator==(visited const& o) const { return name == o.name && rows == o.rows && cols == o.cols; }
};

std::ostream& operator<<(std::ostream& os, visited const& v) {
  return os << v.name << " (" << v.rows << ", " << v.cols << ")";
}

// The tensors g visits (name and shape, in order), through both overloads; checks at compile time that
// each is a gradient_tensor<C> (mutable, or const through the const overload).
template <class C, class G>
std::vector<visited> visit(G& g) {
  std::vector<visited> seen, seen_const;
  g.for_each_tensor([&](char const* name, auto& t) {
    static_assert(std::is_same_v<decltype(t), gradient_tensor<C>&>, "for_each_tensor passes gradient_tensor<C>&");
    seen.push_back({name, t.rows(), t.cols()});
  });
  std::as_const(g).for_each_tensor([&](char const* name, auto& t) {
    static_assert(std::is_same_v<decltype(t), gradient_tensor<C> const&>,
                  "const for_each_tensor passes gradient_tensor<C> const&");
    seen_const.push_back({name, t.rows(), t.cols()});
  });
  CHECK(seen_const == seen);
  return seen;
}

// Every value of g, tensor after tensor in visit order, each in its memory order.
template <class G>
std::vector<double> values(G const& g) {
  std::vector<double> v;
  g.for_each_tensor([&](char const*, auto const& t) {
    for (index_t i = 0; i < t.size(); ++i) v.push_back(static_cast<double>(t.data()[i]));
  });
  return v;
}

// make_gradients(enc) (or `g`, when given) visits `want`, is all zeros, fits enc, adds elementwise and
// set_zero zeroes it.
template <class C, class E, class G>
void check_contract(E const& enc, G g, std::vector<visited> const& want) {
  CHECK(visit<C>(g) == want);
  index_t total = 0;
  for (auto const& w : want) total += w.rows * w.cols;
  auto const zeros = values(g);
  REQUIRE(static_cast<index_t>(zeros.size()) == total);
  CHECK(std::all_of(zeros.begin(), zeros.end(), [](double x) { return x == 0.0; }));
  CHECK(posenc_test::error_of([&] { posenc::detail::check_encoder_gradients("check", enc, g); }) == "<no error>");

  // Distinct values, exact in float: 0.5, 1, 1.5, ...
  index_t k = 0;
  g.for_each_tensor([&](char const*, auto& t) {
    for (index_t i = 0; i < t.size(); ++i) t.data()[i] = static_cast<C>(0.5 * static_cast<double>(++k));
  });
  REQUIRE(k == total);
  auto const once = values(g);
  G sum = g;
  sum += g;
  sum += g;
  auto const thrice = values(sum);
  REQUIRE(thrice.size() == once.size());
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < once.size(); ++i) wrong += (thrice[i] == 3 * once[i] && once[i] != 0.0) ? 0 : 1;
  CHECK(wrong == 0);

  g.set_zero();
  CHECK(values(g) == zeros);
  CHECK(visit<C>(g) == want);  // set_zero keeps the shapes
}

// g += other throws `message` and leaves g as it was.
template <class G>
void check_mismatch(G g, G const& other, std::string const& message) {
  index_t k = 0;
  g.for_each_tensor([&](char const*, auto& t) {
    using C = typename std::decay_t<decltype(t)>::Scalar;
    for (index_t i = 0; i < t.size(); ++i) t.data()[i] = static_cast<C>(++k);
  });
  auto const before = values(g);
  CHECK(posenc_test::error_of([&] { g += other; }) == message);
  CHECK(values(g) == before);
}

// One SGD step through for_each_tensor: the i-th tensor visited updates buffers[i] (the borrowed
// parameter, in the tensor's memory order): p -= lr * g.
template <class G>
void sgd_step(G const& g, std::vector<std::pair<std::string, std::vector<float>*>> const& buffers, float lr) {
  std::size_t i = 0;
  g.for_each_tensor([&](char const* name, gradient_tensor<float> const& t) {
    REQUIRE(i < buffers.size());
    CHECK(name == buffers[i].first);
    std::vector<float>& p = *buffers[i].second;
    REQUIRE(static_cast<index_t>(p.size()) == t.size());
    for (index_t j = 0; j < t.size(); ++j) p[static_cast<std::size_t>(j)] -= lr * t.data()[j];
    ++i;
  });
  CHECK(i == buffers.size());
}

// The manual step on the parameter as a (rows, cols) matrix: param - lr * grad.
gradient_tensor<float> manual_step(std::vector<float> const& param, index_t rows, index_t cols,
                                   gradient_tensor<float> const& grad, float lr) {
  Eigen::Map<gradient_tensor<float> const> p(param.data(), rows, cols);
  return p - lr * grad;
}

// The number of nonzero values of t.
index_t nonzeros(gradient_tensor<float> const& t) { return (t.array() != 0.0f).count(); }

}  // namespace

TEST_CASE("gradients: ALiBi's slopes are a (heads, 1) tensor, learned by default, (0 x 0) when fixed",
          "[gradients][alibi]") {
  alibi<float> const enc(alibi_form::paper, 3);
  REQUIRE(enc.heads() == 3);
  check_contract<float>(enc, posenc::make_gradients(enc), {{"slopes", enc.heads(), 1}});
  check_contract<float>(enc, enc.make_gradients(true), {{"slopes", enc.heads(), 1}});
  check_contract<float>(enc, enc.make_gradients(false), {{"slopes", 0, 0}});
  check_contract<double>(alibi<double>(alibi_form::symmetric, 5), alibi<double>(alibi_form::symmetric, 5).make_gradients(),
                         {{"slopes", 5, 1}});

  // The hook adds into row `head`, the slope's: sum_j dbias[j] * (k - q) for the paper form.
  auto g = posenc::make_gradients(enc);
  float const dbias[4] = {1.0f, -2.0f, 0.5f, 4.0f};
  enc.bias_row_backward(1, 5, 2, 4, dbias, g);  // distances -3, -2, -1, 0
  CHECK(g.slopes(1, 0) == 1.0f * -3 + -2.0f * -2 + 0.5f * -1 + 4.0f * 0);
  CHECK(g.slopes(0, 0) == 0.0f);
  CHECK(g.slopes(2, 0) == 0.0f);
  auto fixed = enc.make_gradients(false);
  enc.bias_row_backward(1, 5, 2, 4, dbias, fixed);
  CHECK(fixed.slopes.size() == 0);

  check_mismatch(posenc::make_gradients(enc), enc.make_gradients(false),
                 "posenc::alibi::gradients::operator+=: other.slopes shape is (0, 0), expected (3, 1) (this one's)");
  check_mismatch(enc.make_gradients(false), posenc::make_gradients(enc),
                 "posenc::alibi::gradients::operator+=: other.slopes shape is (3, 1), expected (0, 0) (this one's)");
  check_mismatch(posenc::make_gradients(enc), alibi<float>(alibi_form::paper, 2).make_gradients(),
                 "posenc::alibi::gradients::operator+=: other.slopes shape is (2, 1), expected (3, 1) (this one's)");

  // check_gradients: (heads, 1) or (0 x 0), nothing else (a column of heads values, not a row).
  auto row = posenc::make_gradients(enc);
  row.slopes = gradient_tensor<float>::Zero(1, 3);
  CHECK(posenc_test::error_of([&] { enc.check_gradients("where", row); }) ==
        "where: grads.slopes shape is (1, 3), expected (0, 0) (fixed slopes) or (3, 1) (heads, 1)");
}

TEST_CASE("gradients: T5 and clipped tables are (rows, heads) like the tables they take", "[gradients][relative]") {
  t5_bias<float> const t5(t5_bias_params{3}, 7u);
  check_contract<float>(t5, posenc::make_gradients(t5), {{"table", t5.num_buckets(), t5.heads()}});
  t5_bias<Eigen::bfloat16> const t5h(t5_bias_params{2, true, 16}, 7u);
  check_contract<float>(t5h, posenc::make_gradients(t5h), {{"table", 16, 2}});
  check_mismatch(posenc::make_gradients(t5), t5_bias<float>(t5_bias_params{2}, 7u).make_gradients(),
                 "posenc::t5_bias::gradients::operator+=: other.table shape is (32, 2), expected (32, 3) (this one's)");

  clipped_bias<double> const cb(4, 2, 3u);
  check_contract<double>(cb, posenc::make_gradients(cb), {{"table", 2 * cb.max_distance() + 1, cb.heads()}});
  check_mismatch(posenc::make_gradients(cb), clipped_bias<double>(1, 2, 3u).make_gradients(),
                 "posenc::clipped_bias::gradients::operator+=: other.table shape is (3, 2), expected (9, 2) (this one's)");
}

TEST_CASE("gradients: Shaw visits key then value, (0 x 0) without value embeddings", "[gradients][shaw]") {
  shaw<float> const kv(2, 4, shaw_terms::keys_and_values, 5u);
  REQUIRE(kv.has_values());
  index_t const rows = 2 * kv.max_distance() + 1;
  check_contract<float>(kv, posenc::make_gradients(kv), {{"key", rows, kv.head_dim()}, {"value", rows, kv.head_dim()}});
  shaw<float> const k_only(2, 4, shaw_terms::keys, 5u);
  REQUIRE(!k_only.has_values());
  check_contract<float>(k_only, posenc::make_gradients(k_only), {{"key", rows, k_only.head_dim()}, {"value", 0, 0}});
  shaw<Eigen::half> const half_kv = shaw<Eigen::half>::rounded_from(kv);
  check_contract<float>(half_kv, posenc::make_gradients(half_kv), {{"key", rows, 4}, {"value", rows, 4}});
  check_mismatch(posenc::make_gradients(kv), posenc::make_gradients(k_only),
                 "posenc::shaw::gradients::operator+=: other.value shape is (0, 0), expected (5, 4) (this one's)");
  check_mismatch(posenc::make_gradients(kv), shaw<float>(2, 6, shaw_terms::keys_and_values, 5u).make_gradients(),
                 "posenc::shaw::gradients::operator+=: other.key shape is (5, 6), expected (5, 4) (this one's)");
}

TEST_CASE("gradients: the learned table is (rows, d_model), the table's own layout", "[gradients][learned]") {
  auto const enc = learned<float>::random(6, 3, 11u, 2);
  check_contract<float>(enc, posenc::make_gradients(enc), {{"table", enc.rows(), enc.d_model()}});
  auto const half = learned<Eigen::half>::random(5, 4, 11u);
  check_contract<float>(half, posenc::make_gradients(half), {{"table", half.rows(), half.d_model()}});
  check_mismatch(posenc::make_gradients(enc), learned<float>::random(6, 4, 11u).make_gradients(),
                 "posenc::learned::gradients::operator+=: other.table shape is (6, 4), expected (6, 3) (this one's)");
  // The same count of values in another shape is another shape.
  check_mismatch(posenc::make_gradients(enc), learned<float>::random(9, 2, 11u).make_gradients(),
                 "posenc::learned::gradients::operator+=: other.table shape is (9, 2), expected (6, 3) (this one's)");
  auto flat = posenc::make_gradients(enc);
  flat.table = gradient_tensor<float>::Zero(1, 18);
  CHECK(posenc_test::error_of([&] { enc.check_gradients("where", flat); }) ==
        "where: grads.table shape is (1, 18), expected (6, 3) (rows, d_model)");
}

TEST_CASE("gradients: Transformer-XL visits u, v, r", "[gradients][transformer_xl]") {
  auto const enc = posenc_test::random_transformer_xl<double>(2, 4, 6, 3, 9u);
  index_t const r_rows = enc.heads() * (2 * enc.distance_limit() + 1);
  check_contract<double>(enc, posenc::make_gradients(enc),
                         {{"u", enc.heads(), enc.head_dim()}, {"v", enc.heads(), enc.head_dim()}, {"r", r_rows, 4}});
  check_mismatch(posenc::make_gradients(enc), posenc_test::random_transformer_xl<double>(2, 4, 6, 1, 9u).make_gradients(),
                 "posenc::transformer_xl::gradients::operator+=: other.r shape is (6, 4), expected (14, 4) (this one's)");
  check_mismatch(posenc::make_gradients(enc), posenc_test::random_transformer_xl<double>(3, 4, 6, 3, 9u).make_gradients(),
                 "posenc::transformer_xl::gradients::operator+=: other.u shape is (3, 4), expected (2, 4) (this one's)");
}

TEST_CASE("gradients: compose visits its parts in order with their names; rope visits nothing",
          "[gradients][compose]") {
  rope<float> const rot(rope_layout::half_split, 8);
  posenc::no_gradients none = posenc::make_gradients(rot);
  CHECK(visit<float>(none).empty());
  none.set_zero();
  none += posenc::no_gradients{};
  CHECK(values(none).empty());

  using both_t = compose<learned<float>, rope<float>, t5_bias<float>>;
  auto const lrn = learned<float>::random(7, 8, 2u);
  t5_bias<float> const t5(t5_bias_params{2, true, 16}, 4u);
  both_t const both(lrn, rot, t5);
  check_contract<float>(both, posenc::make_gradients(both), {{"table", 7, 8}, {"table", 16, 2}});

  // The visit order is the parts': part 0's tensor first.
  auto g = posenc::make_gradients(both);
  g.get<0>().table.setConstant(1.0f);
  g.get<2>().table.setConstant(2.0f);
  std::vector<float> firsts;
  g.for_each_tensor([&](char const*, gradient_tensor<float> const& t) { firsts.push_back(t(0, 0)); });
  CHECK(firsts == std::vector<float>{1.0f, 2.0f});

  check_mismatch(posenc::make_gradients(both),
                 both_t(lrn, rot, t5_bias<float>(t5_bias_params{2}, 4u)).make_gradients(),
                 "posenc::compose::gradients::operator+=: other.table shape is (32, 2), expected (16, 2) (this one's)");

  using pair_t = compose<alibi<float>, shaw<float>>;
  pair_t const pair(alibi<float>(alibi_form::paper, 2), shaw<float>(1, 4, shaw_terms::keys_and_values, 1u));
  check_contract<float>(pair, posenc::make_gradients(pair), {{"slopes", 2, 1}, {"key", 3, 4}, {"value", 3, 4}});
}

TEST_CASE("gradients: an SGD step through for_each_tensor on borrowed tables is the manual update",
          "[gradients][optimiser]") {
  float const lr = 0.5f;  // a power of two: lr * g is exact, contracted or not

  SECTION("learned (its padding row gets no gradient)") {
    index_t const rows = 6, dm = 3, offset = 2, B = 2, S = 3;
    auto table = posenc_test::random_vector<float>(static_cast<std::size_t>(rows * dm), 21);
    auto const original = table;
    auto const enc = learned<float>::view_of(table, rows, dm, offset).with_padding_row(1);
    std::vector<index_t> const ids = {-1, 0, 3, 1, -1, 0};  // -1 reads the padding row 1
    auto const dx = posenc_test::random_vector<float>(static_cast<std::size_t>(B * S * dm), 22);
    auto g = posenc::make_gradients(enc);
    enc.add_to_backward(posenc::make_bsd(dx.data(), B, S, dm), posenc::position_span::ids(ids.data(), B, S), g);
    CHECK(nonzeros(g.table) == 3 * dm);  // rows 2, 3 and 5 read by tokens, row 1 is padding
    CHECK(g.table.row(1).isZero());
    for (index_t c = 0; c < dm; ++c) CHECK(g.table(5, c) == dx[static_cast<std::size_t>(2 * dm + c)]);

    auto const want = manual_step(original, rows, dm, g.table, lr);
    sgd_step(g, {{"table", &table}}, lr);
    std::size_t wrong = 0;
    for (index_t r = 0; r < rows; ++r)
      for (index_t c = 0; c < dm; ++c) wrong += enc.value(r - offset, c) == want(r, c) ? 0 : 1;
    CHECK(wrong == 0);
    CHECK(table != original);
  }
  SECTION("T5") {
    t5_bias_params const p{2, true, 8};
    auto table = posenc_test::random_vector<float>(static_cast<std::size_t>(p.num_buckets * p.heads), 31);
    auto const original = table;
    auto const enc = t5_bias<float>::view_of(p, table);
    auto const dbias = posenc_test::random_vector<float>(6, 32);
    auto g = posenc::make_gradients(enc);
    enc.bias_row_backward(1, 3, 0, 6, dbias.data(), g);
    REQUIRE(nonzeros(g.table) > 0);
    CHECK(g.table.col(0).isZero());  // head 0 had no gradient
    auto const want = manual_step(original, p.num_buckets, p.heads, g.table, lr);
    sgd_step(g, {{"table", &table}}, lr);
    std::size_t wrong = 0;
    for (index_t b = 0; b < p.num_buckets; ++b)
      for (index_t h = 0; h < p.heads; ++h) wrong += enc.weight(b, h) == want(b, h) ? 0 : 1;
    CHECK(wrong == 0);
    CHECK(table != original);
  }
  SECTION("clipped") {
    index_t const K = 2, H = 3, rows = 2 * K + 1;
    auto table = posenc_test::random_vector<float>(static_cast<std::size_t>(rows * H), 41);
    auto const original = table;
    auto const enc = clipped_bias<float>::view_of(K, H, table);
    auto const dbias = posenc_test::random_vector<float>(7, 42);
    auto g = posenc::make_gradients(enc);
    enc.bias_row_backward(2, 4, 0, 7, dbias.data(), g);
    REQUIRE(nonzeros(g.table) == rows);  // distances -4 .. 2 reach every row of head 2
    auto const want = manual_step(original, rows, H, g.table, lr);
    sgd_step(g, {{"table", &table}}, lr);
    std::size_t wrong = 0;
    for (index_t r = 0; r < rows; ++r)
      for (index_t h = 0; h < H; ++h) wrong += enc.weight(r, h) == want(r, h) ? 0 : 1;
    CHECK(wrong == 0);
  }
  SECTION("Shaw, keys and values") {
    index_t const K = 1, D = 4, rows = 2 * K + 1, n = 4;
    auto keys = posenc_test::random_vector<float>(static_cast<std::size_t>(rows * D), 51);
    auto vals = posenc_test::random_vector<float>(static_cast<std::size_t>(rows * D), 52);
    auto const keys0 = keys, vals0 = vals;
    auto const enc = shaw<float>::view_of(K, D, keys, vals);
    auto const q = posenc_test::random_vector<float>(static_cast<std::size_t>(D), 53);
    auto const ds = posenc_test::random_vector<float>(static_cast<std::size_t>(n), 54);
    auto const p = posenc_test::random_vector<float>(static_cast<std::size_t>(n), 55);
    auto const dout = posenc_test::random_vector<float>(static_cast<std::size_t>(D), 56);
    std::vector<float> dq(static_cast<std::size_t>(D)), dp(static_cast<std::size_t>(n));
    auto g = posenc::make_gradients(enc);
    enc.score_row_backward(q.data(), 1, 0, n, 0.5f, ds.data(), dq.data(), g);
    enc.value_row_backward(p.data(), dout.data(), 1, 0, n, dp.data(), g);
    REQUIRE(nonzeros(g.key) == rows * D);
    REQUIRE(nonzeros(g.value) == rows * D);
    auto const want_k = manual_step(keys0, rows, D, g.key, lr), want_v = manual_step(vals0, rows, D, g.value, lr);
    sgd_step(g, {{"key", &keys}, {"value", &vals}}, lr);
    std::size_t wrong = 0;
    for (index_t r = 0; r < rows; ++r)
      for (index_t c = 0; c < D; ++c) {
        wrong += enc.key_weight(r, c) == want_k(r, c) ? 0 : 1;
        wrong += enc.value_weight(r, c) == want_v(r, c) ? 0 : 1;
      }
    CHECK(wrong == 0);
  }
}

TEST_CASE("gradients: the example of docs/backward.md, an SGD step on a borrowed T5 table", "[gradients][docs]") {
  t5_bias_params const p{2, true, 8};
  std::vector<float> table = posenc_test::random_vector<float>(static_cast<std::size_t>(8 * 2), 61);
  auto const original = table;
  auto const enc = t5_bias<float>::view_of(p, table);
  auto g = posenc::make_gradients(enc);
  auto const dbias = posenc_test::random_vector<float>(5, 62);
  enc.bias_row_backward(0, 2, 0, 5, dbias.data(), g);  // as attention_backward(..., enc, opt, g) would
  float const lr = 0.25f;
  std::vector<std::string> names;
  g.for_each_tensor([&](char const* name, posenc::gradient_tensor<float> const& t) {
    names.push_back(name);  // "table": (num_buckets, heads), the table's own shape
    Eigen::Map<posenc::gradient_tensor<float>>(table.data(), t.rows(), t.cols()) -= lr * t;
  });
  CHECK(names == std::vector<std::string>{"table"});
  REQUIRE(nonzeros(g.table) > 0);
  auto const want = manual_step(original, 8, 2, g.table, lr);
  std::size_t wrong = 0;
  for (index_t b = 0; b < 8; ++b)
    for (index_t h = 0; h < 2; ++h) wrong += enc.weight(b, h) == want(b, h) ? 0 : 1;
  CHECK(wrong == 0);
}

}  // namespace encoding_gradients_tests
