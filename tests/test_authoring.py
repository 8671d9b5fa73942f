"""Every week is authored one way: its sources tools/weeks/weekNN/*.py (jupytext percent files: markdown as markdown,
code as code) build solutions/NN/<notebook> through tools/weeks/build.py, and the sources win. Each week must rebuild
the committed notebook byte for byte (built into a temporary folder, nothing executed), and every solution notebook
must have its sources."""
from __future__ import annotations

from pathlib import Path

import pytest

from grader.course_map import COURSE
from tools.weeks.build import build, read_percent, render_fields

REPO = Path(__file__).resolve().parent.parent
WEEKS = [w.number for w in COURSE]


def test_every_solution_notebook_has_sources():
    weeks = sorted(p.name for p in (REPO / "solutions").iterdir() if list(p.glob("*.ipynb")))
    assert weeks, "no solution notebooks found"
    sources = sorted(p.name.removeprefix("week") for p in (REPO / "tools" / "weeks").glob("week[0-9][0-9]")
                     if list(p.glob("*.py")))
    assert sources == weeks, \
        "each solutions/NN/ notebook is built from tools/weeks/weekNN/*.py (docs/authoring-a-week.md)"


@pytest.mark.parametrize("week", WEEKS)
def test_sources_rebuild_the_notebook(week, tmp_path):
    target, built = build(week, tmp_path)
    assert target.parent == REPO / "solutions" / str(week), target
    assert target.is_file(), f"tools/weeks/week{week}/ builds {target}, which is not in the repo"
    assert built.read_bytes() == target.read_bytes(), (
        f"{target.relative_to(REPO)} differs from what tools/weeks/week{week}/ builds: the sources win, so edit them "
        f"and run `python tools/weeks/build.py {week}` (an edit made in the notebook is lost)")


def test_a_changed_source_changes_the_build(tmp_path, monkeypatch):
    """The comparison above can fail: a word changed in a markdown cell of a source reaches the built notebook."""
    import tools.weeks.build as builder

    first = builder.parts(16)[0]
    changed = tmp_path / "week16" / first.name
    changed.parent.mkdir()
    text = first.read_text(encoding="utf-8")
    changed.write_text(text.replace("# # Week 16", "# # Week Sixteen", 1), encoding="utf-8")
    for other in builder.parts(16)[1:]:
        (changed.parent / other.name).write_bytes(other.read_bytes())
    monkeypatch.setattr(builder, "SOURCES", tmp_path)
    monkeypatch.setattr(builder, "REPO", REPO)
    _, built = build(16, tmp_path / "out")
    assert built.read_bytes() != (REPO / "solutions" / "16" / COURSE[0].notebook).read_bytes()
    assert "Week Sixteen" in built.read_text(encoding="utf-8")


def test_the_percent_format_round_trips_cells(tmp_path):
    """What a percent file says, cell by cell: the header's type and metadata, markdown lines without their '# '."""
    src = tmp_path / "part.py"
    src.write_text('# %% [markdown]\n# ## 1. A title\n#\n# text\n\n# %% tags=["setup"]\nimport math\n\n\n'
                   '# %% nbgrader={"grade": true, "grade_id": "test_x", "points": 2}\ncheck_x(x)\n', encoding="utf-8")
    assert read_percent(src) == [
        ("markdown", "## 1. A title\n\ntext", {}),
        ("code", "import math", {"tags": ["setup"]}),
        ("code", "check_x(x)", {"nbgrader": {"grade": True, "grade_id": "test_x", "points": 2}}),
    ]
    src.write_text("# %% [markdown]\nnot a comment\n", encoding="utf-8")
    with pytest.raises(ValueError, match="start with '# '"):
        read_percent(src)


def test_fields_are_rendered_from_the_records():
    """A markdown field is evaluated with tools/weeks/fields.py's names: a recorded figure comes from the committed
    record (marked as such), a figure the records lack fails the build, and a malformed field is refused."""
    figure = render_fields('at {{ recorded_md("decode", "decode b1: roofline", "amd-epyc-avx512") }}.')
    assert figure.startswith("at <!-- recorded decode|decode b1: roofline|amd-epyc-avx512 -->"), figure
    assert render_fields('{{ format(1234, ",") }} lines') == "1,234 lines"
    with pytest.raises(KeyError):
        render_fields('{{ recorded_md("decode", "no such figure", "amd-epyc-avx512") }}')
    with pytest.raises(ValueError, match="one space inside"):
        render_fields("{{recorded_md}}")


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
