"""The pytest fixture every week's test file shares, so that `test_weekNN.py` holds only its tests:

    from grader.checks import week16 as checks
    from grader.fixtures import ex  # noqa: F401  (the fixture)

    def test_ex02_causal_mask(ex):
        checks.check_causal_mask(ex.causal_mask)

`ex` is `load_exercises` of the notebook beside the test file (`grader.checks.weekNN.WEEK.notebook`, with NN
from the file's name), loaded once per test file. Imported, not put in a conftest, so it also works where a
week's folder is copied on its own (tests/test_paths_agree.py runs the student's path that way).
"""
from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from grader.harness import load_exercises


@pytest.fixture(scope="module")
def ex(request):
    """The exercises of the notebook beside this week's test file, `test_weekNN.py`."""
    path = Path(request.path)
    match = re.fullmatch(r"test_week(\d+)\.py", path.name)
    if not match:
        raise ValueError(f"{path.name}: the `ex` fixture of grader.fixtures is for a week's test file, test_weekNN.py")
    week = importlib.import_module(f"grader.checks.week{match[1]}").WEEK
    return load_exercises(path.with_name(week.notebook), week=week)
