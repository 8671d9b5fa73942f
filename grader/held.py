"""What an object keeps: the bytes reachable from a callable (a cache's bound `append`: its object, the object's class,
the notebook's namespace its methods read), counted in the process where it lives, after the call.

A meter of what one call allocates cannot see what an object *keeps* from call to call: a rolling cache that keeps every
chunk it was given in a list (the argument itself, or a copy) allocates only a chunk per append. `held_bytes` walks
what the callable reaches, as the garbage collector sees it (`gc.get_referents`, which runs none of the notebook's
code), and sums what it holds: the storages of tensors (each once; a sparse tensor's indices and values, a nested or
mkldnn one's elements), numpy arrays' data, an mmap's pages, and every other object's own size (lists, dicts, bytes,
Python numbers). A check compares it after the first and the last call of a long stream
(`grader.checks.week16_caches.rolling_stream`): what grew is what the object kept.

What the callable's observed calls made and left alive when they returned is counted too, wherever it is kept
(`note_made`: the storage of every tensor the call's ops made, read or wrote, held by weak reference: `touching`):
a history kept on an imported module (`math.h`), on a class of torch's, in a registry of a library's, where the walk
below never goes, is found that way. A storage is counted once, by either route.

The walk stops at imported modules (those in sys.modules: torch's state is not the notebook's; a module object the
notebook made is followed), at classes and functions from outside the namespace
the callable's code was written in, at that namespace's builtins, at the grader's proxies and at the Jupyter kernel's
objects (the shell behind `get_ipython`); it follows everything else (instance dicts and slots, class attributes,
closures, generators' frames, containers).
"""
from __future__ import annotations

import collections
import gc
import mmap
import sys
import types
import weakref

from grader.child_identity import OWN  # the grader's modules in the student's process (not in its sys.modules)

_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class made by a class statement
# A class's attributes read through `type`'s own descriptors: no metaclass of the notebook's is asked
_FLAGS, _MRO, _NAME, _MODULE = (type.__dict__[n] for n in ("__flags__", "__mro__", "__name__", "__module__"))
LIMIT = 2_000_000  # objects walked at most: a bound on the walk's time (past it, `held_bytes` says -1)
_LEAVES = (int, float, complex, bool, str, bytes, type(None))
_MADE: dict = {}  # id(the measured object) -> (the object, [weak references to storages its observed calls made])
_MADE_KEPT = 8  # objects remembered at most (a check measures one stream at a time)
# The notebook's kernel puts its own objects in the namespace (get_ipython, exit, the shell behind them): not followed
_KERNEL = ("IPython.", "ipykernel.", "traitlets.", "jupyter_client.", "zmq.", "tornado.")


def _namespace(root):
    """The globals dict of the code `root` runs (a bound method's function's, a function's), or None."""
    fn = root.__func__ if type(root) is types.MethodType else root
    return fn.__globals__ if type(fn) is types.FunctionType else None


def _module(cls) -> str:
    m = _MODULE.__get__(cls)
    return m if type(m) is str else ""


def _own_size(o) -> int:
    """The object's own size, by the `__sizeof__` of the first class of its MRO that is not made by a class statement
    (no code of the notebook's runs)."""
    for cls in _MRO.__get__(type(o)):
        if not _FLAGS.__get__(cls) & _HEAPTYPE:
            try:
                return int(cls.__sizeof__(o))
            except Exception:  # noqa: BLE001  (a C type that cannot say: counted as nothing)
                return 0
    return 0


def _owner(root):
    return root.__self__ if type(root) is types.MethodType else root


def _storages(t, torch) -> list:
    """The storages a tensor's data lives in: its own, or a sparse tensor's parts' (read through TensorBase's own
    methods: no subclass code runs); none for meta."""
    base = torch._C.TensorBase
    try:
        if base.layout.__get__(t) != torch.strided:
            parts = []
            _layout_bytes(torch, t, parts, [])
            return [s for p in parts for s in _storages(p, torch)]
        s = base.untyped_storage(t)
    except (RuntimeError, NotImplementedError, TypeError):
        return []
    return [s] if s.device.type != "meta" else []


def touching(rec):
    """A fresh memory meter for the recording `rec` (lib's `TensorMemoryMeter`) that also remembers, by weak
    reference, the storage of every tensor an op of the call read or wrote (`touched`): what `note_made` takes, beside
    what the call made. So a history grown in place (`resize_` of a tensor made before, kept where the walk does not
    go: red team 10b's #8) or kept as sparse tensors, which the meter cannot track (#9), is counted too. The storages
    are taken before the recording's own handling of the op (`rec.recorder.after`), which a sparse result stops."""
    import torch

    class Touching(type(rec.meter)):
        touched: dict  # id(storage) -> weak reference to it

    meter = Touching()
    meter.touched = {}
    record = rec.recorder.after

    def after(func, args, kwargs, out, counted):
        for a in (*args, *(kwargs or {}).values(), *(out if isinstance(out, (tuple, list)) else (out,))):
            for t in (a if isinstance(a, (tuple, list)) else (a,)):
                if isinstance(t, torch.Tensor):
                    for s in _storages(t, torch):
                        ref = meter.touched.get(id(s))
                        if ref is None or ref() is not s:
                            meter.touched[id(s)] = weakref.ref(s)
        return record(func, args, kwargs, out, counted)

    rec.recorder.after = after
    return meter


def note_made(root, storages) -> None:
    """Remember `storages` (what an observed call of `root` made, read or wrote and still alive when it returned:
    its result among them) by weak reference: `held_bytes(root)` counts those still alive that something other than
    the grader keeps, wherever they are kept. A storage's weak reference lives as long as its memory does, however it
    is held (a tensor, a view, the storage object alone)."""
    owner = _owner(root)
    entry = _MADE.get(id(owner))
    if entry is None or entry[0] is not owner:
        entry = _MADE[id(owner)] = (owner, {})
        while len(_MADE) > _MADE_KEPT:
            del _MADE[next(iter(_MADE))]
    refs = entry[1]
    for key in [k for k, r in refs.items() if r() is None]:
        del refs[key]
    for s in storages:
        if s.nbytes():
            ref = refs.get(id(s))
            if ref is None or ref() is not s:
                refs[id(s)] = weakref.ref(s)


def _made_alive(root) -> list:
    """The storages `note_made` remembered for `root` that something other than the grader keeps alive: the
    student's process keeps every storage it sent the trusted side (`grader.child._Child.sent_storages`, so that
    views keep their identity), which is not the notebook's keeping. Kept by the notebook: a tensor still uses it
    (the storage's use count counts tensors, and the storage object itself when it holds it), or its storage object
    has more references than the grader's list and this function hold."""
    import torch

    entry = _MADE.get(id(_owner(root)))
    if entry is None or entry[0] is not _owner(root):
        return []
    child = getattr(OWN.get("grader.child"), "_CHILD", None)
    sent = collections.Counter(map(id, getattr(child, "sent_storages", ())))
    out = []
    for ref in list(entry[1].values()):
        s = ref()
        if s is None:
            continue
        # references: `s`, getrefcount's argument, the grader's list (once per entry), and `out` once appended
        if torch._C._storage_Use_Count(s._cdata) > 1 or sys.getrefcount(s) > 2 + sent[id(s)]:
            out.append(s)
        del s
    return out


def held_bytes(root, made=None) -> int:
    """Bytes reachable from `root` (see the module docstring); -1 when they are more than `LIMIT` objects. `made`: the
    memory meter of a call of `root` just made (`touching`'s): the storages its ops touched are noted first."""
    import torch

    if made is not None:  # what its ops made, read or wrote (their results among them) and is alive now
        note_made(root, [s for s in (r() for r in list(getattr(made, "touched", {}).values())) if s is not None])

    try:
        import numpy
        ndarray = numpy.ndarray
    except ImportError:  # pragma: no cover
        ndarray = ()
    names = _namespace(root)
    module = names.get("__name__") if names is not None else None
    builtins_ = names.get("__builtins__") if names is not None else None
    skip = {id(sys.modules), id(builtins_), id(getattr(builtins_, "__dict__", None))}
    # modules stop the walk only when imported (in sys.modules): one the notebook made (`types.ModuleType("h")`) is an
    # object like any other (red team 9's #9 kept its history on one)
    imported = {id(m) for m in list(sys.modules.values())}
    seen, storages, stack, total, keep = set(), set(), [root], 0, []
    tensor, storage_types = torch.Tensor, (torch.UntypedStorage, torch.storage.TypedStorage)
    with torch._C.DisableTorchFunction():
        while stack and len(seen) < LIMIT:
            o = stack.pop()
            if id(o) in seen or id(o) in skip:
                continue
            seen.add(id(o))
            t = type(o)  # (type, issubclass: no `__class__` of the notebook's objects read, no code of theirs run)
            if ((issubclass(t, types.ModuleType) and id(o) in imported) or _NAME.__get__(t) == "_ParentProxy"
                    or _module(t).startswith(_KERNEL)):
                continue  # a module imported, the trusted side's object seen from the student's process, the kernel's
            if issubclass(t, type):
                if not _FLAGS.__get__(o) & _HEAPTYPE or _module(o) != module:
                    continue  # a class of Python's, torch's or a library's: not the notebook's
            elif t is types.FunctionType and o.__globals__ is not names:
                continue  # a function from elsewhere (its globals are another module's)
            elif t is types.CodeType:
                continue  # the notebook's code: the same before and after
            if issubclass(t, tensor) and tensor.layout.__get__(o) != torch.strided:
                # sparse, nested or mkldnn: no storage of its own to count (red team 9's #8 kept its history as
                # hybrid sparse tensors); its parts (indices, values), or its elements at their size, are counted
                total += _own_size(o) + _layout_bytes(torch, o, stack, keep)
                continue
            if issubclass(t, tensor):
                try:
                    s = torch._C.TensorBase.untyped_storage(o)
                    ptr = s.data_ptr() if s.device.type != "meta" else None
                except (RuntimeError, NotImplementedError, TypeError):  # a tensor subclass without a storage
                    ptr = None
                if ptr is not None and ptr not in storages:
                    storages.add(ptr)
                    total += s.nbytes()
                total += _own_size(o)
            elif t in storage_types:  # (exactly torch's: a subclass's methods are the notebook's code)
                s = o if t is torch.UntypedStorage else o._untyped_storage
                if s.device.type != "meta" and s.data_ptr() not in storages:
                    storages.add(s.data_ptr())
                    total += s.nbytes()
            elif ndarray and issubclass(t, ndarray):
                base = ndarray.base.__get__(o)
                if base is None:
                    total += int(ndarray.nbytes.__get__(o))
                else:
                    stack.append(base)  # a view: its data belongs to its base
                if ndarray.dtype.__get__(o).hasobject:  # an array of objects: each is followed
                    stack.extend(ndarray.tolist(ndarray.ravel(o)))
                continue
            else:
                total += _own_size(o) + (len(o) if t is mmap.mmap and not o.closed else 0)  # an mmap's pages (#10)
            for r in gc.get_referents(o):
                if type(r) in _LEAVES:  # counted where met (each time: the same before and after), not walked
                    total += _own_size(r)
                else:
                    stack.append(r)
    if stack:
        return -1
    for s in _made_alive(root):  # what its calls made and is still alive, wherever it is kept
        if s.data_ptr() not in storages:
            storages.add(s.data_ptr())
            total += s.nbytes()
    return total


def _layout_bytes(torch, o, stack, keep) -> int:
    """A tensor of another layout than strided: its sparse parts go on the walk (each a strided tensor, its storage
    counted once); what has none (nested, mkldnn, meta) counts its elements at their size."""
    base, parts = torch._C.TensorBase, ()  # its methods as torch defines them: none of a subclass's code runs
    try:
        layout = base.layout.__get__(o)
        if layout == torch.sparse_coo:
            parts = (base._indices(o), base._values(o))
        elif layout in (torch.sparse_csr, torch.sparse_bsr):
            parts = (base.crow_indices(o), base.col_indices(o), base.values(o))
        elif layout in (torch.sparse_csc, torch.sparse_bsc):
            parts = (base.ccol_indices(o), base.row_indices(o), base.values(o))
    except Exception:  # noqa: BLE001  (counted by its elements below)
        parts = ()
    if parts:
        stack.extend(parts)
        keep.extend(parts)  # new objects: alive until the walk ends, so that no other object takes their ids
        return 0
    try:
        return 0 if base.device.__get__(o).type == "meta" else int(base.numel(o)) * int(base.element_size(o))
    except Exception:  # noqa: BLE001
        return 0
