"""Week 19's wrong routes for every exercise but paged attention (tests/_week19_attention_routes.py holds those):
counting blocks, the allocator, slot mapping, block hashes, the prefix cache, the scheduler and predicting the step
count. Ordinary functions and classes, each giving the right numbers, or would but for the flaw its comment names;
tests/test_week19_checks.py sends their source to an isolated child as a notebook's cells would define them."""

import torch

from lib.batching import blocks as ref_blocks, engine as ref_engine
from lib.batching import paged as ref

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
         VagueError, ForksFreeBlocks, NegativeIds, Int8Counts, contiguous_slots, int32_slots, unchained, with_partial,
         chained_sum, additive_chain, twenty_bits, thirty_two_bits, _flawed_schedule, ignores_budget, last_come_first,
         preempts_oldest, never_chunks, never_preempts, fixed_chunk, admits_while_preempting, credits_blocks,
         slot_per_request, calls_lib_schedule, decode_steps_only, runs_the_engine]
