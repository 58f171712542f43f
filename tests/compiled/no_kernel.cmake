# SPDX-License-Identifier: MIT
# A consumer of posenc::compiled compiles no kernel of the library's list: its object file
# defines no fused kernel function and calls the library's.
#   cmake -DNM=<nm> -DOBJECTS=<object files> -P no_kernel.cmake
execute_process(COMMAND ${NM} -C ${OBJECTS} OUTPUT_VARIABLE _syms RESULT_VARIABLE _rc)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "${NM} failed on ${OBJECTS}")
endif()
string(REGEX MATCHALL "[^\n]* [TtWw] [^\n]*posenc::detail::fused[a-z_]*::[^\n]*" _kernels "${_syms}")
if(_kernels)
  list(GET _kernels 0 _first)
  message(FATAL_ERROR "the consumer compiled a kernel itself, e.g.: ${_first}")
endif()
if(NOT _syms MATCHES " U posenc::detail::compiled_kernels::forward\\(")
  message(FATAL_ERROR "the consumer does not call posenc::compiled's forward kernel")
endif()
message("no kernel: ok")
