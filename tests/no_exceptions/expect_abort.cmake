# SPDX-License-Identifier: MIT
# Runs PROGRAM and passes when it aborts (no normal exit) after printing MESSAGE on stderr:
#   cmake -DPROGRAM=... -DMESSAGE=... -P expect_abort.cmake
execute_process(COMMAND ${PROGRAM} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message(STATUS "exit: ${rc}\nstdout: ${out}\nstderr: ${err}")
if(rc MATCHES "^[0-9]+$")
  message(FATAL_ERROR "the program exited normally (${rc}); expected an abort")
endif()
string(FIND "${err}" "${MESSAGE}" at)
if(at EQUAL -1)
  message(FATAL_ERROR "stderr lacks the expected message: ${MESSAGE}")
endif()
string(FIND "${out}" "valid view accepted" at)
if(at EQUAL -1)
  message(FATAL_ERROR "the valid call did not return")
endif()
message(STATUS "no_exceptions: ok")
