"""Week 16 checks: `pytest weeks/16` (your notebook) or `pytest weeks/16 -k ex2` (one exercise).

Only the notebook's exercise cells are run (no demos, no plots); the checks live in grader/checks/week16.py
and are the same ones the notebook's graded cells call.
"""
from pathlib import Path

import pytest

from grader.checks import week16 as checks
from grader.harness import load_exercises

NOTEBOOK = Path(__file__).with_name(checks.WEEK.notebook)


@pytest.fixture(scope="module")
def ex():
    return load_exercises(NOTEBOOK)


def test_ex2_causal_mask(ex):
    checks.check_causal_mask(ex.causal_mask)
