"""Counting memory traffic and footprint (week 17): why FlashAttention is fast without a GPU to show it.

A GPU has a small fast memory (SRAM, on-chip, ~100–200 KB per SM) and a large slow one (HBM). Dao et al.
(2022, "FlashAttention", §3.2 and Theorem 2) count the slow-memory (HBM) accesses of two algorithms,
in *elements*, for one head with sequence length N, head dim d and a fast memory of M elements:

- standard attention (their Algorithm 0): Θ(N·d + N²) — S and P, both N×N, go to HBM and back;
- FlashAttention (their Algorithm 1):     Θ(N²·d²/M) — K and V are read once, Q and O once per key block.

`standard_io` and `flash_io` are those counts, exactly, for the loops as the paper writes them; `run_standard`
and `run_algorithm1` execute the same loops on a single head through an `HBM` object that counts every
element read and written, so the formulas can be checked against a run. This module is the lab's own:
no public teaching repo counts the traffic this way, so read it as a model, not a measurement.

`TensorMemoryMeter` and `peak_rss_delta` measure the other half of the argument, the memory footprint, on this CPU.
"""
from __future__ import annotations

import math
import os
import subprocess
import sys
import weakref
from typing import NamedTuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class IOCount(NamedTuple):
    """Slow-memory traffic in elements. A NamedTuple, so it compares equal to a plain `(reads, writes)`."""
    reads: int
    writes: int

    @property
    def total(self) -> int:
        return self.reads + self.writes


def block_sizes(d: int, m: int) -> tuple[int, int]:
    """Algorithm 1, line 1: B_c = ceil(M / 4d) key rows, B_r = min(ceil(M / 4d), d) query rows."""
    if m < 4 * d:
        raise ValueError(f"fast memory of M={m} elements cannot hold a block of head_dim {d} (needs M >= 4d = {4 * d})")
    b_c = math.ceil(m / (4 * d))
    return min(b_c, d), b_c


def standard_io(n: int, d: int) -> IOCount:
    """Algorithm 0: read Q, K, write S; read S, write P; read P, V, write O.  = (3Nd + 2N², Nd + 2N²)."""
    return IOCount(reads=3 * n * d + 2 * n * n, writes=n * d + 2 * n * n)


def flash_io(n: int, d: int, m: int) -> IOCount:
    """Algorithm 1 with T_c = ceil(N / B_c) key blocks:

    writes: initialise O, ℓ, m (Nd + 2N), then every (key block, query block) writes O_i, ℓ_i, m_i back
            → Nd + 2N + T_c·(Nd + 2N);
    reads:  every key block loads K_j, V_j once (2Nd in all) and, for each of them, every Q_i, O_i, ℓ_i, m_i
            → 2Nd + T_c·(2Nd + 2N).
    """
    _, b_c = block_sizes(d, m)
    t_c = math.ceil(n / b_c)
    return IOCount(reads=2 * n * d + t_c * (2 * n * d + 2 * n), writes=n * d + 2 * n + t_c * (n * d + 2 * n))


class HBM:
    """Named slow-memory arrays; `read` and `write` of row ranges count elements moved."""

    def __init__(self, **arrays: torch.Tensor):
        self.arrays = dict(arrays)
        self.reads = 0
        self.writes = 0

    def read(self, name: str, start: int, end: int) -> torch.Tensor:
        block = self.arrays[name][start:end].clone()
        self.reads += block.numel()
        return block

    def write(self, name: str, start: int, value: torch.Tensor) -> None:
        self.arrays[name][start:start + value.shape[0]] = value
        self.writes += value.numel()

    def alloc(self, name: str, value: torch.Tensor) -> None:
        self.arrays[name] = torch.empty_like(value)
        self.write(name, 0, value)

    @property
    def count(self) -> IOCount:
        return IOCount(self.reads, self.writes)


def run_standard(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, IOCount]:
    """Algorithm 0 on one head (`[N, d]` each), every HBM access counted."""
    n = q.shape[0]
    hbm = HBM(Q=q, K=k, V=v)
    s = hbm.read("Q", 0, n) @ hbm.read("K", 0, n).T * q.shape[1] ** -0.5
    hbm.alloc("S", s)  # [N, N] to HBM
    hbm.alloc("P", torch.softmax(hbm.read("S", 0, n), dim=-1))  # and back, and out again
    hbm.alloc("O", hbm.read("P", 0, n) @ hbm.read("V", 0, n))
    return hbm.arrays["O"], hbm.count


def run_algorithm1(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, m: int) -> tuple[torch.Tensor, IOCount, int]:
    """Algorithm 1 of Dao et al. on one head, literally (key blocks outside, query blocks inside).

    Returns the output, the counted HBM traffic and the largest number of elements held in fast memory at
    once (K_j, V_j, Q_i, O_i, ℓ_i, m_i, S_ij, P_ij and the new statistics); with the paper's block sizes
    this is a small constant times M (the paper's Θ hides it).
    """
    n, d = q.shape
    b_r, b_c = block_sizes(d, m)
    scale = d ** -0.5
    hbm = HBM(Q=q, K=k, V=v)
    hbm.alloc("O", torch.zeros_like(q))
    hbm.alloc("l", torch.zeros(n, dtype=q.dtype))
    hbm.alloc("m", torch.full((n,), float("-inf"), dtype=q.dtype))
    sram_peak = 0
    for js in range(0, n, b_c):
        kj, vj = hbm.read("K", js, js + b_c), hbm.read("V", js, js + b_c)  # [Bc, d] each
        for is_ in range(0, n, b_r):
            qi, oi = hbm.read("Q", is_, is_ + b_r), hbm.read("O", is_, is_ + b_r)  # [Br, d]
            li, mi = hbm.read("l", is_, is_ + b_r), hbm.read("m", is_, is_ + b_r)  # [Br]
            s = qi @ kj.T * scale  # [Br, Bc], on chip
            m_tilde = s.amax(dim=1)
            p = torch.exp(s - m_tilde[:, None])
            l_tilde = p.sum(dim=1)
            m_new = torch.maximum(mi, m_tilde)
            l_new = torch.exp(mi - m_new) * li + torch.exp(m_tilde - m_new) * l_tilde
            o_new = ((li * torch.exp(mi - m_new))[:, None] * oi + torch.exp(m_tilde - m_new)[:, None] * (p @ vj)) / l_new[:, None]
            held = kj.numel() + vj.numel() + qi.numel() + oi.numel() + 2 * s.numel() + 6 * li.numel()
            sram_peak = max(sram_peak, held)
            hbm.write("O", is_, o_new)
            hbm.write("l", is_, l_new)
            hbm.write("m", is_, m_new)
    return hbm.arrays["O"], hbm.count, sram_peak


# --- measuring the footprint on this CPU ---------------------------------------------------------------

class TensorMemoryMeter(TorchDispatchMode):
    """Peak bytes of tensor storage allocated while the mode is active (inputs made before it are not counted).

    Every aten op's outputs pass through `__torch_dispatch__`; a new storage is counted when it first
    appears and uncounted when the last tensor seen on it is freed (a weakref callback); views of memory
    that existed before the meter started (slices of the inputs) are not counted. This is the
    allocator's view of the computation — what a GPU's `torch.cuda.max_memory_allocated` would report —
    and unlike process RSS it does not depend on what the allocator hands back to the OS. It costs
    Python time per op, so time things outside it.

        with TensorMemoryMeter() as meter:
            out = naive_attention(q, k, v)
        meter.peak  # bytes
    """

    @classmethod
    def _should_skip_dynamo(cls) -> bool:  # its first use would import torch._dynamo (seconds): nothing is compiled
        return False

    def __init__(self):
        super().__init__()
        self._live: dict[int, list] = {}  # storage data_ptr -> [nbytes, live tensors]
        self._refs: dict[int, weakref.ref] = {}  # keeps the callbacks alive
        self.current = 0
        self.peak = 0

    def _release(self, key: int, ref) -> None:
        self._refs.pop(id(ref), None)
        entry = self._live.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            self.current -= entry[0]
            del self._live[key]

    def _track(self, t: torch.Tensor, input_storages: set[int]) -> None:
        storage = t.untyped_storage()
        nbytes = storage.nbytes()
        if nbytes == 0:
            return
        key = storage.data_ptr()
        if key in self._live:
            self._live[key][1] += 1  # a view of (or the same) memory allocated under the meter
        elif key in input_storages:
            return  # a view of memory allocated before the meter started: not ours to count
        else:
            self._live[key] = [nbytes, 1]
            self.current += nbytes
            self.peak = max(self.peak, self.current)
        ref = weakref.ref(t, lambda ref, key=key: self._release(key, ref))
        self._refs[id(ref)] = ref

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.note(args, kwargs, out)
        return out

    def note(self, args, kwargs, out) -> None:
        """Count the storages `out` (an op's result) holds that the op made: what `__torch_dispatch__` does after
        each op (the grader's observers call it from their own dispatch mode)."""
        outs = out if isinstance(out, (tuple, list)) else (out,)
        if any(isinstance(t, torch.Tensor) for t in outs):
            inputs = set()
            for a in list(args) + list((kwargs or {}).values()):
                for t in (a if isinstance(a, (tuple, list)) else (a,)):
                    if isinstance(t, torch.Tensor):
                        inputs.add(t.untyped_storage().data_ptr())
            for t in outs:
                if isinstance(t, torch.Tensor):
                    self._track(t, inputs)


_RSS_SCRIPT = r"""
import sys, torch
from lib.attn import attention

def status(field):  # kB, from the kernel's view of this process
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024

torch.set_num_threads(int(sys.argv[6]))
causal = sys.argv[7] == "1"
if sys.argv[1] == "scaled_dot_product_attention":  # PyTorch's fused kernel, square causal mask built in
    fn = lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
else:
    fn = lambda q, k, v, f=getattr(attention, sys.argv[1]): f(q, k, v, causal=causal)
b, h, n, d = map(int, sys.argv[2:6])
g = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(b, h, n, d, generator=g) for _ in range(3))
fn(q[:, :, :64], k[:, :, :64], v[:, :, :64])  # warm up: library code and thread pools, not memory
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # reset the peak-RSS high-water mark (VmHWM) to the current RSS
before = status("VmRSS")
with torch.no_grad():
    out = fn(q, k, v)
print(status("VmHWM") - before)
"""


def peak_rss_delta(fn_name: str, b: int, h: int, n: int, d: int, causal: bool = False, threads: int | None = None) -> int:
    """Bytes the process's peak resident set grows by while `lib.attn.attention.<fn_name>(q, k, v, causal)` runs, in a
    fresh process (`fn_name="scaled_dot_product_attention"`: PyTorch's own, with `is_causal`).

    Linux only: the child makes its inputs and warms the code up, resets its peak-RSS mark (`VmHWM`, by
    writing 5 to /proc/self/clear_refs), runs the call once and reports VmHWM minus the RSS before it. A fresh
    process, so nothing earlier in the notebook (freed but cached memory) hides in the figure. Coarser than
    `TensorMemoryMeter` (whole pages, the allocator's caching, BLAS workspaces), but it is what the OS saw.
    """
    threads = threads or torch.get_num_threads()
    res = subprocess.run([sys.executable, "-c", _RSS_SCRIPT, fn_name, str(b), str(h), str(n), str(d), str(threads),
                          "1" if causal else "0"],
                         capture_output=True, text=True, check=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    return int(res.stdout.strip().splitlines()[-1])
