// SPDX-License-Identifier: MIT
// posenc::compiled: the check the headers make at their first call into the library.
#include <cstring>

#include "posenc/core/error.hpp"
#include "posenc/core/simd.hpp"
#include "posenc/core/version.hpp"

namespace posenc::detail::compiled_kernels {

void check_library(char const* headers_version, char const* headers_isa) {
  char const* const w = "posenc::compiled";
  require(std::strcmp(headers_version, version_string()) == 0, w, "the library is posenc ", version_string(),
          ", the headers are posenc ", headers_version,
          ", expected the same version (build posenc::compiled from the headers you include)");
#if !POSENC_COMPILED_DISPATCH  // with dispatch, any caller's instruction set is fine
  require(std::strcmp(headers_isa, simd::arch_name()) == 0, w, "the library's kernels are built for ",
          simd::arch_name(), ", this translation unit for ", headers_isa,
          ", expected the same instruction set (give posenc::compiled and its consumers the same -march flags)");
#else
  (void)headers_isa;
#endif
}

}  // namespace posenc::detail::compiled_kernels
