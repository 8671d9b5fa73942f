"""Matmuls straight from a GGUF file's quantized blocks: the weights stay as the file stores them (week 20).

    y = qmatmul(x, blocks, "Q4_1")          # x float32 [..., in]; blocks uint8 [out, in / 32 * 20] -> [..., out]
    y64 = matmul_reference(x, blocks, "Q4_1")   # the same product in float64 from lib.gguf.qformats' dequantizer
    block_dot_q4_1(x32, block20)            # one block's dot product, written to be read
    backend()                               # "C++ avx512" / "C++ avx2" / "C++ generic" / "PyTorch fallback"

A decode step reads every weight once, so its speed is set by the bytes of weights per token: Q4_1 stores 32
weights in 20 bytes (5 bits each) instead of 128. The file's weights *are* the model — dequantized once to
float32 they give `lib.modeling.llama`'s fp32 model exactly — so a kernel that decodes each block in registers as it
multiplies computes the same model while reading 6.4x fewer bytes. No requantization, and the activations stay
float32 (llama.cpp rounds them to 8 bits; this kernel does not): the result is `x · dequantize(W)ᵀ` up to the
order of the float32 sum.

The block dot product, for Q4_1 (d and m are float16, q are 32 four-bit integers):

    sum_i x_i · (d·q_i + m)        — each weight decoded as lib.gguf.qformats does: d·q_i, rounded, plus m, rounded

`block_dot_q4_1` below is that line for one block; the C++ kernel (lib/gguf/csrc/qmatmul.cpp) does the same 16
lanes at a time, decoding each weight row once for up to 8 rows of `x` (a decode step, a verify step of week 18,
a batch of week 19), with the output rows split over threads.

The kernel is compiled on first use with the machine's C++ compiler (`-march=native`: AVX-512 or AVX2 where the
CPU has them; about 3 s) and cached under `data/cache/qmatmul/`. Without a compiler, or if the build fails,
every call falls back to PyTorch (`lib.gguf.qformats.dequantize` then `F.linear`: the same numbers, much slower) and a
warning says so once. `LAB_QMATMUL=pytorch` forces the fallback.

Types: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K (the layouts are in lib/gguf/qformats.py); Q4_1 and Q8_0 have
hand-written AVX-512 and AVX2 loops, the others the portable loop (vectorized by the compiler). SmolLM2's file
holds Q4_1 linears and a Q8_0 token embedding, which is also its (tied) output layer. `repack_q4_1` lays Q4_1
blocks out "wide" (d and m as float32, 24 bytes: "Q4_1F") — the same weights, the same products bit for bit,
read with fewer shuffles; GGUFFastLlama times both layouts and keeps the faster (measured: about 1.2x on the
Q4_1 matmuls alone on the AMD EPYC; 1.2x on an Intel Xeon VM's whole step, with software prefetch on: `set_prefetch`).

The same library holds `decode_steps`: a whole step of a llama model (one new token per sequence, or a few: a
verify step) on these blocks (norms, RoPE, the KV-cache write, attention, SiLU between the matmuls) in one call,
which `lib.quantization.quant_linear.GGUFFastLlama` uses (`QWeight`, `DecodeLayer`, `DecodeDims` below describe its arguments).
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from lib.bench import paths
from lib.gguf.qformats import BLOCK_SIZES, dequantize

QTYPES = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K")  # every type lib.gguf.qformats decodes
_CODES = {"Q8_0": 0, "Q4_0": 1, "Q4_1": 2, "Q4_K": 3, "Q6_K": 4, "Q5_0": 5, "Q5_1": 6, "Q5_K": 7}  # the C++ enum
# Not a GGUF type: plain float32 weights [out, in] through the same loops and the same whole-step call
# (lib.modeling.fast's "cpp" kernel); `in` must be a multiple of F32_BLOCK.
_STEP_CODES = {**_CODES, "F32": 8, "Q4_1F": 9}
F32_BLOCK = 16
# Not a GGUF type either: Q4_1 with d and m widened to float32 (`repack_q4_1`), 24 bytes a block. The same
# weights, read with fewer shuffles (lib.quantization.quant_linear.GGUFFastLlama's "wide" layout, chosen where it is faster).
WIDE = {"Q4_1": "Q4_1F"}
_LAYOUTS = {**BLOCK_SIZES, "Q4_1F": (32, 24)}
SOURCE = Path(__file__).resolve().parent / "csrc" / "qmatmul.cpp"
CXXFLAGS = ["-O3", "-march=native", "-fopenmp", "-ffp-contract=off", "-shared", "-fPIC"]
# Rows of x above which decoding the whole weight to float32 once and calling torch's matmul is faster than
# the fused kernel (a prefill), measured with `benchmarks/quant.py --matmul`: on SmolLM2's gate+up (Q4_1) the
# two cross between 24 and 32 rows; on its output layer (Q8_0, 113 MB as float32) the fused kernel wins at 64.
FUSED_MAX_ROWS = 32
# Software prefetch distance of the Q4_1 and Q8_0 loops (`set_prefetch`): 4 KB, a few rows of a matrix ahead.
# SmolLM2's Q4_1 weights streamed through the kernel on an Intel Xeon VM (2 threads, 100 MB): 7.7-10.5 GB/s
# without, 11-13 with 2-8 KB (flat over that range), and the wide layout 10.4-11.0 -> 14-16 GB/s.
PREFETCH_BYTES = 4096
# The same crossing for plain float32 weights (`linear_f32`): nothing to decode, so torch's matmul wins sooner.
# All of SmolLM2's weight matmuls (AMD EPYC, 2 threads) against oneDNN on the same plain weights: 8 rows 48 ms
# here and 50 there, 12 rows 51 and 52, 16 rows 74 and 57.
F32_MAX_ROWS = 12


# --- the block dot product, to be read ---------------------------------------------------------------------

def _f16(b) -> float:
    return float(np.frombuffer(bytes(b), dtype="<f2")[0])


def block_dot_q4_1(x: np.ndarray, block: np.ndarray) -> np.float32:
    """The dot product of 32 activations `x` (float32) with one Q4_1 block (20 bytes), as the kernel forms it:
    d and m from their float16 bytes, q from the 16 bytes of nibbles (low nibbles are weights 0-15, high ones
    16-31), each weight d·q + m in float32, then a float32 multiply-add per weight."""
    d, m = np.float32(_f16(block[0:2])), np.float32(_f16(block[2:4]))
    nibbles = np.asarray(block[4:20], dtype=np.uint8)
    q = np.concatenate([nibbles & 0x0F, nibbles >> 4]).astype(np.float32)  # [32]
    w = d * q + m  # the weights, as lib.gguf.qformats.dequantize writes them
    acc = np.float32(0)
    for xi, wi in zip(np.asarray(x, dtype=np.float32), w):
        acc = np.float32(acc + xi * wi)
    return acc


def row_dot_reference(x: np.ndarray, row: np.ndarray, qtype: str) -> float:
    """One output: activations `x [in]` with one weight row of GGUF blocks, block by block (any type): each
    block decoded by lib.gguf.qformats, its dot product added in float64."""
    block, nbytes = BLOCK_SIZES[qtype]
    total = 0.0
    for b in range(len(row) // nbytes):
        w = dequantize(row[b * nbytes:(b + 1) * nbytes], qtype)  # [block] float32
        total += float(np.dot(w.astype(np.float64), np.asarray(x[b * block:(b + 1) * block], dtype=np.float64)))
    return total


def matmul_reference(x: torch.Tensor, blocks: torch.Tensor, qtype: str) -> torch.Tensor:
    """`x · dequantize(blocks)ᵀ` in float64 (the oracle the tests hold the kernel to): x [..., in] -> [..., out]."""
    w = torch.from_numpy(dequantize(blocks.cpu(), qtype)).double()
    return x.double().cpu() @ w.T


# --- building and loading the C++ kernel --------------------------------------------------------------------

_lock = threading.Lock()
_state: dict = {}  # "lib": the loaded CDLL or None, once decided


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _compiler() -> str | None:
    for name in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def build(cache_dir: Path | None = None, compiler: str | None = None, extra_flags: tuple[str, ...] = ()) -> Path:
    """Compile lib/gguf/csrc/qmatmul.cpp for this CPU (or reuse the copy built before) and return the library's path.
    The file name hashes the source, the compiler, its flags and the CPU's flags, so a changed source or
    another machine gets its own build. `extra_flags` (tests: e.g. "-mno-avx512f" builds the AVX2 loops on an
    AVX-512 CPU) go after CXXFLAGS. Raises RuntimeError (with the compiler's message) when it cannot."""
    cxx = compiler or _compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler found (looked for $CXX, g++, c++, clang++)")
    cache_dir = Path(cache_dir) if cache_dir is not None else paths.CACHE_DIR / "qmatmul"
    flags = [*CXXFLAGS, *extra_flags]
    key = hashlib.sha256("\0".join([SOURCE.read_text(), cxx, " ".join(flags), _cpu_flags()]).encode())
    target = cache_dir / f"qmatmul-{key.hexdigest()[:16]}.so"
    if target.is_file():
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f"{target.name}.{os.getpid()}.part")  # two processes building at once: both rename
    proc = subprocess.run([cxx, *flags, str(SOURCE), "-o", str(tmp)], capture_output=True, text=True)
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"{cxx} failed to build {SOURCE.name}:\n{proc.stderr[-2000:]}")
    tmp.replace(target)
    return target


def _load():
    """The kernel library, built on first use; None (after one warning) when it cannot be built or loaded."""
    if "lib" in _state:
        return _state["lib"]
    with _lock:
        if "lib" in _state:
            return _state["lib"]
        lib, why = None, None
        if os.environ.get("LAB_QMATMUL", "").lower() == "pytorch":
            why = "LAB_QMATMUL=pytorch is set"
        else:
            try:
                lib = ctypes.CDLL(str(build()))  # torch is imported, so the kernel shares its OpenMP runtime
                lib.qmatmul_isa.restype = ctypes.c_char_p
                i64, ptr = ctypes.c_int64, ctypes.c_void_p
                lib.qmatmul_f32.argtypes = [ctypes.c_int, ptr, i64, i64, ptr, i64, i64, ptr, ctypes.c_int]
                lib.dequantize_f32.argtypes = [ctypes.c_int, ptr, i64, i64, ptr, ctypes.c_int]
                lib.decode_steps.argtypes = [ptr, ctypes.c_int, ptr, ptr, i64, i64, i64, ptr, ptr, ptr, ptr,
                                             ctypes.c_int]
                lib.qmatmul_set_prefetch.argtypes, lib.qmatmul_set_prefetch.restype = [i64], i64
            except (RuntimeError, OSError) as e:
                lib, why = None, str(e)
        if lib is None:
            msg = (f"lib.gguf.qmatmul: the C++ kernel is not available ({why}); using the PyTorch fallback "
                   f"(dequantize, then a float32 matmul): same results, several times slower")
            warnings.warn(msg, RuntimeWarning, stacklevel=3)
            print(msg, file=sys.stderr)
        _state["lib"] = lib
        return lib


class QWeight(ctypes.Structure):
    """One matmul weight for `decode_steps` (lib/gguf/csrc/qmatmul.cpp): up to 3 parts of GGUF blocks stacked along
    the output, each of one type."""
    _fields_ = [("nparts", ctypes.c_int32), ("qtype", ctypes.c_int32 * 3), ("rows", ctypes.c_int64 * 3),
                ("blocks", ctypes.c_void_p * 3)]


class DecodeLayer(ctypes.Structure):
    _fields_ = [("attn_norm", ctypes.c_void_p), ("mlp_norm", ctypes.c_void_p), ("wqkv", QWeight), ("wo", QWeight),
                ("w_gate_up", QWeight), ("w_down", QWeight)]


class DecodeDims(ctypes.Structure):
    _fields_ = [(n, ctypes.c_int64) for n in ("d_model", "n_heads", "n_kv_heads", "head_dim", "d_ff", "max_len")] + [
        ("eps", ctypes.c_float)]


def qweight(parts: list[tuple[str, torch.Tensor]]) -> QWeight:
    """A `QWeight` over `[(type, blocks)]` (contiguous CPU blocks, kept alive by the caller; type "F32": a
    float32 weight [out, in] itself)."""
    if not 1 <= len(parts) <= 3:
        raise ValueError(f"a decode-step weight has 1 to 3 parts, got {len(parts)}")
    w = QWeight(nparts=len(parts))
    for i, (qtype, b) in enumerate(parts):
        if not b.is_contiguous() or b.device.type != "cpu":
            raise ValueError("decode-step blocks must be contiguous CPU tensors")
        w.qtype[i], w.rows[i], w.blocks[i] = _STEP_CODES[qtype], b.shape[0], b.data_ptr()
    return w


def set_prefetch(nbytes: int) -> int:
    """How far ahead (bytes) the Q4_1 and Q8_0 loops ask for the blocks they will read next (0: off); returns
    the setting before. One setting per process (lib.quantization.quant_linear.GGUFFastLlama applies its measured choice,
    `PREFETCH_BYTES` or 0, before each step). The products do not change, only when the bytes arrive."""
    lib = _load()
    return 0 if lib is None else int(lib.qmatmul_set_prefetch(int(nbytes)))


def kernel():
    """The loaded C++ library (its `decode_steps` is called by lib.quantization.quant_linear.GGUFFastLlama), or None where
    the PyTorch fallback is in use."""
    return _load()


def backend() -> str:
    """Which code multiplies: "C++ avx512" / "C++ avx2" / "C++ generic", or "PyTorch fallback"."""
    lib = _load()
    return "PyTorch fallback" if lib is None else f"C++ {lib.qmatmul_isa().decode()}"


def reset() -> None:
    """Forget the loaded kernel, so the next call decides again (tests use it with LAB_QMATMUL or a missing
    compiler)."""
    with _lock:
        _state.clear()


# --- the operations -----------------------------------------------------------------------------------------

def repack_q4_1(blocks: torch.Tensor) -> torch.Tensor:
    """Q4_1 blocks `[out, in / 32 · 20]` -> the "Q4_1F" layout `[out, in / 32 · 24]`: each block's d and m as
    float32 (exactly: every float16 is a float32), then its 16 bytes of nibbles. Same weights, 20 % more bytes;
    the kernel loads d and m as they are instead of converting and broadcasting them in registers."""
    n, k = check_blocks(blocks, "Q4_1", None)
    b = blocks.contiguous().view(n, k // 32, 20)
    dm = b[..., :4].contiguous().view(torch.float16).float()  # [out, blocks, 2]
    return torch.cat([dm.view(torch.uint8), b[..., 4:]], dim=-1).reshape(n, k // 32 * 24)


def _dequantize_q4_1f(blocks: torch.Tensor) -> np.ndarray:
    b = blocks.cpu().contiguous().view(blocks.shape[0], -1, 24)
    dm = b[..., :8].contiguous().view(torch.float32)  # [out, blocks, 2]
    q = b[..., 8:].to(torch.int32)
    q = torch.cat([q & 0x0F, q >> 4], dim=-1).float()  # [out, blocks, 32]
    return (dm[..., :1] * q + dm[..., 1:]).reshape(blocks.shape[0], -1).numpy()  # d·q, rounded, + m, rounded


def check_blocks(blocks: torch.Tensor, qtype: str, in_features: int | None) -> tuple[int, int]:
    if qtype not in _LAYOUTS:
        raise ValueError(f"unsupported type {qtype!r}: supported types are {', '.join(QTYPES)} (and Q4_1F, "
                         f"repack_q4_1's layout)")
    if blocks.dtype != torch.uint8 or blocks.dim() != 2:
        raise ValueError(f"blocks must be uint8 [out, bytes per row], got {blocks.dtype} {tuple(blocks.shape)}")
    block, nbytes = _LAYOUTS[qtype]
    if blocks.shape[1] % nbytes:
        raise ValueError(f"{qtype} stores {block} weights in {nbytes} bytes, but a row of blocks has "
                         f"{blocks.shape[1]} bytes")
    k = blocks.shape[1] // nbytes * block
    if in_features is not None and in_features != k:
        raise ValueError(f"x has {in_features} features, but rows of {blocks.shape[1]} bytes of {qtype} hold {k}")
    return blocks.shape[0], k


def dequantize_blocks(blocks: torch.Tensor, qtype: str) -> torch.Tensor:
    """float32 `[out, in]` weights from GGUF blocks `[out, bytes]`, on the blocks' device."""
    n, k = check_blocks(blocks, qtype, None)
    if blocks.device.type == "meta":
        return torch.empty(n, k, device="meta")
    lib = _load() if blocks.device.type == "cpu" else None
    if lib is None:
        w = _dequantize_q4_1f(blocks) if qtype == "Q4_1F" else dequantize(blocks.cpu(), qtype)
        return torch.from_numpy(w).to(blocks.device)
    blocks = blocks.contiguous()
    out = torch.empty(n, k, dtype=torch.float32)
    lib.dequantize_f32(_STEP_CODES[qtype], blocks.data_ptr(), n, k, out.data_ptr(), torch.get_num_threads())
    return out


def qmatmul(x: torch.Tensor, blocks: torch.Tensor, qtype: str, weight_cache: dict | None = None) -> torch.Tensor:
    """`x · Wᵀ` for W stored as GGUF blocks: x float32 `[..., in]`, blocks uint8 `[out, in / block · bytes]`
    -> float32 `[..., out]` on x's device.

    On the CPU with the kernel: fused (decode in registers) for up to `FUSED_MAX_ROWS` rows of x, else the
    weight is decoded to float32 once and multiplied by torch. Elsewhere (GPU, or no kernel): the float32
    weight from the dequantizer (kept in `weight_cache["w"]` when a dict is given) and `F.linear`."""
    n, k = check_blocks(blocks, qtype, x.shape[-1])
    if x.dtype != torch.float32:
        raise ValueError(f"x must be float32 (the kernel keeps activations in float32), got {x.dtype}")
    if x.device != blocks.device:
        raise ValueError(f"x is on {x.device} but the blocks are on {blocks.device}")
    if x.device.type == "meta":
        return torch.empty(*x.shape[:-1], n, device="meta")
    flat = x.reshape(-1, k)
    rows = flat.shape[0]
    lib = _load() if x.device.type == "cpu" else None
    if lib is not None and rows <= FUSED_MAX_ROWS:
        flat, blocks = flat.contiguous(), blocks.contiguous()
        y = torch.empty(rows, n, dtype=torch.float32)
        lib.qmatmul_f32(_STEP_CODES[qtype], blocks.data_ptr(), n, k, flat.data_ptr(), rows, k, y.data_ptr(),
                        torch.get_num_threads())
        return y.reshape(*x.shape[:-1], n)
    if weight_cache is not None and lib is None:
        w = weight_cache.get("w")
        if w is None:
            w = weight_cache["w"] = dequantize_blocks(blocks, qtype)
    else:
        w = dequantize_blocks(blocks, qtype)
    return F.linear(x, w)


def f32_kernel_fits(w: torch.Tensor) -> bool:
    """Whether `linear_f32` and the decode step can multiply by `w` with the C++ kernel: a contiguous float32
    [out, in] CPU weight whose `in` is a multiple of F32_BLOCK, and the kernel built."""
    return (w.dtype == torch.float32 and w.device.type == "cpu" and w.dim() == 2 and w.is_contiguous()
            and w.shape[1] % F32_BLOCK == 0 and _load() is not None)


def linear_f32(x: torch.Tensor, w: torch.Tensor, max_rows: int = F32_MAX_ROWS, large=None) -> torch.Tensor:
    """`F.linear(x, w)` for float32 x `[..., in]` and a weight that `f32_kernel_fits`: up to `F32_MAX_ROWS` rows
    of x by the C++ kernel (each weight row read once for up to 8 rows of x, two threads streaming the weight:
    the read a decode step is made of), more rows by `large(x, w)` (default `F.linear`). Same numbers up to the order of the float32
    sum."""
    k = w.shape[1]
    flat = x.reshape(-1, k)
    rows = flat.shape[0]
    if rows > max_rows or x.dtype != torch.float32 or x.device.type != "cpu":
        return large(x, w) if large is not None else F.linear(x, w)
    flat = flat.contiguous()
    y = torch.empty(rows, w.shape[0], dtype=torch.float32)
    _load().qmatmul_f32(_STEP_CODES["F32"], w.data_ptr(), w.shape[0], k, flat.data_ptr(), rows, k, y.data_ptr(),
                        torch.get_num_threads())
    return y.reshape(*x.shape[:-1], w.shape[0])
