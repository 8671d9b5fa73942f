"""Week 17's predict-then-measure exercise, `predict_peak_bytes`, graded on the student's model (below
`grader.checks.week17`, which registers it): the peak bytes of the tensors one non-causal attention forward allocates
(the inputs, which exist before the call, not counted), naive or tiled, from N, d, the block size, the bytes of an
input element, the batch and the heads; on configurations drawn per run.

The model it is judged against (§1 and §3 of the notebook, what `lib.attn.io_model.TensorMemoryMeter` measures):
- naive: S and P alive at once, plus O — B·H·(2·N² + N·d)·e; up to B·H·(2·N·d·e + 8·N) more is accepted (a scaled
  copy of q, a row statistic);
- tiled: O, then a working set that depends on the block and not on N — at least O plus one float32 block of scores,
  B·H·(N·d·e + 4·block²), at most B·H·(N·d·e + 8·N + 4·(8·block² + 8·block·d + 16·block)) (the logsumexp, a few
  float32 score blocks, the accumulator and a query block).
Every configuration has B·H ≥ 4 and N ≥ 32 blocks, and e of 2 or 4, so each natural mistake misses it: an N² term in
the tiled model, the output left out, one N×N matrix in the naive model, elements instead of bytes, one head of one
batch element, the naive model for the tiled one.
"""
from __future__ import annotations

import torch

from grader.checks import generator, seed_note

FIXED = [  # (what, n, d, block, dtype_bytes, batch, heads)
    ("N = 4096, d = 64, blocks of 256, fp32, B = 1, H = 8 (§7's measurement)", 4096, 64, 256, 4, 1, 8),
    ("N = 8192, d = 128, blocks of 128, bf16, B = 2, H = 16", 8192, 128, 128, 2, 2, 16),
]


def bounds(n: int, d: int, block: int, e: int, b: int, h: int, tiled: bool) -> tuple[int, int]:
    """The bytes a correct model may give (see the module's text)."""
    bh = b * h
    if not tiled:
        lo = bh * (2 * n * n + n * d) * e
        return lo, lo + bh * (2 * n * d * e + 8 * n)
    return (bh * (n * d * e + 4 * block * block),
            bh * (n * d * e + 8 * n + 4 * (8 * block * block + 8 * block * d + 16 * block)))


def cases(offset: int) -> list[tuple]:
    """FIXED, then six configurations drawn from this run's seed."""
    g = generator(offset)
    out = list(FIXED)
    for i in range(6):
        u = [float(x) for x in torch.rand(6, generator=g, dtype=torch.float64)]
        block = (16, 32, 64)[int(3 * u[0])]
        n = block * (32 + int(96 * u[1]))
        d = (32, 48, 64, 80, 96, 128)[int(6 * u[2])]
        e = (2, 4)[int(2 * u[3])]
        b, h = 1 + int(4 * u[4]), 4 + int(29 * u[5])
        out.append((f"drawn configuration {i + 1}", n, d, block, e, b, h))
    return out


def _hint(got: float, n: int, d: int, block: int, e: int, b: int, h: int, tiled: bool) -> str:
    """What a wrong prediction most likely did (the model in outline where no single mistake fits)."""
    bh = b * h
    lo, hi = bounds(n, d, block, e, b, h, tiled)
    if tiled and got >= bh * n * n:
        return ("it grows as N²: the tiled forward never holds a row of scores, only blocks of block_q × block_k, "
                "so beyond its output its memory does not depend on N")
    if got * e >= lo and got * e <= hi:
        return "it counts elements, not bytes (dtype_bytes for the output, 4 bytes for float32 state)"
    if got * bh >= lo and got * bh <= hi:
        return "it is one head of one batch element: every (batch, head) pair has its own scores and output"
    if not tiled and abs(got - bh * n * n * e) <= bh * (2 * n * d * e + 8 * n):
        return "it holds one N×N matrix: S is still alive when softmax writes P, a second N×N matrix"
    if got < lo:
        return ("it leaves something out that must be alive at the peak: the output [B, H, N, d] exists when the last "
                "block is written" + ("" if tiled else ", beside S and P"))
    return ("naive: S and P (each B·H·N² elements of the input's dtype) alive at once, plus O; tiled: O and a working "
            "set of a few float32 blocks that does not grow with N")


def judge(predict_peak_bytes, run) -> None:
    """`run(fn, *args)` calls the student's function, observed and its route judged; returns what it returned."""
    for what, n, d, block, e, b, h in cases(170):
        for tiled in (False, True):
            got = run(predict_peak_bytes, n, d, block, e, b, h, tiled)
            try:
                got = float(got)
            except (TypeError, ValueError):
                raise AssertionError(f"predict_peak_bytes returned {type(got).__name__}; expected a number of "
                                     "bytes") from None
            lo, hi = bounds(n, d, block, e, b, h, tiled)
            assert lo <= got <= hi, (
                f"predict_peak_bytes(n={n}, d={d}, block={block}, dtype_bytes={e}, batch={b}, heads={h}, "
                f"tiled={tiled}) [{what}] = {got:,.0f} bytes, expected {lo:,} to {hi:,}: "
                f"{_hint(got, n, d, block, e, b, h, tiled)} {seed_note()}")
