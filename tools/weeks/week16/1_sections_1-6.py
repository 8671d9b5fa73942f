# %% [markdown]
# # Week 16 — The KV cache and grouped-query attention
#
# A language model writes one token at a time, and every new token attends to all the tokens before it.
# Recomputing the keys and values of the whole prefix at every step makes generation quadratic; keeping
# them in a **KV cache** makes each step cost one token's work. This week you build that cache from
# scratch, prove that it changes nothing but the speed, predict how much faster it is on this machine and
# measure it, and then look at its price — memory — and at the two ways of paying less:
# sharing KV heads (**MQA**, **GQA**) and a **sliding window**.
#
# **You will write** twelve small pieces: a FLOP count, the causal mask, a preallocated cache, attention with
# grouped KV heads, the cached decode loop, the cache-size formula, a roofline bound, a model of a decode step's
# time (which you then measure), KV-head pooling, a rolling-buffer cache, and two quiz answers. Each exercise poses
# a question and says what a correct answer must do; how to do it, and the formula, come right *after* the cell
# that checks it. Each is checked by the cell right after it and by `pytest weeks/16 -k exNN` (for example
# `pytest weeks/16 -k ex03`); `pytest weeks/16` checks them all (≤ 60 s).
#
# **The model** is SmolLM2-135M-Instruct, a Llama-architecture model small enough for a laptop CPU:
# 30 layers, d_model 576, 9 query heads and 3 KV heads (so it already uses GQA), head_dim 64.
# The lab's implementation is in `lib/modeling/llama.py`; it accepts any cache with an `append(k, v)` method and
# any attention function `(q, k, v, causal=True) -> out`, which is how your pieces plug into it.
#
# **Read** Ainslie et al. 2023, *GQA: Training Generalized Multi-Query Transformer Models from Multi-Head
# Checkpoints* (§2 and §3), and Shazeer 2019, *Fast Transformer Decoding: One Write-Head is All You Need*
# (the MQA paper).
#
# A rule of this notebook: every number is either derived in the cell that prints it, measured there, or rendered
# from a recorded measurement that names its machine. Where the course's source notes make a claim, we check it and
# say so when it does not hold.

# %% tags=["setup"]
import math

import torch
import torch.nn.functional as F

from lib.modeling.kv_cache import CacheOverflowError, KVCache
from lib.modeling.llama import LlamaModel
from grader.checks.week16 import (check_step_flops, check_causal_mask, check_LayerKVCache, check_gqa_attention,
                                  check_generate, check_kv_cache_bytes, check_roofline_time, check_decode_time,
                                  check_pool_kv_heads, check_RollingKVCache, check_answer_q1, check_answer_q3)

# %%
import os

import matplotlib.pyplot as plt
from tqdm.auto import tqdm

from lib.modeling import kv_cache as ref
from lib.bench import roofline
from lib.attn.attention import gqa_attention as lab_attention  # the lab's reference, under another name
from lib.modeling.generate import generate as lib_generate
from lib.modeling.llama import shared_smollm2
from lib.modeling.text import load_text, perplexity
from lib.bench.timing import Conditions, interleaved, not_monotone, report, warning

# The lab's own run of this notebook (tests/test_nbgrader_pipeline.py) sets INFERENCE_LAB_QUICK_DEMOS=1: every
# measurement at a smaller size, to show that each cell runs; its figures then say little. Leave it unset.
QUICK = os.environ.get("INFERENCE_LAB_QUICK_DEMOS") == "1"
torch.manual_seed(0)
model, tok = shared_smollm2()  # SmolLM2-135M-Instruct, fp32, on the CPU (or CUDA when there is one); do not modify it
cfg = model.config
print(cfg)
dev = model.device  # every tensor a demo makes goes here: the notebook runs unchanged on a GPU
print(f"{sum(p.numel() for p in model.parameters()):,} parameters on {dev}, {torch.get_num_threads()} CPU threads")

# %% [markdown]
# ## 1. Why generation without a cache is quadratic
#
# Each generation step runs a forward pass over a sequence of *T* positions and takes the last position's
# logits to pick token *T + 1*. That pass needs the keys and values of all *T* positions in every layer.
# Without a cache it recomputes them: it runs all *T* tokens through the network. With a cache, the keys and
# values of the first *T − 1* positions are already there, and only the newest token (position *T*) runs.
#
# Count the work in FLOPs (a multiply-add is 2 FLOPs) and only in matrix products, which is nearly all of it:
#
# * **weights:** every token that runs multiplies through every weight matrix once, where `n_params` counts the
#   weights of all linear layers plus the LM head;
# * **attention:** each token that runs scores itself against the `seq_len` keys (Q·Kᵀ) and mixes the
#   `seq_len` values (P·V), in every layer. (The query heads together have `n_heads · head_dim = d_model`
#   dimensions. Count the full score matrix, masked entries included, because that is what a plain
#   implementation computes.) Derive the FLOPs of each product from its shapes.
#
# **Exercise 1 (derive).** Write `step_flops(n_params, n_layers, d_model, seq_len, cached)`: the FLOPs of the step
# whose forward pass covers `seq_len` positions — uncached, `seq_len` tokens in; cached, one token in and
# `seq_len − 1` in the cache. (It yields the logits for token `seq_len + 1`; §7 times exactly this pass.)

# %% nbgrader={"grade": false, "grade_id": "step_flops", "locked": false, "schema_version": 3, "solution": true, "task": false}
def step_flops(n_params: int, n_layers: int, d_model: int, seq_len: int, cached: bool) -> int:
    """FLOPs (matmuls only) of one generation step at sequence length `seq_len`, with or without a KV cache."""
    ### BEGIN SOLUTION
    tokens = 1 if cached else seq_len  # how many tokens run through the network in this step
    return 2 * n_params * tokens + 4 * n_layers * d_model * tokens * seq_len
    ### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "test_step_flops", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
check_step_flops(step_flops)

# %% [markdown]
# **The count, now that your check passes.** A token that runs does one multiply-add per weight: `2 · n_params`.
# In one layer its query (`d_model` numbers over all heads) meets `seq_len` keys — `d_model · seq_len`
# multiply-adds for Q·Kᵀ — and its probabilities mix `seq_len` values of the same width — as many again for P·V:
# `4 · d_model · seq_len` FLOPs per layer. So a step costs `tokens · (2 · n_params + 4 · n_layers · d_model · seq_len)`
# with `tokens = seq_len` uncached and `1` cached.
#
# On SmolLM2: the per-step cost, and the total cost of generating *T* tokens (the sum over the steps).

# %%
n_params = roofline.matmul_params(model)  # linears of the 30 blocks + the tied LM head
print(f"n_params in matmuls: {n_params:,}")
print(f"{'seq_len':>8} {'uncached GFLOP':>15} {'cached GFLOP':>13} {'ratio':>7}")
for T in [1, 64, 256, 2048]:
    u = step_flops(n_params, cfg.n_layers, cfg.d_model, T, cached=False)
    c = step_flops(n_params, cfg.n_layers, cfg.d_model, T, cached=True)
    print(f"{T:>8} {u / 1e9:>15.2f} {c / 1e9:>13.3f} {u / c:>7.1f}")
crossover = n_params / (2 * cfg.n_layers * cfg.d_model)
print(f"attention FLOPs per token pass the weight FLOPs beyond seq_len = n_params / (2 n_layers d_model) = {crossover:,.0f}")

Ts = torch.arange(1, 2049)
total_u = torch.tensor([step_flops(n_params, cfg.n_layers, cfg.d_model, int(t), False) for t in Ts], dtype=torch.float64).cumsum(0)
total_c = torch.tensor([step_flops(n_params, cfg.n_layers, cfg.d_model, int(t), True) for t in Ts], dtype=torch.float64).cumsum(0)
fig, ax = plt.subplots(figsize=(6, 3.5))
ax.loglog(Ts, total_u, label="without cache (≈ n_params · T²)")
ax.loglog(Ts, total_c, label="with cache (≈ 2 · n_params · T)")
ax.set(xlabel="tokens generated, T", ylabel="total FLOPs", title="SmolLM2: work to generate T tokens")
ax.legend(); ax.grid(alpha=0.3); plt.show()

# %% [markdown]
# Per step, the uncached pass costs about *T* times the cached one, so generating *T* tokens costs
# Σ 2·n_params·t ≈ n_params·T² without a cache and 2·n_params·T with one: **quadratic against linear**.
# The attention term grows one power faster in both cases, but for SmolLM2 it only matters beyond a few
# thousand tokens (the crossover printed above). FLOPs are not time, though: section 7 predicts the time,
# measures it, and explains why the real ratio is much smaller than the FLOP ratio.
#
# Check: `pytest weeks/16 -k ex01`

# %% [markdown]
# ## 2. The causal mask
#
# A query may attend to its own position and the ones before it. When queries and keys cover the same
# *T* positions (the prefill), that is the familiar lower triangle. With a cache they do not: at a decode step
# there is **one** query (the new token) and **T + 1** keys (the *T* cached ones and its own); a chunk of `c` new
# tokens after `n` cached ones has `c` queries and `n + c` keys. In every case the queries are the **last**
# `q_len` of the `kv_len` positions.
#
# **Exercise 2 (derive).** Write `causal_mask(q_len, kv_len, device=None)`: a boolean tensor `[q_len, kv_len]`,
# True where query *i* may attend to key *j*. Work out, from where query *i* sits among the `kv_len` positions,
# which keys it may see; check your rule on the decode step (one query: what is its row?) and on the prefill
# (`q_len == kv_len`). Create the mask on `device` (a mask built on the CPU cannot be applied to scores on a GPU —
# the check tries `device="meta"`, a device with shapes but no data).

# %% nbgrader={"grade": false, "grade_id": "causal_mask", "locked": false, "schema_version": 3, "solution": true, "task": false}
def causal_mask(q_len: int, kv_len: int, device=None) -> torch.Tensor:
    """Boolean [q_len, kv_len] on `device`: True where query i may attend to key j (queries are the last q_len positions)."""
    ### BEGIN SOLUTION
    i = torch.arange(q_len, device=device).unsqueeze(1)  # [q_len, 1]
    j = torch.arange(kv_len, device=device).unsqueeze(0)  # [1, kv_len]
    return j <= i + (kv_len - q_len)
    ### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "test_causal_mask", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
check_causal_mask(causal_mask)

# %% [markdown]
# **The rule, now that your check passes.** Query *i* is the (*i* + 1)-th of the last `q_len` positions, so it sits
# at position `i + (kv_len − q_len)`; it may see key *j* iff `j <= i + (kv_len - q_len)`. The triangle is aligned at
# the **bottom right**: the decode step's single row is all True, and the prefill (`q_len == kv_len`) is the usual
# lower triangle. In torch: `torch.arange(kv_len)[None, :] <= torch.arange(q_len)[:, None] + (kv_len - q_len)`,
# both aranges made on `device`.

# %%
print("prefill, [4, 4]:\n", causal_mask(4, 4).int())
print("cached decode after 4 tokens, [1, 5]:\n", causal_mask(1, 5).int())
print("chunk of 2 after 3 cached, [2, 5]:\n", causal_mask(2, 5).int())

# %% [markdown]
# ### The classic bug: the prefill mask during cached decoding
#
# The week's source notes warn that when cached and uncached outputs differ, the likely cause is the
# mask. The usual way to get it wrong is to build the mask as if queries and keys started at the same
# position (**top-left** alignment): take the first row of the `[T+1, T+1]` prefill mask for the
# single decode query. That row lets the new token see *only the first token*. It is easy to do by
# accident: `torch.nn.functional.scaled_dot_product_attention(..., is_causal=True)` aligns its mask top-left,
# so with one query it attends to key 0 alone — check it below.
#
# We run SmolLM2 with that mask. The prefill is square, so its first token is right; every decode step
# after it is wrong, and the text falls apart.

# %%
q, k, v = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 5, 8), torch.randn(1, 1, 5, 8)
print("SDPA is_causal=True with 1 query and 5 keys returns v[key 0]:",
      torch.allclose(F.scaled_dot_product_attention(q, k, v, is_causal=True), v[:, :, :1]))
print("top-left row:", causal_mask(5, 5)[:1].int().tolist(), "  right row:", causal_mask(1, 5).int().tolist())

def prefill_mask_attention(q, k, v, causal=True):
    # THE BUG: the first q_len rows of the [kv_len, kv_len] prefill mask (top-left aligned)
    mask = causal_mask(k.shape[2], k.shape[2], device=q.device)[: q.shape[2]]  # [q_len, kv_len], top-left aligned
    return lab_attention(q, k, v, mask=mask)

buggy = model.with_attention(prefill_mask_attention)  # shares SmolLM2's weights
prompt = tok("The capital of France is", return_tensors="pt").input_ids.to(dev)
good_ids, good_logits = lib_generate(model, prompt, 24, return_logits=True)
bad_ids, bad_logits = lib_generate(buggy, prompt, 24, return_logits=True)
print("correct mask:", repr(tok.decode(good_ids[0, prompt.shape[1]:])))
print("prefill mask:", repr(tok.decode(bad_ids[0, prompt.shape[1]:])))
diff = (good_logits - bad_logits).abs().amax(-1)[0]
print("largest logit difference per step:", [round(x, 2) for x in diff.tolist()[:8]], "...")

# %% [markdown]
# Check: `pytest weeks/16 -k ex02`

# %% [markdown]
# ## 3. The cache
#
# Each layer keeps its keys and values as `[batch, n_kv_heads, max_len, head_dim]` tensors. Why not simply grow
# them with `torch.cat` at every step? Not for the order of the cost: a decode step's attention already reads
# the whole cache, O(T) bytes per step, and a `cat` adds one O(T) copy to that (we measure both below). The
# reasons are practical: a `cat` allocates a new tensor every step for every layer (allocator churn and
# fragmentation, worst on a GPU), the shapes change every step (no CUDA graphs, a recompile for `torch.compile`),
# and the memory is not bounded or known in advance.
#
# Note that the cache stores *n_kv_heads*, not *n_heads*: for SmolLM2, 3 heads rather than 9.
#
# **Exercise 3 (design).** Complete `LayerKVCache`. Its interface: `length` (positions held), `max_len`, `nbytes`
# (bytes of its K and V storage) and `append(k, v)` with `k`, `v` of `[batch, n_kv_heads, t, head_dim]`, which
# returns the keys and values of **all** positions held so far, oldest first. The properties a correct answer keeps
# (the check tries each):
#
# * its memory is allocated **once**, in `__init__`, for `max_len` positions, with the `dtype` and on the `device` it
#   is given (the model passes its own; on a GPU a cache on the CPU cannot take the GPU's keys);
# * an append costs what it appends: it never copies or reallocates what the cache already holds, at any length, and
#   what it returns is not a copy either;
# * appending past `max_len` raises `CacheOverflowError` (imported at the top) with a message that says what to do,
#   and leaves the cache as it was.

# %% nbgrader={"grade": false, "grade_id": "LayerKVCache", "locked": false, "schema_version": 3, "solution": true, "task": false}
class LayerKVCache:
    """One layer's keys and values, preallocated as [batch, n_kv_heads, max_len, head_dim]."""

    def __init__(self, batch: int, n_kv_heads: int, max_len: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device=None):
        ### BEGIN SOLUTION
        shape = (batch, n_kv_heads, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # [batch, n_kv_heads, max_len, head_dim]
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.length = 0  # positions held
        ### END SOLUTION

    @property
    def max_len(self) -> int:
        ### BEGIN SOLUTION
        return self.k.shape[2]
        ### END SOLUTION

    @property
    def nbytes(self) -> int:
        """Bytes of the K and V buffers."""
        ### BEGIN SOLUTION
        return 2 * self.k.numel() * self.k.element_size()
        ### END SOLUTION

    def append(self, k: torch.Tensor, v: torch.Tensor):
        """Store k, v [batch, n_kv_heads, t, head_dim]; return all positions held, [.., length, ..], oldest first."""
        ### BEGIN SOLUTION
        t = k.shape[2]
        end = self.length + t
        if end > self.max_len:
            raise CacheOverflowError(
                f"KV cache overflow: it holds {self.length} of {self.max_len} positions and {t} more were "
                f"appended; allocate it with max_len >= {end}")
        self.k[:, :, self.length:end] = k
        self.v[:, :, self.length:end] = v
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]
        ### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "test_LayerKVCache", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_LayerKVCache(LayerKVCache)

# %% [markdown]
# **How it works, now that your check passes.** Two zero tensors of the full shape are made in `__init__`; an append
# writes its `t` positions into the slice `[:, :, length:length + t]` (an in-place copy of the new positions only) and
# returns the *views* `self.k[:, :, :length]` and `self.v[:, :, :length]` — slices share the buffer's memory, so
# nothing is copied. The overflow test comes before any write, so a refused append changes nothing.
#
# Your cache in SmolLM2: 30 layers of it, enough for 32 positions. We prefill a prompt, then try to go past the end.

# %%
cache = KVCache([LayerKVCache(1, cfg.n_kv_heads, 32, cfg.head_dim, device=dev) for _ in range(cfg.n_layers)])
ids = tok("Who's there? Nay, answer me: stand, and unfold yourself.", return_tensors="pt").input_ids.to(dev)
with torch.no_grad():
    model(ids, cache=cache)
print(f"held {cache.length} of {cache.max_len} positions; {cache.nbytes:,} bytes allocated "
      f"= 30 layers x 2 x {cfg.n_kv_heads} heads x 32 x {cfg.head_dim} x 4 B")
try:
    with torch.no_grad():
        model(torch.cat([ids, ids], 1), cache=cache)
except CacheOverflowError as e:
    print("CacheOverflowError:", e)

# %% [markdown]
# **Measured: `torch.cat` growth against a preallocated write.** For SmolLM2's 30 layers at batch 1, one
# decode step appends one position per layer. We time that append both ways at a few cache lengths, next to
# the step's attention over the cache (one query against all *T* keys, every layer) — the read that happens
# anyway. The three are timed in turn, round after round (`lib.bench.timing.interleaved`), so that whatever else the
# machine does falls on all of them; the best of the rounds is shown with the spread of all of them
# (worst / best), and the load around the measurement.

# %%
conditions = Conditions.now()
appends = {}
for T in [128, 512, 2048]:
    shape = (1, cfg.n_kv_heads, T, cfg.head_dim)
    held = [torch.randn(shape, device=dev) for _ in range(2 * cfg.n_layers)]  # K and V of every layer
    buffers = [torch.zeros(1, cfg.n_kv_heads, T + 1, cfg.head_dim, device=dev) for _ in range(2 * cfg.n_layers)]
    new = torch.randn(1, cfg.n_kv_heads, 1, cfg.head_dim, device=dev)
    q1 = torch.randn(1, cfg.n_heads, 1, cfg.head_dim, device=dev)
    appends[T] = interleaved({
        "cat append": lambda: [torch.cat([h, new], dim=2) for h in held],
        "preallocated write": lambda: [b[:, :, T:T + 1].copy_(new) for b in buffers],
        "attention read": lambda: [lab_attention(q1, held[2 * i], held[2 * i + 1]) for i in range(cfg.n_layers)],
    }, repeats=10, device=dev)
    del held, buffers
conditions.done()
print(f"{'T':>6} {'cat append':>16} {'preallocated':>16} {'attention read':>16} {'cat / prealloc':>15}"
      f"   (ms per step, 30 layers: best of 10, spread)")
for T, t in appends.items():
    cells = [f"{x.best * 1e3:8.3f} ({x.spread:4.2f})" for x in t.values()]
    print(f"{T:>6} {cells[0]:>16} {cells[1]:>16} {cells[2]:>16} {t['cat append'].best / t['preallocated write'].best:>14.0f}x")
print(conditions.line())
print(warning([x for t in appends.values() for x in t.values()], conditions) or "")

# %% [markdown]
# Both the `cat` copy and the attention read grow linearly with *T*, so over a whole generation both are
# O(T²) bytes in all: `cat` makes each step more expensive by a constant factor (compare the columns above),
# it does not change the order. The preallocated write costs the same at every length. (The rolling cache of
# §9 also copies — the *W* held positions, every step — which is fine for the same reason: bounded, and next to a
# read of the same size.)
#
# Check: `pytest weeks/16 -k ex03`

# %% [markdown]
# ## 4. Attention with grouped KV heads
#
# In multi-head attention (MHA) every query head has its own key and value head. Multi-query attention
# (MQA, Shazeer 2019) keeps all the query heads but only **one** K/V head that they share; grouped-query
# attention (GQA, Ainslie et al. 2023) sits in between: the `n_heads` query heads form `n_kv_heads` groups of
# consecutive heads (the first `n_heads / n_kv_heads` heads are group 0, and so on), and the heads of a group
# share one K/V head. MHA (`n_kv_heads == n_heads`) and MQA (`n_kv_heads == 1`) are the two ends of the same code.
#
# **Exercise 4 (design).** Write `gqa_attention(q, k, v, causal=True)` with q `[B, n_heads, q_len, d]` and k, v
# `[B, n_kv_heads, kv_len, d]`, returning `[B, n_heads, q_len, d]`: each query head's scaled dot-product attention,
# softmax(q·kᵀ/√d)·v, against its group's K/V head. The properties a correct answer keeps (the check tries each):
#
# * with `n_kv_heads == n_heads` it is ordinary multi-head attention; with one KV head, every query head reads it;
# * with `causal`, the scores are masked with *your* `causal_mask` (bottom-right aligned: `q_len` may be less than
#   `kv_len`), built on the inputs' device (`device=q.device`: the model may be on a GPU);
# * fp16 and bf16 inputs work: softmax in float32, the output in the inputs' dtype; q may be a non-contiguous view;
# * you write the attention: no `scaled_dot_product_attention` or fused attention ops (the check watches).

# %% nbgrader={"grade": false, "grade_id": "gqa_attention", "locked": false, "schema_version": 3, "solution": true, "task": false}
def gqa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True) -> torch.Tensor:
    """Scaled dot-product attention where each group of n_heads // n_kv_heads query heads shares one KV head."""
    ### BEGIN SOLUTION
    b, h, tq, d = q.shape
    hkv, tk = k.shape[1], k.shape[2]
    group = h // hkv
    qg = q.reshape(b, hkv, group * tq, d)  # fold each group's query heads into the query axis
    scores = (qg @ k.transpose(-1, -2)).reshape(b, h, tq, tk) / math.sqrt(d)  # [B, H, Tq, Tk]
    if causal:
        scores = scores.masked_fill(~causal_mask(tq, tk, device=q.device), float("-inf"))
    probs = torch.softmax(scores.float(), dim=-1).to(v.dtype)
    return (probs.reshape(b, hkv, group * tq, tk) @ v).reshape(b, h, tq, d)
    ### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "test_gqa_attention", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_gqa_attention(gqa_attention)

# %% [markdown]
# **How it works, now that your check passes.** Query head *h* belongs to group `h // (n_heads // n_kv_heads)` and
# reads that KV head: SmolLM2's heads 0–2 read KV head 0, 3–5 read KV head 1, 6–8 read KV head 2. The simplest code
# repeats each KV head for its group, `k.repeat_interleave(n_heads // n_kv_heads, dim=1)` (same for v), and runs
# ordinary attention — but that copies K and V `group` times. Reshaping q instead, `[B, n_kv_heads, group · q_len, d]`
# (each group's query heads folded into the query axis), multiplies every KV head once by all its queries and copies
# nothing; the scores are reshaped back to `[B, n_heads, q_len, kv_len]` to apply the mask.

# %%
mine = model.with_attention(gqa_attention)  # SmolLM2's weights, your attention
ids = tok("To be, or not to be", return_tensors="pt").input_ids.to(dev)
with torch.no_grad():
    diff = (mine(ids) - model(ids)).abs().max().item()
print(f"SmolLM2 with your gqa_attention vs the lab's: largest logit difference {diff:.2e}")
print("query head -> KV head:", {h: h // (cfg.n_heads // cfg.n_kv_heads) for h in range(cfg.n_heads)})

# %% [markdown]
# Check: `pytest weeks/16 -k ex04`

# %% [markdown]
# ## 5. Generation with the cache
#
# What the model gives you: `model(ids)` runs the positions `ids` `[B, t]` and returns their logits
# `[B, t, vocab]`; `model(ids, cache=cache)` does the same for positions that come *after* the ones the cache
# holds, using the cached keys and values for attention, and appends the new ones; `model.new_cache(batch, max_len)`
# allocates a cache for `max_len` positions (or build 30 of your `LayerKVCache`s into a `KVCache`).
#
# **Exercise 5 (design).** Write `generate(model, input_ids, max_new_tokens, use_cache=True, return_logits=False)`:
# greedy decoding (each new token is the argmax of the logits at the last position). It returns the ids
# `[B, prompt + new]` and, with `return_logits`, also the logits each step chose from, `[B, new, vocab]` — the same
# contract as `lib.modeling.generate.generate`. The properties a correct answer keeps (the check counts what the model is fed):
#
# * cached and uncached generation give the same tokens, and logits within 1e-4 at every step — on SmolLM2
#   (64 greedy tokens) and on random tiny configurations (MHA, GQA, MQA, one and two sequences);
# * with `use_cache`, each position goes through the model **once**; without it, every step recomputes the whole
#   sequence (the baseline the cache is measured against);
# * you call the model you are given (no copy of its weights, no layers one by one).

# %% nbgrader={"grade": false, "grade_id": "generate", "locked": false, "schema_version": 3, "solution": true, "task": false}
@torch.no_grad()
def generate(model, input_ids: torch.Tensor, max_new_tokens: int, use_cache: bool = True,
             return_logits: bool = False):
    """Greedy decoding; returns ids [B, T + new] (and logits [B, new, vocab] with return_logits)."""
    ### BEGIN SOLUTION
    b, t = input_ids.shape
    cache = model.new_cache(batch=b, max_len=t + max_new_tokens) if use_cache else None
    ids, step_input, step_logits = input_ids, input_ids, []
    for _ in range(max_new_tokens):
        logits = model(step_input if use_cache else ids, cache=cache)[:, -1]  # [B, vocab]
        step_logits.append(logits)
        nxt = logits.argmax(dim=-1, keepdim=True)  # [B, 1]
        ids = torch.cat([ids, nxt], dim=1)
        step_input = nxt
    logits = torch.stack(step_logits, dim=1)  # [B, new, vocab]
    return (ids, logits) if return_logits else ids
    ### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "test_generate", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
check_generate(generate)

# %% [markdown]
# **The loop, now that your check passes.** With the cache: allocate it for `prompt + max_new_tokens` positions, run
# the whole prompt once (the prefill: its last logits give the first new token), then at every step feed **only the
# newest token**, `model(next_ids, cache=cache)`, and take its logits. Without the cache, feed the whole sequence so
# far at every step. Either way append the argmax to the ids and keep the step's last-position logits.

# %%
prompt = tok("To be, or not to be, that is the question:", return_tensors="pt").input_ids.to(dev)
N_NEW = 16 if QUICK else 64
c_ids, c_logits = generate(model, prompt, N_NEW, use_cache=True, return_logits=True)
u_ids, u_logits = generate(model, prompt, N_NEW, use_cache=False, return_logits=True)
print(f"identical tokens: {torch.equal(c_ids, u_ids)}; largest logit difference over {N_NEW} steps: "
      f"{(c_logits - u_logits).abs().max().item():.2e}")
print(repr(tok.decode(c_ids[0, prompt.shape[1]:])))

# %% [markdown]
# The logits are not bit-identical — the cached and uncached passes multiply matrices of different shapes,
# so floating-point sums are taken in different orders — but they agree well within 1e-4 (printed above), and
# the tokens are the same. (Greedy SmolLM2 soon repeats itself on this prompt; that is the model, not the cache.)
# How much faster the cached loop is, and why, is section 7's question.
#
# Check: `pytest weeks/16 -k ex05`

# %% [markdown]
# ## 6. How much memory
#
# The cache holds, for every layer, a key and a value vector (each `head_dim` numbers) per KV head and per
# position, for every sequence of the batch.
#
# **Exercise 6 (derive).** Write `kv_cache_bytes(n_layers, n_kv_heads, head_dim, seq_len, batch=1,
# bytes_per_element=2)` (fp16/bf16 by default): derive the byte count from the sentence above.
#
# **Milestones** (the source notes' figures, which the check holds your formula to): OPT-13B (40 layers, 40 heads of
# 128) needs 819,200 B per token; GPT-3 175B (96 layers, 96 heads of 128) needs 4.5 MiB per token; for SmolLM2 the
# formula equals the bytes of the cache tensors the model actually allocates.

# %% nbgrader={"grade": false, "grade_id": "kv_cache_bytes", "locked": false, "schema_version": 3, "solution": true, "task": false}
def kv_cache_bytes(n_layers: int, n_kv_heads: int, head_dim: int, seq_len: int,
                   batch: int = 1, bytes_per_element: int = 2) -> int:
    """Bytes of a KV cache holding seq_len positions for batch sequences."""
    ### BEGIN SOLUTION
    return 2 * n_layers * n_kv_heads * head_dim * seq_len * batch * bytes_per_element
    ### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "test_kv_cache_bytes", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_kv_cache_bytes(kv_cache_bytes)

# %% [markdown]
# **The formula, now that your check passes:** `2 (K and V) · n_layers · n_kv_heads · head_dim · seq_len · batch ·
# bytes_per_element`. Per token and sequence that is `2 · n_layers · n_kv_heads · head_dim` numbers — OPT-13B:
# 2 · 40 · 40 · 128 = 409,600 numbers, 819,200 B in fp16.

# %%
opt = kv_cache_bytes(40, 40, 128, 1)
print(f"OPT-13B: {opt:,} B/token; a 2048-token sequence: {kv_cache_bytes(40, 40, 128, 2048) / 1e9:.2f} GB "
      f"= {kv_cache_bytes(40, 40, 128, 2048) / 2**30:.2f} GiB")
print(f"GPT-3 175B: {kv_cache_bytes(96, 96, 128, 1):,} B/token = {kv_cache_bytes(96, 96, 128, 1) / 2**20} MiB")
allocated = model.new_cache(batch=2, max_len=1000).nbytes  # fp32, like the model
formula = kv_cache_bytes(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, 1000, batch=2, bytes_per_element=4)
print(f"SmolLM2, batch 2, 1000 positions, fp32: allocated {allocated:,} B, formula {formula:,} B, equal: {allocated == formula}")

# %% [markdown]
# Real configurations (layers, query heads, KV heads, head_dim from each model's published configuration),
# in fp16, against context length. SmolLM2 appears three times: as it is (GQA, 3 KV heads), as it would be
# with MHA (9), and with MQA (1). The last column is each cache against the same model with MHA.

# %%
configs = {  # name: (n_layers, n_heads, n_kv_heads, head_dim)
    "OPT-13B (MHA)": (40, 40, 40, 128),
    "Llama-2-7B (MHA)": (32, 32, 32, 128),
    "Llama-2-70B (GQA, 8 KV)": (80, 64, 8, 128),
    "SmolLM2-135M as MHA (9 KV)": (30, 9, 9, 64),
    "SmolLM2-135M (GQA, 3 KV)": (30, 9, 3, 64),
    "SmolLM2-135M as MQA (1 KV)": (30, 9, 1, 64),
}
contexts = [2 ** p for p in range(7, 16)]  # 128 ... 32768
print(f"{'model':<28} {'KiB/token':>10} {'GiB at 4096':>12} {'MHA / this':>11}")
fig, ax = plt.subplots(figsize=(7, 4.2))
for name, (L, H, Hkv, d) in configs.items():
    saving = kv_cache_bytes(L, H, d, 4096) / kv_cache_bytes(L, Hkv, d, 4096)
    print(f"{name:<28} {kv_cache_bytes(L, Hkv, d, 1) / 1024:>10.1f} {kv_cache_bytes(L, Hkv, d, 4096) / 2**30:>12.3f} {saving:>10.0f}x")
    ax.loglog(contexts, [kv_cache_bytes(L, Hkv, d, n) / 2 ** 30 for n in contexts], "o-" if "Smol" in name else "s-",
              ms=3, label=name)
ax.set(xlabel="context length (tokens)", ylabel="KV cache, GiB (fp16, batch 1)", title="KV cache memory against context")
ax.grid(alpha=0.3, which="both"); ax.legend(fontsize=8); plt.show()

# %% [markdown]
# Sharing KV heads shrinks the cache (the last column); by how much, for a given number of query and KV heads, is
# question 3 of section 10 — and the course's source notes state that factor in two ways that disagree, which we
# take apart after you answer it. The 4.5 "MB" per token of GPT-3 is 4.5 **MiB** (4,718,592 B).
#
# Check: `pytest weeks/16 -k ex06`
