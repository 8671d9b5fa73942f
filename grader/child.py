"""The student's process: its runtime, after `grader._sandbox` has confined it.

What it guards: **the student's code runs here and only here, and what it did is reported as data.** `_Child`
runs the notebook's exercise cells (`load`), answers the trusted side's requests (look a name up, call a
function, `observe` a call, report reference use), and sends every result through `_ChildPickler`, which
encodes it as plain data or as a reference (see `grader.wire`). Around each call it watches which of `lib`'s
functions ran (`watch`, by bytecode fingerprint: `grader.fingerprint`), and compares every tensor argument
bit for bit before and after (`_snapshot`, `_copied`). An object of the trusted process (a check's model, a
spy) is a `_ParentProxy` here, which calls back. `_child_main` is the entry point the session starts
(`grader.isolation._CHILD_BOOT`); the address-space limit is set after torch and the cells are loaded.
"""
from __future__ import annotations

import io
import os
import pickle
import sys
from pathlib import Path

from grader.fingerprint import lib_name
from grader.wire import _GENERATOR_STATE, _TENSOR_CHANGED, _apply, _exc_info, _rebuild_exc, _recv, _send

LIB_DIR = str(Path(__file__).resolve().parent.parent / "lib") + os.sep

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
        if op == "on_device":  # checks.call_on_default_device: torch's default device set around the call only
            import torch

            device, call_args, kwargs = args
            if device not in ("meta", "cpu"):
                raise ValueError(f"on_device: {device!r} is not a default device a check sets")
            before = self._snapshot(call_args, kwargs)
            with self.watch(), torch.device(device):
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
        from grader.notebook import exercise_module

        self.module = exercise_module(notebook, cells)
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
    from grader import notebook  # noqa: F401

    from grader.fingerprint import warm

    warm()  # lib's fingerprints, taken before the student's code can touch lib's modules
    _CHILD = _Child(rfd, wfd, memory, sandbox)
    _CHILD.send(("ok", None, sandbox))
    _CHILD.loop()
