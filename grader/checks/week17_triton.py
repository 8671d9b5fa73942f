"""Week 17, section 8: the Triton exercises' checks (`check_softmax_rows`, `check_tiled_matmul`,
`check_flash_attention_triton`, registered as exercises 11-13 by `grader.checks.week17`, which imports this module)
and what they share.

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

from grader.checks import Observation, generator, observe
from grader.checks import assert_close as _close

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
    lib = obs.lib_calls_except("lib.attn.triton_attention.check_triton_attention_shapes", "lib.attn.triton_attention.kernel_device",
                               "lib.attn.triton_attention.interpreting", "lib.attn.attention.check_attention_shapes")
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


def run_kernel(fn, what: str, names: tuple, *args, flat_reductions: bool = False, route: dict | None = None,
               **kwargs):
    """A check's call of a kernel exercise: every call is observed (lightly: no profiler, so lib's functions are
    not named — the observed technique runs do that) and held to the route's basics — one launch, triton.language
    only, the inputs alone read and as passed, the results alone written and wholly stored by the kernel — and to
    `route` (more of `assert_kernel_route`'s bounds), so that no call is answered another way than the ones the
    technique is measured on."""
    result, obs = observe(fn, *args, _observe_light=True, **kwargs)
    assert_kernel_route(obs, what, names=names, flat_reductions=flat_reductions, **(route or {}))
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


# --- the checks of exercises 11, 12, 13 (registered by grader.checks.week17) ------------------------------

def _shape(t):
    return tuple(t.shape)


def _on(t: torch.Tensor) -> torch.Tensor:
    return t.to(device())


def check_softmax_rows(softmax_rows) -> None:
    g = generator(600)

    def run(x, what):
        return run_kernel(softmax_rows, what, ("x",), x)

    for rows, cols in [(1, 1), (3, 37), (5, 128), (2, 1000)]:
        x = _on(torch.randn(rows, cols, generator=g) * 3)
        what = f"softmax_rows(x [{rows}, {cols}])"
        _close(run(x, what), torch.softmax(x.double(), -1).float(), what, 1e-6, 1e-5)
    x = _on(torch.randn(4, 50, generator=g) * 1e4)  # exp overflows float32 unless the row's max is subtracted
    _close(run(x, "softmax_rows on entries of size 1e4"), torch.softmax(x.double(), -1).float(),
           "softmax_rows on entries of size 1e4", 1e-6)
    x = torch.randn(3, 40, generator=g)
    x[0, :13], x[1, 39], x[2, 5:30] = float("-inf"), float("-inf"), float("-inf")
    x = _on(x)
    _close(run(x, "softmax_rows with -inf entries"), torch.softmax(x.double(), -1).float(),
           "softmax_rows with -inf entries", 1e-6, 1e-5)
    x = _on(torch.randn(45, 6, generator=g)).t()  # [6, 45], a column stride of 6: the kernel must use both strides
    what = "softmax_rows on a transposed (non-contiguous) input"
    _close(run(x, what), torch.softmax(x.double(), -1).float(), what, 1e-6, 1e-5)
    x = _on(torch.randn(3, 70, generator=g)).half()
    what = "softmax_rows on float16 (compute in float32, return float16)"
    _close(run(x, what), torch.softmax(x.float(), -1).half(), what, 1e-3, 1e-2)
    x = _on(torch.randn(6, 300, generator=g))
    _, obs = observe(softmax_rows, x)
    assert_kernel_route(obs, "softmax_rows(x [6, 300])", names=("x",))
    if interpreting():
        grids = [grid for _, grid in obs.kernel_launches]
        assert any(grid and grid[0] == 6 for grid in grids), (
            f"softmax_rows(x [6, 300]): the kernels launched had grids {grids}; launch one program per row, "
            f"grid (6,)")


def check_tiled_matmul(tiled_matmul) -> None:
    g = generator(700)

    def run(what, *args, **kwargs):
        return run_kernel(tiled_matmul, what, ("a", "b"), *args, flat_reductions=True, **kwargs)

    for (m, k, n), blocks in [((1, 1, 1), (16, 16, 16)), ((45, 70, 33), (16, 16, 16)), ((64, 64, 64), (32, 16, 16)),
                              ((37, 100, 20), (16, 32, 32)), ((20, 33, 70), (16, 64, 16))]:
        a = _on(torch.randn(m, k, generator=g))
        b = _on(torch.randn(k, n, generator=g))
        bm, bn, bk = blocks
        what = f"tiled_matmul(a [{m}, {k}], b [{k}, {n}], block_m={bm}, block_n={bn}, block_k={bk})"
        # every call: each block of a loaded once per program that needs it, no tl.dot wider than the blocks
        route = dict(max_dot_dim=max(blocks), blocks=f"{bm}, {bn}, {bk}",
                     max_loaded={0: -(-n // bn) * m * k, 1: -(-m // bm) * k * n})
        _close(run(what, a, b, block_m=bm, block_n=bn, block_k=bk, route=route), (a.double() @ b.double()).float(),
               what, *tol(1e-4, 1e-4))
    a = _on(torch.randn(30, 50, generator=g))
    b = _on(torch.randn(40, 50, generator=g)).t()  # [50, 40] with a row stride of 1
    what = "tiled_matmul with b transposed (non-contiguous)"
    _close(run(what, a, b), (a.double() @ b.double()).float(), what, *tol(1e-4, 1e-4))
    a, b = _on(torch.randn(40, 64, generator=g)).half(), _on(torch.randn(64, 24, generator=g)).half()
    what = "tiled_matmul on float16 (accumulate in float32, return float16)"
    _close(run(what, a, b), (a.float() @ b.float()).half(), what, *tol(1e-2, 1e-2))
    for shape_a, shape_b in [((3, 4), (5, 6)), ((3, 4, 5), (5, 6))]:
        try:
            tiled_matmul(_on(torch.zeros(shape_a)), _on(torch.zeros(shape_b)))
        except ValueError:
            pass
        else:
            raise AssertionError(f"tiled_matmul(a {list(shape_a)}, b {list(shape_b)}) should raise ValueError "
                                 f"naming the shapes")
    m, k, n = 48, 96, 40
    a, b = _on(torch.randn(m, k, generator=g)), _on(torch.randn(k, n, generator=g))
    what = f"tiled_matmul(a [{m}, {k}], b [{k}, {n}], blocks 16, 16, 32)"
    _, obs = observe(tiled_matmul, a, b, block_m=16, block_n=16, block_k=32)
    padded = 2 * (-(-m // 16) * 16) * (-(-k // 32) * 32) * (-(-n // 16) * 16)  # whole blocks, edges included
    assert_kernel_route(obs, what, min_dot_flops=2 * m * k * n, max_dot_dim=32, blocks="16, 16, 32",
                            names=("a", "b"), widest_load=16 * 32, flat_reductions=True, max_dot_flops=padded,
                            elementwise_per_mac=0.5, max_loaded={0: -(-n // 16) * m * k, 1: -(-m // 16) * k * n})
    if interpreting():
        scaled, _ = observe(tiled_matmul, a, b, block_m=16, block_n=16, block_k=32, _observe_dot_scale=1.25,
                            _observe_light=True)
        assert_made_of_dots(scaled, 1.25 * (a.double() @ b.double()), what, 1e-4, 1e-4)


def _attention_inputs(b, h, nq, nk, d, offset, dtype=torch.float32, transposed=False):
    """Random q, k, v from this run's seed, on the kernels' device (`transposed`: q a non-contiguous view)."""
    g = generator(offset)
    q = torch.randn(b, nq, h, d, generator=g).transpose(1, 2) if transposed else torch.randn(b, h, nq, d, generator=g)
    k, v = torch.randn(b, h, nk, d, generator=g), torch.randn(b, h, nk, d, generator=g)
    return _on(q.to(dtype)), _on(k.to(dtype)), _on(v.to(dtype))


def check_flash_attention_triton(flash_attention_triton) -> None:
    def run(what, *args, **kwargs):
        return run_kernel(flash_attention_triton, what, ("q", "k", "v"), *args, flat_reductions=True, **kwargs)

    cases = [(1, 1, 1, 1, 16, False), (1, 2, 37, 37, 16, True), (2, 1, 5, 70, 32, True), (1, 2, 70, 33, 64, False),
             (1, 1, 1, 200, 128, True), (1, 2, 64, 96, 16, True), (2, 2, 50, 50, 32, False)]
    for i, (b, h, nq, nk, d, causal) in enumerate(cases):
        q, k, v = _attention_inputs(b, h, nq, nk, d, offset=800 + i, transposed=i % 3 == 1)
        want, want_lse = float64_attention(q, k, v, causal)
        for bm, bn in [((16, 16), (32, 16), (16, 32))[i % 3]]:
            what = (f"flash_attention_triton(q {_shape(q)}{' non-contiguous' if i % 3 == 1 else ''}, k {_shape(k)}, "
                    f"causal={causal}, block_m={bm}, block_n={bn})")
            # every call: K and V loaded once per query block, no second pass of tl.dots, blocks no wider than asked
            once = b * h * -(-nq // bm) * nk * d
            route = dict(max_loaded={1: once, 2: once}, max_dot_dim=max(bm, bn, d), blocks=f"{bm}, {bn}",
                         max_dot_flops=4 * b * h * (-(-nq // bm) * bm) * (-(-nk // bn) * bn) * d)
            res = run(what, q, k, v, causal=causal, block_m=bm, block_n=bn, route=route)
            assert isinstance(res, tuple) and len(res) == 2, f"{what} should return a tuple (out, lse)"
            _close(res[0], want.float(), what + " output", *tol(1e-5, 1e-4))
            _close(res[1], want_lse.float(), what + " logsumexp [B, H, Nq] (float32)", *tol(1e-5, 1e-5))
    # Long rows whose scores grow from block to block: the running max changes at every block, so a kernel that
    # does not rescale l and acc by exp(m_old - m_new) is wrong here.
    nk, d = 160, 16
    q = _on(torch.ones(1, 1, 4, d) * 0.5)
    ramp = torch.linspace(0.0, 12.0, nk).view(1, 1, nk, 1)
    k = _on(ramp * torch.ones(1, 1, nk, d) / d ** 0.5 * 2 + 0.1 * torch.randn(1, 1, nk, d, generator=generator(810)))
    v = _on(torch.randn(1, 1, nk, d, generator=generator(811)))
    want, want_lse = float64_attention(q, k, v, False)
    out, lse = run("flash_attention_triton on rows whose scores grow", q, k, v, causal=False, block_m=16, block_n=16)
    _close(out, want.float(), "flash_attention_triton on rows whose scores grow block after block (the running max "
           "changes at each block: rescale l and acc by exp(m_old − m_new))", *tol(1e-5, 1e-4))
    _close(lse, want_lse.float(), "flash_attention_triton's lse on rows whose scores grow block after block",
           *tol(1e-5, 1e-5))
    # Scores that climb by 32 per block to 318: exp of a score minus any max but the running one overflows float32.
    q = _on(torch.ones(1, 1, 16, d))
    k = _on((torch.arange(nk).float() / 2).view(1, 1, nk, 1) * torch.ones(1, 1, nk, d)
            + 0.01 * torch.randn(1, 1, nk, d, generator=generator(812)))
    want, want_lse = float64_attention(q, k, v, False)
    out, lse = run("flash_attention_triton on scores that climb", q, k, v, causal=False, block_m=16, block_n=16)
    _close(out, want.float(), "flash_attention_triton on scores that climb from 0 to 318 over the row (exp overflows "
           "float32 past 88: keep the running max current, rescaling l and acc whenever it grows)",
           *tol(1e-4, 1e-3))
    _close(lse, want_lse.float(), "flash_attention_triton's lse on scores that climb from 0 to 318",
           *tol(1e-4, 1e-4))
    q, k, v = _attention_inputs(1, 2, 40, 40, 32, offset=820, dtype=torch.float16)
    want, want_lse = float64_attention(q, k, v, True)
    out, lse = run("flash_attention_triton on float16", q, k, v, causal=True)
    _close(out, want.half(), "flash_attention_triton on float16 (keep m, l and acc in float32; return float16)",
           *tol(2e-3, 4e-3))
    _close(lse, want_lse.float(), "flash_attention_triton's lse on float16 inputs (float32)", *tol(1e-3, 1e-4))
    for qs, ks, why in [((1, 2, 5, 24), (1, 2, 5, 24), "a head dim of 24 (not a power of two)"),
                        ((1, 4, 5, 16), (1, 2, 5, 16), "heads differ")]:
        try:
            flash_attention_triton(_on(torch.zeros(qs)), _on(torch.zeros(ks)), _on(torch.zeros(ks)))
        except ValueError:
            pass
        else:
            raise AssertionError(f"flash_attention_triton(q {list(qs)}, k {list(ks)}) should raise ValueError ({why}): "
                                 f"start with check_triton_attention_shapes(q, k, v, causal)")
    # The technique: one kernel, blocks only, every product by tl.dot, each key block read once per query block,
    # causal blocks skipped, nothing of size N×N in memory.
    n, d = 96, 16
    q, k, v = _attention_inputs(1, 1, n, n, d, offset=830)
    what = f"flash_attention_triton(q [1, 1, {n}, {d}], block_m=16, block_n=16)"
    one_pass = -(-n // 16) * n * d  # each of the 6 query blocks reads all of K and V once
    route = dict(max_dot_dim=16, blocks="16, 16", names=("q", "k", "v"), widest_load=16 * d, flat_reductions=True,
                 max_dot_flops=4 * n * n * d, elementwise_per_mac=0.5)
    _, full = observe(flash_attention_triton, q, k, v, causal=False, block_m=16, block_n=16)
    assert_kernel_route(full, what, min_dot_flops=4 * n * n * d, max_loaded={1: one_pass, 2: one_pass}, **route)
    _, causal = observe(flash_attention_triton, q, k, v, causal=True, block_m=16, block_n=16)
    assert_kernel_route(causal, what + " causal", max_loaded={1: one_pass, 2: one_pass}, **route)
    if interpreting():
        ratio = causal.kernel_dot_flops() / max(full.kernel_dot_flops(), 1)
        assert ratio < 0.65, (
            f"{what}: the causal pass ran {ratio:.2f}× the tl.dot FLOPs of the non-causal one; stop each program's "
            f"loop at the last key block its rows can see (21 of 36 blocks: 0.58× here)")
        loads = [causal.kernel.get("loaded", {}).get(i, 0) / max(full.kernel.get("loaded", {}).get(i, 1), 1)
                 for i in ("1", "2")]
        assert max(loads) < 0.65, (
            f"{what}: the causal pass loaded {max(loads):.2f}× the keys and values of the non-causal one; blocks "
            f"above the diagonal are never loaded (21 of 36 blocks: 0.58× here)")
        scaled, _ = observe(flash_attention_triton, q, k, v, causal=False, block_m=16, block_n=16,
                            _observe_dot_scale=1.25, _observe_light=True)
        want, want_lse = float64_attention(1.25 * q.double(), k, v, False)  # QKᵀ scaled, then PV scaled
        assert_made_of_dots(scaled, (1.25 * want, want_lse), what, 1e-5, 1e-4)
    peaks, held = {}, {}
    for n in (32, 128):
        q, k, v = _attention_inputs(1, 1, n, n, 16, offset=840 + n)
        _, obs = observe(flash_attention_triton, q, k, v, causal=False, block_m=32, block_n=32, _observe_light=True)
        peaks[n] = obs.peak_bytes - (q.numel() * 4 + n * 4)
        held[n] = obs.kernel.get("peak_values", 0)
    assert peaks[128] <= peaks[32] + 16 * 1024, (
        f"flash_attention_triton: torch memory beyond out and lse grew from {peaks[32] / 1e3:.1f} kB at N=32 to "
        f"{peaks[128] / 1e3:.1f} kB at N=128; the kernel keeps its blocks in registers, never a score matrix in memory")
    # A program's registers: q, m, l, acc and one key block's worth, whatever N — two passes over score blocks
    # kept in a list or tuple (an unrolled loop) hold the whole row at once.
    assert held[128] <= held[32] + 2 * 32 * 32 * 4, (
        f"flash_attention_triton: the values your kernel's programs held at once grew from {held[32] / 1e3:.1f} kB at "
        f"N=32 to {held[128] / 1e3:.1f} kB at N=128 (blocks of 32): a program keeps q, m, l, acc and the key block it "
        f"is on — the scores of the blocks before it are folded into m, l and acc, not kept")
