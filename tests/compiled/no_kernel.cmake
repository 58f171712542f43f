# SPDX-License-Identifier: MIT
# A consumer of posenc::compiled compiles nothing of a listed call: its object file defines no
# fused kernel, no validation, plan or rotation of the call, and calls the library's entry.
#   cmake -DNM=<nm> -DOBJECTS=<object files> -DENTRY=<attention_call|attention_backward_call> -P no_kernel.cmake
execute_process(COMMAND ${NM} -C ${OBJECTS} OUTPUT_VARIABLE _syms RESULT_VARIABLE _rc)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "${NM} failed on ${OBJECTS}")
endif()
set(_work "posenc::detail::(fused[a-z_]*::|validate[a-z_]*<|make_plan<|plan_rotation<|run_attention[a-z_]*<|rotated_copy<)")
string(REGEX MATCHALL "[^\n]* [TtWw] ${_work}[^\n]*" _kernels "${_syms}")
string(REGEX MATCHALL "[^\n]* [TtWw] [^\n]*posenc::rope<float>::(rotate|run_layout)[^\n]*" _rotations "${_syms}")
list(APPEND _kernels ${_rotations})
if(_kernels)
  list(GET _kernels 0 _first)
  message(FATAL_ERROR "the consumer compiled part of a listed call itself, e.g.: ${_first}")
endif()
if(NOT _syms MATCHES " U posenc::detail::compiled_kernels::${ENTRY}\\(")
  message(FATAL_ERROR "the consumer does not call posenc::compiled's ${ENTRY}")
endif()
message("no kernel: ok")
