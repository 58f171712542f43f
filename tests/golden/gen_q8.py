# SPDX-License-Identifier: MIT
"""Golden values for the 8-bit block format (posenc::q8_block), written from docs/formulas.md 7.1
with numpy: scale = float16(float32(max|x|) / 127) (numpy's float32 division and its float16
conversion, both rounding to nearest even), q = rint(x / scale) in float64 (ties to even), clipped
to [-127, 127]; scale 0 gives q 0. Run with /usr/bin/python3; writes tests/golden/data/q8.txt
(for each case the float32 inputs, the scales and the 32 q of every block)."""
import numpy as np

from golden_io import write_golden


def quantize(x):
    """x: float32 values. Returns (scales, q) with q padded to 32 per block (0 past a partial block)."""
    scales, qs = [], []
    for b in range(0, len(x), 32):
        v = x[b:b + 32]
        amax = np.float32(np.max(np.abs(v)))
        s = float(np.float16(amax / np.float32(127)))
        q = np.zeros(32)
        if s != 0.0:
            q[:len(v)] = np.clip(np.rint(v.astype(np.float64) / s), -127, 127)
        scales.append(s)
        qs.extend(q)
    return scales, qs


def cases():
    rng = np.random.RandomState(20261207)
    out = {}
    out["gaussian"] = rng.standard_normal(96).astype(np.float32)
    # Keys with outlier channels, as real models have: two channels of each block far larger.
    k = (0.3 * rng.standard_normal(64)).astype(np.float32)
    k[[3, 40]] = np.float32(25.0), np.float32(-41.5)
    out["outlier_channels"] = k
    out["zeros"] = np.zeros(32, dtype=np.float32)
    # A block with negative zeros and one value: the zeros stay 0.
    z = np.full(32, -0.0, dtype=np.float32)
    z[7] = np.float32(-3.0)
    out["negative_zeros"] = z
    # Ties: scale exactly 2^-5 (max 127 x 2^-5), the others at (k + 1/2) x 2^-5.
    t = np.array([127.0] + [k + 0.5 for k in range(-15, 16)], dtype=np.float64) * 2.0 ** -5
    out["ties"] = t.astype(np.float32)
    # Subnormal scale with the clamp: max |x| = 127 x 1.4 x 2^-24, whose scale rounds to 2^-24.
    s = rng.uniform(-1.0, 1.0, 32) * 127 * 2.0 ** -24
    s[5] = 127 * 1.4 * 2.0 ** -24
    out["subnormal_scale"] = s.astype(np.float32)
    # A block whose scale rounds to 0: every q is 0.
    out["vanishing"] = (rng.uniform(-1.0, 1.0, 32) * 1e-9).astype(np.float32)
    # A head dim of 80: two full blocks and a partial one of 16 values.
    out["partial_80"] = rng.standard_normal(80).astype(np.float32)
    # Blocks of very different magnitudes, and one near the largest scale (65504 x 127).
    m = rng.standard_normal(128)
    m[0:32] *= 1e-3
    m[32:64] *= 1e3
    m[96:128] *= 8.0e6 / np.max(np.abs(m[96:128]))
    out["magnitudes"] = m.astype(np.float32)
    return out


def main():
    records = []
    for name, x in cases().items():
        scales, q = quantize(x)
        records.append(("q8." + name + ".x", [float(v) for v in x]))
        records.append(("q8." + name + ".scale", scales))
        records.append(("q8." + name + ".q", q))
    path = write_golden("q8.txt", records,
                        header="8-bit blocks (posenc::q8_block): tests/golden/gen_q8.py\n"
                               "from docs/formulas.md 7.1, numpy float32 / float16 / float64 rint.")
    print("wrote", path)


if __name__ == "__main__":
    main()
