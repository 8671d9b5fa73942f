# %% [markdown]
# # Week 19 — Continuous batching and PagedAttention
#
# A server answers many requests at once. Two things decide how many: **memory** (every running request
# keeps a KV cache, and the cache is what runs out first) and **scheduling** (a batch that waits for its
# longest member wastes the slots of the others). vLLM's answer to both (Kwon et al., 2023) is this week:
# the KV cache in fixed-size **blocks** handed out on demand, like pages of virtual memory
# (**PagedAttention**), and a scheduler that decides again at every step who runs (**continuous
# batching**). You build the pieces — block arithmetic, a reference-counted allocator, block tables and
# slot mapping, attention that reads keys and values straight from the block pool — and then run them
# inside a small real engine (`lib/batching/engine.py` and its block pool `lib/batching/blocks.py`; the first code cell prints
# their length) on SmolLM2, which returns exactly the tokens that `generate` returns on each request alone.
#
# **You will write** a model of what continuous batching gains (`continuous_gain`, predicted, then measured),
# `blocks_needed`, `slots_wasted`, `BlockAllocator`, `slot_mapping`, `paged_attention`, `block_hashes`, the
# block pool with its prefix cache `PrefixCache`, the engine's scheduler `schedule` and two quiz answers — then
# run the engine on your parts alone (exercise 10) and predict its step count (`predict_steps`). Most of them
# are posed as a question, a design (the properties an answer must keep) or a prediction: the formula, the
# algorithm or the derivation comes after the check that your answer passes. Each is followed by a graded cell;
# `pytest weeks/19 -k ex05` checks one exercise from a terminal.
#
# **Time.** About 5 hours. The notebook runs top to bottom in 2–3 minutes on a 2-core CPU with the fast
# defaults below; `FULL = True` reruns the measurements at the seed's sizes (about 15 minutes).

# %% tags=["setup"]
import math

import torch

from grader.checks.week19 import (check_continuous_gain, check_blocks_needed, check_slots_wasted,
                                  check_BlockAllocator, check_slot_mapping, check_paged_attention, check_block_hashes,
                                  check_schedule, check_PrefixCache, check_engine, check_predict_steps,
                                  check_answer_q1, check_answer_q3)

# %%
import inspect
import time

import matplotlib.pyplot as plt
from tqdm.auto import tqdm

import lib.batching.blocks
import lib.batching.engine
import lib.batching.model_runner
from lib.batching import paged as ref
from lib.bench import records, roofline as rl
from lib.attn.attention import gqa_attention
from lib.batching.engine import LLMEngine, simulate_steps
from lib.batching.engine_load import percentile, run_load
from lib.modeling.generate import generate as lib_generate
from lib.modeling.kv_cache import kv_cache_bytes
from lib.modeling.llama import shared_smollm2, tiny_model
from lib.modeling.text import load_text
from lib.bench.timing import Conditions, interleaved, not_monotone, report, warning

FULL = False  # True: the seed's sizes (64 requests of 50/200 tokens, batch up to 32): about 15 minutes

torch.manual_seed(0)
model, tok = shared_smollm2()  # SmolLM2-135M-Instruct, fp32; do not modify it
cfg = model.config
dev = model.device  # every tensor a demo makes goes here: the notebook runs unchanged on a GPU
print(f"{cfg.n_layers} layers, {cfg.n_kv_heads} KV heads of {cfg.head_dim}; {torch.get_num_threads()} CPU threads; "
      f"model on {dev}")

def sync():
    rl.sync(dev)  # wait for queued GPU work before reading a clock (CUDA runs asynchronously; a CPU needs nothing)


# Prompts for the whole notebook: lines of Hamlet, 6 to 20 tokens each.
lines = [ln.strip() for ln in load_text("hamlet").splitlines() if len(ln.strip()) > 30]
PROMPTS = [tok(ln).input_ids[:20] for ln in lines[200:264]]
print(len(PROMPTS), "prompts, e.g.", repr(tok.decode(PROMPTS[0])))
# The engine you will run, by size (docstrings and comments included): what there is to read
size = {m.__name__: len(inspect.getsource(m).splitlines()) for m in (lib.batching.engine, lib.batching.model_runner, lib.batching.blocks)}
print(", ".join(f"{m.replace('.', '/')}.py {n} lines" for m, n in size.items()) + "; of them LLMEngine "
      f"{len(inspect.getsource(LLMEngine).splitlines())}, its step() {len(inspect.getsource(LLMEngine.step).splitlines())}")

# %% [markdown]
# ## 1. Static batching's waste
#
# **Static batching** forms a batch, runs it until its *longest* request is done, then forms the next.
# A request that finishes early keeps its slot, idle (or padded), until then. **Continuous batching**
# (Orca, Yu et al., 2022) decides at every step: a finished request leaves at once and a waiting one takes
# its slot at the next step.
#
# The course's seed puts it as: 8 concurrent requests, half finishing in 50 tokens and half in 200 —
# "expected throughput improvement: 2–3×". Count steps first (one decode step gives every running request
# one token). `simulate_steps` is that count.

# %%
seed8 = [50, 200] * 4  # 8 requests, 8 slots: everything runs at once
s8, c8 = simulate_steps(seed8, 8, "static"), simulate_steps(seed8, 8, "continuous")
print(f"8 requests on 8 slots: static {s8} steps, continuous {c8} steps")
# Latency of the 8 requests: a static batch returns them together; continuous returns each when it is done.
print(f"mean completion: static {s8} steps, continuous {sum(seed8) / len(seed8):.0f} steps")

# %% [markdown]
# With only the 8 requests there is nothing to gain in **throughput**: both policies take as many steps as the
# longest request, because nobody is waiting for the slots the short requests free. There is a gain in
# **latency**: a static batch returns its requests together, continuous batching returns each short request as
# soon as it is done. The throughput gain needs a **queue**.
#
# **Exercise 1 (predict).** A deep queue of requests waits for `slots` slots. Each request generates `n` new
# tokens with probability `lengths[n]`, independently of the others. Static batching takes the next `slots`
# requests as a batch and runs it until all of them are done; continuous batching gives a freed slot to the
# next request at the next step. Write `continuous_gain(lengths, slots)`: continuous batching's throughput over
# static batching's (requests finished per step, in the long run), in the step-count model above (one token per
# running request per step, prefill left out). Reason about how long one static batch lasts, and about one slot
# under continuous batching. The check asks about distributions and slot counts you have not seen (drawn per
# run, its seed printed); then you measure a real queue against your model. Before you run anything: what does
# your model say about the seed's half-50, half-200 mix on 8 slots?

# %% nbgrader={"grade": false, "grade_id": "continuous_gain", "locked": false, "schema_version": 3, "solution": true, "task": false}
def continuous_gain(lengths: dict[int, float], slots: int) -> float:
    """Continuous over static throughput, a deep queue; n new tokens with probability lengths[n]."""
    ### BEGIN SOLUTION
    cdf, below, batch_steps = 0.0, 0.0, 0.0
    for n, p in sorted(lengths.items()):
        cdf += p
        batch_steps += n * (cdf ** slots - below)  # P(the longest of `slots` requests has n tokens)
        below = cdf ** slots
    return batch_steps / sum(n * p for n, p in lengths.items())
    ### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "test_continuous_gain", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_continuous_gain(continuous_gain)

# %% [markdown]
# *The model, now that your check passes.* Under continuous batching no slot idles while requests wait: a slot
# serves one request per E[L] steps on average, so S slots finish S requests per E[L] steps. A static batch of
# S requests holds all S slots until the longest of them is done: E[max of S lengths] steps for S requests. The
# gain is E[max] / E[L]. The longest of S independent lengths is at most n with probability F(n)^S (F: the
# distribution function of the lengths), so it is exactly n with probability F(n)^S − F(n−1)^S. Equivalently the
# gain is 1 / (1 − idle), with idle the share of a static batch's slot-steps that no token fills: a scheduler
# that wasted no slot-step would gain exactly this and no more. Your model on the seed's mix:

# %%
for slots in (1, 2, 4, 8, 32):
    print(f"half 50, half 200 new tokens, {slots:2d} slots: continuous batching gains {continuous_gain({50: 0.5, 200: 0.5}, slots):.3f}x")
print(f"bound for any number of slots: every static batch as long as the longest request: {200 / 125:.3f}x")

# %% [markdown]
# With 8 slots nearly every static batch holds a 200-token request, so the gain is close to its bound
# (200 steps per batch against the mean of 125 per request). The seed's "2–3×" is above what any scheduler gains
# on this mix. The gain grows with the spread of lengths and the number of slots, and is 1 when all lengths are
# equal or with a single slot.
#
# **Count it** with the real engine: a queue drawn from a mix like the seed's (half short, half 4× longer),
# scaled down by default (12 requests of 4 or 16 new tokens on 4 slots; `FULL`: 64 requests of 50 or 200 on 8
# slots). Your prediction first, then the engine's step counts, static against continuous. The steps depend on the
# lengths, not on the model, so a tiny model of SmolLM2's vocabulary counts them in a moment; section 8 times the
# same queue on SmolLM2, on an engine built from your own parts.

# %%
N_REQ, SLOTS, SHORT, LONG = (64, 8, 50, 200) if FULL else (12, 4, 4, 16)
MIX = {SHORT: 0.5, LONG: 0.5}


def draw_queue(n, seed):
    """n requests' new-token counts, drawn from MIX."""
    g = torch.Generator().manual_seed(seed)
    return [LONG if long else SHORT for long in (torch.rand(n, generator=g) < MIX[LONG]).tolist()]


def run_workload(policy, lengths, slots, on=model, progress=True, **kwargs):
    engine = LLMEngine(on, num_blocks=512, max_num_seqs=slots, policy=policy, **kwargs)
    for p, n in zip(PROMPTS, lengths):
        engine.add_request(p, n)
    with tqdm(total=sum(lengths), desc=policy, leave=False, disable=not progress) as bar:
        while engine.has_unfinished():
            bar.update(len(engine.step()))
    return engine


lengths = draw_queue(N_REQ, 19)
predicted = continuous_gain(MIX, SLOTS)
counter = tiny_model(vocab_size=cfg.vocab_size)  # random weights: its tokens mean nothing, its steps are the same
es, ec = (run_workload(policy, lengths, SLOTS, on=counter) for policy in ("static", "continuous"))
print(f"{N_REQ} requests on {SLOTS} slots, new tokens drawn from {MIX}: {lengths}")
print(f"your model (a deep queue): continuous batching gains {predicted:.3f}x")
print(f"this queue, in the engine: static {len(es.trace)} steps, continuous {len(ec.trace)} steps, "
      f"gain {len(es.trace) / len(ec.trace):.3f}x")
assert (len(es.trace), len(ec.trace)) == (simulate_steps(lengths, SLOTS, "static"), simulate_steps(lengths, SLOTS))
print("deeper queues from the same mix (the step-count model, no model run):")
for depth in (N_REQ, 16 * N_REQ, 256 * N_REQ, 4096 * N_REQ):
    q = draw_queue(depth, depth)
    print(f"  {depth:6d} requests: gain {simulate_steps(q, SLOTS, 'static') / simulate_steps(q, SLOTS):.3f}x")

# %% [markdown]
# The engine takes exactly the steps of the step-count model (the `assert` above): the prefill step also samples a
# request's first token, so a request of n new tokens holds its slot for exactly n steps. A short queue gains less
# than your prediction for a deep one, for two reasons: at its end the last requests run beside empty slots
# (continuous batching has nothing left to fill them with), and a dozen requests may draw an unlucky mix. As the
# queue deepens (the last lines) its gain approaches your model. The **Gantt chart** below shows each
# slot over time, one colour per request: in the static run a slot whose request has finished keeps computing
# padding (grey) until the whole batch is done.

# %%
def slot_gantt(ax, engine, title):
    slots, seen = {}, {}
    free = list(range(engine.max_num_seqs))
    prev = set()
    for step, scheduled in enumerate(engine.trace):
        now = {rid for rid, _ in scheduled}
        for rid in sorted(prev - now):  # finished (or preempted): the slot is free again
            free.append(slots.pop(rid)); free.sort()
        for rid in sorted(now - prev):
            slots[rid] = free.pop(0)
        for rid, slot in slots.items():
            seen[rid] = seen.get(rid, 0) + 1  # a request's steps: its prefill, then one per further token
            padding = seen[rid] > engine.requests[rid].max_new_tokens  # finished, still in a static batch
            ax.broken_barh([(step, 1)], (slot - 0.4, 0.8), color="0.85" if padding else plt.cm.tab20(rid % 20))
        prev = now
    ax.set_title(f"{title}: {len(engine.trace)} steps")
    ax.set_ylabel("slot"); ax.set_yticks(range(engine.max_num_seqs))


fig, axes = plt.subplots(2, 1, figsize=(10, 4.5), sharex=True)
slot_gantt(axes[0], es, "static batching")
slot_gantt(axes[1], ec, "continuous batching")
axes[1].set_xlabel("step (one forward each)")
plt.tight_layout(); plt.show()

# %% [markdown]
# Check: `pytest weeks/19 -k ex01`

# %% [markdown]
# ## 2. Preallocation's waste
#
# A contiguous cache (week 16's `LayerKVCache`) must reserve, for every request, as many slots as the
# request *might* need — in practice the model's maximum length — because it cannot grow in place. A
# paged cache hands a request whole blocks of `block_size` slots, one more each time it fills the last.
#
# **Exercise 2 (derive).** `blocks_needed(num_tokens, block_size)`: how many blocks a sequence of `num_tokens`
# tokens holds. Mind the edges (no tokens; a length that is a multiple of the block size; lengths far beyond
# what a float holds exactly).
#
# **Exercise 3 (derive).** `slots_wasted(lengths, block_size)`: of the slots a paged cache gives sequences of
# these lengths (each exactly the blocks it needs), how many hold no token? Where in a sequence's blocks can an
# empty slot be, and how many can one sequence have at most? (The answer is after the check.)

# %% nbgrader={"grade": false, "grade_id": "blocks_needed", "locked": false, "schema_version": 3, "solution": true, "task": false}
def blocks_needed(num_tokens: int, block_size: int) -> int:
    """Blocks of `block_size` slots that hold `num_tokens` tokens."""
    ### BEGIN SOLUTION
    return -(-num_tokens // block_size)  # ceil without floats
    ### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "test_blocks_needed", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
check_blocks_needed(blocks_needed)

# %% nbgrader={"grade": false, "grade_id": "slots_wasted", "locked": false, "schema_version": 3, "solution": true, "task": false}
def slots_wasted(lengths: list[int], block_size: int) -> int:
    """Slots that hold no token, when each sequence of `lengths` has the blocks it needs."""
    ### BEGIN SOLUTION
    return sum(blocks_needed(n, block_size) * block_size - n for n in lengths)
    ### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "test_slots_wasted", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
check_slots_wasted(slots_wasted)

# %% [markdown]
# *Where the waste is, now that your checks pass.* `n` tokens need ⌈n / b⌉ blocks of `b` slots
# (`-(-n // b)` in integers: a float division rounds wrongly for large `n`). Every block of a sequence is full
# except its last, so a sequence wastes ⌈n / b⌉·b − n slots: none when `n` is a multiple of `b`, at most
# `b − 1` — whatever its length. Preallocation wastes `max_len − n` per request.
#
# The seed also quotes "20.4 % utilization (FasterTransformer)" for existing systems: in the vLLM paper (Kwon et
# al., 2023, Fig. 2) that figure is **Orca (Max)**, a cache that reserves the maximum length per request — the same
# kind of number as the "preallocate 2048" row below. In bytes, on SmolLM2 (fp32 here; the cell prints the bytes
# per token) for a realistic mix — request lengths spread from short chats to long documents — and for several
# block sizes:

# %%
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

# %% [markdown]
# Preallocation to the maximum length uses a small fraction of what it reserves on this mix; paging
# with blocks of 16 uses nearly all of it (the seed's "96.3 % utilization" is this kind of number). Smaller blocks waste less but mean longer block tables and more,
# smaller reads (vLLM settled on 16). The reserved memory is what limits the batch: the last line is
# how many more requests the same pool holds when paged.
#
# Check: `pytest weeks/19 -k "ex02 or ex03"`

# %% [markdown]
# ## 3. The block allocator
#
# The pool is `num_blocks` physical blocks, numbered `0 … num_blocks − 1`. The allocator hands out free blocks
# and takes them back. One twist makes it more than a free list: a block can have **several owners** — two
# samples of the same prompt (section 6), or every request that starts with the same system prompt (section
# 7) — and it may be handed out again only when none is left.
#
# **Exercise 4 (design).** `BlockAllocator(num_blocks)` with `allocate() -> int`, `fork(block)`, `free(block)`,
# `ref_count(block)` and the property `num_free`. How it keeps track is yours; what it must keep true:
#
# * `allocate()` returns a block that nobody owns, and from then on it has one owner; `fork(block)` gives an
#   owned block one more owner, `free(block)` takes one away. A block is never handed out while it has an owner.
# * `ref_count(block)` is its number of owners (0: free); `num_free` is the number of blocks nobody owns.
# * A block may have hundreds of owners.
# * What cannot be done changes nothing and says why: `allocate()` with every block owned raises
#   `OutOfBlocksError` (below), its message saying how many blocks exist and how many are in use; `fork` or
#   `free` of a block nobody owns, or of a number that is not a block of the pool, raises `ValueError`.
#
# Keep every operation cheap: the engine calls them for every block of every step. The check replays long random
# sequences of allocate / fork / free against a model of the pool, and the errors.

# %% nbgrader={"grade": false, "grade_id": "BlockAllocator", "locked": false, "schema_version": 3, "solution": true, "task": false}
class OutOfBlocksError(RuntimeError):
    """allocate() found no free block."""


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

    def ref_count(self, block: int) -> int:
        ### BEGIN SOLUTION
        if not 0 <= block < self.num_blocks:
            raise ValueError(f"block {block} is not in 0..{self.num_blocks - 1}")
        return self.ref_counts[block]
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

# %% nbgrader={"grade": true, "grade_id": "test_BlockAllocator", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_BlockAllocator(BlockAllocator)

# %% [markdown]
# *One design, now that your check passes.* A list of reference counts, one per block, and a stack of the free
# blocks: `allocate` pops one and sets its count to 1, `fork` adds 1, `free` subtracts 1 and pushes the block back
# when the count reaches 0 — every operation O(1), and `num_free` is the stack's length. vLLM's block pool is the
# same idea (its free list is a queue, so that a freed block that still caches a prefix is reused last: section 7).

# %%
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

# %% [markdown]
# Check: `pytest weeks/19 -k ex04`
