"""The student's path and the instructor's path agree, exercise by exercise (issue 12, item 7).

Three week-16 submissions — honest, partial (some exercises stubs, some wrong) and broken (an exception and
a `sys.exit()` at the top level of cells) — are checked both ways:

- `pytest` on a folder holding the submission next to the week's `test_week16.py` (what `pytest weeks/16`
  does in the student's copy), one subprocess for all three folders;
- `python -m grader collect` + `autograde`, the nbgrader score of each graded test cell read from the gradebook.

Every exercise test that passes in pytest has full points in the gradebook, every one that fails has 0.
The untouched release (all fail) is covered by tests/test_release.py and tests/test_nbgrader_pipeline.py.
Fast: demo cells stripped, and `generate` (its check loads SmolLM2) and `RollingKVCache` (tens of seconds)
are the release's stubs in every submission — failing in both paths. About 30 s on 2 quiet cores, 80-100 s at load 3-5.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from grader.__main__ import autograde, collect
from grader.course import Course
from grader.harness import with_cell_source


REPO = Path(__file__).resolve().parent.parent
WEEK = "16"
SLOW = ("generate", "RollingKVCache")  # the release's stubs in every submission, to keep this test short


_edit = with_cell_source


def _honest(solution: dict) -> dict:
    """The solution without its demo cells (they earn nothing and neither path runs them)."""
    nb = json.loads(json.dumps(solution))
    nb["cells"] = [c for c in nb["cells"] if c["cell_type"] != "code" or c["metadata"].get("nbgrader", {}).get(
        "solution") or c["metadata"].get("nbgrader", {}).get("grade") or "setup" in c["metadata"].get("tags", [])]
    return nb


def _stub(nb: dict, release: dict, grade_ids) -> dict:
    stubs = {c["metadata"]["nbgrader"]["grade_id"]: c["source"] for c in release["cells"]
             if c["metadata"].get("nbgrader", {}).get("solution")}
    for gid in grade_ids:
        nb = _edit(nb, gid, "".join(stubs[gid]) if isinstance(stubs[gid], list) else stubs[gid])
    return nb


def _submissions(solution: dict, release: dict) -> dict[str, dict]:
    honest = _stub(_honest(solution), release, SLOW)
    partial = _stub(honest, release, ["step_flops", "LayerKVCache"])
    partial = _edit(partial, "causal_mask", """
        def causal_mask(q_len, kv_len, device=None):
            i = torch.arange(q_len, device=device).unsqueeze(1)
            j = torch.arange(kv_len, device=device).unsqueeze(0)
            return j <= i  # wrong when kv_len > q_len (cached decode)
        """)
    partial = _edit(partial, "kv_cache_bytes", """
        def kv_cache_bytes(n_layers, n_kv_heads, head_dim, seq_len, batch=1, bytes_per_element=2):
            return n_layers * n_kv_heads * head_dim * seq_len * batch * bytes_per_element  # K only
        """)
    partial = _edit(partial, "answer_q1", """
        def answer_q1():
            return 13.0
        """)
    broken = _edit(honest, "roofline_time", """
        import sys
        sys.exit("I give up on this cell")
        """, prepend=True)
    broken = _edit(broken, "pool_kv_heads", """
        raise RuntimeError("a typo at the top of the cell")
        """, prepend=True)
    broken = _append(broken, "gqa_attention", 'raise ValueError("a leftover debug raise after the definition")')
    return {"honest": honest, "partial": partial, "broken": broken}


def _append(nb: dict, grade_id: str, line: str) -> dict:
    nb = json.loads(json.dumps(nb))
    for cell in nb["cells"]:
        if cell["metadata"].get("nbgrader", {}).get("grade_id") == grade_id:
            old = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
            cell["source"] = old.rstrip("\n") + "\n" + line + "\n"
            return nb
    raise KeyError(grade_id)


def _pytest_outcomes(report: Path) -> dict[str, dict[str, bool]]:
    """student -> grade_id of the test cell (`test_<name>`) -> passed, from pytest's junit XML."""
    found: dict[str, dict[str, bool]] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        student = next(part for part in re.split(r"[./]", case.get("classname", "")) if part in
                       ("honest", "partial", "broken"))
        name = re.sub(r"^test_ex\d\d_", "test_", case.get("name"))
        passed = case.find("failure") is None and case.find("error") is None and case.find("skipped") is None
        found.setdefault(student, {})[name] = passed
    return found


def _nbgrader_scores(course: Course, student: str) -> dict[str, tuple[float, float]]:
    from nbgrader.api import Gradebook

    with Gradebook(course.config.CourseDirectory.db_url) as gb:
        sub = gb.find_submission(WEEK, student)
        return {g.name: (float(g.auto_score or 0), float(g.max_score)) for nb in sub.notebooks for g in nb.grades
                if g.cell_type == "code"}


@pytest.mark.notebook  # autogrades three notebooks: 30 s quiet, up to 1.5 min on 2 loaded cores
def test_pytest_and_autograde_agree_per_exercise(tmp_path, capsys):
    root = tmp_path / "course"
    for part in ("solutions", "weeks"):
        shutil.copytree(REPO / part / WEEK, root / part / WEEK,
                        ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache", "*.backup-*"))
    release_path = next((root / "weeks" / WEEK).glob("*.ipynb"))
    release = json.loads(release_path.read_text())
    solution = json.loads((root / "solutions" / WEEK / release_path.name).read_text())
    subs = _submissions(solution, release)

    # the student's path: pytest on a folder holding the submission and the week's test file
    folders, collected = [], tmp_path / "collected"
    collected.mkdir()
    for student, nb in subs.items():
        folder = tmp_path / "students" / student
        folder.mkdir(parents=True)
        shutil.copy(root / "weeks" / WEEK / f"test_week{WEEK}.py", folder)
        (folder / release_path.name).write_text(json.dumps(nb))
        (collected / f"{student}.ipynb").write_text(json.dumps(nb))
        folders.append(str(folder))
    report = tmp_path / "report.xml"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    student_run = subprocess.Popen(  # runs while autograde runs here
        [sys.executable, "-m", "pytest", *folders, "-q", "-p", "no:cacheprovider", "--import-mode=importlib",
         f"--junitxml={report}", f"--rootdir={tmp_path}"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    # the instructor's path
    try:
        assert collect(WEEK, collected, root=root) == []
        assert autograde(WEEK, [], root=root) == []
    finally:
        out, _ = student_run.communicate(timeout=600)
    print(capsys.readouterr().out)
    assert report.exists(), out[-3000:]
    by_pytest = _pytest_outcomes(report)

    course = Course(root)
    tests = {g for g, (_, mx) in _nbgrader_scores(course, "honest").items()}
    disagreements = []
    for student in subs:
        scores = _nbgrader_scores(course, student)
        assert set(by_pytest[student]) == set(scores) == tests, (student, sorted(by_pytest[student]), sorted(scores))
        for grade_id, (score, max_score) in sorted(scores.items()):
            assert score in (0, max_score), f"{student} {grade_id}: partial credit {score}/{max_score}"
            if by_pytest[student][grade_id] != (score == max_score):
                disagreements.append(f"{student} {grade_id}: pytest {'passed' if by_pytest[student][grade_id] else 'failed'}, "
                                     f"nbgrader {score:g}/{max_score:g}")
    assert not disagreements, "\n".join(disagreements) + "\n" + out[-3000:]

    # the three submissions are what they claim to be
    failing = {s: sorted(g for g, ok in by_pytest[s].items() if not ok) for s in subs}
    assert failing["honest"] == ["test_RollingKVCache", "test_generate"], failing
    assert {"test_step_flops", "test_LayerKVCache", "test_causal_mask", "test_kv_cache_bytes",
            "test_answer_q1"} <= set(failing["partial"]), failing
    assert {"test_roofline_time", "test_pool_kv_heads"} <= set(failing["broken"]), failing
    assert "test_step_flops" not in failing["broken"], failing  # the other cells still load
