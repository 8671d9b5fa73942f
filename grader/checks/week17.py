"""Week 17 — FlashAttention: the milestone checks, used by solutions/17/test_week17.py and the notebook."""
from __future__ import annotations

import math

import torch

from grader.checks import assert_close as _close
from grader.harness import Week
from lib import attention as ref
from lib import io_model
from lib.kv_cache import causal_mask

WEEK = Week(17, "week17_flash_attention.ipynb")

# (batch, heads, q_len, kv_len, head_dim, causal): lengths that are not multiples of the blocks, q_len != kv_len.
CASES = [(1, 1, 1, 1, 8, False), (2, 3, 37, 37, 16, True), (2, 3, 37, 37, 16, False), (1, 2, 5, 70, 8, True),
         (2, 2, 70, 33, 8, False), (1, 1, 1, 300, 64, True), (1, 2, 130, 130, 32, True), (1, 2, 64, 128, 16, True)]


def _qkv(b, h, nq, nk, d, dtype=torch.float32, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, nq, d, generator=g, dtype=dtype) * scale
    k = torch.randn(b, h, nk, d, generator=g, dtype=dtype) * scale
    v = torch.randn(b, h, nk, d, generator=g, dtype=dtype)
    return q, k, v


def _ref_lse(q, k, causal):
    s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    if causal:
        s = s.masked_fill(~causal_mask(q.shape[2], k.shape[2]), float("-inf"))
    return torch.logsumexp(s, dim=-1)


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


@WEEK.exercise(1, "naive_attention", section="1 (What standard attention costs)")
def check_naive_attention(naive_attention) -> None:
    for b, h, nq, nk, d, causal in CASES:
        q, k, v = _qkv(b, h, nq, nk, d)
        want = ref.naive_attention(q, k, v, causal=causal)
        _close(naive_attention(q, k, v, causal=causal), want,
               f"naive_attention on q {tuple(q.shape)}, k {tuple(k.shape)}, causal={causal}", 1e-5)
    _bad_shapes(naive_attention, "naive_attention")


@WEEK.exercise(2, "score_bytes", section="1 (What standard attention costs)")
def check_score_bytes(score_bytes) -> None:
    for args, want in [((8, 8, 4096, 4096), 4_294_967_296), ((8, 8, 1024, 1024), 268_435_456), ((1, 8, 4096, 4096), 536_870_912),
                       ((1, 1, 1, 300), 1200), ((2, 3, 5, 7), 840)]:
        got = score_bytes(*args)
        assert got == want, f"score_bytes{args} = {got}; expected {want} (batch·heads·q_len·kv_len·4 bytes in fp32)"
    got = score_bytes(1, 8, 4096, 4096, bytes_per_element=2)
    assert got == 268_435_456, f"score_bytes(1, 8, 4096, 4096, bytes_per_element=2) = {got}; expected 268435456 (fp16)"


@WEEK.exercise(3, "online_softmax", section="2 (Online softmax)")
def check_online_softmax(online_softmax) -> None:
    g = torch.Generator().manual_seed(1)
    for shape, chunks in [((1, 10), (1, 3, 10, 15)), ((4, 37), (1, 5, 8, 36, 37)), ((2, 3, 64), (7, 16, 64))]:
        x = torch.randn(shape, generator=g)
        for c in chunks:
            _close(online_softmax(x, c), torch.softmax(x, dim=-1), f"online_softmax(x {shape}, chunk_size={c})", 1e-6)
    x = torch.randn(3, 50, generator=g) * 1e4  # exp(1e4) overflows: the running max must be subtracted
    _close(online_softmax(x, 7), torch.softmax(x, dim=-1), "online_softmax on entries of size 1e4", 1e-6)
    x = torch.randn(3, 50, generator=g)
    x[0, :20] = float("-inf")  # a whole first chunk of -inf: the running max is still -inf after it
    x[1, 7] = float("-inf")
    x[2, 40:] = float("-inf")
    _close(online_softmax(x, 10), torch.softmax(x, dim=-1), "online_softmax with -inf entries (row 0's first 2 chunks all -inf)", 1e-6)
    x = torch.randn(2, 33, generator=g, dtype=torch.float64)
    got = online_softmax(x, 4)
    assert got.dtype == torch.float64, f"online_softmax changed float64 input to {got.dtype}"


@WEEK.exercise(4, "flash_attention_forward", section="3 (The tiled forward pass)")
def check_flash_attention_forward(flash_attention_forward) -> None:
    for b, h, nq, nk, d, causal in CASES:
        q, k, v = _qkv(b, h, nq, nk, d)
        for bq, bk in [(16, 16), (7, 13), (128, 64)] + ([(1, 1)] if nq * nk <= 800 else []):
            what = f"flash_attention_forward(q {tuple(q.shape)}, k {tuple(k.shape)}, causal={causal}, block_q={bq}, block_k={bk})"
            res = flash_attention_forward(q, k, v, causal=causal, block_q=bq, block_k=bk)
            assert isinstance(res, tuple) and len(res) == 2, f"{what} should return a tuple (out, lse)"
            out, lse = res
            _close(out, ref.naive_attention(q, k, v, causal=causal), what + " output", 1e-5)
            _close(lse, _ref_lse(q, k, causal), what + " logsumexp [B, H, Nq]", 1e-5)
    q, k, v = _qkv(1, 2, 50, 50, 16, scale=8.0)  # scores of size ~500: exp overflows fp32 without the running max
    out, _ = flash_attention_forward(q, k, v, causal=True, block_q=16, block_k=16)
    _close(out, ref.naive_attention(q, k, v, causal=True), "flash_attention_forward on large scores", 1e-4)
    # Causal: the blocks computed must be exactly those not wholly above the (bottom-right aligned) diagonal.
    for nq, nk, bq, bk in [(100, 100, 16, 32), (5, 70, 2, 8), (64, 64, 16, 16), (33, 97, 8, 8)]:
        q, k, v = _qkv(1, 1, nq, nk, 8)
        visited = []
        flash_attention_forward(q, k, v, causal=True, block_q=bq, block_k=bk, visited=visited)
        want = []
        ref.flash_attention_forward(q, k, v, causal=True, block_q=bq, block_k=bk, visited=want)
        extra, missing = sorted(set(visited) - set(want)), sorted(set(want) - set(visited))
        assert not extra and not missing, (
            f"causal, Nq={nq}, Nk={nk}, block_q={bq}, block_k={bk}: visited (q_start, k_start) blocks differ from the "
            f"expected {len(want)}: computed but wholly masked {extra[:5]}, needed but skipped {missing[:5]}")
        assert len(visited) == len(want), f"causal, Nq={nq}, Nk={nk}: {len(visited)} blocks recorded, some twice; expected {len(want)}"
    # O(N·d) memory: never a full [B, H, N, N] matrix.
    q, k, v = _qkv(1, 2, 1024, 1024, 8)
    with io_model.TensorMemoryMeter() as meter:
        flash_attention_forward(q, k, v, causal=False, block_q=128, block_k=128)
    full = ref.score_bytes(1, 2, 1024, 1024)
    assert meter.peak < full / 8, (f"flash_attention_forward at N=1024 with 128×128 blocks allocated {meter.peak / 1e6:.1f} MB at peak; "
                                   f"the full score matrix is {full / 1e6:.1f} MB: work block by block")
    _bad_shapes(lambda q, k, v, causal: flash_attention_forward(q, k, v, causal=causal), "flash_attention_forward")


@WEEK.exercise(5, "standard_io", section="4 (Counting HBM traffic)")
def check_standard_io(standard_io) -> None:
    for n, d in [(1, 1), (64, 16), (1000, 64), (4096, 128), (3, 500)]:
        got, want = standard_io(n, d), io_model.standard_io(n, d)
        assert tuple(got) == tuple(want), (
            f"standard_io({n}, {d}) = {tuple(got)}; expected (reads, writes) = {tuple(want)}: read Q, K (2Nd), write S (N²); "
            f"read S, write P (N² each); read P (N²) and V (Nd), write O (Nd)")
    q, k, v = _qkv(1, 1, 48, 48, 8, dtype=torch.float64)
    _, counted = io_model.run_standard(q[0, 0], k[0, 0], v[0, 0])
    assert tuple(standard_io(48, 8)) == tuple(counted), f"standard_io(48, 8) = {tuple(standard_io(48, 8))}; an instrumented run counted {tuple(counted)}"


@WEEK.exercise(6, "flash_io", section="4 (Counting HBM traffic)")
def check_flash_io(flash_io) -> None:
    for n, d, m in [(100, 8, 64), (256, 16, 1000), (333, 32, 5000), (64, 64, 100_000), (4096, 64, 100_000), (65536, 128, 2 ** 16)]:
        got, want = flash_io(n, d, m), io_model.flash_io(n, d, m)
        b_r, b_c = io_model.block_sizes(d, m)
        assert tuple(got) == tuple(want), (
            f"flash_io({n}, {d}, {m}) = {tuple(got)}; expected (reads, writes) = {tuple(want)}. Here B_c = {b_c}, B_r = {b_r}, "
            f"T_c = {math.ceil(n / b_c)}: K and V are read once, Q, O, l, m once per key block, O, l, m written once per key block "
            f"(and once at initialisation)")
    for n, d, m in [(100, 8, 64), (130, 16, 700)]:
        q, k, v = _qkv(1, 1, n, n, d, dtype=torch.float64)
        _, counted, _ = io_model.run_algorithm1(q[0, 0], k[0, 0], v[0, 0], m)
        assert tuple(flash_io(n, d, m)) == tuple(counted), f"flash_io({n}, {d}, {m}) = {tuple(flash_io(n, d, m))}; an instrumented run of Algorithm 1 counted {tuple(counted)}"


def _grads(q, k, v, causal, dout):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    ref.naive_attention(q, k, v, causal=causal).backward(dout)
    return q.grad, k.grad, v.grad


@WEEK.exercise(7, "flash_attention_backward", section="5 (The backward pass)")
def check_flash_attention_backward(flash_attention_backward) -> None:
    for b, h, nq, nk, d, causal in CASES[1:6] + [(1, 1, 1, 1, 4, True)]:
        q, k, v = _qkv(b, h, nq, nk, d, dtype=torch.float64)
        dout = torch.randn(q.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
        out, lse = ref.flash_attention_forward(q, k, v, causal=causal)
        for bq, bk in [(16, 16), (7, 13)]:
            got = flash_attention_backward(q, k, v, out, lse, dout, causal=causal, block_q=bq, block_k=bk)
            what = f"flash_attention_backward(q {tuple(q.shape)}, k {tuple(k.shape)}, causal={causal}, block_q={bq}, block_k={bk})"
            assert isinstance(got, tuple) and len(got) == 3, f"{what} should return (dq, dk, dv)"
            for name, g_, w in zip(("dq", "dk", "dv"), got, _grads(q, k, v, causal, dout)):
                _close(g_, w, f"{what}: {name}", 1e-9)
    q, k, v = _qkv(1, 2, 1024, 1024, 8)
    out, lse = ref.flash_attention_forward(q, k, v)
    with io_model.TensorMemoryMeter() as meter:
        flash_attention_backward(q, k, v, out, lse, torch.ones_like(out), block_q=128, block_k=128)
    full = ref.score_bytes(1, 2, 1024, 1024)
    assert meter.peak < full / 4, (f"flash_attention_backward at N=1024 with 128×128 blocks allocated {meter.peak / 1e6:.1f} MB at peak; "
                                   f"the full probability matrix is {full / 1e6:.1f} MB: recompute P block by block from lse")


@WEEK.exercise(8, "FlashAttention", section="5 (The backward pass)")
def check_FlashAttention(FlashAttention) -> None:
    assert isinstance(FlashAttention, type) and issubclass(FlashAttention, torch.autograd.Function), (
        "FlashAttention should be a subclass of torch.autograd.Function")
    for b, h, nq, nk, d, causal, bq, bk in [(1, 2, 9, 9, 4, True, 4, 3), (1, 1, 5, 12, 4, True, 2, 5), (2, 1, 7, 6, 3, False, 3, 4)]:
        q, k, v = (t.requires_grad_() for t in _qkv(b, h, nq, nk, d, dtype=torch.float64))
        ok = torch.autograd.gradcheck(lambda q, k, v: FlashAttention.apply(q, k, v, causal, bq, bk), (q, k, v), raise_exception=False)
        assert ok, (f"torch.autograd.gradcheck failed for FlashAttention.apply(q {tuple(q.shape)}, k {tuple(k.shape)}, causal={causal}, "
                    f"block_q={bq}, block_k={bk}) in float64: backward must return (dq, dk, dv, None, None, None)")
    q, k, v = (t.requires_grad_() for t in _qkv(1, 1, 64, 64, 8))
    out = FlashAttention.apply(q, k, v, True, 16, 16)
    big = [tuple(t.shape) for t in out.grad_fn.saved_tensors if t.numel() >= 64 * 64]
    assert not big, f"FlashAttention saved tensors of shape {big} for backward: save q, k, v, out and lse, never the N×N matrix"


@WEEK.exercise(9, "flash_decode", section="6 (One query, many keys: split-K)")
def check_flash_decode(flash_decode) -> None:
    for b, h, nq, nk, d in [(1, 2, 1, 300, 64), (2, 3, 1, 37, 16), (1, 1, 1, 5, 8), (1, 2, 4, 50, 8)]:
        q, k, v = _qkv(b, h, nq, nk, d)
        want = ref.naive_attention(q, k, v)
        for n_splits in sorted({1, 2, 3, 7, nk}):
            if n_splits <= nk:
                _close(flash_decode(q, k, v, n_splits=n_splits), want,
                       f"flash_decode(q {tuple(q.shape)}, k {tuple(k.shape)}, n_splits={n_splits})", 1e-5)


@WEEK.exercise(10, "answer_q1", section="8 (Check your understanding)")
def check_answer_q1(answer_q1) -> None:
    got = float(answer_q1())
    assert abs(got - 268.435456) < 0.5, f"answer_q1() = {got}: not the fp32 score matrix of [8, 8, 1024, 1024] in MB (10^6 bytes)"


@WEEK.exercise(11, "answer_q2", section="8 (Check your understanding)")
def check_answer_q2(answer_q2) -> None:
    got = answer_q2()
    assert got == 528, f"answer_q2() = {got}: count the (query block, key block) pairs on or below the diagonal of a 32×32 grid of blocks"


@WEEK.exercise(12, "answer_q3", section="8 (Check your understanding)")
def check_answer_q3(answer_q3) -> None:
    got = float(answer_q3())
    assert abs(got - 4.0) < 1e-6, f"answer_q3() = {got}: weight each partial output by exp(its lse − the total lse)"
