"""What the student's process may read: a view of the lab made for one week, and the paths it may open.

What it guards: **the student's process cannot reach the answer key.** Watching which functions ran can be
switched off from inside the process it watches (`sys.setprofile(None)`); a file that is not there cannot be
read. So the child that runs a notebook's code (`grader.child`) does not see the repository at all. It sees:

- `lib/` as this week allows it: every module is present (so `from lib.modeling.kv_cache import KVCache` works), but
  only the names the week declares (`Week(..., child_may_use=...)` in `grader/checks/weekNN.py`) and what they
  need, found by reading their code (`_closure`), keep their code. Every other function and class of lib is a
  stub that raises `ReferenceUnavailable` naming itself — above all the week's own exercises (a lib function
  or class named like one is a stub whatever else needs it), and lib's other routes to them (week 18's
  `predicted_speedup` for `best_k`, week 19's engine for `predict_steps`);
- `grader/`: only the modules the child runs (`CHILD_MODULES`); `grader.checks` and its week modules are
  stubs whose every name raises (the setup cell's `from grader.checks.week16 import check_...` still works);
- the packages of the Python environment, minus `DENIED_PACKAGES` (transformers' GGUF dequantizers, ...) and
  with `REWRITTEN_PACKAGES` (gguf-py) present as a copy whose quantizers and writer are stubs;
- its own temporary folder, and the system's shared files (`/usr`, `/etc`, `/proc`, `/sys`, `/dev`).

Not the repository (`solutions/`, the real `lib/`, `grader/checks/`), not `grader/submitted` or the gradebook,
not `/tmp` (other children's folders), not the home folder. `readable_paths` lists what the child may open
and `grader._sandbox` hands it to Linux Landlock, which enforces it for reading as well as writing. Where
Landlock is missing, the view still decides what `import` finds, but files can be opened by path.

Built once per process and week (`build_view`), in a temporary folder removed at exit.
"""
from __future__ import annotations

import ast
import atexit
import hashlib
import os
import pickle
import shutil
import sys
import sysconfig
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
LIB = REPO_ROOT / "lib"
GRADER = REPO_ROOT / "grader"

ALL = "*"
# What the child itself runs, whatever the week: the grader's side of the child, and lib's memory meter.
CHILD_MODULES = ("__init__", "_sandbox", "child", "child_wire", "child_guard", "child_identity", "child_observe", "wire",
                 "notebook", "status", "fingerprint", "observe", "observers", "held", "reads", "reach", "ran",
                 "ran_plan", "ran_switch", "triton_watch", "similarity", "copy_thresholds", "op_table", "host_budget",
                 "course_map", "raw_memory")
ALWAYS = {"lib.attn.io_model": ("TensorMemoryMeter",), "lib.bench.threads": ("apply", "describe")}
# Packages whose code does an exercise's work: not readable at all (nothing the exercises need is in them).
DENIED_PACKAGES = ("transformers", "accelerate", "llama_cpp", "llama_cpp_python", "vllm", "gguf",
                   # memory by address without ctypes (red team 10b: cffi's `ffi.cast("uint64_t *", id(t))`), and
                   # CPython's test modules, which poke at memory: nothing the notebook needs is in them
                   "cffi", "_cffi_backend", "_argon2_cffi_bindings", "_testcapi", "_testinternalcapi", "_testbuffer",
                   "_ctypes_test", "_testmultiphase", "_testsinglephase", "_testclinic", "_xxtestfuzz",
                   "_testimportmultiple")
# Packages the exercises import for their constants, whose quantizers and writer are what week 20's checks
# compare with: present in the view as a copy in which those modules' functions and methods are stubs.
REWRITTEN_PACKAGES = {"gguf": ("quants.py", "gguf_writer.py")}
SYSTEM_PATHS = ("/usr", "/lib", "/lib64", "/bin", "/sbin", "/etc", "/proc", "/sys", "/dev", "/opt")


@dataclass(frozen=True)
class ViewSpec:
    """One week's view: `lib` maps a module to the names the notebook's code may use (or `ALL`); `deny` are
    names stubbed wherever lib defines them (the week's exercises); `week` is for the messages."""
    week: int | None = None
    lib: tuple = ()  # ((module, names or ALL), ...): hashable, so one view is built per spec
    deny: frozenset = frozenset()
    exercises: tuple = ()  # ((name, number), ...) for the stubs' messages
    open: bool = False  # everything readable and nothing stubbed: for tests of the checks' second line

    @classmethod
    def everything(cls, week: int | None = None) -> "ViewSpec":
        """No view at all, as on a machine without Landlock where lib's files can be read by path: lib whole, the
        real gguf, reading unrestricted. For testing what the checks and fingerprints catch behind the door."""
        return cls(week=week, open=True)

    @classmethod
    def make(cls, week: int | None, lib: dict | None = None, exercises: dict | None = None) -> "ViewSpec":
        items = tuple(sorted((m, n if n == ALL else tuple(sorted(n))) for m, n in (lib or {}).items()))
        numbers = tuple(sorted((name, int(v[0]) if isinstance(v, tuple) else int(v)) for name, v in (exercises or {}).items()))
        return cls(week=week, lib=items, deny=frozenset(exercises or {}), exercises=numbers)


# --- reading lib's code --------------------------------------------------------------------------------------

@dataclass
class _Module:
    name: str
    tree: ast.Module
    defs: dict = field(default_factory=dict)  # top-level name -> FunctionDef / ClassDef
    aliases: dict = field(default_factory=dict)  # local name -> ("module", "lib.x") or ("name", "lib.x", "y")


def _lib_imports(node: ast.AST) -> dict:
    """Local name -> what it stands for, for every `from lib... import` / `import lib...` inside `node`."""
    out = {}
    for n in ast.walk(node):
        if isinstance(n, ast.ImportFrom) and n.module and (n.module == "lib" or n.module.startswith("lib.")) and not n.level:
            for a in n.names:
                if n.module == "lib" or (LIB.parent / n.module.replace(".", "/")).is_dir():  # a package: a module
                    out[a.asname or a.name] = ("module", f"{n.module}.{a.name}")
                else:
                    out[a.asname or a.name] = ("name", n.module, a.name)
        elif isinstance(n, ast.Import):
            for a in n.names:
                if a.name.startswith("lib."):
                    out[a.asname or a.name.split(".")[0]] = ("module", a.name if a.asname else "lib")
    return out


def _read_lib() -> dict[str, _Module]:
    mods = {}
    for path in sorted(LIB.rglob("*.py")):
        parts = path.relative_to(LIB.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        mod = _Module(name, tree)
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                mod.defs[node.name] = node
        mod.aliases = _lib_imports(tree)
        mods[name] = mod
    return mods


def _uses(mod: _Module, node: ast.AST, mods: dict[str, _Module]) -> set[tuple[str, str]]:
    """(module, name) of every lib definition `node`'s code refers to."""
    local = dict(mod.aliases)
    local.update(_lib_imports(node))
    found = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            if n.id in mod.defs:
                found.add((mod.name, n.id))
            what = local.get(n.id)
            if what and what[0] == "name":
                target = mods.get(what[1])
                if target is not None and what[2] in target.defs:
                    found.add((what[1], what[2]))
                elif target is not None and what[2] in target.aliases:  # a re-export: follow it once
                    again = target.aliases[what[2]]
                    if again[0] == "name":
                        found.add((again[1], again[2]))
        elif isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name):
            what = local.get(n.value.id)
            if what and what[0] == "module" and what[1] in mods:
                found.add((what[1], n.attr))
        elif isinstance(n, ast.Attribute) and isinstance(n.value, ast.Attribute) and (
                dotted := ast.unparse(n.value)) in mods and local.get("lib", ("",))[0] == "module":  # lib.x.y.z
            found.add((dotted, n.attr))
    return found


def _closure(mods: dict[str, _Module], roots: dict[str, object], deny: frozenset) -> dict[str, set[str]]:
    """For each module, the top-level names whose code the view keeps: `roots` and what their code needs,
    except the denied names (which stay stubs even where kept code refers to them)."""
    keep: dict[str, set[str]] = {m: set() for m in mods}
    todo = []
    for m, names in roots.items():
        if m not in mods:
            raise ValueError(f"the view allows {m}, which is not a module of lib/")
        for n in (mods[m].defs if names == ALL else names):
            if n not in mods[m].defs and n not in mods[m].aliases:
                raise ValueError(f"the view allows {m}.{n}, which {m} does not define")
            todo.append((m, n))
    while todo:
        m, n = todo.pop()
        mod = mods.get(m)
        if mod is None:
            continue
        if n not in mod.defs:  # a name the module imports: keep it where it is defined
            what = mod.aliases.get(n)
            if what and what[0] == "name":
                todo.append((what[1], what[2]))
            continue
        if n in deny or n in keep[m]:
            continue
        keep[m].add(n)
        todo.extend(_uses(mod, mod.defs[n], mods))
    return keep


# --- writing the view ----------------------------------------------------------------------------------------

_UNAVAILABLE = '''"""Written by grader.view: the error a stub raises."""


class ReferenceUnavailable(RuntimeError):
    """This part of lib is not available to the notebook's code while its week is graded."""


def unavailable(name, why):
    raise ReferenceUnavailable(f"{name} is not available to your code while this week is graded: {why}")
'''


def _stub_function(node, qualname: str, why: str) -> ast.stmt:
    src = (f"def {node.name}(*args, **kwargs):\n"
           f"    _lab_unavailable({qualname!r}, {why!r})\n")
    return ast.parse(src).body[0]


_RECORD_BASES = {"NamedTuple", "Enum", "IntEnum", "StrEnum", "Flag", "IntFlag", "TypedDict", "Exception", "ValueError",
                 "RuntimeError", "TypeError", "KeyError", "IndexError", "LookupError", "AssertionError"}


def _has_methods(node: ast.ClassDef) -> bool:
    """Whether a class holds code worth a stub: a method other than dunders and properties, and not a record or
    exception type (NamedTuple, Enum, ...: their methods are accessors, and they cannot take a stub __init__)."""
    bases = {b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else "" for b in node.bases}
    if bases & _RECORD_BASES or any(b.endswith(("Error", "Exception", "Warning")) for b in bases):
        return False
    for n in node.body:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and not (n.name.startswith("__") and n.name.endswith("__")):
            decorators = {d.id for d in n.decorator_list if isinstance(d, ast.Name)}
            if "property" not in decorators:
                return True
    return False


def _stub_class(node: ast.ClassDef, qualname: str, why: str) -> ast.stmt:
    stub = ast.parse(f"class {node.name}:\n"
                     f"    def __init__(self, *args, **kwargs):\n"
                     f"        _lab_unavailable({qualname!r}, {why!r})\n").body[0]
    stub.bases, stub.keywords = node.bases, node.keywords
    return stub


def _insert_after_future(tree: ast.Module, stmt: ast.stmt) -> None:
    at = 0
    for i, node in enumerate(tree.body):
        if (isinstance(node, ast.ImportFrom) and node.module == "__future__") or (
                i == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)):
            at = i + 1
    tree.body.insert(at, stmt)


def _why(spec: ViewSpec, name: str, numbers: dict) -> str:
    if name in spec.deny:
        n = numbers.get(name)
        return (f"it is the answer to week {spec.week}'s exercise{f' {n}' if n is not None else ''} `{name}` — write "
                f"it yourself")
    if spec.week is None:
        return "a notebook graded without its week's checks may use no part of lib"
    return (f"week {spec.week}'s exercises may use only the parts of lib its setup cell imports, and this one "
            f"would do an exercise's work — write what you need yourself")


def rewrite_lib_module(mod: _Module, keep: set[str], spec: ViewSpec) -> str:
    numbers = dict(spec.exercises)
    tree = ast.parse(ast.unparse(mod.tree))  # a copy
    body = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name not in keep:
            qual = f"{mod.name}.{node.name}"
            if isinstance(node, ast.ClassDef) and not _has_methods(node) and node.name not in spec.deny:
                body.append(node)  # an exception or a plain record: no technique in it
            elif isinstance(node, ast.ClassDef):
                body.append(_stub_class(node, qual, _why(spec, node.name, numbers)))
            else:
                body.append(_stub_function(node, qual, _why(spec, node.name, numbers)))
        else:
            body.append(node)
    tree.body = body
    _insert_after_future(tree, ast.parse("from lib._unavailable import unavailable as _lab_unavailable").body[0])
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n"


def rewrite_oracle_module(source: str, qualname: str) -> str:
    """Every function and method of an oracle module stubbed (class structure and constants kept;
    `__init_subclass__`, which registers the quantizer classes at import, kept)."""
    tree = ast.parse(source)
    why = "the checks compare your code with it; write the format yourself"

    def strip(body, prefix):
        out = []
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name != "__init_subclass__":
                stub = _stub_function(node, f"{prefix}.{node.name}", why)
                stub.decorator_list = [d for d in node.decorator_list
                                       if isinstance(d, ast.Name) and d.id in ("staticmethod", "classmethod", "property")]
                stub.body = ast.parse(f"_lab_unavailable({f'{prefix}.{node.name}'!r}, {why!r})").body
                out.append(stub)
            elif isinstance(node, ast.ClassDef):
                node.body = strip(node.body, f"{prefix}.{node.name}") or [ast.Pass()]
                out.append(node)
            else:
                out.append(node)
        return out

    tree.body = strip(tree.body, qualname)
    _insert_after_future(tree, ast.parse(
        "def _lab_unavailable(name, why):\n"
        "    raise RuntimeError(f'{name} is not available to your code while this week is graded: {why}')").body[0])
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n"


_CHECKS_STUB = '''"""Written by grader.view: the checks run in the grader's process, never here."""


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)

    def check(*args, **kwargs):
        raise RuntimeError(f"{name} runs in the grader's process, not in the notebook's code")

    check.__name__ = name
    return check
'''


def _site_packages() -> list[Path]:
    paths = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    paths |= {p for p in sys.path if p.endswith(("site-packages", "dist-packages"))}
    return sorted({Path(p).resolve() for p in paths if Path(p).is_dir()})


def _package_folders() -> list[Path]:
    """Every folder of installed packages the child could read: the environment's, the base Python's, the system's."""
    found = set(_site_packages())
    for pattern in (f"{sys.base_prefix}/lib/python3*/site-packages", "/usr/lib/python3*/dist-packages",
                    "/usr/local/lib/python3*/dist-packages", "/usr/local/lib/python3*/site-packages"):
        found |= {p.resolve() for p in Path("/").glob(pattern.lstrip("/")) if p.is_dir()}
    return sorted(found)


def package_dir(name: str) -> Path | None:
    """The folder of package `name` where the grader's own imports find it: a venv's site-packages, or a folder
    on PYTHONPATH of any name (`pip install --target DIR`): the child's copy of it must come from the same place."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    for where in (spec.submodule_search_locations or []) if spec is not None else []:
        if (Path(where) / "__init__.py").is_file():
            return Path(where).resolve()
    return None


_VIEWS: dict[ViewSpec, Path] = {}
_KEPT: dict[ViewSpec, dict[str, set[str]]] = {}
_TABLES: dict = {}


def _remove_views() -> None:
    for path in _VIEWS.values():
        shutil.rmtree(path.parent if path.name == "view" else path, ignore_errors=True)
    _VIEWS.clear()


atexit.register(_remove_views)


def build_view(spec: ViewSpec) -> Path:
    """The folder the child sees instead of the repository (built once per process and spec)."""
    path = _VIEWS.get(spec)
    if path is not None and path.is_dir():
        return path
    base = Path(tempfile.mkdtemp(prefix="inference-lab-view-"))
    os.chmod(base, 0o755)
    path = base / "view"
    (path / "lib").mkdir(parents=True)
    mods = _read_lib()
    roots = {m: names for m, names in ALWAYS.items()}
    for m, names in spec.lib:
        old = roots.get(m)
        roots[m] = ALL if ALL in (names, old) else tuple(set(names) | set(old or ()))
    keep = {m: set(mod.defs) for m, mod in mods.items()} if spec.open else _closure(mods, roots, spec.deny)
    _KEPT[spec] = keep
    for name, mod in mods.items():
        rel = Path(*name.split("."))
        out = path / (rel / "__init__.py" if (LIB.parent / rel).is_dir() else rel.with_suffix(".py"))
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(rewrite_lib_module(mod, keep[name], spec), encoding="utf-8")
    (path / "lib" / "_unavailable.py").write_text(_UNAVAILABLE, encoding="utf-8")
    (path / "grader" / "checks").mkdir(parents=True)
    for name in CHILD_MODULES:
        shutil.copyfile(GRADER / f"{name}.py", path / "grader" / f"{name}.py")
    for check in sorted((GRADER / "checks").glob("*.py")):
        (path / "grader" / "checks" / check.name).write_text(_CHECKS_STUB, encoding="utf-8")
    for package, modules in REWRITTEN_PACKAGES.items():
        src = package_dir(package)
        if src is None or spec.open:
            continue
        shutil.copytree(src, path / package, ignore=shutil.ignore_patterns("__pycache__", "scripts"))
        for module in modules:
            f = path / package / module
            if f.is_file():
                f.write_text(rewrite_oracle_module(f.read_text(encoding="utf-8"), f"{package}.{f.stem}"),
                             encoding="utf-8")
    with open(path / "grader" / "fingerprints.pickle", "wb") as f:
        pickle.dump(fingerprint_tables(), f)
    for p in [path, *path.rglob("*")]:
        os.chmod(p, 0o755 if p.is_dir() else 0o644)
    _VIEWS[spec] = path
    return path


def kept(spec: ViewSpec, module: str, qualname: str) -> bool:
    """Whether the view of `spec` keeps the code of lib's `module.qualname` (its top-level name decides)."""
    if spec not in _KEPT:
        build_view(spec)
    return qualname.split(".")[0] in _KEPT[spec].get(module, ())


def fingerprint_tables() -> dict:
    """lib's and the oracles' fingerprint tables, built here from the real code (the child's lib is stubs)."""
    if not _TABLES:
        from grader import fingerprint

        fingerprint.warm()
        _TABLES.update(lib=dict(fingerprint._table()), oracle=dict(fingerprint._oracle_table()),
                       oracle_files=dict(fingerprint._ORACLE_FILES))
    return _TABLES


# --- what the child may open ---------------------------------------------------------------------------------

def _python_paths() -> list[Path]:
    paths = set()
    for key in ("stdlib", "platstdlib"):
        paths.add(sysconfig.get_paths()[key])
    paths.add(os.path.join(sys.base_prefix, "lib"))  # lib-dynload, libpython
    paths.add(os.path.dirname(os.path.realpath(sys.executable)))
    paths.add(sys.prefix)  # a venv: its python, pyvenv.cfg (a process the child starts reads it), its packages
    return sorted({Path(p).resolve() for p in paths if os.path.exists(p)})


def _allow_except(root: Path, excluded: list[Path]) -> list[tuple[str, str]]:
    """`root` as rules that cover everything beneath it except `excluded` (Landlock only adds rights): ("read",
    path) for whole subtrees, ("list", path) for a folder on the way to an excluded one — its entries may be
    listed (Python's importer lists folders) but not opened."""
    prefix = os.path.join(str(root), "")  # string prefixes: `root in e.parents` made this 1-2 s a process
    inside = [e for e in excluded if e == root or str(e).startswith(prefix)]
    if not inside:
        return [("read", str(root))]
    if root in inside or not root.is_dir():
        return []
    out = [("list", str(root))]
    try:
        entries = sorted(root.iterdir())
    except OSError:
        return out
    for entry in entries:
        out += _allow_except(entry.resolve(), excluded)  # resolved: a link (a venv's lib64) is where it points
    return out


_READABLE: dict = {}


def readable_paths(view: Path, extra: list[str] = ()) -> list[tuple[str, str]]:
    """`_readable_paths`, once per process and arguments (a child starts for every exercise that crashed)."""
    key = (str(view), tuple(extra))
    if key not in _READABLE:
        _READABLE[key] = _readable_paths(view, extra)
    return _READABLE[key]


def _readable_paths(view: Path, extra: list[str] = ()) -> list[tuple[str, str]]:
    """Every path beneath which the child may read (("read" or "list", path): see `_allow_except`; ("device",
    path): a GPU's device file, also opened for writing): the view, the
    Python environment (and `extra`, the grader's other import paths) minus the denied packages, the system's
    shared folders — never the repository, /tmp, or the home folders."""
    excluded = [REPO_ROOT.resolve(), Path(tempfile.gettempdir()).resolve(), Path.home().resolve()]
    on_path = _site_packages() + [Path(p).resolve() for p in extra]
    excluded += [p for p in _package_folders() if p not in on_path]  # e.g. the base Python's, under its stdlib
    dynload = Path(sysconfig.get_paths()["stdlib"]) / "lib-dynload"  # the standard library's C modules, as installed
    for folder in set(_package_folders()) | set(on_path) | {dynload}:
        for name in DENIED_PACKAGES:
            for pattern in (name, f"{name}-*.dist-info", f"{name}.py", f"{name}.*.so", f"{name}.so"):
                try:
                    excluded += [p.resolve() for p in folder.glob(pattern)]
                except OSError:  # a folder this user cannot read (another user's Python): nothing to exclude there
                    pass
    rules = []
    for root in [*map(Path, SYSTEM_PATHS), *_python_paths(), *on_path]:
        if root.exists():
            rules += _allow_except(root.resolve(), excluded)
    # A GPU's device files are opened read-write by CUDA's (or ROCm's) initialisation: without this, a confined
    # child on a GPU machine dies at its first CUDA tensor (writes are otherwise allowed only in its own folder)
    rules += [("device", str(p)) for pattern in ("nvidia*", "dri/*", "kfd") for p in Path("/dev").glob(pattern)
              if p.is_char_device()]
    return sorted(set(rules) | {("read", str(view))})


def spec_digest(spec: ViewSpec) -> str:
    return hashlib.sha256(repr(spec).encode()).hexdigest()[:12]
