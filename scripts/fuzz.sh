#!/usr/bin/env bash
# Builds the libFuzzer harnesses (clang 14, ASan + UBSan) and runs each one for
# a bounded time from its checked-in seed corpus; any finding fails.
#   bash scripts/fuzz.sh [seconds per harness, default 60; 0 = replay the seeds only] [harness names...]
# New inputs go to build/fuzz/corpus/<name> (kept between runs), findings to build/fuzz/findings/.
# POSENC_FUZZ_JOBS sets the build jobs and how many harnesses fuzz at once (default: nproc; each
# harness runs on one core, its output in build/fuzz/<name>.log, printed when it ends).
# POSENC_FUZZ_SEED fixes libFuzzer's seed (CI does: the same inputs in the same order every
# run, so a failure there reproduces).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
shift || true
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(rope_hf attention backward cache)
cxx="${POSENC_FUZZ_CXX:-clang++-14}"
# posenc_fuzz builds the named harnesses in one build step, several at once.
harnesses=$(IFS=';'; echo "${names[*]}")
cmake -S . -B build/fuzz -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER="$cxx" -DPOSENC_FUZZ=ON \
  -DPOSENC_OPENMP=OFF -DPOSENC_BUILD_TESTS=ON -DPOSENC_BUILD_BENCH=OFF -DPOSENC_BUILD_EXAMPLES=OFF \
  -DPOSENC_PACKAGING_TESTS=OFF -DPOSENC_ISA_TESTS=OFF -DPOSENC_INSTALL=OFF \
  "-DPOSENC_FUZZ_HARNESSES=$harnesses" >/dev/null
cmake --build build/fuzz -j "${POSENC_FUZZ_JOBS:-$(nproc)}" --target posenc_fuzz
mkdir -p build/fuzz/findings
# fuzz_one NAME: replays NAME's regressions, then its seeds (seconds 0) or fuzzes from them.
fuzz_one() {
  local n="$1" work="build/fuzz/corpus/$1"
  echo "== fuzz $n (${seconds} s)"
  mkdir -p "$work"
  # The saved regressions first (they must pass), then fuzzing from the seeds.
  if [ -d "tests/fuzz/regressions/$n" ]; then
    "build/fuzz/tests/fuzz/posenc_fuzz_$n" -runs=0 "tests/fuzz/regressions/$n"
  fi
  if [ "$seconds" = 0 ]; then  # replay the seeds only, no fuzzing
    UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 ASAN_OPTIONS=halt_on_error=1:detect_leaks=1 \
      "build/fuzz/tests/fuzz/posenc_fuzz_$n" -runs=0 "tests/fuzz/corpus/$n"
    return
  fi
  UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 ASAN_OPTIONS=halt_on_error=1:detect_leaks=1 \
    "build/fuzz/tests/fuzz/posenc_fuzz_$n" ${POSENC_FUZZ_SEED:+-seed="$POSENC_FUZZ_SEED"} \
    -max_total_time="$seconds" -timeout=20 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="build/fuzz/findings/$n-" "$work" "tests/fuzz/corpus/$n"
}
# Up to POSENC_FUZZ_JOBS harnesses at once; any failure fails the script once all have ended.
parallel="${POSENC_FUZZ_JOBS:-$(nproc)}"
failed=()
pids=()
run_names=()
# finish_first: waits for the oldest running harness, prints its log, records a failure.
finish_first() {
  local rc=0
  wait "${pids[0]}" || rc=$?
  cat "build/fuzz/${run_names[0]}.log"
  if [ "$rc" != 0 ]; then
    echo "== fuzz ${run_names[0]}: FAILED (exit $rc)"
    failed+=("${run_names[0]}")
  fi
  pids=("${pids[@]:1}")
  run_names=("${run_names[@]:1}")
}
for n in "${names[@]}"; do
  if [ "${#pids[@]}" -ge "$parallel" ]; then
    finish_first
  fi
  (set -e; fuzz_one "$n") > "build/fuzz/$n.log" 2>&1 &
  pids+=($!)
  run_names+=("$n")
done
while [ "${#pids[@]}" -gt 0 ]; do
  finish_first
done
if [ "${#failed[@]}" -gt 0 ]; then
  echo "fuzz: ${failed[*]} failed (findings in build/fuzz/findings/)"
  exit 1
fi
