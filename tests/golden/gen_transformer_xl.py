# SPDX-License-Identifier: MIT
"""Golden values for Transformer-XL relative attention, written with numpy the
way the reference model computes them (Dai et al. 2019; Hugging Face
TransfoXL `RelPartialLearnableMultiHeadAttn` and `PositionalEmbedding`):
positions klen-1 down to 0, the sinusoids [sin | cos] with the paper's
frequencies 1 / 10000^(2k / d_model), the content term (q + u) . k, the position
term (q + v) . R before the pad-and-shift relative shift, causal mask
triu(diagonal = 1 + mlen). Independent of the C++ code, which indexes R by
distance directly.

Run with /usr/bin/python3 (it has numpy): writes tests/golden/data/transformer_xl.txt.

Records of case <c> (all flattened row-major, our (batch, seq, head, dim) layout):
  <c>_shape              B, qlen, mlen, H, D, d_model, memory_length given to the encoder
  <c>_q, <c>_k, <c>_v    q (B, qlen, H, D); k, v (B, mlen + qlen, H, D) = [memory ; segment]
  <c>_u, <c>_vb, <c>_wr  u, v (H, D); W_R (H * D, d_model)
  <c>_scores             scaled scores after the mask, (B, H, qlen, klen) (-inf masked)
  <c>_out                attention output (B, qlen, H, D)
Case "cut": the encoder keeps memory_length = 2 of the 4 memory tokens given;
its scores and output are those of the model run with the last 2 memory
tokens (HF keeps mems[-mem_len:]), so scores are (B, H, qlen, 2 + qlen).
Case "rtab" has no W_R: the model's R for the distances klen-1 down to 0 is
given directly (a checkpoint storing r_head_k), record <c>_r (klen, H * D) in
that order instead of <c>_wr; <c>_shape's d_model is 0. The same forward,
without the projection of the sinusoids.
"""
import numpy as np

from golden_io import write_golden


def positional_embedding(pos_seq, d_model):
    inv_freq = 1.0 / (10000.0 ** (np.arange(0.0, d_model, 2.0) / d_model))
    sinusoid = np.outer(pos_seq, inv_freq)
    return np.concatenate([np.sin(sinusoid), np.cos(sinusoid)], axis=-1)


def rel_shift(x):
    """HF TransfoXL _rel_shift on x of shape (qlen, klen, B, H)."""
    zero_pad = np.zeros((x.shape[0], 1) + x.shape[2:], dtype=x.dtype)
    x_padded = np.concatenate([zero_pad, x], axis=1)
    x_padded = x_padded.reshape((x.shape[1] + 1, x.shape[0]) + x.shape[2:])
    return x_padded[1:].reshape(x.shape)


def transfo_xl(q, k, v, u, vb, wr, d_model):
    """q (B, qlen, H, D), k and v (B, klen, H, D): HF's forward in its (len, B, H, D) layout."""
    klen = k.shape[1]
    pos_seq = np.arange(klen - 1, -1, -1.0)
    pos_emb = positional_embedding(pos_seq, d_model)  # (klen, d_model)
    return transfo_xl_r(q, k, v, u, vb, pos_emb @ wr.T)


def transfo_xl_r(q, k, v, u, vb, r):
    """The same forward from r_head_k, r (klen, H * D) for the distances klen-1 down to 0."""
    B, qlen, H, D = q.shape
    klen = k.shape[1]
    mlen = klen - qlen
    w_head_q = q.transpose(1, 0, 2, 3)
    w_head_k = k.transpose(1, 0, 2, 3)
    w_head_v = v.transpose(1, 0, 2, 3)
    r_head_k = r.reshape(klen, H, D)
    ac = np.einsum("ibnd,jbnd->ijbn", w_head_q + u, w_head_k)
    bd = rel_shift(np.einsum("ibnd,jnd->ijbn", w_head_q + vb, r_head_k))
    scale = 1.0 / np.sqrt(D)
    score = (ac + bd) * scale
    mask = np.triu(np.ones((qlen, klen)), k=1 + mlen).astype(bool)
    score = np.where(mask[:, :, None, None], -np.inf, score)
    prob = np.exp(score - score.max(axis=1, keepdims=True))
    prob = prob / prob.sum(axis=1, keepdims=True)
    out = np.einsum("ijbn,jbnd->ibnd", prob, w_head_v)
    return score.transpose(2, 3, 0, 1), out.transpose(1, 0, 2, 3)


def case(rng, name, B, qlen, mlen, H, D, d_model, memory_length):
    klen = mlen + qlen
    q = rng.uniform(-1, 1, (B, qlen, H, D))
    k = rng.uniform(-1, 1, (B, klen, H, D))
    v = rng.uniform(-1, 1, (B, klen, H, D))
    u = rng.uniform(-0.5, 0.5, (H, D))
    vb = rng.uniform(-0.5, 0.5, (H, D))
    wr = rng.uniform(-0.5, 0.5, (H * D, d_model))
    kept = mlen if memory_length == 0 else min(mlen, memory_length)
    score, out = transfo_xl(q, k[:, mlen - kept:], v[:, mlen - kept:], u, vb, wr, d_model)
    return [
        (name + "_shape", [B, qlen, mlen, H, D, d_model, memory_length]),
        (name + "_q", q.ravel()), (name + "_k", k.ravel()), (name + "_v", v.ravel()),
        (name + "_u", u.ravel()), (name + "_vb", vb.ravel()), (name + "_wr", wr.ravel()),
        (name + "_scores", score.ravel()), (name + "_out", out.ravel()),
    ]


def case_r(rng, name, B, qlen, mlen, H, D):
    klen = mlen + qlen
    q = rng.uniform(-1, 1, (B, qlen, H, D))
    k = rng.uniform(-1, 1, (B, klen, H, D))
    v = rng.uniform(-1, 1, (B, klen, H, D))
    u = rng.uniform(-0.5, 0.5, (H, D))
    vb = rng.uniform(-0.5, 0.5, (H, D))
    r = rng.uniform(-1, 1, (klen, H * D))
    score, out = transfo_xl_r(q, k, v, u, vb, r)
    return [
        (name + "_shape", [B, qlen, mlen, H, D, 0, 0]),
        (name + "_q", q.ravel()), (name + "_k", k.ravel()), (name + "_v", v.ravel()),
        (name + "_u", u.ravel()), (name + "_vb", vb.ravel()), (name + "_r", r.ravel()),
        (name + "_scores", score.ravel()), (name + "_out", out.ravel()),
    ]


def main():
    rng = np.random.default_rng(20)
    records = []
    records += case(rng, "mem", 2, 5, 3, 3, 4, 6, 0)
    records += case(rng, "nomem", 1, 6, 0, 2, 8, 8, 0)
    records += case(rng, "cut", 2, 3, 4, 2, 4, 10, 2)
    records += case_r(rng, "rtab", 2, 4, 3, 2, 4)
    write_golden("transformer_xl.txt", records,
                 "Transformer-XL relative attention, HF TransfoXL formulas (pad-and-shift).\n"
                 "Written by tests/golden/gen_transformer_xl.py; do not edit.")


if __name__ == "__main__":
    main()
