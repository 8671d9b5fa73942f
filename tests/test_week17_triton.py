"""Week 17, section 8: the Triton checks accept the solution's kernels and reject each wrong route, named.

Each wrong route is the solution notebook's own cell with one flaw written in (`_variant`: a text replacement,
asserted to apply), or a wrapper that computes the answer some other way, run in this process under Triton's
interpreter (lib.triton_attention sets TRITON_INTERPRET=1 where there is no GPU). A few also go through the
isolated child, as `pytest weeks/17` grades a student.
"""
import json
from pathlib import Path

import numpy as np
import pytest
import torch

import lib.triton_attention as lib_triton  # sets TRITON_INTERPRET=1 without a GPU, before any @triton.jit below
from grader.checks import week17 as checks
from grader.checks import week17_triton as tri
from grader.harness import load_exercises, with_cell_source

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


def _variant(name: str, *edits: tuple[str, str], extra: str = ""):
    """The solution's cell for `name` with each (old, new) replaced once, plus `extra` code; its function."""
    src = _cell(name)
    for old, new in edits:
        assert src.count(old) == 1, f"the edit {old!r} does not apply to the solution cell {name} (it changed?)"
        src = src.replace(old, new)
    ns = _namespace()
    exec(compile(src + "\n" + extra, f"<wrong {name}>", "exec"), ns)
    return ns[name]


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


WRONG = {
    "softmax_rows": [
        (lambda: softmax_torch, "torch arithmetic"),
        (lambda: softmax_numpy, "torch arithmetic|no Triton kernel"),
        (lambda: lib_triton.softmax_rows, "lab's reference"),
        (lambda: _variant("softmax_rows", ('other=float("-inf")', "other=0.0")), r"softmax_rows\(x \[3, 37\]\)"),
        (lambda: _variant("softmax_rows", ("tl.exp(x - tl.max(x, axis=0))", "tl.exp(x)")), "1e4|NaN"),
        (lambda: _variant("softmax_rows", ("cols * sx1", "cols"), ("cols * so1", "cols")), "transposed"),
        # one program for every row, looping over the rows inside it
        (lambda: _variant("softmax_rows",
                          ("    row = tl.program_id(0)\n", "    for row in range(0, N_ROWS):\n"),
                          ("    cols = tl.arange(0, BLOCK)\n", "        cols = tl.arange(0, BLOCK)\n"),
                          ("    inside = cols < n_cols\n", "        inside = cols < n_cols\n"),
                          ("    x = tl.load(", "        x = tl.load("),
                          ("    e = tl.exp(", "        e = tl.exp("),
                          ("    tl.store(", "        tl.store("),
                          ("so1, BLOCK: tl.constexpr)", "so1, N_ROWS, BLOCK: tl.constexpr)"),
                          ("[(x.shape[0],)]", "[(1,)]"),
                          ("out.stride(1),\n", "out.stride(1), x.shape[0],\n")), "one program per row"),
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
         "FLOPs|torch arithmetic"),
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
    """As `pytest weeks/17` grades it: the kernel without rescaling, in the confined child, fails by its numbers;
    the solution's passes; a torch wrapper fails by its route."""
    nb = json.loads(NOTEBOOK.read_text())
    flawed = _cell("flash_attention_triton").replace("acc = acc * alpha[:, None] + ", "acc = acc + ")
    torch_wrapper = '''
def softmax_rows(x):
    return torch.softmax(x, -1)
'''
    path = tmp_path / checks.WEEK.notebook
    path.write_text(json.dumps(with_cell_source(with_cell_source(nb, "flash_attention_triton", flawed),
                                                "softmax_rows", torch_wrapper)))
    ex = load_exercises(path, isolated=True)
    try:
        checks.check_tiled_matmul(ex.tiled_matmul)
        with pytest.raises(AssertionError, match="flash_attention_triton"):
            checks.check_flash_attention_triton(ex.flash_attention_triton)
        with pytest.raises(AssertionError, match="torch arithmetic"):
            checks.check_softmax_rows(ex.softmax_rows)
    finally:
        ex.close()
