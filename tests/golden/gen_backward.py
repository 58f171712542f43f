# SPDX-License-Identifier: MIT
"""Golden gradients of attention with each positional encoding, from torch autograd.

Run with /usr/bin/python3 (Debian's python3-torch and numpy): writes
tests/golden/data/backward.txt. Independent of the C++ code: a plain
scaled-dot-product attention written here in torch float64 (softmax over
scores + bias + mask, as docs/formulas.md section 5 states it), each encoding
written from docs/formulas.md sections 2-4, and torch.autograd for the
gradients of L = sum(dout * out).

Inputs are rounded to float32 so that the C++ test feeds the same values to
its float and double runs. Tensors are flattened row-major in (batch, seq,
head, dim) order; tables in the (rows, cols) layout the C++ constructors take.

Records, per case <c>:
  <c>/q, <c>/k, <c>/v, <c>/dout     inputs
  <c>/dq, <c>/dk, <c>/dv            gradients
  <c>/<param>, <c>/d<param>         an encoder parameter and its gradient
Cases: plain (causal), softcap_mask (softcap, additive mask with -inf, a fully
masked row), gqa (4 query heads over 2 kv heads, Dv != D), t5 (bidirectional
buckets), clipped (K = 2), alibi (paper form, learnable slopes), shaw (K = 2,
keys and values), rope_half and rope_interleaved (base 10000), learned (table
with offset 2, q = k = v = x + W[pos + 2]).
"""
import math

import numpy as np
import torch

from golden_io import write_golden

torch.set_default_dtype(torch.float64)
B, S, H, D = 2, 5, 2, 4


def f32(a):
    return np.asarray(a, dtype=np.float32).astype(np.float64)


def rand(rng, *shape, scale=1.0):
    return torch.tensor(f32(rng.uniform(-scale, scale, size=shape)), requires_grad=True)


def sdpa(q, k, v, bias=None, mask=None, causal=False, softcap=0.0, scale=None, shaw_k=None, shaw_v=None):
    """q (B, Sq, Hq, D), k (B, Sk, Hkv, D), v (B, Sk, Hkv, Dv); bias (Hq, Sq, Sk) or None;
    mask (Sq, Sk) additive or None; shaw_k, shaw_v (Sq, Sk, D) relative embeddings or None."""
    Hq, Hkv = q.shape[2], k.shape[2]
    rep = Hq // Hkv
    kk = k.repeat_interleave(rep, dim=2)
    vv = v.repeat_interleave(rep, dim=2)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = torch.einsum("bihd,bjhd->bhij", q, kk)
    if shaw_k is not None:
        s = s + torch.einsum("bihd,ijd->bhij", q, shaw_k)
    s = s * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    if bias is not None:
        s = s + bias[None]
    Sq, Sk = s.shape[-2], s.shape[-1]
    if mask is not None:
        s = s + torch.tensor(mask)[None, None]
    if causal:
        off = Sk - Sq
        i = torch.arange(Sq)[:, None] + off
        j = torch.arange(Sk)[None, :]
        s = s.masked_fill(j > i, -math.inf)
    m = s.amax(dim=-1, keepdim=True)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    e = torch.exp(s - m)
    den = e.sum(dim=-1, keepdim=True)
    p = torch.where(den > 0, e / torch.where(den > 0, den, torch.ones_like(den)), torch.zeros_like(e))
    out = torch.einsum("bhij,bjhd->bihd", p, vv)
    if shaw_v is not None:
        out = out + torch.einsum("bhij,ijd->bihd", p, shaw_v)
    return out


def t5_bucket(delta, num_buckets, max_distance):
    """Bidirectional T5 bucket of delta = key - query (docs/formulas.md 4.1), log term in float64."""
    half = num_buckets // 2
    offset = half if delta > 0 else 0
    n = abs(delta)
    exact = half // 2
    if n < exact:
        return offset + n
    n = min(n, max_distance)
    v = math.log(n / exact) / math.log(max_distance / exact) * (half - exact)
    return offset + min(half - 1, exact + int(v))


def rope_rotate(x, layout, base=10000.0, positions=None):
    """RoPE of x (B, S, H, D) at positions 0..S-1 (docs/formulas.md 3)."""
    d = x.shape[-1]
    inv = torch.tensor([base ** (-2.0 * k / d) for k in range(d // 2)])
    pos = torch.arange(x.shape[1], dtype=torch.float64) if positions is None else positions
    ang = pos[:, None] * inv[None, :]  # (S, d/2)
    c = torch.cos(ang)[None, :, None, :]
    s = torch.sin(ang)[None, :, None, :]
    if layout == "half":
        a, b = x[..., : d // 2], x[..., d // 2:]
        return torch.cat([a * c - b * s, b * c + a * s], dim=-1)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * c - b * s, b * c + a * s], dim=-1).flatten(-2)


def flat(t):
    return t.detach().numpy().reshape(-1)


def main():
    rng = np.random.default_rng(20260116)
    records = []

    def case(name, q, k, v, dout, out, params=()):
        out.backward(dout)
        records.extend([(name + "/q", flat(q)), (name + "/k", flat(k)), (name + "/v", flat(v)),
                        (name + "/dout", flat(dout)), (name + "/dq", flat(q.grad)), (name + "/dk", flat(k.grad)),
                        (name + "/dv", flat(v.grad))])
        for pname, p in params:
            records.extend([(name + "/" + pname, flat(p)), (name + "/d" + pname, flat(p.grad))])

    def qkvd(hq=H, hkv=H, dv=D):
        return (rand(rng, B, S, hq, D), rand(rng, B, S, hkv, D), rand(rng, B, S, hkv, dv),
                torch.tensor(f32(rng.uniform(-1, 1, size=(B, S, hq, dv)))))

    q, k, v, do = qkvd()
    case("plain", q, k, v, do, sdpa(q, k, v, causal=True))

    q, k, v, do = qkvd()
    mask = f32(rng.uniform(-1, 1, size=(S, S)))
    mask[0, 2] = mask[3, 1] = -math.inf
    mask[4, :] = -math.inf  # row 4 sees nothing: zero gradients
    records.append(("softcap_mask/mask", mask.reshape(-1)))
    case("softcap_mask", q, k, v, do, sdpa(q, k, v, mask=mask, softcap=0.7, scale=1.3))

    q, k, v, do = qkvd(hq=4, hkv=2, dv=3)
    case("gqa", q, k, v, do, sdpa(q, k, v, causal=True))

    q, k, v, do = qkvd()
    nb, md = 8, 12
    table = rand(rng, nb, H, scale=0.5)
    idx = torch.tensor([[t5_bucket(j - i, nb, md) for j in range(S)] for i in range(S)])
    bias = table[idx].permute(2, 0, 1)  # (H, S, S)
    case("t5", q, k, v, do, sdpa(q, k, v, bias=bias), [("table", table)])

    q, k, v, do = qkvd()
    K = 2
    ctab = rand(rng, 2 * K + 1, H, scale=0.5)
    idx = torch.tensor([[max(-K, min(K, j - i)) + K for j in range(S)] for i in range(S)])
    case("clipped", q, k, v, do, sdpa(q, k, v, bias=ctab[idx].permute(2, 0, 1), causal=True), [("table", ctab)])

    q, k, v, do = qkvd()
    slopes = torch.tensor([0.25, 0.0625], requires_grad=True)
    dist = torch.tensor([[float(j - i) for j in range(S)] for i in range(S)])
    case("alibi", q, k, v, do, sdpa(q, k, v, bias=slopes[:, None, None] * dist[None], causal=True),
         [("slopes", slopes)])

    q, k, v, do = qkvd()
    ak = rand(rng, 2 * K + 1, D, scale=0.5)
    av = rand(rng, 2 * K + 1, D, scale=0.5)
    case("shaw", q, k, v, do, sdpa(q, k, v, shaw_k=ak[idx], shaw_v=av[idx], causal=True),
         [("aK", ak), ("aV", av)])

    for layout in ("half", "interleaved"):
        q, k, v, do = qkvd()
        out = sdpa(rope_rotate(q, layout), rope_rotate(k, layout), v, causal=True)
        case("rope_" + layout, q, k, v, do, out)

    # learned: x (B, S, H * D) + W[pos + 2]; q = k = v = x split into heads.
    rows, off = S + 3, 2
    x = torch.tensor(f32(rng.uniform(-1, 1, size=(B, S, H * D))))
    w = rand(rng, rows, H * D, scale=0.5)
    pos = torch.tensor([[0, 1, 2, 3, 4], [-1, 0, 1, 2, 3]])  # the second entry left-padded (OPT: -1)
    xe = x + w[pos + off]
    xh = xe.reshape(B, S, H, D)
    do = torch.tensor(f32(rng.uniform(-1, 1, size=(B, S, H, D))))
    out = sdpa(xh, xh, xh, causal=True)
    out.backward(do)
    records.extend([("learned/x", flat(x)), ("learned/dout", flat(do)), ("learned/table", flat(w)),
                    ("learned/dtable", flat(w.grad))])

    write_golden("backward.txt", records, header=__doc__.strip().splitlines()[0] + "\n(tests/golden/gen_backward.py)")


if __name__ == "__main__":
    main()
