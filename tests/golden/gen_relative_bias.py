# SPDX-License-Identifier: MIT
"""Golden values for the relative position encoders, written from
spec/docs/formulas.md section 4 with numpy (independent of the C++ code).

Run with /usr/bin/python3 (it has numpy): writes tests/golden/data/relative_bias.txt.

Records (all flattened row-major):
  t5_bucket_{bi,uni}_N<N>_D<D>   bucket(delta) for delta = -300 .. 300
  alibi_slopes_H<H>              slopes m_1 .. m_H
  alibi_<form>                   bias (head, query, key), 6 heads, queries at 5..8, keys 0..12
  t5_{bi,uni}_table, t5_{bi,uni}_bias      table (32, 3); bias (head, query, key)
  clipped_table, clipped_bias             table (7, 2), K = 3; bias (head, query, key)
  shaw_aK, shaw_aV, shaw_q, shaw_p, shaw_scores, shaw_values   K = 2, head_dim 5
"""
import math

import numpy as np

from golden_io import write_golden

DELTAS = np.arange(-300, 301, dtype=np.int64)


def t5_bucket(delta, bidirectional, num_buckets, max_distance):
    """docs/formulas.md 4.1, vectorised, the log term in float64 in the formula's order."""
    delta = np.asarray(delta, dtype=np.int64)
    if bidirectional:
        half = num_buckets // 2
        offset = np.where(delta > 0, half, 0)
        n = np.abs(delta)
    else:
        half = num_buckets
        offset = np.zeros_like(delta)
        n = np.maximum(-delta, 0)
    exact = half // 2
    with np.errstate(divide="ignore"):
        large = np.log(n.astype(np.float64) / exact) / math.log(max_distance / exact) * (half - exact)
    large = exact + np.trunc(np.where(n < exact, 0.0, large)).astype(np.int64)
    large = np.minimum(large, half - 1)
    return offset + np.where(n < exact, n, large)


def t5_bucket_scalar_f32(delta, bidirectional, num_buckets, max_distance):
    """The same function one value at a time with the log term in float32, as
    HF computes it; used only to cross-check the vectorised float64 version."""
    if bidirectional:
        half = num_buckets // 2
        offset = half if delta > 0 else 0
        n = abs(delta)
    else:
        half = num_buckets
        offset = 0
        n = max(-delta, 0)
    exact = half // 2
    if n < exact:
        return offset + n
    v = np.float32(np.log(np.float32(n) / np.float32(exact))) / np.float32(math.log(max_distance / exact))
    v = np.float32(v * np.float32(half - exact))
    return offset + min(half - 1, exact + int(v))


def alibi_slopes(heads):
    """docs/formulas.md 4.2: powers of two directly, else c = 2^floor(log2 H) slopes
    followed by the odd-numbered slopes of the 2c-head sequence."""
    c = 2 ** int(math.floor(math.log2(heads)))
    first = [2.0 ** (-8.0 * h / c) for h in range(1, c + 1)]
    extra = [2.0 ** (-4.0 * (2 * t - 1) / c) for t in range(1, heads - c + 1)]
    return np.array(first + extra, dtype=np.float64)


def f32(a):
    """Values representable in float32, held in float64."""
    return np.asarray(a, dtype=np.float32).astype(np.float64)


def main():
    records = []

    # T5 buckets: both modes, several (num_buckets, max_distance).
    bi_settings = [(32, 128), (64, 128), (16, 32), (4, 3), (10, 50), (32, 1000), (8, 300)]
    uni_settings = [(32, 128), (16, 64), (2, 2), (7, 40), (48, 1000), (32, 17)]
    for bidirectional, settings in ((True, bi_settings), (False, uni_settings)):
        for n_b, d in settings:
            b = t5_bucket(DELTAS, bidirectional, n_b, d)
            check = [t5_bucket_scalar_f32(int(x), bidirectional, n_b, d) for x in DELTAS]
            if list(b) != check:
                diff = [(int(x), int(p), c) for x, p, c in zip(DELTAS, b, check) if p != c]
                print("note: float32 and float64 buckets differ for", bidirectional, n_b, d, diff[:5])
            name = "t5_bucket_%s_N%d_D%d" % ("bi" if bidirectional else "uni", n_b, d)
            records.append((name, b))

    # ALiBi slopes.
    for h in (1, 6, 8, 12, 20, 32, 40, 112):
        records.append(("alibi_slopes_H%d" % h, alibi_slopes(h)))

    # ALiBi bias forms: 6 heads, queries at 5..8, keys 0..12 (L = 13).
    m = alibi_slopes(6)
    qp = np.arange(5, 9)
    kp = np.arange(0, 13)
    L = 13
    rel = kp[None, :] - qp[:, None]  # (query, key): p_j - p_i
    forms = {
        "paper": -m[:, None, None] * (qp[:, None] - kp[None, :])[None],
        "key_only": m[:, None, None] * np.broadcast_to(kp[None, :], rel.shape)[None],
        "shifted": m[:, None, None] * np.broadcast_to(kp[None, :] - (L - 1), rel.shape)[None],
        "symmetric": -m[:, None, None] * np.abs(rel)[None],
    }
    for name, v in forms.items():
        records.append(("alibi_" + name, v.reshape(-1)))

    rng = np.random.default_rng(20240611)

    # T5 bias with a given table: queries at 100..103, keys 0..250, 3 heads.
    qp = np.arange(100, 104)
    kp = np.arange(0, 251)
    for bidirectional, tag in ((True, "bi"), (False, "uni")):
        table = f32(rng.normal(0.0, 1.0, size=(32, 3)))
        buckets = t5_bucket((kp[None, :] - qp[:, None]).reshape(-1), bidirectional, 32, 128)
        buckets = buckets.reshape(len(qp), len(kp))
        bias = np.transpose(table[buckets], (2, 0, 1))  # (head, query, key)
        records.append(("t5_%s_table" % tag, table.reshape(-1)))
        records.append(("t5_%s_bias" % tag, bias.reshape(-1)))

    # Clipped bias: K = 3, 2 heads, queries at 2..6, keys 0..10.
    k = 3
    table = f32(rng.normal(0.0, 1.0, size=(2 * k + 1, 2)))
    qp = np.arange(2, 7)
    kp = np.arange(0, 11)
    idx = np.clip(kp[None, :] - qp[:, None], -k, k) + k
    records.append(("clipped_table", table.reshape(-1)))
    records.append(("clipped_bias", np.transpose(table[idx], (2, 0, 1)).reshape(-1)))

    # Shaw: K = 2, head_dim 5, queries at 4..6 (one vector each), keys 0..9.
    k, dh = 2, 5
    ak = f32(rng.normal(0.0, 1.0, size=(2 * k + 1, dh)))
    av = f32(rng.normal(0.0, 1.0, size=(2 * k + 1, dh)))
    qp = np.arange(4, 7)
    kp = np.arange(0, 10)
    q = f32(rng.normal(0.0, 1.0, size=(len(qp), dh)))
    p = f32(rng.uniform(0.0, 1.0, size=(len(qp), len(kp))))
    idx = np.clip(kp[None, :] - qp[:, None], -k, k) + k  # (query, key)
    scale = 1.0 / math.sqrt(dh)
    scores = scale * np.einsum("id,ijd->ij", q, ak[idx])
    values = np.einsum("ij,ijd->id", p, av[idx])
    records += [("shaw_aK", ak.reshape(-1)), ("shaw_aV", av.reshape(-1)), ("shaw_q", q.reshape(-1)),
                ("shaw_p", p.reshape(-1)), ("shaw_scores", scores.reshape(-1)),
                ("shaw_values", values.reshape(-1))]

    path = write_golden("relative_bias.txt", records,
                        header="Relative position encoders (docs/formulas.md 4.1-4.4); written by "
                               "tests/golden/gen_relative_bias.py with numpy " + np.__version__)
    print("wrote", path)


if __name__ == "__main__":
    main()
