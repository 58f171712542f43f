// SPDX-License-Identifier: MIT
// posenc::error, the POSENC_THROW / POSENC_ASSERT macros and message helpers.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>

// Without exception support the library prints the message and aborts.
#if !defined(POSENC_NO_EXCEPTIONS) && !defined(__cpp_exceptions) && !defined(__EXCEPTIONS)
#define POSENC_NO_EXCEPTIONS 1
#endif

namespace posenc {

/// Thrown for bad arguments, before any output is written. The message names
/// the function, the argument, its value and what was expected:
/// "posenc::attention: k.seq is 7, expected 9 (v.seq)".
class error : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

namespace detail {
[[noreturn]] inline void print_and_abort(char const* what) noexcept {
  std::fprintf(stderr, "%s\n", what);
  std::abort();
}
}  // namespace detail
}  // namespace posenc

/// POSENC_THROW(e) reports a posenc::error: throws it, or with POSENC_NO_EXCEPTIONS
/// prints e.what() to stderr and aborts. Define it before including posenc to route
/// errors elsewhere; it must not return (posenc::detail::fail is [[noreturn]]).
#ifndef POSENC_THROW
#ifdef POSENC_NO_EXCEPTIONS
#define POSENC_THROW(x) ::posenc::detail::print_and_abort((x).what())
#else
#define POSENC_THROW(x) throw(x)
#endif
#endif

/// POSENC_ASSERT(cond, "literal"): debug-only check for hot loops (arguments are
/// validated up front instead); prints and aborts when cond fails, nothing under NDEBUG.
/// Overridable like POSENC_THROW.
#ifndef POSENC_ASSERT
#ifdef NDEBUG
#define POSENC_ASSERT(cond, msg) ((void)0)
#else
#define POSENC_ASSERT(cond, msg) \
  ((cond) ? (void)0 : ::posenc::detail::print_and_abort("posenc assertion failed: " msg))
#endif
#endif

namespace posenc::detail {

/// Writes x to os; floating-point values as %g with 6 digits, or more when needed
/// to read back exactly (0.1, not 0.10000000000000001; 10000; 1e-05; inf; nan).
template <class T>
void put(std::ostringstream& os, T const& x) {
  if constexpr (std::is_floating_point_v<T>) {
    char buf[64];
    for (int digits = 6; digits <= std::numeric_limits<T>::max_digits10; ++digits) {
      std::snprintf(buf, sizeof buf, "%.*Lg", digits, static_cast<long double>(x));
      if (static_cast<T>(std::strtold(buf, nullptr)) == x) break;
    }
    os << buf;
  } else {
    os << x;
  }
}

/// Concatenates anything streamable into one string.
template <class... Args>
std::string cat(Args const&... args) {
  std::ostringstream os;
  (put(os, args), ...);
  return os.str();
}

/// Throws posenc::error("<where>: <args...>").
template <class... Args>
[[noreturn]] void fail(char const* where, Args const&... args) {
  POSENC_THROW(::posenc::error(cat(where, ": ", args...)));
}

/// fail() unless cond holds. Arguments are only formatted on failure.
template <class... Args>
void require(bool cond, char const* where, Args const&... args) {
  if (!cond) fail(where, args...);
}

template <class T>
inline constexpr bool dependent_false_v = false;

}  // namespace posenc::detail
