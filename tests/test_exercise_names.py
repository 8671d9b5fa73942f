"""One exercise, one name, everywhere: the notebook's solution cell (its grade_id), the check's `@WEEK.exercise`,
the check function `check_<name>`, the graded test cell `test_<name>` that calls it, the pytest test
`test_exNN_<name>` in solutions/NN/test_weekNN.py, and the section the check's messages point to (a heading of
the notebook). Renaming an exercise in one place and not the others fails here, naming the mismatch.

Week 19's `engine` is the one exercise without a cell of its own: the engine is built from the notebook's parts
(`check_engine` takes them), so its test cell and test call it with those, not with a function named `engine`."""
from __future__ import annotations

import ast
import importlib
import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
WEEKS = [int(p.name) for p in sorted((REPO / "solutions").iterdir()) if p.name.isdigit()]
NO_CELL = {(19, "engine")}  # assembled from the notebook's parts (see the module docstring)


def _week(n: int):
    return importlib.import_module(f"grader.checks.week{n}")


def name_mismatches(week: int) -> list[str]:
    """What disagrees about the names of week `week`'s exercises (empty when everything agrees)."""
    checks = _week(week)
    exercises = checks.WEEK.exercises  # name -> (number, section)
    nb = json.loads((REPO / "solutions" / str(week) / checks.WEEK.notebook).read_text())
    cells = [c for c in nb["cells"] if c["cell_type"] == "code"]
    solution_ids = [c["metadata"]["nbgrader"]["grade_id"] for c in cells
                    if c["metadata"].get("nbgrader", {}).get("solution")]
    test_cells = {c["metadata"]["nbgrader"]["grade_id"]: "".join(c["source"]) for c in cells
                  if c["metadata"].get("nbgrader", {}).get("grade") and not c["metadata"]["nbgrader"].get("solution")}
    headings = [line for c in nb["cells"] if c["cell_type"] == "markdown"
                for line in "".join(c["source"]).splitlines() if line.startswith("#")]
    tests = {}
    tree = ast.parse((REPO / "solutions" / str(week) / f"test_week{week}.py").read_text())
    for fn in tree.body:
        if isinstance(fn, ast.FunctionDef) and fn.name.startswith("test_ex"):
            tests[fn.name] = ast.unparse(fn)
    bad = []
    for name, (number, section) in exercises.items():
        check = getattr(checks, f"check_{name}", None)
        if check is None:
            bad.append(f"week {week}: `{name}` is registered by @WEEK.exercise but grader/checks/week{week}.py has "
                       f"no check_{name}")
        elif getattr(check, "exercise", None) != (week, number, name):
            bad.append(f"week {week}: check_{name} is registered as {getattr(check, 'exercise', None)}, not "
                       f"{(week, number, name)}")
        if (week, name) not in NO_CELL and name not in solution_ids:
            bad.append(f"week {week}: no solution cell has grade_id `{name}` (the notebook's are {solution_ids})")
        test_id = f"test_{name}"
        if test_id not in test_cells:
            bad.append(f"week {week}: no graded test cell `{test_id}`")
        elif f"check_{name}(" not in test_cells[test_id]:
            bad.append(f"week {week}: the test cell `{test_id}` does not call check_{name}")
        pytest_name = f"test_ex{number:02d}_{name}"
        same_number = [t for t in tests if t.startswith(f"test_ex{number:02d}_")]
        if pytest_name not in tests and not (name.startswith("answer_") and any(t.endswith(name) for t in same_number)):
            bad.append(f"week {week}: solutions/{week}/test_week{week}.py has no {pytest_name} (tests numbered "
                       f"{number:02d}: {same_number})")
        elif pytest_name in tests and f"check_{name}(" not in tests[pytest_name]:
            bad.append(f"week {week}: {pytest_name} does not call checks.check_{name}")
        match = re.match(r"(\d+) \(([^;)]+)", section)
        if not match or not any(h.lstrip("# ").startswith(f"{match[1]}. {match[2]}") for h in headings):
            bad.append(f"week {week}: `{name}`'s section {section!r} is not a heading of the notebook "
                       f"(\"## {section.split(' (')[0]}. ...\")")
    for grade_id in solution_ids:
        if grade_id not in exercises:
            bad.append(f"week {week}: the solution cell `{grade_id}` has no @WEEK.exercise in grader/checks/week{week}.py")
    for test in tests:
        m = re.fullmatch(r"test_ex(\d\d)_(\w+)", test)
        if not m or m[2] not in exercises or exercises[m[2]][0] != int(m[1]):
            bad.append(f"week {week}: {test} names no exercise (`{m[2] if m else test}` as number {m[1] if m else '?'})")
    return bad


@pytest.mark.parametrize("week", WEEKS)
def test_every_name_of_an_exercise_agrees(week):
    bad = name_mismatches(week)
    assert not bad, "\n".join(bad)


def test_a_renamed_check_is_named(monkeypatch):
    """Renaming the check of one exercise (and not its cell, test cell and pytest test) is caught, by name."""
    checks = _week(16)
    monkeypatch.setitem(checks.WEEK.exercises, "causal_masks", checks.WEEK.exercises["causal_mask"])
    monkeypatch.delitem(checks.WEEK.exercises, "causal_mask")
    bad = name_mismatches(16)
    assert any("causal_masks" in b and "check_causal_masks" in b for b in bad), bad
    assert any("`causal_mask` has no @WEEK.exercise" in b for b in bad), bad


@pytest.mark.parametrize("week", WEEKS)
def test_lib_code_named_like_an_exercise_is_a_stub_in_its_weeks_view(week):
    """The rule for lib's names: lib's function or class named like an exercise is that exercise's reference (the
    answer key), so in the week's view (grader/view.py) it is a stub, whatever else the week lets the notebook use."""
    from grader.view import _read_lib, kept

    spec = _week(week).WEEK.view()
    named = [(m, n) for m, mod in _read_lib().items() for n in mod.defs if n in spec.deny]
    assert named or week == 18, f"week {week}: no lib definition is named like an exercise"  # 18's are in lib.speculative
    kept_ones = [f"{m}.{n}" for m, n in named if kept(spec, m, n)]
    assert not kept_ones, f"week {week}: lib code named like an exercise keeps its code in the view: {kept_ones}"
