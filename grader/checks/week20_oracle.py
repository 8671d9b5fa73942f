"""Week 20's instruments for the block formats' byte-for-byte checks (below `checks/week20.py`, which imports
them): the oracle (gguf-py's quantizers and dequantizers, `oracle_quantize`, `oracle_dequantize`), the inputs the
formats are checked on (random, heavy-tailed and real SmolLM2 rows; blocks built so that x/d lands exactly on a half,
`q8_ties` and the like; blocks at the boundaries where x·(1/d) and x/d give different codes), the comparisons (every
byte, every float32 bit) and `run`, which calls the student's function under `observe` and refuses the lab's
reference and the oracle, recognised by their code. `judge_quantizer` and `judge_dequantizer` put them together for
one format.
"""
from __future__ import annotations

import functools

import numpy as np
import torch

from grader.checks import generator, observe, seed_note
from lib.gguf import qformats


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
    from lib.modeling.llama import shared_smollm2

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


_BELOW_HALF = np.nextafter(np.float32(0.5), np.float32(0))  # 0.49999997: rounds to 0, but 0.49999997 + 0.5 -> 1.0


def _powers_of_two(rows, g):
    """Per row a power of two 2^e: normal float16 scales (e in -12..0) and, in every fourth row, subnormal ones
    (e in -20..-16: float16 stores them exactly, a port that flushes them to zero writes 0)."""
    e = torch.randint(-12, 1, (rows, 1), generator=g)
    e[::4] = torch.randint(-20, -15, (len(e[::4]), 1), generator=g)
    return torch.pow(2.0, e.double())


def q8_ties(rows, offset):
    """Blocks whose abs-max is 127·2^e, so d = 2^e exactly and x·(1/d) is exact: the other values are
    (k + 0.5)·2^e (ties), ±0.49999997·2^e (near-ties) and 0; and one all-zero block (d = 0)."""
    g = generator(offset)
    k = torch.randint(-126, 126, (rows, 128), generator=g).double() + 0.5
    near = torch.rand(rows, 128, generator=g) < 0.2
    k = torch.where(near, torch.where(torch.rand(rows, 128, generator=g) < 0.5, -1.0, 1.0) * float(_BELOW_HALF), k)
    k[torch.rand(rows, 128, generator=g) < 0.05] = 0.0
    k[:, ::32] = 127.0 * torch.where(torch.rand(rows, 4, generator=g) < 0.5, -1.0, 1.0)
    x = (k * _powers_of_two(rows, g)).numpy().astype(np.float32)
    x[-1, :32] = 0.0
    return x


def q4_1_ties(rows, offset):
    """Blocks with min −c·2^e and max (15 − c)·2^e, so d = 2^e and (x − min)·(1/d) is exact: the rest are ties
    (k + 0.5), near-ties (0.49999997: ggml's float32 trunc(v + 0.5) gives 1, exact rounding 0) and exact
    codes; subnormal float16 scales in every fourth row, and one all-zero block."""
    g = generator(offset)
    k = torch.randint(0, 15, (rows, 128), generator=g).double() + 0.5
    near = torch.rand(rows, 128, generator=g) < 0.2
    k = torch.where(near, torch.full_like(k, float(_BELOW_HALF)), k)
    k[:, ::32], k[:, 1::32] = 0.0, 15.0
    c = torch.randint(0, 8, (rows, 1), generator=g).double()
    c[::2] = 0  # min 0 in every other row: there x − min is exactly the near-tie 0.49999997·2^e
    x = ((k - c) * _powers_of_two(rows, g)).numpy().astype(np.float32)
    x[-1, :32] = 0.0
    return x


def q5_0_ties(rows, offset):
    """Blocks whose signed abs-max is ±16·2^e, so |d| = 2^e and x·(1/d) is exact: the rest are (k + 0.5)·2^e and
    near-ties (k + 0.49999997)·2^e (float32's v + 16.5 rounds those up, exact arithmetic would not), and 0; in
    half the blocks the abs-max appears twice with opposite signs (the first one decides d's sign); subnormal
    float16 d in every fourth row, and one all-zero block."""
    g = generator(offset)
    k = torch.randint(-15, 15, (rows, 128), generator=g).double() + 0.5
    near = torch.rand(rows, 128, generator=g) < 0.3
    k = torch.where(near, k.floor() + float(_BELOW_HALF), k)
    k[:, ::32] = 16.0 * torch.where(torch.rand(rows, 4, generator=g) < 0.5, -1.0, 1.0)
    # ± ties: in half the blocks the abs-max also appears later with the other sign; ggml keeps the first one
    # (its scan replaces the max only on a strictly larger |x|), so "the positive one" is wrong half the time
    tie = torch.rand(rows, 4, generator=g) < 0.5
    at = torch.randint(1, 32, (rows, 4), generator=g)
    for r, b in tie.nonzero().tolist():
        k[r, 32 * b + int(at[r, b])] = -k[r, 32 * b]
    x = (k * _powers_of_two(rows, g)).numpy().astype(np.float32)
    x[-1, :32] = 0.0
    return x


def reciprocal_boundaries(qtype, rows, offset):
    """float32 [rows, 128] in blocks whose d is not a power of two, their values within 3 ulps of a rounding boundary
    (a half for Q8_0, where v + 0.5 or v + 16.5 truncates for Q4_1 and Q5_0), kept where ggml's float32
    x·id (id = 1/d, itself a float32) gives another code than the float32 quotient x/d or the exact x/d: the tie
    blocks have d = 2^e, where all three agree. Q8_0: ±abs-max first; Q5_0: the signed peak first; Q4_1: min, max."""
    f32, g = np.float32, generator(offset)
    nb, cand = rows * 4, 512
    top = (0.5 + 0.5 * torch.rand(nb, 1, generator=g, dtype=torch.float64)) * torch.pow(
        2.0, torch.randint(-10, 1, (nb, 1), generator=g).double())
    top = top.numpy().astype(f32)
    sign = np.where(torch.rand(nb, 1, generator=g).numpy() < 0.5, f32(-1), f32(1))
    ulps = torch.randint(-3, 4, (nb, cand), generator=g).numpy().astype(np.int32)

    def near(h, d, base=0.0):  # base + h·d rounded to float32, then moved by a few ulps
        x = (np.float64(0) + base + h * d.astype(np.float64)).astype(f32)
        return (x.view(np.int32) + ulps).view(f32)

    def roundf(v):
        v = np.asarray(v, np.float64)
        return np.sign(v) * np.floor(np.abs(v) + 0.5)

    with np.errstate(all="ignore"):
        if qtype == "Q8_0":
            d = top / f32(127)
            x = np.clip(near(torch.randint(-127, 127, (nb, cand), generator=g).double().numpy() + 0.5, d), -top, top)
            ggml, quotient = roundf(x * (f32(1) / d)), roundf(x / d)
            exact = roundf(x.astype(np.float64) / (top.astype(np.float64) / 127))
            first = sign * top
        elif qtype == "Q5_0":
            first = sign * top
            d = first / f32(-16)
            x = np.clip(near(torch.randint(-16, 15, (nb, cand), generator=g).double().numpy() + 0.5, d), -top, top)
            ggml, quotient = np.trunc(x * (f32(1) / d) + f32(16.5)), np.trunc((x / d).astype(f32) + f32(16.5))
            exact = np.floor(x.astype(np.float64) / (first.astype(np.float64) / -16) + 16.5)
        else:  # Q4_1
            lo = -top * torch.rand(nb, 1, generator=g).numpy().astype(f32)
            hi = lo + top
            d = (hi - lo) / f32(15)
            x = np.clip(near(torch.randint(0, 15, (nb, cand), generator=g).double().numpy() + 0.5, d, lo), lo, hi)
            ggml, quotient = np.trunc((x - lo) * (f32(1) / d) + f32(0.5)), np.trunc(((x - lo) / d).astype(f32) + f32(0.5))
            exact = np.floor((x.astype(np.float64) - lo) / ((hi.astype(np.float64) - lo) / 15) + 0.5)
            first = np.concatenate([lo, hi], 1)
    differ = (ggml != quotient) | (ggml != exact)
    pick = np.argsort(~differ, axis=1, kind="stable")[:, :32 - first.shape[1]]  # the differing candidates first
    return np.concatenate([first, np.take_along_axis(x, pick, 1)], 1).astype(f32).reshape(rows, 128)


def block_cases(block, offset, ties=None):
    """(description, x float32 [rows, n]) for random, heavy-tailed, real and (optionally) tie inputs."""
    yield "random normal [16, 1024]", _normal(16, 1024, offset)
    yield "heavy-tailed [16, 2048] (outliers 50x)", _heavy_tailed(16, 2048, offset + 1)
    for i in range(2):
        name, w = _real(24, block, offset + 2 + i)
        yield f"SmolLM2 {name}, 24 random rows", w
    if ties is not None:
        yield "tie blocks (x/d is exactly k + 0.5 or 0.49999997; d a power of two, subnormal in float16 in some)", \
            ties(8, offset + 4)


# --- comparing ----------------------------------------------------------------------------------------------

def as_array(x, what):
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    assert isinstance(x, np.ndarray), f"{what}: returned {type(x).__name__}; expected a numpy array"
    return x


def _same_bytes(got, want: np.ndarray, x: np.ndarray, block: int, what: str, qtype: str) -> None:
    got = as_array(got, what)
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
        f"Byte 0-1 is d as float16{'; bytes 2-5 the fifth bits (bit i of a little-endian uint32 for code i)' if qtype == 'Q5_0' else ''}; check the {qtype} formula, float32 arithmetic throughout, and the rounding rule "
        f"(C roundf sends halves away from zero; np.round / torch.round send them to even) {seed_note()}")


def _same_floats(got, want: np.ndarray, what: str) -> None:
    got = as_array(got, what)
    assert got.dtype == np.float32, f"{what}: dtype {got.dtype}; expected float32"
    assert got.shape == want.shape, f"{what}: shape {got.shape}; expected {want.shape}"
    if np.array_equal(got.view(np.uint32), want.view(np.uint32)):
        return
    bad = np.argwhere(got.view(np.uint32) != want.view(np.uint32))[0]
    raise AssertionError(
        f"{what}: value at {tuple(int(i) for i in bad)} is {got[tuple(bad)]!r}, gguf-py gives {want[tuple(bad)]!r} "
        f"({int((got != want).sum())} values differ). Bit-exact means the same float32 operations in the same order "
        f"(e.g. d * q + m, with d and m converted from float16 to float32 first) {seed_note()}")


def run(fn, *args, what: str):
    """Call the student's `fn` under `observe` (in the student's process when it is isolated); refuse lib's
    reference and gguf-py's quantizers (the oracle), recognised by their code wherever it was loaded from."""
    result, obs = observe(fn, *args)
    used = sorted(c for c in obs.lib_calls if c.startswith(("lib.gguf.qformats.", "lib.quantization.quant.", "lib.quantization.gptq.", "lib.quantization.awq.")))
    assert not used, f"{what}: calls the lab's reference ({', '.join(used)}); write the block arithmetic yourself"
    oracle = sorted(c for c in obs.lib_calls if c.startswith("gguf."))
    assert not oracle, (f"{what}: calls gguf-py ({', '.join(oracle)}), the oracle this check compares against; "
                        f"write the block arithmetic yourself")
    return result


def oracle_quantize(x, qtype):
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    return quantize(x, GGMLQuantizationType[qtype])


def oracle_dequantize(data, qtype):
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    return dequantize(data, GGMLQuantizationType[qtype])


def judge_quantizer(fn, qtype, name, offset, ties):
    block = qformats.BLOCK_SIZES[qtype][0]
    boundary = ("blocks at rounding boundaries where float32 x·(1/d) and x/d (float32 or exact) give different codes "
                "(ggml multiplies by id = 1/d, a float32, and never divides)", reciprocal_boundaries(qtype, 8, offset + 5))
    for desc, x in [*block_cases(block, offset, ties), boundary]:
        got = run(fn, x.copy(), what=f"{name} on {desc}")
        _same_bytes(got, oracle_quantize(x, qtype), x, block, f"{name} on {desc}", qtype)


def _random_blocks(qtype, rows, blocks, offset):
    """Random bytes in `qtype`'s layout whose float16 fields are finite, of weight-like size, subnormal (20 %)
    or zero (10 %)."""
    g = generator(offset)
    nbytes = qformats.BLOCK_SIZES[qtype][1]
    data = torch.randint(0, 256, (rows, blocks, nbytes), generator=g, dtype=torch.uint8).numpy()
    f16_fields = {"Q8_0": [0], "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q4_K": [0, 2],
                  "Q5_K": [0, 2], "Q6_K": [208]}[qtype]
    for at in f16_fields:
        scale = (torch.rand(rows, blocks, generator=g) * 0.01).numpy().astype(np.float16)
        tiny = (torch.randint(1, 1024, (rows, blocks), generator=g) * 2.0**-24).numpy().astype(np.float16)
        pick = torch.rand(rows, blocks, generator=g).numpy()
        scale = np.where(pick < 0.2, tiny, np.where(pick < 0.3, np.float16(0), scale))  # subnormal and zero scales
        if qtype in ("Q4_1", "Q5_1") and at == 2:
            scale = -scale  # m is the block's minimum, usually negative
        data[..., at:at + 2] = scale.reshape(rows, blocks, 1).view(np.uint8)
    return data.reshape(rows, blocks * nbytes)


def judge_dequantizer(fn, qtype, name, offset):
    block = qformats.BLOCK_SIZES[qtype][0]
    cases = [("random bytes (8 rows, 12 blocks each)", _random_blocks(qtype, 8, 12, offset))]
    for desc, x in block_cases(block, offset + 10):
        data = oracle_quantize(x, qtype) if qtype in qformats.QUANTIZE_TYPES[:5] else qformats.quantize(x, qtype)
        cases.append((f"{qtype} bytes of {desc}", data))
    for desc, data in cases:
        got = run(fn, data.copy(), what=f"{name} on {desc}")
        _same_floats(got, oracle_dequantize(data, qtype), f"{name} on {desc}")
