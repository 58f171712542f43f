#!/bin/sh
# SPDX-License-Identifier: MIT
# One instruction set's build of posenc::compiled's kernels as one object whose symbols cannot
# meet any other build's: the objects are linked into one relocatable object, and every symbol
# it defines outside the level's own namespace (posenc::detail::compiled_kernels::<level>: the
# kernels the dispatcher calls), and every COMDAT group signature, gets the suffix
# .posenc_<level>. Without this, an inline function or template built for AVX-512 here and for
# SSE2 in the caller would be one symbol, and the linker could hand the AVX-512 body to a CPU
# without AVX-512.
#   posenc_isolate.sh <c++> <nm> <objcopy> <readelf> <level> <out> <objects...>
set -eu
cxx=$1 nm=$2 objcopy=$3 readelf=$4 level=$5 out=$6
shift 6
"$cxx" -r -nostdlib -o "$out.whole.o" "$@"
keep="_ZN6posenc6detail16compiled_kernels${#level}${level}"
{
  "$nm" --defined-only --extern-only --format=posix "$out.whole.o" | awk '{print $1}'
  # a constructor's or destructor's group is named by a symbol (..C5Ev, ..D5Ev) no list shows
  "$readelf" -g -W "$out.whole.o" | sed -n 's/^COMDAT group section \[ *[0-9]*\] `[^'"'"']*'"'"' \[\(.*\)\].*/\1/p'
} | sort -u | awk -v keep="$keep" -v sfx=".posenc_$level" 'index($0, keep) != 1 {print $0, $0 sfx}' >"$out.map"
if ! "$nm" --defined-only --extern-only --format=posix "$out.whole.o" | grep -q "^$keep"; then
  echo "posenc_isolate.sh: no kernel of namespace $level in the objects" >&2
  exit 1
fi
"$objcopy" --redefine-syms="$out.map" "$out.whole.o" "$out"
rm -f "$out.whole.o"
