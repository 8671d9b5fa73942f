"""Builds solutions/16/week16_kv_cache.ipynb (run: python tools/weeks/week16.py).

Each graded exercise poses its question and states the interface and the properties a correct answer keeps; the
formula or algorithm comes after the check passes ("... now that your check passes"), or in the check's failure hint
(solutions/16/README.md's table; tests/test_week16_checks.py holds the notebook to it). Figures in the prose are
rendered from the committed records (tools.results.recorded_md), never typed; the live ones are printed by the cells.
"""
from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tools.nbbuild import Notebook  # noqa: E402
from tools.results import recorded_md  # noqa: E402

EPYC, H200 = "amd-epyc-avx512", "nvidia-h200"
MODEL_DECODE = "decode b1 n64: lib.modeling.generate (lib.modeling.llama)"  # lib.modeling.llama's eager decode of SmolLM2, fp32 on the CPU

nb = Notebook()

nb.md("""
# Week 16 — The KV cache and grouped-query attention

A language model writes one token at a time, and every new token attends to all the tokens before it.
Recomputing the keys and values of the whole prefix at every step makes generation quadratic; keeping
them in a **KV cache** makes each step cost one token's work. This week you build that cache from
scratch, prove that it changes nothing but the speed, predict how much faster it is on this machine and
measure it, and then look at its price — memory — and at the two ways of paying less:
sharing KV heads (**MQA**, **GQA**) and a **sliding window**.

**You will write** twelve small pieces: a FLOP count, the causal mask, a preallocated cache, attention with
grouped KV heads, the cached decode loop, the cache-size formula, a roofline bound, a model of a decode step's
time (which you then measure), KV-head pooling, a rolling-buffer cache, and two quiz answers. Each exercise poses
a question and says what a correct answer must do; how to do it, and the formula, come right *after* the cell
that checks it. Each is checked by the cell right after it and by `pytest weeks/16 -k exNN` (for example
`pytest weeks/16 -k ex03`); `pytest weeks/16` checks them all (≤ 60 s).

**The model** is SmolLM2-135M-Instruct, a Llama-architecture model small enough for a laptop CPU:
30 layers, d_model 576, 9 query heads and 3 KV heads (so it already uses GQA), head_dim 64.
The lab's implementation is in `lib/modeling/llama.py`; it accepts any cache with an `append(k, v)` method and
any attention function `(q, k, v, causal=True) -> out`, which is how your pieces plug into it.

**Read** Ainslie et al. 2023, *GQA: Training Generalized Multi-Query Transformer Models from Multi-Head
Checkpoints* (§2 and §3), and Shazeer 2019, *Fast Transformer Decoding: One Write-Head is All You Need*
(the MQA paper).

A rule of this notebook: every number is either derived in the cell that prints it, measured there, or rendered
from a recorded measurement that names its machine. Where the course's source notes make a claim, we check it and
say so when it does not hold.
""")

nb.setup("""
import math

import torch
import torch.nn.functional as F

from lib.modeling.kv_cache import CacheOverflowError, KVCache
from lib.modeling.llama import LlamaModel
from grader.checks.week16 import (check_step_flops, check_causal_mask, check_LayerKVCache, check_gqa_attention,
                                  check_generate, check_kv_cache_bytes, check_roofline_time, check_decode_time,
                                  check_pool_kv_heads, check_RollingKVCache, check_answer_q1, check_answer_q3)
""")

nb.code('''
import matplotlib.pyplot as plt
from tqdm.auto import tqdm

from lib.modeling import kv_cache as ref
from lib.bench import roofline
from lib.attn.attention import gqa_attention as lab_attention  # the lab's reference, under another name
from lib.modeling.generate import generate as lib_generate
from lib.modeling.llama import shared_smollm2
from lib.modeling.text import load_text, perplexity
from lib.bench.timing import Conditions, interleaved, not_monotone, report, warning

torch.manual_seed(0)
model, tok = shared_smollm2()  # SmolLM2-135M-Instruct, fp32, on the CPU (or CUDA when there is one); do not modify it
cfg = model.config
print(cfg)
dev = model.device  # every tensor a demo makes goes here: the notebook runs unchanged on a GPU
print(f"{sum(p.numel() for p in model.parameters()):,} parameters on {dev}, {torch.get_num_threads()} CPU threads")
''')

# --- 1 -------------------------------------------------------------------------------------------------------
nb.md("""
## 1. Why generation without a cache is quadratic

Each generation step runs a forward pass over a sequence of *T* positions and takes the last position's
logits to pick token *T + 1*. That pass needs the keys and values of all *T* positions in every layer.
Without a cache it recomputes them: it runs all *T* tokens through the network. With a cache, the keys and
values of the first *T − 1* positions are already there, and only the newest token (position *T*) runs.

Count the work in FLOPs (a multiply-add is 2 FLOPs) and only in matrix products, which is nearly all of it:

* **weights:** every token that runs multiplies through every weight matrix once, where `n_params` counts the
  weights of all linear layers plus the LM head;
* **attention:** each token that runs scores itself against the `seq_len` keys (Q·Kᵀ) and mixes the
  `seq_len` values (P·V), in every layer. (The query heads together have `n_heads · head_dim = d_model`
  dimensions. Count the full score matrix, masked entries included, because that is what a plain
  implementation computes.) Derive the FLOPs of each product from its shapes.

**Exercise 1 (derive).** Write `step_flops(n_params, n_layers, d_model, seq_len, cached)`: the FLOPs of the step
whose forward pass covers `seq_len` positions — uncached, `seq_len` tokens in; cached, one token in and
`seq_len − 1` in the cache. (It yields the logits for token `seq_len + 1`; §7 times exactly this pass.)
""")

nb.exercise("step_flops", '''
def step_flops(n_params: int, n_layers: int, d_model: int, seq_len: int, cached: bool) -> int:
    """FLOPs (matmuls only) of one generation step at sequence length `seq_len`, with or without a KV cache."""
    ### BEGIN SOLUTION
    tokens = 1 if cached else seq_len  # how many tokens run through the network in this step
    return 2 * n_params * tokens + 4 * n_layers * d_model * tokens * seq_len
    ### END SOLUTION
''')

nb.test("test_step_flops", """
check_step_flops(step_flops)
""", points=1)

nb.md("""
**The count, now that your check passes.** A token that runs does one multiply-add per weight: `2 · n_params`.
In one layer its query (`d_model` numbers over all heads) meets `seq_len` keys — `d_model · seq_len`
multiply-adds for Q·Kᵀ — and its probabilities mix `seq_len` values of the same width — as many again for P·V:
`4 · d_model · seq_len` FLOPs per layer. So a step costs `tokens · (2 · n_params + 4 · n_layers · d_model · seq_len)`
with `tokens = seq_len` uncached and `1` cached.

On SmolLM2: the per-step cost, and the total cost of generating *T* tokens (the sum over the steps).
""")

nb.code("""
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
""")

nb.md("""
Per step, the uncached pass costs about *T* times the cached one, so generating *T* tokens costs
Σ 2·n_params·t ≈ n_params·T² without a cache and 2·n_params·T with one: **quadratic against linear**.
The attention term grows one power faster in both cases, but for SmolLM2 it only matters beyond a few
thousand tokens (the crossover printed above). FLOPs are not time, though: section 7 predicts the time,
measures it, and explains why the real ratio is much smaller than the FLOP ratio.

Check: `pytest weeks/16 -k ex01`
""")

# --- 2 -------------------------------------------------------------------------------------------------------
nb.md("""
## 2. The causal mask

A query may attend to its own position and the ones before it. When queries and keys cover the same
*T* positions (the prefill), that is the familiar lower triangle. With a cache they do not: at a decode step
there is **one** query (the new token) and **T + 1** keys (the *T* cached ones and its own); a chunk of `c` new
tokens after `n` cached ones has `c` queries and `n + c` keys. In every case the queries are the **last**
`q_len` of the `kv_len` positions.

**Exercise 2 (derive).** Write `causal_mask(q_len, kv_len, device=None)`: a boolean tensor `[q_len, kv_len]`,
True where query *i* may attend to key *j*. Work out, from where query *i* sits among the `kv_len` positions,
which keys it may see; check your rule on the decode step (one query: what is its row?) and on the prefill
(`q_len == kv_len`). Create the mask on `device` (a mask built on the CPU cannot be applied to scores on a GPU —
the check tries `device="meta"`, a device with shapes but no data).
""")

nb.exercise("causal_mask", '''
def causal_mask(q_len: int, kv_len: int, device=None) -> torch.Tensor:
    """Boolean [q_len, kv_len] on `device`: True where query i may attend to key j (queries are the last q_len positions)."""
    ### BEGIN SOLUTION
    i = torch.arange(q_len, device=device).unsqueeze(1)  # [q_len, 1]
    j = torch.arange(kv_len, device=device).unsqueeze(0)  # [1, kv_len]
    return j <= i + (kv_len - q_len)
    ### END SOLUTION

''')

nb.test("test_causal_mask", """
check_causal_mask(causal_mask)
""", points=1)

nb.md("""
**The rule, now that your check passes.** Query *i* is the (*i* + 1)-th of the last `q_len` positions, so it sits
at position `i + (kv_len − q_len)`; it may see key *j* iff `j <= i + (kv_len - q_len)`. The triangle is aligned at
the **bottom right**: the decode step's single row is all True, and the prefill (`q_len == kv_len`) is the usual
lower triangle. In torch: `torch.arange(kv_len)[None, :] <= torch.arange(q_len)[:, None] + (kv_len - q_len)`,
both aranges made on `device`.
""")

nb.code(r"""
print("prefill, [4, 4]:\n", causal_mask(4, 4).int())
print("cached decode after 4 tokens, [1, 5]:\n", causal_mask(1, 5).int())
print("chunk of 2 after 3 cached, [2, 5]:\n", causal_mask(2, 5).int())
""")

nb.md("""
### The classic bug: the prefill mask during cached decoding

The week's source notes warn that when cached and uncached outputs differ, the likely cause is the
mask. The usual way to get it wrong is to build the mask as if queries and keys started at the same
position (**top-left** alignment): take the first row of the `[T+1, T+1]` prefill mask for the
single decode query. That row lets the new token see *only the first token*. It is easy to do by
accident: `torch.nn.functional.scaled_dot_product_attention(..., is_causal=True)` aligns its mask top-left,
so with one query it attends to key 0 alone — check it below.

We run SmolLM2 with that mask. The prefill is square, so its first token is right; every decode step
after it is wrong, and the text falls apart.
""")

nb.code("""
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
""")

nb.md("""
Check: `pytest weeks/16 -k ex02`
""")

# --- 3 -------------------------------------------------------------------------------------------------------
nb.md("""
## 3. The cache

Each layer keeps its keys and values as `[batch, n_kv_heads, max_len, head_dim]` tensors. Why not simply grow
them with `torch.cat` at every step? Not for the order of the cost: a decode step's attention already reads
the whole cache, O(T) bytes per step, and a `cat` adds one O(T) copy to that (we measure both below). The
reasons are practical: a `cat` allocates a new tensor every step for every layer (allocator churn and
fragmentation, worst on a GPU), the shapes change every step (no CUDA graphs, a recompile for `torch.compile`),
and the memory is not bounded or known in advance.

Note that the cache stores *n_kv_heads*, not *n_heads*: for SmolLM2, 3 heads rather than 9.

**Exercise 3 (design).** Complete `LayerKVCache`. Its interface: `length` (positions held), `max_len`, `nbytes`
(bytes of its K and V storage) and `append(k, v)` with `k`, `v` of `[batch, n_kv_heads, t, head_dim]`, which
returns the keys and values of **all** positions held so far, oldest first. The properties a correct answer keeps
(the check tries each):

* its memory is allocated **once**, in `__init__`, for `max_len` positions, with the `dtype` and on the `device` it
  is given (the model passes its own; on a GPU a cache on the CPU cannot take the GPU's keys);
* an append costs what it appends: it never copies or reallocates what the cache already holds, at any length, and
  what it returns is not a copy either;
* appending past `max_len` raises `CacheOverflowError` (imported at the top) with a message that says what to do,
  and leaves the cache as it was.
""")

nb.exercise("LayerKVCache", '''
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
''')

nb.test("test_LayerKVCache", """
check_LayerKVCache(LayerKVCache)
""", points=2)

nb.md("""
**How it works, now that your check passes.** Two zero tensors of the full shape are made in `__init__`; an append
writes its `t` positions into the slice `[:, :, length:length + t]` (an in-place copy of the new positions only) and
returns the *views* `self.k[:, :, :length]` and `self.v[:, :, :length]` — slices share the buffer's memory, so
nothing is copied. The overflow test comes before any write, so a refused append changes nothing.

Your cache in SmolLM2: 30 layers of it, enough for 32 positions. We prefill a prompt, then try to go past the end.
""")

nb.code("""
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
""")

nb.md("""
**Measured: `torch.cat` growth against a preallocated write.** For SmolLM2's 30 layers at batch 1, one
decode step appends one position per layer. We time that append both ways at a few cache lengths, next to
the step's attention over the cache (one query against all *T* keys, every layer) — the read that happens
anyway. The three are timed in turn, round after round (`lib.bench.timing.interleaved`), so that whatever else the
machine does falls on all of them; the best of the rounds is shown with the spread of all of them
(worst / best), and the load around the measurement.
""")

nb.code("""
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
""")

nb.md("""
Both the `cat` copy and the attention read grow linearly with *T*, so over a whole generation both are
O(T²) bytes in all: `cat` makes each step more expensive by a constant factor (compare the columns above),
it does not change the order. The preallocated write costs the same at every length. (The rolling cache of
§9 also copies — the *W* held positions, every step — which is fine for the same reason: bounded, and next to a
read of the same size.)

Check: `pytest weeks/16 -k ex03`
""")

# --- 4 -------------------------------------------------------------------------------------------------------
nb.md("""
## 4. Attention with grouped KV heads

In multi-head attention (MHA) every query head has its own key and value head. Multi-query attention
(MQA, Shazeer 2019) keeps all the query heads but only **one** K/V head that they share; grouped-query
attention (GQA, Ainslie et al. 2023) sits in between: the `n_heads` query heads form `n_kv_heads` groups of
consecutive heads (the first `n_heads / n_kv_heads` heads are group 0, and so on), and the heads of a group
share one K/V head. MHA (`n_kv_heads == n_heads`) and MQA (`n_kv_heads == 1`) are the two ends of the same code.

**Exercise 4 (design).** Write `gqa_attention(q, k, v, causal=True)` with q `[B, n_heads, q_len, d]` and k, v
`[B, n_kv_heads, kv_len, d]`, returning `[B, n_heads, q_len, d]`: each query head's scaled dot-product attention,
softmax(q·kᵀ/√d)·v, against its group's K/V head. The properties a correct answer keeps (the check tries each):

* with `n_kv_heads == n_heads` it is ordinary multi-head attention; with one KV head, every query head reads it;
* with `causal`, the scores are masked with *your* `causal_mask` (bottom-right aligned: `q_len` may be less than
  `kv_len`), built on the inputs' device (`device=q.device`: the model may be on a GPU);
* fp16 and bf16 inputs work: softmax in float32, the output in the inputs' dtype; q may be a non-contiguous view;
* you write the attention: no `scaled_dot_product_attention` or fused attention ops (the check watches).
""")

nb.exercise("gqa_attention", '''
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
''')

nb.test("test_gqa_attention", """
check_gqa_attention(gqa_attention)
""", points=2)

nb.md("""
**How it works, now that your check passes.** Query head *h* belongs to group `h // (n_heads // n_kv_heads)` and
reads that KV head: SmolLM2's heads 0–2 read KV head 0, 3–5 read KV head 1, 6–8 read KV head 2. The simplest code
repeats each KV head for its group, `k.repeat_interleave(n_heads // n_kv_heads, dim=1)` (same for v), and runs
ordinary attention — but that copies K and V `group` times. Reshaping q instead, `[B, n_kv_heads, group · q_len, d]`
(each group's query heads folded into the query axis), multiplies every KV head once by all its queries and copies
nothing; the scores are reshaped back to `[B, n_heads, q_len, kv_len]` to apply the mask.
""")

nb.code("""
mine = model.with_attention(gqa_attention)  # SmolLM2's weights, your attention
ids = tok("To be, or not to be", return_tensors="pt").input_ids.to(dev)
with torch.no_grad():
    diff = (mine(ids) - model(ids)).abs().max().item()
print(f"SmolLM2 with your gqa_attention vs the lab's: largest logit difference {diff:.2e}")
print("query head -> KV head:", {h: h // (cfg.n_heads // cfg.n_kv_heads) for h in range(cfg.n_heads)})
""")

nb.md("""
Check: `pytest weeks/16 -k ex04`
""")

# --- 5 -------------------------------------------------------------------------------------------------------
nb.md("""
## 5. Generation with the cache

What the model gives you: `model(ids)` runs the positions `ids` `[B, t]` and returns their logits
`[B, t, vocab]`; `model(ids, cache=cache)` does the same for positions that come *after* the ones the cache
holds, using the cached keys and values for attention, and appends the new ones; `model.new_cache(batch, max_len)`
allocates a cache for `max_len` positions (or build 30 of your `LayerKVCache`s into a `KVCache`).

**Exercise 5 (design).** Write `generate(model, input_ids, max_new_tokens, use_cache=True, return_logits=False)`:
greedy decoding (each new token is the argmax of the logits at the last position). It returns the ids
`[B, prompt + new]` and, with `return_logits`, also the logits each step chose from, `[B, new, vocab]` — the same
contract as `lib.modeling.generate.generate`. The properties a correct answer keeps (the check counts what the model is fed):

* cached and uncached generation give the same tokens, and logits within 1e-4 at every step — on SmolLM2
  (64 greedy tokens) and on random tiny configurations (MHA, GQA, MQA, one and two sequences);
* with `use_cache`, each position goes through the model **once**; without it, every step recomputes the whole
  sequence (the baseline the cache is measured against);
* you call the model you are given (no copy of its weights, no layers one by one).
""")

nb.exercise("generate", '''
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
''')

nb.test("test_generate", """
check_generate(generate)
""", points=3)

nb.md("""
**The loop, now that your check passes.** With the cache: allocate it for `prompt + max_new_tokens` positions, run
the whole prompt once (the prefill: its last logits give the first new token), then at every step feed **only the
newest token**, `model(next_ids, cache=cache)`, and take its logits. Without the cache, feed the whole sequence so
far at every step. Either way append the argmax to the ids and keep the step's last-position logits.
""")

nb.code("""
prompt = tok("To be, or not to be, that is the question:", return_tensors="pt").input_ids.to(dev)
c_ids, c_logits = generate(model, prompt, 64, use_cache=True, return_logits=True)
u_ids, u_logits = generate(model, prompt, 64, use_cache=False, return_logits=True)
print(f"identical tokens: {torch.equal(c_ids, u_ids)}; largest logit difference over 64 steps: "
      f"{(c_logits - u_logits).abs().max().item():.2e}")
print(repr(tok.decode(c_ids[0, prompt.shape[1]:])))
""")

nb.md("""
The logits are not bit-identical — the cached and uncached passes multiply matrices of different shapes,
so floating-point sums are taken in different orders — but they agree well within 1e-4 (printed above), and
the tokens are the same. (Greedy SmolLM2 soon repeats itself on this prompt; that is the model, not the cache.)
How much faster the cached loop is, and why, is section 7's question.

Check: `pytest weeks/16 -k ex05`
""")

# --- 6 -------------------------------------------------------------------------------------------------------
nb.md("""
## 6. How much memory

The cache holds, for every layer, a key and a value vector (each `head_dim` numbers) per KV head and per
position, for every sequence of the batch.

**Exercise 6 (derive).** Write `kv_cache_bytes(n_layers, n_kv_heads, head_dim, seq_len, batch=1,
bytes_per_element=2)` (fp16/bf16 by default): derive the byte count from the sentence above.

**Milestones** (the source notes' figures, which the check holds your formula to): OPT-13B (40 layers, 40 heads of
128) needs 819,200 B per token; GPT-3 175B (96 layers, 96 heads of 128) needs 4.5 MiB per token; for SmolLM2 the
formula equals the bytes of the cache tensors the model actually allocates.
""")

nb.exercise("kv_cache_bytes", '''
def kv_cache_bytes(n_layers: int, n_kv_heads: int, head_dim: int, seq_len: int,
                   batch: int = 1, bytes_per_element: int = 2) -> int:
    """Bytes of a KV cache holding seq_len positions for batch sequences."""
    ### BEGIN SOLUTION
    return 2 * n_layers * n_kv_heads * head_dim * seq_len * batch * bytes_per_element
    ### END SOLUTION
''')

nb.test("test_kv_cache_bytes", """
check_kv_cache_bytes(kv_cache_bytes)
""", points=2)

nb.md("""
**The formula, now that your check passes:** `2 (K and V) · n_layers · n_kv_heads · head_dim · seq_len · batch ·
bytes_per_element`. Per token and sequence that is `2 · n_layers · n_kv_heads · head_dim` numbers — OPT-13B:
2 · 40 · 40 · 128 = 409,600 numbers, 819,200 B in fp16.
""")

nb.code("""
opt = kv_cache_bytes(40, 40, 128, 1)
print(f"OPT-13B: {opt:,} B/token; a 2048-token sequence: {kv_cache_bytes(40, 40, 128, 2048) / 1e9:.2f} GB "
      f"= {kv_cache_bytes(40, 40, 128, 2048) / 2**30:.2f} GiB")
print(f"GPT-3 175B: {kv_cache_bytes(96, 96, 128, 1):,} B/token = {kv_cache_bytes(96, 96, 128, 1) / 2**20} MiB")
allocated = model.new_cache(batch=2, max_len=1000).nbytes  # fp32, like the model
formula = kv_cache_bytes(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, 1000, batch=2, bytes_per_element=4)
print(f"SmolLM2, batch 2, 1000 positions, fp32: allocated {allocated:,} B, formula {formula:,} B, equal: {allocated == formula}")
""")

nb.md("""
Real configurations (layers, query heads, KV heads, head_dim from each model's published configuration),
in fp16, against context length. SmolLM2 appears three times: as it is (GQA, 3 KV heads), as it would be
with MHA (9), and with MQA (1). The last column is each cache against the same model with MHA.
""")

nb.code("""
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
""")

nb.md("""
Sharing KV heads shrinks the cache (the last column); by how much, for a given number of query and KV heads, is
question 3 of section 10 — and the course's source notes state that factor in two ways that disagree, which we
take apart after you answer it. The 4.5 "MB" per token of GPT-3 is 4.5 **MiB** (4,718,592 B).

Check: `pytest weeks/16 -k ex06`
""")

# --- 7 -------------------------------------------------------------------------------------------------------
nb.md("""
## 7. How much faster, and why

The week's source notes say the cache makes a token "~15× faster at 64 tokens and ~40× at 256". Section 1's
FLOP ratio is about *T* itself (printed there, at 64 and 256). Neither is what you will measure, because time is
not FLOPs.
Here you build a model of the time from two numbers of the machine, predict, and then measure your own `generate`.

A kernel must do its arithmetic (at best at the machine's peak FLOP/s) and move its bytes between memory and the
processor (at best at the memory bandwidth), and a modern processor does both at once: while one block of data is
being multiplied, the next is already on its way.

**Exercise 7 (derive).** Write `roofline_time(flops, bytes_moved, flops_per_s, bytes_per_s)`: the least time
(in seconds) such a kernel can take, when its compute and its memory traffic overlap perfectly.
""")

nb.exercise("roofline_time", '''
def roofline_time(flops: float, bytes_moved: float, flops_per_s: float, bytes_per_s: float) -> float:
    """Lower bound on a kernel's time (s) when compute and memory traffic overlap."""
    ### BEGIN SOLUTION
    return max(flops / flops_per_s, bytes_moved / bytes_per_s)
    ### END SOLUTION
''')

nb.test("test_roofline_time", """
check_roofline_time(roofline_time)
""", points=1)

nb.md("""
**Why, now that your check passes.** The arithmetic alone takes `flops / flops_per_s`, the traffic alone
`bytes_moved / bytes_per_s`; if they overlap perfectly the kernel takes as long as the **slower** of the two —
`max(...)`, not the sum. This is the *roofline model*: a kernel is compute-bound when its FLOPs per byte exceed the
machine's **ridge point** (FLOP/s ÷ bandwidth), memory-bound below it.

Now this machine — the device the model is on (`dev`): matmul throughput from a 2048×2048 product, and
bandwidth from a matrix-vector product over a 256 MiB matrix (larger than any CPU cache, and the same
operation as a decode step; a plain streaming read of the same bytes, the roofline's true ceiling, is faster —
week 20 uses that one). The two are timed in turn, ten rounds; the best round counts (other programs only slow
a round down), and the spread and the load say how far to trust it. Close other programs first.
""")

nb.code("""
dtype = model.embed.weight.dtype
N = 2048
a, b = torch.randn(N, N, dtype=dtype, device=dev), torch.randn(N, N, dtype=dtype, device=dev)
w = torch.randn(256 * 2**20 // (4096 * a.element_size()), 4096, dtype=dtype, device=dev)  # 256 MiB
if w.device.type == "cpu":
    w = roofline.on_huge_pages([w])[0]  # on 2 MB pages, as lib.modeling.fast keeps its weights: the read, not a TLB test
x = torch.randn(1, 4096, dtype=dtype, device=dev)
conditions = Conditions.now()
with torch.no_grad():
    probes = interleaved({"matmul 2048x2048": lambda: a @ b, "mat-vec over 256 MiB": lambda: F.linear(x, w)},
                         repeats=10, device=dev)
conditions.done()
flops_per_s = 2 * N ** 3 / probes["matmul 2048x2048"].best
bytes_per_s = w.numel() * w.element_size() / probes["mat-vec over 256 MiB"].best
print(report(probes, conditions))
print(f"{dev}: matmul {flops_per_s / 1e9:.0f} GFLOP/s, mat-vec bandwidth {bytes_per_s / 1e9:.1f} GB/s, "
      f"ridge point {flops_per_s / bytes_per_s:.0f} FLOP/byte")
del a, b, w, x
""")

nb.md("""
### Predict, then measure: one decode step

A cached decode step at batch *B*: each of the *B* sequences feeds one new token, and each sequence's cache holds
`cache_len` positions before the step.

**Exercise 8 (predict).** Write `decode_time(config, cache_len, batch, flops_per_s, bytes_per_s)`: your model of
the seconds one such step takes on a machine with these peak rates. `config` is a dict with the model's
`n_params` (the weights of its matrix products, LM head included), `n_layers`, `d_model`, `n_heads`,
`n_kv_heads`, `head_dim` and `bytes_per_element` (of the weights and of the cache alike). Ask yourself which bytes
must come from memory during the step, how many FLOPs it does (section 1), and which of the two sets the time —
you have the tools from exercises 1, 6 and 7. The check grades your model on configurations it has not seen
(drawn each run: big and small models, batches up to 64, memory-bound and compute-bound machines), and
then you measure.
""")

nb.exercise("decode_time", '''
def decode_time(config: dict, cache_len: int, batch: int, flops_per_s: float, bytes_per_s: float) -> float:
    """Predicted seconds of one cached decode step: `batch` sequences, `cache_len` positions cached in each."""
    ### BEGIN SOLUTION
    c, seq_len = config, cache_len + 1  # the step's pass covers the cached positions and the new one
    flops = batch * (2 * c["n_params"] + 4 * c["n_layers"] * c["d_model"] * seq_len)  # exercise 1, per sequence
    weights = c["n_params"] * c["bytes_per_element"]  # every weight read once, for the whole batch
    cache = 2 * c["n_layers"] * c["n_kv_heads"] * c["head_dim"] * seq_len * batch * c["bytes_per_element"]  # exercise 6
    return max(flops / flops_per_s, (weights + cache) / bytes_per_s)  # exercise 7: they overlap
    ### END SOLUTION
''')

nb.test("test_decode_time", """
check_decode_time(decode_time)
""", points=2)

nb.md("""
**The model, now that your check passes.** One step reads every weight **once** — a weight fetched from memory
is multiplied by all *B* new tokens before it is dropped — plus each sequence's own cache: `n_params ·
bytes_per_element + kv_cache_bytes(n_layers, n_kv_heads, head_dim, cache_len + 1, batch, bytes_per_element)`
(the new position is written and read too). It does §1's cached-step FLOPs for each sequence,
`batch · step_flops(n_params, n_layers, d_model, cache_len + 1, cached=True)`. Its time is the roofline of the
two. At batch 1 that is 2 FLOPs per weight against `bytes_per_element` bytes — 0.5 FLOP/byte in fp32, far below
the ridge point printed above — so a decode step is **memory-bound**: its time is its bytes over the bandwidth,
and the weights dominate them until the cache grows past the weights. Batching raises the FLOPs per byte
(*B* sequences share each weight read) until the ridge point, where compute takes over.

Now the prediction for SmolLM2 on this machine, at 64 and 256 cached positions, beside your own `generate`
timed there. A cached step is measured as the difference between `generate` of 1 + `STEPS` new tokens and of 1
new token after the same prompt, divided by `STEPS` (the prefill is in both); an uncached step at the same position
is `generate(..., 1, use_cache=False)` after a prompt one token longer — one forward over all of it. Each is timed
three times, in turn with the others, and the best counts.
""")

nb.code(r"""
smol = dict(n_params=n_params, n_layers=cfg.n_layers, d_model=cfg.d_model, n_heads=cfg.n_heads,
            n_kv_heads=cfg.n_kv_heads, head_dim=cfg.head_dim, bytes_per_element=model.embed.weight.element_size())
weight_bytes = n_params * smol["bytes_per_element"]
STEPS = 32
text_ids = tok(load_text("hamlet")[:4000], return_tensors="pt").input_ids[:, :256 + 1].to(dev)  # [1, 257]

def predicted_cached(T):  # seconds: the steps measured below have T ... T + STEPS - 1 positions cached
    return decode_time(smol, T + STEPS // 2, 1, flops_per_s, bytes_per_s)

def predicted_uncached(T):  # seconds: one forward over T + 1 positions, the weights read once
    return roofline_time(step_flops(n_params, cfg.n_layers, cfg.d_model, T + 1, cached=False), weight_bytes,
                         flops_per_s, bytes_per_s)

conditions = Conditions.now()
timed = {}
for T in tqdm([64, 256], desc="your generate"):
    timed[T] = interleaved({
        "prefill only": lambda: generate(model, text_ids[:, :T], 1),
        f"prefill + {STEPS} steps": lambda: generate(model, text_ids[:, :T], 1 + STEPS),
        "uncached step": lambda: generate(model, text_ids[:, :T + 1], 1, use_cache=False),
    }, repeats=3, device=dev)
conditions.done()
measured_cached = {T: (t[f"prefill + {STEPS} steps"].best - t["prefill only"].best) / STEPS for T, t in timed.items()}
measured_uncached = {T: t["uncached step"].best for T, t in timed.items()}
overhead = max(0.0, measured_cached[64] - predicted_cached(64))  # what the model leaves out, read off at 64

print(f"bytes per cached step: {weight_bytes / 1e6:.0f} MB of weights + the cache, "
      f"{kv_cache_bytes(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, 256, 1, smol['bytes_per_element']) / 1e6:.1f} MB at 256 positions")
print(f"\n{'T':>4} | {'cached step (ms)':^28} | {'uncached step (ms)':^19} | {'speedup':^27}")
print(f"{'':>4} | {'predicted':>9} {'measured':>9} {'gap':>8} | {'predicted':>9} {'measured':>9} | "
      f"{'predicted':>9} {'+ gap':>7} {'measured':>9}")
speedups = {}
for T in (64, 256):
    pc, mc, pu, mu = predicted_cached(T), measured_cached[T], predicted_uncached(T), measured_uncached[T]
    speedups[T] = dict(predicted=pu / pc, with_gap=(pu + overhead) / (pc + overhead), measured=mu / mc)
    print(f"{T:>4} | {pc * 1e3:9.1f} {mc * 1e3:9.1f} {(mc - pc) * 1e3:+8.1f} | {pu * 1e3:9.0f} {mu * 1e3:9.0f} | "
          f"{speedups[T]['predicted']:8.1f}x {speedups[T]['with_gap']:6.1f}x {speedups[T]['measured']:8.1f}x")
print(f"your generate decodes at {1 / measured_cached[64]:.1f} tok/s after 64 positions "
      f"(the model predicts {1 / predicted_cached(64):.1f})")
print(report({f"T={T}: {name}": x for T, t in timed.items() for name, x in t.items()}, conditions))
# More positions cost more bytes and FLOPs: a curve that falls is a disturbance, not a finding.
for curve, what in [(measured_cached, "the cached step's time"), (measured_uncached, "the uncached step's time")]:
    disturbed = not_monotone(list(curve), list(curve.values()), what)
    if disturbed or min(curve.values()) <= 0:
        print(disturbed or f"measurement disturbed: {what} measured as no time at all — rerun when the machine is quieter")

Ts_all = list(range(1, 513))
fig, ax = plt.subplots(figsize=(7, 4.2))
for pred, color, name in [(predicted_cached, "C0", "cached"), (predicted_uncached, "C1", "uncached")]:
    curve = [pred(T) * 1e3 for T in Ts_all]
    ax.plot(Ts_all, curve, "--", color=color, lw=1, label=f"{name}: your model")
    ax.plot(Ts_all, [c + overhead * 1e3 for c in curve], ":", color=color, lw=1.5, label=f"{name}: model + the gap at 64")
ax.plot(list(measured_cached), [m * 1e3 for m in measured_cached.values()], "o", color="C0", label="cached: measured")
ax.plot(list(measured_uncached), [m * 1e3 for m in measured_uncached.values()], "s", color="C1", label="uncached: measured")
ax.set_yscale("log")
ax.set(xlabel="positions before the step, T", ylabel="time of one step (ms, log scale)",
       title=f"SmolLM2 on {dev}: predicted and measured (your generate)")
ax.legend(fontsize=7); ax.grid(alpha=0.3, which="both"); plt.show()
""")

nb.md(f"""
**Reading the numbers.**

* The **cached** step is memory-bound, as predicted, but slower than the model says: an eager PyTorch forward
  launches hundreds of small operations per token, each costing microseconds of Python and dispatch, and the
  model's 576-wide matrices read memory more slowly than the 256 MiB mat-vec did. The model leaves that out; the
  "gap" column is it, read off at 64 positions and roughly the same at 256. The cache itself is small next to the
  weights at 256 positions, so the cached step's time hardly grows.
* The **uncached** step is close to a compute-bound forward pass, but a 576-wide model runs below the
  2048×2048 matmul's FLOP/s (its matrices are smaller, and softmax, norms and RoPE are not matmuls), so it
  is slower than predicted.
* Because the uncached step costs ∝ *T* (compute) and the cached step is ≈ constant (bandwidth), the
  ratio is roughly `(2·n_params·T / FLOP/s) / (4·n_params / bandwidth) = T · bandwidth / (2 · FLOP/s)`
  once *T* is past the ridge point: **linear in T, with a slope set by the machine**, not a constant of
  the method. The speedups printed above are what this machine gives.
* **The source notes' "15× at 64 and 40× at 256"** name no model and no hardware, so they cannot be checked
  as stated; what can be said is what sets them. The per-token speedup is not a property of the KV cache but
  of the machine's FLOP/s-to-bandwidth ratio, the weights' precision and the per-step overhead. On a GPU
  the same formula with bf16 weights (2 bytes each) gives `T · bandwidth / FLOP/s`; an A100 80GB's
  published 312 TFLOP/s and 2.0 TB/s make that about T / 156 — at batch 1 a 64-token forward costs hardly
  more than one token. There the cache pays off through the O(T²) → O(T) total at long contexts and large
  batches, not through a big per-token factor at 64 tokens. Measure before you quote a speedup.
* **The lab's recorded runs** (`benchmarks/decode.py`, the same model in `lib.modeling.llama`, fp32 on the CPU), to put
  beside your own figure: on the lab's EPYC, `lib.modeling.generate` decodes at {recorded_md("decode", MODEL_DECODE, EPYC)}
  against a bandwidth roofline of {recorded_md("decode", "decode b1: roofline", EPYC)}; on an H200, at
  {recorded_md("decode", MODEL_DECODE, H200)} against a roofline of {recorded_md("decode", "decode b1: roofline", H200)}
  — there the eager step's launches, not the bandwidth, set the time, and the same step replayed as a CUDA graph
  runs at {recorded_md("decode", "decode b1 n64: lib.modeling.generate (lib.modeling.fast, CUDA graphs)", H200)}.

Check: `pytest weeks/16 -k "ex07 or ex08"`
""")

# --- 8 -------------------------------------------------------------------------------------------------------
nb.md("""
## 8. What sharing KV heads costs

Memory is one side; quality is the other. Ainslie et al. turn an MHA checkpoint into a GQA one by
**mean-pooling** the key and value projection heads of each group into one head, then *uptraining* for
about 5 % of the original pre-training compute (they compare pooling with keeping the first head of each
group and with random initialisation: pooling works best). We can afford the pooling, not the uptraining, so we
measure what is lost *before* uptraining.

SmolLM2 has 9 query heads and 3 KV heads. Pooling merges whole KV heads, so the new count must divide 3:
the only options are **3** (unchanged) and **1** (MQA). (9 divides into 9, 3 and 1, but going from 3 up
to 9 KV heads would only copy each head three times: the same outputs at 3× the memory.)

**Exercise 9 (design).** Write `pool_kv_heads(model, n_groups)`: a **new** `LlamaModel` with `n_kv_heads = n_groups`,
whose `k_proj` and `v_proj` weights in every layer are the means of the original heads of each group
(consecutive heads: group *g* pools heads *g·r … g·r + r − 1*, with *r* = `n_kv_heads // n_groups`) and whose
other weights are copies. Do not modify `model` (other cells use it). `model.config.replace(n_kv_heads=...)`
gives the new configuration; `k_proj.weight` is `[n_kv_heads · head_dim, d_model]`, head by head.
""")

nb.exercise("pool_kv_heads", '''
@torch.no_grad()
def pool_kv_heads(model: LlamaModel, n_groups: int) -> LlamaModel:
    """A new model whose n_groups KV heads are the means of the model's KV heads in each group."""
    ### BEGIN SOLUTION
    cfg = model.config
    r = cfg.n_kv_heads // n_groups
    state = {}
    for name, w in model.state_dict().items():
        if name.endswith(("attn.k_proj.weight", "attn.v_proj.weight")):
            w = w.reshape(n_groups, r, cfg.head_dim, cfg.d_model).mean(dim=1).reshape(n_groups * cfg.head_dim, cfg.d_model)
        state[name] = w.clone()
    new = LlamaModel(cfg.replace(n_kv_heads=n_groups), attention_fn=model.attention_fn)
    new.load_state_dict(state)
    return new.to(model.device).eval()
    ### END SOLUTION
''')

nb.test("test_pool_kv_heads", """
check_pool_kv_heads(pool_kv_heads)
""", points=2)

nb.md("""
**How it works, now that your check passes.** Each `k_proj` / `v_proj` weight viewed as
`[n_groups, r, head_dim, d_model]` and averaged over the `r` axis is the pooled projection; every other tensor of
the state dict is cloned, and a `LlamaModel` built from `config.replace(n_kv_heads=n_groups)` loads them.

**Milestone:** perplexity on *Hamlet* (Project Gutenberg; `data/text/hamlet.txt`) with 3 KV heads and
with 1. `lib.modeling.text.perplexity` reads the text in windows of 256 tokens advancing by 128, so every token scored
after the first window sees at least 128 tokens of context (the first 128 tokens see only what precedes them).
We score the first 2,048 tokens of the play.
""")

nb.code("""
from lib.modeling.gqa import kv_group_options

eval_ids = tok(load_text("hamlet"), return_tensors="pt").input_ids[0, :2049]
print("KV-head counts reachable by pooling:", kv_group_options(cfg.n_heads, cfg.n_kv_heads))
rows = []
for g in kv_group_options(cfg.n_heads, cfg.n_kv_heads):
    m = model if g == cfg.n_kv_heads else pool_kv_heads(model, g)
    ppl = perplexity(m, eval_ids, window=256, stride=128, progress=True, desc=f"{g} KV heads")
    rows.append((g, kv_cache_bytes(cfg.n_layers, g, cfg.head_dim, 1), ppl))
    del m
base = rows[0][2]
print(f"{'KV heads':>8} {'KV bytes/token (fp16)':>22} {'perplexity':>11} {'NLL change (nats/token)':>24}")
for g, b, ppl in rows:
    print(f"{g:>8} {b:>22,} {ppl:>11.2f} {math.log(ppl / base):>+24.3f}")
print(f"pooling {cfg.n_kv_heads} -> 1 KV head: cache {rows[0][1] / rows[-1][1]:.0f}x smaller, perplexity {base:.1f} -> "
      f"{rows[-1][2]:,.0f} ({rows[-1][2] / base:,.0f}x, {math.log(rows[-1][2] / base):+.1f} nats per token)")

fig, ax = plt.subplots(1, 2, figsize=(8, 3.2))
names = [f"{g} KV heads" + (" (original)" if g == cfg.n_kv_heads else " (pooled MQA)") for g, _, _ in rows]
ax[0].bar(names, [b / 1024 for _, b, _ in rows], color=["C0", "C1"]); ax[0].set(ylabel="KiB per token (fp16)", title="KV cache")
bars = ax[1].bar(names, [p for _, _, p in rows], color=["C0", "C1"])
ax[1].bar_label(bars, fmt="%.1f"); ax[1].set_yscale("log")
ax[1].set(ylabel="perplexity on Hamlet (log scale)", title="quality (lower is better)")
for a in ax: a.tick_params(axis="x", labelsize=8)
plt.tight_layout(); plt.show()
""")

nb.md("""
Pooling to one KV head cuts the cache 3× and, without uptraining, it breaks the model: the perplexity
printed above rises by orders of magnitude — several nats per token. The three KV heads learned
different keys and values, and their mean is none of them; with RoPE, each head also uses the rotation
frequencies in its own way, so an averaged key matches no query well. Here "memory saved against quality
lost" is 3× against a model that no longer models English. That is why the GQA paper uptrains after
pooling (and finds uptrained GQA much closer to the original MHA quality than uptrained MQA), and why models such as SmolLM2 and
Llama-2-70B are *trained* with their KV heads shared from the start instead of converted afterwards.

Check: `pytest weeks/16 -k ex09`
""")

# --- 9 -------------------------------------------------------------------------------------------------------
nb.md("""
## 9. Sliding window

Another way to bound the cache: let each token attend only to the last *W* positions (itself included),
as Mistral 7B does (Jiang et al. 2023, with *W* = 4096). Then the cache never needs more than *W*
positions, whatever the sequence length: a **rolling buffer** of *W* slots, in which each new position takes the
place of the one that just left the window.

`lib.modeling.kv_cache.sliding_window_attention(W)` is the matching attention: the causal mask, minus every key more
than *W − 1* positions behind its query (`lib.attn.masks.sliding_window_mask`, bottom-right aligned like yours).

**Exercise 10 (design).** Write `RollingKVCache(batch, n_kv_heads, window, head_dim, dtype, device)`. Its interface:
`k`, `v` storage of `[batch, n_kv_heads, window, head_dim]` and `nbytes` (its bytes); `length`, how many positions
were ever appended (the model takes the next RoPE position from it); `append(k, v)` for `t ≥ 1` new positions,
which returns the positions still held (at most `window`, **oldest first**) followed by the new ones — the
sliding-window mask hides any extra. The properties a correct answer keeps (the check tries each):

* its storage is allocated once, in `__init__`, on the `device` given, and what an append allocates is bounded by
  the window and what it appends — never by how many positions have gone by;
* every append writes its positions into that storage (keeping only the last `window` of them), for any `t`: one
  position, several, more than a window at once.

**Milestone:** decoding with it gives the logits of full attention under a sliding-window mask, and its
memory stays constant as the sequence grows.
""")

nb.exercise("RollingKVCache", '''
class RollingKVCache:
    """A sliding-window cache: a ring buffer of `window` positions per layer."""

    def __init__(self, batch: int, n_kv_heads: int, window: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device=None):
        ### BEGIN SOLUTION
        shape = (batch, n_kv_heads, window, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # [batch, n_kv_heads, window, head_dim]
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.window = window
        self.length = 0  # positions ever appended
        ### END SOLUTION

    @property
    def nbytes(self) -> int:
        ### BEGIN SOLUTION
        return 2 * self.k.numel() * self.k.element_size()
        ### END SOLUTION

    def append(self, k: torch.Tensor, v: torch.Tensor):
        """k, v [batch, n_kv_heads, t, head_dim] -> (held + new keys, held + new values), oldest first."""
        ### BEGIN SOLUTION
        t, w = k.shape[2], self.window
        held = min(self.length, w)
        old = torch.arange(self.length - held, self.length, device=self.k.device) % w  # slots of the held positions, oldest first
        keys = torch.cat([self.k[:, :, old], k], dim=2)  # [B, Hkv, held + t, d]
        values = torch.cat([self.v[:, :, old], v], dim=2)
        keep = min(t, w)
        slots = torch.arange(self.length + t - keep, self.length + t, device=self.k.device) % w
        self.k[:, :, slots] = k[:, :, t - keep:]
        self.v[:, :, slots] = v[:, :, t - keep:]
        self.length += t
        return keys, values
        ### END SOLUTION
''')

nb.test("test_RollingKVCache", """
check_RollingKVCache(RollingKVCache)
""", points=2)

nb.md("""
**How it works, now that your check passes.** Position *p* lives in slot *p mod W*: the position that leaves the
window, *p − W*, had the same slot. The held positions, oldest first, are `length − held … length − 1` with
`held = min(length, W)`; gather their slots (`torch.arange(length − held, length, device=...) % W`), append the new
keys after them, then write the last `min(t, W)` new positions into their slots.

On SmolLM2 with *W* = 32: generate 96 tokens with your rolling cache, then check every step against one
uncached forward pass over the final sequence under the sliding-window mask, and track the cache's memory
against a full cache's.
""")

nb.code("""
W = 32
windowed = model.with_attention(ref.sliding_window_attention(W))
prompt = tok("Something is rotten in the state of Denmark.", return_tensors="pt").input_ids.to(dev)
rolling = KVCache([RollingKVCache(1, cfg.n_kv_heads, W, cfg.head_dim, device=dev) for _ in range(cfg.n_layers)])
ids, step_logits, mem_rolling, mem_full = prompt, [], [], []
with torch.no_grad():
    logits = windowed(prompt, cache=rolling)[:, -1]
    for _ in tqdm(range(96), desc=f"rolling cache, W={W}"):
        step_logits.append(logits)
        nxt = logits.argmax(-1, keepdim=True)
        ids = torch.cat([ids, nxt], 1)
        mem_rolling.append(rolling.nbytes)
        mem_full.append(kv_cache_bytes(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, ids.shape[1] - 1, bytes_per_element=4))
        logits = windowed(nxt, cache=rolling)[:, -1]
    full = windowed(ids[:, :-1])[0, prompt.shape[1] - 1:]  # uncached, sliding-window mask: every step's logits
err = (torch.cat(step_logits) - full).abs().max().item()
print(f"rolling cache vs full sliding-window attention: largest logit difference {err:.2e} over 96 steps")
print(f"rolling cache: {rolling.nbytes:,} B at every step; a full cache would now hold {mem_full[-1]:,} B")
print(repr(tok.decode(ids[0, prompt.shape[1]:])))

fig, ax = plt.subplots(figsize=(6, 3.2))
pos = range(prompt.shape[1], prompt.shape[1] + 96)
ax.plot(pos, [m / 2**20 for m in mem_full], label="full cache (grows with the sequence)")
ax.plot(pos, [m / 2**20 for m in mem_rolling], label=f"rolling buffer, W = {W}")
ax.axvline(W, color="gray", ls=":", lw=1)
ax.set(xlabel="positions held", ylabel="MiB (fp32)", title="SmolLM2 KV cache memory"); ax.legend(); ax.grid(alpha=0.3); plt.show()
""")

nb.md("""
The outputs are exact, but they are the outputs of a *different model*: SmolLM2 was trained to see its whole
context, and here it only sees 32 positions. A model must be trained (or at least fine-tuned) with the window
it will be served with; Mistral stacks its layers so that information still travels further than *W*
(each layer reaches *W* positions back through the previous layer's outputs).

### Beyond the anchors: attention sinks

How much does the window cost in quality, and can it be bought back? Xiao et al. 2023 (*Efficient Streaming
Language Models with Attention Sinks*, "StreamingLLM") observed that models park a large share of their
attention on the first few tokens of a sequence, whatever those tokens are: a sliding window that drops them
breaks the softmax's habits. Their fix keeps the first few positions ("sinks") in the cache forever and
slides the rest: same memory. `sliding_window_attention(W, n_sinks=4)` masks that way (each query sees the 4
first positions plus itself and the 27 before it: 32 keys, like W = 32). We score the same Hamlet tokens
with full attention, a plain window of 32, and 28 + 4 sinks (windows of 128 tokens advancing by 64).

Check: `pytest weeks/16 -k ex10`
""")

nb.code("""
sink_ids = eval_ids[:257]
sink_rows = []
for name, fn in [("full attention", None), ("window W = 32", ref.sliding_window_attention(32)),
                 ("W = 28 recent + 4 sinks", ref.sliding_window_attention(32, n_sinks=4))]:
    m = model if fn is None else model.with_attention(fn)
    sink_rows.append((name, perplexity(m, sink_ids, window=128, stride=64, progress=True, desc=name)))
print(f"perplexity on {sink_ids.numel() - 1} Hamlet tokens, windows of 128 advancing by 64:")
for name, ppl in sink_rows:
    print(f"  {name:<26} {ppl:>9.1f}")
print(f"keeping 4 sink positions instead of 4 more recent ones: perplexity {sink_rows[1][1]:.1f} -> {sink_rows[2][1]:.1f} "
      f"({sink_rows[1][1] / sink_rows[2][1]:.1f}x lower; full attention: {sink_rows[0][1]:.1f})")
""")

# --- 10 ------------------------------------------------------------------------------------------------------
nb.md("""
## 10. Check your understanding

Three questions from the course's Phase IV quiz. Numeric answers are functions returning a number.

**Q1 (exercise 11).** A 13B-parameter model in FP16 requires how much memory for its weights alone? Answer in GB
(10⁹ bytes).
""")

nb.exercise("answer_q1", '''
def answer_q1() -> float:
    """GB (1e9 bytes) of FP16 weights of a 13B-parameter model."""
    ### BEGIN SOLUTION
    return 13e9 * 2 / 1e9
    ### END SOLUTION
''')

nb.test("test_answer_q1", """
check_answer_q1(answer_q1)
""", points=1)

nb.md("""
**Q2.** During LLM decode, GPU utilization is typically low. Why? What is the hardware bottleneck?
Answer in a few sentences below; use what you predicted and measured in section 7. (Graded by hand.)
""")

nb.answer("answer_q2", """
**Model answer.** At batch 1, a decode step multiplies a single token vector by every weight matrix: each
weight is read from memory once and used for one multiply-add (2 FLOPs per 2 bytes in fp16 — about 1 FLOP
per byte), and each step also reads the whole KV cache. A GPU needs on the order of 150 FLOPs per byte of
memory traffic (A100: 312 TFLOP/s against ≈ 2 TB/s) to keep its arithmetic units busy, so they mostly
wait. The bottleneck is **memory bandwidth** (HBM): the step time ≈ (weight bytes + KV-cache bytes) /
bandwidth. In section 7 the cached step stayed almost flat in *T* (the weights dominate the bytes), but it was
slower than the weights-over-bandwidth prediction: a roughly fixed per-step overhead (dispatching hundreds of
small ops, small matrices that do not reach peak bandwidth) comes on top — on a GPU at batch 1 the same shows up
as kernel-launch latency, one more reason the arithmetic units sit idle. Remedies raise the FLOPs per byte or cut the bytes: batching many sequences (each weight read
serves the whole batch), quantized weights, smaller caches (GQA/MQA), speculative decoding.

**Mark scheme (2 points).** 1 point: decode is memory-bandwidth bound — the named bottleneck is memory
(HBM) bandwidth, not compute. 1 point: the reason — one token per step gives low arithmetic intensity (each
weight, and the KV cache, read for ~1–2 FLOPs per byte, far below the GPU's FLOP/byte ratio); mentioning
that batching/quantization/GQA help is a plus but not required. No point for "the GPU is idle waiting for
the CPU" alone or "attention is quadratic".
""", points=2)

nb.md("""
**Q3 (exercise 12).** Grouped-query attention with 32 query heads and 8 KV heads reduces the KV cache by what factor
compared with standard MHA?
""")

nb.exercise("answer_q3", '''
def answer_q3() -> float:
    """KV-cache reduction factor of GQA (32 query heads, 8 KV heads) relative to MHA (32 KV heads)."""
    ### BEGIN SOLUTION
    return kv_cache_bytes(32, 32, 128, 1) / kv_cache_bytes(32, 8, 128, 1)  # 32 / 8
    ### END SOLUTION
''')

nb.test("test_answer_q3", """
check_answer_q3(answer_q3)
""", points=1)

nb.md("""
**Why, now that your check passes.** The cache holds one K and one V per **KV head**, so it shrinks by
`n_heads / n_kv_heads`, the number of query heads that share each KV head: 32 / 8 = 4×. MQA saves `n_heads`×
(32× for a 32-head model, only 9× for SmolLM2); Llama-2-70B saves 8× because it has 64 query heads for its 8 KV heads.

### The source notes' "8 groups → 8×", read both ways

The course's quick reference (seed 001) draws GQA as 32 query heads and **4** KV heads and writes "GQA: 8×
reduction (32 heads → 4)"; elsewhere it writes "GQA (8 groups): 8× reduction" and "8 groups for 32 heads … 8×
memory reduction". It is not simply wrong: it is inconsistent about what a *group* is. In the GQA paper a group is
the set of query heads that share one KV head, so the number of groups **is** the number of KV heads. The cell
below derives what each reading gives.
""")

nb.code("""
H, L, d = 32, 32, 128  # 32 query heads; the factor does not depend on the layers or the head size
readings = {
    "'32 heads -> 4': 4 KV heads (4 groups of 8 query heads)": 4,
    "'8 groups', as the GQA paper counts groups: 8 KV heads": 8,
    "'8 groups' read as groups of 8 query heads: 32 / 8 = 4 KV heads": 32 // 8,
}
for name, n_kv in readings.items():
    print(f"{name:<68} {kv_cache_bytes(L, H, d, 1) / kv_cache_bytes(L, n_kv, d, 1):.0f}x smaller than MHA")
""")

nb.md("""
So "32 heads → 4" does give 8×, and so does "8 groups" if a group means eight query heads; but with the paper's
(and the quiz's) meaning — 8 groups = 8 KV heads — the saving is 4×, which is what Q3 asks and what the same
course's quiz (seed 002) answers. Say which you mean: "8 KV heads" or "groups of 8 query heads".

## What you built

A cache that makes generation linear instead of quadratic without changing a single token; the mask
that makes it correct; attention for any number of KV heads; a model of a decode step's time, predicted and then
measured on this machine; the memory formula and what GQA, MQA and a sliding window do to it. Next week (17) looks
inside the attention itself: FlashAttention computes the same result without ever storing the score matrix.

Check: `pytest weeks/16 -k ex11` and `-k ex12` for the quiz, and `pytest weeks/16` for everything at once.
""")

if __name__ == "__main__":
    nb.write(str(REPO / 'solutions/16/week16_kv_cache.ipynb'))
    print("wrote solutions/16/week16_kv_cache.ipynb")
