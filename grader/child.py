"""The student's process: its runtime, after `grader._sandbox` has confined it.

What it guards: **the student's code runs here and only here, and what it did is reported as data.** `_Child`
runs the notebook's exercise cells (`load`), answers the trusted side's requests (look a name up, call a
function, `observe` a call, report reference use), and sends every result through `_ChildPickler`, which
encodes it as plain data or as a reference (see `grader.wire`). Every call into the notebook's code, observed
or not, runs under the same observers and watches which of `lib`'s functions ran (`grader.child_observe`: by
bytecode fingerprint, `grader.fingerprint`); every tensor argument is compared bit for bit before and after
(`_snapshot`, `_copied`). An object of the trusted process (a check's model, a
spy) is a `_ParentProxy` here, which calls back. `_child_main` is the entry point the session starts
(`grader.isolation._CHILD_BOOT`); the address-space limit is set after torch and the cells are loaded.
"""
from __future__ import annotations

import io
import os
import pickle
import sys
from pathlib import Path

# _freeze: what the process holds leaves the collector's sight, so the collection before each call into the notebook's
# code (`grader.child_observe`) costs microseconds, not the 40 ms of a process with torch loaded
from gc import freeze as _freeze

from grader.child_observe import CALLS, Calls
from grader.fingerprint import lib_name
from grader.status import TAMPERED_TAIL
from grader.wire import GENERATOR_STATE, TENSOR_CHANGED, apply_operation, exception_info, rebuild_exception, recv_message, send_message

LIB_DIR = str(Path(__file__).resolve().parent.parent / "lib") + os.sep
# What this process's grader code runs on, bound before the notebook's code runs (as `grader.wire`'s framing):
# `io.BytesIO`, `pickle.dumps` or `os._exit` replaced by the notebook's code by plain names changes nothing here.
_BytesIO, _dumps, _exit, _realpath = io.BytesIO, pickle.dumps, os._exit, os.path.realpath
# The modules whose functions the grader's code here calls by plain names; one of their functions replaced by the
# notebook's code is a verdict (`_Guard._runtime`): it could change what the grader's code does in this process.
_RUNTIME_MODULES = ("builtins", "os", "posix", "posixpath", "io", "select", "struct", "pickle", "_pickle", "ast",
                    "types", "marshal", "sys", "collections", "hashlib")
# ... and of torch's, those the grader's code here calls (torch.equal judges whether a call changed its arguments);
# not all of torch's: torch._dynamo, once imported, wraps some of them itself (torch.manual_seed)
_RUNTIME_TORCH = ("equal", "no_grad", "frombuffer", "empty", "empty_strided", "zeros", "ones_like", "arange", "max",
                  "allclose", "device", "get_rng_state", "set_rng_state", "is_tensor", "Generator")

_CHILD = None
# The grader's own modules in this process, as they were loaded before the notebook's code ran: taken from here, not
# from sys.modules, which they leave (`_hide_modules`) so that the notebook's `import grader.child` finds a fresh copy
# of the file rather than this process's records. Also lib's memory meter, which a check may ask to measure a call.
_OWN: dict = {}


class _ParentProxy:
    """In the child: an object of the trusted process. Behaves like it for attribute access, calls, indexing."""

    def __init__(self, oid, module, qualname):
        object.__setattr__(self, "_oid", oid)
        object.__setattr__(self, "_cls", _find_class(module, qualname))
        object.__setattr__(self, "_qualname", qualname)

    def _do(self, op, *args):
        return _CHILD.request(op, self, args)

    @property
    def __class__(self):
        return self._cls or _ParentProxy

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__") and name not in ("__name__", "__qualname__", "__doc__", "__wrapped__"):
            raise AttributeError(name)
        return self._do("getattr", name)

    def __setattr__(self, name, value):
        self._do("setattr", name, value)

    def __delattr__(self, name):
        self._do("delattr", name)

    def __call__(self, *args, **kwargs):
        return self._do("call", args, kwargs)

    def __getitem__(self, key):
        return self._do("getitem", key)

    def __setitem__(self, key, value):
        self._do("setitem", key, value)

    def __len__(self):
        return self._do("len")

    def __iter__(self):
        it = self._do("iter")
        while True:
            try:
                yield it._do("next") if isinstance(it, _ParentProxy) else next(it)
            except StopIteration:
                return

    def __contains__(self, item):
        return self._do("contains", item)

    def __bool__(self):
        return self._do("bool")

    def __float__(self):
        return self._do("float")

    def __int__(self):
        return self._do("int")

    def __index__(self):
        return self._do("index")

    def __repr__(self):
        return self._do("repr")

    def __str__(self):
        return self._do("str")

    def __dir__(self):
        return self._do("dir")

    def __deepcopy__(self, memo):
        return _CHILD.request("byvalue", self, ())

    def __copy__(self):
        return _CHILD.request("byvalue", self, ())

    def __reduce_ex__(self, protocol):
        return (_CHILD.request, ("byvalue", self, ()))

    def __eq__(self, other):
        return self is other

    def __hash__(self):
        return object.__hash__(self)


def _find_class(module, qualname):
    mod = sys.modules.get(module)
    obj = mod
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj if isinstance(obj, type) else None


class _ChildPickler(pickle.Pickler):
    """Encodes the child's values as data the trusted side can check (see the module docstring)."""

    def __init__(self, file, child):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.child = child

    def persistent_id(self, obj):
        import torch

        t = type(obj)
        if t in (type(None), bool, int, float, str, bytes, list, tuple, dict, set, frozenset):
            return None
        if isinstance(obj, _ParentProxy):
            return ("P", object.__getattribute__(obj, "_oid"))
        if isinstance(obj, torch.Tensor):
            return self.child.encode_tensor(obj)
        if isinstance(obj, bool):
            return ("V", bool(obj))
        if isinstance(obj, int):
            return ("V", int.__int__(obj))
        if isinstance(obj, float):
            return ("V", float.__float__(obj))
        if isinstance(obj, str):
            return ("V", str.__str__(obj))
        if isinstance(obj, complex):
            return ("complex", float(obj.real), float(obj.imag))
        if isinstance(obj, torch.dtype):
            return ("dtype", str(obj))
        if isinstance(obj, torch.device):
            return ("device", str(obj))
        if isinstance(obj, torch.Size):
            return ("size", tuple(int(s) for s in obj))
        if isinstance(obj, slice):
            return ("slice", obj.start, obj.stop, obj.step)
        if obj is Ellipsis:
            return ("ellipsis",)
        mod = t.__module__
        if mod == "numpy":
            import numpy as np

            if isinstance(obj, np.ndarray) and not obj.dtype.hasobject:
                return ("A", obj.dtype.str, tuple(obj.shape), np.ascontiguousarray(obj).tobytes())
            if isinstance(obj, np.generic) and not isinstance(obj, np.object_):
                return ("V", obj.item()) if not isinstance(obj.item(), complex) else ("complex", obj.real, obj.imag)
        if mod == "collections" and isinstance(obj, dict):
            return ("odict", [(k, v) for k, v in obj.items()])
        if isinstance(obj, tuple):  # a namedtuple (e.g. torch.return_types) arrives as a plain tuple
            return ("tuple", list(obj))
        if isinstance(obj, list):
            return ("list", list(obj))
        return self.child.export(obj)


class _Child:
    def __init__(self, rfd, wfd, memory, sandbox):
        self.r, self.w = rfd, wfd
        self.objects: dict[int, object] = {}
        self.sent_storages: list = []
        self.module = None
        self.memory = memory
        self.memory_kind = "as"  # or "data": see _apply_memory_limit
        self.sandbox = sandbox
        self.lib_seen: dict[str | None, set[str]] = {}  # exercise name -> lib functions that ran on its behalf
        self.lib_codes: dict = {}  # code object -> "lib.module.qualname", or None when not lib's
        self.roots: dict[int, str] = {}  # id of an exported object -> the exercise name it came from
        self.current_root: str | None = None
        self.watching = 0  # how many calls into the notebook's code are running (`grader.child_observe.Scope`)
        self._next_req = 0
        # Copies of the answer key the trusted side found in the cells (grader.similarity): (cell index, qualname) ->
        # why. Their bodies arrive as a `raise` (`similarity.without_copies`); one that runs while an exercise's call
        # does is that exercise's reference use as well. (Code compiled later: the audit hook refuses a copy.)
        self.copies: dict = {}
        self.cell_files: dict[str, int] = {}  # file name a cell's code was compiled under -> the cell's index
        self.copies_sent: set = set()
        self.guard = _Guard()
        self.calls = Calls(self)  # every call into the notebook's code, under the same observers (grader.child_observe)

    # encoding --------------------------------------------------------------------------------------------
    def export(self, obj):
        import torch

        self.objects[id(obj)] = obj
        self.roots.setdefault(id(obj), self.current_root)
        t = obj if isinstance(obj, type) else type(obj)
        info = {"type": getattr(t, "__qualname__", "object")[:200], "callable": callable(obj),
                "module": str(getattr(t, "__module__", ""))[:200]}
        if isinstance(obj, type):
            try:
                info["autograd_function"] = issubclass(obj, torch.autograd.Function)
            except TypeError:
                pass
            info["name"] = obj.__name__[:200]
        elif callable(obj):
            info["name"] = str(getattr(obj, "__name__", ""))[:200]
        return ("R", id(obj), info)

    def encode_tensor(self, t):
        import torch

        if t.layout != torch.strided or t.is_quantized:
            raise TypeError(f"cannot send a {t.layout} / quantized tensor")
        t = t.detach()
        if t.device.type == "meta":  # no data: shape, stride and dtype are all there is
            return ("M", str(t.dtype), tuple(t.shape), tuple(t.stride()))
        if t.device.type != "cpu":  # sent as bytes, put back on its device by the trusted side
            return ("D", str(t.device), self.encode_tensor(t.cpu()))
        storage = t.untyped_storage()
        self.sent_storages.append(storage)  # kept alive: its address stays unique, so views keep their identity
        data = t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        return ("T", str(t.dtype), tuple(t.shape), tuple(t.stride()), int(t.storage_offset()),
                int(storage.data_ptr()), int(storage.nbytes()), data)

    def encode(self, msg) -> bytes:
        buf = _BytesIO()
        _ChildPickler(buf, self).dump(msg)
        return buf.getvalue()

    # messaging -------------------------------------------------------------------------------------------
    def send(self, msg):
        try:
            payload = self.encode(msg)
        except Exception as e:
            if msg[0] == "ok":
                payload = self.encode(("err", msg[1], (["TypeError", "Exception"],
                                                        f"the result cannot be sent to the checks: {e}")))
            else:
                raise
        send_message(self.w, payload)

    def request(self, op, target, args):
        self._next_req += 1
        rid = -self._next_req
        self.send(("req", rid, op, target, args))
        return self.loop(rid)

    def loop(self, waiting_for=None):
        # The outer loop (the one `_child_main` starts, before any of the notebook's code has run) keeps its own
        # handle on the guard's check and on `send`: after each request it sends what the guard found, at once,
        # so that rebinding the grader's functions later cannot take a verdict back.
        check, send = (self.guard.checker(), self.send) if waiting_for is None else (None, None)
        while True:
            try:
                data = recv_message(self.r, None)
            except EOFError:
                _exit(0)
            msg = _ChildUnpickler(_BytesIO(data)).load()
            kind = msg[0]
            if kind in ("ok", "err"):
                if msg[1] != waiting_for:
                    _exit(3)
                if kind == "ok":
                    return msg[2]
                raise rebuild_exception(msg[2])
            _, rid, op, target, args = msg
            previous = self.current_root
            self.current_root = args[0] if op == "getname" else self.roots.get(id(target), previous)
            try:
                reply = ("ok", rid, self.handle(op, target, args))
            except BaseException as e:  # noqa: BLE001  (student code may raise anything, SystemExit included)
                reply = ("err", rid, exception_info(e))
            try:
                if check is not None:
                    for root, why in check():
                        send(("flag", root, why))
                self.send(reply)
            finally:
                self.current_root = previous

    # operations ------------------------------------------------------------------------------------------
    def handle(self, op, target, args):
        if op == "load":
            return self.load(*args)
        if op == "refs":
            return self.references(args[0])
        if op == "unreached":  # (exercise, the week's exercises): what of its code did not run, lines run (grader.ran)
            return self.ran.unreached(str(args[0]), [str(a) for a in args[1]]), self.ran.python_lines(str(args[0]))
        if op in CALLS:  # a call of the notebook's function, method, class or object, observed or not
            return self.calls.run(op, target, args)
        with self.calls.scope.entry():  # the notebook's code can run here too (a property, `__getitem__`, ...)
            if op == "getname":
                return getattr(self.module, args[0])
            return apply_operation(op, target, args)

    @staticmethod
    def _snapshot(args, kwargs) -> dict:
        """A copy of every array argument with data — tensors and numpy arrays, also inside lists, tuples and
        dicts — taken before the call (see `_copied`)."""
        out = {i: _frozen(a) for i, a in enumerate(args)}
        out.update({k: _frozen(v) for k, v in kwargs.items()})
        return {k: v for k, v in out.items() if v is not None}

    @staticmethod
    def _copied(args, kwargs, before: dict | None = None):
        """What the caller's arguments became: list/dict arguments and generators always; for a tensor argument
        whose shape, dtype or any bit the call changed (compared with `before`), a description of the change."""
        import torch

        def state(v):
            if type(v) is torch.Generator:
                return (GENERATOR_STATE, bytes(v.get_state().numpy().tobytes()))
            return v

        out = {i: state(a) for i, a in enumerate(args) if type(a) in (list, dict, torch.Generator)}
        out.update({k: state(v) for k, v in kwargs.items() if type(v) in (list, dict, torch.Generator)})
        for key, old in (before or {}).items():
            new = args[key] if type(key) is int else kwargs[key]
            what = _changed(old, new)
            if what:
                out[key] = (TENSOR_CHANGED, what)
        return out

    def load(self, notebook, cells, copies=(), references=None):
        exercise_module = _OWN["grader.notebook"].exercise_module

        # the trusted side found these copies in the cells' source; code compiled later is judged by the audit hook
        self.copies.update({(int(index), str(qualname)): str(why) for index, qualname, why in copies})
        if references:  # to the audit hook, which alone keeps them (`_Guard.audit`): nothing here can clear them
            sys.audit(REFERENCES_EVENT, dict(references))  # `grader.similarity.References.data`: plain hashes
        self._apply_memory_limit()  # before the cells run: what they allocate counts too
        self.ran.remember(cells)
        previous, self.current_root = self.current_root, None
        try:
            with self.calls.scope.entry():
                self.module = exercise_module(notebook, cells, self.cell_files, self.ran.compile_cell)
        finally:
            self.current_root = previous
        _freeze()  # what the cells made is old now: collections before each call look only at what came after
        return {"stubbed": list(self.module._stubbed_cells), "broken": dict(self.module._broken_cells)}

    @staticmethod
    def judge_compiled(source, filename: str, references: dict | None, similarity) -> tuple[dict, str | None]:
        """Code the notebook's code compiles while it runs (`exec` of decoded text, a file it wrote and imports):
        ({qualname: why} for its functions that copy the answer key — `references`, the statement hashes: the audit
        hook then refuses the compile —, why it is a verdict that it names an attribute that leads to the grader's
        objects, as in the cells' own source: `introspection_in_cells`). `similarity` is the module as it was when
        the hook was made."""
        import ast

        if isinstance(source, (bytes, bytearray, memoryview)):
            source = bytes(source).decode("utf-8", "replace")
        elif isinstance(source, ast.AST):
            try:
                source = ast.unparse(source)
            except Exception:  # noqa: BLE001  (a tree ast.unparse cannot print cannot be judged either)
                return {}, None
        if not isinstance(source, str):
            return {}, None
        try:
            peeks = similarity.introspection_in_source(source)
            found = similarity.copies_in_source(source, references) if references else {}
        except (RecursionError, MemoryError, ValueError):  # a source too deep to parse is not judged
            return {}, None
        if peeks:
            line, name = peeks[0]
            return found, similarity.introspection_why(name, f"line {line} of code it compiled as {filename!r}")
        return found, None

    def copy_ran(self, root, code) -> None:
        """A function of the notebook's that copies the answer key ran: sent to the trusted side at once, as the
        reference use of the exercise whose call it ran in (at load: of every exercise)."""
        key = (self.cell_files.get(code.co_filename, code.co_filename), getattr(code, "co_qualname", code.co_name))
        why = self.copies.get(key)
        if why is None or (root, why) in self.copies_sent:
            return
        self.copies_sent.add((root, why))
        send_message(self.w, _dumps(("copied", root, why), protocol=pickle.HIGHEST_PROTOCOL))

    def _apply_memory_limit(self):
        """`memory` bytes beyond what the process holds now. By address space (RLIMIT_AS) where the child does not
        use CUDA; on a CUDA machine by data (RLIMIT_DATA: private writable memory), because CUDA's initialisation
        reserves tens of GiB of address space it never touches (PROT_NONE), which an address-space limit refuses:
        the child would die at its first CUDA tensor (tests/test_integrity.py reproduces it on the CPU)."""
        import resource

        if self.memory <= 0:
            return
        kind, field = (resource.RLIMIT_DATA, "VmData:") if self.memory_kind == "data" else (resource.RLIMIT_AS, "VmSize:")
        try:
            with open("/proc/self/status") as f:
                held = next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith(field))
            limit = held + self.memory
            resource.setrlimit(kind, (limit, limit))
        except (OSError, ValueError, StopIteration):
            pass

    def references(self, names):
        """How each exercise uses lib's own implementation, if it does: it *is* lib's, or lib's ran while it did."""
        found = {}
        self.guard.check_intact()
        for name in names:
            tampered = self.guard.reasons(name)
            if tampered:
                found[name] = f"`{name}` {tampered[0]} — {TAMPERED_TAIL}"
                continue
            obj = self.module.__dict__.get(name) if self.module is not None else None
            if obj is None:
                continue
            target = obj
            code = getattr(getattr(target, "__wrapped__", target), "__code__", None)
            mod = str(getattr(target, "__module__", "") or "")
            if mod.startswith("lib.") or (code is not None and code.co_filename.startswith(LIB_DIR)):
                found[name] = f"`{name}` is lib's own ({mod or code.co_filename}.{getattr(target, '__qualname__', name)})"
                continue
            same = lib_name(code) if code is not None else None
            if same is None and isinstance(target, type):  # a class whose methods are lib's
                for member in vars(target).values():
                    member_code = getattr(getattr(member, "__func__", member), "__code__", None)
                    if member_code is not None and lib_name(member_code) is not None:
                        same = lib_name(member_code)
                        break
            if same is not None:
                found[name] = f"`{name}` is lib's own code ({same}) loaded under another name"
                continue
            if isinstance(target, type):
                libs = [c for c in target.__mro__[1:] if str(getattr(c, "__module__", "")).startswith("lib.")
                        and c.__name__ == name]
                if libs:
                    found[name] = f"`{name}` subclasses lib's own {libs[0].__module__}.{libs[0].__qualname__}"
                    continue
            ran = sorted(q for q in self.lib_seen.get(name, ()) if q.split(".")[-1] == name or f".{name}." in q)
            if ran:
                found[name] = f"`{name}` ran lib's own {ran[0]}"
        return found


# --- arguments a call must leave as they were ---------------------------------------------------------------------

def _frozen(v, depth=0):
    """A copy of the arrays in `v` (tensors, numpy arrays; inside lists, tuples and dicts), or None if none."""
    import torch

    if isinstance(v, torch.Tensor):
        if v.device.type != "meta" and v.layout == torch.strided:
            with torch.no_grad():
                return ("t", v.detach().clone())
        return None
    if type(v).__module__ == "numpy" and hasattr(v, "dtype") and hasattr(v, "shape") and getattr(v, "ndim", 0):
        if not v.dtype.hasobject:
            return ("a", v.copy())
        return None
    if depth < 3 and type(v) in (list, tuple):
        items = [_frozen(x, depth + 1) for x in v]
        return ("seq", items) if any(i is not None for i in items) else None
    if depth < 3 and type(v) is dict:
        items = {k: _frozen(x, depth + 1) for k, x in v.items()}
        items = {k: x for k, x in items.items() if x is not None}
        return ("map", items) if items else None
    return None


def _changed(old, new) -> str:
    """'' if `new` still holds what `old` (from `_frozen`) copied, bit for bit; else what changed."""
    import torch

    kind = old[0]
    if kind == "t":
        t = old[1]
        desc = f"a {tuple(t.shape)} {str(t.dtype).removeprefix('torch.')} tensor"
        if not isinstance(new, torch.Tensor):
            return desc + f", now a {type(new).__name__}"
        if new.shape != t.shape or new.dtype != t.dtype:
            return desc + f", now {tuple(new.shape)} {str(new.dtype).removeprefix('torch.')}"
        with torch.no_grad():
            a, b = t.reshape(-1), new.detach().contiguous().reshape(-1)
            same = torch.equal(a, b) if a.dtype == torch.bool else torch.equal(a.view(torch.uint8), b.view(torch.uint8))
        return "" if same else desc
    if kind == "a":
        a = old[1]
        desc = f"a {tuple(a.shape)} {a.dtype} numpy array"
        if type(new) is not type(a) or new.shape != a.shape or new.dtype != a.dtype:
            return desc + f", now a {type(new).__name__}"
        return "" if a.tobytes() == new.tobytes() else desc
    if kind == "seq":
        if type(new) not in (list, tuple) or len(new) < len(old[1]):
            return f"a {type(new).__name__} whose items were replaced"
        for i, item in enumerate(old[1]):
            what = _changed(item, new[i]) if item is not None else ""
            if what:
                return f"its item {i}, {what}"
        return ""
    if kind == "map":
        if type(new) is not dict:
            return "a dict, now something else"
        for k, item in old[1].items():
            what = _changed(item, new[k]) if k in new else "removed"
            if what:
                return f"its entry {k!r}, {what}"
        return ""
    return ""


# --- what the notebook's code may not do to the grader in its process -----------------------------------------

_ELSEWHERE = ("the checks watch the thread that runs the graded code: a forbidden op or a whole score matrix computed "
              "elsewhere goes unseen, so the result cannot be judged; compute on the calling thread")
SPAWNED = f"started a thread or a process ({_ELSEWHERE})"
REGISTERED = ("registered an operator or a kernel with torch.library: it runs inside the dispatch modes' handlers, "
              "out of the sight of the modes the checks observe through")
_TORCH_LIBRARY = tuple(str(Path(__import__("torch").__file__).parent / part) for part in ("library.py", "_library" + os.sep))
DISPATCH_GUARD = ("made one of torch._C's dispatch-key guards, which hide torch's operations from the dispatch modes "
                  "the checks observe through")
# torch._C's types that change which dispatch keys run (each hides ops from a TorchDispatchMode, measured on torch
# 2.13, or can: a forced or preserved key set)
DISPATCH_GUARDS = ("_DisableTorchDispatch", "ExcludeDispatchKeyGuard", "_ExcludeDispatchKeyGuard",
                   "_SetExcludeDispatchKeyGuard", "_ForceDispatchKeyGuard", "_IncludeDispatchKeyGuard",
                   "_PreserveDispatchKeyGuard", "_RestorePythonTLSSnapshot", "_EnablePreDispatch")
REDISPATCHED = "redispatched an operator below the dispatch modes the checks observe through"
# The checks tell the notebook's code from Python's, torch's and the grader's by file name: code compiled under one of
# theirs (or a frozen module's) would pass for theirs.
COMPILED_COPY = ("the grader does not compile a copy of the answer key (decoded, written to a file, or put together "
                 "while the notebook runs): write the function yourself")
REFERENCES_EVENT = "grader.child.references"  # `_Child.load` -> the audit hook: see `_Guard.audit`
IMPERSONATED = ("compiled code under the file name of Python's, a package's or the grader's own code, which the "
                "checks would take for theirs")
PEEKED = ("asked for the grader's profiler function (sys.getprofile, sys.gettrace): what it holds is the grader's "
          "record of what ran")
FRAME_TAKEN = ("took a frame (sys._getframe, inspect, a traceback's tb_frame, a generator's gi_frame, a signal "
               "handler): a frame's f_back leads to the grader's own frames and objects")
CODE_REPLACED = "replaced a function's code (`__code__`): the checks would read one function and run another"
_FRAME_ATTRIBUTES = frozenset(("tb_frame", "gi_frame", "cr_frame", "ag_frame"))
CODE_MADE = ("made a code object itself (types.CodeType, code.replace): bytecode put together without source is code "
             "the checks cannot read, a copy of the answer key's included")


def _traced(fn):
    """`fn` (a builtin) behind Python code, whose call the child's profiler sees however it is made (`_Guard`)."""
    def call(*args, **kwargs):
        return fn(*args, **kwargs)
    return call


def _internal(fn):
    """`fn` (one of torch._C's dispatch-mode functions) behind Python code, whose call the child's profiler sees."""
    def dispatch_internal(*args, **kwargs):
        return fn(*args, **kwargs)
    return dispatch_internal


def _spawning(fn):
    """`fn` (a thread starter) behind Python code, whose call the child's profiler sees however it is made."""
    def start(*args, **kwargs):
        return fn(*args, **kwargs)
    return start


def _peeking(fn):
    """`fn` (a builtin that hands out the grader's objects: sys.getprofile) behind Python code the profiler sees."""
    def peek(*args, **kwargs):
        return fn(*args, **kwargs)
    return peek


def _guarded_redispatch(self, *args, **kwargs):
    return type(self)._grader_redispatch(self, *args, **kwargs)


def _guarded_init(self, *args, **kwargs):
    return type(self)._grader_init(self, *args, **kwargs)


def _guarded_enter(self, *args):
    return type(self)._grader_enter(self, *args)


# The shims above are put where the notebook's code can reach them (torch._C's attributes, a class's methods); a
# function's `__globals__` is readable without an audit event, so theirs hold nothing but the builtins (and the file
# name, which tells the checks that the code is the grader's): not this module, whose `_CHILD` is the grader's record.
_BARE = {"__builtins__": __builtins__, "__file__": __file__, "__name__": __name__}


def _bare(fn):
    import types

    return types.FunctionType(fn.__code__, _BARE, fn.__name__, fn.__defaults__, fn.__closure__)


_traced, _internal, _spawning, _peeking = _bare(_traced), _bare(_internal), _bare(_spawning), _bare(_peeking)
_guarded_redispatch, _guarded_init, _guarded_enter = _bare(_guarded_redispatch), _bare(_guarded_init), _bare(_guarded_enter)


def _guard_type(cls) -> None:
    """Route `cls`'s construction (and `with`) through Python code the child's profiler sees (`_Guard`)."""
    cls._grader_init = vars(cls)["__init__"]
    cls.__init__ = _guarded_init
    if "__enter__" in vars(cls):
        cls._grader_enter = vars(cls)["__enter__"]
        cls.__enter__ = _guarded_enter
    cls._grader_guarded = True


_MISSING = object()


class _Guard:
    """Second line behind `grader.view` (which keeps the answers out of this process): the notebook's code must not
    switch off the watching (`sys.setprofile`), pop the checks' dispatch modes, walk the garbage collector, a frame
    or the profiler function to the grader's objects, call C through ctypes, or rewrite the grader's own modules
    here or what its observers run on (`_machinery`). What it did is a verdict
    for the exercise it was running (or for every exercise, when it did it while the cells loaded)."""

    def __init__(self):
        import threading

        import torch
        from torch.utils import _python_dispatch as pd

        self.flags: dict = {}
        self.out = None  # (the pipe to the trusted side, what was sent): set by `audit`; see `flag`
        self.watched_c = {}

        for name in ("_pop_torch_dispatch_stack", "_pop_torch_dispatch_mode", "_set_dispatch_mode",
                     "_unset_dispatch_mode", "_push_on_torch_dispatch_stack", "_dispatch_tls_set_dispatch_key_excluded",
                     "_dispatch_tls_set_dispatch_key_included", "_disabled_torch_dispatch_impl",
                     "_get_dispatch_stack_at", "_get_dispatch_mode"):  # the last two hand out the modes themselves
            fn = getattr(torch._C, name, None)
            if fn is not None and getattr(fn, "__code__", None) is None:
                self.watched_c[id(fn)] = f"called torch._C.{name} (the checks observe through a dispatch mode)"
                # ... and as Python code (torch._C's attribute, and torch.utils._python_dispatch's import of it), so
                # that a call through functools.partial is seen too
                shim = _internal(fn)
                setattr(torch._C, name, shim)
                if getattr(pd, name, None) is fn:
                    setattr(pd, name, shim)
        # torch.library (custom_op, Library(...).define/impl): an operator or a kernel of the notebook's own runs
        # inside the dispatch modes' handlers, where they are popped: what it computes goes unseen. Asked for by
        # the notebook's code through torch.library's functions (see `event`).
        self.registrar = None
        library = getattr(torch._C, "_dispatch_library", None)
        if library is not None:
            self.registrar = id(library)
            self.watched_c[id(library)] = REGISTERED
        # Running an operator below the dispatch modes: OpOverload.redispatch and the handle's redispatch_boxed (a
        # bound method of pybind's, which `f(*args)` calls without a profiler event: Python code here, see below).
        handle = getattr(torch._C, "_DispatchOperatorHandle", None)
        if handle is not None and "redispatch_boxed" in vars(handle) and "_grader_redispatch" not in vars(handle):
            handle._grader_redispatch = vars(handle)["redispatch_boxed"]
            handle.redispatch_boxed = _guarded_redispatch
        # Threads and processes: a torch dispatch mode, the profiler and the memory meter watch the thread that
        # calls the graded code, so work handed to another thread (or a forked process) runs unseen — a forbidden
        # op, a whole score matrix. Whoever calls these (the notebook's code, or threading/subprocess/
        # multiprocessing on its behalf) while a check runs the notebook's code, or while its cells load, starts one.
        import _posixsubprocess
        import _thread

        self.spawners = set()
        for module, names in ((_thread, ("start_new_thread", "start_new", "start_joinable_thread")),
                              (os, ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system")),
                              (_posixsubprocess, ("fork_exec",))):
            for name in names:
                fn = getattr(module, name, None)
                if fn is not None:
                    self.watched_c[id(fn)] = SPAWNED
                    self.spawners.add(id(fn))
        self.watched_code = {}
        # ... and called from C (functools.partial(_thread.start_new_thread, f, ())()) a builtin leaves no profiler
        # event, and Python raises no audit event for a thread: the starters become Python code here (threading's
        # own reference too), whose every call is seen. Processes do raise audit events (`audit`).
        for module, name in ((_thread, "start_new_thread"), (_thread, "start_new"), (threading, "_start_new_thread")):
            fn = getattr(module, name, None)
            if fn is not None and getattr(fn, "__code__", None) is None:
                setattr(module, name, _spawning(fn))
        self.watched_code[_spawning(None).__code__] = SPAWNED
        for fn, label in ((threading.setprofile, "called threading.setprofile"),
                          (threading.settrace, "called threading.settrace")):
            self.watched_code[fn.__code__] = label
        for name in ("_pop_mode", "_pop_mode_temporarily", "_disable_current_modes", "_get_current_dispatch_mode",
                     "_get_current_dispatch_mode_stack"):
            fn = getattr(pd, name, None)
            code = getattr(getattr(fn, "__wrapped__", fn), "__code__", None)
            if code is not None:
                self.watched_code[code] = f"called torch.utils._python_dispatch.{name} (the checks observe through a dispatch mode)"
        self.watched_code[_internal(None).__code__] = ("called torch._C's dispatch-mode internals (the checks observe "
                                                       "through a dispatch mode)")
        redispatch = getattr(torch._ops.OpOverload, "redispatch", None)
        if getattr(redispatch, "__code__", None) is not None:
            self.watched_code[redispatch.__code__] = REDISPATCHED
        self.watched_code[_guarded_redispatch.__code__] = REDISPATCHED
        # tracemalloc measures what numpy and Python hold during some calls (grader.observe's host meter): resetting
        # its peak, clearing or stopping it would hide memory, and asking whether it runs would tell the code which
        # calls are measured. The notebook's code has no use for it: any use is a verdict. Its C functions become
        # Python code here, so that a call through functools.partial or map (no profiler event for a builtin called
        # from C) is seen too; its Python ones are watched as they are.
        import _tracemalloc
        import tracemalloc
        import types

        used = "used tracemalloc, through which the checks measure the memory numpy and Python hold"
        for name, fn in list(vars(_tracemalloc).items()):
            if callable(fn) and not name.startswith("__") and getattr(fn, "__code__", None) is None:
                shim = _traced(fn)
                setattr(_tracemalloc, name, shim)
                if getattr(tracemalloc, name, None) is fn:
                    setattr(tracemalloc, name, shim)
                self.watched_c[id(fn)] = used  # the original, taken out of the shim's closure and called
        self.watched_code[_traced(None).__code__] = used
        for fn in vars(tracemalloc).values():
            if isinstance(fn, types.FunctionType) and fn.__module__ == "tracemalloc":
                self.watched_code[fn.__code__] = used
        # torch._C's dispatch-key guards switch the modes off for as long as they live; made from Python they leave
        # no profiler event (a type's call is not a function's), so their __init__ and __enter__ become Python code
        # here, which does: made by the notebook's code (directly or through functools.partial), a verdict.
        self.watched_code[_guarded_init.__code__] = DISPATCH_GUARD
        self.watched_code[_guarded_enter.__code__] = DISPATCH_GUARD
        for name in DISPATCH_GUARDS:
            cls = getattr(torch._C, name, None)
            if isinstance(cls, type) and "__init__" in vars(cls) and not getattr(cls, "_grader_guarded", False):
                _guard_type(cls)
        # The ways to the grader's objects here that no audit event reports (frames taken by the notebook's code are
        # `audit`'s): the profiler function (sys.getprofile; its closure holds what this process records), the
        # functions that hand out frames (a frame's f_back leads to the grader's frames and their locals), and a
        # signal handler (it is given the running frame). Their builtins become Python code the profiler sees.
        import inspect
        import signal
        import traceback

        import _signal

        for module, name in ((sys, "getprofile"), (sys, "gettrace")):
            fn = getattr(module, name, None)
            if fn is not None and getattr(fn, "__code__", None) is None:
                self.watched_c[id(fn)] = PEEKED
                setattr(module, name, _peeking(fn))
        self.watched_code[_peeking(None).__code__] = PEEKED
        for fn in (inspect.currentframe, inspect.stack, inspect.trace, inspect.getouterframes, inspect.getinnerframes,
                   traceback.walk_stack, traceback.walk_tb, signal.signal):
            code = getattr(fn, "__code__", None)
            if code is not None:
                self.watched_code[code] = FRAME_TAKEN
        self.watched_c[id(_signal.signal)] = FRAME_TAKEN
        import site

        trusted = [str(Path(__file__).resolve().parent.parent), sys.prefix, sys.base_prefix, sys.exec_prefix]
        trusted += [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
        try:
            trusted += site.getsitepackages()
        except AttributeError:
            pass
        self.trusted = tuple(os.path.realpath(p) + os.sep for p in trusted if p) + tuple(p + os.sep for p in trusted if p)
        self.intact: list = []
        self.machinery: list = []
        self.compiled: set = set()  # the file names the notebook's code compiled code under ("<string>", say)

    def student(self, frame) -> bool:
        """Whether `frame` runs the notebook's code (or code it compiled), not Python's, torch's or the grader's:
        by the module the code runs in (a dataclass's generated `__init__` runs in its class's module)."""
        if frame is None or frame.f_code.co_filename in self.compiled:
            return True  # code the notebook compiled, run in any module's globals (exec(source, vars(functools)))
        g = frame.f_globals
        where = g.get("__file__")
        if isinstance(where, str) and where:
            return not where.startswith(self.trusted)
        origin = getattr(g.get("__spec__"), "origin", None)
        return origin not in ("frozen", "built-in")

    def flag(self, root, why: str) -> None:
        """A verdict: noted (`reasons`), and sent to the trusted process at once — the notebook's code that clears
        the record afterwards (the guard is reachable from any of the grader's classes) takes nothing back."""
        found = self.flags.setdefault(root, [])
        if why not in found:
            found.append(why)
        if self.out is not None and (root, why) not in self.out[1]:
            self.out[1].add((root, why))
            send_message(self.out[0], _dumps(("flag", root if root is None or type(root) is str else None, why),
                                             protocol=pickle.HIGHEST_PROTOCOL))

    def event(self, root, frame, event, arg) -> None:
        """A profiler event (`sys.setprofile`'s): note a call of a watched function by the notebook's code."""
        if event == "call":
            label = self.watched_code.get(frame.f_code)
            if label is not None and (label is SPAWNED or self.student(frame.f_back)):
                self.flag(root, label)
        elif event == "c_call":
            label = self.watched_c.get(id(arg))
            if label is None:
                return
            if id(arg) == self.registrar:  # torch.library's own code calls it: whose request is it?
                while frame is not None and frame.f_code.co_filename.startswith(_TORCH_LIBRARY):
                    frame = frame.f_back
            if id(arg) in self.spawners or self.student(frame):
                self.flag(root, label)

    def reasons(self, name) -> list[str]:
        return self.flags.get(name, []) + self.flags.get(None, []) + self.flags.get("*", [])

    @staticmethod
    def _members() -> list:
        """The grader's code here: [(label, the live mapping that holds it, name, the object)] — compared by
        identity later (`_changes`), with the objects themselves kept (an id can be reused)."""
        observe, fingerprint, wire, notebook, observers, calls, triton = (_OWN[f"grader.{m}"] for m in (
            "observe", "fingerprint", "wire", "notebook", "observers", "child_observe", "triton_watch"))
        out = []
        reads, reach, ran = _OWN["grader.reads"], _OWN["grader.reach"], _OWN["grader.ran"]  # ran: with LinesRun
        for holder in (_OWN.get("grader.child") or sys.modules[__name__], observe, fingerprint, wire, notebook, _Child,
                       _ChildPickler, _ChildUnpickler, _ParentProxy, _Guard, observe.OpRecorder, observe.Observation,
                       observe.Recording, observers, observers.Observers, observers.HostMeter, calls, calls.Scope,
                       calls.Calls, calls.Job, calls.Rerun, vars(calls)["_Entry"], vars(calls)["_Copier"], triton,
                       triton.TritonWatch, reads, reads.Visits, reads.ReadCounter, reach, reach.Reach, ran, *ran.PLAN):
            mapping, name = vars(holder), getattr(holder, "__name__", str(holder))
            out += [(f"{name}.{k}", mapping, k, v) for k, v in mapping.items()
                    if callable(v) or isinstance(v, (staticmethod, classmethod, property))]
        out += [(f"_OWN[{k!r}]", _OWN, k, v) for k, v in _OWN.items()]  # what the grader's code here takes its modules from
        # the judge of compiled code (the audit hook's): its constants too (`MIN_STATEMENTS`, `THRESHOLD`, ...)
        similarity = _OWN["grader.similarity"]
        out += [(f"grader.similarity.{k}", vars(similarity), k, v) for k, v in vars(similarity).items()
                if not k.startswith("__")]
        # the table the recorder classifies ops by: its tables too (an op moved among ELEMENTWISE goes unmeasured)
        op_table = _OWN["grader.op_table"]
        out += [(f"grader.op_table.{k}", vars(op_table), k, v) for k, v in vars(op_table).items() if not k.startswith("__")]
        for cls in (similarity.Unit, similarity.Source, similarity.References, similarity._Normalise):  # its methods
            out += [(f"grader.similarity.{cls.__name__}.{k}", vars(cls), k, v) for k, v in vars(cls).items()
                    if callable(v) or isinstance(v, (staticmethod, classmethod, property))]
        return out

    @staticmethod
    def _machinery() -> list:
        """What the observers run on that is not the grader's, as `_members`: torch's dispatch-mode machinery
        (TorchDispatchMode, the mode stack's functions in torch._C and torch.utils._python_dispatch, OpOverload, the
        Tensor class), FlopCounterMode with its table of formulas, lib's memory meter, the profiler's functions —
        and that each of their modules is still the one `sys.modules` names. The notebook's code that replaced one
        (`torch.utils._python_dispatch._push_mode = ...`: no mode is pushed, nothing is seen) would change what
        every check measures."""
        import torch
        import torch._ops
        import torch.utils._python_dispatch as pd

        flop_counter = sys.modules.get("torch.utils.flop_counter")
        meter = _OWN.get("TensorMemoryMeter")
        holders = [torch._C, pd, torch._ops, pd.TorchDispatchMode, torch._ops.OpOverload, torch._ops.OpOverloadPacket,
                   torch.Tensor, torch._C.TensorBase]
        if flop_counter is not None:
            holders += [flop_counter, flop_counter.FlopCounterMode, getattr(flop_counter, "_FlopCounterMode", None)]
        if meter is not None:
            holders += [sys.modules.get(meter.__module__), meter]
        out = []
        for holder in holders:
            if holder is None:
                continue
            mapping, name = vars(holder), getattr(holder, "__name__", str(holder))
            if isinstance(holder, type(sys)):
                out.append((f"sys.modules[{name!r}]", sys.modules, name, holder))
            out += [(f"{name}.{k}", mapping, k, v) for k, v in mapping.items()
                    if callable(v) or isinstance(v, (staticmethod, classmethod, property))]
        out += [(f"sys.{k}", vars(sys), k, getattr(sys, k)) for k in
                ("setprofile", "getprofile", "settrace", "gettrace", "_getframe", "_current_frames") if hasattr(sys, k)]
        registry = getattr(flop_counter, "flop_registry", None)
        if isinstance(registry, dict):
            out.append(("torch.utils.flop_counter.flop_registry", vars(flop_counter), "flop_registry", registry))
            out += [(f"torch.utils.flop_counter.flop_registry[{k}]", registry, k, v) for k, v in registry.items()]
        return out

    @staticmethod
    def _runtime() -> list:
        """As `_members`: the functions of the modules the grader's code here calls by plain names
        (`_RUNTIME_MODULES`: builtins, os, io, pickle, ast, ...). The framing and the encoder are bound at import
        (`grader.wire._write`, `_BytesIO`), but the rest calls `len`, `isinstance`, `ast.parse` as any code does:
        `builtins.len` replaced could silence the audit hook, `ast.parse` the judging of compiled code."""
        out = []
        for name in _RUNTIME_MODULES:
            module = sys.modules.get(name)
            if module is None:
                continue
            mapping = vars(module)
            out.append((f"sys.modules[{name!r}]", sys.modules, name, module))
            out += [(f"{name}.{k}", mapping, k, v) for k, v in list(mapping.items())
                    if callable(v) and not (name == "sys" and k.endswith("hook"))]  # sys.excepthook & co. are settings
        import torch

        out += [(f"torch.{k}", vars(torch), k, vars(torch)[k]) for k in _RUNTIME_TORCH if k in vars(torch)]
        from collections import Counter  # what the judging of compiled code counts statements with

        out += [(f"Counter.{k}", vars(Counter), k, v) for k, v in vars(Counter).items() if callable(v)]
        return out

    def remember(self) -> None:
        """What the grader's code in this process is, and what it observes through, before the notebook's code runs."""
        self.intact = self._members()
        self.machinery = self._machinery() + self._runtime()

    @staticmethod
    def _changes(intact: list, machinery: list) -> list[str]:
        out = []
        missing = _MISSING
        changed = [label for label, mapping, key, obj in intact if mapping.get(key, missing) is not obj]
        if changed:
            out.append(f"replaced the grader's own code in its process ({', '.join(sorted(changed)[:3])})")
        changed = [label for label, mapping, key, obj in machinery if mapping.get(key, missing) is not obj]
        if changed:
            out.append(f"changed what the checks observe through ({', '.join(sorted(changed)[:3])}): the dispatch "
                       f"modes, meters and formulas that see every operation of a call, and the functions of Python's "
                       f"the grader's code in its process runs on")
        return out

    def check_intact(self) -> None:
        for why in self._changes(self.intact, self.machinery):
            self.flag("*", why)

    def audit(self, child, wfd) -> None:
        """A `sys.addaudithook` hook — which no code in this process can remove — for what the profiler cannot see:
        `sys.setprofile`/`sys.settrace` however they are reached (`map(sys.setprofile, [None])`, cProfile, bdb),
        `sys._getframe`, the garbage collector's object lists, ctypes, and attributes set on the grader's classes.
        Done by the notebook's code, each is sent to the trusted process at once, as a verdict it keeps."""
        send, dumps, protocol, realpath = send_message, _dumps, pickle.HIGHEST_PROTOCOL, _realpath
        self.out = (wfd, set())  # `flag` sends from now on
        changed_class = "changed a class of the grader's"
        student, busy, sent = self.student, [False], set()
        labels = {"sys.setprofile": "called sys.setprofile", "sys.settrace": "called sys.settrace",
                  "sys._getframe": FRAME_TAKEN, "sys._current_frames": FRAME_TAKEN,
                  "gc.get_objects": "called gc.get_objects", "gc.get_referrers": "called gc.get_referrers",
                  "gc.get_referents": "called gc.get_referents", "ctypes.dlopen": "called C code through ctypes",
                  "ctypes.dlsym": "called C code through ctypes", "ctypes.dlsym/handle": "called C code through ctypes",
                  "object.__setattr__": changed_class, "object.__delattr__": changed_class,
                  "compile": IMPERSONATED, "code.__new__": CODE_MADE,
                  "marshal.loads": "loaded code with marshal (a code object's file name is whatever its bytes say)",
                  "marshal.load": "loaded code with marshal (a code object's file name is whatever its bytes say)"}
        # compile: through importlib's source_to_code too (one frame up); an import's compile is further away
        # a frame: only the notebook's own reading counts (collections.namedtuple reads its caller's module name from
        # sys._getframe; the functions that hand a frame to their caller are watched instead: `_Guard.__init__`)
        reach = {"sys.setprofile": 8, "sys.settrace": 8, "ctypes.dlopen": 2, "ctypes.dlsym": 2, "ctypes.dlsym/handle": 2,
                 "compile": 2, "sys._getframe": 0, "sys._current_frames": 0, "object.__getattr__": 0}
        frame_attributes = _FRAME_ATTRIBUTES
        impersonated = tuple(self.trusted) + ("<frozen",)
        compiled, own = self.compiled, set()  # `own`: the hook's copy, which only `checker` sees too
        self._compiled_own = own
        # a process started however it is called (functools.partial of os.fork leaves no profiler event)
        spawns = {"os.fork", "os.forkpty", "os.posix_spawn", "os.system", "subprocess.Popen", "os.exec", "os.spawn"}
        getframe = sys._getframe
        grader_dir = str(Path(__file__).resolve().parent) + os.sep
        # the child's own folder (its cwd at start-up), the one place the notebook's code can write a file to import
        workdir = os.path.realpath(os.getcwd()) + os.sep
        # the references' statement hashes, which `_Child.load` hands over by an audit event before the cells run:
        # held only here (no code can reach an audit hook), and the judging function as it is now
        references, judge, refused, similarity = [], _Child.judge_compiled, COMPILED_COPY, _OWN["grader.similarity"]

        def copies_refused(source, name) -> None:
            """A copy of the answer key compiled while the notebook runs is refused: the compile raises, and the copy
            never exists (as a copy in a cell never reaches this process). A name that leads to the grader's objects
            is a verdict, sent at once."""
            found, peeked = judge(source, name, references[0] if references else None, similarity)
            if peeked:
                root = child.current_root if type(child.current_root) is str else None
                send(wfd, dumps(("flag", root, peeked), protocol=protocol))
            if found:
                qualname, why = next(iter(found.items()))
                raise RuntimeError(f"{why} — {refused}")

        def hook(event, args):
            if event == REFERENCES_EVENT:
                if not references and len(args) == 1 and type(args[0]) is dict:
                    references.append(args[0])  # the first only: load's, before any of the notebook's code ran
                return
            if event in spawns and child.watching and not busy[0]:  # whoever asks, while graded code runs
                root = child.current_root if type(child.current_root) is str else None
                if (root, SPAWNED) not in sent:
                    sent.add((root, SPAWNED))
                    send(wfd, dumps(("flag", root, SPAWNED), protocol=protocol))
                return
            label = labels.get(event)
            if event == "object.__getattr__":  # (every `__code__` read, too)
                label = FRAME_TAKEN if len(args) > 1 and args[1] in frame_attributes else None
            elif event == "object.__setattr__" and len(args) > 1 and args[1] == "__code__":
                label = CODE_REPLACED
            if label is None or busy[0]:
                return
            busy[0] = True
            try:
                if label is changed_class and not str(getattr(args[0], "__module__", "")).startswith("grader."):
                    return
                if (event == "compile" and len(args) > 1 and isinstance(args[1], str) and args[1].startswith(os.sep)
                        and realpath(args[1]).startswith(workdir)):
                    compiled.add(args[1])  # a file the notebook's code wrote, imported (importlib compiles it)
                    own.add(args[1])
                    copies_refused(args[0], args[1])
                    return
                frame = getframe(1)
                for _ in range(reach.get(event, 1)):  # the nearest frame of the notebook's code or the grader's
                    if frame is None or student(frame) or frame.f_code.co_filename.startswith(grader_dir):
                        break
                    frame = frame.f_back
                if frame is None or not student(frame):
                    return
                if label is IMPERSONATED:
                    name = args[1] if len(args) > 1 and isinstance(args[1], str) else None
                    if name is not None:
                        compiled.add(name)  # code of that name is the notebook's, whatever globals it runs in
                        own.add(name)
                        copies_refused(args[0], name)  # a copy of the answer key, decoded and exec'd?
                    if name is None or not name.startswith(impersonated):
                        return  # compiled under a name of the notebook's own
                root = child.current_root if type(child.current_root) is str else None
                if (root, label) not in sent:
                    sent.add((root, label))
                    send(wfd, dumps(("flag", root, label), protocol=protocol))
            finally:
                busy[0] = False

        sys.addaudithook(hook)

    def checker(self):
        """A check bound now, before the notebook's code runs: it compares the grader's code with what it was and
        returns the verdicts not yet sent. Rebinding `_Guard`'s methods or the guard's record later changes
        nothing for it (it holds its own copies)."""
        intact, machinery, changes = list(self.intact), list(self.machinery), self._changes
        flags, guard, sent, pipe, child = self.flags, self, set(), self.out, _CHILD
        # a method shadowed by an instance attribute (`guard.flag = print`) is not in any class's dict: `_members`
        # would not see it
        shadowable = [(obj, {k for k, v in vars(type(obj)).items() if callable(v) or isinstance(v, (staticmethod, property))})
                      for obj in (guard, child) if obj is not None]

        # the guard's tables of what it watches and whose code is whose, fixed once the cells may run: emptied (and
        # not put back within the call), a whole kind of verdict would be off for the rest of the run
        def copy(value):
            return dict(value) if type(value) is dict else set(value) if type(value) is set else value

        tables = [(name, vars(guard)[name], copy(vars(guard)[name])) for name in
                  ("watched_code", "watched_c", "trusted", "registrar", "spawners") if name in vars(guard)]
        # the file names the notebook compiled code under (its code, whatever module's globals it runs in): the audit
        # hook's own copy, handed over here before the cells run and then out of reach
        compiled, compiled_own = self.compiled, self.__dict__.pop("_compiled_own", set())

        def note(why):
            found = flags.setdefault("*", [])
            if why not in found:
                found.append(why)

        def check():
            for why in changes(intact, machinery):
                note(why)
            if (guard.__dict__.get("flags") is not flags or guard.__dict__.get("out") is not pipe
                    or any(guard.__dict__.get(name) is not was or copy(was) != contents for name, was, contents in tables)
                    or guard.__dict__.get("compiled") is not compiled or not compiled_own <= compiled):
                note("replaced the grader's record of what it saw")
            for obj, methods in shadowable:
                hidden = sorted(k for k in vars(obj) if k in methods)
                if hidden:
                    note(f"replaced the grader's own code in its process ({type(obj).__name__}.{hidden[0]}, on the "
                         f"instance)")
            out = []
            for root, whys in list(flags.items()):
                for why in whys:
                    if (root, why) not in sent:
                        sent.add((root, why))
                        out.append((root, why))
            return out

        return check


class _ChildUnpickler(pickle.Unpickler):
    """In the child: the trusted side's messages (trusted, so a normal unpickler) with its references resolved."""

    def find_class(self, module, name):
        own = _OWN.get(module)  # the grader's modules are no longer in sys.modules (`_hide_modules`)
        return getattr(own, name) if own is not None else super().find_class(module, name)

    def persistent_load(self, pid):
        tag = pid[0]
        if tag == "C":
            return _CHILD.objects[pid[1]]
        if tag == "P":
            return _ParentProxy(pid[1], pid[2], pid[3])
        if tag == "t":
            return pid[1]
        if tag == "G":
            import torch

            return torch.Generator(device=pid[1]).manual_seed(pid[2])  # a seed drawn for it (grader.wire)
        raise pickle.UnpicklingError(f"unknown tag {tag!r}")


def _child_main(rfd, wfd, memory, sandbox, memory_kind="as"):
    global _CHILD
    import torch  # noqa: F401  (imported before the student's code, and before the memory limit)

    import lib.io_model  # lib first: it sets TRITON_INTERPRET before anything imports triton
    from grader import notebook, similarity  # noqa: F401  (similarity: judges code compiled later, see judge_compiled)

    from grader import observe  # the guard remembers its code; warm_up below
    from grader.fingerprint import warm

    _OWN.update((name, module) for name, module in list(sys.modules.items())
                if name == "grader" or name.startswith("grader."))
    _OWN["TensorMemoryMeter"] = lib.io_model.TensorMemoryMeter
    warm()  # lib's fingerprints, taken before the student's code can touch lib's modules
    observe.warm_up()  # the first observation's fixed cost, paid at start-up rather than in an exercise's time
    _freeze()
    _CHILD = _Child(rfd, wfd, memory, sandbox)
    _CHILD.memory_kind = memory_kind
    _CHILD.guard.remember()
    _CHILD.guard.audit(_CHILD, wfd)
    _hide_modules()
    _CHILD.send(("ok", None, sandbox))
    _CHILD.loop()


def _hide_modules() -> None:
    """The grader's modules leave `sys.modules` (and the `grader` package's attributes, and the start-up script's
    globals, `__main__`): the notebook's `import grader.child` then loads a fresh copy of the file, whose `_CHILD`
    is None, instead of handing it this process's records of what ran (which it could clear). The grader's own code
    keeps its modules (`_OWN`). `grader.checks` is a stub either way."""
    for name in [n for n in sys.modules if n == "grader" or n.startswith("grader.")]:
        _OWN.setdefault(name, sys.modules[name])
        del sys.modules[name]
    package = _OWN.get("grader")
    for name in list(vars(package)) if package is not None else ():
        if isinstance(getattr(package, name), type(sys)):
            delattr(package, name)
    main = sys.modules.get("__main__")
    if main is not None:
        for name in [n for n in vars(main) if not n.startswith("__")]:  # the script never returns to use them
            delattr(main, name)
