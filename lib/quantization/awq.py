"""AWQ: activation-aware weight quantization (week 20).

A few input channels carry large activations; their weights matter most. AWQ scales those weight columns up
by s before rounding (and the activations down by s, folded into the previous operation at no cost), which
shrinks their relative rounding error; s = (E|x|)^α per input channel, α found by a grid search that
minimizes the layer's output error on calibration inputs (Lin et al., 2024, §3.2, Eq. 4-5). Then plain
round-to-nearest.

AWQ's second search (its code's `auto_clip`): min/max rounding spends levels on the extremes of each group;
shrinking a group's range clips those few weights but gives every other one a finer step. Per row and group,
`clip_search` tries the range shrunk by r = 1, 1 − 1/n_grid, … (down to 1 − max_shrink) and keeps the r whose
rounded group changes that group's share of the output, x_g·w_gᵀ, the least on the calibration inputs.

    w_eff, alpha = awq_quantize(w, x, bits=3, group_size=64)              # w_eff = Q(W·diag(s))·diag(s)⁻¹
    w_eff, alpha = awq_quantize(w, x, bits=3, group_size=64, clip=True)   # Q with each group's range searched
"""
from __future__ import annotations

import torch

from lib.quantization.gptq import output_error
from lib.quantization.quant import input_column_means, minmax_grid, rtn_quantize, snap


def awq_scales(x_abs_mean: torch.Tensor, alpha: float) -> torch.Tensor:
    """s = (E|x|)^α per input channel, normalized so that sqrt(max·min) = 1 (as in the AWQ code)."""
    s = x_abs_mean.float().clamp_min(1e-5).pow(alpha)
    return s / (s.max() * s.min()).sqrt()


@torch.no_grad()
def clip_search(w: torch.Tensor, x: torch.Tensor, bits: int, group_size: int, n_grid: int = 20,
                max_shrink: float = 0.5) -> torch.Tensor:
    """Round-to-nearest of `w [out, in]` on min/max grids whose range is shrunk per (row, group): each group's
    [lo, hi] becomes [r·lo, r·hi] (weights outside clip to the ends) for the r in 1, 1 − 1/n_grid, …,
    > 1 − max_shrink that minimizes mean((x_g·(w_g − Q(w_g))ᵀ)²) over the inputs `x [n, in]`. r = 1 is plain
    RTN, so no group's output error on `x` is ever larger than RTN's. Returns the dequantized weights."""
    out_f, in_f = w.shape
    if in_f % group_size:
        raise ValueError(f"cols ({in_f}) must be a multiple of group_size ({group_size})")
    x = x.reshape(-1, in_f).float()
    g = w.float().reshape(out_f, in_f // group_size, group_size)  # [out, groups, group]
    xg = x.reshape(-1, in_f // group_size, group_size).transpose(0, 1)  # [groups, n, group]
    lo, hi = g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)
    best, best_err = None, None
    for i in range(max(1, int(round(max_shrink * n_grid)))):
        r = 1 - i / n_grid
        scale, low = minmax_grid(torch.cat([lo * r, hi * r], -1), bits)  # the shrunk range's grid
        q = snap(g.clamp(lo * r, hi * r), scale, low, bits)  # [out, groups, group]
        err = (torch.bmm(xg, (g - q).permute(1, 2, 0)) ** 2).mean(1).T[..., None]  # [out, groups, 1]
        if best is None:
            best, best_err = q, err
        else:
            better = err < best_err
            best, best_err = torch.where(better, q, best), torch.where(better, err, best_err)
    return best.reshape(out_f, in_f).to(w.dtype)


@torch.no_grad()
def awq_quantize(w: torch.Tensor, x: torch.Tensor, bits: int = 4, group_size: int = 64,
                 n_grid: int = 20, clip: bool = False) -> tuple[torch.Tensor, float]:
    """Search α in {0, 1/n_grid, …, (n_grid−1)/n_grid}; return (Q(W·diag(s))·diag(s)⁻¹, best α). α = 0 is RTN.
    `clip`: then, with the best α, Q is `clip_search` of W·diag(s) on the inputs x / s (AWQ's clipping search)."""
    x = x.reshape(-1, x.shape[-1]).float()
    x_abs_mean = x.abs().mean(0)  # [in]
    best, best_err, best_alpha = None, float("inf"), 0.0
    for i in range(n_grid):
        alpha = i / n_grid
        s = awq_scales(x_abs_mean, alpha)  # [in]
        w_eff = rtn_quantize(w.float() * s, bits, group_size) / s
        err = output_error(w, w_eff, x)
        if err < best_err:
            best, best_err, best_alpha = w_eff, err, alpha
    if clip:
        s = awq_scales(x_abs_mean, best_alpha)
        best = clip_search(w.float() * s, x / s, bits, group_size, n_grid) / s
    return best.to(w.dtype), best_alpha


def salient_channels(w: torch.Tensor, x_abs_mean: torch.Tensor, fraction: float, by: str,
                     generator: torch.Generator | None = None) -> torch.Tensor:
    """Indices of the `fraction` of input channels AWQ's Table 1 keeps in full precision, chosen `by`
    "activation" (E|x|), "weight" (the column's mean |w|) or "random"."""
    n = w.shape[1]
    k = max(1, round(fraction * n))
    if by == "activation":
        return x_abs_mean.topk(k).indices
    if by == "weight":
        return w.abs().mean(0).topk(k).indices
    if by == "random":
        return torch.randperm(n, generator=generator, device="cpu")[:k].to(w.device)
    raise ValueError(f"by must be 'activation', 'weight' or 'random', got {by!r}")


def rtn_keep_channels(w: torch.Tensor, keep: torch.Tensor, bits: int, group_size: int) -> torch.Tensor:
    """RTN of `w`, except the input channels `keep`, which stay as they are (mixed precision, AWQ Table 1)."""
    out = rtn_quantize(w, bits, group_size)
    out[:, keep] = w[:, keep]
    return out


def activation_means(model, windows: list[torch.Tensor], names: list[str]) -> dict[str, torch.Tensor]:
    """E|x| per input channel `[in]` of every linear in `names` over the token windows `[1, T]`."""
    return input_column_means(model, windows, names, torch.abs)
