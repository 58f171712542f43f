# SPDX-License-Identifier: MIT
# Debian's xsimd 8.1 target has INTERFACE_LINK_LIBRARIES "xtl" but its config
# never finds xtl; without a target of that name the linker gets -lxtl and fails.
if(TARGET xsimd AND NOT TARGET xtl)
  get_target_property(_posenc_xsimd_links xsimd INTERFACE_LINK_LIBRARIES)
  if(_posenc_xsimd_links MATCHES "(^|;)xtl(;|$)")
    find_package(xtl CONFIG QUIET)
    if(NOT TARGET xtl)
      add_library(xtl INTERFACE IMPORTED GLOBAL)
    endif()
  endif()
endif()
