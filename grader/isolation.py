"""Student code in a separate, resource-limited process; the checks in the trusted one, talking through proxies.

    session = Session(notebook)           # starts the child: rlimits, Landlock, its own temporary folder
    session.load(cells)                   # the child runs the notebook's exercise cells
    fn = session.get("causal_mask")       # a proxy: calling it sends the arguments to the child,
    fn(3, 8)                              #   runs the student's function there, and receives the result

What crosses the boundary
-------------------------
- trusted -> child: pickled. Plain data (numbers, strings, tensors, containers, dtypes, dataclass configs) is
  copied; anything with identity or behaviour (models, spies, functions made in a check, autograd contexts)
  stays in the trusted process and the child gets a proxy that calls back.
- child -> trusted: **never unpickled as such.** The child encodes its results as plain data (exact built-in
  types, tensors as raw bytes with dtype/shape/strides, numpy arrays as bytes) or as a reference to an object
  that stays in the child (a class, an instance, a function); the trusted side decodes with an unpickler that
  refuses every global, so the student's code can never run in the trusted process and a value can never
  lie about what it is (an `int` subclass whose `__eq__` always says True arrives as a plain `int`).
- Exceptions cross as (class names of the MRO, message); the trusted side re-raises the nearest built-in
  class (a `CacheOverflowError(ValueError)` arrives as a `ValueError` subclass of that name). `SystemExit`
  and `KeyboardInterrupt` raised by student code arrive as `RuntimeError`.

Emulated so that checks written for one process keep working: in-place changes to list/dict arguments are
copied back (`visited=[]` out-parameters); a tensor view of a buffer the student keeps (a KV cache's
`k[:, :, :length]`) keeps the same `data_ptr()` between calls; a `TensorMemoryMeter` active around a call
sees the peak bytes allocated in the child; a student `torch.autograd.Function` subclass arrives as a local
`Function` whose forward/backward run in the child (the `ctx` stays here). A tensor argument the call
changes in place (`k_pool.mul_(2)`, `x.data[0] = 1`, a resize) is *not* copied back — the caller's tensor
may be a worker's cached input, shared with the next submission — the call raises `ArgumentChanged` (an
AssertionError: the exercise fails with that reason), as a check comparing its arguments after the call would.

Limits of one child: RLIMIT_AS (address space), RLIMIT_CPU, RLIMIT_FSIZE, RLIMIT_CORE=0, a wall-clock
timeout for each call (`INFERENCE_LAB_CALL_TIMEOUT`, default 60 s of silence from the child) and a budget for
the whole session (`INFERENCE_LAB_BUDGET`, default 900 s). A child that dies (os._exit, a crash, out of
memory, killed at a timeout) is restarted for the next exercise, up to `max_restarts` times.
"""
from __future__ import annotations

import builtins
import contextlib
import dataclasses
import enum
import io
import operator
import os
import pickle
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import types
import weakref
from pathlib import Path
from grader.fingerprint import lib_name  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parent.parent
LIB_DIR = str(REPO_ROOT / "lib") + os.sep
MAX_MESSAGE = 1 << 30  # 1 GiB: a bigger message from the child is a protocol violation

DEFAULT_CALL_TIMEOUT = 60.0
DEFAULT_BUDGET = 900.0
DEFAULT_EXERCISE_TIMEOUT = 180.0  # seconds of the student's code per graded test (autograde), summed over its calls
DEFAULT_MEMORY = 4 << 30  # bytes of address space the child may add after importing torch
DEFAULT_CPU = 600  # CPU seconds for one child


def _env_float(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name) or default)
    except ValueError:
        return default


class IsolationError(AssertionError):
    """The student's process did not answer: it timed out, died, or broke the protocol."""


class StudentTimeout(IsolationError):
    pass


class StudentCrash(IsolationError):
    pass


# --- framing ----------------------------------------------------------------------------------------------

def _send(fd: int, payload: bytes) -> None:
    data = struct.pack(">Q", len(payload)) + payload
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _recv_exact(fd: int, n: int, deadline: float | None) -> bytes:
    chunks, got = [], 0
    while got < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                raise TimeoutError
        chunk = os.read(fd, min(n - got, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _recv(fd: int, timeout: float | None) -> bytes:
    deadline = None if timeout is None else time.monotonic() + timeout
    (n,) = struct.unpack(">Q", _recv_exact(fd, 8, deadline))
    if n > MAX_MESSAGE:
        raise ValueError(f"message of {n} bytes")
    # Once a message has started, its body gets a fresh allowance (big tensors take a while on a busy machine).
    return _recv_exact(fd, n, None if timeout is None else time.monotonic() + max(timeout, 30.0))


# --- operations, the same on both sides -------------------------------------------------------------------

def _apply(op: str, obj, args: tuple):
    if op == "getattr":
        return getattr(obj, args[0])
    if op == "setattr":
        setattr(obj, args[0], args[1])
        return None
    if op == "delattr":
        delattr(obj, args[0])
        return None
    if op == "call":
        return obj(*args[0], **args[1])
    if op == "getitem":
        return obj[args[0]]
    if op == "setitem":
        obj[args[0]] = args[1]
        return None
    if op == "len":
        return len(obj)
    if op == "iter":
        return iter(obj)
    if op == "next":
        return next(obj)
    if op == "bool":
        return bool(obj)
    if op == "float":
        return float(obj)
    if op == "int":
        return int(obj)
    if op == "index":
        return operator.index(obj)
    if op == "repr":
        return repr(obj)
    if op == "str":
        return str(obj)
    if op == "contains":
        return args[0] in obj
    if op == "dir":
        return list(dir(obj))
    raise ValueError(f"unknown operation {op!r}")


def _exc_info(e: BaseException) -> tuple[list[str], str]:
    names = [c.__name__ for c in type(e).__mro__]
    try:
        msg = str(e)
    except Exception:  # noqa: BLE001
        msg = "<unprintable>"
    return names[:20], msg[:20000]


_SAFE_EXC = {name: obj for name, obj in vars(builtins).items()
             if isinstance(obj, type) and issubclass(obj, Exception)}
_SAFE_EXC["StopIteration"] = StopIteration


def _rebuild_exc(info) -> BaseException:
    """An exception from (MRO names, message), using only built-in classes (and the harness's two)."""
    from grader.harness import ExerciseMissing, NotImplementedYet

    names, msg = info
    if not (isinstance(names, list) and all(type(n) is str for n in names) and type(msg) is str):
        return IsolationError("malformed exception from the student's process")
    known = dict(_SAFE_EXC, NotImplementedYet=NotImplementedYet, ExerciseMissing=ExerciseMissing,
                 StudentTimeout=StudentTimeout, StudentCrash=StudentCrash, IsolationError=IsolationError)
    if names and names[0] in ("SystemExit", "KeyboardInterrupt", "GeneratorExit"):
        return RuntimeError(f"the code raised {names[0]}({msg})")
    for i, name in enumerate(names):
        base = known.get(name)
        if base is not None:
            if i == 0:
                return base(msg)
            cls = type(names[0][:100], (base,), {"__module__": "student"})
            return cls(msg)
    return RuntimeError(f"{names[0] if names else 'error'}: {msg}")


# =========================================================================================================
# The trusted side
# =========================================================================================================

_BY_VALUE_MODULES = ("torch", "lib", "math", "builtins", "numpy", "operator", "functools", "grader", "collections",
                     "typing", "dataclasses", "itertools")


def _module_root(obj) -> str:
    return (getattr(obj, "__module__", None) or "").split(".")[0]


_CHILD_MAY = {"getattr", "setattr", "delattr", "call", "getitem", "setitem", "len", "iter", "next", "bool",
              "float", "int", "index", "repr", "str", "contains", "byvalue"}


# The checks' models (SmolLM2 above all) are shared by every submission a worker grades: the notebook's code may
# run them and read them, never change them (`model.half()`, `model.layers[0] = ...`, a forward hook), or the
# next student would be graded against a broken model. Reads that nn.Module itself defines are listed here;
# every other name nn.Module defines (to, half, apply, register_*, load_state_dict, train, ...) is refused.
_MODULE_READS = {"forward", "parameters", "named_parameters", "buffers", "named_buffers", "children",
                 "named_children", "modules", "named_modules", "state_dict", "training", "extra_repr",
                 "get_submodule", "get_parameter", "get_buffer"}


def _refuse_module_change(op: str, target, args: tuple) -> None:
    import torch

    if not isinstance(target, torch.nn.Module):
        return
    if op in ("setattr", "delattr", "setitem"):
        raise AttributeError(f"the checks' models are read-only to the notebook's code ({op} on a "
                             f"{type(target).__name__} was refused): build your own tensors instead")
    if op == "getattr" and args[0] not in _MODULE_READS and hasattr(torch.nn.Module, args[0]):
        raise AttributeError(f"the checks' models are read-only to the notebook's code: "
                             f"{type(target).__name__}.{args[0]} is not available to it (run the model, "
                             f"read its config and weights; do not change it)")


class _TrustedPickler(pickle.Pickler):
    """Pickles arguments for the child: plain data by value, objects with identity or behaviour by reference."""

    def __init__(self, file, session: "Session"):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.session = session

    def persistent_id(self, obj):
        import torch

        t = type(obj)
        if t in (type(None), bool, int, float, complex, str, bytes, bytearray, list, tuple, dict, set, frozenset,
                 slice, range, type(Ellipsis), type(NotImplemented)):
            return None
        if t is _ByValue or t is pickle.PickleBuffer:  # numpy's array data under protocol 5, in-band
            return None
        if isinstance(obj, ChildProxy):
            if obj._session is not self.session or obj._generation != self.session.generation:
                raise IsolationError("an object of the student's earlier process was used after a restart")
            return ("C", obj._oid)
        if isinstance(obj, torch.Tensor):
            if t is torch.Tensor and not obj.requires_grad:
                return None  # torch's own pickling (its storage below is copied too)
            return ("t", obj.detach())  # a Parameter, a subclass, or part of an autograd graph: its data only
        if isinstance(obj, (torch.UntypedStorage, torch.storage.TypedStorage)):
            return None
        if t is torch.Generator:  # by state; the child's final state is copied back (see _copy_back)
            return ("G", str(obj.device), bytes(obj.get_state().numpy().tobytes()))
        if isinstance(obj, (torch.dtype, torch.device, torch.Size, torch.memory_format, torch.layout)):
            return None
        if isinstance(obj, torch.nn.Module):
            return ("P",) + self.session.export(obj)
        if isinstance(obj, types.ModuleType):
            raise TypeError("a module is never handed to the notebook's code")
        if isinstance(obj, (types.FunctionType, type, types.BuiltinFunctionType)):
            qual = getattr(obj, "__qualname__", "")
            if _module_root(obj) in _BY_VALUE_MODULES and "<" not in qual:
                return None  # pickled by name, imported in the child
            if isinstance(obj, types.BuiltinFunctionType):
                raise TypeError(f"{qual} is never handed to the notebook's code")
            return ("P",) + self.session.export(obj)
        if t.__module__.split(".")[0] == "numpy" or isinstance(obj, enum.Enum):  # arrays, dtypes (numpy.dtypes.*), scalars
            return None
        if isinstance(obj, dict) and _module_root(t) == "collections":
            return None
        if dataclasses.is_dataclass(obj) and _module_root(t) in _BY_VALUE_MODULES:
            return None  # configs: copied
        return ("P",) + self.session.export(obj)


def _refuse(self):
    raise pickle.UnpicklingError("the student's process sent an opcode that could call code: refused")


def _safe_append(self):
    value = self.stack.pop()
    if type(self.stack[-1]) is not list:
        _refuse(self)
    self.stack[-1].append(value)


def _safe_appends(self):
    items = self.pop_mark()
    if type(self.stack[-1]) is not list:
        _refuse(self)
    self.stack[-1].extend(items)


def _safe_setitem(self):
    value = self.stack.pop()
    key = self.stack.pop()
    if type(self.stack[-1]) is not dict:
        _refuse(self)
    self.stack[-1][key] = value


def _safe_setitems(self):
    items = self.pop_mark()
    if type(self.stack[-1]) is not dict:
        _refuse(self)
    for i in range(0, len(items), 2):
        self.stack[-1][items[i]] = items[i + 1]


def _safe_additems(self):
    items = self.pop_mark()
    if type(self.stack[-1]) is not set:
        _refuse(self)
    self.stack[-1].update(items)


def _safe_dispatch() -> dict:
    table = dict(pickle._Unpickler.dispatch)
    for name in ("GLOBAL", "STACK_GLOBAL", "REDUCE", "BUILD", "INST", "OBJ", "NEWOBJ", "NEWOBJ_EX", "EXT1", "EXT2",
                 "EXT4", "NEXT_BUFFER", "READONLY_BUFFER", "PERSID"):
        code = getattr(pickle, name, None)
        if code is not None:
            table[code[0]] = _refuse
    table[pickle.APPEND[0]] = _safe_append
    table[pickle.APPENDS[0]] = _safe_appends
    table[pickle.SETITEM[0]] = _safe_setitem
    table[pickle.SETITEMS[0]] = _safe_setitems
    table[pickle.ADDITEMS[0]] = _safe_additems
    return table


class _SafeUnpickler(pickle._Unpickler):
    """Decodes the child's messages with the pure-Python unpickler and an opcode table that can build only
    built-in containers and scalars: no globals, no calls (REDUCE/NEWOBJ), no __setstate__ (BUILD), and
    list/dict/set updates only on real lists, dicts and sets. Everything else arrives as tagged data."""

    dispatch = _safe_dispatch()

    def __init__(self, file, session: "Session"):
        super().__init__(file)
        self.session = session

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"the student's process sent a global ({module}.{name}): refused")

    def persistent_load(self, pid):
        if type(pid) is not tuple or not pid or type(pid[0]) is not str:
            raise pickle.UnpicklingError("bad reference")
        return self.session.decode_tagged(pid)


class ChildProxy:
    """An object that lives in the student's process. Attribute access, calls, indexing and iteration are sent
    there; equality and hashing are by identity (a student's object cannot claim to equal the answer)."""

    __slots__ = ("_session", "_oid", "_generation", "_info", "_name", "__weakref__")

    def __init__(self, session, oid, info, name=None):
        object.__setattr__(self, "_session", session)
        object.__setattr__(self, "_oid", oid)
        object.__setattr__(self, "_generation", session.generation)
        object.__setattr__(self, "_info", info)
        object.__setattr__(self, "_name", name)  # the notebook name it was looked up by, if any

    def _do(self, op, *args):
        return self._session.request(op, self, args)

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__") and name not in ("__name__", "__qualname__", "__doc__"):
            if name == "__observe__" and self._info.get("callable"):
                return lambda args, kwargs: self._session.observe(self, args, kwargs)
            if name == "__map__" and self._info.get("callable"):  # many calls, one round trip (checks.call_many)
                return lambda calls: self._session.request("map", self, (list(calls),))
            raise AttributeError(name)
        return self._do("getattr", name)

    def __setattr__(self, name, value):
        self._do("setattr", name, value)

    def __delattr__(self, name):
        self._do("delattr", name)

    def __call__(self, *args, **kwargs):
        meter = _active_memory_meter()
        if meter is not None:  # measure in the child, where the memory is allocated
            result, peak, copied = self._session.request("metered", self, (args, kwargs))
            _copy_back(args, kwargs, copied)
            meter.peak = max(meter.peak, meter.current + int(peak))
            return result
        return self._session.call(self, args, kwargs)

    def __getitem__(self, key):
        return self._do("getitem", key)

    def __setitem__(self, key, value):
        self._do("setitem", key, value)

    def __len__(self):
        n = self._do("len")
        if type(n) is not int:
            raise TypeError("len() did not return an int")
        return n

    def __iter__(self):
        it = self._do("iter")
        while True:
            try:
                yield it._do("next") if isinstance(it, ChildProxy) else next(it)
            except StopIteration:
                return

    def __contains__(self, item):
        return bool(self._do("contains", item))

    def __bool__(self):
        return self._do("bool") is True

    def __float__(self):
        v = self._do("float")
        if type(v) is not float:
            raise TypeError("__float__ did not return a float")
        return v

    def __int__(self):
        v = self._do("int")
        if type(v) is not int:
            raise TypeError("__int__ did not return an int")
        return v

    def __index__(self):
        v = self._do("index")
        if type(v) is not int:
            raise TypeError("__index__ did not return an int")
        return v

    def __repr__(self):
        try:
            r = self._do("repr")
        except Exception:  # noqa: BLE001
            r = "?"
        return f"<student {self._info.get('type', 'object')} {str(r)[:200]}>"

    def __str__(self):
        try:
            return str(self._do("str"))[:10000]
        except Exception:  # noqa: BLE001
            return repr(self)

    def __eq__(self, other):
        return self is other

    def __ne__(self, other):
        return self is not other

    def __hash__(self):
        return id(self)

    def __reduce__(self):
        raise TypeError("an object of the student's process cannot be pickled")


def _active_memory_meter():
    try:
        from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

        from lib.io_model import TensorMemoryMeter
    except Exception:  # noqa: BLE001
        return None
    for mode in reversed(_get_current_dispatch_mode_stack()):
        if isinstance(mode, TensorMemoryMeter):
            return mode
    return None


def _autograd_function(proxy: ChildProxy):
    """A local torch.autograd.Function whose forward and backward run the student's (ctx stays here)."""
    import torch

    class StudentFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *args):
            return proxy.forward(ctx, *args)

        @staticmethod
        def backward(ctx, *grads):
            return proxy.backward(ctx, *grads)

    StudentFunction.__name__ = StudentFunction.__qualname__ = str(proxy._info.get("name") or "StudentFunction")
    StudentFunction._remote = proxy
    return StudentFunction


# --- every process a submission starts ------------------------------------------------------------------
# A process group is not enough: `setsid` leaves it, and a double fork leaves the child's process tree. The child
# is the subreaper of its own tree (grader._sandbox), a grading worker is the subreaper of what the child leaves
# (`become_subreaper`), and, as root where a pids cgroup can be made, the child is in one of its own. `kill_tree`
# stops (a stopped process cannot fork) and then kills all of them.

_PR_SET_CHILD_SUBREAPER, _PR_GET_CHILD_SUBREAPER = 36, 37


def _libc():
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def become_subreaper() -> bool:
    """Make this process the subreaper of its descendants: one whose parent dies is handed to it, not to init."""
    return sys.platform.startswith("linux") and _libc().prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def _is_subreaper() -> bool:
    import ctypes

    flag = ctypes.c_int(0)
    return sys.platform.startswith("linux") and \
        _libc().prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0) == 0 and flag.value == 1


def _processes() -> dict[int, tuple[int, int, str]]:
    """pid -> (parent pid, start time in clock ticks since boot, state) of every process (Linux /proc)."""
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    stat = f.read()
                fields = stat[stat.rindex(b")") + 2:].split()
                table[int(entry)] = (int(fields[1]), int(fields[19]), fields[0].decode())
            except (OSError, ValueError, IndexError):
                pass
    return table


def _start_time(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return int(stat[stat.rindex(b")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _cgroup_members(cgroup: str | None) -> set[int]:
    if not cgroup:
        return set()
    try:
        with open(os.path.join(cgroup, "cgroup.procs")) as f:
            return {int(line) for line in f if line.strip()}
    except (OSError, ValueError):
        return set()


def kill_tree(root: int | None, orphans_since: int | None = None, keep: set[int] = frozenset(),
              cgroup: str | None = None) -> int:
    """SIGKILL `root`, every descendant of it, every process in `cgroup`, and (`orphans_since`, a start time) this
    process's own children started since then but `keep` — a subreaper's share of what a dead child left. Each is
    first stopped, through a pidfd taken while its start time still matched (so a reused pid is never hit),
    until a pass finds no new one; then all are killed and this process's own are reaped. Returns how many."""
    me = os.getpid()
    held: dict[int, int] = {}  # pid -> pidfd of a stopped process
    try:
        for _ in range(1000):
            table = _processes()
            roots = ({root} if root in table else set()) | (_cgroup_members(cgroup) & set(table))
            if orphans_since is not None:
                roots |= {p for p, (parent, start, _) in table.items()
                          if parent == me and start >= orphans_since and p not in keep}
            children: dict[int, list[int]] = {}
            for p, (parent, _, _) in table.items():
                children.setdefault(parent, []).append(p)
            found, todo = set(), list(roots)
            while todo:
                p = todo.pop()
                if p not in found:
                    found.add(p)
                    todo.extend(children.get(p, ()))
            new = [p for p in found - set(held) if table[p][2] not in "ZX"]
            if not new:
                break
            for p in new:
                try:
                    fd = os.pidfd_open(p)
                except OSError:
                    continue
                if _start_time(p) != table[p][1]:
                    os.close(fd)
                    continue
                held[p] = fd
                try:
                    signal.pidfd_send_signal(fd, signal.SIGSTOP)
                except OSError:
                    pass
        for fd in held.values():
            try:
                signal.pidfd_send_signal(fd, signal.SIGKILL)
            except OSError:
                pass
    finally:
        for fd in held.values():
            os.close(fd)
    # Reap the ones handed to this process (a Popen reaps its own `root`), and those that had already exited.
    deadline = time.monotonic() + 5
    mine = {p for p in held if p != root}
    if orphans_since is not None:
        mine |= {p for p, (parent, start, state) in _processes().items()
                 if parent == me and state == "Z" and start >= orphans_since and p != root and p not in keep}
    while mine and time.monotonic() < deadline:
        for p in list(mine):
            try:
                done, _ = os.waitpid(p, os.WNOHANG)
            except ChildProcessError:  # not ours: its own parent (also being killed) or init reaps it
                done = p
            if done:
                mine.discard(p)
        if mine:
            time.sleep(0.01)
    return len(held)


def _pids_cgroup() -> str | None:
    """As root: a new pids cgroup (at most `_sandbox.MAX_PROCESSES` tasks) below this process's own, or None where
    none can be made (no pids controller, not writable, not root: then RLIMIT_NPROC applies)."""
    from grader._sandbox import MAX_PROCESSES

    if os.geteuid() != 0:
        return None
    try:
        with open("/proc/self/cgroup") as f:
            lines = [line.rstrip("\n").split(":", 2) for line in f]
    except OSError:
        return None
    for _, controllers, path in lines:
        if "pids" in controllers.split(","):
            base = f"/sys/fs/cgroup/pids{path.rstrip('/')}"
            break
    else:
        return None
    try:
        cgroup = tempfile.mkdtemp(prefix="inference-lab-", dir=base)
        with open(os.path.join(cgroup, "pids.max"), "w") as f:
            f.write(str(MAX_PROCESSES))
        return cgroup
    except OSError:
        return None


def _remove_cgroup(cgroup: str | None) -> None:
    if cgroup:
        for _ in range(50):
            try:
                os.rmdir(cgroup)
                return
            except FileNotFoundError:
                return
            except OSError:  # still has (dying) members
                time.sleep(0.02)


_SESSIONS: "weakref.WeakSet[Session]" = weakref.WeakSet()


def _close_all() -> None:
    for session in list(_SESSIONS):
        session.close()


import atexit  # noqa: E402

atexit.register(_close_all)


class Session:
    """One student process: started on demand, restarted after it dies, stopped with `close()`."""

    def __init__(self, notebook: str | Path, cells: list[tuple[int, str | None, str]] | None = None,
                 call_timeout: float | None = None, budget: float | None = None,
                 memory: int | None = None, cpu: int | None = None, max_restarts: int = 4):
        self.notebook = str(notebook)
        self.cells = cells
        self.call_timeout = call_timeout or _env_float("INFERENCE_LAB_CALL_TIMEOUT", DEFAULT_CALL_TIMEOUT)
        self.budget = budget or _env_float("INFERENCE_LAB_BUDGET", DEFAULT_BUDGET)
        self.exercise: str | None = None  # the graded test running now (`time_limit`)
        self.exercise_limit: float | None = None
        self.exercise_used = 0.0
        self.timeouts: list[str] = []  # one line per time limit that stopped the child
        self.memory = int(memory or _env_float("INFERENCE_LAB_MEMORY", DEFAULT_MEMORY))
        self.cpu = int(cpu or _env_float("INFERENCE_LAB_CPU", DEFAULT_CPU))
        self.max_restarts = max_restarts
        self.generation = 0
        self.proc: subprocess.Popen | None = None
        self.dead: str | None = None  # why the current child is gone
        self.load_info: dict = {}
        self.started = time.monotonic()
        self.restarts = 0
        self._exports: dict[int, object] = {}
        self._storages: dict[int, object] = {}
        self._next_req = 0
        self.workdir: str | None = None
        self.cgroup: str | None = None
        self._child_start: int | None = None
        self.log_lines: list[str] = []
        _SESSIONS.add(self)

    # --- lifecycle ------------------------------------------------------------------------------------------
    def start(self) -> None:
        if self.proc is not None and self.dead is None:
            return
        if self.proc is not None:
            self.restarts += 1
            if self.restarts > self.max_restarts:
                raise StudentCrash(f"the student's process was restarted {self.max_restarts} times; giving up "
                                   f"(last: {self.dead})")
        self._stop_child()
        self.generation += 1
        self._exports.clear()
        self._storages.clear()
        self.workdir = tempfile.mkdtemp(prefix="inference-lab-student-")
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("JPY_", "JUPYTER_"))}
        env.update(HOME=self.workdir, TMPDIR=self.workdir, MPLCONFIGDIR=self.workdir, XDG_CACHE_HOME=self.workdir,
                   PYTHONDONTWRITEBYTECODE="1", MPLBACKEND="Agg",
                   PYTHONPATH=os.pathsep.join([str(REPO_ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]))
        env.setdefault("OMP_NUM_THREADS", "1")
        self.cgroup = _pids_cgroup()
        if self.cgroup:
            env["INFERENCE_LAB_PIDS_CGROUP"] = self.cgroup
        log = open(os.path.join(self.workdir, "output.log"), "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-c", _CHILD_BOOT, str(to_child_r), str(from_child_w), self.workdir,
             str(self.memory), str(self.cpu), str(REPO_ROOT)],
            pass_fds=(to_child_r, from_child_w), cwd=self.workdir, env=env, stdin=subprocess.DEVNULL,
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        self._child_start = _start_time(self.proc.pid)
        os.close(to_child_r)
        os.close(from_child_w)
        self._w, self._r = to_child_w, from_child_r
        self.dead = None
        limit, self.exercise_limit = self.exercise_limit, None  # a fresh child's start-up is not the exercise's time
        try:
            hello = self._wait_reply(None, timeout=max(120.0, self.call_timeout))
            self.sandbox = hello
            if self.cells is not None:
                self.load_info = self._request_raw("load", None, (self.notebook, self.cells))
        finally:
            self.exercise_limit = limit

    def load(self, cells: list[tuple[int, str | None, str]]) -> dict:
        self.cells = cells
        self.start()
        return self.load_info

    def _stop_child(self) -> None:
        if self.proc is None:
            return
        for fd in (getattr(self, "_w", None), getattr(self, "_r", None)):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._w = self._r = None
        self._kill_all()
        self._collect_log()
        if self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def _collect_log(self) -> None:
        try:
            with open(os.path.join(self.workdir, "output.log"), "rb") as f:
                f.seek(0, 2)
                f.seek(max(0, f.tell() - 4000))
                self.log_lines = f.read().decode("utf-8", "replace").splitlines()[-20:]
        except (OSError, TypeError):
            pass

    def close(self) -> None:
        self._stop_child()
        self.proc = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass

    def _kill(self, why: str) -> None:
        self.dead = why
        if self.proc is not None:
            self._kill_all()
            self._collect_log()

    def _kill_all(self) -> None:
        """The child and everything it started, `setsid`'d and double-forked processes included (`kill_tree`)."""
        if self.proc is None:
            return
        if not sys.platform.startswith("linux"):  # no /proc, pidfds or subreapers: the process group only
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            self.proc.wait()
            return
        others = {s.proc.pid for s in list(_SESSIONS) if s is not self and s.proc is not None}
        since = self._child_start if self._child_start is not None and _is_subreaper() else None
        kill_tree(self.proc.pid if self.proc.poll() is None else None, orphans_since=since, keep=others,
                  cgroup=self.cgroup)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        _remove_cgroup(self.cgroup)
        self.cgroup = None

    def _death_reason(self, during: str) -> str:
        rc = self.proc.poll() if self.proc is not None else None
        if rc is None:
            return f"stopped responding during {during}"
        if rc < 0:
            sig = -rc
            what = {signal.SIGXCPU: f"used up its CPU time ({self.cpu} s)", signal.SIGKILL: "was killed (out of memory?)",
                    signal.SIGSEGV: "crashed (segmentation fault; out of memory?)", signal.SIGXFSZ: "wrote too big a file",
                    signal.SIGABRT: "aborted (out of memory?)"}.get(sig, f"was ended by signal {sig}")
            return f"the process running the notebook's code {what} during {during}"
        tail = [ln for ln in self.log_lines if ln.strip()]
        hint = ""
        if any("MemoryError" in ln or "std::bad_alloc" in ln or "DefaultCPUAllocator" in ln for ln in tail):
            hint = f" (out of memory: the limit is {self.memory >> 20} MiB beyond the imports)"
        return (f"the process running the notebook's code exited with status {rc} during {during} "
                f"(os._exit() or sys.exit() in the code?){hint}")

    # --- messaging ------------------------------------------------------------------------------------------
    def _encode(self, msg) -> bytes:
        buf = io.BytesIO()
        _TrustedPickler(buf, self).dump(msg)
        return buf.getvalue()

    def _decode(self, data: bytes):
        return _SafeUnpickler(io.BytesIO(data), self).load()

    def export(self, obj) -> tuple:
        oid = id(obj)
        self._exports[oid] = obj
        t = type(obj)
        return (oid, getattr(t, "__module__", ""), getattr(t, "__qualname__", t.__name__))

    def _budget_left(self) -> float:
        return self.budget - (time.monotonic() - self.started)

    @contextlib.contextmanager
    def time_limit(self, exercise: str, seconds: float | None):
        """While this block runs (one graded test), the student's code may take `seconds` in all — the time spent
        waiting for the child, not the checks' own work — so a slow exercise costs only its own points."""
        self.exercise, self.exercise_limit, self.exercise_used = exercise, seconds, 0.0
        try:
            yield
        finally:
            self.exercise = self.exercise_limit = None

    def _timed_out(self, line: str) -> StudentTimeout:
        self.timeouts.append(line)
        self._kill(line)
        return StudentTimeout(line)

    def _wait_reply(self, req_id, timeout: float, during: str = "start-up"):
        """Serve the child's requests until the reply to `req_id` arrives (req_id None: the start-up hello)."""
        while True:
            left = self._budget_left()
            if left <= 0:
                raise self._timed_out(f"the time budget for this notebook ({self.budget:g} s) is used up; "
                                      f"stopped during {during}" + (f" ({self.exercise})" if self.exercise else ""))
            wait = min(timeout, left)
            if self.exercise_limit is not None:
                exercise_left = self.exercise_limit - self.exercise_used
                if exercise_left <= 0:
                    raise self._timed_out(f"{self.exercise} ran out of time: the notebook's code used up this test's "
                                          f"time limit ({self.exercise_limit:g} s, INFERENCE_LAB_EXERCISE_TIMEOUT); "
                                          f"stopped during {during}")
                wait = min(wait, exercise_left)
            began = time.monotonic()
            try:
                data = _recv(self._r, wait)
            except TimeoutError:
                self.exercise_used += time.monotonic() - began
                if wait < timeout:
                    continue  # the budget or exercise check above reports it
                raise self._timed_out(f"{during} took longer than {timeout:g} s (an endless loop?); the process "
                                      f"running the notebook's code was stopped") from None
            except (EOFError, OSError, ValueError) as e:
                self.exercise_used += time.monotonic() - began
                time.sleep(0.05)
                why = self._death_reason(during) if not isinstance(e, ValueError) else f"protocol violation: {e}"
                self._kill(why)
                raise StudentCrash(why) from None
            self.exercise_used += time.monotonic() - began
            try:
                msg = self._decode(data)
            except Exception as e:  # noqa: BLE001
                self._kill(f"undecodable message ({e})")
                raise StudentCrash(f"the student's process sent something that is not plain data ({one_line(e)})") from None
            if type(msg) is not tuple or not msg or type(msg[0]) is not str:
                self._kill("malformed message")
                raise StudentCrash("the student's process broke the protocol")
            kind = msg[0]
            if kind in ("ok", "err") and len(msg) == 3:
                if msg[1] != req_id:
                    self._kill("reply to the wrong request")
                    raise StudentCrash("the student's process broke the protocol (reply to the wrong request)")
                if kind == "ok":
                    return msg[2]
                exc = _rebuild_exc(msg[2])
                if isinstance(exc, MemoryError):
                    # A process that ran out of memory may stay short of it: the next exercise gets a fresh one.
                    self._kill(f"it ran out of memory during {during}")
                    exc = MemoryError(f"out of memory during {during} (the limit is {self.memory >> 20} MiB "
                                      f"beyond the imports) {exc}".strip())
                raise exc
            if kind == "req" and len(msg) == 5:
                self._serve(msg)
                continue
            self._kill("malformed message")
            raise StudentCrash("the student's process broke the protocol")

    def _serve(self, msg) -> None:
        """The child asks something of one of our objects (a model, a spy, a ctx). Only public attributes: the
        private and dunder ones (`__globals__`, `__class__`, `_modules`...) are how one would walk from an
        object to the grader's modules and functions."""
        _, rid, op, target, args = msg
        try:
            if type(op) is not str or type(args) is not tuple or op not in _CHILD_MAY:
                raise TypeError("bad request")
            if op in ("getattr", "setattr", "delattr") and (type(args[0]) is not str or args[0].startswith("_")):
                raise AttributeError(f"the checks' objects do not expose private attributes ({args[0]!r}) "
                                     f"to the notebook's code")
            _refuse_module_change(op, target, args)
            if op == "byvalue":
                value = _ByValue(target)
            else:
                value = _apply(op, target, args)
            reply = ("ok", rid, value)
            try:
                payload = self._encode(reply)
            except Exception as e:  # noqa: BLE001
                payload = self._encode(("err", rid, _exc_info(e)))
        except BaseException as e:  # noqa: BLE001
            if isinstance(e, KeyboardInterrupt):
                raise
            payload = self._encode(("err", rid, _exc_info(e)))
        _send(self._w, payload)

    def _request_raw(self, op: str, target, args: tuple, during: str | None = None):
        if self.dead is not None:
            raise StudentCrash(self.dead)
        self._next_req += 1
        rid = self._next_req
        payload = self._encode(("req", rid, op, target, args))
        try:
            _send(self._w, payload)
        except OSError:
            why = self._death_reason(during or op)
            self._kill(why)
            raise StudentCrash(why) from None
        return self._wait_reply(rid, self.call_timeout, during or self._describe(op, target))

    def _describe(self, op: str, target) -> str:
        name = target._info.get("name") if isinstance(target, ChildProxy) else None
        if op in ("call", "callback", "metered", "observe"):
            return f"a call of `{name}`" if name else "a call into the notebook's code"
        return f"{op} on an object of the notebook's code"

    def _exercise_over(self) -> None:
        """Within a graded test whose time is up, every further call fails at once (no restart for it)."""
        if self.exercise_limit is not None and self.exercise_used >= self.exercise_limit:
            raise StudentTimeout(f"{self.exercise} ran out of time (its limit: {self.exercise_limit:g} s)")

    def request(self, op: str, target: "ChildProxy", args: tuple):
        self._exercise_over()
        if target._generation != self.generation:
            if target._name is not None and self.dead is not None:
                self.start()
                fresh = self.get(target._name)
                if isinstance(fresh, ChildProxy):
                    return self.request(op, fresh, args)
                return _apply(op, fresh, args)
            raise StudentCrash(f"this object belonged to the student's earlier process, which ended: {self.dead or ''}")
        if self.dead is not None and target._name is not None:
            self.start()
            return self.request(op, self.get(target._name), args)
        return self._request_raw(op, target, args)

    def call(self, target: "ChildProxy", args: tuple, kwargs: dict):
        result, copied = self.request("callback", target, (args, kwargs))
        _copy_back(args, kwargs, copied)
        return result

    def observe(self, target: "ChildProxy", args: tuple, kwargs: dict):
        from grader.checks import Observation
        from collections import Counter

        result, obs, copied = self.request("observe", target, (args, kwargs))
        _copy_back(args, kwargs, copied)
        o = Observation()
        o.ops = Counter({k: v for k, v in obs["ops"].items() if type(k) is str and type(v) is int})
        o.matmuls = [(tuple(a), tuple(b)) for a, b in obs["matmuls"]]
        o.flops, o.peak_bytes = int(obs["flops"]), int(obs["peak_bytes"])
        o.lib_calls = {c for c in obs["lib_calls"] if type(c) is str}
        o.reductions = [(str(n), tuple(int(x) for x in sh), int(e)) for n, sh, e in obs.get("reductions", ())]
        return result, o

    def get(self, name: str):
        """A name defined by the notebook's exercise cells: plain data, or a proxy."""
        self._exercise_over()
        self.start()
        value = self._request_raw("getname", None, (name,), during=f"looking up `{name}`")
        if isinstance(value, ChildProxy):
            object.__setattr__(value, "_name", name)
            value._info["name"] = name
            if value._info.get("autograd_function"):
                return _autograd_function(value)
        return value

    def reference_use(self, names: list[str]) -> dict[str, str]:
        """{exercise name: how it uses lib's own implementation} for the names that do."""
        if self.dead is not None:
            return {}
        try:
            found = self._request_raw("refs", None, (list(names),), during="the reference-use query")
        except IsolationError:
            return {}
        return {k: v for k, v in found.items() if type(k) is str and type(v) is str}

    # --- decoding the child's tagged values ----------------------------------------------------------------
    def decode_tagged(self, pid: tuple):
        import torch

        tag = pid[0]
        if tag == "R" and len(pid) == 3 and type(pid[1]) is int and type(pid[2]) is dict:
            info = {k: v for k, v in pid[2].items() if type(k) is str and type(v) in (str, bool, int, type(None))}
            return ChildProxy(self, pid[1], info)
        if tag == "P" and len(pid) == 2 and type(pid[1]) is int:
            if pid[1] not in self._exports:
                raise pickle.UnpicklingError("unknown trusted object")
            return self._exports[pid[1]]
        if tag == "T" and len(pid) == 8:
            return self._tensor(*pid[1:])
        if tag == "M" and len(pid) == 4:
            dt = getattr(torch, str(pid[1]).removeprefix("torch."), None)
            shape, stride = tuple(int(s) for s in pid[2]), tuple(int(s) for s in pid[3])
            if not isinstance(dt, torch.dtype) or len(shape) != len(stride) or any(s < 0 for s in shape):
                raise pickle.UnpicklingError("bad meta tensor")
            return torch.empty_strided(shape, stride, dtype=dt, device="meta")
        if tag == "D" and len(pid) == 3 and type(pid[1]) is str and type(pid[2]) is tuple and pid[2][:1] == ("T",):
            device = torch.device(pid[1])
            if device.type not in ("cuda", "mps", "xpu"):
                raise pickle.UnpicklingError("bad tensor device")
            return self.decode_tagged(pid[2]).to(device)
        if tag == "A" and len(pid) == 4:
            import numpy as np

            dtype, shape, data = np.dtype(str(pid[1])), tuple(int(s) for s in pid[2]), pid[3]
            if dtype.hasobject or type(data) is not bytes:
                raise pickle.UnpicklingError("numpy array of objects")
            return np.frombuffer(data, dtype=dtype).reshape(shape).copy()
        if tag == "V" and len(pid) == 2 and type(pid[1]) in (bool, int, float, str, bytes, type(None)):
            return pid[1]
        if tag == "complex" and len(pid) == 3 and type(pid[1]) is float and type(pid[2]) is float:
            return complex(pid[1], pid[2])
        if tag == "dtype" and len(pid) == 2 and type(pid[1]) is str:
            dt = getattr(torch, pid[1].removeprefix("torch."), None)
            if not isinstance(dt, torch.dtype):
                raise pickle.UnpicklingError("unknown dtype")
            return dt
        if tag == "device" and len(pid) == 2 and type(pid[1]) is str:
            return torch.device(pid[1])
        if tag == "size" and len(pid) == 2 and type(pid[1]) is tuple and all(type(s) is int for s in pid[1]):
            return torch.Size(pid[1])
        if tag == "odict" and len(pid) == 2 and type(pid[1]) is list:
            from collections import OrderedDict

            return OrderedDict((k, v) for k, v in pid[1])
        if tag == "slice" and len(pid) == 4:
            return slice(pid[1], pid[2], pid[3])
        if tag == "tuple" and len(pid) == 2 and type(pid[1]) is list:
            return tuple(pid[1])
        if tag == "list" and len(pid) == 2 and type(pid[1]) is list:
            return pid[1]
        if tag == "ellipsis":
            return Ellipsis
        if tag == "obs" and len(pid) == 2 and type(pid[1]) is dict:
            return pid[1]
        raise pickle.UnpicklingError(f"unknown tag {tag!r}")

    def _tensor(self, *fields):
        # The trusted side's copy of a child's tensor is the grader's bookkeeping, not the student's memory:
        # build it outside any active TorchDispatchMode (observe()'s memory meter and op recorder).
        from torch.utils._python_dispatch import _disable_current_modes

        with _disable_current_modes():
            return self._tensor_unobserved(*fields)

    def _tensor_unobserved(self, dtype_name, shape, stride, offset, key, nbytes, data):
        import torch

        dt = getattr(torch, str(dtype_name).removeprefix("torch."), None)
        if not isinstance(dt, torch.dtype) or type(data) is not bytes:
            raise pickle.UnpicklingError("bad tensor")
        shape, stride = tuple(int(s) for s in shape), tuple(int(s) for s in stride)
        numel = 1
        for s in shape:
            numel *= s
        item = torch.empty((), dtype=dt).element_size()
        if len(data) != numel * item or len(shape) != len(stride) or any(s < 0 for s in shape):
            raise pickle.UnpicklingError("tensor data does not match its shape")
        values = (torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dt) if data else
                  torch.empty(0, dtype=dt)).reshape(shape)
        if type(key) is int and type(nbytes) is int and 0 < nbytes <= MAX_MESSAGE and nbytes % item == 0 and numel:
            # The same child buffer maps to the same local buffer: views keep their data_ptr() between calls.
            base = self._storages.get((key, dt))
            if base is None or base.numel() * item != nbytes:
                base = torch.empty(nbytes // item, dtype=dt)
                self._storages[(key, dt)] = base
            try:
                view = base.as_strided(shape, stride, int(offset))
                view.copy_(values)
                return view
            except (RuntimeError, ValueError):
                pass
        return values


class _ByValue:
    """Reply to the child's `byvalue` request (copy.deepcopy of a proxy): the object itself, pickled."""

    def __init__(self, obj):
        self.obj = obj

    def __reduce__(self):
        import pickle as _p

        return (_p.loads, (_plain_pickle(self.obj),))


def _plain_pickle(obj) -> bytes:
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


_GENERATOR_STATE = "__torch_generator_state__"
_TENSOR_CHANGED = "__tensor_changed_in_place__"


def _is_generator(obj) -> bool:
    import torch

    return type(obj) is torch.Generator


class ArgumentChanged(IsolationError):
    """The student's function changed a tensor it was given (in place, through `.data`, or by resizing it)."""


def _describe_arg(key) -> str:
    return f"argument {key + 1}" if type(key) is int else f"argument `{key}`"


def _copy_back(args: tuple, kwargs: dict, copied) -> None:
    """The child's final state of list/dict arguments (out-parameters) and generators, written into the
    caller's objects. A tensor argument the call changed is not written back — the caller's tensor may be
    shared with the next submission a worker grades — the call fails with `ArgumentChanged` instead."""
    if type(copied) is not dict:
        return
    changed: list[str] = []
    for key, value in copied.items():
        target = args[key] if type(key) is int and 0 <= key < len(args) else kwargs.get(key) if type(key) is str else None
        if (type(value) is tuple and len(value) == 2 and value[0] == _GENERATOR_STATE and type(value[1]) is bytes
                and _is_generator(target)):
            import torch

            target.set_state(torch.frombuffer(bytearray(value[1]), dtype=torch.uint8).clone())
        elif type(value) is tuple and len(value) == 2 and value[0] == _TENSOR_CHANGED:
            changed.append(f"{_describe_arg(key)} ({value[1]})")
        elif type(target) is list and type(value) is list:
            target[:] = value
        elif type(target) is dict and type(value) is dict:
            target.clear()
            target.update(value)
    if changed:
        raise ArgumentChanged(
            "the function changed " + ", ".join(changed) + " in place: a graded function must leave the tensors "
            "it is given unchanged (the caller still needs them) — work on a copy or write into a new tensor")


def one_line(e: BaseException, limit: int = 300) -> str:
    text = " ".join(f"{type(e).__name__}: {e}".split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


# =========================================================================================================
# The child
# =========================================================================================================

_CHILD_BOOT = r"""
import os, sys
rfd, wfd, workdir, memory, cpu, repo = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
sys.path.insert(0, repo)
from grader import _sandbox
sandbox = _sandbox.confine(workdir, cpu)
from grader import isolation
isolation._child_main(rfd, wfd, memory, sandbox)
"""

_CHILD = None


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
        self.sandbox = sandbox
        self.lib_seen: dict[str | None, set[str]] = {}  # exercise name -> lib functions that ran on its behalf
        self.lib_codes: dict = {}  # code object -> "lib.module.qualname", or None when not lib's
        self.roots: dict[int, str] = {}  # id of an exported object -> the exercise name it came from
        self.current_root: str | None = None
        self._next_req = 0

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
        buf = io.BytesIO()
        _ChildPickler(buf, self).dump(msg)
        return buf.getvalue()

    # messaging -------------------------------------------------------------------------------------------
    def send(self, msg):
        try:
            payload = self.encode(msg)
        except Exception as e:  # noqa: BLE001
            if msg[0] == "ok":
                payload = self.encode(("err", msg[1], (["TypeError", "Exception"],
                                                        f"the result cannot be sent to the checks: {e}")))
            else:
                raise
        _send(self.w, payload)

    def request(self, op, target, args):
        self._next_req += 1
        rid = -self._next_req
        self.send(("req", rid, op, target, args))
        return self.loop(rid)

    def loop(self, waiting_for=None):
        while True:
            try:
                data = _recv(self.r, None)
            except EOFError:
                os._exit(0)
            msg = _ChildUnpickler(io.BytesIO(data)).load()
            kind = msg[0]
            if kind in ("ok", "err"):
                if msg[1] != waiting_for:
                    os._exit(3)
                if kind == "ok":
                    return msg[2]
                raise _rebuild_exc(msg[2])
            _, rid, op, target, args = msg
            previous = self.current_root
            self.current_root = args[0] if op == "getname" else self.roots.get(id(target), previous)
            try:
                reply = ("ok", rid, self.handle(op, target, args))
            except BaseException as e:  # noqa: BLE001  (student code may raise anything, SystemExit included)
                reply = ("err", rid, _exc_info(e))
            try:
                self.send(reply)
            finally:
                self.current_root = previous

    # operations ------------------------------------------------------------------------------------------
    def handle(self, op, target, args):
        if op == "load":
            return self.load(*args)
        if op == "getname":
            return getattr(self.module, args[0])
        if op == "refs":
            return self.references(args[0])
        if op == "callback":
            call_args, kwargs = args
            before = self._snapshot(call_args, kwargs)
            with self.watch():
                result = target(*call_args, **kwargs)
            return (result, self._copied(call_args, kwargs, before))
        if op == "map":
            calls = args[0]
            with self.watch():
                return [target(*a, **k) for a, k in calls]
        if op == "metered":
            from lib.io_model import TensorMemoryMeter

            call_args, kwargs = args
            before = self._snapshot(call_args, kwargs)
            with self.watch(profile=False), TensorMemoryMeter() as meter:
                result = target(*call_args, **kwargs)
            return (result, int(meter.peak), self._copied(call_args, kwargs, before))
        if op == "observe":
            from grader.checks import observe

            call_args, kwargs = args
            before = self._snapshot(call_args, kwargs)
            with self.watch(profile=False):
                result, obs = observe(target, *call_args, **kwargs)
            self.lib_seen.setdefault(self.current_root, set()).update(obs.lib_calls)
            return (result, ({"ops": dict(obs.ops), "matmuls": [tuple(map(tuple, m)) for m in obs.matmuls],
                                     "flops": int(obs.flops), "peak_bytes": int(obs.peak_bytes),
                                     "lib_calls": sorted(obs.lib_calls),
                                     "reductions": [(str(n), tuple(map(int, sh)), int(e)) for n, sh, e in obs.reductions]}),
                    self._copied(call_args, kwargs, before))
        with self.watch():
            return _apply(op, target, args)

    @staticmethod
    def _snapshot(args, kwargs) -> dict:
        """A copy of every tensor argument with data, taken before the call (see `_copied`)."""
        import torch

        def copy(v):
            if isinstance(v, torch.Tensor) and v.device.type != "meta" and v.layout == torch.strided:
                with torch.no_grad():
                    return v.detach().clone()
            return None
        out = {i: copy(a) for i, a in enumerate(args)}
        out.update({k: copy(v) for k, v in kwargs.items()})
        return {k: v for k, v in out.items() if v is not None}

    @staticmethod
    def _copied(args, kwargs, before: dict | None = None):
        """What the caller's arguments became: list/dict arguments and generators always; for a tensor argument
        whose shape, dtype or any bit the call changed (compared with `before`), a description of the change."""
        import torch

        def state(v):
            if type(v) is torch.Generator:
                return (_GENERATOR_STATE, bytes(v.get_state().numpy().tobytes()))
            return v

        def changed(old, new) -> bool:
            if not isinstance(new, torch.Tensor) or old.shape != new.shape or old.dtype != new.dtype:
                return True
            with torch.no_grad():
                new = new.detach().contiguous().reshape(-1)
                old = old.reshape(-1)
                if old.dtype == torch.bool:
                    return not torch.equal(old, new)
                return not torch.equal(old.view(torch.uint8), new.view(torch.uint8))
        out = {i: state(a) for i, a in enumerate(args) if type(a) in (list, dict, torch.Generator)}
        out.update({k: state(v) for k, v in kwargs.items() if type(v) in (list, dict, torch.Generator)})
        for key, old in (before or {}).items():
            new = args[key] if type(key) is int else kwargs[key]
            if changed(old, new):
                def kind(t):
                    return f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}"
                what = f"a {kind(old)} tensor"
                if not isinstance(new, torch.Tensor):
                    what += f", now a {type(new).__name__}"
                elif kind(new) != kind(old):
                    what += f", now {kind(new)}"
                out[key] = (_TENSOR_CHANGED, what)
        return out

    def watch(self, profile=True):
        child = self

        class _Watch:
            def __enter__(self):
                self.prev = sys.getprofile()
                if profile:
                    seen = child.lib_seen.setdefault(child.current_root, set())
                    codes = child.lib_codes

                    def prof(frame, event, arg):
                        if event == "call":
                            code = frame.f_code
                            try:
                                name = codes[code]
                            except KeyError:  # lib's by file, or lib's bytecode loaded from anywhere else
                                name = codes[code] = lib_name(code)
                            if name is not None:
                                seen.add(name)
                    sys.setprofile(prof)

            def __exit__(self, *exc):
                sys.setprofile(self.prev)

        return _Watch()

    def load(self, notebook, cells):
        from grader.harness import ExerciseModule, _run_cells

        self.module = ExerciseModule(Path(notebook).stem)
        self.module.__file__ = notebook
        self.module._stubbed_cells = []
        self.module._broken_cells = {}
        _run_cells(self.module, Path(notebook), cells)
        self._apply_memory_limit()
        return {"stubbed": list(self.module._stubbed_cells), "broken": dict(self.module._broken_cells)}

    def _apply_memory_limit(self):
        import resource

        if self.memory <= 0:
            return
        try:
            with open("/proc/self/status") as f:
                vm = next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith("VmSize:"))
            limit = vm + self.memory
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        except (OSError, ValueError, StopIteration):
            pass

    def references(self, names):
        """How each exercise uses lib's own implementation, if it does: it *is* lib's, or lib's ran while it did."""
        found = {}
        for name in names:
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


class _ChildUnpickler(pickle.Unpickler):
    """In the child: the trusted side's messages (trusted, so a normal unpickler) with its references resolved."""

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

            gen = torch.Generator(device=pid[1])
            gen.set_state(torch.frombuffer(bytearray(pid[2]), dtype=torch.uint8).clone())
            return gen
        raise pickle.UnpicklingError(f"unknown tag {tag!r}")


def _child_main(rfd, wfd, memory, sandbox):
    global _CHILD
    import torch  # noqa: F401  (imported before the student's code, and before the memory limit)

    import lib  # noqa: F401
    from grader import harness  # noqa: F401

    from grader.fingerprint import warm

    warm()  # lib's fingerprints, taken before the student's code can touch lib's modules
    _CHILD = _Child(rfd, wfd, memory, sandbox)
    _CHILD.send(("ok", None, sandbox))
    _CHILD.loop()
