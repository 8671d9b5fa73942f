"""Week 21 checks: `pytest weeks/21` (your notebook) or `pytest weeks/21 -k ex03` (one exercise).

Only the notebook's exercise cells are run (no server, no load test); the checks live in grader/checks/week21.py
and are the same ones the notebook's graded cells call.
"""
from grader.checks import week21 as checks
from grader.fixtures import ex  # noqa: F401  (the fixture: the exercises of the notebook beside this file)


def test_ex01_TextStream(ex):
    """Every push's piece equals the rule's, on random byte chunks with split characters and stop strings."""
    checks.check_TextStream(ex.TextStream)


def test_ex02_ServingLoop(ex):
    """Milestone: each request's tokens equal generate on it alone; one engine step per run_once; nothing leaks."""
    checks.check_ServingLoop(ex.ServingLoop)


def test_ex03_predict_ttft(ex):
    """The mean TTFT predicted on random configurations (one slot and many, light to heavy load, past capacity) is
    within a factor of the stated server's simulation, and infinite exactly where the queue grows without bound."""
    checks.check_predict_ttft(ex.predict_ttft)


def test_ex04_e2e_latency(ex):
    """The time of a request's last token from its TTFT, its mean gap between tokens and its token count."""
    checks.check_e2e_latency(ex.e2e_latency)


def test_ex05_cost_per_million_tokens(ex):
    """Dollars per million tokens from a throughput and a machine's hourly price."""
    checks.check_cost_per_million_tokens(ex.cost_per_million_tokens)
