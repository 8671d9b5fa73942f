"""A check has a hard wall-clock deadline, whatever the student's code returns (the sixth red-team round,
FINDINGS6.md #20: a `schedule` whose plan's lists are endless generators kept a grading run going past every limit,
each `next` a short call of the student's code that the per-call and per-exercise limits never added up).

Through the isolated path, as `pytest weeks/19` (no exercise limit) and autograde (`Session.time_limit`) grade:
the test stops at the deadline with a clear message and the student's process is gone; `check_schedule` rejects
such a plan at once."""
import json
import subprocess
import time
from pathlib import Path

import pytest

from grader.harness import load_exercises, with_cell_source
from grader.wire import StudentTimeout

REPO = Path(__file__).resolve().parent.parent
ENDLESS = REPO / "tests" / "fixtures" / "redteam" / "v6" / "w19_sched_hostile_infgen.py"
LIMIT = 3.0  # INFERENCE_LAB_EXERCISE_TIMEOUT here; the notebook's budget (60 s) is far past the deadline


@pytest.fixture(scope="module")
def endless(tmp_path_factory):
    patch = pytest.MonkeyPatch()
    patch.setenv("INFERENCE_LAB_EXERCISE_TIMEOUT", str(LIMIT))
    patch.setenv("INFERENCE_LAB_CALL_TIMEOUT", "30")
    patch.setenv("INFERENCE_LAB_BUDGET", "90")
    tmp_path = tmp_path_factory.mktemp("endless")
    path = next((REPO / "weeks" / "19").glob("week*.ipynb"))
    text = subprocess.run(["git", "show", f"HEAD:{path.relative_to(REPO)}"], cwd=REPO, capture_output=True, text=True,
                          check=True).stdout
    target = tmp_path / path.name
    target.write_text(json.dumps(with_cell_source(json.loads(text), "schedule", ENDLESS.read_text())))
    ex = load_exercises(target)
    yield ex
    ex.close()
    patch.undo()


def _drain(ex) -> tuple[str, float, int]:
    """Iterate the plan's endless 'run' list inside a check, as a check judging it would: (message, seconds, items)."""
    session = ex._session
    began, n = time.monotonic(), 0
    session.begin_check()
    try:
        plan = ex.schedule([], [], 1, 1, 1, 1)
        with pytest.raises(StudentTimeout) as caught:
            for _ in plan["run"]:
                n += 1
    finally:
        session.end_check()
    return str(caught.value), time.monotonic() - began, n


def test_check_schedule_rejects_a_plan_of_generators_at_once(endless):
    from grader.checks import week19

    began = time.monotonic()
    with pytest.raises(AssertionError, match="must be lists"):
        week19.check_schedule(endless.schedule)
    assert time.monotonic() - began < 2 * LIMIT + 30


@pytest.mark.parametrize("path", ["pytest", "autograde"])
def test_an_endless_result_stops_at_the_checks_deadline(endless, path):
    """pytest's path has no exercise limit: the deadline stops it (before it, the notebook's budget did, at 90 s).
    autograde's counts the student's share of each call: that, or the deadline, stops it."""
    session = endless._session
    if path == "autograde":
        with session.time_limit("schedule", LIMIT):
            said, seconds, n = _drain(endless)
    else:
        said, seconds, n = _drain(endless)
    assert n > 0, "the endless generator was never drawn from"
    assert "ran out of time" in said, said
    assert seconds < 2 * LIMIT + 15, f"the check ran {seconds:.0f} s; its deadline is {2 * LIMIT:g} s"
    if path == "pytest":
        assert "the checks' own work included" in said, said
        assert session.proc.poll() is not None, "the student's process still runs"
    with pytest.raises(StudentTimeout):  # every later request of that check fails at once: nothing runs on
        session.begin_check()
        try:
            session.deadline = time.monotonic() - 1
            endless.schedule([], [], 1, 1, 1, 1)
        finally:
            session.end_check()

