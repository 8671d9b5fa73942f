"""grader.status, the one home of grading state: the notes of a submission (written and read through one pair of
functions, listed for the grades) and the limits on the student's process (the grader's --timeout held as a setting
of the process, over the environment's INFERENCE_LAB_* knobs, over the defaults)."""
import os

from grader.course import grade_one
from grader.isolation import Session
from grader.status import (DEFAULT_BUDGET, DEFAULT_CALL_TIMEOUT, limits, limits_set, read_status, status_files,
                           status_path, write_status)


def test_notes_round_trip_and_are_listed(tmp_path):
    assert read_status(tmp_path, "16", "alice") == {} and status_files(tmp_path) == []
    write_status(tmp_path, "16", "alice", {"status": "graded", "tests": {"ex": "passed"}})
    write_status(tmp_path, "17", "bob", {"status": "failed"})
    assert read_status(tmp_path, "16", "alice") == {"status": "graded", "tests": {"ex": "passed"}}
    assert status_files(tmp_path) == [("16", "alice"), ("17", "bob")]
    status_path(tmp_path, "17", "bob").write_text("{not json")
    assert read_status(tmp_path, "17", "bob") == {}  # unreadable notes read as none, never an exception


def test_limits_setting_over_environment_over_defaults(monkeypatch):
    monkeypatch.delenv("INFERENCE_LAB_CALL_TIMEOUT", raising=False)
    monkeypatch.delenv("INFERENCE_LAB_BUDGET", raising=False)
    assert (limits().call_timeout, limits().budget) == (DEFAULT_CALL_TIMEOUT, DEFAULT_BUDGET)
    monkeypatch.setenv("INFERENCE_LAB_CALL_TIMEOUT", "7")
    assert limits().call_timeout == 7 and Session("x.ipynb").call_timeout == 7
    with limits_set(call_timeout=3, budget=None):
        assert limits().call_timeout == 3 and limits().budget == DEFAULT_BUDGET
        assert Session("x.ipynb").call_timeout == 3
        assert os.environ["INFERENCE_LAB_CALL_TIMEOUT"] == "7", "the setting travelled through the environment"
    assert limits().call_timeout == 7


def test_grade_one_holds_its_timeout_without_touching_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("INFERENCE_LAB_CALL_TIMEOUT", raising=False)
    student, ok, line, _ = grade_one("16", "nobody", str(tmp_path), timeout=5)
    assert student == "nobody" and not ok and line, line  # no course there: a one-line failure, not an exception
    assert "INFERENCE_LAB_CALL_TIMEOUT" not in os.environ and limits().call_timeout == DEFAULT_CALL_TIMEOUT
