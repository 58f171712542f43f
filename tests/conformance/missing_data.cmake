# SPDX-License-Identifier: MIT
# Runs a conformance test program with its data folder pointed at a missing path:
#   cmake -DPROGRAM=<exe> -DREQUIRE=<0|1> -DSKIP_CODE=<n> -P missing_data.cmake
# REQUIRE=0: the program must exit with SKIP_CODE (ctest shows it as skipped).
# REQUIRE=1 (POSENC_REQUIRE_ONNX=1): it must fail, with any other non-zero status.
execute_process(
  COMMAND ${CMAKE_COMMAND} -E env POSENC_ONNX_DIR=${CMAKE_CURRENT_LIST_DIR}/no-such-folder
          POSENC_REQUIRE_ONNX=${REQUIRE} ${PROGRAM}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(REQUIRE)
  if(rc EQUAL 0 OR rc EQUAL SKIP_CODE)
    message(FATAL_ERROR "expected a failure with POSENC_REQUIRE_ONNX=1, got exit status ${rc}:\n${out}\n${err}")
  endif()
elseif(NOT rc EQUAL SKIP_CODE)
  message(FATAL_ERROR "expected exit status ${SKIP_CODE} (skipped), got ${rc}:\n${out}\n${err}")
endif()
message(STATUS "missing data: ok (exit status ${rc})")
