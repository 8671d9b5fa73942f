"""Week 19 — continuous batching and PagedAttention: the milestone checks, used by solutions/19/test_week19.py
and the notebook.

One `check_<name>` per exercise; each takes the student's function or class and raises AssertionError with
a message that says what is wrong. The references are in lib/paged.py and lib/engine.py.
"""
from __future__ import annotations

import math
import random

import torch

from grader.checks import assert_close, generator, observe, run_seed, seed_note
from grader.harness import Week
from lib import paged as ref
from lib.attention import gqa_attention

WEEK = Week(19, "week19_paged_batching.ipynb")


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
            elif op == "fork" and owners:
                block = rng.choice(sorted(owners))
                alloc.fork(block)
                log.append(f"fork({block})")
                owners[block] += 1
            elif op == "free" and owners:
                block = rng.choice(sorted(owners))
                alloc.free(block)
                log.append(f"free({block})")
                owners[block] -= 1
                if owners[block] == 0:
                    del owners[block]
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
    """Ragged lengths, block sizes 1, 7 and 16, GQA/MHA/MQA, against contiguous attention (<= 1e-5, fp32); reads
    the pool in place: no lib, no SDPA, no contiguous copy of every sequence's keys and values."""
    g = generator(5)
    for case, (bs, h, hkv) in enumerate([(16, 4, 2), (1, 4, 4), (7, 6, 1), (16, 6, 3)]):
        d, b = 16, 6
        lens = torch.randint(1, 1100, (b,), generator=g)
        lens[0] = int(torch.randint(900, 1100, (1,), generator=g))  # one long sequence
        lens[1] = 1
        lens[2] = bs * int(torch.randint(1, 40, (1,), generator=g))  # one fills its last block exactly
        lens = lens.tolist()
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
        got, obs = observe(paged_attention, q, k_pool, v_pool, block_tables, context_lens)
        what = f"paged_attention case {case}: block_size={bs}, n_heads={h}, n_kv_heads={hkv}, context_lens={lens}"
        assert_close(got, _contiguous_reference(q, k_pool, v_pool, tables, lens), what, atol=1e-5)
        lib_used = sorted(c for c in obs.lib_calls if c.startswith(("lib.paged", "lib.attention", "lib.engine")))
        assert not lib_used, f"{what}: calls {lib_used}; write the attention yourself"
        sdpa = obs.called("aten._scaled_dot_product")
        assert not sdpa, f"{what}: calls {sdpa}; compute the scores and the softmax yourself, block by block"
        gathered = 2 * sum(need[i] * bs for i in range(b)) * hkv * d * 4  # every sequence's K and V, contiguous
        assert obs.peak_bytes < gathered / 2, (
            f"{what}: allocated {obs.peak_bytes} bytes at peak, as much as a contiguous copy of every sequence's "
            f"keys and values ({gathered} bytes). Read the pool a block (or a few) at a time and keep a running "
            f"max and sum (online softmax), as the kernel does; do not gather [B, max_len] K/V.")


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
