#!/bin/sh
# SPDX-License-Identifier: MIT
# Each instruction set's object of posenc::compiled defines no symbol, and names no COMDAT
# group, that another build could share: every defined global symbol is a kernel of the
# level's own namespace or carries the suffix .posenc_<level> (cmake/posenc_isolate.sh).
#   isolated.sh <nm> <readelf> <object> <level>
set -eu
nm=$1 readelf=$2 obj=$3 level=$4
keep="_ZN6posenc6detail16compiled_kernels${#level}${level}"
sfx=".posenc_$level"
bad=$("$nm" --defined-only --extern-only --format=posix "$obj" | awk -v keep="$keep" -v sfx="$sfx" \
  'index($1, keep) != 1 && substr($1, length($1) - length(sfx) + 1) != sfx {print $1}' | head -3)
if [ -n "$bad" ]; then
  echo "$obj: shared symbols: $bad"
  exit 1
fi
groups=$("$readelf" -g -W "$obj" | sed -n 's/^COMDAT group section \[ *[0-9]*\] `[^'"'"']*'"'"' \[\(.*\)\].*/\1/p')
bad=$(printf '%s\n' "$groups" | awk -v sfx="$sfx" 'NF && substr($1, length($1) - length(sfx) + 1) != sfx' | head -3)
if [ -n "$bad" ]; then
  echo "$obj: shared COMDAT groups: $bad"
  exit 1
fi
kernels=$("$nm" --defined-only --extern-only --format=posix "$obj" | grep -c "^$keep" || true)
echo "$level: $kernels kernels, every other symbol and group its own: ok"
