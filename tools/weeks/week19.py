"""Build solutions/19/week19_paged_batching.ipynb (no outputs): `python tools/weeks/week19.py`."""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tools.nbbuild import Notebook  # noqa: E402

nb = Notebook()

nb.md("""
# Week 19 — Continuous batching and PagedAttention

A server answers many requests at once. Two things decide how many: **memory** (every running request
keeps a KV cache, and the cache is what runs out first) and **scheduling** (a batch that waits for its
longest member wastes the slots of the others). vLLM's answer to both (Kwon et al., 2023) is this week:
the KV cache in fixed-size **blocks** handed out on demand, like pages of virtual memory
(**PagedAttention**), and a scheduler that decides again at every step who runs (**continuous
batching**). You build the pieces — block arithmetic, a reference-counted allocator, block tables and
slot mapping, attention that reads keys and values straight from the block pool — and then run them
inside a small real engine (`lib/engine.py`, about 400 lines) on SmolLM2, which returns exactly the
tokens that `generate` returns on each request alone.

**You will write** `blocks_needed`, `slots_wasted`, `BlockAllocator`, `slot_mapping`, `paged_attention`,
`block_hashes` and two quiz answers. Each is followed by a graded cell; `pytest weeks/19 -k ex04` checks
one exercise from a terminal.

**Time.** About 5 hours. The notebook runs top to bottom in 2–3 minutes on a 2-core CPU with the fast
defaults below; `FULL = True` reruns the measurements at the seed's sizes (about 15 minutes).
""")

nb.setup("""
import math

import torch

from grader.checks.week19 import (check_blocks_needed, check_slots_wasted, check_BlockAllocator,
                                  check_slot_mapping, check_paged_attention, check_block_hashes,
                                  check_answer_q1, check_answer_q3)
""")

nb.code("""
import time

import matplotlib.pyplot as plt
from tqdm.auto import tqdm

from lib import paged as ref
from lib.attention import gqa_attention
from lib.engine import LLMEngine, simulate_steps
from lib.generate import generate as lib_generate
from lib.kv_cache import kv_cache_bytes
from lib.model import shared_smollm2
from lib.text import load_text

FULL = False  # True: the seed's sizes (64 requests of 50/200 tokens, batch up to 32): about 15 minutes

torch.manual_seed(0)
model, tok = shared_smollm2()  # SmolLM2-135M-Instruct, fp32; do not modify it
cfg = model.config
print(f"{cfg.n_layers} layers, {cfg.n_kv_heads} KV heads of {cfg.head_dim}; {torch.get_num_threads()} CPU threads")

# Prompts for the whole notebook: lines of Hamlet, 6 to 20 tokens each.
lines = [ln.strip() for ln in load_text("hamlet").splitlines() if len(ln.strip()) > 30]
PROMPTS = [tok(ln).input_ids[:20] for ln in lines[200:264]]
print(len(PROMPTS), "prompts, e.g.", repr(tok.decode(PROMPTS[0])))
""")

# --- 1 -----------------------------------------------------------------------------------------------
nb.md("""
## 1. Static batching's waste

**Static batching** forms a batch, runs it until its *longest* request is done, then forms the next.
A request that finishes early keeps its slot, idle (or padded), until then. **Continuous batching**
(Orca, Yu et al., 2022) decides at every step: a finished request leaves at once and a waiting one takes
its slot at the next step.

The course's seed puts it as: 8 concurrent requests, half finishing in 50 tokens and half in 200 —
"expected throughput improvement: 2–3×". Count steps first (one decode step gives every running request
one token). `simulate_steps` is that count.
""")
nb.code("""
seed8 = [50, 200] * 4  # 8 requests, 8 slots: everything runs at once
queued = [50, 200] * 32  # 64 requests queued for the same 8 slots
for name, lengths in [("8 requests, 8 slots", seed8), ("64 queued requests, 8 slots", queued)]:
    s, c = simulate_steps(lengths, 8, "static"), simulate_steps(lengths, 8, "continuous")
    print(f"{name:>28}: static {s:5d} steps, continuous {c:5d} steps, ratio {s / c:.2f}")
uniform = [200] * 64
print(f"{'64 requests, all 200':>28}: ratio {simulate_steps(uniform, 8, 'static') / simulate_steps(uniform, 8):.2f}")
""")
nb.md("""
With only the 8 requests there is **nothing** to gain: both policies take 200 steps, because nobody is
waiting for the slots the short requests free. The gain needs a queue. With 64 requests queued the
short ones' slots are refilled, and continuous batching takes 1100 steps against 1600: **1.45×**, not
2–3×. The step-count model says the gain is `Σ max(batch) / (continuous steps)`; it grows with the spread
of lengths and the depth of the queue, and is 1.0 when all lengths are equal.

Now measure it on SmolLM2 with the real engine: the same workload shape (half short, half 4× longer,
alternating), static against continuous, steps and wall time. The fast default is scaled down
(16 requests of 5/20 new tokens on 4 slots); `FULL` runs the 64 requests of 50/200 on 8 slots.
""")
nb.code("""
N_REQ, SLOTS, SHORT, LONG = (64, 8, 50, 200) if FULL else (16, 4, 5, 20)
lengths = [SHORT, LONG] * (N_REQ // 2)


def run_workload(policy, prompts, lengths, slots, **kwargs):
    engine = LLMEngine(model, num_blocks=512, max_num_seqs=slots, policy=policy, **kwargs)
    for p, n in zip(prompts, lengths):
        engine.add_request(p, n)
    start = time.perf_counter()
    with tqdm(total=sum(lengths), desc=policy, leave=False) as bar:
        while engine.has_unfinished():
            bar.update(len(engine.step()))
    return engine, time.perf_counter() - start


runs = {policy: run_workload(policy, PROMPTS, lengths, SLOTS) for policy in ("static", "continuous")}
pred = simulate_steps(lengths, SLOTS, "static") / simulate_steps(lengths, SLOTS, "continuous")
(es, ts), (ec, tc) = runs["static"], runs["continuous"]
print(f"{N_REQ} requests of {SHORT}/{LONG} new tokens on {SLOTS} slots")
print(f"  static:     {len(es.trace):4d} steps, {ts:6.1f} s, {sum(lengths) / ts:6.1f} tok/s")
print(f"  continuous: {len(ec.trace):4d} steps, {tc:6.1f} s, {sum(lengths) / tc:6.1f} tok/s")
print(f"  gain: predicted by step count {pred:.2f}x, measured steps {len(es.trace) / len(ec.trace):.2f}x, "
      f"measured wall time {ts / tc:.2f}x")
""")
nb.md("""
The measured step counts include one prefill step per admission, so they sit a little above the model's.
Wall time follows the step count because a decode step costs about the same with 2 or 4 requests in it
(section 5 measures that). The **Gantt chart** below shows each slot over time: in the static run a slot
whose request finished stays empty until the whole batch is done.
""")
nb.code("""
def slot_gantt(ax, engine, title):
    slots, colors = {}, {}
    free = list(range(engine.max_num_seqs))
    prev = set()
    for step, scheduled in enumerate(engine.trace):
        now = {rid for rid, _ in scheduled}
        for rid in sorted(prev - now):  # finished (or preempted): the slot is free again
            free.append(slots.pop(rid)[0]); free.sort()
        for rid in sorted(now - prev):
            slots[rid] = (free.pop(0), step)
        for rid, (slot, first) in slots.items():
            ax.broken_barh([(step, 1)], (slot - 0.4, 0.8), color=plt.cm.tab20(rid % 20))
        prev = now
    ax.set_title(f"{title}: {len(engine.trace)} steps")
    ax.set_ylabel("slot"); ax.set_yticks(range(engine.max_num_seqs))


fig, axes = plt.subplots(2, 1, figsize=(10, 4.5), sharex=True)
slot_gantt(axes[0], es, "static batching")
slot_gantt(axes[1], ec, "continuous batching")
axes[1].set_xlabel("step (one forward each)")
plt.tight_layout(); plt.show()
""")

# --- 2 -----------------------------------------------------------------------------------------------
nb.md("""
## 2. Preallocation's waste

A contiguous cache (week 16's `LayerKVCache`) must reserve, for every request, as many slots as the
request *might* need — in practice the model's maximum length — because it cannot grow in place. A
paged cache reserves whole blocks of `block_size` slots as the request fills them, so the only empty
slots are in each request's last, partly filled block.

**Exercise 1.** `blocks_needed(num_tokens, block_size)`: how many blocks hold `num_tokens` slots.

**Exercise 2.** `slots_wasted(lengths, block_size)`: the empty slots when each sequence of `lengths`
has exactly the blocks it needs.
""")
nb.exercise("blocks_needed", """
def blocks_needed(num_tokens: int, block_size: int) -> int:
    \"\"\"Blocks of `block_size` slots that hold `num_tokens` tokens.\"\"\"
    ### BEGIN SOLUTION
    return -(-num_tokens // block_size)  # ceil without floats
    ### END SOLUTION
""")
nb.test("test_blocks_needed", "check_blocks_needed(blocks_needed)", points=1)
nb.exercise("slots_wasted", """
def slots_wasted(lengths: list[int], block_size: int) -> int:
    \"\"\"Empty slots in the last blocks of sequences of these lengths.\"\"\"
    ### BEGIN SOLUTION
    return sum(blocks_needed(n, block_size) * block_size - n for n in lengths)
    ### END SOLUTION
""")
nb.test("test_slots_wasted", "check_slots_wasted(slots_wasted)", points=1)
nb.md("""
The seed's example: four requests of 2000, 100, 500 and 1500 tokens, a 2048-slot preallocation each,
against blocks of 16.
""")
nb.code("""
lengths4 = [2000, 100, 500, 1500]
blocks4 = sum(blocks_needed(n, 16) for n in lengths4)
pre_waste = sum(2048 - n for n in lengths4)
print(f"preallocated: {4 * 2048} slots for {sum(lengths4)} tokens, {pre_waste} wasted "
      f"({pre_waste / (4 * 2048):.1%})")
print(f"paged (16):   {blocks4} blocks = {blocks4 * 16} slots, {slots_wasted(lengths4, 16)} wasted "
      f"({slots_wasted(lengths4, 16) / (blocks4 * 16):.2%})")
""")
nb.md("""
Both of the seed's numbers (258 blocks, 28 slots) are right. Its "at most 15 × 4 = 60 slots" is the bound;
28 is what these lengths give. In bytes, on SmolLM2 (fp32 here, 46 KB per token) for a realistic mix —
request lengths spread from short chats to long documents — and for several block sizes:
""")
nb.code("""
g = torch.Generator().manual_seed(0)
mix = torch.exp(5.5 + 0.9 * torch.randn(256, generator=g)).clamp(8, 2048).long().tolist()  # log-normal lengths
per_token = kv_cache_bytes(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, 1, bytes_per_element=4)
used = sum(mix) * per_token
print(f"256 requests, median {sorted(mix)[128]} tokens, mean {sum(mix) / len(mix):.0f}; {per_token:,} B/token")
print(f"{'layout':>22} {'reserved MB':>12} {'used MB':>8} {'utilization':>12}")
reserved = len(mix) * 2048 * per_token
print(f"{'preallocate 2048':>22} {reserved / 1e6:12.0f} {used / 1e6:8.0f} {used / reserved:12.1%}")
for bs in (1, 8, 16, 32, 128):
    reserved = sum(blocks_needed(n, bs) for n in mix) * bs * per_token
    print(f"{'paged, block ' + str(bs):>22} {reserved / 1e6:12.0f} {used / 1e6:8.0f} {used / reserved:12.1%}")
paged16 = sum(blocks_needed(n, 16) for n in mix) * 16
print(f"the same memory holds {len(mix) * 2048 / paged16:.1f}x as many of these requests paged (block 16) as preallocated")
""")
nb.md("""
Preallocation to the maximum length uses a small fraction of what it reserves on this mix; paging
with blocks of 16 uses nearly all of it (the seed's "96.3 % utilization" is this kind of number). Smaller blocks waste less but mean longer block tables and more,
smaller reads (vLLM settled on 16). The reserved memory is what limits the batch: the last line is
how many more requests the same pool holds when paged.

Check: `pytest weeks/19 -k "ex01 or ex02"`
""")

# --- 3 -----------------------------------------------------------------------------------------------
nb.md("""
## 3. The block allocator

The pool is `num_blocks` physical blocks. The allocator hands out free blocks and takes them back. One
twist makes it more than a free list: a block can have **several owners** — two samples of the same
prompt (section 6), or every request that starts with the same system prompt (section 7) — so each
block carries a **reference count**. `fork(block)` adds an owner; `free(block)` removes one, and the
block returns to the pool only when the last owner lets go.

**Exercise 3.** `BlockAllocator(num_blocks)` with `allocate() -> int`, `free(block)`, `fork(block)` and
`num_free`. `allocate()` on an empty pool raises `OutOfBlocksError` (below) with a message that says how
many blocks exist and how many are in use; freeing a block that is not allocated raises `ValueError`.
The check runs long random sequences of allocate / fork / free against a model of the pool.
""")
nb.exercise("BlockAllocator", """
class OutOfBlocksError(RuntimeError):
    \"\"\"allocate() found no free block.\"\"\"


class BlockAllocator:
    def __init__(self, num_blocks: int):
        ### BEGIN SOLUTION
        self.num_blocks = num_blocks
        self.ref_counts = [0] * num_blocks
        self.free_list = list(range(num_blocks - 1, -1, -1))
        ### END SOLUTION

    @property
    def num_free(self) -> int:
        ### BEGIN SOLUTION
        return len(self.free_list)
        ### END SOLUTION

    def allocate(self) -> int:
        ### BEGIN SOLUTION
        if not self.free_list:
            raise OutOfBlocksError(f"all {self.num_blocks} blocks are in use ({self.num_blocks} in use, 0 free)")
        block = self.free_list.pop()
        self.ref_counts[block] = 1
        return block
        ### END SOLUTION

    def fork(self, block: int) -> int:
        ### BEGIN SOLUTION
        if not 0 <= block < self.num_blocks or self.ref_counts[block] == 0:
            raise ValueError(f"block {block} is not allocated")
        self.ref_counts[block] += 1
        return block
        ### END SOLUTION

    def free(self, block: int) -> None:
        ### BEGIN SOLUTION
        if not 0 <= block < self.num_blocks or self.ref_counts[block] == 0:
            raise ValueError(f"block {block} is not allocated")
        self.ref_counts[block] -= 1
        if self.ref_counts[block] == 0:
            self.free_list.append(block)
        ### END SOLUTION
""")
nb.test("test_BlockAllocator", "check_BlockAllocator(BlockAllocator)", points=2)
nb.code("""
alloc = BlockAllocator(4)
a, b = alloc.allocate(), alloc.allocate()
alloc.fork(a)  # a second sequence shares block a
alloc.free(a)
print(f"after fork + one free, block {a} is still owned: num_free = {alloc.num_free}")
alloc.free(a); alloc.free(b)
print(f"after the last owners free: num_free = {alloc.num_free}")
for _ in range(4):
    alloc.allocate()
try:
    alloc.allocate()
except OutOfBlocksError as e:
    print("OutOfBlocksError:", e)
""")
nb.md("Check: `pytest weeks/19 -k ex03`")

# --- 4 -----------------------------------------------------------------------------------------------
nb.md("""
## 4. Block tables and paged attention

A sequence's **block table** lists its physical blocks in logical order. Logical position `p` lives in
block `table[p // block_size]` at offset `p % block_size`; numbering the pool's slots block by block,
that is slot `table[p // block_size] * block_size + p % block_size`. The engine writes each new token's
key and value to its slot (the **slot mapping**) and reads a sequence's keys through its table.

**Exercise 4.** `slot_mapping(block_table, start, num_tokens, block_size)`: the slots (int64 tensor
`[num_tokens]`) of positions `start … start + num_tokens − 1`.
""")
nb.exercise("slot_mapping", """
def slot_mapping(block_table: list[int], start: int, num_tokens: int, block_size: int) -> torch.Tensor:
    \"\"\"Physical slots of logical positions start .. start + num_tokens - 1.\"\"\"
    ### BEGIN SOLUTION
    pos = torch.arange(start, start + num_tokens)  # [num_tokens]
    table = torch.tensor(block_table, dtype=torch.int64)
    return table[pos // block_size] * block_size + pos % block_size
    ### END SOLUTION
""")
nb.test("test_slot_mapping", "check_slot_mapping(slot_mapping)", points=1)
nb.md("""
Now the attention. At a decode step every running sequence has **one** query and its own number of
keys, scattered over the pool. `paged_attention(q, k_pool, v_pool, block_tables, context_lens)` takes

* `q [B, n_heads, head_dim]` (one query per sequence),
* `k_pool, v_pool [num_blocks, n_kv_heads, block_size, head_dim]` (one layer's pool),
* `block_tables` int64 `[B, max_blocks]` (a row may end with entries that mean nothing: ignore them),
* `context_lens` int64 `[B]` (how many keys each sequence has, its new token's included),

and returns `[B, n_heads, head_dim]`, equal to ordinary attention over each sequence's keys (query head
`h` reads KV head `h // (n_heads // n_kv_heads)`, as in week 16).

**Exercise 5.** Write it **without** copying each sequence's keys into a contiguous `[B, max_len]`
tensor: that copy is exactly the memory paging saves, and the vLLM kernel never makes it. Read a block
(or a few) of every sequence at a time — `k_pool[block_tables[:, j]]` is `[B, n_kv_heads, block_size,
head_dim]` — mask the positions at or past `context_lens`, and combine the blocks with the **online
softmax** of week 17 (running max `m`, running sum `l`, running output). The check compares against
contiguous attention (≤ 1e-5) on ragged lengths, block sizes 1, 7 and 16, and watches the peak memory;
no SDPA and no `lib`.
""")
nb.exercise("paged_attention", """
def paged_attention(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, block_tables: torch.Tensor,
                    context_lens: torch.Tensor) -> torch.Tensor:
    \"\"\"One decode query per sequence, attending over its keys and values read from the block pool.\"\"\"
    ### BEGIN SOLUTION
    b, h, d = q.shape
    _, hkv, bs, _ = k_pool.shape
    group = h // hkv
    n_blocks = -(-int(context_lens.max()) // bs)
    per_step = max(1, 32 // bs)  # blocks read at once: about 32 keys
    qg = q.reshape(b, hkv, group, d).float() / math.sqrt(d)  # [B, Hkv, group, d]
    m = torch.full((b, hkv, group), float("-inf"))
    l = torch.zeros(b, hkv, group)
    acc = torch.zeros(b, hkv, group, d)
    for j0 in range(0, n_blocks, per_step):
        j1 = min(j0 + per_step, n_blocks)
        pos = torch.arange(j0 * bs, j1 * bs)  # logical positions of these blocks
        valid = pos[None, :] < context_lens[:, None]  # [B, c * bs]
        ids = torch.where(valid[:, ::bs], block_tables[:, j0:j1], 0)  # past the end: any block, masked
        kb = k_pool[ids].permute(0, 2, 1, 3, 4).reshape(b, hkv, -1, d).float()  # [B, Hkv, c * bs, d]
        vb = v_pool[ids].permute(0, 2, 1, 3, 4).reshape(b, hkv, -1, d).float()
        s = (qg @ kb.transpose(-1, -2)).masked_fill(~valid[:, None, None, :], float("-inf"))
        m_new = torch.maximum(m, s.amax(-1))
        m_safe = torch.where(torch.isinf(m_new), 0.0, m_new)  # a sequence with nothing valid yet
        p = torch.exp(s - m_safe[..., None])
        alpha = torch.exp(m - m_safe)
        l = l * alpha + p.sum(-1)
        acc = acc * alpha[..., None] + p @ vb
        m = m_new
    return (acc / l[..., None]).reshape(b, h, d).to(q.dtype)
    ### END SOLUTION
""")
nb.test("test_paged_attention", "check_paged_attention(paged_attention)", points=3)
nb.md("""
**Milestone.** On SmolLM2's shapes (9 query heads, 3 KV heads of 64), ragged lengths and shuffled
blocks: your `paged_attention` against contiguous attention.
""")
nb.code("""
g = torch.Generator().manual_seed(1)
for bs in (1, 16):
    lens = [1, 37, 300, 129, 16]
    need = [blocks_needed(n, bs) for n in lens]
    k_pool = torch.randn(sum(need) + 4, cfg.n_kv_heads, bs, cfg.head_dim, generator=g)
    v_pool = torch.randn_like(k_pool)
    perm = torch.randperm(k_pool.shape[0], generator=g).tolist()
    tables = [perm[sum(need[:i]):sum(need[:i + 1])] for i in range(len(lens))]
    q = torch.randn(len(lens), cfg.n_heads, cfg.head_dim, generator=g)
    out = paged_attention(q, k_pool, v_pool, ref.block_table_tensor(tables), torch.tensor(lens))
    err = 0.0
    for i, n in enumerate(lens):
        slots = slot_mapping(tables[i], 0, n, bs)
        k = k_pool.permute(0, 2, 1, 3).reshape(-1, cfg.n_kv_heads, cfg.head_dim)[slots].transpose(0, 1)[None]
        v = v_pool.permute(0, 2, 1, 3).reshape(-1, cfg.n_kv_heads, cfg.head_dim)[slots].transpose(0, 1)[None]
        err = max(err, (gqa_attention(q[i][None, :, None], k, v)[0, :, 0] - out[i]).abs().max().item())
    print(f"block size {bs:2d}: lengths {lens}, max |paged - contiguous| = {err:.1e}")
""")
nb.md("Check: `pytest weeks/19 -k \"ex04 or ex05\"`")

# --- 5 -----------------------------------------------------------------------------------------------
nb.md("""
## 5. The engine

`lib/engine.py` puts the pieces together (read it: it is short). Each **step**:

1. the scheduler picks the running requests (one token each for a decode, a chunk of the prompt for a
   prefill), then admits waiting ones while there are free slots, token budget and blocks;
2. the allocator gives each one the blocks its new tokens need;
3. all scheduled tokens of all requests go through the model in **one forward**, flattened to
   `[1, N]`: the linear layers see every token at once, and each layer writes its new keys and values
   to their slots (`lib.paged.PagedKVCache`) and attends — decodes together through `paged_attention`,
   prefills over their own blocks;
4. each request whose tokens are all computed gets its next token (greedy); finished ones free their blocks.

**Milestone.** Requests batched together give exactly the tokens `generate` gives each one alone.
""")
nb.code("""
prompts = PROMPTS[:4]
NEW = 32 if FULL else 12
alone = [lib_generate(model, torch.tensor([p]), NEW)[0, len(p):].tolist() for p in tqdm(prompts, desc="alone")]
engine = LLMEngine(model, num_blocks=64, block_size=16, max_num_seqs=8)
batched = engine.generate(prompts, NEW)
print("identical to generate on each alone:", batched == alone)
print("requests per forward:", [len(s) for s in engine.trace])
print(repr(tok.decode(prompts[0])), "->", repr(tok.decode(batched[0])))
assert batched == alone
""")
nb.md("""
**Throughput against batch size.** A decode step of a small batch is bound by memory bandwidth: it
reads every weight once whatever the batch (week 16, section 6). So a step with 8 requests should cost
little more than a step with 1, and tokens per second should grow almost linearly with the batch — until
the matmuls become compute-bound. Measured (decode steps only, after the prefill):
""")
nb.code("""
BATCHES = [1, 2, 4, 8, 16, 32] if FULL else [1, 2, 4, 8, 16]
STEPS = 16 if FULL else 6


def decode_rate(batch, steps=STEPS):
    eng = LLMEngine(model, num_blocks=8 * batch, block_size=16, max_num_seqs=batch, max_num_batched_tokens=1024)
    for p in PROMPTS[:batch]:
        eng.add_request(p, steps + 1)
    eng.step()  # the prefill of every request
    start = time.perf_counter()
    for _ in range(steps):
        eng.step()
    seconds = time.perf_counter() - start
    return batch * steps / seconds, seconds / steps


rates = {b: decode_rate(b) for b in tqdm(BATCHES, desc="batch sizes")}
print(f"{'batch':>6} {'ms/step':>8} {'tok/s':>7} {'vs batch 1':>10}")
for b, (rate, step) in rates.items():
    print(f"{b:>6} {step * 1e3:8.1f} {rate:7.1f} {rate / rates[1][0]:9.1f}x")
fig, ax = plt.subplots(1, 2, figsize=(10, 3.5))
ax[0].plot(BATCHES, [rates[b][0] for b in BATCHES], "o-", label="measured")
ax[0].plot(BATCHES, [rates[1][0] * b for b in BATCHES], "--", color="gray", label="linear in batch")
ax[0].set_xlabel("batch (requests decoding together)"); ax[0].set_ylabel("decode tokens / s"); ax[0].legend()
ax[1].plot(BATCHES, [rates[b][1] * 1e3 for b in BATCHES], "o-")
ax[1].set_xlabel("batch"); ax[1].set_ylabel("ms per decode step"); ax[1].set_ylim(bottom=0)
plt.tight_layout(); plt.show()
""")
nb.md("""
The step time grows slowly with the batch, so throughput grows nearly in proportion — that is the whole
reason servers batch. The curve bends where the per-token work (attention over each request's own keys,
the activations of the LM head's 49,152 outputs per token) starts to count next to reading the weights.
Measured on a shared CPU, so read the ratios, not the absolute numbers.
""")

nb.md("""
## What you built

Block arithmetic that shows where preallocation wastes memory; a reference-counted block allocator;
block tables, slot mapping, and attention that reads keys and values in place from a block pool; and,
running on them, an engine that batches requests at every step and returns exactly what `generate`
returns.

Check: `pytest weeks/19` for everything at once.
""")

if __name__ == "__main__":
    out = ROOT / "solutions" / "19" / "week19_paged_batching.ipynb"
    out.parent.mkdir(parents=True, exist_ok=True)
    nb.write(str(out))
    print(f"wrote {out.relative_to(ROOT)} ({len(nb.cells)} cells)")
