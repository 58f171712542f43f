#!/usr/bin/python3
# SPDX-License-Identifier: MIT
# Draws GFLOP/s against S for each attention path, with the in-run GEMM and FMA peak lines, and the
# decode time against context length, from Google Benchmark JSON.
"""Usage: /usr/bin/python3 scripts/plot_bench.py attention.json [docs/img/attention_gflops.png] [--table]
                                    [--decode docs/img/decode_context.png]

Reads the JSON written by `posenc_bench_attention --benchmark_out=attention.json
--benchmark_out_format=json`. Single-thread rates are computed from the
process CPU time (the bench machine is shared; CPU time excludes the time the
thread waited for a core); two-thread rates from the wall-clock time; decode
entries from their manual time (the call alone: a read of K and V follows each
call, and its ratio is the entry's x_stream counter).
With --table, prints the Markdown table of the run: docs/performance.md ("Attention")
shows its main rows, docs/performance-log.md all of them.
With --decode FILE, also draws the kv_cache decode rows (one query, H = Hkv = 8, D = 128,
one thread) against the context length Sk: the time of a call beside the time to read the
cache's K and V once (the call's time / x_stream, measured in the same loop), and x_stream.
"""
import json
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def rate(b):
    """GFLOP/s of one benchmark entry (CPU time for one thread, wall time otherwise)."""
    g = b.get("GFLOP/s")
    if g is None:
        return None
    threads = b.get("threads", 1)
    name = b["name"]
    m = re.search(r"threads:(\d+)", name)
    if m:
        threads = int(m.group(1))
    if "x_stream" in b:  # decode entries: manual time of the call alone (a read of K and V follows it)
        return g
    if threads == 1 and b.get("cpu_time", 0) > 0:
        return g * b["real_time"] / b["cpu_time"]
    return g


def load(path):
    with open(path) as f:
        data = json.load(f)
    return [b for b in data["benchmarks"] if b.get("run_type", "iteration") == "iteration"]


def parse(benches):
    peak = None
    gemm = {}  # (kind, S, D) -> GFLOP/s
    att = {}  # (path, mask, H, Hkv, Sq, Sk, D, threads) -> entry
    for b in benches:
        n = b["name"]
        if n.startswith("baseline/fma_peak"):
            peak = rate(b)
            continue
        m = re.match(r"baseline/gemm/(qk|pv)/S(\d+)_D(\d+)", n)
        if m:
            gemm[(m.group(1), int(m.group(2)), int(m.group(3)))] = rate(b)
            continue
        m = re.match(r"attention/([a-z0-9_]+)/(full|causal)/H(\d+)_Hkv(\d+)/Sq(\d+)_Sk(\d+)/D(\d+)/threads:(\d+)", n)
        if m:
            key = (m.group(1), m.group(2), int(m.group(3)), int(m.group(4)), int(m.group(5)), int(m.group(6)),
                   int(m.group(7)), int(m.group(8)))
            cpu = key[-1] == 1 and "x_stream" not in b
            att[key] = {"gflops": rate(b), "ms": (b["cpu_time"] if cpu else b["real_time"]),
                        "unit": b.get("time_unit", "ms"), "x_stream": b.get("x_stream")}
    return peak, gemm, att


def gemm_rate(gemm, S, D):
    """Rate of the two Eigen GEMMs of one attention head (S x D . D x S, then S x S . S x D):
    equal flop counts, so the combined rate is the harmonic mean of the two."""
    a, b = gemm.get(("qk", S, D)), gemm.get(("pv", S, D))
    if not a or not b:
        return None
    return 2.0 / (1.0 / a + 1.0 / b)


def plot(peak, gemm, att, out):
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, D in zip(axes, (64, 128)):
        for path, style in (("fused", "o-"), ("materialized", "s--")):
            for mask in ("full", "causal"):
                pts = sorted((k[5], v["gflops"]) for k, v in att.items()
                             if k[0] == path and k[1] == mask and k[2] == 8 and k[3] == 8 and k[4] == k[5]
                             and k[6] == D and k[7] == 1)
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=f"{path} {mask}")
        g = sorted((k[1], gemm_rate(gemm, k[1], D)) for k in gemm if k[0] == "qk" and k[2] == D)
        g = [p for p in g if p[1]]
        if g:
            ax.plot([p[0] for p in g], [p[1] for p in g], ":", color="gray", label="Eigen GEMMs q.k^T + p.v")
        if peak:
            ax.axhline(peak, color="black", linewidth=0.8, label="FMA peak (1 core)")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("S (Sq = Sk), H = 8")
        ax.set_title(f"float, head_dim {D}, 1 thread")
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("GFLOP/s")
    axes[1].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(out, dpi=80)


def plot_decode(att, out):
    """Decode through a kv_cache of float, binary16 and bfloat16 against the context length."""
    fig, (ax_t, ax_x) = plt.subplots(1, 2, figsize=(10, 4))
    kinds = (("fused_cache", "float", "C0"), ("fused_cache_f16", "binary16", "C1"), ("fused_cache_bf16", "bfloat16", "C2"))
    drawn = 0
    for path, label, color in kinds:
        pts = sorted((k[5], v["ms"], v["x_stream"]) for k, v in att.items()
                     if k[0] == path and k[1] == "causal" and k[2] == 8 and k[3] == 8 and k[4] == 1 and k[6] == 128
                     and k[7] == 1 and v.get("x_stream"))
        if not pts:
            continue
        drawn += 1
        sk = [p[0] for p in pts]
        ax_t.plot(sk, [p[1] for p in pts], "o-", color=color, label=f"decode, {label} cache")
        ax_t.plot(sk, [p[1] / p[2] for p in pts], "--", color=color, linewidth=1, label=f"read of its K and V ({label})")
        ax_x.plot(sk, [p[2] for p in pts], "o-", color=color, label=f"{label} cache")
    if not drawn:
        raise SystemExit("--decode: no fused_cache rows (causal, H8_Hkv8, Sq1, D128, threads:1) in the run")
    ticks = sorted({k[5] for k, v in att.items() if k[0].startswith("fused_cache") and k[4] == 1})
    for ax in (ax_t, ax_x):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks)
        ax.set_xticklabels([f"{t // 1024}k" if t % 1024 == 0 else str(t) for t in ticks])
        ax.set_xlabel("context length Sk (keys in the cache)")
        ax.grid(True, which="both", alpha=0.3)
    ax_t.set_yscale("log")
    ax_t.set_ylabel("ms per decode step (8 heads, D 128)")
    ax_t.set_title("decode time, 1 thread")
    ax_t.legend(fontsize=7, loc="upper left")
    ax_x.set_ylabel("decode time / read time (x_stream)")
    ax_x.set_ylim(bottom=1.0)
    ax_x.axhline(1.0, color="black", linewidth=0.8)
    ax_x.set_title("x_stream (1.0: the time to read K and V once)")
    ax_x.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(out, dpi=80)


def table(peak, gemm, att):
    rows = ["| path | mask | H / Hkv | Sq x Sk | D | threads | time (ms) | GFLOP/s | / FMA peak | / Eigen GEMMs |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for k in sorted(att, key=lambda k: (k[0], k[6], k[5], k[1], k[2], k[7])):
        v = att[k]
        g = gemm_rate(gemm, k[5], k[6])
        ratio_peak = v["gflops"] / (peak * k[7]) if peak else float("nan")
        ratio_gemm = f"{v['gflops'] / g:.2f}" if g and k[4] == k[5] and k[7] == 1 else "-"
        rows.append(f"| {k[0]} | {k[1]} | {k[2]} / {k[3]} | {k[4]} x {k[5]} | {k[6]} | {k[7]} | {v['ms']:.2f} | "
                    f"{v['gflops']:.1f} | {ratio_peak:.2f} | {ratio_gemm} |")
    return "\n".join(rows)


def main(argv):
    decode_out = None
    if "--decode" in argv:
        i = argv.index("--decode")
        if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
            print("--decode needs an output file")
            return 2
        decode_out = argv[i + 1]
        argv = argv[:i] + argv[i + 2:]
    args = [a for a in argv[1:] if not a.startswith("--")]
    if not args:
        print(__doc__)
        return 2
    out = args[1] if len(args) > 1 else "docs/img/attention_gflops.png"
    peak, gemm, att = parse(load(args[0]))
    if any(k[4] == k[5] for k in att):  # prefill rows: the GFLOP/s figure
        plot(peak, gemm, att, out)
    if decode_out:
        plot_decode(att, decode_out)
    if "--table" in argv:
        print(f"FMA peak (1 core): {peak:.1f} GFLOP/s" if peak else "no FMA peak in the run")
        print(table(peak, gemm, att))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
