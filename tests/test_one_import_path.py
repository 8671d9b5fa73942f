"""One import path per name (issue 59): no lib module re-exports another's names.

- A lib module imports a name from another lib module only to use it: each such name occurs in the module's code.
- Nobody (lib, grader, tests, benchmarks, tools, the solution notebooks' code cells) imports a name from a lib module
  that only imported it: `from lib.batching.engine import PrefixCache` or `spec.early_exit_draft` (with `spec` bound to
  `lib.spec_decode.speculative`) fail; the name is taken from the module that defines it.

Read from the code's own imports (those inside functions included); nothing is imported or run."""
from __future__ import annotations

import ast
import json
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCANNED = ("lib", "grader", "tests", "benchmarks", "tools")


def _module(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _lib_imports(tree: ast.AST) -> dict[str, str]:
    """name bound in this module -> the lib module it was imported from (`from lib.X import name`)."""
    return {a.asname or a.name: node.module for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").startswith("lib.")
            for a in node.names}


LIB = {_module(p): ast.parse(p.read_text(encoding="utf-8")) for p in sorted((REPO / "lib").rglob("*.py"))}
BORROWED = {mod: set(_lib_imports(tree)) for mod, tree in LIB.items()}  # names a lib module imported, not defined


def _sources():
    for pkg in SCANNED:
        for path in sorted((REPO / pkg).rglob("*.py")):
            if "fixtures" not in path.parts:
                yield str(path.relative_to(REPO)), path.read_text(encoding="utf-8")
    for nb in sorted((REPO / "solutions").glob("*/*.ipynb")):
        for i, cell in enumerate(json.loads(nb.read_text(encoding="utf-8"))["cells"]):
            if cell["cell_type"] == "code":
                lines = "".join(cell["source"]).splitlines()
                yield f"{nb.relative_to(REPO)}[cell {i}]", "\n".join(
                    "pass" if ln.lstrip().startswith(("%", "!")) else ln for ln in lines)


def through_a_facade(source: str) -> list[str]:
    """`lib.X.name` uses in `source` whose name lib.X only imported from elsewhere."""
    found, aliases = [], {}
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and not node.level and node.module in BORROWED:
            found += [f"from {node.module} import {a.name}" for a in node.names if a.name in BORROWED[node.module]]
            aliases.update({a.asname or a.name: f"{node.module}.{a.name}" for a in node.names
                            if f"{node.module}.{a.name}" in BORROWED})  # `from lib.pkg import module`
        elif isinstance(node, ast.Import):
            aliases.update({a.asname: a.name for a in node.names if a.asname and a.name in BORROWED})
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            base = ast.unparse(node.value)
            mod = aliases.get(base, base)
            if mod in BORROWED and node.attr in BORROWED[mod]:
                found.append(f"{base}.{node.attr}")
    return found


def test_a_lib_module_imports_only_what_it_uses():
    unused = {}
    for mod, tree in LIB.items():
        used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        names = [name for name in BORROWED[mod] if name not in used]
        if names:
            unused[mod] = sorted(names)
    assert not unused, f"imported from another lib module and never used (a re-export?): {unused}"


def test_every_name_is_imported_from_its_own_module():
    bad = {}
    for where, source in _sources():
        try:
            hits = through_a_facade(source)
        except SyntaxError:
            continue  # a notebook cell with IPython syntax: not Python
        if hits:
            bad[where] = sorted(set(hits))
    assert not bad, f"names taken from a lib module that only imported them (import from the defining module): {bad}"


def test_the_check_sees_a_facade():
    mod = next(m for m, names in BORROWED.items() if names and m != "lib")  # a lib module importing a lib name
    name = sorted(BORROWED[mod])[0]
    package, short = mod.rsplit(".", 1)
    assert through_a_facade(f"from {mod} import {name}") == [f"from {mod} import {name}"]
    assert through_a_facade(f"from {package} import {short} as m\nm.{name}") == [f"m.{name}"]
    assert through_a_facade(f"import {mod} as m\nm.{name}") == [f"m.{name}"]
    assert not through_a_facade(f"import {mod} as m\nm.__name__")
