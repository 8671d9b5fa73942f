"""Week 19 — continuous batching and PagedAttention: the milestone checks, used by solutions/19/test_week19.py
and the notebook.

One `check_<name>` per exercise; each takes the student's function or class and raises AssertionError with
a message that says what is wrong. The references are in lib/paged.py, lib/blocks.py and lib/engine.py.
"""
from __future__ import annotations

import math
import random

import torch

from grader.checks import assert_close, check_on_meta, generator, observe, run_seed, seed_note
from grader.harness import Week
from lib import paged as ref
from lib.attention import gqa_attention

WEEK = Week(19, "week19_paged_batching.ipynb")
# lib's engine as the fingerprints name it: lib.engine (which also prefixes lib.engine_load, its load test) and
# lib.blocks (the block hashes, PrefixCache and BlockManager that lib.engine re-exports)
ENGINE_MODULES = ("lib.engine", "lib.blocks")


# --- 1, 2: counting blocks ---------------------------------------------------------------------------

@WEEK.exercise(1, "blocks_needed", section="2 (Preallocation's waste)")
def check_blocks_needed(blocks_needed) -> None:
    g = generator(1)
    cases = [(0, 16), (1, 16), (16, 16), (17, 16), (2000, 16), (100, 16), (7, 1), (31, 32)]
    cases += [(int(n), int(b)) for n, b in zip(torch.randint(0, 5000, (20,), generator=g),
                                              torch.randint(1, 64, (20,), generator=g))]
    for n, b in cases:
        got = blocks_needed(n, b)
        want = ref.blocks_needed(n, b)
        assert got == want, (f"blocks_needed(num_tokens={n}, block_size={b}) = {got}; expected {want}: a block "
                              f"holds {b} slots and a partly filled last block still counts (round up) {seed_note()}")


@WEEK.exercise(2, "slots_wasted", section="2 (Preallocation's waste)")
def check_slots_wasted(slots_wasted) -> None:
    got = slots_wasted([2000, 100, 500, 1500], 16)
    assert got == 28, (f"slots_wasted([2000, 100, 500, 1500], 16) = {got}; expected 28 (the seed's example: "
                       f"258 blocks = 4128 slots for 4100 tokens)")
    g = generator(2)
    for case in range(20):
        b = int(torch.randint(1, 33, (1,), generator=g))
        lengths = torch.randint(1, 3000, (int(torch.randint(1, 12, (1,), generator=g)),), generator=g).tolist()
        lengths[0] = b * int(torch.randint(1, 50, (1,), generator=g))  # one fills its last block exactly
        got = slots_wasted(lengths, b)
        want = ref.slots_wasted(lengths, b)
        assert got == want, (f"slots_wasted({lengths}, block_size={b}) = {got}; expected {want}: only each sequence's "
                             f"last block has empty slots, and none if the length is a multiple of the block size "
                             f"{seed_note()}")


# --- 3: the block allocator --------------------------------------------------------------------------

def _expect_error(fn, kind, what: str) -> Exception:
    try:
        fn()
    except NotImplementedError:
        raise
    except kind as e:
        return e
    except Exception as e:
        raise AssertionError(f"{what} raised {type(e).__name__}: {e}; expected a {kind.__name__}") from None
    raise AssertionError(f"{what} did not raise; expected a {kind.__name__}")


@WEEK.exercise(3, "BlockAllocator", section="3 (The block allocator)")
def check_BlockAllocator(BlockAllocator) -> None:
    """Random allocate / fork / free sequences against a model of the pool (a dict of owners per block)."""
    rng = random.Random(run_seed() + 3)
    for trial in range(6):
        n = rng.randint(1, 24)
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
                    e = _expect_error(alloc.allocate, Exception, f"after {log[-6:]}, allocate() with all {n} blocks in use")
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
        for block, count in owners.items():  # every owner frees: the whole pool is free again
            for _ in range(count):
                alloc.free(block)
        assert alloc.num_free == n, (f"after every owner freed its blocks, num_free = {alloc.num_free}; expected "
                                     f"all {n} {seed_note()}")
        freed = rng.randrange(n)
        _expect_error(lambda: alloc.free(freed), ValueError, f"free({freed}) of a block that is not allocated")
        assert alloc.num_free == n, "a refused free must leave the pool as it was"
        _expect_error(lambda: alloc.fork(freed), ValueError, f"fork({freed}) of a free block (it would be handed "
                      f"out again while owned)")
        assert alloc.num_free == n, "a refused fork must leave the pool as it was"
    # adversarial sequences: bad ids on a full pool, a block with hundreds of owners
    n = rng.randint(2, 9)
    alloc = BlockAllocator(n)
    blocks = [alloc.allocate() for _ in range(n)]
    assert sorted(blocks) == list(range(n)), f"{n} allocate() calls on a new pool of {n} returned {blocks}"
    for bad in (-1, -n, n, n + 3):
        for op in ("free", "fork"):
            _expect_error(lambda: getattr(alloc, op)(bad), ValueError,
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


# --- 4: slot mapping ---------------------------------------------------------------------------------

@WEEK.exercise(4, "slot_mapping", section="4 (Block tables and paged attention)")
def check_slot_mapping(slot_mapping) -> None:
    got = slot_mapping([5, 2, 9], 0, 7, 3)
    want = torch.tensor([15, 16, 17, 6, 7, 8, 27])
    assert_close(got, want, "slot_mapping([5, 2, 9], start=0, num_tokens=7, block_size=3)", atol=0)
    g = generator(4)
    for _ in range(12):
        bs = int(torch.randint(1, 20, (1,), generator=g))
        nb = int(torch.randint(1, 12, (1,), generator=g))
        table = torch.randperm(64, generator=g)[:nb].tolist()
        start = int(torch.randint(0, nb * bs, (1,), generator=g))
        count = int(torch.randint(0, nb * bs - start + 1, (1,), generator=g))
        got = slot_mapping(table, start, count, bs)
        assert_close(got, ref.slot_mapping(table, start, count, bs),
                     f"slot_mapping({table}, start={start}, num_tokens={count}, block_size={bs}) (position p lives "
                     f"in slot table[p // block_size] * block_size + p % block_size; blocks are not contiguous)",
                     atol=0)


# --- 5: paged attention ------------------------------------------------------------------------------

def _contiguous_reference(q, k_pool, v_pool, tables, lens):
    """What contiguous attention gives, one sequence at a time (the check's reference, outside the observation)."""
    _, hkv, bs, d = k_pool.shape
    flat_k = k_pool.permute(0, 2, 1, 3).reshape(-1, hkv, d)  # [slots, Hkv, d]
    flat_v = v_pool.permute(0, 2, 1, 3).reshape(-1, hkv, d)
    outs = []
    for i, n in enumerate(lens):
        slots = ref.slot_mapping(tables[i], 0, n, bs)
        k = flat_k[slots].transpose(0, 1)[None]  # [1, Hkv, n, d]
        v = flat_v[slots].transpose(0, 1)[None]
        outs.append(gqa_attention(q[i][None, :, None], k, v)[0, :, 0])
    return torch.stack(outs)  # [B, H, d]


@WEEK.exercise(5, "paged_attention", section="4 (Block tables and paged attention)")
def check_paged_attention(paged_attention) -> None:
    """Ragged lengths, random block sizes, head_dim, batch and GQA/MHA/MQA, against contiguous attention (<= 1e-5,
    fp32); reads the pool in place: no lib, no SDPA, no copy of a sequence's whole K/V, no full-row softmax, all
    of it visible to the observer (torch ops, not numpy), inputs unchanged, tensors made on the inputs' device."""
    g = generator(5)
    heads = [(4, 2), (4, 4), (6, 1), (6, 3), (8, 2)]
    dims = [[16, 32, 64][i] for i in torch.randperm(3, generator=g)] + [int(16 * torch.randint(1, 5, (1,), generator=g))]
    for case in range(4):
        bs = [1, 7, 16, int(torch.randint(2, 33, (1,), generator=g))][case]
        h, hkv = heads[int(torch.randint(0, len(heads), (1,), generator=g))]
        d = dims[case]  # head_dim 16, 32 and 64 every run: a hard-coded 1/sqrt(16) fails
        b = int(torch.randint(3, 7, (1,), generator=g))
        lens = torch.randint(1, 1200, (b,), generator=g)
        lens[0] = int(torch.randint(1500, 2001, (1,), generator=g))  # one long sequence
        lens[1] = 1
        lens[2] = bs * int(torch.randint(1, 40, (1,), generator=g))  # one fills its last block exactly
        lens = lens[torch.randperm(b, generator=g)].tolist()
        need = [ref.blocks_needed(n, bs) for n in lens]
        nb = sum(need) + 3
        k_pool = torch.randn(nb, hkv, bs, d, generator=g)
        v_pool = torch.randn(nb, hkv, bs, d, generator=g)
        perm = torch.randperm(nb, generator=g).tolist()
        tables, at = [], 0
        for k in need:
            tables.append(perm[at:at + k])
            at += k
        width = max(need) + 2
        block_tables = torch.randint(0, nb, (b, width), generator=g)  # entries past each end: any block, ignored
        for i, t in enumerate(tables):
            block_tables[i, :len(t)] = torch.tensor(t)
        q = torch.randn(b, h, d, generator=g)
        context_lens = torch.tensor(lens)
        args = (q, k_pool, v_pool, block_tables, context_lens)
        before = [a.clone() for a in args]
        got, obs = observe(paged_attention, *args)
        what = (f"paged_attention case {case}: block_size={bs}, n_heads={h}, n_kv_heads={hkv}, head_dim={d}, "
                f"context_lens={lens}")
        assert_close(got, _contiguous_reference(*before[:3], tables, lens), what, atol=1e-5)
        changed = [name for name, a, a0 in zip(("q", "k_pool", "v_pool", "block_tables", "context_lens"), args, before)
                   if not torch.equal(a, a0)]
        assert not changed, (f"{what}: changed its arguments {changed} in place; the pool belongs to the cache (every "
                             f"later step reads it): scale the query or the scores, never the caller's tensors")
        lib_used = sorted(c for c in obs.lib_calls if c.startswith(("lib.paged", "lib.attention", *ENGINE_MODULES)))
        assert not lib_used, f"{what}: calls {lib_used}; write the attention yourself"
        sdpa = obs.called("aten._scaled_dot_product")
        assert not sdpa, f"{what}: calls {sdpa}; compute the scores and the softmax yourself, block by block"
        assert obs.called("aten.exp", "aten._softmax", "aten.softmax", "aten.exp2", "aten.special_exp2"), (
            f"{what}: the observer saw no exponential: the softmax ran out of its sight (numpy, which breaks on "
            f"CUDA tensors, or a popped dispatch-mode stack). Compute with torch ops on the inputs' device.")
        longest = 2 * max(lens) * hkv * d * 4  # one sequence's K and V, contiguous, fp32
        made = obs.peak_bytes + obs.premade_bytes  # allocated during the call, or written into a buffer made before
        assert made < longest / 2, (
            f"{what}: allocated {obs.peak_bytes} bytes at peak"
            f"{f' and wrote {obs.premade_bytes} bytes into buffers made before the call (a workspace)' if obs.premade_bytes else ''}"
            f", as much as a contiguous copy of the longest sequence's keys and values ({longest} bytes). Read the "
            f"pool a few blocks (about 32 keys) at a time for every sequence and keep a running max and sum (online "
            f"softmax), as the kernel does.")
        red = obs.max_reduction_extent()
        assert red <= 512, (f"{what}: one reduction (softmax, max, sum) combined {red} elements: a softmax over a "
                            f"sequence's whole row of scores. Reduce a chunk of blocks at a time and keep running "
                            f"statistics (online softmax).")
    check_on_meta(paged_attention, args, "paged_attention")


# --- 6: prefix caching ------------------------------------------------------------------------------

@WEEK.exercise(6, "block_hashes", section="7 (Prefix caching)")
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
    tokens = [rng.randrange(50000) for _ in range(8000)]
    hs = block_hashes(tokens, 1)  # 8000 different prefixes
    assert len(set(hs)) == len(hs), (
        f"8000 different prefixes got only {len(set(hs))} different hashes: too few bits (a 20-bit hash collides "
        f"about 30 times here, a 64-bit one with probability 2e-12). Keep the whole hash {seed_note()}")


# --- 10: check your understanding --------------------------------------------------------------------

@WEEK.exercise(10, "answer_q1", section="10 (Check your understanding)")
def check_answer_q1(answer_q1) -> None:
    got = float(answer_q1())
    want = 1 - 28 / (258 * 16)
    assert math.isclose(got, want, rel_tol=1e-3), (
        f"answer_q1() = {got}; the fraction of allocated slots that hold a token for the 4 requests of section 2 "
        f"(2000, 100, 500, 1500 tokens, block size 16)")


@WEEK.exercise(10, "answer_q3", section="10 (Check your understanding)")
def check_answer_q3(answer_q3) -> None:
    got = float(answer_q3())
    assert math.isclose(got, 1600 / 1100, rel_tol=1e-3), (
        f"answer_q3() = {got}; the step-count ratio static / continuous for 64 queued requests (half 50, half 200 "
        f"new tokens, alternating) on 8 slots: count the steps each policy takes")


# --- 8: the scheduler -------------------------------------------------------------------------------

def _need(view: dict, n: int, block_size: int) -> int:
    return max(0, ref.blocks_needed(view["computed"] + n, block_size) - view["blocks"])


def _judge_plan(plan, running: list[dict], waiting: list[dict], free: int, bs: int, budget: int, max_seqs: int,
                chunked: bool, where: str) -> tuple[list[int], list[tuple[int, int]]]:
    """The invariants one step's plan must keep; returns (preempted ids, [(id, n)])."""
    assert isinstance(plan, dict) and set(plan) >= {"preempt", "run"}, (
        f"{where}: schedule returned {plan!r}; expected a dict {{'preempt': [id, ...], 'run': [[id, n], ...]}}")
    try:
        preempt = [int(i) for i in plan["preempt"]]
        run = [(int(i), int(n)) for i, n in plan["run"]]
    except (TypeError, ValueError):
        raise AssertionError(f"{where}: schedule returned {plan!r}; 'preempt' must be a list of request ids and "
                             f"'run' a list of [id, num_tokens] pairs") from None
    views = {r["id"]: r for r in running + waiting}
    run_ids = [i for i, _ in run]
    assert len(set(run_ids)) == len(run_ids), f"{where}: the plan runs a request twice: {run}"
    unknown = [i for i in run_ids + preempt if i not in views]
    assert not unknown, f"{where}: the plan names request ids {unknown} that are neither running nor waiting"
    for i, n in run:
        left = views[i]["tokens"] - views[i]["computed"]
        assert 1 <= n <= left, f"{where}: the plan runs {n} tokens of request {i}, which has {left} left to compute"
    total = sum(n for _, n in run)
    assert total <= budget, (f"{where}: the plan runs {total} tokens; the token budget is {budget} "
                             f"(max_num_batched_tokens): cut the prefills to what is left of it")
    # preemption: the newest running requests, newest first, and only requests that are running
    running_ids = [r["id"] for r in running]
    assert all(i in running_ids for i in preempt), f"{where}: the plan preempts {preempt}, not all of them running"
    newest = running_ids[::-1][:len(preempt)]
    assert preempt == newest, (
        f"{where}: the plan preempts {preempt}; running (oldest first) is {running_ids}: preempt the most recently "
        f"admitted request first ({newest}), so the oldest requests keep their blocks and finish")
    assert not set(preempt) & set(run_ids), f"{where}: the plan both preempts and runs {set(preempt) & set(run_ids)}"
    # blocks: never more than are free (plus what the preempted requests give back)
    need = sum(_need(views[i], n, bs) for i, n in run)
    have = free + sum(views[i]["freeable"] for i in preempt)
    assert need <= have, (f"{where}: the plan needs {need} new blocks; {free} are free"
                          f"{f' and the preempted give back {have - free}' if preempt else ''}: a request that needs a "
                          f"block when none is free must preempt (the newest running request) or wait")
    # running requests first, oldest first; waiting ones first come first served
    kept = [i for i in running_ids if i not in preempt]
    ran = [i for i in run_ids if i in kept]
    assert ran == kept[:len(ran)], (f"{where}: of the running requests {kept} (oldest first) the plan runs {ran}: "
                                    f"serve the running requests oldest first, skipping none")
    if len(ran) < len(kept):
        assert total == budget or preempt, (
            f"{where}: running requests {kept[len(ran):]} got no tokens although the plan leaves "
            f"{budget - total} of the budget unused and preempts nobody")
    waiting_ids = [r["id"] for r in waiting]
    admitted = [i for i in run_ids if i in waiting_ids]
    assert admitted == waiting_ids[:len(admitted)], (
        f"{where}: the plan admits {admitted} from the waiting queue {waiting_ids}: admit first come first served "
        f"(the queue's front first; a preempted request is at the front and resumes before later arrivals)")
    seqs = sum(views[i]["seqs"] for i in kept) + sum(views[i]["seqs"] for i in admitted)
    assert seqs <= max_seqs, f"{where}: the plan runs {seqs} sequences; max_num_seqs is {max_seqs}"
    for i, n in run:
        left = views[i]["tokens"] - views[i]["computed"]
        if n < left:
            assert chunked, (f"{where}: the plan runs {n} of the {left} tokens request {i} has left, with chunked "
                             f"prefill off: a prompt runs whole or waits")
            assert total == budget, (f"{where}: the plan cuts request {i} to {n} of its {left} tokens while "
                                     f"{budget - total} of the budget is unused: a chunk is cut by the budget only")
    if not preempt and waiting_ids[len(admitted):] and seqs < max_seqs and total < budget:
        nxt = views[waiting_ids[len(admitted)]]
        left = nxt["tokens"] - nxt["computed"]
        n = min(left, budget - total)
        fits = nxt["seqs"] + seqs <= max_seqs and _need(nxt, n, bs) <= free - need and (chunked or n == left)
        assert not fits, (f"{where}: waiting request {nxt['id']} could run {n} tokens (slots, {budget - total} of the "
                          f"budget and {free - need} free blocks are left) but the plan leaves it waiting"
                          f"{'; with chunked prefill on, admit a chunk of a prompt longer than the budget left' if n < left else ''}")
    return preempt, run


def _workload(rng: random.Random, crowded: bool = False) -> dict:
    """A random workload; `crowded`: everyone arrives at once, decodes long, in a pool that makes several running
    requests preempt one another."""
    if crowded:
        bs, k = rng.choice([1, 2]), rng.randint(5, 8)
        prompts = [rng.randint(2, 10) for _ in range(k)]
        new = [rng.randint(8, 20) for _ in range(k)]
        longest = max(ref.blocks_needed(p + m - 1, bs) for p, m in zip(prompts, new))
        return dict(bs=bs, prompts=prompts, new=new, arrivals=[0] * k, num_blocks=longest + rng.randint(0, 3),
                    max_seqs=rng.randint(4, 6), budget=rng.randint(16, 32), chunked=True)
    bs = rng.choice([1, 2, 4, 8])
    k = rng.randint(3, 9)
    prompts = [rng.randint(1, 30) for _ in range(k)]
    new = [rng.randint(1, 10) for _ in range(k)]
    longest = max(ref.blocks_needed(p + m - 1, bs) for p, m in zip(prompts, new))
    chunked = rng.random() < 0.75
    max_seqs = rng.randint(1, 5)
    budget = rng.randint(max(max_seqs, 4), 24) if chunked else max(p + m - 1 for p, m in zip(prompts, new)) + rng.randint(0, 8)
    return dict(bs=bs, prompts=prompts, new=new, arrivals=sorted(rng.randint(0, 12) for _ in range(k)),
                num_blocks=longest + rng.randint(0, 2 * longest), max_seqs=max_seqs, budget=max(budget, max_seqs),
                chunked=chunked)


def _simulate(schedule, w: dict, label: str) -> int:
    """Serve workload `w` with `schedule`, judging every plan; returns the steps taken. Plain data, no model:
    a request whose cache holds all its tokens produces one more, until it has its max_new_tokens."""
    reqs = [dict(id=i, computed=0, tokens=p, blocks=0, out=0) for i, p in enumerate(w["prompts"])]
    waiting, running, free, step = [], [], w["num_blocks"], 0
    arrived = 0
    limit = 20 * sum(p + m for p, m in zip(w["prompts"], w["new"])) + 20
    while arrived < len(reqs) or waiting or running:
        while arrived < len(reqs) and w["arrivals"][arrived] <= step:
            waiting.append(reqs[arrived])
            arrived += 1
        if not (waiting or running):
            step += 1
            continue
        where = f"{label}, step {step}"
        view = lambda r: dict(id=r["id"], computed=r["computed"], tokens=r["tokens"], blocks=r["blocks"],  # noqa: E731
                              freeable=r["blocks"], seqs=1)
        rv, wv = [view(r) for r in running], [view(r) for r in waiting[:w["max_seqs"]]]
        plan = schedule(rv, wv, free, w["bs"], w["budget"], w["max_seqs"], w["chunked"])
        preempt, run = _judge_plan(plan, rv, wv, free, w["bs"], w["budget"], w["max_seqs"], w["chunked"], where)
        assert run, (f"{where}: the plan runs nothing although {len(running)} request(s) run and {len(waiting)} wait; "
                     f"the engine would stall")
        for i in preempt:  # back to the queue's front (the oldest preempted first), blocks freed, to be recomputed
            r = reqs[i]
            running.remove(r)
            free += r["blocks"]
            r["computed"] = r["blocks"] = 0
            waiting.insert(0, r)
        for i, n in run:
            r = reqs[i]
            if r in waiting:
                waiting.remove(r)
                running.append(r)
            grow = _need(view(r), n, w["bs"])
            free -= grow
            r["blocks"] += grow
            r["computed"] += n
            if r["computed"] == r["tokens"]:
                r["out"] += 1
                if r["out"] == w["new"][i]:
                    running.remove(r)
                    free += r["blocks"]
                else:
                    r["tokens"] += 1
        step += 1
        assert step <= limit, (f"{label}: not finished after {limit} steps ({[r['id'] for r in running]} running, "
                               f"{[r['id'] for r in waiting]} waiting): a request is starved {seed_note()}")
    assert free == w["num_blocks"], f"{label}: blocks leaked: {free} of {w['num_blocks']} free at the end"
    return step


@WEEK.exercise(8, "schedule", section="8 (The scheduler: preemption and chunked prefill)")
def check_schedule(schedule) -> None:
    """Random workloads (arrivals, lengths, pools tight enough to preempt, budgets small enough to chunk), every
    plan judged by the invariants; then LLMEngine with this scheduler equals generate on each request alone."""
    rng = random.Random(run_seed() + 7)
    for case in range(30):
        w = _workload(rng, crowded=case % 3 == 0)
        label = (f"workload {case} (block_size {w['bs']}, {w['num_blocks']} blocks, budget {w['budget']}, "
                 f"max_num_seqs {w['max_seqs']}, chunked prefill {'on' if w['chunked'] else 'off'}, prompts "
                 f"{w['prompts']}, new tokens {w['new']}, arrival steps {w['arrivals']}) {seed_note()}")
        if case == 0:
            _, obs = observe(schedule, [], [dict(id=0, computed=0, tokens=5, blocks=0, freeable=0, seqs=1)], 4, 4, 8, 2,
                             True)
            used = sorted(c for c in obs.lib_calls if c.startswith(ENGINE_MODULES))
            assert not used, f"schedule calls {used}; write the scheduling decision yourself"
        _simulate(schedule, w, label)
    from lib.engine import LLMEngine
    from lib.generate import generate

    g = generator(70)
    model = _context_model(int(torch.randint(0, 1000, (1,), generator=g)))
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


# --- 7: the prefix cache ----------------------------------------------------------------------------

class _CacheModel:
    """What a PrefixCache must do, as sets and lists: free blocks that cache nothing (any order), free cached
    blocks (least recently freed first), owners per block, hash -> (block, tokens)."""

    def __init__(self, n: int):
        self.uncached, self.lru, self.owners, self.cached = set(range(n)), [], {}, {}

    def key_of(self, block):
        return next((h for h, (b, _) in self.cached.items() if b == block), None)


def _cache_trial(PrefixCache, rng: random.Random, n: int, steps: int, trial: int) -> int:
    cache, model, log, hits = PrefixCache(n), _CacheModel(n), [], 0
    hashes = [rng.getrandbits(62) for _ in range(6)]  # few hashes: registering one twice and colliding happen

    def where():
        return f"PrefixCache({n}), trial {trial}, after {log[-8:]} {seed_note()}"

    for _ in range(steps):
        op = rng.choice(["allocate", "allocate", "free", "free", "fork", "register", "register", "lookup", "lookup",
                         "reuse"])
        if op == "allocate":
            if not model.uncached and not model.lru:
                e = _expect_error(cache.allocate, Exception, f"{where()}: allocate() with every block owned (a block "
                                  f"in use is never evicted)")
                assert type(e).__name__ == "OutOfBlocksError", f"allocate() on a full pool raised {type(e).__name__}"
                continue
            block = cache.allocate()
            log.append(f"allocate() -> {block}")
            if model.uncached:
                assert block in model.uncached, (
                    f"{where()}: allocate() returned {block}; a free block that caches nothing ({sorted(model.uncached)}) "
                    f"must go first: evict a cached block only when no other is free"
                    + (f" (block {block} is owned)" if block in model.owners else ""))
                model.uncached.discard(block)
            else:
                want = model.lru[0]
                assert block == want, (
                    f"{where()}: allocate() returned {block}; with no uncached block free it must evict the least "
                    f"recently freed cached block, {want} (free cached blocks, oldest first: {model.lru})"
                    + (f"; block {block} is in use by {model.owners[block]} owner(s)" if block in model.owners else ""))
                model.lru.pop(0)
                del model.cached[model.key_of(block)]
            model.owners[block] = 1
        elif op == "free" and model.owners:
            block = rng.choice(sorted(model.owners))
            cache.free(block)
            log.append(f"free({block})")
            model.owners[block] -= 1
            if not model.owners[block]:
                del model.owners[block]
                (model.lru.append if model.key_of(block) is not None else model.uncached.add)(block)
        elif op == "fork" and model.owners:
            block = rng.choice(sorted(model.owners))
            cache.fork(block)
            log.append(f"fork({block})")
            model.owners[block] += 1
        elif op == "register" and model.owners:
            block, h = rng.choice(sorted(model.owners)), rng.choice(hashes)
            tokens = [rng.randrange(4) for _ in range(3)]
            cache.register(block, h, tokens)
            log.append(f"register({block}, {h:#x}, {tokens})")
            if h not in model.cached and model.key_of(block) is None:
                model.cached[h] = (block, tuple(tokens))
        elif op in ("lookup", "reuse"):
            if op == "reuse" and model.lru:  # a cached block sitting among the free ones: a hit takes it back
                block = rng.choice(model.lru)
                h = model.key_of(block)
                tokens = list(model.cached[h][1])
            else:
                h = rng.choice(hashes)
                tokens = list(model.cached[h][1]) if h in model.cached and rng.random() < 0.6 else \
                    [rng.randrange(4) for _ in range(3)]
            got = cache.lookup(h, tokens)
            log.append(f"lookup({h:#x}, {tokens}) -> {got}")
            want = model.cached[h][0] if h in model.cached and model.cached[h][1] == tuple(tokens) else None
            assert got == want, (
                f"{where()}: lookup returned {got}; expected {want}" +
                (" (the hash is cached but for other tokens: a collision is a miss)" if want is None and h in model.cached
                 else " (the block was registered and has not been evicted, even if no request owns it now)"
                 if want is not None else " (nothing is cached under this hash)"))
            if got is not None:
                hits += 1
                if op == "reuse" or rng.random() < 0.5:
                    cache.fork(got)
                    log.append(f"fork({got})")
                    if got in model.lru:
                        model.lru.remove(got)
                    model.owners[got] = model.owners.get(got, 0) + 1
        want_free = len(model.uncached) + len(model.lru)
        assert cache.num_free == want_free, (
            f"{where()}: num_free = {cache.num_free}; expected {want_free} (free blocks, cached or not: a hit on a "
            f"free cached block takes it back)")
    return hits


@WEEK.exercise(7, "PrefixCache", section="7 (Prefix caching)")
def check_PrefixCache(PrefixCache) -> None:
    """Random allocate / fork / free / register / lookup against a model of the cache (which block is evicted,
    hits, a collision, reuse of a free cached block), errors; then LLMEngine with it equals generate alone."""
    _, obs = observe(PrefixCache, 4)
    used = sorted(c for c in obs.lib_calls if c.startswith((*ENGINE_MODULES, "lib.paged.BlockAllocator")))
    assert not used, f"PrefixCache(4) runs {used}; write the pool and its cache yourself"
    rng = random.Random(run_seed() + 8)
    hits = sum(_cache_trial(PrefixCache, rng, rng.randint(1, 8), 400, trial) for trial in range(5))
    assert hits > 0, f"no lookup hit in 2000 operations {seed_note()}"
    n = rng.randint(3, 8)  # LRU order, spelled out: every block cached, freed in a random order, one reused
    cache = PrefixCache(n)
    blocks = [cache.allocate() for _ in range(n)]
    keys = [(rng.getrandbits(62), [rng.randrange(100) for _ in range(4)]) for _ in blocks]
    for block, (h, tokens) in zip(blocks, keys):
        cache.register(block, h, tokens)
    order = rng.sample(blocks, n)
    for block in order:
        cache.free(block)
    reused = order[rng.randrange(n)]
    h, tokens = keys[blocks.index(reused)]
    assert cache.lookup(h, tokens) == reused, (f"PrefixCache({n}): block {reused}, registered and then freed, is not "
                                               f"found by lookup: a free cached block stays cached until evicted")
    cache.fork(reused)
    assert cache.num_free == n - 1, f"after fork({reused}) of a free cached block num_free = {cache.num_free}; expected {n - 1}"
    want = [b for b in order if b != reused]
    got = [cache.allocate() for _ in want]
    assert got == want, (f"PrefixCache({n}): every block cached and freed in the order {order}, block {reused} taken "
                         f"back by a hit; allocate() then evicted {got}; expected the least recently freed first: "
                         f"{want} {seed_note()}")
    cache = PrefixCache(3)
    b = cache.allocate()
    cache.free(b)
    _expect_error(lambda: cache.free(b), ValueError, "free() of a free block")
    _expect_error(lambda: cache.fork(b), ValueError, "fork() of a free block that caches nothing")
    for bad in (-1, 3):
        _expect_error(lambda: cache.free(bad), ValueError, f"free({bad}) on a pool of 3 blocks")
    from lib.engine import LLMEngine
    from lib.generate import generate

    g = generator(80)
    model = _context_model(int(torch.randint(0, 1000, (1,), generator=g)))
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


# --- 9: your engine ---------------------------------------------------------------------------------

_PARTS = ("BlockAllocator", "slot_mapping", "paged_attention", "block_hashes", "PrefixCache", "schedule")


def _lib_parts(parts: dict) -> list[str]:
    """How each part that is lib's own (or lib's code under another name) says so: through the isolation the
    child answers; in the notebook's process the code is fingerprinted here."""
    from grader.fingerprint import lib_name
    from grader.isolation import ChildProxy

    found = []
    for name, part in parts.items():
        proxy = getattr(part, "_remote", part)
        if isinstance(proxy, ChildProxy):
            found += proxy._session.reference_use([name]).values()
            continue
        members = [part] + (list(vars(part).values()) + list(part.__mro__[1:]) if isinstance(part, type) else [])
        for member in members:
            code = getattr(getattr(getattr(member, "__func__", member), "__wrapped__", member), "__code__", None)
            module = str(getattr(member, "__module__", "") or "")
            same = "lib" if module.startswith("lib.") else (lib_name(code) if code is not None else None)
            if same is not None:
                found.append(f"`{name}` is lib's own ({same if same != 'lib' else module})")
                break
    return found


def _context_model(seed: int):
    """A tiny model whose next token depends on the context. `tiny_model`'s attention is too weak for that (its
    greedy tokens follow the last token alone: K/V written to the wrong slots would go unseen), so its attention
    projections are scaled up 8x: a prompt whose first 8 of 12 tokens change then changes the output (20 of 20
    random prompts, seed 3)."""
    from lib.model import tiny_model

    model = tiny_model(seed=seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.rsplit(".", 2)[-2] in ("q_proj", "k_proj", "v_proj", "o_proj"):
                p.mul_(8.0)
    return model


def _engine_workload(rng: random.Random, vocab: int, prefix_caching: bool) -> dict:
    """Prompts, new tokens and an engine configuration tight enough to preempt, with a budget small enough to
    chunk (and, for prefix caching, prompts that share a system prompt of whole blocks, some repeated)."""
    bs = rng.choice([2, 4])
    k = rng.randint(5, 7)
    if prefix_caching:
        system = [rng.randrange(vocab) for _ in range(bs * rng.randint(2, 3))]
        prompts = [system + [rng.randrange(vocab) for _ in range(rng.randint(1, 6))] for _ in range(k)]
        prompts[rng.randrange(1, k)] = list(prompts[0])  # the same prompt twice: its whole prefix is cached
    else:
        prompts = [[rng.randrange(vocab) for _ in range(rng.randint(3, 20))] for _ in range(k)]
    new = rng.randint(4, 8)
    longest = max(ref.blocks_needed(len(p) + new - 1, bs) for p in prompts)
    max_seqs = rng.randint(3, 4)
    return dict(prompts=prompts, new=new, kwargs=dict(
        num_blocks=longest + rng.randint(1, 3), block_size=bs, max_num_seqs=max_seqs,
        max_num_batched_tokens=rng.randint(max(max_seqs, 6), 12), enable_chunked_prefill=True,
        enable_prefix_caching=prefix_caching))


@WEEK.exercise(9, "engine", section="8 (The scheduler: preemption and chunked prefill; Your engine)")
def check_engine(BlockAllocator, slot_mapping, paged_attention, block_hashes, PrefixCache, schedule) -> None:
    """LLMEngine built from your parts only — your pool (BlockAllocator, or PrefixCache with prefix caching),
    slot_mapping, paged_attention, block_hashes and schedule — returns what generate returns on each request
    alone, on random workloads that preempt, chunk prefills and (the second) hit the prefix cache."""
    from collections import Counter

    from lib.engine import LLMEngine
    from lib.generate import generate

    parts = dict(zip(_PARTS, (BlockAllocator, slot_mapping, paged_attention, block_hashes, PrefixCache, schedule)))
    used = _lib_parts(parts)
    assert not used, f"your engine runs on lib's parts: {'; '.join(used)}. Plug in your own."
    calls: Counter = Counter()

    def counted(name):
        def call(*args, **kwargs):
            calls[name] += 1
            return parts[name](*args, **kwargs)
        return call

    rng = random.Random(run_seed() + 9)
    model = _context_model(rng.randrange(1000))
    for prefix_caching in (False, True):
        for _ in range(50):  # a workload on which lib's engine preempts and chunks (and hits the prefix cache)
            w = _engine_workload(rng, model.config.vocab_size, prefix_caching)
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

def _step_workload(rng: random.Random) -> dict:
    """Requests queued at once, slots and a budget (chunked prefill on or off), blocks to spare."""
    k = rng.randint(1, 8)
    prompts = [rng.randint(1, 40) for _ in range(k)]
    new = [rng.randint(1, 8) for _ in range(k)]
    seqs = rng.randint(1, 4)
    chunked = rng.random() < 0.7
    budget = (rng.randint(max(seqs, 4), 24) if chunked
              else max(p + n - 1 for p, n in zip(prompts, new)) + rng.randint(0, 8))  # a recompute fits (engine rule)
    return dict(prompt_lens=prompts, new_tokens=new, max_num_seqs=seqs, token_budget=budget, chunked_prefill=chunked)


@WEEK.exercise(11, "predict_steps", section="8 (The scheduler: preemption and chunked prefill; Predicting the step count)")
def check_predict_steps(predict_steps) -> None:
    """Random workloads (lengths, slots, budgets, chunking on and off): the prediction equals the steps LLMEngine
    takes on them (a tiny model, blocks to spare); predicted without lib's engine or a model."""
    from lib.engine import LLMEngine
    from lib.model import tiny_model

    rng = random.Random(run_seed() + 11)
    model = tiny_model(seed=rng.randrange(1000))
    for case in range(12):
        w = _step_workload(rng)
        if case == 0:
            got, obs = observe(predict_steps, **w)
            used = sorted(c for c in obs.lib_calls if c.startswith((*ENGINE_MODULES, "lib.model", "lib.generate")))
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
