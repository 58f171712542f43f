// SPDX-License-Identifier: MIT
// The encoder contract (encoding/traits.hpp): every encoder of the library and compose<> of them keep it.
#include <posenc/encoding/alibi.hpp>
#include <posenc/encoding/clipped_bias.hpp>
#include <posenc/encoding/compose.hpp>
#include <posenc/encoding/learned.hpp>
#include <posenc/encoding/none.hpp>
#include <posenc/encoding/rope.hpp>
#include <posenc/encoding/shaw.hpp>
#include <posenc/encoding/sinusoidal.hpp>
#include <posenc/encoding/t5_bias.hpp>

#include "support/catch.hpp"
#include "support/fake_encoders.hpp"

namespace encoding_contract_tests {

namespace {
using posenc::keeps_encoder_contract_v;
using problem = posenc::detail::contract_problem;

template <class T>
constexpr bool all_library_encoders_keep_it() {
  return keeps_encoder_contract_v<posenc::rope<T>, T> && keeps_encoder_contract_v<posenc::alibi<T>, T> &&
         keeps_encoder_contract_v<posenc::t5_bias<T>, T> && keeps_encoder_contract_v<posenc::clipped_bias<T>, T> &&
         keeps_encoder_contract_v<posenc::shaw<T>, T> && keeps_encoder_contract_v<posenc::sinusoidal<T>, T> &&
         keeps_encoder_contract_v<posenc::learned<T>, T> && keeps_encoder_contract_v<posenc::none, T> &&
         keeps_encoder_contract_v<posenc::compose<posenc::rope<T>, posenc::alibi<T>>, T> &&
         keeps_encoder_contract_v<posenc::compose<posenc::learned<T>, posenc::t5_bias<T>, posenc::shaw<T>>, T>;
}
}  // namespace

TEMPLATE_TEST_CASE("encoder contract: the library's encoders and compose<> of them keep it", "[traits]", float,
                   double) {
  STATIC_REQUIRE(all_library_encoders_keep_it<TestType>());
  // Generic encoders (no value_type, templated hooks) keep it for any element type.
  STATIC_REQUIRE(keeps_encoder_contract_v<posenc_test::fake_rotary, TestType>);
  STATIC_REQUIRE(keeps_encoder_contract_v<posenc_test::fake_bias, TestType>);
  STATIC_REQUIRE(keeps_encoder_contract_v<posenc::compose<posenc_test::fake_rotary, posenc_test::fake_bias>, TestType>);
}

TEST_CASE("encoder contract: an element type other than the views' is the first problem named", "[traits]") {
  CHECK(posenc::detail::encoder_contract_problem<posenc::rope<double>, float>() == problem::value_type);
  CHECK(posenc::detail::encoder_contract_problem<posenc::alibi<float>, double>() == problem::value_type);
  // compose<> names the first part that breaks it.
  CHECK(posenc::detail::encoder_contract_problem<posenc::compose<posenc::rope<float>, posenc::alibi<double>>,
                                                 float>() == problem::value_type);
  CHECK(posenc::detail::encoder_contract_problem<posenc::compose<posenc_test::fake_rotary, posenc::t5_bias<double>>,
                                                 float>() == problem::value_type);
  CHECK_FALSE(keeps_encoder_contract_v<posenc::compose<posenc::rope<float>, posenc::shaw<double>>, float>);
  CHECK(keeps_encoder_contract_v<posenc::compose<posenc::rope<double>, posenc::shaw<double>>, double>);
}
}  // namespace encoding_contract_tests
