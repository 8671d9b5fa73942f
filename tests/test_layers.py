"""No import circles in lib/, grader/ or benchmarks/: a module lower in the layering never imports a higher one
(grader/README.md lists grader's layers). The graph is read from the code's own imports, those inside functions
included; nothing is imported or run. A benchmark script's sibling import (`from timing import ...`, with its
folder on sys.path) counts as an import of benchmarks/timing.py."""
from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("lib", "grader", "benchmarks")


def _module(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path = REPO) -> dict[str, set[str]]:
    """module -> the modules of PACKAGES it imports."""
    files = {_module(p, root): p for pkg in PACKAGES for p in sorted((root / pkg).rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            for target in targets:
                if name.startswith("benchmarks.") and f"benchmarks.{target}" in files:
                    target = f"benchmarks.{target}"  # a script's sibling, found through sys.path
                if target in files and target != name:
                    found.add(target)
        graph[name] = found
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each import circle once, as the modules on it (depth-first search for back edges)."""
    found, state, stack = [], {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                cycle = stack[stack.index(nxt):]
                if sorted(cycle) not in [sorted(c) for c in found]:
                    found.append(cycle)
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return found


def test_the_graph_is_read():
    graph = import_graph()
    assert "lib.masks" in graph["lib.attention"] and "grader.wire" in graph["grader.isolation"]
    assert "benchmarks.timing" in graph["benchmarks.decode"]


def test_no_import_circles():
    found = circles(import_graph())
    assert not found, "import circles (each module imports the next, the last the first): " + "; ".join(
        " -> ".join(c) for c in found)


def test_a_circle_is_found():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
