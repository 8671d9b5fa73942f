"""Weight-only quantized linears on torch's CPU kernels, for a faster decode (week 20).

    fast = quantize_linears(model, "int4", group_size=32)   # a copy: every linear and the LM head int4
    ids = generate(fast, prompt, 32)                          # lib.generate works unchanged

- `Int8Linear`: per-output-channel symmetric int8 (`scale = max|w_row| / 127`), `aten._weight_int8pack_mm`.
- `Int4Linear`: per-group asymmetric 4-bit (min/max, the grid of `lib.quant.rtn_quantize(w, 4, group_size)`),
  packed by `aten._convert_weight_to_int4pack_for_cpu`, multiplied by `aten._weight_int4pack_mm_for_cpu`.

Both kernels want bfloat16 activations (with float32 ones they are 4-15x slower; platform-facts.md): the
module casts `x` to bf16 and the result back to `x`'s dtype. Weights are read as 1 or ~0.5 byte each
instead of 4, which is what a memory-bound decode step is waiting for. CPU only (other devices: use the
float path).
"""
from __future__ import annotations

import copy

import torch
import torch.nn as nn


class Int8Linear(nn.Module):
    """y = x Wᵀ with W stored as int8 [out, in] and one bf16 scale per output row."""

    def __init__(self, weight: torch.Tensor):
        super().__init__()
        w = weight.detach().float()
        scale = (w.abs().amax(1) / 127).clamp_min(1e-12)  # [out]
        self.register_buffer("q", torch.round(w / scale[:, None]).to(torch.int8))
        self.register_buffer("scale", scale.to(torch.bfloat16))
        self.in_features, self.out_features = w.shape[1], w.shape[0]

    def dequantized(self) -> torch.Tensor:
        return self.q.float() * self.scale.float()[:, None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).to(torch.bfloat16)
        y = torch.ops.aten._weight_int8pack_mm(flat, self.q, self.scale)
        return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)


class Int4Linear(nn.Module):
    """y = x Wᵀ with W on a 4-bit min/max grid per group of `group_size` inputs, packed for the CPU kernel."""

    def __init__(self, weight: torch.Tensor, group_size: int = 64):
        super().__init__()
        w = weight.detach().float()
        out_f, in_f = w.shape
        if in_f % group_size or group_size not in (32, 64, 128, 256):
            raise ValueError(f"group_size must be 32, 64, 128 or 256 and divide in_features ({in_f}); got {group_size}")
        g = w.reshape(out_f, in_f // group_size, group_size)
        lo = g.amin(-1)
        scale = ((g.amax(-1) - lo) / 15).clamp_min(1e-12)  # [out, groups]
        q = torch.clamp(torch.round((g - lo[..., None]) / scale[..., None]), 0, 15).reshape(out_f, in_f)
        self.register_buffer("packed", torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 8))
        # the kernel computes (q - 8)·scale + zero, so zero = min + 8·scale; layout [groups, out, 2]
        sz = torch.stack([scale, lo + 8 * scale], -1).transpose(0, 1).contiguous()
        self.register_buffer("scale_and_zero", sz.to(torch.bfloat16))
        self.group_size, self.in_features, self.out_features = group_size, in_f, out_f

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).to(torch.bfloat16)
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(flat, self.packed, self.group_size, self.scale_and_zero)
        return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)


def _maker(kind: str, group_size: int):
    if kind == "int8":
        return Int8Linear
    if kind == "int4":
        return lambda w: Int4Linear(w, group_size)
    raise ValueError(f"kind must be 'int8' or 'int4', got {kind!r}")


def quantize_linears(model, kind: str, group_size: int = 32, lm_head: str | None = "same"):
    """A copy of `model` (a lib.model.LlamaModel on the CPU) whose linears are `Int8Linear` (kind "int8") or
    `Int4Linear` (kind "int4"); the tied LM head becomes the same kind (`lm_head="same"`), another kind
    ("int8"/"int4"), or stays float (None). Embedding lookups and norms stay float.

    Group 32 with min/max is Q4_1's own grid: on SmolLM2, whose weights are decoded Q4_1, int4 g32 keeps them
    (up to the bf16 rounding of scale and zero)."""
    if model.device.type != "cpu":
        raise ValueError(f"these are CPU kernels; the model is on {model.device}")
    make = _maker(kind, group_size)
    memo = {id(p): p for p in model.parameters()}  # share every float tensor; only the linears are replaced
    other = copy.deepcopy(model, memo)
    for layer in other.layers:
        for parent in (layer.attn, layer.mlp):
            for name, child in list(parent.named_children()):
                if isinstance(child, nn.Linear):
                    setattr(parent, name, make(child.weight))
    if lm_head is not None:
        head = model.embed.weight if model.lm_head is None else model.lm_head.weight
        other.lm_head = (make if lm_head == "same" else _maker(lm_head, group_size))(head)
    return other.eval()
