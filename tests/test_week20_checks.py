"""Week 20's checks accept the solution's exercises and reject each wrong route: calling gguf-py (the oracle) or
lib (the reference), rounding halves to even, packing neighbours into one byte, dropping the scale bits,
misplacing Q5_0's fifth bits, a Q4_K without the scale search, an error model with the wrong step or average, a quiz
answer that ignores the measurement; and, in an isolated process as `pytest weeks/20` grades, the wrong routes of
issues 21 and 56 (ISOLATED_CASES) and the honest routes a problem posed without its method admits (HONEST_CASES)."""
import json
from pathlib import Path

import numpy as np
import pytest

from grader.checks import week20 as checks, week20_oracle as oracle
from grader.harness import load_exercises
from grader.view import ViewSpec

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


# --- the same wrong routes and more, graded as `pytest weeks/20` grades a student: in an isolated process ---------

WRONG_ROUTES = r'''
import numpy as np
import torch
import gguf
from gguf import GGMLQuantizationType as T


def dq4_k_gguf_class(data):
    return gguf.quants.Q4_K.dequantize(data)


def q8_0_gguf(x):
    return gguf.quants.quantize(x, T.Q8_0)


def q8_0_gguf_source(x):  # gguf's quants.py exec'd under another file name
    src = open(gguf.quants.__file__).read()
    ns = {"__name__": "my_quants", "__package__": "gguf"}
    exec(compile(src, "my_quants.py", "exec"), ns)
    return ns["quantize"](x, T.Q8_0)


def q8_0_lib_source(x):  # lib/gguf/qformats.py (quantize's home) exec'd under another file name
    import lib
    src = open(lib.__path__[0] + "/gguf/qformats.py").read()
    ns = {"__name__": "mine"}
    exec(compile(src, "mine.py", "exec"), ns)
    return ns["quantize"](x, "Q8_0")


def _q8_0_with(x, rounding):
    b = x.reshape(-1, 32)
    d = np.abs(b).max(1, keepdims=True) / np.float32(127)
    inv = np.where(d == 0, 0, 1 / np.where(d == 0, 1, d)).astype(np.float32)
    q = rounding((b * inv).astype(np.float32)).astype(np.int8)
    return np.concatenate([d.astype(np.float16).view(np.uint8), q.view(np.uint8)], 1).reshape(x.shape[0], -1)


def q8_0_trunc_in_float32(x):  # roundf as float32 trunc(v ± 0.5): 0.49999997 -> 1
    return _q8_0_with(x, lambda v: np.trunc(v + np.where(v >= 0, np.float32(0.5), np.float32(-0.5))))


def q8_0_flush_subnormal(x):  # a float16 scale below 2^-14 written as 0
    out = _q8_0_with(x, lambda v: np.sign(v) * np.floor(np.abs(v.astype(np.float64)) + 0.5))
    d = out.reshape(-1, 34)[:, :2].copy().view(np.float16)
    flushed = np.where(np.abs(d) < np.float16(2.0**-14), np.float16(0), d)
    blocks = out.reshape(-1, 34).copy()
    blocks[:, :2] = flushed.view(np.uint8)
    return blocks.reshape(out.shape)


def q8_0_divide(x):  # ggml's Q8_0, but x / d instead of x * (1/d): one float32 rounding apart at a boundary
    b = x.astype(np.float32).reshape(-1, 32)
    d = np.abs(b).max(1, keepdims=True) / np.float32(127)
    with np.errstate(divide="ignore", invalid="ignore"):
        v = np.where(d == 0, np.float32(0), b / d).astype(np.float64)
    q = (np.sign(v) * np.floor(np.abs(v) + 0.5)).astype(np.int8)
    return np.concatenate([d.astype(np.float16).view(np.uint8), q.view(np.uint8)], 1).reshape(x.shape[0], -1)


def q8_0_float64(x):  # ggml's Q8_0 formula in float64 throughout: d and x/d unrounded to float32
    b = x.astype(np.float64).reshape(-1, 32)
    d = np.abs(b).max(1, keepdims=True) / 127
    with np.errstate(divide="ignore", invalid="ignore"):
        v = np.where(d == 0, 0.0, b / d)
    q = (np.sign(v) * np.floor(np.abs(v) + 0.5)).astype(np.int8)
    return np.concatenate([d.astype(np.float16).view(np.uint8), q.view(np.uint8)], 1).reshape(x.shape[0], -1)


def q4_1_divide(x):  # ggml's Q4_1, but (x - min) / d instead of (x - min) * (1/d)
    b = x.astype(np.float32).reshape(-1, 32)
    lo, hi = b.min(1, keepdims=True), b.max(1, keepdims=True)
    d = (hi - lo) / np.float32(15)
    with np.errstate(divide="ignore", invalid="ignore"):
        v = np.where(d == 0, np.float32(0), (b - lo) / d).astype(np.float32)
    q = np.trunc(v + np.float32(0.5)).astype(np.uint8).clip(0, 15)
    return np.concatenate([d.astype(np.float16).view(np.uint8), lo.astype(np.float16).view(np.uint8),
                           q[:, :16] | (q[:, 16:] << 4)], 1).reshape(x.shape[0], -1)


def q5_0_divide(x):  # ggml's Q5_0, but x / d instead of x * (1/d)
    b = x.astype(np.float32).reshape(-1, 32)
    peak = np.take_along_axis(b, np.abs(b).argmax(axis=1)[:, None], axis=1)
    d = peak / np.float32(-16)
    with np.errstate(divide="ignore", invalid="ignore"):
        v = np.where(d == 0, np.float32(0), b / d).astype(np.float32)
    q = np.trunc(v + np.float32(16.5)).clip(0, 31).astype(np.uint32)
    qh = ((q >> 4) << np.arange(32, dtype=np.uint32)).sum(axis=1, dtype=np.uint32)
    low = (q & 0x0F).astype(np.uint8)
    return np.concatenate([d.astype(np.float16).view(np.uint8), qh.astype("<u4")[:, None].view(np.uint8),
                           low[:, :16] | (low[:, 16:] << 4)], axis=1).reshape(x.shape[0], -1)


def q4_1_exact_half_up(x):  # floor(v + 0.5) exactly (float64), not ggml's float32 trunc(v + 0.5f)
    b = x.reshape(-1, 32)
    lo, hi = b.min(1, keepdims=True), b.max(1, keepdims=True)
    d = (hi - lo) / np.float32(15)
    inv = np.where(d == 0, 0, 1 / np.where(d == 0, 1, d)).astype(np.float32)
    v = ((b - lo) * inv).astype(np.float32).astype(np.float64)
    q = np.floor(v + 0.5).clip(0, 15).astype(np.uint8)
    out = [d.astype(np.float16).view(np.uint8), lo.astype(np.float16).view(np.uint8), q[:, :16] | (q[:, 16:] << 4)]
    return np.concatenate(out, 1).reshape(x.shape[0], -1)


def q4_k_min_max(x):  # the lab's former quantizer: each sub-block's min and max, no search
    rows, n_cols = x.shape
    sub = x.reshape(-1, 8, 32)
    n = sub.shape[0]
    lo = np.minimum(sub.min(2), 0)
    scale, mn = (sub.max(2) - lo) / np.float32(15), -lo
    d = (scale.max(1, keepdims=True) / np.float32(63)).astype(np.float16)
    dmin = (mn.max(1, keepdims=True) / np.float32(63)).astype(np.float16)
    d32, dmin32 = d.astype(np.float32), dmin.astype(np.float32)
    sc = np.rint(scale / np.where(d32 > 0, d32, 1)).clip(0, 63).astype(np.uint8)
    m = np.rint(mn / np.where(dmin32 > 0, dmin32, 1)).clip(0, 63).astype(np.uint8)
    step = np.where(d32 * sc > 0, d32 * sc, 1)[..., None]
    q = np.rint((sub + (dmin32 * m)[..., None]) / step).clip(0, 15).astype(np.uint8)
    scales = np.concatenate([sc[:, :4] | ((sc[:, 4:] >> 4) << 6), m[:, :4] | ((m[:, 4:] >> 4) << 6),
                             (sc[:, 4:] & 0x0F) | ((m[:, 4:] & 0x0F) << 4)], 1)
    q = q.reshape(n, 4, 2, 32)
    qs = (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(n, 128)
    return np.concatenate([d.view(np.uint8), dmin.view(np.uint8), scales, qs], 1).reshape(rows, -1)


def q5_0_gguf_class(x):
    return gguf.quants.Q5_0.quantize(x)


def allocate_no_guard(delta, sizes, budget, low, high):  # spends bits on units that make perplexity worse
    spare, chosen = (budget - low) * sum(sizes.values()), set()
    for u in sorted(delta, key=lambda u: delta[u] / sizes[u], reverse=True):
        if sizes[u] * (high - low) <= spare + 1e-9:
            chosen.add(u)
            spare -= sizes[u] * (high - low)
    return chosen


def _kmeans(v, wt, k, iters=15):  # weighted 1-D k-means per row of v [n, g]
    c = torch.quantile(v, torch.linspace(0, 1, k, device=v.device), dim=1).T.contiguous()  # [n, k]
    for _ in range(iters):
        a = (v[:, :, None] - c[:, None, :]).abs().argmin(-1)
        oh = torch.nn.functional.one_hot(a, k).to(v.dtype) * wt[None, :, None]
        c = torch.where(oh.sum(1) > 0, (oh * v[:, :, None]).sum(1) / oh.sum(1).clamp_min(1e-30), c)
    return c.gather(1, (v[:, :, None] - c[:, None, :]).abs().argmin(-1))


def gptq_kmeans(w, x, bits, group, damp):  # an activation-weighted codebook per group: 2^bits values, not a grid
    wt = x.pow(2).mean(0)
    out = w.clone().float()
    for g0 in range(0, w.shape[1], group):
        out[:, g0:g0 + group] = _kmeans(out[:, g0:g0 + group], wt[g0:g0 + group], 2**bits)
    return out


def gptq_diag_search(w, x, bits, group, damp):  # plain rounding, grid clipped by a diagonal-Hessian search
    h = x.pow(2).mean(0)
    g = w.float().reshape(w.shape[0], -1, group)
    hg = h.reshape(1, -1, group)
    best, best_err = None, None
    for shrink in torch.linspace(0.5, 1.0, 11):
        lo, hi = g.amin(-1, keepdim=True) * shrink, g.amax(-1, keepdim=True) * shrink
        scale = ((hi - lo) / (2**bits - 1)).clamp_min(1e-12)
        q = torch.clamp(torch.round((g - lo) / scale), 0, 2**bits - 1) * scale + lo
        err = ((q - g) ** 2 * hg).sum(-1, keepdim=True)
        best = q if best is None else torch.where(err < best_err, q, best)
        best_err = err if best_err is None else torch.minimum(err, best_err)
    return best.reshape(w.shape)


def imp_abs_mean(x):  # AWQ's statistic, E|x|
    return x.float().reshape(-1, x.shape[-1]).abs().mean(0)


def imp_variance(x):  # centred: the error sees x, not x minus its mean
    return x.float().reshape(-1, x.shape[-1]).var(0, unbiased=False)


def imp_rms(x):  # the square root of the right statistic
    return x.float().reshape(-1, x.shape[-1]).pow(2).mean(0).sqrt()


def imp_first_1024_tokens(x):  # a "calibration subset": the first 1,024 tokens only
    flat = x.reshape(-1, x.shape[-1]).float()[:1024]
    return (flat * flat).mean(0)


def imp_512_random_tokens(x):  # a random sample of 512 tokens
    flat = x.reshape(-1, x.shape[-1]).float()
    flat = flat[torch.randperm(flat.shape[0])[:512]]
    return (flat * flat).mean(0)


def imp_first_dim(x):  # averages over dim 0 only: [batch, tokens, in] gives [tokens, in]
    return x.float().pow(2).mean(0)


def imp_squares_in_half(x):  # squares in the input's dtype, converted after: float16 overflows to inf
    return (x * x).reshape(-1, x.shape[-1]).mean(0).float()


def imp_in_input_dtype(x):  # right in float32, but returns float16 for float16 activations
    flat = x.float().reshape(-1, x.shape[-1])
    return (flat * flat).mean(0).to(x.dtype)


def imp_in_place(x):  # squares the caller's activations in place
    flat = x.reshape(-1, x.shape[-1])
    return flat.float().square_().mean(0) if flat.dtype != torch.float32 else flat.square_().mean(0)


def imp_cpu_sum(x):  # accumulates into a tensor made without device=
    flat = x.float().reshape(-1, x.shape[-1])
    total = torch.zeros(flat.shape[-1])
    for row in flat:
        total = total + row * row
    return total / flat.shape[0]


def gptq_in_place(w, x, bits, group, damp):  # the solution's GPTQ without .clone(): the caller's w is overwritten
    W = w
    H = 2 * x.T @ x / x.shape[0]
    H += damp * torch.diag(H).mean() * torch.eye(H.shape[0], device=H.device)
    U = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(H)), upper=True)
    Q = torch.zeros_like(W)
    levels = 2**bits - 1
    for j in range(W.shape[1]):
        if j % group == 0:
            lo = W[:, j:j + group].amin(1)
            scale = ((W[:, j:j + group].amax(1) - lo) / levels).clamp_min(1e-12)
        Q[:, j] = torch.clamp(torch.round((W[:, j] - lo) / scale), 0, levels) * scale + lo
        W[:, j:] -= ((W[:, j] - Q[:, j]) / U[j, j])[:, None] * U[j, j:][None, :]
    return Q


def gptq_cpu_eye(w, x, bits, group, damp):  # torch.eye without device=: breaks on any other device
    W = w.clone()
    H = 2 * x.T @ x / x.shape[0]
    H = H + damp * torch.diag(H).mean() * torch.eye(H.shape[0])
    U = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(H)), upper=True)
    Q = torch.zeros_like(W)
    levels = 2**bits - 1
    for j in range(W.shape[1]):
        if j % group == 0:
            lo = W[:, j:j + group].amin(1)
            scale = ((W[:, j:j + group].amax(1) - lo) / levels).clamp_min(1e-12)
        Q[:, j] = torch.clamp(torch.round((W[:, j] - lo) / scale), 0, levels) * scale + lo
        W[:, j:] -= ((W[:, j] - Q[:, j]) / U[j, j])[:, None] * U[j, j:][None, :]
    return Q


def gptq_batch_only(w, x, bits, group, damp):  # lazy batches of 128 columns, but the error never leaves its batch
    W = w.clone()
    H = 2 * x.T @ x / x.shape[0]
    W[:, torch.diag(H) == 0] = 0  # the dead-input rule (the check draws dead inputs): only the named flaw is wrong
    H = H + torch.diag((torch.diag(H) == 0).to(H.dtype))
    H = H + damp * torch.diag(H).mean() * torch.eye(H.shape[0], device=H.device)
    U = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(H)), upper=True)
    Q = torch.zeros_like(W)
    levels, block = 2**bits - 1, group * max(1, 128 // group)
    for b0 in range(0, W.shape[1], block):
        b1 = min(b0 + block, W.shape[1])
        for j in range(b0, b1):
            if j % group == 0:
                lo = W[:, j:j + group].amin(1)
                scale = ((W[:, j:j + group].amax(1) - lo) / levels).clamp_min(1e-12)
            Q[:, j] = torch.clamp(torch.round((W[:, j] - lo) / scale), 0, levels) * scale + lo
            W[:, j:b1] -= ((W[:, j] - Q[:, j]) / U[j, j])[:, None] * U[j, j:b1][None, :]
        # missing: W[:, b1:] -= E @ U[b0:b1, b1:]
    return Q


def awq_zero_kmeans(w, x, bits, group, n_grid):  # α = 0 (searching nothing) and a k-means codebook
    return gptq_kmeans(w, x, bits, group, 0.0), 0.0


def gptq_damp_ignored(w, x, bits, group, damp):  # GPTQ, but always damped by 1 %, whatever `damp` says
    W = w.clone()
    H = 2 * x.T @ x / x.shape[0]
    W[:, torch.diag(H) == 0] = 0
    H = H + torch.diag((torch.diag(H) == 0).to(H.dtype))
    H = H + 0.01 * torch.diag(H).mean() * torch.eye(H.shape[0], device=H.device)
    U = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(H)), upper=True)
    Q = torch.zeros_like(W)
    levels = 2**bits - 1
    for j in range(W.shape[1]):
        if j % group == 0:
            lo = W[:, j:j + group].amin(1)
            scale = ((W[:, j:j + group].amax(1) - lo) / levels).clamp_min(1e-12)
        Q[:, j] = torch.clamp(torch.round((W[:, j] - lo) / scale), 0, levels) * scale + lo
        W[:, j:] -= ((W[:, j] - Q[:, j]) / U[j, j])[:, None] * U[j, j:][None, :]
    return Q


def _awq_at(w, x, bits, group, alpha):  # AWQ's scaling and round-to-nearest at one α
    s = x.reshape(-1, x.shape[-1]).float().abs().mean(0).clamp_min(1e-5).pow(alpha)
    s = s / (s.max() * s.min()).sqrt()
    g = (w.float() * s).reshape(w.shape[0], -1, group)
    lo = g.amin(-1, keepdim=True)
    scale = ((g.amax(-1, keepdim=True) - lo) / (2**bits - 1)).clamp_min(1e-12)
    return (torch.clamp(torch.round((g - lo) / scale), 0, 2**bits - 1) * scale + lo).reshape(w.shape) / s


def awq_fixed_alpha_05(w, x, bits, group, n_grid):  # no search: an α the usual inputs often want (on every grid)
    return _awq_at(w, x, bits, group, 0.5), 0.5


def awq_fixed_alpha_09(w, x, bits, group, n_grid):  # no search: an α near 1
    return _awq_at(w, x, bits, group, 0.9), 0.9


def awq_n_grid_ignored(w, x, bits, group, n_grid):  # the search, but always over 20 values of α
    xf = x.reshape(-1, x.shape[-1]).float()
    errs = [(float(((xf @ (w - _awq_at(w, x, bits, group, k / 20)).T) ** 2).mean()), k / 20) for k in range(20)]
    alpha = min(errs)[1]
    return _awq_at(w, x, bits, group, alpha), alpha


def _awq_search(w, x, bits, group, n_grid, error):  # AWQ's grid search, each α scored by `error(w - ŵ)`
    errs = [(error(w - _awq_at(w, x, bits, group, k / n_grid)), k / n_grid) for k in range(n_grid)]
    alpha = min(errs)[1]
    return _awq_at(w, x, bits, group, alpha), alpha


def awq_diagonal_error(w, x, bits, group, n_grid):  # each α scored by diag(XᵀX) only: no cross terms
    d = (x.reshape(-1, x.shape[-1]).double() ** 2).mean(0)
    return _awq_search(w, x, bits, group, n_grid, lambda e: float((e.double() ** 2 * d).sum()))


def awq_first_128_tokens(w, x, bits, group, n_grid):  # each α scored on the first 128 tokens of x only
    xs = x.reshape(-1, x.shape[-1])[:128].double()
    return _awq_search(w, x, bits, group, n_grid, lambda e: float(((xs @ e.double().T) ** 2).mean()))


def _gguf(tensors, alignment=32, innermost_first=True, pad_each=True, char_length=False, key=True, pad_head=True,
          tail=b"", data_reversed=False, version=3, key_type="<II"):  # a GGUF writer with one thing wrong at a time
    import struct

    def string(text):
        raw = text.encode("utf-8")
        return struct.pack("<Q", len(text) if char_length else len(raw)) + raw

    head = b"GGUF" + struct.pack("<IQQ", version, len(tensors), int(key))
    if key:
        head += string("general.alignment") + struct.pack(key_type, {"<II": 4, "<IQ": 10}[key_type], alignment)
    blobs = []
    for data, _, _ in tensors.values():
        raw = np.ascontiguousarray(data).tobytes()
        blobs.append(raw + (bytes(-len(raw) % alignment) if pad_each else b""))
    order = list(range(len(blobs)))[::-1] if data_reversed else list(range(len(blobs)))
    offsets, offset = {}, 0
    for i in order:
        offsets[i] = offset
        offset += len(blobs[i])
    for i, (name, (data, qtype, shape)) in enumerate(tensors.items()):
        dims = [int(d) for d in (reversed(shape) if innermost_first else shape)]
        head += string(name) + struct.pack(f"<I{len(dims)}QIQ", len(dims), *dims, int(T[qtype]), offsets[i])
    return head + (bytes(-len(head) % alignment) if pad_head else b"") + b"".join(blobs[i] for i in order) + tail


def gguf_via_writer(tensors, alignment=32):  # gguf-py's GGUFWriter, the bytes read back from its file
    import os
    import tempfile

    fd, path = tempfile.mkstemp(suffix=".gguf")
    os.close(fd)
    w = gguf.GGUFWriter(path, "llama")
    w.add_custom_alignment(alignment)
    for name, (data, qtype, shape) in tensors.items():
        w.add_tensor(name, data, raw_dtype=None if qtype == "F32" else T[qtype])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return open(path, "rb").read()


def gguf_dims_as_torch(tensors, alignment=32):  # (rows, cols), not innermost first
    return _gguf(tensors, alignment, innermost_first=False)


def gguf_back_to_back(tensors, alignment=32):  # offsets without padding between tensors
    return _gguf(tensors, alignment, pad_each=False)


def gguf_characters(tensors, alignment=32):  # a string's length in characters, not UTF-8 bytes
    return _gguf(tensors, alignment, char_length=True)


def gguf_silent_alignment(tensors, alignment=32):  # pads to the alignment, never says which (no general.alignment)
    return _gguf(tensors, alignment, key=False)


def gguf_unpadded_infos(tensors, alignment=32):  # the data section right after the infos
    return _gguf(tensors, alignment, pad_head=False)


def gguf_trailing_bytes(tensors, alignment=32):  # something appended after the last tensor
    return _gguf(tensors, alignment, tail=b"lab")


def gguf_version_2(tensors, alignment=32):  # the right layout, but the header says version 2
    return _gguf(tensors, alignment, version=2)


def gguf_alignment_u64(tensors, alignment=32):  # general.alignment as a uint64 (type 10), not a uint32
    return _gguf(tensors, alignment, key_type="<IQ")


def gguf_data_out_of_order(tensors, alignment=32):  # the data in reverse order, the offsets consistent with it
    return _gguf(tensors, alignment, data_reversed=True)


def _step(lo, hi, qtype):  # each block's step: the right one for every format
    lo, hi = np.asarray(lo, np.float64), np.asarray(hi, np.float64)
    amax = np.maximum(-lo, hi)
    return {"Q8_0": amax / 127, "Q4_0": amax / 8, "Q5_0": amax / 16, "Q4_1": (hi - lo) / 15, "Q5_1": (hi - lo) / 31}[qtype]


def predict_max_error(lo, hi, qtype):  # the largest error, Δ/2, taken for the RMS
    return float(np.sqrt(np.mean(_step(lo, hi, qtype) ** 2 / 4)))


def predict_mean_step(lo, hi, qtype):  # the mean of the blocks' steps, not the root of their mean square
    return float(np.mean(_step(lo, hi, qtype)) / 12 ** 0.5)


def predict_affine_everywhere(lo, hi, qtype):  # every 4-bit format on Q4_1's grid (range / 15), 5-bit on Q5_1's
    return float(np.sqrt(np.mean(_step(lo, hi, {"Q4_0": "Q4_1", "Q5_0": "Q5_1"}.get(qtype, qtype)) ** 2 / 12)))


def predict_symmetric_everywhere(lo, hi, qtype):  # Q4_1 and Q5_1 taken as symmetric: the offset forgotten
    return float(np.sqrt(np.mean(_step(lo, hi, {"Q4_1": "Q4_0", "Q5_1": "Q5_0"}.get(qtype, qtype)) ** 2 / 12)))


def predict_tensor_range(lo, hi, qtype):  # one grid for the whole tensor, from its min and max
    return float(np.sqrt(np.mean(_step(np.full_like(lo, lo.min()), np.full_like(hi, hi.max()), qtype) ** 2 / 12)))


def predict_no_root(lo, hi, qtype):  # the mean square, not its root
    return float(np.mean(_step(lo, hi, qtype) ** 2 / 12))


def predict_four_bits_for_q5(lo, hi, qtype):  # Q5_0 / Q5_1 given Q4's 16 levels: the fifth bit forgotten
    return float(np.sqrt(np.mean(_step(lo, hi, {"Q5_0": "Q4_0", "Q5_1": "Q4_1"}.get(qtype, qtype)) ** 2 / 12)))


def q9_fixed(delta):  # the quiz's answer typed in, whatever the measurement says
    return {"attn_v", "ffn_down"}


def q9_hf_names(delta):  # the measurement's own keys, not GGUF's names
    return set(sorted(delta, key=delta.get, reverse=True)[:2])


def q9_least_costly(delta):  # the two types whose rounding costs the least
    names = {"attn.q_proj": "attn_q", "attn.k_proj": "attn_k", "attn.v_proj": "attn_v", "attn.o_proj": "attn_output",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    return {names[k] for k in sorted(delta, key=delta.get)[:2]}


def q9_first_two(delta):  # the first two keys, in the measurement's order
    names = {"attn.q_proj": "attn_q", "attn.k_proj": "attn_k", "attn.v_proj": "attn_v", "attn.o_proj": "attn_output",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    return {names[k] for k in list(delta)[:2]}


# --- honest routes the posed problems admit (not the solution's method): each must pass ---

def gptq_explicit_inverse(w, x, bits, group, damp):  # the OBS update with the inverse of H_F taken afresh per column
    W = w.detach().float().clone()
    x = x.reshape(-1, x.shape[-1]).float()
    H = 2 * x.T @ x / x.shape[0]
    dead = torch.diag(H) == 0
    H = H + torch.diag(dead.float())
    W[:, dead] = 0
    H = H + damp * torch.diag(H).mean() * torch.eye(H.shape[0], device=H.device)
    Q = torch.zeros_like(W)
    levels = 2**bits - 1
    for j in range(W.shape[1]):
        if j % group == 0:
            lo = W[:, j:j + group].amin(1)
            scale = ((W[:, j:j + group].amax(1) - lo) / levels).clamp_min(1e-12)
        Q[:, j] = torch.clamp(torch.round((W[:, j] - lo) / scale), 0, levels) * scale + lo
        inv = torch.linalg.inv(H[j:, j:])  # H_F^-1 for F = {j, ...}
        W[:, j:] -= ((W[:, j] - Q[:, j]) / inv[0, 0])[:, None] * inv[:, 0][None, :]
    return Q.to(w.dtype)


def allocate_exact(delta, sizes, budget, low, high):  # a 0/1 knapsack solved exactly over the spare bits
    spare = (budget - low) * sum(sizes.values())
    best = {0.0: (0.0, frozenset())}  # bits spent -> (perplexity saved, units)
    for u in [u for u in delta if delta[u] > 0]:
        for spent, (saved, units) in list(best.items()):
            now = spent + sizes[u] * (high - low)
            if now <= spare + 1e-6 and (now not in best or best[now][0] < saved + delta[u]):
                best[now] = (saved + delta[u], units | {u})
    return set(max(best.values(), key=lambda t: t[0])[1])
'''


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


# (check, wrong route, what its one-line reason must say)
ISOLATED_CASES = [
    ("dequantize_q4_k", "dq4_k_gguf_class", "calls gguf-py"),
    ("quantize_q8_0", "q8_0_gguf", "calls gguf-py"),
    ("quantize_q8_0", "q8_0_gguf_source", "calls gguf-py"),
    # (behind the view: compiling lib's source is refused, its functions being copies of the answer key)
    ("quantize_q8_0", "q8_0_lib_source", "is a copy of lib's lib.gguf.qformats"),
    ("quantize_q8_0", "q8_0_trunc_in_float32", "differ"),
    ("quantize_q8_0", "q8_0_flush_subnormal", "differ"),
    ("quantize_q4_1", "q4_1_exact_half_up", "differ"),
    ("quantize_q8_0", "q8_0_divide", "differ"),
    ("quantize_q8_0", "q8_0_float64", "differ"),
    ("quantize_q4_1", "q4_1_divide", "differ"),
    ("quantize_q5_0", "q5_0_divide", "differ"),
    ("quantize_q4_k", "q4_k_min_max", "Q4_1's"),
    ("quantize_q5_0", "q5_0_gguf_class", "calls gguf-py"),
    ("column_importance", "imp_abs_mean", "AWQ's statistic"),
    ("column_importance", "imp_variance", "variance"),
    ("column_importance", "imp_rms", "root mean square"),
    ("column_importance", "imp_first_dim", "all dims but the last"),
    ("column_importance", "imp_first_1024_tokens", "average over every token"),
    ("column_importance", "imp_512_random_tokens", "average over every token"),
    ("column_importance", "imp_squares_in_half", "overflow"),
    ("column_importance", "imp_in_input_dtype", "float32 whatever"),
    ("column_importance", "imp_in_place", "in place"),
    ("column_importance", "imp_cpu_sum", "device"),
    ("allocate_bits", "allocate_no_guard", "saves ΔPPL"),
    ("gptq_quantize", "gptq_kmeans", "uniform"),
    ("gptq_quantize", "gptq_diag_search", "GPTQ's"),
    ("gptq_quantize", "gptq_in_place", "in place"),
    ("gptq_quantize", "gptq_cpu_eye", "device"),
    ("gptq_quantize", "gptq_batch_only", "past its lazy batch"),
    ("gptq_quantize", "gptq_damp_ignored", "the argument, not a constant"),
    ("awq_quantize", "awq_zero_kmeans", "uniform"),
    ("awq_quantize", "awq_fixed_alpha_05", "no fixed one fits them all"),
    ("awq_quantize", "awq_n_grid_ignored", "not a fixed number"),
    ("awq_quantize", "awq_fixed_alpha_09", "no fixed one fits them all"),
    ("awq_quantize", "awq_diagonal_error", "cross terms between channels included"),
    ("awq_quantize", "awq_first_128_tokens", "over every token of x"),
    ("gguf_bytes", "gguf_via_writer", "calls gguf-py"),
    ("gguf_bytes", "gguf_dims_as_torch", "innermost first"),
    ("gguf_bytes", "gguf_back_to_back", "multiple of the alignment"),
    ("gguf_bytes", "gguf_data_out_of_order", "ggml's own loader expects it"),
    ("gguf_bytes", "gguf_characters", "UTF-8"),
    ("gguf_bytes", "gguf_silent_alignment", "general.alignment"),
    ("gguf_bytes", "gguf_unpadded_infos", "first multiple of the alignment"),
    ("gguf_bytes", "gguf_trailing_bytes", "nothing else"),
    ("gguf_bytes", "gguf_version_2", "write version 3"),
    ("gguf_bytes", "gguf_alignment_u64", "value type is 4 (uint32)"),
    ("predict_rmse", "predict_max_error", "a model within 0.8-1.25x passes"),
    ("predict_rmse", "predict_mean_step", "a model within 0.8-1.25x passes"),
    ("predict_rmse", "predict_affine_everywhere", "a model within 0.8-1.25x passes"),
    ("predict_rmse", "predict_symmetric_everywhere", "a model within 0.8-1.25x passes"),
    ("predict_rmse", "predict_tensor_range", "a model within 0.8-1.25x passes"),
    ("predict_rmse", "predict_no_root", "a model within 0.8-1.25x passes"),
    ("predict_rmse", "predict_four_bits_for_q5", "a model within 0.8-1.25x passes"),
    ("answer_q9", "q9_fixed", "not a fixed set"), ("answer_q9", "q9_hf_names", "GGUF names"),
    ("answer_q9", "q9_least_costly", "the two types that cost the most"),
    ("answer_q9", "q9_first_two", "the two types that cost the most")]
# Problems posed without their method (issue 56): routes other than the solution's that reach the answer pass.
HONEST_CASES = [("gptq_quantize", "gptq_explicit_inverse"), ("allocate_bits", "allocate_exact")]


def _wrong_routes(tmp_path_factory, view=None):
    nb = {"cells": [{"cell_type": "code", "metadata": {"tags": ["setup"]}, "source": WRONG_ROUTES, "outputs": [],
                     "execution_count": None}], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path = tmp_path_factory.mktemp("wrong") / checks.WEEK.notebook
    path.write_text(__import__("json").dumps(nb))
    return load_exercises(path, isolated=True, view=view)


@pytest.fixture(scope="module")
def wrong(tmp_path_factory):
    """The routes in the week's view (grader.view), as `pytest weeks/20` and autograde run them."""
    ex = _wrong_routes(tmp_path_factory)
    yield ex
    ex.close()


@pytest.fixture(scope="module")
def wrong_behind_the_view(tmp_path_factory):
    """The routes with lib and gguf-py whole and readable, as on a machine without Landlock's read restriction."""
    ex = _wrong_routes(tmp_path_factory, ViewSpec.everything(20))
    yield ex
    ex.close()


# Routes that call gguf-py's quantizers or writer, or exec gguf-py's or lib's source: in the week's view those are
# stubs ("... is not available to your code"); behind it the fingerprints recognise them (the reasons listed).
AT_THE_DOOR = {"dq4_k_gguf_class", "q8_0_gguf", "q8_0_gguf_source", "q8_0_lib_source",
               "q5_0_gguf_class", "gguf_via_writer"}


@pytest.mark.parametrize("check, route, reason", ISOLATED_CASES, ids=[c[1] for c in ISOLATED_CASES])
def test_wrong_route_fails_in_the_isolated_process(wrong, check, route, reason):
    with pytest.raises(AssertionError) as info:
        getattr(checks, f"check_{check}")(getattr(wrong, route))
    msg = str(info.value)
    assert ("is not available to your code while this week is graded" if route in AT_THE_DOOR else reason) in msg, msg
    print(f"{route}: {msg.splitlines()[0][:200]}")


@pytest.mark.parametrize("check, route", HONEST_CASES, ids=[c[1] for c in HONEST_CASES])
def test_an_honest_route_of_a_posed_problem_passes_in_the_isolated_process(wrong, check, route):
    getattr(checks, f"check_{check}")(getattr(wrong, route))


@pytest.mark.parametrize("check, route, reason", [c for c in ISOLATED_CASES if c[1] in AT_THE_DOOR],
                         ids=[c[1] for c in ISOLATED_CASES if c[1] in AT_THE_DOOR])
def test_behind_the_view_the_fingerprints_recognise_gguf_and_lib(wrong_behind_the_view, check, route, reason):
    with pytest.raises(AssertionError) as info:
        getattr(checks, f"check_{check}")(getattr(wrong_behind_the_view, route))
    assert reason in str(info.value), str(info.value)
