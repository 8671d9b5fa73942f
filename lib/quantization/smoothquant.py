"""SmoothQuant: W8A8 with activation outliers migrated into the weights (week 20).

int8 activations with one scale per tensor fail on LLMs: a few input channels carry values far larger than
the rest, set the scale, and leave the ordinary channels a handful of levels. SmoothQuant (Xiao et al., 2023,
Eq. 4) divides each input channel j by s_j = max|X_j|^α / max|W_j|^(1−α) and multiplies the weight column by
s_j — the product is unchanged, the activation outliers shrink, the weights absorb some difficulty.
Here the quantization is simulated (fake-quantized in float32), to measure quality, not speed:

    act_max = activation_absmax(model, windows, names)       # max|x| per input channel, from calibration
    naive = w8a8_model(model)                                 # per-tensor int8 activations, per-channel int8 weights
    smooth = w8a8_model(model, act_max, alpha=0.5)
"""
from __future__ import annotations

import copy

import torch
import torch.nn as nn


def fake_int8(x: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Symmetric int8 round trip with one scale per tensor (dim None) or per slice along `dim`."""
    amax = x.abs().amax() if dim is None else x.abs().amax(dim=dim, keepdim=True)
    scale = (amax / 127).clamp_min(1e-12)
    return torch.clamp(torch.round(x / scale), -127, 127) * scale


class W8A8Linear(nn.Module):
    """y = Q(x / s) · Q(W · s)ᵀ: dynamic per-tensor int8 activations, per-output-channel int8 weights,
    optional smoothing factors `s [in]` (ones: naive W8A8)."""

    def __init__(self, weight: torch.Tensor, smooth: torch.Tensor | None = None):
        super().__init__()
        s = torch.ones(weight.shape[1], device=weight.device) if smooth is None else smooth.to(weight.device)
        self.register_buffer("inv_s", 1.0 / s)
        self.register_buffer("w_q", fake_int8(weight.detach().float() * s, dim=1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(fake_int8(x * self.inv_s), self.w_q)


def smooth_scales(act_max: torch.Tensor, weight: torch.Tensor, alpha: float) -> torch.Tensor:
    """s_j = max|X_j|^α / max|W_j|^(1−α) per input channel j (SmoothQuant Eq. 4)."""
    w_max = weight.detach().abs().amax(0).clamp_min(1e-5)
    return (act_max.clamp_min(1e-5).pow(alpha) / w_max.pow(1 - alpha)).clamp_min(1e-5)


@torch.no_grad()
def activation_absmax(model, windows: list[torch.Tensor], names: list[str]) -> dict[str, torch.Tensor]:
    """max|x| per input channel `[in]` of every linear in `names` over the token windows `[1, T]`."""
    seen: dict[str, torch.Tensor] = {}
    hooks = []
    for name in names:
        def hook(mod, args, out, name=name):
            m = args[0].detach().reshape(-1, args[0].shape[-1]).abs().amax(0)
            seen[name] = torch.maximum(seen[name], m) if name in seen else m
        hooks.append(model.get_submodule(name.rsplit(".", 1)[0]).register_forward_hook(hook))
    try:
        for ids in windows:
            model(ids.to(model.device))
    finally:
        for h in hooks:
            h.remove()
    return seen


# Linears whose smoothing factors must be one vector: 1/s is folded into the operation that feeds them, and q, k, v
# read one RMSNorm's output (as gate and up read another's). o_proj's input is attention's output: with GQA, v_proj
# has fewer outputs than o_proj has inputs, so no 1/s folds into v_proj for it — left unsmoothed, as AutoAWQ does.
SHARED = {"attn": [("q_proj", "k_proj", "v_proj"), ("o_proj",)], "mlp": [("gate_proj", "up_proj"), ("down_proj",)]}
UNSMOOTHED = {"o_proj"}


def w8a8_model(model, act_max: dict[str, torch.Tensor] | None = None, alpha: float = 0.5):
    """A copy of `model` whose block linears are `W8A8Linear`; smoothed, with `act_max` and `alpha` given, by one
    vector s per group of `SHARED` (from the group's joint weight max), o_proj unsmoothed (`UNSMOOTHED`)."""
    memo = {id(p): p for p in model.parameters()}
    other = copy.deepcopy(model, memo)
    for i, layer in enumerate(other.layers):
        for part, parent in (("attn", layer.attn), ("mlp", layer.mlp)):
            for group in SHARED[part]:
                linears = [getattr(parent, name) for name in group]
                s = None
                if act_max is not None and group[0] not in UNSMOOTHED:
                    joint = torch.cat([lin.weight.detach() for lin in linears])  # rows of all: one max per column
                    s = smooth_scales(act_max[f"layers.{i}.{part}.{group[0]}.weight"], joint, alpha)
                for name, lin in zip(group, linears):
                    setattr(parent, name, W8A8Linear(lin.weight, s))
    return other.eval()
