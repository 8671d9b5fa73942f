"""The child's side of the wire: how the student's process encodes what it sends and decodes what it receives.

`encode` (`_ChildPickler`) turns the child's values into what the trusted side can check (`grader.wire`'s
`decode_tagged`): plain data by value, a tensor or a numpy array as its bytes with dtype, shape and strides, anything
else as a reference (`R`) to an object that stays here. `decode` (`_ChildUnpickler`) reads the trusted side's messages
(trusted, so a normal unpickler) with their references resolved: an object of the child's by its id, and an object of
the trusted process (a check's model, a spy) as a `_ParentProxy`, which behaves like it and calls back. The trusted
side's pickler and its safe decoder are in `grader.wire`.
"""
from __future__ import annotations

import io
import pickle
import sys

from grader.child_identity import OWN

# What the codec runs on, bound before the notebook's code runs (as `grader.wire`'s framing): `io.BytesIO` replaced by
# the notebook's code by a plain name changes nothing here.
_BytesIO = io.BytesIO
# The process's runtime (`grader.child._Child`), which a proxy's every use asks and the decoder resolves the child's
# objects in: set by `serve`, before the notebook's code runs.
_CHILD = None


def serve(child) -> None:
    """Proxies and references decoded from now on are `child`'s (`grader.child._child_main`)."""
    global _CHILD
    _CHILD = child


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
    """Encodes the child's values as data the trusted side can check (`encode`)."""

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


class _ChildUnpickler(pickle.Unpickler):
    """In the child: the trusted side's messages (trusted, so a normal unpickler) with its references resolved."""

    def find_class(self, module, name):
        own = OWN.get(module)  # the grader's modules are no longer in sys.modules (`grader.child._hide_modules`)
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



def encode(msg, child) -> bytes:
    """`msg` as the trusted side reads it (`grader.wire.decode_tagged`); `child` exports what is sent by reference."""
    buf = _BytesIO()
    _ChildPickler(buf, child).dump(msg)
    return buf.getvalue()


def decode(data: bytes):
    """A message of the trusted side's."""
    return _ChildUnpickler(_BytesIO(data)).load()
