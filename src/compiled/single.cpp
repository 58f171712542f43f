// SPDX-License-Identifier: MIT
// posenc::compiled without dispatch: one build of the kernels, for the library's own flags.
#include <string>
#include <vector>

#include "posenc/compiled.hpp"
#include "posenc/core/error.hpp"
#include "posenc/core/simd.hpp"

namespace posenc::compiled {

std::string isa() { return simd::arch_name(); }

std::string arch() { return simd::arch_name(); }

std::vector<std::string> isas() { return {simd::arch_name()}; }

void set_isa(std::string const& level) {
  detail::require(level == simd::arch_name() || level == "best", "posenc::compiled::set_isa", "level is ", level,
                  ", expected ", simd::arch_name(), " (this library is built for one instruction set)");
}

}  // namespace posenc::compiled
