# SPDX-License-Identifier: MIT
# posenc::compiled's entries (src/compiled/entry_*.cpp, built for the library's baseline
# instruction set with dispatch) compile no kernel themselves: every kernel they call is in the library's
# lists, so it runs at the CPU's level. An entry member of the archive that defines a fused
# kernel function would run it at the entries' instruction set (SSE2 with dispatch).
#   cmake -DNM=<nm> -DLIBRARY=<libposenc_compiled.a> -P entries_call_levels.cmake
execute_process(COMMAND ${NM} -C -A ${LIBRARY} OUTPUT_VARIABLE _syms RESULT_VARIABLE _rc)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "${NM} failed on ${LIBRARY}")
endif()
# The entries' archive members: entry_*.cpp.o, or with dispatch the isolated posenc_compiled_entry.o.
string(REGEX MATCHALL "[^\n]*(entry_[a-z]+\\.cpp\\.o|posenc_compiled_entry\\.o):[^\n]*" _entry_syms "${_syms}")
list(LENGTH _entry_syms _n)
if(_n EQUAL 0)
  message(FATAL_ERROR "no entry object (entry_*.cpp.o or posenc_compiled_entry.o) in ${LIBRARY}")
endif()
set(_bad "")
foreach(_line IN LISTS _entry_syms)
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
message("entries: ${_n} symbols, no kernel: ok")
