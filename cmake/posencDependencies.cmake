# SPDX-License-Identifier: MIT
# Eigen (>= 3.4) and xsimd (8.1 .. 14): installed packages first, FetchContent otherwise.
include(FetchContent)

set(POSENC_EIGEN_GIT_TAG "3.4.0" CACHE STRING "Eigen tag fetched when no installed Eigen is found")
set(POSENC_XSIMD_GIT_TAG "13.2.0" CACHE STRING "xsimd tag fetched when no installed xsimd is found")

if(NOT TARGET Eigen3::Eigen)
  # Unversioned: Eigen 3.4 rejects the range 3.4...5 and Eigen 5 reads "3.4" as 3.4.x only.
  find_package(Eigen3 CONFIG QUIET)
  if(Eigen3_FOUND)
    if(DEFINED Eigen3_VERSION AND Eigen3_VERSION VERSION_LESS 3.4)
      message(FATAL_ERROR "posenc needs Eigen >= 3.4, found ${Eigen3_VERSION} in ${Eigen3_DIR}")
    endif()
  else()
    message(STATUS "posenc: Eigen3 not installed, fetching ${POSENC_EIGEN_GIT_TAG}")
    set(EIGEN_BUILD_DOC OFF CACHE BOOL "" FORCE)
    set(EIGEN_BUILD_TESTING OFF CACHE BOOL "" FORCE)
    set(BUILD_TESTING OFF CACHE BOOL "" FORCE)
    FetchContent_Declare(Eigen3 GIT_REPOSITORY https://gitlab.com/libeigen/eigen.git
                         GIT_TAG ${POSENC_EIGEN_GIT_TAG} GIT_SHALLOW TRUE)
    FetchContent_MakeAvailable(Eigen3)
  endif()
endif()

if(TARGET xsimd)
  set(POSENC_XSIMD_TARGET xsimd)
elseif(TARGET xsimd::xsimd)
  set(POSENC_XSIMD_TARGET xsimd::xsimd)
else()
  find_package(xsimd CONFIG QUIET)
  if(NOT xsimd_FOUND)
    message(STATUS "posenc: xsimd not installed, fetching ${POSENC_XSIMD_GIT_TAG}")
    FetchContent_Declare(xsimd GIT_REPOSITORY https://github.com/xtensor-stack/xsimd.git
                         GIT_TAG ${POSENC_XSIMD_GIT_TAG} GIT_SHALLOW TRUE)
    FetchContent_MakeAvailable(xsimd)
  endif()
  # Installed xsimd exports a plain `xsimd` target (no namespace).
  if(TARGET xsimd)
    set(POSENC_XSIMD_TARGET xsimd)
  else()
    set(POSENC_XSIMD_TARGET xsimd::xsimd)
  endif()
endif()

# Debian's xsimd 8.1 package links its target to "xtl" (for the optional xtl
# complex support) without finding it, so linking fails with -lxtl. Find xtl
# if it is installed, else stand in an empty target: posenc does not use xtl.
include(${CMAKE_CURRENT_LIST_DIR}/posencXtlWorkaround.cmake)
