# SPDX-License-Identifier: MIT
# posenc::compiled's entries (src/compiled/entry_*.cpp) compile no kernel themselves: every
# kernel they call is in the library's lists, built once per level. A kernel an entry compiled
# would be built again, and with dispatch it would escape the level's dispatch.
#   cmake -DNM=<nm> -DOBJECTS=<the entries' object files> -P entries_call_levels.cmake
execute_process(COMMAND ${NM} -C ${OBJECTS} OUTPUT_VARIABLE _syms RESULT_VARIABLE _rc)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "${NM} failed on ${OBJECTS}")
endif()
if(NOT _syms MATCHES "attention_call\\(")
  message(FATAL_ERROR "no entry (attention_call) in ${OBJECTS}")
endif()
string(REGEX MATCHALL "[^\n]*\n" _lines "${_syms}")
set(_bad "")
foreach(_line IN LISTS _lines)
  # A kernel's functions take its SIMD traits (fused_traits<..., xsimd arch>) or are its entry
  # points; the entries' own helpers (paged_work's buffers, chunk lists) are neither.
  if(_line MATCHES " [TtWw] .*(fused_traits<|fused_attention<|fused_attention_backward<|run_paged[a-z_]*<)")
    list(APPEND _bad "${_line}")
  endif()
endforeach()
if(_bad)
  list(LENGTH _bad _nb)
  list(GET _bad 0 _first)
  message(FATAL_ERROR "${_nb} kernel functions compiled in the entries, e.g.: ${_first}")
endif()
message("entries: no kernel: ok")
