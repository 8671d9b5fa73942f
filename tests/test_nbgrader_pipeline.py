"""The instructor's chain, end to end in a throw-away course folder, for every week:

release -> submissions (the solution handed in as a student: full marks; the untouched release: 0)
-> autograde -> feedback HTML -> grades CSV.

Autograding is isolated (grader/grading.py: exercise cells in a child process, tests here, demo cells not
run). The solution is also autograded the old way, by nbgrader's kernel executing the whole notebook top to
bottom (INFERENCE_LAB_ISOLATION=0): so this is still the test that every solution notebook runs without an
error, and it proves the two ways of grading agree on it.

Week 16's solution is not autograded isolated here: tests/test_commands.py autogrades it twice, with the same
settings, through the commands an instructor types, and asserts every point (ISOLATED_ELSEWHERE); here its kernel
run is held to every point.
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

# Weeks whose solution another test of `make test` autogrades isolated (full marks asserted): the pipeline autogrades
# it in the kernel only, and holds the kernel's score to the full marks that test asserts (~40 s of a core saved).
ISOLATED_ELSEWHERE = {
    "16": "tests/test_commands.py::test_grader_commands_for_a_term (alice, the solution: `nbgrader autograde 16` "
          "and `python -m grader autograde 16 --jobs 2`, which must give her every autograded point)",
}


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
    isolated = week not in ISOLATED_ELSEWHERE  # the solution autograded isolated here too

    for student, source in [("solution", root / "solutions" / week / name), ("untouched", released / name),
                            ("solution-kernel", root / "solutions" / week / name)]:
        if student == "solution" and not isolated:
            continue
        dest = root / "grader" / "submitted" / student / week
        dest.mkdir(parents=True)
        shutil.copy(source, dest / name)

    if isolated:
        start = time.perf_counter()
        course.autograde(week, "solution")
        seconds = time.perf_counter() - start
        print(f"week {week}: autograding the solution (isolated, demo cells not run) took {seconds:.0f} s")
    course.autograde(week, "untouched")

    monkeypatch.setenv("INFERENCE_LAB_ISOLATION", "0")
    start = time.perf_counter()
    Course(root).autograde(week, "solution-kernel")
    print(f"week {week}: autograding the solution in a kernel (a full top-to-bottom run) took "
          f"{time.perf_counter() - start:.0f} s")
    monkeypatch.delenv("INFERENCE_LAB_ISOLATION")
    autograded = root / "grader" / "autograded" / "solution-kernel" / week / name
    errors = _errors(autograded)
    assert not errors, "the solution notebook raised while running top to bottom:\n" + "\n".join(errors)
    full = "solution" if isolated else "solution-kernel"
    assert not _errors(root / "grader" / "autograded" / full / week / name)

    good, bad = course.score(week, full), course.score(week, "untouched")
    assert course.score(week, "solution-kernel") == good, "the kernel run and the isolated run disagree"
    assert good["max_code_score"] > 0
    assert good["code_score"] == good["max_code_score"], f"solution lost autograded points: {good}"
    assert bad["score"] == 0, f"the untouched release earned points, so some test checks nothing: {bad}"

    for student in (full, "untouched"):
        html = course.feedback(week, student) / name.replace(".ipynb", ".html")
        assert html.is_file() and "Score" in html.read_text()

    rows = read_csv(course.export(tmp_path / "grades.csv"))
    by_student = {r["student_id"]: r for r in rows if r["assignment"] == week}
    assert float(by_student["untouched"]["score"]) == 0
    assert float(by_student[full]["score"]) == good["score"] > 0
