"""Attention (weeks 16–17).

Shapes: queries `[batch, n_heads, q_len, head_dim]`; keys and values `[batch, n_kv_heads, kv_len, head_dim]`.
With `n_heads == n_kv_heads` this is multi-head attention (MHA); with `n_kv_heads == 1`, multi-query
attention (MQA); anything in between that divides `n_heads` is grouped-query attention (GQA): query
head h reads KV head h // (n_heads // n_kv_heads). One function covers all three.

`causal=True` uses the bottom-right aligned mask of `lib.attn.masks.causal_mask`, so the same call
serves a prefill (q_len == kv_len) and a cached decode step (q_len == 1).
"""
from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F

from lib.attn.masks import causal_mask

# An attention backend: (q, k, v, causal) -> output [batch, n_heads, q_len, head_dim].
AttentionFn = Callable[..., torch.Tensor]


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """`[B, n_kv_heads, T, d]` -> `[B, n_kv_heads * n_rep, T, d]`, each KV head repeated for its query group."""
    if n_rep == 1:
        return x
    b, h, t, d = x.shape
    return x[:, :, None].expand(b, h, n_rep, t, d).reshape(b, h * n_rep, t, d)


def check_attention_shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                           grouped: bool = False) -> None:
    """Raise ValueError, naming the shapes, for inputs no attention function can take.

    q is `[B, H, Nq, d]`, k and v `[B, Hk, Nk, d]` with `Hk == H`, or, with `grouped=True`, any `Hk` dividing `H`.
    """
    shapes = f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"expected q [B, H, Nq, d] and k, v [B, H, Nk, d]; got {shapes}")
    if q.shape[0] != k.shape[0] or k.shape[:3] != v.shape[:3]:
        raise ValueError(f"batch of q, k, v (and heads and length of k and v) must match; got {shapes}")
    if grouped and q.shape[1] % k.shape[1]:
        raise ValueError(f"n_heads ({q.shape[1]}) must be a multiple of n_kv_heads ({k.shape[1]}); got {shapes}")
    if not grouped and q.shape[1] != k.shape[1]:
        raise ValueError(f"q, k and v must have the same number of heads (wrap with expand_kv for GQA); got {shapes}")
    if q.shape[3] != k.shape[3]:
        raise ValueError(f"q and k must have the same head_dim; got {shapes}")
    if causal and q.shape[2] > k.shape[2]:
        raise ValueError(f"causal attention needs Nq <= Nk (the queries are the last Nq of Nk positions); got {shapes}")


def gqa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                  mask: torch.Tensor | None = None) -> torch.Tensor:
    """Scaled dot-product attention with grouped KV heads (MHA, GQA and MQA are this one function).

    `mask` is boolean, broadcastable to `[B, H, q_len, kv_len]`, True where attention is allowed; it
    is combined with the causal mask when both are given. Softmax runs in float32.
    """
    check_attention_shapes(q, k, v, causal, grouped=True)
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
    check_attention_shapes(q, k, v, causal, grouped=True)
    tq, tk = q.shape[2], k.shape[2]
    gqa = q.shape[1] != k.shape[1]
    if causal and mask is None and tq == tk:  # square: let the kernel mask, no [T, T] tensor is built
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    if causal and tq > 1:  # one query (a cached decode step) sees every key: nothing to mask
        cm = causal_mask(tq, tk, device=q.device)
        mask = cm if mask is None else (cm & mask)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)


def expand_kv(fn: AttentionFn) -> AttentionFn:
    """Wrap an attention function that needs as many KV heads as query heads into a GQA backend."""

    def backend(q, k, v, causal=False, **kwargs):
        n_rep = q.shape[1] // k.shape[1]
        return fn(q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), causal=causal, **kwargs)

    backend.__name__ = f"expand_kv({getattr(fn, '__name__', 'attention')})"
    return backend


# --- week 17: FlashAttention --------------------------------------------------------------------------
#
# Same shapes as above but one KV head per query head: q `[B, H, Nq, d]`, k and v `[B, H, Nk, d]`
# (wrap with `expand_kv` for a GQA model). `causal=True` is aligned at the bottom right: query i sees
# keys j <= i + (Nk - Nq). Reference: Dao et al., "FlashAttention: Fast and Memory-Efficient Exact
# Attention with IO-Awareness", NeurIPS 2022 (Algorithm 1, Theorem 2); the backward follows its
# Algorithm 4 with the logsumexp trick of FlashAttention-2 (Dao 2023).


def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False) -> torch.Tensor:
    """Standard attention: materializes the full `[B, H, Nq, Nk]` score and probability matrices."""
    check_attention_shapes(q, k, v, causal)
    scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5  # [B, H, Nq, Nk]
    if causal:
        scores = scores.masked_fill(~causal_mask(q.shape[2], k.shape[2], device=q.device), float("-inf"))
    return torch.softmax(scores, dim=-1) @ v  # [B, H, Nq, dv]


def score_bytes(batch: int, heads: int, q_len: int, kv_len: int, bytes_per_element: int = 4) -> int:
    """Bytes of one `[batch, heads, q_len, kv_len]` score matrix (fp32 by default)."""
    return batch * heads * q_len * kv_len * bytes_per_element


def online_softmax(x: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """Softmax over the last dim, reading `x` in chunks of `chunk_size` with a running max and sum.

    Pass 1 keeps, per row, m = max so far and l = sum of exp(x - m) so far; when a chunk raises the max,
    the old sum is rescaled by exp(m_old - m_new). Pass 2 writes exp(x - m) / l. (Milakov & Gimelshein 2018.)
    """
    m = torch.full(x.shape[:-1], float("-inf"), dtype=x.dtype, device=x.device)
    l = torch.zeros(x.shape[:-1], dtype=x.dtype, device=x.device)
    for start in range(0, x.shape[-1], chunk_size):
        chunk = x[..., start:start + chunk_size]
        m_new = torch.maximum(m, chunk.amax(dim=-1))
        m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)  # all -inf so far: nothing to add
        l = l * torch.exp(m - m_safe) + torch.exp(chunk - m_safe[..., None]).sum(dim=-1)
        m = m_new
    return torch.exp(x - m[..., None]) / l[..., None]


def _causal_block(q_start: int, q_end: int, k_start: int, k_end: int, offset: int) -> str:
    """'skip' if every key of the block is hidden from every query, 'full' if all are visible, else 'mask'."""
    if k_start > q_end - 1 + offset:
        return "skip"
    if k_end - 1 <= q_start + offset:
        return "full"
    return "mask"


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a tiled attention keeps its running max, sum and output in: float32 for fp16/bf16 inputs
    (as FlashAttention's kernels do), the input dtype for float32 and float64."""
    return torch.promote_types(dtype, torch.float32)


def flash_attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                            block_q: int = 128, block_k: int = 128,
                            visited: list | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Tiled attention (Algorithm 1, query blocks outside): returns `out [B, H, Nq, d]` and `lse [B, H, Nq]`.

    Never builds more than a `[B, H, block_q, block_k]` block of scores. `lse` is the per-row logsumexp of
    the scaled, masked scores: what the backward pass and split-K merging need. If `visited` is a list,
    `(q_start, k_start)` is appended for every block of scores computed (blocks wholly above the causal
    diagonal are skipped). fp16/bf16 inputs are accumulated in float32: `out` comes back in q's dtype,
    `lse` in float32 (`accumulation_dtype`). A query with no keys (Nk = 0) gets out 0 and lse -inf.
    """
    check_attention_shapes(q, k, v, causal)
    if block_q < 1 or block_k < 1:
        raise ValueError(f"block_q and block_k must be >= 1; got {block_q}, {block_k}")
    nq, nk, scale = q.shape[2], k.shape[2], q.shape[-1] ** -0.5
    offset = nk - nq
    acc_dtype = accumulation_dtype(q.dtype)
    out = torch.empty(q.shape[:3] + (v.shape[-1],), dtype=q.dtype, device=q.device)  # [B, H, Nq, d]
    lse = torch.empty(q.shape[:3], dtype=acc_dtype, device=q.device)  # [B, H, Nq]
    for qs in range(0, nq, block_q):
        qe = min(qs + block_q, nq)
        qi = q[:, :, qs:qe].to(acc_dtype) * scale  # [B, H, bq, d]
        m = torch.full(qi.shape[:3], float("-inf"), dtype=acc_dtype, device=q.device)  # running max
        l = torch.zeros_like(m)  # running sum of exp(s - m)
        acc = torch.zeros(qi.shape[:3] + (v.shape[-1],), dtype=acc_dtype, device=q.device)  # unnormalized out
        for ks in range(0, nk, block_k):
            ke = min(ks + block_k, nk)
            kind = _causal_block(qs, qe, ks, ke, offset) if causal else "full"
            if kind == "skip":
                break  # key blocks only move further right of the diagonal
            if visited is not None:
                visited.append((qs, ks))
            s = qi @ k[:, :, ks:ke].to(acc_dtype).transpose(-1, -2)  # [B, H, bq, bk]
            if kind == "mask":
                keep = (torch.arange(ks, ke, device=q.device)[None, :]
                        <= torch.arange(qs, qe, device=q.device)[:, None] + offset)  # [bq, bk]
                s = s.masked_fill(~keep, float("-inf"))
            m_new = torch.maximum(m, s.amax(dim=-1))
            m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
            p = torch.exp(s - m_safe[..., None])  # [B, H, bq, bk]
            alpha = torch.exp(m - m_safe)  # rescales what was accumulated under the old max
            l = l * alpha + p.sum(dim=-1)
            acc = acc * alpha[..., None] + p @ v[:, :, ks:ke].to(acc_dtype)
            m = m_new
        l_safe = torch.where(l == 0, torch.ones_like(l), l)  # no key seen: out 0, lse -inf
        out[:, :, qs:qe] = (acc / l_safe[..., None]).to(q.dtype)
        lse[:, :, qs:qe] = torch.where(l == 0, m, m + torch.log(l_safe))
    return out, lse


def flash_attention_backward(q, k, v, out, lse, dout, causal: bool = False, block_q: int = 128,
                             block_k: int = 128) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk, dv from the saved `out` and `lse`, recomputing each block of probabilities (no N×N matrix).

    P = exp(S - lse);  dV = Pᵀ dO;  dP = dO Vᵀ;  dS = P ∘ (dP - D) with D = rowsum(dO ∘ O);
    dQ = dS K · scale;  dK = dSᵀ Q · scale.
    """
    check_attention_shapes(q, k, v, causal)
    nq, nk, scale = q.shape[2], k.shape[2], q.shape[-1] ** -0.5
    offset = nk - nq
    in_dtype, acc_dtype = q.dtype, accumulation_dtype(q.dtype)  # fp16/bf16: accumulate in float32
    q, k, v, out, lse, dout = (t.to(acc_dtype) for t in (q, k, v, out, lse, dout))
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    delta = (dout * out).sum(dim=-1)  # [B, H, Nq]
    for ks in range(0, nk, block_k):
        ke = min(ks + block_k, nk)
        kj, vj = k[:, :, ks:ke], v[:, :, ks:ke]  # [B, H, bk, d]
        for qs in range(0, nq, block_q):
            qe = min(qs + block_q, nq)
            kind = _causal_block(qs, qe, ks, ke, offset) if causal else "full"
            if kind == "skip":
                continue
            qi, doi = q[:, :, qs:qe], dout[:, :, qs:qe]
            s = (qi @ kj.transpose(-1, -2)) * scale  # [B, H, bq, bk]
            if kind == "mask":
                keep = (torch.arange(ks, ke, device=q.device)[None, :]
                        <= torch.arange(qs, qe, device=q.device)[:, None] + offset)
                s = s.masked_fill(~keep, float("-inf"))
            p = torch.exp(s - lse[:, :, qs:qe, None])  # the forward's probabilities, recomputed
            dv[:, :, ks:ke] += p.transpose(-1, -2) @ doi
            dp = doi @ vj.transpose(-1, -2)
            ds = p * (dp - delta[:, :, qs:qe, None])
            dq[:, :, qs:qe] += (ds @ kj) * scale
            dk[:, :, ks:ke] += (ds.transpose(-1, -2) @ qi) * scale
    return dq.to(in_dtype), dk.to(in_dtype), dv.to(in_dtype)


class FlashAttention(torch.autograd.Function):
    """`FlashAttention.apply(q, k, v, causal, block_q, block_k)`: saves q, k, v, out and lse — O(N·d) — not P."""

    @staticmethod
    def forward(ctx, q, k, v, causal=False, block_q=128, block_k=128):
        out, lse = flash_attention_forward(q, k, v, causal, block_q, block_k)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.block_q, ctx.block_k = causal, block_q, block_k
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = flash_attention_backward(q, k, v, out, lse, dout, ctx.causal, ctx.block_q, ctx.block_k)
        return dq, dk, dv, None, None, None


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                    block_q: int = 128, block_k: int = 128, return_lse: bool = False):
    """Tiled exact attention, differentiable through `FlashAttention`; `return_lse=True` gives `(out, lse)`.

    GQA models: `model.attention_fn = expand_kv(flash_attention)`.
    """
    if return_lse:
        return flash_attention_forward(q, k, v, causal, block_q, block_k)
    return FlashAttention.apply(q, k, v, causal, block_q, block_k)


def merge_partials(outs: list[torch.Tensor], lses: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Combine attention over disjoint key sets: out = Σ exp(lse_i - lse) out_i with lse = logsumexp_i lse_i.

    outs: S tensors `[B, H, Nq, d]`, each normalized over its own keys; lses: S tensors `[B, H, Nq]`. A part
    with no keys has lse -inf and contributes nothing (its out is ignored, even if NaN); lses of any size
    (1e4, -1e4) are fine: the largest is subtracted before exponentiating. Returns `(out, lse)`, out in the
    parts' dtype, lse in float32 or wider; a row whose parts are all empty gets out 0 and lse -inf.
    """
    if len(outs) != len(lses) or not outs:
        raise ValueError(f"need one lse per partial output and at least one of each; got {len(outs)} outs, {len(lses)} lses")
    acc_dtype = accumulation_dtype(outs[0].dtype)
    lse_all = torch.stack([s.to(acc_dtype) for s in lses])  # [S, B, H, Nq]
    top = lse_all.amax(dim=0)
    top_safe = torch.where(torch.isinf(top), torch.zeros_like(top), top)
    weights = torch.exp(lse_all - top_safe)  # [S, B, H, Nq]; 0 for empty parts
    total = weights.sum(dim=0)
    lse = top_safe + torch.log(total)  # -inf where every part is empty
    weights = weights / torch.where(total == 0, torch.ones_like(total), total)  # sums to 1 over S (or 0)
    parts = torch.stack([o.to(acc_dtype) for o in outs])  # [S, B, H, Nq, d]
    parts = torch.where(weights[..., None] > 0, parts, torch.zeros_like(parts))  # an empty part's NaN stays out
    return (weights[..., None] * parts).sum(dim=0).to(outs[0].dtype), lse


def flash_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n_splits: int = 4) -> torch.Tensor:
    """Split-K (flash-decoding): attend to `n_splits` chunks of the keys independently, then merge by logsumexp.

    For a decode step (Nq = 1, no mask needed: the query sees every cached key). On a GPU the chunks run
    in parallel on different SMs; here they run one after another, and the answer is the same. The chunks
    are as even as possible (sizes differ by at most 1); with more splits than keys some are empty.
    """
    check_attention_shapes(q, k, v, causal=False)
    nk = k.shape[2]
    if n_splits < 1:
        raise ValueError(f"n_splits must be >= 1; got {n_splits}")
    bounds = [i * nk // n_splits for i in range(n_splits + 1)]
    outs, lses = [], []
    for start, end in zip(bounds[:-1], bounds[1:]):
        o, s = flash_attention_forward(q, k[:, :, start:end], v[:, :, start:end], block_k=max(end - start, 1))
        outs.append(o)
        lses.append(s)
    return merge_partials(outs, lses)[0]


def flash_decode_gqa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n_splits: int = 4) -> torch.Tensor:
    """Split-K decoding for grouped KV heads without copying K and V: q `[B, H, Nq, d]`, k and v `[B, Hkv, Nk, d]`.

    The `H / Hkv` query heads that share a KV head are folded into the query axis (`[B, Hkv, (H/Hkv)·Nq, d]`),
    so each KV head's keys and values are read once for its whole group — `expand_kv(flash_decode)` instead
    repeats them per query head (H / Hkv times the bytes; 3× for SmolLM2). No mask: a decode step.
    """
    check_attention_shapes(q, k, v, grouped=True)
    b, h, nq, d = q.shape
    hkv = k.shape[1]
    out = flash_decode(q.reshape(b, hkv, (h // hkv) * nq, d), k, v, n_splits)  # [B, Hkv, group·Nq, d]
    return out.reshape(b, h, nq, v.shape[-1])
