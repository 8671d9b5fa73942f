"""Week 17 — FlashAttention: the milestone checks, used by solutions/17/test_week17.py and the notebook.

Every check follows the three rules of `grader.checks` (data in, data out; seeded random inputs; only the
technique passes). What each one rejects besides wrong numbers (tests/test_week17_checks.py has them all):

- naive_attention: SDPA or `lib`'s reference under another name; a CPU tensor mixed into a GPU computation.
- score_bytes, standard_io, flash_io: `lib`'s functions; a table of the checked values (inputs are random).
- online_softmax: `torch.softmax` (or any reduction) over the whole row instead of chunk by chunk.
- flash_attention_forward: naive attention plus a logsumexp (full rows or a full score matrix), `lib`'s reference,
  SDPA; fp32 state for fp16/bf16 inputs is required (lse in float32); causal work must be about half (FLOPs);
  memory beyond the output must not grow with N; masks built on the CPU.
- merge_partials: a merge that overflows (lse of 1e4) or turns an empty part (lse −inf) into NaN; `lib`'s merge.
- flash_attention_backward: autograd through naive attention, recomputing the softmax instead of using the
  saved lse, recomputing O instead of using the saved out (both are fed perturbed), full rows.
- FlashAttention: saving P; a backward that re-runs autograd over naive attention; `lib`'s Function.
- flash_decode: naive attention or one unsplit pass (a matmul over all keys), `lib`'s reference; more splits
  than keys must work.
- softmax_rows, tiled_matmul, flash_attention_triton (Triton, `week17_triton`): a wrapper doing torch arithmetic,
  no kernel launched or too few `tl.dot` FLOPs (numpy, Python), a `tl.dot` wider than the blocks, one program for
  all rows, causal blocks loaded (FLOPs), P stored (memory), no rescaling, wrong mask fill values, strides ignored.
"""
from __future__ import annotations

import math

import torch

from grader.checks import assert_close as _close
from grader.checks import assert_route, check_on_meta, generator, observe, seed_note
from grader.checks import week17_triton as tri
from grader.harness import Week
from lib import attention as ref
from lib import io_model
from lib.masks import causal_mask

WEEK = Week(17, "week17_flash_attention.ipynb",
            child_may_use={"lib.attention": ("check_attention_shapes",), "lib.masks": ("causal_mask",),
                           "lib.triton_attention": ("check_triton_attention_shapes", "kernel_device", "interpreting")})

# (batch, heads, q_len, kv_len, head_dim, causal): lengths that are not multiples of the blocks, q_len != kv_len,
# head dims that are not powers of two.
CASES = [(1, 1, 1, 1, 8, False), (2, 3, 37, 37, 24, True), (2, 3, 37, 37, 16, False), (1, 2, 5, 70, 40, True),
         (2, 2, 70, 33, 8, False), (1, 1, 1, 300, 64, True), (1, 2, 130, 130, 20, True), (1, 2, 64, 128, 16, True)]
SDPA_OPS = ("aten._scaled_dot_product", "aten.scaled_dot_product", "aten._flash_attention", "aten._efficient_attention")
SHAPES_OK = ("lib.attention.check_attention_shapes", "lib.masks.causal_mask")  # the helpers the notebook imports
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

@WEEK.exercise(1, "naive_attention", section="1 (What standard attention costs)")
def check_naive_attention(naive_attention) -> None:
    for i, (b, h, nq, nk, d, causal) in enumerate(CASES):
        q, k, v = _qkv(b, h, nq, nk, d, offset=i, transposed=i % 2 == 1)
        want, _ = _want(q, k, v, causal)
        _close(naive_attention(q, k, v, causal=causal), want,
               f"naive_attention on q {_shape(q)}{' (non-contiguous)' if i % 2 else ''}, k {_shape(k)}, causal={causal}",
               *TOL[torch.float32])
    for dtype in (torch.float16, torch.bfloat16):
        q, k, v = _qkv(1, 2, 40, 40, 24, dtype=dtype, offset=20)
        want, _ = _want(q, k, v, True)
        _close(naive_attention(q, k, v, causal=True), want, f"naive_attention on {dtype} inputs (vs fp32 math)",
               *(2 * t for t in TOL[dtype]))
    q, k, v = _qkv(1, 2, 33, 47, 24, offset=30)
    _, obs = observe(naive_attention, q, k, v, causal=True)
    assert_route(obs, "naive_attention", lib_allowed=SHAPES_OK, forbidden_ops=SDPA_OPS,
                 why="Write softmax(q kᵀ/√d) v yourself.")
    check_on_meta(naive_attention, (q, k, v), "naive_attention", dict(causal=True))
    _bad_shapes(naive_attention, "naive_attention")


@WEEK.exercise(2, "score_bytes", section="1 (What standard attention costs)")
def check_score_bytes(score_bytes) -> None:
    for args, want in [((8, 8, 4096, 4096), 4_294_967_296), ((8, 8, 1024, 1024), 268_435_456), ((1, 1, 1, 300), 1200)]:
        got = score_bytes(*args)
        assert got == want, f"score_bytes{args} = {got}; expected {want} (batch·heads·q_len·kv_len·4 bytes in fp32)"
    g = generator(1)
    for _ in range(5):
        b, h, nq, nk, e = (int(x) for x in torch.randint(1, 50, (5,), generator=g))
        want = b * h * nq * nk * e
        got, obs = observe(score_bytes, b, h, nq, nk, bytes_per_element=e)
        assert got == want, (f"score_bytes({b}, {h}, {nq}, {nk}, bytes_per_element={e}) = {got}; expected {want} "
                             f"{seed_note()}")
        assert_route(obs, "score_bytes")


# --- 3 ------------------------------------------------------------------------------------------------

@WEEK.exercise(3, "online_softmax", section="2 (Online softmax)")
def check_online_softmax(online_softmax) -> None:
    g = generator(3)
    for shape, chunks in [((1, 10), (1, 3, 10, 15)), ((4, 37), (1, 5, 8, 36, 37)), ((2, 3, 64), (7, 16, 64))]:
        x = torch.randn(shape, generator=g) * 3
        for c in chunks:
            _close(online_softmax(x, c), torch.softmax(x, dim=-1), f"online_softmax(x {shape}, chunk_size={c})", 1e-6, 1e-5)
    x = torch.randn(3, 50, generator=g) * 1e4  # exp(1e4) overflows: the running max must be subtracted
    _close(online_softmax(x, 7), torch.softmax(x, dim=-1), "online_softmax on entries of size 1e4", 1e-6)
    x = torch.randn(3, 50, generator=g)
    x[0, :20] = float("-inf")  # a whole first chunk of -inf: the running max is still -inf after it
    x[1, 7] = float("-inf")
    x[2, 40:] = float("-inf")
    _close(online_softmax(x, 10), torch.softmax(x, dim=-1), "online_softmax with -inf entries (row 0's first 2 chunks all -inf)", 1e-6)
    x = torch.randn(5, 33, generator=g, dtype=torch.float64).t()  # non-contiguous, float64
    _close(online_softmax(x, 4), torch.softmax(x, dim=-1), "online_softmax on a non-contiguous float64 input", 1e-12)
    # The technique: no reduction may see more than one chunk of a row.
    x = torch.randn(4, 200, generator=g)
    got, obs = observe(online_softmax, x, 16)
    _close(got, torch.softmax(x, dim=-1), "online_softmax(x [4, 200], chunk_size=16), the call whose route is judged",
           1e-6, 1e-5)
    assert_route(obs, "online_softmax(x [4, 200], chunk_size=16)", forbidden_ops=("aten._softmax", "aten._log_softmax"),
                 max_extent=16, why="Read each row 16 entries at a time, keeping a running max and a rescaled running sum.")
    check_on_meta(online_softmax, (x, 16), "online_softmax")


# --- 4 ------------------------------------------------------------------------------------------------

def _forward_route(flash_attention_forward, offset) -> None:
    """Blocks only, no lib, causal skips work (FLOPs), memory beyond the output does not grow with N."""
    bq, bk, d = 32, 16, 24
    q, k, v = _qkv(1, 2, 128, 128, d, offset=offset)
    what = "flash_attention_forward(q [1, 2, 128, 24], block_q=32, block_k=16)"
    _, obs_full = observe(flash_attention_forward, q, k, v, causal=False, block_q=bq, block_k=bk)
    assert_route(obs_full, what, lib_allowed=SHAPES_OK, forbidden_ops=SDPA_OPS, max_extent=max(bq, bk, d),
                 why="Never hold more than a [block_q, block_k] block of scores.",
                 min_flops=int(0.9 * 4 * q.shape[0] * q.shape[1] * 128 * 128 * d))  # QKᵀ and PV: 4·N²·d a head
    _, obs_causal = observe(flash_attention_forward, q, k, v, causal=True, block_q=bq, block_k=bk)
    assert_route(obs_causal, what + " causal", lib_allowed=SHAPES_OK, forbidden_ops=SDPA_OPS, max_extent=max(bq, bk, d))
    ratio = obs_causal.flops / max(obs_full.flops, 1)
    assert ratio < 0.65, (f"{what}: the causal pass counted {ratio:.2f}× the FLOPs of the non-causal one; skipping the "
                          f"blocks wholly above the diagonal makes it about 0.56× (torch's FlopCounterMode counted)")
    peaks = {}
    for n in (128, 512):
        q, k, v = _qkv(1, 2, n, n, 8, offset=offset + n)
        _, obs = observe(flash_attention_forward, q, k, v, causal=False, block_q=32, block_k=32, _observe_host=True)
        result_bytes = q.numel() * q.element_size() + 1 * 2 * n * 4  # out + lse (fp32)
        peaks[n] = obs.all_peak_bytes - result_bytes  # tensors, and numpy arrays or lists made on the way
    assert peaks[512] <= 1.5 * peaks[128] + 32 * 1024, (
        f"flash_attention_forward with 32×32 blocks: memory beyond the output grew from {peaks[128] / 1e3:.0f} kB at "
        f"N=128 to {peaks[512] / 1e3:.0f} kB at N=512; a tiled pass needs the same few blocks whatever N is "
        f"(the full score matrix at N=512 is {ref.score_bytes(1, 2, 512, 512) / 1e6:.1f} MB, as a tensor or a "
        f"numpy array alike)")


@WEEK.exercise(4, "flash_attention_forward", section="3 (The tiled forward pass)")
def check_flash_attention_forward(flash_attention_forward) -> None:
    for i, (b, h, nq, nk, d, causal) in enumerate(CASES):
        q, k, v = _qkv(b, h, nq, nk, d, offset=100 + i, transposed=i % 2 == 1)
        want, want_lse = _want(q, k, v, causal)
        for bq, bk in [(16, 16), (7, 13), (128, 64)] + ([(1, 1)] if nq * nk <= 800 else []):
            what = (f"flash_attention_forward(q {_shape(q)}{' non-contiguous' if i % 2 else ''}, k {_shape(k)}, "
                    f"causal={causal}, block_q={bq}, block_k={bk})")
            res = flash_attention_forward(q, k, v, causal=causal, block_q=bq, block_k=bk)
            assert isinstance(res, tuple) and len(res) == 2, f"{what} should return a tuple (out, lse)"
            out, lse = res
            _close(out, want, what + " output", *TOL[torch.float32])
            _close(lse, want_lse, what + " logsumexp [B, H, Nq]", *TOL[torch.float32])
    for dtype in (torch.float16, torch.bfloat16):
        q, k, v = _qkv(1, 2, 300, 300, 40, dtype=dtype, offset=120)
        want, want_lse = _want(q, k, v, True)
        out, lse = flash_attention_forward(q, k, v, causal=True, block_q=32, block_k=32)
        what = f"flash_attention_forward on {dtype} inputs, N=300, d=40"
        _close(out, want, what + " output (vs attention in fp32; keep m, l and acc in float32)", *TOL[dtype])
        _close(lse, want_lse, what + " lse (float32: accumulate in fp32, as FlashAttention's kernels do)", 1e-3, 1e-4,
               dtype=torch.float32)
    q, k, v = _qkv(1, 2, 50, 50, 16, scale=8.0, offset=130)  # scores of size ~500: exp overflows fp32 without the max
    out, _ = flash_attention_forward(q, k, v, causal=True, block_q=16, block_k=16)
    _close(out, _want(q, k, v, True)[0], "flash_attention_forward on large scores", 1e-4, 1e-4)
    # Causal: the blocks computed must be exactly those not wholly above the (bottom-right aligned) diagonal.
    for nq, nk, bq, bk in [(100, 100, 16, 32), (5, 70, 2, 8), (64, 64, 16, 16), (33, 97, 8, 8)]:
        q, k, v = _qkv(1, 1, nq, nk, 8, offset=140)
        visited = []
        flash_attention_forward(q, k, v, causal=True, block_q=bq, block_k=bk, visited=visited)
        want = []
        ref.flash_attention_forward(q, k, v, causal=True, block_q=bq, block_k=bk, visited=want)
        extra, missing = sorted(set(visited) - set(want)), sorted(set(want) - set(visited))
        assert not extra and not missing, (
            f"causal, Nq={nq}, Nk={nk}, block_q={bq}, block_k={bk}: visited (q_start, k_start) blocks differ from the "
            f"expected {len(want)}: computed but wholly masked {extra[:5]}, needed but skipped {missing[:5]}")
        assert len(visited) == len(want), f"causal, Nq={nq}, Nk={nk}: {len(visited)} blocks recorded, some twice; expected {len(want)}"
    _forward_route(flash_attention_forward, offset=150)
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
        got, obs = observe(standard_io, n, d)
        assert tuple(got) == tuple(want), (
            f"standard_io({n}, {d}) = {tuple(got)}; expected (reads, writes) = {tuple(want)}: read Q, K (2Nd), write S (N²); "
            f"read S, write P (N² each); read P (N²) and V (Nd), write O (Nd) {seed_note()}")
        assert_route(obs, f"standard_io({n}, {d})")
    q, k, v = _qkv(1, 1, 48, 48, 8, dtype=torch.float64, offset=5)
    _, counted = io_model.run_standard(q[0, 0], k[0, 0], v[0, 0])
    assert tuple(standard_io(48, 8)) == tuple(counted), f"standard_io(48, 8) = {tuple(standard_io(48, 8))}; an instrumented run counted {tuple(counted)}"


@WEEK.exercise(6, "flash_io", section="4 (Counting HBM traffic)")
def check_flash_io(flash_io) -> None:
    g = generator(6)
    cases = [(100, 8, 64), (4096, 64, 100_000), (65536, 128, 2 ** 16)]
    for _ in range(5):
        n, d = int(torch.randint(1, 70_000, (1,), generator=g)), int(torch.randint(1, 257, (1,), generator=g))
        cases.append((n, d, 4 * d * int(torch.randint(1, 2000, (1,), generator=g)) + int(torch.randint(0, 4 * d, (1,), generator=g))))
    for n, d, m in cases:
        want = io_model.flash_io(n, d, m)
        got, obs = observe(flash_io, n, d, m)
        b_r, b_c = io_model.block_sizes(d, m)
        assert tuple(got) == tuple(want), (
            f"flash_io({n}, {d}, {m}) = {tuple(got)}; expected (reads, writes) = {tuple(want)}. Here B_c = {b_c}, B_r = {b_r}, "
            f"T_c = {math.ceil(n / b_c)}: K and V are read once, Q, O, l, m once per key block, O, l, m written once per key block "
            f"(and once at initialisation) {seed_note()}")
        assert_route(obs, f"flash_io({n}, {d}, {m})")
    for n, d, m in [(100, 8, 64), (130, 16, 700)]:
        q, k, v = _qkv(1, 1, n, n, d, dtype=torch.float64, offset=6)
        _, counted, _ = io_model.run_algorithm1(q[0, 0], k[0, 0], v[0, 0], m)
        assert tuple(flash_io(n, d, m)) == tuple(counted), f"flash_io({n}, {d}, {m}) = {tuple(flash_io(n, d, m))}; an instrumented run of Algorithm 1 counted {tuple(counted)}"


# --- 7, 8 ---------------------------------------------------------------------------------------------

def _grads(q, k, v, causal, dout):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    ref.naive_attention(q, k, v, causal=causal).backward(dout)
    return q.grad, k.grad, v.grad


@WEEK.exercise(7, "flash_attention_backward", section="5 (The backward pass)")
def check_flash_attention_backward(flash_attention_backward) -> None:
    for i, (b, h, nq, nk, d, causal) in enumerate(CASES[1:6] + [(1, 1, 1, 1, 4, True)]):
        q, k, v = _qkv(b, h, nq, nk, d, dtype=torch.float64, offset=200 + i, transposed=i % 2 == 1)
        dout = torch.randn(q.shape, dtype=torch.float64, generator=generator(210 + i))
        out, lse = ref.flash_attention_forward(q, k, v, causal=causal)
        for bq, bk in [(16, 16), (7, 13)]:
            got = flash_attention_backward(q, k, v, out, lse, dout, causal=causal, block_q=bq, block_k=bk)
            what = f"flash_attention_backward(q {_shape(q)}, k {_shape(k)}, causal={causal}, block_q={bq}, block_k={bk})"
            assert isinstance(got, tuple) and len(got) == 3, f"{what} should return (dq, dk, dv)"
            for name, g_, w in zip(("dq", "dk", "dv"), got, _grads(q, k, v, causal, dout)):
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
        got = flash_attention_backward(q, k, v, o_, l_, dout, causal=True, block_q=16, block_k=16)
        for gname, g_, w in zip(("dq", "dk", "dv"), got, want):
            _close(g_, w, f"flash_attention_backward given {name}: {gname} (use the saved lse, P = exp(S − lse), and "
                          f"D = rowsum(dO ∘ out) from the given out — do not recompute the softmax or the output)",
                   1e-9, 1e-9)
    for dtype in (torch.float16, torch.bfloat16):
        q, k, v = _qkv(1, 2, 40, 40, 24, dtype=dtype, offset=230)
        dout = torch.randn(q.shape, generator=generator(231)).to(dtype)
        out, lse = ref.flash_attention_forward(q, k, v, causal=True)
        got = flash_attention_backward(q, k, v, out, lse, dout, causal=True, block_q=16, block_k=16)
        want = ref.flash_attention_backward(q.float(), k.float(), v.float(), out.float(), lse, dout.float(), causal=True,
                                            block_q=16, block_k=16)
        for gname, g_, w in zip(("dq", "dk", "dv"), got, want):
            _close(g_, w.to(dtype), f"flash_attention_backward on {dtype} inputs: {gname} (accumulate in float32, "
                                    f"return the inputs' dtype)", *(4 * t for t in TOL[dtype]))
    # The technique: blocks only, no lib, no autograd through a full matrix.
    bq, bk, d = 32, 16, 24
    q, k, v = _qkv(1, 2, 100, 100, d, offset=240)
    out, lse = ref.flash_attention_forward(q, k, v, causal=True)
    dout = torch.randn(q.shape, generator=generator(241))
    _, obs = observe(flash_attention_backward, q, k, v, out, lse, dout, causal=True, block_q=bq, block_k=bk)
    _, ref_obs = observe(ref.flash_attention_backward, q, k, v, out, lse, dout, causal=True, block_q=bq, block_k=bk)
    assert_route(obs, "flash_attention_backward(q [1, 2, 100, 24], block_q=32, block_k=16)", lib_allowed=SHAPES_OK,
                 forbidden_ops=SDPA_OPS + ("aten._softmax", "aten._softmax_backward"), max_extent=max(bq, bk, d),
                 why="Recompute P block by block from the saved lse.",
                 min_flops=ref_obs.flops // 2)  # S, dP, dV, dQ, dK: five products a block (the reference's count)
    q, k, v = _qkv(1, 2, 1024, 1024, 8, offset=250)
    out, lse = ref.flash_attention_forward(q, k, v)
    _, obs = observe(flash_attention_backward, q, k, v, out, lse, torch.ones_like(out), block_q=128, block_k=128,
                     _observe_host=True)
    full = ref.score_bytes(1, 2, 1024, 1024)
    assert obs.all_peak_bytes < full / 4, (
        f"flash_attention_backward at N=1024 with 128×128 blocks allocated {obs.all_peak_bytes / 1e6:.1f} MB at peak "
        f"(tensors, numpy arrays and lists); the full probability matrix is {full / 1e6:.1f} MB: recompute P block "
        f"by block from lse")
    q, k, v = _qkv(1, 2, 20, 30, 8, offset=260)
    out, lse = ref.flash_attention_forward(q, k, v, causal=True)
    check_on_meta(flash_attention_backward, (q, k, v, out, lse, out), "flash_attention_backward",
                  dict(causal=True, block_q=8, block_k=8))


@WEEK.exercise(8, "FlashAttention", section="5 (The backward pass)")
def check_FlashAttention(FlashAttention) -> None:
    assert isinstance(FlashAttention, type) and issubclass(FlashAttention, torch.autograd.Function), (
        "FlashAttention should be a subclass of torch.autograd.Function")
    assert not issubclass(FlashAttention, ref.FlashAttention), "FlashAttention must be yours, not a subclass of lib's"
    for i, (b, h, nq, nk, d, causal, bq, bk) in enumerate(
            [(1, 2, 9, 9, 4, True, 4, 3), (1, 1, 5, 12, 6, True, 2, 5), (2, 1, 7, 6, 3, False, 3, 4)]):
        q, k, v = (t.requires_grad_() for t in _qkv(b, h, nq, nk, d, dtype=torch.float64, offset=300 + i))
        ok = torch.autograd.gradcheck(lambda q, k, v: FlashAttention.apply(q, k, v, causal, bq, bk), (q, k, v), raise_exception=False)
        assert ok, (f"torch.autograd.gradcheck failed for FlashAttention.apply(q {_shape(q)}, k {_shape(k)}, causal={causal}, "
                    f"block_q={bq}, block_k={bk}) in float64: backward must return (dq, dk, dv, None, None, None) {seed_note()}")
    q, k, v = (t.requires_grad_() for t in _qkv(1, 1, 64, 64, 8, offset=310))
    out = FlashAttention.apply(q, k, v, True, 16, 16)
    big = [tuple(t.shape) for t in out.grad_fn.saved_tensors if t.numel() >= 64 * 64]
    assert not big, f"FlashAttention saved tensors of shape {big} for backward: save q, k, v, out and lse, never the N×N matrix"
    # The technique, forward and backward: blocks only, no lib, no autograd over a full matrix.
    bq, bk, d = 32, 16, 24
    q, k, v = (t.requires_grad_() for t in _qkv(1, 2, 100, 100, d, offset=320))
    out, obs = observe(FlashAttention.apply, q, k, v, True, bq, bk)
    assert_route(obs, "FlashAttention.apply(q [1, 2, 100, 24], causal=True, 32, 16) forward", lib_allowed=SHAPES_OK,
                 forbidden_ops=SDPA_OPS, max_extent=max(bq, bk, d))
    dout = torch.randn(out.shape, generator=generator(321))
    _, obs = observe(out.backward, dout)
    assert_route(obs, "FlashAttention backward (q [1, 2, 100, 24], blocks 32, 16)", lib_allowed=SHAPES_OK,
                 forbidden_ops=SDPA_OPS + ("aten._softmax",), max_extent=max(bq, bk, d),
                 why="backward must recompute P block by block from the saved lse (your flash_attention_backward).")
    want = _grads(q, k, v, True, dout)
    for name, g_, w in zip(("dq", "dk", "dv"), (q.grad, k.grad, v.grad), want):
        _close(g_, w, f"FlashAttention gradients {name}, N=100, d=24", 1e-5, 1e-4)


# --- 9 ------------------------------------------------------------------------------------------------

@WEEK.exercise(9, "merge_partials", section="6 (One query, many keys: split-K)")
def check_merge_partials(merge_partials) -> None:
    g = generator(400)
    for n_parts in (1, 2, 5):
        b, h, nq, d = 2, 3, 4, 24
        outs = [torch.randn(b, h, nq, d, generator=g) for _ in range(n_parts)]
        lses = [torch.randn(b, h, nq, generator=g) * 5 for _ in range(n_parts)]
        for scale, label in [(1.0, "lse of size ~5"), (2000.0, "lse of size ~1e4 (exp overflows: subtract the max)")]:
            ls = [s * scale for s in lses]
            want_out, want_lse = ref.merge_partials(outs, ls)
            res = merge_partials(outs, ls)
            assert isinstance(res, tuple) and len(res) == 2, "merge_partials should return a tuple (out, lse)"
            what = f"merge_partials of {n_parts} parts, {label}"
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
    out, lse = merge_partials(outs, lses)
    _close(out, want_out, "merge_partials with empty parts (lse -inf) and one lse of 1e4: out", 1e-5, 1e-5)
    _close(lse, want_lse, "merge_partials with empty parts (lse -inf) and one lse of 1e4: lse", 1e-4, 1e-6)
    _, obs = observe(merge_partials, outs, lses)
    assert_route(obs, "merge_partials")
    check_on_meta(merge_partials, (outs, lses), "merge_partials")


@WEEK.exercise(10, "flash_decode", section="6 (One query, many keys: split-K)")
def check_flash_decode(flash_decode) -> None:
    for i, (b, h, nq, nk, d) in enumerate([(1, 2, 1, 300, 64), (2, 3, 1, 37, 24), (1, 1, 1, 5, 8), (1, 2, 4, 50, 40)]):
        q, k, v = _qkv(b, h, nq, nk, d, offset=500 + i, transposed=i % 2 == 1)
        want, _ = _want(q, k, v, False)
        for n_splits in sorted({1, 2, 3, 7, nk, nk + 3}):
            _close(flash_decode(q, k, v, n_splits=n_splits), want,
                   f"flash_decode(q {_shape(q)}, k {_shape(k)}, n_splits={n_splits})"
                   + (" — more splits than keys: some splits are empty (lse -inf)" if n_splits > nk else ""),
                   *TOL[torch.float32])
    for dtype in (torch.float16, torch.bfloat16):
        q, k, v = _qkv(1, 2, 1, 257, 40, dtype=dtype, offset=510)
        want, _ = _want(q, k, v, False)
        _close(flash_decode(q, k, v, n_splits=5), want, f"flash_decode on {dtype} inputs (merge in float32)", *TOL[dtype])
    # The technique: each split sees only its own keys; no lib.
    nk, n_splits, d = 240, 8, 24
    q, k, v = _qkv(1, 2, 1, nk, d, offset=520)
    _, obs = observe(flash_decode, q, k, v, n_splits=n_splits)
    assert_route(obs, f"flash_decode(k [1, 2, {nk}, {d}], n_splits={n_splits})", lib_allowed=("lib.attention.check_attention_shapes",),
                 forbidden_ops=SDPA_OPS, max_extent=max(nk // n_splits, d),
                 why=f"Attend to each of the {n_splits} chunks of {nk // n_splits} keys separately, then merge by logsumexp.",
                 min_flops=int(0.9 * 4 * 2 * nk * d))  # q·K and p·V for each of the 2 heads: 4·Nk·d a head
    check_on_meta(flash_decode, (q, k, v), "flash_decode", dict(n_splits=3))


# --- 11, 12, 13: Triton -------------------------------------------------------------------------------

TRITON = "8 (The kernel itself: FlashAttention in Triton)"


def _on(t: torch.Tensor) -> torch.Tensor:
    return t.to(tri.device())


@WEEK.exercise(11, "softmax_rows", section=TRITON)
def check_softmax_rows(softmax_rows) -> None:
    g = generator(600)

    def run(x, what):
        return tri.run_kernel(softmax_rows, what, ("x",), x)

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
    tri.assert_kernel_route(obs, "softmax_rows(x [6, 300])", names=("x",))
    if tri.interpreting():
        grids = [grid for _, grid in obs.kernel_launches]
        assert any(grid and grid[0] == 6 for grid in grids), (
            f"softmax_rows(x [6, 300]): the kernels launched had grids {grids}; launch one program per row, "
            f"grid (6,)")


@WEEK.exercise(12, "tiled_matmul", section=TRITON)
def check_tiled_matmul(tiled_matmul) -> None:
    g = generator(700)

    def run(what, *args, **kwargs):
        return tri.run_kernel(tiled_matmul, what, ("a", "b"), *args, flat_reductions=True, **kwargs)

    for (m, k, n), blocks in [((1, 1, 1), (16, 16, 16)), ((45, 70, 33), (16, 16, 16)), ((64, 64, 64), (32, 16, 16)),
                              ((37, 100, 20), (16, 32, 32)), ((20, 33, 70), (16, 64, 16))]:
        a = _on(torch.randn(m, k, generator=g))
        b = _on(torch.randn(k, n, generator=g))
        bm, bn, bk = blocks
        what = f"tiled_matmul(a [{m}, {k}], b [{k}, {n}], block_m={bm}, block_n={bn}, block_k={bk})"
        _close(run(what, a, b, block_m=bm, block_n=bn, block_k=bk), (a.double() @ b.double()).float(), what,
               *tri.tol(1e-4, 1e-4))
    a = _on(torch.randn(30, 50, generator=g))
    b = _on(torch.randn(40, 50, generator=g)).t()  # [50, 40] with a row stride of 1
    what = "tiled_matmul with b transposed (non-contiguous)"
    _close(run(what, a, b), (a.double() @ b.double()).float(), what, *tri.tol(1e-4, 1e-4))
    a, b = _on(torch.randn(40, 64, generator=g)).half(), _on(torch.randn(64, 24, generator=g)).half()
    what = "tiled_matmul on float16 (accumulate in float32, return float16)"
    _close(run(what, a, b), (a.float() @ b.float()).half(), what, *tri.tol(1e-2, 1e-2))
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
    tri.assert_kernel_route(obs, what, min_dot_flops=2 * m * k * n, max_dot_dim=32, blocks="16, 16, 32",
                            names=("a", "b"), widest_load=16 * 32, flat_reductions=True, max_dot_flops=padded,
                            elementwise_per_mac=0.5, max_loaded={0: -(-n // 16) * m * k, 1: -(-m // 16) * k * n})
    if tri.interpreting():
        scaled, _ = observe(tiled_matmul, a, b, block_m=16, block_n=16, block_k=32, _observe_dot_scale=1.25,
                            _observe_light=True)
        tri.assert_made_of_dots(scaled, 1.25 * (a.double() @ b.double()), what, 1e-4, 1e-4)


def _attention_inputs(b, h, nq, nk, d, offset, dtype=torch.float32, transposed=False):
    q, k, v = _qkv(b, h, nq, nk, d, dtype=dtype, offset=offset, transposed=transposed)
    return _on(q), _on(k), _on(v)


@WEEK.exercise(13, "flash_attention_triton", section=TRITON)
def check_flash_attention_triton(flash_attention_triton) -> None:
    def run(what, *args, **kwargs):
        return tri.run_kernel(flash_attention_triton, what, ("q", "k", "v"), *args, flat_reductions=True, **kwargs)

    cases = [(1, 1, 1, 1, 16, False), (1, 2, 37, 37, 16, True), (2, 1, 5, 70, 32, True), (1, 2, 70, 33, 64, False),
             (1, 1, 1, 200, 128, True), (1, 2, 64, 96, 16, True), (2, 2, 50, 50, 32, False)]
    for i, (b, h, nq, nk, d, causal) in enumerate(cases):
        q, k, v = _attention_inputs(b, h, nq, nk, d, offset=800 + i, transposed=i % 3 == 1)
        want, want_lse = tri.float64_attention(q, k, v, causal)
        for bm, bn in [((16, 16), (32, 16), (16, 32))[i % 3]]:
            what = (f"flash_attention_triton(q {_shape(q)}{' non-contiguous' if i % 3 == 1 else ''}, k {_shape(k)}, "
                    f"causal={causal}, block_m={bm}, block_n={bn})")
            res = run(what, q, k, v, causal=causal, block_m=bm, block_n=bn)
            assert isinstance(res, tuple) and len(res) == 2, f"{what} should return a tuple (out, lse)"
            _close(res[0], want.float(), what + " output", *tri.tol(1e-5, 1e-4))
            _close(res[1], want_lse.float(), what + " logsumexp [B, H, Nq] (float32)", *tri.tol(1e-5, 1e-5))
    # Long rows whose scores grow from block to block: the running max changes at every block, so a kernel that
    # does not rescale l and acc by exp(m_old - m_new) is wrong here.
    nk, d = 160, 16
    q = _on(torch.ones(1, 1, 4, d) * 0.5)
    ramp = torch.linspace(0.0, 12.0, nk).view(1, 1, nk, 1)
    k = _on(ramp * torch.ones(1, 1, nk, d) / d ** 0.5 * 2 + 0.1 * torch.randn(1, 1, nk, d, generator=generator(810)))
    v = _on(torch.randn(1, 1, nk, d, generator=generator(811)))
    want, want_lse = tri.float64_attention(q, k, v, False)
    out, lse = run("flash_attention_triton on rows whose scores grow", q, k, v, causal=False, block_m=16, block_n=16)
    _close(out, want.float(), "flash_attention_triton on rows whose scores grow block after block (the running max "
           "changes at each block: rescale l and acc by exp(m_old − m_new))", *tri.tol(1e-5, 1e-4))
    _close(lse, want_lse.float(), "flash_attention_triton's lse on rows whose scores grow block after block",
           *tri.tol(1e-5, 1e-5))
    # Scores that climb by 32 per block to 318: exp of a score minus any max but the running one overflows float32.
    q = _on(torch.ones(1, 1, 16, d))
    k = _on((torch.arange(nk).float() / 2).view(1, 1, nk, 1) * torch.ones(1, 1, nk, d)
            + 0.01 * torch.randn(1, 1, nk, d, generator=generator(812)))
    want, want_lse = tri.float64_attention(q, k, v, False)
    out, lse = run("flash_attention_triton on scores that climb", q, k, v, causal=False, block_m=16, block_n=16)
    _close(out, want.float(), "flash_attention_triton on scores that climb from 0 to 318 over the row (exp overflows "
           "float32 past 88: keep the running max current, rescaling l and acc whenever it grows)",
           *tri.tol(1e-4, 1e-3))
    _close(lse, want_lse.float(), "flash_attention_triton's lse on scores that climb from 0 to 318",
           *tri.tol(1e-4, 1e-4))
    q, k, v = _attention_inputs(1, 2, 40, 40, 32, offset=820, dtype=torch.float16)
    want, want_lse = tri.float64_attention(q, k, v, True)
    out, lse = run("flash_attention_triton on float16", q, k, v, causal=True)
    _close(out, want.half(), "flash_attention_triton on float16 (keep m, l and acc in float32; return float16)",
           *tri.tol(2e-3, 4e-3))
    _close(lse, want_lse.float(), "flash_attention_triton's lse on float16 inputs (float32)", *tri.tol(1e-3, 1e-4))
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
    tri.assert_kernel_route(full, what, min_dot_flops=4 * n * n * d, max_loaded={1: one_pass, 2: one_pass}, **route)
    _, causal = observe(flash_attention_triton, q, k, v, causal=True, block_m=16, block_n=16)
    tri.assert_kernel_route(causal, what + " causal", max_loaded={1: one_pass, 2: one_pass}, **route)
    if tri.interpreting():
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
        want, want_lse = tri.float64_attention(1.25 * q.double(), k, v, False)  # QKᵀ scaled, then PV scaled
        tri.assert_made_of_dots(scaled, (1.25 * want, want_lse), what, 1e-5, 1e-4)
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
