"""Week 17, section 8: the Triton checks accept the solution's kernels and reject each wrong route, named.

Each wrong route is the solution notebook's own cell with one flaw written in (`_variant`: a text replacement,
asserted to apply), or a wrapper that computes the answer some other way, run in this process under Triton's
interpreter (lib.attn.triton_attention sets TRITON_INTERPRET=1 where there is no GPU). A few also go through the
isolated child, as `pytest weeks/17` grades a student.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import lib.attn.triton_attention as lib_triton  # sets TRITON_INTERPRET=1 without a GPU, before any @triton.jit below
from grader.checks import week17 as checks
from grader.checks import week17_triton as tri
from grader.harness import load_exercises, with_cell_source
from grader.notebook import remember_source

NOTEBOOK = Path(__file__).resolve().parent.parent / "solutions" / "17" / checks.WEEK.notebook

interpreter_only = pytest.mark.skipif(not tri.interpreting(), reason="the kernel-route checks watch Triton's interpreter")


def _cell(grade_id: str) -> str:
    for cell in json.loads(NOTEBOOK.read_text())["cells"]:
        if cell["metadata"].get("nbgrader", {}).get("grade_id") == grade_id:
            return "".join(cell["source"])
    raise KeyError(grade_id)


def _namespace() -> dict:
    import triton
    import triton.language as tl

    return {"torch": torch, "triton": triton, "tl": tl, "kernel_device": lib_triton.kernel_device,
            "check_triton_attention_shapes": lib_triton.check_triton_attention_shapes, "np": np}


def _variant_source(name: str, *edits: tuple[str, str], extra: str = "") -> str:
    """The solution's cell for `name` with each (old, new) replaced once, plus `extra` code."""
    src = _cell(name)
    for old, new in edits:
        assert src.count(old) == 1, f"the edit {old!r} does not apply to the solution cell {name} (it changed?)"
        src = src.replace(old, new)
    return src + "\n" + extra


def _variant(name: str, *edits: tuple[str, str], extra: str = ""):
    """`_variant_source`'s cell, run: its function."""
    ns = _namespace()
    text = _variant_source(name, *edits, extra=extra)
    exec(compile(text, remember_source(f"<wrong {name}>", text.splitlines()), "exec"), ns)
    return ns[name]


# softmax_rows as one program that loops over every row (right numbers; its grid gives it away)
ONE_PROGRAM_FOR_ALL_ROWS = (("    row = tl.program_id(0)\n", "    for row in range(0, N_ROWS):\n"),
                            ("    cols = tl.arange(0, BLOCK)\n", "        cols = tl.arange(0, BLOCK)\n"),
                            ("    inside = cols < n_cols\n", "        inside = cols < n_cols\n"),
                            ("    x = tl.load(", "        x = tl.load("),
                            ("    e = tl.exp(", "        e = tl.exp("),
                            ("    tl.store(", "        tl.store("),
                            ("so1, BLOCK: tl.constexpr)", "so1, N_ROWS, BLOCK: tl.constexpr)"),
                            ("[(x.shape[0],)]", "[(1,)]"),
                            ("out.stride(1),\n", "out.stride(1), x.shape[0],\n"))


# --- wrong routes -------------------------------------------------------------------------------------

def softmax_torch(x):
    return torch.softmax(x.float(), -1).to(x.dtype)


def softmax_numpy(x):
    a = x.double().numpy()
    e = np.exp(a - a.max(axis=1, keepdims=True))
    return torch.from_numpy(e / e.sum(axis=1, keepdims=True)).to(x.dtype)


def matmul_torch(a, b, block_m=16, block_n=16, block_k=16):
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"cannot multiply {tuple(a.shape)} by {tuple(b.shape)}")
    return a @ b


def attention_torch(q, k, v, causal=False, block_m=16, block_n=16):
    lib_triton.check_triton_attention_shapes(q, k, v, causal)
    out, lse = tri.float64_attention(q, k, v, causal)
    return out.to(q.dtype), lse.float()


FORGED_DOTS = """
_kernel_only = tiled_matmul
def tiled_matmul(a, b, block_m=16, block_n=16, block_k=16):
    from triton.runtime import interpreter
    c = _kernel_only(a, b, block_m, block_n, block_k)
    zero = lambda r, s: interpreter.TensorHandle(np.zeros((r, s), np.float32), tl.float32)
    for _ in range(triton.cdiv(a.shape[0], block_m) * triton.cdiv(b.shape[1], block_n) * triton.cdiv(a.shape[1], block_k)):
        interpreter.InterpreterBuilder.create_dot(interpreter.interpreter_builder, zero(block_m, block_k),
                                                  zero(block_k, block_n), zero(block_m, block_n), None, None)
    c.numpy()[...] = a.numpy().astype(np.float64) @ b.numpy().astype(np.float64)
    return c
"""

SOFTMAX_OF_NUMPY = """
_kernel_only = softmax_rows
def softmax_rows(x):
    a = x.numpy().astype(np.float64)
    return _kernel_only(torch.from_numpy(a - a.max(1, keepdims=True)).to(x.dtype))
"""

SOFTMAX_OF_NUMPY_IN_X = """
_kernel_only = softmax_rows
def softmax_rows(x):
    saved = x.numpy().copy()
    x.numpy()[...] = saved - saved.max(1, keepdims=True) - 1.0
    out = _kernel_only(x)
    x.numpy()[...] = saved
    return out
"""

NUMPY_EXP = """
def _numpy_exp(t):
    from triton.runtime import interpreter
    return tl.core.tensor(interpreter.TensorHandle(np.exp(t.handle.data), tl.float32), t.type)
"""

NUMPY_ATTENTION = """
_kernel_only = flash_attention_triton
def flash_attention_triton(q, k, v, causal=False, block_m=16, block_n=16):
    out, lse = _kernel_only(q, k, v, causal, block_m, block_n)
    Q, K, V = (t.numpy().astype(np.float64) for t in (q, k, v))
    s = Q @ np.swapaxes(K, -1, -2) / np.sqrt(Q.shape[-1])
    if causal:
        s = np.where(np.tri(s.shape[-2], s.shape[-1], s.shape[-1] - s.shape[-2], dtype=bool), s, -np.inf)
    mx = s.max(-1, keepdims=True)
    p = np.exp(s - mx)
    out.numpy()[...] = (p / p.sum(-1, keepdims=True)) @ V
    lse.numpy()[...] = (mx + np.log(p.sum(-1, keepdims=True)))[..., 0]
    return out, lse
"""

TWO_PASS = """    for start_n in range(0, end, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        kt = tl.load(k_ptr + b * skb + h * skh + cols[None, :] * skn + dims[:, None] * skd, mask=cols[None, :] < NK,
                     other=0.0).to(tl.float32)
        s = tl.where(cols[None, :] < NK, tl.dot(q, kt) * scale, float("-inf"))
        if CAUSAL:
            s = tl.where(cols[None, :] <= rows[:, None] + (NK - NQ), s, float("-inf"))
        m = tl.maximum(m, tl.max(s, axis=1))
    for start_n in range(0, end, BLOCK_N):
"""

OUTER_PRODUCTS = """        s = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for j in range(0, D):
            qj = tl.load(q_ptr + b * sqb + h * sqh + rows * sqm + j * sqd, mask=rows < NQ, other=0.0).to(tl.float32)
            kj = tl.load(k_ptr + b * skb + h * skh + cols * skn + j * skd, mask=cols < NK, other=0.0).to(tl.float32)
            s += qj[:, None] * kj[None, :]
        s = s * scale + 0.0 * tl.dot(q, kt)
"""

TWICE = """
_kernel_only = flash_attention_triton
def flash_attention_triton(q, k, v, causal=False, block_m=16, block_n=16):
    _kernel_only(q, k, v, causal, block_m, block_n)
    return _kernel_only(q, k, v, causal, block_m, block_n)
"""

WATCH_DETECTED = """
_kernel_only = softmax_rows
def softmax_rows(x):
    import sys
    if sys.getprofile() is None:  # not the observed call: torch, without the kernel's care for edges
        return torch.softmax(x.float(), -1).to(x.dtype)
    return _kernel_only(x)
"""

ANSWER_AS_CONSTEXPR = """
@triton.jit
def _smuggled(x_ptr, out_ptr, n_cols, sx0, sx1, so0, so1, VALS: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    y = tl.zeros((BLOCK,), dtype=tl.float32) + 0 * tl.load(x_ptr + row * sx0 + cols * sx1, mask=cols < n_cols, other=0.0)
    for i in tl.static_range(len(VALS)):
        y = tl.where(row * n_cols + cols == i, VALS[i], y)
    tl.store(out_ptr + row * so0 + cols * so1, y.to(out_ptr.dtype.element_ty), mask=cols < n_cols)

def softmax_rows(x):
    a = x.numpy().astype(np.float64)
    e = np.exp(a - a.max(1, keepdims=True))
    vals = tuple(float(v) for v in (e / e.sum(1, keepdims=True)).ravel())
    out = torch.empty(x.shape, dtype=x.dtype)
    _smuggled[(x.shape[0],)](x, out, x.shape[1], x.stride(0), x.stride(1), out.stride(0), out.stride(1),
                             VALS=vals, BLOCK=triton.next_power_of_2(x.shape[1]))
    return out
"""

STATIC_TWO_PASS = """
@triton.jit
def _two_pass(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, H, NQ, NK, scale, sqb, sqh, sqm, sqd, skb, skh, skn, skd,
              svb, svh, svn, svd, sob, soh, som, sod, NB: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr,
              BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    b, h = tl.program_id(1) // H, tl.program_id(1) % H
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, D)
    q = tl.load(q_ptr + b * sqb + h * sqh + rows[:, None] * sqm + dims[None, :] * sqd, mask=rows[:, None] < NQ, other=0.0).to(tl.float32)
    end = NK
    if CAUSAL:
        end = tl.minimum(NK, tl.program_id(0) * BLOCK_M + BLOCK_M + NK - NQ)
    scores = []
    m = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    for j in tl.static_range(NB):  # pass 1: every score block, kept
        cols = j * BLOCK_N + tl.arange(0, BLOCK_N)
        vis = j * BLOCK_N < end
        kt = tl.load(k_ptr + b * skb + h * skh + cols[None, :] * skn + dims[:, None] * skd,
                     mask=(cols[None, :] < NK) & vis, other=0.0).to(tl.float32)
        s = tl.full((BLOCK_M, BLOCK_N), float("-inf"), dtype=tl.float32)
        if vis:
            s = tl.dot(q, kt) * scale
        keep = cols[None, :] < NK
        if CAUSAL:
            keep = keep & (cols[None, :] <= rows[:, None] + (NK - NQ))
        s = tl.where(keep, s, float("-inf"))
        scores.append(s)
        m = tl.maximum(m, tl.max(s, axis=1))
    l = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, D), dtype=tl.float32)
    for j in tl.static_range(NB):  # pass 2: the exact max known, nothing rescaled
        cols = j * BLOCK_N + tl.arange(0, BLOCK_N)
        vis = j * BLOCK_N < end
        v = tl.load(v_ptr + b * svb + h * svh + cols[:, None] * svn + dims[None, :] * svd,
                    mask=(cols[:, None] < NK) & vis, other=0.0).to(tl.float32)
        p = tl.exp(scores[j] - m[:, None])
        l += tl.sum(p, axis=1)
        if vis:
            acc += tl.dot(p, v)
    tl.store(o_ptr + b * sob + h * soh + rows[:, None] * som + dims[None, :] * sod,
             (acc / l[:, None]).to(o_ptr.dtype.element_ty), mask=rows[:, None] < NQ)
    tl.store(lse_ptr + tl.program_id(1) * NQ + rows, m + tl.log(l), mask=rows < NQ)

def flash_attention_triton(q, k, v, causal=False, block_m=16, block_n=16):
    check_triton_attention_shapes(q, k, v, causal)
    bsz, heads, nq, d = q.shape
    out = torch.empty_like(q)
    lse = torch.empty((bsz, heads, nq), dtype=torch.float32)
    _two_pass[(triton.cdiv(nq, block_m), bsz * heads)](q, k, v, out, lse, heads, nq, k.shape[2], d ** -0.5,
        *q.stride(), *k.stride(), *v.stride(), *out.stride(), NB=triton.cdiv(k.shape[2], block_n), D=d,
        BLOCK_M=block_m, BLOCK_N=block_n, CAUSAL=causal)
    return out, lse
"""

RANK_ONE = """        for kk in range(0, BLOCK_K):  # outer products of one column of a and one row of b; a dot of ones
            a_col = tl.sum(tl.where(tl.arange(0, BLOCK_K)[None, :] == kk, a.to(tl.float32), 0.0), axis=1)
            b_row = tl.sum(tl.where(tl.arange(0, BLOCK_K)[:, None] == kk, b.to(tl.float32), 0.0), axis=0)
            acc += a_col[:, None] * b_row[None, :]
        acc = acc * tl.dot(tl.full((BLOCK_M, BLOCK_K), 1.0, tl.float32), tl.full((BLOCK_K, BLOCK_N), 1.0, tl.float32)) / BLOCK_K
"""

def _unless_96(wrong):
    """`wrong`, except on calls with q_len 96 (the shape the check's technique calls used): the solution there."""
    honest = _variant("flash_attention_triton")

    def flash_attention_triton(q, k, v, causal=False, block_m=16, block_n=16):
        return (honest if q.shape[2] == 96 else wrong)(q, k, v, causal, block_m, block_n)
    return flash_attention_triton


WRONG = {
    "softmax_rows": [
        (lambda: softmax_torch, "torch arithmetic"),
        (lambda: softmax_numpy, "torch arithmetic|no Triton kernel"),
        (lambda: lib_triton.softmax_rows, "lab's reference"),
        (lambda: _variant("softmax_rows", ('other=float("-inf")', "other=0.0")), r"softmax_rows\(x \[3, 37\]\)"),
        (lambda: _variant("softmax_rows", ("tl.exp(x - tl.max(x, axis=0))", "tl.exp(x)")), "1e4|NaN"),
        (lambda: _variant("softmax_rows", ("cols * sx1", "cols"), ("cols * so1", "cols")), "transposed"),
        # one program for every row, looping over the rows inside it
        (lambda: _variant("softmax_rows", *ONE_PROGRAM_FOR_ALL_ROWS), "one program per row"),
        # numpy computes log-softmax in the wrapper; the kernel's softmax of that is the answer
        (lambda: _variant("softmax_rows", extra=SOFTMAX_OF_NUMPY), "not an input"),
        # the same, written into x for the kernel to read, and x put back afterwards
        (lambda: _variant("softmax_rows", extra=SOFTMAX_OF_NUMPY_IN_X), "input was changed"),
        # torch when the call is not watched by a profiler, the kernel only when it is
        (lambda: _variant("softmax_rows", extra=WATCH_DETECTED), "torch arithmetic"),
        # numpy's answer passed to the kernel as a constexpr tuple, selected lane by lane
        (lambda: _variant("softmax_rows", extra=ANSWER_AS_CONSTEXPR), "tuple"),
        # numpy inside the kernel, through a Python helper
        (lambda: _variant("softmax_rows", ("e = tl.exp(x - tl.max(x, axis=0))", "e = _numpy_exp(x - tl.max(x, axis=0))"),
                          extra=NUMPY_EXP), "only triton.language"),
    ],
    "tiled_matmul": [
        (lambda: matmul_torch, "torch arithmetic"),
        (lambda: lib_triton.tiled_matmul, "lab's reference"),
        # all of K in one block
        (lambda: _variant("tiled_matmul", ("BLOCK_K=block_k)", "BLOCK_K=triton.next_power_of_2(k))")),
         "wider than the blocks"),
        # masked lanes read 1, not 0
        (lambda: _variant("tiled_matmul", ("(rk[None, :] < K), other=0.0)", "(rk[None, :] < K), other=1.0)"),
                          ("(rn[None, :] < N), other=0.0)", "(rn[None, :] < N), other=1.0)")),
         r"tiled_matmul\(a \[1, 1\]"),
        # numpy does the product; a kernel is launched for show
        (lambda: _variant("tiled_matmul", ("acc += tl.dot(a.to(tl.float32), b.to(tl.float32))", "pass"),
                          ("    return c\n", "    c.copy_(torch.from_numpy(a.float().numpy() @ "
                                             "b.float().numpy()).to(c.dtype))\n    return c\n")),
         "FLOPs|torch arithmetic|do not hold what your kernel stored"),
        # the product as outer products of columns and rows, a tl.dot of ones beside it
        (lambda: _variant("tiled_matmul", ("        acc += tl.dot(a.to(tl.float32), b.to(tl.float32))\n", RANK_ONE)),
         "element by element"),
        # numpy does the product; tl.dots forged by calling the interpreter's builder from the wrapper
        (lambda: _variant("tiled_matmul", extra=FORGED_DOTS), "outside any kernel launch"),
        # the product by broadcasting and tl.sum, a tl.dot of zeros beside it for the count
        (lambda: _variant("tiled_matmul", ("acc += tl.dot(a.to(tl.float32), b.to(tl.float32))",
                                           "acc += tl.sum(a.to(tl.float32)[:, :, None] * b.to(tl.float32)[None, :, :], "
                                           "axis=1) + 0.0 * tl.dot(tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32), "
                                           "tl.zeros((BLOCK_K, BLOCK_N), dtype=tl.float32))")), "3-D"),
    ],
    "flash_attention_triton": [
        (lambda: lib_triton.flash_attention_triton, "lab's reference"),
        # no online rescaling: l and acc keep their old scale when the max grows
        (lambda: _variant("flash_attention_triton", ("l = l * alpha + ", "l = l + "), ("acc = acc * alpha[:, None] + ",
                                                                                       "acc = acc + ")),
         "output|logsumexp|rescale"),
        # every key block loaded, the causal mask applied, nothing skipped
        (lambda: _variant("flash_attention_triton", ("end = tl.minimum(NK, start_m + BLOCK_M + NK - NQ)", "end = NK")),
         "FLOPs of the non-causal"),
        # one block for the whole row of keys
        (lambda: _variant("flash_attention_triton", ("BLOCK_N=block_n", "BLOCK_N=triton.next_power_of_2(k.shape[2])")),
         "wider than the blocks"),
        # the probabilities written to an N×N buffer (for a backward, say)
        (lambda: _variant("flash_attention_triton",
                          ("lse_ptr, sqb", "lse_ptr, p_ptr, sqb"),
                          ("        m = m_new\n", "        m = m_new\n        tl.store(p_ptr + tl.program_id(1) * NQ * NK"
                                                   " + rows[:, None] * NK + cols[None, :], p, mask=(rows[:, None] < NQ)"
                                                   " & (cols[None, :] < NK))\n"),
                          ("q, k, v, out, lse, *q.stride()", "q, k, v, out, lse, scores, *q.stride()"),
                          ("    lse = torch.empty(", "    scores = torch.empty((bsz, heads, nq, k.shape[2]), "
                                                    "device=q.device)\n    lse = torch.empty(")),
         "memory"),
        # attention in torch, returned in the right dtypes
        (lambda: attention_torch, "torch arithmetic"),
        # numpy computes attention; the kernel runs on the side and the wrapper writes numpy's answer
        (lambda: _variant("flash_attention_triton", extra=NUMPY_ATTENTION), "do not hold what your kernel stored"),
        # a value's interpreter data read inside the kernel
        (lambda: _variant("flash_attention_triton", ("s = tl.dot(q, kt) * scale", "s = tl.dot(q, kt) * scale\n"
                                                     "        peek = q.handle.data")), "handle"),
        # the row max fixed by the first block, never raised: exact until exp overflows
        (lambda: _variant("flash_attention_triton", ("m_new = tl.maximum(m, tl.max(s, axis=1))",
                                                     "m_new = tl.where(m == float('-inf'), tl.max(s, axis=1), m)")),
         "0 to 318"),
        # two passes: the exact max first, then the sums (every key block read twice)
        (lambda: _variant("flash_attention_triton", ("    for start_n in range(0, end, BLOCK_N):\n", TWO_PASS)),
         "2.00× what one pass needs"),
        # QKᵀ as a sum of outer products of columns loaded one by one; a tl.dot of zeros for the count
        (lambda: _variant("flash_attention_triton",
                          ("        kt = tl.load(k_ptr + b * skb + h * skh + cols[None, :] * skn + dims[:, None] * skd, "
                           "mask=cols[None, :] < NK,\n                     other=0.0).to(tl.float32)",
                           "        kt = tl.zeros((D, BLOCK_N), dtype=tl.float32)"),
                          ("        s = tl.dot(q, kt) * scale\n", OUTER_PRODUCTS)), "element by element"),
        # the scores by broadcasting and tl.sum
        (lambda: _variant("flash_attention_triton", ("s = tl.dot(q, kt) * scale",
                                                     "s = tl.sum(q[:, :, None] * kt[None, :, :], axis=1) * scale"
                                                     " + 0.0 * tl.dot(q, kt)")),
         "3-D"),
        # the scores kept in a buffer made before the call
        (lambda: _variant("flash_attention_triton",
                          ("lse_ptr, sqb", "lse_ptr, p_ptr, sqb"),
                          ("        m = m_new\n", "        m = m_new\n        tl.store(p_ptr + rows[:, None] * NK + "
                                                   "cols[None, :], p, mask=(rows[:, None] < NQ) & (cols[None, :] < NK))\n"),
                          ("q, k, v, out, lse, *q.stride()", "q, k, v, out, lse, SCRATCH, *q.stride()"),
                          extra="SCRATCH = torch.empty(1 << 20)"), "stored"),
        # two passes, except on the shape the technique's own calls use (q_len 96): every call is held to one pass
        (lambda: _unless_96(_variant("flash_attention_triton", ("    for start_n in range(0, end, BLOCK_N):\n",
                                                                TWO_PASS))), "what one pass needs"),
        # two passes over score blocks kept in a list (an unrolled loop): the whole row held at once
        (lambda: _variant("flash_attention_triton", extra=STATIC_TWO_PASS), "held at once"),
        # launched twice
        (lambda: _variant("flash_attention_triton", extra=TWICE), "2 kernel launches"),
    ],
}


@interpreter_only
@pytest.mark.parametrize("name", list(WRONG))
def test_check_accepts_the_solution(name):
    ex = load_exercises(NOTEBOOK, isolated=False)
    getattr(checks, f"check_{name}")(getattr(ex, name))


@interpreter_only
@pytest.mark.parametrize("name, i", [(name, i) for name, routes in WRONG.items() for i in range(len(routes))])
def test_check_rejects_wrong_route(name, i):
    make, says = WRONG[name][i]
    with pytest.raises((AssertionError, ValueError), match=says):
        getattr(checks, f"check_{name}")(make())


def test_every_triton_exercise_has_wrong_routes():
    assert set(WRONG) == {n for n, (_, section) in checks.WEEK.exercises.items() if section == checks.TRITON}


@pytest.mark.skipif(tri.interpreting() or not torch.cuda.is_available(), reason="needs a CUDA GPU (compiled kernels)")
@pytest.mark.parametrize("name", list(WRONG))
def test_solution_kernels_compiled_on_cuda(name):
    """On a GPU the same checks run the solution's kernels compiled, on CUDA inputs (the numbers and the wrapper)."""
    assert tri.device() == "cuda"
    ex = load_exercises(NOTEBOOK, isolated=False)
    getattr(checks, f"check_{name}")(getattr(ex, name))


@interpreter_only
def test_a_flawed_kernel_fails_in_the_isolated_child(tmp_path):
    """As `pytest weeks/17` grades it, in the confined child: the solution's matmul passes (its observed and
    dot-scaled runs included); a kernel whose max never rises fails by its numbers; a softmax that reads numpy's
    answer out of its input fails by what the interpreter saw (the observation crosses back as data)."""
    nb = json.loads(NOTEBOOK.read_text())
    fixed_max = _variant_source("flash_attention_triton", ("m_new = tl.maximum(m, tl.max(s, axis=1))",
                                                           "m_new = tl.where(m == float('-inf'), tl.max(s, axis=1), m)"))
    numpy_in_x = _variant_source("softmax_rows", extra=SOFTMAX_OF_NUMPY_IN_X)
    path = tmp_path / checks.WEEK.notebook
    path.write_text(json.dumps(with_cell_source(with_cell_source(nb, "flash_attention_triton", fixed_max),
                                                "softmax_rows", numpy_in_x)))
    ex = load_exercises(path, isolated=True)
    try:
        checks.check_tiled_matmul(ex.tiled_matmul)
        with pytest.raises(AssertionError, match="0 to 318"):
            checks.check_flash_attention_triton(ex.flash_attention_triton)
        with pytest.raises(AssertionError, match="input was changed"):
            checks.check_softmax_rows(ex.softmax_rows)
    finally:
        ex.close()


def test_the_graded_child_interprets_where_the_grader_does_not(tmp_path, monkeypatch):
    """On a GPU machine the grader's own process compiles Triton kernels (TRITON_INTERPRET unset there, 0 here),
    and a compiled kernel is invisible to the checks' counters. The graded child interprets anyway, and the checks
    judge the route as they do on a CPU: the solution's matmul passes, a softmax that runs one program for every
    row (right numbers) fails by its grid. Before, the child inherited the grader's setting: here (no GPU) no kernel
    could run, and on a GPU the softmax passed on its numbers."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    from grader.isolation import triton_interpreted_in_child

    if not triton_interpreted_in_child():  # a GPU machine whose triton is older than the pin: graded compiled
        pytest.skip("Triton's interpreter does not run here (numpy 2.4 and triton 3.6): the child compiles")
    source = _variant_source("softmax_rows", *ONE_PROGRAM_FOR_ALL_ROWS)
    path = tmp_path / checks.WEEK.notebook
    path.write_text(json.dumps(with_cell_source(json.loads(NOTEBOOK.read_text()), "softmax_rows", source)))
    ex = load_exercises(path, isolated=True)
    try:
        checks.check_tiled_matmul(ex.tiled_matmul)
        with pytest.raises(AssertionError, match="one program per row"):
            checks.check_softmax_rows(ex.softmax_rows)
    finally:
        ex.close()
    assert not tri.interpreting(), "outside a graded check, this process's own setting decides"


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU kernels are compiled, not interpreted")
def test_kernels_interpret_where_another_lib_folder_shadows_the_labs(tmp_path):
    """llama-cpp-python (the optional extra) installs a `lib` folder into site-packages: outside the repo, `import
    lib` is then a namespace package and lib's `__init__` (which sets TRITON_INTERPRET) never runs. A notebook whose
    check observed a call before its Triton cell (torch.utils.flop_counter imports triton) could not interpret
    kernels ("triton was imported before TRITON_INTERPRET=1 was set"). A `lib` folder beside the code stands in."""
    (tmp_path / "lib").mkdir()
    code = ("import lib, lib.attn.attention, grader.observe as o\n"
            "print('shadowed' if getattr(lib, '__file__', None) is None else 'not shadowed')\n"
            "o.observe(lambda: 1)\n"
            "import lib.attn.triton_attention as ta\n"
            "assert ta.interpreting()\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
