"""Week 17's checks accept the reference solution and reject every wrong route we could think of.

The reference here is the solution notebook's own code (`load_exercises`), i.e. what a student writes: lib's
functions themselves must be *rejected* by a check (a student could import them under the exercise's name).
Each wrong route gives the right numbers (or would, but for the flaw named) by a route the exercise forbids.
"""
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from grader.checks import week17 as checks
from grader.harness import load_exercises
from lib.attn import attention as lib_attention
from lib.attn import io_model
from lib.attn.attention import check_attention_shapes
from lib.attn.masks import causal_mask

NOTEBOOK = Path(__file__).resolve().parent.parent / "solutions" / "17" / checks.WEEK.notebook


def _variants():
    """tests/week17_variants.py (the tests run with --import-mode=importlib: a sibling is loaded by its path)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("week17_variants", Path(__file__).with_name("week17_variants.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


VARIANTS = _variants()
HONEST, WRONG_SOURCES, variant = VARIANTS.HONEST, VARIANTS.WRONG, VARIANTS.variant


@pytest.fixture(scope="module")
def ex():
    return load_exercises(NOTEBOOK, isolated=False)  # the checks themselves are under test: trusted code, in-process


def _full_scores(q, k, causal, on_cpu=False):
    wide = torch.promote_types(q.dtype, torch.float32)
    s = (q.to(wide) @ k.to(wide).transpose(-1, -2)) * q.shape[-1] ** -0.5
    if causal:
        mask = causal_mask(q.shape[2], k.shape[2]) if on_cpu else causal_mask(q.shape[2], k.shape[2], device=q.device)
        s = s.masked_fill(~mask, float("-inf"))
    return s


# --- wrong routes -------------------------------------------------------------------------------------

def naive_via_sdpa(q, k, v, causal=False):
    check_attention_shapes(q, k, v, causal)
    mask = causal_mask(q.shape[2], k.shape[2], device=q.device) if causal else None
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def naive_mask_on_cpu(q, k, v, causal=False):
    check_attention_shapes(q, k, v, causal)
    return (torch.softmax(_full_scores(q, k, causal, on_cpu=True), -1).to(v.dtype) @ v)


SCORE_TABLE = {(8, 8, 4096, 4096): 4_294_967_296, (8, 8, 1024, 1024): 268_435_456, (1, 1, 1, 300): 1200}


def score_bytes_table(batch, heads, q_len, kv_len, bytes_per_element=4):
    return SCORE_TABLE.get((batch, heads, q_len, kv_len), 0)


def _numpy_attention(q, k, v, causal):
    """Whole-matrix attention in numpy (float64): out, lse, and the probabilities. Out of torch's sight."""
    import numpy as np

    qn, kn, vn = (t.detach().double().numpy() for t in (q, k, v))
    s = qn @ kn.swapaxes(-1, -2) / np.sqrt(qn.shape[-1])
    if causal:
        s = np.where(np.arange(s.shape[-1])[None, :] <= np.arange(s.shape[-2])[:, None] + s.shape[-1] - s.shape[-2],
                     s, -np.inf)
    m = s.max(-1, keepdims=True)
    p = np.exp(s - m)
    lse = m[..., 0] + np.log(p.sum(-1))
    p /= p.sum(-1, keepdims=True)
    return p @ vn, lse, p


def forward_in_numpy(q, k, v, causal=False, block_q=128, block_k=128, visited=None):
    """The right numbers (and the visited blocks), the score matrix whole, in numpy."""
    check_attention_shapes(q, k, v, causal)
    if q.device.type == "meta":
        return torch.empty(q.shape, dtype=q.dtype, device="meta"), torch.empty(q.shape[:3], device="meta")
    nq, nk = q.shape[2], k.shape[2]
    for qs in range(0, nq, block_q):
        for ks in range(0, nk, block_k):
            if visited is not None and not (causal and ks > min(qs + block_q, nq) - 1 + nk - nq):
                visited.append((qs, ks))
    out, lse, _ = _numpy_attention(q, k, v, causal)
    return torch.from_numpy(out).to(q.dtype), torch.from_numpy(lse).float()


def forward_in_numpy_behind_a_tiled_pass(ex):
    """The right numbers from the score matrix whole, in numpy; a real tiled pass beside it, for the observers."""
    def fn(q, k, v, causal=False, block_q=128, block_k=128, visited=None):
        ex.flash_attention_forward(q, k, v, causal, block_q, block_k)
        return forward_in_numpy(q, k, v, causal, block_q, block_k, visited)
    return fn


def online_softmax_full_row(x, chunk_size):
    return torch.softmax(x, -1)


def online_softmax_two_pass(x, chunk_size):  # the max over the whole row first, then a chunked sum
    m = x.amax(-1, keepdim=True)
    l = sum(torch.exp(x[..., s:s + chunk_size] - m).sum(-1, keepdim=True) for s in range(0, x.shape[-1], chunk_size))
    return torch.exp(x - m) / l


def online_softmax_in_numpy(x, chunk_size):  # out of torch's sight: no op reads x
    import numpy as np

    a = x.numpy()
    e = np.exp(a - a.max(-1, keepdims=True))
    return torch.from_numpy(e / e.sum(-1, keepdims=True))


def online_softmax_two_pass_joined(x, chunk_size):
    """The max pass, then the sum pass, every chunk's maximum taken again between them (a terminal read of every
    element at each step), so that no element is left between two of its reads: as many reads as chunks."""
    chunks = range(0, x.shape[-1], chunk_size)
    whole = x.shape[-1] // chunk_size * chunk_size

    def touch():
        x[..., :whole].reshape(*x.shape[:-1], -1, chunk_size).amax(-1)
        if whole < x.shape[-1]:
            x[..., whole:].amax(-1)
    m = torch.full(x.shape[:-1], float("-inf"), dtype=x.dtype)
    for s in chunks:
        m = torch.maximum(m, x[..., s:s + chunk_size].amax(-1))
        touch()
    safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    l = torch.zeros_like(m)
    for s in chunks:
        touch()
        l = l + torch.exp(x[..., s:s + chunk_size] - safe[..., None]).sum(-1)
    return torch.exp(x - safe[..., None]) / l[..., None]


def _visit(nq, nk, causal, block_q, block_k, visited):
    if visited is None:
        return
    for qs in range(0, nq, block_q):
        for ks in range(0, nk, block_k):
            if not causal or ks <= min(qs + block_q, nq) - 1 + nk - nq:
                visited.append((qs, ks))


def forward_naive_plus_lse(q, k, v, causal=False, block_q=128, block_k=128, visited=None):
    check_attention_shapes(q, k, v, causal)
    _visit(q.shape[2], k.shape[2], causal, block_q, block_k, visited)  # reports the right blocks, computes all
    s = _full_scores(q, k, causal)
    return (torch.softmax(s, -1) @ v.to(s.dtype)).to(q.dtype), torch.logsumexp(s, -1)


def forward_tiled_without_skipping(ex):
    def fn(q, k, v, causal=False, block_q=128, block_k=128, visited=None):
        _visit(q.shape[2], k.shape[2], causal, block_q, block_k, visited)
        if not causal or q.dtype != torch.float32:
            return ex.flash_attention_forward(q, k, v, causal, block_q, block_k)
        # computes every block (no skipping), masking the full [Nq, Nk] grid of each block row
        bias = torch.zeros(q.shape[2], k.shape[2], device=q.device)
        bias = bias.masked_fill(~causal_mask(q.shape[2], k.shape[2], device=q.device), float("-inf"))
        outs, lses = [], []
        for qs in range(0, q.shape[2], block_q):
            qi = q[:, :, qs:qs + block_q]
            m = torch.full(qi.shape[:3], float("-inf"))
            l = torch.zeros(qi.shape[:3])
            acc = torch.zeros(qi.shape[:3] + (v.shape[-1],))
            for ks in range(0, k.shape[2], block_k):
                s = qi @ k[:, :, ks:ks + block_k].transpose(-1, -2) * q.shape[-1] ** -0.5 + bias[qs:qs + block_q, ks:ks + block_k]
                m_new = torch.maximum(m, s.amax(-1))
                safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
                p = torch.exp(s - safe[..., None])
                a = torch.exp(m - safe)
                l, acc, m = a * l + p.sum(-1), a[..., None] * acc + p @ v[:, :, ks:ks + block_k], m_new
            outs.append(acc / l[..., None])
            lses.append(m + torch.log(l))
        return torch.cat(outs, 2), torch.cat(lses, 2)
    return fn


def forward_low_precision_state(ex):
    """Tiled, but keeps m, l, acc and lse in fp16/bf16 for half inputs."""
    def fn(q, k, v, causal=False, block_q=128, block_k=128, visited=None):
        if q.dtype in (torch.float16, torch.bfloat16):
            out, lse = ex.flash_attention_forward(q, k, v, causal, block_q, block_k, visited)
            return out, lse.to(q.dtype)
        return ex.flash_attention_forward(q, k, v, causal, block_q, block_k, visited)
    return fn


def forward_mask_on_cpu(ex):
    src = ex.flash_attention_forward
    def fn(q, k, v, causal=False, block_q=128, block_k=128, visited=None):
        if q.device.type != "cpu" and causal:
            torch.arange(3) + torch.zeros(3, device=q.device)  # what a mask built without device= does
        return src(q, k, v, causal, block_q, block_k, visited)
    return fn


def merge_overflowing(outs, lses):
    w = torch.stack([torch.exp(s) for s in lses])  # exp(1e4) = inf
    total = w.sum(0)
    return (w[..., None] / total[..., None] * torch.stack(outs)).sum(0), torch.log(total)


def merge_nan_for_empty(outs, lses):
    lse_all = torch.stack(lses)
    top = lse_all.amax(0)
    w = torch.exp(lse_all - top)  # -inf - -inf = NaN for a row whose every part is... fine; empty part: 0
    total = w.sum(0)
    return (w[..., None] / total[..., None] * torch.stack(outs)).sum(0) * torch.where(
        torch.isinf(lse_all).any(0), torch.nan, 1.0)[..., None], top + torch.log(total)


def backward_by_autograd(q, k, v, out, lse, dout, causal=False, block_q=128, block_k=128):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    with torch.enable_grad():
        o = torch.softmax(_full_scores(q, k, causal).to(q.dtype), -1) @ v
        return torch.autograd.grad(o, (q, k, v), dout)


def backward_in_numpy(q, k, v, out, lse, dout, causal=False, block_q=128, block_k=128, decoys=False):
    """FlashAttention's backward from the saved lse and out, right, but with P whole, in numpy."""
    import numpy as np

    check_attention_shapes(q, k, v, causal)
    if q.device.type == "meta":
        return tuple(torch.empty(t.shape, dtype=t.dtype, device="meta") for t in (q, k, v))
    if decoys:  # torch matmuls of blocks beside it, five a block pair, for the FLOP counter
        for qq in q.detach().float().flatten(0, 2).split(block_q):
            for kk in k.detach().float().flatten(0, 2).split(block_k):
                for _ in range(5):
                    qq @ kk.T
    qn, kn, vn, on, dn = (t.detach().double().numpy() for t in (q, k, v, out, dout))
    scale = 1 / np.sqrt(qn.shape[-1])
    s = qn @ kn.swapaxes(-1, -2) * scale
    if causal:
        s = np.where(np.arange(s.shape[-1])[None, :] <= np.arange(s.shape[-2])[:, None] + s.shape[-1] - s.shape[-2],
                     s, -np.inf)
    p = np.exp(s - lse.detach().double().numpy()[..., None])
    dp = dn @ vn.swapaxes(-1, -2)
    ds = p * (dp - (dn * on).sum(-1, keepdims=True))
    grads = (ds @ kn * scale, ds.swapaxes(-1, -2) @ qn * scale, p.swapaxes(-1, -2) @ dn)
    return tuple(torch.from_numpy(g).to(t.dtype) for g, t in zip(grads, (q, k, v)))


def backward_in_numpy_with_decoy_flops(q, k, v, out, lse, dout, causal=False, block_q=128, block_k=128):
    return backward_in_numpy(q, k, v, out, lse, dout, causal, block_q, block_k, decoys=True)


def backward_recomputes_stats(ex):
    """Tiled and correct on honest inputs, but recomputes lse and out with its own forward."""
    def fn(q, k, v, out, lse, dout, causal=False, block_q=128, block_k=128):
        out2, lse2 = ex.flash_attention_forward(q, k, v, causal, block_q, block_k)
        return ex.flash_attention_backward(q, k, v, out2, lse2, dout, causal, block_q, block_k)
    return fn


def backward_recomputes_out(ex):
    def fn(q, k, v, out, lse, dout, causal=False, block_q=128, block_k=128):
        out2, _ = ex.flash_attention_forward(q, k, v, causal, block_q, block_k)
        return ex.flash_attention_backward(q, k, v, out2, lse, dout, causal, block_q, block_k)
    return fn


class SavesP(torch.autograd.Function):
    """Tiled both ways, but the probabilities of every block are saved for backward: the N×N matrix."""
    @staticmethod
    def forward(ctx, q, k, v, causal=False, block_q=128, block_k=128):
        out, lse = lib_attention.flash_attention_forward(q, k, v, causal, block_q, block_k)
        scale = q.shape[-1] ** -0.5
        rows = []
        for qs in range(0, q.shape[2], block_q):
            row = []
            for ks in range(0, k.shape[2], block_k):
                s = q[:, :, qs:qs + block_q] @ k[:, :, ks:ks + block_k].transpose(-1, -2) * scale
                if causal:
                    s = s.masked_fill(~causal_mask(q.shape[2], k.shape[2])[qs:qs + block_q, ks:ks + block_k], float("-inf"))
                row.append(torch.exp(s - lse[:, :, qs:qs + block_q, None]))
            rows.append(torch.cat(row, -1))
        ctx.save_for_backward(q, k, v, out, torch.cat(rows, -2))
        ctx.blocks = block_q, block_k
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, p = ctx.saved_tensors
        bq, bk = ctx.blocks
        scale = q.shape[-1] ** -0.5
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        delta = (dout * out).sum(-1)
        for qs in range(0, q.shape[2], bq):
            for ks in range(0, k.shape[2], bk):
                pb, do = p[:, :, qs:qs + bq, ks:ks + bk], dout[:, :, qs:qs + bq]
                dv[:, :, ks:ks + bk] += pb.transpose(-1, -2) @ do
                ds = pb * (do @ v[:, :, ks:ks + bk].transpose(-1, -2) - delta[:, :, qs:qs + bq, None])
                dq[:, :, qs:qs + bq] += ds @ k[:, :, ks:ks + bk] * scale
                dk[:, :, ks:ks + bk] += ds.transpose(-1, -2) @ q[:, :, qs:qs + bq] * scale
        return dq, dk, dv, None, None, None


def function_autograd_backward(ex):
    class AutogradBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, causal=False, block_q=128, block_k=128):
            out, lse = ex.flash_attention_forward(q, k, v, causal, block_q, block_k)
            ctx.save_for_backward(q, k, v, out, lse)
            ctx.causal = causal
            return out

        @staticmethod
        def backward(ctx, dout):
            q, k, v, _, _ = ctx.saved_tensors
            return (*backward_by_autograd(q, k, v, None, None, dout, ctx.causal), None, None, None)
    return AutogradBackward


class LibSubclass(lib_attention.FlashAttention):
    pass


def decode_unsplit(ex):
    def fn(q, k, v, n_splits=4):
        return ex.flash_attention_forward(q, k, v, block_k=k.shape[2] or 1)[0]
    return fn


def decode_refuses_empty_splits(ex):
    def fn(q, k, v, n_splits=4):
        if n_splits > k.shape[2]:
            raise ValueError("n_splits must be at most the number of keys")
        return ex.flash_decode(q, k, v, n_splits)
    return fn


# --- the table: exercise -> [(wrong route, what the failure says)] ---------------------------------------

WRONG = {
    "naive_attention": [
        (lambda ex: naive_via_sdpa, "aten._scaled_dot_product"),
        (lambda ex: lib_attention.naive_attention, "lab's reference"),
        (lambda ex: naive_mask_on_cpu, "CPU tensor"),
    ],
    "score_bytes": [
        (lambda ex: lib_attention.score_bytes, "lab's reference"),
        (lambda ex: score_bytes_table, "expected"),
    ],
    "online_softmax": [
        (lambda ex: online_softmax_full_row, "aten._softmax|reduction"),
        (lambda ex: online_softmax_two_pass, "reduction"),
        (lambda ex: lib_attention.online_softmax, "lab's reference"),
        (lambda ex: online_softmax_in_numpy, "never read by a torch op"),
        (lambda ex: online_softmax_two_pass_joined, "visited|read by"),
    ],
    "flash_attention_forward": [
        (lambda ex: forward_naive_plus_lse, "matrix product|reduction"),
        (lambda ex: lib_attention.flash_attention_forward, "lab's reference"),
        (forward_tiled_without_skipping, "FLOPs"),
        (forward_low_precision_state, "dtype"),
        (forward_mask_on_cpu, "CPU tensor"),
        (lambda ex: forward_in_numpy, "counted 0 FLOPs"),
        (forward_in_numpy_behind_a_tiled_pass, "memory beyond the output"),
    ],
    "standard_io": [(lambda ex: io_model.standard_io, "lab's reference")],
    "flash_io": [(lambda ex: io_model.flash_io, "lab's reference")],
    "merge_partials": [
        (lambda ex: merge_overflowing, "NaN|differs"),
        (lambda ex: merge_nan_for_empty, "NaN"),
        (lambda ex: lib_attention.merge_partials, "lab's reference"),
    ],
    "flash_attention_backward": [
        (lambda ex: backward_by_autograd, "aten._softmax|lse shifted"),
        (backward_recomputes_stats, "lse shifted"),
        (backward_recomputes_out, "out perturbed"),
        (lambda ex: lib_attention.flash_attention_backward, "lab's reference"),
        (lambda ex: backward_in_numpy, "counted 0 FLOPs"),
        (lambda ex: backward_in_numpy_with_decoy_flops, "MB at peak"),
    ],
    "FlashAttention": [
        (lambda ex: SavesP, "saved tensors|visited"),
        (function_autograd_backward, "aten._softmax|matrix product|reduction"),
        (lambda ex: LibSubclass, "not a subclass of lib"),
        (lambda ex: lib_attention.FlashAttention, "not a subclass of lib"),
    ],
    "flash_decode": [
        (lambda ex: lambda q, k, v, n_splits=4: ex.naive_attention(q, k, v), "matrix product|reduction"),
        (decode_unsplit, "matrix product|reduction"),
        (decode_refuses_empty_splits, "n_splits must be"),
        (lambda ex: lib_attention.flash_decode, "lab's reference"),
    ],
}


for _name, _routes in WRONG_SOURCES.items():  # tests/week17_variants.py: each also runs in the child (test_week17_routes)
    WRONG[_name] += [(lambda ex, src=src, name=_name: variant(src, name), says) for src, says in _routes.values()]


@pytest.mark.parametrize("name", list(WRONG))
def test_check_accepts_the_reference(ex, name):
    getattr(checks, f"check_{name}")(getattr(ex, name))


@pytest.mark.parametrize("name, i", [(name, i) for name, routes in WRONG.items() for i in range(len(routes))])
def test_check_rejects_wrong_route(ex, name, i):
    make, says = WRONG[name][i]
    with pytest.raises((AssertionError, ValueError), match=says):
        getattr(checks, f"check_{name}")(make(ex))


@pytest.mark.parametrize("name, route", [(name, route) for name, routes in HONEST.items() for route in routes
                                         if name != "flash_attention_forward"])  # those: test_week17_routes, in the child
def test_check_accepts_honest_variants(name, route):
    """Written apart from the solution: softmax and split-K variants (the forward's run through the isolated child)."""
    getattr(checks, f"check_{name}")(variant(HONEST[name][route], name))


def test_every_exercise_has_a_wrong_route():
    quiz = {name for name in checks.WEEK.exercises if name.startswith("answer_")}
    triton = {name for name, (_, section) in checks.WEEK.exercises.items() if section == checks.TRITON}  # their own file
    predicted = {"predict_peak_bytes"}  # its wrong routes: tests/test_week17_predict.py
    assert set(WRONG) == set(checks.WEEK.exercises) - quiz - triton - predicted
