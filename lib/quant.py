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

`Q4_K` and `Q6_K` quantizers are the lab's own (gguf-py has none): a plain min/max (Q4_K) or signed
abs-max (Q6_K) quantizer per sub-block, whose sub-block scales are then quantized to 6 or 8 bits. llama.cpp
searches scales a little more cleverly; gguf-py's dequantizer reads our blocks all the same.

Inputs are numpy arrays or torch tensors; outputs are numpy arrays (use `fake_quantize` for a torch round trip).
"""
from __future__ import annotations

import numpy as np

# name -> (weights per block, bytes per block); from the layouts above (gguf.GGML_QUANT_SIZES agrees, tested)
BLOCK_SIZES: dict[str, tuple[int, int]] = {
    "Q8_0": (32, 34), "Q4_0": (32, 18), "Q4_1": (32, 20), "Q5_0": (32, 22), "Q5_1": (32, 24),
    "Q4_K": (256, 144), "Q5_K": (256, 176), "Q6_K": (256, 210),
}
QUANTIZE_TYPES = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q6_K")
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


def _as_numpy(x, dtype) -> np.ndarray:
    if hasattr(x, "detach"):  # a torch tensor
        x = x.detach().cpu().numpy()
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


def _q4_k(x):
    """The lab's Q4_K: per sub-block of 32, min/max (min clamped to <= 0) -> scale and min; those 8 scales
    and 8 mins quantized to 6 bits against the super-block's d and dmin (f16); then q = round((x + min)/scale)."""
    n = x.shape[0]
    sub = x.reshape(n, 8, 32)
    lo = np.minimum(sub.min(axis=-1), 0)  # [n, 8]
    hi = sub.max(axis=-1)
    scale, neg_min = (hi - lo) / np.float32(15), -lo  # x ≈ scale·q − neg_min
    d = (scale.max(axis=-1, keepdims=True) / np.float32(63)).astype(np.float16).astype(np.float32)
    dmin = (neg_min.max(axis=-1, keepdims=True) / np.float32(63)).astype(np.float16).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(d > 0, roundf(scale / d), 0).clip(0, 63)
        mn = np.where(dmin > 0, roundf(neg_min / dmin), 0).clip(0, 63)
        step = (d * sc)[..., None]  # [n, 8, 1], as the dequantizer forms it
        q = np.where(step > 0, roundf((sub + (dmin * mn)[..., None]) / step), 0).clip(0, 15).astype(np.uint8)
    q = q.reshape(n, 4, 2, 32)  # sub-blocks (2j, 2j+1) share 32 bytes: low and high nibbles
    qs = (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(n, 128)
    return np.concatenate([_f16_bytes(d), _f16_bytes(dmin), _pack_k_scales(sc, mn), qs], axis=-1)


def _q6_k(x):
    """The lab's Q6_K: per sub-block of 16, scale = signed abs-max / -32 (so q spans -32..31); the 16 scales
    quantized to int8 against the super-block's d (f16); then q = round(x / (d·sc))."""
    n = x.shape[0]
    sub = x.reshape(n, 16, 16)
    scale = _signed_absmax(sub)[..., 0] / np.float32(-32)  # [n, 16]
    d = (np.abs(scale).max(axis=-1, keepdims=True) / np.float32(127)).astype(np.float16).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(d > 0, roundf(scale / d), 0).clip(-128, 127)
        step = (d * sc)[..., None]
        q = np.where(step != 0, roundf(sub / step), 0).clip(-32, 31)
    q = (q + 32).astype(np.uint8).reshape(n, 256)
    # weight v sits in half v // 128, quarter (v % 128) // 32: low nibbles of quarters 0/1 share ql bytes with 2/3
    halves = q.reshape(n, 2, 4, 32)  # [n, half, quarter, 32]
    low, high = halves & 0x0F, halves >> 4
    ql = (low[:, :, 0:2] | (low[:, :, 2:4] << 4)).reshape(n, 128)  # per half: 64 bytes
    qh = (high[:, :, 0] | (high[:, :, 1] << 2) | (high[:, :, 2] << 4) | (high[:, :, 3] << 6)).reshape(n, 64)
    return np.concatenate([ql, qh, sc.astype(np.int8).view(np.uint8), _f16_bytes(d)], axis=-1)


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
               "Q4_K": _q4_k, "Q6_K": _q6_k}
_DEQUANTIZERS = {"Q8_0": _dq8_0, "Q4_0": _dq4_0, "Q4_1": _dq4_1, "Q5_0": _dq5_0, "Q5_1": _dq5_1,
                 "Q4_K": _dq4_k, "Q5_K": _dq5_k, "Q6_K": _dq6_k}


def quantize(x, qtype: str) -> np.ndarray:
    """`x [..., n]` (float, numpy or torch) -> uint8 `[..., n // block * type_size]` in the GGUF layout of `qtype`.

    Bit-identical to `gguf.quants.quantize` for Q8_0, Q4_0, Q4_1, Q5_0, Q5_1; Q4_K and Q6_K are the lab's
    own quantizers. `n` must be a multiple of the block size (32, or 256 for K-quants)."""
    name = _check_type(qtype, QUANTIZE_TYPES, "quantize to")
    x = _as_numpy(x, np.float32)
    block, nbytes = BLOCK_SIZES[name]
    if x.ndim == 0 or x.shape[-1] % block:
        raise ValueError(f"{name} quantizes blocks of {block} weights along the last dimension, but x has shape "
                         f"{x.shape}: its last dimension must be a multiple of {block} (pad or pick another type)")
    out = _QUANTIZERS[name](x.reshape(-1, block))
    return out.reshape(*x.shape[:-1], x.shape[-1] // block * nbytes)


def dequantize(data, qtype: str) -> np.ndarray:
    """uint8 `[..., k · type_size]` in the GGUF layout of `qtype` -> float32 `[..., k · block]`.

    Bit-identical to `gguf.quants.dequantize` for every type in `DEQUANTIZE_TYPES`."""
    name = _check_type(qtype, DEQUANTIZE_TYPES, "dequantize")
    data = _as_numpy(data, np.uint8)
    block, nbytes = BLOCK_SIZES[name]
    if data.ndim == 0 or data.shape[-1] % nbytes:
        raise ValueError(f"{name} stores {block} weights in {nbytes} bytes, but data has shape {data.shape}: its "
                         f"last dimension must be a multiple of {nbytes} bytes")
    out = _DEQUANTIZERS[name](data.reshape(-1, nbytes)).astype(np.float32, copy=False)
    return out.reshape(*data.shape[:-1], data.shape[-1] // nbytes * block)


def fake_quantize(w, qtype: str):
    """`dequantize(quantize(w, qtype), qtype)` as a float32 torch tensor on `w`'s device (weights as the
    quantized model would see them)."""
    import torch

    device = w.device if hasattr(w, "device") else "cpu"
    return torch.from_numpy(dequantize(quantize(w, qtype), qtype)).to(device)


# --- whole models: which type each tensor gets, fake-quantized copies, size ----------------------------------

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


def linear_names(model) -> list[str]:
    """The parameter names of the 7 linear weights of every block (q, k, v, o, gate, up, down), in order."""
    return [n for n, p in model.named_parameters() if n.startswith("layers.") and p.dim() == 2]


def use_more_bits(layer: int, n_layers: int) -> bool:
    """llama.cpp's choice of layers that get more bits in its _M mixes: the first and last eighth, and every
    third layer in between."""
    return layer < n_layers // 8 or layer >= 7 * n_layers // 8 or (layer - n_layers // 8) % 3 == 2


def q4_k_m_plan(model) -> dict[str, str]:
    """A Q4_K_M-like mix (llama.cpp's rule for the linears): attn_v and ffn_down of `use_more_bits` layers get
    Q6_K, every other linear Q4_K — each stored as `storable_type` allows."""
    plan = {}
    n_layers = model.config.n_layers
    for name in linear_names(model):
        layer = int(name.split(".")[1])
        more = ("attn.v_proj" in name or "mlp.down_proj" in name) and use_more_bits(layer, n_layers)
        plan[name] = "Q6_K" if more else "Q4_K"
    return plan


def uniform_plan(model, qtype: str) -> dict[str, str]:
    return {name: qtype for name in linear_names(model)}


def resolve_plan(model, plan: dict[str, str]) -> dict[str, str]:
    """Each tensor's type as it would be stored (K-quants on 576-wide rows fall back, see `storable_type`)."""
    params = dict(model.named_parameters())
    return {name: storable_type(t, params[name].shape[-1]) for name, t in plan.items()}


def plan_bits_per_weight(model, plan: dict[str, str]) -> float:
    """Average bits per weight over the tensors of `plan`, as stored."""
    params = dict(model.named_parameters())
    stored = resolve_plan(model, plan)
    bits = sum(params[n].numel() * bits_per_weight(t) for n, t in stored.items())
    return bits / sum(params[n].numel() for n in stored)


def quantize_model(model, plan: dict[str, str], weight_fn=None):
    """A copy of `model` whose tensors named in `plan` hold `fake_quantize(w, type)` (as stored: see
    `resolve_plan`); every other tensor is shared with `model`, which is left unchanged. `weight_fn(name, w,
    qtype) -> w'` replaces the GGUF round trip (e.g. a 3-bit round-to-nearest)."""
    import copy

    import torch

    stored = resolve_plan(model, plan) if weight_fn is None else dict(plan)
    memo = {id(p): p for p in model.parameters()}  # deepcopy shares what the memo names ...
    for name, qtype in stored.items():  # ... and puts the quantized weights in place of the originals
        w = model.get_parameter(name).detach()
        new_w = fake_quantize(w, qtype) if weight_fn is None else weight_fn(name, w, qtype)
        memo[id(model.get_parameter(name))] = torch.nn.Parameter(new_w.to(w.device, w.dtype), requires_grad=False)
    return copy.deepcopy(model, memo)


def minmax_grid(w, bits: int):
    """Asymmetric min/max grid of `w [..., group]` along its last dim: `(scale, lo)`, each `[..., 1]`; the
    levels are lo + scale·q for q = 0 … 2^bits − 1 (a group of equal values gets a tiny scale, never 0)."""
    lo, hi = w.amin(-1, keepdim=True), w.amax(-1, keepdim=True)
    return ((hi - lo) / (2**bits - 1)).clamp_min(1e-12), lo


def snap(w, scale, lo, bits: int):
    """Round `w` to the nearest level of the grid (scale, lo), clamped to the 2^bits levels; dequantized."""
    import torch

    return torch.clamp(torch.round((w - lo) / scale), 0, 2**bits - 1) * scale + lo


def rtn_quantize(w, bits: int, group_size: int = 64):
    """Round-to-nearest, asymmetric min/max per group of `group_size` along each row: the baseline that GPTQ
    and AWQ improve on. `w [rows, cols]` torch, returns the dequantized tensor (same shape, dtype, device).
    (SmolLM2's 576-wide rows take groups of 32, 64 or 192, not 128.)"""
    rows, cols = w.shape
    if cols % group_size:
        raise ValueError(f"cols ({cols}) must be a multiple of group_size ({group_size})")
    g = w.float().reshape(rows, cols // group_size, group_size)
    scale, lo = minmax_grid(g, bits)
    return snap(g, scale, lo, bits).reshape(rows, cols).to(w.dtype)


def rtn_bits_per_weight(bits: int, group_size: int) -> float:
    """`bits` per weight plus a float16 scale and a float16 minimum per group."""
    return bits + 32 / group_size


# --- writing a GGUF file with chosen per-tensor types ----------------------------------------------------------

def gguf_tensor_name(param_name: str) -> str:
    """Our parameter name -> the GGUF tensor name: "layers.3.mlp.down_proj.weight" -> "blk.3.ffn_down.weight"."""
    from lib.model import _GGUF_NAMES

    if param_name == "embed.weight":
        return "token_embd.weight"
    if param_name == "norm.weight":
        return "output_norm.weight"
    parts = param_name.split(".")
    ours = ".".join(parts[2:-1])
    for g, name in _GGUF_NAMES.items():
        if name == ours and parts[0] == "layers":
            return f"blk.{parts[1]}.{g}.weight"
    raise ValueError(f"{param_name!r} has no GGUF tensor name")


def write_gguf(path, plan: dict[str, str], source=None):
    """Write a copy of the GGUF file `source` (default: the lab's SmolLM2) to `path`, with every tensor named in
    `plan` (our parameter names, or GGUF tensor names) re-quantized to its type as stored (`storable_type`):
    metadata, tokenizer and every other tensor are copied byte for byte. The weights are taken from the source
    file itself (dequantized, in its own row order), so llama.cpp's Q/K row permutation is kept as it was.
    Returns the path. `lib.model.read_gguf_llama(path)` and transformers load the result."""
    from pathlib import Path

    import gguf

    from lib import paths

    source = Path(source) if source is not None else paths.smollm2_path()
    reader = gguf.GGUFReader(source)
    wanted = {(n if n.startswith(("blk.", "token_embd", "output")) else gguf_tensor_name(n)): t for n, t in plan.items()}
    names = {t.name for t in reader.tensors}
    unknown = sorted(set(wanted) - names)
    if unknown:
        raise ValueError(f"{source.name} has no tensors {unknown[:5]}")
    writer = gguf.GGUFWriter(path, reader.fields["general.architecture"].contents())
    for field in reader.fields.values():
        if field.name == "general.architecture" or field.name.startswith("GGUF."):
            continue  # written by GGUFWriter itself
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), vtype, sub_type=sub)
    for t in reader.tensors:
        data = np.asarray(t.data)
        if t.name in wanted:
            w = gguf.quants.dequantize(data, t.tensor_type).astype(np.float32)  # [rows, cols]
            qtype = storable_type(getattr(wanted[t.name], "name", wanted[t.name]), w.shape[-1])
            writer.add_tensor(t.name, quantize(w, qtype), raw_dtype=gguf.GGMLQuantizationType[qtype])
        elif t.tensor_type in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
            writer.add_tensor(t.name, data)
        else:
            writer.add_tensor(t.name, data, raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)


def allocate_bits(delta_ppl: dict[str, float], n_weights: dict[str, int], budget_bpw: float, low_bpw: float,
                  high_bpw: float) -> set[str]:
    """Which units get the high-bit format under a size budget: greedy by perplexity saved per extra bit.

    Every unit starts at `low_bpw`; raising unit u to `high_bpw` costs `n_weights[u]·(high − low)` bits and
    saves `delta_ppl[u]` (its perplexity increase when it alone is quantized low: sensitivities are assumed
    to add up). Units are taken in order of `delta_ppl / n_weights` while they fit in the budget
    `budget_bpw · Σ n_weights`."""
    if not low_bpw <= budget_bpw <= high_bpw:
        raise ValueError(f"the budget ({budget_bpw} bits/weight) must lie between low ({low_bpw}) and high ({high_bpw})")
    spare = (budget_bpw - low_bpw) * sum(n_weights.values())
    chosen = set()
    for unit in sorted(delta_ppl, key=lambda u: delta_ppl[u] / n_weights[u], reverse=True):
        cost = n_weights[unit] * (high_bpw - low_bpw)
        if delta_ppl[unit] > 0 and cost <= spare + 1e-9:
            chosen.add(unit)
            spare -= cost
    return chosen
