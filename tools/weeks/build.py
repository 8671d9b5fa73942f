"""Build a week's solution notebook from its sources: `python tools/weeks/build.py 16` writes
solutions/16/week16_kv_cache.ipynb (no outputs); `python tools/weeks/build.py` builds every week of the course map.

The sources are tools/weeks/weekNN/*.py, read in name order as one notebook: text files in jupytext's **percent**
format, so a reviewer reads prose as markdown and code as code (jupytext, where installed, opens each part as a
notebook of its own; the lab does not need it). The format, as the lab writes it:

    # %% [markdown]                     a markdown cell; each of its lines is "# " + the line ("#" when empty)
    # ## 2. The causal mask
    #
    # A query may attend to ...

    # %% tags=["setup"]                 a code cell; its lines as they are
    import torch

    # %% nbgrader={"grade": false, "grade_id": "causal_mask", "locked": false, "schema_version": 3, ...}
    def causal_mask(...):

A cell's metadata is written in its header line as jupytext writes it: `key=<JSON>` pairs, here `nbgrader` (an
exercise's solution cell, a graded test cell with its points, a hand-graded markdown answer) and `tags`. Blank lines
that end a cell separate it from the next and are not part of it. Cell ids are derived (an nbgrader cell's grade_id,
else `md-NNN` / `code-NNN` by position), so a rebuild writes the same bytes: tests/test_authoring.py builds every
week into a temporary folder and compares it with the committed notebook.

A markdown cell may hold computed fields, `{{ expression }}`, rendered at build time from tools/weeks/fields.py
(figures from the committed records, never typed); markdown holds no other `{{`. A week's sources are split into
parts of at most 600 lines (tests/test_file_sizes.py), at section headings.
"""
from __future__ import annotations

import argparse
import builtins
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import nbformat  # noqa: E402
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook  # noqa: E402

from grader.course_map import COURSE  # noqa: E402

SOURCES = REPO / "tools" / "weeks"
HEADER = re.compile(r"# %%(?: \[(?P<kind>markdown)\])?(?: (?P<meta>.*))?")
FIELD = re.compile(r"\{\{ (.+?) \}\}")
METADATA_KEYS = ("nbgrader", "tags")
ID_PREFIX = {"markdown": "md", "code": "code"}


def _shown(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def parts(week: int) -> list[Path]:
    """The week's source files, in the order they are read."""
    found = sorted((SOURCES / f"week{week}").glob("*.py"))
    if not found:
        raise FileNotFoundError(f"no sources for week {week}: tools/weeks/week{week}/*.py")
    return found


def parse_metadata(text: str, where: str) -> dict:
    """`key=<JSON> key=<JSON> ...` of a cell's header line."""
    meta, pos, decoder = {}, 0, json.JSONDecoder()
    while pos < len(text):
        m = re.compile(r" *(\w+)=").match(text, pos)
        if not m:
            raise ValueError(f"{where}: cell metadata {text!r} is not key=<JSON> pairs")
        value, pos = decoder.raw_decode(text, m.end())
        if m[1] not in METADATA_KEYS or m[1] in meta:
            raise ValueError(f"{where}: cell metadata key {m[1]!r} (the lab writes {METADATA_KEYS}, once each)")
        meta[m[1]] = value
    return meta


def read_percent(path: Path) -> list[tuple[str, str, dict]]:
    """The cells of one percent-format file: (cell type, source, metadata)."""
    cells: list[tuple[str, list[str], dict]] = []
    for n, line in enumerate(path.read_text(encoding="utf-8").split("\n"), 1):
        where = f"{_shown(path)}:{n}"
        head = HEADER.fullmatch(line)
        if head:
            cells.append((head["kind"] or "code", [], parse_metadata(head["meta"] or "", where)))
        elif not cells:
            if line.strip():
                raise ValueError(f"{where}: text before the first cell marker (`# %%`)")
        elif cells[-1][0] == "markdown" and line and not (line == "#" or line.startswith("# ")):
            raise ValueError(f"{where}: a markdown cell's lines start with '# ' (or are '#', or blank before the next "
                             f"cell): {line!r}")
        else:
            cells[-1][1].append(line)
    out = []
    for kind, lines, meta in cells:
        while lines and lines[-1] == "":
            lines.pop()
        if kind == "markdown":
            lines = [line[2:] for line in lines]
        out.append((kind, "\n".join(lines), meta))
    return out


class _Fields(dict):
    """The names a field may use: tools/weeks/fields.py's (looked up when a field names them), then the builtins."""

    def __missing__(self, name):
        from tools.weeks import fields
        if name not in fields.__all__:
            raise KeyError(name)  # eval looks in the builtins next, then says NameError
        return getattr(fields, name)


def render_fields(text: str) -> str:
    """A markdown cell's text with each `{{ expression }}` replaced by its value."""
    rendered = FIELD.sub(lambda m: str(eval(m[1], {"__builtins__": builtins}, _Fields())), text)
    if "{{" in FIELD.sub("", text):  # ("}}" alone is LaTeX's)
        raise ValueError(f"a field is written `{{{{ expression }}}}`, one space inside each pair of braces: "
                         f"{text[:200]!r}")
    return rendered


def notebook(week: int) -> nbformat.NotebookNode:
    """The week's notebook, built from its sources."""
    cells, ids = [], set()
    for path in parts(week):
        for kind, source, meta in read_percent(path):
            if kind == "markdown":
                cell = new_markdown_cell(render_fields(source).strip("\n"))
            else:
                cell = new_code_cell(source)
            cell.metadata.update(meta)
            cell["id"] = meta.get("nbgrader", {}).get("grade_id") or f"{ID_PREFIX[kind]}-{len(cells):03d}"
            if cell["id"] in ids:
                raise ValueError(f"{_shown(path)}: duplicate cell id / grade_id {cell['id']!r}")
            ids.add(cell["id"])
            cells.append(cell)
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
    nb.metadata["language_info"] = {"name": "python"}
    nbformat.validate(nb)
    return nb


def target(week: int) -> Path:
    """Where the week's notebook goes: solutions/NN/<the course map's notebook>."""
    return REPO / "solutions" / str(week) / next(w.notebook for w in COURSE if w.number == week)


def build(week: int, into: Path | None = None) -> tuple[Path, Path]:
    """Build week `week`'s notebook: written in place, or under `into` at its path relative to the repo (as
    tests/test_authoring.py does). Returns (the notebook's path in the repo, the path written)."""
    path = target(week)
    out = path if into is None else Path(into) / path.relative_to(REPO)
    out.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook(week), str(out))
    return path, out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("weeks", nargs="*", type=int, help="the weeks to build (default: every week of the course map)")
    args = ap.parse_args(argv)
    for week in args.weeks or [w.number for w in COURSE]:
        path, _ = build(week)
        print(f"wrote {path.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
