# SPDX-License-Identifier: MIT
# Fails when a CMake file of the project needs a newer CMake than the project declares.
#   cmake -DSRC=<source dir> -P check_cmake_minimum.cmake
# Reads the minimum from the top-level cmake_minimum_required, then looks in every
# CMakeLists.txt and *.cmake / *.cmake.in for the commands and options added after
# it (below). A use is allowed inside `if(CMAKE_VERSION VERSION_GREATER_EQUAL X)`
# with X at least the version that added it. README.md must state the same minimum.
file(READ ${SRC}/CMakeLists.txt _top)
if(NOT _top MATCHES "cmake_minimum_required\\(VERSION ([0-9]+\\.[0-9]+)")
  message(FATAL_ERROR "no cmake_minimum_required(VERSION ...) in ${SRC}/CMakeLists.txt")
endif()
set(_min ${CMAKE_MATCH_1})

# <regex>|<first CMake version that has it>
set(_features
  "file\\(CONFIGURE|3.18"
  "file\\(ARCHIVE_|3.18"
  "cmake_language\\(|3.18"
  "ECHO_OUTPUT_VARIABLE|3.18"
  "foreach\\([^)]*ZIP_LISTS|3.17"
  "CMAKE_CURRENT_FUNCTION|3.17"
  "-E rm |3.17"
  "file\\(REAL_PATH|3.19"
  "file\\(CHMOD|3.19"
  "string\\(JSON|3.19"
  "COMMAND_ERROR_IS_FATAL|3.19"
  "cmake_path\\(|3.20"
  "file\\(COPY_FILE|3.21"
  "ENVIRONMENT_MODIFICATION|3.22"
  "FIND_PACKAGE_ARGS|3.24"
  "PATH_EQUAL|3.24"
  "\\$<LINK_LIBRARY|3.24"
  "block\\(|3.25"
  "return\\(PROPAGATE|3.25")

# The project's own CMake files (build trees inside the source tree are not read).
set(_files ${SRC}/CMakeLists.txt)
foreach(dir cmake tests bench examples)
  file(GLOB_RECURSE _more LIST_DIRECTORIES false ${SRC}/${dir}/CMakeLists.txt ${SRC}/${dir}/*.cmake
       ${SRC}/${dir}/*.cmake.in)
  list(APPEND _files ${_more})
endforeach()
set(_bad "")
foreach(f IN LISTS _files)
  file(RELATIVE_PATH _rel ${SRC} ${f})
  if(_rel MATCHES "^(build|\\.git|_deps)/|/build/|check_cmake_minimum\\.cmake$")
    continue()
  endif()
  # Walk the lines, keeping a stack of the CMake version each enclosing if() guarantees
  # (the branch of `if(CMAKE_VERSION VERSION_GREATER_EQUAL X)` guarantees X, its else nothing).
  file(STRINGS ${f} _lines)
  set(_stack "0")
  set(_n 0)
  foreach(line IN LISTS _lines)
    math(EXPR _n "${_n} + 1")
    string(STRIP "${line}" line)
    if(line MATCHES "^#")
      continue()
    endif()
    if(line MATCHES "^if\\(CMAKE_VERSION VERSION_GREATER_EQUAL ([0-9.]+)\\)")
      list(INSERT _stack 0 ${CMAKE_MATCH_1})
      continue()
    elseif(line MATCHES "^if\\(")
      list(GET _stack 0 _cur)
      list(INSERT _stack 0 ${_cur})
    elseif(line MATCHES "^(else|elseif)\\(")
      list(REMOVE_AT _stack 0)
      list(GET _stack 0 _cur)
      list(INSERT _stack 0 ${_cur})
    elseif(line MATCHES "^endif\\(")
      list(REMOVE_AT _stack 0)
    endif()
    list(GET _stack 0 _have)
    foreach(entry IN LISTS _features)
      string(REPLACE "|" ";" entry "${entry}")
      list(GET entry 0 _re)
      list(GET entry 1 _ver)
      if(_ver VERSION_GREATER _min AND _ver VERSION_GREATER _have AND line MATCHES "${_re}")
        string(APPEND _bad "  ${_rel}:${_n}: '${_re}' needs CMake ${_ver}, the project declares ${_min}\n")
      endif()
    endforeach()
  endforeach()
endforeach()

file(READ ${SRC}/README.md _readme)
if(NOT _readme MATCHES "\\| CMake \\| >= ([0-9.]+)")
  string(APPEND _bad "  README.md: no '| CMake | >= <version>' row\n")
elseif(NOT CMAKE_MATCH_1 VERSION_EQUAL _min)
  string(APPEND _bad "  README.md: says CMake >= ${CMAKE_MATCH_1}, the project declares ${_min}\n")
endif()

if(_bad)
  message(FATAL_ERROR "CMake features newer than the declared minimum:\n${_bad}")
endif()
message(STATUS "cmake_minimum: ok (${_min})")
