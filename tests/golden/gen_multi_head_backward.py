# SPDX-License-Identifier: MIT
"""Golden gradients of a multi-head attention layer and of Transformer-XL, from torch autograd.

Run with /usr/bin/python3 (Debian's python3-torch and numpy): writes
tests/golden/data/multi_head_backward.txt. Independent of the C++ code: the
layer is written here with nn.Linear-style projections (y = x W^T + b) in
torch float64 around the plain attention of gen_backward.py; Transformer-XL
follows the reference model (Dai et al. 2019, Hugging Face TransfoXL
`RelPartialLearnableMultiHeadAttn`): positions klen-1 down to 0, the
sinusoids [sin | cos], (q + u) . k + (q + v) . R with the pad-and-shift
relative shift, causal mask triu(1 + mlen). torch.autograd gives the
gradients of L = sum(dy * y).

Inputs are rounded to float32 so that the C++ test feeds the same values to
its float and double runs. Tensors are flattened row-major: x, y (batch, seq,
model_dim); q, k, v (batch, seq, head, dim); weights (out_features,
in_features).

Records of layer case <c> (mha_clipped: 4 query heads over 2 kv heads,
head_dim 3, value_dim 2, causal, clipped relative bias K = 2; mha_txl: 2
heads, head_dim 3, causal, Transformer-XL with pos_dim 4):
  <c>/x, <c>/dy, <c>/wq .. <c>/wo, <c>/bq .. <c>/bo     inputs and parameters
  <c>/dx, <c>/dwq .. <c>/dwo, <c>/dbq .. <c>/dbo         gradients
  <c>/<param>, <c>/d<param>                              encoder parameters (table; u, vb, wr)
Records of attention case <c> (txl_mem: memory 3, txl_cut: memory 4 cut to 2
by memory_length; both causal, 2 heads, head_dim 4, pos_dim 6):
  <c>/q, <c>/k, <c>/v, <c>/dout, <c>/u, <c>/vb, <c>/wr   inputs
  <c>/dq, <c>/dk, <c>/dv, <c>/du, <c>/dvb, <c>/dwr       gradients
"""
import math

import numpy as np
import torch

from gen_backward import f32, rand, sdpa
from golden_io import write_golden

torch.set_default_dtype(torch.float64)


def flat(t):
    return t.detach().numpy().reshape(-1)


def positional_embedding(pos_seq, d_model):
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0.0, d_model, 2.0) / d_model))
    sinusoid = torch.outer(pos_seq, inv_freq)
    return torch.cat([torch.sin(sinusoid), torch.cos(sinusoid)], dim=-1)


def rel_shift(x):
    """HF TransfoXL _rel_shift on x of shape (qlen, klen, B, H)."""
    zero_pad = torch.zeros((x.shape[0], 1) + tuple(x.shape[2:]))
    x_padded = torch.cat([zero_pad, x], dim=1)
    x_padded = x_padded.reshape((x.shape[1] + 1, x.shape[0]) + tuple(x.shape[2:]))
    return x_padded[1:].reshape(x.shape)


def transfo_xl(q, k, v, u, vb, wr):
    """q (B, qlen, H, D), k and v (B, klen, H, Dv): HF's forward in its (len, B, H, D) layout, causal."""
    B, qlen, H, D = q.shape
    klen = k.shape[1]
    mlen = klen - qlen
    wq, wk, wv = q.permute(1, 0, 2, 3), k.permute(1, 0, 2, 3), v.permute(1, 0, 2, 3)
    pos_emb = positional_embedding(torch.arange(klen - 1, -1, -1.0), wr.shape[1])  # (klen, d_model)
    r_head_k = (pos_emb @ wr.T).reshape(klen, H, D)
    ac = torch.einsum("ibnd,jbnd->ijbn", wq + u, wk)
    bd = rel_shift(torch.einsum("ibnd,jnd->ijbn", wq + vb, r_head_k))
    score = (ac + bd) / math.sqrt(D)
    mask = torch.triu(torch.ones((qlen, klen)), diagonal=1 + mlen).bool()
    score = score.masked_fill(mask[:, :, None, None], -math.inf)
    prob = torch.softmax(score, dim=1)
    out = torch.einsum("ijbn,jbnd->ibnd", prob, wv)
    return out.permute(1, 0, 2, 3)


def main():
    rng = np.random.default_rng(20261201)
    records = []

    def put(prefix, named):
        for name, t in named:
            records.append((prefix + "/" + name, flat(t)))

    def layer_case(name, M, Hq, Hkv, D, Dv, B, S, attend, params):
        x = rand(rng, B, S, M)
        dy = torch.tensor(f32(rng.uniform(-1, 1, size=(B, S, M))))
        rows = [Hq * D, Hkv * D, Hkv * Dv, M]
        cols = [M, M, M, Hq * Dv]
        ws = [rand(rng, rows[i], cols[i], scale=0.6) for i in range(4)]
        bs = [rand(rng, rows[i], scale=0.3) for i in range(4)]
        q = (x @ ws[0].T + bs[0]).reshape(B, S, Hq, D)
        k = (x @ ws[1].T + bs[1]).reshape(B, S, Hkv, D)
        v = (x @ ws[2].T + bs[2]).reshape(B, S, Hkv, Dv)
        o = attend(q, k, v).reshape(B, S, Hq * Dv)
        y = o @ ws[3].T + bs[3]
        y.backward(dy)
        tags = ["q", "k", "v", "o"]
        put(name, [("x", x), ("dy", dy), ("dx", x.grad)])
        put(name, [("w" + t, w) for t, w in zip(tags, ws)] + [("dw" + t, w.grad) for t, w in zip(tags, ws)])
        put(name, [("b" + t, b) for t, b in zip(tags, bs)] + [("db" + t, b.grad) for t, b in zip(tags, bs)])
        put(name, [(p, t) for p, t in params] + [("d" + p, t.grad) for p, t in params])

    # Layer with a clipped relative bias: GQA, Dv != D, causal.
    B, S, K, Hq = 2, 5, 2, 4
    ctab = rand(rng, 2 * K + 1, Hq, scale=0.5)
    idx = torch.tensor([[max(-K, min(K, j - i)) + K for j in range(S)] for i in range(S)])
    layer_case("mha_clipped", 6, Hq, 2, 3, 2, B, S,
               lambda q, k, v: sdpa(q, k, v, bias=ctab[idx].permute(2, 0, 1), causal=True), [("table", ctab)])

    # Layer with Transformer-XL, causal.
    H, D, P = 2, 3, 4
    u, vb, wr = rand(rng, H, D, scale=0.5), rand(rng, H, D, scale=0.5), rand(rng, H * D, P, scale=0.5)
    layer_case("mha_txl", 6, H, H, D, D, B, S, lambda q, k, v: transfo_xl(q, k, v, u, vb, wr),
               [("u", u), ("vb", vb), ("wr", wr)])

    # Transformer-XL attention over a memory, and over a memory cut to memory_length.
    for name, qlen, mlen, kept in (("txl_mem", 4, 3, 3), ("txl_cut", 3, 4, 2)):
        H, D, P = 2, 4, 6
        q = rand(rng, B, qlen, H, D)
        k = rand(rng, B, mlen + qlen, H, D)
        v = rand(rng, B, mlen + qlen, H, D)
        dout = torch.tensor(f32(rng.uniform(-1, 1, size=(B, qlen, H, D))))
        u, vb, wr = rand(rng, H, D, scale=0.5), rand(rng, H, D, scale=0.5), rand(rng, H * D, P, scale=0.5)
        out = transfo_xl(q, k[:, mlen - kept:], v[:, mlen - kept:], u, vb, wr)
        out.backward(dout)
        put(name, [("q", q), ("k", k), ("v", v), ("dout", dout), ("u", u), ("vb", vb), ("wr", wr)])
        put(name, [("dq", q.grad), ("dk", k.grad), ("dv", v.grad), ("du", u.grad), ("dvb", vb.grad), ("dwr", wr.grad)])

    write_golden("multi_head_backward.txt", records,
                 header=__doc__.strip().splitlines()[0] + "\n(tests/golden/gen_multi_head_backward.py)")


if __name__ == "__main__":
    main()
