"""Week 20's checks accept the solution notebook's exercises and reject each wrong route: calling gguf-py (the
oracle) or lib.quant (the reference), rounding halves to even, packing neighbours into one byte, dropping the
scale bits, ignoring the scales' cost."""
from pathlib import Path

import numpy as np
import pytest

from grader.checks import week20 as checks
from grader.harness import load_exercises

pytestmark = pytest.mark.model  # the checks draw real SmolLM2 rows

SOLUTION = Path(__file__).resolve().parent.parent / "solutions" / "20" / checks.WEEK.notebook


@pytest.fixture(scope="module")
def ex():
    return load_exercises(SOLUTION, isolated=False)  # the checks themselves are under test: trusted code, in-process


def _rejects(check, fn, *needles):
    with pytest.raises(AssertionError) as info:
        check(fn)
    msg = str(info.value)
    assert any(n in msg for n in needles), msg


# --- wrong routes -------------------------------------------------------------------------------------------

def via_gguf(qtype, direction):
    def fn(x):
        from gguf import GGMLQuantizationType
        from gguf import quants

        return getattr(quants, direction)(x, GGMLQuantizationType[qtype])
    return fn


def via_lib(qtype, direction):
    from lib import quant as hidden  # the reference under another name

    return lambda x: getattr(hidden, direction)(x, qtype)


def q8_0_round_half_even(x):
    rows, n = x.shape
    b = x.reshape(-1, 32)
    d = np.abs(b).max(1, keepdims=True) / np.float32(127)
    inv = np.where(d == 0, 0, 1 / np.where(d == 0, 1, d)).astype(np.float32)
    q = np.round(b * inv).astype(np.int8)  # torch.round / np.round: 2.5 -> 2
    return np.concatenate([d.astype(np.float16).view(np.uint8), q.view(np.uint8)], 1).reshape(rows, -1)


def q8_0_floor_half(x):
    rows, n = x.shape
    b = x.reshape(-1, 32)
    d = np.abs(b).max(1, keepdims=True) / np.float32(127)
    inv = np.where(d == 0, 0, 1 / np.where(d == 0, 1, d)).astype(np.float32)
    q = np.floor(b * inv + np.float32(0.5)).astype(np.int8)  # -2.5 -> -2, not -3
    return np.concatenate([d.astype(np.float16).view(np.uint8), q.view(np.uint8)], 1).reshape(rows, -1)


def dq8_0_in_float16(data):
    b = data.reshape(-1, 34)
    d = np.ascontiguousarray(b[:, :2]).view(np.float16)
    return (d * b[:, 2:].view(np.int8).astype(np.float16)).astype(np.float32).reshape(data.shape[0], -1)


def _q4_1_codes(x, rounding):
    b = x.reshape(-1, 32)
    lo, hi = b.min(1, keepdims=True), b.max(1, keepdims=True)
    d = (hi - lo) / np.float32(15)
    inv = np.where(d == 0, 0, 1 / np.where(d == 0, 1, d)).astype(np.float32)
    return d, lo, rounding((b - lo) * inv).clip(0, 15).astype(np.uint8)


def q4_1_round_half_even(x):
    d, lo, q = _q4_1_codes(x, np.round)
    out = [d.astype(np.float16).view(np.uint8), lo.astype(np.float16).view(np.uint8), q[:, :16] | (q[:, 16:] << 4)]
    return np.concatenate(out, 1).reshape(x.shape[0], -1)


def q4_1_neighbour_nibbles(x):
    d, lo, q = _q4_1_codes(x, lambda v: np.trunc(v + np.float32(0.5)))
    out = [d.astype(np.float16).view(np.uint8), lo.astype(np.float16).view(np.uint8), q[:, 0::2] | (q[:, 1::2] << 4)]
    return np.concatenate(out, 1).reshape(x.shape[0], -1)


def dq4_1_neighbour_nibbles(data):
    b = data.reshape(-1, 20)
    d = np.ascontiguousarray(b[:, :2]).view(np.float16).astype(np.float32)
    m = np.ascontiguousarray(b[:, 2:4]).view(np.float16).astype(np.float32)
    q = np.stack([b[:, 4:] & 0x0F, b[:, 4:] >> 4], -1).reshape(-1, 32).astype(np.float32)
    return (d * q + m).reshape(data.shape[0], -1)


def bits_without_scales(qtype):
    return {"Q8_0": 8.0, "Q4_0": 4.0, "Q4_1": 4.0, "Q5_0": 5.0, "Q5_1": 5.0, "Q4_K": 4.0, "Q5_K": 5.0, "Q6_K": 6.0}[qtype]


def q4_k_symmetric_ignoring_mins(x):
    """Writes scale d·sc but leaves every min at 0: negative weights clip to 0."""
    rows, n = x.shape
    sub = x.reshape(-1, 8, 32)
    k = sub.shape[0]
    scale = np.abs(sub).max(2) / np.float32(15)
    d = (scale.max(1, keepdims=True) / np.float32(63)).astype(np.float16)
    sc = np.round(scale / np.maximum(d.astype(np.float32), 1e-30)).clip(0, 63).astype(np.uint8)
    q = np.round(sub / np.maximum((d.astype(np.float32) * sc)[..., None], 1e-30)).clip(0, 15).astype(np.uint8)
    scales = np.concatenate([sc[:, :4] | ((sc[:, 4:] >> 4) << 6), np.zeros((k, 4), np.uint8), sc[:, 4:] & 0x0F], 1)
    q = q.reshape(k, 4, 2, 32)
    qs = (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(k, 128)
    zero = np.zeros((k, 1), np.float16)
    return np.concatenate([d.view(np.uint8), zero.view(np.uint8), scales, qs], 1).reshape(rows, -1)


# --- the tests -------------------------------------------------------------------------------------------------

def test_quantize_q8_0(ex):
    checks.check_quantize_q8_0(ex.quantize_q8_0)
    _rejects(checks.check_quantize_q8_0, via_gguf("Q8_0", "quantize"), "calls gguf-py")
    _rejects(checks.check_quantize_q8_0, via_lib("Q8_0", "quantize"), "calls the lab's reference")
    _rejects(checks.check_quantize_q8_0, q8_0_round_half_even, "differ")
    _rejects(checks.check_quantize_q8_0, q8_0_floor_half, "differ")


def test_dequantize_q8_0(ex):
    checks.check_dequantize_q8_0(ex.dequantize_q8_0)
    _rejects(checks.check_dequantize_q8_0, via_gguf("Q8_0", "dequantize"), "calls gguf-py")
    _rejects(checks.check_dequantize_q8_0, via_lib("Q8_0", "dequantize"), "calls the lab's reference")
    _rejects(checks.check_dequantize_q8_0, dq8_0_in_float16, "differ")


def test_quantize_q4_1(ex):
    checks.check_quantize_q4_1(ex.quantize_q4_1)
    _rejects(checks.check_quantize_q4_1, via_gguf("Q4_1", "quantize"), "calls gguf-py")
    _rejects(checks.check_quantize_q4_1, via_lib("Q4_1", "quantize"), "calls the lab's reference")
    _rejects(checks.check_quantize_q4_1, q4_1_round_half_even, "differ")
    _rejects(checks.check_quantize_q4_1, q4_1_neighbour_nibbles, "differ")


def test_dequantize_q4_1(ex):
    checks.check_dequantize_q4_1(ex.dequantize_q4_1)
    _rejects(checks.check_dequantize_q4_1, via_gguf("Q4_1", "dequantize"), "calls gguf-py")
    _rejects(checks.check_dequantize_q4_1, via_lib("Q4_1", "dequantize"), "calls the lab's reference")
    _rejects(checks.check_dequantize_q4_1, dq4_1_neighbour_nibbles, "differ")


def test_bits_per_weight(ex):
    checks.check_bits_per_weight(ex.bits_per_weight)
    _rejects(checks.check_bits_per_weight, bits_without_scales, "count the scales")
    from lib.quant import bits_per_weight as hidden

    _rejects(checks.check_bits_per_weight, lambda t: hidden(t), "calls the lab's reference")


def test_dequantize_q4_k(ex):
    checks.check_dequantize_q4_k(ex.dequantize_q4_k)
    _rejects(checks.check_dequantize_q4_k, via_gguf("Q4_K", "dequantize"), "calls gguf-py")
    _rejects(checks.check_dequantize_q4_k, via_lib("Q4_K", "dequantize"), "calls the lab's reference")

    def low_scale_bits_only(data):  # the student's own decoder, but the top 2 bits of sc/m[4..7] are dropped
        b = np.ascontiguousarray(data).reshape(-1, 144).copy()
        b[:, 4:12] &= 0x3F
        return ex.dequantize_q4_k(b.reshape(data.shape))

    _rejects(checks.check_dequantize_q4_k, low_scale_bits_only, "differ")


def test_quantize_q4_k(ex):
    checks.check_quantize_q4_k(ex.quantize_q4_k)
    _rejects(checks.check_quantize_q4_k, via_lib("Q4_K", "quantize"), "calls the lab's reference")
    _rejects(checks.check_quantize_q4_k, q4_k_symmetric_ignoring_mins, "RMSE")

    def neighbour_sub_blocks(x):  # sub-blocks 2j, 2j+1 written to consecutive 16-byte halves: decodes scrambled
        data = ex.quantize_q4_k(x).reshape(-1, 144).copy()
        qs = data[:, 16:].reshape(-1, 4, 32)
        lo, hi = qs & 0x0F, qs >> 4
        data[:, 16:] = np.concatenate([lo[:, :, 0::2] | (lo[:, :, 1::2] << 4), hi[:, :, 0::2] | (hi[:, :, 1::2] << 4)],
                                      axis=2).reshape(-1, 128)
        return data.reshape(x.shape[0], -1)

    _rejects(checks.check_quantize_q4_k, neighbour_sub_blocks, "RMSE")
    _rejects(checks.check_quantize_q4_k, lambda x: np.zeros((x.shape[0], x.shape[1] // 256 * 144), np.uint8), "RMSE")


def test_allocate_bits(ex):
    checks.check_allocate_bits(ex.allocate_bits)

    def by_total_delta(delta, sizes, budget, low, high):  # ignores what each unit costs
        spare, chosen = (budget - low) * sum(sizes.values()), set()
        for u in sorted(delta, key=delta.get, reverse=True):
            if sizes[u] * (high - low) <= spare:
                chosen.add(u)
                spare -= sizes[u] * (high - low)
        return chosen

    _rejects(checks.check_allocate_bits, by_total_delta, "per weight")
    _rejects(checks.check_allocate_bits, lambda *a: set(a[0]), "over the budget")
    from lib.quant import allocate_bits as hidden

    _rejects(checks.check_allocate_bits, lambda *a: hidden(*a), "calls the lab's reference")


def test_gptq_quantize(ex):
    import torch

    checks.check_gptq_quantize(ex.gptq_quantize)
    from lib.quant import rtn_quantize

    _rejects(checks.check_gptq_quantize, lambda w, x, bits, group, damp: rtn_quantize(w, bits, group), "calls the lab's")

    def rtn_own(w, x, bits, group, damp):  # round to nearest, no error compensation
        g = w.reshape(w.shape[0], -1, group)
        lo = g.amin(-1, keepdim=True)
        scale = ((g.amax(-1, keepdim=True) - lo) / (2**bits - 1)).clamp_min(1e-12)
        return (torch.clamp(torch.round((g - lo) / scale), 0, 2**bits - 1) * scale + lo).reshape(w.shape)

    _rejects(checks.check_gptq_quantize, rtn_own, "output error")
    _rejects(checks.check_gptq_quantize, lambda w, x, bits, group, damp: w.clone(), "not quantized")
    from lib.gptq import gptq_quantize as hidden

    _rejects(checks.check_gptq_quantize, lambda *a: hidden(*a), "calls the lab's reference")


def test_awq_quantize(ex):
    checks.check_awq_quantize(ex.awq_quantize)
    from lib.awq import awq_quantize as hidden

    _rejects(checks.check_awq_quantize, lambda *a: hidden(*a), "calls the lab's reference")
    _rejects(checks.check_awq_quantize, lambda w, x, bits, group, n: (ex.awq_quantize(w, x, bits, group, 1)[0], 0.0),
             "grid search finds")  # alpha = 0 only: plain RTN
    _rejects(checks.check_awq_quantize, lambda w, x, bits, group, n: (w.clone(), 0.5), "not quantized")


def test_answer_q9(ex):
    checks.check_answer_q9(ex.answer_q9)
    _rejects(checks.check_answer_q9, lambda: {"attn_q", "attn_k"}, "Q6_K")
