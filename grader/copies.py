"""Copies of the answer key in a notebook, judged in the trusted process: the references (lib's code, the
instructor's solution and, in week 20, gguf-py's quantizers and writer — the oracle its checks compare bytes with —,
read here: the student's process cannot read the first two, and has stubs for gguf-py's), each exercise's verdict,
the copies in every cell and their bodies replaced before the cells reach the child. The measure itself is
`grader.similarity`'s (the child judges code compiled while the notebook runs with it, on these references' hashes)."""
from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import marshal
import os
import re
from collections import Counter
from functools import lru_cache
from pathlib import Path

from grader.similarity import (MIN_FINGERPRINTS, MIN_STATEMENTS, References, Source, Unit, copies_of, definitions,
                               why_copy, without_magics, ratio)

REPO_ROOT = Path(__file__).resolve().parent.parent
COMMON_IN = 3  # a fingerprint or statement in more functions of lib and the solutions than this is idiom
_SOLUTION_BLOCK = re.compile(r"^[ \t]*### BEGIN SOLUTION.*?^[ \t]*### END SOLUTION[^\n]*\n?", re.S | re.M)


def _units_of(source: Source, label) -> dict[str, Unit]:
    """A source's reference units: each function, method and class, and each function or class with the functions
    and classes of the same source it uses (a helper of a few lines is compared within its caller)."""
    out = {}
    for name, unit in source.units.items():
        if ".<locals>." in name:
            continue  # part of the function it is in
        out[label(name)] = unit
        if "." not in name.split(":")[-1]:
            whole, helpers = source.closure(name)
            if helpers:
                out[f"{label(name)} with {', '.join(f'`{h.rsplit(chr(46), 1)[-1]}`' for h in helpers[:4])}"] = whole
    return out


@lru_cache(maxsize=1)
def _lib_sources() -> dict[str, Source]:
    """lib's modules, `lib.module` -> its Source."""
    return {mod: Source([(path.name, path.read_text(encoding="utf-8"))]) for mod, path in _lib_paths().items()}


@lru_cache(maxsize=8)
def _solution_source(path: str) -> Source:
    return Source(sorted(_cells_of(path).items()))


@lru_cache(maxsize=1)
def _common() -> tuple[frozenset, frozenset]:
    """The idiom (`_read_common`)."""
    return _stored()[1]


def _lib_units() -> dict[str, Unit]:
    """lib's units (`_read_lib_units`), a dict of the caller's own."""
    return dict(_stored()[0])


# lib's units and the idiom take 4-6 s of a core to read (a few thousand functions parsed twice): once per tree, not
# once per process (each test process, each notebook kernel of an autograde, each `pytest weeks/NN`). Stored as
# marshal data (hashes, names and counts: nothing that runs), named by a hash of everything they are read from.
STORE = REPO_ROOT / "data" / "cache" / "similarity"


@lru_cache(maxsize=1)
def _stored() -> tuple[dict[str, Unit], tuple[frozenset, frozenset]]:
    """(lib's units, the idiom), from `STORE` when this tree's lib, solutions and measure made them, else read now
    and stored (a store that cannot be written or read is no error: they are read again)."""
    file = _store_file()
    try:
        units, (fp, st) = marshal.loads(file.read_bytes())
        return ({name: Unit(kg, ufp, Counter(ust)) for name, (kg, ufp, ust) in units.items()},
                (frozenset(fp), frozenset(st)))
    except (OSError, ValueError, EOFError, TypeError, KeyError):
        pass
    common = _read_common()
    units = _read_lib_units(common)
    try:
        STORE.mkdir(parents=True, exist_ok=True)
        part = file.with_suffix(f".{os.getpid()}.part")
        part.write_bytes(marshal.dumps(({name: (u.kg, u.fp, dict(u.st)) for name, u in units.items()}, common)))
        os.replace(part, file)
        for old in STORE.glob("index-*.marshal"):  # made from an earlier tree
            if old != file:
                old.unlink(missing_ok=True)
    except OSError:
        pass
    return units, common


def _store_file() -> Path:
    """Where `_stored` keeps what it reads from this tree: named by the files it is read from, and the code that reads."""
    key = hashlib.sha256()
    for path in _index_sources():
        data = path.read_bytes()
        key.update(f"{path.name}\0{len(data)}\0".encode() + data)
    return STORE / f"index-{key.hexdigest()[:24]}.marshal"


def _index_sources() -> list[Path]:
    return [Path(__file__), REPO_ROOT / "grader" / "similarity.py", *_lib_paths().values(),
            *sorted((REPO_ROOT / "solutions").glob("*/*.ipynb"))]


def _read_common() -> tuple[frozenset, frozenset]:
    """(fingerprints, statements) found in more than COMMON_IN of the functions and methods of lib and of the solutions
    of every week: the idiom any code of the lab writes (`_ = _.shape[0]`, a loop over blocks), no evidence of a copy.
    They are taken out of the references, as MOSS ignores what many programs share."""
    fps, sts = Counter(), Counter()
    paths = sorted((REPO_ROOT / "solutions").glob("*/*.ipynb"))
    for source in [*_lib_sources().values(), *(_solution_source(str(p)) for p in paths)]:
        for name, unit in source.units.items():
            if name not in source.members and ".<locals>." not in name:
                fps.update(unit.fp)
                sts.update(set(unit.st))
    return (frozenset(h for h, n in fps.items() if n > COMMON_IN), frozenset(h for h, n in sts.items() if n > COMMON_IN))


# Besides lib and the solution: the oracle the week-20 checks compare bytes with, gguf-py. The student's
# environment has it (its quantizers are ~15 lines of numpy each); calling it is seen by its fingerprint
# (`grader.fingerprint.ORACLE_MODULES`), a copy with one name changed only here. Read from the package installed
# beside the grader (the student's process has stubs in its place: `grader.view.REWRITTEN_PACKAGES`).
ORACLE_SOURCES = {"gguf.quants": "quants.py", "gguf.gguf_writer": "gguf_writer.py"}
ORACLE_WEEKS = frozenset({20})  # the weeks whose checks compare with gguf-py (and whose exercises it implements)
# The fingerprints a gguf-py reference needs to be judged on (lib's: `similarity.MIN_FINGERPRINTS`, 60): gguf's Q8_0
# quantizer with `np_roundf` has 44 once the idiom is out. Measured (tests/test_redteam7_gguf_copies.py): the honest
# week-20 variants hold at most 36 % of it, the red team's edited copy 64 %; nothing honest comes within 0.9 of a
# threshold against any gguf-py reference.
ORACLE_MIN_FINGERPRINTS = 40
# What a copy of a class's method writes for the class's constants (`cls.block_size // 2` is `16` in a function of
# Q4_1 alone): spelled as the numbers they are in the references (folded: `QK_K // 16` is `16`), so that a copy's
# constants and the reference's are the same token (`grader.similarity` makes every number one placeholder, so
# a class whose blocks are not 32 long is read right too).
_ORACLE_CONSTANTS = {"cls.block_size": 32, "cls.K_SCALE_SIZE": 12, "QK_K": 256}
_ORACLE_CONSTANT = re.compile(r"(?<![\w.])(cls\.block_size|cls\.K_SCALE_SIZE|QK_K)\b(?!\s*(?:,|=(?!=)))"
                              r"(?:\s*//\s*(\d+)\b)?")


def _spelled_as_numbers(text: str) -> str:
    def number(m):  # not where they are assigned, nor in an import
        value = _ORACLE_CONSTANTS[m.group(1)]
        return str(value // int(m.group(2)) if m.group(2) else value)
    return "\n".join(line if line.lstrip().startswith(("from ", "import ")) else _ORACLE_CONSTANT.sub(number, line)
                     for line in text.split("\n"))


def _oracle_paths() -> dict[str, Path]:
    spec = importlib.util.find_spec("gguf")
    if spec is None or not spec.submodule_search_locations:
        return {}
    root = Path(next(iter(spec.submodule_search_locations)))
    return {mod: root / name for mod, name in ORACLE_SOURCES.items() if (root / name).is_file()}


@lru_cache(maxsize=1)
def _oracle_sources() -> dict[str, Source]:
    """gguf-py's quantizers and writer, `gguf.module` -> its Source (empty where gguf-py is not installed)."""
    out = {}
    for mod, path in _oracle_paths().items():
        out[mod] = Source([(path.name, _spelled_as_numbers(path.read_text(encoding="utf-8")))])
    return out


@lru_cache(maxsize=1)
def _oracle_units() -> dict[str, Unit]:
    """Every function, method and class of gguf-py's quantizers and writer, as `gguf-py's gguf.module.qualname`,
    each (methods too: `Q8_0.quantize_blocks` calls the module's `np_roundf`) also with the module's functions it
    uses. gguf's helpers are 3-6 lines: compared within their caller, or their class (`Q4_K` is `get_scale_min`
    and `dequantize_blocks`)."""
    out = {}
    for mod, source in _oracle_sources().items():
        out.update(_units_of(source, lambda name, mod=mod: f"gguf-py's {mod}.{name}"))
        for name in source.units:
            if "." in name and ".<locals>." not in name and name not in source.members:
                whole, helpers = source.closure(name)
                if helpers:
                    shown = ", ".join(f"`{h.rsplit('.', 1)[-1]}`" for h in helpers[:4])
                    out[f"gguf-py's {mod}.{name} with {shown}"] = whole
    return out


@lru_cache(maxsize=1)
def _lib_sources_unchecked() -> dict[str, Source]:
    """lib's modules without their argument checks (`if ...: raise`): what a copy drops first."""
    return {mod: Source([(path.name, path.read_text(encoding="utf-8"))], checks=False)
            for mod, path in _lib_paths().items()}


def _lib_paths() -> dict[str, Path]:
    files = {p.relative_to(REPO_ROOT).with_suffix("").parts: p for p in sorted((REPO_ROOT / "lib").rglob("*.py"))}
    return {".".join(parts[:-1] if parts[-1] == "__init__" else parts): p for parts, p in files.items()}


def _read_lib_units(common) -> dict[str, Unit]:
    """Every function, method and class of lib (with its helpers), as `lib's lib.module.qualname`; and, where its
    argument checks are a good part of it, the same without them, as `lib's lib.module.qualname (its argument checks aside)` — a
    copy that drops the checks and cuts the rest into helpers (the red team's #62b/#62c, `paged_attention`) holds
    most of what is left. Only where what is left is still large enough to judge on both measures
    (`similarity.MIN_FINGERPRINTS`, `MIN_STATEMENTS`): a small class's core is what any solution writes."""
    out = {}
    common_fp, common_st = common
    for mod, source in _lib_sources().items():
        whole = _units_of(source, lambda name, mod=mod: f"lib's {mod}.{name}")
        out.update(whole)
        for name, unit in _units_of(_lib_sources_unchecked()[mod], lambda name, mod=mod: f"lib's {mod}.{name}").items():
            st = sum(n for h, n in unit.st.items() if h not in common_st)
            if unit.st != whole[name].st and len(unit.fp - common_fp) >= MIN_FINGERPRINTS and st >= MIN_STATEMENTS:
                base, *helpers = name.split(" with ", 1)
                out[" with ".join([f"{base} (its argument checks aside)", *helpers])] = unit
    return out


def _solution_cells(week: int | None, notebook_name: str) -> dict[str, str]:
    """grade_id -> source of the solution notebook's exercise cells (empty when solutions/ is not here)."""
    if week is None:
        return {}
    path = REPO_ROOT / "solutions" / str(week) / notebook_name
    if not path.is_file():
        candidates = sorted((REPO_ROOT / "solutions" / str(week)).glob("*.ipynb"))
        if len(candidates) != 1:
            return {}
        path = candidates[0]
    return _cells_of(str(path))


@lru_cache(maxsize=8)
def _cells_of(path: str) -> dict[str, str]:
    try:
        nb = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    out = {}
    for cell in nb.get("cells", []):
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if cell.get("cell_type") == "code" and meta.get("solution") and meta.get("grade_id"):
            src = cell["source"]
            out[meta["grade_id"]] = "".join(src) if isinstance(src, list) else src
    return out


@lru_cache(maxsize=64)
def _given_unit(source: str) -> Unit:
    """What the release gives in a solution cell: its code outside `### BEGIN/END SOLUTION`."""
    given = Source([(0, _SOLUTION_BLOCK.sub("", source))])
    unit = Unit()
    for name, part in given.units.items():
        if name not in given.members:
            unit = unit + part
    return unit


def _given(solutions: dict[str, str], grade_id) -> Unit:
    return _given_unit(solutions[grade_id]) if grade_id in solutions else Unit()


@lru_cache(maxsize=16)
def _indexed(solution_path: str | None, compare_solution: bool, oracle: bool) -> References:
    units = _lib_units()
    if compare_solution and solution_path is not None:
        units.update(_units_of(_solution_source(solution_path), lambda name: f"the instructor's solution (its `{name}`)"))
    smaller = {}
    if oracle:
        smaller = {name: ORACLE_MIN_FINGERPRINTS for name in _oracle_units()}
        units.update(_oracle_units())
    return References(units, _common(), min_fingerprints=smaller)


def _references(notebook: Path, week: int | None) -> tuple[References, dict[str, str], frozenset]:
    """(the references, the solution's exercise cells by grade_id, the answer key's own k-grams): lib's code,
    gguf-py's in `ORACLE_WEEKS`, and the instructor's solution unless `notebook` is that solution or `INFERENCE_LAB_SOLUTION_COPIES=allow`. When the
    solution is not compared, it is graded as the answer key it is: code made (nearly, `similarity.KEY_SHARE`)
    wholly of its k-grams is not compared with lib either (it was written with lib at hand: week 17's forward holds 82 % of lib's; a class's students are
    compared with the solution, and a copy of it is one of the answer key)."""
    solutions = _solution_cells(week, notebook.name)
    solution_file = REPO_ROOT / "solutions" / str(week) / notebook.name if week is not None else None
    if solution_file is not None and not solution_file.is_file():
        found = sorted((REPO_ROOT / "solutions" / str(week)).glob("*.ipynb"))
        solution_file = found[0] if len(found) == 1 else None
    compare_solution = os.environ.get("INFERENCE_LAB_SOLUTION_COPIES") != "allow" and not (
        solution_file is not None and notebook.resolve() == solution_file.resolve())
    key = frozenset()
    if not compare_solution and solution_file is not None:
        key = frozenset().union(*(u.kg for u in _solution_source(str(solution_file)).units.values()))
    oracle = week in ORACLE_WEEKS
    return _indexed(str(solution_file) if solution_file else None, compare_solution, oracle), solutions, key


def scores(notebook: str | Path, cells, week: int | None) -> dict[str, tuple]:
    """{grade_id: (token share, statement share, reference, qualname, helpers)} for each exercise cell of `cells`
    (`grader.notebook.exercise_cells`): of its functions and classes, alone or with the notebook's functions they
    call (another exercise's graded one aside), the one nearest to copying a reference (`References.best`)."""
    references, solutions, key = _references(Path(notebook), week)
    source = Source([(index, text) for index, _, text in cells])
    graded = {g for _, g, _ in cells if g}
    found = {}
    for index, grade_id, _ in cells:
        if not grade_id:
            continue
        given, best = _given(solutions, grade_id), None
        for name in [n for n, where in source.where.items() if where == index]:
            candidates = [(source.units[name], [])]
            if "." not in name:  # a function or class of the cell, with the notebook's functions it uses
                whole, helpers = source.closure(name, exclude=graded - {grade_id})
                if helpers:
                    candidates.append((whole, helpers))
            for unit, helpers in candidates:
                hit = references.best(unit, given, key)
                if hit is not None and (best is None or ratio(hit) > ratio(best)):
                    best = (*hit, name, helpers)
        if best is not None:
            found[grade_id] = best
    return found


def similar_to_reference(notebook: str | Path, cells, week: int | None) -> dict[str, str]:
    """{grade_id: why} for the exercise cells of `cells` whose functions or classes, alone or with the notebook's
    functions they call, are copies of a reference unit (lib's, or the instructor's solution's): `scores` at
    TOKEN_THRESHOLD or THRESHOLD. The solution is not compared with itself, nor at all when
    `INFERENCE_LAB_SOLUTION_COPIES=allow` (the lab's own tests grade copies of the solution)."""
    return similar_and_nearest(notebook, cells, week)[0]


def similar_and_nearest(notebook: str | Path, cells, week: int | None) -> tuple[dict[str, str], dict[str, str]]:
    """`similar_to_reference`'s answer, and {grade_id: "reference NN% (tokens NN%, statements NN%)"}: each exercise's
    nearest reference, below the thresholds too. A copy re-spelled line by line stays under them (red team 10's
    #10-#15: 23-55 % of the tokens, where honest work can score as much), so the instructor's status file shows how
    near each exercise came (`nearest_reference`)."""
    found = scores(notebook, cells, week)
    return ({grade_id: why_copy(name, (tok, st, ref), helpers)
             for grade_id, (tok, st, ref, name, helpers) in found.items() if ratio((tok, st, ref)) >= 1},
            {grade_id: f"{ref} {max(tok, st):.0%} (tokens {tok:.0%}, statements {st:.0%})"
             for grade_id, (tok, st, ref, _, _) in found.items()})


def copies_in_cells(notebook: str | Path, cells, week: int | None) -> list[tuple[int, str, str]]:
    """(cell index, qualname, why) for every function of every cell the student's process runs — setup cells and
    the other exercises' cells too — that is a copy of the answer key, alone or as a method of a class that is one:
    the child names the exercise during whose call such a function runs (a copy parked in one cell and called from
    another exercise's)."""
    references, solutions, key = _references(Path(notebook), week)
    grade_of = {index: grade_id for index, grade_id, _ in cells}
    source = Source([(index, text) for index, _, text in cells])
    return [(int(i), q, why) for i, q, why in copies_of(source, references, lambda i: _given(solutions, grade_of[i]), key)]


def reference_units(notebook: str | Path, week: int | None) -> dict:
    """The references as plain data, for the student's process: it judges the code the notebook's code compiles
    while it runs (an encoded copy decoded and exec'd) with `copies_in_source`. Hashes only: nothing of the answer
    key can be read back from them."""
    return _references(Path(notebook), week)[0].data


def without_copies(source: str, copies: dict[str, str]) -> str:
    """`source` as the student's process gets it (IPython magics dropped, as `grader.notebook.run_cells` does), with
    the body of each function named in `copies` ({qualname: why}, from `copies_in_cells`) replaced by a `raise` that
    says why: the copy never reaches the student's process, so nothing done there can let it run unseen. Line
    numbers stay as they were."""
    text = without_magics(source)
    if not copies:
        return text
    tree = ast.parse(text)
    nodes = definitions(tree)
    spans = sorted(((n.body[0].lineno, n.body[0].col_offset, n.body[-1].end_lineno, n.body[-1].end_col_offset, why)
                    for q, why in copies.items() if (n := nodes.get(q)) is not None), key=lambda s: s[:2])
    lines = text.split("\n")
    out, row, col = [], 1, 0  # the text before (row, col) is written
    for start_row, start_col, end_row, end_col, why in spans:
        if (start_row, start_col) < (row, col):
            continue  # inside a copy already replaced
        out.append(_text_between(lines, (row, col), (start_row, start_col)))
        source_of = "gguf-py's code (the oracle the check compares with)" if "gguf-py's" in why else "the answer key"
        message = f"{why} — the grader does not run a copy of {source_of}: write the function yourself"
        out.append(f"raise RuntimeError({message!r})" + "\n" * (end_row - start_row))
        row, col = end_row, end_col
    out.append(_text_between(lines, (row, col), (len(lines), len(lines[-1]))))
    return "".join(out)


def _text_between(lines: list[str], start: tuple[int, int], end: tuple[int, int]) -> str:
    """The text of `lines` from (row, column) `start` to `end` (rows from 1, columns in UTF-8 bytes, as `ast` counts)."""
    (r0, c0), (r1, c1) = start, end
    def part(row, a=None, b=None):
        raw = lines[row - 1].encode("utf-8")
        return raw[a:b].decode("utf-8")
    if r0 == r1:
        return part(r0, c0, c1)
    return "\n".join([part(r0, c0)] + [lines[r - 1] for r in range(r0 + 1, r1)] + [part(r1, None, c1)])


