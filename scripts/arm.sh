#!/usr/bin/env bash
# Builds posenc's tests for 64-bit ARM with Debian's cross compiler and runs them under
# qemu-user-static (emulated: correctness only, no speed; docs/integration.md, "Platforms"):
#   arm.sh [neon|bf16|sve|isa] ...   (default: all three targets and the ISA check)
# neon: -march=armv8-a (NEON, every AArch64 CPU) on an emulated Cortex-A53 (ARMv8.0): the core,
#       every encoder, the three paths, the caches, the backward, 16-bit storage, packed and
#       paged calls, the bfloat16 product mode and the golden values (neon_subset below).
# bf16: -march=armv8.2-a+fp16+bf16 on qemu's "max" CPU: the SIMD shim (bfcvtn narrows bfloat16),
#       16-bit storage and the golden attention values.
# sve:  -march=armv8.2-a+sve with 256-bit SVE vectors: the same and the fused path. Debian's
#       xsimd 8.1 has no SVE batch, so posenc's kernels run NEON there; the loops the compiler
#       vectorises itself (the reference path, the tables) run SVE at 256 bits.
# isa:  AArch64 with +nosimd, a target posenc does not support, must stop at compile time with
#       posenc's one sentence.
# Each target builds in build/aarch64-<name>, its tests at -O1 (about 30% less compile time than
# -O2, the same run time under qemu: docs/testing.md); POSENC_ARM_FLAGS adds compile options.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/deps.sh arm  # the cross compiler, qemu and the header-only dependencies

neon_subset=(
  core/simd core/view core/positions core/aligned_buffer core/threading
  encoding/alibi encoding/clipped_bias encoding/compose encoding/identity encoding/learned
  encoding/learned_half encoding/rope encoding/rope_half encoding/shaw
  encoding/sinusoidal encoding/t5_bias encoding/transformer_xl
  paths/fused paths/materialized paths/fused_backward paths/transformer_xl
  attention/kv_cache attention/paged_kv_cache attention/cache_attention attention/backward
  attention/half_storage attention/paged_half attention/packed attention/bf16_compute
  golden/rope golden/mha golden/relative_bias golden/absolute golden/backward golden/transformer_xl
)
bf16_subset=(core/simd attention/half_storage golden/mha)
sve_subset=(core/simd paths/fused attention/half_storage golden/mha)

jobs=$(nproc)
# target NAME MARCH QEMU_CPU SUBSET...: configures, builds and runs one target.
target() {
  local name=$1 march=$2 cpu=$3
  shift 3
  local subset
  subset=$(IFS=';'; echo "$*")
  local dir=build/aarch64-$name
  local start=$SECONDS
  echo "== aarch64 $name: -march=$march, qemu -cpu $cpu, $# test files"
  cmake -S . -B "$dir" --toolchain cmake/toolchains/aarch64-linux-gnu.cmake -DCMAKE_BUILD_TYPE=Release \
    -DPOSENC_AARCH64_MARCH="$march" -DPOSENC_QEMU_CPU="$cpu" -DPOSENC_BUILD_TESTS=ON -DPOSENC_BUILD_BENCH=OFF \
    -DPOSENC_BUILD_EXAMPLES=OFF -DPOSENC_DISTRIBUTED=OFF -DPOSENC_INSTALL=OFF \
    -DPOSENC_TEST_FLAGS="-O1 ${POSENC_ARM_FLAGS:-}" -DPOSENC_TEST_SUBSET="$subset" >/dev/null
  cmake --build "$dir" -j "$jobs"
  (cd "$dir" && ctest --output-on-failure -j "$jobs")
  echo "== aarch64 $name: $((SECONDS - start)) s"
}

# uses DIR INSTRUCTION...: the SIMD shim's test program of DIR contains each instruction (the
# 16-bit conversions compile to the ARM ones, not to the lane-by-lane fallback).
uses() {
  local dir=$1
  shift
  local asm
  asm=$(aarch64-linux-gnu-objdump -d "$dir/tests/posenc_core_tests")
  for insn in "$@"; do
    if ! grep -qE "[[:space:]]$insn[[:space:]]" <<<"$asm"; then
      echo "arm.sh: $dir/tests/posenc_core_tests has no $insn instruction" >&2
      return 1
    fi
  done
  echo "$dir: uses $*: ok"
}

# The unsupported-target check: the compile must fail, with the sentence and nothing after it.
isa_check() {
  local out
  echo "== aarch64 +nosimd: rejected at compile time"
  if out=$(echo '#include <posenc/posenc.hpp>' | aarch64-linux-gnu-g++ -std=c++17 -march=armv8-a+nosimd -Iinclude \
             -isystem /usr/include/eigen3 -idirafter /usr/include -x c++ -c - -o /dev/null 2>&1); then
    echo "arm.sh: a +nosimd build of <posenc/posenc.hpp> compiled; expected posenc's error" >&2
    return 1
  fi
  if ! grep -q "posenc: this target has no vector instruction set posenc supports" <<<"$out" ||
     [ "$(grep -cE '^[^ ].*: (fatal )?error:' <<<"$out")" -gt 2 ]; then
    printf 'arm.sh: a +nosimd build failed otherwise than with posenc'"'"'s one sentence:\n%s\n' "$out" >&2
    return 1
  fi
  echo "aarch64 +nosimd: rejected with posenc's sentence: ok"
}

which=("$@")
[ ${#which[@]} -eq 0 ] && which=(isa neon bf16 sve)
for t in "${which[@]}"; do
  case "$t" in
    neon) target neon armv8-a cortex-a53 "${neon_subset[@]}"
          uses build/aarch64-neon fcvtl fcvtn shll ;;
    bf16) target bf16 armv8.2-a+fp16+bf16 max "${bf16_subset[@]}"
          uses build/aarch64-bf16 fcvtl fcvtn shll bfcvtn ;;
    sve)  target sve armv8.2-a+sve max,sve256=on "${sve_subset[@]}" ;;
    isa)  isa_check ;;
    *) echo "arm.sh: unknown target '$t', expected neon, bf16, sve or isa" >&2; exit 2 ;;
  esac
done
