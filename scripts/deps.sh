#!/usr/bin/env bash
# Installs the Debian packages of one set (when missing):
#   deps.sh [tour|test|arm|all]          (default all)
#   deps.sh --list [tour|test|arm|all]   prints the set's package names instead
# tour: what scripts/tour.sh needs to configure and build the tour with the tests and benches off:
#       the compiler and build tools, Eigen, xsimd and stb (the examples draw PNG pictures). OpenMP
#       comes with g++; MPI, Google Benchmark, Catch2 and Python are looked up only when found or
#       when tests or benches are on.
# test: what scripts/test.sh needs (the whole suite). python3 runs the docs checks (ctest
#       docs.code_blocks and docs.links); the golden values are checked in, so their generators'
#       numpy and torch are not needed. clang-14 and its runtime libraries build the sanitizer test
#       build, the libFuzzer harnesses and the ThreadSanitizer test; libomp-14-dev is clang's
#       OpenMP. fortunes-min is the lab's training text. g++-aarch64-linux-gnu and qemu-user-static
#       build and run the AArch64 stage (scripts/arm.sh).
# arm:  what scripts/arm.sh needs alone (part of test): the cross compiler, qemu and the
#       header-only dependencies.
# all:  the union of tour and test.
set -euo pipefail
tour=(cmake g++ make libeigen3-dev libxsimd-dev libstb-dev)
test=(cmake g++ make libeigen3-dev libxsimd-dev catch2 libbenchmark-dev libstb-dev clang-14 libclang-rt-14-dev libomp-14-dev
      libopenmpi-dev openmpi-bin fortunes-min python3 g++-aarch64-linux-gnu qemu-user-static)
arm=(cmake make g++-aarch64-linux-gnu qemu-user-static libeigen3-dev libxsimd-dev catch2)

list=0
set_name=all
for arg in "$@"; do
  case "$arg" in
    --list) list=1 ;;
    tour|test|arm|all) set_name=$arg ;;
    *) echo "deps.sh: unknown argument '$arg', expected tour, test, arm, all or --list" >&2; exit 2 ;;
  esac
done

pkgs=()
case "$set_name" in
  tour) pkgs=("${tour[@]}") ;;
  test) pkgs=("${test[@]}") ;;
  arm)  pkgs=("${arm[@]}") ;;
  all)  # the union, in first-seen order
    for p in "${tour[@]}" "${test[@]}"; do
      case " ${pkgs[*]} " in *" $p "*) ;; *) pkgs+=("$p") ;; esac
    done ;;
esac

if [ "$list" = 1 ]; then
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
