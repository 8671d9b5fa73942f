"""Week 17, section 8: what the Triton exercises' checks share (below `grader.checks.week17`, which imports it).

Where kernels run in Triton's interpreter (no GPU: TRITON_INTERPRET=1), `observe` sees every launch and the
shape of every `tl.dot` the student's programs executed (`Observation.kernel_launches`, `.kernel_dots`), beside
the aten ops of the wrapper around them. So a check can tell a kernel that did the work from a wrapper that
computed the answer with torch (aten arithmetic), with numpy or by hand (no kernel, or too few `tl.dot` FLOPs),
from a kernel that loaded a whole row or all of K at once (a `tl.dot` wider than the blocks asked for), and from
one that stored the score matrix in memory (torch bytes growing with N). A compiled kernel on a GPU is not
seen by the interpreter: there the checks judge the numbers and the wrapper's aten ops only, and say so.
"""
from __future__ import annotations

import os

import torch

from grader.checks import Observation

# What a kernel's wrapper may run through aten: allocation, views, copies (the interpreter's own copies of the
# arguments too), fills. Any other aten op is arithmetic the kernel should have done.
WRAPPER_OPS = ("aten.empty", "aten.new_empty", "aten.empty_like", "aten.empty_strided", "aten.zeros", "aten.new_zeros",
               "aten.zeros_like", "aten.full", "aten.new_full", "aten.full_like", "aten.fill_", "aten.zero_",
               "aten.set_", "aten.copy_", "aten.clone", "aten._to_copy", "aten.view", "aten._unsafe_view",
               "aten.as_strided", "aten.alias", "aten.detach", "aten.lift_fresh", "aten.t", "aten.transpose",
               "aten.permute", "aten.expand", "aten.reshape", "aten.select", "aten.slice", "aten.unsqueeze",
               "aten.squeeze", "aten.contiguous", "aten.sym_", "aten.is_", "aten.resize_")


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "on", "yes")


def device() -> str:
    """Where the checks put their inputs: the CPU for the interpreter, CUDA for compiled kernels."""
    return "cpu" if interpreting() or not torch.cuda.is_available() else "cuda"


def tol(atol: float, rtol: float) -> tuple[float, float]:
    """The tolerance for float32 results: as given under the interpreter (numpy's float32 products); at least 2e-2
    for compiled kernels, whose `tl.dot` on float32 blocks uses TF32 (a 10-bit mantissa) on GPUs that have it."""
    return (atol, rtol) if interpreting() else (max(atol, 2e-2), max(rtol, 2e-2))


def arithmetic_ops(obs: Observation) -> list[str]:
    """The aten ops of the call that are not allocation, views or copies (the interpreter's markers excluded)."""
    return sorted(op for op in obs.ops if op.startswith("aten.") and not op.startswith(WRAPPER_OPS))


def assert_kernel_route(obs: Observation, what: str, min_dot_flops: int = 0, max_dot_dim: int | None = None,
                        blocks: str = "") -> None:
    """The work was done by Triton kernels: the wrapper ran no aten arithmetic and no lib function; under the
    interpreter, at least one kernel launched, its `tl.dot`s add up to at least `min_dot_flops`, and none was wider
    than `max_dot_dim` (the blocks asked for)."""
    lib = obs.lib_calls_except("lib.triton_attention.check_triton_attention_shapes", "lib.triton_attention.kernel_device",
                               "lib.triton_attention.interpreting", "lib.attention.check_attention_shapes")
    assert not lib, f"{what}: your code called the lab's reference {lib}; write the kernel yourself"
    ops = arithmetic_ops(obs)
    assert not ops, (f"{what}: the wrapper ran torch arithmetic {ops[:6]}; a wrapper only allocates the outputs and "
                     f"launches the kernel — every operation on the data belongs inside the @triton.jit kernel")
    if not interpreting():
        return  # a compiled kernel is invisible to the interpreter's counters: the numbers were judged
    assert obs.kernel_launches, (f"{what}: no Triton kernel was launched (the interpreter saw none); the result must "
                                 f"come from your @triton.jit kernel, launched as kernel[grid](...)")
    done = obs.kernel_dot_flops()
    assert done >= min_dot_flops, (
        f"{what}: your kernels' tl.dot calls did {done:,} FLOPs, fewer than the {min_dot_flops:,} the product needs: "
        f"multiply the blocks with tl.dot inside the kernel (not with numpy, torch or Python loops)")
    if max_dot_dim is not None:
        widest = obs.max_kernel_dot_dim()
        assert widest <= max_dot_dim, (
            f"{what}: a tl.dot of {widest} rows/columns ran, wider than the blocks asked for ({blocks}): load and "
            f"multiply one block at a time, looping over the rest")


def float64_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool):
    """Attention and its log-sum-exp per row, in float64 (causal aligned at the bottom right)."""
    q, k, v = q.double(), k.double(), v.double()
    s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    if causal:
        nq, nk = q.shape[2], k.shape[2]
        keep = torch.ones(nq, nk, dtype=torch.bool, device=q.device).tril(nk - nq)
        s = s.masked_fill(~keep, float("-inf"))
    return torch.softmax(s, dim=-1) @ v, torch.logsumexp(s, dim=-1)
