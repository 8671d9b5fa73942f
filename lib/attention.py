"""Attention (weeks 16–17).

Shapes: queries `[batch, n_heads, q_len, head_dim]`; keys and values `[batch, n_kv_heads, kv_len, head_dim]`.
With `n_heads == n_kv_heads` this is multi-head attention (MHA); with `n_kv_heads == 1`, multi-query
attention (MQA); anything in between that divides `n_heads` is grouped-query attention (GQA): query
head h reads KV head h // (n_heads // n_kv_heads). One function covers all three.

`causal=True` uses the bottom-right aligned mask of `lib.kv_cache.causal_mask`, so the same call
serves a prefill (q_len == kv_len) and a cached decode step (q_len == 1).
"""
from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F

from lib.kv_cache import causal_mask

# An attention backend: (q, k, v, causal) -> output [batch, n_heads, q_len, head_dim].
AttentionFn = Callable[..., torch.Tensor]


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """`[B, n_kv_heads, T, d]` -> `[B, n_kv_heads * n_rep, T, d]`, each KV head repeated for its query group."""
    if n_rep == 1:
        return x
    b, h, t, d = x.shape
    return x[:, :, None].expand(b, h, n_rep, t, d).reshape(b, h * n_rep, t, d)


def _check_gqa_shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    if q.dim() != 4 or k.dim() != 4 or v.shape != k.shape:
        raise ValueError(f"expected q [B, H, Tq, d], k and v [B, Hkv, Tk, d]; got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}, v {tuple(v.shape)}")
    if q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3] or q.shape[1] % k.shape[1] != 0:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)}: batch and head_dim must match and "
                         f"n_heads ({q.shape[1]}) must be a multiple of n_kv_heads ({k.shape[1]})")


def gqa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                  mask: torch.Tensor | None = None) -> torch.Tensor:
    """Scaled dot-product attention with grouped KV heads (MHA, GQA and MQA are this one function).

    `mask` is boolean, broadcastable to `[B, H, q_len, kv_len]`, True where attention is allowed; it
    is combined with the causal mask when both are given. Softmax runs in float32.
    """
    _check_gqa_shapes(q, k, v)
    b, h, tq, d = q.shape
    hkv, tk = k.shape[1], k.shape[2]
    group = h // hkv
    # Fold each group of query heads into the query axis: no copy of K or V is made.
    qg = q.reshape(b, hkv, group * tq, d)  # [B, Hkv, group*Tq, d]
    scores = (qg @ k.transpose(-1, -2)) / math.sqrt(d)  # [B, Hkv, group*Tq, Tk]
    scores = scores.reshape(b, h, tq, tk).float()
    allowed = None
    if causal:
        allowed = causal_mask(tq, tk, device=q.device)
    if mask is not None:
        allowed = mask if allowed is None else allowed & mask
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(v.dtype)  # [B, H, Tq, Tk]
    out = probs.reshape(b, hkv, group * tq, tk) @ v  # [B, Hkv, group*Tq, d]
    return out.reshape(b, h, tq, d)


def sdpa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                   mask: torch.Tensor | None = None) -> torch.Tensor:
    """PyTorch's fused `scaled_dot_product_attention`, with the lab's bottom-right causal convention."""
    _check_gqa_shapes(q, k, v)
    tq, tk = q.shape[2], k.shape[2]
    if causal:
        cm = causal_mask(tq, tk, device=q.device)
        mask = cm if mask is None else (cm & mask)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=q.shape[1] != k.shape[1])


def expand_kv(fn: AttentionFn) -> AttentionFn:
    """Wrap an attention function that needs as many KV heads as query heads into a GQA backend."""

    def backend(q, k, v, causal=False, **kwargs):
        n_rep = q.shape[1] // k.shape[1]
        return fn(q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), causal=causal, **kwargs)

    backend.__name__ = f"expand_kv({getattr(fn, '__name__', 'attention')})"
    return backend
