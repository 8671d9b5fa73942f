"""Week 17 — FlashAttention: the milestone checks, used by solutions/17/test_week17.py and the notebook.

Every check follows the three rules of `grader.checks` (data in, data out; seeded random inputs; only the
technique passes). Exercises 1-10: every call whose result a check judges is observed, and its route judged on
that same call (`week17_routes.call`): no number comes from a call the check did not watch, and no observed result
is thrown away. What each check rejects besides wrong numbers (tests/test_week17_checks.py has them all, and
tests/test_week17_routes.py runs the named routes and honest variants through the graded child):

- naive_attention: SDPA (on any call: a function that answers unwatched calls with SDPA has none), `lib`'s
  reference under another name; a CPU tensor mixed into a GPU computation.
- score_bytes, standard_io, flash_io: `lib`'s functions; a table of the checked values (inputs are random).
- online_softmax: `torch.softmax` (or any reduction) over more than a chunk; a first pass over the chunks for the
  maximum and a second for the sum — also on a copy of x, or on x passed through a reduction over a dimension of
  one (each element must be visited once: `grader.reads`); a product or numpy doing the work (no torch op reads x).
- flash_attention_forward, on every call (lengths the blocks do not divide, several block shapes per case): a
  product or reduction wider than a block (naive attention plus a logsumexp, naive where the blocks do not
  divide), SDPA, fewer FLOPs than the visible pairs need (numpy) or more than 1.2x one pass over the blocks
  computed (blocks wholly above the causal diagonal, a block's scores computed twice); K or V visited more than
  once per query block or Q more than once per key block (a second pass over the key blocks, in either loop order:
  the paper's Algorithm 1 order, key blocks outside, reads Q once per key block and passes); the wrong blocks
  visited when causal; fp32 state for fp16/bf16 inputs (lse in float32); memory beyond the results that grows
  with N faster than O(N·d) state (output-sized accumulators, m and l for every row, per-block outputs kept for a
  concatenation all pass; a row of scores per query block, the score matrix, numpy's copy of it do not:
  `week17_routes.assert_memory_growth`); masks built on the CPU.
- merge_partials: a merge that overflows (lse of 1e4) or turns an empty part (lse −inf) into NaN; `lib`'s merge.
- flash_attention_backward, on every call: autograd through naive attention, a softmax, a product wider than a
  block, fewer than the five products of each visible pair; recomputing the softmax instead of using the saved
  lse, recomputing O instead of using the saved out (both are fed perturbed); P in memory at N=1024.
- FlashAttention: its forward and backward observed through autograd (blocks only, as above), gradients against
  attention's own in float64 and float32; saving P; `lib`'s Function.
- flash_decode, on every call: naive attention or one unsplit pass (a product or reduction over more than a
  split), a first pass over the splits for the global maximum (each key visited once), an identity product (at
  most 2x the FLOPs); `lib`'s reference; more splits than keys must work.
- softmax_rows, tiled_matmul, flash_attention_triton (Triton, `week17_triton`): a wrapper doing torch arithmetic,
  no kernel launched or too few `tl.dot` FLOPs (numpy, Python), a `tl.dot` wider than the blocks, one program for
  all rows, causal blocks loaded (FLOPs), P stored (memory), no rescaling, wrong mask fill values, strides ignored;
  on every call of tiled_matmul and flash_attention_triton, not only the technique's: each block loaded once per
  program that needs it (a second pass over K and V, on whatever shapes), `tl.dot`s of one (padded) pass.
- predict_peak_bytes (exercise 17, `week17_predict`, no lib counterpart): graded on the student's model of the peak
  memory of naive and tiled attention, on configurations drawn per run; `lib`'s functions on the way fail.
"""
from __future__ import annotations

import math

import torch

from grader.checks import assert_close as _close
from grader.checks import assert_route, check_on_meta, generator, observe, seed_note
from grader.checks import sweep
from grader.checks import week17_predict as predict
from grader.checks import week17_triton as tri
from grader.checks.week17_routes import (SDPA_OPS, SHAPES_OK, assert_memory_growth, assert_visits, backward_route, blocks,
                                         call, decode_route, forward_route, softmax_route)
from grader.harness import Week
from lib.attn import attention as ref
from lib.attn import io_model
from lib.attn.masks import causal_mask

WEEK = Week(17, "week17_flash_attention.ipynb",
            child_may_use={"lib.attn.attention": ("check_attention_shapes",), "lib.attn.masks": ("causal_mask",),
                           "lib.attn.triton_attention": ("check_triton_attention_shapes", "kernel_device", "interpreting")})

# (batch, heads, q_len, kv_len, head_dim, causal): lengths that are not multiples of the blocks, q_len != kv_len,
# head dims that are not powers of two.
CASES = [(1, 1, 1, 1, 8, False), (2, 3, 37, 37, 24, True), (2, 3, 37, 37, 16, False), (1, 2, 5, 70, 40, True),
         (2, 2, 70, 33, 8, False), (1, 1, 1, 300, 64, True), (1, 2, 130, 130, 20, True), (1, 2, 64, 128, 16, True)]
# Tolerances (absolute, relative) by input dtype; fp16/bf16 outputs are compared with attention computed in fp32.
TOL = {torch.float32: (1e-5, 1e-5), torch.float64: (1e-9, 1e-9), torch.float16: (2e-3, 4e-3),
       torch.bfloat16: (1.6e-2, 2e-2)}


def _qkv(b, h, nq, nk, d, dtype=torch.float32, offset=0, scale=1.0, transposed=False):
    """Random q, k, v from this run's seed. `transposed`: q is a non-contiguous view of a [B, Nq, H, d] tensor,
    as a model's projections produce it."""
    g = generator(offset)
    q = torch.randn(b, nq, h, d, generator=g).transpose(1, 2) if transposed else torch.randn(b, h, nq, d, generator=g)
    k = torch.randn(b, h, nk, d, generator=g)
    v = torch.randn(b, h, nk, d, generator=g)
    return (q * scale).to(dtype), (k * scale).to(dtype), v.to(dtype)


def one_score(q, k, value: float, g) -> torch.Tensor:
    """`k` with one key per batch row and head, at a random place, whose score against query 0 (q . k / sqrt(d)) is
    `value`: past 709, exp overflows even float64 without a max (red team 13b's #3, #10)."""
    k = k.clone()
    b, h, nk, d = k.shape
    for i in range(b):
        for j in range(h):
            at, x = int(torch.randint(0, nk, (1,), generator=g)), q[i, j, 0].double()
            k[i, j, at] = (x * (value * d ** 0.5 / float(x @ x))).to(k.dtype)
    return k


def _ref_lse(q, k, causal):
    s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    if causal:
        s = s.masked_fill(~causal_mask(q.shape[2], k.shape[2], device=q.device), float("-inf"))
    return torch.logsumexp(s, dim=-1)


def _want(q, k, v, causal):
    """Reference output (in q's dtype) and lse (float32 or wider), computed in at least float32."""
    wide = ref.accumulation_dtype(q.dtype)
    qw, kw, vw = q.to(wide), k.to(wide), v.to(wide)
    return ref.naive_attention(qw, kw, vw, causal=causal).to(q.dtype), _ref_lse(qw, kw, causal)


def _bad_shapes(fn, name):
    """Inputs that cannot work must raise ValueError naming the shapes."""
    bad = [((1, 2, 5, 8), (1, 2, 5, 16), (1, 2, 5, 16), False, "head dims differ"),
           ((1, 2, 9, 8), (1, 2, 5, 8), (1, 2, 5, 8), True, "causal with q_len > kv_len"),
           ((2, 2, 5, 8), (1, 2, 5, 8), (1, 2, 5, 8), False, "batch differs"),
           ((1, 4, 5, 8), (1, 2, 5, 8), (1, 2, 5, 8), False, "heads differ (expand GQA heads before calling)")]
    for qs, ks, vs, causal, why in bad:
        try:
            fn(torch.zeros(qs), torch.zeros(ks), torch.zeros(vs), causal=causal)
        except ValueError as e:
            msg = str(e)
            shown = [s for s in (qs, ks) if any(form in msg for form in (str(s), str(list(s)), str(torch.Size(s))))]
            assert len(shown) == 2, (f"{name}: the ValueError for {why} should name the shapes given, e.g. "
                                     f"q {qs}, k {ks}; its message was: {msg!r}")
        else:
            raise AssertionError(f"{name}(q {qs}, k {ks}, v {vs}, causal={causal}) should raise ValueError ({why})")


def _shape(t):
    return tuple(t.shape)


# --- 1, 2 ---------------------------------------------------------------------------------------------

NAIVE = dict(route=dict(lib_allowed=SHAPES_OK, forbidden_ops=SDPA_OPS, why="Write softmax(q kᵀ/√d) v yourself."))


@WEEK.exercise(1, "naive_attention", section="1 (What standard attention costs)")
def check_naive_attention(naive_attention) -> None:
    for i, (b, h, nq, nk, d, causal) in enumerate(CASES):
        q, k, v = _qkv(b, h, nq, nk, d, offset=i, transposed=i % 2 == 1)
        what = f"naive_attention on q {_shape(q)}{' (non-contiguous)' if i % 2 else ''}, k {_shape(k)}, causal={causal}"
        got, _ = call(naive_attention, what, q, k, v, causal=causal, full=i == 0, **NAIVE)
        _close(got, _want(q, k, v, causal)[0], what, *TOL[torch.float32])
    for dtype in (torch.float16, torch.bfloat16):
        q, k, v = _qkv(1, 2, 40, 40, 24, dtype=dtype, offset=20)
        what = f"naive_attention on {dtype} inputs (vs fp32 math)"
        got, _ = call(naive_attention, what, q, k, v, causal=True, **NAIVE)
        _close(got, _want(q, k, v, True)[0], what, *(2 * t for t in TOL[dtype]))
    check_on_meta(naive_attention, (q, k, v), "naive_attention", dict(causal=True))
    _bad_shapes(naive_attention, "naive_attention")


@WEEK.exercise(2, "score_bytes", section="1 (What standard attention costs)")
def check_score_bytes(score_bytes) -> None:
    g = generator(1)
    cases = [((8, 8, 4096, 4096), 4), ((8, 8, 1024, 1024), 4), ((1, 1, 1, 300), 4)]
    cases += [(tuple(int(x) for x in torch.randint(1, 50, (4,), generator=g)), int(torch.randint(1, 50, (1,), generator=g)))
              for _ in range(5)]
    for (b, h, nq, nk), e in cases:
        what = f"score_bytes({b}, {h}, {nq}, {nk}" + (f", bytes_per_element={e})" if e != 4 else ")")
        got, _ = call(score_bytes, what, b, h, nq, nk, full=nk == 300, **({"bytes_per_element": e} if e != 4 else {}))
        assert got == b * h * nq * nk * e, (f"{what} = {got}; expected {b * h * nq * nk * e} "
                                            f"(batch·heads·q_len·kv_len·bytes per element) {seed_note()}")
    sweep.score_bytes(score_bytes)


# --- 3 ------------------------------------------------------------------------------------------------

@WEEK.exercise(3, "online_softmax", section="2 (Online softmax)")
def check_online_softmax(online_softmax) -> None:
    g = generator(3)

    def run(x, c, what, *tol, full=False):
        got, _ = call(online_softmax, what, x, c, full=full, **softmax_route(x, c))
        _close(got, torch.softmax(x, dim=-1), what, *tol)

    for shape, chunks in [((1, 10), (1, 3, 10, 15)), ((4, 37), (1, 5, 8, 36, 37)), ((2, 3, 64), (7, 16, 64))]:
        x = torch.randn(shape, generator=g) * 3
        for c in chunks:
            run(x, c, f"online_softmax(x {shape}, chunk_size={c})", 1e-6, 1e-5)
    x = torch.randn(3, 50, generator=g) * 1e4  # exp(1e4) overflows: the running max must be subtracted
    run(x, 7, "online_softmax on entries of size 1e4", 1e-6)
    x = torch.randn(3, 50, generator=g)
    x[0, :20] = float("-inf")  # a whole first chunk of -inf: the running max is still -inf after it
    x[1, 7] = float("-inf")
    x[2, 40:] = float("-inf")
    run(x, 10, "online_softmax with -inf entries (row 0's first 2 chunks all -inf)", 1e-6)
    x = torch.randn(5, 33, generator=g, dtype=torch.float64).t()  # non-contiguous, float64
    run(x, 4, "online_softmax on a non-contiguous float64 input", 1e-12)
    # The technique, on rows of 32-33 chunks (a length that does not divide by them): every element read, once.
    cols = 256 + int(torch.randint(2, 8, (1,), generator=g))
    x = torch.randn(4, cols, generator=g) * 3
    run(x, 8, f"online_softmax(x [4, {cols}], chunk_size=8)", 1e-6, 1e-5, full=True)
    check_on_meta(online_softmax, (x, 16), "online_softmax")


# --- 4 ------------------------------------------------------------------------------------------------

def _forward(flash_attention_forward, q, k, v, causal, bq, bk, what, **kwargs):
    """One observed call, its route judged (`week17_routes.forward_route`); returns (out, lse)."""
    res, _ = call(flash_attention_forward, what, q, k, v, causal=causal, block_q=bq, block_k=bk,
                  **forward_route(q, k, causal, bq, bk), **kwargs)
    assert isinstance(res, tuple) and len(res) == 2, f"{what} should return a tuple (out, lse)"
    return res


def _forward_memory(flash_attention_forward, offset) -> None:
    """Memory beyond the results may grow with N by O(N·d), not by a row of scores per query block."""
    g = generator(offset)
    n1 = int(torch.randint(129, 189, (1,), generator=g))  # blocks of 64 divide neither length
    heads, d, block = 8, 8, 64
    peaks = {}
    for n in (n1, n1 + 384):
        q, k, v = _qkv(1, heads, n, n, d, offset=offset + n)
        what = f"flash_attention_forward(q [1, {heads}, {n}, {d}], block_q={block}, block_k={block})"
        (out, lse), obs = call(flash_attention_forward, what, q, k, v, causal=False, block_q=block, block_k=block,
                               full=True, _observe_host=True, **forward_route(q, k, False, block, block))
        want, want_lse = _want(q, k, v, False)
        _close(out, want, what + " output", *TOL[torch.float32])
        _close(lse, want_lse, what + " logsumexp", *TOL[torch.float32])
        peaks[n] = obs.all_peak_bytes - (q.numel() * q.element_size() + heads * n * 4)  # beyond out and lse (fp32)
    assert_memory_growth(peaks, f"flash_attention_forward with {block}×{block} blocks, {heads} heads, d={d}", heads, d,
                         block)


@WEEK.exercise(4, "flash_attention_forward", section="3 (The tiled forward pass)")
def check_flash_attention_forward(flash_attention_forward) -> None:
    # Every call observed and held to the route (blocks, FLOPs, reads: `week17_routes.forward_route`), on lengths
    # the blocks do not divide, q_len != kv_len, several block shapes per case.
    for i, (b, h, nq, nk, d, causal) in enumerate(CASES):
        q, k, v = _qkv(b, h, nq, nk, d, offset=100 + i, transposed=i % 2 == 1)
        want, want_lse = _want(q, k, v, causal)
        for bq, bk in [(16, 16), (7, 13), (128, 64)] + ([(1, 1)] if nq * nk <= 100 else []):
            what = (f"flash_attention_forward(q {_shape(q)}{' non-contiguous' if i % 2 else ''}, k {_shape(k)}, "
                    f"causal={causal}, block_q={bq}, block_k={bk})")
            out, lse = _forward(flash_attention_forward, q, k, v, causal, bq, bk, what, full=(i, bq) == (6, 16))
            _close(out, want, what + " output", *TOL[torch.float32])
            _close(lse, want_lse, what + " logsumexp [B, H, Nq]", *TOL[torch.float32])
    for dtype in (torch.float16, torch.bfloat16):
        q, k, v = _qkv(1, 2, 150, 150, 40, dtype=dtype, offset=120)
        want, want_lse = _want(q, k, v, True)
        what = f"flash_attention_forward on {dtype} inputs, N=150, d=40"
        out, lse = _forward(flash_attention_forward, q, k, v, True, 32, 32, what)
        _close(out, want, what + " output (vs attention in fp32; keep m, l and acc in float32)", *TOL[dtype])
        _close(lse, want_lse, what + " lse (float32: accumulate in fp32, as FlashAttention's kernels do)", 1e-3, 1e-4,
               dtype=torch.float32)
    q, k, v = _qkv(1, 2, 50, 50, 16, scale=8.0, offset=130)  # scores of size ~500: exp overflows fp32 without the max
    out, lse = _forward(flash_attention_forward, q, k, v, True, 16, 16, "flash_attention_forward on large scores")
    want, want_lse = _want(q, k, v, True)
    _close(out, want, "flash_attention_forward on large scores", 1e-4, 1e-4)
    _close(lse, want_lse, "flash_attention_forward's logsumexp on large scores", 1e-4, 1e-5)
    # Causal: the blocks computed must be exactly those not wholly above the (bottom-right aligned) diagonal.
    for nq, nk, bq, bk in [(100, 100, 16, 32), (5, 70, 2, 8), (64, 64, 16, 16), (33, 97, 8, 16)]:
        q, k, v = _qkv(1, 1, nq, nk, 8, offset=140)
        visited = []
        what = f"flash_attention_forward(q [1, 1, {nq}, 8], k [1, 1, {nk}, 8], causal=True, block_q={bq}, block_k={bk})"
        out, lse = _forward(flash_attention_forward, q, k, v, True, bq, bk, what, visited=visited)
        want_out, want_lse = _want(q, k, v, True)
        _close(out, want_out, what + " output", *TOL[torch.float32])
        _close(lse, want_lse, what + " logsumexp", *TOL[torch.float32])
        want = blocks(nq, nk, bq, bk, True)
        extra, missing = sorted(set(visited) - set(want)), sorted(set(want) - set(visited))
        assert not extra and not missing, (
            f"causal, Nq={nq}, Nk={nk}, block_q={bq}, block_k={bk}: visited (q_start, k_start) blocks differ from the "
            f"expected {len(want)}: computed but wholly masked {extra[:5]}, needed but skipped {missing[:5]}")
        assert len(visited) == len(want), f"causal, Nq={nq}, Nk={nk}: {len(visited)} blocks recorded, some twice; expected {len(want)}"
    _forward_memory(flash_attention_forward, offset=150)
    q, k, v = _qkv(1, 2, 20, 30, 8, offset=160)
    check_on_meta(flash_attention_forward, (q, k, v), "flash_attention_forward", dict(causal=True, block_q=8, block_k=8))
    _bad_shapes(lambda q, k, v, causal: flash_attention_forward(q, k, v, causal=causal), "flash_attention_forward")


# --- 5, 6 ---------------------------------------------------------------------------------------------

@WEEK.exercise(5, "standard_io", section="4 (Counting HBM traffic)")
def check_standard_io(standard_io) -> None:
    g = generator(5)
    cases = [(1, 1), (4096, 128)] + [tuple(int(x) for x in torch.randint(1, 5000, (2,), generator=g)) for _ in range(4)]
    for n, d in cases:
        want = io_model.standard_io(n, d)
        got, _ = call(standard_io, f"standard_io({n}, {d})", n, d, full=n == 1)
        assert tuple(got) == tuple(want), (
            f"standard_io({n}, {d}) = {tuple(got)}; expected (reads, writes) = {tuple(want)}: read Q, K (2Nd), write S (N²); "
            f"read S, write P (N² each); read P (N²) and V (Nd), write O (Nd) {seed_note()}")
    q, k, v = _qkv(1, 1, 48, 48, 8, dtype=torch.float64, offset=5)
    _, counted = io_model.run_standard(q[0, 0], k[0, 0], v[0, 0])
    got, _ = call(standard_io, "standard_io(48, 8)", 48, 8)
    assert tuple(got) == tuple(counted), f"standard_io(48, 8) = {tuple(got)}; an instrumented run counted {tuple(counted)}"
    sweep.standard_io(standard_io)


@WEEK.exercise(6, "flash_io", section="4 (Counting HBM traffic)")
def check_flash_io(flash_io) -> None:
    g = generator(6)
    cases = [(100, 8, 64), (4096, 64, 100_000), (65536, 128, 2 ** 16)]
    for _ in range(5):
        n, d = int(torch.randint(1, 70_000, (1,), generator=g)), int(torch.randint(1, 257, (1,), generator=g))
        cases.append((n, d, 4 * d * int(torch.randint(1, 2000, (1,), generator=g)) + int(torch.randint(0, 4 * d, (1,), generator=g))))
    for n, d, m in cases:
        want = io_model.flash_io(n, d, m)
        got, _ = call(flash_io, f"flash_io({n}, {d}, {m})", n, d, m, full=m == 64)
        b_r, b_c = io_model.block_sizes(d, m)
        assert tuple(got) == tuple(want), (
            f"flash_io({n}, {d}, {m}) = {tuple(got)}; expected (reads, writes) = {tuple(want)}. Here B_c = {b_c}, B_r = {b_r}, "
            f"T_c = {math.ceil(n / b_c)}: K and V are read once, Q, O, l, m once per key block, O, l, m written once per key block "
            f"(and once at initialisation) {seed_note()}")
    for n, d, m in [(100, 8, 64), (130, 16, 700)]:
        q, k, v = _qkv(1, 1, n, n, d, dtype=torch.float64, offset=6)
        _, counted, _ = io_model.run_algorithm1(q[0, 0], k[0, 0], v[0, 0], m)
        got, _ = call(flash_io, f"flash_io({n}, {d}, {m})", n, d, m)
        assert tuple(got) == tuple(counted), f"flash_io({n}, {d}, {m}) = {tuple(got)}; an instrumented run of Algorithm 1 counted {tuple(counted)}"
    sweep.flash_io(flash_io)


# --- 7, 8 ---------------------------------------------------------------------------------------------

def _grads(q, k, v, causal, dout):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    ref.naive_attention(q, k, v, causal=causal).backward(dout)
    return q.grad, k.grad, v.grad


def _backward(flash_attention_backward, what, q, k, v, out, lse, dout, causal, bq, bk, **kwargs):
    got, obs = call(flash_attention_backward, what, q, k, v, out, lse, dout, causal=causal, block_q=bq, block_k=bk,
                    **backward_route(q, k, causal, bq, bk), **kwargs)
    assert isinstance(got, tuple) and len(got) == 3, f"{what} should return (dq, dk, dv)"
    return got, obs


@WEEK.exercise(7, "flash_attention_backward", section="5 (The backward pass)")
def check_flash_attention_backward(flash_attention_backward) -> None:
    for i, (b, h, nq, nk, d, causal) in enumerate(CASES[1:6] + [(1, 1, 1, 1, 4, True)]):
        q, k, v = _qkv(b, h, nq, nk, d, dtype=torch.float64, offset=200 + i, transposed=i % 2 == 1)
        dout = torch.randn(q.shape, dtype=torch.float64, generator=generator(210 + i))
        out, lse = ref.flash_attention_forward(q, k, v, causal=causal)
        want = _grads(q, k, v, causal, dout)
        for bq, bk in [(16, 16), (7, 13)]:
            what = f"flash_attention_backward(q {_shape(q)}, k {_shape(k)}, causal={causal}, block_q={bq}, block_k={bk})"
            got, _ = _backward(flash_attention_backward, what, q, k, v, out, lse, dout, causal, bq, bk, full=(i, bq) == (0, 16))
            for name, g_, w in zip(("dq", "dk", "dv"), got, want):
                _close(g_, w, f"{what}: {name}", 1e-9, 1e-9)
    # The saved statistics must be used, not recomputed: feed a shifted lse and a perturbed out. The math says
    # P = exp(S - lse) scales row i by exp(-shift_i), and D = rowsum(dO ∘ O) uses the out it is given.
    q, k, v = _qkv(1, 2, 45, 45, 12, dtype=torch.float64, offset=220)
    g = generator(221)
    out, lse = ref.flash_attention_forward(q, k, v, causal=True)
    dout = torch.randn(q.shape, dtype=torch.float64, generator=g)
    shift = torch.rand(lse.shape, dtype=torch.float64, generator=g) * 2 - 1
    out_moved = out + 0.1 * torch.randn(out.shape, dtype=torch.float64, generator=g)
    for name, o_, l_ in [("lse shifted by a random amount per row", out, lse + shift),
                         ("out perturbed", out_moved, lse)]:
        want = ref.flash_attention_backward(q, k, v, o_, l_, dout, causal=True, block_q=16, block_k=16)
        got, _ = _backward(flash_attention_backward, f"flash_attention_backward given {name}", q, k, v, o_, l_, dout,
                           True, 16, 16)
        for gname, g_, w in zip(("dq", "dk", "dv"), got, want):
            _close(g_, w, f"flash_attention_backward given {name}: {gname} (use the saved lse, P = exp(S − lse), and "
                          f"D = rowsum(dO ∘ out) from the given out — do not recompute the softmax or the output)",
                   1e-9, 1e-9)
    for dtype in (torch.float16, torch.bfloat16):
        q, k, v = _qkv(1, 2, 40, 40, 24, dtype=dtype, offset=230)
        dout = torch.randn(q.shape, generator=generator(231)).to(dtype)
        out, lse = ref.flash_attention_forward(q, k, v, causal=True)
        got, _ = _backward(flash_attention_backward, f"flash_attention_backward on {dtype} inputs", q, k, v, out, lse,
                           dout, True, 16, 16)
        want = ref.flash_attention_backward(q.float(), k.float(), v.float(), out.float(), lse, dout.float(), causal=True,
                                            block_q=16, block_k=16)
        for gname, g_, w in zip(("dq", "dk", "dv"), got, want):
            _close(g_, w.to(dtype), f"flash_attention_backward on {dtype} inputs: {gname} (accumulate in float32, "
                                    f"return the inputs' dtype)", *(4 * t for t in TOL[dtype]))
    # The technique at N=1024: memory of a few blocks, not of the probability matrix.
    q, k, v = _qkv(1, 2, 1024, 1024, 8, offset=250)
    out, lse = ref.flash_attention_forward(q, k, v)
    dout = torch.ones_like(out)
    got, obs = _backward(flash_attention_backward, "flash_attention_backward(q [1, 2, 1024, 8], 128×128 blocks)",
                         q, k, v, out, lse, dout, False, 128, 128, full=True, _observe_host=True)
    for gname, g_, w in zip(("dq", "dk", "dv"), got, _grads(q, k, v, False, dout)):
        _close(g_, w, f"flash_attention_backward at N=1024: {gname}", 1e-4, 1e-4)
    full = ref.score_bytes(1, 2, 1024, 1024)
    assert obs.all_peak_bytes < full / 4, (
        f"flash_attention_backward at N=1024 with 128×128 blocks allocated {obs.all_peak_bytes / 1e6:.1f} MB at peak "
        f"(tensors, numpy arrays and lists); the full probability matrix is {full / 1e6:.1f} MB: recompute P block "
        f"by block from lse")
    q, k, v = _qkv(1, 2, 20, 30, 8, offset=260)
    out, lse = ref.flash_attention_forward(q, k, v, causal=True)
    check_on_meta(flash_attention_backward, (q, k, v, out, lse, out), "flash_attention_backward",
                  dict(causal=True, block_q=8, block_k=8))


def _observed_function(FlashAttention, seen: list):
    """A torch.autograd.Function whose forward and backward are the notebook's, each call observed (`seen` gets
    ("forward" | "backward", args, observation)). In the graded child the notebook's class is a proxy's
    (`grader.proxy.autograd_function_of`: `_remote`), and its methods are observed there."""
    own = getattr(FlashAttention, "_remote", FlashAttention)
    forward, backward = own.forward, own.backward

    class Observed(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *args):
            out, obs = observe(forward, ctx, *args, _observe_light=True, _observe_reads=((1, 2), (2, 2), (3, 2)))
            seen.append(("forward", args, obs))
            return out

        @staticmethod
        def backward(ctx, *grads):
            got, obs = observe(backward, ctx, *grads, _observe_light=True)
            seen.append(("backward", grads, obs))
            return got

    return Observed


def _judge_function(seen: list, what: str) -> None:
    """Each observed forward and backward of `_observed_function`, held to the forward's and backward's routes."""
    for kind, args, obs in seen:
        if kind == "forward":
            q, k, _, causal, bq, bk = (list(args) + [False, 128, 128])[:6]
            spec = forward_route(q, k, causal, bq, bk, offset=1)
            route = dict(spec["route"])
            route.pop("max_flops")
            assert_route(obs, f"{what} forward", **route)
            assert_visits(obs, f"{what} forward", spec["visits"])
    backward = [obs for kind, _, obs in seen if kind == "backward"]
    forward = [args for kind, args, _ in seen if kind == "forward"]
    for obs, args in zip(backward, forward):
        q, k, _, causal, bq, bk = (list(args) + [False, 128, 128])[:6]
        assert_route(obs, f"{what} backward", **backward_route(q, k, causal, bq, bk)["route"])


@WEEK.exercise(8, "FlashAttention", section="5 (The backward pass)")
def check_FlashAttention(FlashAttention) -> None:
    assert isinstance(FlashAttention, type) and issubclass(FlashAttention, torch.autograd.Function), (
        "FlashAttention should be a subclass of torch.autograd.Function")
    assert not issubclass(FlashAttention, ref.FlashAttention), "FlashAttention must be yours, not a subclass of lib's"
    # Forward and backward through autograd, every call observed (blocks only, no softmax of a row, the products of
    # every visible pair), the gradients against attention's own in float64 and in float32.
    for i, (b, h, nq, nk, d, causal, bq, bk, dtype) in enumerate(
            [(1, 2, 9, 9, 4, True, 4, 3, torch.float64), (1, 1, 5, 12, 6, True, 2, 5, torch.float64),
             (2, 1, 7, 6, 3, False, 3, 4, torch.float64), (1, 2, 100, 100, 24, True, 32, 16, torch.float32)]):
        q, k, v = (t.requires_grad_() for t in _qkv(b, h, nq, nk, d, dtype=dtype, offset=300 + i))
        what = f"FlashAttention.apply(q {_shape(q)}, k {_shape(k)}, causal={causal}, block_q={bq}, block_k={bk})"
        seen = []
        out = _observed_function(FlashAttention, seen).apply(q, k, v, causal, bq, bk)
        _close(out, _want(q.detach(), k.detach(), v.detach(), causal)[0], what + " output", *TOL[dtype])
        dout = torch.randn(out.shape, dtype=dtype, generator=generator(310 + i))
        out.backward(dout)
        assert [kind for kind, _, _ in seen] == ["forward", "backward"], (
            f"{what}: autograd ran {[kind for kind, _, _ in seen]}; one forward and one backward expected")
        _judge_function(seen, what)
        for name, g_, w in zip(("dq", "dk", "dv"), (q.grad, k.grad, v.grad), _grads(q, k, v, causal, dout)):
            assert g_ is not None, f"{what}: no gradient for {name}: backward must return (dq, dk, dv, None, None, None)"
            _close(g_, w, f"{what}: gradient {name}", *((1e-9, 1e-9) if dtype == torch.float64 else (1e-5, 1e-4)))
    # What forward keeps for backward (saved tensors and anything set on ctx) and holds at its peak: O(N·d) — q, k,
    # v, out, lse — not P (N×N: 16x q's size here), whole or in blocks, on ctx or anywhere else.
    n, d, block = 256, 8, 32
    q, k, v = (t.requires_grad_() for t in _qkv(1, 1, n, n, d, offset=320))
    what = f"FlashAttention.apply(q [1, 1, {n}, {d}], causal=False, {block}, {block})"
    seen = []
    out = _observed_function(FlashAttention, seen).apply(q, k, v, False, block, block)
    _close(out, _want(q.detach(), k.detach(), v.detach(), False)[0], what + " output", *TOL[torch.float32])
    allowed = 8 * n * d * 4 + 4 * n * 4
    kept = _held_bytes(out.grad_fn)
    assert kept <= allowed, (
        f"{what}: forward kept {kept / 1e3:.0f} kB of tensors for backward (saved, or set on ctx); q, k, v, out and "
        f"lse are {(4 * n * d + n) * 4 / 1e3:.0f} kB, the probabilities {n * n * 4 / 1e3:.0f} kB: save q, k, v, out "
        f"and lse, never P")
    peak = seen[0][2].peak_bytes
    assert peak <= allowed + 8 * block * block * 4, (
        f"{what}: forward held {peak / 1e3:.0f} kB of tensors at its peak; q, k, v, out and lse are "
        f"{(4 * n * d + n) * 4 / 1e3:.0f} kB and a block of scores {block * block * 4 / 1e3:.0f} kB: compute P block "
        f"by block and keep none of it")
    dout = torch.randn(out.shape, generator=generator(321))
    out.backward(dout)
    _judge_function(seen, what)
    for name, g_, w in zip(("dq", "dk", "dv"), (q.grad, k.grad, v.grad), _grads(q, k, v, False, dout)):
        _close(g_, w, f"{what}: gradient {name}", 1e-5, 1e-4)


def _held_bytes(ctx) -> int:
    """Bytes of the distinct tensors an autograd ctx holds: saved for backward, or set on it (in lists too)."""
    found, todo = {}, list(ctx.saved_tensors) + list(vars(ctx).values())
    while todo:
        v = todo.pop()
        if isinstance(v, torch.Tensor):
            found[(v.untyped_storage().data_ptr(), v.untyped_storage().nbytes())] = v.untyped_storage().nbytes()
        elif isinstance(v, (list, tuple)):
            todo += list(v)[:10000]
        elif isinstance(v, dict):
            todo += list(v.values())[:10000]
    return sum(found.values())


# --- 7 ------------------------------------------------------------------------------------------------


@WEEK.exercise(17, "predict_peak_bytes", section="7 (On the real model)")
def check_predict_peak_bytes(predict_peak_bytes) -> None:
    """Graded on the student's model of attention's peak memory, naive and tiled, on configurations drawn per run
    (`week17_predict`: the model and the mistakes it tells apart)."""
    def run(fn, *args):
        got, obs = observe(fn, *args)
        assert_route(obs, "predict_peak_bytes")
        return got

    predict.judge(predict_peak_bytes, run)


# --- 9 ------------------------------------------------------------------------------------------------

@WEEK.exercise(9, "merge_partials", section="6 (One query, many keys: split-K)")
def check_merge_partials(merge_partials) -> None:
    g = generator(400)
    for n_parts in (1, 2, 5, int(torch.randint(6, 13, (1,), generator=g))):  # and a count drawn for this run
        b, h, nq, d = 2, 3, 4, 24
        outs = [torch.randn(b, h, nq, d, generator=g) for _ in range(n_parts)]
        lses = [torch.randn(b, h, nq, generator=g) * 5 for _ in range(n_parts)]
        for scale, label in [(1.0, "lse of size ~5"), (2000.0, "lse of size ~1e4 (exp overflows: subtract the max)")]:
            ls = [s * scale for s in lses]
            want_out, want_lse = ref.merge_partials(outs, ls)
            what = f"merge_partials of {n_parts} parts, {label}"
            res, _ = call(merge_partials, what, outs, ls, full=(n_parts, scale) == (2, 1.0))
            assert isinstance(res, tuple) and len(res) == 2, "merge_partials should return a tuple (out, lse)"
            _close(res[0], want_out, what + ": out", 1e-5, 1e-5)
            _close(res[1], want_lse, what + ": lse", 1e-4, 1e-6)
    # Empty parts (a split with no keys: out 0, lse -inf) contribute nothing; a part with all the mass dominates.
    outs = [torch.randn(1, 2, 3, 8, generator=g) for _ in range(4)]
    lses = [torch.randn(1, 2, 3, generator=g) for _ in range(4)]
    outs[1] = torch.zeros_like(outs[1])
    lses[1] = torch.full_like(lses[1], float("-inf"))
    lses[2][0, 0] = float("-inf")
    outs[2][0, 0] = 0.0
    lses[3][0, 1] = 1e4
    want_out, want_lse = ref.merge_partials(outs, lses)
    what = "merge_partials with empty parts (lse -inf) and one lse of 1e4"
    (out, lse), _ = call(merge_partials, what, outs, lses)
    _close(out, want_out, what + ": out", 1e-5, 1e-5)
    _close(lse, want_lse, what + ": lse", 1e-4, 1e-6)
    check_on_meta(merge_partials, (outs, lses), "merge_partials")


@WEEK.exercise(10, "flash_decode", section="6 (One query, many keys: split-K)")
def check_flash_decode(flash_decode) -> None:
    def run(q, k, v, n_splits, what, tol, full=False):
        got, _ = call(flash_decode, what, q, k, v, n_splits=n_splits, full=full, **decode_route(q, k, n_splits))
        _close(got, _want(q, k, v, False)[0], what, *tol)

    for i, (b, h, nq, nk, d) in enumerate([(1, 2, 1, 300, 64), (2, 3, 1, 37, 24), (1, 1, 1, 5, 8), (1, 2, 4, 50, 40)]):
        q, k, v = _qkv(b, h, nq, nk, d, offset=500 + i, transposed=i % 2 == 1)
        for n_splits in sorted({1, 2, 3, 7} | ({nk, nk + 3} if nk <= 50 else set())):  # one split a key, and more
            run(q, k, v, n_splits, f"flash_decode(q {_shape(q)}, k {_shape(k)}, n_splits={n_splits})"
                + (" — more splits than keys: some splits are empty (lse -inf)" if n_splits > nk else ""),
                TOL[torch.float32])
    for dtype in (torch.float16, torch.bfloat16):
        q, k, v = _qkv(1, 2, 1, 257, 40, dtype=dtype, offset=510)
        run(q, k, v, 5, f"flash_decode on {dtype} inputs (merge in float32)", TOL[dtype])
    q, k, v = _qkv(1, 2, 1, 61, 16, scale=8.0, offset=530)  # scores of size ~500 (red team 11: a split without its max)
    run(q, k, v, 4, "flash_decode on large scores (~500: exp overflows float32 unless each split subtracts its own "
        "max)", (1e-4, 1e-4))
    q, k, v = _qkv(1, 2, 1, 61, 16, offset=531)  # red team 13b's #10: no max at all, in float64
    run(q, one_score(q, k, 1000.0, generator(532)), v, 4, "flash_decode with one score of 1000 per head (exp overflows "
        "float64 too unless each split subtracts its own max)", (1e-4, 1e-4))
    # The technique, with splits the keys do not divide: each split sees only its own keys, each key read once.
    g = generator(520)
    nk, n_splits, d = 240 + int(torch.randint(1, 8, (1,), generator=g)), 8, 24
    q, k, v = _qkv(1, 2, 1, nk, d, offset=520)
    run(q, k, v, n_splits, f"flash_decode(k [1, 2, {nk}, {d}], n_splits={n_splits})", TOL[torch.float32], full=True)
    check_on_meta(flash_decode, (q, k, v), "flash_decode", dict(n_splits=3))


# --- 11, 12, 13: Triton (the checks are grader.checks.week17_triton's) --------------------------------

TRITON = "8 (The kernel itself: FlashAttention in Triton)"
check_softmax_rows = WEEK.exercise(11, "softmax_rows", section=TRITON)(tri.check_softmax_rows)
check_tiled_matmul = WEEK.exercise(12, "tiled_matmul", section=TRITON)(tri.check_tiled_matmul)
check_flash_attention_triton = WEEK.exercise(13, "flash_attention_triton", section=TRITON)(tri.check_flash_attention_triton)


# --- quiz ---------------------------------------------------------------------------------------------

@WEEK.exercise(14, "answer_q1", section="9 (Check your understanding)")
def check_answer_q1(answer_q1) -> None:
    got = float(answer_q1())
    assert abs(got - 268.435456) < 0.5, f"answer_q1() = {got}: not the fp32 score matrix of [8, 8, 1024, 1024] in MB (10^6 bytes)"


@WEEK.exercise(15, "answer_q2", section="9 (Check your understanding)")
def check_answer_q2(answer_q2) -> None:
    got = answer_q2()
    assert got == 528, f"answer_q2() = {got}: count the (query block, key block) pairs on or below the diagonal of a 32×32 grid of blocks"


@WEEK.exercise(16, "answer_q3", section="9 (Check your understanding)")
def check_answer_q3(answer_q3) -> None:
    got = float(answer_q3())
    assert abs(got - 4.0) < 1e-6, f"answer_q3() = {got}: weight each partial output by exp(its lse − the total lse)"
