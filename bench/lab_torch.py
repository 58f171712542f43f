#!/usr/bin/python3
# SPDX-License-Identifier: MIT
# The lab's training step in PyTorch, timed side by side with the lab's own bench mode.
#
#   /usr/bin/python3 bench/lab_torch.py --lab build/examples/lab/posenc_lab [--encoding rope]
#       [--threads 1 2] [--reps 3] [--warmup 20] [--steps 200] [--quick]
#       [--variant 'LABEL|PATH|EXTRA ARGS' ...]
#
# The model is built from the configuration the lab binary prints (`posenc_lab config`), so the
# two cannot drift apart: byte vocabulary, width, layers, heads, MLP width, pre-norm LayerNorm,
# tanh GELU, output tied to the embedding, the encoding (rope, alibi, learned, sinusoidal, none),
# batch and sequence length, Adam with linear warmup and global-norm clipping, float32.
# Each repetition runs, for every thread count, the lab (`posenc_lab bench`) and then this
# script's torch loop; the medians and the ratio lab / torch are printed as a markdown table.
# --variant times other lab builds or options in the same sitting (before/after a change); in
# EXTRA ARGS, {t} is the thread count, e.g. 'eigen|build/examples/lab/posenc_lab|--eigen-threads {t}'.
# Needs Debian's python3-torch (not run by CI). Debian's torch calls the system libblas.so.3
# (the reference BLAS unless an optimized one is installed); with an OpenBLAS unpacked from
# Debian's libopenblas0-openmp, LD_LIBRARY_PATH=<dir of its libblas.so.3> gives torch that one
# (its OpenMP threads follow torch.set_num_threads). The script prints the one loaded.
import argparse
import json
import math
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F


def blas_in_use():
    """The BLAS library this process loaded (Debian's torch calls libblas.so.3 for its products)."""
    libs = {line.split()[-1] for line in open("/proc/self/maps") if "blas" in line.split()[-1]}
    return ", ".join(sorted(libs)) or "none"


def lab_lines(cmd):
    """Runs the lab and returns its lab-config and lab-bench objects (None when absent)."""
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    found = {}
    for line in out.splitlines():
        key, _, rest = line.partition(" ")
        if key in ("lab-config", "lab-bench"):
            found[key] = json.loads(rest)
    return found.get("lab-config"), found.get("lab-bench")


class LabModel(torch.nn.Module):
    """The lab's decoder-only byte model, parameter for parameter (see examples/lab/model.hpp)."""

    def __init__(self, c):
        super().__init__()
        self.c = c
        d, hid, L = c["d_model"], c["mlp_hidden"], c["layers"]
        enc = c["encoding"]
        supported = ("none", "rope", "alibi", "learned", "sinusoidal")
        if enc not in supported:
            sys.exit(f"lab_torch.py: encoding is {enc!r}, expected one of {', '.join(supported)}")
        if not (c["norm"] == "pre" and c["gelu"] == "tanh" and c["tied_output"] and c["final_norm"]
                and not c["qkvo_bias"] and c["mlp_bias"] and c["dtype"] == "float32"):
            sys.exit("lab_torch.py: the lab's configuration has a feature this script does not build: " + json.dumps(c))
        g = torch.Generator().manual_seed(c["seed"])

        def normal(rows, cols, sd):
            return torch.nn.Parameter(torch.randn(rows, cols, generator=g) * sd)

        self.embedding = normal(c["vocab"], d, 0.02)
        self.blocks = torch.nn.ModuleList()
        for _ in range(L):
            b = torch.nn.Module()
            b.ln1 = torch.nn.LayerNorm(d, eps=c["ln_eps"])
            b.wq, b.wk, b.wv = (normal(d, d, d ** -0.5) for _ in range(3))
            b.wo = normal(d, d, d ** -0.5 / math.sqrt(2 * L))
            b.ln2 = torch.nn.LayerNorm(d, eps=c["ln_eps"])
            b.w1 = normal(d, hid, d ** -0.5)
            b.b1 = torch.nn.Parameter(torch.zeros(hid))
            b.w2 = normal(hid, d, hid ** -0.5 / math.sqrt(2 * L))
            b.b2 = torch.nn.Parameter(torch.zeros(d))
            self.blocks.append(b)
        self.final = torch.nn.LayerNorm(d, eps=c["ln_eps"])
        S, H, hd = c["seq"], c["heads"], c["head_dim"]
        if enc == "learned":
            self.table = normal(S, d, 0.02)
        pos = torch.arange(S, dtype=torch.float64)
        if enc == "sinusoidal":
            w = c["rope_base"] ** (-2.0 * torch.arange((d + 1) // 2, dtype=torch.float64) / d)
            pe = torch.zeros(S, d, dtype=torch.float64)
            pe[:, 0::2] = torch.sin(pos[:, None] * w[None, :])
            pe[:, 1::2] = torch.cos(pos[:, None] * w[None, : d // 2])
            self.register_buffer("pe", pe.float())
        if enc == "rope":
            inv = c["rope_base"] ** (-2.0 * torch.arange(hd // 2, dtype=torch.float64) / hd)
            ang = pos[:, None] * inv[None, :]
            self.register_buffer("cos", torch.cos(ang).float())  # (S, hd/2)
            self.register_buffer("sin", torch.sin(ang).float())
        mask = torch.full((S, S), float("-inf")).triu(1)
        if enc == "alibi":
            slopes = torch.tensor(c["alibi_slopes"], dtype=torch.float64)
            dist = (pos[:, None] - pos[None, :])  # p_i - p_j
            mask = mask[None, :, :] - slopes[:, None, None] * dist[None, :, :]
        self.register_buffer("mask", mask.float())

    def rotate(self, x):
        """RoPE, half-split layout: pairs (k, k + hd/2)."""
        h = x.shape[-1] // 2
        a, b = x[..., :h], x[..., h:]
        return torch.cat((a * self.cos - b * self.sin, a * self.sin + b * self.cos), dim=-1)

    def forward(self, inputs, targets):
        c = self.c
        B, S = inputs.shape
        H, hd, d = c["heads"], c["head_dim"], c["d_model"]
        x = self.embedding[inputs]  # (B, S, d)
        if c["encoding"] == "learned":
            x = x + self.table[:S]
        if c["encoding"] == "sinusoidal":
            x = x + self.pe[:S]
        for b in self.blocks:
            h = b.ln1(x)
            q, k, v = ((h @ w).view(B, S, H, hd).transpose(1, 2) for w in (b.wq, b.wk, b.wv))
            if c["encoding"] == "rope":
                q, k = self.rotate(q), self.rotate(k)
            s = (q @ k.transpose(-1, -2)) * c["attention_scale"] + self.mask
            att = (torch.softmax(s, dim=-1) @ v).transpose(1, 2).reshape(B, S, d)
            x = x + att @ b.wo
            x = x + F.gelu(b.ln2(x) @ b.w1 + b.b1, approximate="tanh") @ b.w2 + b.b2
        logits = self.final(x) @ self.embedding.t()
        return F.cross_entropy(logits.view(B * S, -1), targets.reshape(B * S))


def torch_rate(c, data, threads, warmup, steps):
    """Steps per second of `steps` training steps after `warmup`, on `threads` threads."""
    torch.set_num_threads(threads)
    torch.manual_seed(c["seed"] + 1)
    model = LabModel(c)
    opt = torch.optim.Adam(model.parameters(), lr=c["lr"], betas=(c["beta1"], c["beta2"]), eps=c["eps"])
    B, S = c["batch"], c["seq"]
    span = torch.arange(S + 1)
    t = 0

    def step():
        nonlocal t
        t += 1
        win = data[torch.randint(0, data.numel() - S - 1, (B,))[:, None] + span]
        loss = model(win[:, :-1], win[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), c["clip_global_norm"])
        for group in opt.param_groups:
            group["lr"] = c["lr"] * min(1.0, t / max(1, c["lr_warmup_steps"]))
        opt.step()

    for _ in range(warmup):
        step()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    return steps / (time.perf_counter() - t0)


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--lab", required=True, help="path of the posenc_lab binary")
    p.add_argument("--encoding", default="rope")
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--quick", action="store_true", help="the lab's --quick model")
    p.add_argument("--corpus", default="/usr/share/games/fortunes/fortunes")
    p.add_argument("--variant", action="append", default=[], help="'LABEL|PATH|EXTRA ARGS': another lab run")
    a = p.parse_args()
    variants = [("lab", a.lab, "")] + [tuple((v.split("|") + ["", ""])[:3]) for v in a.variant]
    size = ["--quick"] if a.quick else []
    c, _ = lab_lines([a.lab, "config", "--encoding", a.encoding] + size)
    print("config:", json.dumps(c))
    count = sum(p.numel() for p in LabModel(c).parameters())
    if count != c["parameters"]:
        sys.exit(f"lab_torch.py: the torch model has {count} parameters, the lab's {c['parameters']}")
    print(f"parameters: {count} in both")
    data = torch.tensor(list(open(a.corpus, "rb").read()), dtype=torch.long)
    print(f"torch {torch.__version__}, BLAS {blas_in_use()}; load now: {open('/proc/loadavg').read().split()[:3]}")
    names = [v[0] for v in variants] + ["torch"]
    rates = {t: {n: [] for n in names} for t in a.threads}
    for rep in range(a.reps):
        for t in a.threads:
            for label, path, extra in variants:
                cmd = [path, "bench", "--encoding", a.encoding, "--threads", str(t), "--warmup", str(a.warmup),
                       "--steps", str(a.steps)] + size + extra.replace("{t}", str(t)).split()
                rates[t][label].append(lab_lines(cmd)[1]["steps_per_s"])
            rates[t]["torch"].append(torch_rate(c, data, t, a.warmup, a.steps))
            print(f"rep {rep + 1}, {t} thread(s): " + ", ".join(f"{n} {rates[t][n][-1]:.2f}" for n in names) + " steps/s",
                  flush=True)
    print(f"load after: {open('/proc/loadavg').read().split()[:3]}")
    print("\n| threads | " + " | ".join(f"{n} steps/s" for n in names) + " | " +
          " | ".join(f"{n} / torch" for n in names[:-1]) + " |")
    print("|---" * (2 * len(names)) + "|")
    for t in a.threads:
        med = {n: statistics.median(rates[t][n]) for n in names}
        print(f"| {t} | " + " | ".join(f"{med[n]:.2f}" for n in names) + " | " +
              " | ".join(f"{med[n] / med['torch']:.2f}" for n in names[:-1]) + " |")
    print(f"\n(medians of {a.reps} runs each, {a.steps} steps after {a.warmup} warmup steps, encoding {c['encoding']})")

if __name__ == "__main__":
    main()
