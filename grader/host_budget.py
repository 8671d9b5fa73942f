"""In the student's process: how much of the tensors' data a call of a torch-only exercise takes out of torch.

The checks judge a kernel by the torch operations it runs (`grader.observers`: FLOPs, extents, reads, the blocks it
visits, the memory it holds). What numpy or Python arithmetic computes is out of their sight: a decoy of tiled torch
products beside the real answer computed in numpy (a whole row of scores, a two-pass softmax) would pass every one of
them. So for the exercises the course map marks `torch_only` (`grader.course_map`), the data may not leave torch
during a call: every number that crosses to Python or numpy is counted, and a call that moves more than
`HOST_LIMIT` of them, or reaches a tensor's memory itself (its storage, its address, DLPack), is a verdict.

What is counted, in every call of such an exercise (observed or not: the count runs the same way in all of them):
- `Tensor.numpy()` and `Tensor.tolist()` (numpy's `np.asarray(t)` and `print(t)` go through them): the tensor's
  elements, seen by the profiler as the `c_call` of torch's C function from a keeper's frame (below), however the
  wrapper or the keeper was reached;
- a scalar taken from a tensor (`item()`, `float(t)`, `int(t)`, `bool(t)`, an `if` on a tensor, `torch.equal`,
  `torch.allclose`): one each, seen by the dispatch mode (`Observers.host`), and `item()` called by torch's own
  Python code with the modes switched off (printing a tensor) by the profiler.
- denied outright: `untyped_storage()` / `_typed_storage()` (pickling or saving a tensor reads them), `data_ptr()` /
  `const_data_ptr()` called by the notebook's code, `torch._C._storage_address`, `torch._C._to_dlpack`
  (`__dlpack__`, `np.from_dlpack`), and `apply_` / `map_` / `map2_` (Python run on each element, from C); taking a
  wrapper off torch.Tensor is a verdict too.
- memory torch shares with numpy or Python: what the notebook's code (at any time, cells included) made with
  `from_numpy`, `frombuffer`, `from_file`, `asarray`, `as_tensor`, or whose `numpy()` or DLPack it took (`EXPORTED`),
  and every storage the notebook's code holds as a storage object, made (`torch.UntypedStorage(n)`, a TypedStorage, a
  subclass of torch's storage base) or taken (`untyped_storage()`, `storage()`) at any time (`HANDLED`: a storage
  object reads and writes its bytes from Python, `s[i]`, `s.tolist()`, `torch.save(s)`; red team 11's #10): each
  region of it an op of the call reads or writes counts its elements (`HostBudget.op`); and an op that writes
  into an integer argument's memory ends its being free (below). (The storage methods that map files or shared
  memory or move raw bytes raise in that process: `grader.raw_memory.close_storage_doors`.)
Each of those C functions is replaced wherever torch keeps it — torch._C.TensorBase's own dict and the legacy
tensor types' (`torch.FloatTensor`...) copies of it, changed through the dicts themselves since the types are
immutable — by one Python wrapper (`install`), which hands the call to a keeper: a running generator whose frame is
the only holder of the C functions (`_keeper`). The C function is then called by Python code, in the keeper's frame,
so even `map(torch._C.TensorBase.numpy, ts)` or a keeper's `send` called from C is a `c_call` the profiler sees.
Reaching the C functions themselves means reading a frame (`gi_frame`, a traceback's `tb_frame`) or the garbage
collector's lists, each a verdict of `grader.child_guard`.
Memory read by address without torch is denied, not counted: numpy reads no `__array_interface__` in the student's
process (`grader.raw_memory`), `/proc/self/mem` cannot be opened there (`grader._sandbox`), ctypes' reads are a verdict.
The grader's own code (its observers, its wire) converts tensors too: calls made from its files are not counted. Nor
is reading the memory of the call's integer and boolean arguments (week 19's block tables and lengths: metadata).

`HOST_LIMIT` is above what honest kernels take out (a length; a printed running max per chunk, 33 chunks in
online_softmax's technique case) and below the row of scores of the smallest technique case (flash_decode's: 2 heads
over 241-247 keys, at least 482 numbers).
"""
from __future__ import annotations

import sys
from pathlib import Path

from grader.course_map import COURSE

HOST_LIMIT = 128  # numbers a call may take out of torch
TORCH_ONLY = frozenset(e.name for w in COURSE for e in w.exercises if e.torch_only)
_COUNTED = frozenset(("numpy", "tolist", "item"))  # a tensor's methods: its elements leave torch
# ... and the ways to its memory itself, or to Python code run on each element in C (apply_, map_, map2_)
_DENIED = frozenset(("untyped_storage", "_typed_storage", "data_ptr", "const_data_ptr", "_storage_address", "_to_dlpack",
                     "_to_dlpack_versioned", "apply_", "map_", "map2_"))
_WRAPPED = ("numpy", "tolist", "item", "untyped_storage", "data_ptr", "const_data_ptr", "apply_", "map_", "map2_")
WATCHED_NAMES = _COUNTED | _DENIED  # what the profiler hands to `HostBudget.c_call` (by the C function's name)
_GRADER = (str(Path(__file__).resolve().parent) + "/",
           str(Path(__file__).resolve().parent.parent / "lib" / "attn" / "io_model.py"))


def moved_message(root: str, moved: int, how: str) -> str:
    return (f"took {moved} numbers out of torch in one call ({how}): {root} is a kernel written in torch "
            f"operations, which is what the checks observe; numpy and Python arithmetic are out of their sight, so a "
            f"result computed there cannot be judged. Compute with torch ops on the tensors (a length or a printed "
            f"value is fine: at most {HOST_LIMIT} numbers a call may leave torch)")


def denied_message(root: str, how: str) -> str:
    return (f"reached a tensor's memory itself, or ran Python on each element ({how}) in a call of {root}: a kernel of "
            f"this exercise computes with torch ops, which the checks observe; data read through a storage, an "
            f"address, DLPack or apply_/map_ is out of their sight. Compute with torch ops on the tensors")


def _keeper(originals: dict):
    """A generator whose frame is the only holder of the C functions the wrappers replace: sent (name, args,
    kwargs), it answers (True, result) or (False, the exception, without its traceback). The C function's call from
    this frame is what `HostBudget.c_call` counts, whoever sent the request (a wrapper, or code that found `send`)."""
    out = None
    while True:
        try:
            name, args, kwargs = yield out
        except Exception:  # noqa: BLE001  (thrown in by other code, or not a request: answered, the keeper goes on)
            out = (False, RuntimeError("the grader's conversions were interrupted"))
            continue
        try:
            out = (True, originals[name](*args, **kwargs))
        except BaseException as e:  # noqa: BLE001  (a timeout's KeyboardInterrupt too: raised again by the wrapper)
            out = (False, e.with_traceback(None))
        name = args = kwargs = None


KEEPER_CODE = _keeper.__code__
_KEEPERS = 8  # a generator answers one call at a time: nested calls (a __torch_function__ mode's) and threads take another


def _wrapper(name: str, sends):
    """`<name>` as Python code: however it is called (`map(torch.Tensor.numpy, ts)`, `operator.methodcaller("tolist")`
    call a C function from C, which leaves no `c_call` event), the C function is then called from the keeper's frame."""
    def counted_method(self, *args, **kwargs):
        request = (name, (self, *args), kwargs)
        for send in sends:
            try:
                ok, out = send(request)
            except (ValueError, StopIteration):  # answering another call (nested, or another thread's), or closed
                continue
            if ok:
                if name in _SHARING and _STUDENT and _asked_by_notebook(sys._getframe(1)):
                    _exported(self if name in _SHARED_BY_SELF else out, out)
                elif name == "untyped_storage" and _STUDENT and _through_torch(sys._getframe(1)):
                    handled(out)
                return out
            raise out
        raise RuntimeError(f"{name}: the grader's keepers of torch's conversions are all busy or closed (closed by the "
                           f"notebook's code?)")
    counted_method.__name__ = counted_method.__qualname__ = name
    return counted_method


def _asked_by_notebook(frame, depth: int = 4) -> bool:
    """Whether the notebook's code asked, directly or through a few frames of torch's or numpy's (`np.asarray(t)`
    calls torch's `__array__`, which calls numpy())."""
    for _ in range(depth):
        if frame is None:
            return False
        if _STUDENT[0](frame):
            return True
        frame = frame.f_back
    return False


def _through_torch(frame) -> bool:
    """Whether the notebook's code asked, itself or through torch's own Python code (`t.storage()`, a TypedStorage),
    a copy of a tensor aside (`copy.deepcopy` takes storages to copy them, handing none out)."""
    while frame is not None and frame.f_code.co_filename.startswith(_TORCH_DIR):
        if frame.f_code.co_name == "__deepcopy__":
            return False
        frame = frame.f_back
    return frame is not None and _STUDENT[0](frame)


def handled(storage) -> None:
    """`storage` is held by the notebook's code as a storage object: its memory is seen from Python (`HANDLED`, by
    the storage's identity in torch, which a resize keeps) while that object lives."""
    import weakref

    try:
        key = storage._cdata
        weakref.finalize(storage, _release, HANDLED, key)
    except (AttributeError, TypeError):
        return
    HANDLED[key] = HANDLED.get(key, 0) + 1


def _storage_new(original):
    """torch's storage base's `__new__` as Python code: a storage the notebook's code makes is `handled`."""
    def __new__(cls, *args, **kwargs):
        storage = original(cls, *args, **kwargs)
        if _STUDENT and _through_torch(sys._getframe(1)):
            handled(storage)
        return storage
    return staticmethod(__new__)


def _storage_from_buffer(original):
    """The storage base's `from_buffer` (a C static method, which makes its storage without `__new__`: red team
    12b's #1, #2) as Python code: a storage the notebook's code makes with it is `handled` too."""
    def from_buffer(*args, **kwargs):
        storage = original(*args, **kwargs)
        if _STUDENT and _through_torch(sys._getframe(1)):
            handled(storage)
        return storage
    return staticmethod(from_buffer)


def _exported(tensor, holder) -> None:
    """`tensor`'s memory is seen by numpy or Python too, while `holder` (the array numpy() made, or the tensor over
    foreign memory) lives: noted in `EXPORTED`, by its storage's address."""
    import weakref

    try:
        ptr = tensor.untyped_storage().data_ptr()
    except Exception:  # noqa: BLE001  (no storage: nothing shared)
        return
    if not ptr:
        return
    EXPORTED[ptr] = EXPORTED.get(ptr, 0) + 1
    try:
        weakref.finalize(holder, _release, EXPORTED, ptr)
    except TypeError:  # (not weakly referable: noted for good)
        pass


def _release(table: dict, key: int) -> None:
    """One holder of `key` in `table` (`EXPORTED`, `HANDLED`) is gone."""
    left = table.get(key, 0) - 1
    if left > 0:
        table[key] = left
    else:
        table.pop(key, None)


WRAPPERS: dict = {}  # name -> the wrapper on torch.Tensor and wherever torch kept the C function (`install`)
WRAPPER_CODE = _wrapper("", ()).__code__
_MODULE_FUNCTIONS = ("_to_dlpack", "_to_dlpack_versioned", "_storage_address", "_from_dlpack")  # torch._C's
# torch's functions that make a tensor over memory numpy or Python owns (or may): what the notebook's code makes with
# them, and the tensors whose memory its numpy() hands out, are memory both sides see (`EXPORTED`). (`from_dlpack`
# over a numpy array: red team 12b's #3.)
_TORCH_FUNCTIONS = ("from_numpy", "frombuffer", "from_file", "asarray", "as_tensor", "from_dlpack")
_SHARED_BY_SELF = frozenset(("numpy", "_to_dlpack", "_to_dlpack_versioned"))  # the memory shared is the tensor's
_SHARING = frozenset((*_SHARED_BY_SELF, *_TORCH_FUNCTIONS, "_from_dlpack"))
EXPORTED: dict = {}  # address of a storage numpy or Python also sees (made so by the notebook's code) -> live exports
HANDLED: dict = {}  # a storage the notebook's code holds as a storage object (its `_cdata`) -> live handles
_TORCH_DIR = "//"  # torch's own Python files (`install`)
_STUDENT: list = []  # the guard's `student` (`install`): whether a frame runs the notebook's code


def install(student=None) -> None:
    """In the student's process, before the notebook's code runs: torch's ways out of torch become `_wrapper`s
    everywhere torch keeps them (torch.Tensor, torch._C.TensorBase and the legacy tensor types' dicts, torch._C,
    torch.utils.dlpack)."""
    import ctypes
    import gc

    import torch
    import torch.utils.dlpack

    global _TORCH_DIR
    _TORCH_DIR = str(Path(torch.__file__).parent) + "/"
    if student is not None and not _STUDENT:
        _STUDENT.append(student)
    if WRAPPERS:
        return
    base = gc.get_referents(torch._C.TensorBase.__dict__)[0]  # the immutable type's own dict
    originals = {name: base[name] for name in _WRAPPED if name in base}
    originals.update({name: getattr(torch._C, name) for name in _MODULE_FUNCTIONS if hasattr(torch._C, name)})
    originals.update({name: getattr(torch, name) for name in _TORCH_FUNCTIONS if hasattr(torch, name)})
    keepers = tuple(_keeper(originals) for _ in range(_KEEPERS))
    for keeper in keepers:
        next(keeper)
    sends = tuple(keeper.send for keeper in keepers)
    frozen = gc.get_freeze_count()
    gc.unfreeze()  # `gc.get_referrers` does not look at frozen objects (the child froze torch's at start-up)
    for name, fn in originals.items():
        shim = WRAPPERS[name] = _wrapper(name, sends)
        _replace(gc, fn, shim, originals)
        if name not in _MODULE_FUNCTIONS and name not in _TORCH_FUNCTIONS:
            setattr(torch.Tensor, name, shim)
    storage_base = gc.get_referents(torch._C.StorageBase.__dict__)[0]
    new = _storage_new(storage_base["__new__"])
    storage_base["__new__"] = new  # the classes made from now on (a notebook's subclass) call it
    torch.UntypedStorage.__new__ = new
    if isinstance(storage_base.get("from_buffer"), staticmethod):
        storage_base["from_buffer"] = _storage_from_buffer(storage_base["from_buffer"].__func__)
    for t in (torch._C.TensorBase, *torch._tensor_classes, torch._C.StorageBase):
        ctypes.pythonapi.PyType_Modified(ctypes.py_object(t))  # the types' attribute caches see the new dicts
    sys._clear_type_cache()
    fn = base = None
    if frozen:
        gc.freeze()


def _replace(gc, fn, shim, originals: dict) -> None:
    """`fn` replaced by `shim` wherever torch keeps it: a dict's value (a type's, a module's), a staticmethod in a
    dict (torch._C._VariableFunctionsClass's), a tuple in a list or a dict (torch.jit's table of builtin ops)."""
    for holder in gc.get_referrers(fn):
        if type(holder) is dict and holder is not originals:
            for key in [k for k, v in holder.items() if v is fn]:
                holder[key] = shim
            if fn in holder:  # a key (torch._dynamo's tables of functions, when it was imported first)
                holder[shim] = holder.pop(fn)
        elif type(holder) is set:
            holder.discard(fn)
            holder.add(shim)
        elif type(holder) in (staticmethod, tuple):
            new = staticmethod(shim) if type(holder) is staticmethod else tuple(shim if x is fn else x for x in holder)
            for outer in gc.get_referrers(holder):
                if type(outer) is dict:
                    for key in [k for k, v in outer.items() if v is holder]:
                        outer[key] = new
                elif type(outer) is list:
                    outer[:] = [new if x is holder else x for x in outer]


def replaced() -> list[str]:
    """The wrappers the notebook's code took off torch.Tensor or torch._C (each a verdict in a torch-only exercise's
    call)."""
    import torch

    def where(name):
        return (getattr(torch._C, name, None) if name in _MODULE_FUNCTIONS else getattr(torch, name, None)
                if name in _TORCH_FUNCTIONS else vars(torch.Tensor).get(name))
    return [name for name, w in WRAPPERS.items() if where(name) is not w]


class HostBudget:
    """The count for one call of exercise `root` (made by `grader.child_observe` for each call of a torch-only
    exercise); a finding is the guard's verdict (`flag`), sent at once."""

    __slots__ = ("guard", "root", "moved", "how", "done", "tensor_type", "free", "plain", "shared")

    def __init__(self, guard, root: str, args=(), kwargs=None):
        import torch

        self.guard, self.root, self.moved, self.how, self.done = guard, root, 0, {}, set()
        self.tensor_type, self.plain = torch._C.TensorBase, torch._C.DisableTorchFunctionSubclass
        # The memory of the call's integer and boolean arguments (a block table, the lengths): metadata an honest
        # kernel reads in Python (`int(context_lens[b])`, an index taken from a block table), free to read through
        # any view of it. Writing other data there is changing an argument in place, which the checks refuse.
        self.free = set()
        self.shared = set()  # (address, offset, numel) of the regions of `EXPORTED` memory the call's ops touched
        self.close()  # torch.Tensor's wrappers taken off before the call
        for a in _tensors((*args, *(kwargs or {}).values())):
            if not a.is_floating_point() and not a.is_complex() and a.device.type != "meta":
                ptr = a.untyped_storage().data_ptr()
                if ptr:
                    self.free.add(ptr)

    def close(self) -> None:
        """At the call's start and end: torch.Tensor's wrappers must still be there (`install`)."""
        gone = replaced()
        if gone and "replaced" not in self.done:
            self.done.add("replaced")
            self.guard.flag(self.root, f"took torch.Tensor's {', '.join(gone[:3])} back to torch._C's own, whose "
                                       f"calls from C the checks do not see (grader.host_budget): leave torch.Tensor as "
                                       f"it is")

    def _free(self, t) -> bool:
        """Whether reading `t` reads only the memory of an integer or boolean argument (see `free`)."""
        if not self.free or not isinstance(t, self.tensor_type):
            return False
        try:
            with self.plain():  # a subclass's __torch_function__ (the notebook's code) does not answer for it
                return t.device.type != "meta" and t.untyped_storage().data_ptr() in self.free
        except Exception:  # noqa: BLE001  (a tensor without storage: not an argument's memory)
            return False

    def take(self, n: int, how: str) -> None:
        self.moved += n
        self.how[how] = self.how.get(how, 0) + n
        if self.moved > HOST_LIMIT and "moved" not in self.done:
            self.done.add("moved")
            ways = ", ".join(f"{k}: {v}" for k, v in sorted(self.how.items(), key=lambda kv: -kv[1])[:3])
            self.guard.flag(self.root, moved_message(self.root, self.moved, ways))

    def op(self, func, args, kwargs, out) -> None:
        """Every op of the call (the dispatch mode's): a region of memory numpy or Python also sees (`EXPORTED`), read
        or written by the op, is numbers leaving or entering torch without a conversion (red team 9: a tensor copied
        into `torch.frombuffer(bytearray)` or `torch.from_numpy(np.empty(...))`, or into a tensor whose numpy() the
        cells took, then read by numpy); and an op that writes into an integer argument's memory ends its being free
        metadata (#7: scores written into the block table's memory through a float view, read by tolist())."""
        if "moved" in self.done:
            return  # the verdict is given: the rest of the call is not judged (and runs at its own speed)
        writes = _WRITES.get(func)
        if writes is None:
            writes = _WRITES[func] = _written(func)
        if not EXPORTED and not HANDLED and not (self.free and writes):
            return
        with self.plain():
            for i, t in _flat(args, kwargs, out):
                if not isinstance(t, self.tensor_type) or t.device.type == "meta":
                    continue
                try:
                    storage = t.untyped_storage()
                    ptr = storage.data_ptr()
                except Exception:  # noqa: BLE001  (no storage)
                    continue
                if ptr in EXPORTED or storage._cdata in HANDLED:
                    region = (ptr, t.storage_offset(), t.numel())
                    if region not in self.shared:
                        self.shared.add(region)
                        self.take(t.numel(), "memory numpy or Python sees too (from_numpy, frombuffer, from_dlpack, "
                                             "as_tensor of an array, a tensor whose numpy() was taken, a storage object the "
                                             "notebook holds), read or written by torch ops; a constant made that way "
                                             "is fine once cloned into torch's memory")
                if ptr in self.free and (i in writes or i == -1):
                    self.free.discard(ptr)

    def scalar(self, func, args) -> None:
        """A scalar read out of a tensor by an op (the dispatch mode's `host`)."""
        if not all(self._free(a) for a in args if isinstance(a, self.tensor_type)):
            self.take(1, "scalars read from tensors (item, float, bool, an if on a tensor)")

    def c_call(self, frame, arg) -> None:
        """A C function called during the call (the profiler's `c_call`): counted when it takes data out. Called from
        a keeper's frame (`_keeper`), it is one of torch's conversions, asked for by the code that sent the request:
        a wrapper's caller, or whoever called a keeper's `send` itself."""
        name = getattr(arg, "__name__", None)
        if name not in _COUNTED and name not in _DENIED:
            return
        if frame.f_code is not KEEPER_CODE:
            self.called(frame, name, getattr(arg, "__self__", None))
            return
        f_locals = frame.f_locals
        name, args = f_locals.get("name"), f_locals.get("args") or (None,)
        asker = frame.f_back
        if asker is not None and asker.f_code is WRAPPER_CODE:
            asker = asker.f_back
        self.called(asker, name, sys.modules.get("torch._C") if name in _MODULE_FUNCTIONS else args[0])

    def called(self, frame, name, owner) -> None:
        """`owner.<name>()` called by the code of `frame`: counted, or denied, when it takes data out of torch."""
        if frame is not None and frame.f_code.co_filename.startswith(_GRADER) and not self.guard.student(frame):
            return  # the grader's own code (a fresh copy of a grader file, imported by the notebook's code, is not)
        if name in _DENIED:
            if name in _MODULE_FUNCTIONS:
                if type(owner).__name__ != "module" or getattr(owner, "__name__", "") != "torch._C":
                    return
            elif not isinstance(owner, self.tensor_type):
                return
            elif name in ("data_ptr", "const_data_ptr") and not self.guard.student(frame):
                return  # torch's own code asks for addresses (serialization after a storage, already denied)
            if name not in self.done:
                self.done.add(name)
                self.guard.flag(self.root, denied_message(self.root, f"{name}()"))
            return
        if name not in _COUNTED or not isinstance(owner, self.tensor_type) or self._free(owner):
            return
        if name == "item":
            if self.guard.student(frame):
                return  # under the dispatch mode: counted there as the scalar it reads
            self.take(1, "scalars read from tensors (item, float, bool, an if on a tensor)")
            return
        try:
            with self.plain():
                # a meta tensor has no data: its tolist() raises (the checks' meta-device run of a kernel that reads
                # its block table once with tolist(): red team 9's #14), and nothing leaves torch
                n = 0 if owner.device.type == "meta" else int(owner.numel())
        except Exception:  # noqa: BLE001  (a tensor whose size cannot be read moves nothing countable)
            return
        if n:
            self.take(n, f"Tensor.{name}()")


_WRITES: dict = {}  # op -> the positions (in `_flat`'s order) of the arguments it writes into


def _written(func) -> frozenset:
    """The positional arguments `func` writes into (an in-place op's self, `out=` arguments count as outputs)."""
    try:
        return frozenset(i for i, a in enumerate(func._schema.arguments)
                         if a.alias_info is not None and a.alias_info.is_write and not a.kwarg_only)
    except AttributeError:
        return frozenset()


def _flat(args, kwargs, out):
    """(position, value) of the op's positional arguments, then of its keyword arguments at -1 (`out=`: written)
    and of its outputs at -2 (new memory, or a view of an argument's: not a write)."""
    for i, a in enumerate(args):
        if isinstance(a, (list, tuple)):
            yield from ((i, x) for x in a)
        else:
            yield i, a
    for v in (kwargs or {}).values():
        yield -1, v
    for v in out if isinstance(out, (list, tuple)) else (out,):
        yield -2, v


def _tensors(values, depth: int = 0):
    """The tensors among `values` and inside their lists, tuples and dicts (two levels down)."""
    import torch

    for v in values:
        if isinstance(v, torch._C.TensorBase):
            yield v
        elif depth < 2 and isinstance(v, (list, tuple)):
            yield from _tensors(v, depth + 1)
        elif depth < 2 and isinstance(v, dict):
            yield from _tensors(v.values(), depth + 1)
