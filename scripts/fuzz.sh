#!/usr/bin/env bash
# Builds the libFuzzer harnesses (clang 14, ASan + UBSan) and runs each one for
# a bounded time from its checked-in seed corpus; any finding fails.
#   bash scripts/fuzz.sh [seconds per harness, default 60; 0 = replay the seeds only] [harness names...]
# New inputs go to build/fuzz/corpus/<name> (kept between runs), findings to build/fuzz/findings/.
# POSENC_FUZZ_JOBS sets the build jobs (default: nproc). POSENC_FUZZ_SEED fixes libFuzzer's
# seed (CI does: the same inputs in the same order every run, so a failure there reproduces).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
shift || true
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(rope_hf attention backward cache)
cxx="${POSENC_FUZZ_CXX:-clang++-14}"
cmake -S . -B build/fuzz -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER="$cxx" -DPOSENC_FUZZ=ON \
  -DPOSENC_OPENMP=OFF -DPOSENC_BUILD_TESTS=ON -DPOSENC_BUILD_BENCH=OFF -DPOSENC_BUILD_EXAMPLES=OFF \
  -DPOSENC_PACKAGING_TESTS=OFF -DPOSENC_ISA_TESTS=OFF -DPOSENC_INSTALL=OFF >/dev/null
targets=()
for n in "${names[@]}"; do targets+=("posenc_fuzz_$n"); done
cmake --build build/fuzz -j "${POSENC_FUZZ_JOBS:-$(nproc)}" --target "${targets[@]}"
mkdir -p build/fuzz/findings
for n in "${names[@]}"; do
  echo "== fuzz $n (${seconds} s)"
  work="build/fuzz/corpus/$n"
  mkdir -p "$work"
  # The saved regressions first (they must pass), then fuzzing from the seeds.
  if [ -d "tests/fuzz/regressions/$n" ]; then
    "build/fuzz/tests/fuzz/posenc_fuzz_$n" -runs=0 "tests/fuzz/regressions/$n"
  fi
  if [ "$seconds" = 0 ]; then  # replay the seeds only, no fuzzing
    UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 ASAN_OPTIONS=halt_on_error=1:detect_leaks=1 \
      "build/fuzz/tests/fuzz/posenc_fuzz_$n" -runs=0 "tests/fuzz/corpus/$n"
    continue
  fi
  UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 ASAN_OPTIONS=halt_on_error=1:detect_leaks=1 \
    "build/fuzz/tests/fuzz/posenc_fuzz_$n" ${POSENC_FUZZ_SEED:+-seed="$POSENC_FUZZ_SEED"} \
    -max_total_time="$seconds" -timeout=20 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="build/fuzz/findings/$n-" "$work" "tests/fuzz/corpus/$n"
done
