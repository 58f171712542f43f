// SPDX-License-Identifier: MIT
// error_of(f): the message of the posenc::error f throws, or "<no error>".
#pragma once

#include <string>

#include <posenc/core/error.hpp>

namespace posenc_test {

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (posenc::error const& e) {
    return e.what();
  }
  return "<no error>";
}

}  // namespace posenc_test
