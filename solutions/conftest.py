"""`pytest solutions/NN` (the solution notebooks through the isolated path, in `make test`) runs each exercise's test
under the time limit the isolated autograde gives its graded test (`grader.status.limits().exercise_timeout`, the
student's code's time summed over its calls; grader/grading.py, `IsolatedExecute`): so a solution that would lose
points to that limit when graded fails here. tests/test_nbgrader_pipeline.py leans on it: it no longer autogrades
the solution isolated, which ran the same checks a second time.

After the week's last test, the reference-use query the autograde makes once all graded tests have run
(`session.reference_use` over every exercise of the week) must find nothing, as it does for each check on its own.

Not copied to weeks/ (a release is made from solutions/NN/ alone): a student's `pytest weeks/NN` is as before.
"""
import importlib
import re

import pytest


@pytest.fixture(autouse=True)
def _autograde_time_limit(request):
    match = re.fullmatch(r"test_ex\d\d_(\w+)", request.node.originalname or request.node.name)
    if not match or "ex" not in request.fixturenames:
        yield
        return
    session = getattr(request.getfixturevalue("ex"), "_session", None)  # None: INFERENCE_LAB_ISOLATION=0
    if session is None:
        yield
        return
    from grader.status import limits

    with session.time_limit(f"test_{match[1]}", limits().exercise_timeout):
        yield


@pytest.fixture(scope="module", autouse=True)
def _no_reference_use_after_the_last_test(request):
    match = re.fullmatch(r"test_week(\d+)\.py", request.path.name)
    if not match or "ex" not in request.fixturenames:
        yield
        return
    session = getattr(request.getfixturevalue("ex"), "_session", None)
    yield
    if session is not None and session.proc is not None:
        names = sorted(importlib.import_module(f"grader.checks.week{match[1]}").WEEK.exercises)
        used = session.reference_use(names)
        assert not used, f"the autograde's reference-use query after every test finds: {used}"
