# SPDX-License-Identifier: MIT
"""Golden values for a tiny BERT-like model: word + position + token type
embeddings, LayerNorm, one self-attention layer (projections, softmax attention
over the non-padding keys, output projection), then the residual and
LayerNorm of BERT's self-output. Computed with plain torch ops in float64.

Run with /usr/bin/python3 (Debian's python3-torch). Writes tests/golden/data/mha.txt.

The weights come from a seeded numpy RNG and are rounded to float32 first, so
that a float program reads exactly the values used here. Records (read by
tests/golden/mha.tests.cpp):
  config                 vocab max_positions type_vocab model_dim heads batch seq
  input_ids, token_type_ids  (batch, seq)
  lengths                (batch): tokens that are not padding
  word_embeddings        (vocab, model_dim)
  position_embeddings    (max_positions, model_dim)
  token_type_embeddings  (type_vocab, model_dim)
  embeddings_ln_gamma, embeddings_ln_beta, output_ln_gamma, output_ln_beta  (model_dim)
  layer_norm_eps
  wq wk wv wo            (model_dim, model_dim), nn.Linear layout (out, in)
  bq bk bv bo            (model_dim)
  embeddings             (batch, seq, model_dim): LayerNorm(word + position + type)
  attention_output       (batch, seq, model_dim): output projection of the attention
  layer_output           (batch, seq, model_dim): LayerNorm(attention_output + embeddings)
"""
import numpy as np
import torch

from golden_io import write_golden

VOCAB, MAX_POS, TYPES, MODEL, HEADS = 24, 16, 2, 16, 4
BATCH, SEQ = 2, 7
LENGTHS = [7, 5]
EPS = 1e-12  # BERT's layer_norm_eps


def main():
    rng = np.random.default_rng(20240611)

    def weights(*shape, scale=0.3):
        return rng.normal(0.0, scale, size=shape).astype(np.float32).astype(np.float64)

    word = weights(VOCAB, MODEL, scale=0.5)
    pos = weights(MAX_POS, MODEL, scale=0.5)
    typ = weights(TYPES, MODEL, scale=0.5)
    ln1_g = 1.0 + weights(MODEL, scale=0.1)
    ln1_b = weights(MODEL, scale=0.1)
    ln2_g = 1.0 + weights(MODEL, scale=0.1)
    ln2_b = weights(MODEL, scale=0.1)
    ln1_g = ln1_g.astype(np.float32).astype(np.float64)
    ln2_g = ln2_g.astype(np.float32).astype(np.float64)
    w = {n: weights(MODEL, MODEL) for n in ("wq", "wk", "wv", "wo")}
    b = {n: weights(MODEL, scale=0.1) for n in ("bq", "bk", "bv", "bo")}
    ids = rng.integers(0, VOCAB, size=(BATCH, SEQ))
    types = rng.integers(0, TYPES, size=(BATCH, SEQ))
    for bi, n in enumerate(LENGTHS):
        ids[bi, n:] = 0  # the padding token
        types[bi, n:] = 0

    t = lambda a: torch.tensor(a, dtype=torch.float64)
    ids_t = torch.tensor(ids)
    types_t = torch.tensor(types)
    positions = torch.arange(SEQ)
    x = t(word)[ids_t] + t(pos)[positions][None, :, :] + t(typ)[types_t]
    emb = torch.nn.functional.layer_norm(x, (MODEL,), t(ln1_g), t(ln1_b), EPS)

    head_dim = MODEL // HEADS

    def heads(y):  # (batch, seq, model) -> (batch, heads, seq, head_dim)
        return y.view(BATCH, SEQ, HEADS, head_dim).transpose(1, 2)

    q = heads(emb @ t(w["wq"]).T + t(b["bq"]))
    k = heads(emb @ t(w["wk"]).T + t(b["bk"]))
    v = heads(emb @ t(w["wv"]).T + t(b["bv"]))
    scores = q @ k.transpose(-1, -2) / np.sqrt(head_dim)
    visible = torch.arange(SEQ)[None, :] < torch.tensor(LENGTHS)[:, None]  # (batch, key)
    scores = scores.masked_fill(~visible[:, None, None, :], float("-inf"))
    ctx = torch.softmax(scores, dim=-1) @ v  # (batch, heads, seq, head_dim)
    ctx = ctx.transpose(1, 2).reshape(BATCH, SEQ, MODEL)
    attn = ctx @ t(w["wo"]).T + t(b["bo"])
    out = torch.nn.functional.layer_norm(attn + emb, (MODEL,), t(ln2_g), t(ln2_b), EPS)

    records = [
        ("config", [VOCAB, MAX_POS, TYPES, MODEL, HEADS, BATCH, SEQ]),
        ("input_ids", ids.ravel()),
        ("token_type_ids", types.ravel()),
        ("lengths", LENGTHS),
        ("word_embeddings", word.ravel()),
        ("position_embeddings", pos.ravel()),
        ("token_type_embeddings", typ.ravel()),
        ("embeddings_ln_gamma", ln1_g),
        ("embeddings_ln_beta", ln1_b),
        ("output_ln_gamma", ln2_g),
        ("output_ln_beta", ln2_b),
        ("layer_norm_eps", [EPS]),
    ]
    records += [(n, w[n].ravel()) for n in ("wq", "wk", "wv", "wo")]
    records += [(n, b[n]) for n in ("bq", "bk", "bv", "bo")]
    records += [
        ("embeddings", emb.numpy().ravel()),
        ("attention_output", attn.numpy().ravel()),
        ("layer_output", out.numpy().ravel()),
    ]
    header = ("Tiny BERT-like embeddings + one self-attention layer: tests/golden/gen_mha.py\n"
              "torch %s, float64; weights from numpy default_rng(20240611), rounded to float32." % torch.__version__)
    print(write_golden("mha.txt", records, header))


if __name__ == "__main__":
    main()
