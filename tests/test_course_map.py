"""The course map (grader/course_map.py) against every place that still states the course by hand: each failure names
the file and what in it disagrees with the map.

- the weeks: solutions/NN/, tools/weeks/weekNN.py, grader/checks/weekNN.py and weeks/NN/ are the map's weeks, no more;
- the notebook (solutions/NN/<notebook>): its graded cells are the map's (each exercise's test cell `test_<name>`,
  each written answer), with the map's points; its code solution cells are the exercises' (grade_id = name); each
  test cell calls `check_<name>`; each exercise's section is a heading ("## 2. The causal mask");
- the check registry (grader/checks/weekNN.py): `WEEK`'s notebook, and each `@WEEK.exercise(number, name, section)`
  on `check_<name>`, as the map has them;
- the pytest file (solutions/NN/test_weekNN.py): one `test_exNN_<name>` per exercise, calling `check_<name>`;
- lib: the function or class named like an exercise is the map's `lib` (its reference, a stub in the week's view);
- README.md's week table, and the kind column of each week's README;
- docs/authoring-a-week.md's "Adding a week" names only files that exist.

Week 19's `engine` is the one exercise without a solution cell of its own (`own_cell=False`): the engine is built from
the notebook's parts (`check_engine` takes them), so its test cell and test call it with those."""
from __future__ import annotations

import ast
import importlib
import json
import re
from pathlib import Path

import pytest

from grader.course_map import COURSE, CourseWeek

REPO = Path(__file__).resolve().parent.parent
WEEKS = [w.number for w in COURSE]
WALKTHROUGH = REPO / "docs" / "authoring-a-week.md"


def _checks(week: int):
    return importlib.import_module(f"grader.checks.week{week}")


def _week(number: int) -> CourseWeek:
    return next(w for w in COURSE if w.number == number)


def _table(lines: list[str], start: int) -> tuple[list[str], list[list[str]]]:
    """The markdown table whose header is lines[start]: (header cells, rows of cells)."""
    cells = [[c.strip() for c in line.strip().strip("|").split("|")] for line in lines[start:]]
    rows = []
    for line, row in zip(lines[start + 2:], cells[2:]):
        if not line.startswith("|"):
            break
        rows.append(row)
    return cells[0], rows


def _tables(text: str) -> list[tuple[list[str], list[list[str]]]]:
    lines = text.splitlines()
    return [_table(lines, i) for i, line in enumerate(lines[:-1])
            if line.startswith("|") and re.fullmatch(r"\|[-:| ]+\|", lines[i + 1].strip())]


# --- the weeks ------------------------------------------------------------------------------------------------

def folder_disagreements(course=COURSE, root: Path = REPO) -> list[str]:
    """Week folders and per-week files that are not the map's weeks (or a map week without them)."""
    weeks = {w.folder for w in course}
    bad = []
    if [w.number for w in course] != sorted({w.number for w in course}):
        bad.append(f"grader/course_map.py: the weeks {[w.number for w in course]} are not in order, each once")
    found = {
        "solutions/NN/": {p.name for p in (root / "solutions").iterdir() if p.is_dir() and p.name.isdigit()},
        "weeks/NN/": {p.name for p in (root / "weeks").iterdir() if p.is_dir() and p.name.isdigit()},
        "tools/weeks/weekNN.py": {p.stem[4:] for p in (root / "tools" / "weeks").glob("week[0-9][0-9].py")},
        "grader/checks/weekNN.py": {p.stem[4:] for p in (root / "grader" / "checks").glob("week[0-9][0-9].py")},
    }
    for where, there in found.items():
        for week in sorted(there - weeks):
            bad.append(f"{where.replace('NN', week)} is a week grader/course_map.py does not have: add it to COURSE")
        for week in sorted(weeks - there):
            bad.append(f"grader/course_map.py has week {week}, but there is no {where.replace('NN', week)}")
    return bad


def test_the_weeks_are_the_maps():
    assert WEEKS, "grader/course_map.py declares no week"
    bad = folder_disagreements()
    assert not bad, "\n".join(bad)


# --- the notebook -----------------------------------------------------------------------------------------------

def notebook_disagreements(week: CourseWeek, root: Path = REPO) -> list[str]:
    """What the week's solution notebook says otherwise than the map: graded cells, points, solution cells, the
    checks its test cells call, the sections' headings."""
    where = f"solutions/{week.folder}/{week.notebook}"
    path = root / where
    if not path.is_file():
        return [f"{where} does not exist (grader/course_map.py's notebook of week {week.number})"]
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    meta = [(c, c["metadata"].get("nbgrader", {})) for c in cells]
    graded = {m["grade_id"]: m.get("points") for _, m in meta if m.get("grade")}
    solutions = [m["grade_id"] for c, m in meta if c["cell_type"] == "code" and m.get("solution")]
    sources = {m["grade_id"]: "".join(c["source"]) for c, m in meta if m.get("grade_id")}
    headings = [line.lstrip("# ") for c in cells if c["cell_type"] == "markdown"
                for line in "".join(c["source"]).splitlines() if line.startswith("#")]
    expected = {e.test_cell: e.points for e in week.exercises} | {w.name: w.points for w in week.written}
    bad = []
    numbers = [e.number for e in week.exercises]
    if sorted(numbers) != list(range(1, len(numbers) + 1)):
        bad.append(f"grader/course_map.py: week {week.number}'s exercises are numbered {numbers}, not 1..n once each")
    for gid, points in expected.items():
        if gid not in graded:
            bad.append(f"{where}: no graded cell `{gid}` (grader/course_map.py has it, {points} points)")
        elif graded[gid] != points:
            bad.append(f"{where}: the graded cell `{gid}` has {graded[gid]} points; grader/course_map.py says {points}")
    for gid in graded:
        if gid not in expected:
            bad.append(f"{where}: the graded cell `{gid}` is not in grader/course_map.py's week {week.number}")
    own = [e.name for e in week.exercises if e.own_cell]
    for name in own:
        if name not in solutions:
            bad.append(f"{where}: no solution cell has grade_id `{name}` (the notebook's are {solutions})")
    for gid in solutions:
        if gid not in own:
            bad.append(f"{where}: the solution cell `{gid}` is no exercise of grader/course_map.py's week {week.number}")
    for e in week.exercises:
        if e.test_cell in sources and f"{e.check}(" not in sources[e.test_cell]:
            bad.append(f"{where}: the test cell `{e.test_cell}` does not call {e.check}")
        match = re.match(r"(\d+) \(([^;)]+)", e.section)
        if not match or not any(h.startswith(f"{match[1]}. {match[2]}") for h in headings):
            bad.append(f"{where}: `{e.name}`'s section {e.section!r} (grader/course_map.py) is not a heading of the "
                       f"notebook (\"## {e.section.split(' (')[0]}. ...\")")
    return bad


@pytest.mark.parametrize("week", WEEKS)
def test_the_notebook_has_the_maps_graded_cells(week):
    bad = notebook_disagreements(_week(week))
    assert not bad, "\n".join(bad)


# --- the check registry and the pytest file ---------------------------------------------------------------------

def registry_disagreements(week: CourseWeek, checks) -> list[str]:
    """What grader/checks/weekNN.py registers otherwise than the map."""
    where = f"grader/checks/week{week.number}.py"
    registered = checks.WEEK.exercises  # name -> (number, section)
    bad = []
    if (checks.WEEK.number, checks.WEEK.notebook) != (week.number, week.notebook):
        bad.append(f"{where}: WEEK = Week({checks.WEEK.number}, {checks.WEEK.notebook!r}); grader/course_map.py has "
                   f"week {week.number}'s notebook {week.notebook!r}")
    for e in week.exercises:
        check = getattr(checks, e.check, None)
        if check is None:
            bad.append(f"{where} has no {e.check} (exercise {e.number}, `{e.name}`, in grader/course_map.py)")
        elif getattr(check, "exercise", None) != (week.number, e.number, e.name):
            bad.append(f"{where}: {e.check} is registered as {getattr(check, 'exercise', None)}, not "
                       f"{(week.number, e.number, e.name)}")
        if e.name not in registered:
            bad.append(f"{where}: `{e.name}` has no @WEEK.exercise")
        elif registered[e.name] != (e.number, e.section):
            bad.append(f"{where}: @WEEK.exercise{(registered[e.name][0], e.name, registered[e.name][1])}; "
                       f"grader/course_map.py has number {e.number}, section {e.section!r}")
    names = {e.name for e in week.exercises}
    for name in registered:
        if name not in names:
            bad.append(f"{where}: @WEEK.exercise registers `{name}`, which is no exercise of grader/course_map.py's "
                       f"week {week.number}")
    return bad


def pytest_file_disagreements(week: CourseWeek, root: Path = REPO) -> list[str]:
    """What solutions/NN/test_weekNN.py tests otherwise than the map: one test_exNN_<name> per exercise."""
    where = f"solutions/{week.folder}/test_week{week.number}.py"
    tree = ast.parse((root / where).read_text(encoding="utf-8"))
    tests = {fn.name: ast.unparse(fn) for fn in tree.body
             if isinstance(fn, ast.FunctionDef) and fn.name.startswith("test_ex")}
    bad = []
    for e in week.exercises:
        if e.pytest_name not in tests:
            numbered = [t for t in tests if t.startswith(f"test_ex{e.number:02d}_")]
            bad.append(f"{where} has no {e.pytest_name} (tests numbered {e.number:02d}: {numbered})")
        elif f"{e.check}(" not in tests[e.pytest_name]:
            bad.append(f"{where}: {e.pytest_name} does not call checks.{e.check}")
    for test in sorted(set(tests) - {e.pytest_name for e in week.exercises}):
        bad.append(f"{where}: {test} names no exercise of grader/course_map.py's week {week.number}")
    return bad


@pytest.mark.parametrize("week", WEEKS)
def test_the_checks_and_tests_are_the_maps(week):
    bad = registry_disagreements(_week(week), _checks(week)) + pytest_file_disagreements(_week(week))
    assert not bad, "\n".join(bad)


def test_a_renamed_check_is_named(monkeypatch):
    """Renaming the check of one exercise (and not the map, its cell, test cell and pytest test) is caught, by name."""
    checks = _checks(16)
    monkeypatch.setitem(checks.WEEK.exercises, "causal_masks", checks.WEEK.exercises["causal_mask"])
    monkeypatch.delitem(checks.WEEK.exercises, "causal_mask")
    bad = registry_disagreements(_week(16), checks)
    assert any("`causal_masks`, which is no exercise" in b for b in bad), bad
    assert any("`causal_mask` has no @WEEK.exercise" in b for b in bad), bad


# --- lib ----------------------------------------------------------------------------------------------------------

def lib_disagreements(week: CourseWeek, lib_defs: dict[str, set[str]]) -> list[str]:
    """The lib function or class named like each exercise (lib_defs: `lib.module` -> its names) against the map's."""
    bad = []
    for e in week.exercises:
        named = sorted(f"{module}.{e.name}" for module, defs in lib_defs.items() if e.name in defs)
        if named != ([e.lib] if e.lib else []):
            bad.append(f"lib/: week {week.number}'s `{e.name}` is defined as {named or 'nothing'}; grader/course_map.py "
                       f"says lib={e.lib!r}")
    return bad


@pytest.mark.parametrize("week", WEEKS)
def test_lib_code_named_like_an_exercise_is_the_maps_reference_and_a_stub_in_its_weeks_view(week):
    """The rule for lib's names: lib's function or class named like an exercise is that exercise's reference (the
    answer key), so in the week's view (grader/view.py) it is a stub, whatever else the week lets the notebook use."""
    from grader.view import _read_lib, kept

    lib = _read_lib()
    bad = lib_disagreements(_week(week), {m: set(mod.defs) for m, mod in lib.items()})
    assert not bad, "\n".join(bad)
    spec = _checks(week).WEEK.view()
    named = [(m, n) for m, mod in lib.items() for n in mod.defs if n in spec.deny]
    assert named or week == 18, f"week {week}: no lib definition is named like an exercise"  # 18's are in lib.spec_decode.speculative
    kept_ones = [f"{m}.{n}" for m, n in named if kept(spec, m, n)]
    assert not kept_ones, f"week {week}: lib code named like an exercise keeps its code in the view: {kept_ones}"


# --- the READMEs ----------------------------------------------------------------------------------------------------

def week_table_disagreements(course=COURSE, root: Path = REPO) -> list[str]:
    """README.md's table of weeks (week, topic, notebook link) against the map."""
    tables = [rows for head, rows in _tables((root / "README.md").read_text(encoding="utf-8"))
              if head[:2] == ["week", "topic"]]
    if len(tables) != 1:
        return [f"README.md: {len(tables)} tables headed | week | topic | ... |, not one"]
    got = [tuple(row[:3]) for row in tables[0]]
    want = [(w.folder, w.topic, f"[`weeks/{w.folder}`](weeks/{w.folder})") for w in course]
    bad = [f"README.md's week table has {row}, which grader/course_map.py does not" for row in got if row not in want]
    bad += [f"README.md's week table lacks {row} (grader/course_map.py)" for row in want if row not in got]
    if not bad and got != want:
        bad.append(f"README.md's week table is in the order {[r[0] for r in got]}, not the map's")
    return bad


def readme_kind(text: str) -> str:
    """A kind as a week's README states it now: the part after "→" (November → now), without bold, parenthesized
    remarks and what follows a colon, comma or semicolon — "**design** (given as properties: ...)" is "design"."""
    text = text.split("→")[-1].replace("**", "")
    while re.search(r"\([^()]*\)", text):
        text = re.sub(r"\([^()]*\)", "", text)
    return " ".join(re.split(r"[:,;]", text)[0].split())


def kind_disagreements(week: CourseWeek, root: Path = REPO) -> list[str]:
    """The week README's table of exercises (| ex | name | ... | kind ... |) against the map: each numbered row's name
    and kind."""
    where = f"solutions/{week.folder}/README.md"
    rows = {}
    for head, table in _tables((root / where).read_text(encoding="utf-8")):
        kind = next((i for i, h in enumerate(head) if h.startswith("kind")), None)
        if head[0] != "ex" or "name" not in head or kind is None:
            continue
        for row in table:
            if row[0].isdigit():  # "—": written answers, not exercises
                cell = row[head.index("name")]
                name = re.search(r"`(\w+)`", cell) or re.match(r"(\w+)", cell)  # week 19's engine has no backticks
                rows[int(row[0])] = (name[1], readme_kind(row[kind]))
    if not rows:
        return [f"{where} has no table headed | ex | name | ... | kind ... |"]
    want = {e.number: (e.name, e.kind) for e in week.exercises}
    bad = []
    for number in sorted(set(rows) | set(want)):
        if rows.get(number) != want.get(number):
            bad.append(f"{where}: exercise {number} is {rows.get(number, 'missing')} (name, kind); "
                       f"grader/course_map.py has {want.get(number, 'no such exercise')}")
    return bad


def test_readmes_week_table_is_the_maps():
    bad = week_table_disagreements()
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("week", WEEKS)
def test_the_weeks_readme_states_the_maps_kinds(week):
    bad = kind_disagreements(_week(week))
    assert not bad, "\n".join(bad)


# --- the walkthrough ------------------------------------------------------------------------------------------------

def walkthrough_paths(text: str) -> list[str]:
    """The file paths (`a/b.py`, `README.md`) that docs/authoring-a-week.md's "Adding a week" names, in order."""
    section = text.split("## Adding a week", 1)[1].split("\n## ", 1)[0]
    return list(dict.fromkeys(p for p in re.findall(r"`([\w./<>-]+)`", section)
                              if re.search(r"\.(py|md|ipynb|sh)$", p) or p.endswith("/")))


def missing_paths(paths: list[str], course=COURSE, root: Path = REPO) -> list[str]:
    """The paths that name no file: NN stands for each week of the map, <anything> for any name."""
    bad = []
    for path in paths:
        for week in ([w.folder for w in course] if "NN" in path else [None]):
            pattern = re.sub(r"<[^>]+>", "*", path.replace("NN", week) if week else path)
            if not any(root.glob(pattern.rstrip("/"))):
                bad.append(f"docs/authoring-a-week.md, \"Adding a week\": `{path}` names no file"
                           + (f" for week {week} ({pattern})" if week else ""))
    return bad


def test_the_walkthrough_names_files_that_exist():
    paths = walkthrough_paths(WALKTHROUGH.read_text(encoding="utf-8"))
    assert paths and paths[0] == "grader/course_map.py", f"the walkthrough names the course map first: {paths}"
    bad = missing_paths(paths)
    assert not bad, "\n".join(bad)
