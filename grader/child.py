"""The student's process: its runtime, after `grader._sandbox` has confined it.

What it guards: **the student's code runs here and only here, and what it did is reported as data.** `_Child`
runs the notebook's exercise cells (`load`), answers the trusted side's requests (look a name up, call a
function, `observe` a call, report reference use), and sends every result through the child's codec
(`grader.child_wire`), which encodes it as plain data or as a reference (see `grader.wire`). Every call into the
notebook's code, observed or not, runs under the same observers and watches which of `lib`'s functions ran
(`grader.child_observe`: by bytecode fingerprint, `grader.fingerprint`); every tensor argument is compared bit for
bit before and after (`_snapshot`, `_copied`). What the notebook's code does to the grader here is its guard's
(`grader.child_guard`). An object of the trusted process (a check's model, a spy) is a proxy here
(`grader.child_wire`), which calls back. `_child_main` is the entry point the session starts
(`grader.child_setup.CHILD_BOOT`); the address-space limit is set after torch and the cells are loaded.
"""
from __future__ import annotations

import os
import pickle
import sys
from pathlib import Path

# _freeze: what the process holds leaves the collector's sight, so the collection before each call into the notebook's
# code (`grader.child_observe`) costs microseconds, not the 40 ms of a process with torch loaded
from gc import freeze as _freeze
from threading import Event as _Event, Thread as _Thread  # (bound before the notebook's code runs)
from time import perf_counter as _clock

from grader.child_guard import REFERENCES_EVENT, new_guard
from grader.host_budget import install as install_host_wrappers
from grader.child_identity import OWN
from grader.child_observe import CALLS, Calls
from grader.child_wire import decode, encode, serve
from grader.fingerprint import lib_name
from grader.status import TAMPERED_TAIL
from grader.wire import GENERATOR_STATE, TENSOR_CHANGED, apply_operation, exception_info, rebuild_exception, recv_message, send_message

LIB_DIR = str(Path(__file__).resolve().parent.parent / "lib") + os.sep
# What this process's grader code runs on, bound before the notebook's code runs (as `grader.wire`'s framing):
# `pickle.dumps` or `os._exit` replaced by the notebook's code by plain names changes nothing here.
_dumps, _exit = pickle.dumps, os._exit

_CHILD = None


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
        self.guard = new_guard()
        install_host_wrappers(self.guard.student)  # torch's ways out of torch as Python code (grader.host_budget)
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
        return encode(msg, self)

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
        check, send = (self.guard.checker(self), self.send) if waiting_for is None else (None, None)
        while True:
            try:
                data = recv_message(self.r, None)
            except EOFError:
                _exit(0)
            msg = decode(data)
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
        if op == "thread":  # a call made on a thread of its own while this one waits (grader.checks.week21_during)
            return self._threaded(target, *args)
        with self.calls.scope.entry():  # the notebook's code can run here too (a property, `__getitem__`, ...)
            if op == "getname":
                return getattr(self.module, args[0])
            return apply_operation(op, target, args)

    def _threaded(self, target, args, kwargs, wait):
        """`target(*args, **kwargs)` on a new thread, as a server's front end calls while the engine thread steps:
        ("ok", seconds it took) or ("stuck",) when it has not returned within `wait` seconds; what it raised, raised."""
        box, go = [], _Event()

        def run():
            go.wait()  # (after the guard watches thread starts again: the notebook's code runs from here)
            try:
                start = _clock()
                self.calls.run("callback", target, (args, kwargs))
                box.append(("ok", _clock() - start))
            except BaseException as e:  # noqa: BLE001  (the notebook's code may raise anything)
                box.append(("err", e))
        t = _Thread(target=run, daemon=True)
        self.guard.own_spawn = True
        try:
            t.start()
        finally:
            self.guard.own_spawn = False
        go.set()
        t.join(float(wait))
        if t.is_alive() or not box:
            return ("stuck",)
        if box[0][0] == "err":
            raise box[0][1]
        return box[0]

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
        exercise_module = OWN["grader.notebook"].exercise_module

        # the trusted side found these copies in the cells' source; code compiled later is judged by the audit hook
        self.copies.update({(int(index), str(qualname)): str(why) for index, qualname, why in copies})
        if references:  # to the audit hook, which alone keeps them (`grader.child_guard`): nothing here can clear them
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
        the child would die at its first CUDA tensor (tests/test_integrity_resources.py reproduces it on the CPU)."""
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


def _child_main(rfd, wfd, memory, sandbox, memory_kind="as"):
    global _CHILD
    import torch  # noqa: F401  (imported before the student's code, and before the memory limit)

    from grader.raw_memory import close_array_interface, close_storage_doors
    sandbox = f"{sandbox}; {close_array_interface()}"  # numpy makes no array by address (before any of the notebook's code)
    sandbox = f"{sandbox}; {close_storage_doors()}"

    import lib.attn.io_model  # lib first: it sets TRITON_INTERPRET before anything imports triton
    from grader import notebook, similarity  # noqa: F401  (similarity: judges code compiled later: grader.child_guard)

    from grader import observe  # the guard remembers its code; warm_up below
    from grader.fingerprint import warm

    OWN.update((name, module) for name, module in list(sys.modules.items())
               if name == "grader" or name.startswith("grader."))
    OWN["TensorMemoryMeter"] = lib.attn.io_model.TensorMemoryMeter
    warm()  # lib's fingerprints, taken before the student's code can touch lib's modules
    observe.warm_up()  # the first observation's fixed cost, paid at start-up rather than in an exercise's time
    _freeze()
    _CHILD = _Child(rfd, wfd, memory, sandbox)
    _CHILD.memory_kind = memory_kind
    serve(_CHILD)
    _CHILD.guard.remember()
    _CHILD.guard.audit(_CHILD, wfd)
    _hide_modules()
    _CHILD.send(("ok", None, sandbox))
    _CHILD.loop()


def _hide_modules() -> None:
    """The grader's modules leave `sys.modules` (and the `grader` package's attributes, and the start-up script's
    globals, `__main__`): the notebook's `import grader.child` then loads a fresh copy of the file, whose `_CHILD`
    is None, instead of handing it this process's records of what ran (which it could clear). The grader's own code
    keeps its modules (`grader.child_identity.OWN`). `grader.checks` is a stub either way."""
    for name in [n for n in sys.modules if n == "grader" or n.startswith("grader.")]:
        OWN.setdefault(name, sys.modules[name])
        del sys.modules[name]
    package = OWN.get("grader")
    for name in list(vars(package)) if package is not None else ():
        if isinstance(getattr(package, name), type(sys)):
            delattr(package, name)
    main = sys.modules.get("__main__")
    if main is not None:
        for name in [n for n in vars(main) if not n.startswith("__")]:  # the script never returns to use them
            delattr(main, name)
