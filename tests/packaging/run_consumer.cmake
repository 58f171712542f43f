# SPDX-License-Identifier: MIT
# Configures, builds and runs one consumer project:
#   cmake -DKIND=... -DSRC=... -DWORK=... [-DCXX=<compiler>] -P run_consumer.cmake
# KIND find_package consumes posenc twice: installed into a prefix, and from its
# build tree (export()) without installing.
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
set(_common -DCMAKE_BUILD_TYPE=Release)
if(CXX)
  list(APPEND _common -DCMAKE_CXX_COMPILER=${CXX})
endif()

function(run_step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(rc)
    message(FATAL_ERROR "${what} failed (${rc}):\n${out}\n${err}")
  endif()
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

# consume(<build dir> <extra configure args>...): configure, build and run the consumer.
function(consume dir)
  run_step("configuring the ${KIND} consumer (${dir})"
           ${CMAKE_COMMAND} -S ${SRC}/tests/packaging/${KIND} -B ${WORK}/${dir} -DPOSENC_SOURCE_DIR=${SRC}
           ${_common} ${ARGN})
  run_step("building the ${KIND} consumer (${dir})" ${CMAKE_COMMAND} --build ${WORK}/${dir})
  run_step("running the ${KIND} consumer (${dir})" ${WORK}/${dir}/consumer)
  message(STATUS "${dir}: ${step_output}")
endfunction()

if(KIND STREQUAL "find_package")
  run_step("configuring posenc" ${CMAKE_COMMAND} -S ${SRC} -B ${WORK}/posenc-build ${_common}
           -DPOSENC_BUILD_TESTS=OFF -DPOSENC_BUILD_BENCH=OFF -DPOSENC_BUILD_EXAMPLES=OFF -DPOSENC_INSTALL=ON)
  run_step("installing posenc" ${CMAKE_COMMAND} --install ${WORK}/posenc-build --prefix ${WORK}/prefix)
  consume(build -DCMAKE_PREFIX_PATH=${WORK}/prefix)
  consume(build-tree -Dposenc_DIR=${WORK}/posenc-build)
else()
  consume(build)
endif()
message(STATUS "${KIND} consumer: ok")
