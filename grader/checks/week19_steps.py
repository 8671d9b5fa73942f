"""Week 19's single scheduler steps (below `grader.checks.week19`'s `check_schedule`): steps that need exactly one
preemption, a chunking-off step whose waiting prompt exceeds the budget left, a long prompt chunked by a large budget.
Plain data, no model: each is judged by `week19_sim.judge_plan`."""
from __future__ import annotations

import math
import random

from lib.batching import paged as ref


def amount_step(rng: random.Random, busy: tuple[int, int] | None = None) -> dict:
    """One step in which the oldest running request needs a block and none is free, and preempting the newest
    frees enough for every running request left: exactly one preemption is needed (a scheduler that preempts every
    newer request at once preempts two or more here). 3-5 requests run, or `busy` = (low, high) (a scheduler that
    preempts one more only when many run passed the small steps: the check runs 7-12, 13-64 and 65-256 every run)."""
    bs = rng.choice([1, 2, 4])
    k = rng.randint(*busy) if busy else rng.randint(3, 5)
    running = []
    for i in range(k):  # each at the end of a full block, decoding: one new block each
        blocks = rng.randint(k, k + 3)
        running.append(dict(id=i, computed=blocks * bs, tokens=blocks * bs + 1, blocks=blocks, freeable=blocks,
                            seqs=1))
    waiting = [dict(id=k, computed=0, tokens=rng.randint(1, 10), blocks=0, freeable=0, seqs=1)]
    return dict(running=running, waiting=waiting, free=0, bs=bs, budget=rng.randint(k, k + 24), max_seqs=k + 2)


def unchunked_step(rng: random.Random) -> dict:
    """A step, chunked prefill off, whose waiting prompt is longer than the budget left: it waits. Every run, so that
    `not chunked and n < left` meets both outcomes (FINDINGS5 #31, FINDINGS6 #17: the workloads may miss it)."""
    bs, k = rng.choice([1, 2, 4]), rng.randint(1, 3)
    running = []
    for i in range(k):  # decoding, a block to spare
        computed = rng.randint(1, 12)
        blocks = ref.blocks_needed(computed + 1, bs)
        running.append(dict(id=i, computed=computed, tokens=computed + 1, blocks=blocks, freeable=blocks, seqs=1))
    budget = rng.randint(k + 2, 24)
    waiting = [dict(id=k, computed=0, tokens=budget - k + rng.randint(1, 8), blocks=0, freeable=0, seqs=1)]
    return dict(running=running, waiting=waiting, free=rng.randint(8, 16), bs=bs, budget=budget, max_seqs=k + 2,
                chunked=False)


def long_step(rng: random.Random) -> dict:
    """Chunked prefill on, a waiting prompt of 300-8192 tokens and a budget of 257 to the prompt's length, blocks to
    spare: the chunk is the whole budget (or the prompt). Every run: a cap on a chunk hidden in the code (a constant of
    a few hundred tokens: FINDINGS6 #18) is crossed."""
    bs = rng.choice([1, 2, 4, 16])
    length = int(math.exp(rng.uniform(math.log(300), math.log(8193))))
    waiting = [dict(id=0, computed=0, tokens=length, blocks=0, freeable=0, seqs=1)]
    return dict(running=[], waiting=waiting, free=ref.blocks_needed(length, bs) + rng.randint(0, 4), bs=bs,
                budget=rng.randint(257, length), max_seqs=2, chunked=True)
