"""Seed 002's quiz (Q1-Q10, Day 63) is answered across the weeks; week 21's README maps each question to the week,
the cell (its nbgrader grade_id), the section and how it is graded. The map is checked against the solution
notebooks: the cell exists in that section, it is graded the way the map says (a graded test cell that calls the
check, or a hand-graded written answer), and the question just above it is the seed's (one of its words)."""
from __future__ import annotations

import json
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MAP = REPO / "solutions" / "21" / "README.md"
# A word of each seed question that its notebook's wording keeps (seed 002, /work/shared/seeds in the lab's notes).
SEED_WORDS = {1: "13B", 2: "utilization", 3: "32 query heads", 4: "block", 5: "0.6", 6: "INT8", 7: "GPTQ",
              8: "salient", 9: "Q4_K_M", 10: "system prompt"}
ROW = re.compile(r"^\| Q(?P<q>\d+) \| [^|]+ \| (?P<week>\d+) \| `(?P<cell>\w+)` \| (?P<section>[^|]+) \| (?P<how>[^|]+) \|$",
                 re.M)


def _cells(week: int) -> list[dict]:
    return json.loads(next((REPO / "solutions" / str(week)).glob("*.ipynb")).read_text())["cells"]


def map_mismatches(readme: str) -> list[str]:
    """What the README's quiz map gets wrong about the notebooks (empty when every row holds)."""
    rows = [m.groupdict() for m in ROW.finditer(readme)]
    bad = []
    if sorted(int(r["q"]) for r in rows) != list(range(1, 11)):
        bad.append(f"the map has rows for {sorted(int(r['q']) for r in rows)}, not Q1-Q10 once each")
    for r in rows:
        q, week, cell, section, how = int(r["q"]), int(r["week"]), r["cell"], r["section"].strip(), r["how"].strip()
        cells = _cells(week)
        ids = [c["metadata"].get("nbgrader", {}).get("grade_id") for c in cells]
        if cell not in ids:
            bad.append(f"Q{q}: week {week} has no cell `{cell}`")
            continue
        at = ids.index(cell)
        headings = [line for c in cells[:at] if c["cell_type"] == "markdown"
                    for line in "".join(c["source"]).splitlines() if line.startswith("## ")]
        if not headings or headings[-1] != f"## {section}":
            bad.append(f"Q{q}: `{cell}` is in section {headings[-1] if headings else None!r} of week {week}, not "
                       f"'## {section}'")
        question = next("".join(c["source"]) for c in reversed(cells[:at])
                        if c["cell_type"] == "markdown" and not c["metadata"].get("nbgrader"))
        if SEED_WORDS[q] not in question:
            bad.append(f"Q{q}: the question above week {week}'s `{cell}` does not say {SEED_WORDS[q]!r} (seed 002's Q{q})")
        meta = cells[at]["metadata"]["nbgrader"]
        if how.startswith("autograded"):
            test = f"test_{cell}"
            source = "".join(cells[ids.index(test)]["source"]) if test in ids else ""
            if f"`{test}`" not in how or f"check_{cell}(" not in source:
                bad.append(f"Q{q}: week {week} has no graded test cell `{test}` calling check_{cell}")
        elif how.startswith("by hand"):
            if not (cells[at]["cell_type"] == "markdown" and meta.get("grade") and meta.get("points")):
                bad.append(f"Q{q}: week {week}'s `{cell}` is not a hand-graded written answer")
        else:
            bad.append(f"Q{q}: 'how graded' must start with 'autograded' or 'by hand'; it says {how!r}")
        for extra in re.findall(r"by hand \(`(\w+)`\)", how):
            if extra not in ids:
                bad.append(f"Q{q}: week {week} has no cell `{extra}`")
    return bad


def test_the_quiz_map_matches_the_notebooks():
    assert map_mismatches(MAP.read_text()) == []


def test_a_wrong_row_of_the_quiz_map_is_caught():
    """The map's check can fail: a row that names another week, another cell, or the wrong kind of grading."""
    readme = MAP.read_text()
    row = next(m for m in ROW.finditer(readme) if m["q"] == "3")[0]
    assert map_mismatches(readme.replace(row, row.replace("| 16 |", "| 19 |"))), "a wrong week passed"
    assert map_mismatches(readme.replace(row, row.replace("`answer_q3`", "`answer_q2`"))), "a wrong cell passed"
    assert map_mismatches(readme.replace(row, row.replace("autograded: `test_answer_q3`", "by hand: `x`"))), \
        "a wrong kind of grading passed"
    assert map_mismatches(readme.replace(row, "")), "a missing question passed"
