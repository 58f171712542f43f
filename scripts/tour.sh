#!/usr/bin/env bash
# Quick start 1: install what the tour needs when it is missing (the tour set of scripts/deps.sh:
# compiler, CMake, Eigen, xsimd, stb), build the tour (Release, tests and benches off) and run it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh tour
cmake -S . -B build/release -DCMAKE_BUILD_TYPE=Release -DPOSENC_BUILD_TESTS=OFF -DPOSENC_BUILD_BENCH=OFF >/dev/null
cmake --build build/release --target posenc_example_tour -j "$(nproc)"
./build/release/examples/posenc_example_tour "$@"
