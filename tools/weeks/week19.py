"""Build solutions/19/week19_paged_batching.ipynb (no outputs): `python tools/weeks/week19.py`."""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from lib import records  # noqa: E402
from tools.nbbuild import Notebook  # noqa: E402
from tools.results import recorded_md  # noqa: E402


def recorded_classes(benchmark: str, figure: str) -> list[str]:
    """The machine classes whose committed record of `benchmark` has `figure`."""
    return [cls for cls, recs in sorted(records.committed().items()) if figure in recs.get(benchmark, {}).get("figures", {})]


def serving_records() -> str:
    """Batch 8 over batch 1 in decode, per machine class that has a committed serving record, rendered from it."""
    lines = []
    for cls in recorded_classes("serving", "decode b8 / b1"):
        line = f"- batch 8 decodes {recorded_md('serving', 'decode b8 / b1', cls)} the tokens per second of batch 1"
        eager = ("decode b1, eager (graphs=False)", "decode b8, eager (graphs=False)")
        if all(f in records.committed()[cls]["serving"]["figures"] for f in eager):
            line += (f"; launched op by op from Python, without CUDA graphs, batch 1 decodes "
                     f"{recorded_md('serving', eager[0], cls)} and batch 8 {recorded_md('serving', eager[1], cls)}")
        lines.append(line + ".")
    if not [c for c in recorded_classes("serving", "decode b8 / b1") if not c.startswith("nvidia")]:
        lines.append("- no CPU class has a committed serving record yet: `python benchmarks/serving.py --decode-only "
                     "--record` on a quiet machine writes one, and rebuilding this notebook renders it here.")
    return "\n".join(lines)


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
inside a small real engine (`lib/engine.py` and its block pool `lib/blocks.py`; the first code cell prints
their length) on SmolLM2, which returns exactly the tokens that `generate` returns on each request alone.

**You will write** a model of what continuous batching gains (`continuous_gain`, predicted, then measured),
`blocks_needed`, `slots_wasted`, `BlockAllocator`, `slot_mapping`, `paged_attention`, `block_hashes`, the
block pool with its prefix cache `PrefixCache`, the engine's scheduler `schedule` and two quiz answers — then
run the engine on your parts alone (exercise 10) and predict its step count (`predict_steps`). Most of them
are posed as a question, a design (the properties an answer must keep) or a prediction: the formula, the
algorithm or the derivation comes after the check that your answer passes. Each is followed by a graded cell;
`pytest weeks/19 -k ex05` checks one exercise from a terminal.

**Time.** About 5 hours. The notebook runs top to bottom in 2–3 minutes on a 2-core CPU with the fast
defaults below; `FULL = True` reruns the measurements at the seed's sizes (about 15 minutes).
""")

nb.setup("""
import math

import torch

from grader.checks.week19 import (check_continuous_gain, check_blocks_needed, check_slots_wasted,
                                  check_BlockAllocator, check_slot_mapping, check_paged_attention, check_block_hashes,
                                  check_schedule, check_PrefixCache, check_engine, check_predict_steps,
                                  check_answer_q1, check_answer_q3)
""")

nb.code("""
import inspect
import time

import matplotlib.pyplot as plt
from tqdm.auto import tqdm

import lib.blocks
import lib.engine
import lib.model_runner
from lib import paged as ref, records, roofline as rl
from lib.attention import gqa_attention
from lib.engine import LLMEngine, simulate_steps
from lib.engine_load import percentile, run_load
from lib.generate import generate as lib_generate
from lib.kv_cache import kv_cache_bytes
from lib.model import shared_smollm2, tiny_model
from lib.text import load_text
from lib.timing import Conditions, interleaved, not_monotone, report, warning

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
size = {m.__name__: len(inspect.getsource(m).splitlines()) for m in (lib.engine, lib.model_runner, lib.blocks)}
print(", ".join(f"{m.replace('.', '/')}.py {n} lines" for m, n in size.items()) + "; of them LLMEngine "
      f"{len(inspect.getsource(LLMEngine).splitlines())}, its step() {len(inspect.getsource(LLMEngine.step).splitlines())}")
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
s8, c8 = simulate_steps(seed8, 8, "static"), simulate_steps(seed8, 8, "continuous")
print(f"8 requests on 8 slots: static {s8} steps, continuous {c8} steps")
# Latency of the 8 requests: a static batch returns them together; continuous returns each when it is done.
print(f"mean completion: static {s8} steps, continuous {sum(seed8) / len(seed8):.0f} steps")
""")
nb.md("""
With only the 8 requests there is nothing to gain in **throughput**: both policies take as many steps as the
longest request, because nobody is waiting for the slots the short requests free. There is a gain in
**latency**: a static batch returns its requests together, continuous batching returns each short request as
soon as it is done. The throughput gain needs a **queue**.

**Exercise 1 (predict).** A deep queue of requests waits for `slots` slots. Each request generates `n` new
tokens with probability `lengths[n]`, independently of the others. Static batching takes the next `slots`
requests as a batch and runs it until all of them are done; continuous batching gives a freed slot to the
next request at the next step. Write `continuous_gain(lengths, slots)`: continuous batching's throughput over
static batching's (requests finished per step, in the long run), in the step-count model above (one token per
running request per step, prefill left out). Reason about how long one static batch lasts, and about one slot
under continuous batching. The check asks about distributions and slot counts you have not seen (drawn per
run, its seed printed); then you measure a real queue against your model. Before you run anything: what does
your model say about the seed's half-50, half-200 mix on 8 slots?
""")
nb.exercise("continuous_gain", """
def continuous_gain(lengths: dict[int, float], slots: int) -> float:
    \"\"\"Continuous over static throughput, a deep queue; n new tokens with probability lengths[n].\"\"\"
    ### BEGIN SOLUTION
    cdf, below, batch_steps = 0.0, 0.0, 0.0
    for n, p in sorted(lengths.items()):
        cdf += p
        batch_steps += n * (cdf ** slots - below)  # P(the longest of `slots` requests has n tokens)
        below = cdf ** slots
    return batch_steps / sum(n * p for n, p in lengths.items())
    ### END SOLUTION
""")
nb.test("test_continuous_gain", "check_continuous_gain(continuous_gain)", points=2)
nb.md("""
*The model, now that your check passes.* Under continuous batching no slot idles while requests wait: a slot
serves one request per E[L] steps on average, so S slots finish S requests per E[L] steps. A static batch of
S requests holds all S slots until the longest of them is done: E[max of S lengths] steps for S requests. The
gain is E[max] / E[L]. The longest of S independent lengths is at most n with probability F(n)^S (F: the
distribution function of the lengths), so it is exactly n with probability F(n)^S − F(n−1)^S. Equivalently the
gain is 1 / (1 − idle), with idle the share of a static batch's slot-steps that no token fills: a scheduler
that wasted no slot-step would gain exactly this and no more. Your model on the seed's mix:
""")
nb.code("""
for slots in (1, 2, 4, 8, 32):
    print(f"half 50, half 200 new tokens, {slots:2d} slots: continuous batching gains {continuous_gain({50: 0.5, 200: 0.5}, slots):.3f}x")
print(f"bound for any number of slots: every static batch as long as the longest request: {200 / 125:.3f}x")
""")
nb.md("""
With 8 slots nearly every static batch holds a 200-token request, so the gain is close to its bound
(200 steps per batch against the mean of 125 per request). The seed's "2–3×" is above what any scheduler gains
on this mix. The gain grows with the spread of lengths and the number of slots, and is 1 when all lengths are
equal or with a single slot.

**Count it** with the real engine: a queue drawn from a mix like the seed's (half short, half 4× longer),
scaled down by default (12 requests of 4 or 16 new tokens on 4 slots; `FULL`: 64 requests of 50 or 200 on 8
slots). Your prediction first, then the engine's step counts, static against continuous. The steps depend on the
lengths, not on the model, so a tiny model of SmolLM2's vocabulary counts them in a moment; section 8 times the
same queue on SmolLM2, on an engine built from your own parts.
""")
nb.code("""
N_REQ, SLOTS, SHORT, LONG = (64, 8, 50, 200) if FULL else (12, 4, 4, 16)
MIX = {SHORT: 0.5, LONG: 0.5}


def draw_queue(n, seed):
    \"\"\"n requests' new-token counts, drawn from MIX.\"\"\"
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
""")
nb.md("""
The engine takes exactly the steps of the step-count model (the `assert` above): the prefill step also samples a
request's first token, so a request of n new tokens holds its slot for exactly n steps. A short queue gains less
than your prediction for a deep one, for two reasons: at its end the last requests run beside empty slots
(continuous batching has nothing left to fill them with), and a dozen requests may draw an unlucky mix. As the
queue deepens (the last lines) its gain approaches your model. The **Gantt chart** below shows each
slot over time, one colour per request: in the static run a slot whose request has finished keeps computing
padding (grey) until the whole batch is done.
""")
nb.code("""
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
""")
nb.md("Check: `pytest weeks/19 -k ex01`")

# --- 2 -----------------------------------------------------------------------------------------------
nb.md("""
## 2. Preallocation's waste

A contiguous cache (week 16's `LayerKVCache`) must reserve, for every request, as many slots as the
request *might* need — in practice the model's maximum length — because it cannot grow in place. A
paged cache hands a request whole blocks of `block_size` slots, one more each time it fills the last.

**Exercise 2 (derive).** `blocks_needed(num_tokens, block_size)`: how many blocks a sequence of `num_tokens`
tokens holds. Mind the edges (no tokens; a length that is a multiple of the block size; lengths far beyond
what a float holds exactly).

**Exercise 3 (derive).** `slots_wasted(lengths, block_size)`: of the slots a paged cache gives sequences of
these lengths (each exactly the blocks it needs), how many hold no token? Where in a sequence's blocks can an
empty slot be, and how many can one sequence have at most? (The answer is after the check.)
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
    \"\"\"Slots that hold no token, when each sequence of `lengths` has the blocks it needs.\"\"\"
    ### BEGIN SOLUTION
    return sum(blocks_needed(n, block_size) * block_size - n for n in lengths)
    ### END SOLUTION
""")
nb.test("test_slots_wasted", "check_slots_wasted(slots_wasted)", points=1)
nb.md("""
*Where the waste is, now that your checks pass.* `n` tokens need ⌈n / b⌉ blocks of `b` slots
(`-(-n // b)` in integers: a float division rounds wrongly for large `n`). Every block of a sequence is full
except its last, so a sequence wastes ⌈n / b⌉·b − n slots: none when `n` is a multiple of `b`, at most
`b − 1` — whatever its length. Preallocation wastes `max_len − n` per request.

The seed also quotes "20.4 % utilization (FasterTransformer)" for existing systems: in the vLLM paper (Kwon et
al., 2023, Fig. 2) that figure is **Orca (Max)**, a cache that reserves the maximum length per request — the same
kind of number as the "preallocate 2048" row below. In bytes, on SmolLM2 (fp32 here; the cell prints the bytes
per token) for a realistic mix — request lengths spread from short chats to long documents — and for several
block sizes:
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

Check: `pytest weeks/19 -k "ex02 or ex03"`
""")

# --- 3 -----------------------------------------------------------------------------------------------
nb.md("""
## 3. The block allocator

The pool is `num_blocks` physical blocks, numbered `0 … num_blocks − 1`. The allocator hands out free blocks
and takes them back. One twist makes it more than a free list: a block can have **several owners** — two
samples of the same prompt (section 6), or every request that starts with the same system prompt (section
7) — and it may be handed out again only when none is left.

**Exercise 4 (design).** `BlockAllocator(num_blocks)` with `allocate() -> int`, `fork(block)`, `free(block)`,
`ref_count(block)` and the property `num_free`. How it keeps track is yours; what it must keep true:

* `allocate()` returns a block that nobody owns, and from then on it has one owner; `fork(block)` gives an
  owned block one more owner, `free(block)` takes one away. A block is never handed out while it has an owner.
* `ref_count(block)` is its number of owners (0: free); `num_free` is the number of blocks nobody owns.
* A block may have hundreds of owners.
* What cannot be done changes nothing and says why: `allocate()` with every block owned raises
  `OutOfBlocksError` (below), its message saying how many blocks exist and how many are in use; `fork` or
  `free` of a block nobody owns, or of a number that is not a block of the pool, raises `ValueError`.

Keep every operation cheap: the engine calls them for every block of every step. The check replays long random
sequences of allocate / fork / free against a model of the pool, and the errors.
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
""")
nb.test("test_BlockAllocator", "check_BlockAllocator(BlockAllocator)", points=2)
nb.md("""
*One design, now that your check passes.* A list of reference counts, one per block, and a stack of the free
blocks: `allocate` pops one and sets its count to 1, `fork` adds 1, `free` subtracts 1 and pushes the block back
when the count reaches 0 — every operation O(1), and `num_free` is the stack's length. vLLM's block pool is the
same idea (its free list is a queue, so that a freed block that still caches a prefix is reused last: section 7).
""")
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
nb.md("Check: `pytest weeks/19 -k ex04`")

# --- 4 -----------------------------------------------------------------------------------------------
nb.md("""
## 4. Block tables and paged attention

A sequence's **block table** lists its physical blocks in logical order: its first `block_size` tokens
live in block `table[0]`, the next ones in `table[1]`, and so on. The pool numbers its slots block by block
(block `b` holds slots `b·block_size … b·block_size + block_size − 1`). The engine writes each new token's
key and value to its slot (the **slot mapping**) and reads a sequence's keys through its table.

**Exercise 5 (derive).** Work out, from the table and `block_size`, the slot that holds logical position
`p` of a sequence; then write `slot_mapping(block_table, start, num_tokens, block_size)`: the slots (int64
tensor `[num_tokens]`) of positions `start … start + num_tokens − 1`. (The derivation is spelled out after
the check.)
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
*The derivation.* Position `p` is in the table's entry `p // block_size` (whole blocks before it) at offset
`p % block_size` inside that block, so its slot is `table[p // block_size] · block_size + p % block_size` —
vLLM's `slot_mapping` is exactly this, computed for every new token of a step.
""")
nb.md("""
Now the attention. At a decode step every running sequence has **one** query and its own number of
keys, scattered over the pool. `paged_attention(q, k_pool, v_pool, block_tables, context_lens)` takes

* `q [B, n_heads, head_dim]` (one query per sequence),
* `k_pool, v_pool [num_blocks, n_kv_heads, block_size, head_dim]` (one layer's pool),
* `block_tables` int64 `[B, max_blocks]` (a row may end with entries that mean nothing: ignore them),
* `context_lens` int64 `[B]` (how many keys each sequence has, its new token's included),

and returns `[B, n_heads, head_dim]`, equal to ordinary attention over each sequence's keys (query head
`h` reads KV head `h // (n_heads // n_kv_heads)`, as in week 16). `q` and the pools may be bf16 or fp16 (a
server's cache usually is): the result has `q`'s dtype and is as accurate as an fp32 computation rounded once at
the end — upcast each block you read (`.float()`), keep the scores, the running statistics and the output in fp32,
and return `.to(q.dtype)`.

**Exercise 6 (design).** Write it **without** copying each sequence's keys into a contiguous `[B, max_len]`
tensor: that copy is exactly the memory paging saves, and the vLLM kernel never makes it. Read a block
(or a few) of every sequence at a time — `k_pool[block_tables[:, j]]` is `[B, n_kv_heads, block_size,
head_dim]` — mask the positions at or past `context_lens`, and combine the blocks with the **online
softmax** of week 17 (running max `m`, running sum `l`, running output). The check compares against
contiguous attention (≤ 1e-5) on ragged lengths, random block sizes, head sizes and batches (GQA and MHA
every run), and in bf16 and fp16 with 12,000–16,000 keys (within the dtype's rounding); it watches the peak
memory (less than half a contiguous copy of the longest sequence's K and V,
and with one sequence of ~5,000 keys less than half of one KV head's keys: no whole row per head either), the
longest reduction (no softmax over a whole row), how often each block of K is read (once per KV head: the
query heads of a GQA group share it, so read it once for all of them — not once per query head, not a first
pass for the max and a second for the exponentials, not twice by chunks of positions that split a block) and
your inputs (unchanged); no SDPA, no `lib`, no numpy, and every
tensor you make on the inputs' device (`device=q.device`: the check also runs it on `meta` tensors).
""")
nb.exercise("paged_attention", """
def paged_attention(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, block_tables: torch.Tensor,
                    context_lens: torch.Tensor) -> torch.Tensor:
    \"\"\"One decode query per sequence, attending over its keys and values read from the block pool.\"\"\"
    ### BEGIN SOLUTION
    b, h, d = q.shape
    _, hkv, bs, _ = k_pool.shape
    group = h // hkv
    dev = q.device  # every tensor made here lives where the inputs do (a GPU's, in a server)
    per_step = max(1, 32 // bs)  # blocks read at once: about 32 keys
    qg = q.reshape(b, hkv, group, d).float() / math.sqrt(d)  # [B, Hkv, group, d]
    m = torch.full((b, hkv, group), float("-inf"), device=dev)
    l = torch.zeros(b, hkv, group, device=dev)
    acc = torch.zeros(b, hkv, group, d, device=dev)
    for j0 in range(0, block_tables.shape[1], per_step):  # columns past a sequence's end are masked out
        j1 = min(j0 + per_step, block_tables.shape[1])
        pos = torch.arange(j0 * bs, j1 * bs, device=dev)  # logical positions of these blocks
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
    # drawn on the CPU (the seeded generator lives there), then put where a server's pool lives: the model's device
    k_pool = torch.randn(sum(need) + 4, cfg.n_kv_heads, bs, cfg.head_dim, generator=g).to(dev)
    v_pool = torch.randn_like(k_pool)
    perm = torch.randperm(k_pool.shape[0], generator=g).tolist()
    tables = [perm[sum(need[:i]):sum(need[:i + 1])] for i in range(len(lens))]
    q = torch.randn(len(lens), cfg.n_heads, cfg.head_dim, generator=g).to(dev)
    out = paged_attention(q, k_pool, v_pool, ref.block_table_tensor(tables, dev), torch.tensor(lens, device=dev))
    err = 0.0
    for i, n in enumerate(lens):
        slots = slot_mapping(tables[i], 0, n, bs).to(dev)
        k = k_pool.permute(0, 2, 1, 3).reshape(-1, cfg.n_kv_heads, cfg.head_dim)[slots].transpose(0, 1)[None]
        v = v_pool.permute(0, 2, 1, 3).reshape(-1, cfg.n_kv_heads, cfg.head_dim)[slots].transpose(0, 1)[None]
        err = max(err, (gqa_attention(q[i][None, :, None], k, v)[0, :, 0] - out[i]).abs().max().item())
    print(f"block size {bs:2d}: lengths {lens}, max |paged - contiguous| = {err:.1e}")
""")
nb.md("""
**What reading in place costs.** The vLLM paper measured its paged kernel against the contiguous kernel of
FasterTransformer; seed 001 quotes the cost as "20-26% higher attention kernel latency (block table lookup,
non-contiguous memory access)". Measure yours on this machine: your `paged_attention`
against attention over the same keys and values stored contiguously per sequence (`gqa_attention`: the same
matmuls and softmax, one call for the whole batch), a decode batch of 8 sequences of SmolLM2's shapes (one
layer), blocks of 16 scattered over the pool, at several context lengths. The two take turns, round by round,
so that whatever else the machine does falls on both (`lib.timing`); read the best of the repeats, their
spread and the load.
""")
nb.code("""
CONTEXTS = [256, 1024, 4096, 8192] if FULL else [256, 1024, 4096]
B_DECODE, BS = 8, 16
g = torch.Generator().manual_seed(4)
conditions = Conditions.now()
latency = {}
for T in CONTEXTS:
    n_blocks = B_DECODE * T // BS
    k_pool = torch.randn(n_blocks, cfg.n_kv_heads, BS, cfg.head_dim, generator=g).to(dev)
    v_pool = torch.randn_like(k_pool)
    tables = torch.randperm(n_blocks, generator=g).reshape(B_DECODE, T // BS).to(dev)  # scattered blocks
    lens = torch.full((B_DECODE,), T, device=dev)
    q = torch.randn(B_DECODE, cfg.n_heads, cfg.head_dim, generator=g).to(dev)
    # the same keys and values, each sequence's stored contiguously: [B, n_kv_heads, T, head_dim]
    k, v = (pool[tables].permute(0, 2, 1, 3, 4).reshape(B_DECODE, cfg.n_kv_heads, T, cfg.head_dim).contiguous()
            for pool in (k_pool, v_pool))
    latency[T] = interleaved({"contiguous": lambda q=q, k=k, v=v: gqa_attention(q[:, :, None], k, v),
                              "paged (yours)": lambda q=q, kp=k_pool, vp=v_pool, t=tables, n=lens:
                              paged_attention(q, kp, vp, t, n)}, repeats=7 if FULL else 5, device=dev)
conditions.done()
print(f"decode attention, batch {B_DECODE}, {cfg.n_heads} query heads / {cfg.n_kv_heads} KV heads of {cfg.head_dim}, "
      f"blocks of {BS}; best of the repeats (ms), worst / best in brackets")
print(f"{'context':>8} {'contiguous':>15} {'paged (yours)':>15} {'paged cost':>11}")
for T, t in latency.items():
    c, p = t["contiguous"], t["paged (yours)"]
    print(f"{T:>8} {c.best * 1e3:9.3f} ({c.spread:.2f}) {p.best * 1e3:9.3f} ({p.spread:.2f}) {p.best / c.best - 1:+11.0%}")
print(conditions.line())
alerts = [not_monotone(CONTEXTS, [latency[T][name].best for T in CONTEXTS], f"{name} attention's time")
          for name in ("contiguous", "paged (yours)")]  # more keys cannot take less time
alerts.append(warning([x for t in latency.values() for x in t.values()], conditions))
print("\\n".join(a for a in alerts if a))
""")
nb.md("""
Compare the last column with the seed's "20-26%". That figure is for a fused CUDA kernel, where a block-table
lookup is a few instructions inside one kernel that reads every block once. Your function issues a handful of
torch operations for each chunk of blocks, and on a CPU each operation has a fixed cost (the interpreter, the
dispatcher, a small matmul that uses the cores badly) on top of its arithmetic. How much of that a chunk
amortizes is what the column shows: a kernel that reads the table inside a fused loop (vLLM's, or FlashInfer's)
pays for the indirection only, which is how the paper's figure can be that small.
""")
nb.md("Check: `pytest weeks/19 -k \"ex05 or ex06\"`")

# --- 5 -----------------------------------------------------------------------------------------------
nb.md("""
## 5. The engine

`lib/engine.py` puts the pieces together. It is not short (the first code cell printed its length); the part
to read is `LLMEngine.step`, schedule → run → postprocess: `_schedule` carries out the scheduler's plan,
`ModelRunner.run` (`lib/model_runner.py`) runs the forward, `_postprocess` samples and finishes. Each **step**:

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
prompts = PROMPTS[:8] if FULL else PROMPTS[:3]
NEW = 32 if FULL else 8
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
the matmuls become compute-bound. Measured (decode steps only, after the prefill; the batch sizes take turns,
round by round, and the best round counts). The roofline uses the best streaming bandwidth measured on this
class of machine (`lib.records.best_bandwidth`: the committed records, this machine's earlier runs and this
run), never one run's reading alone: a shared machine's probe moves from minute to minute.
""")
nb.code("""
BATCHES = [1, 2, 4, 8, 16, 32] if FULL else [1, 4, 8, 16]
STEPS, REPEATS = (16, 3) if FULL else (4, 2)


def decoding_engine(batch):
    \"\"\"An engine whose `batch` requests are past their prefill, with tokens left for every timed round.\"\"\"
    eng = LLMEngine(model, num_blocks=8 * batch, block_size=16, max_num_seqs=batch, max_num_batched_tokens=1024)
    for p in PROMPTS[:batch]:
        eng.add_request(p, STEPS * REPEATS + 2)
    eng.step()  # the prefill of every request
    return eng


engines = {b: decoding_engine(b) for b in tqdm(BATCHES, desc="prefill")}
conditions = Conditions.now()
timed = interleaved({f"batch {b}": lambda e=engines[b]: [e.step() for _ in range(STEPS)] for b in BATCHES},
                    repeats=REPEATS, warmup=0, device=dev)
bandwidth = rl.measure_bandwidth(128, repeats=3, device=dev)  # a streaming read of 128 MiB on the model's device
conditions.done()
rates = {b: (b * STEPS / timed[f"batch {b}"].best, timed[f"batch {b}"].best / STEPS) for b in BATCHES}  # tok/s, s/step
weight_bytes = rl.weight_bytes_per_token(model)  # every matmul weight once, the tied embedding as the LM head
roof_bandwidth, roof_from = records.best_bandwidth(measured_now=bandwidth)
roofline = weight_bytes / roof_bandwidth  # s per step to read every weight once
print(f"this machine ({records.machine()['class']}): roofline {weight_bytes / 1e6:.0f} MB of weights at "
      f"{roof_bandwidth / 1e9:.1f} GB/s = {roofline * 1e3:.1f} ms per step, any batch")
print(f"  the bandwidth: {roof_from}; the probe read {bandwidth / 1e9:.1f} GB/s now")
print(f"{'batch':>6} {'ms/step':>8} {'spread':>7} {'x roofline':>10} {'tok/s':>7} {'vs batch 1':>10} {'of linear':>9}")
for b, (rate, step) in rates.items():
    print(f"{b:>6} {step * 1e3:8.1f} {timed[f'batch {b}'].spread:6.2f}x {step / roofline:9.1f}x {rate:7.1f} "
          f"{rate / rates[1][0]:9.1f}x {rate / rates[1][0] / b:9.0%}")
print(conditions.line())
alerts = [not_monotone(BATCHES, [rates[b][1] for b in BATCHES], "the decode step's time"),  # more rows cannot cost less
          warning(timed, conditions)]
if min(step for _, step in rates.values()) < roofline:
    alerts.append("measurement problem: a step faster than reading the weights once — the bandwidth is understated")
print("\\\\n".join(a for a in alerts if a))
fig, ax = plt.subplots(1, 2, figsize=(10, 3.5))
ax[0].plot(BATCHES, [rates[b][0] for b in BATCHES], "o-", label="measured")
ax[0].plot(BATCHES, [rates[1][0] * b for b in BATCHES], "--", color="gray", label="linear in batch")
ax[0].set_xlabel("batch (requests decoding together)"); ax[0].set_ylabel("decode tokens / s"); ax[0].legend()
ax[1].plot(BATCHES, [rates[b][1] * 1e3 for b in BATCHES], "o-")
ax[1].set_xlabel("batch"); ax[1].set_ylabel("ms per decode step"); ax[1].set_ylim(bottom=0)
plt.tight_layout(); plt.show()
""")
nb.md("""
Read the last two columns. Throughput grows with the batch — that is the reason servers batch — but
**not** in proportion. The bandwidth argument above assumed a step costs about the time to read the weights;
the `x roofline` column says how far from that the steps are. Several times the roofline at batch 1 means the
step is bound by **overhead** — Python, one kernel call per layer and operation, the paged-attention loop, the
LM head — more than by memory bandwidth, and that overhead grows with the batch. Your machine's figures are the
table above: read its ratios, not the absolute times, and rerun the cell if it warns (a busy machine changes the
ratios too).

The same decode steps, recorded with `python benchmarks/serving.py --decode-only` on the lab's machines:
{SERVING_RECORDS}
""".replace("{SERVING_RECORDS}", serving_records()))

# --- 6 -----------------------------------------------------------------------------------------------
nb.md("""
## 6. Copy-on-write: parallel sampling

Asking for `n` samples of one prompt (`n=4` in an API call) computes the prompt **once**. The samples
then share its blocks: the allocator's reference counts say each block has `n` owners. The full blocks
are never written again, so they stay shared to the end. The prompt's last, partly filled block is
written by every sample's next token — so each sample but the last owner gets a private **copy** of
that one block the first time it writes (copy-on-write), and from then on fills blocks of its own.

`LLMEngine.sample(prompt, max_new_tokens, n, temperature, seed)` does this; below, its peak block use
against the same 4 samples run as 4 separate requests.
""")
nb.code("""
long_prompt = tok(" ".join(lines[300:330])).input_ids[:100]  # a 100-token prompt: 6 full blocks + 4 tokens
N_SAMPLES, NEW6, TEMP = 4, (32 if FULL else 6), 0.8
shared = LLMEngine(model, num_blocks=64, block_size=16)
samples = shared.sample(long_prompt, NEW6, n=N_SAMPLES, temperature=TEMP, seed=0)
separate = LLMEngine(model, num_blocks=64, block_size=16)
for k in range(N_SAMPLES):
    separate.add_request(long_prompt, NEW6, temperature=TEMP, seed=k)  # sample k of `sample` is seeded 0 + k
while separate.has_unfinished():
    separate.step()
apart = separate.finished_outputs()
print("each shared sample equals its separate run:", [samples[k] == apart[k] for k in range(N_SAMPLES)])
block_bytes = 16 * kv_cache_bytes(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, 1, bytes_per_element=4)
for name, eng in [("shared (copy-on-write)", shared), ("4 separate requests", separate)]:
    peak = max(s["blocks_in_use"] for s in eng.step_stats)
    print(f"{name:>24}: peak {peak:3d} blocks = {peak * block_bytes / 1e6:5.1f} MB; "
          f"prompt computed {sum(s['num_prefill_tokens'] for s in eng.step_stats)} tokens; "
          f"{eng.num_cow_copies} blocks copied on write")
for k in range(N_SAMPLES):
    print(f"sample {k}:", repr(tok.decode(samples[k])))
""")
nb.md("""
Sharing saves the prompt's full blocks `n − 1` times over, and its prefill `n − 1` times; the copies cost
one block per extra sample. The longer the prompt against the answers, the bigger the saving: on chat
workloads, whose answers are long against their prompts, it is much smaller than here (the vLLM paper,
§6.3, measures it for parallel sampling and for beam search, which shares more and saves more).
""")

# --- 7 -----------------------------------------------------------------------------------------------
nb.md("""
## 7. Prefix caching

A chatbot sends the same long system prompt in front of every user message (the seed's Q10: a
2000-token system prompt shared by all users). Its keys and values are the same every time, so a server
can keep the blocks and reuse them: **prefix caching**. The engine needs to find, for a new request, the
longest run of leading *full* blocks that some earlier request already computed. It keys each full
block by a hash, and looks the hashes up. A hit shares the block (one more reference); a cached block that no
running request holds is kept until the pool runs short, then the least recently used one is evicted.

**Exercise 7 (design).** `block_hashes(token_ids, block_size)`: one hash per full block, designed so
that a hit is safe to share. Two requests must get the same hash for block `i` exactly when their first
`(i + 1)·block_size` tokens agree — not just block `i`'s own tokens; the same block of tokens at another
depth must hash differently; the order of the tokens matters; and a cache of a million blocks must not
collide (keep at least 64 bits). What must the hash of block `i` be computed from? The check tests these
properties, not particular values; one design is given after it.
""")
nb.exercise("block_hashes", """
def block_hashes(token_ids: list[int], block_size: int) -> list[int]:
    \"\"\"One hash per FULL block of token_ids, with the properties above.\"\"\"
    ### BEGIN SOLUTION
    hashes, h = [], None
    for i in range(len(token_ids) // block_size):
        h = hash((h, tuple(token_ids[i * block_size:(i + 1) * block_size])))
        hashes.append(h)
    return hashes
    ### END SOLUTION
""")
nb.test("test_block_hashes", "check_block_hashes(block_hashes)", points=1)
nb.md("""
*One design, now that your check passes.* Chain it: `h_i = hash((h_{i−1}, tuple(tokens of block i)))` with `h_{−1} = None`. Block `i`'s
hash then covers every earlier token through `h_{i−1}`, a tuple keeps the order, and Python's `hash` of a
tuple gives 64 bits, deterministic within one process — enough for one engine (processes that must agree on
hashes use a stable one, such as SHA-256 of the tokens' bytes). The collision that remains possible is why
`lookup` compares the tokens too.
""")
nb.md("""
The engine keeps the cache inside its block pool: a block whose last owner frees it can stay cached, so that a
later request with the same prefix takes it back instead of recomputing it.

**Exercise 8 (design).** `PrefixCache(num_blocks)`: a block pool with your `BlockAllocator`'s interface
(`allocate`, `fork`, `free`, `ref_count`, `num_free`) and two more methods: `register(block, block_hash,
tokens)` caches an owned full block under its hash, keeping its tokens (nothing if that hash or that block is
cached already); `lookup(block_hash, tokens)` returns a cached block or `None`, and changes nothing (the engine
`fork`s a block it uses). The structures are yours; what it must keep true:

* **A hit is safe.** `lookup` returns a block only if it is cached under that hash with exactly these tokens:
  two different blocks can share a hash, and serving another prompt's keys and values would be a silent wrong
  answer.
* **What is owned stays.** A block somebody owns is never handed out by `allocate`, and never forgotten by the
  cache.
* **A freed block stays cached as long as the pool can afford it.** When its last owner frees it, it counts as
  free (`num_free`), `lookup` still finds it, and `fork` takes it back (a hit: one owner, no longer free).
  `allocate` hands out a free block that caches nothing while there is one; only when every free block caches
  something does it evict one — the one freed longest ago (least recently used) — and forget its hash.
* **What cannot be done changes nothing and says why**, as in exercise 4: `allocate` with no free block raises
  `OutOfBlocksError`; `free` of a block nobody owns, `fork` of a free block that caches nothing, or a number that
  is not a block of the pool raise `ValueError`.

The check replays random operations against a model of the cache (which block is evicted, every
lookup's answer, a collision, `num_free` after every step), then runs `LLMEngine(...,
enable_prefix_caching=True, block_pool=PrefixCache)` on prompts sharing a prefix through a pool small
enough to evict, against `generate` on each prompt alone.
""")
nb.exercise("PrefixCache", """
class PrefixCache:
    def __init__(self, num_blocks: int):
        ### BEGIN SOLUTION
        from collections import OrderedDict

        self.size = num_blocks
        self.owners = [0] * num_blocks
        self.plain = list(range(num_blocks - 1, -1, -1))  # free blocks caching nothing (a stack)
        self.stale = OrderedDict()  # free cached blocks, least recently freed first
        self.by_hash = {}  # hash -> block
        self.entry = {}  # block -> (hash, tokens)
        ### END SOLUTION

    @property
    def num_free(self) -> int:
        ### BEGIN SOLUTION
        return len(self.plain) + len(self.stale)
        ### END SOLUTION

    def ref_count(self, block: int) -> int:
        ### BEGIN SOLUTION
        return self.owners[block]
        ### END SOLUTION

    def allocate(self) -> int:
        ### BEGIN SOLUTION
        if self.plain:
            block = self.plain.pop()
        elif self.stale:
            block = next(iter(self.stale))  # the least recently freed
            del self.stale[block]
            block_hash, _ = self.entry.pop(block)
            del self.by_hash[block_hash]
        else:
            raise OutOfBlocksError(f"all {self.size} blocks are in use")
        self.owners[block] = 1
        return block
        ### END SOLUTION

    def fork(self, block: int) -> int:
        ### BEGIN SOLUTION
        if not 0 <= block < self.size:
            raise ValueError(f"no block {block}")
        if self.owners[block] == 0:
            if block not in self.stale:
                raise ValueError(f"block {block} is free and caches nothing")
            del self.stale[block]  # a hit: the cached block is in use again
        self.owners[block] += 1
        return block
        ### END SOLUTION

    def free(self, block: int) -> None:
        ### BEGIN SOLUTION
        if not 0 <= block < self.size or self.owners[block] == 0:
            raise ValueError(f"block {block} is not allocated")
        self.owners[block] -= 1
        if self.owners[block] == 0:
            if block in self.entry:
                self.stale[block] = None  # free, still cached, evicted last
            else:
                self.plain.append(block)
        ### END SOLUTION

    def register(self, block: int, block_hash: int, tokens: list[int]) -> None:
        ### BEGIN SOLUTION
        if not 0 <= block < self.size or self.owners[block] == 0:
            raise ValueError(f"block {block} is not allocated")
        if block_hash in self.by_hash or block in self.entry:
            return
        self.by_hash[block_hash] = block
        self.entry[block] = (block_hash, tuple(tokens))
        ### END SOLUTION

    def lookup(self, block_hash: int, tokens: list[int]) -> int | None:
        ### BEGIN SOLUTION
        block = self.by_hash.get(block_hash)
        if block is not None and self.entry[block][1] == tuple(tokens):
            return block
        return None  # not cached, or a collision
        ### END SOLUTION
""")
nb.test("test_PrefixCache", "check_PrefixCache(PrefixCache)", points=3)
nb.md("""
*One design, now that your check passes.* Reference counts as in exercise 4; a stack of the free blocks that
cache nothing; the free blocks that cache something in the order they were freed (an `OrderedDict`: the first
is the one to evict, and a hit removes its block from it); and two maps, hash → block and block → (hash,
tokens). `free` of a block's last owner puts it on the stack or, if it caches something, at the end of the
ordered free blocks; `allocate` pops the stack first. vLLM's pool gets the same order from one free queue in
which freed cached blocks go to the back.
""")
nb.md("""
The engine with and without prefix caching on 8 requests that share a system prompt (128 tokens here,
512 with `FULL`), each with its own question, all arriving at once:
""")
nb.code("""
SYSTEM = tok(" ".join(lines[400:520])).input_ids[:512 if FULL else 128]
chat = [SYSTEM + p for p in PROMPTS[10:18]]


def serve(prompts, new, **kwargs):
    eng = LLMEngine(model, num_blocks=256, block_size=16, max_num_seqs=4, block_pool=PrefixCache, **kwargs)
    result = run_load(eng, prompts, [new] * len(prompts), [0.0] * len(prompts))
    return eng, result


caching = {"no prefix cache": False, "prefix cache": True}
runs = {name: [] for name in caching}  # each repeat's (engine, result), the two taking turns
conditions = Conditions.now()
timed = interleaved({name: lambda name=name: runs[name].append(serve(chat, 4, enable_prefix_caching=caching[name]))
                     for name in caching}, repeats=3 if FULL else 2, warmup=0, device=dev)
conditions.done()
print(f"{len(chat)} requests, {len(SYSTEM)}-token shared system prompt + {sum(map(len, PROMPTS[10:18])) // 8} "
      f"tokens each; TTFT p50: the best repeat, the worst in brackets")
ttft = {name: [percentile(r["ttft"], 50) for _, r in done] for name, done in runs.items()}
for name, done in runs.items():
    eng = done[0][0]
    computed = sum(s["num_prefill_tokens"] for s in eng.step_stats)
    hit = eng.prefix_hit_tokens / eng.prompt_tokens
    print(f"{name:>16}: prefill tokens computed {computed:5d}, hit rate {hit:5.1%}, "
          f"TTFT p50 {min(ttft[name]):5.2f} s ({max(ttft[name]):.2f})")
print(report(timed, conditions, unit="s for all requests", scale=1))
print(f"TTFT gain (p50, best repeats): {min(ttft['no prefix cache']) / min(ttft['prefix cache']):.2f}x")
""")
nb.md("""
The first batch of requests is admitted together, before anything is cached, so they all compute the
system prompt; every later request computes only its own question. **Eviction under pressure:** with
a pool too small to keep the system prompt cached while unrelated requests run, its blocks are evicted
(oldest first) and the next round has to recompute it.
""")
nb.code("""
small = LLMEngine(model, num_blocks=16, block_size=16, max_num_seqs=2, enable_prefix_caching=True,
                  block_pool=PrefixCache)
small.generate(chat[:2], 1)
hits_before = small.prefix_hit_tokens
unrelated = [tok(" ".join(lines[600 + 10 * i:610 + 10 * i])).input_ids[:120] for i in range(2)]
small.generate(unrelated, 1)  # needs more blocks than are free: evicts cached blocks, LRU first
small.generate(chat[2:4], 1)
print(f"evictions: {small.blocks.num_evictions}; system-prompt tokens reused: round 1 {hits_before}, "
      f"round 2 {small.prefix_hit_tokens - hits_before} (of {2 * len(SYSTEM) // 16 * 16} possible)")
""")
nb.md("Check: `pytest weeks/19 -k \"ex07 or ex08\"`")

# --- 8 -----------------------------------------------------------------------------------------------
nb.md("""
## 8. The scheduler: preemption and chunked prefill

Everything so far is memory. What makes the batching *continuous* is the decision the engine takes
before every forward: who runs this step, with how many tokens. `LLMEngine` asks a function for it,
`scheduler(running, waiting, free_blocks, block_size, token_budget, max_num_seqs, chunked_prefill)`, and
carries out the plan it returns. The function sees only plain data: each request is a dict of ints,

| key | meaning |
|---|---|
| `id` | the request |
| `computed` | tokens whose K and V are already in the cache (for a waiting request: found in the prefix cache) |
| `tokens` | prompt + output so far; it needs `tokens - computed` more before it can sample its next token |
| `blocks` | blocks it holds and can write into |
| `freeable` | blocks that come free if it is preempted (shared ones do not) |
| `seqs` | slots it takes (1; `n` for a request whose `n` parallel samples are not forked yet) |

`running` is in admission order, oldest first; `waiting` in queue order. The plan is
`{"preempt": [id, ...], "run": [[id, n], ...]}`: the requests sent back to the queue, and how many tokens each
request runs this step. (How many more blocks does a request need to run `n` more tokens? Work it out from
`computed`, `blocks` and your `blocks_needed`.) The policy is yours to design; every plan must keep these
properties:

* **The budget.** The plan's tokens add up to at most `token_budget`; each request runs at least one token and at
  most what it has left.
* **The blocks.** The new blocks the plan's requests need add up to at most `free_blocks` plus the `freeable`
  blocks of the requests it preempts (blocks a preempted request shares stay taken).
* **Work in progress first.** Running requests are served before any waiting one is admitted, oldest first, none
  skipped while budget is left; a request still prefilling takes as much of the budget left as it can use
  (**chunked prefill**, Sarathi-Serve, Agrawal et al., 2024: a long prompt rides along with the decodes instead of
  stalling them). With `chunked_prefill` off, a prompt is admitted only whole.
* **Preemption: newest first, and no more than needed.** When a running request's new blocks do not fit, the
  requests preempted to make room are the most recently admitted ones — so that the oldest, which hold the most
  work, finish — and only as many as it takes; if the newer ones cannot free enough, the request itself is
  preempted. A step that preempts admits nobody.
* **First come, first served.** Waiting requests are admitted in queue order, never one ahead of an earlier one
  that does not fit. The engine puts a preempted request back at the **front** of the queue and later recomputes
  its prompt *and* the tokens it had generated in one prefill (vLLM's "recompute"; the alternative is swapping
  its blocks to CPU memory; greedy decoding depends only on the tokens, so its output is unchanged): first come,
  first served then means a preempted request resumes before later arrivals.
* **Slots per sequence.** Running and admitted requests take at most `max_num_seqs` slots, a request `seqs` of
  them.
* **Nothing that fits waits.** In a step that preempts nobody, a waiting request whose turn it is and that fits
  (slots, budget, blocks) is admitted; every step runs something.

**Exercise 9 (design).** Write `schedule`. The check runs random workloads — arrivals, lengths, pools tight
enough to preempt, budgets small enough to chunk, requests with `seqs` 2 or 3 — through your function step by
step and judges every plan by these properties, and that every request finishes. Then `LLMEngine(...,
scheduler=schedule)` must return exactly what `generate` returns on each request alone.
""")
nb.exercise("schedule", """
def schedule(running: list[dict], waiting: list[dict], free_blocks: int, block_size: int, token_budget: int,
             max_num_seqs: int, chunked_prefill: bool = True) -> dict:
    \"\"\"This step's plan: {"preempt": [id, ...], "run": [[id, num_tokens], ...]}.\"\"\"
    ### BEGIN SOLUTION
    def more_blocks(req, n):  # blocks req needs to hold computed + n tokens, beyond those it has
        return max(0, blocks_needed(req["computed"] + n, block_size) - req["blocks"])

    plan = {"preempt": [], "run": []}
    budget, free = token_budget, free_blocks
    queue = list(running)  # oldest first; preemption takes from the end
    k = 0
    while k < len(queue) and budget > 0:
        req = queue[k]
        n = min(req["tokens"] - req["computed"], budget)
        while more_blocks(req, n) > free and queue[-1] is not req:
            victim = queue.pop()
            plan["preempt"].append(victim["id"])
            free += victim["freeable"]
        if more_blocks(req, n) > free:  # it is the newest itself: it goes back to the queue too
            queue.pop()
            plan["preempt"].append(req["id"])
            break
        plan["run"].append([req["id"], n])
        free -= more_blocks(req, n)
        budget -= n
        k += 1
    if plan["preempt"]:
        return plan  # short of blocks: admit nobody this step
    slots = max_num_seqs - sum(r["seqs"] for r in queue)
    for req in waiting:
        left = req["tokens"] - req["computed"]
        n = min(left, budget)
        if budget == 0 or req["seqs"] > slots or (n < left and not chunked_prefill) or more_blocks(req, n) > free:
            break
        plan["run"].append([req["id"], n])
        free -= more_blocks(req, n)
        budget -= n
        slots -= req["seqs"]
    return plan
    ### END SOLUTION
""")
nb.test("test_schedule", "check_schedule(schedule)", points=3)
nb.md("""
*One policy that keeps them, now that your check passes* (vLLM's, in the shape of nano-vllm's). A request
needs `max(0, blocks_needed(computed + n, block_size) - blocks)` more blocks to run `n` more tokens.

1. **Running requests first, oldest first.** A decode runs 1 token; a request still prefilling runs the rest
   of its prompt, cut to what is left of the budget.
2. **Preemption.** If the request being served needs more blocks than are free, preempt the most recently
   admitted running request (its freeable blocks come free), and again, until it fits — or until it is the
   one preempted.
3. **Admission**, only in a step that preempted nobody: waiting requests in queue order, while there are slots,
   budget and blocks; stop at the first that does not fit.
""")
nb.md("""
Your scheduler in the engine, on section 5's prompts through a pool far too small for them: it must
preempt, and the output must not change.
""")
nb.code("""
tight = LLMEngine(model, num_blocks=4, block_size=8, max_num_seqs=8, max_num_batched_tokens=32, scheduler=schedule)
out_tight = tight.generate(prompts, NEW)
print(f"pool of {tight.num_blocks} blocks of 8: {tight.num_preemptions} preemptions, {len(tight.trace)} steps "
      f"(against {len(engine.trace)} with room); identical to generate alone: {out_tight == alone}")
assert out_tight == alone
""")
nb.md("""
**Recompute or swap?** The engine above recomputes a preempted request. The alternative (vLLM's "swap")
copies its blocks to host memory and back when it resumes: no tokens computed twice, but every one of
its tokens' K and V crosses the memory bus twice. Both, on the same workload, with your scheduler:
""")
nb.code("""
kv_per_token = kv_cache_bytes(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, 1, bytes_per_element=4)
n_params = sum(p.numel() for p in model.parameters())
ran = {}


def preempting(mode):
    def run():
        eng = LLMEngine(model, num_blocks=4, block_size=8, max_num_seqs=8, max_num_batched_tokens=32,
                        scheduler=schedule, preemption_mode=mode)
        assert eng.generate(prompts, NEW) == alone
        ran[mode] = eng
    return run


conditions = Conditions.now()
timed = interleaved({mode: preempting(mode) for mode in ("recompute", "swap")}, repeats=3 if FULL else 2, warmup=0,
                    device=dev)
flops = rl.measure_flops_per_s(repeats=3, device=dev)  # the best fp32 matmul rate, measured now
conditions.done()
for mode, eng in ran.items():
    prefill = sum(s["num_prefill_tokens"] for s in eng.step_stats)
    print(f"{mode:>9}: {eng.num_preemptions} preemptions, {len(eng.trace)} steps, {prefill} prefill tokens "
          f"({eng.recomputed_tokens} of them recomputed), {eng.swap_bytes / 1e6:.2f} MB swapped in "
          f"{eng.swap_seconds * 1e3:.1f} ms")
print(report(timed, conditions, unit="s", scale=1))
swapped_tokens = ran["swap"].swap_bytes / (2 * kv_per_token)  # each token's K and V: out once, in once
print(f"per token, derived: swap 4 x {kv_per_token / 1e3:.0f} KB (out and back in, each copy reads and writes them) "
      f"at {roof_bandwidth / 1e9:.1f} GB/s (section 5) = {4 * kv_per_token / roof_bandwidth * 1e6:.1f} us; "
      f"recompute 2 x {n_params / 1e6:.0f}M FLOP at {flops / 1e9:.0f} GFLOP/s (measured now) = "
      f"{2 * n_params / flops * 1e3:.2f} ms")
print(f"per token, measured: swap {ran['swap'].swap_seconds / swapped_tokens * 1e3:.2f} ms "
      f"({swapped_tokens:.0f} tokens' K and V moved out and in)")
""")
nb.md("""
By the arithmetic (the `derived` line: bytes over the memory bandwidth of section 5, FLOPs over the matmul rate
measured just now) swapping a token costs microseconds and recomputing it far more (compare the two): on a CPU,
where "host memory" is the memory the cache already lives in, swap should win by orders of magnitude. The
`measured` line shows what the copies actually cost in this run: each swap is 2 × 30 separate copies
(K and V of every layer), and on a shared, loaded CPU the per-operation overhead, not the bandwidth, sets
their time — compare the two totals in the table. On a GPU the copy crosses PCIe (32 GB/s theoretical
for PCIe 4.0 x16, far below the GPU's own memory) while a prefill runs at hundreds of TFLOP/s, and
swapped-out blocks take pinned host memory: the two come much closer, and recompute needs no host memory
and no bookkeeping of the copies — vLLM's v1 engine preempts by recompute only.
""")
nb.md("""
**Chunked prefill.** A long prompt's prefill is one big forward. If it runs in one step, every request
that is decoding waits for it: a spike in their time between tokens (TBT). With a token budget per step
(`max_num_batched_tokens`) and chunked prefill (Sarathi-Serve, Agrawal et al., 2024), the prompt is cut
into chunks that ride along with the decodes, step by step. Three short requests are decoding when a
long prompt arrives:
""")
nb.code("""
LONG_PROMPT = tok(" ".join(lines[700:900])).input_ids[:1024 if FULL else 256]


def decode_with_long_arrival(**kwargs):
    eng = LLMEngine(model, num_blocks=256, block_size=16, max_num_seqs=8, scheduler=schedule, **kwargs)
    short = [eng.add_request(p, 12) for p in PROMPTS[20:23]]
    for _ in range(3):
        eng.step()
    eng.add_request(LONG_PROMPT, 2, request_id="long")
    while eng.has_unfinished():
        eng.step()
    gaps = [b - a for r in short for a, b in zip(eng.request(r).token_times, eng.request(r).token_times[1:])]
    long = eng.request("long")
    return gaps, long.first_token_time - long.arrival, len(eng.trace)


settings = {"one-step prefill": dict(enable_chunked_prefill=False, max_num_batched_tokens=2048),
            "chunked, 64/step": dict(enable_chunked_prefill=True, max_num_batched_tokens=64)}
runs = {name: [] for name in settings}  # the two take turns; each figure below is its best repeat
conditions = Conditions.now()
timed = interleaved({name: lambda name=name: runs[name].append(decode_with_long_arrival(**settings[name]))
                     for name in settings}, repeats=3 if FULL else 2, warmup=0, device=dev)
conditions.done()
for name, done in runs.items():
    p50 = min(percentile(gaps, 50) for gaps, _, _ in done)
    worst_gap = min(max(gaps) for gaps, _, _ in done)
    print(f"{name:>17}: decoders' TBT p50 {p50 * 1e3:6.0f} ms, max {worst_gap * 1e3:6.0f} ms; "
          f"long prompt's TTFT {min(t for _, t, _ in done):5.2f} s; {done[0][2]} steps")
print(conditions.line())
print(warning(timed, conditions) or "")
""")
nb.md("""
Chunking caps the stall a long prompt causes: the decoders' worst gap drops to about one chunk's
compute, and the long prompt's own first token comes a little later (its prefill is spread over several
steps, each also carrying the decodes). That is the trade a serving system tunes with the token budget.

Check: `pytest weeks/19 -k ex09`

**Your engine.** So far only the scheduler (and, in section 7, the pool) was yours; the engine took the rest
from `lib`. `LLMEngine` takes every part you wrote: `block_pool=` (your `BlockAllocator`, or your
`PrefixCache` when prefix caching is on), `slot_mapping=`, `paged_attention=` (the decodes' attention in
every layer), `block_hashes=` (the prefix cache's keys) and `scheduler=`. `lib` then only runs the model,
the prefills' attention and the bookkeeping between your parts.

**Exercise 10** (a milestone: nothing new to write). The check builds an engine from your parts alone and
compares it with `generate` on each request alone, on random workloads (a tiny model) that preempt, cut
prompts into chunks and, the second, hit the prefix cache.
""")
nb.test("test_engine", "check_engine(BlockAllocator, slot_mapping, paged_attention, block_hashes, PrefixCache, schedule)",
        points=2)
nb.md("""
The same on SmolLM2: section 5's prompts through a pool too small for them, then with prefix caching on
(the first prompt asked twice), every part yours:
""")
nb.code("""
mine = dict(scheduler=schedule, slot_mapping=slot_mapping, paged_attention=paged_attention, block_hashes=block_hashes)
yours = LLMEngine(model, num_blocks=5, block_size=8, max_num_seqs=8, max_num_batched_tokens=16,
                  block_pool=BlockAllocator, **mine)
out_yours = yours.generate(prompts, NEW)
print(f"your parts, {yours.num_blocks} blocks of 8: {yours.num_preemptions} preemptions, {len(yours.trace)} steps; "
      f"identical to generate alone: {out_yours == alone}")
cached_yours = LLMEngine(model, num_blocks=8, block_size=8, max_num_seqs=8, max_num_batched_tokens=16,
                         block_pool=PrefixCache, enable_prefix_caching=True, **mine)
out_cached = cached_yours.generate(prompts + prompts[:1], NEW)
print(f"with your prefix cache: {cached_yours.prefix_hit_tokens} prompt tokens found cached, "
      f"{cached_yours.num_preemptions} preemptions; identical: {out_cached == alone + alone[:1]}")
assert out_yours == alone and out_cached == alone + alone[:1]
""")
nb.md("""
**Exercise 1, measured on your engine.** Section 1's queue once more, static against continuous, on an engine
built from your parts, timed: the two take turns, round by round, and the best round counts (`lib.timing`:
the spread and the load are printed). Beside them, your prediction for a deep queue and the step-count model of
this very queue.
""")
nb.code("""
def serving(policy):
    return lambda: run_workload(policy, lengths, SLOTS, progress=False, block_pool=BlockAllocator, **mine)


conditions = Conditions.now()
timed = interleaved({policy: serving(policy) for policy in ("static", "continuous")}, repeats=3 if FULL else 2,
                    warmup=0, device=dev)
conditions.done()
print(report(timed, conditions, unit="s for the whole queue", scale=1))
best = {policy: t.best for policy, t in timed.items()}
print(f"your model (a deep queue): {continuous_gain(MIX, SLOTS):.3f}x; the step-count model of this queue: "
      f"{simulate_steps(lengths, SLOTS, 'static') / simulate_steps(lengths, SLOTS):.3f}x")
print(f"measured on your engine: {sum(lengths) / best['static']:.1f} tok/s static, "
      f"{sum(lengths) / best['continuous']:.1f} tok/s continuous: {best['static'] / best['continuous']:.3f}x")
""")
nb.md("""
Wall time follows the step count only as far as a step costs the same whatever it carries: a static batch keeps
computing its finished rows (padding), while continuous batching's steps also carry the prefills of requests
admitted mid-run, which cost more than a decode. Read the measured gain against the step count of this queue,
and your model against section 1's deeper queues.
""")
nb.md("Check: `pytest weeks/19 -k ex10`")
nb.md("""
**Predicting the step count.** Section 1's step-count model counted decode steps only. With the scheduler
you wrote, the steps of a whole workload follow from the same rules, token by token: in each step the
running requests take their tokens first, oldest first (1 for a decode; the rest of its prompt, cut to
the budget left, for one still prefilling), then waiting requests are admitted first come first served
while slots (`max_num_seqs`) and budget last (a prompt only whole, with chunked prefill off). A request
whose tokens are all computed samples one token in that step, and leaves once it has its
`max_new_tokens`. With a pool large enough that nobody is preempted nothing else matters: not the model,
not the tokens, not the block size. One request alone, a 20-token prompt and 4 new tokens with a budget of
8: ⌈20 / 8⌉ = 3 steps of prefill (the third samples the first token), then 3 decodes — 6 steps.

**Exercise 11.** `predict_steps(prompt_lens, new_tokens, max_num_seqs, token_budget, chunked_prefill)`: the
number of engine steps for requests queued at once, in this order, with blocks to spare — predicted from the
rules, without running the engine or a model. The check compares it with the steps `LLMEngine` takes on
random workloads.
""")
nb.exercise("predict_steps", """
def predict_steps(prompt_lens: list[int], new_tokens: list[int], max_num_seqs: int, token_budget: int,
                  chunked_prefill: bool = True) -> int:
    \"\"\"Engine steps to serve requests queued at once (prompt_lens[i] tokens, new_tokens[i] to generate), no preemption.\"\"\"
    ### BEGIN SOLUTION
    waiting = [dict(tokens=p, computed=0, out=0, new=n) for p, n in zip(prompt_lens, new_tokens)]
    running, steps = [], 0
    while waiting or running:
        budget, ran = token_budget, []
        for r in running:  # oldest first: a decode takes 1 token, a prefill the rest of its prompt (cut)
            if budget == 0:
                break
            n = min(r["tokens"] - r["computed"], budget)
            ran.append((r, n))
            budget -= n
        while waiting and budget > 0 and len(running) < max_num_seqs:  # first come first served
            r = waiting[0]
            n = min(r["tokens"] - r["computed"], budget)
            if n < r["tokens"] - r["computed"] and not chunked_prefill:
                break
            running.append(waiting.pop(0))
            ran.append((r, n))
            budget -= n
        for r, n in ran:
            r["computed"] += n
            if r["computed"] == r["tokens"]:  # all its tokens computed: it samples one more
                r["out"] += 1
                if r["out"] == r["new"]:
                    running.remove(r)
                else:
                    r["tokens"] += 1
        steps += 1
    return steps
    ### END SOLUTION
""")
nb.test("test_predict_steps", "check_predict_steps(predict_steps)", points=2)
nb.md("""
Predict first, then run: six of the prompts, a budget of 16 tokens per step, 3 slots.
""")
nb.code("""
demo_prompts, demo_new = PROMPTS[30:36], [2, 6, 3, 5, 2, 4]
predicted = predict_steps([len(p) for p in demo_prompts], demo_new, max_num_seqs=3, token_budget=16)
print(f"prompts of {[len(p) for p in demo_prompts]} tokens, {demo_new} new tokens: predicted {predicted} steps")
eng = LLMEngine(model, num_blocks=64, block_size=16, max_num_seqs=3, max_num_batched_tokens=16, scheduler=schedule)
for p, n in zip(demo_prompts, demo_new):
    eng.add_request(p, n)
while eng.has_unfinished():
    eng.step()
print(f"measured: {len(eng.trace)} steps, tokens per step {[sum(n for _, n in s) for s in eng.trace]}")
assert len(eng.trace) == predicted
""")
nb.md("Check: `pytest weeks/19 -k ex11`")

# --- 9 -----------------------------------------------------------------------------------------------
nb.md("""
## 9. Load test

Requests arrive at random (a Poisson process: exponential gaps at a rate of λ per second), with a
mix of prompt and answer lengths. For several rates we measure what users feel — **TTFT** (time to
first token: queueing + prefill) and **TBT** (time between tokens: the step time of the batch the
request is in), at the median and the 95th percentile — and what the operator sees: throughput and KV
utilization (slots holding a token / slots in the running requests' blocks; against a contiguous cache
that reserves exactly `prompt + max_new_tokens` per request ("exact": the lengths known in advance) and
one that reserves 2048 slots ("2048": the usual case, since an answer's length is not known). Time between arrivals with nothing to do is
skipped; every step is measured for real. The rates are set from the batch-8 decode rate of section 5,
so the test loads this machine at about the same fractions of its capacity, whatever its speed.
""")
nb.code("""
N_LOAD = 64 if FULL else 12
g = torch.Generator().manual_seed(9)
load_prompts = [PROMPTS[i % len(PROMPTS)] for i in range(N_LOAD)]
load_new = torch.randint(4, 33 if FULL else 13, (N_LOAD,), generator=g).tolist()
capacity = rates[8][0] / (sum(load_new) / N_LOAD)  # requests/s that batch-8 decoding could sustain
FRACTIONS = [0.25, 0.5, 1.0, 2.0] if FULL else [0.3, 1.5]
results = {}
conditions = Conditions.now()  # one run per rate: the load says how far to trust it
for frac in tqdm(FRACTIONS, desc="arrival rates"):
    lam = frac * capacity
    arrivals = torch.cumsum(torch.empty(N_LOAD).exponential_(lam, generator=g), 0).tolist()
    eng = LLMEngine(model, num_blocks=128, block_size=16, max_num_seqs=8)
    results[frac] = run_load(eng, load_prompts, load_new, arrivals)
print(f"capacity estimate {capacity:.2f} req/s; {N_LOAD} requests of {min(load_new)}-{max(load_new)} new tokens")
print(f"{'λ req/s':>8} {'req/s':>6} {'tok/s':>6} {'TTFT p50':>9} {'p95':>6} {'TBT p50':>8} {'p95':>6} "
      f"{'batch':>6} {'KV paged':>9} {'exact':>6} {'2048':>6}")
for frac, r in results.items():
    print(f"{frac * capacity:8.2f} {r['requests_per_s']:6.2f} {r['tokens_per_s']:6.1f} "
          f"{percentile(r['ttft'], 50):8.2f}s {percentile(r['ttft'], 95):5.2f}s "
          f"{percentile(r['tbt'], 50) * 1e3:6.0f}ms {percentile(r['tbt'], 95) * 1e3:4.0f}ms "
          f"{r['mean_batch']:6.1f} {r['kv_utilization']:9.1%} {r['kv_utilization_preallocated']:6.1%} "
          f"{r['kv_utilization_max_len']:6.1%}")
print(conditions.done().line())
print(warning([], conditions) or "")
fig, ax = plt.subplots(1, 2, figsize=(10, 3.5))
lams = [f * capacity for f in FRACTIONS]
for q, style in [(50, "o-"), (95, "s--")]:
    ax[0].plot(lams, [percentile(results[f]["ttft"], q) for f in FRACTIONS], style, label=f"TTFT p{q}")
    ax[1].plot(lams, [percentile(results[f]["tbt"], q) * 1e3 for f in FRACTIONS], style, label=f"TBT p{q}")
ax[0].set_xlabel("arrival rate λ (requests/s)"); ax[0].set_ylabel("seconds"); ax[0].legend()
ax[1].set_xlabel("arrival rate λ (requests/s)"); ax[1].set_ylabel("ms"); ax[1].legend()
plt.tight_layout(); plt.show()
""")
nb.md("""
Below capacity, requests rarely wait: TTFT is about one prefill and TBT one small batch's step. Past
capacity the queue grows, TTFT climbs (the p95 first), and the batch fills up — so throughput *rises*
with load while each request's TBT gets a little worse: the latency–throughput trade of every server.

**KV utilization.** With blocks of 16, a request wastes on average half a block; these requests are
short (tens of tokens), so that half block is a visible fraction, and a preallocation that knew every
length exactly would do about as well. For the long requests of section 2 the same rule uses nearly all it
reserves (section 2's table), as the vLLM paper reports; a preallocation that must reserve the maximum length
(the "2048" column) falls far below either, and that is the case paging was built for.

**The seed's thresholds** ("TTFT good < 200 ms, TBT good < 30 ms") are for GPU chat serving. This machine's
figures beside them, from section 5: the roofline step (every weight read once at the class's best bandwidth)
and the steps the engine measured.
""")
nb.code("""
print(f"TBT 'good' below 30 ms; on this machine a decode step takes at least {roofline * 1e3:.1f} ms (the roofline: "
      f"{weight_bytes / 1e6:.0f} MB at {roof_bandwidth / 1e9:.1f} GB/s); the engine's batch-1 step took "
      f"{rates[1][1] * 1e3:.0f} ms ({rates[1][1] / roofline:.1f}x the roofline)")
b = max(BATCHES)
print(f"batch {b}: a step took {rates[b][1] * 1e3:.0f} ms, for {rates[b][0] / rates[1][0]:.1f}x the tokens per second "
      f"of batch 1")
""")
nb.md("""
Where the batch-1 step is above the threshold, TBT here is "poor" by that table at any load — while the
*throughput* of a large batch is several times that of one request. Which of the two a deployment must meet
decides its batch size. The streaming bandwidth recorded on the lab's machines, for comparison with this
machine's (section 5): {RECORDED_BANDWIDTH}
""".replace("{RECORDED_BANDWIDTH}", "; ".join(recorded_md("decode", "streaming bandwidth", cls)
                                             for cls in recorded_classes("decode", "streaming bandwidth")) + "."))

# --- 10 ----------------------------------------------------------------------------------------------
nb.md("""
## 10. Check your understanding

Questions from the course's Phase IV material (seed 001's PagedAttention example, seed 000's batching
claim, seed 002's quiz Q4 and Q10). Numeric answers are functions returning a number.

**Q1** (seed 001's PagedAttention example). Four requests of 2000, 100, 500 and 1500 tokens are paged in
blocks of 16. What fraction of the allocated slots hold a token? (Your exercises 2 and 3 compute it.)
""")
nb.exercise("answer_q1", """
def answer_q1() -> float:
    \"\"\"Fraction (0..1) of allocated slots in use, 4 requests of 2000/100/500/1500 tokens, block size 16.\"\"\"
    ### BEGIN SOLUTION
    lengths = [2000, 100, 500, 1500]
    allocated = sum(blocks_needed(n, 16) for n in lengths) * 16
    return sum(lengths) / allocated
    ### END SOLUTION
""")
nb.test("test_answer_q1", "check_answer_q1(answer_q1)", points=1)
nb.code("""
lengths4 = [2000, 100, 500, 1500]
blocks4 = sum(blocks_needed(n, 16) for n in lengths4)
print(f"paged (16): {blocks4} blocks = {blocks4 * 16} slots for {sum(lengths4)} tokens, {slots_wasted(lengths4, 16)} "
      f"empty ({slots_wasted(lengths4, 16) / (blocks4 * 16):.2%}); at most {15 * len(lengths4)} (15 per request)")
pre_waste = sum(2048 - n for n in lengths4)
print(f"preallocated 2048 each: {4 * 2048} slots, {pre_waste} empty ({pre_waste / (4 * 2048):.1%})")
""")
nb.md("""
Both of the seed's counts (258 blocks, 28 slots) are right (printed above). Its "at most 15 tokens × 4 = 60
slots" is the bound; 28 is what these lengths give, and their share of the allocated slots is the one printed
above, not the seed's "0.3%". Its "50% waste!" for preallocating 2048 slots each is right too (printed).
""")
nb.md("""
**Q2** (seed 002, Q4). In PagedAttention, what is a "block", and why does it eliminate memory
fragmentation? (Graded by hand.)
""")
nb.answer("answer_q2", """
**Model answer.** A block is a fixed-size chunk of the KV cache holding the keys and values of
`block_size` consecutive tokens (16 in vLLM) of one sequence, for every layer and KV head. Blocks live
in one preallocated pool; each sequence has a block table mapping its logical blocks to physical ones,
which need not be contiguous. Because every allocation is one block of the same size, any free block
fits any request: there is no **external** fragmentation (no free gaps too small to use), and no
reservation for tokens that may never come — blocks are allocated as the sequence grows. The only
waste is **internal**: the unfilled slots of each sequence's last block, fewer than `block_size` per
sequence (28 slots for the four requests of Q1, against 4092 with 2048-slot preallocation).
Blocks can also be shared by reference count (parallel sampling, prefix caching).

**Mark scheme (2 points).** 1 point: a fixed-size chunk of K/V for a fixed number of tokens, mapped
through a per-sequence block table to non-contiguous physical memory, allocated on demand. 1 point: no
external fragmentation because all allocations are the same size and any free block serves any
sequence; waste bounded by one partial block per sequence (internal fragmentation).
""", points=2)
nb.md("""
**Q3** (seed 000's batching claim). 64 requests are queued for 8 slots, alternating 50 and 200 new
tokens. Using the step-count model (one token per running request per step, prefill ignored), what is the
ratio of static-batching steps to continuous-batching steps?
""")
nb.exercise("answer_q3", """
def answer_q3() -> float:
    \"\"\"Static / continuous decode steps, 64 queued requests of 50/200 new tokens on 8 slots.\"\"\"
    ### BEGIN SOLUTION
    lengths = [50, 200] * 32
    static = sum(max(lengths[i:i + 8]) for i in range(0, 64, 8))  # every batch takes its longest request
    queue, running, continuous = list(lengths), [], 0
    while queue or running:
        while queue and len(running) < 8:
            running.append(queue.pop(0))
        running = [n - 1 for n in running if n > 1]
        continuous += 1
    return static / continuous
    ### END SOLUTION
""")
nb.test("test_answer_q3", "check_answer_q3(answer_q3)", points=1)
nb.code("""
queue = [50, 200] * 32
static, continuous = simulate_steps(queue, 8, "static"), simulate_steps(queue, 8)
print(f"64 queued requests of 50/200 on 8 slots: static {static} steps, continuous {continuous}: "
      f"{static / continuous:.3f}x (your answer_q3: {answer_q3():.3f}x)")
print(f"full slots to the end would take {sum(queue) // 8} steps; your model for a deep queue of this mix: "
      f"{continuous_gain({50: 0.5, 200: 0.5}, 8):.3f}x")
""")
nb.md("""
The seed's "2–3×" is overstated: 64 queued requests gain less than your deep-queue model predicts for this mix,
because at the end the last long requests run with empty slots beside them (continuous takes more steps than
full slots would, printed above); with a deeper queue the gain approaches the model, which no scheduler can
beat on this mix.
""")
nb.md("""
**Q4** (seed 002, Q10). A chatbot has a 2000-token system prompt shared by all users and runs on
4×A100. Which serving framework would maximize throughput, and which specific feature makes it best?
Use your measurements of section 7. (Graded by hand.)
""")
nb.answer("answer_q4", """
**Model answer.** A paged-KV server with **automatic prefix caching**: vLLM (with prefix caching on,
tensor-parallel over the 4 GPUs) or SGLang, whose RadixAttention keeps a radix tree of cached prefixes.
The feature is the prefix cache: the 2000-token system prompt's KV blocks are computed once and shared by
every request (reference-counted blocks), so each request prefills only its own message. That removes
most of the prefill FLOPs (here the prefill tokens computed fell by the hit rate measured in section 7),
cuts TTFT, and frees KV memory (one copy of the prompt's blocks instead of one per request), which
allows a larger batch — hence higher throughput. Continuous batching and PagedAttention come with it.

**Mark scheme (2 points).** 1 point: names vLLM or SGLang (or TensorRT-LLM with KV reuse) *with prefix
caching* as the reason. 1 point: explains the mechanism — shared system-prompt KV computed once and reused
across requests, saving prefill compute and memory — citing a measured effect (hit rate, fewer prefill
tokens or lower TTFT).
""", points=2)
nb.md("Check: `pytest weeks/19 -k \"ex12 or ex13\"`")

nb.md("""
## What you built

A model of what continuous batching gains over static batching, checked against a real queue; block arithmetic that shows where preallocation wastes memory; a reference-counted block allocator;
block tables, slot mapping, and attention that reads keys and values in place from a block pool; and,
running on them, an engine that batches requests at every step and returns exactly what `generate`
returns — sharing blocks between samples (copy-on-write) and between requests with a common prefix
(chained block hashes), surviving a pool that is too small (preemption by recompute), keeping decodes
flowing past long prompts (chunked prefill), measured under a Poisson load. Next week (20) shrinks the
weights themselves: quantized inference with GGUF.

Check: `pytest weeks/19` for everything at once.
""")

if __name__ == "__main__":
    out = ROOT / "solutions" / "19" / "week19_paged_batching.ipynb"
    out.parent.mkdir(parents=True, exist_ok=True)
    nb.write(str(out))
    print(f"wrote {out.relative_to(ROOT)} ({len(nb.cells)} cells)")
