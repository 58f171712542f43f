# SPDX-License-Identifier: MIT
# Eigen (>= 3.4) and xsimd (8.1 .. 14): installed packages first, FetchContent otherwise.
include(FetchContent)

set(POSENC_EIGEN_GIT_TAG "3.4.0" CACHE STRING "Eigen tag fetched when no installed Eigen is found")
set(POSENC_XSIMD_GIT_TAG "13.2.0" CACHE STRING "xsimd tag fetched when no installed xsimd is found")

# posenc_find_or_fetch(<name> <git url> <tag>): find_package(<name> CONFIG), else
# fetch and add the sources. CMake >= 3.24 does both in FetchContent_MakeAvailable
# (FIND_PACKAGE_ARGS); older CMake finds first and fetches only when missing.
# A macro, so that <name>_FOUND and <name>_VERSION reach the caller.
macro(posenc_find_or_fetch _name _url _tag)
  if(CMAKE_VERSION VERSION_GREATER_EQUAL 3.24)
    FetchContent_Declare(${_name} GIT_REPOSITORY ${_url} GIT_TAG ${_tag} GIT_SHALLOW TRUE
                         FIND_PACKAGE_ARGS CONFIG QUIET)
    FetchContent_MakeAvailable(${_name})
  else()
    find_package(${_name} CONFIG QUIET)
    if(NOT ${_name}_FOUND)
      message(STATUS "posenc: ${_name} not installed, fetching ${_tag}")
      FetchContent_Declare(${_name} GIT_REPOSITORY ${_url} GIT_TAG ${_tag} GIT_SHALLOW TRUE)
      FetchContent_MakeAvailable(${_name})
    endif()
  endif()
endmacro()

if(NOT TARGET Eigen3::Eigen)
  # Unversioned: Eigen 3.4 rejects the range 3.4...5 and Eigen 5 reads "3.4" as 3.4.x
  # only, so the version is checked here instead.
  # Should Eigen be fetched, keep its tests, docs and pkg-config file out of this build
  # (normal variables, scoped to this directory, honoured by option() under CMP0077).
  set(_posenc_saved_cmp0077 "${CMAKE_POLICY_DEFAULT_CMP0077}")
  set(CMAKE_POLICY_DEFAULT_CMP0077 NEW)
  set(_posenc_had_build_testing ${BUILD_TESTING})
  set(BUILD_TESTING OFF)
  set(EIGEN_BUILD_TESTING OFF)
  set(EIGEN_BUILD_DOC OFF)
  set(EIGEN_BUILD_PKGCONFIG OFF)
  posenc_find_or_fetch(Eigen3 https://gitlab.com/libeigen/eigen.git ${POSENC_EIGEN_GIT_TAG})
  unset(BUILD_TESTING)
  if(DEFINED _posenc_had_build_testing)
    set(BUILD_TESTING ${_posenc_had_build_testing})
  endif()
  unset(EIGEN_BUILD_TESTING)
  unset(EIGEN_BUILD_DOC)
  unset(EIGEN_BUILD_PKGCONFIG)
  set(CMAKE_POLICY_DEFAULT_CMP0077 "${_posenc_saved_cmp0077}")
  if(Eigen3_FOUND AND DEFINED Eigen3_VERSION AND Eigen3_VERSION VERSION_LESS 3.4)
    message(FATAL_ERROR "posenc needs Eigen >= 3.4, found ${Eigen3_VERSION} in ${Eigen3_DIR}")
  endif()
endif()

if(NOT TARGET xsimd AND NOT TARGET xsimd::xsimd)
  posenc_find_or_fetch(xsimd https://github.com/xtensor-stack/xsimd.git ${POSENC_XSIMD_GIT_TAG})
  if(xsimd_FOUND AND DEFINED xsimd_VERSION AND xsimd_VERSION VERSION_LESS 8.1)
    message(FATAL_ERROR "posenc needs xsimd >= 8.1, found ${xsimd_VERSION} in ${xsimd_DIR}")
  endif()
endif()
# Installed xsimd exports a plain `xsimd` target (no namespace).
if(TARGET xsimd)
  set(POSENC_XSIMD_TARGET xsimd)
else()
  set(POSENC_XSIMD_TARGET xsimd::xsimd)
endif()

# Debian's xsimd 8.1 package links its target to "xtl" (for the optional xtl
# complex support) without finding it, so linking fails with -lxtl. Find xtl
# if it is installed, else stand in an empty target: posenc does not use xtl.
include(${CMAKE_CURRENT_LIST_DIR}/posencXtlWorkaround.cmake)
