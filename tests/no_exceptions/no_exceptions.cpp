// SPDX-License-Identifier: MIT
// Built with -fno-exceptions: a bad argument prints the posenc message to stderr and aborts.
#include <posenc/posenc.hpp>

#include <cstdio>
#include <vector>

#ifndef POSENC_NO_EXCEPTIONS
#error "POSENC_NO_EXCEPTIONS must be on without exception support"
#endif

int main() {
  std::vector<float> buf(16);
  auto v = posenc::make_bshd(buf.data(), 1, 2, 2, 4);
  posenc::detail::check_view("posenc::attention", "q", v);  // valid: returns
  std::printf("valid view accepted\n");
  std::fflush(stdout);
  v.dim_stride = 2;
  posenc::detail::check_view("posenc::attention", "q", v);  // prints and aborts
  std::printf("not reached\n");
  return 0;
}
