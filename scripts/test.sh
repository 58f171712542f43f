#!/usr/bin/env bash
# Quick start 2: install what is missing, then build and run the whole suite in five
# stages: Release (g++: tests, benches, examples, ISA builds, packaging), Debug with
# AddressSanitizer + UndefinedBehaviorSanitizer (clang), the libFuzzer harnesses (clang),
# the ThreadSanitizer test (clang) and the AArch64 builds (cross g++, run under qemu). Each stage prints its time, and a table closes the run
# (docs/testing.md keeps the measured one).
set -euo pipefail
cd "$(dirname "$0")/.."
stage_names=()
stage_secs=()
stage_start=$SECONDS
# stage_done NAME: records the time since the previous stage ended.
stage_done() {
  stage_names+=("$1")
  stage_secs+=($((SECONDS - stage_start)))
  echo "== $1: $((SECONDS - stage_start)) s"
  stage_start=$SECONDS
}
bash scripts/deps.sh
stage_done "packages"
jobs=$(nproc)
# CI always has the ONNX conformance data (../shared/conformance/onnx): there, a
# missing folder fails the conformance tests instead of skipping them.
if [[ -n "${CI:-}" ]]; then
  export POSENC_REQUIRE_ONNX=1
fi

echo "== Release"
# The test programs link posenc::compiled (each kernel of its list compiled once for the suite;
# on x86-64 for sse2, avx2 and avx512 with run-time dispatch, tests/compiled checks each level).
# The test programs at -O2 (POSENC_TEST_FLAGS) and posenc::compiled at -O2 -fpeel-loops
# (POSENC_COMPILED_FLAGS: a third less compile time than -O3, its kernels at 1.0x to 1.15x
# of -O3's time in decode and 2.6x in prefill; the benches and the examples keep Release's -O3 and
# compile the same kernels header-only there: docs/testing.md, "Optimisation levels").
cmake -S . -B build/release -DCMAKE_BUILD_TYPE=Release -DPOSENC_BUILD_TESTS=ON -DPOSENC_BUILD_BENCH=ON \
  -DPOSENC_BUILD_EXAMPLES=ON -DPOSENC_COMPILED=ON -DPOSENC_TEST_FLAGS=-O2 \
  "-DPOSENC_COMPILED_FLAGS=-O2 -fpeel-loops" >/dev/null
cmake --build build/release -j "$jobs"
stage_done "Release build"
(cd build/release && ctest --output-on-failure -j "$jobs")
stage_done "Release ctest"

echo "== Debug + ASan + UBSan (clang)"
san="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
# Tests only (the examples, the ISA builds and the header-alone compiles run in the Release
# build), linking posenc::compiled built once for this build's flags (no dispatch: the Release
# build tests that), with line tables (-g1) instead of full debug information: enough for the
# sanitizers' stack traces, and a faster build. Built with clang (OpenMP from libomp): with
# UBSan, g++ 12 spends about twice clang's time on the same test (docs/testing.md); g++
# builds the Release stage. At -O0 the tests build about five times faster than at -O1 and
# run longer by less than the build saves, except the run-heavy programs, which get -O1
# (POSENC_RUN_HEAVY_FLAGS, tests/CMakeLists.txt).
cmake -S . -B build/asan -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_COMPILER=clang++-14 \
  -DPOSENC_BUILD_TESTS=ON -DPOSENC_BUILD_BENCH=OFF \
  -DPOSENC_BUILD_EXAMPLES=OFF -DPOSENC_PACKAGING_TESTS=OFF -DPOSENC_ISA_TESTS=OFF -DPOSENC_HEADER_TESTS=OFF \
  -DPOSENC_COMPILED=ON -DPOSENC_COMPILED_DISPATCH=OFF \
  -DCMAKE_CXX_FLAGS_DEBUG="-O0 -g1" -DPOSENC_RUN_HEAVY_FLAGS=-O1 \
  -DCMAKE_CXX_FLAGS="$san" -DCMAKE_EXE_LINKER_FLAGS="$san" >/dev/null
cmake --build build/asan -j "$jobs"
stage_done "ASan + UBSan build"
(cd build/asan && UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 ASAN_OPTIONS=halt_on_error=1:detect_leaks=1 \
  ctest --output-on-failure -j "$jobs")
stage_done "ASan + UBSan ctest"

# Clang builds of only what they need: the libFuzzer harnesses (60 s each from
# the checked-in seeds) and the ThreadSanitizer concurrency test (serial kernels:
# libgomp is not instrumented for TSan).
echo "== libFuzzer (clang, ASan + UBSan)"
POSENC_FUZZ_SEED="${POSENC_FUZZ_SEED:-1}" bash scripts/fuzz.sh "${POSENC_FUZZ_SECONDS:-60}" rope_hf attention backward cache
stage_done "libFuzzer (build, replay, fuzz)"

echo "== ThreadSanitizer (clang, OpenMP off)"
tsan="-fsanitize=thread -fno-omit-frame-pointer"
cmake -S . -B build/tsan -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_COMPILER=clang++-14 -DPOSENC_TSAN=ON \
  -DPOSENC_OPENMP=OFF -DPOSENC_BUILD_TESTS=ON -DPOSENC_BUILD_BENCH=OFF -DPOSENC_BUILD_EXAMPLES=OFF \
  -DPOSENC_PACKAGING_TESTS=OFF -DPOSENC_ISA_TESTS=OFF -DPOSENC_INSTALL=OFF \
  -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g" -DCMAKE_CXX_FLAGS="$tsan" -DCMAKE_EXE_LINKER_FLAGS="$tsan" >/dev/null
cmake --build build/tsan -j "$jobs" --target posenc_tsan_concurrency_tests
(cd build/tsan && TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 ctest --output-on-failure -R '^tsan\.')
stage_done "ThreadSanitizer (build, run)"

echo "== AArch64 (cross-compiled, run under qemu)"
# The test files of scripts/arm.sh for three AArch64 targets (NEON, +fp16+bf16, SVE at 256 bits),
# built with Debian's g++-aarch64-linux-gnu and run under qemu-user-static, and the check that an
# unsupported target stops at compile time (docs/integration.md, "Platforms").
bash scripts/arm.sh
stage_done "AArch64 (build, qemu)"

echo "== stage times (s)"
total=0
for i in "${!stage_names[@]}"; do
  printf '  %-34s %6d\n' "${stage_names[$i]}" "${stage_secs[$i]}"
  total=$((total + stage_secs[i]))
done
printf '  %-34s %6d\n' "total" "$total"
