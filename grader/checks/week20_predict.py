"""Week 20's two exercises graded on the student's model of a measurement (below `checks/week20.py`, which
registers them): `predict_rmse` (the RMS error a block format makes, predicted from each block's min and max, on
tensors the student has not seen) and `answer_q9` (the quiz answer, read off a sensitivity measurement).

The measurement `predict_rmse` is judged against is gguf-py's round trip (the oracle of the format checks) on
tensors drawn per run: a distribution family, blocks of very different scales (a few blocks 6-10x the rest, as
outlier rows and blocks are in real weights), a weight-like overall size. The Δ/√12 model (each weight's rounding
error spread evenly over one step Δ of its block's grid) lands within 0.885-1.077x of the measurement on these
families over 600 runs x 10 configurations (with or without the weights that sit exactly on the grid); the bounds
are 0.8-1.25x. Each natural mistake misses them in every
configuration it concerns: the largest error Δ/2 instead of the RMS (1.58x and more), the mean step instead of the
RMS of the steps (0.69x at most: the few large blocks carry the error), an affine grid for a symmetric format or
the other way round (0.39x or 2.7x on the shifted families), the tensor's range instead of each block's, no
square root. Families with heavier tails than Laplace's are left out: there one outlier sets a block's step and the
other weights crowd near the level at 0, so the model over-predicts (Student-t(4): up to 1.23x on Q4_0) — the
notebook shows that case as the model's limit, it is not graded.
"""
from __future__ import annotations

import numpy as np
import torch

from grader.checks import generator, seed_note

PREDICT_TYPES = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1")
PREDICT_BOUNDS = (0.8, 1.25)  # predicted / measured RMSE
SYMMETRIC_FAMILIES = ("normal", "uniform", "laplace")
SHIFTED_FAMILIES = ("offset normal (1 + 0.3·N(0, 1))", "log-normal", "half-normal")


def _family(name: str, g: torch.Generator, n: int) -> torch.Tensor:
    if name == "normal":
        return torch.randn(n, generator=g)
    if name == "uniform":
        return torch.rand(n, generator=g) * 2 - 1
    if name == "laplace":
        u = (torch.rand(n, generator=g) - 0.5) * (1 - 1e-6)  # |u| < 1/2: log1p(-1) would be -inf
        return -torch.sign(u) * torch.log1p(-2 * u.abs())
    if name.startswith("offset"):
        return 1 + 0.3 * torch.randn(n, generator=g)
    if name == "log-normal":
        return torch.exp(0.5 * torch.randn(n, generator=g))
    return torch.randn(n, generator=g).abs()


def predict_cases(offset: int):
    """[(description, x float32 [rows, cols], qtype)]: each type of PREDICT_TYPES on one zero-centred and one
    shifted family, in a random order, with per-block scales (lognormal, 5-15 % of the blocks 6-10x larger)."""
    g = generator(offset)
    out = []
    for qtype in [PREDICT_TYPES[int(i)] for i in torch.randperm(len(PREDICT_TYPES), generator=g)]:
        for families in (SYMMETRIC_FAMILIES, SHIFTED_FAMILIES):
            fam = families[int(torch.randint(len(families), (1,), generator=g))]
            rows, cols = int(torch.randint(32, 65, (1,), generator=g)), 32 * int(torch.randint(32, 65, (1,), generator=g))
            x = _family(fam, g, rows * cols).reshape(-1, 32)
            share, ratio = 0.05 + 0.1 * float(torch.rand(1, generator=g)), 6 + 4 * float(torch.rand(1, generator=g))
            big = torch.rand(x.shape[0], 1, generator=g) < share
            size = 10 ** (-3 + 1.5 * float(torch.rand(1, generator=g)))
            scale = torch.exp(0.5 * torch.randn(x.shape[0], 1, generator=g)) * torch.where(big, ratio, 1.0) * size
            out.append((f"{qtype} on {fam} weights [{rows}, {cols}], {share:.0%} of the blocks {ratio:.1f}x larger",
                        (x * scale).reshape(rows, cols).numpy().astype(np.float32), qtype))
    return out


def measured_rmse(x: np.ndarray, qtype: str) -> float:
    """The RMS error of gguf-py's round trip of `x` through `qtype`."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize

    with np.errstate(all="ignore"):
        back = dequantize(quantize(x, GGMLQuantizationType[qtype]), GGMLQuantizationType[qtype])
    return float(np.sqrt(np.mean((back.astype(np.float64) - x) ** 2)))


def judge_predict_rmse(predict_rmse, run) -> None:
    """`run(fn, *args, what=...)` calls the student's function (observed, lib and gguf-py refused)."""
    lo_bound, hi_bound = PREDICT_BOUNDS
    for desc, x, qtype in predict_cases(1300):
        blocks = x.reshape(-1, 32)
        lo, hi = blocks.min(axis=1), blocks.max(axis=1)
        what = f"predict_rmse(lo, hi, {qtype!r}) for {desc}"
        got = run(predict_rmse, lo.copy(), hi.copy(), qtype, what=what)
        try:
            got = float(got)
        except (TypeError, ValueError):
            raise AssertionError(f"{what}: returned {type(got).__name__}; expected one number, the RMS error "
                                 f"over every weight") from None
        want = measured_rmse(x, qtype)
        assert np.isfinite(got) and lo_bound * want <= got <= hi_bound * want, (
            f"{what}: you predict an RMS error of {got:.4g}; gguf-py's round trip measures {want:.4g} "
            f"({got / want if want else float('inf'):.2f}x; a model within {lo_bound}-{hi_bound}x passes). Each block has "
            f"its own grid: what is its step Δ for {qtype} (symmetric formats: from the largest magnitude; those with "
            f"a minimum: from the range), and what mean square does rounding to the nearest of levels Δ apart "
            f"leave? Average the squares over the blocks before the square root {seed_note()}")


# --- answer_q9 -------------------------------------------------------------------------------------------------

KINDS = {"attn.q_proj": "attn_q", "attn.k_proj": "attn_k", "attn.v_proj": "attn_v", "attn.o_proj": "attn_output",
         "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def q9_cases(offset: int):
    """Measurements like section 6's {tensor type: ΔPPL}: random costs (some negative: noise), and their answer,
    the GGUF names of the two most costly types (the second clear of the third by 0.05 at least)."""
    g = generator(offset)
    found = 0
    while found < 6:
        costs = torch.rand(len(KINDS), generator=g, dtype=torch.float64).pow(2) * 25 - (1.5 if found % 2 else 0)
        delta = dict(zip(KINDS, costs.tolist()))
        ranked = sorted(delta, key=delta.get, reverse=True)
        if delta[ranked[1]] - delta[ranked[2]] >= 0.05:
            found += 1
            yield delta, {KINDS[k] for k in ranked[:2]}


def judge_answer_q9(answer_q9, run) -> None:
    for delta, want in q9_cases(1400):
        what = f"answer_q9({ {k: round(v, 2) for k, v in delta.items()} })"
        got = run(answer_q9, dict(delta), what=what)
        assert isinstance(got, (set, frozenset, list, tuple)), f"{what}: returned {type(got).__name__}; expected a set"
        got = {str(t) for t in got}
        assert got == want, (
            f"{what} = {sorted(got)}: from a measurement of what 3-bit rounding of each tensor type costs (ΔPPL, "
            f"keys as in section 6), return the GGUF names (as in blk.N.<name>.weight: 'attn_q', 'ffn_up', ...) of "
            f"the two types that cost the most — the answer must come from the measurement you are given, not a "
            f"fixed set {seed_note()}")
