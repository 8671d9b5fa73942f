"""Recognise `lib`'s code by what it is, not by the file it was loaded from.

A check that forbids the reference must not be fooled by `exec(open("lib/spec_decode/speculative.py").read())`, by lib's
function pasted into a notebook cell with its locals renamed, or by a copy of `lib/` under another folder: each
of those runs lib's bytecode from a code object whose `co_filename` is not `lib/...`. `lib_name(code)` answers
for any code object: the qualified name of the `lib` function it is (`"lib.spec_decode.speculative.verify"`), or None.

A code object's fingerprint is its bytecode and the global/attribute names it uses, with the same for every
nested code object (comprehensions, inner functions, lambdas); its constants (numbers, strings, docstrings),
local-variable names, file name and line numbers are left out. So renaming the locals, changing a constant or
rewording a docstring keeps the fingerprint; changing what the code *does* changes it. Functions shorter than
`MIN_CODE_BYTES` of bytecode are not fingerprinted: a two-line helper written independently may well compile to
the same bytes. Only whole functions and methods are fingerprinted, not their nested code (a generator expression
alone is too small to say whose it is).
"""
from __future__ import annotations

import hashlib
import importlib
import os
import pkgutil
import types
from pathlib import Path

LIB_DIR = str(Path(__file__).resolve().parent.parent / "lib") + os.sep
MIN_CODE_BYTES = 64
# lib functions that are glue any correct solution writes word for word (an autograd.Function that calls the
# student's own forward and backward): recognising them would report honest work. tests/test_fingerprint.py checks
# that no solution's exercise code matches lib's otherwise.
NOT_FINGERPRINTED = {"lib.attn.attention.FlashAttention.forward", "lib.attn.attention.FlashAttention.backward"}

# Besides lib: modules a check compares against (an oracle), recognised the same way. Week 20 forbids gguf-py's
# quantizers and its file writer, so calling them — or exec'ing their source under another name — is seen in the
# student's process.
ORACLE_MODULES = ("gguf.quants", "gguf.gguf_writer")

_TABLE: dict[bytes, str] | None = None
_CACHE: dict[types.CodeType, str | None] = {}
_ORACLE_TABLE: dict[bytes, str] | None = None
_ORACLE_FILES: dict[str, str] = {}  # file of an oracle module -> its name
_ORACLE_CACHE: dict[types.CodeType, str | None] = {}


def fingerprint(code: types.CodeType) -> bytes:
    """The code object's bytecode and names, nested code objects included; constants, locals and places left out."""
    h = hashlib.sha256()

    def feed(c: types.CodeType) -> None:
        h.update(c.co_code)
        h.update("\0".join(c.co_names).encode())
        h.update(bytes([c.co_argcount & 0xFF, c.co_kwonlyargcount & 0xFF]))
        for k in c.co_consts:
            if isinstance(k, types.CodeType):
                h.update(b"\1")
                feed(k)

    feed(code)
    return h.digest()


def _module_codes(mod: types.ModuleType):
    """Every code object defined in `mod` (functions, methods, nested functions), with the module's name."""
    seen: set[int] = set()

    def from_obj(obj, depth=0):
        if depth > 3 or id(obj) in seen:
            return
        seen.add(id(obj))
        if isinstance(obj, (staticmethod, classmethod)):
            obj = obj.__func__
        if isinstance(obj, property):
            for f in (obj.fget, obj.fset, obj.fdel):
                if f is not None:
                    yield from from_obj(f, depth + 1)
            return
        while isinstance(getattr(obj, "__wrapped__", None), types.FunctionType):  # under @torch.no_grad() etc.
            if isinstance(obj, types.FunctionType) and obj.__code__.co_filename == getattr(mod, "__file__", None):
                yield obj.__code__, mod.__name__  # a decorator lib itself defines: its wrapper is lib's too
            obj = obj.__wrapped__
        if isinstance(obj, types.FunctionType):  # defined in this module's source (not a decorator's wrapper)
            if obj.__code__.co_filename == getattr(mod, "__file__", None):
                yield obj.__code__, mod.__name__  # nested code (a genexpr) is part of it, not a function alone
            return
        if isinstance(obj, type) and getattr(obj, "__module__", None) == mod.__name__:
            for v in vars(obj).values():
                yield from from_obj(v, depth + 1)

    for v in list(vars(mod).values()):
        yield from from_obj(v)


# In the student's process, lib is the week's view (mostly stubs: grader.view): the tables of the real code come
# with the view, built by the trusted process.
_VIEW_TABLES = Path(__file__).with_name("fingerprints.pickle")


def _tables_from_view() -> bool:
    global _TABLE, _ORACLE_TABLE
    if not _VIEW_TABLES.is_file():
        return False
    import pickle

    with open(_VIEW_TABLES, "rb") as f:
        tables = pickle.load(f)
    _TABLE, _ORACLE_TABLE = tables["lib"], tables["oracle"]
    _ORACLE_FILES.update(tables["oracle_files"])
    root = Path(__file__).resolve().parent.parent
    for modname in ORACLE_MODULES:  # the view's own (stubbed) copies
        _ORACLE_FILES[str(root / (modname.replace(".", "/") + ".py"))] = modname
    return True


def _table() -> dict[bytes, str]:
    global _TABLE
    if _TABLE is None and not _tables_from_view():
        import lib

        table: dict[bytes, str] = {}
        for info in pkgutil.walk_packages(lib.__path__, "lib."):
            try:
                mod = importlib.import_module(info.name)
            except Exception:  # noqa: BLE001  (an optional dependency missing: that module's code cannot run either)
                continue
            for code, modname in _module_codes(mod):
                name = f"{modname}.{getattr(code, 'co_qualname', code.co_name)}"
                if len(code.co_code) >= MIN_CODE_BYTES and name not in NOT_FINGERPRINTED:
                    table.setdefault(fingerprint(code), name)
        _TABLE = table
    return _TABLE


_PLAIN: dict = {}  # id(code compiled with grader.ran's probes) -> (that code, the same function compiled without them)


def compiled_twice(probed: types.CodeType, plain: types.CodeType) -> None:
    """A cell compiled with `grader.ran`'s probes (`probed`) and as written (`plain`): each function of `probed` is
    fingerprinted as its twin in `plain` (the probes change the bytecode; lib's code pasted in a cell is still lib's)."""
    def functions(code, out):
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                out.setdefault((getattr(const, "co_qualname", const.co_name), const.co_firstlineno), const)
                functions(const, out)
        return out

    twins = functions(plain, {})
    for key, code in functions(probed, {}).items():
        if key in twins:
            _PLAIN[id(code)] = (code, twins[key])


def lib_name(code: types.CodeType) -> str | None:
    """`"lib.<module>.<qualname>"` if `code` is lib's (by file, or by fingerprint wherever it was loaded from)."""
    pair = _PLAIN.get(id(code))
    if pair is not None and pair[0] is code:
        code = pair[1]
    try:
        return _CACHE[code]
    except KeyError:
        pass
    if code.co_filename.startswith(LIB_DIR):
        module = code.co_filename[len(LIB_DIR):].removesuffix(".py").replace(os.sep, ".")
        name = f"lib.{module}.{getattr(code, 'co_qualname', code.co_name)}"
    elif len(code.co_code) >= MIN_CODE_BYTES:
        name = _table().get(fingerprint(code))
    else:
        name = None
    _CACHE[code] = name
    return name


def _oracle_table() -> dict[bytes, str]:
    global _ORACLE_TABLE
    if _ORACLE_TABLE is None and not _tables_from_view():
        table: dict[bytes, str] = {}
        for modname in ORACLE_MODULES:
            try:
                mod = importlib.import_module(modname)
            except Exception:  # noqa: BLE001  (not installed: its code cannot run either)
                continue
            path = getattr(mod, "__file__", None)
            if path:
                _ORACLE_FILES[str(Path(path))] = modname
                _ORACLE_FILES[str(Path(path).resolve())] = modname
            for code, name in _module_codes(mod):
                if len(code.co_code) >= MIN_CODE_BYTES:
                    table.setdefault(fingerprint(code), f"{name}.{getattr(code, 'co_qualname', code.co_name)}")
        _ORACLE_TABLE = table
    return _ORACLE_TABLE


def oracle_name(code: types.CodeType) -> str | None:
    """`"gguf.quants.<qualname>"` if `code` is an `ORACLE_MODULES` function (by file, or by fingerprint)."""
    try:
        return _ORACLE_CACHE[code]
    except KeyError:
        pass
    table = _oracle_table()
    modname = _ORACLE_FILES.get(code.co_filename)
    if modname is not None:
        name = f"{modname}.{getattr(code, 'co_qualname', code.co_name)}"
    elif len(code.co_code) >= MIN_CODE_BYTES:
        name = table.get(fingerprint(code))
    else:
        name = None
    _ORACLE_CACHE[code] = name
    return name


def warm() -> None:
    """Build the tables now (imports every lib module and the oracles): call before the code being judged runs."""
    _table()
    _oracle_table()
