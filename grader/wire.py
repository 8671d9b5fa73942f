"""The wire between the grader and the student's process: what a message is, and how each side reads it.

What it guards: **nothing the child sends can run code in the trusted process, or lie about what it is.**
The child's messages are decoded by `SafeUnpickler` — the pure-Python unpickler with an opcode table that
can build only built-in containers and scalars (no globals, no calls, no `__setstate__`) — and every other
value arrives as a tag (`decode_tagged`) that is checked field by field: a tensor as raw bytes with dtype,
shape and strides, a numpy array as bytes, an object that stays in the child as a reference (`R`). An `int`
subclass whose `__eq__` always says True arrives as a plain `int`.

Also here, because both sides must agree on them: the framing (`send_message`/`recv_message`: 8-byte length, then the
pickle; the trusted side reads at most `MAX_FROM_CHILD`, refusing a bigger message before its body is read), the
limits on what one message of the child's makes the trusted side hold (`STORAGE_BUDGET` of twins, `MAX_REFERENCES`
proxies, `MAX_TEXT` of an exception's message; `grader.bounds` holds the rest), the operations a proxy forwards
(`apply_operation`), how an exception crosses (class names of its MRO and its message, rebuilt as the nearest
built-in class), the trusted side's pickler
(`TrustedPickler`: plain data by value, anything with identity or behaviour by reference), and what a call
copies back into its caller's arguments (`copy_back`: lists, dicts and generators; a changed tensor is a
verdict, `ArgumentChanged`). The child's own pickler and unpickler are in `grader.child_wire`.

A `torch.Generator` never crosses as it is: its state holds its seed (`initial_seed()`, and the first word of the
Mersenne Twister's state), and the checks' seeds come from the run's seed, so the child could recompute every
randomized input. The child gets a generator seeded one-way from it and the run's seed (`handed_generator_seed`),
and the caller's generator is then reseeded one-way from the child's final state (`copy_back`).
"""
from __future__ import annotations

import builtins
import dataclasses
import enum
import operator
import os
import pickle
import select
import struct
import time
import types

from grader.notebook import ExerciseMissing, NotImplementedYet

MAX_MESSAGE = 1 << 30  # what the child reads from the trusted side in one message (its memory: its own limit applies)
# What the trusted side reads from the child — a bigger message is refused before its body is read — and holds for
# it (`grader.bounds` has the rest, and where the numbers come from: 5x the solutions' largest or more).
MAX_FROM_CHILD = 64 << 20  # one message (the solutions' largest: 12.6 MB, week 16's SmolLM2 logits)
STORAGE_BUDGET = 256 << 20  # local twins of the child's buffers, per child (the solutions': 14.3 MB at most)
MAX_REFERENCES = 100_000  # references to the child's objects in one message (the solutions': 8,003 in a session)
MAX_TEXT = 20_000  # characters of an exception's message from the child (its class names: 20 of 100)


class IsolationError(AssertionError):
    """The student's process did not answer: it timed out, died, or broke the protocol."""


class StudentTimeout(IsolationError):
    pass


class StudentCrash(IsolationError):
    pass


class ResourceRefused(IsolationError):
    """The notebook's code asked the trusted process for more than it gives (`grader.bounds`): the call fails."""


class StudentMemoryError(MemoryError):
    """The student's process ran out of its own memory (not the trusted process: `grader.bounds.is_memory_error`)."""


# --- framing ----------------------------------------------------------------------------------------------

# What the framing runs on, bound when this module is imported — in the student's process, before the notebook's
# code runs: a notebook that replaces `os.write` (to drop the child's verdicts, or rewrite its replies) or `os.read`
# by plain names changes nothing here (and `grader.child_guard._Guard` makes such a replacement a verdict).
_write, _read, _select, _pack, _unpack, _monotonic = os.write, os.read, select.select, struct.pack, struct.unpack, time.monotonic


def send_message(fd: int, payload: bytes) -> None:
    data = _pack(">Q", len(payload)) + payload
    view = memoryview(data)
    while view:
        n = _write(fd, view)
        view = view[n:]


def _recv_exact(fd: int, n: int, deadline: float | None) -> bytes:
    chunks, got = [], 0
    while got < n:
        if deadline is not None:
            left = deadline - _monotonic()
            if left <= 0:
                raise TimeoutError
            ready, _, _ = _select([fd], [], [], left)
            if not ready:
                raise TimeoutError
        chunk = _read(fd, min(n - got, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def recv_message(fd: int, timeout: float | None, limit: int = MAX_MESSAGE) -> bytes:
    deadline = None if timeout is None else _monotonic() + timeout
    (n,) = _unpack(">Q", _recv_exact(fd, 8, deadline))
    if n > limit:
        raise ValueError(f"a message of {n} bytes, more than the {limit >> 20} MiB one message may hold")
    # Once a message has started, its body gets a fresh allowance (big tensors take a while on a busy machine).
    return _recv_exact(fd, n, None if timeout is None else _monotonic() + max(timeout, 30.0))


# --- operations, the same on both sides -------------------------------------------------------------------

def apply_operation(op: str, obj, args: tuple):
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


def exception_info(e: BaseException) -> tuple[list[str], str]:
    names = [c.__name__ for c in type(e).__mro__]
    try:
        msg = str(e)
    except Exception:  # noqa: BLE001
        msg = "<unprintable>"
    return names[:20], msg[:20000]


def exception_for_child(e: BaseException) -> tuple[list[str], str]:
    """`exception_info` of an exception the trusted side sends the child (a check's object failed when the child
    called it), with the run's seed taken out: failure messages print it (`checks.seed_note`), and the child must
    not learn it (`grader.seeds`)."""
    from grader.seeds import drawn_seed

    names, msg = exception_info(e)
    seed = drawn_seed()
    return names, msg if seed is None else msg.replace(str(seed), "<the run's seed>")


_SAFE_EXC = {name: obj for name, obj in vars(builtins).items()
             if isinstance(obj, type) and issubclass(obj, Exception)}
_SAFE_EXC["StopIteration"] = StopIteration


def rebuild_exception(info) -> BaseException:
    """An exception from (MRO names, message), using only built-in classes (and grader.notebook's two); its
    `from_child` is True (`grader.bounds`: a MemoryError of the other process is not a refusal of this one's)."""
    exc = _rebuild(info)
    exc.from_child = True
    return exc


def _rebuild(info) -> BaseException:
    names, msg = info
    if not (isinstance(names, list) and all(type(n) is str for n in names) and type(msg) is str):
        return IsolationError("malformed exception from the student's process")
    names, msg = [n[:100] for n in names[:20]], msg[:MAX_TEXT]  # the sender cuts them too, but it is the child
    known = dict(_SAFE_EXC, NotImplementedYet=NotImplementedYet, ExerciseMissing=ExerciseMissing,
                 StudentTimeout=StudentTimeout, StudentCrash=StudentCrash, IsolationError=IsolationError,
                 ResourceRefused=ResourceRefused)
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


# --- the trusted side's encoder ------------------------------------------------------------------------------

class Remote:
    """Base of an object that lives in the child (`grader.proxy.ChildProxy`): `TrustedPickler` sends it as a
    reference to the child's own object, never by value."""

    __slots__ = ()


_BY_VALUE_MODULES = ("torch", "lib", "math", "builtins", "numpy", "operator", "functools", "grader", "collections",
                     "typing", "dataclasses", "itertools")


def _module_root(obj) -> str:
    return (getattr(obj, "__module__", None) or "").split(".")[0]


class TrustedPickler(pickle.Pickler):
    """Pickles arguments for the child: plain data by value, objects with identity or behaviour by reference."""

    def __init__(self, file, session):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.session = session

    def persistent_id(self, obj):
        import torch

        t = type(obj)
        if t in (type(None), bool, int, float, complex, str, bytes, bytearray, list, tuple, dict, set, frozenset,
                 slice, range, type(Ellipsis), type(NotImplemented)):
            return None
        if t is ByValue or t is pickle.PickleBuffer:  # numpy's array data under protocol 5, in-band
            return None
        if isinstance(obj, Remote):
            if obj._session is not self.session or obj._generation != self.session.generation:
                raise IsolationError("an object of the student's earlier process was used after a restart")
            return ("C", obj._oid)
        if isinstance(obj, torch.Tensor):
            if t is torch.Tensor and not obj.requires_grad:
                return None  # torch's own pickling (its storage below is copied too)
            return ("t", obj.detach())  # a Parameter, a subclass, or part of an autograd graph: its data only
        if isinstance(obj, (torch.UntypedStorage, torch.storage.TypedStorage)):
            return None
        if t is torch.Generator:  # another generator, in a state drawn one-way from this one's (see copy_back)
            return ("G", str(obj.device), handed_generator_seed(obj))
        if isinstance(obj, (torch.dtype, torch.device, torch.Size, torch.memory_format, torch.layout)):
            return None
        if isinstance(obj, torch.nn.Module):
            return ("P",) + self.session.export(obj)
        if isinstance(obj, types.ModuleType):
            raise TypeError("a module is never handed to the notebook's code")
        if isinstance(obj, (types.FunctionType, type, types.BuiltinFunctionType)):
            qual = getattr(obj, "__qualname__", "")
            if _module_root(obj) in ("lib", "grader") and not self._in_view(obj):
                return ("P",) + self.session.export(obj)  # a stub in the child's view (grader.view): called back here
            if _module_root(obj) in _BY_VALUE_MODULES and "<" not in qual:
                return None  # pickled by name, imported in the child
            if isinstance(obj, types.BuiltinFunctionType):
                raise TypeError(f"{qual} is never handed to the notebook's code")
            return ("P",) + self.session.export(obj)
        if t.__module__.split(".")[0] == "numpy" or isinstance(obj, enum.Enum):  # arrays, dtypes (numpy.dtypes.*), scalars
            return None
        if isinstance(obj, dict) and _module_root(t) == "collections":
            return None
        if dataclasses.is_dataclass(obj) and _module_root(t) in _BY_VALUE_MODULES and self._in_view(t):
            return None  # configs: copied
        return ("P",) + self.session.export(obj)


    def _in_view(self, obj) -> bool:
        """Whether the child's view holds `obj` (a function or class of lib, or of the grader) by name."""
        module = getattr(obj, "__module__", "") or ""
        if module.startswith("grader."):
            return module in ("grader.observe", "grader.wire", "grader.notebook", "grader.status")
        if not module.startswith("lib"):
            return True
        view = getattr(self.session, "view", None)
        if view is None:
            return True
        from grader.view import kept

        return kept(view, module, getattr(obj, "__qualname__", ""))


class ByValue:
    """Reply to the child's `byvalue` request (copy.deepcopy of a proxy): the object itself, pickled."""

    def __init__(self, obj):
        self.obj = obj

    def __reduce__(self):
        import pickle as _p

        return (_p.loads, (_plain_pickle(self.obj),))


def _plain_pickle(obj) -> bytes:
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


# --- the trusted side's decoder ------------------------------------------------------------------------------

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


class SafeUnpickler(pickle._Unpickler):
    """Decodes the child's messages with the pure-Python unpickler and an opcode table that can build only
    built-in containers and scalars: no globals, no calls (REDUCE/NEWOBJ), no __setstate__ (BUILD), and
    list/dict/set updates only on real lists, dicts and sets. Everything else arrives as tagged data."""

    dispatch = _safe_dispatch()

    def __init__(self, file, session):
        super().__init__(file)
        self.session = session
        self.references = 0  # proxies made for this message (MAX_REFERENCES)

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"the student's process sent a global ({module}.{name}): refused")

    def persistent_load(self, pid):
        if type(pid) is not tuple or not pid or type(pid[0]) is not str:
            raise pickle.UnpicklingError("bad reference")
        if pid[0] == "R":
            self.references += 1
            if self.references > MAX_REFERENCES:
                raise pickle.UnpicklingError(f"a message with more than {MAX_REFERENCES} references to the "
                                             f"notebook's objects")
        return decode_tagged(self.session, pid)


def decode_tagged(session, pid: tuple):
    """A value the child sent as a tag (see `SafeUnpickler`), checked field by field."""
    import torch

    tag = pid[0]
    if tag == "R" and len(pid) == 3 and type(pid[1]) is int and type(pid[2]) is dict:
        info = {k[:40]: v[:200] if type(v) is str else v for k, v in list(pid[2].items())[:20]
                if type(k) is str and type(v) in (str, bool, int, type(None))}
        return session.proxy(pid[1], info)
    if tag == "P" and len(pid) == 2 and type(pid[1]) is int:
        if pid[1] not in session._exports:
            raise pickle.UnpicklingError("unknown trusted object")
        return session._exports[pid[1]]
    if tag == "T" and len(pid) == 8:
        return _tensor(session._storages, *pid[1:])
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
        return decode_tagged(session, pid[2]).to(device)
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

def _tensor(storages: dict, *fields):
    # The trusted side's copy of a child's tensor is the grader's bookkeeping, not the student's memory:
    # build it outside any active TorchDispatchMode (observe()'s memory meter and op recorder).
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():
        return _tensor_unobserved(storages, *fields)

def _tensor_unobserved(storages: dict, dtype_name, shape, stride, offset, key, nbytes, data):
    import torch

    dt = getattr(torch, str(dtype_name).removeprefix("torch."), None)
    if not isinstance(dt, torch.dtype) or type(data) is not bytes:
        raise pickle.UnpicklingError("bad tensor")
    shape, stride = tuple(int(s) for s in shape), tuple(int(s) for s in stride)
    numel = 1
    for s in shape:
        numel *= s
    # device="cpu" on every tensor made here: the decoder may run while a check has set torch's default device
    # (grader.checks.call_on_default_device), and what arrives is CPU data whatever that default is
    item = torch.empty((), dtype=dt, device="cpu").element_size()
    if len(data) != numel * item or len(shape) != len(stride) or any(s < 0 for s in shape):
        raise pickle.UnpicklingError("tensor data does not match its shape")
    values = (torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dt) if data else
              torch.empty(0, dtype=dt, device="cpu")).reshape(shape)
    held = storages.get("bytes", 0)
    if type(key) is int and type(nbytes) is int and 0 < nbytes <= STORAGE_BUDGET and nbytes % item == 0 and numel:
        # The same child buffer maps to the same local buffer: views keep their data_ptr() between calls. The
        # buffer's size is the child's word: the buffers kept for one child stay under STORAGE_BUDGET bytes.
        base = storages.get((key, dt))
        if base is None or base.numel() * item != nbytes:
            if held + nbytes > STORAGE_BUDGET:
                return values
            base = torch.empty(nbytes // item, dtype=dt, device="cpu")
            storages[(key, dt)] = base
            storages["bytes"] = held + nbytes
        try:
            view = base.as_strided(shape, stride, int(offset))
            view.copy_(values)
            return view
        except (RuntimeError, ValueError):
            pass
    return values


# --- what a call copies back into its caller's arguments -----------------------------------------------------

GENERATOR_STATE = "__torch_generator_state__"
TENSOR_CHANGED = "__tensor_changed_in_place__"


def _permuted32(x: int) -> int:
    """A permutation of the 32-bit integers drawn from the run's seed (four Feistel rounds on 16-bit halves, each
    round a keyed hash of it): distinct seeds stay distinct, and nothing about `x` can be read from the result."""
    from grader.seeds import derived_seed

    left, right = x >> 16, x & 0xFFFF
    for i in range(4):
        left, right = right, left ^ (derived_seed("handed generator: round", i, right) & 0xFFFF)
    return (left << 16) | right


def handed_generator_seed(gen) -> int:
    """The seed of the generator the child gets for the trusted side's `gen` (one of its device): drawn from `gen`'s
    state and the run's seed one-way (`grader.seeds.derived_seed`), so that neither the child's `initial_seed()`
    nor its state tells it the run's seed, or the seed of any other generator. Equal states give equal seeds (a
    check comparing two runs from equal states still can). A CPU generator's Mersenne Twister keeps only its seed's
    low 32 bits; a freshly seeded generator's are permuted (`_permuted32`), so generators whose seeds' low 32 bits
    differ — a law test's thousands of trials, seeds s + t — never share a stream."""
    import hashlib

    import torch

    from grader.seeds import derived_seed

    state, seed = gen.get_state(), gen.initial_seed()
    if torch.equal(torch.Generator(device=gen.device).manual_seed(seed).get_state(), state):
        return (derived_seed("handed generator: high", str(gen.device), seed) >> 32 << 32) | _permuted32(seed & 0xFFFFFFFF)
    return derived_seed("handed generator: advanced", str(gen.device), hashlib.sha256(state.numpy().tobytes()).hexdigest())


def _reseed_returned(target, raw: bytes) -> None:
    """After a call, the caller's generator `target` is seeded one-way from the state the child's generator ended in
    (and the run's seed): its next draws — a check's next inputs — are neither the child's to choose nor to
    foresee, and equal final states still give equal generators."""
    import hashlib

    from grader.seeds import derived_seed

    target.manual_seed(derived_seed("returned generator", str(target.device), hashlib.sha256(raw).hexdigest()))


def _is_generator(obj) -> bool:
    import torch

    return type(obj) is torch.Generator


class ArgumentChanged(IsolationError):
    """The student's function changed a tensor it was given (in place, through `.data`, or by resizing it)."""


def _describe_arg(key) -> str:
    return f"argument {key + 1}" if type(key) is int else f"argument `{key}`"


def copy_back(args: tuple, kwargs: dict, copied) -> None:
    """The child's final state of list/dict arguments (out-parameters) and generators, written into the
    caller's objects. A tensor argument the call changed is not written back — the caller's tensor may be
    shared with the next submission a worker grades — the call fails with `ArgumentChanged` instead."""
    if type(copied) is not dict:
        return
    changed: list[str] = []
    for key, value in copied.items():
        target = args[key] if type(key) is int and 0 <= key < len(args) else kwargs.get(key) if type(key) is str else None
        if (type(value) is tuple and len(value) == 2 and value[0] == GENERATOR_STATE and type(value[1]) is bytes
                and _is_generator(target)):
            _reseed_returned(target, value[1])
        elif type(value) is tuple and len(value) == 2 and value[0] == TENSOR_CHANGED:
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
