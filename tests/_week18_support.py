"""Shared by week 18's check tests (tests/test_week18_checks.py, tests/test_week18_theory.py): the solution notebook
with wrong routes appended to exercise cells, loaded through the isolated path as `pytest weeks/18` loads it. The
tests run with --import-mode=importlib, so they load this sibling by its path."""
import json
from pathlib import Path

from grader.checks import week18 as checks
from grader.harness import load_exercises, with_cell_source

ROOT = Path(__file__).resolve().parent.parent
SOLUTION = ROOT / "solutions" / "18" / checks.WEEK.notebook


def isolated(tmp_path_factory, edits: dict[str, str]):
    """The solution notebook with `edits` (grade_id -> source added after the cell's own), loaded isolated."""
    nb = json.loads(SOLUTION.read_text())
    for grade_id, source in edits.items():
        nb = _append(nb, grade_id, source)
    path = tmp_path_factory.mktemp("w18") / SOLUTION.name
    path.write_text(json.dumps(nb))
    return load_exercises(path, isolated=True)


def _append(nb, grade_id, source):
    for cell in nb["cells"]:
        if cell["metadata"].get("nbgrader", {}).get("grade_id") == grade_id:
            old = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
            return with_cell_source(nb, grade_id, old + "\n\n" + source)
    raise KeyError(grade_id)
