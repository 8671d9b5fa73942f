"""Week 18 checks: `pytest weeks/18` (your notebook) or `pytest weeks/18 -k ex02` (one exercise).

Only the notebook's exercise cells are run (no demos, no plots); the checks live in grader/checks/week18.py
and are the same ones the notebook's graded cells call.
"""
from pathlib import Path

import pytest

from grader.checks import week18 as checks
from grader.harness import load_exercises

NOTEBOOK = Path(__file__).with_name(checks.WEEK.notebook)


@pytest.fixture(scope="module")
def ex():
    return load_exercises(NOTEBOOK)


def test_ex01_speculative_generate(ex):
    """Milestone: greedy speculation == target greedy (Markov, tiny Llama, SmolLM2 64 tokens, K in {1, 2, 4, 8}),
    with fewer target calls than tokens."""
    checks.check_speculative_generate(ex.speculative_generate)


def test_ex02_verify(ex):
    """Milestone: speculative sampling has the target's law (chi-square, < 1e-6 false failures)."""
    checks.check_verify(ex.verify)


def test_ex03_acceptance_rate(ex):
    checks.check_acceptance_rate(ex.acceptance_rate)


def test_ex04_expected_tokens_per_call(ex):
    """Milestone: α = 0.7, K = 4 gives 2.77 tokens per call (not the seed's 3.6)."""
    checks.check_expected_tokens_per_call(ex.expected_tokens_per_call)


def test_ex05_predicted_speedup(ex):
    """Milestone: the GPU-like regime (flat verify, c = 0.05) predicts 2.80x for α = 0.8, K = 4."""
    checks.check_predicted_speedup(ex.predicted_speedup)


def test_ex06_answer_q5(ex):
    checks.check_answer_q5(ex.answer_q5)


def test_ex06_answer_q6(ex):
    checks.check_answer_q6(ex.answer_q6)
