"""Week 19 checks: `pytest weeks/19` (your notebook) or `pytest weeks/19 -k ex04` (one exercise).

Only the notebook's exercise cells are run (no demos, no plots); the checks live in grader/checks/week19.py
and are the same ones the notebook's graded cells call.
"""
from grader.checks import week19 as checks
from grader.fixtures import ex  # noqa: F401  (the fixture: the exercises of the notebook beside this file)


def test_ex01_continuous_gain(ex):
    """Predict: the throughput gain of continuous batching for a deep queue, on distributions drawn per run."""
    checks.check_continuous_gain(ex.continuous_gain)


def test_ex02_blocks_needed(ex):
    checks.check_blocks_needed(ex.blocks_needed)


def test_ex03_slots_wasted(ex):
    """Milestone: the seed's 4 requests (2000/100/500/1500 tokens, block 16) waste 28 slots."""
    checks.check_slots_wasted(ex.slots_wasted)


def test_ex04_BlockAllocator(ex):
    """Property test: random allocate / fork / free against a model of the pool."""
    checks.check_BlockAllocator(ex.BlockAllocator)


def test_ex05_slot_mapping(ex):
    checks.check_slot_mapping(ex.slot_mapping)


def test_ex06_paged_attention(ex):
    """Milestone: equal to contiguous attention (<= 1e-5) on ragged lengths, block sizes 1, 7, 16, in place; each
    block of K read once per KV head (GQA and MHA every run)."""
    checks.check_paged_attention(ex.paged_attention)


def test_ex07_block_hashes(ex):
    checks.check_block_hashes(ex.block_hashes)


def test_ex08_PrefixCache(ex):
    """Property test against a model of the cache (eviction order, hits, collisions); LLMEngine with it equals
    generate alone."""
    checks.check_PrefixCache(ex.PrefixCache)


def test_ex09_schedule(ex):
    """Milestone: random workloads judged by the scheduler's invariants (the preemptions' order and amount);
    LLMEngine with it equals generate alone."""
    checks.check_schedule(ex.schedule)


def test_ex10_engine(ex):
    """Milestone: LLMEngine on your parts alone (pool, slot mapping, paged attention, hashes, scheduler) equals
    generate alone on random workloads that preempt, chunk and hit the prefix cache."""
    checks.check_engine(ex.BlockAllocator, ex.slot_mapping, ex.paged_attention, ex.block_hashes, ex.PrefixCache,
                        ex.schedule)


def test_ex11_predict_steps(ex):
    """The predicted step count of random workloads equals the steps LLMEngine takes."""
    checks.check_predict_steps(ex.predict_steps)


def test_ex12_answer_q1(ex):
    checks.check_answer_q1(ex.answer_q1)


def test_ex13_answer_q3(ex):
    checks.check_answer_q3(ex.answer_q3)
