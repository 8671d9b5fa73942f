"""Week 18 checks: `pytest weeks/18` (your notebook) or `pytest weeks/18 -k ex02` (one exercise).

Only the notebook's exercise cells are run (no demos, no plots); the checks live in grader/checks/week18.py
and are the same ones the notebook's graded cells call.
"""
from grader.checks import week18 as checks
from grader.fixtures import ex  # noqa: F401  (the fixture: the exercises of the notebook beside this file)


def test_ex01_speculative_generate(ex):
    """Milestone: greedy speculation == target greedy (Markov, tiny Llama, SmolLM2 64 tokens), every forward
    counted however it is called, <= K + 1 tokens per target call, caches rolled back to the output."""
    checks.check_speculative_generate(ex.speculative_generate)


def test_ex02_verify(ex):
    """Milestone: verify's output has the exact law of speculative sampling (per run, < 1e-6 false failures;
    an acceptance probability 2 points off fails with probability > 0.999)."""
    checks.check_verify(ex.verify)


def test_ex03_speculative_sample(ex):
    """Milestone: the sampling loop around verify: counted work, rollback, the target's law at every position of a
    round and the bonus token (K = 4, 8, 1, 2; T = 1, 0.5, 2)."""
    checks.check_speculative_sample(ex.speculative_sample)


def test_ex04_expected_rejections(ex):
    checks.check_expected_rejections(ex.expected_rejections)


def test_ex05_lookup_draft(ex):
    checks.check_lookup_draft(ex.lookup_draft)


def test_ex06_best_k(ex):
    """Derived: the best K and its speedup, for one α or one per draft position (configurations drawn per run)."""
    checks.check_best_k(ex.best_k)


def test_ex07_expected_target_calls(ex):
    """Predicted: the expected target calls of an n-token run at α and K, exactly (configurations drawn per run)."""
    checks.check_expected_target_calls(ex.expected_target_calls)


def test_ex08_batched_speculative_generate(ex):
    """Milestone: the ragged batch — each row equals its own single-row run, no row waits (for a finished row or
    any other), every row rolled back on its own."""
    checks.check_batched_speculative_generate(ex.batched_speculative_generate)


def test_ex09_tree_accept(ex):
    """Derived: one node of a sampled tree — children drawn from q without replacement, tried in drawn order; the
    emitted token's law is p and each child is accepted as often as the rule says (< 1e-6 false failures)."""
    checks.check_tree_accept(ex.tree_accept)
