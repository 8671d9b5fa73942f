"""Week 17, section 8: attention as a GPU kernel, written in Triton — the references of the Triton exercises.

Triton compiles a Python function decorated with `@triton.jit` into a GPU kernel. One *program* runs per
point of the launch grid; it reads and writes blocks of memory through pointers (`base + offsets`), with a
boolean `mask` where a block hangs over the end of a tensor. With `TRITON_INTERPRET=1` the same kernel runs
on the CPU, each `tl` operation executed by numpy: slow, but exact enough to grade, and no GPU needed.
Importing this module sets that variable on a machine without CUDA (unless it is set already), before any
kernel is decorated — Triton reads it at `@triton.jit` time.

- `softmax_rows(x)`: one program per row, the row in one block (masked to the row's length).
- `tiled_matmul(a, b)`: one program per output tile, a loop over K in blocks, a float32 accumulator.
- `flash_attention_triton(q, k, v, causal)`: FlashAttention-2's forward, one program per (query block, batch·head):
  the online softmax held in registers (m, l, acc), key blocks wholly above the diagonal skipped, the output
  normalised once at the end, and the log-sum-exp per row saved (float32) for a backward pass.

Shapes and the causal convention are the week's: q [B, H, Nq, d], k and v [B, H, Nk, d], query i sees keys
j <= i + (Nk - Nq). The head dimension must be a power of two from 16 to 128 (a block of d columns is one
`tl.arange`, which needs a power of two; a GPU's `tl.dot` needs at least 16).
"""
from __future__ import annotations

import os

import torch

TRITON_PIN = "triton==3.8.0"  # the version pyproject.toml installs; 3.6's interpreter fails on numpy 2.4


def interpreting() -> bool:
    """True if Triton kernels decorated from now on run in the interpreter (on the CPU, through numpy)."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "on", "yes")


# No CUDA device: run kernels in the interpreter (unless TRITON_INTERPRET says otherwise; `lib` sets it on import).
if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

try:
    import triton
    import triton.language as tl
except ImportError as e:  # the lab's set-up installs it; say what to do instead of a stack trace
    raise ImportError(f"week 17's Triton section needs the `triton` package ({TRITON_PIN}): run `make setup`, or "
                      f"`pip install {TRITON_PIN}` in the lab's environment ({e})") from None

if interpreting() and type(tl.max).__name__ != "InterpretedFunction":
    # Triton decorates its own library (tl.max, tl.softmax, ...) when first imported: imported before
    # TRITON_INTERPRET was set, those stay compiled, and a kernel calling them fails with "Cannot call @triton.jit'd
    # outside of the scope of a kernel".
    raise ImportError("triton was imported before TRITON_INTERPRET=1 was set, so its library (tl.max, tl.sum, ...) "
                      "cannot run in the interpreter: restart the kernel (or the process) and import lib, or set "
                      "TRITON_INTERPRET=1, before anything imports triton or torch.utils.flop_counter")


def kernel_device(*tensors: torch.Tensor) -> None:
    """Raise ValueError unless the tensors can be handed to a kernel here: on CUDA for a compiled kernel, on the
    CPU for the interpreter."""
    want = "cpu" if interpreting() else "cuda"
    bad = [str(t.device) for t in tensors if t.device.type != want]
    if bad:
        raise ValueError(f"Triton kernels here run on {want} tensors ({'interpreter' if want == 'cpu' else 'compiled'}"
                         f" mode, TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET', '')!r}); got tensors on {bad}")


# --- 1. softmax of each row ------------------------------------------------------------------------------

@triton.jit
def _softmax_kernel(x_ptr, out_ptr, n_cols, x_row_stride, out_row_stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    inside = cols < n_cols
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=inside, other=float("-inf")).to(tl.float32)
    x = x - tl.max(x, axis=0)
    e = tl.exp(x)
    y = e / tl.sum(e, axis=0)
    tl.store(out_ptr + row * out_row_stride + cols, y.to(out_ptr.dtype.element_ty), mask=inside)


def softmax_rows(x: torch.Tensor) -> torch.Tensor:
    """softmax over the last dimension of a 2-D tensor, one kernel program per row."""
    if x.dim() != 2:
        raise ValueError(f"softmax_rows takes a 2-D tensor [rows, cols]; got shape {tuple(x.shape)}")
    kernel_device(x)
    x = x if x.stride(-1) == 1 else x.contiguous()
    out = torch.empty_like(x)
    rows, cols = x.shape
    _softmax_kernel[(rows,)](x, out, cols, x.stride(0), out.stride(0), BLOCK=triton.next_power_of_2(cols))
    return out


# --- 2. tiled matrix product ------------------------------------------------------------------------------

@triton.jit
def _matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, sam, sak, sbk, sbn, scm, scn,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + rk
        a = tl.load(a_ptr + rm[:, None] * sam + ks[None, :] * sak, mask=(rm[:, None] < M) & (ks[None, :] < K), other=0.0)
        b = tl.load(b_ptr + ks[:, None] * sbk + rn[None, :] * sbn, mask=(ks[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc += tl.dot(a, b)
    tl.store(c_ptr + rm[:, None] * scm + rn[None, :] * scn, acc.to(c_ptr.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


def tiled_matmul(a: torch.Tensor, b: torch.Tensor, block_m: int = 16, block_n: int = 16,
                 block_k: int = 16) -> torch.Tensor:
    """a [M, K] @ b [K, N], one program per [block_m, block_n] tile of the output, K read block_k at a time."""
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"tiled_matmul takes a [M, K] and b [K, N]; got {tuple(a.shape)} and {tuple(b.shape)}")
    kernel_device(a, b)
    m, k = a.shape
    n = b.shape[1]
    c = torch.empty((m, n), dtype=a.dtype, device=a.device)
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    _matmul_kernel[grid](a, b, c, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0),
                         c.stride(1), BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k)
    return c


# --- 3. FlashAttention-2 forward --------------------------------------------------------------------------

@triton.jit
def _flash_forward_kernel(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr,
                          sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd, sob, soh, som, sod,
                          H, NQ, NK, scale,
                          D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    rows = start_m + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, D)
    q = tl.load(q_ptr + b * sqb + h * sqh + rows[:, None] * sqm + dims[None, :] * sqd, mask=rows[:, None] < NQ,
                other=0.0).to(tl.float32)
    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, D), dtype=tl.float32)
    end = NK
    if CAUSAL:  # keys past the last row's diagonal are masked for every row of this block: never read them
        end = tl.minimum(NK, start_m + BLOCK_M + NK - NQ)
    for start_n in range(0, end, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        kt = tl.load(k_ptr + b * skb + h * skh + cols[None, :] * skn + dims[:, None] * skd, mask=cols[None, :] < NK,
                     other=0.0).to(tl.float32)
        s = tl.dot(q, kt) * scale
        keep = cols[None, :] < NK
        if CAUSAL:
            keep = keep & (cols[None, :] <= rows[:, None] + (NK - NQ))
        s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no key yet: nothing to rescale
        p = tl.exp(s - m_safe[:, None])
        alpha = tl.exp(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_ptr + b * svb + h * svh + cols[:, None] * svn + dims[None, :] * svd, mask=cols[:, None] < NK,
                    other=0.0).to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p, v)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(o_ptr + b * sob + h * soh + rows[:, None] * som + dims[None, :] * sod, out.to(o_ptr.dtype.element_ty),
             mask=rows[:, None] < NQ)
    tl.store(lse_ptr + bh * NQ + rows, m_i + tl.log(l_i), mask=rows < NQ)


def check_triton_attention_shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> None:
    """Raise ValueError naming the shapes when the kernel cannot take them (the week's rules, plus a head dim
    that is a power of two from 16 to 128)."""
    from lib.attn.attention import check_attention_shapes

    check_attention_shapes(q, k, v, causal)
    d = q.shape[-1]
    if d < 16 or d > 128 or d & (d - 1):
        raise ValueError(f"the Triton kernel takes a head dim that is a power of two from 16 to 128; got q "
                         f"{tuple(q.shape)} (d = {d}): pad the head dim, or use flash_attention_forward")


def flash_attention_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                           block_m: int = 16, block_n: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashAttention-2's forward as one Triton kernel: (out [B, H, Nq, d] in q's dtype, lse [B, H, Nq] float32)."""
    check_triton_attention_shapes(q, k, v, causal)
    kernel_device(q, k, v)
    bsz, heads, nq, d = q.shape
    nk = k.shape[2]
    out = torch.empty_like(q)
    lse = torch.empty((bsz, heads, nq), dtype=torch.float32, device=q.device)
    grid = (triton.cdiv(nq, block_m), bsz * heads)
    _flash_forward_kernel[grid](q, k, v, out, lse, *q.stride(), *k.stride(), *v.stride(), *out.stride(),
                                heads, nq, nk, d ** -0.5, D=d, BLOCK_M=block_m, BLOCK_N=block_n, CAUSAL=causal)
    return out, lse
