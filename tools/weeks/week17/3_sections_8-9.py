# %% [markdown]
# ## 8. The kernel itself: FlashAttention in Triton
#
# §3's loop is the algorithm; on a GPU it runs as **one kernel**, and the tiles live in registers and shared
# memory instead of in tensors that PyTorch allocates for every op. Triton (Tillet, Kung, Cox 2019) lets you
# write that kernel in Python. Its model, in five lines:
#
# - a kernel is a function decorated with `@triton.jit`, launched as `kernel[grid](args...)`: one **program**
#   runs for each point of `grid` (a tuple of up to 3 sizes); `tl.program_id(axis)` says which one it is;
# - it works on **blocks**: `tl.arange(0, BLOCK)` is a block of offsets (`BLOCK` a power of two, a
#   compile-time constant: an argument annotated `tl.constexpr`), and arithmetic, `tl.exp`, `tl.max(x, axis)`,
#   `tl.sum`, `tl.where` and `tl.dot(a, b)` (an `[M, K]` block times a `[K, N]` block) act on whole blocks;
# - a tensor passed to a kernel arrives as a **pointer** to its first element: `ptr + offsets` is a block of
#   addresses, read by `tl.load(ptrs, mask=..., other=...)` and written by `tl.store(ptrs, values, mask=...)`;
#   the `mask` switches off the lanes that hang over the end of the tensor (`other` is what a switched-off
#   lane reads) — strides are yours to apply, so pass `x.stride(0)`, `x.stride(1)` as arguments;
# - every operation on the data happens inside the kernel: the Python function around it (the *wrapper*)
#   only checks shapes, allocates the outputs with `torch.empty(..., device=x.device)` and launches.
#
# Without a GPU, `TRITON_INTERPRET=1` (set by the cell below on this machine) runs each program one after
# another on the CPU, every `tl` operation done by numpy: thousands of times slower than a GPU, but the same
# code, and exact enough to check. The checks watch the interpreter: the kernels you launched, the shape of
# every `tl.dot` your programs ran, the addresses every `tl.load` and `tl.store` touched, your kernel's source,
# the arguments of each launch, the values each program holds, and the torch ops of your wrapper — on every
# call a check makes. So the answer computed with torch, numpy or a Python loop (or passed in as numbers), a
# `tl.dot` wider than the blocks asked for, a load of more than a block, a block read twice, a score matrix or
# running state kept in memory or held whole in a program, or products taken some other way than `tl.dot` (they
# also rerun your kernel with every `tl.dot` product scaled by 1.25 and check the result moves as it must) fail
# even when the numbers are right. Inside `@triton.jit` use `triton.language` only, as a GPU would require: no
# numpy, no Python helpers (a helper must be `@triton.jit` itself); a kernel's arguments are tensors and the
# scalars it needs (sizes, strides, a scale, block sizes). (On a GPU this notebook compiles your kernels, the interpreter is
# not there to watch, and the check cells below judge the numbers and the wrapper; `pytest weeks/17` and the grader
# run your kernels in the interpreter wherever it works, GPU machines included, so they judge all of the above.)

# %% tags=["setup"]
import os

if not torch.cuda.is_available():  # no GPU: Triton's interpreter (numpy, on the CPU). Set before triton is first
    os.environ.setdefault("TRITON_INTERPRET", "1")  # imported — importing lib (the first cell) already did it
import triton
import triton.language as tl

from lib.attn.triton_attention import check_triton_attention_shapes  # ValueError naming the shapes the kernel cannot take
from lib.attn.triton_attention import interpreting, kernel_device  # kernel_device: ValueError for tensors on the wrong device
from grader.checks.week17 import check_softmax_rows, check_tiled_matmul, check_flash_attention_triton

# %% [markdown]
# A complete kernel first, to read rather than write: `out = x + y` for vectors of any length. One program
# per block of 128 elements; the last block is masked.

# %%
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

# %% [markdown]
# ### A softmax per row
#
# One program per row; the whole row is one block of `BLOCK = triton.next_power_of_2(cols)` lanes. Three
# things to get right: the lanes past the end of the row must not change the result (what should a
# switched-off lane read, for a max and for a sum of exponentials?); entries of size 1e4 must not overflow;
# and the input may be a transposed view, so address element `(r, c)` as `x_ptr + r·stride₀ + c·stride₁`.
# Compute in float32 (`.to(tl.float32)`) and store in the output's dtype (`out_ptr.dtype.element_ty`).

# %% nbgrader={"grade": false, "grade_id": "softmax_rows", "locked": false, "schema_version": 3, "solution": true, "task": false}
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

# %% nbgrader={"grade": true, "grade_id": "test_softmax_rows", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_softmax_rows(softmax_rows)

# %% [markdown]
# ### A tiled matrix product
#
# `c = a @ b` for `a [M, K]`, `b [K, N]`: one program per `[block_m, block_n]` tile of `c` (a 2-D grid), which
# walks along K `block_k` columns at a time — load a block of `a` and a block of `b`, `tl.dot` them, add into
# a float32 accumulator — and stores its tile once at the end. M, N and K need not be multiples of the blocks
# (what must a masked-off lane of `a` or `b` read so that the product is unchanged?). Raise `ValueError` when
# the shapes cannot be multiplied. The check asks for blocks of 16 and 32 and watches the widest `tl.dot`.

# %% nbgrader={"grade": false, "grade_id": "tiled_matmul", "locked": false, "schema_version": 3, "solution": true, "task": false}
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

# %% nbgrader={"grade": true, "grade_id": "test_tiled_matmul", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_tiled_matmul(tiled_matmul)

# %% [markdown]
# What did your kernel do? `observe` (the checks' instrument) records each launch and each `tl.dot` the
# interpreter ran. Count them for a 100×200 by 200×60 product and compare with what you expect from the grid
# and the K loop.

# %%
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

# %% [markdown]
# ### FlashAttention-2's forward as one kernel
#
# Now §3 as a kernel, in FlashAttention-2's loop order: **one program per (block of `block_m` queries, batch·head)**
# — a grid of `(cdiv(Nq, block_m), B·H)` — each looping over the keys `block_n` at a time. A program keeps its
# query block, the running max `m`, the running sum `l` and the unnormalised output `acc` in registers (float32),
# so nothing but `q`, `k`, `v` is read and nothing but `out` and `lse` is written.
#
# What you must work out (§2 and §3 have the pieces; the kernel has no tensors to fall back on):
#
# 1. the offsets of the query block and of each key block for batch `b`, head `h` — from the strides you pass;
# 2. the scores of one block, `q · kᵀ / √d` with `tl.dot`, and which of them to set to `-inf`: keys past `Nk`,
#    and with `causal=True` keys after the diagonal (bottom-right aligned: query `i` sees `j ≤ i + Nk − Nq`);
# 3. the online update of `m`, `l`, `acc` — and what to do for a row that has seen no key yet (`m = −∞`);
# 4. where the loop stops when `causal=True`, so that blocks wholly above the diagonal are never loaded;
# 5. the end: divide by `l` once, store `out` in q's dtype, and `lse = m + log l` (float32, `[B, H, Nq]`) — the one
#    statistic a backward pass needs (§5).
#
# Start with `check_triton_attention_shapes(q, k, v, causal)` (it also rejects head dims that are not a power of
# two from 16 to 128) and `kernel_device(q, k, v)`.

# %% nbgrader={"grade": false, "grade_id": "flash_attention_triton", "locked": false, "schema_version": 3, "solution": true, "task": false}
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

# %% nbgrader={"grade": true, "grade_id": "test_flash_attention_triton", "locked": true, "points": 4, "schema_version": 3, "solution": false, "task": false}
check_flash_attention_triton(flash_attention_triton)

# %% [markdown]
# Your kernel against your §3 function and the library, on this machine: the same numbers, and — under the
# interpreter — the work it did, counted. The causal pass should run a little over half the `tl.dot` FLOPs of the
# full one (the blocks wholly above the diagonal are skipped). On a GPU the cell times the three instead.

# %%
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

# %% [markdown]
# **Stretch (not graded): the backward kernel.** FlashAttention-2's backward is two kernels: one program per
# key block accumulates `dK` and `dV` over the query blocks, recomputing `P = exp(S − lse)` from the `lse` your
# forward saved, with `D = rowsum(dO ∘ O)` computed first by a small kernel; `dQ` comes from a loop over key blocks
# per query block (or atomic adds). §5's `flash_attention_backward` is the same algorithm in PyTorch tiles: port
# it, and compare with `torch.autograd` on `naive_attention` in float64.
#
# Check this section: `pytest weeks/17 -k "ex11 or ex12 or ex13"`.

# %% [markdown]
# ## 9. Check your understanding
#
# **Q1.** How many MB (10⁶ bytes) is the fp32 score matrix of shape `[8, 8, 1024, 1024]`? Return it from
# `answer_q1`.
#
# **Q2.** A causal prefill of N = 4096 tokens with `block_q = block_k = 128`: how many (query block, key
# block) pairs does your tiled forward compute (per batch element and head)?
#
# **Q3.** Split-K decoding with head dim 1 produced two partial results: chunk A with output 1.0 and
# logsumexp 0, chunk B with output 5.0 and logsumexp ln 3. What is the merged output?

# %% nbgrader={"grade": false, "grade_id": "answer_q1", "locked": false, "schema_version": 3, "solution": true, "task": false}
def answer_q1() -> float:
    ### BEGIN SOLUTION
    return 8 * 8 * 1024 * 1024 * 4 / 1e6
    ### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "test_answer_q1", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
check_answer_q1(answer_q1)

# %%
print(f"N = 1024: {score_bytes(8, 8, 1024, 1024) / 1e6:.0f} MB   (seed: '70 MB vs 7 MB' — does not follow from its own shape)")
print(f"  (it is 4096²/1024² = 16× less than at 4096, not 60×; FlashAttention's O(N·d) state at 1024 — Q, K, V, O of "
      f"[8, 8, 1024, 64] — is {4 * score_bytes(8, 8, 1024, 64) / 1e6:.0f} MB)")

# %% nbgrader={"grade": false, "grade_id": "answer_q2", "locked": false, "schema_version": 3, "solution": true, "task": false}
def answer_q2() -> int:
    ### BEGIN SOLUTION
    t = 4096 // 128
    return t * (t + 1) // 2
    ### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "test_answer_q2", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
check_answer_q2(answer_q2)

# %% nbgrader={"grade": false, "grade_id": "answer_q3", "locked": false, "schema_version": 3, "solution": true, "task": false}
def answer_q3() -> float:
    ### BEGIN SOLUTION
    lse = math.log(math.exp(0.0) + math.exp(math.log(3.0)))  # ln 4
    return math.exp(0.0 - lse) * 1.0 + math.exp(math.log(3.0) - lse) * 5.0
    ### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "test_answer_q3", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
check_answer_q3(answer_q3)

# %% [markdown]
# **Q4 (written).** Your tiled forward allocates far less memory than `naive_attention` but is much slower than
# `scaled_dot_product_attention` on this CPU. Using your measurements in §7 and your counts in §4, explain in a few sentences (a) where the
# time goes in your implementation, and (b) what a fused GPU kernel changes, in terms of the HBM accesses you
# counted. Also say when, by your §4 formulas, FlashAttention's traffic advantage shrinks.

# %% [markdown] nbgrader={"grade": true, "grade_id": "q4_written", "locked": false, "points": 3, "schema_version": 3, "solution": true, "task": false}
# *Model answer (the release replaces this cell with "YOUR ANSWER HERE"):* (a) each block runs ~10 separate
# ops, each a dispatch with Python overhead (and, multithreaded, a barrier) that reads and writes a fresh
# block tensor; small matmuls use BLAS less well than one large one; nothing is fused, so the tile does not
# stay in fast memory between ops and much of the traffic the algorithm could save is not saved; SDPA's fused
# C++ kernel does the same blocked loop in one pass. (b) A fused
# kernel keeps S and P on chip, so HBM sees only Q, K, V, O (K and V read once; Q, O, ℓ, m once per key
# block): Θ(N²d²/M) instead of Θ(Nd + N²) — about 12d²/M accesses per score instead of 4, ≈ 7× fewer at
# N = 4096, d = 64, M ≈ 98K. The advantage shrinks as d grows (traffic ∝ d²) or as M shrinks; for d = 64–128
# and M ≈ 100K elements d² ≪ M, so it is large in practice.
#
# **Mark scheme (3 points).** (a) 1 point: the time goes to per-op overhead and unfused ops — each block runs
# ~10 separate PyTorch ops (dispatch/Python overhead, a fresh tensor written and re-read each time), so the tile
# does not stay in fast memory; "Python is slow" alone gets ½. (b) 1 point: a fused kernel keeps S and P in
# SRAM/registers, so HBM traffic is only Q, K, V, O (and ℓ, m): Θ(N²d²/M) against Θ(Nd + N²) — naming the N²
# reads and writes of S and P that disappear, with a number from §4 (e.g. ≈ 7× fewer accesses at N = 4096,
# d = 64, M ≈ 98K) for full marks. (c) 1 point: the advantage shrinks when d²/M grows (larger head dim or smaller
# SRAM), with the §4 formula (T_c = ⌈N/B_c⌉, B_c = ⌈M/4d⌉); no point for "when N is small" without the d²/M
# argument. Not credited: claiming FlashAttention reduces FLOPs or changes the N² order.

# %% [markdown]
# ## Further reading
#
# - Dao, Fu, Ermon, Rudra, Ré, *FlashAttention: Fast and Memory-Efficient Exact Attention with IO-Awareness*,
#   NeurIPS 2022 — Algorithm 1, Theorem 2 (IO complexity), Appendix B (backward).
# - Dao, *FlashAttention-2: Faster Attention with Better Parallelism and Work Partitioning*, 2023 — the loop order used in §3, the logsumexp backward.
# - Milakov & Gimelshein, *Online normalizer calculation for softmax*, 2018.
# - Dao, Haziza, Massa, Sizov, *Flash-Decoding for long-context inference*, 2023 (PyTorch blog / Stanford CRFM).
