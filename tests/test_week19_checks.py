"""Each week-19 check accepts the solution notebook's code and rejects the wrong routes a student might take,
graded the way `pytest weeks/19` and autograde grade a student: the submission runs in an isolated child process
(grader.isolation) and the check sees it through proxies.

The wrong routes below are ordinary functions and classes of this file; `_child` sends their source to one child
process (as a notebook cell would define them) and the checks get proxies. Each gives the right numbers, or would
but for the flaw named, by a route the exercise forbids; the comment says why it must fail and the `match` the
one-line reason it gets.
"""
import inspect
import json
import math
import textwrap
from pathlib import Path

import pytest
import torch

from grader.checks import week19 as checks
from grader.harness import ReferenceUse, exercise_cells, load_exercises
from grader.isolation import Session
from grader.view import ViewSpec
from lib.batching import blocks as ref_blocks, engine as ref_engine
from lib.batching import paged as ref

NOTEBOOK = Path(__file__).resolve().parent.parent / "solutions" / "19" / checks.WEEK.notebook


# --- counting blocks -----------------------------------------------------------------------------------

def rounds_down(n, b):  # 17 tokens in blocks of 16 need 2 blocks, not 1
    return n // b


def one_too_many(n, b):  # a full last block needs no extra block
    return n // b + 1


def full_block_wasted(lengths, b):  # a length that is a multiple of the block size wastes nothing, not b
    return sum(b - n % b for n in lengths)


def seed_constant(lengths, b):  # the seed's example's number, whatever the input
    return 28


# --- the allocator --------------------------------------------------------------------------------------

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


class ForksFreeBlocks(ref.BlockAllocator):
    """fork() of a free block gives it an owner while it is still on the free list: handed out twice."""

    def fork(self, block):
        if not 0 <= block < self.num_blocks:
            raise ValueError("bad block")
        self.ref_counts[block] += 1
        return block


class NegativeIds(ref.BlockAllocator):
    """Checks `ref_counts[block] == 0` only: free(-1) frees the last block (Python's negative index)."""

    def _check(self, block, what):
        if self.ref_counts[block] == 0:
            raise ValueError(f"cannot {what} block {block}: not allocated")


class Int8Counts(ref.BlockAllocator):
    """Reference counts in an int8 tensor: the 128th owner wraps the count to -128."""

    def __init__(self, n):
        super().__init__(n)
        self.ref_counts = torch.zeros(n, dtype=torch.int8)

    def allocate(self):
        block = super().allocate()
        self.ref_counts[block] = 1
        return block

    def _check(self, block, what):
        if not 0 <= block < self.num_blocks or int(self.ref_counts[block]) <= 0:
            raise ValueError(f"cannot {what} block {block}: not allocated")

    def free(self, block):
        self._check(block, "free")
        self.ref_counts[block] -= 1
        if int(self.ref_counts[block]) == 0:
            self._free.append(block)


# --- slot mapping -------------------------------------------------------------------------------------

def contiguous_slots(table, start, n, bs):  # assumes the blocks follow one another
    return table[0] * bs + torch.arange(start, start + n)


def int32_slots(table, start, n, bs):
    return ref.slot_mapping(table, start, n, bs).int()


# --- paged attention ------------------------------------------------------------------------------------

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


def calls_lib_attention(q, k_pool, v_pool, block_tables, context_lens):
    return ref.paged_attention(q, k_pool, v_pool, block_tables, context_lens)


def ignores_lengths(q, k_pool, v_pool, block_tables, context_lens):  # attends to the last block's empty slots too
    bs = k_pool.shape[2]
    return _solution_like(q, k_pool, v_pool, block_tables, (context_lens + bs - 1) // bs * bs)


WORKSPACE = torch.empty(1 << 22)  # made when the cell runs, before the check observes anything (in the child)


def workspace_gather(q, k_pool, v_pool, block_tables, context_lens):
    """Each sequence's K and V gathered (out=) into a workspace made beforehand: no allocation to see; then a
    softmax over the whole row."""
    b, h, d = q.shape
    _, hkv, bs, _ = k_pool.shape
    outs = []
    for i, n in enumerate(context_lens.tolist()):
        nb = -(-n // bs)
        size = hkv * nb * bs * d
        k, v = WORKSPACE[:size].view(hkv, nb, bs, d), WORKSPACE[size:2 * size].view(hkv, nb, bs, d)
        torch.index_select(k_pool.transpose(0, 1), 1, block_tables[i, :nb], out=k)
        torch.index_select(v_pool.transpose(0, 1), 1, block_tables[i, :nb], out=v)
        kc, vc = k.view(hkv, nb * bs, d)[:, :n], v.view(hkv, nb * bs, d)[:, :n]
        qg = q[i].reshape(hkv, h // hkv, d)
        p = torch.softmax(qg @ kc.transpose(-1, -2) / math.sqrt(d), -1)  # [Hkv, group, n]
        outs.append((p @ vc).reshape(h, d))
    return torch.stack(outs)


def _online_over(q, k, v, n, chunk=32):
    """Online softmax of q [H, d] over contiguous k, v [Hkv, >= n, d], `chunk` keys at a time (GQA by grouping)."""
    h, d = q.shape
    hkv = k.shape[0]
    qg = q.reshape(hkv, h // hkv, d) / math.sqrt(d)
    m = torch.full((hkv, h // hkv), float("-inf"))
    l, acc = torch.zeros(hkv, h // hkv), torch.zeros(hkv, h // hkv, d)
    for s0 in range(0, n, chunk):
        s = qg @ k[:, s0:min(n, s0 + chunk)].transpose(-1, -2)  # [Hkv, group, c]
        m_new = torch.maximum(m, s.amax(-1))
        p, a = torch.exp(s - m_new[..., None]), torch.exp(m - m_new)
        l, acc, m = l * a + p.sum(-1), acc * a[..., None] + p @ v[:, s0:min(n, s0 + chunk)], m_new
    return (acc / l[..., None]).reshape(h, d)


def workspace_online(q, k_pool, v_pool, block_tables, context_lens):
    """Each sequence's K and V gathered (out=) into a workspace made when the cell ran, then an online softmax in
    chunks of 32 over it: no allocation, no long reduction — but the contiguous copy paging avoids."""
    b, h, d = q.shape
    _, hkv, bs, _ = k_pool.shape
    out = torch.empty_like(q)
    for i, n in enumerate(context_lens.tolist()):
        nb = -(-n // bs)
        size = hkv * nb * bs * d
        k, v = WORKSPACE[:size].view(hkv, nb, bs, d), WORKSPACE[size:2 * size].view(hkv, nb, bs, d)
        torch.index_select(k_pool.transpose(0, 1), 1, block_tables[i, :nb], out=k)
        torch.index_select(v_pool.transpose(0, 1), 1, block_tables[i, :nb], out=v)
        out[i] = _online_over(q[i], k.view(hkv, nb * bs, d), v.view(hkv, nb * bs, d), n)
    return out


def workspace_by_block(q, k_pool, v_pool, block_tables, context_lens):
    """The same workspace filled one block at a time (every write is one block, as in the kernel), then read in
    chunks: the copy is still made, just in small pieces."""
    b, h, d = q.shape
    _, hkv, bs, _ = k_pool.shape
    out = torch.empty_like(q)
    for i, n in enumerate(context_lens.tolist()):
        nb = -(-n // bs)
        size = hkv * nb * bs * d
        k, v = WORKSPACE[:size].view(hkv, nb * bs, d), WORKSPACE[size:2 * size].view(hkv, nb * bs, d)
        for j in range(nb):
            k[:, j * bs:(j + 1) * bs].copy_(k_pool[int(block_tables[i, j])])
            v[:, j * bs:(j + 1) * bs].copy_(v_pool[int(block_tables[i, j])])
        out[i] = _online_over(q[i], k, v, n)
    return out


def chunked_gather_full_row(q, k_pool, v_pool, block_tables, context_lens):
    """Blocks read a chunk at a time (nothing big allocated), the scores of the whole row kept, one softmax."""
    b, h, d = q.shape
    _, hkv, bs, _ = k_pool.shape
    out = torch.empty_like(q)
    for i, n in enumerate(context_lens.tolist()):
        qg = q[i].reshape(hkv, h // hkv, d) / math.sqrt(d)
        nb = -(-n // bs)
        scores = torch.cat([qg @ k_pool[int(block_tables[i, j])].transpose(-1, -2) for j in range(nb)], -1)[..., :n]
        p = torch.softmax(scores, -1)  # [Hkv, group, n]
        acc = torch.zeros(hkv, h // hkv, d)
        for j in range(nb):
            pj = p[..., j * bs:min(n, (j + 1) * bs)]
            acc += pj @ v_pool[int(block_tables[i, j])][:, :pj.shape[-1]]
        out[i] = acc.reshape(h, d)
    return out


def _chunks(q, k_pool, block_tables, context_lens):
    """(positions valid [B, c*bs], block ids [B, c]) per chunk of about 32 keys, as the solution walks the tables."""
    bs = k_pool.shape[2]
    per_step = max(1, 32 // bs)
    for j0 in range(0, block_tables.shape[1], per_step):
        j1 = min(j0 + per_step, block_tables.shape[1])
        valid = torch.arange(j0 * bs, j1 * bs, device=q.device)[None, :] < context_lens[:, None]
        yield valid, torch.where(valid[:, ::bs], block_tables[:, j0:j1], 0)


def two_pass_softmax(q, k_pool, v_pool, block_tables, context_lens):
    """Exact, small chunks, no long reduction: a first pass over the blocks for the row's max, a second that
    computes the scores again for the exponentials — K read twice."""
    b, h, d = q.shape
    _, hkv, bs, _ = k_pool.shape
    qg = q.reshape(b, hkv, h // hkv, d) / math.sqrt(d)

    def scores(valid, ids):
        kb = k_pool[ids].permute(0, 2, 1, 3, 4).reshape(b, hkv, -1, d)
        return (qg @ kb.transpose(-1, -2)).masked_fill(~valid[:, None, None, :], float("-inf"))

    m = torch.full((b, hkv, h // hkv), float("-inf"))
    for valid, ids in _chunks(q, k_pool, block_tables, context_lens):
        m = torch.maximum(m, scores(valid, ids).amax(-1))
    l, acc = torch.zeros(b, hkv, h // hkv), torch.zeros(b, hkv, h // hkv, d)
    for valid, ids in _chunks(q, k_pool, block_tables, context_lens):
        p = torch.exp(scores(valid, ids) - m[..., None])
        l = l + p.sum(-1)
        acc = acc + p @ v_pool[ids].permute(0, 2, 1, 3, 4).reshape(b, hkv, -1, d)
    return (acc / l[..., None]).reshape(b, h, d)


def per_query_head_online(q, k_pool, v_pool, block_tables, context_lens):
    """One pass per query head (vLLM's first kernel did this): each block of K read once for every query head of its
    GQA group, where the group shares it (issue 54: read once per KV head)."""
    b, h, d = q.shape
    _, hkv, bs, _ = k_pool.shape
    out = torch.empty_like(q)
    for j in range(h):
        kv = j // (h // hkv)
        dev = q.device
        m, l, acc = torch.full((b,), float("-inf"), device=dev), torch.zeros(b, device=dev), torch.zeros(b, d, device=dev)
        for valid, ids in _chunks(q, k_pool, block_tables, context_lens):
            kb = k_pool[ids, kv].reshape(b, -1, d)  # [B, c*bs, d]
            s = (kb @ q[:, j, :, None])[..., 0].masked_fill(~valid, float("-inf")) / math.sqrt(d)
            m_new = torch.maximum(m, s.amax(-1))
            safe = torch.where(torch.isinf(m_new), 0.0, m_new)
            p, a = torch.exp(s - safe[:, None]), torch.exp(m - safe)
            l, acc, m = l * a + p.sum(-1), acc * a[:, None] + (p[:, None] @ v_pool[ids, kv].reshape(b, -1, d))[:, 0], m_new
        out[:, j] = acc / l[:, None]
    return out


def per_head_full_row(q, k_pool, v_pool, block_tables, context_lens):
    """Per sequence and head: the head's keys gathered, a softmax over the full row."""
    b, h, d = q.shape
    _, hkv, bs, _ = k_pool.shape
    out = torch.empty_like(q)
    for i, n in enumerate(context_lens.tolist()):
        ids = block_tables[i, :-(-n // bs)]
        for j in range(h):
            kv = j // (h // hkv)
            k = k_pool[ids, kv].reshape(-1, d)[:n]
            v = v_pool[ids, kv].reshape(-1, d)[:n]
            out[i, j] = torch.softmax(k @ q[i, j] / math.sqrt(d), 0) @ v
    return out


def per_sequence_all_heads(q, k_pool, v_pool, block_tables, context_lens):
    """The most natural wrong route: one sequence at a time, all its K and V gathered, online softmax in chunks."""
    b, h, d = q.shape
    _, hkv, bs, _ = k_pool.shape
    out = torch.empty_like(q)
    for i, n in enumerate(context_lens.tolist()):
        ids = block_tables[i, :-(-n // bs)]
        k = k_pool[ids].transpose(0, 1).reshape(hkv, -1, d)[:, :n].repeat_interleave(h // hkv, 0)  # [H, n, d]
        v = v_pool[ids].transpose(0, 1).reshape(hkv, -1, d)[:, :n].repeat_interleave(h // hkv, 0)
        m = torch.full((h,), float("-inf"))
        l, acc = torch.zeros(h), torch.zeros(h, d)
        for s0 in range(0, n, 32):
            s = (k[:, s0:s0 + 32] @ q[i][:, :, None])[..., 0] / math.sqrt(d)
            m_new = torch.maximum(m, s.amax(-1))
            p, a = torch.exp(s - m_new[:, None]), torch.exp(m - m_new)
            l, acc, m = l * a + p.sum(-1), acc * a[:, None] + (p[:, None] @ v[:, s0:s0 + 32])[:, 0], m_new
        out[i] = acc / l[:, None]
    return out


def _solution_like(q, k_pool, v_pool, block_tables, context_lens, scale=None, device=True, chunk=32):
    """The solution's online softmax, with the flaw a wrong route below asks for."""
    b, h, d = q.shape
    _, hkv, bs, _ = k_pool.shape
    group = h // hkv
    dev = q.device if device else None
    per_step = max(1, chunk // bs)
    qg = q.reshape(b, hkv, group, d).float() * (scale if scale is not None else d ** -0.5)
    m = torch.full((b, hkv, group), float("-inf"), device=dev)
    l = torch.zeros(b, hkv, group, device=dev)
    acc = torch.zeros(b, hkv, group, d, device=dev)
    for j0 in range(0, block_tables.shape[1], per_step):
        j1 = min(j0 + per_step, block_tables.shape[1])
        pos = torch.arange(j0 * bs, j1 * bs, device=q.device)
        valid = pos[None, :] < context_lens[:, None]
        ids = torch.where(valid[:, ::bs], block_tables[:, j0:j1], 0)
        kb = k_pool[ids].permute(0, 2, 1, 3, 4).reshape(b, hkv, -1, d).float()
        vb = v_pool[ids].permute(0, 2, 1, 3, 4).reshape(b, hkv, -1, d).float()
        s = (qg @ kb.transpose(-1, -2)).masked_fill(~valid[:, None, None, :], float("-inf"))
        m_new = torch.maximum(m, s.amax(-1))
        m_safe = torch.where(torch.isinf(m_new), 0.0, m_new)
        p = torch.exp(s - m_safe[..., None])
        alpha = torch.exp(m - m_safe)
        l = l * alpha + p.sum(-1)
        acc = acc * alpha[..., None] + p @ vb
        m = m_new
    return (acc / l[..., None]).reshape(b, h, d).to(q.dtype)


def scale_quarter(q, k_pool, v_pool, block_tables, context_lens):  # 1/sqrt(16): right only for head_dim 16
    return _solution_like(q, k_pool, v_pool, block_tables, context_lens, scale=0.25)


def no_device(q, k_pool, v_pool, block_tables, context_lens):  # m, l, acc on the CPU whatever q's device
    return _solution_like(q, k_pool, v_pool, block_tables, context_lens, device=False)


def scales_pool_in_place(q, k_pool, v_pool, block_tables, context_lens):  # corrupts the cache for later steps
    k_pool.mul_(q.shape[-1] ** -0.5)
    return _solution_like(q, k_pool, v_pool, block_tables, context_lens, scale=1.0)


def numpy_route(q, k_pool, v_pool, block_tables, context_lens):  # .numpy() fails on CUDA tensors
    import numpy as np

    qn, kn, vn = q.numpy(), k_pool.numpy(), v_pool.numpy()
    b, h, d = qn.shape
    _, hkv, bs, _ = kn.shape
    out = np.zeros_like(qn)
    for i, n in enumerate(context_lens.tolist()):
        ids = block_tables[i, :-(-n // bs)].numpy()
        for j in range(h):
            k = kn[ids, j // (h // hkv)].reshape(-1, d)[:n]
            v = vn[ids, j // (h // hkv)].reshape(-1, d)[:n]
            s = k @ qn[i, j] / math.sqrt(d)
            p = np.exp(s - s.max())
            out[i, j] = (p / p.sum()) @ v
    return torch.from_numpy(out)


def numpy_per_head_decoy_exp(q, k_pool, v_pool, block_tables, context_lens):
    """The numpy route with a torch.exp beside it for the check that wants an exponential seen: torch allocates
    nothing and reads no block of the pool."""
    torch.exp(torch.zeros(1, device=q.device))
    return numpy_route(q, k_pool, v_pool, block_tables, context_lens)


def sdpa_popped(q, k_pool, v_pool, block_tables, context_lens):
    """SDPA after taking every dispatch mode (the observer's) off the stack, put back afterwards."""
    from torch.utils import _python_dispatch as pd

    modes = []
    while torch._C._len_torch_dispatch_stack() > 0:
        modes.append(pd._pop_mode())
    try:
        return sdpa_on_materialized(q, k_pool, v_pool, block_tables, context_lens)
    finally:
        for mode in reversed(modes):
            pd._push_mode(mode)


# --- block hashes ---------------------------------------------------------------------------------------

def unchained(tokens, bs):  # each block on its own: a hit would not mean the whole prefix matches
    return [hash(tuple(tokens[i * bs:(i + 1) * bs])) for i in range(len(tokens) // bs)]


def with_partial(tokens, bs):  # hashes a partly filled last block too
    return ref_blocks.block_hashes(tokens + [0] * (-len(tokens) % bs), bs)


def chained_sum(tokens, bs):  # chained over each block's sum: permuted or compensating blocks collide
    out, h = [], None
    for i in range(len(tokens) // bs):
        h = hash((h, sum(tokens[i * bs:(i + 1) * bs])))
        out.append(h)
    return out


def additive_chain(tokens, bs):  # h_i = h_{i-1} + hash(block): blind to the order of the blocks
    out, h = [], 0
    for i in range(len(tokens) // bs):
        h = (h + hash(tuple(tokens[i * bs:(i + 1) * bs]))) % (1 << 61)
        out.append(h)
    return out


def twenty_bits(tokens, bs):  # truncated: 8000 prefixes collide about 30 times
    return [h & 0xFFFFF for h in ref_blocks.block_hashes(tokens, bs)]


def thirty_two_bits(tokens, bs):  # truncated: 8000 prefixes collide with probability 0.0074, a real cache surely
    return [h & 0xFFFFFFFF for h in ref_blocks.block_hashes(tokens, bs)]


# --- the prefix cache ------------------------------------------------------------------------------------

# Subclasses of the solution notebook's PrefixCache (its cell runs in the child first), each with one flaw.
PREFIX_CACHE_ROUTES = """
class EvictsInUse(PrefixCache):  # keeps every cached block in LRU order, owned or not: evicts one in use
    def allocate(self):
        if not self.plain and self.entry:
            block = next(iter(self.entry))
            del self.by_hash[self.entry.pop(block)[0]]
            self.stale.pop(block, None)
            self.owners[block] = 1
            return block
        return super().allocate()


class EvictsNewest(PrefixCache):  # evicts the most recently freed cached block, not the least
    def allocate(self):
        if not self.plain and self.stale:
            self.stale.move_to_end(next(reversed(self.stale)), last=False)
        return super().allocate()


class EvictsBeforeUncached(PrefixCache):  # evicts a cached block while blocks that cache nothing are free
    def allocate(self):
        if self.stale:
            keep, self.plain = self.plain, []
            try:
                return super().allocate()
            finally:
                self.plain = keep
        return super().allocate()


class NoTokenCompare(PrefixCache):  # trusts the hash: a collision serves another prompt's keys and values
    def lookup(self, block_hash, tokens):
        return self.by_hash.get(block_hash)


class ForksUncounted(PrefixCache):  # a hit takes a free cached block back, but a fork of an owned one adds no owner
    def fork(self, block):
        if self.owners[block] > 0:
            self.owners[block] = 1
            return
        super().fork(block)


class ForgetsOnFree(PrefixCache):  # drops a block's hash when its last owner frees it: nothing reused once free
    def free(self, block):
        super().free(block)
        if self.owners[block] == 0 and block in self.entry:
            del self.by_hash[self.entry.pop(block)[0]]
            del self.stale[block]
            self.plain.append(block)
"""


# --- the scheduler --------------------------------------------------------------------------------------

def _flawed_schedule(flaw, running, waiting, free_blocks, block_size, token_budget, max_num_seqs, chunked_prefill):
    """A correct scheduler but for `flaw`; blocks counted without lib (check_engine rejects lib code it observes)."""
    def more(req, n):
        return max(0, -(-(req["computed"] + n) // block_size) - req["blocks"])

    plan = {"preempt": [], "run": []}
    budget, free = token_budget, free_blocks
    queue = list(running)
    k = 0
    while k < len(queue) and (budget > 0 or flaw == "budget"):
        req = queue[k]
        left = req["tokens"] - req["computed"]
        n = left if flaw == "budget" else min(left, budget)
        if flaw == "fixed_chunk":
            n = min(n, 2)
        while more(req, n) > free and queue[-1] is not req and flaw != "never_preempts":
            victim = queue.pop(k + 1 if flaw == "oldest" and k + 1 < len(queue) else -1)
            plan["preempt"].append(victim["id"])
            free += victim["blocks" if flaw == "credits_blocks" else "freeable"]
        if more(req, n) > free and flaw != "never_preempts":
            queue.pop(k)
            plan["preempt"].append(req["id"])
            break
        plan["run"].append([req["id"], n])
        free -= more(req, n)
        budget -= n
        k += 1
    if plan["preempt"] and flaw != "admits_while_preempting":
        return plan
    slots = max_num_seqs - sum(1 if flaw == "slot_per_request" else r["seqs"] for r in queue)
    for req in (waiting[::-1] if flaw == "lcfs" else waiting):
        left = req["tokens"] - req["computed"]
        n = left if flaw == "budget" else min(left, budget)
        if flaw == "fixed_chunk":
            n = min(n, 2)
        seqs = 1 if flaw == "slot_per_request" else req["seqs"]
        if (budget <= 0 and flaw != "budget") or seqs > slots or more(req, n) > free and flaw != "never_preempts":
            break
        if n < left and (not chunked_prefill or flaw == "never_chunks"):
            break
        plan["run"].append([req["id"], n])
        free -= more(req, n)
        budget -= n
        slots -= seqs
    return plan


def ignores_budget(*args):  # runs every prompt whole
    return _flawed_schedule("budget", *args)


def last_come_first(*args):  # admits the newest arrival first
    return _flawed_schedule("lcfs", *args)


def preempts_oldest(*args):  # frees the blocks of the request that holds the most work
    return _flawed_schedule("oldest", *args)


def never_chunks(*args):  # a prompt longer than the budget left waits, though chunked prefill is on
    return _flawed_schedule("never_chunks", *args)


def never_preempts(*args):  # hands out blocks that are not free
    return _flawed_schedule("never_preempts", *args)


def fixed_chunk(*args):  # 2 tokens per prefill step, whatever the budget
    return _flawed_schedule("fixed_chunk", *args)


def credits_blocks(*args):  # counts a victim's every block as freed, shared ones (prefix cache) included
    return _flawed_schedule("credits_blocks", *args)


def admits_while_preempting(*args):  # a later arrival overtakes the request preempted in the same step
    return _flawed_schedule("admits_while_preempting", *args)


def slot_per_request(*args):  # a parallel-sampling request (n > 1) counted as one slot
    return _flawed_schedule("slot_per_request", *args)


def calls_lib_schedule(*args):
    return ref_engine.schedule(*args)


# --- predicting the step count --------------------------------------------------------------------------

def decode_steps_only(prompt_lens, new_tokens, max_num_seqs, token_budget, chunked_prefill=True):
    """Section 1's model as it stands: one step per token on `max_num_seqs` slots, prefill left out."""
    queue, running, steps = list(new_tokens), [], 0
    while queue or running:
        while queue and len(running) < max_num_seqs:
            running.append(queue.pop(0))
        running = [n - 1 for n in running if n > 1]
        steps += 1
    return steps


def runs_the_engine(prompt_lens, new_tokens, max_num_seqs, token_budget, chunked_prefill=True):
    """Measures instead of predicting: lib's engine on a tiny model."""
    from lib.batching.engine import LLMEngine
    from lib.modeling.llama import tiny_model

    engine = LLMEngine(tiny_model(), num_blocks=sum(prompt_lens) + sum(new_tokens), block_size=1,
                       max_num_seqs=max_num_seqs, max_num_batched_tokens=token_budget,
                       enable_chunked_prefill=chunked_prefill)
    for p, n in zip(prompt_lens, new_tokens):
        engine.add_request([1] * p, n)
    while engine.has_unfinished():
        engine.step()
    return len(engine.trace)


WRONG = [rounds_down, one_too_many, full_block_wasted, seed_constant, NoRefCounts, NeverReuses, SilentDoubleFree,
         VagueError, ForksFreeBlocks, NegativeIds, Int8Counts, contiguous_slots, int32_slots, _gather_all,
         gather_then_attend, sdpa_on_materialized, calls_lib_attention, ignores_lengths, workspace_gather,
         _online_over, workspace_online, workspace_by_block, chunked_gather_full_row, _chunks, two_pass_softmax,
         per_query_head_online,
         per_head_full_row, per_sequence_all_heads, _solution_like, numpy_per_head_decoy_exp, scale_quarter, no_device,
         scales_pool_in_place,
         numpy_route, sdpa_popped, unchained, with_partial, chained_sum, additive_chain, twenty_bits, thirty_two_bits,
         _flawed_schedule, ignores_budget, last_come_first, preempts_oldest, never_chunks, never_preempts,
         fixed_chunk, admits_while_preempting, credits_blocks, slot_per_request, calls_lib_schedule, decode_steps_only,
         runs_the_engine]

HEADER = """
import math
import torch
from lib.batching import blocks as ref_blocks, engine as ref_engine
from lib.batching import paged as ref
"""
# lib's own schedule, exec'd under another name: the child's audit hook refuses to compile a copy of the answer key,
# so its cell (a cell of its own) raises, naming lib's function
LIB_COPY = """
import inspect as _inspect
from lib.batching.paged import blocks_needed
exec(compile(_inspect.getsource(ref_engine.schedule).replace("def schedule(", "def lib_copy_schedule("),
             "<student cell>", "exec"))
"""


@pytest.fixture(scope="module")
def child(tmp_path_factory):
    """The wrong routes, defined in an isolated child process as a notebook's cells would define them."""
    cells = {gid: src for _, gid, src in exercise_cells(json.loads(NOTEBOOK.read_text()))}
    source = HEADER + "\nWORKSPACE = torch.empty(1 << 22)\n\n" + "\n\n".join(
        textwrap.dedent(inspect.getsource(c)) for c in WRONG)
    source += "\n".join(["\nfrom collections import OrderedDict", cells["BlockAllocator"], cells["PrefixCache"], PREFIX_CACHE_ROUTES])
    # Most routes are lib's parts with one thing broken: they need lib whole, as on a machine without Landlock's
    # read restriction (grader.view); what the week's view does to them is tests/test_integrity.py's subject.
    # Each route must be rejected by its own rule, not by the per-call time limit: a slow one (a whole-row route
    # took 36 s quiet) ran past 60 s on a loaded 2-core machine and was stopped instead.
    session = Session(tmp_path_factory.mktemp("nb") / "week19_wrong_routes.ipynb", view=ViewSpec.everything(19),
                      call_timeout=300)
    session.load([(0, None, source), (1, None, HEADER + LIB_COPY)])
    yield session
    session.close()


@pytest.fixture(scope="module")
def ex():
    """The solution notebook's code, isolated as a student's is: what each check must accept."""
    exercises = load_exercises(NOTEBOOK, isolated=True)
    yield exercises
    exercises.close()


def _rejects(child, check, name, match):
    with pytest.raises(AssertionError, match=match):
        check(child.get(name))


def test_blocks_needed(ex, child):
    checks.check_blocks_needed(ex.blocks_needed)
    _rejects(child, checks.check_blocks_needed, "rounds_down", "round up")
    _rejects(child, checks.check_blocks_needed, "one_too_many", "expected")


def test_slots_wasted(ex, child):
    checks.check_slots_wasted(ex.slots_wasted)
    _rejects(child, checks.check_slots_wasted, "full_block_wasted", "expected 28")
    _rejects(child, checks.check_slots_wasted, "seed_constant", "last block")


@pytest.mark.parametrize("name, match", [
    ("NoRefCounts", "num_free|ref_count"),
    ("NeverReuses", "returned|KeyError|did not raise|ref_count"),  # numbers past the pool, never runs out, no ref_count
    ("SilentDoubleFree", "did not raise"),
    ("VagueError", "OutOfBlocksError"),
    ("ForksFreeBlocks", r"fork\(\d+\) of a free block"),
    ("NegativeIds", r"\(-1\) on a pool"),
    ("Int8Counts", "owners"),
])
def test_block_allocator_wrong_routes(child, name, match):
    _rejects(child, checks.check_BlockAllocator, name, match)


def test_block_allocator_accepts_the_solution(ex):
    checks.check_BlockAllocator(ex.BlockAllocator)


def test_slot_mapping(ex, child):
    checks.check_slot_mapping(ex.slot_mapping)
    _rejects(child, checks.check_slot_mapping, "contiguous_slots", "differs")
    _rejects(child, checks.check_slot_mapping, "int32_slots", "dtype")


def test_paged_attention_accepts_the_solution(ex):
    checks.check_paged_attention(ex.paged_attention)


@pytest.mark.parametrize("name, match", [
    ("gather_then_attend", "contiguous copy of the longest"),
    ("sdpa_on_materialized", "_scaled_dot_product"),
    ("calls_lib_attention", "lib.batching.paged"),
    ("ignores_lengths", "differs"),
    ("workspace_gather", "combined .* elements|buffers made before the call"),  # out= into a pre-made buffer
    ("workspace_online", "buffers made before the call"),  # the same, then an online softmax: only the writes show
    ("workspace_by_block", "buffers made before the call"),  # filled block by block: still the whole sequence
    ("chunked_gather_full_row", "combined .* elements|contiguous copy of the longest"),  # whole-row softmax; or its scores pass the memory bound
    ("per_head_full_row", "combined .* elements|contiguous copy of the longest"),
    ("per_sequence_all_heads", "contiguous copy of the longest"),  # deterministic: the longest is >= 1500 keys
    ("scale_quarter", "differs"),  # head_dim varies: 0.25 is right for 16 only
    ("no_device", "mixed in a CPU tensor"),
    ("scales_pool_in_place", "changed argument|changed its arguments"),  # k_pool scaled: later steps read it
    ("numpy_route", "no exponential"),
    ("numpy_per_head_decoy_exp", "read by torch ops 0.00 times"),
    ("sdpa_popped", "no exponential"),
    ("two_pass_softmax", "median full block of K was read 2.0 times"),  # every case
    ("per_query_head_online", "not once per query head"),  # the GQA cases: K read once per query head of a group
])
def test_paged_attention_wrong_routes(child, name, match):
    _rejects(child, checks.check_paged_attention, name, match)


def test_observe_counts_reads_of_an_argument():
    """Observation.reads_of: views read nothing, a gather reads what it gathers, any other op each element once."""
    from grader.checks import observe

    pool = torch.randn(6, 4, 8)
    q = torch.randn(8)

    def once(pool):
        return (pool[torch.tensor([1, 3])] @ q).sum() + (pool[4] @ q).sum()  # blocks 1, 3 gathered, 4 by a view

    def twice(pool):
        first = (pool[torch.tensor([1, 3])] @ q).amax()
        return first + torch.exp(pool[torch.tensor([1, 3])] @ q).sum()

    def expanded(pool):  # broadcasting a view to 5 copies reads its elements once
        return (pool[2].unsqueeze(0).expand(5, 4, 8) * 2).sum()

    assert observe(once, pool, _observe_reads=(0,))[1].reads_of(0) == [0, 1, 0, 1, 1, 0]
    assert observe(twice, pool, _observe_reads=(0,))[1].reads_of(0) == [0, 2, 0, 2, 0, 0]
    assert observe(expanded, pool, _observe_reads=(0,))[1].reads_of(0) == [0, 0, 1, 0, 0, 0]
    assert observe(once, pool)[1].reads_of(0) == []  # not asked for


def test_observe_counts_writes_into_premade_buffers():
    """Observation.premade_bytes: the high-water mark of what a call wrote into buffers made before it (not its
    arguments, not what it allocated, not torch.tensor's data)."""
    from grader.checks import observe

    buffer = torch.zeros(1000)
    x = torch.randn(10, 8)

    def out_into_buffer(x):
        torch.mul(x, 2, out=buffer[40:120].view(10, 8))  # elements 40..119: 480 bytes from the buffer's start
        return buffer[40:120].sum()

    def fresh_only(x):
        y = torch.empty(10, 8)
        y.copy_(x)
        z = torch.tensor([0.0])
        z.add_(1)
        return y.sum() + z

    def into_argument(x):
        x.mul_(1)
        return x

    assert observe(out_into_buffer, x)[1].premade_bytes == 120 * 4
    assert observe(fresh_only, x)[1].premade_bytes == 0
    _, obs = observe(into_argument, x)
    assert obs.premade_bytes == 0 and obs.inputs_written == 1


def test_paged_attention_in_place_scaling_rejected_in_process():
    """Tensor arguments changed in place, where the check and the code share a process (the notebook's graded
    cell): the check compares every argument with its clone. Through the isolation the child makes the same
    comparison (grader.isolation's ArgumentChanged): test_paged_attention_wrong_routes[scales_pool_in_place]."""
    with pytest.raises(AssertionError, match="changed its arguments"):
        checks.check_paged_attention(scales_pool_in_place)


def test_block_hashes(ex, child):
    checks.check_block_hashes(ex.block_hashes)
    checks.check_block_hashes(ref_blocks.block_hashes)  # sha256-based: the property check takes any good hash
    _rejects(child, checks.check_block_hashes, "unchained", "chain")
    _rejects(child, checks.check_block_hashes, "with_partial", "FULL")
    _rejects(child, checks.check_block_hashes, "chained_sum", "not their sum")
    _rejects(child, checks.check_block_hashes, "additive_chain", "order of the blocks")
    _rejects(child, checks.check_block_hashes, "twenty_bits", "too few bits")
    _rejects(child, checks.check_block_hashes, "thirty_two_bits", "bits: a hash kept to 32 bits")


def test_prefix_cache_accepts_the_solution(ex):
    checks.check_PrefixCache(ex.PrefixCache)


@pytest.mark.parametrize("name, match", [
    ("EvictsInUse", "in use|least recently freed"),  # evicts an owned block, or the wrong free one
    ("EvictsNewest", "least recently freed"),
    ("EvictsBeforeUncached", "must go first"),
    ("NoTokenCompare", "collision is a miss"),
    ("ForgetsOnFree", "has not been evicted|must go first|least recently freed"),  # the model still has it cached
    ("ForksUncounted", "ref_count"),
])
def test_prefix_cache_wrong_routes(child, name, match):
    _rejects(child, checks.check_PrefixCache, name, match)


def test_schedule_accepts_the_solution(ex):
    checks.check_schedule(ex.schedule)


@pytest.mark.parametrize("name, match", [
    ("ignores_budget", "token budget|leaves it waiting"),  # over the budget, or (whole prompts only) admits too few
    ("last_come_first", "first come first served"),
    ("preempts_oldest", "most recently admitted"),
    ("never_chunks", "leaves it waiting"),
    ("never_preempts", "new blocks"),
    ("fixed_chunk", "cut by the budget only"),
    ("admits_while_preempting", "admits nobody"),
    ("credits_blocks", "freeable blocks"),  # only the shared-block steps catch it
    ("slot_per_request", "sequences; max_num_seqs is"),
    ("calls_lib_schedule", "lib.batching.engine.schedule"),
    ("lib_copy_schedule", "lib.batching.engine.schedule"),
])
def test_schedule_wrong_routes(child, name, match):
    _rejects(child, checks.check_schedule, name, match)


def test_engine_accepts_the_solution(ex):
    checks.check_engine(*(getattr(ex, name) for name in checks._PARTS))


@pytest.mark.parametrize("part, name, match", [
    ("slot_mapping", "contiguous_slots", "not what generate gives|slot_mapping.* expected"),  # keys land elsewhere
    ("paged_attention", "ignores_lengths", "not what generate gives"),  # attends to empty slots of the last block
    ("BlockAllocator", "NeverReuses", "ref_count|not what generate gives|Error"),  # no ref_count; blocks past the pool
    ("schedule", "never_preempts", "more blocks than|not what generate gives"),
    ("paged_attention", "scales_pool_in_place", "changed argument"),  # the engine's pool, scaled at every decode
])
def test_engine_wrong_parts(ex, child, part, name, match):
    """One part of the solution's engine replaced by a wrong route (through the isolated path): the engine's
    output differs from generate's, or the engine trips over the part."""
    parts = [child.get(name) if p == part else getattr(ex, p) for p in checks._PARTS]
    with pytest.raises(AssertionError, match=match):
        checks.check_engine(*parts)


def test_predict_steps_accepts_the_solution(ex):
    checks.check_predict_steps(ex.predict_steps)


@pytest.mark.parametrize("name, match", [
    ("decode_steps_only", "LLMEngine took"),
    ("runs_the_engine", "without running the engine"),
])
def test_predict_steps_wrong_routes(child, name, match):
    _rejects(child, checks.check_predict_steps, name, match)


def test_lib_reference_is_reported(tmp_path, ex):
    """Behind the week's view (lib readable, as without Landlock): lib's code under the exercise's own name, exec'd
    from lib's source (another file name): ReferenceUse for ex04 (a class whose short methods are lib's bytecode), and
    for ex06 (a function, a copy by its statements) the child refuses to compile it, the cell's error naming lib's
    code; lib's PrefixCache subclassed for ex08; the engine of ex10 on lib's parts; through the isolated path."""
    copy = HEADER + """
import inspect as _inspect
from lib.batching.paged import blocks_needed, OutOfBlocksError
exec(compile(_inspect.getsource(ref.{name}), "<student cell>", "exec"))
"""
    source = HEADER + """
PrefixCache = type("PrefixCache", (ref_blocks.PrefixCache,), {})  # lib's, under the exercise's name
"""
    session = Session(tmp_path / "week19_lib_copy.ipynb", view=ViewSpec.everything(19))  # behind the view
    try:
        session.load([(0, None, copy.format(name="BlockAllocator")), (1, None, copy.format(name="paged_attention")),
                      (2, None, source)])
        # (its methods are short: no one is a copy by statements, but their bytecode is lib's)
        with pytest.raises(ReferenceUse, match=r"is lib's own code \(lib.batching.paged.BlockAllocator"):
            checks.check_BlockAllocator(session.get("BlockAllocator"))
        with pytest.raises(AssertionError, match=r"is a copy of lib's lib.batching.paged.paged_attention.*does not compile"):
            checks.check_paged_attention(session.get("paged_attention"))
        with pytest.raises(AssertionError, match="lib.batching.blocks.PrefixCache"):
            checks.check_PrefixCache(session.get("PrefixCache"))
        parts = [session.get(p) if p in ("BlockAllocator", "PrefixCache") else getattr(ex, p) for p in checks._PARTS]
        with pytest.raises(AssertionError, match="runs on lib's parts: `BlockAllocator`.*PrefixCache"):
            checks.check_engine(*parts)
    finally:
        session.close()


def test_quiz():
    checks.check_answer_q1(lambda: 1 - 28 / 4128)
    with pytest.raises(AssertionError):
        checks.check_answer_q1(lambda: 0.963)  # the seed's "96.3 % utilization", not this example's
    checks.check_answer_q3(lambda: 1600 / 1100)
    with pytest.raises(AssertionError):
        checks.check_answer_q3(lambda: 2.5)  # the seed's "2-3x"
    assert math.isclose(ref_engine.simulate_steps([50, 200] * 32, 8, "static") /
                        ref_engine.simulate_steps([50, 200] * 32, 8, "continuous"), 1600 / 1100)
