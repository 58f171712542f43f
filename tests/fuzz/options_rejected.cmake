# SPDX-License-Identifier: MIT
# The fuzz build's options: a configure of SRC into BIN with POSENC_FUZZ=ON and clang (CXX)
# must fail on a POSENC_FUZZ_OPT that is not -O0 .. -O3 and on a POSENC_FUZZ_HARNESSES name
# that is not a harness, each with a message naming the option, the value and what is expected;
# with valid values it must configure.
#   cmake -DSRC=<source> -DBIN=<scratch folder> -DCXX=<clang++> -DGENERATOR=<generator> -P options_rejected.cmake
function(configure_fuzz expect_ok pattern)
  file(REMOVE_RECURSE ${BIN})
  execute_process(COMMAND ${CMAKE_COMMAND} -S ${SRC} -B ${BIN} -G ${GENERATOR} -DCMAKE_CXX_COMPILER=${CXX}
                          -DCMAKE_BUILD_TYPE=Release -DPOSENC_FUZZ=ON -DPOSENC_OPENMP=OFF -DPOSENC_BUILD_TESTS=ON
                          -DPOSENC_BUILD_BENCH=OFF -DPOSENC_BUILD_EXAMPLES=OFF -DPOSENC_PACKAGING_TESTS=OFF
                          -DPOSENC_ISA_TESTS=OFF -DPOSENC_HEADER_TESTS=OFF -DPOSENC_INSTALL=OFF ${ARGN}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  # CMake wraps its error text: compare with the whitespace folded.
  string(REGEX REPLACE "[ \t\r\n]+" " " text "${out} ${err}")
  if(expect_ok AND NOT rc EQUAL 0)
    message(FATAL_ERROR "fuzz options: the configure with ${ARGN} failed (${rc}):\n${out}\n${err}")
  elseif(NOT expect_ok AND rc EQUAL 0)
    message(FATAL_ERROR "fuzz options: the configure with ${ARGN} succeeded, expected an error")
  elseif(NOT expect_ok AND NOT text MATCHES "${pattern}")
    message(FATAL_ERROR "fuzz options: the configure with ${ARGN} failed without the message '${pattern}':\n${out}\n${err}")
  endif()
endfunction()
configure_fuzz(FALSE "POSENC_FUZZ_OPT is '-O9', expected -O0, -O1, -O2 or -O3" "-DPOSENC_FUZZ_OPT=-O9")
configure_fuzz(FALSE "POSENC_FUZZ_OPT is '-Os', expected -O0, -O1, -O2 or -O3" "-DPOSENC_FUZZ_OPT=-Os")
configure_fuzz(FALSE "POSENC_FUZZ_HARNESSES names cachee, expected one of: " "-DPOSENC_FUZZ_HARNESSES=cachee")
configure_fuzz(TRUE "" "-DPOSENC_FUZZ_OPT=-O2" "-DPOSENC_FUZZ_HARNESSES=cache")
file(REMOVE_RECURSE ${BIN})
message("fuzz options: ok")
