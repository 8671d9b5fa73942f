"""GGUF block quantization, byte for byte (week 20).

    data = quantize(w, "Q4_1")           # uint8 [..., n // 32 * 20], the GGUF block layout
    w2 = dequantize(data, "Q4_1")        # float32 [..., n]
    bits_per_weight("Q4_K")              # 4.5: 144 bytes per 256 weights

The legacy formats quantize **bit-identically to gguf-py** (`gguf.quants.quantize`, a numpy port of
ggml-quants.c), and every format here dequantizes bit-identically to `gguf.quants.dequantize`:

| type | block | bytes | layout (in this order)                                        | value                 |
|------|-------|-------|---------------------------------------------------------------|-----------------------|
| Q8_0 | 32    | 34    | d f16, 32 × int8                                              | d·q                   |
| Q4_0 | 32    | 18    | d f16, 16 bytes of nibbles (low: q[0:16], high: q[16:32])     | d·(q − 8)             |
| Q4_1 | 32    | 20    | d f16, m f16, 16 bytes of nibbles                             | d·q + m               |
| Q5_0 | 32    | 22    | d f16, qh u32 (bit i = bit 4 of q[i]), 16 bytes of nibbles    | d·(q − 16)            |
| Q5_1 | 32    | 24    | d f16, m f16, qh u32, 16 bytes of nibbles                     | d·q + m               |
| Q4_K | 256   | 144   | d f16, dmin f16, 12 bytes: 8 six-bit scales and 8 mins, 128 B nibbles | (d·sc)·q − dmin·m per 32 |
| Q5_K | 256   | 176   | as Q4_K, then 32 bytes of 5th bits before the nibbles         | (d·sc)·q − dmin·m     |
| Q6_K | 256   | 210   | 128 B low nibbles, 64 B 2-bit highs, 16 int8 scales, d f16    | (d·sc)·(q − 32) per 16 |

Rounding is where a port goes wrong. ggml's Q8_0 uses C `roundf`: halves go *away from zero*
(2.5 -> 3, -2.5 -> -3), while `torch.round` and `np.round` send halves to the even neighbour (2.5 -> 2).
The 4- and 5-bit legacy formats do not round at all: they add 8.5 (or 16.5, or 0.5) in float32 and
truncate, so the float32 addition itself decides a tie.

The K-quant quantizers (Q4_K, Q5_K, Q6_K) are the lab's own (gguf-py has none), built on llama.cpp's idea:
per sub-block, try a grid of candidate scales around the min/max one, round with each, refit scale and
minimum by *weighted* least squares on the codes it gave, and keep the candidate whose weighted squared
error is smallest (`search_affine`, `search_symmetric`). The weights are `sqrt(mean x²) + |x|` of the
sub-block, or an importance matrix (`importance=`: per input column, the mean squared activation that
column meets, `collect_imatrix`). The sub-block scales are then quantized to 6 or 8 bits. K-quant codes
round half to even (ggml's `nearest_int`), a third rounding rule beside Q8_0's `roundf` and Q4_x's
`trunc(x + 0.5)`. gguf-py's dequantizer reads our blocks (tested).

With `importance=`, the legacy types (not Q8_0) use the same weighted search, as llama.cpp does with an
imatrix; without it they stay bit-identical to gguf-py.

Inputs are numpy arrays or torch tensors; outputs are numpy arrays (use `fake_quantize` for a torch round trip).
`storable_type` says which type a row of a given length can be stored in (llama.cpp's K-quant fallback).

One tensor at a time, no model: the whole-model parts (type plans, the imatrix, RTN and GPTQ/AWQ's grid, writing
a GGUF file, llama.cpp) are in `lib/quantization/quant.py`, which builds on this module; import this module's names from here.
"""
from __future__ import annotations

import numpy as np

# name -> (weights per block, bytes per block); from the layouts above (gguf.GGML_QUANT_SIZES agrees, tested)
BLOCK_SIZES: dict[str, tuple[int, int]] = {
    "Q8_0": (32, 34), "Q4_0": (32, 18), "Q4_1": (32, 20), "Q5_0": (32, 22), "Q5_1": (32, 24),
    "Q4_K": (256, 144), "Q5_K": (256, 176), "Q6_K": (256, 210),
}
QUANTIZE_TYPES = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K")
DEQUANTIZE_TYPES = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K")
QK_K = 256  # weights per K-quant super-block


def _check_type(qtype: str, supported: tuple[str, ...], what: str) -> str:
    name = getattr(qtype, "name", qtype)  # a gguf.GGMLQuantizationType works too
    if name not in supported:
        raise ValueError(f"cannot {what} {qtype!r}: supported types are {', '.join(supported)}")
    return name


def bits_per_weight(qtype: str) -> float:
    """Bits of storage per weight, scales included: 8 · bytes per block / weights per block."""
    name = _check_type(qtype, DEQUANTIZE_TYPES, "size")
    block, nbytes = BLOCK_SIZES[name]
    return 8.0 * nbytes / block


def as_numpy(x, dtype) -> np.ndarray:
    if hasattr(x, "detach"):  # a torch tensor (bfloat16 has no numpy dtype: widen it first)
        x = x.detach().cpu()
        x = (x.float() if x.is_floating_point() else x).numpy()
    return np.ascontiguousarray(np.asarray(x), dtype=dtype)


def roundf(x: np.ndarray) -> np.ndarray:
    """C `roundf`: the nearest integer, halves away from zero (2.5 -> 3, -2.5 -> -3), as float32.

    Done in float64, where `|x| + 0.5` is exact for every float32 `x` (in float32, 0.49999997 + 0.5
    rounds up to 1.0 and would round 0.49999997 to 1)."""
    x64 = x.astype(np.float64)
    return (np.sign(x64) * np.floor(np.abs(x64) + 0.5)).astype(np.float32)


def _f16_bytes(v: np.ndarray) -> np.ndarray:
    """float32 [n, 1] -> its float16 bytes [n, 2] (little-endian; round to nearest even, as ggml's fp16 cast)."""
    return v.astype(np.float16).view(np.uint8)


def _f16(b: np.ndarray) -> np.ndarray:
    """float16 bytes [n, 2k] -> float32 [n, k]."""
    return np.ascontiguousarray(b).view(np.float16).astype(np.float32)


def _pack_nibbles(q: np.ndarray) -> np.ndarray:
    """q [n, 32] in 0..15 -> 16 bytes: byte j holds q[j] (low nibble) and q[j + 16] (high nibble)."""
    return (q[:, :16] | (q[:, 16:] << 4)).astype(np.uint8)


def _unpack_nibbles(b: np.ndarray) -> np.ndarray:
    """16 bytes [n, 16] -> q [n, 32]: the low nibbles, then the high nibbles."""
    return np.concatenate([b & 0x0F, b >> 4], axis=-1)


def _high_bits(q: np.ndarray) -> np.ndarray:
    """q [n, 32] in 0..31 -> qh [n, 4] bytes: bit i of the little-endian uint32 is bit 4 of q[i]."""
    bits = (q >> 4).astype(np.uint32) & 1
    word = (bits << np.arange(32, dtype=np.uint32)).sum(axis=-1, dtype=np.uint32)
    return word.astype("<u4").reshape(-1, 1).view(np.uint8)


def _unpack_high_bits(qh: np.ndarray) -> np.ndarray:
    word = np.ascontiguousarray(qh).view("<u4")  # [n, 1]
    return ((word >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)  # [n, 32]


# --- quantizers, one per type: blocks float32 [n, block] -> bytes uint8 [n, type_size] -------------------

def _q8_0(x):
    d = np.abs(x).max(axis=-1, keepdims=True) / np.float32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
    q = roundf(x * inv).astype(np.int8)
    return np.concatenate([_f16_bytes(d), q.view(np.uint8)], axis=-1)


def _signed_absmax(x):
    """Per row, the element of largest magnitude, with its sign (the first one on a tie, as argmax)."""
    return np.take_along_axis(x, np.abs(x).argmax(axis=-1, keepdims=True), axis=-1)


def _symmetric(x, levels: int):
    """Q4_0 (levels 16) / Q5_0 (32): d = signed abs-max / -(levels/2); q = trunc(x/d + levels/2 + 0.5)."""
    d = _signed_absmax(x) / np.float32(-(levels // 2))
    with np.errstate(divide="ignore"):
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
    q = np.trunc(x * inv + np.float32(levels // 2 + 0.5)).astype(np.uint8).clip(0, levels - 1)
    return d, q


def _affine(x, levels: int):
    """Q4_1 / Q5_1: m = min, d = (max - min) / (levels - 1); q = trunc((x - m)/d + 0.5)."""
    lo, hi = x.min(axis=-1, keepdims=True), x.max(axis=-1, keepdims=True)
    d = (hi - lo) / np.float32(levels - 1)
    with np.errstate(divide="ignore"):
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
    q = np.trunc((x - lo) * inv + np.float32(0.5)).astype(np.uint8).clip(0, levels - 1)
    return d, lo, q


def _q4_0(x):
    d, q = _symmetric(x, 16)
    return np.concatenate([_f16_bytes(d), _pack_nibbles(q)], axis=-1)


def _q4_1(x):
    d, m, q = _affine(x, 16)
    return np.concatenate([_f16_bytes(d), _f16_bytes(m), _pack_nibbles(q)], axis=-1)


def _q5_0(x):
    d, q = _symmetric(x, 32)
    return np.concatenate([_f16_bytes(d), _high_bits(q), _pack_nibbles(q & 0x0F)], axis=-1)


def _q5_1(x):
    d, m, q = _affine(x, 32)
    return np.concatenate([_f16_bytes(d), _f16_bytes(m), _high_bits(q), _pack_nibbles(q & 0x0F)], axis=-1)


def _pack_k_scales(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """8 six-bit scales and 8 six-bit mins [n, 8] -> the 12 bytes of Q4_K/Q5_K.

    bytes 0-3: sc[0:4] | top 2 bits of sc[4:8] << 6; bytes 4-7: mn[0:4] | top 2 bits of mn[4:8] << 6;
    bytes 8-11: low 4 bits of sc[4:8] | low 4 bits of mn[4:8] << 4."""
    sc, mn = sc.astype(np.uint8), mn.astype(np.uint8)
    first = sc[:, :4] | ((sc[:, 4:] >> 4) << 6)
    second = mn[:, :4] | ((mn[:, 4:] >> 4) << 6)
    third = (sc[:, 4:] & 0x0F) | ((mn[:, 4:] & 0x0F) << 4)
    return np.concatenate([first, second, third], axis=-1).astype(np.uint8)


def _unpack_k_scales(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    first, second, third = b[:, 0:4], b[:, 4:8], b[:, 8:12]
    sc = np.concatenate([first & 0x3F, (third & 0x0F) | ((first >> 6) << 4)], axis=-1)
    mn = np.concatenate([second & 0x3F, (third >> 4) | ((second >> 6) << 4)], axis=-1)
    return sc, mn


# --- the K-quants' scale search --------------------------------------------------------------------------------

# Candidate inverse scales tried per sub-block: (nmax + offset) / (max − min) for each offset (affine), or
# −(nmax + offset) / (signed abs-max) (symmetric). The offset 0 is the plain min/max (abs-max) choice.
AFFINE_OFFSETS = np.round(np.arange(-1.0, 1.0001, 0.1), 1)   # 21 candidates
SYMMETRIC_OFFSETS = np.round(np.arange(-0.9, 0.9001, 0.1), 1)  # 19 candidates


def default_weights(x: np.ndarray) -> np.ndarray:
    """The search's weights without an importance matrix: `sqrt(mean x²) + |x|` per sub-block `x [..., B]`
    (the error on a large weight counts more, but no weight counts for nothing)."""
    return np.sqrt(np.mean(x * x, axis=-1, keepdims=True)) + np.abs(x)


def nearest_int(v: np.ndarray) -> np.ndarray:
    """ggml's K-quant rounding (`nearest_int`): the nearest integer, halves to even (2.5 -> 2, 3.5 -> 4)."""
    return np.rint(v)


def weighted_affine_fit(x, w, q):
    """Least squares for x ≈ scale·q + offset with weights w, along the last axis: returns (scale, offset),
    each [...]. From ∂/∂scale = ∂/∂offset = 0 of Σ w (scale·q + offset − x)² (a 2×2 linear system).
    Where the codes are all equal (no unique fit), scale = 0 and offset the weighted mean."""
    sw, sq, sx = w.sum(-1), (w * q).sum(-1), (w * x).sum(-1)
    sqq, sqx = (w * q * q).sum(-1), (w * q * x).sum(-1)
    det = sw * sqq - sq * sq
    ok = det > 1e-12 * np.maximum(sw * sqq, 1e-300)
    safe = np.where(ok, det, 1.0)
    scale = np.where(ok, (sw * sqx - sq * sx) / safe, 0.0)
    offset = np.where(ok, (sqq * sx - sq * sqx) / safe, sx / np.maximum(sw, 1e-300))
    return scale, offset


def search_affine(x: np.ndarray, w: np.ndarray, nmax: int, offsets=AFFINE_OFFSETS):
    """Per sub-block `x [..., B]` (weights `w`, same shape): the scale ≥ 0 and min ≥ 0 minimizing
    Σ w (scale·q − min − x)², q = nearest code in 0..nmax, over the candidate grid `offsets`; returns
    (scale, min), each [...], float32. For each candidate inverse scale (nmax + offset)/(max − min'), with
    min' = min(x.min(), 0): round, then refit scale and min by weighted least squares on those codes (the
    min clamped at 0 — K-quants store x ≈ scale·q − min with min ≥ 0 — and scale refit alone if so)."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    lo = np.minimum(x.min(-1), 0.0)  # [...]
    span = x.max(-1) - lo
    flat = span <= 0
    span = np.where(flat, 1.0, span)
    best_scale, best_min = span / nmax, -lo  # the min/max choice
    q = np.clip(nearest_int((x - lo[..., None]) / best_scale[..., None]), 0, nmax)
    best_err = (w * (best_scale[..., None] * q - best_min[..., None] - x) ** 2).sum(-1)
    for off in offsets:
        q = np.clip(nearest_int((x - lo[..., None]) * ((nmax + off) / span)[..., None]), 0, nmax)
        scale, offset = weighted_affine_fit(x, w, q)
        clamp = offset > 0  # a positive offset is a negative min: not storable, so min = 0, refit the scale
        scale = np.where(clamp, (w * q * x).sum(-1) / np.maximum((w * q * q).sum(-1), 1e-300), scale)
        offset = np.where(clamp, 0.0, offset)
        err = (w * (scale[..., None] * q + offset[..., None] - x) ** 2).sum(-1)
        better = (err < best_err) & (scale > 0)
        best_scale, best_min, best_err = (np.where(better, scale, best_scale), np.where(better, -offset, best_min),
                                          np.where(better, err, best_err))
    best_scale = np.where(flat, 0.0, best_scale)
    return best_scale.astype(np.float32), best_min.astype(np.float32)


def search_symmetric(x: np.ndarray, w: np.ndarray, nmax: int, offsets=SYMMETRIC_OFFSETS):
    """Per sub-block `x [..., B]`: the signed scale minimizing Σ w (scale·q − x)², q the nearest code in
    −nmax..nmax−1, over candidate inverse scales −(nmax + offset)/(signed abs-max); each candidate's scale
    refit by weighted least squares (scale = Σ w q x / Σ w q²). Returns scale [...], float32."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    peak = _signed_absmax(x)[..., 0]
    zero = peak == 0
    peak = np.where(zero, 1.0, peak)
    best = peak / -nmax
    q = np.clip(nearest_int(x / best[..., None]), -nmax, nmax - 1)
    best_err = (w * (best[..., None] * q - x) ** 2).sum(-1)
    for off in offsets:
        q = np.clip(nearest_int(x * (-(nmax + off) / peak)[..., None]), -nmax, nmax - 1)
        sqq = (w * q * q).sum(-1)
        scale = (w * q * x).sum(-1) / np.maximum(sqq, 1e-300)
        err = (w * (scale[..., None] * q - x) ** 2).sum(-1)
        better = (err < best_err) & (sqq > 0)
        best, best_err = np.where(better, scale, best), np.where(better, err, best_err)
    return np.where(zero, 0.0, best).astype(np.float32)


def sub_weights(sub, importance):
    """The search's weights for sub-blocks `sub [n, S, B]`: `importance` (per column, cut into sub-blocks the
    same way, [n, S, B]) if given, else `default_weights`."""
    if importance is None:
        return default_weights(sub)
    return importance + 1e-9 * importance.mean(axis=(-1, -2), keepdims=True) + 1e-30  # never all zero


def _k_affine(x, nmax: int, importance=None, search=True):
    """Q4_K / Q5_K's numbers for super-blocks `x [n, 256]`: (d, dmin [n, 1] float16-exact float32, sc, mn [n, 8]
    six-bit, q [n, 8, 32] codes 0..nmax)."""
    n = x.shape[0]
    sub = x.reshape(n, 8, 32)
    imp = None if importance is None else importance.reshape(n, 8, 32)
    scale, mins = search_affine(sub, sub_weights(sub, imp), nmax, AFFINE_OFFSETS if search else ())  # [n, 8]
    d = (scale.max(axis=-1, keepdims=True) / np.float32(63)).astype(np.float16).astype(np.float32)
    dmin = (mins.max(axis=-1, keepdims=True) / np.float32(63)).astype(np.float16).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(d > 0, nearest_int(scale / d), 0).clip(0, 63).astype(np.uint8)
        mn = np.where(dmin > 0, nearest_int(mins / dmin), 0).clip(0, 63).astype(np.uint8)
        step = (d * sc)[..., None]  # [n, 8, 1], as the dequantizer forms it: the codes fit the stored scales
        q = np.where(step > 0, nearest_int((sub + (dmin * mn)[..., None]) / step), 0).clip(0, nmax).astype(np.uint8)
    return d, dmin, sc, mn, q


def _q4_k(x, importance=None, search=True):
    """Q4_K: per sub-block of 32, the searched scale and min; those 8 scales and 8 mins quantized to 6 bits
    against the super-block's d and dmin (float16); then the codes against the stored scales."""
    n = x.shape[0]
    d, dmin, sc, mn, q = _k_affine(x, 15, importance, search)
    q = q.reshape(n, 4, 2, 32)  # sub-blocks (2j, 2j+1) share 32 bytes: low and high nibbles
    qs = (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(n, 128)
    return np.concatenate([_f16_bytes(d), _f16_bytes(dmin), _pack_k_scales(sc, mn), qs], axis=-1)


def _q5_k(x, importance=None, search=True):
    """Q5_K: Q4_K with 32 levels; bit 4 of sub-block j's code at position l is bit j of byte l of qh[32]."""
    n = x.shape[0]
    d, dmin, sc, mn, q = _k_affine(x, 31, importance, search)
    qh = ((q >> 4) << np.arange(8, dtype=np.uint8).reshape(1, 8, 1)).sum(axis=1, dtype=np.uint8)  # [n, 32]
    low = (q & 0x0F).reshape(n, 4, 2, 32)
    qs = (low[:, :, 0] | (low[:, :, 1] << 4)).reshape(n, 128)
    return np.concatenate([_f16_bytes(d), _f16_bytes(dmin), _pack_k_scales(sc, mn), qh, qs], axis=-1)


def _q6_k(x, importance=None, search=True):
    """Q6_K: per sub-block of 16, the searched signed scale (q in −32..31); the 16 scales quantized to int8
    against the super-block's d (float16); then q = nearest_int(x / (d·sc))."""
    n = x.shape[0]
    sub = x.reshape(n, 16, 16)
    imp = None if importance is None else importance.reshape(n, 16, 16)
    scale = search_symmetric(sub, sub_weights(sub, imp), 32, SYMMETRIC_OFFSETS if search else ())  # [n, 16]
    d = (np.abs(scale).max(axis=-1, keepdims=True) / np.float32(127)).astype(np.float16).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(d > 0, nearest_int(scale / d), 0).clip(-128, 127)
        step = (d * sc)[..., None]
        q = np.where(step != 0, nearest_int(sub / step), 0).clip(-32, 31)
    q = (q + 32).astype(np.uint8).reshape(n, 256)
    # weight v sits in half v // 128, quarter (v % 128) // 32: low nibbles of quarters 0/1 share ql bytes with 2/3
    halves = q.reshape(n, 2, 4, 32)  # [n, half, quarter, 32]
    low, high = halves & 0x0F, halves >> 4
    ql = (low[:, :, 0:2] | (low[:, :, 2:4] << 4)).reshape(n, 128)  # per half: 64 bytes
    qh = (high[:, :, 0] | (high[:, :, 1] << 2) | (high[:, :, 2] << 4) | (high[:, :, 3] << 6)).reshape(n, 64)
    return np.concatenate([ql, qh, sc.astype(np.int8).view(np.uint8), _f16_bytes(d)], axis=-1)


def _weighted_legacy(x, importance, qtype):
    """Q4_0 / Q4_1 / Q5_0 / Q5_1 with an importance matrix: the weighted search per block of 32, its scale
    (and min) stored as float16, the codes against the stored values (llama.cpp does the same with an imatrix)."""
    levels = 16 if qtype.startswith("Q4") else 32
    w = sub_weights(x[:, None, :], importance[:, None, :])[:, 0]
    with np.errstate(divide="ignore", invalid="ignore"):
        if qtype.endswith("_0"):
            d = search_symmetric(x, w, levels // 2)[:, None].astype(np.float16).astype(np.float32)
            q = np.where(d != 0, nearest_int(x / d), 0).clip(-(levels // 2), levels // 2 - 1) + levels // 2
            q, fields = q.astype(np.uint8), [_f16_bytes(d)]
        else:
            scale, mins = search_affine(x[:, None, :], w[:, None, :], levels - 1)
            d = scale.astype(np.float16).astype(np.float32)  # [n, 1]
            m = (-mins).astype(np.float16).astype(np.float32)
            q = np.where(d > 0, nearest_int((x - m) / d), 0).clip(0, levels - 1).astype(np.uint8)
            fields = [_f16_bytes(d), _f16_bytes(m)]
    if levels == 32:
        fields.append(_high_bits(q))
    return np.concatenate(fields + [_pack_nibbles(q & 0x0F)], axis=-1)


# --- dequantizers: bytes uint8 [n, type_size] -> float32 [n, block] -----------------------------------------

def _dq8_0(b):
    return _f16(b[:, :2]) * b[:, 2:].view(np.int8).astype(np.float32)


def _dq4_0(b):
    return _f16(b[:, :2]) * (_unpack_nibbles(b[:, 2:]).astype(np.float32) - np.float32(8))


def _dq4_1(b):
    return _f16(b[:, :2]) * _unpack_nibbles(b[:, 4:]).astype(np.float32) + _f16(b[:, 2:4])


def _dq5_0(b):
    q = _unpack_nibbles(b[:, 6:]) | (_unpack_high_bits(b[:, 2:6]) << 4)
    return _f16(b[:, :2]) * (q.astype(np.float32) - np.float32(16))


def _dq5_1(b):
    q = _unpack_nibbles(b[:, 8:]) | (_unpack_high_bits(b[:, 4:8]) << 4)
    return _f16(b[:, :2]) * q.astype(np.float32) + _f16(b[:, 2:4])


def _k_steps(b):
    sc, mn = _unpack_k_scales(b[:, 4:16])
    step = (_f16(b[:, :2]) * sc.astype(np.float32))[..., None]  # [n, 8, 1]
    offset = (_f16(b[:, 2:4]) * mn.astype(np.float32))[..., None]
    return step, offset


def _k_nibbles(qs):
    n = qs.shape[0]
    g = qs.reshape(n, 4, 1, 32)
    return np.concatenate([g & 0x0F, g >> 4], axis=2).reshape(n, 8, 32)  # sub-block 2j: low, 2j+1: high


def _dq4_k(b):
    step, offset = _k_steps(b)
    return (step * _k_nibbles(b[:, 16:]).astype(np.float32) - offset).reshape(-1, QK_K)


def _dq5_k(b):
    n = b.shape[0]
    step, offset = _k_steps(b)
    qh = b[:, 16:48].reshape(n, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)  # bit j -> sub-block j
    q = _k_nibbles(b[:, 48:]) | ((qh & 1) << 4)
    return (step * q.astype(np.float32) - offset).reshape(-1, QK_K)


def _dq6_k(b):
    n = b.shape[0]
    ql, qh, sc, d = b[:, :128], b[:, 128:192], b[:, 192:208], b[:, 208:210]
    ql = ql.reshape(n, 2, 1, 64)
    low = np.concatenate([ql & 0x0F, ql >> 4], axis=2).reshape(n, 2, 4, 32)  # [n, half, quarter, 32]
    high = (qh.reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)) & 0x03
    q = (low | (high << 4)).astype(np.int8) - np.int8(32)  # [n, 2, 4, 32]
    step = (_f16(d) * sc.view(np.int8).astype(np.float32))[..., None]  # [n, 16, 1]
    return (step * q.reshape(n, 16, 16).astype(np.float32)).reshape(n, QK_K)


_QUANTIZERS = {"Q8_0": _q8_0, "Q4_0": _q4_0, "Q4_1": _q4_1, "Q5_0": _q5_0, "Q5_1": _q5_1,
               "Q4_K": _q4_k, "Q5_K": _q5_k, "Q6_K": _q6_k}
_DEQUANTIZERS = {"Q8_0": _dq8_0, "Q4_0": _dq4_0, "Q4_1": _dq4_1, "Q5_0": _dq5_0, "Q5_1": _dq5_1,
                 "Q4_K": _dq4_k, "Q5_K": _dq5_k, "Q6_K": _dq6_k}


def quantize(x, qtype: str, importance=None, search: bool = True) -> np.ndarray:
    """`x [..., n]` (float, numpy or torch) -> uint8 `[..., n // block * type_size]` in the GGUF layout of `qtype`.

    Bit-identical to `gguf.quants.quantize` for Q8_0, Q4_0, Q4_1, Q5_0, Q5_1; the K-quants are the lab's own
    search. `n` must be a multiple of the block size (32, or 256 for K-quants). `importance [n]` (≥ 0, e.g.
    from `collect_imatrix`): per column, how much its error counts — the search's weights; Q8_0 ignores it.
    `search=False` (K-quants): the plain min/max (abs-max) scale per sub-block, the baseline of the search."""
    name = _check_type(qtype, QUANTIZE_TYPES, "quantize to")
    x = as_numpy(x, np.float32)
    block, nbytes = BLOCK_SIZES[name]
    if x.ndim == 0 or x.shape[-1] % block:
        raise ValueError(f"{name} quantizes blocks of {block} weights along the last dimension, but x has shape "
                         f"{x.shape}: its last dimension must be a multiple of {block} (pad or pick another type)")
    if importance is not None:
        importance = as_numpy(importance, np.float32)
        if importance.shape != x.shape[-1:] or not (np.isfinite(importance).all() and (importance >= 0).all()):
            raise ValueError(f"importance must be finite, >= 0 and of shape {x.shape[-1:]} (one per column); got "
                             f"shape {importance.shape}")
        rows = int(np.prod(x.shape[:-1]))
        imp = np.broadcast_to(importance, (rows, x.shape[-1])).reshape(-1, block)
    if name.endswith("_K"):
        out = _QUANTIZERS[name](x.reshape(-1, block), None if importance is None else imp, search)
    elif importance is None or name == "Q8_0":
        out = _QUANTIZERS[name](x.reshape(-1, block))
    else:
        out = _weighted_legacy(x.reshape(-1, block), imp, name)
    return out.reshape(*x.shape[:-1], x.shape[-1] // block * nbytes)


def dequantize(data, qtype: str) -> np.ndarray:
    """uint8 `[..., k · type_size]` in the GGUF layout of `qtype` -> float32 `[..., k · block]`.

    Bit-identical to `gguf.quants.dequantize` for every type in `DEQUANTIZE_TYPES`."""
    name = _check_type(qtype, DEQUANTIZE_TYPES, "dequantize")
    data = as_numpy(data, np.uint8)
    block, nbytes = BLOCK_SIZES[name]
    if data.ndim == 0 or data.shape[-1] % nbytes:
        raise ValueError(f"{name} stores {block} weights in {nbytes} bytes, but data has shape {data.shape}: its "
                         f"last dimension must be a multiple of {nbytes} bytes")
    out = _DEQUANTIZERS[name](data.reshape(-1, nbytes)).astype(np.float32, copy=False)
    return out.reshape(*data.shape[:-1], data.shape[-1] // nbytes * block)


def fake_quantize(w, qtype: str, importance=None):
    """`dequantize(quantize(w, qtype, importance), qtype)` as a float32 torch tensor on `w`'s device (weights
    as the quantized model would see them)."""
    import torch

    device = w.device if hasattr(w, "device") else "cpu"
    return torch.from_numpy(dequantize(quantize(w, qtype, importance), qtype)).to(device)


# --- which type a row can be stored in ----------------------------------------------------------------------

# llama.cpp (llama-quant.cpp) cannot store a K-quant in a row whose length is not a multiple of 256 — SmolLM2's
# d_model is 576 — and falls back to a legacy type of about the same size:
K_FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}


def storable_type(qtype: str, n_cols: int) -> str:
    """`qtype`, or llama.cpp's fallback when a row of `n_cols` weights does not fill whole blocks of it."""
    block = BLOCK_SIZES[qtype][0] if qtype in BLOCK_SIZES else 1
    if n_cols % block == 0:
        return qtype
    fallback = K_FALLBACK.get(qtype)
    if fallback is None or n_cols % BLOCK_SIZES[fallback][0]:
        raise ValueError(f"rows of {n_cols} weights fit neither {qtype} nor a fallback type")
    return fallback
