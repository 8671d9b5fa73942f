"""GPTQ: quantize a linear layer column by column, compensating each column's rounding error in the columns
not yet quantized, with the inverse Hessian of the layer's reconstruction error (week 20).

    x = collect_inputs(model, ids, names)["layers.3.mlp.up_proj.weight"]   # [tokens, in] calibration inputs
    w_q = gptq_quantize(w, x, bits=4, group_size=64)                        # dequantized, same shape as w

The objective is the layer's output on calibration inputs, ||X Wᵀ − X Ŵᵀ||², a quadratic in each row of Ŵ with
Hessian H = 2 XᵀX / n (Frantar et al., 2023, §3). Quantizing column j leaves an error e_j = (w_j − q_j)/[H⁻¹]_jj
that the remaining columns absorb: w_{j+1:} −= e_j · [H⁻¹]_{j, j+1:}. With the upper Cholesky factor U of H⁻¹
(H⁻¹ = UᵀU), row j of U holds exactly those coefficients for the columns after j — so one factorization serves
every step ("Cholesky reformulation", §3 step 3). Damping λ = 1 % of the mean diagonal keeps H invertible.
Columns go in blocks of 128 (or one group, if larger) whose updates to later columns are applied once per block (lazy batch updates).
Groups of `group_size` columns get their min/max grid from the weights as updated when the group starts.
"""
from __future__ import annotations

import torch

from lib.quantization.quant import minmax_grid, snap


def hessian(x: torch.Tensor) -> torch.Tensor:
    """H = 2 XᵀX / n for calibration inputs `x [n, in]` (float32)."""
    x = x.reshape(-1, x.shape[-1]).float()
    return 2.0 * x.T @ x / x.shape[0]


@torch.no_grad()
def gptq_quantize(w: torch.Tensor, x: torch.Tensor, bits: int = 4, group_size: int = 64, damp: float = 0.01,
                  block_size: int | None = None, act_order: bool = False) -> torch.Tensor:
    """GPTQ of `w [out, in]` on calibration inputs `x [n, in]`: returns the dequantized weights (`w`'s dtype,
    shape and device), each group of `group_size` columns on a `bits`-bit min/max grid per row.

    `act_order`: quantize the columns in order of decreasing H_jj (the inputs with the most energy first, while
    the most later columns remain to absorb their error; GPTQ's "act-order"). The groups are then consecutive
    columns *in that order* (a stored model keeps each column's group index, `g_idx`)."""
    out_f, in_f = w.shape
    if block_size is None:  # 128 columns, or whole groups when a group is larger
        block_size = group_size * max(1, 128 // group_size)
    if x.shape[-1] != in_f:
        raise ValueError(f"x has {x.shape[-1]} features, w has {in_f} input columns")
    if in_f % group_size or block_size % group_size:
        raise ValueError(f"group_size ({group_size}) must divide the columns ({in_f}) and block_size ({block_size})")
    W = w.detach().float().clone()
    H = hessian(x.to(W.device))
    dead = torch.diag(H) == 0  # inputs that are always 0: their weights do not matter
    H = H + torch.diag(dead.to(H.dtype))
    W = W * ~dead
    perm = None
    if act_order:
        perm = torch.argsort(torch.diag(H), descending=True)
        W, H = W[:, perm], H[perm][:, perm]
    H += damp * torch.diag(H).mean() * torch.eye(in_f, device=W.device)
    U = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(H)), upper=True)  # H⁻¹ = UᵀU
    Q = torch.zeros_like(W)
    for b0 in range(0, in_f, block_size):
        b1 = min(b0 + block_size, in_f)
        W1, E1, U1 = W[:, b0:b1].clone(), torch.zeros_like(W[:, b0:b1]), U[b0:b1, b0:b1]
        for j in range(b1 - b0):
            if j % group_size == 0:  # a new group: its grid from the weights as they are now
                scale, lo = minmax_grid(W1[:, j:j + group_size], bits)  # [out, 1]
            q = snap(W1[:, j:j + 1], scale, lo, bits)[:, 0]
            Q[:, b0 + j] = q
            err = (W1[:, j] - q) / U1[j, j]
            W1[:, j:] -= err[:, None] * U1[j, j:][None, :]  # compensate inside the block
            E1[:, j] = err
        W[:, b1:] -= E1 @ U[b0:b1, b1:]  # and, once per block, in every later column
    if perm is not None:
        Q = Q[:, torch.argsort(perm)]
    return Q.to(w.dtype)


@torch.no_grad()
def collect_inputs(model, ids: torch.Tensor, names: list[str]) -> dict[str, torch.Tensor]:
    """The inputs `[tokens, in]` that the linears whose weights are `names` see when `model` reads `ids [1, T]`."""
    seen: dict[str, torch.Tensor] = {}
    hooks = []
    for name in names:
        module = model.get_submodule(name.rsplit(".", 1)[0])
        hooks.append(module.register_forward_hook(
            lambda mod, args, out, name=name: seen.__setitem__(name, args[0].detach().reshape(-1, args[0].shape[-1]))))
    try:
        model(ids.to(model.device))
    finally:
        for h in hooks:
            h.remove()
    return seen


def output_error(w: torch.Tensor, w_q: torch.Tensor, x: torch.Tensor) -> float:
    """Mean squared error of the layer's outputs on `x`: mean((X Wᵀ − X Ŵᵀ)²)."""
    return float(((x.float() @ (w.float() - w_q.float()).T) ** 2).mean())
