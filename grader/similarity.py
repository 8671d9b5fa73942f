"""Code copied from the answer key, found in the notebook's source: lib's functions and the instructor's solution.

What it guards: **a renamed or padded copy of the reference is not the student's work.** The bytecode
fingerprints (`grader.fingerprint`) recognise lib's code exactly, in the student's process; this module reads
the submitted source in the trusted process, where nothing the student runs can interfere, and measures how
much of a reference function's code the submission contains, in a form that renaming variables, adding dead
statements, rewording comments and docstrings, changing constants or reordering statements does not change.

How: each function is cut into statements (a compound statement counts its header: `for i in range(n):`
without its body), each statement normalised — every local name and parameter becomes `_`, every number and
string a placeholder, docstrings and `pass` dropped — and hashed; a function is the multiset of those hashes.
The statements the release itself gives the student (the exercise cell outside `### BEGIN/END SOLUTION`) are
taken out of both sides. Containment = the share of the reference's statements found in the submission's.
A submission function that contains at least `THRESHOLD` of a reference function of at least `MIN_STATEMENTS`
statements is reported: `reference_use`, and the exercise scores 0 like any use of lib's implementation.
Shorter references (a two-line mask) are not judged: independent solutions of a few lines coincide.

The threshold is sized on honest code (tests/test_similarity.py): the solutions of weeks 16–21 against every lib
function, and lib's and the solutions' functions against each other, written independently of each other.
"""
from __future__ import annotations

import ast
import hashlib
import os
import re
from collections import Counter
from functools import lru_cache
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
THRESHOLD = 0.9
MIN_STATEMENTS = 12
_SOLUTION_BLOCK = re.compile(r"^[ \t]*### BEGIN SOLUTION.*?^[ \t]*### END SOLUTION[^\n]*\n?", re.S | re.M)


class _Normalise(ast.NodeTransformer):
    """Locals and parameters -> `_`, numbers and strings -> placeholders; globals and attributes kept."""

    def __init__(self, local: set[str]):
        self.local = local

    def visit_Name(self, node):
        return ast.Name(id="_" if node.id in self.local else node.id, ctx=ast.Load())

    def visit_arg(self, node):
        return ast.arg(arg="_", annotation=None)

    def visit_Constant(self, node):
        if isinstance(node.value, (bool, type(None))):
            return node
        return ast.Constant(value="<str>" if isinstance(node.value, (str, bytes)) else 0)

    def visit_keyword(self, node):
        self.generic_visit(node)
        return node


def _locals(fn: ast.AST) -> set[str]:
    names = set()
    for n in ast.walk(fn):
        if isinstance(n, ast.arg):
            names.add(n.arg)
        elif isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)):
            names.add(n.id)
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n is not fn:
            names.add(n.name)
        elif isinstance(n, ast.ExceptHandler) and n.name:
            names.add(n.name)
    return names


_BODIES = ("body", "orelse", "finalbody", "handlers")


def _statements(stmts: list[ast.stmt], norm: _Normalise, out: list[str]) -> None:
    for s in stmts:
        if isinstance(s, ast.Pass) or (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)):
            continue  # `pass` and docstrings / bare constants: dead
        head = type(s)(**{f: ([] if f in _BODIES or f == "cases" else getattr(s, f, None)) for f in s._fields})
        if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            head = ast.Name(id=f"<{type(s).__name__}>", ctx=ast.Load())
        out.append(hashlib.sha1(ast.dump(norm.visit(head)).encode()).hexdigest()[:16])
        for f in _BODIES:
            body = getattr(s, f, None)
            if isinstance(body, list):
                for item in body:
                    if isinstance(item, ast.ExceptHandler):
                        _statements([ast.Expr(value=item.type or ast.Constant(value=None))], norm, out)
                        _statements(item.body, norm, out)
                if body and not isinstance(body[0], ast.ExceptHandler):
                    _statements(body, norm, out)
        for case in getattr(s, "cases", []) or []:
            _statements(case.body, norm, out)


def function_units(fn: ast.FunctionDef) -> Counter:
    """The multiset of normalised statement hashes of one function (nested functions included)."""
    out: list[str] = []
    _statements(fn.body, _Normalise(_locals(fn)), out)
    return Counter(out)


def _without_magics(source: str) -> str:
    """The cell's code as the grader runs it (`grader.notebook.run_cells`): IPython magics and shell escapes dropped."""
    return "\n".join(ln for ln in source.splitlines() if not ln.lstrip().startswith(("%", "!")))


def _definitions(tree: ast.AST, prefix: str = "") -> dict[str, ast.AST]:
    """qualname (as Python spells `co_qualname`) -> node, for every function and method in `tree`, however deep: in
    a class, in another function (`outer.<locals>.inner`), under `if`, `try`, `with` or a loop."""
    found = {}

    def visit(node, qual):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.setdefault(f"{qual}{child.name}", child)
                visit(child, f"{qual}{child.name}.<locals>.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{qual}{child.name}.")
            else:
                visit(child, qual)

    visit(tree, prefix)
    return found


def functions(source: str, prefix: str = "") -> dict[str, Counter]:
    """qualname -> statement multiset, for every function and method defined in `source` (`_definitions`: also
    those nested in a block or in another function; IPython magics dropped)."""
    try:
        tree = ast.parse(_without_magics(source))
    except SyntaxError:
        return {}
    return {qual: function_units(node) for qual, node in _definitions(tree, prefix).items()}


def containment(reference: Counter, submission: Counter) -> float:
    """The share of `reference`'s statements (with multiplicity) that `submission` has too."""
    total = sum(reference.values())
    if not total:
        return 0.0
    return sum((reference & submission).values()) / total


@lru_cache(maxsize=1)
def lib_functions() -> dict[str, Counter]:
    """Every function and method of lib, as `lib.module.qualname`."""
    out = {}
    for path in sorted((REPO_ROOT / "lib").glob("*.py")):
        mod = "lib" if path.stem == "__init__" else f"lib.{path.stem}"
        out.update(functions(path.read_text(encoding="utf-8"), f"{mod}."))
    return out


def _solution_cells(week: int | None, notebook_name: str) -> dict[str, str]:
    """grade_id -> source of the solution notebook's exercise cells (empty when solutions/ is not here)."""
    import json

    if week is None:
        return {}
    path = REPO_ROOT / "solutions" / str(week) / notebook_name
    if not path.is_file():
        candidates = sorted((REPO_ROOT / "solutions" / str(week)).glob("*.ipynb"))
        if len(candidates) != 1:
            return {}
        path = candidates[0]
    try:
        nb = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    out = {}
    for cell in nb.get("cells", []):
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if cell.get("cell_type") == "code" and meta.get("solution") and meta.get("grade_id"):
            src = cell["source"]
            out[meta["grade_id"]] = "".join(src) if isinstance(src, list) else src
    return out


def _given(source: str) -> Counter:
    """What the release gives in a solution cell: its code outside `### BEGIN/END SOLUTION`."""
    units = Counter()
    for fn in functions(_SOLUTION_BLOCK.sub("", source)).values():
        units += fn
    return units


def _references(notebook: Path, week: int | None) -> tuple[dict[str, Counter], dict[str, str]]:
    """(reference name -> statement multiset, the solution's exercise cells by grade_id): lib's functions, and the
    instructor's solution unless `notebook` is that solution or `INFERENCE_LAB_SOLUTION_COPIES=allow`."""
    solutions = _solution_cells(week, notebook.name)
    solution_file = REPO_ROOT / "solutions" / str(week) / notebook.name if week is not None else None
    compare_solution = os.environ.get("INFERENCE_LAB_SOLUTION_COPIES") != "allow" and not (
        solution_file is not None and notebook.resolve() == solution_file.resolve())
    references = {f"lib's {name}": units for name, units in lib_functions().items()}
    if compare_solution:
        for src in solutions.values():
            for name, units in functions(src).items():
                references[f"the instructor's solution (its `{name}`)"] = units
    return references, solutions


def _copies(source: str, references: dict[str, Counter], given: Counter) -> dict[str, tuple[float, str]]:
    """{qualname: (share, reference name)} for the functions of `source` that hold THRESHOLD of a reference
    function of MIN_STATEMENTS or more (what `given` holds, the release's own code, taken out of both)."""
    found = {}
    for fn_name, units in functions(source).items():
        mine = units - given
        best = (0.0, None)
        for ref_name, ref in references.items():
            ref = ref - given
            if sum(ref.values()) < MIN_STATEMENTS:
                continue
            share = containment(ref, mine)
            if share > best[0]:
                best = (share, ref_name)
        if best[0] >= THRESHOLD:
            found[fn_name] = best
    return found


def _why(fn_name: str, share: float, ref_name: str) -> str:
    return (f"`{fn_name}` is a copy of {ref_name}: it holds {share:.0%} of that code's statements (names, constants, "
            f"order and added statements aside)")


def similar_to_reference(notebook: str | Path, cells, week: int | None) -> dict[str, str]:
    """{grade_id: why} for the exercise cells of `cells` (`grader.notebook.exercise_cells`) whose functions contain
    most of a lib function or of the instructor's solution. The solution is not compared with itself, nor at
    all when `INFERENCE_LAB_SOLUTION_COPIES=allow` (the lab's own tests grade copies of the solution)."""
    references, solutions = _references(Path(notebook), week)
    found, defined = {}, None
    for _, grade_id, source in cells:
        if not grade_id:
            continue
        given = _given(solutions[grade_id]) if grade_id in solutions else Counter()
        copies = _copies(source, references, given)
        if copies:
            fn_name, (share, ref_name) = max(copies.items(), key=lambda kv: kv[1][0])
            found[grade_id] = _why(fn_name, share, ref_name)
            continue
        if defined is None:
            defined = _defined(cells, solutions)
        split = _split_copy(grade_id, source, defined, {g for _, g, _ in cells if g}, references, solutions)
        if split is not None:
            found[grade_id] = split
    return found


def _defined(cells, solutions: dict[str, str]) -> dict[str, list]:
    """A function's name -> [("grade_id:qualname", its statements beyond what the release gives, its node)], for
    every function of every cell."""
    defined: dict[str, list] = {}
    for index, g, src in cells:
        try:
            nodes = _definitions(ast.parse(_without_magics(src)))
        except SyntaxError:
            continue
        given = _given(solutions[g]) if g in solutions else Counter()
        for qual, node in nodes.items():
            defined.setdefault(qual.split(".")[-1], []).append((f"{g or index}:{qual}", function_units(node) - given, node))
    return defined


def _split_copy(grade_id: str, source: str, defined: dict, grade_ids: set, references: dict[str, Counter],
                solutions: dict[str, str]) -> str | None:
    """Why an exercise cell's function, taken together with the notebook's functions it calls (by name, however
    deep: `defined`), is a copy of a reference although no one of them is: a copy split across helpers. Another
    exercise's graded function is the student's own answer to it, and is not counted in."""
    try:
        tree = ast.parse(_without_magics(source))
    except SyntaxError:
        return None
    given = _given(solutions[grade_id]) if grade_id in solutions else Counter()
    for qual, node in _definitions(tree).items():
        units, seen, todo, helpers = function_units(node) - given, {f"{grade_id}:{qual}"}, [node], []
        while todo:
            for used in ast.walk(todo.pop()):
                name = used.id if isinstance(used, ast.Name) else used.attr if isinstance(used, ast.Attribute) else None
                for key, helper_units, helper in defined.get(name, ()):
                    if key in seen or (name in grade_ids and name != grade_id):
                        continue
                    seen.add(key)
                    units += helper_units
                    helpers.append(key.split(":", 1)[1])
                    todo.append(helper)
        if not helpers:
            continue
        for ref_name, ref in references.items():
            ref = ref - given
            if sum(ref.values()) >= MIN_STATEMENTS and (share := containment(ref, units)) >= THRESHOLD:
                return (f"`{qual}` with the functions it calls ({', '.join(f'`{h}`' for h in helpers[:4])}) is a copy of "
                        f"{ref_name} split across them: together they hold {share:.0%} of that code's statements")
    return None


def copies_in_cells(notebook: str | Path, cells, week: int | None) -> list[tuple[int, str, str]]:
    """(cell index, qualname, why) for every function of every cell the student's process runs — setup cells and
    the other exercises' cells too — that is a copy of the answer key: the child names the exercise during whose
    call such a function runs (a copy parked in one cell and called from another exercise's)."""
    references, solutions = _references(Path(notebook), week)
    out = []
    for index, grade_id, source in cells:
        given = _given(solutions[grade_id]) if grade_id in solutions else Counter()
        for fn_name, (share, ref_name) in _copies(source, references, given).items():
            out.append((int(index), fn_name, _why(fn_name, share, ref_name)))
    return out


def without_copies(source: str, copies: dict[str, str]) -> str:
    """`source` as the student's process gets it (IPython magics dropped, as `grader.notebook.run_cells` does), with
    the body of each function named in `copies` ({qualname: why}, from `copies_in_cells`) replaced by a `raise` that
    says why: the copy never reaches the student's process, so nothing done there can let it run unseen. Line
    numbers stay as they were."""
    text = _without_magics(source)
    if not copies:
        return text
    tree = ast.parse(text)
    nodes = _definitions(tree)
    spans = sorted(((n.body[0].lineno, n.body[0].col_offset, n.body[-1].end_lineno, n.body[-1].end_col_offset, why)
                    for q, why in copies.items() if (n := nodes.get(q)) is not None), key=lambda s: s[:2])
    lines = text.split("\n")
    out, row, col = [], 1, 0  # the text before (row, col) is written
    for start_row, start_col, end_row, end_col, why in spans:
        if (start_row, start_col) < (row, col):
            continue  # inside a copy already replaced
        out.append(_text_between(lines, (row, col), (start_row, start_col)))
        message = f"{why} — the grader does not run a copy of the answer key: write the function yourself"
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


def reference_units(notebook: str | Path, week: int | None) -> dict[str, dict[str, int]]:
    """The references as plain data, for the student's process: it judges the code the notebook's code compiles
    while it runs (an encoded copy decoded and exec'd) with `copies_in_source`. Statement hashes only: nothing of
    the answer key can be read back from them."""
    return {name: dict(units) for name, units in _references(Path(notebook), week)[0].items()}


def copies_in_source(source: str, references: dict) -> dict[str, str]:
    """{qualname: why} for the functions of `source` that are copies of `references` (`reference_units`)."""
    refs = {name: units if isinstance(units, Counter) else Counter(units) for name, units in references.items()}
    return {fn: _why(fn, share, ref) for fn, (share, ref) in _copies(source, refs, Counter()).items()}


# --- reaching the grader's objects ---------------------------------------------------------------------------------

# The attributes through which code walks from a function or a frame to the objects behind it: a function's module
# globals and closure, a frame's caller and namespaces. In the student's process every one of them leads to the
# grader's own objects (its records of what ran, what it watches), and no audit event reports reading them. An
# exercise has no use for any of them; the notebook's source (and source it compiles while it runs) may not name them.
INTROSPECTION = ("__globals__", "__closure__", "cell_contents", "f_back", "f_locals", "f_globals", "f_builtins")


def introspection_in_source(source: str) -> list[tuple[int, str]]:
    """(line, name) for each use of an `INTROSPECTION` attribute in `source`: read as an attribute (`f.__globals__`)
    or named by a string (`getattr(f, "__closure__")`)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in INTROSPECTION:
            out.append((node.lineno, node.attr))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in INTROSPECTION:
            out.append((node.lineno, node.value))
    return sorted(set(out))


def introspection_why(name: str, where: str) -> str:
    return (f"reads `{name}` ({where}): through a function's globals or closure, or a frame's caller, code reaches "
            f"the grader's own objects in its process; an exercise has no use for it (remove it)")


def introspection_in_cells(cells) -> list[str]:
    """One reason per cell of `cells` (`grader.notebook.exercise_cells`) whose source uses an `INTROSPECTION`
    attribute (`introspection_in_source`)."""
    out = []
    for index, _, source in cells:
        found = introspection_in_source(source)
        if found:
            line, name = found[0]
            out.append(introspection_why(name, f"cell {index}, line {line}"))
    return out
