# SPDX-License-Identifier: MIT
# posenc::compiled: the kernels of include/posenc/compiled/list.hpp in a static library.
#
# With dispatch (POSENC_COMPILED_DISPATCH, the default on x86-64 with g++ or clang and GNU
# binutils) the kernels are built once per instruction set: sse2 (x86-64 baseline), avx2
# (-march=haswell: AVX2, FMA, F16C), avx512 (-march=x86-64-v4) and, for the bfloat16 product
# mode, avx512_bf16; each build's symbols are made its own (cmake/posenc_isolate.sh), and
# src/compiled/dispatch.cpp, built without -march, calls the best level the CPU runs.
# Without dispatch, one build with POSENC_COMPILED_FLAGS (or -march=native with POSENC_NATIVE),
# which every consumer must share (checked at the first call).
set(_posenc_dispatch_default OFF)
if(CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64" AND CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang"
   AND CMAKE_NM AND CMAKE_OBJCOPY AND CMAKE_READELF AND NOT WIN32 AND NOT APPLE)
  set(_posenc_dispatch_default ON)
endif()
option(POSENC_COMPILED_DISPATCH "posenc::compiled holds its kernels for sse2, avx2 and avx512 and picks one at run time"
       ${_posenc_dispatch_default})
set(POSENC_COMPILED_LEVELS "sse2;avx2;avx512;avx512_bf16" CACHE STRING
    "With dispatch: the levels posenc::compiled holds, separated by ; or , (sse2 always; avx512_bf16 needs avx512). A CPU above the highest runs the highest.")
set(POSENC_COMPILED_FLAGS "" CACHE STRING
    "Compile options of posenc::compiled (with dispatch: after each level's -march; without: its instruction set, e.g. -march=x86-64-v3, which consumers must match)")

set(_pc_dir ${PROJECT_SOURCE_DIR}/src/compiled)
set(_pc_forward forward_float forward_half_kv forward_half forward_bf16_kv forward_bf16)
set(_pc_kernels ${_pc_forward} paged_float paged_half paged_bf16 backward level)
list(TRANSFORM _pc_forward PREPEND ${_pc_dir}/)
list(TRANSFORM _pc_forward APPEND .cpp)
list(TRANSFORM _pc_kernels PREPEND ${_pc_dir}/)
list(TRANSFORM _pc_kernels APPEND .cpp)

# Options of every source of the library: posenc's include path, dependencies and OpenMP (from
# posenc::posenc), the bfloat16 product mode, and warnings as errors in posenc's own build.
function(_posenc_compiled_sources tgt)
  target_link_libraries(${tgt} PRIVATE posenc)
  target_compile_definitions(${tgt} PRIVATE POSENC_BF16_PRODUCTS=1)
  set_target_properties(${tgt} PROPERTIES POSITION_INDEPENDENT_CODE ON)
  if(POSENC_BUILD_TESTS AND CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
    target_compile_options(${tgt} PRIVATE -Wall -Wextra -Werror)
  endif()
endfunction()

# The entries (src/compiled/entry.hpp): the whole call of each listed combination, validation
# and rotation included, built as its consumers are (POSENC_COMPILED=1); with dispatch, by
# every level beside its kernels (isolated with them), and called through dispatch.cpp.
set(_pc_entries ${_pc_dir}/entry_forward.cpp ${_pc_dir}/entry_backward.cpp ${_pc_dir}/entry_paged.cpp)
set_source_files_properties(${_pc_entries} PROPERTIES COMPILE_DEFINITIONS POSENC_COMPILED=1)

separate_arguments(_pc_flags NATIVE_COMMAND "${POSENC_COMPILED_FLAGS}")
if(POSENC_COMPILED_DISPATCH)
  string(REPLACE "," ";" _pc_levels "${POSENC_COMPILED_LEVELS}")
  foreach(_level IN LISTS _pc_levels)
    if(NOT _level MATCHES "^(sse2|avx2|avx512|avx512_bf16)$")
      message(FATAL_ERROR "POSENC_COMPILED_LEVELS holds ${_level}, expected sse2, avx2, avx512 or avx512_bf16")
    endif()
  endforeach()
  if(NOT "sse2" IN_LIST _pc_levels)
    message(FATAL_ERROR "POSENC_COMPILED_LEVELS is ${POSENC_COMPILED_LEVELS}, expected sse2 among its levels "
                        "(the level every x86-64 CPU runs)")
  endif()
  if("avx512_bf16" IN_LIST _pc_levels AND NOT "avx512" IN_LIST _pc_levels)
    message(FATAL_ERROR "POSENC_COMPILED_LEVELS is ${POSENC_COMPILED_LEVELS}, expected avx512 beside avx512_bf16 "
                        "(which runs only the bfloat16 product mode and hands every other call to avx512)")
  endif()
  add_library(posenc_compiled STATIC ${_pc_dir}/check.cpp ${_pc_dir}/dispatch.cpp)
  target_compile_options(posenc_compiled PRIVATE ${_pc_flags})
  _posenc_compiled_sources(posenc_compiled)
  target_compile_definitions(posenc_compiled PRIVATE POSENC_COMPILED_DISPATCH=1)
  foreach(_level avx2 avx512 avx512_bf16)
    string(TOUPPER ${_level} _up)
    if(_level IN_LIST _pc_levels)
      target_compile_definitions(posenc_compiled PRIVATE POSENC_COMPILED_HAS_${_up}=1)
    else()
      target_compile_definitions(posenc_compiled PRIVATE POSENC_COMPILED_HAS_${_up}=0)
    endif()
  endforeach()
  foreach(_level sse2 avx2 avx512 avx512_bf16)
    if(NOT _level IN_LIST _pc_levels)
      continue()
    endif()
    if(_level STREQUAL "sse2")
      set(_flags -march=x86-64)
    elseif(_level STREQUAL "avx2")
      set(_flags -march=haswell)
    elseif(_level STREQUAL "avx512")
      set(_flags -march=x86-64-v4)
    else()
      set(_flags -march=x86-64-v4 -mavx512bf16)
    endif()
    set(_srcs ${_pc_kernels} ${_pc_entries})
    if(_level STREQUAL "avx512_bf16")
      set(_srcs ${_pc_forward})  # the bfloat16 product mode is a forward kernel's
    endif()
    set(_objs posenc_compiled_${_level})
    add_library(${_objs} OBJECT ${_srcs})
    _posenc_compiled_sources(${_objs})
    target_compile_definitions(${_objs} PRIVATE POSENC_COMPILED_LEVEL=${_level})
    if(_level STREQUAL "avx512_bf16")
      target_compile_definitions(${_objs} PRIVATE POSENC_COMPILED_BF16_LEVEL=1)
    endif()
    target_compile_options(${_objs} PRIVATE ${_flags} ${_pc_flags})
    set(_out ${CMAKE_CURRENT_BINARY_DIR}/posenc_compiled_${_level}${CMAKE_CXX_OUTPUT_EXTENSION})
    add_custom_command(OUTPUT ${_out}
      COMMAND sh ${PROJECT_SOURCE_DIR}/cmake/posenc_isolate.sh ${CMAKE_CXX_COMPILER} ${CMAKE_NM} ${CMAKE_OBJCOPY}
              ${CMAKE_READELF} ${_level} ${_out} $<TARGET_OBJECTS:${_objs}>
      DEPENDS ${_objs} $<TARGET_OBJECTS:${_objs}> ${PROJECT_SOURCE_DIR}/cmake/posenc_isolate.sh
      COMMENT "posenc::compiled: isolating the ${_level} kernels" VERBATIM COMMAND_EXPAND_LISTS)
    set_source_files_properties(${_out} PROPERTIES EXTERNAL_OBJECT TRUE GENERATED TRUE)
    target_sources(posenc_compiled PRIVATE ${_out})
  endforeach()
else()
  # The entries in an object library of their own (tests/compiled reads their objects).
  add_library(posenc_compiled_entries OBJECT ${_pc_entries})
  add_library(posenc_compiled STATIC ${_pc_dir}/check.cpp ${_pc_dir}/single.cpp ${_pc_kernels}
              $<TARGET_OBJECTS:posenc_compiled_entries>)
  foreach(_tgt posenc_compiled posenc_compiled_entries)
    _posenc_compiled_sources(${_tgt})
    target_compile_options(${_tgt} PRIVATE ${_pc_flags})
    if(POSENC_NATIVE AND CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang" AND NOT POSENC_COMPILED_FLAGS)
      # The instruction set of posenc's own tests, benches and examples, which link it.
      target_compile_options(${_tgt} PRIVATE -march=native)
    endif()
  endforeach()
endif()
add_library(posenc::compiled ALIAS posenc_compiled)
set_target_properties(posenc_compiled PROPERTIES EXPORT_NAME compiled OUTPUT_NAME posenc_compiled)
# Its consumers call its kernels instead of compiling them (POSENC_COMPILED=1).
target_link_libraries(posenc_compiled PUBLIC posenc)
target_compile_definitions(posenc_compiled INTERFACE POSENC_COMPILED=1)
