// SPDX-License-Identifier: MIT
// fuzz_input: decodes the fuzzer's bytes into small choices, numbers and seeds (zeros once exhausted).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>

namespace posenc_fuzz {

/// Reads the input front to back; every read past the end gives 0, so any
/// byte string decodes to one configuration and short inputs mean "defaults".
class fuzz_input {
 public:
  fuzz_input(std::uint8_t const* data, std::size_t size) noexcept : data_(data), size_(size) {}

  std::uint8_t byte() noexcept { return pos_ < size_ ? data_[pos_++] : 0; }
  /// A value in [0, n) (n >= 1).
  std::uint32_t below(std::uint32_t n) noexcept {
    std::uint32_t x = byte();
    if (n > 256) x = (x << 8) | byte();
    return x % n;
  }
  /// A value in [lo, hi].
  std::int64_t range(std::int64_t lo, std::int64_t hi) noexcept {
    return lo + static_cast<std::int64_t>(below(static_cast<std::uint32_t>(hi - lo + 1)));
  }
  bool coin() noexcept { return (byte() & 1) != 0; }
  std::uint64_t word() noexcept {
    std::uint64_t w = 0;
    for (int i = 0; i < 8; ++i) w = (w << 8) | byte();
    return w;
  }
  /// Any double, including NaN, infinities, subnormals and huge values.
  double raw_double() noexcept {
    std::uint64_t const w = word();
    double d;
    std::memcpy(&d, &w, sizeof d);
    return d;
  }
  /// A number chosen among the edge cases most parameters care about, or raw bits.
  double number() noexcept {
    static constexpr double inf = std::numeric_limits<double>::infinity();
    static double const table[] = {0.0,     -0.0,   1.0,    -1.0,   0.5,     2.0,   4.0,    8.0,     16.0,
                                   32.0,    64.0,   1.5,    0.25,   1e-3,    100.0, 1024.0, 2048.0,  4096.0,
                                   8192.0,  10000.0, 500000.0, 1e6, 1e12,   1e300,  -1e300, 1e-300,  4.9e-324,
                                   2.2250738585072014e-308, 9007199254740992.0, 1.8446744073709552e19,
                                   std::numeric_limits<double>::max(), inf, -inf,
                                   std::numeric_limits<double>::quiet_NaN(), 3.0, 7.0, 0.1, 64.5, -32.0};
    constexpr std::uint32_t n = sizeof table / sizeof table[0];
    std::uint32_t const k = below(n + 2);
    if (k < n) return table[k];
    if (k == n) return static_cast<double>(range(-100000, 100000));
    return raw_double();
  }
  bool exhausted() const noexcept { return pos_ >= size_; }

 private:
  std::uint8_t const* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
};

/// A finding: print what failed and abort, so that libFuzzer saves the input.
[[noreturn]] inline void finding(char const* what) {
  std::fprintf(stderr, "posenc fuzz finding: %s\n", what);
  std::fflush(stderr);
  std::abort();
}

}  // namespace posenc_fuzz
