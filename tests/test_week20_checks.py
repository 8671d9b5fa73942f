"""Week 20's checks accept the solution's exercises and reject each wrong route: calling gguf-py (the oracle) or
lib (the reference), rounding halves to even, packing neighbours into one byte, dropping the scale bits,
misplacing Q5_0's fifth bits, a Q4_K without the scale search, an error model with the wrong step or average, a quiz
answer that ignores the measurement. These run in-process (the checks are trusted code); the wrong routes of issues
21 and 56 in an isolated process, as `pytest weeks/20` grades: tests/test_week20_isolated.py."""
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from grader.checks import week20 as checks, week20_oracle as oracle
from grader.harness import load_exercises

pytestmark = pytest.mark.model  # the checks draw real SmolLM2 rows

SOLUTION = Path(__file__).resolve().parent.parent / "solutions" / "20" / checks.WEEK.notebook

_spec = importlib.util.spec_from_file_location("_week20_routes", Path(__file__).with_name("_week20_routes.py"))
_routes = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_routes)
WRONG_ROUTES = _routes.WRONG_ROUTES


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
    from lib.gguf import qformats as hidden  # the reference under another name

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


def test_quantize_q4_1(ex):
    checks.check_quantize_q4_1(ex.quantize_q4_1)
    _rejects(checks.check_quantize_q4_1, via_gguf("Q4_1", "quantize"), "calls gguf-py")
    _rejects(checks.check_quantize_q4_1, via_lib("Q4_1", "quantize"), "calls the lab's reference")
    _rejects(checks.check_quantize_q4_1, q4_1_round_half_even, "differ")
    _rejects(checks.check_quantize_q4_1, q4_1_neighbour_nibbles, "differ")


def q5_0_high_bits_reversed(own):  # the student's own quantizer, but bit 31 - i for code i
    return lambda x: _reverse_qh(own(x), x.shape[0])


def _reverse_qh(data, rows):
    out = data.reshape(-1, 22).copy()
    word = np.ascontiguousarray(out[:, 2:6]).view("<u4")[:, 0]
    rev = np.zeros_like(word)
    for i in range(32):
        rev |= ((word >> i) & 1) << (31 - i)
    out[:, 2:6] = rev.astype("<u4")[:, None].view(np.uint8)
    return out.reshape(rows, -1)


def q5_0_exact_half_up(own):  # exact floor(v + 16.5), not float32's trunc(v + 16.5f)
    return lambda x: _exact_codes(own(x), x)


def _exact_codes(data, x):
    out = data.reshape(-1, 22).copy()
    b = x.reshape(-1, 32)
    d = np.ascontiguousarray(out[:, :2]).view(np.float16).astype(np.float32)
    inv = np.where(d == 0, 0, 1 / np.where(d == 0, 1, d)).astype(np.float32)
    q = np.floor((b * inv).astype(np.float32).astype(np.float64) + 16.5).clip(0, 31).astype(np.uint32)
    out[:, 2:6] = ((q >> 4) << np.arange(32, dtype=np.uint32)).sum(1, dtype=np.uint32).astype("<u4")[:, None].view(np.uint8)
    low = (q & 0x0F).astype(np.uint8)
    out[:, 6:] = low[:, :16] | (low[:, 16:] << 4)
    return out.reshape(x.shape[0], -1)


def q5_0_positive_on_ties(x):  # ggml's Q5_0, but on a ± tie of the abs-max the positive value sets d
    b = x.astype(np.float32).reshape(-1, 32)
    hi, lo = b.max(1), b.min(1)
    mx = np.where(hi >= -lo, hi, lo)  # ggml keeps the first of the two (a strictly larger |x| replaces it)
    d = (mx / np.float32(-16)).astype(np.float32)
    inv = np.where(d == 0, 0, 1 / np.where(d == 0, 1, d)).astype(np.float32)
    q = np.trunc((b * inv[:, None]).astype(np.float32) + np.float32(16.5)).clip(0, 31).astype(np.uint32)
    out = np.zeros((b.shape[0], 22), dtype=np.uint8)
    out[:, :2] = d.astype(np.float16)[:, None].view(np.uint8)
    out[:, 2:6] = ((q >> 4) << np.arange(32, dtype=np.uint32)).sum(1, dtype=np.uint32).astype("<u4")[:, None].view(np.uint8)
    low = (q & 0x0F).astype(np.uint8)
    out[:, 6:] = low[:, :16] | (low[:, 16:] << 4)
    return out.reshape(x.shape[0], -1)


def test_quantize_q5_0(ex):
    checks.check_quantize_q5_0(ex.quantize_q5_0)
    _rejects(checks.check_quantize_q5_0, q5_0_positive_on_ties, "differ")
    _rejects(checks.check_quantize_q5_0, via_gguf("Q5_0", "quantize"), "calls gguf-py")
    _rejects(checks.check_quantize_q5_0, via_lib("Q5_0", "quantize"), "calls the lab's reference")
    _rejects(checks.check_quantize_q5_0, q5_0_high_bits_reversed(ex.quantize_q5_0), "fifth bits")
    _rejects(checks.check_quantize_q5_0, q5_0_exact_half_up(ex.quantize_q5_0), "differ")


def test_dequantize_q4_k(ex):
    checks.check_dequantize_q4_k(ex.dequantize_q4_k)
    _rejects(checks.check_dequantize_q4_k, via_gguf("Q4_K", "dequantize"), "calls gguf-py")
    _rejects(checks.check_dequantize_q4_k, via_lib("Q4_K", "dequantize"), "calls the lab's reference")

    def low_scale_bits_only(data):  # the student's own decoder, but the top 2 bits of sc/m[4..7] are dropped
        b = np.ascontiguousarray(data).reshape(-1, 144).copy()
        b[:, 4:12] &= 0x3F
        return ex.dequantize_q4_k(b.reshape(data.shape))

    _rejects(checks.check_dequantize_q4_k, low_scale_bits_only, "differ")


def _solution_with(name: str, old: str, new: str):
    """The solution notebook's `name`, its source edited (`old` -> `new`): a natural mistake, in the student's code."""
    from grader.notebook import exercise_cells

    source = next(src for _, gid, src in exercise_cells(json.loads(SOLUTION.read_text())) if gid == name)
    assert old in source, f"the solution's {name} no longer holds {old!r}"
    ns = {"np": np}
    exec(source.replace(old, new), ns)
    return ns[name]


def test_quantize_q4_k(ex):
    checks.check_quantize_q4_k(ex.quantize_q4_k)
    _rejects(checks.check_quantize_q4_k, via_lib("Q4_K", "quantize"), "calls the lab's reference")
    _rejects(checks.check_quantize_q4_k, q4_k_symmetric_ignoring_mins, "RMSE")
    unweighted = _solution_with("quantize_q4_k", "w = np.sqrt((sub ** 2).mean(axis=2, keepdims=True)) + np.abs(sub)",
                                "w = np.ones_like(sub)")  # plain least squares: a lower RMSE, the wrong objective
    _rejects(checks.check_quantize_q4_k, unweighted, "the weighted error")

    def neighbour_sub_blocks(x):  # sub-blocks 2j, 2j+1 written to consecutive 16-byte halves: decodes scrambled
        data = ex.quantize_q4_k(x).reshape(-1, 144).copy()
        qs = data[:, 16:].reshape(-1, 4, 32)
        lo, hi = qs & 0x0F, qs >> 4
        data[:, 16:] = np.concatenate([lo[:, :, 0::2] | (lo[:, :, 1::2] << 4), hi[:, :, 0::2] | (hi[:, :, 1::2] << 4)],
                                      axis=2).reshape(-1, 128)
        return data.reshape(x.shape[0], -1)

    _rejects(checks.check_quantize_q4_k, neighbour_sub_blocks, "RMSE")
    _rejects(checks.check_quantize_q4_k, lambda x: np.zeros((x.shape[0], x.shape[1] // 256 * 144), np.uint8), "RMSE")


def test_column_importance(ex):
    checks.check_column_importance(ex.column_importance)
    _rejects(checks.check_column_importance, lambda x: x.float().reshape(-1, x.shape[-1]).mean(0) ** 2, "squared mean")
    _rejects(checks.check_column_importance, lambda x: x.float().reshape(-1, x.shape[-1]).abs().max(0).values,
             "not proportional")


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

    def low_assumed(delta, sizes, budget, low, high):  # the right greedy, but the low format taken as 3.5 bits
        return ex.allocate_bits(delta, sizes, budget, 3.5, high)

    _rejects(checks.check_allocate_bits, low_assumed, "with the low and high given")
    from lib.quantization.quant import allocate_bits as hidden

    _rejects(checks.check_allocate_bits, lambda *a: hidden(*a), "calls the lab's reference")


def test_gptq_quantize(ex):
    import torch

    checks.check_gptq_quantize(ex.gptq_quantize)
    from lib.quantization.quant import rtn_quantize

    _rejects(checks.check_gptq_quantize, lambda w, x, bits, group, damp: rtn_quantize(w, bits, group), "calls the lab's")

    def rtn_own(w, x, bits, group, damp):  # round to nearest, no error compensation
        g = w.reshape(w.shape[0], -1, group)
        lo = g.amin(-1, keepdim=True)
        scale = ((g.amax(-1, keepdim=True) - lo) / (2**bits - 1)).clamp_min(1e-12)
        return (torch.clamp(torch.round((g - lo) / scale), 0, 2**bits - 1) * scale + lo).reshape(w.shape)

    _rejects(checks.check_gptq_quantize, rtn_own, "GPTQ's")
    _rejects(checks.check_gptq_quantize, lambda w, x, bits, group, damp: w.clone(), "uniform")
    from lib.quantization.gptq import gptq_quantize as hidden

    _rejects(checks.check_gptq_quantize, lambda *a: hidden(*a), "calls the lab's reference")


def test_awq_quantize(ex):
    checks.check_awq_quantize(ex.awq_quantize)
    from lib.quantization.awq import awq_quantize as hidden

    _rejects(checks.check_awq_quantize, lambda *a: hidden(*a), "calls the lab's reference")
    _rejects(checks.check_awq_quantize, lambda w, x, bits, group, n: (ex.awq_quantize(w, x, bits, group, 1)[0], 0.0),
             "grid search finds")  # alpha = 0 only: plain RTN
    _rejects(checks.check_awq_quantize, lambda w, x, bits, group, n: (w.clone(), 0.5), "uniform")


def test_gguf_bytes(ex):
    checks.check_gguf_bytes(ex.gguf_bytes)


def test_predict_rmse(ex):
    checks.check_predict_rmse(ex.predict_rmse)

    def halved_step(lo, hi, qtype):  # the right model with a step of half the size (one bit too many)
        return ex.predict_rmse(lo / 2, hi / 2, qtype)

    _rejects(checks.check_predict_rmse, halved_step, "a model within 0.8-1.25x passes")
    _rejects(checks.check_predict_rmse, lambda lo, hi, qtype: [0.0] * len(lo), "expected one number")


def test_answer_q9(ex):
    checks.check_answer_q9(ex.answer_q9)
    _rejects(checks.check_answer_q9, lambda delta: {"attn_v", "ffn_down"}, "not a fixed set")




def test_the_boundary_blocks_alone_reject_a_division(ex):
    """The Q8_0, Q4_1 and Q5_0 checks' boundary blocks, whatever the seed: gguf-py's bytes are the solution's, and
    x / d (float32, or float64 throughout) writes other bytes there, not only where the real rows happen to tie."""
    routes = {}
    exec(WRONG_ROUTES, routes)
    for qtype, own, wrong in [("Q8_0", ex.quantize_q8_0, ["q8_0_divide", "q8_0_float64"]),
                              ("Q4_1", ex.quantize_q4_1, ["q4_1_divide"]), ("Q5_0", ex.quantize_q5_0, ["q5_0_divide"])]:
        for offset in (0, 17):
            x = oracle.reciprocal_boundaries(qtype, 8, offset)
            want = oracle.oracle_quantize(x, qtype)
            assert np.array_equal(own(x), want), qtype
            for name in wrong:
                assert not np.array_equal(routes[name](x), want), (qtype, name)
