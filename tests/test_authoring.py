"""Every week is authored one way: its script tools/weeks/weekNN.py builds solutions/NN/*.ipynb through
tools/nbbuild.py, and the script is the source. Each script must rebuild the committed notebook byte for byte
(built into a temporary folder, nothing executed), and every solution notebook must have its script."""
from __future__ import annotations

from pathlib import Path

import pytest

from tools.nbbuild import build

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = sorted((REPO / "tools" / "weeks").glob("week[0-9][0-9].py"))


def test_every_solution_notebook_has_a_script():
    weeks = sorted(p.name for p in (REPO / "solutions").iterdir() if list(p.glob("*.ipynb")))
    assert weeks, "no solution notebooks found"
    assert [s.stem.removeprefix("week") for s in SCRIPTS] == weeks, \
        "each solutions/NN/ notebook is built by tools/weeks/weekNN.py (docs/authoring-a-week.md)"


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.stem for s in SCRIPTS])
def test_script_rebuilds_its_notebook(script, tmp_path):
    written = build(script, tmp_path)
    week = script.stem.removeprefix("week")
    assert [t.parent for t, _ in written] == [REPO / "solutions" / week], written
    for target, built in written:
        assert target.is_file(), f"{script.name} builds {target}, which is not in the repo"
        assert built.read_bytes() == target.read_bytes(), (
            f"{target.relative_to(REPO)} differs from what {script.relative_to(REPO)} builds: the script is the "
            f"source, so edit it and run `python {script.relative_to(REPO)}` (an edit made in the notebook is lost)")


NOTEBOOKS = sorted((REPO / "solutions").glob("*/*.ipynb")) + sorted((REPO / "weeks").glob("*/*.ipynb"))


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: f"{p.parent.parent.name}/{p.parent.name}")
def test_every_code_cell_compiles(notebook):
    """A builder's string escapes are easy to get wrong ("\\n" written as a newline inside a string literal): every
    code cell of the solution and release notebooks must compile, magics aside — seconds here, where the notebook
    runs find it only after minutes."""
    import json

    from grader.similarity import without_magics

    cells = json.loads(notebook.read_text())["cells"]
    for i, cell in enumerate(cells):
        if cell["cell_type"] == "code":
            source = "".join(cell["source"])
            try:
                compile(without_magics(source), f"{notebook.name}, cell {i}", "exec")
            except SyntaxError as e:
                pytest.fail(f"{notebook.relative_to(REPO)} cell {i} does not compile: {e}")
