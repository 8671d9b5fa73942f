"""Week 20 — quantized inference: the milestone checks, used by solutions/20/test_week20.py and the notebook.

One `check_<name>` per exercise; each takes the student's function and raises AssertionError with a
message that says what is wrong. The oracle is gguf-py (`gguf.quants`, a numpy port of ggml-quants.c);
the lab's reference is lib/quant.py. Every byte must match: inputs include random, heavy-tailed and real
SmolLM2 tensors and blocks built so that x/d lands exactly on a half (a rounding tie).

A student's function may call neither `gguf` (the oracle) nor `lib.quant` (the reference): the check runs
it under `observe` and a watcher of gguf-py's Python frames.
"""
from __future__ import annotations

import functools
import sys
from pathlib import Path

import numpy as np
import torch

from grader.checks import generator, observe, seed_note
from grader.harness import Week
from lib import quant as ref

WEEK = Week(20, "week20_quantization.ipynb")

SECTION_LEGACY = "2 (Q8_0, Q4_0 and Q4_1, byte for byte)"
SECTION_K = "4 (K-quants)"


# --- inputs ------------------------------------------------------------------------------------------------

def _normal(rows, n, offset):
    return torch.randn(rows, n, generator=generator(offset)).numpy().astype(np.float32)


def _heavy_tailed(rows, n, offset):
    """A scale mixture (Gaussian times log-normal) plus a few outliers 50x the typical size: what LLM
    weights and activations look like, and what stresses abs-max scaling."""
    g = generator(offset)
    x = torch.randn(rows, n, generator=g) * torch.exp(1.5 * torch.randn(rows, n, generator=g))
    hit = torch.rand(rows, n, generator=g) < 0.002
    x = torch.where(hit, 50 * torch.randn(rows, n, generator=g), x)
    return (0.02 * x).numpy().astype(np.float32)


@functools.lru_cache(maxsize=1)
def _smollm2_state():
    from lib.model import shared_smollm2

    model, _ = shared_smollm2()
    return {k: v.detach().cpu() for k, v in model.state_dict().items() if v.dim() == 2}


def _real(rows, block, offset):
    """`rows` rows of a random SmolLM2 weight matrix (a random layer and projection), as float32 numpy,
    cut to a multiple of `block` columns."""
    state = _smollm2_state()
    names = sorted(state)
    g = generator(offset)
    name = names[int(torch.randint(len(names), (1,), generator=g))]
    w = state[name]
    pick = torch.randperm(w.shape[0], generator=g)[:rows]
    n = w.shape[1] // block * block
    return name, w[pick, :n].numpy().astype(np.float32)


def _q8_ties(rows, offset):
    """Blocks whose abs-max is 127, so d = 1 and x/d = x: every other value is k + 0.5 — an exact tie."""
    g = generator(offset)
    k = torch.randint(-126, 126, (rows, 128), generator=g).float() + 0.5
    k[:, ::32] = 127.0 * torch.where(torch.rand(rows, 4, generator=g) < 0.5, -1.0, 1.0)
    return k.numpy().astype(np.float32)


def _q4_1_ties(rows, offset):
    """Blocks with min 0 and max 15, so d = 1 and (x - min)/d = x: the rest are k + 0.5 — ties."""
    g = generator(offset)
    k = torch.randint(0, 15, (rows, 128), generator=g).float() + 0.5
    k[:, ::32], k[:, 1::32] = 0.0, 15.0
    return k.numpy().astype(np.float32)


def _cases(block, offset, ties=None):
    """(description, x float32 [rows, n]) for random, heavy-tailed, real and (optionally) tie inputs."""
    yield "random normal [16, 1024]", _normal(16, 1024, offset)
    yield "heavy-tailed [16, 2048] (outliers 50x)", _heavy_tailed(16, 2048, offset + 1)
    for i in range(2):
        name, w = _real(24, block, offset + 2 + i)
        yield f"SmolLM2 {name}, 24 random rows", w
    if ties is not None:
        yield "tie blocks (x/d is exactly k + 0.5)", ties(8, offset + 4)


# --- comparing ----------------------------------------------------------------------------------------------

def _np(x, what):
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    assert isinstance(x, np.ndarray), f"{what}: returned {type(x).__name__}; expected a numpy array"
    return x


def _same_bytes(got, want: np.ndarray, x: np.ndarray, block: int, what: str, qtype: str) -> None:
    got = _np(got, what)
    assert got.dtype == np.uint8, f"{what}: dtype {got.dtype}; expected uint8 (raw GGUF bytes)"
    assert got.shape == want.shape, (f"{what}: shape {got.shape}; expected {want.shape} = [rows, n // {block} * "
                                     f"{want.shape[-1] // (x.shape[-1] // block)}] bytes")
    if np.array_equal(got, want):
        return
    nbytes = want.shape[-1] // (x.shape[-1] // block)
    diff = np.argwhere(got != want)[0]
    row, blk, byte = diff[0], diff[1] // nbytes, diff[1] % nbytes
    values = x[row, blk * block:(blk + 1) * block]
    raise AssertionError(
        f"{what}: byte {byte} of block {blk} in row {row} is {got[row, diff[1]]}, gguf-py writes {want[row, diff[1]]} "
        f"({int((got != want).sum())} bytes differ). The block's first values: {np.array2string(values[:6], precision=4)}. "
        f"Byte 0-1 is d as float16; check the {qtype} formula, float32 arithmetic throughout, and the rounding rule "
        f"(C roundf sends halves away from zero; np.round / torch.round send them to even) {seed_note()}")


def _same_floats(got, want: np.ndarray, what: str) -> None:
    got = _np(got, what)
    assert got.dtype == np.float32, f"{what}: dtype {got.dtype}; expected float32"
    assert got.shape == want.shape, f"{what}: shape {got.shape}; expected {want.shape}"
    if np.array_equal(got.view(np.uint32), want.view(np.uint32)):
        return
    bad = np.argwhere(got.view(np.uint32) != want.view(np.uint32))[0]
    raise AssertionError(
        f"{what}: value at {tuple(int(i) for i in bad)} is {got[tuple(bad)]!r}, gguf-py gives {want[tuple(bad)]!r} "
        f"({int((got != want).sum())} values differ). Bit-exact means the same float32 operations in the same order "
        f"(e.g. d * q + m, with d and m converted from float16 to float32 first) {seed_note()}")


_GGUF_FILE = Path(__import__("gguf").__file__)
_GGUF_DIRS = tuple({str(_GGUF_FILE.parent), str(_GGUF_FILE.resolve().parent)})  # as imported, and behind symlinks


def _run(fn, *args, what: str):
    """Call the student's `fn` under `observe`, also watching for gguf-py frames; refuse either route."""
    gguf_calls: set[str] = set()

    def watched(*a):
        previous = sys.getprofile()

        def profile(frame, event, arg):
            if event == "call" and frame.f_code.co_filename.startswith(_GGUF_DIRS):
                gguf_calls.add(f"gguf.{Path(frame.f_code.co_filename).stem}.{frame.f_code.co_name}")
            if previous is not None:
                previous(frame, event, arg)

        sys.setprofile(profile)
        try:
            return fn(*a)
        finally:
            sys.setprofile(previous)

    if getattr(fn, "__observe__", None) is not None:  # student code in another process: only lib calls are seen
        result, obs = observe(fn, *args)
    else:
        result, obs = observe(watched, *args)
    used = sorted(c for c in obs.lib_calls if c.startswith(("lib.quant.", "lib.gptq.", "lib.awq.")))
    assert not used, f"{what}: calls the lab's reference ({', '.join(used)}); write the block arithmetic yourself"
    assert not gguf_calls, (f"{what}: calls gguf-py ({', '.join(sorted(gguf_calls))}), the oracle this check compares "
                            f"against; write the block arithmetic yourself")
    return result


def _oracle_quantize(x, qtype):
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    return quantize(x, GGMLQuantizationType[qtype])


def _oracle_dequantize(data, qtype):
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    return dequantize(data, GGMLQuantizationType[qtype])


def _check_quantizer(fn, qtype, name, offset, ties):
    block = ref.BLOCK_SIZES[qtype][0]
    for desc, x in _cases(block, offset, ties):
        got = _run(fn, x.copy(), what=f"{name} on {desc}")
        _same_bytes(got, _oracle_quantize(x, qtype), x, block, f"{name} on {desc}", qtype)


def _random_blocks(qtype, rows, blocks, offset):
    """Random bytes in `qtype`'s layout whose float16 fields are finite, positive and of weight-like size."""
    g = generator(offset)
    nbytes = ref.BLOCK_SIZES[qtype][1]
    data = torch.randint(0, 256, (rows, blocks, nbytes), generator=g, dtype=torch.uint8).numpy()
    f16_fields = {"Q8_0": [0], "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q4_K": [0, 2],
                  "Q5_K": [0, 2], "Q6_K": [208]}[qtype]
    for at in f16_fields:
        scale = (torch.rand(rows, blocks, generator=g) * 0.01).numpy().astype(np.float16)
        if qtype in ("Q4_1", "Q5_1") and at == 2:
            scale = -scale  # m is the block's minimum, usually negative
        data[..., at:at + 2] = scale.reshape(rows, blocks, 1).view(np.uint8)
    return data.reshape(rows, blocks * nbytes)


def _check_dequantizer(fn, qtype, name, offset):
    block = ref.BLOCK_SIZES[qtype][0]
    cases = [("random bytes (8 rows, 12 blocks each)", _random_blocks(qtype, 8, 12, offset))]
    for desc, x in _cases(block, offset + 10):
        data = _oracle_quantize(x, qtype) if qtype in ref.QUANTIZE_TYPES[:5] else ref.quantize(x, qtype)
        cases.append((f"{qtype} bytes of {desc}", data))
    for desc, data in cases:
        got = _run(fn, data.copy(), what=f"{name} on {desc}")
        _same_floats(got, _oracle_dequantize(data, qtype), f"{name} on {desc}")


# --- 1-5: the legacy formats -----------------------------------------------------------------------------------

@WEEK.exercise(1, "quantize_q8_0", section=SECTION_LEGACY)
def check_quantize_q8_0(quantize_q8_0) -> None:
    """Bytes equal to gguf-py's on random, heavy-tailed, real and tie blocks (halves round away from zero)."""
    _check_quantizer(quantize_q8_0, "Q8_0", "quantize_q8_0", 100, _q8_ties)


@WEEK.exercise(2, "dequantize_q8_0", section=SECTION_LEGACY)
def check_dequantize_q8_0(dequantize_q8_0) -> None:
    _check_dequantizer(dequantize_q8_0, "Q8_0", "dequantize_q8_0", 200)


@WEEK.exercise(3, "quantize_q4_1", section=SECTION_LEGACY)
def check_quantize_q4_1(quantize_q4_1) -> None:
    """Bytes equal to gguf-py's, ties included: q = trunc((x - min) * (1/d) + 0.5) in float32, not a round()."""
    _check_quantizer(quantize_q4_1, "Q4_1", "quantize_q4_1", 300, _q4_1_ties)


@WEEK.exercise(4, "dequantize_q4_1", section=SECTION_LEGACY)
def check_dequantize_q4_1(dequantize_q4_1) -> None:
    _check_dequantizer(dequantize_q4_1, "Q4_1", "dequantize_q4_1", 400)


@WEEK.exercise(5, "bits_per_weight", section=SECTION_LEGACY)
def check_bits_per_weight(bits_per_weight) -> None:
    """bits_per_weight(qtype) for every type in lib.quant.DEQUANTIZE_TYPES, from the block layout (scales included)."""
    types = list(ref.DEQUANTIZE_TYPES)
    order = torch.randperm(len(types), generator=generator(500)).tolist()
    for i in order:
        qtype = types[i]
        got = _run(bits_per_weight, qtype, what=f"bits_per_weight({qtype!r})")
        want = ref.bits_per_weight(qtype)
        assert isinstance(got, (int, float)) and abs(float(got) - want) < 1e-9, (
            f"bits_per_weight({qtype!r}) = {got!r}; expected {want} = 8 x bytes per block / weights per block "
            f"({ref.BLOCK_SIZES[qtype][1]} bytes per {ref.BLOCK_SIZES[qtype][0]} weights: count the scales too)")


# --- 6-7: K-quants ------------------------------------------------------------------------------------------

@WEEK.exercise(6, "dequantize_q4_k", section=SECTION_K)
def check_dequantize_q4_k(dequantize_q4_k) -> None:
    """Bit-exact with gguf-py on random Q4_K bytes (every 6-bit scale and min pattern) and on quantized tensors."""
    _check_dequantizer(dequantize_q4_k, "Q4_K", "dequantize_q4_k", 600)


# A plain min/max Q4_K quantizer lands within 1 % of Q4_1's RMSE (4.5 vs 5.0 bits per weight) on Gaussian
# tensors (ratio 1.002 ± 0.0015 over 300 seeds of [16, 1024]); allow 3 %. On heavy-tailed tensors and SmolLM2's
# weights (decoded Q4_1 already), within 5 % of the lab's min/max Q4_K.
Q4_K_RMSE_VS_Q4_1 = 1.03
Q4_K_RMSE_VS_LAB = 1.05


@WEEK.exercise(7, "quantize_q4_k", section=SECTION_K)
def check_quantize_q4_k(quantize_q4_k) -> None:
    """Any Q4_K quantizer whose bytes gguf-py decodes to weights as close as Q4_1's on Gaussian ones (RMSE within
    3 %), and within 5 % of the lab's min/max Q4_K on heavy-tailed and real SmolLM2 rows."""
    for desc, x in _cases(256, 700):
        what = f"quantize_q4_k on {desc}"
        got = _np(_run(quantize_q4_k, x.copy(), what=what), what)
        want_shape = (x.shape[0], x.shape[1] // 256 * 144)
        assert got.dtype == np.uint8 and got.shape == want_shape, (
            f"{what}: returned {got.dtype} {got.shape}; expected uint8 {want_shape} (144 bytes per 256 weights)")
        decoded = _oracle_dequantize(got, "Q4_K")
        assert np.isfinite(decoded).all(), f"{what}: gguf-py decodes NaN or inf from your blocks (d or dmin?) {seed_note()}"
        rmse = float(np.sqrt(np.mean((decoded.astype(np.float64) - x) ** 2)))
        if desc.startswith("random normal"):
            base_name, base = "Q4_1", _oracle_dequantize(_oracle_quantize(x, "Q4_1"), "Q4_1")
            bound = Q4_K_RMSE_VS_Q4_1
        else:  # outliers spoil the 6-bit sub-block scales; real weights are decoded Q4_1, which Q4_1 gets for free
            base_name, base = "the lab's min/max Q4_K", ref.dequantize(ref.quantize(x, "Q4_K"), "Q4_K")
            bound = Q4_K_RMSE_VS_LAB
        rmse_base = float(np.sqrt(np.mean((base.astype(np.float64) - x) ** 2)))
        assert rmse <= bound * rmse_base + 1e-12, (
            f"{what}: gguf-py decodes your blocks with RMSE {rmse:.4g}, {base_name} gets {rmse_base:.4g} (allowed "
            f"{bound}x); a per-sub-block min/max quantizer gets within 1 % of Q4_1. Are the scales and mins packed in "
            f"the 12-byte layout, sub-block 2j in the low nibbles and 2j+1 in the high nibbles of the same 32 bytes? "
            f"{seed_note()}")


# --- 8: sensitivity -> bits -----------------------------------------------------------------------------------

def _saved(chosen, delta):
    return sum(delta[u] for u in chosen)


@WEEK.exercise(8, "allocate_bits", section="6 (Per-layer sensitivity)")
def check_allocate_bits(allocate_bits) -> None:
    """Within the budget, and saving at least the perplexity that the greedy-by-ratio allocation saves."""
    g = generator(800)
    cases = [  # a big unit that is sensitive in total but cheap per bit loses to two small ones
        ({"big": 10.0, "a": 6.0, "b": 6.0, "c": 0.5}, {"big": 1000, "a": 300, "b": 300, "c": 400}, 4.0, 3.5, 4.5)]
    for _ in range(6):
        n = int(torch.randint(5, 14, (1,), generator=g))
        names = [f"blk.{i}.{k}" for i, k in enumerate(torch.randint(0, 7, (n,), generator=g).tolist())]
        delta = {u: float(v) for u, v in zip(names, torch.rand(n, generator=g).pow(3) * 20)}
        sizes = {u: int(v) for u, v in zip(names, torch.randint(1, 9, (n,), generator=g) * 110_592)}
        low, high = 3.5, [4.5, 5.0, 8.5][int(torch.randint(3, (1,), generator=g))]
        budget = low + float(torch.rand(1, generator=g)) * (high - low)
        cases.append((delta, sizes, budget, low, high))
    for delta, sizes, budget, low, high in cases:
        what = f"allocate_bits(budget {budget:.3f} bits/weight, low {low}, high {high}, {len(delta)} units)"
        got = _run(allocate_bits, dict(delta), dict(sizes), budget, low, high, what=what)
        assert isinstance(got, (set, frozenset, list, tuple)), f"{what}: returned {type(got).__name__}; expected a set of names"
        got = set(got)
        assert got <= set(delta), f"{what}: returned names that are not units: {sorted(got - set(delta))}"
        bits = sum(sizes[u] * (high if u in got else low) for u in delta)
        assert bits <= budget * sum(sizes.values()) + 1e-6, (
            f"{what}: your choice {sorted(got)} needs {bits / sum(sizes.values()):.4f} bits/weight, over the budget")
        want = ref.allocate_bits(delta, sizes, budget, low, high)
        assert _saved(got, delta) >= _saved(want, delta) - 1e-9, (
            f"{what}: your choice {sorted(got)} saves ΔPPL {_saved(got, delta):.3f}; taking units in order of ΔPPL per "
            f"weight (the perplexity an extra bit buys) while they fit saves {_saved(want, delta):.3f} {seed_note()}")


# --- 9-10: GPTQ and AWQ --------------------------------------------------------------------------------------

def _calibration(rows, cols, n, offset):
    """Weights `[rows, cols]` and correlated inputs `[n, cols]` with a few outlier channels, like LLM activations."""
    g = generator(offset)
    w = 0.05 * torch.randn(rows, cols, generator=g)
    x = torch.randn(n, cols, generator=g) @ (torch.randn(cols, cols, generator=g) / cols**0.5)
    outliers = torch.randperm(cols, generator=g)[:4]
    x[:, outliers] *= 20
    return w, x


def _on_grid(w_q, bits, group_size, what, col_scale=None):
    """Every (row, group) of `w_q` (times `col_scale` per input channel) takes at most 2^bits distinct values
    (values closer than 1e-4 of the group's range count as one: float rounding of a rescaled grid)."""
    v = w_q.double() * (col_scale.double() if col_scale is not None else 1.0)
    rows, cols = v.shape
    g = v.reshape(rows, cols // group_size, group_size).sort(-1).values
    span = (g[..., -1:] - g[..., :1]).clamp_min(1e-30)
    distinct = 1 + ((g[..., 1:] - g[..., :-1]) > 1e-4 * span).sum(-1)
    worst = int(distinct.max())
    assert worst <= 2**bits, (
        f"{what}: the weights are not quantized — a group of {group_size} columns in a row holds {worst} distinct "
        f"values, more than the {2 ** bits} levels of {bits} bits. Return the dequantized weights {seed_note()}")


def _mse(w, w_q, x):
    return float(((x.double() @ (w.double() - w_q.double()).T) ** 2).mean())


@WEEK.exercise(9, "gptq_quantize", section="7 (GPTQ)")
def check_gptq_quantize(gptq_quantize) -> None:
    """On its calibration inputs, output error within 5 % of lib.gptq's and well below round-to-nearest's."""
    from lib.gptq import gptq_quantize as ref_gptq

    for i, (bits, group, cols) in enumerate([(4, 64, 128), (3, 32, 96)]):
        w, x = _calibration(24, cols, 384, 900 + i)
        what = f"gptq_quantize(w {tuple(w.shape)}, x {tuple(x.shape)}, bits={bits}, group_size={group}, damp=0.01)"
        got = _run(gptq_quantize, w.clone(), x.clone(), bits, group, 0.01, what=what)
        assert isinstance(got, torch.Tensor) and got.shape == w.shape, (
            f"{what}: returned {type(got).__name__} {tuple(getattr(got, 'shape', ()))}; expected a tensor {tuple(w.shape)}")
        _on_grid(got, bits, group, what)
        err, want = _mse(w, got, x), _mse(w, ref_gptq(w, x, bits, group, 0.01), x)
        rtn = _mse(w, ref.rtn_quantize(w, bits, group), x)
        assert err <= 1.05 * want, (
            f"{what}: output error {err:.4g} on the calibration inputs; GPTQ gets {want:.4g} (round-to-nearest "
            f"{rtn:.4g}). After rounding column j, spread its error over the later columns with row j of the "
            f"Cholesky factor of H⁻¹ (H = 2XᵀX/n, damped by 1 % of its mean diagonal) {seed_note()}")


@WEEK.exercise(10, "awq_quantize", section="8 (AWQ)")
def check_awq_quantize(awq_quantize) -> None:
    """The α found is as good as lib.awq's grid search; the weights are RTN of W·diag(s) scaled back."""
    from lib.awq import awq_quantize as ref_awq
    from lib.awq import awq_scales

    for i, (bits, group, cols) in enumerate([(3, 64, 192), (4, 32, 128)]):
        w, x = _calibration(24, cols, 384, 1000 + i)
        what = f"awq_quantize(w {tuple(w.shape)}, x {tuple(x.shape)}, bits={bits}, group_size={group}, n_grid=20)"
        got = _run(awq_quantize, w.clone(), x.clone(), bits, group, 20, what=what)
        assert isinstance(got, tuple) and len(got) == 2, f"{what}: return (w_eff, alpha), a pair"
        w_eff, alpha = got
        assert isinstance(w_eff, torch.Tensor) and w_eff.shape == w.shape, f"{what}: w_eff must be a tensor {tuple(w.shape)}"
        alpha = float(alpha)
        assert any(abs(alpha - k / 20) < 1e-9 for k in range(20)), f"{what}: α = {alpha} is not on the grid 0, 0.05, … 0.95"
        _on_grid(w_eff, bits, group, what + " (times s)", awq_scales(x.abs().mean(0), alpha))
        err = _mse(w, w_eff, x)
        want_w, want_alpha = ref_awq(w, x, bits, group, 20)
        want = _mse(w, want_w, x)
        assert err <= 1.001 * want, (
            f"{what}: output error {err:.4g} at α = {alpha}; the grid search finds {want:.4g} at α = {want_alpha}. "
            f"Try every α, scale the columns by s = (E|x|)^α, round, scale back, and keep the α with the smallest "
            f"error on x {seed_note()}")


# --- 11: quiz ---------------------------------------------------------------------------------------------

@WEEK.exercise(11, "answer_q9", section="11 (Check your understanding)")
def check_answer_q9(answer_q9) -> None:
    got = answer_q9()
    assert isinstance(got, (set, frozenset, list, tuple)), f"answer_q9() returned {type(got).__name__}; expected a set"
    got = {str(t) for t in got}
    assert got == {"attn_v", "ffn_down"}, (
        f"answer_q9() = {sorted(got)}: which per-layer tensors (GGUF names such as 'attn_q', 'ffn_up') does llama.cpp's "
        f"Q4_K_M store as Q6_K in some layers? See lib.quant.q4_k_m_plan")
