# SPDX-License-Identifier: MIT
# posenc_project_target(tgt): warnings as errors and -march=native, on our own targets only.
option(POSENC_NATIVE "Compile tests, benches and examples with -march=native" ON)

function(posenc_project_target tgt)
  target_link_libraries(${tgt} PRIVATE posenc::posenc)
  if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
    target_compile_options(${tgt} PRIVATE -Wall -Wextra -Werror)
    if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
      # Shadowing and narrowing conversions too (with g++; clang's -Wconversion also takes
      # in sign conversions, which packaging.strict_consumer checks for the public headers).
      target_compile_options(${tgt} PRIVATE -Wshadow -Wconversion)
    endif()
    if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 12.3)
      # GCC bug 105593: false positives inside GCC's own AVX-512 intrinsics headers.
      target_compile_options(${tgt} PRIVATE -Wno-uninitialized -Wno-maybe-uninitialized)
    endif()
    if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_SYSTEM_PROCESSOR MATCHES "aarch64|arm64")
      # g++ notes on AArch64 that passing std::pair<float, float> changed in GCC 10.1: an ABI
      # remark about other compilers' objects, not about this code.
      target_compile_options(${tgt} PRIVATE -Wno-psabi)
    endif()
    if(POSENC_NATIVE)
      target_compile_options(${tgt} PRIVATE -march=native)
    endif()
  endif()
endfunction()
