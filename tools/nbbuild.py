"""Helpers for writing a solution notebook from a Python script (nbformat), with nbgrader metadata.

    from tools.nbbuild import Notebook
    nb = Notebook()
    nb.md("# Title")
    nb.setup("import torch")                          # run by grader.harness.load_exercises too
    nb.exercise("causal_mask", "def causal_mask(...):\n    ### BEGIN SOLUTION\n ...\n    ### END SOLUTION")
    nb.test("test_causal_mask", "check_causal_mask(causal_mask)", points=2)
    nb.code("demo code")                              # ordinary cell, not graded
    nb.answer("q2_answer", "YOUR ANSWER HERE / model answer", points=2)   # hand-graded markdown
    nb.write("solutions/16/week16_kv_cache.ipynb")

Cells get stable ids from their grade_id or their position, so rebuilding gives the same file.

Every week's notebook is built this way, by its script `tools/weeks/weekNN.py` (docs/authoring-a-week.md); the
script is the source. `build(script, into)` runs a script as `python tools/weeks/weekNN.py` does but writes its
notebook under another folder, so tests/test_authoring.py can compare it with the committed one.
"""
from __future__ import annotations

import contextlib
import io
import runpy
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook


REPO = Path(__file__).resolve().parents[1]
_into: Path | None = None  # set while build() runs: where write() puts the notebook instead
_written: list[tuple[Path, Path]] = []


def build(script: Path, into: Path) -> list[tuple[Path, Path]]:
    """Run a week's script as its `__main__`, writing each notebook under `into` at its path relative to the
    repo instead of in place. Returns (the notebook's path in the repo, the path written) for each."""
    global _into
    _into, _written[:] = Path(into), []
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            runpy.run_path(str(script), run_name="__main__")
        return list(_written)
    finally:
        _into = None


class Notebook:
    def __init__(self):
        self.cells = []
        self._ids = set()

    def _add(self, cell, cell_id):
        if cell_id in self._ids:
            raise ValueError(f"duplicate cell id / grade_id {cell_id!r}")
        self._ids.add(cell_id)
        cell["id"] = cell_id
        self.cells.append(cell)
        return cell

    def md(self, text: str):
        return self._add(new_markdown_cell(text.strip("\n")), f"md-{len(self.cells):03d}")

    def code(self, src: str, tags: list[str] | None = None):
        cell = new_code_cell(src.strip("\n"))
        if tags:
            cell.metadata["tags"] = tags
        return self._add(cell, f"code-{len(self.cells):03d}")

    def setup(self, src: str):
        return self.code(src, tags=["setup"])

    def exercise(self, grade_id: str, src: str):
        cell = new_code_cell(src.strip("\n"))
        cell.metadata["nbgrader"] = {"grade": False, "grade_id": grade_id, "locked": False,
                                     "schema_version": 3, "solution": True, "task": False}
        return self._add(cell, grade_id)

    def test(self, grade_id: str, src: str, points: float):
        cell = new_code_cell(src.strip("\n"))
        cell.metadata["nbgrader"] = {"grade": True, "grade_id": grade_id, "locked": True, "points": points,
                                     "schema_version": 3, "solution": False, "task": False}
        return self._add(cell, grade_id)

    def answer(self, grade_id: str, text: str, points: float):
        """A hand-graded written answer (markdown solution cell)."""
        cell = new_markdown_cell(text.strip("\n"))
        cell.metadata["nbgrader"] = {"grade": True, "grade_id": grade_id, "locked": False, "points": points,
                                     "schema_version": 3, "solution": True, "task": False}
        return self._add(cell, grade_id)

    def write(self, path: str):
        nb = new_notebook(cells=self.cells)
        nb.metadata["kernelspec"] = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
        nb.metadata["language_info"] = {"name": "python"}
        nbformat.validate(nb)
        if _into is not None:
            target = Path(path).resolve()
            built = _into / target.relative_to(REPO)
            built.parent.mkdir(parents=True, exist_ok=True)
            _written.append((target, built))
            path = str(built)
        nbformat.write(nb, path)
