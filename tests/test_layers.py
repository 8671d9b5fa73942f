"""No import circles in lib/, grader/ or benchmarks/; no package imports one above or beside it (lib imports only lib;
grader and benchmarks import lib, never each other); and grader's imports follow the layers grader/README.md
lists: a module lower in the layering never imports a higher one. The graph is read from the code's own imports, those inside functions
included; nothing is imported or run. A benchmark script's sibling import (`from timing import ...`, with its
folder on sys.path) counts as an import of benchmarks/timing.py."""
from __future__ import annotations

import ast
import os
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("lib", "grader", "benchmarks")
# nbgrader's working areas (gitignored): a submission's copies of the tests, a probe another test plants and removes
WORK_AREAS = ("submitted", "autograded", "feedback", "exchange", "grading_status")


def sources(root: Path, pkg: str) -> list[Path]:
    """The package's .py files, outside nbgrader's working areas under grader/."""
    found = []
    for folder, dirs, files in os.walk(root / pkg):  # os.walk, not rglob: the areas are pruned, never listed
        if Path(folder) == root / "grader":
            dirs[:] = [d for d in dirs if d not in WORK_AREAS]
        found += [Path(folder) / f for f in files if f.endswith(".py")]
    return sorted(found)


def _module(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path = REPO) -> dict[str, set[str]]:
    """module -> the modules of PACKAGES it imports."""
    files = {_module(p, root): p for pkg in PACKAGES for p in sources(root, pkg)}
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
    assert "lib.attn.masks" in graph["lib.attn.attention"] and "grader.wire" in graph["grader.isolation"]
    assert "benchmarks.timing" in graph["benchmarks.decode"]


def test_no_import_circles():
    found = circles(import_graph())
    assert not found, "import circles (each module imports the next, the last the first): " + "; ".join(
        " -> ".join(c) for c in found)


def test_a_circle_is_found():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def documented_grader_layers(readme: Path = REPO / "grader" / "README.md") -> dict[str, int]:
    """grader's modules and their layer (0 lowest), from the README's "Layers, lowest first" paragraph: groups
    separated by → , modules in a group by commas; `checks/` stands for the package; `child` is a top of its
    own (the child process's)."""
    text = " ".join(readme.read_text(encoding="utf-8").split())
    start = text.index("Layers, lowest first")
    chain = text[text.index(": `", start) + 2:text.index(";", text.index("→", start))]
    layers = {}
    for level, group in enumerate(chain.split("→")):
        for name in re.findall(r"`([\w/]+)`", group):
            layers["grader.checks" if name == "checks/" else f"grader.{name}"] = level
    layers["grader.child"] = len(layers) + 1
    layers["grader"] = -1  # the package's __init__
    return layers


def _layer(module: str, layers: dict[str, int]) -> int | None:
    if module in layers:
        return layers[module]
    if module.startswith("grader.checks."):
        return layers.get("grader.checks")
    return None


def layer_violations(graph: dict[str, set[str]], layers: dict[str, int]) -> list[str]:
    """Each import of a grader module by a grader module placed lower ("a module imports only from those before
    it, or beside it"), and each grader module the README does not place."""
    bad = []
    for module, targets in sorted(graph.items()):
        if not module.startswith("grader"):
            continue
        mine = _layer(module, layers)
        if mine is None:
            bad.append(f"{module} is in no layer of grader/README.md")
            continue
        for target in sorted(targets):
            theirs = _layer(target, layers) if target.startswith("grader") else None
            if theirs is not None and theirs > mine and not (module.startswith("grader.checks") and
                                                             target.startswith("grader.checks")):
                bad.append(f"{module} (layer {mine}) imports {target} (layer {theirs}), which the README puts above it")
    return bad


def test_grader_imports_follow_the_documented_layers():
    bad = layer_violations(import_graph(), documented_grader_layers())
    assert not bad, "; ".join(bad)


def test_an_upward_import_is_found():
    """The layer test fails on a tree where grader/isolation.py imports grader.checks."""
    graph = import_graph()
    graph["grader.isolation"] = set(graph["grader.isolation"]) | {"grader.checks"}
    assert any("grader.isolation" in b and "grader.checks" in b for b in layer_violations(graph, documented_grader_layers()))


def private_imports(root: Path = REPO) -> list[str]:
    """`from lib.x import _name` (or grader's) across modules: a name that crosses files is public (issue 36); a
    module whose file name starts with "_" (grader._sandbox) is a module, not a private name."""
    found = []
    for pkg in PACKAGES + ("tools",):
        for path in sources(root, pkg):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
                if not (isinstance(node, ast.ImportFrom) and node.module and not node.level
                        and node.module.split(".")[0] in ("lib", "grader")):
                    continue
                base = root.joinpath(*node.module.split("."))
                for alias in node.names:
                    if alias.name.startswith("_") and not alias.name.startswith("__") and not (
                            (base / f"{alias.name}.py").exists()):
                        found.append(f"{path.relative_to(root)}:{node.lineno} imports {node.module}.{alias.name}")
    return found


def test_no_private_name_crosses_a_file():
    assert private_imports() == []


def test_a_private_import_is_found(tmp_path):
    for pkg in PACKAGES + ("tools",):
        (tmp_path / pkg).mkdir()
    (tmp_path / "lib" / "a.py").write_text("def _helper():\n    return 1\n")
    (tmp_path / "grader" / "b.py").write_text("from lib.a import _helper\n")
    assert private_imports(tmp_path) == ["grader/b.py:1 imports lib.a._helper"]


# The packages' own order, lowest first: lib (the reference) <- grader, benchmarks (each uses lib, never the other).
PACKAGE_MAY_IMPORT = {"lib": {"lib"}, "grader": {"grader", "lib"}, "benchmarks": {"benchmarks", "lib"}}


def package_violations(graph: dict[str, set[str]]) -> list[str]:
    """Each import that runs back up or across the packages: lib importing grader or benchmarks, grader importing
    benchmarks, benchmarks importing grader."""
    return [f"{module} imports {target}" for module, targets in sorted(graph.items()) for target in sorted(targets)
            if target.split(".")[0] not in PACKAGE_MAY_IMPORT[module.split(".")[0]]]


def test_no_package_imports_one_above_or_beside_it():
    bad = package_violations(import_graph())
    assert not bad, "; ".join(bad)


def test_an_import_back_up_is_found():
    graph = import_graph()
    graph["lib.batching.engine"] = set(graph["lib.batching.engine"]) | {"grader.status"}
    graph["grader.course"] = set(graph["grader.course"]) | {"benchmarks.timing"}
    assert package_violations(graph) == ["grader.course imports benchmarks.timing", "lib.batching.engine imports grader.status"]


def test_the_walk_skips_nbgrader_work_areas(tmp_path):
    """A student's copy of a test under grader/submitted/ (or a probe another test plants there) is no module of
    grader: the walk must not read it, nor fail when it vanishes mid-walk."""
    (tmp_path / "grader" / "submitted" / "s1" / "16").mkdir(parents=True)
    (tmp_path / "grader" / "submitted" / "s1" / "16" / "test_week16.py").write_text("import grader.checks\n")
    (tmp_path / "grader" / "isolation.py").write_text("import os\n")
    assert [p.name for p in sources(tmp_path, "grader")] == ["isolation.py"]


# --- lib's packages: the layers lib/__init__.py declares ------------------------------------------------------------
def documented_lib_layers(init: Path = REPO / "lib" / "__init__.py") -> dict[str, float]:
    """lib's packages and their layer (0 lowest), from lib/__init__.py's "Layers, lowest first" sentence: groups
    separated by → , packages in a group by commas. lib's own `__init__` (which applies `bench.threads` on import,
    and whose `THREADS` anything may read) sits just above the lowest layer."""
    text = " ".join(ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))).split())
    start = text.index("Layers, lowest first")
    chain = text[text.index(":", start) + 1:text.index(";", start)]
    layers: dict[str, float] = {f"lib.{name}": level for level, group in enumerate(chain.split("→"))
                                 for name in re.findall(r"`(\w+)`", group)}
    layers["lib"] = 0.5
    return layers


def lib_layer_violations(graph: dict[str, set[str]], layers: dict[str, float]) -> list[str]:
    """Each lib module outside the declared packages, each declared package that does not exist, and each import of
    a lib package beside or above the importer's (a package imports itself and the layers below it)."""
    def package(module: str) -> str:
        return ".".join(module.split(".")[:2])

    bad = [f"{p} is declared in lib/__init__.py but is no package of lib/" for p in sorted(layers)
           if p != "lib" and p not in graph]
    for module, targets in sorted(graph.items()):
        if not module.startswith("lib"):
            continue
        mine = package(module)
        if mine not in layers:
            bad.append(f"{module} is in no package of lib/__init__.py's layers")
            continue
        for target in sorted(t for t in targets if t.startswith("lib")):
            theirs = package(target)
            if theirs != mine and theirs in layers and layers[theirs] >= layers[mine]:
                bad.append(f"{module} ({mine}, layer {layers[mine]}) imports {target} ({theirs}, layer {layers[theirs]})")
    return bad


def test_lib_packages_follow_the_documented_layers():
    layers = documented_lib_layers()
    assert len(layers) >= 8, layers
    bad = lib_layer_violations(import_graph(), layers)
    assert not bad, "; ".join(bad)


def test_a_lib_import_beside_or_above_is_found():
    graph = import_graph()
    graph["lib.attn.masks"] = set(graph["lib.attn.masks"]) | {"lib.serve.server"}
    graph["lib.quantization.gptq"] = set(graph["lib.quantization.gptq"]) | {"lib.batching.paged"}
    graph["lib.flat"] = set()
    assert lib_layer_violations(graph, documented_lib_layers()) == [
        "lib.attn.masks (lib.attn, layer 1) imports lib.serve.server (lib.serve, layer 5)",
        "lib.flat is in no package of lib/__init__.py's layers",
        "lib.quantization.gptq (lib.quantization, layer 4) imports lib.batching.paged (lib.batching, layer 4)"]
