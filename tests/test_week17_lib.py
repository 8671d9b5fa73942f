"""Properties of the week 17 reference (lib.attention, lib.io_model): fast, no real model."""
import itertools

import pytest
import torch

from lib import attention as A
from lib import io_model as io
from lib.kv_cache import causal_mask
from lib.model import tiny_model


def _qkv(b, h, nq, nk, d, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, h, nq, d, generator=g, dtype=dtype), torch.randn(b, h, nk, d, generator=g, dtype=dtype),
            torch.randn(b, h, nk, d, generator=g, dtype=dtype))


@pytest.mark.parametrize("nq,nk,causal", [(n, m, c) for n, m in [(1, 1), (1, 9), (7, 7), (17, 40), (40, 17), (33, 33)]
                                          for c in (False, True) if not (c and n > m)])
def test_flash_equals_naive_and_sdpa(nq, nk, causal):
    q, k, v = _qkv(2, 3, nq, nk, 8)
    want = A.naive_attention(q, k, v, causal)
    assert torch.allclose(A.sdpa_attention(q, k, v, causal), want, atol=1e-5)
    for bq, bk in itertools.product((1, 5, 64), (1, 6, 64)):
        out, lse = A.flash_attention(q, k, v, causal, bq, bk, return_lse=True)
        assert torch.allclose(out, want, atol=1e-5)
        s = q @ k.transpose(-1, -2) / 8 ** 0.5
        if causal:
            s = s.masked_fill(~causal_mask(nq, nk), float("-inf"))
        assert torch.allclose(lse, torch.logsumexp(s, -1), atol=1e-5)


def test_gradcheck():
    for nq, nk, causal in [(9, 9, True), (4, 11, True), (6, 5, False)]:
        q, k, v = (t.requires_grad_() for t in _qkv(1, 2, nq, nk, 4, dtype=torch.float64))
        assert torch.autograd.gradcheck(lambda q, k, v: A.flash_attention(q, k, v, causal, 3, 4), (q, k, v))


def test_flash_decode_and_online_softmax():
    q, k, v = _qkv(1, 2, 1, 101, 16)
    for s in (1, 2, 7, 101):
        assert torch.allclose(A.flash_decode(q, k, v, s), A.naive_attention(q, k, v), atol=1e-6)
    x = torch.randn(4, 30) * 1e4
    x[0, :12] = float("-inf")
    for c in (1, 4, 30):
        assert torch.allclose(A.online_softmax(x, c), torch.softmax(x, -1), atol=1e-6)


def test_bad_shapes_raise_with_shapes():
    with pytest.raises(ValueError, match=r"\(1, 2, 9, 8\)"):
        A.flash_attention(torch.zeros(1, 2, 9, 8), torch.zeros(1, 2, 5, 8), torch.zeros(1, 2, 5, 8), causal=True)
    with pytest.raises(ValueError, match=r"\(1, 2, 5, 16\)"):
        A.naive_attention(torch.zeros(1, 2, 5, 8), torch.zeros(1, 2, 5, 16), torch.zeros(1, 2, 5, 16))


def test_tiny_model_with_flash_backend():
    model = tiny_model(seed=0)
    ids = torch.randint(0, 128, (2, 37), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = model(ids)
        model.attention_fn = A.expand_kv(lambda q, k, v, causal=False: A.flash_attention(q, k, v, causal, 8, 8))
        got = model(ids)
        cache = model.new_cache(batch=2, max_len=64)  # prefill then decode steps: Nq < Nk, bottom-right causal
        steps = [model(ids[:, :30], cache)] + [model(ids[:, t:t + 1], cache) for t in range(30, 37)]
    assert torch.allclose(got, want, atol=1e-4)
    assert torch.allclose(torch.cat(steps, dim=1), want, atol=1e-4)


def test_io_counts_match_instrumented_runs_and_theorem():
    for n, d, m in [(100, 8, 64), (200, 16, 999), (64, 32, 1 << 20)]:
        q, k, v = _qkv(1, 1, n, n, d, dtype=torch.float64)
        out, counted, _ = io.run_algorithm1(q[0, 0], k[0, 0], v[0, 0], m)
        assert counted == io.flash_io(n, d, m)
        assert torch.allclose(out, A.naive_attention(q, k, v)[0, 0])
        out0, counted0 = io.run_standard(q[0, 0], k[0, 0], v[0, 0])
        assert counted0 == io.standard_io(n, d)
    # Theorem 2's orders: doubling M halves flash's traffic (asymptotically); doubling N quadruples both.
    n = 1 << 16
    assert 1.9 < io.flash_io(n, 64, 1 << 14).total / io.flash_io(n, 64, 1 << 15).total < 2.05
    assert 3.9 < io.flash_io(2 * n, 64, 1 << 15).total / io.flash_io(n, 64, 1 << 15).total < 4.1
    assert 3.9 < io.standard_io(2 * n, 64).total / io.standard_io(n, 64).total < 4.1


def test_memory_meter():
    q, k, v = _qkv(1, 4, 1024, 1024, 16)
    with io.TensorMemoryMeter() as naive:
        A.naive_attention(q, k, v)
    with io.TensorMemoryMeter() as flash:
        A.flash_attention(q, k, v)
    s = A.score_bytes(1, 4, 1024, 1024)
    assert 2 * s <= naive.peak <= 2 * s + 4 * q.nbytes
    assert flash.peak <= s / 10
