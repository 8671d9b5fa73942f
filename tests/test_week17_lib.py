"""Properties of the week 17 reference (lib.attn.attention, lib.attn.io_model): fast, no real model."""
import math
import itertools

import pytest
import torch

from lib.attn import attention as A
from lib.attn import io_model as io
from lib.attn.masks import causal_mask
from lib.modeling.llama import tiny_model


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


def _meta(*tensors):
    return tuple(t.to("meta") for t in tensors)


def test_reference_runs_on_meta_tensors():
    """A tensor made without device= would land on the CPU and meet these meta tensors: torch raises. So this
    catches, on a CPU-only machine, what would fail on a GPU (e.g. torch.arange(...) for a causal mask)."""
    q, k, v = _meta(*_qkv(1, 2, 20, 37, 24))
    for causal in (False, True):
        assert A.naive_attention(q, k, v, causal).device.type == "meta"
        out, lse = A.flash_attention_forward(q, k, v, causal, 8, 16)
        assert out.device.type == lse.device.type == "meta"
        grads = A.flash_attention_backward(q, k, v, out, lse, out, causal, 8, 16)
        assert all(g.device.type == "meta" for g in grads)
    q1 = q[:, :, :1]
    assert A.flash_decode(q1, k, v, 50).device.type == "meta"  # more splits than keys
    assert A.merge_partials([out, out], [lse, lse])[0].device.type == "meta"
    assert A.online_softmax(torch.zeros(3, 40, device="meta"), 7).device.type == "meta"
    assert A.sdpa_attention(q, k, v, causal=True).device.type == "meta"


def test_half_precision_accumulates_in_float32():
    for dtype, tol in [(torch.float16, 2e-3), (torch.bfloat16, 1.6e-2)]:
        q, k, v = (t.to(dtype) for t in _qkv(1, 2, 300, 300, 40))
        out, lse = A.flash_attention_forward(q, k, v, True, 32, 32)
        assert out.dtype == dtype and lse.dtype == torch.float32
        want = A.naive_attention(q.float(), k.float(), v.float(), True)
        torch.testing.assert_close(out.float(), want, atol=tol, rtol=tol)
        dec = A.flash_decode(q[:, :, -1:], k, v, 7)
        assert dec.dtype == dtype
        torch.testing.assert_close(dec.float(), A.naive_attention(q[:, :, -1:].float(), k.float(), v.float()), atol=tol, rtol=tol)


def test_merge_partials_edge_cases():
    outs = [torch.randn(1, 1, 3, 4) for _ in range(3)]
    lses = [torch.tensor([[[1e4, 0.0, float("-inf")]]]), torch.tensor([[[1e4, float("-inf"), float("-inf")]]]),
            torch.tensor([[[-1e4, 1.0, float("-inf")]]])]
    outs[1][0, 0, 1:] = float("nan")  # an empty part's out is ignored
    out, lse = A.merge_partials(outs, lses)
    torch.testing.assert_close(out[0, 0, 0], (outs[0][0, 0, 0] + outs[1][0, 0, 0]) / 2)
    w = torch.softmax(torch.tensor([0.0, 1.0]), 0)
    torch.testing.assert_close(out[0, 0, 1], w[0] * outs[0][0, 0, 1] + w[1] * outs[2][0, 0, 1])
    assert torch.equal(out[0, 0, 2], torch.zeros(4)) and lse[0, 0, 2] == float("-inf")
    assert abs(lse[0, 0, 0].item() - (1e4 + math.log(2))) < 1e-2
    q, k, v = _qkv(1, 2, 1, 5, 8)
    for s in (6, 10):  # more splits than keys: empty chunks contribute nothing
        torch.testing.assert_close(A.flash_decode(q, k, v, s), A.naive_attention(q, k, v), atol=1e-6, rtol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_reference_on_cuda_matches_cpu():
    q, k, v = _qkv(2, 3, 70, 90, 24)
    qc, kc, vc = (t.cuda() for t in (q, k, v))
    for causal in (False, True):
        out, lse = A.flash_attention_forward(q, k, v, causal, 16, 32)
        out_c, lse_c = A.flash_attention_forward(qc, kc, vc, causal, 16, 32)
        torch.testing.assert_close(out_c.cpu(), out, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(lse_c.cpu(), lse, atol=1e-4, rtol=1e-4)
        for g, gc in zip(A.flash_attention_backward(q, k, v, out, lse, out, causal, 16, 32),
                         A.flash_attention_backward(qc, kc, vc, out_c, lse_c, out_c, causal, 16, 32)):
            torch.testing.assert_close(gc.cpu(), g, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(A.flash_decode(qc[:, :, :1], kc, vc, 7).cpu(), A.flash_decode(q[:, :, :1], k, v, 7),
                               atol=1e-4, rtol=1e-4)
    model = tiny_model(seed=0).cuda()
    ids = torch.randint(0, 128, (2, 20), device="cuda")
    with torch.no_grad():
        want = model(ids)
        model.attention_fn = A.expand_kv(lambda q, k, v, causal=False: A.flash_attention(q, k, v, causal, 8, 8))
        torch.testing.assert_close(model(ids), want, atol=1e-3, rtol=1e-3)


def test_flash_decode_gqa_reads_kv_once_per_kv_head():
    from grader.checks import observe

    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(2, 9, 1, 24, generator=g), torch.randn(2, 3, 50, 24, generator=g), torch.randn(2, 3, 50, 24, generator=g)
    want = A.gqa_attention(q, k, v)
    packed, obs_packed = observe(A.flash_decode_gqa, q, k, v, 4)
    expanded, obs_expanded = observe(A.expand_kv(lambda q, k, v, causal=False: A.flash_decode(q, k, v, 4)), q, k, v)
    torch.testing.assert_close(packed, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(expanded, want, atol=1e-5, rtol=1e-5)
    def kv_bytes(obs):  # the K/V operands of QKᵀ and PV
        return sum(math.prod(b_) for _, b_ in obs.matmuls)

    assert kv_bytes(obs_expanded) == 3 * kv_bytes(obs_packed)
