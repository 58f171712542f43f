#!/usr/bin/env bash
# Installs the Debian packages posenc's build, tests, benches and examples use (when missing).
# `deps.sh --list` prints the package names instead.
set -euo pipefail
# (OpenMP comes with g++; python is not needed: golden values are checked in. clang-14 and its
# runtime libraries build the sanitizer test build, the libFuzzer harnesses and the ThreadSanitizer
# test; libomp-14-dev is clang's OpenMP.)
pkgs=(cmake g++ make libeigen3-dev libxsimd-dev catch2 libbenchmark-dev libstb-dev clang-14 libclang-rt-14-dev libomp-14-dev
      libopenmpi-dev openmpi-bin fortunes-min)
if [ "${1:-}" = "--list" ]; then
  echo "${pkgs[*]}"
  exit 0
fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y "${missing[@]}"
fi
