"""Week 19 — continuous batching and PagedAttention: the checks that solutions/19/test_week19.py and the notebook use.

One `check_<name>` per exercise; each raises AssertionError saying what is wrong. References: lib/batching/paged.py,
lib/batching/blocks.py, lib/batching/engine.py; what the checks run the student's code through (the scheduler's invariants, a serving
simulation, a prefix cache model, the workloads, paged attention's cases, the context model): week19_sim.py; the
model of continuous batching's gain (exercise 1): week19_gain.py.

Every check judges what it observes: paged attention's calls are all observed; the scheduler's, the prefix cache's
and the engine's parts' are observed at random (in the proportions each check's docstring gives), and an observed
call's result is used and judged like any other.
"""
from __future__ import annotations

import math
import random
from collections import Counter

import torch

from grader.checks import (assert_classified, assert_close, check_on_meta, generator, observe, run_seed, seed_note,
                           week19_gain)
from grader.checks.week19_sim import (LONG_CASE, cache_trial, context_model, contiguous_reference, paged_one_score,
                                      engine_workload, expect_error, exponentials, judge_plan, lib_parts, lru_order,
                                      paged_case, sdpa_ops, shared_step, simulate, step_workload, workload)
from grader.checks.week19_dtype import assert_low_precision
from grader.checks.week19_steps import amount_step, long_step, unchunked_step
from grader.checks.week19_hashes import assert_hash_entropy, assert_long_chain
from grader.harness import Week
from lib.batching import paged as ref

WEEK = Week(19, "week19_paged_batching.ipynb")
# lib's engine as the fingerprints name it: lib.batching.engine (which also prefixes lib.batching.engine_load, its load test),
# lib.batching.model_runner (its forward), lib.batching.request (its Request) and lib.batching.blocks (block hashes, PrefixCache, BlockManager)
ENGINE_MODULES = ("lib.batching.engine", "lib.batching.model_runner", "lib.batching.request", "lib.batching.blocks")


# --- 1: the gain of continuous batching (predict) ----------------------------------------------------

@WEEK.exercise(1, "continuous_gain", section="1 (Static batching's waste)")
def check_continuous_gain(continuous_gain) -> None:
    """The student's model, on distributions and slot counts drawn per run (week19_gain: the cases, the hints)."""
    week19_gain.judge(continuous_gain)


# --- 2, 3: counting blocks ---------------------------------------------------------------------------

FLOATS = "; past 2**53 a float cannot hold every integer, so n / b (and math.ceil of it) is off: stay in integers"


@WEEK.exercise(2, "blocks_needed", section="2 (Preallocation's waste)")
def check_blocks_needed(blocks_needed) -> None:
    g = generator(1)
    cases = [(0, 16), (1, 16), (16, 16), (17, 16), (2000, 16), (100, 16), (7, 1), (31, 32)]
    cases += [(int(n), int(b)) for n, b in zip(torch.randint(0, 5000, (20,), generator=g),
                                              torch.randint(1, 64, (20,), generator=g))]
    # lengths past what a float holds exactly (the notebook names the edge): math.ceil(n / b) is off by one there
    cases += [(2**53 + 1, 2), (10**18 + 1, 16), (2**62 + 3 * int(torch.randint(1, 2**20, (), generator=g)), 4)]
    for n, b in cases:
        got = blocks_needed(n, b)
        want = ref.blocks_needed(n, b)
        assert got == want, (f"blocks_needed(num_tokens={n}, block_size={b}) = {got}; expected {want}: a block "
                              f"holds {b} slots and a partly filled last block still counts (round up){FLOATS if n > 2**53 else ''} "
                              f"{seed_note()}")


@WEEK.exercise(3, "slots_wasted", section="2 (Preallocation's waste)")
def check_slots_wasted(slots_wasted) -> None:
    got = slots_wasted([2000, 100, 500, 1500], 16)
    assert got == 28, (f"slots_wasted([2000, 100, 500, 1500], 16) = {got}; expected 28 (the seed's example: "
                       f"258 blocks = 4128 slots for 4100 tokens)")
    g = generator(2)
    for case in range(22):
        b = int(torch.randint(1, 33, (1,), generator=g))
        lengths = torch.randint(1, 3000, (int(torch.randint(1, 12, (1,), generator=g)),), generator=g).tolist()
        lengths[0] = b * int(torch.randint(1, 50, (1,), generator=g))  # one fills its last block exactly
        if case >= 20:  # and lengths past what a float holds exactly (2**53 + 1 in blocks of 2: one empty slot)
            b, lengths = (2, [2**53 + 1, 3]) if case == 20 else (16, [10**18 + 1, *lengths[1:]])
        want = ref.slots_wasted(lengths, b)  # before the call, which gets a copy (nothing it does moves it)
        got = slots_wasted(list(lengths), b)
        assert got == want, (f"slots_wasted({lengths}, block_size={b}) = {got}; expected {want}: only each sequence's "
                             f"last block has empty slots, and none if the length is a multiple of the block size"
                             f"{FLOATS if max(lengths) > 2**53 else ''} {seed_note()}")


# --- 4: the block allocator --------------------------------------------------------------------------

@WEEK.exercise(4, "BlockAllocator", section="3 (The block allocator)")
def check_BlockAllocator(BlockAllocator) -> None:
    """Random allocate / fork / free sequences against a model of the pool (a dict of owners per block)."""
    rng = random.Random(run_seed() + 3)
    for trial in range(6):
        n = rng.randint(1, 24) if trial < 5 else rng.randint(65, 5000)  # one pool wider than a 32- or 64-bit mask
        alloc = BlockAllocator(n)
        owners: dict[int, int] = {}
        log = []
        assert alloc.num_free == n, f"a new BlockAllocator({n}) has num_free = {alloc.num_free}; expected {n}"
        for _ in range(300):
            op = rng.choice(["allocate", "allocate", "fork", "free", "free"])
            touched = None  # the block this operation changed: its ref_count is checked
            if op == "allocate":
                if len(owners) == n:
                    log.append("allocate() on a full pool")
                    e = expect_error(alloc.allocate, Exception, f"after {log[-6:]}, allocate() with all {n} blocks in use")
                    assert type(e).__name__ == "OutOfBlocksError", (
                        f"allocate() on a full pool raised {type(e).__name__}; raise OutOfBlocksError")
                    assert str(n) in str(e), (f"the OutOfBlocksError message ({e!s}) should say how many blocks exist "
                                              f"({n}) and how many are in use")
                    continue
                block = alloc.allocate()
                log.append(f"allocate() -> {block}")
                assert isinstance(block, int) and 0 <= block < n, (
                    f"allocate() returned {block!r}; expected a block number in 0..{n - 1}")
                assert block not in owners, (f"after {log[-6:]}: allocate() returned block {block}, which is still "
                                             f"owned ({owners[block]} owner(s)) {seed_note()}")
                owners[block] = 1
                touched = block
            elif op == "fork" and owners:
                block = rng.choice(sorted(owners))
                alloc.fork(block)
                log.append(f"fork({block})")
                owners[block] += 1
                touched = block
            elif op == "free" and owners:
                block = rng.choice(sorted(owners))
                alloc.free(block)
                log.append(f"free({block})")
                owners[block] -= 1
                if owners[block] == 0:
                    del owners[block]
                touched = block
            if touched is not None:
                got = alloc.ref_count(touched)
                assert got == owners.get(touched, 0), (
                    f"after {log[-6:]} ref_count({touched}) = {got}; expected {owners.get(touched, 0)} (its owners: "
                    f"allocate gives one, fork adds one, free removes one) {seed_note()}")
            want = n - len(owners)
            assert alloc.num_free == want, (
                f"after {log[-6:]} num_free = {alloc.num_free}; expected {want}: a block returns to the pool only "
                f"when its last owner frees it (fork adds an owner) {seed_note()}")
        owners.update({} if owners or n < 2 else {alloc.allocate(): 1})  # refused while others are owned too (red
        unowned = [b for b in range(n) if b not in owners]  # team 11b: a double free handed a block out twice)
        for op, b in [(op, rng.choice(unowned)) for op in ("free", "fork")] if unowned else []:
            expect_error(lambda: getattr(alloc, op)(b), ValueError,
                         f"after {log[-4:]}, {op}({b}) of a free block (no one owns it; {sorted(owners)[:8]} are in use)")
            assert alloc.num_free == n - len(owners), f"a refused {op} must leave the pool as it was"
        for block, count in owners.items():  # every owner frees: the whole pool is free again
            for _ in range(count):
                alloc.free(block)
        assert alloc.num_free == n, (f"after every owner freed its blocks, num_free = {alloc.num_free}; expected "
                                     f"all {n} {seed_note()}")
        freed = rng.randrange(n)
        expect_error(lambda: alloc.free(freed), ValueError, f"free({freed}) of a block that is not allocated")
        assert alloc.num_free == n, "a refused free must leave the pool as it was"
        expect_error(lambda: alloc.fork(freed), ValueError, f"fork({freed}) of a free block (handed out again while owned)")
        assert alloc.num_free == n, "a refused fork must leave the pool as it was"
    # adversarial sequences: bad ids on a full pool, a block with hundreds of owners
    n = rng.randint(2, 9)
    alloc = BlockAllocator(n)
    blocks = [alloc.allocate() for _ in range(n)]
    assert sorted(blocks) == list(range(n)), f"{n} allocate() calls on a new pool of {n} returned {blocks}"
    for bad in (-1, -n, n, n + 3):
        for op in ("free", "fork"):
            expect_error(lambda: getattr(alloc, op)(bad), ValueError,
                          f"{op}({bad}) on a pool of {n} blocks (ids are 0..{n - 1}; -1 is not the last block)")
            assert alloc.num_free == 0, f"after a refused {op}({bad}) num_free = {alloc.num_free}; expected 0"
    block = blocks[rng.randrange(n)]
    owners = rng.randint(200, 300)
    for k in range(owners - 1):
        try:
            alloc.fork(block)
        except (ValueError, RuntimeError, OverflowError) as e:
            raise AssertionError(f"the {k + 2}th owner of block {block}: fork raised {type(e).__name__}: {e}; a block "
                                 f"can have hundreds of owners (do the reference counts overflow? a Python int does "
                                 f"not)") from None
    for k in range(owners - 1):
        alloc.free(block)
        assert alloc.num_free == 0, (f"block {block} forked to {owners} owners: after {k + 1} frees num_free = "
                                     f"{alloc.num_free}; it still has {owners - 1 - k} owners (do the reference "
                                     f"counts overflow? a Python int does not) {seed_note()}")
    alloc.free(block)
    assert alloc.num_free == 1, f"after its last owner freed block {block}, num_free = {alloc.num_free}; expected 1"


# --- 5: slot mapping ---------------------------------------------------------------------------------

@WEEK.exercise(5, "slot_mapping", section="4 (Block tables and paged attention)")
def check_slot_mapping(slot_mapping) -> None:
    got = slot_mapping([5, 2, 9], 0, 7, 3)
    want = torch.tensor([15, 16, 17, 6, 7, 8, 27])
    assert_close(got, want, "slot_mapping([5, 2, 9], start=0, num_tokens=7, block_size=3)", atol=0)
    g = generator(4)
    for case in range(12):
        bs = int(torch.randint(1, 20, (1,), generator=g))
        nb = int(torch.randint(1, 12, (1,), generator=g))
        table = torch.randperm(64, generator=g)[:nb].tolist()
        if case >= 9:  # a pool of 2^27 blocks or more: slots past what 16- or 32-bit integers hold
            table = torch.randint(1 << 27, 1 << 28, (nb,), generator=g).tolist()
        start = int(torch.randint(0, nb * bs, (1,), generator=g))
        count = int(torch.randint(0, nb * bs - start + 1, (1,), generator=g))
        want = ref.slot_mapping(table, start, count, bs)  # before the call, which gets a copy (nothing it does moves it)
        got = slot_mapping(list(table), start, count, bs)
        assert_close(got, want,
                     f"slot_mapping({table}, start={start}, num_tokens={count}, block_size={bs}) (position p lives "
                     f"in slot table[p // block_size] * block_size + p % block_size; blocks are not contiguous)",
                     atol=0)


# --- 6: paged attention ------------------------------------------------------------------------------

@WEEK.exercise(6, "paged_attention", section="4 (Block tables and paged attention)")
def check_paged_attention(paged_attention) -> None:
    """Ragged lengths, random block sizes, head_dim, batch and GQA/MHA/MQA (a GQA case and an MHA case every run),
    against contiguous attention (<= 1e-5, fp32); reads the pool in place: no lib, no SDPA, no copy of a sequence's
    whole K/V — in the case with one long sequence (`LONG_CASE`) not even one KV head's whole row of keys or of its
    group's scores —, no full-row softmax, all visible to the observer, each block of K read once per KV head (not per
    query head, no second pass), inputs unchanged, tensors on the inputs' device, large scores; bf16, fp16 (`week19_dtype`)."""
    g = generator(5)
    dims = [[16, 32, 64][i] for i in torch.randperm(3, generator=g)] + [int(16 * torch.randint(1, 5, (1,), generator=g)), 64]
    for case in range(5):
        d = dims[case]  # head_dim 16, 32 and 64 every run: a hard-coded 1/sqrt(16) fails
        c = paged_case(g, case, d)
        args, tables, lens, bs, h, hkv, b = (c[key] for key in ("args", "tables", "lens", "bs", "h", "hkv", "b"))
        before = [a.clone() for a in args]
        got, obs = observe(paged_attention, *args, _observe_reads=(1,))
        what = (f"paged_attention case {case}: block_size={bs}, n_heads={h}, n_kv_heads={hkv}, head_dim={d}, "
                f"context_lens={lens}")
        assert_close(got, contiguous_reference(*before[:3], tables, lens), what, atol=1e-5)
        changed = [name for name, a, a0 in zip(("q", "k_pool", "v_pool", "block_tables", "context_lens"), args, before)
                   if not torch.equal(a, a0)]
        assert not changed, (f"{what}: changed its arguments {changed} in place; the pool belongs to the cache (every "
                             f"later step reads it): scale the query or the scores, never the caller's tensors")
        lib_used = sorted(c for c in obs.lib_calls if c.startswith(("lib.batching.paged", "lib.attn.attention", *ENGINE_MODULES)))
        assert not lib_used, f"{what}: calls {lib_used}; write the attention yourself"
        sdpa = sdpa_ops(obs)
        assert not sdpa, f"{what}: calls {sdpa} (SDPA); compute the scores and the softmax yourself, block by block"
        assert_classified(obs, what)  # an op the observer cannot measure could hold the whole-row softmax
        assert exponentials(obs), (
            f"{what}: the observer saw no exponential: the softmax ran out of its sight (numpy, which breaks on "
            f"CUDA tensors, or a popped dispatch-mode stack). Compute with torch ops on the inputs' device.")
        longest = 2 * max(lens) * hkv * d * 4  # one sequence's K and V, contiguous, fp32
        made = obs.peak_bytes + obs.premade_bytes  # allocated during the call, or written into a buffer made before
        workspace = (f" and wrote {obs.premade_bytes} bytes into buffers made before the call (a workspace)"
                     if obs.premade_bytes else "")
        assert made < longest / 2, (
            f"{what}: allocated {obs.peak_bytes} bytes at peak{workspace}, as much as a contiguous copy of the longest "
            f"sequence's keys and values ({longest} bytes; or its scores, kept). Read the pool a few blocks (about 32 keys) "
            f"at a time for every sequence and fold each into a running max and sum (online softmax). {seed_note()}")
        if case == LONG_CASE:  # B = 2, groups of 64 query heads, one sequence of 4500-5000 keys; fp32:
            row = max(lens) * d * 4  # one KV head's keys of the longest sequence,
            scores = (h // hkv) * max(lens) * 4  # its group's scores over that sequence (red team 13's #6: kept)
            assert made < min(row, scores) / 2, (
                f"{what}: allocated {obs.peak_bytes} bytes at peak{workspace}, more than half of one KV head's keys of the "
                f"longest sequence ({row} bytes) or of its {h // hkv} query heads' scores over it ({scores} bytes): a whole row "
                f"of keys was gathered, or every chunk's scores kept for a second pass. Read a few blocks (about 32 keys) of "
                f"every sequence at a time, for all heads together, and fold each into running statistics (online softmax) "
                f"before the next. {seed_note()}")
        red = obs.max_reduction_extent()
        assert red <= 512, (f"{what}: one reduction (softmax, max, sum) combined {red} elements: a softmax over a "
                            f"sequence's whole row of scores. Reduce a chunk of blocks at a time and keep running "
                            f"statistics (online softmax). {seed_note()}")
        reads = obs.reads_of(1)  # per block of k_pool: how many ops read each of its elements, on average
        full = [blk for t, n in zip(tables, lens) for j, blk in enumerate(t) if (j + 1) * bs <= n]
        if reads and full:
            fewest = min(reads[blk] for blk in full)
            assert fewest >= 0.999, (
                f"{what}: a full block of K was read by torch ops {fewest:.2f} times on average per element; every key "
                f"of a sequence takes part in its attention, so each of its blocks is read at least once. The rest "
                f"was read out of the observer's sight (numpy, .tolist()): compute with torch ops on the inputs. "
                f"{seed_note()}")
            # Each element of K belongs to one KV head: read once, all the query heads of its group share it. Some
            # blocks may be read more often by honest code (the block it reads, masked, for positions past a
            # sequence's end; a block two chunks of positions share), never most of them: the median is judged.
            counts = sorted(reads[blk] for blk in full)
            median = counts[len(counts) // 2]
            assert median <= 1.25, (
                f"{what}: the median full block of K was read {median:.1f} times per element ({sum(c > 1.25 for c in counts)} "
                f"of the {len(full)} full blocks more than once). A one-pass online softmax reads each block once per "
                f"KV head{'' if h == hkv else f', shared by the {h // hkv} query heads of its group (read it once for all of them, not once per query head)'}"
                f". Scores computed twice — a first pass for the max, a second for the exponentials — read K twice from memory, "
                f"which is the traffic paged attention exists to save: keep a running max and rescale (and read whole blocks, "
                f"a few at a time: a block split between two chunks is read twice) {seed_note()}")
    c = paged_case(g, 3, 32)  # large scores: exp overflows without a running max (red team 11; 13b's #3: float64 too)
    for big, what in (((c["args"][0] * 40, *c["args"][1:]), "on scores in the hundreds"),
                      (paged_one_score(c, 1000.0, g), "with one score of 1000 per sequence and KV head")):
        assert_close(observe(paged_attention, *big)[0], contiguous_reference(*big[:3], c["tables"], c["lens"]),
                     f"paged_attention {what}", atol=1e-4)
    for dtype in (torch.bfloat16, torch.float16):  # the result as accurate as fp32's, in q's dtype (FINDINGS5.md #22)
        assert_low_precision(paged_attention, g, dtype, [32, 64][int(torch.randint(0, 2, (1,), generator=g))],
                             ("lib.batching.paged", "lib.attn.attention", *ENGINE_MODULES))
    check_on_meta(paged_attention, args, "paged_attention")


# --- 7: prefix caching ------------------------------------------------------------------------------

@WEEK.exercise(7, "block_hashes", section="7 (Prefix caching)")
def check_block_hashes(block_hashes) -> None:
    """Properties of a chained hash: one per full block; equal prefixes, equal hashes; a change in block i
    changes the hash of block i and of every later block, and of no earlier one."""
    rng = random.Random(run_seed() + 6)
    for _ in range(20):
        bs = rng.randint(1, 16)
        n = rng.randint(0, 12 * bs)
        tokens = [rng.randrange(50000) for _ in range(n)]
        hs = block_hashes(tokens, bs)
        assert isinstance(hs, list) and len(hs) == n // bs, (
            f"block_hashes of {n} tokens with block_size {bs} returned {len(hs) if isinstance(hs, list) else hs!r}"
            f"; expected a list of {n // bs} hashes, one per FULL block (a partly filled block is never shared)")
        assert hs == block_hashes(list(tokens), bs), "block_hashes must be deterministic within a run"
        if n // bs == 0:
            continue
        tail = tokens + [rng.randrange(50000) for _ in range(rng.randint(0, 3 * bs))]
        assert block_hashes(tail, bs)[:len(hs)] == hs, (
            "two sequences with the same first tokens must get the same hashes for their common full blocks "
            f"{seed_note()}")
        i = rng.randrange(n // bs)
        changed = list(tokens)
        changed[i * bs + rng.randrange(bs)] += 1
        hc = block_hashes(changed, bs)
        assert hc[:i] == hs[:i], "changing a token in block i must not change the hashes of earlier blocks"
        later = [j for j in range(i, len(hs)) if hc[j] == hs[j]]
        assert not later, (f"changing a token in block {i} left the hashes of blocks {later} unchanged: each "
                           f"block's hash must cover its own tokens and the previous block's hash (chained), so "
                           f"a hit on block j means blocks 0..j all match {seed_note()}")
    same = [7] * 8
    assert block_hashes(same, 4)[0] != block_hashes(same, 4)[1], (
        "two identical blocks at different depths must hash differently (chain the previous hash in)")
    for _ in range(10):  # blocks whose tokens are permuted, changed in ways that cancel, or swapped
        bs = rng.randint(2, 16)
        k = rng.randint(2, 8)
        tokens = [rng.randrange(50000) for _ in range(k * bs)]
        hs = block_hashes(tokens, bs)
        i = rng.randrange(k)
        block = tokens[i * bs:(i + 1) * bs]
        x, y = rng.sample(range(bs), 2)
        while block[x] == block[y]:
            block[x] = rng.randrange(50000)
            tokens[i * bs + x] = block[x]
            hs = block_hashes(tokens, bs)
        swapped = list(block)
        swapped[x], swapped[y] = swapped[y], swapped[x]
        lo_t, hi_t = (x, y) if block[x] < block[y] else (y, x)  # the larger token is >= 1
        delta = rng.randint(1, min(9, block[hi_t]))
        balanced = list(block)
        balanced[lo_t] += delta  # the sum of the block is unchanged
        balanced[hi_t] -= delta
        for name, new in (("its tokens permuted", swapped), ("two tokens changed by +d and -d", balanced)):
            changed = tokens[:i * bs] + new + tokens[(i + 1) * bs:]
            same = [j for j in range(i, k) if block_hashes(changed, bs)[j] == hs[j]]
            assert not same, (f"block {i} with {name} ({block} -> {new}) leaves the hashes of blocks {same} unchanged: "
                              f"hash the tokens in order, not their sum or any order-blind mix {seed_note()}")
        j = rng.randrange(k)
        if tokens[j * bs:(j + 1) * bs] != tokens[i * bs:(i + 1) * bs]:
            lo, hi = min(i, j), max(i, j)
            blocks = [tokens[t * bs:(t + 1) * bs] for t in range(k)]
            blocks[lo], blocks[hi] = blocks[hi], blocks[lo]
            hb = block_hashes([t for blk in blocks for t in blk], bs)
            same = [t for t in range(lo, k) if hb[t] == hs[t]]
            assert not same, (f"swapping blocks {lo} and {hi} leaves the hashes of blocks {same} unchanged: a chained "
                              f"hash must depend on the order of the blocks (an additive chain does not) {seed_note()}")
    assert_long_chain(block_hashes, rng)  # prompts of 65-160 blocks: chained all the way
    assert_hash_entropy(block_hashes, rng)  # 2^19 prefixes, 2^19 hashes: 64 bits of entropy, not 32 spread out


# --- 12, 13: check your understanding --------------------------------------------------------------------

@WEEK.exercise(12, "answer_q1", section="10 (Check your understanding)")
def check_answer_q1(answer_q1) -> None:
    got = float(answer_q1())
    assert math.isclose(got, 1 - 28 / (258 * 16), rel_tol=1e-3), (
        f"answer_q1() = {got}; the fraction of allocated slots that hold a token for the seed's 4 requests (2000, "
        f"100, 500, 1500 tokens, block size 16): count the blocks each needs")


@WEEK.exercise(13, "answer_q3", section="10 (Check your understanding)")
def check_answer_q3(answer_q3) -> None:
    got = float(answer_q3())
    assert math.isclose(got, 1600 / 1100, rel_tol=1e-3), (
        f"answer_q3() = {got}; the step-count ratio static / continuous for 64 queued requests (half 50, half 200 "
        f"new tokens, alternating) on 8 slots: count the steps each policy takes")


# --- 9: the scheduler -------------------------------------------------------------------------------

@WEEK.exercise(9, "schedule", section="8 (The scheduler: preemption and chunked prefill)")
def check_schedule(schedule) -> None:
    """Random workloads (arrivals, lengths, pools tight enough to preempt, budgets small enough to chunk), every
    plan judged by the invariants (the order of preemption and its amount: only as many as the blocks need); single
    steps with prefix-shared blocks (a victim frees its freeable blocks only) and steps that need exactly one
    preemption; then LLMEngine with this scheduler equals generate on each request alone. About one call in ten,
    chosen at random, is observed (no lib.batching.engine): its plan is judged with the others."""
    rng = random.Random(run_seed() + 7)
    watch = random.Random(run_seed() + 17)

    def call(fn, *args, rate=0.1):
        if watch.random() >= rate:
            return fn(*args)
        plan, obs = observe(fn, *args)
        used = sorted(c for c in obs.lib_calls if c.startswith(ENGINE_MODULES))
        assert not used, f"schedule calls {used}; write the scheduling decision yourself"
        return plan

    for case in range(30):
        w = workload(rng, crowded=case % 3 == 0)
        label = (f"workload {case} (block_size {w['bs']}, {w['num_blocks']} blocks, budget {w['budget']}, "
                 f"max_num_seqs {w['max_seqs']}, chunked prefill {'on' if w['chunked'] else 'off'}, prompts "
                 f"{w['prompts']}, new tokens {w['new']}, arrival steps {w['arrivals']}) {seed_note()}")
        simulate(schedule, w, label, call)
    # Single steps with blocks shared through the prefix cache: a scheduler that credits a victim with every block it
    # holds, not its freeable ones, hands out blocks that stay taken (rejected in about 1 of 4 such steps; 80 steps
    # miss it with probability ~1e-9; lib's schedule passed 40,000 of them). Then steps that need one preemption
    # exactly: one that preempts every newer request at once is rejected at each.
    busy = {83: (7, 12), 84: (13, 64), 85: (65, 256)}  # 80-85: one preemption; 86: chunking off; 87: a long prompt
    for case in range(88):
        s = (shared_step(rng) if case < 80 else amount_step(rng, busy.get(case)) if case < 86 else
             unchunked_step(rng) if case == 86 else long_step(rng))
        where = (f"a step {'with prefix-shared blocks' if case < 80 else 'that needs one preemption'} (block_size "
                 f"{s['bs']}, {s['free']} free, budget {s['budget']}, max_num_seqs {s['max_seqs']}, running "
                 f"{s['running']}, waiting {s['waiting']}, chunked prefill {s.get('chunked', True)}) {seed_note()}")
        chunked = s.get("chunked", True)
        plan = call(schedule, [dict(r) for r in s["running"]], [dict(r) for r in s["waiting"]], s["free"], s["bs"],
                    s["budget"], s["max_seqs"], chunked, rate=0.25 if case < 80 else 1.0)
        judge_plan(plan, s["running"], s["waiting"], s["free"], s["bs"], s["budget"], s["max_seqs"], chunked, where)
    from lib.batching.engine import LLMEngine
    from lib.modeling.generate import generate

    g = generator(70)
    model = context_model(int(torch.randint(0, 1000, (1,), generator=g)))
    prompts = [torch.randint(0, model.config.vocab_size, (int(k),), generator=g).tolist()
               for k in torch.randint(3, 25, (6,), generator=g)]
    want = [generate(model, torch.tensor([p]), 6)[0, len(p):].tolist() for p in prompts]
    for kwargs in (dict(num_blocks=9, block_size=4, max_num_seqs=4, max_num_batched_tokens=8),
                   dict(num_blocks=12, block_size=4, max_num_seqs=3, max_num_batched_tokens=16,
                        enable_prefix_caching=True)):
        engine = LLMEngine(model, scheduler=schedule, **kwargs)
        got = engine.generate(prompts + prompts[:2], 6)
        assert got == want + want[:2], (f"LLMEngine({kwargs}) with your scheduler returned {got}, not what generate "
                                        f"gives on each request alone ({want + want[:2]}) {seed_note()}")


# --- 8: the prefix cache ----------------------------------------------------------------------------

@WEEK.exercise(8, "PrefixCache", section="7 (Prefix caching)")
def check_PrefixCache(PrefixCache) -> None:
    """Random allocate / fork / free / register / lookup against a model of the cache (which block is evicted,
    hits, a collision, reuse of a free cached block, ref_count of every block an operation touched), errors; then
    LLMEngine with it equals generate alone. Each trial's cache is made under observation, and about one call in
    twenty of the random operations, chosen at random: what they did is judged with the rest, and none runs
    lib's pool or cache."""
    watch = random.Random(run_seed() + 18)

    def call(fn, *args, accept=None):  # accept: the blocks any correct pool may allocate (the second run's may differ)
        if fn is not PrefixCache and watch.random() >= 0.05:
            return fn(*args)
        out, obs = observe(fn, *args, **({"_observe_accept": accept} if accept else {}))
        used = sorted(c for c in obs.lib_calls if c.startswith((*ENGINE_MODULES, "lib.batching.paged.BlockAllocator")))
        assert not used, f"PrefixCache runs {used}; write the pool and its cache yourself"
        return out

    rng = random.Random(run_seed() + 8)
    hits = sum(cache_trial(PrefixCache, rng, rng.randint(1, 8), 400, trial, call) for trial in range(5))
    assert hits > 0, f"no lookup hit in 2000 operations {seed_note()}"
    for low, high in ((3, 8), (13, 64), (65, 1024)):  # LRU order, spelled out (week19_sim.lru_order)
        lru_order(PrefixCache, rng, low, high)
    n = rng.randint(3, 8)  # uncached before cached, spelled out: some blocks cached, all freed, allocate again
    cache = PrefixCache(n)
    blocks = [cache.allocate() for _ in range(n)]
    cached = rng.sample(blocks, rng.randint(1, n - 1))
    for block in cached:
        cache.register(block, rng.getrandbits(62), [rng.randrange(100) for _ in range(4)])
    for block in rng.sample(blocks, n):
        cache.free(block)
    plain = sorted(set(blocks) - set(cached))
    got = sorted(cache.allocate() for _ in plain)
    assert got == plain, (f"PrefixCache({n}): blocks {sorted(cached)} cached, then every block freed; allocate() "
                          f"{len(plain)} times returned {got}: the free blocks that cache nothing, {plain}, must go "
                          f"first: evict a cached block only when no other is free {seed_note()}")
    cache = PrefixCache(3)
    a, b = cache.allocate(), cache.allocate()
    cache.free(b)  # a stays owned: refused while other blocks are in use too (red team 11b)
    expect_error(lambda: cache.free(b), ValueError, f"free() of a free block (block {a} still owned)")
    expect_error(lambda: cache.fork(b), ValueError, f"fork() of a free block that caches nothing (block {a} still owned)")
    for bad in (-1, 3):
        expect_error(lambda: cache.free(bad), ValueError, f"free({bad}) on a pool of 3 blocks")
    from lib.batching.engine import LLMEngine
    from lib.modeling.generate import generate

    g = generator(80)
    model = context_model(int(torch.randint(0, 1000, (1,), generator=g)))
    system = torch.randint(0, model.config.vocab_size, (12,), generator=g).tolist()
    prompts = [system + torch.randint(0, model.config.vocab_size, (int(k),), generator=g).tolist()
               for k in torch.randint(1, 6, (5,), generator=g)]
    others = [torch.randint(0, model.config.vocab_size, (14,), generator=g).tolist() for _ in range(2)]
    batch = prompts[:2] + others + prompts[2:]
    want = [generate(model, torch.tensor([p]), 4)[0, len(p):].tolist() for p in batch]
    engine = LLMEngine(model, num_blocks=12, block_size=4, max_num_seqs=2, max_num_batched_tokens=32,
                       enable_prefix_caching=True, block_pool=PrefixCache)
    got = engine.generate(batch, 4)
    assert got == want, (f"LLMEngine with your PrefixCache returned {got}, not what generate gives on each request "
                         f"alone ({want}) {seed_note()}")
    assert engine.prefix_hit_tokens > 0, "LLMEngine with your PrefixCache found no cached prefix in prompts sharing 12 tokens"


# --- 10: your engine ---------------------------------------------------------------------------------

_PARTS = ("BlockAllocator", "slot_mapping", "paged_attention", "block_hashes", "PrefixCache", "schedule")


@WEEK.exercise(10, "engine", section="8 (The scheduler: preemption and chunked prefill; Your engine)")
def check_engine(BlockAllocator, slot_mapping, paged_attention, block_hashes, PrefixCache, schedule) -> None:
    """LLMEngine built from your parts only — your pool (BlockAllocator, or PrefixCache with prefix caching),
    slot_mapping, paged_attention, block_hashes and schedule — returns what generate returns on each request
    alone, on random workloads that preempt, chunk prefills and (the second) hit the prefix cache. Calls of the parts
    are observed at random (a quarter of paged_attention's, a tenth of the others'): none of lib's code, and no SDPA
    in paged_attention."""
    from lib.batching.engine import LLMEngine
    from lib.modeling.generate import generate

    parts = dict(zip(_PARTS, (BlockAllocator, slot_mapping, paged_attention, block_hashes, PrefixCache, schedule)))
    used = lib_parts(parts)
    assert not used, f"your engine runs on lib's parts: {'; '.join(used)}. Plug in your own."
    calls: Counter = Counter()

    watch = random.Random(run_seed() + 19)

    def counted(name):  # calls observed at random (a quarter of paged_attention's, a tenth of the others')
        def call(*args, **kwargs):
            calls[name] += 1
            if watch.random() >= (0.25 if name == "paged_attention" else 0.1):
                return parts[name](*args, **kwargs)
            out, obs = observe(parts[name], *args, **kwargs)
            used = sorted(c for c in obs.lib_calls if c.startswith(("lib.batching.paged", "lib.attn.attention", *ENGINE_MODULES)))
            assert not used, f"in LLMEngine, your {name} called {used}: plug in your own parts"
            if name == "paged_attention":
                assert not sdpa_ops(obs) and exponentials(obs), (
                    f"in LLMEngine, your paged_attention ran {sdpa_ops(obs) or 'no exponential torch saw'} (SDPA): the "
                    f"attention of exercise 6, block by block, in every call")
            return out
        return call

    rng = random.Random(run_seed() + 9)
    model = context_model(rng.randrange(1000))
    for prefix_caching in (False, True):
        for _ in range(50):  # a workload on which lib's engine preempts and chunks (and hits the prefix cache)
            w = engine_workload(rng, model.config.vocab_size, prefix_caching)
            lib_engine = LLMEngine(model, **w["kwargs"])
            want = [generate(model, torch.tensor([p]), w["new"])[0, len(p):].tolist() for p in w["prompts"]]
            same = lib_engine.generate(w["prompts"], w["new"]) == want  # else a near-tie of two logits: not this one
            chunked = w["kwargs"]["max_num_batched_tokens"] < max(map(len, w["prompts"]))  # a prompt is cut
            if same and lib_engine.num_preemptions and chunked and (lib_engine.prefix_hit_tokens or not prefix_caching):
                break
        pool = "PrefixCache" if prefix_caching else "BlockAllocator"
        calls.clear()
        engine = LLMEngine(model, **w["kwargs"], block_pool=counted(pool), scheduler=counted("schedule"),
                           block_hashes=counted("block_hashes"), slot_mapping=counted("slot_mapping"),
                           paged_attention=counted("paged_attention"))
        what = (f"LLMEngine({w['kwargs']}) on your {pool}, slot_mapping, paged_attention"
                f"{', block_hashes' if prefix_caching else ''} and schedule, prompts {w['prompts']}, "
                f"{w['new']} new tokens each")
        got = engine.generate(w["prompts"], w["new"])
        assert got == want, (f"{what}: returned {got}, not what generate gives on each request alone ({want}) "
                             f"({engine.num_preemptions} preemptions; lib's parts preempt {lib_engine.num_preemptions} "
                             f"times and return generate's) {seed_note()}")
        needed = [pool, "schedule", "slot_mapping", "paged_attention"] + (["block_hashes"] if prefix_caching else [])
        idle = [name for name in needed if not calls[name]]
        assert not idle, f"{what}: the engine never called your {idle}"
        if prefix_caching and lib_engine.prefix_hit_tokens:
            assert engine.prefix_hit_tokens, (f"{what}: no prompt token was found in your prefix cache, where lib's "
                                              f"finds {lib_engine.prefix_hit_tokens} {seed_note()}")


# --- 11: predicting the step count -------------------------------------------------------------------

@WEEK.exercise(11, "predict_steps", section="8 (The scheduler: preemption and chunked prefill; Predicting the step count)")
def check_predict_steps(predict_steps) -> None:
    """Random workloads (lengths, slots, budgets, chunking on and off): the prediction equals the steps LLMEngine
    takes on them (a tiny model, blocks to spare); predicted without lib's engine or a model."""
    from lib.batching.engine import LLMEngine
    from lib.modeling.llama import tiny_model

    rng = random.Random(run_seed() + 11)
    model = tiny_model(seed=rng.randrange(1000))
    for case in range(12):
        w = step_workload(rng, unchunked=case == 1)
        if case == 0:
            got, obs = observe(predict_steps, **w)
            used = sorted(c for c in obs.lib_calls if c.startswith((*ENGINE_MODULES, "lib.modeling.llama", "lib.modeling.generate")))
            assert not used, f"predict_steps runs {used[:4]}: predict the steps from the rules, without running the engine"
        else:
            got = predict_steps(**w)
        engine = LLMEngine(model, num_blocks=sum(w["prompt_lens"]) + sum(w["new_tokens"]), block_size=rng.choice([1, 4, 16]),
                           max_num_seqs=w["max_num_seqs"], max_num_batched_tokens=w["token_budget"],
                           enable_chunked_prefill=w["chunked_prefill"])
        for p, n in zip(w["prompt_lens"], w["new_tokens"]):
            engine.add_request([rng.randrange(model.config.vocab_size) for _ in range(p)], n)
        while engine.has_unfinished():
            engine.step()
        steps = len(engine.trace)
        assert isinstance(got, int) and got == steps, (
            f"predict_steps({', '.join(f'{k}={v}' for k, v in w.items())}) = {got!r}; LLMEngine took {steps} steps "
            f"(tokens per step: {[sum(n for _, n in s) for s in engine.trace]}) {seed_note()}")
