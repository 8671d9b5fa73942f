"""The instructor's chain, end to end in a throw-away course folder, for every week:

release -> submissions (the solution handed in as a student: full marks; the untouched release: 0)
-> autograde -> feedback HTML -> grades CSV.

The untouched release is autograded isolated (grader/grading.py: exercise cells in a child process, tests here, demo
cells not run). The solution is autograded by nbgrader's kernel executing the whole notebook top to bottom
(INFERENCE_LAB_ISOLATION=0): so this is still the test that every solution notebook runs without an error, and that
its graded cells pass in a kernel, as a student who runs the notebook sees them. The kernel runs with
INFERENCE_LAB_QUICK_DEMOS=1: a notebook whose demos read it (`QUICK` in weeks 16, 18 and 20) runs each measurement at a
smaller size (every cell still runs; the exercise cells and graded tests are unchanged). The default sizes, which a
student runs, are run by `tools/run_notebooks.py` (`make gpu-check`), not here.

That the isolated autograde gives the solution every point, and so agrees with the kernel run, is held without
grading it a second time (it was the same checks, in the same kind of child, as `pytest solutions/NN`; 300-400 s
of a core in all):
- `solutions/NN` runs every check on the solution in one isolated child, each under the autograde's time limit per
  graded test, and makes the autograde's reference-use query over every exercise after the last (solutions/conftest.py);
- tests/test_paths_agree.py::test_each_graded_cell_is_its_pytest_test: each graded cell is, in the trusted
  namespace the isolated autograde runs it in, the call its solutions/NN test makes, in the same order (where the
  order differs, ISOLATED_HERE, the solution is still autograded isolated here);
- nbgrader's side of an isolated autograde (the scores saved, summed, fed back and exported): every point for
  week 16's solution in tests/test_commands.py::test_grader_commands_for_a_term, exercise by exercise against pytest
  in tests/test_paths_agree.py, and the untouched release here, every week, through the isolated path.
"""
import json
import shutil
import time
from pathlib import Path

import pytest

from grader.course import Course, read_csv
from grader.course_map import week_folders

REPO = Path(__file__).resolve().parent.parent
WEEKS = list(week_folders())  # grader/course_map.py; tests/test_course_map.py holds solutions/ to it

pytestmark = pytest.mark.notebook

# Weeks whose graded cells run in another order than solutions/NN's tests (the isolated autograde runs them in the
# notebook's order, in one child): their solution is autograded isolated here too, and the kernel run held to it.
# tests/test_paths_agree.py::test_each_graded_cell_is_its_pytest_test keeps this set exactly those weeks.
ISOLATED_HERE: dict[str, str] = {}  # week -> why its order differs (none today)


def _errors(notebook: Path) -> list[str]:
    nb = json.loads(notebook.read_text())
    found = []
    for i, cell in enumerate(nb["cells"]):
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                found.append(f"cell {i} ({cell['metadata'].get('nbgrader', {}).get('grade_id', cell.get('id'))}): "
                             f"{out.get('ename')}: {out.get('evalue')}")
    return found


@pytest.mark.parametrize("week", WEEKS)
def test_nbgrader_pipeline(week, tmp_path, monkeypatch):
    root = tmp_path / "course"
    shutil.copytree(REPO / "solutions" / week, root / "solutions" / week,
                    ignore=shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints", ".pytest_cache"))
    course = Course(root)
    released = course.generate(week)
    (name,) = [p.name for p in released.glob("*.ipynb")]

    isolated = week in ISOLATED_HERE
    for student, source in [("untouched", released / name), ("solution", root / "solutions" / week / name),
                            ("solution-isolated", root / "solutions" / week / name)][:3 if isolated else 2]:
        dest = root / "grader" / "submitted" / student / week
        dest.mkdir(parents=True)
        shutil.copy(source, dest / name)

    course.autograde(week, "untouched")  # isolated
    if isolated:
        course.autograde(week, "solution-isolated")

    monkeypatch.setenv("INFERENCE_LAB_ISOLATION", "0")
    monkeypatch.setenv("INFERENCE_LAB_QUICK_DEMOS", "1")  # the kernel inherits it: demos at their smallest sizes
    start = time.perf_counter()
    Course(root).autograde(week, "solution")
    print(f"week {week}: autograding the solution in a kernel (a full top-to-bottom run) took "
          f"{time.perf_counter() - start:.0f} s")
    monkeypatch.delenv("INFERENCE_LAB_ISOLATION")
    monkeypatch.delenv("INFERENCE_LAB_QUICK_DEMOS")
    errors = _errors(root / "grader" / "autograded" / "solution" / week / name)
    assert not errors, "the solution notebook raised while running top to bottom:\n" + "\n".join(errors)

    good, bad = course.score(week, "solution"), course.score(week, "untouched")
    assert good["max_code_score"] > 0
    assert good["code_score"] == good["max_code_score"], f"solution lost autograded points: {good}"
    assert bad["score"] == 0, f"the untouched release earned points, so some test checks nothing: {bad}"
    assert bad["max_code_score"] == good["max_code_score"]
    if isolated:
        assert not _errors(root / "grader" / "autograded" / "solution-isolated" / week / name)
        assert course.score(week, "solution-isolated") == good, "the kernel run and the isolated run disagree"

    for student in ("solution", "untouched"):
        html = course.feedback(week, student) / name.replace(".ipynb", ".html")
        assert html.is_file() and "Score" in html.read_text()

    rows = read_csv(course.export(tmp_path / "grades.csv"))
    by_student = {r["student_id"]: r for r in rows if r["assignment"] == week}
    assert float(by_student["untouched"]["score"]) == 0
    assert float(by_student["solution"]["score"]) == good["score"] > 0
