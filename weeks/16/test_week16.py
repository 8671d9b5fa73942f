"""Week 16 checks: `pytest weeks/16` (your notebook) or `pytest weeks/16 -k ex03` (one exercise).

Only the notebook's exercise cells are run (no demos, no plots); the checks live in grader/checks/week16.py
and are the same ones the notebook's graded cells call.
"""
from grader.checks import week16 as checks
from grader.fixtures import ex  # noqa: F401  (the fixture: the exercises of the notebook beside this file)


def test_ex01_step_flops(ex):
    checks.check_step_flops(ex.step_flops)


def test_ex02_causal_mask(ex):
    checks.check_causal_mask(ex.causal_mask)


def test_ex03_LayerKVCache(ex):
    checks.check_LayerKVCache(ex.LayerKVCache)


def test_ex04_gqa_attention(ex):
    checks.check_gqa_attention(ex.gqa_attention)


def test_ex05_generate(ex):
    """Milestone: cached == uncached on tiny MHA/GQA/MQA models and on SmolLM2 (64 greedy tokens), logits within 1e-4."""
    checks.check_generate(ex.generate)


def test_ex06_kv_cache_bytes(ex):
    """Milestones: OPT-13B 819,200 B/token, GPT-3 4.5 MiB/token, SmolLM2 == the allocated cache."""
    checks.check_kv_cache_bytes(ex.kv_cache_bytes)


def test_ex07_roofline_time(ex):
    checks.check_roofline_time(ex.roofline_time)


def test_ex08_decode_time(ex):
    """Predict: one decode step's time from the model, the cache, the batch, FLOP/s and bandwidth (drawn per run)."""
    checks.check_decode_time(ex.decode_time)


def test_ex09_pool_kv_heads(ex):
    checks.check_pool_kv_heads(ex.pool_kv_heads)


def test_ex10_RollingKVCache(ex):
    """Milestone: rolling cache == full attention under a sliding-window mask, constant memory."""
    checks.check_RollingKVCache(ex.RollingKVCache)


def test_ex11_answer_q1(ex):
    checks.check_answer_q1(ex.answer_q1)


def test_ex12_answer_q3(ex):
    checks.check_answer_q3(ex.answer_q3)
