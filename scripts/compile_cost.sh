#!/usr/bin/env bash
# Compile cost of a consumer's translation unit, against a baseline unit (Eigen + xsimd +
# one GEMM) compiled in the same run: the wall time and peak memory of each compile, and
# their ratios to the baseline's. docs/integration.md ("Compile time") gives the findings.
#
#   bash scripts/compile_cost.sh [units...]
#
# Units are the files of bench/compile_cost/ (default: all of them). Environment:
#   CXX        the compiler (default g++)
#   FLAGS      the consumer's flags (default "-O2 -march=native")
#   ROUNDS     compiles of each unit; the fastest is reported (default 1)
#   COMPILED   1: each unit is also compiled as a consumer of posenc::compiled (with
#              POSENC_COMPILED=1, as linking the target gives it), reported as unit+compiled
#   DEFINES    extra -D flags for the posenc units (e.g. "-DPOSENC_BF16_PRODUCTS=1")
set -euo pipefail
cd "$(dirname "$0")/.."
CXX="${CXX:-g++}"
FLAGS="${FLAGS:--O2 -march=native}"
ROUNDS="${ROUNDS:-1}"
DEFINES="${DEFINES:-}"
eigen_inc=$(pkg-config --cflags-only-I eigen3 2>/dev/null || echo "-I/usr/include/eigen3")
omp="-fopenmp"
[[ "$CXX" == *clang* ]] && omp="-fopenmp=libomp"
units=("$@")
if [ ${#units[@]} -eq 0 ]; then
  for f in bench/compile_cost/*.cpp; do
    u=$(basename "$f" .cpp)
    [ "$u" != baseline ] && units+=("$u")
  done
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# measure <label> <extra flags...>: prints "seconds kilobytes" of the fastest of ROUNDS compiles.
measure() {
  local src=$1
  shift
  local best_t="" best_m=""
  for _ in $(seq "$ROUNDS"); do
    # shellcheck disable=SC2086
    /usr/bin/time -f "%e %M" -o "$tmp/time" "$CXX" -std=c++17 $FLAGS $omp -Iinclude $eigen_inc "$@" \
      -c "$src" -o "$tmp/unit.o"
    read -r t m <"$tmp/time"
    if [ -z "$best_t" ] || awk -v a="$t" -v b="$best_t" 'BEGIN{exit !(a < b)}'; then
      best_t=$t
      best_m=$m
    fi
  done
  echo "$best_t $best_m"
}

echo "compiler: $("$CXX" --version | head -1)"
echo "flags:    $FLAGS $DEFINES"
read -r bt bm < <(measure bench/compile_cost/baseline.cpp)
printf '%-34s %8s %9s %8s %8s\n' unit seconds "peak MB" "x time" "x mem"
row() { awk -v u="$1" -v t="$2" -v m="$3" -v bt="$bt" -v bm="$bm" \
  'BEGIN{printf "%-34s %8.2f %9.0f %8.2f %8.2f\n", u, t, m / 1024, t / bt, m / bm}'; }
row baseline "$bt" "$bm"
for u in "${units[@]}"; do
  # shellcheck disable=SC2086
  read -r t m < <(measure "bench/compile_cost/$u.cpp" $DEFINES)
  row "$u" "$t" "$m"
  if [ -n "${COMPILED:-}" ]; then
    # shellcheck disable=SC2086
    read -r t m < <(measure "bench/compile_cost/$u.cpp" $DEFINES -DPOSENC_COMPILED=1)
    row "$u+compiled" "$t" "$m"
  fi
done
