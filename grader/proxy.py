"""The trusted side's view of the student's objects: `ChildProxy`, and what a call through one does here.

What it guards: **a check never holds the student's object, only a stand-in that forwards to it.** Attribute
access, calls, indexing and iteration are sent to the child (through the proxy's session); equality and
hashing are by identity, so a student's object cannot claim to equal the answer, and a proxy cannot be
pickled. A call made under an active `TensorMemoryMeter` is measured in the child, where the memory is
allocated, and one made during an `observe` of this process's (a check's wrapper around the student's code) is
observed there and added to that observation; a student `torch.autograd.Function` arrives as a local `Function` whose forward and backward run
in the child (`autograd_function_of`). The session (`grader.isolation.Session`) does the messaging.
"""
from __future__ import annotations

from grader.observe import recording_now
from grader.wire import Remote, copy_back


class ChildProxy(Remote):
    """An object that lives in the student's process. Attribute access, calls, indexing and iteration are sent
    there; equality and hashing are by identity (a student's object cannot claim to equal the answer)."""

    __slots__ = ("_session", "_oid", "_generation", "_info", "_name", "_root", "__weakref__")

    def __init__(self, session, oid, info, name=None, root=None):
        object.__setattr__(self, "_session", session)
        object.__setattr__(self, "_oid", oid)
        object.__setattr__(self, "_generation", session.generation)
        object.__setattr__(self, "_info", info)
        object.__setattr__(self, "_name", name)  # the notebook name it was looked up by, if any
        object.__setattr__(self, "_root", root)  # the exercise it came from (`Session._request_raw`)

    def _do(self, op, *args):
        return self._session.request(op, self, args)

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__") and name not in ("__name__", "__qualname__", "__doc__"):
            if name == "__observe__" and self._info.get("callable"):
                return lambda args, kwargs: self._session.observe(self, args, kwargs)
            if name == "__on_default_device__" and self._info.get("callable"):  # checks.call_on_default_device
                return lambda device, args, kwargs: self._session.call(self, args, kwargs, device=device)
            if name == "__map__" and self._info.get("callable"):  # many calls, one round trip (checks.call_many)
                return lambda calls: self._session.request("map", self, (list(calls),))
            if name == "__observe_many__" and self._info.get("callable"):  # checks.observe_many
                return lambda calls, options: self._session.observe_many(self, calls, options)
            raise AttributeError(name)
        return self._do("getattr", name)

    def __setattr__(self, name, value):
        self._do("setattr", name, value)

    def __delattr__(self, name):
        self._do("delattr", name)

    def __call__(self, *args, **kwargs):
        recording = recording_now()
        if recording is not None:  # a call of this process's, observed here, calls the student's code: observed there
            result, obs = self._session.observe(self, args, {**kwargs, "_observe_light": recording.light,
                                                             "_observe_again": False})
            recording.merge(obs)
            return result
        meter = _active_memory_meter()
        if meter is not None:  # measure in the child, where the memory is allocated
            result, peak, copied = self._session.request("metered", self, (args, kwargs))
            copy_back(args, kwargs, copied)
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

        from lib.attn.io_model import TensorMemoryMeter
    except Exception:  # noqa: BLE001
        return None
    for mode in reversed(_get_current_dispatch_mode_stack()):
        if isinstance(mode, TensorMemoryMeter):
            return mode
    return None


def autograd_function_of(proxy: ChildProxy):
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
