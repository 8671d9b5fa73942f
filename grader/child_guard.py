"""The audit policy of the student's process: what the notebook's code may not do to the grader there.

`_Guard` is the second line behind `grader.view` (which keeps the answers out of the process). It watches, through the
child's profiler (`event`, from `grader.child_observe`) and an audit hook no code can remove (`audit`), for the ways to
switch off or get round the checks' observers (the dispatch modes, the profiler, tracemalloc, threads and processes,
torch.library, redispatch, dispatch-key guards), to reach the grader's objects (frames, the garbage collector, ctypes,
the profiler function) and to pass code off as the grader's or Python's (compiled under their file names, code objects
made by hand, copies of the answer key compiled while the notebook runs: `judge_compiled`); and it compares the grader's
code here, and what its observers run on, by identity with what it was before the cells ran (`grader.child_identity`).
Each finding is a verdict, sent to the trusted process the moment it is found. The messages are this module's
constants (`SPAWNED`, `FRAME_TAKEN`, ...); the builtins it watches are replaced by the shims below (`_traced`, ...).
"""
from __future__ import annotations

import os
import pickle
import sys
from pathlib import Path

from grader.child_identity import OWN, grader_code, observer_machinery, runtime_functions
from grader.wire import send_message

# What the guard's code runs on, bound before the notebook's code runs (as `grader.wire`'s framing): `pickle.dumps`
# or `os.path.realpath` replaced by the notebook's code by plain names changes nothing here.
_dumps, _realpath = pickle.dumps, os.path.realpath

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
MEMORY_READ = ("read the process's memory by address through ctypes (string_at, from_address): a tensor's data read "
               "that way is out of the checks' sight, and so is the grader's")
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
# name, which tells the checks that the code is the grader's): not this module, whose `OWN` leads to the grader's records.
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


_MISSING = object()


class _Guard:
    """Second line behind `grader.view` (which keeps the answers out of this process): the notebook's code must not
    switch off the watching (`sys.setprofile`), pop the checks' dispatch modes, walk the garbage collector, a frame
    or the profiler function to the grader's objects, call C through ctypes, or rewrite the grader's own modules
    here or what its observers run on (`grader.child_identity`). What it did is a verdict
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
                     "_get_dispatch_stack_at", "_get_dispatch_mode"):  # these two hand out the modes themselves
            fn = getattr(torch._C, name, None)
            if fn is not None and getattr(fn, "__code__", None) is None:
                self.watched_c[id(fn)] = f"called torch._C.{name} (the checks observe through a dispatch mode)"
                # ... and as Python code (torch._C's attribute, and torch.utils._python_dispatch's import of it), so
                # that a call through functools.partial is seen too
                shim = _internal(fn)
                setattr(torch._C, name, shim)
                if getattr(pd, name, None) is fn:
                    setattr(pd, name, shim)
        # ... and these tell a call made under a dispatch mode (every call the checks make) from one made in a notebook
        # (red team 12b's #12: a mask switched on only while the stack is not empty): watched as C calls by the
        # notebook's code, not put behind Python code (torch's own dispatch calls some of them for every op)
        for name in ("_len_torch_dispatch_stack", "_len_torch_dispatch_stack_pre_dispatch",
                     "_dispatch_tls_local_include_set", "_dispatch_tls_local_exclude_set",
                     "_dispatch_tls_is_dispatch_key_included", "_dispatch_tls_is_dispatch_key_excluded"):
            fn = getattr(torch._C, name, None)
            if fn is not None and getattr(fn, "__code__", None) is None:
                self.watched_c[id(fn)] = f"called torch._C.{name} (the checks observe through a dispatch mode)"
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
        self.own_spawn = False  # True while the grader's own code here starts a thread (grader.child's "thread")
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
                     "_get_current_dispatch_mode_stack", "is_in_torch_dispatch_mode", "is_in_any_mode_without_ignore_compile_internals"):
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
        here = Path(__file__).resolve().parent
        self.grader_files = (str(here) + os.sep, os.path.realpath(here) + os.sep)
        self.own_globals, self._own_count = frozenset(), -1

    def own_module(self, g: dict) -> bool:
        """Whether globals `g` are those of one of the grader's modules as this process loaded them (`OWN`), or the
        bare globals of the guard's shims: a fresh copy of a grader file the notebook imports is not (red team 9, #5:
        `from grader.triton_watch import _values` to call numpy() from a file under grader/)."""
        if len(OWN) != self._own_count:  # OWN grows until the grader's modules leave sys.modules (`_hide_modules`)
            self._own_count = len(OWN)
            self.own_globals = frozenset(id(vars(m)) for m in OWN.values() if type(m) is type(sys)) | {id(_BARE)}
        return id(g) in self.own_globals

    def student(self, frame) -> bool:
        """Whether `frame` runs the notebook's code (or code it compiled), not Python's, torch's or the grader's:
        by the module the code runs in (a dataclass's generated `__init__` runs in its class's module)."""
        if frame is None or frame.f_code.co_filename in self.compiled:
            return True  # code the notebook compiled, run in any module's globals (exec(source, vars(functools)))
        g = frame.f_globals
        where = g.get("__file__")
        if isinstance(where, str) and where:
            if where.startswith(self.grader_files):  # the grader's code by identity, not by path
                return not self.own_module(g)
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
            if label is SPAWNED and self.own_spawn:
                return
            if label is not None and (label is SPAWNED or self.student(frame.f_back)):
                self.flag(root, label)
        elif event == "c_call":
            label = self.watched_c.get(id(arg))
            if label is None:
                return
            if id(arg) == self.registrar:  # torch.library's own code calls it: whose request is it?
                while frame is not None and frame.f_code.co_filename.startswith(_TORCH_LIBRARY):
                    frame = frame.f_back
            if (id(arg) in self.spawners and not self.own_spawn) or self.student(frame):
                self.flag(root, label)

    def reasons(self, name) -> list[str]:
        return self.flags.get(name, []) + self.flags.get(None, []) + self.flags.get("*", [])

    def remember(self) -> None:
        """What the grader's code in this process is, and what it observes through, before the notebook's code runs."""
        self.intact = grader_code()
        self.machinery = observer_machinery() + runtime_functions()

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
                  "ctypes.string_at": MEMORY_READ, "ctypes.wstring_at": MEMORY_READ, "ctypes.cdata": MEMORY_READ,
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
        references, judge, refused, similarity = [], judge_compiled, COMPILED_COPY, OWN["grader.similarity"]

        def real_class(obj) -> bool:
            """Whether `obj` (what `object.__setattr__` changed: a function's `__module__` or `__defaults__`, a
            class) is the grader's as this process runs it (`OWN`): a fresh copy of a grader file is the notebook's
            own, and its code setting its own functions' attributes changes nothing the grader runs."""
            if type(obj) is type(real_class):  # a function: the grader's by its globals
                return self.own_module(obj.__globals__)
            name = getattr(obj, "__module__", None)
            if not isinstance(name, str) or not name.startswith("grader."):
                return False
            if not isinstance(obj, type):
                return True  # anything else of a grader module's, as before
            module, qualname = OWN.get(name), getattr(obj, "__qualname__", "")
            if module is None or not isinstance(qualname, str):
                return module is not None
            return "." in qualname or vars(module).get(qualname) is obj

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
                if label is changed_class and not real_class(args[0]):
                    return  # not the grader's (a class of a fresh copy of a grader file, which nothing here runs)
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

    def checker(self, child):
        """A check bound now, before the notebook's code runs (by `child`, the process's runtime): it compares the
        grader's code with what it was and returns the verdicts not yet sent. Rebinding `_Guard`'s methods or the
        guard's record later changes nothing for it (it holds its own copies)."""
        intact, machinery, changes = list(self.intact), list(self.machinery), self._changes
        flags, guard, sent, pipe = self.flags, self, set(), self.out
        # a method shadowed by an instance attribute (`guard.flag = print`) is not in any class's dict: `grader_code`
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


def new_guard() -> _Guard:
    """The process's guard (`grader.child._Child`); it watches once `remember` and `audit` have run."""
    return _Guard()
