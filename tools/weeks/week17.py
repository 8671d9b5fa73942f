"""Builds solutions/17/week17_flash_attention.ipynb (run: python tools/weeks/week17.py)."""
from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tools.nbbuild import Notebook  # noqa: E402

nb = Notebook()

nb.md("""
# Week 17 — FlashAttention: online softmax, tiling, IO complexity, backward, split-K decode

Standard attention writes a `[B, H, N, N]` matrix of scores, then a second one of probabilities, and
reads both back. FlashAttention (Dao et al., *FlashAttention: Fast and Memory-Efficient Exact Attention
with IO-Awareness*, NeurIPS 2022) computes the **same** output block by block, never holding more than a
tile of scores, thanks to one trick: a softmax can be computed online, rescaling as new keys arrive.

On a GPU that saves time, because the tiles live in on-chip SRAM and the N×N matrix never travels to HBM.
This lab is written to run on a CPU-only laptop (the first code cell prints whether CUDA is available; §7
runs a GPU timing when it is), so we make the argument in two ways we *can* check on any machine:

1. **memory**: we measure the peak memory of each algorithm on this CPU;
2. **traffic**: we build a small model of a fast and a slow memory and *count* the slow-memory accesses,
   reproducing the paper's IO theorem (Theorem 2) by counting instead of by proof.

| § | you write | checked by |
|---|---|---|
| 1 | `naive_attention`, `score_bytes` | `pytest weeks/17 -k "ex01 or ex02"` |
| 2 | `online_softmax` | `-k ex03` |
| 3 | `flash_attention_forward` (Algorithm 1, causal block skipping) | `-k ex04` |
| 4 | `standard_io`, `flash_io` (HBM traffic counts) | `-k "ex05 or ex06"` |
| 5 | `flash_attention_backward`, `FlashAttention` (autograd) | `-k "ex07 or ex08"` |
| 6 | `merge_partials`, `flash_decode` (split-K) | `-k "ex09 or ex10"` |
| 7 | plug it into SmolLM2 (and decode with each KV head read once), time and measure it; `predict_peak_bytes` (exercise 17: predict, then measure) | `-k ex17` |
| 8 | Triton kernels: `softmax_rows`, `tiled_matmul`, `flash_attention_triton` (FlashAttention-2's forward) | `-k "ex11 or ex12 or ex13"` |
| 9 | quiz | `-k "ex14 or ex15 or ex16"` |

Shapes throughout: `q [B, H, Nq, d]`, `k` and `v [B, H, Nk, d]` (one KV head per query head; a GQA model
wraps the function with `lib.attn.attention.expand_kv`). `causal=True` is aligned at the bottom right, as in
week 16: query `i` sees keys `j <= i + (Nk - Nq)`.

The checks judge *how* you compute as well as the numbers: they record the matrix products, reductions,
FLOPs and memory of your calls (`grader.checks.observe`), so the library op, `lib`'s reference, a full score
row where a block is asked for, or a CPU tensor mixed into a GPU computation fail even with the right output. Time: about 4–5 hours. The whole notebook runs in
about 2–3 minutes on 2 CPU cores.
""")

nb.setup("""
import math

import torch

from lib.attn.attention import check_attention_shapes  # raises ValueError naming the shapes, for impossible inputs
from lib.attn.masks import causal_mask  # week 16: bottom-right aligned boolean mask [q_len, kv_len]
from grader.checks.week17 import (check_naive_attention, check_score_bytes, check_online_softmax,
                                  check_flash_attention_forward, check_standard_io, check_flash_io,
                                  check_flash_attention_backward, check_FlashAttention, check_merge_partials,
                                  check_flash_decode, check_predict_peak_bytes,
                                  check_answer_q1, check_answer_q2, check_answer_q3)
""")

nb.code("""
# Demo-only imports (not needed by the exercises).
import subprocess
import sys
import time

import matplotlib.pyplot as plt
import numpy as np
from tqdm.auto import tqdm

from lib.attn import io_model
import torch.nn.functional as F

from lib.attn.attention import expand_kv
from lib.attn.io_model import TensorMemoryMeter

torch.manual_seed(0)
# One thread for every measurement in this notebook. The tiled loop runs thousands of small ops; with two
# OpenMP threads, each op ends in a barrier, and when anything else runs on the machine one thread waits
# for the other to be scheduled again: measured here, a causal N=1024 tiled forward went from 0.04 s (1
# thread) to 3 s (2 threads, the other core busy). One thread makes the three methods comparable and the
# numbers stable; on a quiet machine, try torch.set_num_threads(2) and see what changes.
torch.set_num_threads(1)
print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), CUDA available: {torch.cuda.is_available()}")
""")

nb.md(r"""
## 1. What standard attention costs

Standard attention, for one batch of heads:

$$S = \frac{QK^\top}{\sqrt d} \in \mathbb{R}^{N_q\times N_k},\qquad P = \mathrm{softmax}(S)\ \text{(row-wise)},\qquad O = PV.$$

Written the obvious way, `S` and `P` are both materialized: `[B, H, Nq, Nk]` each. Write it that way
(start with `check_attention_shapes(q, k, v, causal)`, and use `causal_mask` from week 16 with `-inf`, made on
the inputs' device: `causal_mask(..., device=q.device)`).
""")

nb.exercise("naive_attention", '''
def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False) -> torch.Tensor:
    """softmax(q kᵀ / sqrt(d)) v with the full score matrix. q [B, H, Nq, d]; k, v [B, H, Nk, d] -> [B, H, Nq, d]."""
    ### BEGIN SOLUTION
    check_attention_shapes(q, k, v, causal)
    scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5  # [B, H, Nq, Nk]
    if causal:
        scores = scores.masked_fill(~causal_mask(q.shape[2], k.shape[2], device=q.device), float("-inf"))
    return torch.softmax(scores, dim=-1) @ v  # [B, H, Nq, d]
    ### END SOLUTION
''')

nb.test("test_naive_attention", """
check_naive_attention(naive_attention)
""", points=2)

nb.md("""
How big is that score matrix? Write the formula as a function (fp32 = 4 bytes per element by default).
""")

nb.exercise("score_bytes", '''
def score_bytes(batch: int, heads: int, q_len: int, kv_len: int, bytes_per_element: int = 4) -> int:
    """Bytes of one [batch, heads, q_len, kv_len] score matrix."""
    ### BEGIN SOLUTION
    return batch * heads * q_len * kv_len * bytes_per_element
    ### END SOLUTION
''')

nb.test("test_score_bytes", """
check_score_bytes(score_bytes)
""", points=1)

nb.md("""
The curriculum's seed states two numbers for the shape `[batch 8, heads 8, N, N]` in fp32. Check the first here
(the second, at N = 1024, is Q1 in §9):
""")

nb.code("""
print(f"N = 4096: {score_bytes(8, 8, 4096, 4096) / 1e9:.2f} GB   (seed: ~4.3 GB — right)")
""")

nb.md("""
### Measuring it

How do we measure peak memory on a CPU? Process RSS is coarse (the allocator keeps freed pages, and its
high-water mark never goes down), so we count tensor allocations instead: `lib.attn.io_model.TensorMemoryMeter`
is a `TorchDispatchMode` that sees every aten op's outputs, adds a storage's bytes when it first appears
and subtracts them when the last tensor on it is freed. That is what `torch.cuda.max_memory_allocated`
reports on a GPU. It does not see scratch memory a single fused op allocates inside itself (SDPA's
buffers, for instance), so in §7 we cross-check against the operating system's own peak-RSS figure.

The formula predicts **two** N×N matrices alive at once — `S` and `P` = `softmax(S)` — plus the output.
""")

nb.code("""
B, H, D = 1, 8, 64
mem_ns = [512, 1024, 2048, 4096]
naive_peak = {}
for n in tqdm(mem_ns, desc="naive attention, peak memory"):
    q, k, v = torch.randn(3, B, H, n, D).unbind(0)
    with TensorMemoryMeter() as meter:
        naive_attention(q, k, v)
    naive_peak[n] = meter.peak
    del q, k, v
for n in mem_ns:
    formula = 2 * score_bytes(B, H, n, n) + score_bytes(B, H, n, D)
    print(f"N={n:5d}: measured {naive_peak[n] / 1e6:8.1f} MB   formula 2·S + O = {formula / 1e6:8.1f} MB")

plt.figure(figsize=(5, 3.5))
plt.loglog(mem_ns, [naive_peak[n] / 1e6 for n in mem_ns], "o", label="naive, measured")
plt.loglog(mem_ns, [(2 * score_bytes(B, H, n, n) + score_bytes(B, H, n, D)) / 1e6 for n in mem_ns], "-",
           label="formula 2·S + O = (2·B·H·N² + B·H·N·d)·4 bytes")
plt.xlabel("N (sequence length)"); plt.ylabel("peak memory (MB)"); plt.title(f"standard attention, B={B}, H={H}, d={D}")
plt.legend(); plt.grid(True, which="both", alpha=0.3); plt.show()
""")

nb.md("""
Check this section: `pytest weeks/17 -k "ex01 or ex02"`.
""")

nb.md(r"""
## 2. Online softmax

The tiled algorithm sees each row of `S` a chunk at a time. Softmax needs the row's max (for stability)
and its sum of exponentials (for normalization) — both of the *whole* row. Keep, per row, only two numbers
while you read it: the largest entry seen so far, `m`, and a sum of exponentials of the entries seen so far,
`l`, taken **relative to `m`**. Work it out before you write it (Milakov & Gimelshein 2018 found it; Dao et
al. §3.1 use it):

- a new chunk arrives and its largest entry exceeds `m`. What does `l` mean now, and what single factor makes
  it mean the right thing again?
- after the last chunk, how do you get `softmax(x)` from `x`, `m` and `l` — with no second pass over sums?

Your function returns `softmax(x, dim=-1)` for any `chunk_size` from 1 up to the row's length (and beyond).

Edge cases your function must survive: entries of size 1e4 (`exp` overflows fp32 above ~88, so never
exponentiate anything but `x - max`), and `-inf` entries — including a first chunk that is **all** `-inf`,
where `m` is still `-inf` and `exp(-inf - (-inf))` is NaN. (Rows that are entirely `-inf` have no softmax;
you need not handle them.)
""")

nb.exercise("online_softmax", '''
def online_softmax(x: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """softmax(x, dim=-1), reading the last dim in chunks of chunk_size with a running max and a rescaled running sum."""
    ### BEGIN SOLUTION
    m = torch.full(x.shape[:-1], float("-inf"), dtype=x.dtype, device=x.device)  # running max per row
    l = torch.zeros(x.shape[:-1], dtype=x.dtype, device=x.device)  # running sum of exp(x - m)
    for start in range(0, x.shape[-1], chunk_size):
        chunk = x[..., start:start + chunk_size]
        m_new = torch.maximum(m, chunk.amax(dim=-1))
        m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)  # still all -inf: add nothing
        l = l * torch.exp(m - m_safe) + torch.exp(chunk - m_safe[..., None]).sum(dim=-1)
        m = m_new
    return torch.exp(x - m[..., None]) / l[..., None]
    ### END SOLUTION
''')

nb.test("test_online_softmax", """
check_online_softmax(online_softmax)
""", points=2)

nb.md(r"""
**The rule, now that your check passes.** When a chunk `c` arrives:

$$m' = \max(m, \max c),\qquad l' = l\,e^{m - m'} + \sum e^{c - m'}.$$

The old sum is **rescaled** by `exp(m - m')`, so it is always relative to the current max. After the last
chunk, `softmax(x) = exp(x - m) / l`. The same two lines, with an output accumulator rescaled by the same
factor, are the heart of §3.
""")

nb.code("""
x = torch.tensor([[1000.0, 1001.0, -float("inf"), 999.0, 1002.0]])
print("exp(x).sum() in fp32:          ", torch.exp(x).sum().item(), " <- overflow without the max")
print("online_softmax, chunks of 2:   ", online_softmax(x, 2))
print("torch.softmax:                 ", torch.softmax(x, dim=-1))
""")

nb.md("""
Check: `pytest weeks/17 -k ex03`.
""")

nb.md("""
## 3. The tiled forward pass (Algorithm 1)

Dao et al. 2022, Algorithm 1: split Q into blocks of `block_q` rows and K, V into blocks of `block_k` rows,
and compute attention one (query block, key block) pair at a time, never holding more than a block of scores.
You have the pieces: §2's running max and rescaled sum, for a whole *output* now rather than a softmax. Design
the loop yourself; what a correct one keeps:

- the output equals `naive_attention`'s, and it returns the rows' **logsumexp** as well, `lse_i =
  log Σ_j exp(s_ij)` (the backward pass of §5 and split-K decoding of §6 need it);
- no product or reduction spans more than a block; the memory it allocates beyond `out` and `lse` does not grow
  with N (so no row of scores, and no list of blocks to combine at the end);
- **causal masking skips work**: a block that the causal mask hides entirely is never computed (the check counts
  your FLOPs: about half of the non-causal pass). Which blocks are those, for `Nq ≠ Nk` too (bottom-right
  aligned, as in week 16)? Record each block you compute by appending `(q_start, k_start)` to `visited` when it
  is a list: the check uses it to see that you skip exactly the right blocks.

(The paper's Algorithm 1 puts the key loop outside and re-reads O from HBM each time; FlashAttention-2 swapped
the loops so that the running state stays on chip: write that order; §4 counts the first, as the paper does.)

Use `check_attention_shapes(q, k, v, causal)` first. Equal to `naive_attention` within 1e-5 in fp32 for
lengths that are not multiples of the block sizes, `Nq ≠ Nk`, causal or not, head dims that are not powers
of two, and a non-contiguous `q` (a model's `q` is a transposed view).

**Precision and device.** For fp16/bf16 inputs keep `m`, `l` and `acc` in float32 (as FlashAttention's
kernels do: `torch.promote_types(q.dtype, torch.float32)`) and return `out` in q's dtype and `lse` in
float32. Create every tensor — the running state, the `torch.arange` of a mask — on `q.device`: the check
also runs your function on `meta`-device tensors, where a CPU tensor fails as it would on a GPU.

**What the check looks at besides the numbers:** it records every matrix product and reduction your code
runs (a `TorchDispatchMode`, `grader.checks.observe`). None may span more than a block (`max(block_q,
block_k, d)` rows or columns), the causal pass must count about half the FLOPs of the non-causal one, and
the memory it allocates beyond the output must not grow with N. Calling SDPA or `lib`'s reference fails.
""")

nb.exercise("flash_attention_forward", '''
def flash_attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                            block_q: int = 128, block_k: int = 128,
                            visited: list | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Tiled attention. Returns out [B, H, Nq, d] (q's dtype) and lse [B, H, Nq] (float32 or wider)."""
    ### BEGIN SOLUTION
    check_attention_shapes(q, k, v, causal)
    nq, nk, scale = q.shape[2], k.shape[2], q.shape[-1] ** -0.5
    offset = nk - nq  # query i sees keys j <= i + offset
    acc_dtype = torch.promote_types(q.dtype, torch.float32)  # fp16/bf16 -> float32 running state
    out = torch.empty(q.shape[:3] + (v.shape[-1],), dtype=q.dtype, device=q.device)  # [B, H, Nq, d]
    lse = torch.empty(q.shape[:3], dtype=acc_dtype, device=q.device)  # [B, H, Nq]
    for qs in range(0, nq, block_q):
        qe = min(qs + block_q, nq)
        qi = q[:, :, qs:qe].to(acc_dtype) * scale  # [B, H, bq, d]
        m = torch.full(qi.shape[:3], float("-inf"), dtype=acc_dtype, device=q.device)
        l = torch.zeros_like(m)
        acc = torch.zeros(qi.shape[:3] + (v.shape[-1],), dtype=acc_dtype, device=q.device)
        for ks in range(0, nk, block_k):
            ke = min(ks + block_k, nk)
            if causal and ks > qe - 1 + offset:
                break  # this block and every later one lie wholly above the diagonal
            if visited is not None:
                visited.append((qs, ks))
            s = qi @ k[:, :, ks:ke].to(acc_dtype).transpose(-1, -2)  # [B, H, bq, bk]
            if causal and ke - 1 > qs + offset:  # the diagonal crosses this block
                keep = (torch.arange(ks, ke, device=q.device)[None, :]
                        <= torch.arange(qs, qe, device=q.device)[:, None] + offset)  # on q's device (GPU-safe)
                s = s.masked_fill(~keep, float("-inf"))
            m_new = torch.maximum(m, s.amax(dim=-1))
            m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
            p = torch.exp(s - m_safe[..., None])
            alpha = torch.exp(m - m_safe)
            l = alpha * l + p.sum(dim=-1)
            acc = alpha[..., None] * acc + p @ v[:, :, ks:ke].to(acc_dtype)
            m = m_new
        l_safe = torch.where(l == 0, torch.ones_like(l), l)  # a query that saw no key (Nk = 0): out 0, lse -inf
        out[:, :, qs:qe] = (acc / l_safe[..., None]).to(q.dtype)
        lse[:, :, qs:qe] = torch.where(l == 0, m, m + torch.log(l_safe))
    return out, lse
    ### END SOLUTION

''')

nb.test("test_flash_attention_forward", """
check_flash_attention_forward(flash_attention_forward)
""", points=4)

nb.md("""
**The algorithm, now that your check passes** (FlashAttention-2's loop order). For each query block keep, per
row, the running max `m`, the running sum `l` and an **unnormalized** output accumulator `acc` (`[block_q, d]`),
in float32. For each key block:

```
s     = q_i k_jᵀ / sqrt(d)                       [block_q, block_k]   (mask with -inf where causal hides it)
m_new = max(m, rowmax(s))
p     = exp(s - m_new)
alpha = exp(m - m_new)                           rescales what was accumulated under the old max
l     = alpha · l + rowsum(p)
acc   = alpha · acc + p v_j
m     = m_new
```

and at the end `out_i = acc / l` and `lse_i = m + log(l)`. Causal: a block whose first key is right of the last
query's diagonal (`k_start > q_end - 1 + (Nk - Nq)`) is skipped; blocks wholly below it need no mask; only the
blocks the diagonal crosses do.

Which blocks does a causal prefill compute? Count them:
""")

nb.code("""
n, bq = 1024, 128
visited = []
q, k, v = torch.randn(3, 1, 2, n, 32).unbind(0)
out, lse = flash_attention_forward(q, k, v, causal=True, block_q=bq, block_k=bq, visited=visited)
print(f"max |flash - naive| = {(out - naive_attention(q, k, v, causal=True)).abs().max():.2e}")
grid = np.zeros((n // bq, n // bq))
for qs, ks in visited:
    grid[qs // bq, ks // bq] = 1
t = n // bq
print(f"{len(visited)} of {t * t} blocks computed")
plt.figure(figsize=(3, 3)); plt.imshow(grid, cmap="Blues"); plt.xlabel("key block"); plt.ylabel("query block")
plt.title("blocks computed, causal"); plt.show()
""")

nb.md("""
Check: `pytest weeks/17 -k ex04`.
""")

nb.md("""
## 4. Counting HBM traffic

*This section is this lab's own construction; we know of no public teaching repository that counts the
traffic like this. It is a model, as in the paper's analysis, not a measurement of any GPU.*

Model a GPU as a slow memory (HBM, large) and a fast one (SRAM) of **M elements**. Count the elements
each algorithm moves between them, for one head, `N` queries and keys, head dim `d`. Return
`(reads, writes)`.

**Standard attention** (Dao et al., Algorithm 0): (1) read Q and K, compute S, write S; (2) read S,
compute P, write P; (3) read P and V, compute O, write O. (Each matrix is streamed through fast memory once.)

**FlashAttention** (Algorithm 1, key blocks outside, as the paper writes it):

1. block sizes `B_c = ceil(M / 4d)`, `B_r = min(ceil(M / 4d), d)` — so K_j, V_j, Q_i, O_i fit in M;
2. initialise O (N×d), ℓ and m (N each) in HBM: that is a write;
3. for each of the `T_c = ceil(N / B_c)` key blocks: read K_j and V_j; then for each query block read
   Q_i, O_i, ℓ_i, m_i, compute on chip, and write O_i, ℓ_i, m_i back.

(Sum over all blocks, including a short last one: e.g. reading every Q_i once is exactly N·d elements.)
""")

nb.exercise("standard_io", '''
def standard_io(n: int, d: int) -> tuple[int, int]:
    """(reads, writes), in elements, of standard attention (Algorithm 0) for one head."""
    ### BEGIN SOLUTION
    reads = 2 * n * d + n * n + n * n + n * d  # Q, K; S; P, V
    writes = n * n + n * n + n * d  # S; P; O
    return reads, writes
    ### END SOLUTION
''')

nb.test("test_standard_io", """
check_standard_io(standard_io)
""", points=2)

nb.exercise("flash_io", '''
def flash_io(n: int, d: int, m: int) -> tuple[int, int]:
    """(reads, writes), in elements, of FlashAttention's Algorithm 1 for one head, with fast memory of m elements."""
    ### BEGIN SOLUTION
    b_c = math.ceil(m / (4 * d))
    t_c = math.ceil(n / b_c)
    reads = 2 * n * d + t_c * (2 * n * d + 2 * n)  # K, V once; Q, O, l, m once per key block
    writes = (n * d + 2 * n) + t_c * (n * d + 2 * n)  # initialise O, l, m; write them back once per key block
    return reads, writes
    ### END SOLUTION
''')

nb.test("test_flash_io", """
check_flash_io(flash_io)
""", points=2)

nb.md("""
**Do the formulas describe a real run?** `lib.attn.io_model.run_algorithm1` executes Algorithm 1 literally on
one head, with every access to "HBM" going through a counter (`io_model.HBM`), and `run_standard` does the
same for Algorithm 0. Their outputs are real attention outputs, and their counts should be yours exactly.
""")

nb.code("""
for n, d, m in [(256, 32, 2048), (1000, 64, 20_000), (777, 16, 4096)]:
    q, k, v = torch.randn(3, n, d, dtype=torch.float64).unbind(0)
    out1, counted, sram = io_model.run_algorithm1(q, k, v, m)
    out0, counted0 = io_model.run_standard(q, k, v)
    exact = torch.softmax(q @ k.T / math.sqrt(d), dim=-1) @ v
    print(f"N={n:4d} d={d:3d} M={m:6d}: Algorithm 1 counted {tuple(counted)}, flash_io {flash_io(n, d, m)}; "
          f"Algorithm 0 counted {tuple(counted0)}, standard_io {standard_io(n, d)}; "
          f"max err {max((out1 - exact).abs().max(), (out0 - exact).abs().max()):.1e}; SRAM peak {sram / m:.2f}·M")
""")

nb.md("""
(The SRAM peak exceeds M by a small factor: the paper's block sizes keep the working set O(M), and its Θ
hides the constant.)

**The IO theorem by counting.** Theorem 2 of the paper: standard attention needs Θ(N·d + N²) HBM accesses,
FlashAttention Θ(N²·d²/M). Sweep N and M, and fit the exponents on a log-log scale. For the M used below we
take an A100 SM's 192 KiB of SRAM in fp16: 98,304 elements.
""")

nb.code(r"""
def fit_exponent(xs, ys):
    return np.polyfit(np.log(xs), np.log(ys), 1)[0]

d, M_A100 = 64, 98_304
ns = [2 ** p for p in range(9, 17)]  # 512 ... 65536
ms = [2 ** p for p in range(12, 21)]  # 4096 ... 1M elements
n_fixed = 65_536
std_n = [sum(standard_io(n, d)) for n in ns]
fl_n = [sum(flash_io(n, d, M_A100)) for n in ns]
fl_m = [sum(flash_io(n_fixed, d, m)) for m in ms]
ds = [16, 32, 64, 128, 256]
fl_d = [sum(flash_io(n_fixed, dd, M_A100)) for dd in ds]
exps = {"standard vs N": fit_exponent(ns, std_n), "flash vs N": fit_exponent(ns, fl_n),
        "flash vs M": fit_exponent(ms, fl_m), "flash vs d": fit_exponent(ds, fl_d)}
for name, e in exps.items():
    print(f"fitted exponent, {name:14s}: {e:+.3f}")
print(f"\nN=4096, M={M_A100}: HBM accesses by head dim (the paper: d = 64–128, so d² ≪ M)")
print(f"{'d':>5} {'d²/M':>7} {'standard':>14} {'flash':>14} {'standard/flash':>15}")
for dd in ds:
    st, fl = sum(standard_io(4096, dd)), sum(flash_io(4096, dd, M_A100))
    print(f"{dd:>5} {dd * dd / M_A100:>7.3f} {st:>14,} {fl:>14,} {st / fl:>14.1f}×")
d_even = next((dd for dd in range(8, 4097, 8) if sum(flash_io(4096, dd, M_A100)) >= sum(standard_io(4096, dd))), None)
print(f"by these counts flash's traffic reaches the standard algorithm's at N=4096 from d ≈ {d_even} (d² ≈ {d_even ** 2 / M_A100:.2f}·M)")
print(f"\nat N=4096, d=64, M={M_A100}: standard {sum(standard_io(4096, d)):,} elements, flash {sum(flash_io(4096, d, M_A100)):,} "
      f"({sum(standard_io(4096, d)) / sum(flash_io(4096, d, M_A100)):.1f}× fewer)")

fig, ax = plt.subplots(1, 3, figsize=(14, 3.8))
ax[0].loglog(ms, fl_m, "o-", label=f"FlashAttention (N={n_fixed}, d={d})")
ax[0].axhline(sum(standard_io(n_fixed, d)), color="C1", label="standard (does not depend on M)")
ax[0].loglog(ms, [fl_m[0] * ms[0] / m for m in ms], "k:", label="slope −1")
ax[0].set_xlabel("fast memory M (elements)"); ax[0].set_ylabel("HBM accesses (elements)"); ax[0].legend(fontsize=8)
ax[0].set_title("HBM traffic vs SRAM size")
ax[1].loglog(ns, std_n, "o-", label="standard")
ax[1].loglog(ns, fl_n, "s-", label=f"FlashAttention, M={M_A100}")
ax[1].set_xlabel("N"); ax[1].set_ylabel("HBM accesses (elements)"); ax[1].legend(fontsize=8)
ax[1].set_title(f"HBM traffic vs sequence length (d={d})")
ax[2].loglog(ds, [sum(standard_io(4096, dd)) for dd in ds], "o-", label="standard")
ax[2].loglog(ds, [sum(flash_io(4096, dd, M_A100)) for dd in ds], "s-", label=f"FlashAttention, M={M_A100}")
ax[2].axvline(math.sqrt(M_A100), color="gray", ls=":", lw=1, label="d = √M")
ax[2].set_xlabel("head dim d"); ax[2].set_ylabel("HBM accesses (elements)"); ax[2].legend(fontsize=8)
ax[2].set_title("HBM traffic vs head dim (N=4096)")
for a in ax:
    a.grid(True, which="both", alpha=0.3)
plt.tight_layout(); plt.show()
""")

nb.md("""
Both are quadratic in N — FlashAttention does not change the FLOPs or the asymptotic order in N. What it
changes is the constant: `~12·d²/M` (here ≈ 0.5) instead of 4 accesses per score, and that constant shrinks
as SRAM grows (slope −1 in M) while the standard algorithm cannot use more SRAM at all. Flash's traffic
grows as d², so the saving shrinks as d grows — but for the head dims models use, d = 64–128, d² is far
below M (the paper's point: "for typical values of d (64–128) and M (around 100KB), d² is many times
smaller than M"). The table above shows what that means in this model: a large saving at d = 64, a smaller
one at d = 128, and a break-even at the d printed under it — where d²/M is still well below 1, because flash
pays about 12·d²/M accesses per score against the standard algorithm's 4, so the two meet near d² ≈ M/3
(not at d² ≈ M). Limits of this model: it counts elements, not bytes or
time; it assumes the standard algorithm streams each pass through HBM (no L2 reuse, no fusion of its
steps), and it ignores L2 caches altogether — real GPUs keep some of S in L2, which narrows the gap at small N.

Check: `pytest weeks/17 -k "ex05 or ex06"`.
""")

nb.md("""
**Derive it (written).** From your `flash_io`, derive the leading term of FlashAttention's traffic for
large N: how many key blocks T_c there are in terms of N, d and M, what each key block costs, and so the
total to leading order. Then say what it predicts when M doubles and when d doubles. The cell after your
answer compares your leading term with the exact count.
""")

nb.answer("derive_flash_io", """
*Model answer:* B_c = ⌈M/4d⌉ ≈ M/(4d) key rows per block, so T_c = ⌈N/B_c⌉ ≈ 4Nd/M key blocks. For each
key block every query block reads Q_i, O_i (2Nd in all) and ℓ_i, m_i (2N) and writes O_i, ℓ_i, m_i back (Nd + 2N):
≈ 3Nd per key block once d ≫ 1, plus K and V once (2Nd) and the initial write (Nd + 2N), which are lower order.
Total ≈ T_c · 3Nd ≈ 12·N²·d²/M — Θ(N²d²/M), Theorem 2. Doubling M halves it; doubling d quadruples it.
Per score (N² of them) that is ≈ 12d²/M accesses, against ≈ 4 for standard attention (2N² writes and 2N² reads
of S and P).

**Mark scheme (2 points).** 1 point: T_c ≈ 4Nd/M from B_c ≈ M/4d. 1 point: ≈ 3Nd of traffic per key block,
hence ≈ 12N²d²/M in total (a constant other than 12 with a correct derivation of its terms: full marks;
Θ(N²d²/M) without the constant: ½), with the M and d scalings.
""", points=2)

nb.code("""
print(f"{'N':>6} {'d':>4} {'M':>8} {'flash_io total':>15} {'12·N²·d²/M':>13} {'ratio':>6}")
for n_, d_, m_ in [(4096, 64, 98_304), (65_536, 64, 98_304), (65_536, 128, 98_304), (65_536, 64, 2 ** 20)]:
    exact, approx = sum(flash_io(n_, d_, m_)), 12 * n_ ** 2 * d_ ** 2 / m_
    print(f"{n_:>6} {d_:>4} {m_:>8} {exact:>15,} {approx:>13,.0f} {exact / approx:>6.2f}")
""")

nb.md(r"""
## 5. The backward pass with recomputation

Training needs dQ, dK, dV. Autograd on `naive_attention` saves `P` (N×N) for the backward. FlashAttention
saves only `O` and the per-row logsumexp `lse` (O(N)), and **recomputes** each block of `P` when it
needs it. Work out, before you write the code:

- how one block of `P` is recomputed from the block's scores and the saved `lse`, with no max or sum to redo;
- the gradients, block by block, of `S = QKᵀ/√d`, `P = softmax(S)` (row-wise), `O = PV`: what each block pair
  `(i, j)` adds to `dQ_i`, `dK_j` and `dV_j` — using the softmax backward below, whose row term `D_i` you
  express through `O` and `dO` in the written derivation.

What a correct function keeps: the gradients of `naive_attention` (causal or not, `Nq ≠ Nk`), no product spanning
more than a block, the blocks causal masking skips skipped, `P` taken from the saved `lse` and `D` from the saved
`out` (the check feeds a shifted `lse` and a perturbed `out` and expects your result to move), every tensor you
make on `q.device`.
""")

nb.md("""
**Derive it (written).** The softmax backward is dS_ij = P_ij (dP_ij − Σ_k P_ik dP_ik). Show that the
subtracted term, D_i = Σ_k P_ik dP_ik, equals rowsum(dO_i ∘ O_i) — and say why that matters for memory.
""")

nb.answer("derive_delta", """
*Model answer:* dP = dO Vᵀ, so dP_ik = Σ_c dO_ic V_kc. Then
D_i = Σ_k P_ik Σ_c dO_ic V_kc = Σ_c dO_ic (Σ_k P_ik V_kc) = Σ_c dO_ic O_ic, because O = PV. So D_i needs only
the row's output and its gradient, O(d) numbers, instead of a full row of P and dP (O(N)): it can be computed
once before the loop, from the saved O, and no N×N matrix is ever needed.

**Mark scheme (2 points).** 1 point: the algebra — substitute dP = dO Vᵀ and swap the sums to get PV = O.
1 point: the consequence — D is computed from O and dO (saved / given), O(N·d) work and memory, so the backward
needs no full row of P or dP (and therefore a check can feed a perturbed O and see D change).
""", points=2)

nb.exercise("flash_attention_backward", '''
def flash_attention_backward(q, k, v, out, lse, dout, causal: bool = False, block_q: int = 128, block_k: int = 128):
    """(dq, dk, dv) from the forward's out and lse, recomputing P block by block. All tensors [B, H, N*, d], lse [B, H, Nq]."""
    ### BEGIN SOLUTION
    check_attention_shapes(q, k, v, causal)
    nq, nk, scale = q.shape[2], k.shape[2], q.shape[-1] ** -0.5
    offset = nk - nq
    in_dtype, acc_dtype = q.dtype, torch.promote_types(q.dtype, torch.float32)
    q, k, v, out, lse, dout = (t.to(acc_dtype) for t in (q, k, v, out, lse, dout))
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    delta = (dout * out).sum(dim=-1)  # D = rowsum(dO ∘ O), [B, H, Nq]: from the saved out
    for ks in range(0, nk, block_k):
        ke = min(ks + block_k, nk)
        kj, vj = k[:, :, ks:ke], v[:, :, ks:ke]
        for qs in range(0, nq, block_q):
            qe = min(qs + block_q, nq)
            if causal and ks > qe - 1 + offset:
                continue
            qi, doi = q[:, :, qs:qe], dout[:, :, qs:qe]
            s = (qi @ kj.transpose(-1, -2)) * scale
            if causal and ke - 1 > qs + offset:
                keep = (torch.arange(ks, ke, device=q.device)[None, :]
                        <= torch.arange(qs, qe, device=q.device)[:, None] + offset)
                s = s.masked_fill(~keep, float("-inf"))
            p = torch.exp(s - lse[:, :, qs:qe, None])  # recomputed probabilities, from the saved lse
            dv[:, :, ks:ke] += p.transpose(-1, -2) @ doi
            ds = p * (doi @ vj.transpose(-1, -2) - delta[:, :, qs:qe, None])
            dq[:, :, qs:qe] += (ds @ kj) * scale
            dk[:, :, ks:ke] += (ds.transpose(-1, -2) @ qi) * scale
    return dq.to(in_dtype), dk.to(in_dtype), dv.to(in_dtype)
    ### END SOLUTION

''')

nb.test("test_flash_attention_backward", """
check_flash_attention_backward(flash_attention_backward)
""", points=3)

nb.md(r"""
**The rule, now that your check passes** (Dao et al. Appendix B; FlashAttention-2 §3.1.2). Recompute
`P_ij = exp(S_ij − lse_i)` — exactly the forward's probabilities — and with `D_i = rowsum(dO_i ∘ O_i)`:

$$dV_j \mathrel{+}= P_{ij}^\top dO_i,\quad dP_{ij} = dO_i V_j^\top,\quad dS_{ij} = P_{ij}\circ(dP_{ij} - D_i),\quad
dQ_i \mathrel{+}= \tfrac{1}{\sqrt d}\, dS_{ij} K_j,\quad dK_j \mathrel{+}= \tfrac{1}{\sqrt d}\, dS_{ij}^\top Q_i.$$
""")

nb.md("""
Now make it usable by autograd: a `torch.autograd.Function` with `forward(ctx, q, k, v, causal, block_q,
block_k)` and `backward(ctx, dout)`, built on your two functions. What it must keep: `torch.autograd.gradcheck`
passes in float64; between forward and backward it holds nothing that grows as N² (decide what your backward
needs, and save only that); the backward runs your `flash_attention_backward` once and no autograd of its own.
What must `backward` return for the inputs that are not tensors?
""")

nb.exercise("FlashAttention", """
class FlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal=False, block_q=128, block_k=128):
        ### BEGIN SOLUTION
        out, lse = flash_attention_forward(q, k, v, causal, block_q, block_k)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.block_q, ctx.block_k = causal, block_q, block_k
        return out
        ### END SOLUTION

    @staticmethod
    def backward(ctx, dout):
        ### BEGIN SOLUTION
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = flash_attention_backward(q, k, v, out, lse, dout, ctx.causal, ctx.block_q, ctx.block_k)
        return dq, dk, dv, None, None, None
        ### END SOLUTION
""")

nb.test("test_FlashAttention", """
check_FlashAttention(FlashAttention)
""", points=2)

nb.md("""
**Now that your check passes:** the forward saves `q, k, v, out, lse` (O(N·d), never P) and the block sizes on
`ctx`; the backward returns `(dq, dk, dv, None, None, None)` — one entry per input of `forward`, `None` for the
non-tensors.
""")

nb.code("""
# Training memory: forward + backward, naive (autograd saves P) vs FlashAttention (saves O and lse).
n = 2048
q, k, v = torch.randn(3, 1, 8, n, 64).unbind(0)
for name, fn in [("naive", lambda q, k, v: naive_attention(q, k, v, causal=True)),
                 ("FlashAttention", lambda q, k, v: FlashAttention.apply(q, k, v, True, 256, 256))]:
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    with TensorMemoryMeter() as meter:
        fn(qg, kg, vg).sum().backward()
    print(f"{name:15s} forward+backward at N={n}: peak {meter.peak / 1e6:7.1f} MB")
""")

nb.md("""
Check: `pytest weeks/17 -k "ex07 or ex08"`.
""")

nb.md(r"""
## 6. One query, many keys: split-K (flash-decoding)

In a decode step `Nq = 1`. The tiled forward parallelizes over batch, heads and *query blocks*; with one
query there is one block per head, and `B·H` is far smaller than a GPU's ~100+ SMs. Flash-decoding (Dao,
Haziza, Massa, Sizov 2023) splits the **keys** instead: each of `n_splits` chunks is attended
independently, giving a partial output `o_s` (normalized over its own chunk) and its logsumexp `lse_s`, and
the partials are merged into exactly the attention over all keys.

**Exercise 9a.** Write `merge_partials(outs, lses) -> (out, lse)`: `outs` is a list of `S` tensors
`[B, H, Nq, d]`, `lses` a list of `S` tensors `[B, H, Nq]`. Derive the merge: what is the logsumexp of the
union of disjoint key sets, given each set's? And since each `o_s` is a softmax-weighted average over its own
keys, what weight does it get in the average over all keys? Two things break a formula written naively:
logsumexps of size 1e4 (`exp` overflows: subtract the largest `lse_s` first, as in §2), and a chunk with
**no keys** (more splits than keys), whose `lse_s` is `-inf` and whose `o_s` is 0 — it must contribute
nothing, not NaN. Return `out` in the dtype of the `outs`, and `lse` in float32 (or wider).

""")

nb.exercise("merge_partials", '''
def merge_partials(outs: list, lses: list) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge attention over disjoint key sets: (out, lse) of all keys from each set's (out_s, lse_s)."""
    ### BEGIN SOLUTION
    acc_dtype = torch.promote_types(outs[0].dtype, torch.float32)
    lse_all = torch.stack([s.to(acc_dtype) for s in lses])  # [S, B, H, Nq]
    top = lse_all.amax(dim=0)
    top = torch.where(torch.isinf(top), torch.zeros_like(top), top)  # every part empty: avoid -inf - -inf
    w = torch.exp(lse_all - top)  # [S, B, H, Nq], 0 for empty parts, no overflow
    total = w.sum(dim=0)
    lse = top + torch.log(total)
    w = w / torch.where(total == 0, torch.ones_like(total), total)
    parts = torch.stack([o.to(acc_dtype) for o in outs])  # [S, B, H, Nq, d]
    parts = torch.where(w[..., None] > 0, parts, torch.zeros_like(parts))
    return (w[..., None] * parts).sum(dim=0).to(outs[0].dtype), lse
    ### END SOLUTION

''')

nb.test("test_merge_partials", """
check_merge_partials(merge_partials)

""", points=1)

nb.md(r"""
**The rule, now that your check passes:**

$$\mathrm{lse} = \log\sum_s e^{\mathrm{lse}_s},\qquad o = \sum_s e^{\mathrm{lse}_s - \mathrm{lse}}\, o_s.$$

`exp(lse_s - lse)` is the share of the total softmax mass that chunk holds; computed as `exp(lse_s - max_s lse_s)`
normalized, it never overflows, and an empty chunk's `-inf` gives it weight 0.
""")

nb.md("""
**Exercise 9b.** Write `flash_decode(q, k, v, n_splits)`, from the functions you have. What it must keep: it
equals attention over all `Nk` keys (no mask: a decode query sees every cached key); the keys are handled in
`n_splits` contiguous chunks as even as they can be (sizes differing by at most one), and the check looks at the
matrix products your code runs: none may span more keys than one chunk holds; more splits than keys must work.

""")

nb.exercise("flash_decode", '''
def flash_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n_splits: int = 4) -> torch.Tensor:
    """Attention of q [B, H, Nq, d] over all of k, v [B, H, Nk, d], computed in n_splits key chunks merged by logsumexp."""
    ### BEGIN SOLUTION
    nk = k.shape[2]
    bounds = [i * nk // n_splits for i in range(n_splits + 1)]  # even chunks; empty ones when n_splits > nk
    outs, lses = [], []
    for start, end in zip(bounds[:-1], bounds[1:]):
        o, s = flash_attention_forward(q, k[:, :, start:end], v[:, :, start:end], block_k=max(end - start, 1))
        outs.append(o)  # an empty chunk gives o = 0, lse = -inf
        lses.append(s)
    return merge_partials(outs, lses)[0]
    ### END SOLUTION

''')

nb.test("test_flash_decode", """
check_flash_decode(flash_decode)
""", points=2)

nb.md("""
**Now that your check passes:** the chunk bounds `i·Nk // n_splits` for `i = 0 … n_splits` (empty chunks when
`n_splits > Nk`), each chunk attended by your `flash_attention_forward` (one key block per chunk), the partials
merged by your `merge_partials`.
""")

nb.code("""
q = torch.randn(1, 8, 1, 64)
k, v = torch.randn(2, 1, 8, 4096, 64).unbind(0)
for s in [1, 4, 16, 64]:
    print(f"n_splits={s:3d}: max |flash_decode - naive| = {(flash_decode(q, k, v, s) - naive_attention(q, k, v)).abs().max():.2e}")
""")

nb.md("""
Check: `pytest weeks/17 -k "ex09 or ex10"`.
""")

nb.md("""
## 7. On the real model

SmolLM2's attention calls `model.attention_fn(q, k, v, causal=True)` with 9 query heads and 3 KV heads.
`expand_kv` repeats each KV head for its query group, so your function plugs in as it is.
""")

nb.code("""
from lib.modeling.llama import load_smollm2

model, tok = load_smollm2()  # on CUDA when there is one
ids = tok("FlashAttention computes exact attention without ever writing the full score matrix to memory. "
          "It tiles the queries and keys, keeps a running max and sum per row, and", return_tensors="pt").input_ids.to(model.device)
default_fn = model.attention_fn

def my_flash(q, k, v, causal=False):
    return flash_attention_forward(q, k, v, causal=causal, block_q=16, block_k=16)[0]  # small blocks: several per row

with torch.no_grad():
    ref_logits = model(ids)
    model.attention_fn = expand_kv(my_flash)
    flash_logits = model(ids)
    model.attention_fn = default_fn
err = (flash_logits - ref_logits).abs().max().item()
print(f"{ids.shape[1]} tokens; max |logits(flash) - logits(default)| = {err:.2e}; "
      f"same greedy next token: {bool((flash_logits[0, -1].argmax() == ref_logits[0, -1].argmax()).item())}")
assert err < 1e-3
""")

nb.md("""
### Beyond the anchors: split-K decoding that reads each KV head once

SmolLM2 has 9 query heads and 3 KV heads. `expand_kv` makes your `flash_decode` work by repeating every KV
head for its 3 query heads — a copy, and 3× the K/V bytes through the attention. The copy is avoidable: fold
each group's query heads into the **query axis** (`q [B, 9, 1, d] → [B, 3, 3, d]`): one decode step is then 3
queries against one KV head, which `flash_decode` already handles (`lib.attn.attention.flash_decode_gqa`). We decode
8 tokens both ways and count the bytes of the K/V operands of the attention matmuls in one layer's decode step
(`grader.checks.observe` records every matmul's shapes).
""")

nb.code("""
from grader.checks import observe
from lib.attn.attention import gqa_attention
from lib.modeling.generate import generate as lib_generate


def decode_backend(packed: bool):
    def fn(q, k, v, causal=True):
        if q.shape[2] > 1:  # the prefill: ordinary causal attention
            return gqa_attention(q, k, v, causal=causal)
        if not packed:  # repeat each KV head for its query heads
            return expand_kv(lambda q, k, v, causal=False: flash_decode(q, k, v, n_splits=4))(q, k, v)
        b, h, nq, d = q.shape
        hkv = k.shape[1]
        return flash_decode(q.reshape(b, hkv, (h // hkv) * nq, d), k, v, n_splits=4).reshape(b, h, nq, d)
    return fn


prompt = ids[:, :12]
tokens = {packed: lib_generate(model.with_attention(decode_backend(packed)), prompt, 8) for packed in (False, True)}
default_tokens = lib_generate(model, prompt, 8)
print(f"8 greedy tokens identical — expanded vs packed: {torch.equal(tokens[False], tokens[True])}, "
      f"packed vs the default attention: {torch.equal(tokens[True], default_tokens)}")
# One layer's decode step at 512 cached positions, SmolLM2's shapes: bytes of the K/V operands of the attention matmuls.
cfg = model.config
q1 = torch.randn(1, cfg.n_heads, 1, cfg.head_dim, device=model.device)
k1, v1 = torch.randn(2, 1, cfg.n_kv_heads, 512, cfg.head_dim, device=model.device).unbind(0)
kv_bytes = {}
for packed in (False, True):
    _, obs = observe(decode_backend(packed), q1, k1, v1)
    kv_bytes[packed] = sum(math.prod(b) * 4 for _, b in obs.matmuls)  # QKᵀ reads K, PV reads V
print(f"K/V bytes through the attention matmuls, one layer, 512 positions: expanded {kv_bytes[False]:,} B, "
      f"packed {kv_bytes[True]:,} B ({kv_bytes[False] / kv_bytes[True]:.1f}× fewer; ×{cfg.n_layers} layers per token)")
""")

nb.md("""
### Time and memory on this CPU

Three implementations of the same attention, `B=1, H=8, d=64`, causal: your `naive_attention`, your
`flash_attention_forward` (blocks of 128) and PyTorch's fused `scaled_dot_product_attention`
(`is_causal=True`; for Nq = Nk its top-left mask is ours). Timings are
the best of a few runs, taken in this one run of the notebook; other work on the machine moves them, so
read the ratios.
""")

nb.code("""
def best_time(fn, repeats=2):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter(); fn(); times.append(time.perf_counter() - t0)
    return min(times)

impls = {"naive": lambda q, k, v: naive_attention(q, k, v, causal=True),
         "tiled": lambda q, k, v: flash_attention_forward(q, k, v, causal=True)[0],
         "SDPA": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)}  # square: same mask
time_ns = [256, 512, 1024, 2048]
times = {name: [] for name in impls}
with torch.no_grad():
    for n in tqdm(time_ns, desc="timing"):
        q, k, v = torch.randn(3, 1, 8, n, 64).unbind(0)
        for name, fn in impls.items():
            times[name].append(best_time(lambda: fn(q, k, v)))
for i, n in enumerate(time_ns):
    print(f"N={n:5d}: naive {times['naive'][i] * 1e3:7.1f} ms, tiled {times['tiled'][i] * 1e3:7.1f} ms, "
          f"SDPA {times['SDPA'][i] * 1e3:6.1f} ms  |  tiled/naive {times['tiled'][i] / times['naive'][i]:4.1f}×, "
          f"naive/SDPA {times['naive'][i] / times['SDPA'][i]:4.1f}×, tiled/SDPA {times['tiled'][i] / times['SDPA'][i]:4.1f}×")
plt.figure(figsize=(5, 3.5))
for name in impls:
    plt.loglog(time_ns, [t * 1e3 for t in times[name]], "o-", label=name)
plt.xlabel("N"); plt.ylabel("time (ms)"); plt.title("causal attention, B=1, H=8, d=64, this CPU")
plt.legend(); plt.grid(True, which="both", alpha=0.3); plt.show()
""")

nb.md("""
**Peak memory at N = 4096** (the milestone: tiled ≤ 1/10 of naive). Measured twice: by counting tensor
allocations in this process, and — for the reference implementations in `lib.attn.attention` and for SDPA — by the
operating system's peak RSS of a fresh process (`io_model.peak_rss_delta`: it resets the kernel's
high-water mark `VmHWM` just before the call). RSS sees only the CPU's memory; where the model is on a GPU the cell
also runs both on it and reads the CUDA allocator's peak (`torch.cuda.max_memory_allocated`, after
`torch.cuda.reset_peak_memory_stats`) — `peak_bytes` picks the meter by the tensors' device.
""")

nb.code("""
def peak_bytes(fn, *args):
    \"\"\"Peak bytes allocated while fn(*args) runs, beyond what was allocated before it: on a GPU the CUDA
    allocator's own high-water mark, on a CPU the tensor meter (the same quantity, counted per op).\"\"\"
    if args[0].device.type == "cuda":
        torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        fn(*args)
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - before
    with TensorMemoryMeter() as meter:
        fn(*args)
    return meter.peak


n = 4096
q, k, v = torch.randn(3, 1, 8, n, 64).unbind(0)
mem_impls = {"naive": lambda q, k, v: naive_attention(q, k, v, causal=True),
             # blocks of 256 here only to keep the meter's per-op cost down; 128 needs less memory still
             "tiled": lambda q, k, v: flash_attention_forward(q, k, v, causal=True, block_q=256, block_k=256)[0]}
peaks = {}
with torch.no_grad():
    for name, fn in tqdm(list(mem_impls.items()), desc="peak memory at N=4096"):
        peaks[name] = peak_bytes(fn, q, k, v)  # CPU tensors: the tensor meter
rss = {name: io_model.peak_rss_delta(f, 1, 8, n, 64, causal=True) for name, f in
       tqdm([("naive", "naive_attention"), ("tiled", "flash_attention"), ("SDPA", "scaled_dot_product_attention")],
            desc="peak RSS, fresh processes")}
print(f"score matrix alone: {score_bytes(1, 8, n, n) / 1e6:.0f} MB; output: {score_bytes(1, 8, n, 64) / 1e6:.1f} MB")
for name in rss:
    counted = f"{peaks[name] / 1e6:8.1f} MB" if name in peaks else "     (n/a)"  # SDPA's buffers live inside one op
    print(f"{name:6s}: tensors {counted}   process RSS {rss[name] / 1e6:8.1f} MB")
ratio = peaks["naive"] / peaks["tiled"]

# The headline as a picture: tiled peak memory against N, next to naive (tensor-counted, same blocks of 256).
tiled_peak = {}
with torch.no_grad():
    for m_n in tqdm(mem_ns[:-1], desc="tiled, peak memory"):
        qm, km, vm = torch.randn(3, 1, 8, m_n, 64).unbind(0)
        tiled_peak[m_n] = peak_bytes(mem_impls["tiled"], qm, km, vm)
tiled_peak[n] = peaks["tiled"]
plt.figure(figsize=(5.5, 3.6))
plt.loglog(mem_ns, [naive_peak[m_n] / 1e6 for m_n in mem_ns], "o-", label="naive (S and P materialized)")
plt.loglog(mem_ns, [tiled_peak[m_n] / 1e6 for m_n in mem_ns], "s-", label="tiled, blocks of 256")
plt.loglog(mem_ns, [score_bytes(1, 8, m_n, 64) / 1e6 for m_n in mem_ns], "k:", label="the output alone, B·H·N·d·4 bytes")
plt.xlabel("N (sequence length)"); plt.ylabel("peak tensor memory (MB)")
plt.title("attention peak memory, B=1, H=8, d=64"); plt.legend(fontsize=8); plt.grid(True, which="both", alpha=0.3)
plt.show()
print(f"naive / tiled peak memory: {ratio:.0f}× (tensors), {rss['naive'] / max(rss['tiled'], 1):.0f}× (RSS)")
assert peaks["tiled"] <= peaks["naive"] / 10
if model.device.type == "cuda":  # the same calls on the model's GPU, read from torch.cuda.max_memory_allocated
    with torch.no_grad():
        gpu_peaks = {name: peak_bytes(fn, *(t.to(model.device) for t in (q, k, v))) for name, fn in mem_impls.items()}
    print(f"on {model.device} (CUDA allocator): " + ", ".join(f"{name} {b / 1e6:.1f} MB" for name, b in gpu_peaks.items())
          + f"; naive / tiled {gpu_peaks['naive'] / gpu_peaks['tiled']:.0f}×")
""")

nb.md("""
### Predict, then measure: peak memory

**Exercise 17.** Before measuring more, write a model: `predict_peak_bytes(n, d, block, dtype_bytes, batch,
heads, tiled)` returns the peak bytes of the tensors one **non-causal** forward allocates (`q`, `k`, `v` exist
before the call and do not count), for your `naive_attention` (`tiled=False`; `block` unused) or your
`flash_attention_forward` with `block_q = block_k = block` (`tiled=True`), on `[batch, heads, n, d]` inputs of
`dtype_bytes` per element. Think about what is alive at the same moment, which tensors have the input's dtype and
which are float32, and what grows with `n`. The check grades your model on configurations it draws (its seed
printed), far larger than this machine could run; it accepts a band, since a tiled loop's few block-sized
temporaries differ from one way of writing it to another. Then the cell below measures your own two functions
beside your prediction.
""")

nb.exercise("predict_peak_bytes", '''
def predict_peak_bytes(n: int, d: int, block: int, dtype_bytes: int, batch: int, heads: int, tiled: bool) -> int:
    """Predicted peak bytes of one non-causal attention forward (naive or tiled), inputs not counted."""
    ### BEGIN SOLUTION
    bh = batch * heads
    if not tiled:
        return bh * (2 * n * n + n * d) * dtype_bytes  # S and P alive at once, then O
    out, lse = bh * n * d * dtype_bytes, bh * n * 4
    working = bh * 4 * (4 * block * block + 3 * block * d + 6 * block)  # float32 score blocks, acc, q block, m, l
    return out + lse + working
    ### END SOLUTION
''')

nb.test("test_predict_peak_bytes", """
check_predict_peak_bytes(predict_peak_bytes)
""", points=2)

nb.code("""
from lib.bench.timing import Conditions

conditions = Conditions.now()
print(f"{'':34s} {'predicted':>12s} {'measured':>12s} {'measured/predicted':>19s}")
with torch.no_grad():
    for n_, dtype, block in [(512, torch.float32, 128), (1024, torch.float32, 128), (2048, torch.float32, 128),
                             (1024, torch.bfloat16, 64)]:
        q, k, v = (torch.randn(1, 4, n_, 64, dtype=dtype) for _ in range(3))
        for tiled, fn in [(False, lambda: naive_attention(q, k, v)),
                          (True, lambda: flash_attention_forward(q, k, v, block_q=block, block_k=block))]:
            predicted = predict_peak_bytes(n_, 64, block, q.element_size(), 1, 4, tiled)
            measured = peak_bytes(lambda _: fn(), q)
            label = f"{'tiled' if tiled else 'naive'}, N={n_}, {str(dtype)[6:]}" + (f", blocks {block}" if tiled else "")
            print(f"{label:34s} {predicted / 1e6:10.2f} MB {measured / 1e6:10.2f} MB {measured / predicted:18.2f}")
print(conditions.done().line(), "(memory is counted, not timed: the load does not move it)")
""")

nb.md("""
Check: `pytest weeks/17 -k ex17`.
""")

nb.md("""
**The model, now that your check passes.** Naive: `S` is still alive when softmax writes `P`, so two
`B·H·N²` matrices of the input's dtype, plus the output `B·H·N·d`. Tiled: the output and the float32 logsumexp
(`B·H·N` each row), then a working set of a few float32 blocks (scores, their exponentials, the accumulator, a
query block) that depends on the block and `d`, never on `N`: the ratio naive / tiled grows linearly in N.
""")

nb.md("""
### Why is the tiled version slower than SDPA here?

Compare your numbers. Against naive attention the tiled loop can win or lose: it skips the blocks above the
diagonal and its tiles fit in the CPU's caches, but it pays Python and dispatcher overhead (~10 µs) for each
of ~10 ops per block, so at small N it loses. Against `scaled_dot_product_attention` it loses everywhere,
for a simple reason: the tiling saves memory traffic only if the tile *stays* in fast memory between the
operations on it. In pure PyTorch each line of the inner loop — matmul, max, exp, sum, rescale, matmul — is
a separate op that reads its inputs and writes a fresh `[B, H, 128, 128]` tensor back; with several threads
each op is also a separate parallel region ending in a barrier. SDPA on a CPU dispatches to a fused C++
kernel (a flash-attention-style blocked loop, vectorized, one parallel region over batch, heads and query
blocks) in which a block of scores lives in cache and registers from the first matmul to the final
accumulation — the thing our loop only imitates.

On a GPU the same holds with higher stakes: a fused kernel keeps `S` and `P` in SRAM and registers, and
the Θ(N²) HBM reads and writes of §4 are what it saves; FlashAttention reported 2–4× speed-ups over
standard attention for that reason (Dao et al. 2022, §4). Tiling in Python shows the *algorithm* and the
*memory* saving; the *speed* needs a fused kernel (CUDA, Triton, or C++ with intrinsics).
""")

nb.code("""
if torch.cuda.is_available():
    from torch.nn.attention import SDPBackend, sdpa_kernel
    q, k, v = torch.randn(3, 1, 8, 4096, 64, device="cuda", dtype=torch.float16).unbind(0)
    for backend in [SDPBackend.MATH, SDPBackend.FLASH_ATTENTION]:
        with sdpa_kernel(backend):
            torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(10):
                torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            end.record(); torch.cuda.synchronize()
            print(f"{backend.name:16s}: {start.elapsed_time(end) / 10:.2f} ms per call, N=4096 fp16")
else:
    print("No CUDA device on this machine: skipping the GPU timing of SDPA's flash backend.")
""")

nb.md(r"""
## 8. The kernel itself: FlashAttention in Triton

§3's loop is the algorithm; on a GPU it runs as **one kernel**, and the tiles live in registers and shared
memory instead of in tensors that PyTorch allocates for every op. Triton (Tillet, Kung, Cox 2019) lets you
write that kernel in Python. Its model, in five lines:

- a kernel is a function decorated with `@triton.jit`, launched as `kernel[grid](args...)`: one **program**
  runs for each point of `grid` (a tuple of up to 3 sizes); `tl.program_id(axis)` says which one it is;
- it works on **blocks**: `tl.arange(0, BLOCK)` is a block of offsets (`BLOCK` a power of two, a
  compile-time constant: an argument annotated `tl.constexpr`), and arithmetic, `tl.exp`, `tl.max(x, axis)`,
  `tl.sum`, `tl.where` and `tl.dot(a, b)` (an `[M, K]` block times a `[K, N]` block) act on whole blocks;
- a tensor passed to a kernel arrives as a **pointer** to its first element: `ptr + offsets` is a block of
  addresses, read by `tl.load(ptrs, mask=..., other=...)` and written by `tl.store(ptrs, values, mask=...)`;
  the `mask` switches off the lanes that hang over the end of the tensor (`other` is what a switched-off
  lane reads) — strides are yours to apply, so pass `x.stride(0)`, `x.stride(1)` as arguments;
- every operation on the data happens inside the kernel: the Python function around it (the *wrapper*)
  only checks shapes, allocates the outputs with `torch.empty(..., device=x.device)` and launches.

Without a GPU, `TRITON_INTERPRET=1` (set by the cell below on this machine) runs each program one after
another on the CPU, every `tl` operation done by numpy: thousands of times slower than a GPU, but the same
code, and exact enough to check. The checks watch the interpreter: the kernels you launched, the shape of
every `tl.dot` your programs ran, the addresses every `tl.load` and `tl.store` touched, your kernel's source,
the arguments of each launch, the values each program holds, and the torch ops of your wrapper — on every
call a check makes. So the answer computed with torch, numpy or a Python loop (or passed in as numbers), a
`tl.dot` wider than the blocks asked for, a load of more than a block, a block read twice, a score matrix or
running state kept in memory or held whole in a program, or products taken some other way than `tl.dot` (they
also rerun your kernel with every `tl.dot` product scaled by 1.25 and check the result moves as it must) fail
even when the numbers are right. Inside `@triton.jit` use `triton.language` only, as a GPU would require: no
numpy, no Python helpers (a helper must be `@triton.jit` itself); a kernel's arguments are tensors and the
scalars it needs (sizes, strides, a scale, block sizes). (On a GPU this notebook compiles your kernels, the interpreter is
not there to watch, and the check cells below judge the numbers and the wrapper; `pytest weeks/17` and the grader
run your kernels in the interpreter wherever it works, GPU machines included, so they judge all of the above.)
""")

nb.setup("""
import os

if not torch.cuda.is_available():  # no GPU: Triton's interpreter (numpy, on the CPU). Set before triton is first
    os.environ.setdefault("TRITON_INTERPRET", "1")  # imported — importing lib (the first cell) already did it
import triton
import triton.language as tl

from lib.attn.triton_attention import check_triton_attention_shapes  # ValueError naming the shapes the kernel cannot take
from lib.attn.triton_attention import interpreting, kernel_device  # kernel_device: ValueError for tensors on the wrong device
from grader.checks.week17 import check_softmax_rows, check_tiled_matmul, check_flash_attention_triton
""")

nb.md("""
A complete kernel first, to read rather than write: `out = x + y` for vectors of any length. One program
per block of 128 elements; the last block is masked.
""")

nb.code("""
print(f"triton {triton.__version__}: kernels are {'interpreted on the CPU' if interpreting() else 'compiled for the GPU'}")


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)  # this program's block of element indices
    inside = offsets < n  # the last program's block hangs over the end
    x = tl.load(x_ptr + offsets, mask=inside)
    y = tl.load(y_ptr + offsets, mask=inside)
    tl.store(out_ptr + offsets, x + y, mask=inside)


def vector_add(x, y, block=128):
    kernel_device(x, y)
    out = torch.empty_like(x)
    add_kernel[(triton.cdiv(x.numel(), block),)](x, y, out, x.numel(), BLOCK=block)
    return out


device = "cpu" if interpreting() else "cuda"
x, y = torch.randn(1000, device=device), torch.randn(1000, device=device)
print("vector_add == x + y:", torch.equal(vector_add(x, y), x + y), f"({triton.cdiv(1000, 128)} programs of 128)")
""")

nb.md(r"""
### A softmax per row

One program per row; the whole row is one block of `BLOCK = triton.next_power_of_2(cols)` lanes. Three
things to get right: the lanes past the end of the row must not change the result (what should a
switched-off lane read, for a max and for a sum of exponentials?); entries of size 1e4 must not overflow;
and the input may be a transposed view, so address element `(r, c)` as `x_ptr + r·stride₀ + c·stride₁`.
Compute in float32 (`.to(tl.float32)`) and store in the output's dtype (`out_ptr.dtype.element_ty`).
""")

nb.exercise("softmax_rows", '''
# Your @triton.jit kernel here, then the wrapper below that launches it.
### BEGIN SOLUTION
@triton.jit
def _softmax_kernel(x_ptr, out_ptr, n_cols, sx0, sx1, so0, so1, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    inside = cols < n_cols
    x = tl.load(x_ptr + row * sx0 + cols * sx1, mask=inside, other=float("-inf")).to(tl.float32)
    e = tl.exp(x - tl.max(x, axis=0))  # the -inf lanes give exp(-inf) = 0: they add nothing to the sum
    tl.store(out_ptr + row * so0 + cols * so1, (e / tl.sum(e, axis=0)).to(out_ptr.dtype.element_ty), mask=inside)
### END SOLUTION


def softmax_rows(x: torch.Tensor) -> torch.Tensor:
    """softmax over the last dimension of a 2-D tensor [rows, cols], one kernel program per row."""
    ### BEGIN SOLUTION
    kernel_device(x)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _softmax_kernel[(x.shape[0],)](x, out, x.shape[1], x.stride(0), x.stride(1), out.stride(0), out.stride(1),
                                   BLOCK=triton.next_power_of_2(x.shape[1]))
    return out
    ### END SOLUTION
''')

nb.test("test_softmax_rows", """
check_softmax_rows(softmax_rows)
""", points=2)

nb.md(r"""
### A tiled matrix product

`c = a @ b` for `a [M, K]`, `b [K, N]`: one program per `[block_m, block_n]` tile of `c` (a 2-D grid), which
walks along K `block_k` columns at a time — load a block of `a` and a block of `b`, `tl.dot` them, add into
a float32 accumulator — and stores its tile once at the end. M, N and K need not be multiples of the blocks
(what must a masked-off lane of `a` or `b` read so that the product is unchanged?). Raise `ValueError` when
the shapes cannot be multiplied. The check asks for blocks of 16 and 32 and watches the widest `tl.dot`.
""")

nb.exercise("tiled_matmul", '''
# Your @triton.jit kernel here, then the wrapper below that launches it.
### BEGIN SOLUTION
@triton.jit
def _matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, sam, sak, sbk, sbn, scm, scn,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(a_ptr + rm[:, None] * sam + rk[None, :] * sak, mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
        b = tl.load(b_ptr + rk[:, None] * sbk + rn[None, :] * sbn, mask=(rk[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc += tl.dot(a.to(tl.float32), b.to(tl.float32))
    tl.store(c_ptr + rm[:, None] * scm + rn[None, :] * scn, acc.to(c_ptr.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))
### END SOLUTION


def tiled_matmul(a: torch.Tensor, b: torch.Tensor, block_m: int = 16, block_n: int = 16,
                 block_k: int = 16) -> torch.Tensor:
    """a [M, K] @ b [K, N] -> [M, N] in a's dtype, one kernel program per output tile."""
    ### BEGIN SOLUTION
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"tiled_matmul takes a [M, K] and b [K, N]; got {tuple(a.shape)} and {tuple(b.shape)}")
    kernel_device(a, b)
    (m, k), n = a.shape, b.shape[1]
    c = torch.empty((m, n), dtype=a.dtype, device=a.device)
    _matmul_kernel[(triton.cdiv(m, block_m), triton.cdiv(n, block_n))](
        a, b, c, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k)
    return c
    ### END SOLUTION
''')

nb.test("test_tiled_matmul", """
check_tiled_matmul(tiled_matmul)
""", points=2)

nb.md("""
What did your kernel do? `observe` (the checks' instrument) records each launch and each `tl.dot` the
interpreter ran. Count them for a 100×200 by 200×60 product and compare with what you expect from the grid
and the K loop.
""")

nb.code("""
from grader.observe import observe

if interpreting():
    a, b = torch.randn(100, 200), torch.randn(200, 60)
    start = time.perf_counter()
    _, seen = observe(tiled_matmul, a, b, block_m=32, block_n=32, block_k=64)
    took = time.perf_counter() - start
    print(f"launches: {seen.kernel_launches}   tl.dot calls: {len(seen.kernel_dots)} of shapes {sorted(set(seen.kernel_dots))}")
    print(f"grid {math.ceil(100 / 32)}×{math.ceil(60 / 32)} programs × {math.ceil(200 / 64)} K blocks = "
          f"{math.ceil(100 / 32) * math.ceil(60 / 32) * math.ceil(200 / 64)} dots; FLOPs in tl.dot: "
          f"{seen.kernel_dot_flops():,} (2·M·K·N = {2 * 100 * 200 * 60:,}: the difference is masked padding)")
    loaded = seen.kernel.get("loaded", {})
    print(f"elements loaded: a {loaded.get('0', 0):,} = 100·200 × {math.ceil(60 / 32)} columns of programs, "
          f"b {loaded.get('1', 0):,} = 200·60 × {math.ceil(100 / 32)} rows of programs (masked lanes read nothing)")
    print(f"interpreted in {took:.2f} s")
""")

nb.md(r"""
### FlashAttention-2's forward as one kernel

Now §3 as a kernel, in FlashAttention-2's loop order: **one program per (block of `block_m` queries, batch·head)**
— a grid of `(cdiv(Nq, block_m), B·H)` — each looping over the keys `block_n` at a time. A program keeps its
query block, the running max `m`, the running sum `l` and the unnormalised output `acc` in registers (float32),
so nothing but `q`, `k`, `v` is read and nothing but `out` and `lse` is written.

What you must work out (§2 and §3 have the pieces; the kernel has no tensors to fall back on):

1. the offsets of the query block and of each key block for batch `b`, head `h` — from the strides you pass;
2. the scores of one block, `q · kᵀ / √d` with `tl.dot`, and which of them to set to `-inf`: keys past `Nk`,
   and with `causal=True` keys after the diagonal (bottom-right aligned: query `i` sees `j ≤ i + Nk − Nq`);
3. the online update of `m`, `l`, `acc` — and what to do for a row that has seen no key yet (`m = −∞`);
4. where the loop stops when `causal=True`, so that blocks wholly above the diagonal are never loaded;
5. the end: divide by `l` once, store `out` in q's dtype, and `lse = m + log l` (float32, `[B, H, Nq]`) — the one
   statistic a backward pass needs (§5).

Start with `check_triton_attention_shapes(q, k, v, causal)` (it also rejects head dims that are not a power of
two from 16 to 128) and `kernel_device(q, k, v)`.
""")

nb.exercise("flash_attention_triton", '''
# Your @triton.jit kernel here, then the wrapper below that launches it.
### BEGIN SOLUTION
@triton.jit
def _flash_kernel(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, sqb, sqh, sqm, sqd, skb, skh, skn, skd,
                  svb, svh, svn, svd, sob, soh, som, sod, H, NQ, NK, scale,
                  D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    start_m = tl.program_id(0) * BLOCK_M
    b, h = tl.program_id(1) // H, tl.program_id(1) % H
    rows = start_m + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, D)
    q = tl.load(q_ptr + b * sqb + h * sqh + rows[:, None] * sqm + dims[None, :] * sqd, mask=rows[:, None] < NQ,
                other=0.0).to(tl.float32)
    m = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    l = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, D), dtype=tl.float32)
    end = NK
    if CAUSAL:  # the last row of this block sees keys up to start_m + BLOCK_M - 1 + NK - NQ
        end = tl.minimum(NK, start_m + BLOCK_M + NK - NQ)
    for start_n in range(0, end, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        kt = tl.load(k_ptr + b * skb + h * skh + cols[None, :] * skn + dims[:, None] * skd, mask=cols[None, :] < NK,
                     other=0.0).to(tl.float32)  # [D, BLOCK_N]: k transposed by its addresses
        s = tl.dot(q, kt) * scale
        keep = cols[None, :] < NK
        if CAUSAL:
            keep = keep & (cols[None, :] <= rows[:, None] + (NK - NQ))
        s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # no key yet: exp(-inf - 0) = 0, not NaN
        p = tl.exp(s - m_safe[:, None])
        alpha = tl.exp(m - m_safe)
        v = tl.load(v_ptr + b * svb + h * svh + cols[:, None] * svn + dims[None, :] * svd, mask=cols[:, None] < NK,
                    other=0.0).to(tl.float32)
        l = l * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p, v)
        m = m_new
    tl.store(o_ptr + b * sob + h * soh + rows[:, None] * som + dims[None, :] * sod,
             (acc / l[:, None]).to(o_ptr.dtype.element_ty), mask=rows[:, None] < NQ)
    tl.store(lse_ptr + tl.program_id(1) * NQ + rows, m + tl.log(l), mask=rows < NQ)
### END SOLUTION


def flash_attention_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                           block_m: int = 16, block_n: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashAttention-2's forward in one Triton kernel: (out [B, H, Nq, d] in q's dtype, lse [B, H, Nq] float32)."""
    ### BEGIN SOLUTION
    check_triton_attention_shapes(q, k, v, causal)
    kernel_device(q, k, v)
    bsz, heads, nq, d = q.shape
    out = torch.empty_like(q)
    lse = torch.empty((bsz, heads, nq), dtype=torch.float32, device=q.device)
    _flash_kernel[(triton.cdiv(nq, block_m), bsz * heads)](
        q, k, v, out, lse, *q.stride(), *k.stride(), *v.stride(), *out.stride(), heads, nq, k.shape[2], d ** -0.5,
        D=d, BLOCK_M=block_m, BLOCK_N=block_n, CAUSAL=causal)
    return out, lse
    ### END SOLUTION
''')

nb.test("test_flash_attention_triton", """
check_flash_attention_triton(flash_attention_triton)
""", points=4)

nb.md("""
Your kernel against your §3 function and the library, on this machine: the same numbers, and — under the
interpreter — the work it did, counted. The causal pass should run a little over half the `tl.dot` FLOPs of the
full one (the blocks wholly above the diagonal are skipped). On a GPU the cell times the three instead.
""")

nb.code("""
B, H, N, D = 1, 4, 256, 64
q, k, v = (torch.randn(B, H, N, D, device=device) for _ in range(3))
mine, lse = flash_attention_triton(q, k, v, causal=True, block_m=32, block_n=32)
sdpa = F.scaled_dot_product_attention(q, k, v, is_causal=True)
tiles, _ = flash_attention_forward(q, k, v, causal=True, block_q=32, block_k=32)
print(f"max |triton - SDPA| = {(mine - sdpa).abs().max():.2e}   max |triton - §3 tiles| = {(mine - tiles).abs().max():.2e}")
if interpreting():
    counts = {}
    for causal in (False, True):
        start = time.perf_counter()
        _, seen = observe(flash_attention_triton, q, k, v, causal=causal, block_m=32, block_n=32)
        counts[causal] = seen.kernel_dot_flops()
        print(f"causal={causal!s:5}: {len(seen.kernel_dots):4d} tl.dots, {counts[causal] / 1e6:6.1f} MFLOP, "
              f"interpreted in {time.perf_counter() - start:.1f} s")
    t = N // 32
    print(f"causal / full = {counts[True] / counts[False]:.3f}; blocks on or below the diagonal: "
          f"{t * (t + 1) // 2} of {t * t} = {(t + 1) / (2 * t):.3f}")
else:
    def cuda_ms(fn, reps=20):
        fn(); torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record(); torch.cuda.synchronize()
        return start.elapsed_time(end) / reps

    for n in (1024, 4096):
        q, k, v = (torch.randn(1, 16, n, 64, device="cuda", dtype=torch.float16) for _ in range(3))
        print(f"N={n}: triton {cuda_ms(lambda: flash_attention_triton(q, k, v, causal=True, block_m=64, block_n=64)):.3f} ms, "
              f"SDPA {cuda_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)):.3f} ms, "
              f"§3 tiles {cuda_ms(lambda: flash_attention_forward(q, k, v, causal=True, block_q=128, block_k=128), 3):.3f} ms")
""")

nb.md("""
**Stretch (not graded): the backward kernel.** FlashAttention-2's backward is two kernels: one program per
key block accumulates `dK` and `dV` over the query blocks, recomputing `P = exp(S − lse)` from the `lse` your
forward saved, with `D = rowsum(dO ∘ O)` computed first by a small kernel; `dQ` comes from a loop over key blocks
per query block (or atomic adds). §5's `flash_attention_backward` is the same algorithm in PyTorch tiles: port
it, and compare with `torch.autograd` on `naive_attention` in float64.

Check this section: `pytest weeks/17 -k "ex11 or ex12 or ex13"`.
""")

nb.md("""
## 9. Check your understanding

**Q1.** How many MB (10⁶ bytes) is the fp32 score matrix of shape `[8, 8, 1024, 1024]`? Return it from
`answer_q1`.

**Q2.** A causal prefill of N = 4096 tokens with `block_q = block_k = 128`: how many (query block, key
block) pairs does your tiled forward compute (per batch element and head)?

**Q3.** Split-K decoding with head dim 1 produced two partial results: chunk A with output 1.0 and
logsumexp 0, chunk B with output 5.0 and logsumexp ln 3. What is the merged output?
""")

nb.exercise("answer_q1", """
def answer_q1() -> float:
    ### BEGIN SOLUTION
    return 8 * 8 * 1024 * 1024 * 4 / 1e6
    ### END SOLUTION
""")

nb.test("test_answer_q1", """
check_answer_q1(answer_q1)
""", points=1)

nb.code("""
print(f"N = 1024: {score_bytes(8, 8, 1024, 1024) / 1e6:.0f} MB   (seed: '70 MB vs 7 MB' — does not follow from its own shape)")
print(f"  (it is 4096²/1024² = 16× less than at 4096, not 60×; FlashAttention's O(N·d) state at 1024 — Q, K, V, O of "
      f"[8, 8, 1024, 64] — is {4 * score_bytes(8, 8, 1024, 64) / 1e6:.0f} MB)")
""")

nb.exercise("answer_q2", """
def answer_q2() -> int:
    ### BEGIN SOLUTION
    t = 4096 // 128
    return t * (t + 1) // 2
    ### END SOLUTION
""")

nb.test("test_answer_q2", """
check_answer_q2(answer_q2)
""", points=1)

nb.exercise("answer_q3", """
def answer_q3() -> float:
    ### BEGIN SOLUTION
    lse = math.log(math.exp(0.0) + math.exp(math.log(3.0)))  # ln 4
    return math.exp(0.0 - lse) * 1.0 + math.exp(math.log(3.0) - lse) * 5.0
    ### END SOLUTION
""")

nb.test("test_answer_q3", """
check_answer_q3(answer_q3)
""", points=1)

nb.md("""
**Q4 (written).** Your tiled forward allocates far less memory than `naive_attention` but is much slower than
`scaled_dot_product_attention` on this CPU. Using your measurements in §7 and your counts in §4, explain in a few sentences (a) where the
time goes in your implementation, and (b) what a fused GPU kernel changes, in terms of the HBM accesses you
counted. Also say when, by your §4 formulas, FlashAttention's traffic advantage shrinks.
""")

nb.answer("q4_written", """
*Model answer (the release replaces this cell with "YOUR ANSWER HERE"):* (a) each block runs ~10 separate
ops, each a dispatch with Python overhead (and, multithreaded, a barrier) that reads and writes a fresh
block tensor; small matmuls use BLAS less well than one large one; nothing is fused, so the tile does not
stay in fast memory between ops and much of the traffic the algorithm could save is not saved; SDPA's fused
C++ kernel does the same blocked loop in one pass. (b) A fused
kernel keeps S and P on chip, so HBM sees only Q, K, V, O (K and V read once; Q, O, ℓ, m once per key
block): Θ(N²d²/M) instead of Θ(Nd + N²) — about 12d²/M accesses per score instead of 4, ≈ 7× fewer at
N = 4096, d = 64, M ≈ 98K. The advantage shrinks as d grows (traffic ∝ d²) or as M shrinks; for d = 64–128
and M ≈ 100K elements d² ≪ M, so it is large in practice.

**Mark scheme (3 points).** (a) 1 point: the time goes to per-op overhead and unfused ops — each block runs
~10 separate PyTorch ops (dispatch/Python overhead, a fresh tensor written and re-read each time), so the tile
does not stay in fast memory; "Python is slow" alone gets ½. (b) 1 point: a fused kernel keeps S and P in
SRAM/registers, so HBM traffic is only Q, K, V, O (and ℓ, m): Θ(N²d²/M) against Θ(Nd + N²) — naming the N²
reads and writes of S and P that disappear, with a number from §4 (e.g. ≈ 7× fewer accesses at N = 4096,
d = 64, M ≈ 98K) for full marks. (c) 1 point: the advantage shrinks when d²/M grows (larger head dim or smaller
SRAM), with the §4 formula (T_c = ⌈N/B_c⌉, B_c = ⌈M/4d⌉); no point for "when N is small" without the d²/M
argument. Not credited: claiming FlashAttention reduces FLOPs or changes the N² order.
""", points=3)

nb.md("""
## Further reading

- Dao, Fu, Ermon, Rudra, Ré, *FlashAttention: Fast and Memory-Efficient Exact Attention with IO-Awareness*,
  NeurIPS 2022 — Algorithm 1, Theorem 2 (IO complexity), Appendix B (backward).
- Dao, *FlashAttention-2: Faster Attention with Better Parallelism and Work Partitioning*, 2023 — the loop order used in §3, the logsumexp backward.
- Milakov & Gimelshein, *Online normalizer calculation for softmax*, 2018.
- Dao, Haziza, Massa, Sizov, *Flash-Decoding for long-context inference*, 2023 (PyTorch blog / Stanford CRFM).
""")

if __name__ == "__main__":
    nb.write(str(REPO / 'solutions/17/week17_flash_attention.ipynb'))
    print("wrote solutions/17/week17_flash_attention.ipynb")
