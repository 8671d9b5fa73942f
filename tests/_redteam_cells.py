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
