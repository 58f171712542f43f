#!/usr/bin/env bash
# Quick start 1: install what is missing, build the tour (Release) and run it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cmake -S . -B build/release -DCMAKE_BUILD_TYPE=Release -DPOSENC_BUILD_TESTS=OFF -DPOSENC_BUILD_BENCH=OFF >/dev/null
cmake --build build/release --target posenc_example_tour -j "$(nproc)"
./build/release/examples/posenc_example_tour "$@"
