"""A red team's variants as the cells of one notebook, graded as `pytest weeks/NN` grades a student: the release
notebook at HEAD with each named exercise cell replaced (tests/fixtures/redteam/VARIANT), loaded isolated; and a
check of one of its exercises. tests/test_redteam11.py and test_redteam12.py load this sibling by its path (the tests
run with --import-mode=importlib)."""
import importlib
import json
import subprocess
from pathlib import Path

from grader.harness import load_exercises, with_cell_source

REPO = Path(__file__).resolve().parent.parent
RED = REPO / "tests" / "fixtures" / "redteam"


def load(tmp_path, week: str, cells: dict):
    """The week's release at HEAD with `cells` ({exercise: variant path under RED}) in place, loaded isolated."""
    path = next((REPO / "weeks" / week).glob("week*.ipynb"))
    nb = json.loads(subprocess.run(["git", "show", f"HEAD:{path.relative_to(REPO)}"], cwd=REPO, capture_output=True,
                                   text=True, check=True).stdout)
    for name, variant in cells.items():
        nb = with_cell_source(nb, name, (RED / variant).read_text())
    target = tmp_path / path.name
    target.write_text(json.dumps(nb))
    return load_exercises(target)


def check(week: str, name: str, ex):
    """The week's check of exercise `name`, on the loaded notebook's `name`."""
    return getattr(importlib.import_module(f"grader.checks.week{week}"), f"check_{name}")(getattr(ex, name))


def wrong_routes_fail(tmp_path, week: str, routes: dict) -> None:
    """`routes` ({exercise: (variant, what its failure says, or None for an honest helper the route calls)}) in one
    notebook: each check fails saying so (a cell that raises at load fails too: ExerciseMissing is an AssertionError)."""
    import pytest

    ex = load(tmp_path, week, {name: variant for name, (variant, _) in routes.items()})
    try:
        for name, (_, message) in routes.items():
            if message is None:
                check(week, name, ex)
                continue
            with pytest.raises(AssertionError, match=message):
                check(week, name, ex)
    finally:
        ex.close()


def honest_pass(tmp_path, week: str, cells: dict) -> None:
    """`cells` ({exercise: variant}) in one notebook: each check passes."""
    ex = load(tmp_path, week, cells)
    try:
        for name in cells:
            check(week, name, ex)
    finally:
        ex.close()
