# SPDX-License-Identifier: MIT
# Cross-compiling posenc for 64-bit ARM (AArch64 Linux) with Debian's g++-aarch64-linux-gnu, and
# running what it builds (ctest, examples) under qemu-user-static (docs/integration.md, "Platforms").
#
#   cmake -S . -B build/aarch64 --toolchain cmake/toolchains/aarch64-linux-gnu.cmake \
#         -DPOSENC_AARCH64_MARCH=armv8-a [-DPOSENC_QEMU_CPU=max]
#
# POSENC_AARCH64_MARCH: the -march of every target (armv8-a: NEON, the baseline of every AArch64
#   CPU; armv8.2-a+fp16+bf16; armv8.2-a+sve ...). posenc's own targets then need POSENC_NATIVE=OFF,
#   which this file sets: -march=native names the build machine.
# POSENC_QEMU_CPU: qemu's -cpu for the programs ctest runs (default max: every extension qemu
#   emulates; max,sve256=on limits SVE to 256-bit vectors).
#
# posenc's dependencies are header-only. Debian installs Eigen's, xsimd's and Catch2's headers
# once for every architecture, under /usr/include, so they come from the build machine; that
# folder is searched after the cross compiler's own (-idirafter), so the C and C++ library
# headers are always AArch64's.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)

set(POSENC_AARCH64_MARCH "armv8-a" CACHE STRING "The -march of the AArch64 build (armv8-a, armv8.2-a+fp16+bf16, armv8.2-a+sve, ...)")
set(POSENC_QEMU_CPU "max" CACHE STRING "qemu-aarch64's -cpu for the programs ctest runs")
set(CMAKE_CXX_FLAGS_INIT "-march=${POSENC_AARCH64_MARCH} -idirafter /usr/include")
set(POSENC_NATIVE OFF CACHE BOOL "posenc's own targets with -march=native (not when cross-compiling)")

# The AArch64 C library and loader that qemu runs the programs against.
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
# Packages (CMake config files): the AArch64 root first, then the build machine's for the
# header-only ones. Debian keeps xsimd's config in the build machine's multiarch folder.
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)
file(GLOB _posenc_xsimd_config /usr/lib/*-linux-gnu*/cmake/xsimd/xsimdConfig.cmake)
if(_posenc_xsimd_config AND NOT xsimd_DIR)
  list(GET _posenc_xsimd_config 0 _posenc_xsimd_config)
  get_filename_component(_posenc_xsimd_dir ${_posenc_xsimd_config} DIRECTORY)
  set(xsimd_DIR ${_posenc_xsimd_dir} CACHE PATH "xsimd's CMake config (header-only: the build machine's)")
endif()
# /usr/include is where those packages point; listed as implicit, CMake does not put it ahead of
# the AArch64 headers with -isystem (-idirafter above searches it last).
list(APPEND CMAKE_CXX_IMPLICIT_INCLUDE_DIRECTORIES /usr/include)

find_program(POSENC_QEMU_AARCH64 NAMES qemu-aarch64-static qemu-aarch64)
if(POSENC_QEMU_AARCH64)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${POSENC_QEMU_AARCH64} -L /usr/aarch64-linux-gnu -cpu ${POSENC_QEMU_CPU})
endif()
