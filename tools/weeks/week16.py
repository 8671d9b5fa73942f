"""Builds solutions/16/week16_kv_cache.ipynb (run: python tools/weeks/week16.py)."""
from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tools.nbbuild import Notebook  # noqa: E402

nb = Notebook()

nb.md("""
# Week 16 — The KV cache and grouped-query attention

A language model writes one token at a time, and every new token attends to all the tokens before it.
Recomputing the keys and values of the whole prefix at every step makes generation quadratic; keeping
them in a **KV cache** makes each step cost one token's work. This week you build that cache from
scratch, prove that it changes nothing but the speed, measure how much faster it is on this machine
and *why*, and then look at its price — memory — and at the two ways of paying less:
sharing KV heads (**MQA**, **GQA**) and a **sliding window**.

**You will write** ten small pieces: a FLOP count, the causal mask, a preallocated cache, attention with
grouped KV heads, the cached decode loop, a roofline estimate, the cache-size formula, KV-head pooling,
a rolling-buffer cache, and three quiz answers. Each one is checked by the cell right after it and by
`pytest weeks/16 -k exNN` (for example `pytest weeks/16 -k ex03`); `pytest weeks/16` checks them all (≤ 60 s).

**The model** is SmolLM2-135M-Instruct, a Llama-architecture model small enough for a laptop CPU:
30 layers, d_model 576, 9 query heads and 3 KV heads (so it already uses GQA), head_dim 64.
The lab's implementation is in `lib/model.py`; it accepts any cache with an `append(k, v)` method and
any attention function `(q, k, v, causal=True) -> out`, which is how your pieces plug into it.

**Read** Ainslie et al. 2023, *GQA: Training Generalized Multi-Query Transformer Models from Multi-Head
Checkpoints* (§2 and §3), and Shazeer 2019, *Fast Transformer Decoding: One Write-Head is All You Need*
(the MQA paper).

A rule of this notebook: every number is either derived in the cell that prints it or measured there.
Where the course's source notes make a claim, we check it and say so when it does not hold.
""")

nb.setup("""
import math

import torch
import torch.nn.functional as F

from lib.kv_cache import CacheOverflowError, KVCache
from lib.model import LlamaModel
from grader.checks.week16 import (check_step_flops, check_causal_mask, check_LayerKVCache, check_gqa_attention,
                                  check_generate, check_roofline_time, check_kv_cache_bytes, check_pool_kv_heads,
                                  check_RollingKVCache, check_answer_q1, check_answer_q3)
""")

nb.code('''
import time

import matplotlib.pyplot as plt
from tqdm.auto import tqdm

from lib import kv_cache as ref
from lib import roofline
from lib.attention import gqa_attention as lab_attention  # the lab's reference, under another name
from lib.generate import generate as lib_generate
from lib.model import shared_smollm2
from lib.text import load_text, perplexity

torch.manual_seed(0)
model, tok = shared_smollm2()  # SmolLM2-135M-Instruct, fp32, on the CPU (or CUDA when there is one); do not modify it
cfg = model.config
print(cfg)
dev = model.device  # every tensor a demo makes goes here: the notebook runs unchanged on a GPU


def sync():
    roofline.sync(dev)  # wait for queued GPU work before reading a clock (CUDA runs asynchronously; a CPU needs nothing)


print(f"{sum(p.numel() for p in model.parameters()):,} parameters on {dev}, {torch.get_num_threads()} CPU threads")
''')

nb.md("""
## 1. Why generation without a cache is quadratic

Each generation step runs a forward pass over a sequence of *T* positions and takes the last position's
logits to pick token *T + 1*. That pass needs the keys and values of all *T* positions in every layer.
Without a cache it recomputes them: it runs all *T* tokens through the network. With a cache, the keys and
values of the first *T − 1* positions are already there, and only the newest token (position *T*) runs.

Count the work in FLOPs (a multiply-add is 2 FLOPs) and only in matrix products, which is nearly all of it:

* **weights:** every token that runs multiplies through every weight matrix once — one multiply-add per
  weight — where `n_params` counts the weights of all linear layers plus the LM head;
* **attention:** each token that runs scores itself against the `seq_len` keys (Q·Kᵀ) and mixes the
  `seq_len` values (P·V), in every layer. (The query heads together have `n_heads · head_dim = d_model`
  dimensions. Count the full score matrix, masked entries included, because that is what a plain
  implementation computes.) Derive the FLOPs of each product from its shapes.

**Exercise 1.** Write `step_flops(n_params, n_layers, d_model, seq_len, cached)`: the FLOPs of the step whose
forward pass covers `seq_len` positions — uncached, `seq_len` tokens in; cached, one token in and `seq_len − 1`
in the cache. (It yields the logits for token `seq_len + 1`; §6 times exactly this pass at position `T = seq_len`.)
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
thousand tokens (the crossover printed above). FLOPs are not time, though: section 6 measures the time
and explains why the real ratio is much smaller than the FLOP ratio.

Check: `pytest weeks/16 -k ex01`
""")

nb.md("""
## 2. The causal mask

A query may attend to its own position and the ones before it. When queries and keys cover the same
*T* positions (the prefill) the mask is the lower-triangular `[T, T]`. With a cache they do not:
at a decode step there is **one** query (the new token, position *T*) and **T + 1** keys (the *T* cached
ones and its own), so the mask is `[1, T + 1]` and all True. In general the queries are the *last*
`q_len` of `kv_len` positions — the mask is aligned at the **bottom right**:
query *i* may see key *j* iff `j <= i + (kv_len - q_len)`.
The same rule covers a chunk of `c` new tokens after `n` cached ones: `[c, n + c]`.

**Exercise 2.** Write `causal_mask(q_len, kv_len, device=None)`: a boolean tensor `[q_len, kv_len]`, True
where attention is allowed, created on `device` (pass it to `torch.arange`: a mask built on the CPU cannot be
applied to scores on a GPU — the check tries `device="meta"`, a device with shapes but no data).
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
prompt = tok("The capital of France is", return_tensors="pt").input_ids
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

nb.md("""
## 3. The cache

Each layer keeps its keys and values as `[batch, n_kv_heads, max_len, head_dim]` tensors, **allocated
once** for the longest sequence we will generate. `append(k, v)` writes the new positions after the ones
already held and returns *views* of the valid prefix `[batch, n_kv_heads, length, head_dim]` — no copy.
Why preallocate, rather than grow the cache with `torch.cat`? Not to change the order of the cost: a decode
step's attention already reads the whole cache, O(T) bytes per step, and a `cat` adds one O(T) copy to
that (we measure both below). The reasons are practical: a `cat` allocates a new tensor every step for every
layer (allocator churn and fragmentation, worst on a GPU), the shapes change every step (no CUDA graphs, a
recompile for `torch.compile`), and the memory is not bounded or known in advance. A preallocated buffer is
allocated once, has a fixed shape, and fails early and loudly: a write past `max_len` must raise, with a
message that says what to do, instead of corrupting memory or silently reallocating.

Note that the cache stores *n_kv_heads*, not *n_heads*: for SmolLM2, 3 heads rather than 9.

**Exercise 3.** Complete `LayerKVCache`: `length` (positions held), `max_len`, `nbytes` (bytes of the K and
V buffers), and `append(k, v)`, which raises `CacheOverflowError` (imported at the top) on overflow and then
leaves the cache unchanged. Allocate the buffers with the `dtype` and on the `device` you are given: the model
passes its own, and on a GPU a cache on the CPU cannot take the GPU's keys.
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
        """Store k, v [batch, n_kv_heads, t, head_dim]; return views of all positions held, [.., length, ..]."""
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
anyway.
""")

nb.code("""
def time_ms(fn, repeats=20):
    fn(); sync()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    sync()
    return (time.perf_counter() - start) / repeats * 1e3

print(f"{'T':>6} {'cat append':>11} {'preallocated':>13} {'attention read':>15} {'cat / prealloc':>15}   (ms per step, 30 layers)")
for T in [128, 512, 2048]:
    shape = (1, cfg.n_kv_heads, T, cfg.head_dim)
    held = [torch.randn(shape, device=dev) for _ in range(2 * cfg.n_layers)]  # K and V of every layer
    buffers = [torch.zeros(1, cfg.n_kv_heads, T + 1, cfg.head_dim, device=dev) for _ in range(2 * cfg.n_layers)]
    new = torch.randn(1, cfg.n_kv_heads, 1, cfg.head_dim, device=dev)
    q1 = torch.randn(1, cfg.n_heads, 1, cfg.head_dim, device=dev)
    cat_ms = time_ms(lambda: [torch.cat([h, new], dim=2) for h in held])
    pre_ms = time_ms(lambda: [b[:, :, T:T + 1].copy_(new) for b in buffers])
    read_ms = time_ms(lambda: [lab_attention(q1, held[2 * i], held[2 * i + 1]) for i in range(cfg.n_layers)])
    print(f"{T:>6} {cat_ms:>11.3f} {pre_ms:>13.3f} {read_ms:>15.3f} {cat_ms / pre_ms:>14.0f}x")
    del held, buffers
""")

nb.md("""
Both the `cat` copy and the attention read grow linearly with *T*, so over a whole generation both are
O(T²) bytes in all: `cat` makes each step more expensive by a constant factor (compare the columns above),
it does not change the order. The preallocated write costs the same at every length. (The rolling cache of
§9 also copies — the *W* held positions, every step — which is fine for the same reason: bounded, and next to a
read of the same size.)
""")

nb.md("""
Check: `pytest weeks/16 -k ex03`
""")

nb.md("""
## 4. Attention with grouped KV heads

In multi-head attention (MHA) every query head has its own key and value head. Multi-query attention
(MQA, Shazeer 2019) keeps all the query heads but only **one** K/V head that they share; grouped-query
attention (GQA, Ainslie et al. 2023) sits in between: the `n_heads` query heads form `n_kv_heads` groups of
`n_heads / n_kv_heads` consecutive heads, and each group shares one K/V head. So query head *h* reads KV
head `h // (n_heads // n_kv_heads)`. SmolLM2 has 9 query heads in 3 groups: heads 0–2 read KV head 0,
3–5 read KV head 1, 6–8 read KV head 2. MHA (`n_kv_heads == n_heads`) and MQA (`n_kv_heads == 1`) are the
two ends of the same code.

**Exercise 4.** Write `gqa_attention(q, k, v, causal=True)` with q `[B, n_heads, q_len, d]` and k, v
`[B, n_kv_heads, kv_len, d]`: softmax(q·kᵀ/√d, masked with *your* `causal_mask` when `causal`)·v, returning
`[B, n_heads, q_len, d]`. `torch.repeat_interleave` over the head axis is the simplest way; reshaping q
into `[B, n_kv_heads, group · q_len, d]` avoids copying K and V at all. Build the mask on the inputs' device
(`causal_mask(..., device=q.device)`): the model may be on a GPU.
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

nb.md("""
## 5. Generation with the cache

The decode loop: with `use_cache`, allocate a cache for `prompt + max_new_tokens` positions
(`model.new_cache(batch, max_len)`, or 30 of your `LayerKVCache`s in a `KVCache`), run the prompt through
the model once (the prefill), then feed **only the newest token** at each step: `model(next_ids, cache=cache)`.
Without `use_cache`, feed the whole sequence every step. Either way take the last position's logits and
pick the greedy token (argmax).

**Exercise 5.** Write `generate(model, input_ids, max_new_tokens, use_cache=True, return_logits=False)`
(greedy). It returns the ids `[B, prompt + new]` and, with `return_logits`, also the logits of every step
`[B, new, vocab]` — the same contract as `lib.generate.generate`.

**Milestone:** identical tokens cached and uncached — on SmolLM2 (64 greedy tokens) and on random tiny
configurations (MHA, GQA, MQA) — with logits within 1e-4 at every step. The check also verifies that the
cached loop really feeds one token per step.
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

nb.code("""
prompt = tok("To be, or not to be, that is the question:", return_tensors="pt").input_ids.to(dev)
sync(); start = time.perf_counter(); c_ids, c_logits = generate(model, prompt, 64, use_cache=True, return_logits=True)
sync(); t_cached = time.perf_counter() - start
start = time.perf_counter(); u_ids, u_logits = generate(model, prompt, 64, use_cache=False, return_logits=True)
sync(); t_uncached = time.perf_counter() - start
print(f"identical tokens: {torch.equal(c_ids, u_ids)}; largest logit difference over 64 steps: "
      f"{(c_logits - u_logits).abs().max().item():.2e}")
print(f"64 tokens: cached {t_cached:.1f} s, uncached {t_uncached:.1f} s ({t_uncached / t_cached:.1f}x for the whole run)")
print(repr(tok.decode(c_ids[0, prompt.shape[1]:])))

""")

nb.md("""
The logits are not bit-identical — the cached and uncached passes multiply matrices of different shapes,
so floating-point sums are taken in different orders — but they agree well within 1e-4 (printed above), and
the tokens are the same. (Greedy SmolLM2 soon repeats itself on this prompt; that is the model, not the cache.)

Check: `pytest weeks/16 -k ex05`
""")

nb.md("""
## 6. How much faster, and why

The week's source notes say the cache makes a token "~15× faster at 64 tokens and ~40× at 256". Section 1
says the FLOP ratio is about 64× and 256×. Neither is what you will measure, because time is not FLOPs.

**The roofline model.** A kernel must do its arithmetic (at best at the machine's peak FLOP/s) and move its
bytes through memory (at best at the memory bandwidth); the two overlap, so its time is at least the
larger of the two. A decode step with a cache multiplies **one** token vector through every weight
matrix: 2 FLOPs per weight, and each weight (4 bytes in fp32) is read once — it is limited by bandwidth.
An uncached step at position *T* multiplies *T* token vectors through the same weights: *T* times the
FLOPs for the same bytes — beyond a few dozen tokens it is limited by compute.

**Exercise 6.** Write `roofline_time(flops, bytes_moved, flops_per_s, bytes_per_s)`.
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
First, this machine — the device the model is on (`dev`): matmul throughput from a 2048×2048 product, and
bandwidth from a matrix-vector product over a 256 MiB matrix (larger than any CPU cache, and the same
operation as a decode step; a plain streaming read of the same bytes, the roofline's true ceiling, is faster —
week 20 uses that one). On a GPU both measurements synchronize before reading the clock.
Close other programs first: anything else running changes these numbers.
""")

nb.code("""
# On the model's device, in the model's dtype; best of 10: other programs only slow it down.
flops_per_s = roofline.measure_flops_per_s(2048, repeats=10, dtype=model.embed.weight.dtype, device=dev)
bytes_per_s = roofline.measure_bandwidth(256, repeats=10, dtype=model.embed.weight.dtype, device=dev, how="matvec")
print(f"{dev}: matmul: {flops_per_s / 1e9:.0f} GFLOP/s   mat-vec bandwidth: {bytes_per_s / 1e9:.1f} GB/s   "
      f"ridge point: {flops_per_s / bytes_per_s:.0f} FLOP/byte")
""")

nb.md("""
Now the model. For every position up to 256 we time one cached decode step (the cache holds the tokens
before it) and, at a few positions, one uncached step (a forward pass over all *T* tokens). The text is
the opening of *Hamlet*; what the tokens are does not change the time.
""")

nb.code("""
text_ids = tok(load_text("hamlet")[:4000], return_tensors="pt").input_ids[:, :256].to(dev)  # [1, 256]
T_MAX = text_ids.shape[1]
cached_ms = torch.zeros(T_MAX + 1)
with torch.no_grad():
    cache = model.new_cache(max_len=T_MAX)
    model(text_ids[:, :1], cache=cache)  # position 1; warm-up
    for T in tqdm(range(2, T_MAX + 1), desc="cached steps"):
        sync(); start = time.perf_counter()
        model(text_ids[:, T - 1:T], cache=cache)  # the cache holds T - 1 positions; this step's pass covers T
        sync(); cached_ms[T] = (time.perf_counter() - start) * 1e3

uncached_T = [1, 16, 32, 64, 128, 192, 256]
uncached_ms = {}
with torch.no_grad():
    for T in tqdm(uncached_T * 3, desc="uncached steps"):  # three rounds, keep the fastest
        sync(); start = time.perf_counter()
        model(text_ids[:, :T])
        sync(); uncached_ms[T] = min(uncached_ms.get(T, math.inf), (time.perf_counter() - start) * 1e3)

def cached_at(T, half=8):  # the median of nearby steps smooths out the noise of single measurements
    return cached_ms[max(2, T - half):T + half + 1].median().item()

""")

nb.md("""
**Prediction.** Bytes per step: the fp32 weights (read once per step whether one token runs or *T*) plus, for
the cached step, the KV cache so far. FLOPs: `step_flops` from section 1. The roofline gives each step's
time, and their quotient the speedup.
""")

nb.code(r"""
weight_bytes = 4 * n_params
def predicted_ms(T, cached):
    flops = step_flops(n_params, cfg.n_layers, cfg.d_model, T, cached)
    kv = ref.kv_cache_bytes(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, T, bytes_per_element=4) if cached else 0
    return 1e3 * roofline_time(flops, weight_bytes + kv, flops_per_s, bytes_per_s)

print(f"weights: {weight_bytes / 1e6:.0f} MB (fp32); KV cache at 256 positions: "
      f"{ref.kv_cache_bytes(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, 256, bytes_per_element=4) / 1e6:.1f} MB")
# What a roofline cannot know: the time a step spends on anything but peak-rate matmuls and memory reads
# (Python and dispatch of hundreds of small ops, matrices too small to reach the big mat-vec's bandwidth).
overhead_ms = max(0.0, cached_at(32) - predicted_ms(32, True))
print(f"per-step time the roofline does not explain (cached step near position 32 minus its roofline): {overhead_ms:.1f} ms")
print(f"\n{'':>4} | {'roofline prediction':^30} | {'+ overhead':^10} | {'measured':^30}")
print(f"{'T':>4} | {'uncached':>10} {'cached':>9} {'ratio':>7} | {'ratio':>10} | {'uncached':>10} {'cached':>9} {'ratio':>7}")
speedups = {}
for T in [64, 256]:
    pu, pc = predicted_ms(T, False), predicted_ms(T, True)
    mu, mc = uncached_ms[T], cached_at(T)
    speedups[T] = dict(roofline=pu / pc, with_overhead=(pu + overhead_ms) / (pc + overhead_ms), measured=mu / mc)
    print(f"{T:>4} | {pu:>7.0f} ms {pc:>6.1f} ms {pu / pc:>6.1f}x | {speedups[T]['with_overhead']:>9.1f}x | "
          f"{mu:>7.0f} ms {mc:>6.1f} ms {mu / mc:>6.1f}x")

# The picture: measured step times against the roofline's prediction, without and with the fixed overhead.
Ts_all = list(range(2, T_MAX + 1))
fig, ax = plt.subplots(figsize=(7, 4.2))
ax.plot(Ts_all, cached_ms[2:], ".", ms=3, color="C0", label="cached step, measured (1 token in)")
ax.plot(uncached_T, [uncached_ms[T] for T in uncached_T], "o", color="C1", label="uncached step, measured (T tokens in)")
for cached, color, name in [(True, "C0", "cached"), (False, "C1", "uncached")]:
    pred = [predicted_ms(T, cached) for T in Ts_all]
    ax.plot(Ts_all, pred, "--", color=color, lw=1, label=f"{name}: roofline")
    ax.plot(Ts_all, [p + overhead_ms for p in pred], ":", color=color, lw=1.5, label=f"{name}: roofline + overhead")
ax.set_yscale("log")
ax.set(xlabel="position T (tokens the step's forward pass covers)", ylabel="time of one step (ms, log scale)",
       title=f"SmolLM2 on {dev}: latency per new token, measured and predicted")
ax.legend(fontsize=7); ax.grid(alpha=0.3, which="both"); plt.show()
""")

nb.md("""
**Reading the numbers.**

* The **cached** step costs the time to read the fp32 weights once (printed above) plus a roughly fixed
  extra: an eager PyTorch forward launches hundreds of small operations per token, each costing
  microseconds of Python and dispatch, and the model's 576-wide matrices read memory more slowly than the
  256 MiB mat-vec did. The roofline leaves that extra out, so it predicts too fast a cached step and too
  large a speedup; adding the extra measured at one position (the "+ overhead" column) closes much of the gap.
  The cache itself is small next to the weights at 256 positions, so the cached line stays almost flat.
* The **uncached** step is close to a compute-bound forward pass, but a 576-wide model runs below the
  2048×2048 matmul's FLOP/s (its matrices are smaller, and softmax, norms and RoPE are not matmuls), so it
  is slower than predicted.
* Because the uncached step costs ∝ *T* (compute) and the cached step is ≈ constant (bandwidth), the
  ratio is roughly `(2·n_params·T / FLOP/s) / (4·n_params / bandwidth) = T · bandwidth / (2 · FLOP/s)`
  once *T* is past the ridge point: **linear in T, with a slope set by the machine**, not a constant of
  the method. The speedups printed above are what this machine gives.
* **The source notes' 15× at 64 and 40× at 256** name no model and no hardware, so they cannot be checked
  as stated; what can be said is what sets them. The per-token speedup is not a property of the KV cache but
  of the machine's FLOP/s-to-bandwidth ratio, the weights' precision and the per-step overhead. On a GPU
  the same formula with bf16 weights (2 bytes each) gives `T · bandwidth / FLOP/s`; an A100 80GB's
  published 312 TFLOP/s and 2.0 TB/s make that about T / 156 — at batch 1 a 64-token forward costs hardly
  more than one token. There the cache pays off through the O(T²) → O(T) total at long contexts and large
  batches, not through a big per-token factor at 64 tokens. Measure before you quote a speedup.

Check: `pytest weeks/16 -k ex06`
""")

nb.md("""
## 7. How much memory

The cache holds, for every layer, a key and a value vector (each `head_dim` numbers) per KV head and per
position, for every sequence of the batch. Derive the byte count from that sentence.

**Exercise 7.** Write `kv_cache_bytes(n_layers, n_kv_heads, head_dim, seq_len, batch=1, bytes_per_element=2)`
(fp16/bf16 by default).

**Milestones:** OPT-13B (40 layers, 40 heads of 128) needs 819,200 B per token; GPT-3 175B (96 layers,
96 heads of 128) needs 4.5 MiB per token; for SmolLM2 the formula equals the bytes of the cache tensors the
model actually allocates.
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
with MHA (9), and with MQA (1).
""")

nb.code("""
configs = {  # name: (n_layers, n_heads, n_kv_heads, head_dim)
    "OPT-13B (MHA)": (40, 40, 40, 128),
    "Llama-2-7B (MHA)": (32, 32, 32, 128),
    "Llama-2-70B (GQA-8)": (80, 64, 8, 128),
    "SmolLM2-135M as MHA (9 KV)": (30, 9, 9, 64),
    "SmolLM2-135M (GQA, 3 KV)": (30, 9, 3, 64),
    "SmolLM2-135M as MQA (1 KV)": (30, 9, 1, 64),
}
contexts = [2 ** p for p in range(7, 16)]  # 128 ... 32768
print(f"{'model':<28} {'KiB/token':>10} {'GiB at 4096':>12} {'vs MHA':>7}")
fig, ax = plt.subplots(figsize=(7, 4.2))
for name, (L, H, Hkv, d) in configs.items():
    print(f"{name:<28} {kv_cache_bytes(L, Hkv, d, 1) / 1024:>10.1f} {kv_cache_bytes(L, Hkv, d, 4096) / 2**30:>12.3f} {H // Hkv:>6}x")
    ax.loglog(contexts, [kv_cache_bytes(L, Hkv, d, n) / 2 ** 30 for n in contexts], "o-" if "Smol" in name else "s-",
              ms=3, label=name)
ax.set(xlabel="context length (tokens)", ylabel="KV cache, GiB (fp16, batch 1)", title="KV cache memory against context")
ax.grid(alpha=0.3, which="both"); ax.legend(fontsize=8); plt.show()
""")

nb.md("""
**How much does GQA save?** The cache shrinks by the number of query heads per KV head,
`n_heads / n_kv_heads` — not by the number of groups. The source notes' "GQA (8 groups): 8× reduction"
with 32 query heads is wrong: 8 KV heads serving 32 query heads give **32 / 8 = 4×** (the quiz in section 10
gets this right). Llama-2-70B does save 8×, because it has 64 query heads for its 8 KV heads. MQA saves
`n_heads`×: 32× for a 32-head model, only 9× for SmolLM2. The 4.5 "MB" per token of GPT-3 is 4.5 **MiB**
(4,718,592 B).

Check: `pytest weeks/16 -k ex07`
""")

nb.md("""
## 8. What sharing KV heads costs

Memory is one side; quality is the other. Ainslie et al. turn an MHA checkpoint into a GQA one by
**mean-pooling** the key and value projection heads of each group into one head, then *uptraining* for
about 5 % of the original pre-training compute (they compare pooling with keeping the first head of each
group and with random initialisation: pooling works best). We can afford the pooling, not the uptraining, so we measure
what is lost *before* uptraining.

SmolLM2 has 9 query heads and 3 KV heads. Pooling merges whole KV heads, so the new count must divide 3:
the only options are **3** (unchanged) and **1** (MQA). (9 divides into 9, 3 and 1, but going from 3 up
to 9 KV heads would only copy each head three times: the same outputs at 3× the memory.)

**Exercise 8.** Write `pool_kv_heads(model, n_groups)`: a **new** `LlamaModel` with `n_kv_heads = n_groups`,
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
**Milestone:** perplexity on *Hamlet* (Project Gutenberg; `data/text/hamlet.txt`) with 3 KV heads and
with 1. `lib.text.perplexity` reads the text in windows of 256 tokens advancing by 128, so every token scored
after the first window sees at least 128 tokens of context (the first 128 tokens see only what precedes them).
We score the first 2,048 tokens of the play.
""")

nb.code("""
from lib.gqa import kv_group_options

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

Check: `pytest weeks/16 -k ex08`
""")

nb.md("""
## 9. Sliding window

Another way to bound the cache: let each token attend only to the last *W* positions (itself included),
as Mistral 7B does (Jiang et al. 2023, with *W* = 4096). Then the cache never needs more than *W*
positions, whatever the sequence length: a **rolling buffer** of *W* slots where position *p* lives in slot
*p mod W*, overwriting the position that just left the window.

`lib.kv_cache.sliding_window_attention(W)` is the matching attention: the causal mask, minus every key more
than *W − 1* positions behind its query (`lib.masks.sliding_window_mask`, bottom-right aligned like yours).

**Exercise 9.** Write `RollingKVCache(batch, n_kv_heads, window, head_dim, dtype, device)` with:
* `k`, `v` buffers `[batch, n_kv_heads, window, head_dim]` allocated once, and `nbytes` (their bytes);
* `length`: how many positions were ever appended (the model takes the next RoPE position from it);
* `append(k, v)` for `t ≥ 1` new positions: returns the positions still held (at most `window`, **oldest
  first**) followed by the new ones — the sliding-window mask hides any extra — and then keeps only the last
  `window` positions. Make any index tensor of slots on the buffers' device (`torch.arange(..., device=self.k.device)`).

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

Check: `pytest weeks/16 -k ex09`
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

nb.md("""
## 10. Check your understanding

Three questions from the course's Phase IV quiz. Numeric answers are functions returning a number.

**Q1.** A 13B-parameter model in FP16 requires how much memory for its weights alone? Answer in GB (10⁹ bytes).
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
Answer in a few sentences below; use what you measured in section 6. (Graded by hand.)
""")

nb.answer("answer_q2", """
**Model answer.** At batch 1, a decode step multiplies a single token vector by every weight matrix: each
weight is read from memory once and used for one multiply-add (2 FLOPs per 2 bytes in fp16 — about 1 FLOP
per byte), and each step also reads the whole KV cache. A GPU needs on the order of 150 FLOPs per byte of
memory traffic (A100: 312 TFLOP/s against ≈ 2 TB/s) to keep its arithmetic units busy, so they mostly
wait. The bottleneck is **memory bandwidth** (HBM): the step time ≈ (weight bytes + KV-cache bytes) /
bandwidth. In section 6 the cached step stayed almost flat in *T* (the weights dominate the bytes), but it was
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
**Q3.** Grouped-query attention with 32 query heads and 8 KV heads reduces the KV cache by what factor
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
## What you built

A cache that makes generation linear instead of quadratic without changing a single token; the mask
that makes it correct; attention for any number of KV heads; a measured, explained speedup for this
machine; the memory formula and what GQA, MQA and a sliding window do to it. Next week (17) looks inside
the attention itself: FlashAttention computes the same result without ever storing the score matrix.

Check: `pytest weeks/16 -k ex10` for the quiz, and `pytest weeks/16` for everything at once.
""")

if __name__ == "__main__":
    nb.write(str(REPO / 'solutions/16/week16_kv_cache.ipynb'))
    print("wrote solutions/16/week16_kv_cache.ipynb")
