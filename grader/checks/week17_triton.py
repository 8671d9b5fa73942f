"""Week 17, section 8: what the Triton exercises' checks share (below `grader.checks.week17`, which imports it).

Where kernels run in Triton's interpreter (no GPU: TRITON_INTERPRET=1), `observe` sees every launch and the
shape of every `tl.dot` the student's programs executed (`Observation.kernel_launches`, `.kernel_dots`), beside
the aten ops of the wrapper around them. So a check can tell a kernel that did the work from a wrapper that
computed the answer with torch (aten arithmetic), with numpy or by hand (no kernel, or too few `tl.dot` FLOPs),
from a kernel that loaded a whole row or all of K at once (a `tl.dot` wider than the blocks asked for), and from
one that stored the score matrix in memory (torch bytes growing with N). A compiled kernel on a GPU is not
seen by the interpreter: so the graded child always interprets (on a GPU machine too), and only a notebook's own
check on a GPU, run in its kernel, judges the numbers and the wrapper's aten ops alone.
"""
from __future__ import annotations

import os

import torch

from grader.checks import Observation, observe

# What a kernel's wrapper may run through aten: allocation, views, copies (the interpreter's own copies of the
# arguments too), fills. Any other aten op is arithmetic the kernel should have done.
WRAPPER_OPS = ("aten.empty", "aten.new_empty", "aten.empty_like", "aten.empty_strided", "aten.zeros", "aten.new_zeros",
               "aten.zeros_like", "aten.full", "aten.new_full", "aten.full_like", "aten.fill_", "aten.zero_",
               "aten.set_", "aten.copy_", "aten.clone", "aten._to_copy", "aten.view", "aten._unsafe_view",
               "aten.as_strided", "aten.alias", "aten.detach", "aten.lift_fresh", "aten.t", "aten.transpose",
               "aten.permute", "aten.expand", "aten.reshape", "aten.select", "aten.slice", "aten.unsqueeze",
               "aten.squeeze", "aten.contiguous", "aten.sym_", "aten.is_", "aten.resize_")


def interpreting() -> bool:
    """Whether the student's kernels run in Triton's interpreter, where the checks see their launches: always when
    the check grades the isolated child (it interprets on a GPU machine too wherever Triton's interpreter works there:
    `grader.isolation.triton_interpreted_in_child`), else where this process interprets (no GPU, or TRITON_INTERPRET=1: the notebook's own check on a CPU)."""
    from grader.harness import CHECKING_ISOLATED

    if os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "on", "yes"):
        return True
    if CHECKING_ISOLATED.get():
        from grader.isolation import triton_interpreted_in_child

        return triton_interpreted_in_child()
    return False


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
                        blocks: str = "", names: tuple = (), widest_load: int | None = None,
                        max_loaded: dict | None = None, one_launch: bool = True, flat_reductions: bool = False,
                        max_dot_flops: int | None = None, elementwise_per_mac: float | None = None) -> None:
    """The work was done by one Triton kernel: the wrapper ran no aten arithmetic and no lib function; under the
    interpreter, the kernel launched once (`one_launch`), its source is triton.language only, it loaded from the
    inputs alone (`names`: the call's tensor arguments, in order), stored into the results alone and wrote every
    element of them; its `tl.dot`s add up to at least `min_dot_flops`, none wider than `max_dot_dim` (the blocks
    asked for), no load wider than `widest_load` elements; input i was loaded at most `max_loaded[i]` elements'
    worth; with `flat_reductions`, no reduction of a 3-D tensor (a product done by broadcasting and tl.sum)."""
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
    k = obs.kernel
    problems = k.get("problems", [])
    assert not problems, f"{what}: {problems[0]}"
    launched = [name for name, _ in obs.kernel_launches]
    assert not one_launch or len(launched) == 1, (
        f"{what}: {len(launched)} kernel launches ({', '.join(launched[:4])}{' …' if len(launched) > 4 else ''}); "
        f"the exercise is one kernel, launched once: its running state stays in registers between blocks, not in "
        f"memory between launches")
    if k.get("loaded_elsewhere", 0):
        where = ("the output it was writing" if k.get("loaded_from_outputs", 0) else
                 "a buffer that is not an input (one the wrapper filled, or scratch memory), or past the end of an "
                 "input (a load without its mask)")
        raise AssertionError(f"{what}: your kernel loaded {k['loaded_elsewhere']:,} elements from {where}; a kernel "
                             f"reads only its inputs ({', '.join(names) or 'the arguments'}) and keeps the rest in "
                             f"registers")
    assert not k.get("stored_elsewhere", 0), (
        f"{what}: your kernel stored {k['stored_elsewhere']:,} elements outside the tensors it returns (scores, "
        f"probabilities or running state kept in memory, or a store without its mask); store only the results")
    assert not k.get("outputs_not_stored", 0), (
        f"{what}: {k['outputs_not_stored']:,} elements of the result do not hold what your kernel stored there "
        f"(the wrapper filled, overwrote, copied or converted them, or no program stored them): the kernel's tl.store "
        f"writes the result, in its final dtype, into the tensor the wrapper returns")
    done = obs.kernel_dot_flops()
    assert done >= min_dot_flops, (
        f"{what}: your kernels' tl.dot calls did {done:,} FLOPs, fewer than the {min_dot_flops:,} the product needs: "
        f"multiply the blocks with tl.dot inside the kernel (not with numpy, torch or Python loops)")
    if max_dot_dim is not None:
        widest = obs.max_kernel_dot_dim()
        assert widest <= max_dot_dim, (
            f"{what}: a tl.dot of {widest} rows/columns ran, wider than the blocks asked for ({blocks}): load and "
            f"multiply one block at a time, looping over the rest")
    if widest_load is not None:
        assert k.get("widest_load", 0) <= widest_load, (
            f"{what}: one tl.load read {k['widest_load']:,} elements, more than a block holds ({widest_load:,} with "
            f"blocks {blocks}): load one block at a time, looping over the rest")
    for i, most in (max_loaded or {}).items():
        got = k.get("loaded", {}).get(str(i), 0)
        name = names[i] if i < len(names) else f"argument {i}"
        assert got <= most, (
            f"{what}: your kernel loaded {got:,} elements of {name}, {got / max(most, 1):.2f}× what one pass needs "
            f"({most:,}): each block is loaded once per program (a second pass over the blocks, or blocks the loop "
            f"should have skipped, read it again)")
    if flat_reductions:
        assert k.get("reduce_rank", 0) <= 2, (
            f"{what}: your kernel reduced a {k['reduce_rank']}-D tensor: a broadcast product summed with tl.sum is a "
            f"matrix product done element by element; take products of blocks with tl.dot")
    if max_dot_flops is not None:
        assert done <= max_dot_flops, (
            f"{what}: your kernels' tl.dot calls did {done:,} FLOPs, {done / max(max_dot_flops, 1):.2f}× the "
            f"{max_dot_flops:,} one pass over the blocks takes: each product of blocks is taken once")
    if elementwise_per_mac is not None and done:
        ratio = k.get("elementwise", 0) / (done / 2)
        assert ratio <= elementwise_per_mac, (
            f"{what}: your kernel's elementwise float arithmetic ({k.get('elementwise', 0):,} results) is "
            f"{ratio:.2f}× the multiply-adds its tl.dots did: products taken element by element (outer products, "
            f"broadcasts) belong in tl.dot")


def run_kernel(fn, what: str, names: tuple, *args, flat_reductions: bool = False, **kwargs):
    """A check's call of a kernel exercise: every call is observed (lightly: no profiler, so lib's functions are
    not named — the observed technique runs do that) and held to the route's basics — one launch, triton.language
    only, the inputs alone read and as passed, the results alone written and wholly stored by the kernel — so that
    no call is answered another way than the ones the technique is measured on."""
    result, obs = observe(fn, *args, _observe_light=True, **kwargs)
    assert_kernel_route(obs, what, names=names, flat_reductions=flat_reductions)
    return result


def assert_made_of_dots(got, want, what: str, atol: float, rtol: float) -> None:
    """`got` came from a call observed with every `tl.dot` product scaled (`_observe_dot_scale`); `want` is what
    a kernel whose products all come from its tl.dots returns then. Under the interpreter only."""
    got = got if isinstance(got, (tuple, list)) else (got,)
    want = want if isinstance(want, (tuple, list)) else (want,)
    for g, w in zip(got, want):
        close = torch.isclose(g.double(), w.to(g.device).double(), atol=atol, rtol=rtol)
        assert bool(close.all()), (
            f"{what}: with every tl.dot product scaled by 1.25 (a test of where your products come from), your "
            f"result changed in {int((~close).sum())} of {close.numel()} places otherwise than a kernel whose "
            f"products all come from its tl.dots does: some products were taken another way (tl.sum of a "
            f"broadcast product, numpy, the wrapper), or tl.dots ran for show")


def float64_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool):
    """Attention and its log-sum-exp per row, in float64 (causal aligned at the bottom right)."""
    q, k, v = q.double(), k.double(), v.double()
    s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    if causal:
        nq, nk = q.shape[2], k.shape[2]
        keep = torch.ones(nq, nk, dtype=torch.bool, device=q.device).tril(nk - nq)
        s = s.masked_fill(~keep, float("-inf"))
    return torch.softmax(s, dim=-1) @ v, torch.logsumexp(s, dim=-1)
