"""Shared by the integrity tests (tests/test_integrity.py, tests/test_integrity_copies.py,
tests/test_integrity_resources.py; tests/test_similarity.py too): a week's solution notebook with exercise cells
replaced or prefixed, loaded through the isolated path as `pytest weeks/NN` loads it. The tests run with
--import-mode=importlib, so they load this sibling by its path."""
from __future__ import annotations

import json
from pathlib import Path

from grader.harness import load_exercises, with_cell_source

REPO = Path(__file__).resolve().parent.parent


def _solution(week: int) -> tuple[Path, dict]:
    path = next((REPO / "solutions" / str(week)).glob("*.ipynb"))
    return path, json.loads(path.read_text())


def _load(tmp_path: Path, week: int, edits: dict[str, str] | None = None, prepend: dict[str, str] | None = None):
    """The solution of `week` with some exercise cells replaced (or prefixed), loaded as `pytest weeks/NN` does."""
    path, nb = _solution(week)
    for grade_id, src in (edits or {}).items():
        nb = with_cell_source(nb, grade_id, src)
    for grade_id, src in (prepend or {}).items():
        nb = with_cell_source(nb, grade_id, src, prepend=True)
    out = tmp_path / f"w{week}" / path.name
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(nb))
    return load_exercises(out)


def _solution_cells(week: int) -> dict[str, str]:
    from grader.notebook import exercise_cells

    return {g: src for _, g, src in exercise_cells(_solution(week)[1]) if g}


def _reads_restricted(ex) -> bool:
    return "reads only" in getattr(ex._session, "sandbox", "")
