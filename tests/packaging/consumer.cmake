# SPDX-License-Identifier: MIT
# The consumer program of every packaging project: tests/packaging/consumer.cpp linked to
# posenc::posenc and, in the compiled mode (CONSUMER_COMPILED, run_consumer.cmake's MODE
# compiled), to posenc::compiled beside it.
add_executable(consumer ${CMAKE_CURRENT_LIST_DIR}/consumer.cpp)
target_link_libraries(consumer PRIVATE posenc::posenc)
if(CONSUMER_COMPILED)
  if(NOT TARGET posenc::compiled)
    message(FATAL_ERROR "posenc::compiled is missing")
  endif()
  target_link_libraries(consumer PRIVATE posenc::compiled)
  if(CONSUMER_COMPILED_LEVELS)  # the levels the library was asked to hold (POSENC_COMPILED_LEVELS)
    target_compile_definitions(consumer PRIVATE "CONSUMER_COMPILED_LEVELS=\"${CONSUMER_COMPILED_LEVELS}\"")
  endif()
endif()
