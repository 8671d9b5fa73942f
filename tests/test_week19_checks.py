"""Each week-19 check accepts lib's reference and rejects the wrong routes a student might take."""
import inspect
import math

import pytest
import torch

from grader.checks import week19 as checks
from lib import engine as ref_engine
from lib import paged as ref
from lib.attention import gqa_attention


def _rejects(check, fn, match: str | None = None):
    with pytest.raises(AssertionError, match=match):
        check(fn)


def test_blocks_needed():
    checks.check_blocks_needed(ref.blocks_needed)
    _rejects(checks.check_blocks_needed, lambda n, b: n // b)  # rounds down
    _rejects(checks.check_blocks_needed, lambda n, b: n // b + 1)  # one too many when the last block is full


def test_slots_wasted():
    checks.check_slots_wasted(ref.slots_wasted)
    _rejects(checks.check_slots_wasted, lambda lengths, b: sum(b - n % b for n in lengths))  # full last block "wasted"
    _rejects(checks.check_slots_wasted, lambda lengths, b: 28)  # the seed's number, constant


class NoRefCounts(ref.BlockAllocator):
    """Ignores fork: a shared block goes back to the pool at its first free."""

    def fork(self, block):
        return block

    def free(self, block):
        self._check(block, "free")
        self.ref_counts[block] = 0
        self._free.append(block)


class NeverReuses:
    """Hands out fresh numbers and forgets freed blocks."""

    def __init__(self, n):
        self.n, self.next, self.owned = n, 0, {}

    @property
    def num_free(self):
        return self.n - len(self.owned)

    def allocate(self):
        block, self.next = self.next, self.next + 1
        self.owned[block] = 1
        return block

    def fork(self, block):
        self.owned[block] += 1

    def free(self, block):
        if block not in self.owned:
            raise ValueError("not allocated")
        self.owned[block] -= 1
        if not self.owned[block]:
            del self.owned[block]


class SilentDoubleFree(ref.BlockAllocator):
    def free(self, block):
        if self.ref_counts[block] == 0:
            return
        super().free(block)


class VagueError(ref.BlockAllocator):
    def allocate(self):
        if not self._free:
            raise RuntimeError("full")
        return super().allocate()


def test_block_allocator():
    checks.check_BlockAllocator(ref.BlockAllocator)
    _rejects(checks.check_BlockAllocator, NoRefCounts, "num_free")
    _rejects(checks.check_BlockAllocator, NeverReuses)
    _rejects(checks.check_BlockAllocator, SilentDoubleFree, "did not raise")
    _rejects(checks.check_BlockAllocator, VagueError, "OutOfBlocksError")


def test_slot_mapping():
    checks.check_slot_mapping(ref.slot_mapping)

    def contiguous(table, start, n, bs):  # assumes the blocks follow one another
        return table[0] * bs + torch.arange(start, start + n)

    def int32(table, start, n, bs):
        return ref.slot_mapping(table, start, n, bs).int()

    _rejects(checks.check_slot_mapping, contiguous)
    _rejects(checks.check_slot_mapping, int32, "dtype")


def _gather_all(k_pool, block_tables):
    """[B, Hkv, max_blocks * block_size, d]: every sequence's keys, contiguous (what paging avoids)."""
    b, width = block_tables.shape
    _, hkv, bs, d = k_pool.shape
    return k_pool[block_tables].permute(0, 2, 1, 3, 4).reshape(b, hkv, width * bs, d)


def gather_then_attend(q, k_pool, v_pool, block_tables, context_lens):
    k, v = _gather_all(k_pool, block_tables), _gather_all(v_pool, block_tables)  # [B, Hkv, L, d]
    b, h, d = q.shape
    rep = h // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)  # [B, H, L, d]
    scores = (q[:, :, None] @ k.transpose(-1, -2))[:, :, 0] / math.sqrt(d)  # [B, H, L]
    mask = torch.arange(k.shape[2])[None, :] < context_lens[:, None]  # [B, L]
    probs = torch.softmax(scores.masked_fill(~mask[:, None], float("-inf")), -1)
    return (probs[:, :, None] @ v)[:, :, 0]


def sdpa_on_materialized(q, k_pool, v_pool, block_tables, context_lens):
    outs = []
    for i, n in enumerate(context_lens.tolist()):
        k = _gather_all(k_pool, block_tables[i:i + 1])[:, :, :n]
        v = _gather_all(v_pool, block_tables[i:i + 1])[:, :, :n]
        rep = q.shape[1] // k.shape[1]
        outs.append(torch.nn.functional.scaled_dot_product_attention(
            q[i:i + 1, :, None], k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1))[0, :, 0])
    return torch.stack(outs)


def calls_lib(q, k_pool, v_pool, block_tables, context_lens):
    return ref.paged_attention(q, k_pool, v_pool, block_tables, context_lens)


def ignores_lengths(q, k_pool, v_pool, block_tables, context_lens):
    lens = torch.full_like(context_lens, 0)
    bs = k_pool.shape[2]
    for i, n in enumerate(context_lens.tolist()):
        lens[i] = ref.blocks_needed(n, bs) * bs  # attends to the empty slots of the last block too
    return ref.paged_attention(q, k_pool, v_pool, block_tables, lens)


def as_student(*fns):
    """lib's functions re-compiled outside lib/ (as a notebook cell would define them); returns the last."""
    namespace = {"math": math, "torch": torch, "__name__": "student"}
    for fn in fns:
        exec(compile("from __future__ import annotations\n" + inspect.getsource(fn), "<student cell>", "exec"),
             namespace)
    return namespace[fns[-1].__name__]


def test_paged_attention():
    checks.check_paged_attention(as_student(ref.blocks_needed, ref.paged_attention))
    _rejects(checks.check_paged_attention, gather_then_attend, "contiguous copy")
    _rejects(checks.check_paged_attention, sdpa_on_materialized)
    _rejects(checks.check_paged_attention, calls_lib, "lib.paged")
    _rejects(checks.check_paged_attention, ignores_lengths, "differs")


def test_block_hashes():
    checks.check_block_hashes(ref_engine.block_hashes)

    def unchained(tokens, bs):  # each block on its own: a hit would not mean the whole prefix matches
        return [hash(tuple(tokens[i * bs:(i + 1) * bs])) for i in range(len(tokens) // bs)]

    def with_partial(tokens, bs):
        return ref_engine.block_hashes(tokens + [0] * (-len(tokens) % bs), bs)

    _rejects(checks.check_block_hashes, unchained, "chain")
    _rejects(checks.check_block_hashes, with_partial, "FULL")


def test_quiz():
    checks.check_answer_q1(lambda: 1 - 28 / 4128)
    _rejects(checks.check_answer_q1, lambda: 0.963)  # the seed's "96.3 % utilization", not this example's
    checks.check_answer_q3(lambda: 1600 / 1100)
    _rejects(checks.check_answer_q3, lambda: 2.5)  # the seed's "2-3x"
    assert math.isclose(ref_engine.simulate_steps([50, 200] * 32, 8, "static") /
                        ref_engine.simulate_steps([50, 200] * 32, 8, "continuous"), 1600 / 1100)
