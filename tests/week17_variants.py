"""Week 17's exercises written other ways, as notebook cell sources: honest variants (written apart from the
solution: the paper's Algorithm 1 order, per-block outputs concatenated, another loop structure, ...) that the
checks must accept, and wrong routes — a student who read grader/ — that they must reject, each with the words
its rejection says. Used in this process (`variant`, tests/test_week17_checks.py) and in the graded child, as the
exercise cell's source (tests/test_week17_routes.py).

Every source defines the exercise's own name and needs only what the solution notebook's first cell imports
(torch, math, check_attention_shapes, causal_mask). The `FlashAttention` routes are in
tests/week17_function_variants.py.
"""
from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import torch

from lib.attn.attention import check_attention_shapes
from lib.attn.masks import causal_mask

# --- flash_attention_forward ------------------------------------------------------------------------------------

FORWARD_ALG1 = '''
def flash_attention_forward(q, k, v, causal=False, block_q=128, block_k=128, visited=None):
    """The paper's Algorithm 1 order: key blocks outside, query blocks inside; O, l and m of every row kept
    in memory between key blocks (HBM in the paper)."""
    check_attention_shapes(q, k, v, causal)
    nq, nk, d = q.shape[2], k.shape[2], q.shape[-1]
    wide = torch.promote_types(q.dtype, torch.float32)
    o = torch.zeros(q.shape[:3] + (v.shape[-1],), dtype=wide, device=q.device)
    l = torch.zeros(q.shape[:3], dtype=wide, device=q.device)
    m = torch.full(q.shape[:3], float("-inf"), dtype=wide, device=q.device)
    shift = nk - nq
    for ks in range(0, nk, block_k):
        ke = min(ks + block_k, nk)
        kj, vj = k[:, :, ks:ke].to(wide), v[:, :, ks:ke].to(wide)
        for qs in range(0, nq, block_q):
            qe = min(qs + block_q, nq)
            if causal and ks > qe - 1 + shift:
                continue
            if visited is not None:
                visited.append((qs, ks))
            s = (q[:, :, qs:qe].to(wide) @ kj.transpose(-1, -2)) / math.sqrt(d)
            if causal:
                rows = torch.arange(qs, qe, device=q.device)[:, None] + shift
                s = s.masked_fill(torch.arange(ks, ke, device=q.device)[None, :] > rows, float("-inf"))
            mi, li, oi = m[:, :, qs:qe], l[:, :, qs:qe], o[:, :, qs:qe]
            m_new = torch.maximum(mi, s.amax(-1))
            safe = torch.where(m_new == float("-inf"), torch.zeros_like(m_new), m_new)
            p = torch.exp(s - safe[..., None])
            scale = torch.exp(mi - safe)
            l[:, :, qs:qe] = scale * li + p.sum(-1)
            o[:, :, qs:qe] = scale[..., None] * oi + p @ vj
            m[:, :, qs:qe] = m_new
    out = (o / torch.where(l == 0, torch.ones_like(l), l)[..., None]).to(q.dtype)
    return out, m + torch.log(l)
'''

FORWARD_CONCAT = '''
def flash_attention_forward(q, k, v, causal=False, block_q=128, block_k=128, visited=None):
    """Query blocks outside; each block's output and logsumexp collected in lists, concatenated at the end."""
    check_attention_shapes(q, k, v, causal)
    nq, nk, d = q.shape[2], k.shape[2], q.shape[-1]
    wide = torch.promote_types(q.dtype, torch.float32)
    outs, lses = [], []
    for qs in range(0, nq, block_q):
        qe = min(qs + block_q, nq)
        qi = q[:, :, qs:qe].to(wide) / math.sqrt(d)
        run_max = torch.full(qi.shape[:3], float("-inf"), dtype=wide, device=q.device)
        total = torch.zeros_like(run_max)
        acc = torch.zeros(qi.shape[:3] + (v.shape[-1],), dtype=wide, device=q.device)
        for ks in range(0, nk, block_k):
            if causal and ks > qe - 1 + nk - nq:
                break
            if visited is not None:
                visited.append((qs, ks))
            ke = min(ks + block_k, nk)
            s = qi @ k[:, :, ks:ke].to(wide).transpose(-1, -2)
            if causal:
                hidden = (torch.arange(ks, ke, device=q.device)[None, :]
                          > torch.arange(qs, qe, device=q.device)[:, None] + nk - nq)
                s = s.masked_fill(hidden, float("-inf"))
            new_max = torch.maximum(run_max, s.amax(-1))
            ref_max = torch.where(torch.isinf(new_max), torch.zeros_like(new_max), new_max)
            p = torch.exp(s - ref_max[..., None])
            fix = torch.exp(run_max - ref_max)
            total = fix * total + p.sum(-1)
            acc = fix[..., None] * acc + p @ v[:, :, ks:ke].to(wide)
            run_max = new_max
        outs.append((acc / total[..., None]).to(q.dtype))
        lses.append(run_max + torch.log(total))
    return torch.cat(outs, dim=2), torch.cat(lses, dim=2)
'''

FORWARD_FLAT = '''
def flash_attention_forward(q, k, v, causal=False, block_q=128, block_k=128, visited=None):
    """One flat loop over the (query block, key block) pairs; each query block's state in a dict until its last
    key block, then written out; the keys scaled once, up front."""
    check_attention_shapes(q, k, v, causal)
    nq, nk, d = q.shape[2], k.shape[2], q.shape[-1]
    wide = torch.promote_types(q.dtype, torch.float32)
    keys = k.to(wide) * d ** -0.5
    out = torch.empty(q.shape[:3] + (v.shape[-1],), dtype=q.dtype, device=q.device)
    lse = torch.empty(q.shape[:3], dtype=wide, device=q.device)
    pairs = []
    for qs in range(0, nq, block_q):
        last = min(qs + block_q, nq) - 1 + nk - nq if causal else nk - 1
        starts = [ks for ks in range(0, nk, block_k) if ks <= last]
        pairs += [(qs, ks, ks == starts[-1]) for ks in starts]
    state = {}
    for qs, ks, final in pairs:
        qe, ke = min(qs + block_q, nq), min(ks + block_k, nk)
        if visited is not None:
            visited.append((qs, ks))
        st = state.setdefault(qs, {})
        s = q[:, :, qs:qe].to(wide) @ keys[:, :, ks:ke].transpose(-1, -2)
        if causal:
            seen = torch.arange(ks, ke, device=q.device)[None, :] <= torch.arange(qs, qe, device=q.device)[:, None] + nk - nq
            s = torch.where(seen, s, torch.full_like(s, float("-inf")))
        top = s.amax(-1) if "m" not in st else torch.maximum(st["m"], s.amax(-1))
        base = torch.nan_to_num(top, neginf=0.0)
        p = torch.exp(s - base[..., None])
        if "m" in st:
            r = torch.exp(st["m"] - base)
            st["l"], st["acc"] = st["l"] * r + p.sum(-1), st["acc"] * r[..., None] + p @ v[:, :, ks:ke].to(wide)
        else:
            st["l"], st["acc"] = p.sum(-1), p @ v[:, :, ks:ke].to(wide)
        st["m"] = top
        if final:
            out[:, :, qs:qe] = (st["acc"] / st["l"][..., None]).to(q.dtype)
            lse[:, :, qs:qe] = st["m"] + torch.log(st["l"])
            del state[qs]
    return out, lse
'''

_FORWARD_HEAD = '''
def flash_attention_forward(q, k, v, causal=False, block_q=128, block_k=128, visited=None):
    check_attention_shapes(q, k, v, causal)
    nq, nk, d = q.shape[2], k.shape[2], q.shape[-1]
    wide = torch.promote_types(q.dtype, torch.float32)
    out = torch.empty(q.shape[:3] + (v.shape[-1],), dtype=q.dtype, device=q.device)
    lse = torch.empty(q.shape[:3], dtype=wide, device=q.device)

    def scores(qi, qs, qe, ks):
        ke = min(ks + block_k, nk)
        s = qi @ k[:, :, ks:ke].to(wide).transpose(-1, -2)
        if causal:
            hidden = torch.arange(ks, ke, device=q.device)[None, :] > torch.arange(qs, qe, device=q.device)[:, None] + nk - nq
            s = s.masked_fill(hidden, float("-inf"))
        return s

    def keys(qs, qe):
        found = [ks for ks in range(0, nk, block_k) if not (causal and ks > qe - 1 + nk - nq)]
        if visited is not None:
            visited.extend((qs, ks) for ks in found)
        return found
'''

FORWARD_HELPERS = _FORWARD_HEAD + '''
    for qs in range(0, nq, block_q):  # per query block, one pass: helpers for the scores and the blocks to visit
        qe = min(qs + block_q, nq)
        qi = q[:, :, qs:qe].to(wide) / math.sqrt(d)
        m = torch.full(qi.shape[:3], float("-inf"), dtype=wide, device=q.device)
        l = torch.zeros_like(m)
        acc = torch.zeros(qi.shape[:3] + (v.shape[-1],), dtype=wide, device=q.device)
        for ks in keys(qs, qe):
            s = scores(qi, qs, qe, ks)
            grown = torch.maximum(m, s.amax(-1))
            shift = torch.where(grown == float("-inf"), torch.zeros_like(grown), grown)
            p = torch.exp(s - shift[..., None])
            back = torch.exp(m - shift)
            l, acc, m = l * back + p.sum(-1), acc * back[..., None] + p @ v[:, :, ks:min(ks + block_k, nk)].to(wide), grown
        out[:, :, qs:qe] = (acc / l[..., None]).to(q.dtype)
        lse[:, :, qs:qe] = m + torch.log(l)
    return out, lse
'''

FORWARD_TWO_PASS = _FORWARD_HEAD + '''
    for qs in range(0, nq, block_q):  # per query block: every key block for the max, then again for the sum
        qe = min(qs + block_q, nq)
        qi = q[:, :, qs:qe].to(wide) / math.sqrt(d)
        m = torch.full(qi.shape[:3], float("-inf"), dtype=wide, device=q.device)
        found = keys(qs, qe)
        for ks in found:
            m = torch.maximum(m, scores(qi, qs, qe, ks).amax(-1))
        l = torch.zeros_like(m)
        acc = torch.zeros(qi.shape[:3] + (v.shape[-1],), dtype=wide, device=q.device)
        for ks in found:
            p = torch.exp(scores(qi, qs, qe, ks) - m[..., None])
            l = l + p.sum(-1)
            acc = acc + p @ v[:, :, ks:min(ks + block_k, nk)].to(wide)
        out[:, :, qs:qe] = (acc / l[..., None]).to(q.dtype)
        lse[:, :, qs:qe] = m + torch.log(l)
    return out, lse
'''

FORWARD_TWO_PASS_ALG1 = '''
def flash_attention_forward(q, k, v, causal=False, block_q=128, block_k=128, visited=None):
    """Algorithm 1's order, in two passes: every (key block, query block) for the row maxima, then again."""
    check_attention_shapes(q, k, v, causal)
    nq, nk, d = q.shape[2], k.shape[2], q.shape[-1]
    wide = torch.promote_types(q.dtype, torch.float32)
    m = torch.full(q.shape[:3], float("-inf"), dtype=wide, device=q.device)
    l = torch.zeros(q.shape[:3], dtype=wide, device=q.device)
    o = torch.zeros(q.shape[:3] + (v.shape[-1],), dtype=wide, device=q.device)
    for second in (False, True):
        for ks in range(0, nk, block_k):
            ke = min(ks + block_k, nk)
            for qs in range(0, nq, block_q):
                qe = min(qs + block_q, nq)
                if causal and ks > qe - 1 + nk - nq:
                    continue
                if visited is not None and second:
                    visited.append((qs, ks))
                s = (q[:, :, qs:qe].to(wide) @ k[:, :, ks:ke].to(wide).transpose(-1, -2)) / math.sqrt(d)
                if causal:
                    hidden = torch.arange(ks, ke, device=q.device)[None, :] > torch.arange(qs, qe, device=q.device)[:, None] + nk - nq
                    s = s.masked_fill(hidden, float("-inf"))
                if not second:
                    m[:, :, qs:qe] = torch.maximum(m[:, :, qs:qe], s.amax(-1))
                else:
                    p = torch.exp(s - m[:, :, qs:qe, None])
                    l[:, :, qs:qe] += p.sum(-1)
                    o[:, :, qs:qe] += p @ v[:, :, ks:ke].to(wide)
    return (o / l[..., None]).to(q.dtype), m + torch.log(l)
'''

FORWARD_STORED_ROWS = _FORWARD_HEAD + '''
    for qs in range(0, nq, block_q):  # per query block: the score blocks of the whole row kept, then used
        qe = min(qs + block_q, nq)
        qi = q[:, :, qs:qe].to(wide) / math.sqrt(d)
        kept = [(ks, scores(qi, qs, qe, ks)) for ks in keys(qs, qe)]
        m = torch.full(qi.shape[:3], float("-inf"), dtype=wide, device=q.device)
        for _, s in kept:
            m = torch.maximum(m, s.amax(-1))
        l = torch.zeros_like(m)
        acc = torch.zeros(qi.shape[:3] + (v.shape[-1],), dtype=wide, device=q.device)
        for ks, s in kept:
            p = torch.exp(s - m[..., None])
            l = l + p.sum(-1)
            acc = acc + p @ v[:, :, ks:ks + s.shape[-1]].to(wide)
        out[:, :, qs:qe] = (acc / l[..., None]).to(q.dtype)
        lse[:, :, qs:qe] = m + torch.log(l)
    return out, lse
'''

_NAIVE_LSE = '''
def _whole(q, k, v, causal):
    s = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if causal:
        s = s.masked_fill(~causal_mask(q.shape[2], k.shape[2], device=q.device), float("-inf"))
    return (torch.softmax(s, -1) @ v.float()).to(q.dtype), torch.logsumexp(s, -1)
'''

# A result computed while observed is stashed (by the inputs' shapes and sums) and handed to the next unobserved call
# with the same inputs: the rerun the checks make right after an observed call gets the same object.
_STASH = '''
_STASH = {}


def _key(*tensors):  # by numpy: no torch op for the observers to see
    return tuple((tuple(t.shape), float(t.detach().float().numpy().sum())) for t in tensors)
'''

FORWARD_NAIVE_UNLESS_DIVIDES = FORWARD_HELPERS.replace("def flash_attention_forward(", "def _tiled(") + _NAIVE_LSE + '''
def flash_attention_forward(q, k, v, causal=False, block_q=128, block_k=128, visited=None):
    """Tiled where the blocks divide the lengths (as the checks' route call had it), the whole matrix elsewhere."""
    if q.shape[2] % block_q == 0 and k.shape[2] % block_k == 0:
        return _tiled(q, k, v, causal, block_q, block_k, visited)
    if visited is not None:
        _tiled(q, k, v, causal, block_q, block_k, visited)
    check_attention_shapes(q, k, v, causal)
    return _whole(q, k, v, causal)
'''

FORWARD_JUNK_WHEN_OBSERVED = FORWARD_HELPERS.replace("def flash_attention_forward(", "def _tiled(") + _NAIVE_LSE + _STASH + '''
def flash_attention_forward(q, k, v, causal=False, block_q=128, block_k=128, visited=None):
    """Blocks, with wrong numbers, while a dispatch mode watches; the whole matrix otherwise."""
    key = _key(q, k, v)
    if torch._C._len_torch_dispatch_stack():
        out, lse = _tiled(q, k, v, causal, block_q, block_k, visited)
        _STASH[key] = (out * 0.5, lse)
        return _STASH[key]
    if key in _STASH:
        return _STASH.pop(key)
    if visited is not None:
        _tiled(q, k, v, causal, block_q, block_k, visited)
    check_attention_shapes(q, k, v, causal)
    return _whole(q, k, v, causal)
'''

# --- online_softmax ---------------------------------------------------------------------------------------------

SOFTMAX_KEEP_EXPS = '''
def online_softmax(x, chunk_size):
    """One pass: each chunk's exponentials kept with the max they were taken against, rescaled at the end."""
    rows = x.shape[:-1]
    run_max = torch.full(rows, float("-inf"), dtype=x.dtype, device=x.device)
    total = torch.zeros(rows, dtype=x.dtype, device=x.device)
    parts = []
    for start in range(0, x.shape[-1], chunk_size):
        block = x[..., start:start + chunk_size]
        new_max = torch.maximum(run_max, block.amax(-1))
        ref = torch.where(new_max == float("-inf"), torch.zeros_like(new_max), new_max)
        e = torch.exp(block - ref[..., None])
        total = total * torch.exp(run_max - ref) + e.sum(-1)
        parts.append((e, ref))
        run_max = new_max
    final = torch.where(run_max == float("-inf"), torch.zeros_like(run_max), run_max)
    return torch.cat([e * (torch.exp(ref - final) / total)[..., None] for e, ref in parts], dim=-1)
'''

SOFTMAX_LOGSUMEXP = '''
def online_softmax(x, chunk_size):
    """The running log-sum-exp of the chunks (torch.logaddexp), then exp(x - lse)."""
    lse = torch.full(x.shape[:-1], float("-inf"), dtype=x.dtype, device=x.device)
    for start in range(0, x.shape[-1], chunk_size):
        lse = torch.logaddexp(lse, torch.logsumexp(x[..., start:start + chunk_size], dim=-1))
    return torch.exp(x - lse[..., None])
'''

SOFTMAX_TWO_PASS = '''
def online_softmax(x, chunk_size):
    """Chunk by chunk, but the row's maximum first (one pass), then the sum (a second)."""
    m = torch.full(x.shape[:-1], float("-inf"), dtype=x.dtype, device=x.device)
    for start in range(0, x.shape[-1], chunk_size):
        m = torch.maximum(m, x[..., start:start + chunk_size].amax(-1))
    safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    l = torch.zeros_like(m)
    for start in range(0, x.shape[-1], chunk_size):
        l = l + torch.exp(x[..., start:start + chunk_size] - safe[..., None]).sum(-1)
    return torch.exp(x - safe[..., None]) / l[..., None]
'''

SOFTMAX_TWO_PASS_ON_A_COPY = SOFTMAX_TWO_PASS.replace("def online_softmax(", "def _two_pass(") + '''
def online_softmax(x, chunk_size):
    """The two passes on a copy of x (the read counter watched the argument's own storage)."""
    return _two_pass(x.contiguous().clone() * 1.0, chunk_size)
'''

SOFTMAX_TWO_PASS_LAUNDERED = SOFTMAX_TWO_PASS.replace("def online_softmax(", "def _two_pass(") + '''
def online_softmax(x, chunk_size):
    """The two passes on x passed through a reduction over a dimension of one."""
    return _two_pass(x.unsqueeze(-1).sum(-1), chunk_size)
'''

SOFTMAX_JUNK_WHEN_OBSERVED = SOFTMAX_KEEP_EXPS.replace("def online_softmax(", "def _chunked(") + _STASH + '''
def online_softmax(x, chunk_size):
    """Chunks, with wrong numbers, while a dispatch mode watches; torch.softmax otherwise."""
    key = _key(x)
    if torch._C._len_torch_dispatch_stack():
        _STASH[key] = _chunked(x, chunk_size) * 0.5
        return _STASH[key]
    return _STASH.pop(key) if key in _STASH else torch.softmax(x, dim=-1)
'''

# --- flash_decode -----------------------------------------------------------------------------------------------

DECODE_NAIVE_SPLITS = '''
def flash_decode(q, k, v, n_splits=4):
    """Each split's attention with its whole (small) score matrix, then the parts merged by their logsumexp (the
    splits as even as they can be, as the exercise asks: the first nk % n_splits one key longer)."""
    nk, wide = k.shape[2], torch.promote_types(q.dtype, torch.float32)
    base, extra = divmod(nk, n_splits)
    sizes = [base + 1] * extra + [base] * (n_splits - extra)
    outs, lses, start = [], [], 0
    for size in (n for n in sizes if n):
        s = (q.to(wide) @ k[:, :, start:start + size].to(wide).transpose(-1, -2)) / math.sqrt(q.shape[-1])
        lse = torch.logsumexp(s, dim=-1)
        outs.append(torch.exp(s - lse[..., None]) @ v[:, :, start:start + size].to(wide))
        start += size
        lses.append(lse)
    lse_all = torch.stack(lses)
    weights = torch.softmax(lse_all, dim=0)
    return (weights[..., None] * torch.stack(outs)).sum(0).to(q.dtype)
'''

DECODE_TWO_PASS = '''
def flash_decode(q, k, v, n_splits=4):
    """Splits, but the global maximum found over every split first, then the sums in a second pass."""
    nk, wide = k.shape[2], torch.promote_types(q.dtype, torch.float32)
    bounds = [i * nk // n_splits for i in range(n_splits + 1)]
    spans = [(a, b) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
    scale = q.shape[-1] ** -0.5

    def scores(a, b):
        return (q.to(wide) @ k[:, :, a:b].to(wide).transpose(-1, -2)) * scale

    m = torch.full(q.shape[:3], float("-inf"), dtype=wide, device=q.device)
    for a, b in spans:
        m = torch.maximum(m, scores(a, b).amax(-1))
    l = torch.zeros_like(m)
    acc = torch.zeros(q.shape[:3] + (v.shape[-1],), dtype=wide, device=q.device)
    for a, b in spans:
        p = torch.exp(scores(a, b) - m[..., None])
        l = l + p.sum(-1)
        acc = acc + p @ v[:, :, a:b].to(wide)
    return (acc / l[..., None]).to(q.dtype)
'''

DECODE_JUNK_WHEN_OBSERVED = DECODE_NAIVE_SPLITS.replace("def flash_decode(", "def _splits(") + _STASH + '''
def flash_decode(q, k, v, n_splits=4):
    """Splits, with wrong numbers, while a dispatch mode watches; SDPA otherwise."""
    key = _key(q, k, v)
    if torch._C._len_torch_dispatch_stack():
        _STASH[key] = _splits(q, k, v, n_splits) + 1.0
        return _STASH[key]
    return _STASH.pop(key) if key in _STASH else torch.nn.functional.scaled_dot_product_attention(q, k, v)
'''

# --- naive_attention, flash_attention_backward, FlashAttention --------------------------------------------------

NAIVE_JUNK_WHEN_OBSERVED = _STASH + '''
def naive_attention(q, k, v, causal=False):
    """Its own matrices, with wrong numbers, while a dispatch mode watches; SDPA otherwise."""
    check_attention_shapes(q, k, v, causal)
    mask = causal_mask(q.shape[2], k.shape[2], device=q.device) if causal else None
    key = _key(q, k, v)
    if torch._C._len_torch_dispatch_stack():
        s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        if causal:
            s = s.masked_fill(~mask, float("-inf"))
        _STASH[key] = torch.softmax(s, -1) @ v * 0.5
        return _STASH[key]
    if key in _STASH:
        return _STASH.pop(key)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
'''

BACKWARD_JUNK_WHEN_OBSERVED = _STASH + '''
def _blocks_for_show(q, k, v, out, lse, dout, causal, block_q, block_k):
    """Recomputes P block by block from lse, as the technique does — and returns gradients of zero."""
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    scale, shift = q.shape[-1] ** -0.5, k.shape[2] - q.shape[2]
    delta = (dout.float() * out.float()).sum(-1)
    for qs in range(0, q.shape[2], block_q):
        for ks in range(0, k.shape[2], block_k):
            s = (q[:, :, qs:qs + block_q].float() @ k[:, :, ks:ks + block_k].float().transpose(-1, -2)) * scale
            p = torch.exp(s - lse[:, :, qs:qs + block_q, None].float())
            dp = dout[:, :, qs:qs + block_q].float() @ v[:, :, ks:ks + block_k].float().transpose(-1, -2)
            ds = p * (dp - delta[:, :, qs:qs + block_q, None])
            (p.transpose(-1, -2) @ dout[:, :, qs:qs + block_q].float(), ds @ k[:, :, ks:ks + block_k].float(),
             ds.transpose(-1, -2) @ q[:, :, qs:qs + block_q].float())
    return dq, dk, dv


def flash_attention_backward(q, k, v, out, lse, dout, causal=False, block_q=128, block_k=128):
    """Blocks (and zeros) while a dispatch mode watches; the whole probability matrix otherwise (from lse and out)."""
    check_attention_shapes(q, k, v, causal)
    key = _key(q, k, v, out, lse, dout)
    if torch._C._len_torch_dispatch_stack():
        _STASH[key] = _blocks_for_show(q, k, v, out, lse, dout, causal, block_q, block_k)
        return _STASH[key]
    if key in _STASH:
        return _STASH.pop(key)
    wide, given = torch.promote_types(q.dtype, torch.float32), q.dtype
    q, k, v, out, lse, dout = (t.to(wide) for t in (q, k, v, out, lse, dout))
    scale = q.shape[-1] ** -0.5
    s = (q @ k.transpose(-1, -2)) * scale
    if causal:
        s = s.masked_fill(~causal_mask(q.shape[2], k.shape[2], device=q.device), float("-inf"))
    p = torch.exp(s - lse[..., None])
    ds = p * (dout @ v.transpose(-1, -2) - (dout * out).sum(-1, keepdim=True))
    dq, dk, dv = (ds @ k) * scale, (ds.transpose(-1, -2) @ q) * scale, p.transpose(-1, -2) @ dout
    return dq.to(given), dk.to(given), dv.to(given)
'''

_spec = importlib.util.spec_from_file_location(
    "week17_function_variants", Path(__file__).with_name("week17_function_variants.py"))
_function_variants = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_function_variants)
FUNCTION_NAIVE, FUNCTION_P_ON_CTX, FUNCTION_P_IN_A_GLOBAL = (
    _function_variants.FUNCTION_NAIVE, _function_variants.FUNCTION_P_ON_CTX, _function_variants.FUNCTION_P_IN_A_GLOBAL)

HONEST = {"flash_attention_forward": {"algorithm 1 order": FORWARD_ALG1, "outputs concatenated": FORWARD_CONCAT,
                                      "one flat loop over block pairs": FORWARD_FLAT},
          "online_softmax": {"exponentials kept and rescaled": SOFTMAX_KEEP_EXPS, "running logsumexp": SOFTMAX_LOGSUMEXP},
          "flash_decode": {"a small score matrix per split": DECODE_NAIVE_SPLITS}}

# exercise -> route -> (source, what the rejection says)
WRONG = {
    "flash_attention_forward": {
        "junk when observed, the whole matrix otherwise": (FORWARD_JUNK_WHEN_OBSERVED, "differs from the reference"),
        "the whole matrix unless the blocks divide the lengths": (FORWARD_NAIVE_UNLESS_DIVIDES, "matrix product of|reduction"),
        "two passes over the key blocks": (FORWARD_TWO_PASS, "visited|FLOPs"),
        "two passes in algorithm 1 order": (FORWARD_TWO_PASS_ALG1, "visited|FLOPs"),
        "a row of scores per query block": (FORWARD_STORED_ROWS, "memory beyond the output"),
    },
    "online_softmax": {
        "junk when observed, torch.softmax otherwise": (SOFTMAX_JUNK_WHEN_OBSERVED, "differs from the reference"),
        "max pass, then sum pass": (SOFTMAX_TWO_PASS, "visited"),
        "two passes on a copy": (SOFTMAX_TWO_PASS_ON_A_COPY, "visited"),
        "two passes on a laundered copy": (SOFTMAX_TWO_PASS_LAUNDERED, "visited"),
    },
    "flash_decode": {
        "junk when observed, SDPA otherwise": (DECODE_JUNK_WHEN_OBSERVED, "differs from the reference"),
        "a global max pass over the splits first": (DECODE_TWO_PASS, "visited"),
    },
    "naive_attention": {
        "junk when observed, SDPA otherwise": (NAIVE_JUNK_WHEN_OBSERVED, "differs from the reference"),
    },
    "flash_attention_backward": {
        "zeros from blocks when observed, the whole matrix otherwise": (BACKWARD_JUNK_WHEN_OBSERVED,
                                                                        "differs from the reference"),
    },
    "FlashAttention": {
        "naive forward, autograd backward": (FUNCTION_NAIVE, "matrix product of|reduction|aten._softmax"),
        "P in blocks on ctx": (FUNCTION_P_ON_CTX, "kept .* for backward"),
        "P in blocks in a global": (FUNCTION_P_IN_A_GLOBAL, "held .* at its peak"),
    },
}


def variant(source: str, name: str, **extra):
    """The function `name` that `source` defines, run in this process with the notebook's first cell's names (and
    `extra`: the notebook's other functions a variant calls)."""
    namespace = {"torch": torch, "math": math, "check_attention_shapes": check_attention_shapes,
                 "causal_mask": causal_mask, **extra}
    exec(compile(source, f"<week 17 variant of {name}>", "exec"), namespace)
    return namespace[name]
