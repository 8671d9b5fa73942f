"""Grading says why, on the instructor's screen: the one line per student names, for each failed test, whether the
exercise was not implemented, was a copy of the answer key (what it copied and how much), crashed the student's
process, ran out of time or got a wrong answer; the formgrader shows the same reason as the autograder's comment
on the exercise's cell."""
import json
import shutil
from pathlib import Path

from grader.__main__ import autograde
from grader.course import Course, failure_reasons

REPO = Path(__file__).resolve().parent.parent
WEEK = "16"


def test_each_kind_of_failure_gets_its_words():
    status = {"failed": ["test_a", "test_b", "test_c", "test_d", "test_e", "test_f"], "reference_use": ["d"],
              "timed_out": {"test_e": "exercise: 180 s"},
              "tests": {"test_a": "NotImplementedYet: exercise 1, `a`, is not implemented yet — section 1",
                        "test_b": "StudentCrash: exercise 2, `b`: the student's process died (exit status 1)",
                        "test_c": "AssertionError: exercise 3, `c`: causal_mask(3, 8) is wrong at query 0",
                        "test_d": "AssertionError: exercise 4, `d`: uses lib", "test_e": "StudentTimeout: slow",
                        "test_f": "ResourceRefused: exercise 6, `f`: a [16384, 256] input"}}
    why = failure_reasons(status)
    assert why["test_a"] == "not implemented" and why["test_d"] == "reference use"
    assert why["test_b"].startswith("the student's process crashed: exercise 2")
    assert why["test_c"] == "AssertionError: exercise 3, `c`: causal_mask(3, 8) is wrong at query 0"
    assert why["test_e"] == "out of time: exercise: 180 s" and why["test_f"].startswith("refused: exercise 6")


def test_the_autograde_line_and_the_formgraders_comment_say_why(tmp_path, capsys):
    root = tmp_path / "repo"
    for part in ("solutions", "weeks"):
        shutil.copytree(REPO / part / WEEK, root / part / WEEK,
                        ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache", "*.backup-*"))
    release = next((root / "weeks" / WEEK).glob("*.ipynb"))
    nb = json.loads(release.read_text())
    lib_mask = (REPO / "lib" / "attn" / "masks.py").read_text()
    start = lib_mask.index("def causal_mask")
    end = lib_mask.index("\ndef ", start + 1)
    for cell in nb["cells"]:
        gid = cell["metadata"].get("nbgrader", {}).get("grade_id")
        if gid == "causal_mask":  # pasted from lib
            cell["source"] = "import torch\n\n" + lib_mask[start:end]
        elif gid == "step_flops":  # kills its own process when called
            cell["source"] = "import os\n\ndef step_flops(*args):\n    os._exit(3)\n"
    folder = root / "grader" / "submitted" / "ann" / WEEK
    folder.mkdir(parents=True)
    (folder / release.name).write_text(json.dumps(nb))

    assert autograde(WEEK, ["ann"], root=root) == []
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("ann: "))
    assert "reference use: causal_mask (" in line and "lib.attn.masks.causal_mask" in line, line
    assert "test_causal_mask (reference use)" in line, line
    assert "test_step_flops (the student's process crashed" in line, line
    assert "test_LayerKVCache (not implemented)" in line, line

    from nbgrader.api import Gradebook

    with Gradebook(Course(root).config.CourseDirectory.db_url) as gb:
        comments = {c: gb.find_comment(c, release.stem, WEEK, "ann").comment for c in ("causal_mask", "step_flops",
                                                                                         "LayerKVCache")}
    assert comments["causal_mask"].startswith("[autograder] reference use: causal_mask (") and \
        "lib.attn.masks.causal_mask" in comments["causal_mask"], comments
    assert comments["step_flops"].startswith("[autograder] test_step_flops: the student's process crashed"), comments
    assert comments["LayerKVCache"] == "No response.", comments  # left as released: nbgrader's own words
