# SPDX-License-Identifier: MIT
"""Golden values for RoPE, written from docs/formulas.md section 3 with numpy float64.

Run with /usr/bin/python3 (it has numpy). Writes tests/golden/data/rope.txt.

Records (read by tests/golden/rope.tests.cpp):
  x/d<d>                                 input head (float32-representable values)
  positions                              0 1 17 4095 131071 1048575
  longrope_short/r<r>, longrope_long/r<r>  LongRoPE divisors
  yarn_example                           a, lo, hi for r=64, base 1e4, L0 4096, s 8
  freq/<cfg>/b<base>/r<r>/L<len>         theta'_k, k < r/2
  attn/<cfg>/b<base>/r<r>/L<len>         attention factor
  out/<cfg>/<layout>/b<base>/d<d>/r<r>/L<len>  the rotated head at every position < len, concatenated
"""
import math

import numpy as np

from golden_io import write_golden

POSITIONS = [0, 1, 17, 4095, 131071, 1048575]
BASES = [10000.0, 500000.0]
SHAPES = [(64, 64), (128, 128), (128, 32)]  # (head_dim, rotary_dim)
LAYOUTS = ["half", "interleaved"]


def longrope_lists(r):
    k = np.arange(r // 2, dtype=np.float64)
    short = 1.0 + 0.02 * k
    long = 1.0 + 0.75 * k
    return short, long


# name -> (type, params, lengths)
CONFIGS = {
    "none": ("default", {}, [1048576]),
    "linear": ("linear", {"factor": 4.0}, [1048576]),
    "dynamic": ("dynamic", {"factor": 2.0, "M": 4096}, [4096, 1048576]),
    "yarn": ("yarn", {"factor": 8.0, "L0": 4096}, [1048576]),
    "yarn_mscale": ("yarn", {"factor": 40.0, "L0": 4096, "mscale": 1.0, "mscale_all_dim": 0.5}, [1048576]),
    "yarn_notrunc": ("yarn", {"factor": 32.0, "L0": 4096, "truncate": False}, [1048576]),
    "llama3": ("llama3", {"factor": 8.0, "low": 1.0, "high": 4.0, "L0": 8192}, [1048576]),
    "longrope": ("longrope", {"L0": 4096, "M": 131072}, [4096, 1048576]),
}


def get_mscale(s, m=1.0):
    return 1.0 if s <= 1.0 else 0.1 * m * math.log(s) + 1.0


def yarn_range(r, base, beta_fast, beta_slow, l0, truncate):
    def corr(n):
        return r * math.log(l0 / (2.0 * math.pi * n)) / (2.0 * math.log(base))

    lo, hi = corr(beta_fast), corr(beta_slow)
    if truncate:
        lo, hi = math.floor(lo), math.ceil(hi)
    return max(lo, 0.0), min(hi, r - 1.0)


def frequencies(kind, p, r, base, length):
    """theta'_k (k < r/2) and the attention factor a, docs/formulas.md 3.1 and 3.5."""
    k = np.arange(0, r, 2, dtype=np.float64)
    if kind == "dynamic" and length > p["M"]:
        s, m = p["factor"], p["M"]
        base = base * (s * length / m - (s - 1.0)) ** (r / (r - 2.0))
    theta = 1.0 / base ** (k / r)
    a = 1.0
    if kind == "linear":
        theta = theta / p["factor"]
    elif kind == "yarn":
        s = p["factor"]
        lo, hi = yarn_range(r, base, 32.0, 1.0, p["L0"], p.get("truncate", True))
        if lo == hi:
            hi += 0.001
        ramp = np.clip((np.arange(r // 2, dtype=np.float64) - lo) / (hi - lo), 0.0, 1.0)
        w = 1.0 - ramp
        theta = (theta / s) * (1.0 - w) + theta * w
        if "mscale" in p and "mscale_all_dim" in p and p["mscale"] and p["mscale_all_dim"]:
            a = get_mscale(s, p["mscale"]) / get_mscale(s, p["mscale_all_dim"])
        else:
            a = get_mscale(s)
    elif kind == "llama3":
        s, lf, hf, l0 = p["factor"], p["low"], p["high"], p["L0"]
        out = theta.copy()
        for i, t in enumerate(theta):
            wl = 2.0 * math.pi / t
            if wl < l0 / hf:
                out[i] = t
            elif wl > l0 / lf:
                out[i] = t / s
            else:
                g = (l0 / wl - lf) / (hf - lf)
                out[i] = (1.0 - g) * t / s + g * t
        theta = out
    elif kind == "longrope":
        short, long = longrope_lists(r)
        e = long if length > p["L0"] else short
        theta = theta / e
        s = p["M"] / p["L0"]
        a = 1.0 if s <= 1.0 else math.sqrt(1.0 + math.log(s) / math.log(p["L0"]))
    return theta, a


def rotate(x, pos, theta, a, r, layout):
    """Rotates x[:r] by pos * theta (cos, sin times a); x[r:] passes through."""
    y = x.copy()
    phi = pos * theta
    c, s = a * np.cos(phi), a * np.sin(phi)
    h = r // 2
    if layout == "half":
        i0, i1 = np.arange(h), np.arange(h) + h
    else:
        i0, i1 = 2 * np.arange(h), 2 * np.arange(h) + 1
    xa, xb = x[i0], x[i1]
    y[i0] = xa * c - xb * s
    y[i1] = xa * s + xb * c
    return y


def main():
    rng = np.random.default_rng(20240917)
    records = []
    xs = {}
    for d in sorted({d for d, _ in SHAPES}):
        xs[d] = rng.uniform(-1.0, 1.0, d).astype(np.float32).astype(np.float64)
        records.append(("x/d%d" % d, xs[d]))
    records.append(("positions", POSITIONS))
    for r in sorted({r for _, r in SHAPES}):
        short, long = longrope_lists(r)
        records.append(("longrope_short/r%d" % r, short))
        records.append(("longrope_long/r%d" % r, long))
    lo, hi = yarn_range(64, 10000.0, 32.0, 1.0, 4096, True)
    records.append(("yarn_example", [get_mscale(8.0), lo, hi]))

    for name, (kind, p, lengths) in CONFIGS.items():
        for base in BASES:
            for r in sorted({r for _, r in SHAPES}):
                for length in lengths:
                    theta, a = frequencies(kind, p, r, base, length)
                    tag = "%s/b%d/r%d/L%d" % (name, int(base), r, length)
                    records.append(("freq/" + tag, theta))
                    records.append(("attn/" + tag, [a]))
            for d, r in SHAPES:
                for length in lengths:
                    theta, a = frequencies(kind, p, r, base, length)
                    for layout in LAYOUTS:
                        out = [rotate(xs[d], float(q), theta, a, r, layout) for q in POSITIONS if q < length]
                        records.append(("out/%s/%s/b%d/d%d/r%d/L%d" % (name, layout, int(base), d, r, length),
                                        np.concatenate(out)))
    path = write_golden("rope.txt", records, header=__doc__.strip().splitlines()[0] +
                        "\nGenerated by tests/golden/gen_rope.py (numpy float64); do not edit.")
    print("wrote", path)


if __name__ == "__main__":
    main()
