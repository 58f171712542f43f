# SPDX-License-Identifier: MIT
# Configures, builds and runs one consumer project:
#   cmake -DKIND=... -DSRC=... -DWORK=... [-DMODE=header|compiled] [-DINIT=<initial cache>] [-DGENERATOR=...
#         -DGENERATOR_PLATFORM=... -DGENERATOR_TOOLSET=...] -P run_consumer.cmake
# INIT (written by tests/packaging/CMakeLists.txt) holds the configuration under test:
# compiler, CMAKE_PREFIX_PATH, FETCHCONTENT_* and the Eigen / xsimd packages found. Each
# consumer is configured with it and then checked to have used that configuration.
# KIND find_package consumes posenc twice: installed into a prefix, and from its
# build tree (export()) without installing. MODE compiled: the consumer links posenc::compiled
# (POSENC_COMPILED=ON; with dispatch for fetch_content and find_package, without for
# add_subdirectory), its kernels built at -O0 (this checks the plumbing, not the speed).
# REJECT_VERSION (KIND find_package, with -DPOSENC_DIR=<a posenc build tree>): the consumer asks
# find_package for that version instead, and its configure must fail on the version check,
# before anything is configured further or built.
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
set(_init_text "")
if(INIT)
  file(READ ${INIT} _init_text)
endif()
set(_common -DCMAKE_BUILD_TYPE=Release)
set(_posenc_mode "")
if(MODE STREQUAL "compiled")
  set(_dispatch ON)
  if(KIND STREQUAL "add_subdirectory")
    set(_dispatch OFF)
  endif()
  set(_posenc_mode -DPOSENC_COMPILED=ON -DPOSENC_COMPILED_DISPATCH=${_dispatch} -DPOSENC_COMPILED_FLAGS=-O0)
  if(KIND STREQUAL "fetch_content")
    # Dispatch built for one level (the suite's own build tests all four, and find_package's
    # compiled consumer installs that build): the subproject builds a quarter of the kernels,
    # a CPU above sse2 runs the highest level held, and the levels not held are refused.
    list(APPEND _posenc_mode -DPOSENC_COMPILED_LEVELS=sse2 -DCONSUMER_COMPILED_LEVELS=sse2)
  endif()
  list(APPEND _common -DCONSUMER_COMPILED=ON)
endif()
if(GENERATOR)
  list(APPEND _common -G ${GENERATOR})
endif()
if(GENERATOR_PLATFORM)
  list(APPEND _common -A ${GENERATOR_PLATFORM})
endif()
if(GENERATOR_TOOLSET)
  list(APPEND _common -T ${GENERATOR_TOOLSET})
endif()

function(run_step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(rc)
    message(FATAL_ERROR "${what} failed (${rc}):\n${out}\n${err}")
  endif()
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

# init_cache(<name> <extra prefix>): INIT, with <extra prefix> put in front of CMAKE_PREFIX_PATH.
function(init_cache name extra_prefix)
  set(_text "${_init_text}")
  if(extra_prefix)
    string(APPEND _text "set(CMAKE_PREFIX_PATH \"${extra_prefix};\${CMAKE_PREFIX_PATH}\" CACHE STRING \"\" FORCE)\n")
  endif()
  file(WRITE ${WORK}/${name}-init.cmake "${_text}")
endfunction()

# check_cache(<build dir>): the build used the generator, compiler and packages of INIT.
function(check_cache dir)
  file(STRINGS ${WORK}/${dir}/CMakeCache.txt _cache)
  set(_wrong "")
  foreach(line IN LISTS _cache)
    if(line MATCHES "^CMAKE_GENERATOR:INTERNAL=(.*)$" AND GENERATOR)
      if(NOT CMAKE_MATCH_1 STREQUAL GENERATOR)
        string(APPEND _wrong "  generator ${CMAKE_MATCH_1}, expected ${GENERATOR}\n")
      endif()
    endif()
    foreach(var CMAKE_CXX_COMPILER Eigen3_DIR xsimd_DIR)
      if(line MATCHES "^${var}:[A-Z]+=(.*)$" AND _init_text MATCHES "set\\(${var} \"([^\"]*)\"")
        set(_want "${CMAKE_MATCH_1}")
        string(REGEX MATCH "^${var}:[A-Z]+=(.*)$" _m "${line}")
        get_filename_component(_got_real "${CMAKE_MATCH_1}" REALPATH)
        get_filename_component(_want_real "${_want}" REALPATH)
        if(NOT _got_real STREQUAL _want_real)
          string(APPEND _wrong "  ${var} is ${CMAKE_MATCH_1}, expected ${_want}\n")
        endif()
      endif()
    endforeach()
  endforeach()
  if(_wrong)
    message(FATAL_ERROR "the ${KIND} consumer (${dir}) did not use the configuration under test:\n${_wrong}")
  endif()
endfunction()

# The consumer's executable, for single- and multi-configuration generators.
function(find_consumer dir)
  foreach(p ${WORK}/${dir}/consumer ${WORK}/${dir}/consumer.exe ${WORK}/${dir}/Release/consumer
          ${WORK}/${dir}/Release/consumer.exe)
    if(EXISTS ${p} AND NOT IS_DIRECTORY ${p})
      set(consumer_exe ${p} PARENT_SCOPE)
      return()
    endif()
  endforeach()
  message(FATAL_ERROR "no consumer executable under ${WORK}/${dir}")
endfunction()

# consume(<build dir> <extra prefix> <extra configure args>...): configure, check, build
# and run the consumer.
function(consume dir extra_prefix)
  init_cache(${dir} "${extra_prefix}")
  run_step("configuring the ${KIND} consumer (${dir})"
           ${CMAKE_COMMAND} -C ${WORK}/${dir}-init.cmake -S ${SRC}/tests/packaging/${KIND} -B ${WORK}/${dir}
           -DPOSENC_SOURCE_DIR=${SRC} -DCONSUMER_EXPECT_VERSION=${_version} ${_common} ${_posenc_mode} ${ARGN})
  check_cache(${dir})
  run_step("building the ${KIND} consumer (${dir})" ${CMAKE_COMMAND} --build ${WORK}/${dir} --config Release)
  find_consumer(${dir})
  run_step("running the ${KIND} consumer (${dir})" ${consumer_exe})
  message(STATUS "${dir}: ${step_output}")
endfunction()

# The version of the headers (include/posenc/core/version.hpp), as CMake reads it.
file(STRINGS ${SRC}/include/posenc/core/version.hpp _defines REGEX "#define POSENC_VERSION_(MAJOR|MINOR|PATCH) ")
set(_version "")
foreach(_part MAJOR MINOR PATCH)
  string(REGEX MATCH "POSENC_VERSION_${_part} ([0-9]+)" _m "${_defines}")
  list(APPEND _version ${CMAKE_MATCH_1})
endforeach()
string(REPLACE ";" "." _version "${_version}")

if(REJECT_VERSION)
  init_cache(reject "")
  execute_process(COMMAND ${CMAKE_COMMAND} -C ${WORK}/reject-init.cmake -S ${SRC}/tests/packaging/find_package
                          -B ${WORK}/reject -DPOSENC_SOURCE_DIR=${SRC} -Dposenc_DIR=${POSENC_DIR}
                          -DCONSUMER_VERSION=${REJECT_VERSION} ${_common}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  # CMake wraps its error text: compare with the whitespace folded.
  string(REGEX REPLACE "[ \t\r\n]+" " " _text "${out} ${err}")
  string(REPLACE "." "\\." _want_request "requested version \"${REJECT_VERSION}\"")
  string(REPLACE "." "\\." _want_found "posencConfig.cmake, version: ${_version}")
  if(rc EQUAL 0)
    message(FATAL_ERROR "find_package(posenc ${REJECT_VERSION}) accepted posenc ${_version}:\n${out}\n${err}")
  elseif(NOT _text MATCHES "${_want_request}" OR NOT _text MATCHES "${_want_found}")
    message(FATAL_ERROR "the consumer's configure failed, but not on the version check of posenc "
                        "${_version} against ${REJECT_VERSION} (${rc}):\n${out}\n${err}")
  endif()
  message(STATUS "find_package(posenc ${REJECT_VERSION}) refuses posenc ${_version}: ok")
elseif(KIND STREQUAL "find_package" AND POSENC_DIR)
  # A build tree of posenc that is already built (POSENC_DIR): installed, then found both ways.
  run_step("installing posenc" ${CMAKE_COMMAND} --install ${POSENC_DIR} --prefix ${WORK}/prefix --config Release)
  consume(build ${WORK}/prefix)
  consume(build-tree "" -Dposenc_DIR=${POSENC_DIR})
  message(STATUS "${KIND} ${MODE} consumer: ok")
elseif(KIND STREQUAL "find_package")
  init_cache(posenc-build "")
  run_step("configuring posenc" ${CMAKE_COMMAND} -C ${WORK}/posenc-build-init.cmake -S ${SRC} -B ${WORK}/posenc-build
           ${_common} ${_posenc_mode} -DPOSENC_BUILD_TESTS=OFF -DPOSENC_BUILD_BENCH=OFF -DPOSENC_BUILD_EXAMPLES=OFF
           -DPOSENC_INSTALL=ON)
  check_cache(posenc-build)
  if(MODE STREQUAL "compiled")  # the library is built before it is installed
    run_step("building posenc" ${CMAKE_COMMAND} --build ${WORK}/posenc-build --config Release)
  endif()
  run_step("installing posenc" ${CMAKE_COMMAND} --install ${WORK}/posenc-build --prefix ${WORK}/prefix --config Release)
  consume(build ${WORK}/prefix)
  consume(build-tree "" -Dposenc_DIR=${WORK}/posenc-build)
  message(STATUS "${KIND} ${MODE} consumer: ok")
else()
  consume(build "")
  message(STATUS "${KIND} ${MODE} consumer: ok")
endif()
