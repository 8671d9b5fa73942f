"""Roofline arithmetic: how long a step should take on this machine, from its FLOPs and the bytes it moves.

A step is compute-bound when flops / (FLOP/s) exceeds bytes / (bytes/s), memory-bound otherwise; the
roofline estimate is the larger of the two. Decode steps (one token) are memory-bound: every weight is
read once per token. An uncached step (a T-token forward) becomes compute-bound as T grows.
Used by week 16 (section 6) and by `benchmarks/decode.py`; `sync` by every notebook that times work on the model's
device.
"""
from __future__ import annotations

import math
import time

import torch

def step_flops(n_params: int, n_layers: int, d_model: int, seq_len: int, cached: bool) -> int:
    """FLOPs of the forward pass that produces token number `seq_len` (the sequence then holds `seq_len`
    positions, the new one included).

    Counted: matmuls only, a multiply-add = 2 FLOPs. Without a cache the model runs on all `seq_len`
    tokens; with one, on the single new token. Each token that runs costs `2 * n_params` in the weight
    matmuls, plus `4 * n_layers * d_model * seq_len` in attention (QK^T and PV against `seq_len` keys,
    the full score matrix as `gqa_attention` computes it, masked entries included).
    """
    tokens = 1 if cached else seq_len
    return 2 * n_params * tokens + 4 * n_layers * d_model * tokens * seq_len


def matmul_params(model) -> int:
    """Weights a token multiplies through: every linear layer, plus the LM head (the tied embedding)."""
    n = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    head = model.lm_head if getattr(model, "lm_head", None) is not None else None
    return n if head is not None else n + model.embed.weight.numel()


def weight_bytes_per_token(model) -> int:
    """Bytes of weights a decoded token reads: every matmul weight once (the tied embedding as the LM head)."""
    return matmul_params(model) * model.embed.weight.element_size()


def roofline_time(flops: float, bytes_moved: float, flops_per_s: float, bytes_per_s: float) -> float:
    """The roofline estimate of a kernel's time: compute and memory traffic overlap, the slower one wins."""
    return max(flops / flops_per_s, bytes_moved / bytes_per_s)


def sync(device) -> None:
    """Wait for the work queued on `device` before reading a clock: CUDA runs asynchronously, so a timer read
    without it measures the launch, not the work (a CPU needs nothing). Call it at both ends of a timed span."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def best_time(fn, repeats: int) -> float:
    """The best of `repeats` wall-clock seconds of `fn()` after one warm-up call (the least disturbed run on a
    shared machine); `fn` synchronizes a GPU itself. The lab's one timer."""
    fn()  # warm up (allocation, thread pool)
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


HUGE_PAGE = 2 << 20  # x86-64's large page: one TLB entry maps 2 MB instead of 4 KB


def huge_page_empty(nbytes: int) -> torch.Tensor:
    """An uninitialized uint8 CPU tensor of `nbytes`, starting on a 2 MB boundary, whose memory the kernel is
    asked to back with 2 MB pages (Linux `madvise(MADV_HUGEPAGE)`, before anything touches it). A streaming
    read of hundreds of MB on 4 KB pages takes a TLB miss every 4 KB — on a virtual machine each is a walk of
    two page tables — so decode's weights and the bandwidth probe both live on large pages where the system
    allows them (`/sys/kernel/mm/transparent_hugepage/enabled` is `madvise` or `always`); elsewhere (`never`,
    not Linux) this is plain memory and nothing else changes."""
    buf = torch.empty(nbytes + HUGE_PAGE, dtype=torch.uint8)
    view = buf[-buf.data_ptr() % HUGE_PAGE:][:nbytes]  # keeps `buf`'s storage alive
    if nbytes >= HUGE_PAGE:
        _madvise_huge(view.data_ptr(), nbytes)
    return view


def _madvise_huge(addr: int, nbytes: int) -> None:
    global _LIBC
    try:
        if _LIBC is None:
            import ctypes
            import ctypes.util

            _LIBC = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            _LIBC.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        _LIBC.madvise(addr, nbytes - nbytes % 4096, 14)  # 14: MADV_HUGEPAGE; refused (EINVAL) where unknown
    except (OSError, AttributeError):
        _LIBC = False  # no libc or no madvise here: plain pages


_LIBC = None


def on_huge_pages(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Copies of CPU `tensors` laid one after another in one `huge_page_empty` buffer (each at a 64-byte
    boundary), same dtypes and shapes."""
    sizes = [-(-t.numel() * t.element_size() // 64) * 64 for t in tensors]
    buf = huge_page_empty(sum(sizes))
    out, at = [], 0
    for t, size in zip(tensors, sizes):
        n = t.numel() * t.element_size()
        out.append(buf[at:at + n].view(t.dtype).view(t.shape).copy_(t))
        at += size
    return out


@torch.no_grad()
def measure_flops_per_s(n: int = 2048, repeats: int = 5, dtype: torch.dtype = torch.float32, device=None) -> float:
    """This machine's matmul throughput: the best of `repeats` `[n, n] @ [n, n]` products, in FLOP/s."""
    a = torch.randn(n, n, dtype=dtype, device=device)
    b = torch.randn(n, n, dtype=dtype, device=device)
    return 2 * n ** 3 / best_time(lambda: (a @ b, sync(a.device)), repeats)


@torch.no_grad()
def measure_bandwidth(mib: int = 256, repeats: int = 5, dtype: torch.dtype = torch.float32, device=None,
                      how: str = "stream") -> float:
    """This machine's memory bandwidth in bytes/s: the best of `repeats` reads of a `mib`-MiB matrix (use >= 128
    MiB so caches don't help), read one of two ways:

    - `how="stream"` (the roofline's ceiling): a sum over the matrix — every thread streams its share with
      vector loads, the closest torch gets to what the memory delivers. A decode path's share of the roofline
      is measured against this.
    - `how="matvec"`: a one-row `F.linear` over the matrix, the operation of an eager decode step. On the
      lab's 2-core AMD EPYC it read 24.5 GB/s where the stream read 51.5 GB/s in the same run, and lib.modeling.fast's
      packed decoder 31.5 GB/s effective — so this is what one mat-vec kernel gets, not the ceiling.

    On a shared or virtual machine the stream figure moves with the neighbours: 38–69 GB/s within one quiet hour
    on the lab's VM (the mat-vec, kernel-bound, stayed at 23–25). Compare a share with a probe from the same run.
    """
    if how not in ("stream", "matvec"):
        raise ValueError(f"how must be 'stream' or 'matvec'; got {how!r}")
    cols = 4096
    rows = mib * 2 ** 20 // (cols * torch.finfo(dtype).bits // 8)
    w = torch.randn(rows, cols, dtype=dtype, device=device)
    if w.device.type == "cpu":  # on large pages, as lib.modeling.fast keeps its weights: the best read, not a TLB test
        w = on_huge_pages([w])[0]
    if how == "stream":
        words = w.view(-1).view(torch.float32)  # the same bytes as float32 words: torch's fastest sum for any dtype
        read = lambda: (words.sum(), sync(w.device))  # noqa: E731
    else:
        x = torch.randn(1, cols, dtype=dtype, device=device)
        read = lambda: (torch.nn.functional.linear(x, w), sync(w.device))  # noqa: E731
    return w.numel() * w.element_size() / best_time(read, repeats)
