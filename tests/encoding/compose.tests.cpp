// SPDX-License-Identifier: MIT
// none and compose<E...>: traits (OR of where, AND of is_relative), max_positions, hooks forwarded in order.
#include <posenc/encoding/compose.hpp>

#include <string>
#include <vector>

#include <posenc/encoding/learned.hpp>
#include <posenc/encoding/none.hpp>
#include <posenc/encoding/sinusoidal.hpp>

#include "support/catch.hpp"

namespace encoding_compose_tests {

using posenc::index_t;

namespace {

// Small fake encoders, one per place an encoder can act; each logs its calls.
std::vector<std::string>* g_log = nullptr;
void log_call(std::string s) {
  if (g_log) g_log->push_back(std::move(s));
}

struct fake_add {
  std::string name;
  float value;
  index_t max_pos;
  index_t max_positions() const noexcept { return max_pos; }
  void add_to(posenc::token_view<float> x, posenc::position_span pos) const {
    log_call("add " + name);
    for (index_t b = 0; b < x.batch; ++b)
      for (index_t s = 0; s < x.seq; ++s)
        for (index_t d = 0; d < x.dim; ++d) x(b, s, d) = x(b, s, d) * 10 + value + static_cast<float>(pos.at(b, s));
  }
};

struct fake_rotate {
  std::string name;
  index_t max_pos;
  index_t max_positions() const noexcept { return max_pos; }
  void rotate(posenc::view<float> x, posenc::position_span, index_t length) const {
    log_call("rotate " + name + " " + std::to_string(length));
    // a non-commuting step: x -> 2x + 1, so the order shows in the result
    for (index_t b = 0; b < x.batch; ++b)
      for (index_t s = 0; s < x.seq; ++s)
        for (index_t h = 0; h < x.heads; ++h)
          for (index_t d = 0; d < x.dim; ++d) x(b, s, h, d) = 2 * x(b, s, h, d) + (name == "A" ? 1.0f : 0.0f);
  }
};

struct fake_bias {
  float scale;
  index_t n_heads;
  index_t max_positions() const noexcept { return 0; }
  index_t heads() const noexcept { return n_heads; }
  void bias_row(index_t head, index_t q_pos, index_t k_first, index_t count, float* out) const noexcept {
    for (index_t j = 0; j < count; ++j) out[j] += scale * static_cast<float>(head * 100 + (k_first + j) - q_pos);
  }
};

struct fake_shaw {
  bool values;
  index_t dim;
  index_t max_positions() const noexcept { return 0; }
  bool has_values() const { return values; }
  index_t head_dim() const { return dim; }
  void score_row(float const* q, index_t q_pos, index_t k_first, index_t count, float scale,
                 float* out) const noexcept {
    for (index_t j = 0; j < count; ++j) out[j] += scale * q[0] * static_cast<float>(k_first + j - q_pos);
  }
  void value_row(float const* p, index_t, index_t, index_t count, float* out) const noexcept {
    for (index_t j = 0; j < count; ++j) out[0] += p[j];
  }
};

}  // namespace

}  // namespace encoding_compose_tests

namespace posenc {
template <>
struct encoder_traits<encoding_compose_tests::fake_add> {
  static constexpr bool adds_to_embeddings = true, rotates_queries_keys = false, biases_scores = false,
                        relative_key_value = false, is_relative = false;
};
template <>
struct encoder_traits<encoding_compose_tests::fake_rotate> {
  static constexpr bool adds_to_embeddings = false, rotates_queries_keys = true, biases_scores = false,
                        relative_key_value = false, is_relative = true;
};
template <>
struct encoder_traits<encoding_compose_tests::fake_bias> {
  static constexpr bool adds_to_embeddings = false, rotates_queries_keys = false, biases_scores = true,
                        relative_key_value = false, is_relative = true;
};
template <>
struct encoder_traits<encoding_compose_tests::fake_shaw> {
  static constexpr bool adds_to_embeddings = false, rotates_queries_keys = false, biases_scores = false,
                        relative_key_value = true, is_relative = true;
};
}  // namespace posenc

namespace encoding_compose_tests {

TEST_CASE("none: acts nowhere, any position, relative", "[compose][none]") {
  STATIC_REQUIRE(posenc::has_encoder_traits_v<posenc::none>);
  STATIC_REQUIRE(!posenc::adds_to_embeddings_v<posenc::none>);
  STATIC_REQUIRE(!posenc::rotates_queries_keys_v<posenc::none>);
  STATIC_REQUIRE(!posenc::biases_scores_v<posenc::none>);
  STATIC_REQUIRE(!posenc::relative_key_value_v<posenc::none>);
  STATIC_REQUIRE(posenc::is_relative_v<posenc::none>);
  STATIC_REQUIRE(posenc::is_relative_v<posenc::none const>);
  STATIC_REQUIRE(!posenc::has_encoder_traits_v<int>);
  CHECK(posenc::none{}.max_positions() == 0);
}

TEST_CASE("compose: where it acts is the OR of the parts, is_relative the AND", "[compose]") {
  using add_bias = posenc::compose<fake_add, fake_bias>;
  STATIC_REQUIRE(posenc::adds_to_embeddings_v<add_bias>);
  STATIC_REQUIRE(posenc::biases_scores_v<add_bias>);
  STATIC_REQUIRE(!posenc::rotates_queries_keys_v<add_bias>);
  STATIC_REQUIRE(!posenc::relative_key_value_v<add_bias>);
  STATIC_REQUIRE(!posenc::is_relative_v<add_bias>);  // the absolute part makes it absolute

  using rot_bias = posenc::compose<fake_rotate, fake_bias>;
  STATIC_REQUIRE(posenc::rotates_queries_keys_v<rot_bias>);
  STATIC_REQUIRE(posenc::biases_scores_v<rot_bias>);
  STATIC_REQUIRE(!posenc::adds_to_embeddings_v<rot_bias>);
  STATIC_REQUIRE(posenc::is_relative_v<rot_bias>);

  using all = posenc::compose<posenc::none, fake_shaw, fake_rotate>;
  STATIC_REQUIRE(posenc::relative_key_value_v<all>);
  STATIC_REQUIRE(posenc::rotates_queries_keys_v<all>);
  STATIC_REQUIRE(!posenc::biases_scores_v<all>);
  STATIC_REQUIRE(!posenc::adds_to_embeddings_v<all>);
  STATIC_REQUIRE(posenc::is_relative_v<all>);

  using just_none = posenc::compose<posenc::none>;
  STATIC_REQUIRE(!posenc::adds_to_embeddings_v<just_none>);
  STATIC_REQUIRE(posenc::is_relative_v<just_none>);

  using absolute = posenc::compose<posenc::learned<float>, posenc::sinusoidal<float>>;
  STATIC_REQUIRE(posenc::adds_to_embeddings_v<absolute>);
  STATIC_REQUIRE(!posenc::is_relative_v<absolute>);
  // nested compose
  using nested = posenc::compose<rot_bias, posenc::none>;
  STATIC_REQUIRE(posenc::is_relative_v<nested>);
  STATIC_REQUIRE(posenc::biases_scores_v<nested>);
}

TEST_CASE("compose: max_positions is the smallest non-zero of the parts", "[compose]") {
  fake_add a{"A", 0, 512};
  fake_add b{"B", 0, 0};
  fake_rotate r{"R", 128};
  CHECK(posenc::compose(b, posenc::none{}).max_positions() == 0);
  CHECK(posenc::compose(a).max_positions() == 512);
  CHECK(posenc::compose(a, b).max_positions() == 512);
  CHECK(posenc::compose(b, a, r).max_positions() == 128);
  CHECK(posenc::compose(r, b, a).max_positions() == 128);
  auto w = std::vector<float>(20 * 4, 0.0f);
  auto learned = posenc::learned<float>::copy_of(w, 20, 4, 2);
  CHECK(posenc::compose(posenc::none{}, learned, a).max_positions() == 18);
  CHECK(posenc::compose(posenc::sinusoidal<float>(4), learned).max_positions() == 18);
}

TEST_CASE("compose: add_to and rotate forward to every part in order", "[compose]") {
  std::vector<std::string> log;
  g_log = &log;
  posenc::compose enc(fake_add{"A", 1.0f, 0}, fake_bias{1.0f, 4}, fake_rotate{"A", 0}, fake_add{"B", 2.0f, 0},
                      fake_rotate{"B", 0});
  std::vector<float> x(1 * 2 * 3, 0.0f);
  enc.add_to(posenc::make_bsd(x.data(), 1, 2, 3), posenc::position_span(5));
  CHECK(log == std::vector<std::string>{"add A", "add B"});
  // A then B: ((0 * 10 + 1 + p) * 10 + 2 + p)
  CHECK(x[0] == (1.0f + 5) * 10 + 2 + 5);
  CHECK(x[3] == (1.0f + 6) * 10 + 2 + 6);
  log.clear();
  std::vector<float> q(1 * 1 * 1 * 2, 1.0f);
  enc.rotate(posenc::make_bshd(q.data(), 1, 1, 1, 2), posenc::position_span(0), 9);
  CHECK(log == std::vector<std::string>{"rotate A 9", "rotate B 9"});
  CHECK(q[0] == 2 * (2 * 1.0f + 1) + 0);  // A (2x + 1) then B (2x); the other order gives 5
  g_log = nullptr;
}

TEST_CASE("compose: biases add up; heads() comes from the biasing parts", "[compose]") {
  posenc::compose enc(fake_bias{1.0f, 0}, fake_add{"A", 0, 0}, fake_bias{0.5f, 8});
  std::vector<float> row(4, 1.0f);
  enc.bias_row(2, 10, 8, 4, row.data());
  for (index_t j = 0; j < 4; ++j) {
    float const b = static_cast<float>(200 + (8 + j) - 10);
    CHECK(row[static_cast<std::size_t>(j)] == 1.0f + b + 0.5f * b);
  }
  CHECK(enc.heads() == 8);  // the first part that names a head count
  CHECK(posenc::compose(fake_bias{1.0f, 12}, fake_bias{1.0f, 12}).heads() == 12);
  CHECK(posenc::compose(fake_add{"A", 0, 0}).heads() == 0);
}

TEST_CASE("compose: Shaw terms forward; value_row only to parts with values", "[compose]") {
  posenc::compose enc(fake_shaw{false, 16}, fake_rotate{"A", 0}, fake_shaw{true, 16});
  CHECK(enc.has_values());
  CHECK(enc.head_dim() == 16);
  float const q[1] = {2.0f};
  std::vector<float> s(3, 0.0f);
  enc.score_row(q, 4, 3, 3, 0.5f, s.data());
  for (index_t j = 0; j < 3; ++j) CHECK(s[static_cast<std::size_t>(j)] == 2 * 0.5f * 2.0f * static_cast<float>(j - 1));
  float const p[3] = {0.25f, 0.5f, 0.25f};
  float out[1] = {0.0f};
  enc.value_row(p, 4, 3, 3, out);
  CHECK(out[0] == 1.0f);  // only the part with values adds sum(p) = 1
  posenc::compose keys_only(fake_shaw{false, 8});
  CHECK(!keys_only.has_values());
  out[0] = 0.0f;
  keys_only.value_row(p, 4, 3, 3, out);
  CHECK(out[0] == 0.0f);
  CHECK(posenc::compose(fake_add{"A", 0, 0}).head_dim() == 0);
}

TEST_CASE("compose: learned + sinusoidal add_to equals the two add_to calls", "[compose]") {
  auto table = std::vector<float>(16 * 6);
  for (std::size_t i = 0; i < table.size(); ++i) table[i] = 0.01f * static_cast<float>(i);
  auto lrn = posenc::learned<float>::copy_of(table, 16, 6);
  posenc::sinusoidal<float> sin6(6);
  posenc::compose both(lrn, sin6);
  CHECK(&both.get<0>() == &std::get<0>(both.parts()));
  std::vector<float> x(2 * 3 * 6, 0.5f), y = x;
  both.add_to(posenc::make_bsd(x.data(), 2, 3, 6), posenc::position_span(4));
  lrn.add_to(posenc::make_bsd(y.data(), 2, 3, 6), posenc::position_span(4));
  sin6.add_to(posenc::make_bsd(y.data(), 2, 3, 6), posenc::position_span(4));
  CHECK(x == y);
}
}  // namespace encoding_compose_tests
