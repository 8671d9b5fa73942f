"""AWQ: activation-aware weight quantization (week 20).

A few input channels carry large activations; their weights matter most. AWQ scales those weight columns up
by s before rounding (and the activations down by s, folded into the previous operation at no cost), which
shrinks their relative rounding error; s = (E|x|)^α per input channel, α found by a grid search that
minimizes the layer's output error on calibration inputs (Lin et al., 2024, §3.2, Eq. 4-5). Then plain
round-to-nearest.

    w_eff, alpha = awq_quantize(w, x, bits=3, group_size=64)   # w_eff = Q(W·diag(s))·diag(s)⁻¹
"""
from __future__ import annotations

import torch

from lib.gptq import output_error
from lib.quant import input_column_means, rtn_quantize


def awq_scales(x_abs_mean: torch.Tensor, alpha: float) -> torch.Tensor:
    """s = (E|x|)^α per input channel, normalized so that sqrt(max·min) = 1 (as in the AWQ code)."""
    s = x_abs_mean.float().clamp_min(1e-5).pow(alpha)
    return s / (s.max() * s.min()).sqrt()


@torch.no_grad()
def awq_quantize(w: torch.Tensor, x: torch.Tensor, bits: int = 4, group_size: int = 64,
                 n_grid: int = 20) -> tuple[torch.Tensor, float]:
    """Search α in {0, 1/n_grid, …, (n_grid−1)/n_grid}; return (Q(W·diag(s))·diag(s)⁻¹, best α). α = 0 is RTN."""
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
