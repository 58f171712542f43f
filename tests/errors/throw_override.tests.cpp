// SPDX-License-Identifier: MIT
// POSENC_THROW defined before the first posenc include routes every error through it.
#include <string>

namespace {
/// A user's own exception type.
struct routed_error {
  std::string message;
};
}  // namespace

#define POSENC_THROW(x) throw routed_error{(x).what()}

#include <posenc/core/positions.hpp>
#include <posenc/core/view.hpp>

#include "support/catch.hpp"

TEST_CASE("errors: a user-defined POSENC_THROW receives the posenc::error", "[errors]") {
  std::string message;
  try {
    posenc::position_span(-1).validate("posenc::f", "pos", 1, 2);
  } catch (routed_error const& e) {
    message = e.message;
  } catch (...) {
    message = "<another exception type>";
  }
  CHECK(message == "posenc::f: pos position of batch 0 token 0 is -1, expected >= 0");
  REQUIRE_THROWS_AS(posenc::detail::check_equal("posenc::f", "k.seq", 1, 2, "v.seq"), routed_error);
}
