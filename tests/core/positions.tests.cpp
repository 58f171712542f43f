// SPDX-License-Identifier: MIT
// position_span: offset, per-batch and explicit forms; at(), validation messages, max_position().
#include <posenc/core/positions.hpp>

#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/error_of.hpp"

namespace core_positions_tests {

using posenc::index_t;
using posenc::position_span;

namespace {

using posenc_test::error_of;


}  // namespace

TEST_CASE("positions: an offset puts token s of every entry at first + s", "[positions]") {
  position_span def;
  CHECK(def.at(0, 0) == 0);
  CHECK(def.at(3, 5) == 5);
  for (index_t first : {0, 1, 17}) {
    position_span p(first);
    CHECK_FALSE(p.is_explicit());
    CHECK_FALSE(p.is_per_batch());
    for (index_t b = 0; b < 3; ++b)
      for (index_t s = 0; s < 4; ++s) CHECK(p.at(b, s) == first + s);
    CHECK(p.max_position(3, 4) == first + 3);
    CHECK(error_of([&] { p.validate("posenc::f", "pos", 3, 4); }) == "<no error>");
  }
  CHECK(position_span(5).max_position(2, 0) == -1);
  CHECK(position_span(5).max_position(0, 3) == -1);
}

TEST_CASE("positions: per-batch offsets", "[positions]") {
  std::vector<index_t> firsts{0, 7, 3};
  auto p = position_span::per_batch(firsts);
  CHECK(p.is_per_batch());
  CHECK_FALSE(p.is_explicit());
  for (index_t b = 0; b < 3; ++b)
    for (index_t s = 0; s < 5; ++s) CHECK(p.at(b, s) == firsts[static_cast<std::size_t>(b)] + s);
  CHECK(p.max_position(3, 5) == 11);
  CHECK(error_of([&] { p.validate("posenc::f", "pos", 3, 5); }) == "<no error>");
  CHECK(error_of([&] { p.validate("posenc::rope::rotate", "pos", 2, 5); }) ==
        "posenc::rope::rotate: pos has 3 per-batch offsets, expected 2");
  CHECK(error_of([&] { p.validate_shape("posenc::attention", "q_positions", 4, 5); }) ==
        "posenc::attention: q_positions has 3 per-batch offsets, expected 4");
}

TEST_CASE("positions: explicit ids, per entry or broadcast over the batch", "[positions]") {
  // (batch 2, seq 3), packed sequences restart at 0.
  std::vector<index_t> ids{4, 5, 6, 0, 1, 0};
  auto p = position_span::ids(ids.data(), 2, 3);
  CHECK(p.is_explicit());
  CHECK_FALSE(p.is_per_batch());
  for (index_t b = 0; b < 2; ++b)
    for (index_t s = 0; s < 3; ++s) CHECK(p.at(b, s) == ids[static_cast<std::size_t>(b * 3 + s)]);
  CHECK(p.max_position(2, 3) == 6);
  CHECK(error_of([&] { p.validate("posenc::f", "pos", 2, 3); }) == "<no error>");

  // The largest id need not be the last token of an entry.
  std::vector<index_t> shuffled{2, 9, 1};
  auto q = position_span::ids(shuffled.data(), 1, 3);
  for (index_t b = 0; b < 4; ++b)
    for (index_t s = 0; s < 3; ++s) CHECK(q.at(b, s) == shuffled[static_cast<std::size_t>(s)]);
  CHECK(q.max_position(4, 3) == 9);
  CHECK(error_of([&] { q.validate("posenc::f", "pos", 4, 3); }) == "<no error>");
}

TEST_CASE("positions: validate names the function, argument, value and expectation", "[positions]") {
  std::vector<index_t> ids{0, 1, 2, 3, 4, 5};
  auto p = position_span::ids(ids.data(), 2, 3);
  CHECK(error_of([&] { p.validate("posenc::rope::rotate", "pos", 3, 3); }) ==
        "posenc::rope::rotate: pos batch is 2, expected 3 or 1");
  CHECK(error_of([&] { p.validate("posenc::rope::rotate", "pos", 2, 4); }) ==
        "posenc::rope::rotate: pos seq is 3, expected 4");
  CHECK(error_of([&] { p.validate_shape("posenc::attention", "k_positions", 2, 2); }) ==
        "posenc::attention: k_positions seq is 3, expected 2");

  std::vector<index_t> neg{0, 1, 2, 3, -1, 5};
  auto n = position_span::ids(neg.data(), 2, 3);
  CHECK(error_of([&] { n.validate("posenc::learned::add_to", "pos", 2, 3); }) ==
        "posenc::learned::add_to: pos position of batch 1 token 1 is -1, expected >= 0");
  // validate_shape allows negative ids (query rows before the first key).
  CHECK(error_of([&] { n.validate_shape("posenc::attention", "q_positions", 2, 3); }) == "<no error>");

  CHECK(error_of([] { position_span(-2).validate("posenc::f", "pos", 1, 4); }) ==
        "posenc::f: pos position of batch 0 token 0 is -2, expected >= 0");
  CHECK(error_of([] { position_span(-2).validate("posenc::f", "pos", 1, 0); }) == "<no error>");

  std::vector<index_t> firsts{3, -5};
  CHECK(error_of([&] { position_span::per_batch(firsts).validate("posenc::f", "pos", 2, 2); }) ==
        "posenc::f: pos position of batch 1 token 0 is -5, expected >= 0");
}
}  // namespace core_positions_tests
