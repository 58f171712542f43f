# SPDX-License-Identifier: MIT
"""Golden values for the absolute encoders (sinusoidal, learned), written from
docs/formulas.md sections 1 and 2 with numpy in float64. Run with /usr/bin/python3;
writes tests/golden/data/absolute.txt."""
import numpy as np

from golden_io import write_golden

POSITIONS = [0, 1, 17, 4095, 65535]
WIDTHS = [1, 2, 3, 7, 8, 512]


def timing_interleaved(p, d, base):
    """docs/formulas.md 1.1: column c uses k = c // 2; sin on even, cos on odd columns."""
    c = np.arange(d)
    w = np.power(float(base), -2.0 * (c // 2) / d)
    ang = float(p) * w
    return np.where(c % 2 == 0, np.sin(ang), np.cos(ang))


def timing_concat_t2t(p, d, base):
    """docs/formulas.md 1.2: n = d // 2 timescales, divisor max(n - 1, 1), zero column if d is odd."""
    n = d // 2
    k = np.arange(n)
    w = np.exp(k * -(np.log(float(base)) / max(n - 1, 1)))  # log_timescale_increment as in tensor2tensor
    ang = float(p) * w
    row = np.concatenate([np.sin(ang), np.cos(ang)])
    if d % 2:
        row = np.concatenate([row, [0.0]])
    return row


def timing_concat_paper(p, d, base):
    """docs/formulas.md 1.3: ceil(d/2) sines then floor(d/2) cosines, w_k = base^(-2k/d)."""
    ks = np.arange((d + 1) // 2)
    kc = np.arange(d // 2)
    ws = np.power(float(base), -2.0 * ks / d)
    wc = np.power(float(base), -2.0 * kc / d)
    return np.concatenate([np.sin(float(p) * ws), np.cos(float(p) * wc)])


LAYOUTS = {
    "interleaved": timing_interleaved,
    "concat_t2t": timing_concat_t2t,
    "concat_paper": timing_concat_paper,
}


def fairseq_make_positions(tokens, padding_idx, past_len=0):
    """docs/formulas.md 1.4: padding_idx + past_len + running count of real tokens; padding gets padding_idx."""
    real = (tokens != padding_idx).astype(np.int64)
    return (np.cumsum(real, axis=1) + past_len) * real + padding_idx


def mask_positions(mask, seq, padding_position):
    """docs/formulas.md 2.1 / 3.4: cumsum(mask) - 1 at attended slots, the given id at padding; last `seq` columns."""
    pos = np.cumsum(mask, axis=1) - 1
    pos = np.where(mask != 0, pos, padding_position)
    return pos[:, mask.shape[1] - seq:]


def learned_table(rows, d):
    """The deterministic table the C++ tests build the same way."""
    r = np.arange(rows)[:, None].astype(np.float64)
    c = np.arange(d)[None, :].astype(np.float64)
    return np.sin(0.37 * r + 1.3 * c) + 0.05 * c - 0.01 * r


def interpolate(table, new_rows, align_corners):
    """docs/formulas.md 2.3: source coordinate per output row, then np.interp per column."""
    L = table.shape[0]
    t = np.arange(new_rows, dtype=np.float64)
    if align_corners:
        x = np.zeros(new_rows) if new_rows == 1 else t * (L - 1) / (new_rows - 1)
    else:
        x = np.maximum((t + 0.5) * L / new_rows - 0.5, 0.0)
    src = np.arange(L, dtype=np.float64)
    return np.stack([np.interp(x, src, table[:, c]) for c in range(table.shape[1])], axis=1)


def main():
    rec = []
    for name, fn in LAYOUTS.items():
        for d in WIDTHS:
            for p in POSITIONS:
                rec.append(("sinusoidal.%s.d%d.p%d" % (name, d, p), fn(p, d, 10000)))
        # another base
        for p in [0, 1, 17, 4095]:
            rec.append(("sinusoidal.%s.base500.d8.p%d" % (name, p), fn(p, 8, 500)))

    # fairseq padding offset (padding_idx 1): right- and left-padded rows, then a decode step.
    tokens = np.array([[5, 6, 7, 8, 1, 1], [1, 1, 9, 10, 11, 12]], dtype=np.int64)
    pos = fairseq_make_positions(tokens, 1)
    rec.append(("fairseq.tokens", tokens.ravel()))
    rec.append(("fairseq.positions", pos.ravel()))
    pe = np.stack([np.zeros(8) if q == 1 else timing_concat_t2t(q, 8, 10000) for q in pos.ravel()])
    rec.append(("fairseq.pe.d8", pe.ravel()))
    rec.append(("fairseq.positions.past3", fairseq_make_positions(tokens, 1, past_len=3).ravel()))

    # learned tables: rows 10, d 5.
    W = learned_table(10, 5)
    rec.append(("learned.table", W.ravel()))
    # BART / mBART: offset 2, positions past_len + s (past_len 3, 4 tokens).
    bart_rows = 3 + np.arange(4) + 2
    rec.append(("learned.bart.rows", bart_rows))
    rec.append(("learned.bart.pe", W[bart_rows].ravel()))
    # RoBERTa: padding_idx 1, rows from the token ids (offset 0).
    rob_tokens = np.array([[0, 7, 8, 2, 1, 1], [1, 1, 0, 9, 9, 2]], dtype=np.int64)
    rob_rows = fairseq_make_positions(rob_tokens, 1)
    rec.append(("learned.roberta.tokens", rob_tokens.ravel()))
    rec.append(("learned.roberta.rows", rob_rows.ravel()))
    rec.append(("learned.roberta.pe", W[rob_rows].ravel()))
    # OPT: cumsum(mask) * mask - 1 + 2 (padding reads row 1); prefill and one decode step.
    opt_mask = np.array([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]], dtype=np.int64)
    opt_rows = mask_positions(opt_mask, 6, -1) + 2
    rec.append(("learned.opt.mask", opt_mask.ravel()))
    rec.append(("learned.opt.rows", opt_rows.ravel()))
    rec.append(("learned.opt.pe", W[opt_rows].ravel()))
    opt_step = mask_positions(opt_mask, 1, -1) + 2
    rec.append(("learned.opt.step.rows", opt_step.ravel()))
    # GPT-2 generation with left padding: cumsum(mask) - 1, 1 at padding, offset 0.
    gpt2_rows = mask_positions(opt_mask, 6, 1)
    rec.append(("learned.gpt2.rows", gpt2_rows.ravel()))
    rec.append(("learned.gpt2.pe", W[gpt2_rows].ravel()))

    # Interpolation of a 7 x 3 table in both modes.
    T = learned_table(7, 3)
    rec.append(("interp.table", T.ravel()))
    for new_rows in [1, 2, 4, 7, 12, 20]:
        for ac in [0, 1]:
            rec.append(("interp.ac%d.n%d" % (ac, new_rows), interpolate(T, new_rows, bool(ac)).ravel()))

    write_golden("absolute.txt", rec,
                 header="Absolute encodings (sinusoidal, learned): tests/golden/gen_absolute.py\n"
                        "from docs/formulas.md sections 1 and 2, numpy float64.")


if __name__ == "__main__":
    main()
