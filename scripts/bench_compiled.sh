#!/usr/bin/env bash
# The compiled mode's speed against the header-only build, in one run: posenc_bench_attention
# and posenc_bench_attention_backward (-march=native, header-only) beside their _compiled builds
# (no -march; posenc::compiled picks its level at run time), alternated ROUNDS times on the
# rows of docs/performance.md ("Compiled mode"). Optionally a third build (OTHER=<bench dir>,
# e.g. another checkout's build/release/bench) for a before/after: its header-only benches, or
# its compiled ones with OTHER_SUFFIX=_compiled.
#   bash scripts/bench_compiled.sh [build dir]      (default build/release)
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-build/release}/bench"
rounds="${ROUNDS:-2}"
fwd='^attention/fused(_kv_bf16|_cache|_cache_bf16|_rope)?/(full|causal)/H(8|32)_Hkv8/(Sq4096_Sk4096|Sq1_Sk4096|Sq1024_Sk1024)/D128/threads:1/'
fwd_keep='fused/full/H8_Hkv8/Sq4096|fused/causal/H8_Hkv8/Sq4096|fused/full/H32_Hkv8/Sq1024|fused_kv_bf16/causal/H8_Hkv8/Sq4096|fused_cache/causal/H8_Hkv8/Sq1_|fused_cache_bf16/causal/H8_Hkv8/Sq1_|fused_rope/causal/H8_Hkv8/Sq4096'
bwd='^attention_backward/fused/(full|causal)/H8/S4096/D128/threads:1/'
run() {  # run <label> <binary> <filter>: the rows' real time in ms
  "$2" --benchmark_filter="$3" --benchmark_color=false 2>/dev/null | grep '^attention' |
    awk -v l="$1" -v keep="$fwd_keep|attention_backward" '$1 ~ keep {
      ms = $2 * ($3 == "ns" ? 1e-6 : $3 == "us" ? 1e-3 : $3 == "s" ? 1e3 : 1)
      printf "%-9s %-72s %10.3f ms\n", l, $1, ms}'
}
for r in $(seq "$rounds"); do
  echo "== round $r"
  for b in attention attention_backward; do
    f=$fwd
    [ "$b" = attention_backward ] && f=$bwd
    run native "$dir/posenc_bench_$b" "$f"
    run compiled "$dir/posenc_bench_${b}_compiled" "$f"
    if [ -n "${OTHER:-}" ]; then
      run other "$OTHER/posenc_bench_$b${OTHER_SUFFIX:-}" "$f"
    fi
  done
done
