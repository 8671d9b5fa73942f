"""Week 21 checks: `pytest weeks/21` (your notebook) or `pytest weeks/21 -k ex02` (one exercise).

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
