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
import ast
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
from grader.course_map import week_folders
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


def _graded_calls(notebook: Path) -> list[tuple[str, str, list[str]]]:
    """(grade_id, check, argument names) of each graded test cell, in the notebook's order; a cell that is anything
    but one call `check_<name>(a, b, ...)` of plain names is returned as (grade_id, its source, [])."""
    out = []
    for cell in json.loads(notebook.read_text())["cells"]:
        meta = cell["metadata"].get("nbgrader", {})
        if cell["cell_type"] != "code" or not meta.get("grade") or meta.get("solution"):
            continue
        source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        body = ast.parse(source).body
        call = body[0].value if len(body) == 1 and isinstance(body[0], ast.Expr) else None
        if (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and not call.keywords
                and all(isinstance(a, ast.Name) for a in call.args)):
            out.append((meta["grade_id"], call.func.id, [a.id for a in call.args]))
        else:
            out.append((meta["grade_id"], source, []))
    return out


def _pytest_calls(test_file: Path) -> list[tuple[str, str, list[str]]]:
    """("test_<name>", check, argument names) of each `test_exNN_<name>(ex)` in the file's order, whose body (its
    docstring aside) must be one call `checks.check_<name>(ex.a, ex.b, ...)`; anything else as (name, its source, [])."""
    out = []
    for fn in ast.parse(test_file.read_text()).body:
        match = re.fullmatch(r"test_ex\d\d_(\w+)", getattr(fn, "name", ""))
        if not match:
            continue
        body = [s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
        call = body[0].value if len(body) == 1 and isinstance(body[0], ast.Expr) else None
        if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and ast.unparse(call.func.value) ==
                "checks" and not call.keywords and all(isinstance(a, ast.Attribute) and ast.unparse(a.value) == "ex"
                                                       for a in call.args)):
            out.append((f"test_{match[1]}", call.func.attr, [a.attr for a in call.args]))
        else:
            out.append((f"test_{match[1]}", ast.unparse(fn), []))
    return out


@pytest.mark.parametrize("week", list(week_folders()))
def test_each_graded_cell_is_its_pytest_test(week):
    """The isolated autograde of week NN runs each graded cell here, in the trusted namespace (grader/grading.py), with
    the notebook's names as proxies into the child; `pytest solutions/NN` runs test_weekNN.py with `ex`'s proxies
    into such a child. Each graded cell is one call `check_<name>(<names>)`, the very call (check, arguments, order)
    its `test_exNN_<name>` makes, that check in the trusted namespace is the week's own, and no argument is a name
    of that namespace (each is the notebook's): so the two runs are the same checks on the same functions, and
    `pytest solutions/NN` passing (under the autograde's time limit per test: solutions/conftest.py) is the isolated
    autograde giving the solution every point, which tests/test_nbgrader_pipeline.py no longer runs a second time."""
    import importlib

    from grader.grading import _trusted_namespace

    checks = importlib.import_module(f"grader.checks.week{week}")
    notebook = REPO / "solutions" / week / checks.WEEK.notebook
    test_file = REPO / "solutions" / week / f"test_week{week}.py"
    assert re.search(rf"^from grader\.checks import week{week} as checks$", test_file.read_text(), re.M)
    graded, tested = _graded_calls(notebook), _pytest_calls(test_file)
    assert graded, f"{notebook.name} has no graded test cells"
    assert sorted(graded) == sorted(tested), f"{notebook.name}'s graded cells vs {test_file.name}'s tests:\n{graded}\n{tested}"
    from tests.test_nbgrader_pipeline import ISOLATED_HERE

    assert (graded != tested) == (week in ISOLATED_HERE), (
        f"week {week}: its graded cells run in {'another' if graded != tested else 'the same'} order than its tests: "
        f"tests/test_nbgrader_pipeline.py's ISOLATED_HERE must {'hold' if graded != tested else 'not hold'} it")
    trusted = _trusted_namespace(REPO, week, notebook.stem)
    for grade_id, check, args in graded:
        assert trusted.get(check) is getattr(checks, check), f"{grade_id}: `{check}` of the trusted namespace"
        assert not set(args) & set(trusted), f"{grade_id}: {sorted(set(args) & set(trusted))} name the trusted side"
