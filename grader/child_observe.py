"""In the student's process: the observers every call into the notebook's code runs under, and the second run of an
observed call.

What it guards: **no torch or Python query tells the notebook's code whether a call is observed.** Every request
that runs the notebook's code (`grader.child`: a call, a call on a default device, a batch of calls, a metered or
an observed call, a batch of observed calls, an attribute, item or method of one of its objects, the cells
themselves) runs inside the same `Scope`: one `grader.observers.Observers` dispatch mode (pushed by the outermost
request, so the stack is one mode deep in every call), the same profiler function, the same Triton interpreter
watch, and a garbage collection just before the call. An observed call has a `grader.observe.Recording` started
inside all that, which changes what the grader keeps, not what the code runs under; and every call is made from the
same line of `Calls.run`, so the Python stack above the notebook's function is the same whatever the request
(`traceback.extract_stack()` or `warnings.warn(stacklevel=...)` read it without a verdict). What still differs is
time (a recorded op costs ~10-40 µs more; tracemalloc, where a check asks for it, slows Python several-fold) and
the memory the records take: the checks judge the result of the call they observed, so telling the calls apart
by time earns nothing.

The second run (`Rerun`): an observed call is made again right after, the same way (same scope, same line, the
random states it started with), on copies of its arguments and, for a method or a callable object, of its object
taken before the call — copies made without running any of the notebook's code (no `__deepcopy__`,
`__reduce__`, `__init__`), so the code cannot tell that a copy was taken. It must return the same bits: a result
may depend only on its arguments, its object and the random state it is given, not on how many calls came before.
"""
from __future__ import annotations

import gc
import sys
import time
import types

import numpy.random  # noqa: F401  (imported now: the second run takes its state, which would import it mid-call)

from grader.fingerprint import lib_name
from grader.host_budget import TORCH_ONLY, WATCHED_NAMES, HostBudget
from grader.observe import DISPATCH_OFF, OWN_OPERATOR, WATCH_REMOVED, Recording, to_wire
from grader.observers import Observers
from grader.ran import LinesRun
from grader.triton_watch import TritonWatch

# What this module calls by plain names, bound before the notebook's code runs (as grader.child does)
_getprofile, _setprofile, _current_frames = sys.getprofile, sys.setprofile, sys._current_frames
_gettrace, _settrace = sys.gettrace, sys.settrace
_collect, _freeze, _unfreeze, _clock = gc.collect, gc.freeze, gc.unfreeze, time.perf_counter

CALLS = ("callback", "on_device", "map", "metered", "observe", "observe_many")  # the requests `Calls.run` answers
ELSEWHERE = ("the checks watch the thread that runs the graded code: a forbidden op or a whole score matrix computed "
             "elsewhere goes unseen, so the result cannot be judged; compute on the calling thread")
_TRITON_REPLACED = "watch of the Triton interpreter was replaced"


def other_threads() -> int:
    """How many Python threads other than this one the process has (sys._current_frames sees threads started any
    way, `threading` or not)."""
    return len(_current_frames()) - 1


class Job:
    """One call into the notebook's code: `fn(*args, **kwargs)`, with a `Recording` when it is observed, under
    torch's default `device` when a check sets one, and `setup` run just before (a second run's random states)."""

    __slots__ = ("fn", "args", "kwargs", "recording", "device", "setup", "again", "result", "error")

    def __init__(self, fn, args=(), kwargs=None, recording=None, device=None):
        self.fn, self.args, self.kwargs = fn, tuple(args), dict(kwargs or {})
        self.recording, self.device = recording, device
        self.setup = self.again = self.result = self.error = None


class Scope:
    """What every call into the notebook's code runs under (see the module docstring)."""

    def __init__(self, child):
        self.child = child
        self.mode = None  # the Observers mode, while the outermost request's call runs
        self.kernels = None  # its Triton interpreter watch
        self.profiles: list = []  # the profiler functions of the recordings in effect (light ones have none)
        self.calls, self.thaw_at = 0, 2000  # the call at which the collection looks at everything again

    def collect(self) -> None:
        """Before every call alike: garbage of earlier calls (reference cycles) is freed now, its finalizers
        run here, never first inside an observed call (whose host meter wants what it measures to be the call's).
        The process froze what it held once the cells had run (`gc.freeze`: torch's objects, the notebook's), so
        this looks only at what came after; once it takes over a millisecond, what survives is frozen too. Now
        and then (every 2,000 calls at least, less often the longer it takes: at most ~2 % of the calls' time) a
        collection looks at everything, frozen objects included: cycles that died frozen are freed then."""
        self.calls += 1
        began = _clock()
        if self.calls >= self.thaw_at:
            _unfreeze()
            _collect()
            _freeze()
            self.thaw_at = self.calls + max(2000, int((_clock() - began) / 2e-5))
            return
        _collect()
        if _clock() - began > 1e-3:
            _freeze()

    def entry(self, job: Job | None = None, batch: bool = True) -> _Entry | _Nothing:
        """Around a call (`job`), or around what runs the notebook's code without being a call of it (the cells, an
        attribute, an item), or around a batch of calls (`batch`: False for a request of one call: nothing)."""
        return _Entry(self, job) if batch else _NOTHING

    def hook(self, root, host=None):
        """The profiler function of a call made for exercise `root`: which of lib's functions ran (by bytecode
        fingerprint: `grader.fingerprint`), which copies of the answer key ran, what the guard watches (`grader.child_guard`),
        what data the call takes out of torch (`host`, a call of a torch-only exercise: `grader.host_budget`), and what
        the recordings in effect want to see."""
        child = self.child
        seen = child.lib_seen.setdefault(root, set())
        codes, copies, profiles, guard = child.lib_codes, child.copies, self.profiles, child.guard
        watched_code, watched_c, event_of, copy_ran = guard.watched_code, guard.watched_c, guard.event, child.copy_ran
        watched_names = WATCHED_NAMES

        def prof(frame, event, arg):
            if event == "call":
                code = frame.f_code
                if copies:
                    copy_ran(root, code)
                try:
                    name = codes[code]
                except KeyError:  # lib's by file, or lib's bytecode loaded from anywhere else
                    name = codes[code] = lib_name(code)
                if name is not None:
                    seen.add(name)
                if code in watched_code:
                    event_of(root, frame, event, arg)
            elif event == "c_call":
                if id(arg) in watched_c:
                    event_of(root, frame, event, arg)
                if host is not None and getattr(arg, "__name__", None) in watched_names:
                    host.c_call(frame, arg)
            for profile in profiles:
                profile(frame, event, arg)
        return prof


class _Nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


_NOTHING = _Nothing()


class _Entry:
    """Around one call (or the cells' load, or an attribute of the notebook's object): the scope entered, a job's
    recording started last and stopped first."""

    def __init__(self, scope: Scope, job: Job | None):
        self.scope, self.job = scope, job
        self.outermost, self.device, self.before, self.prof, self.started = False, None, (), None, False
        self.tracing, self.host_before, self.host_set = False, None, False

    def __enter__(self):
        scope, child, job = self.scope, self.scope.child, self.job
        child.watching += 1
        try:
            if scope.mode is None:
                mode, kernels = Observers(), TritonWatch()
                mode.__enter__()
                scope.mode, self.outermost = mode, True
                kernels.__enter__()
                scope.kernels = kernels
            self.previous_trace = _gettrace()
            self.tracing = _settrace(child.ran.trace) is None  # the lines run, in every call (settrace returns None)
            self.previous = _getprofile()
            root = child.current_root
            # a call of a torch-only exercise: what it takes out of torch is counted, in every call alike
            host = HostBudget(child.guard, root, job.args, job.kwargs) if job is not None and root in TORCH_ONLY else None
            if job is not None:
                self.host_before, self.host_set, scope.mode.host = scope.mode.host, True, host
            self.prof = scope.hook(root, host)
            _setprofile(self.prof)
            if job is not None and job.device is not None:
                import torch

                self.device = torch.device(job.device)
                self.device.__enter__()
            if job is not None:
                scope.collect()
            rec = job.recording if job is not None else None
            if rec is not None:
                self.before = scope.mode.recordings
                rec.kernels = scope.kernels
                rec.start(collect=False)
                self.started = True
                scope.mode.recordings = self.before + (rec,)
                if not rec.light:
                    scope.profiles.append(rec.hook)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc):
        scope, child, job = self.scope, self.scope.child, self.job
        rec = job.recording if job is not None and self.started else None
        try:
            if rec is not None:
                if not rec.light and rec.hook in scope.profiles:
                    scope.profiles.remove(rec.hook)
                scope.mode.recordings = self.before
                rec.stop()
            if self.device is not None:
                self.device.__exit__(None, None, None)
            if self.host_set and scope.mode is not None:
                if scope.mode.host is not None:
                    scope.mode.host.close()  # torch's wrappers must still be in place at the call's end
                scope.mode.host = self.host_before
            if self.prof is not None:
                if _getprofile() is not self.prof:
                    child.guard.flag(child.current_root, "switched off the grader's watch of its calls (sys.setprofile)")
                    if rec is not None:
                        rec.obs.ops[WATCH_REMOVED] += 1
                _setprofile(self.previous)
            if self.tracing:
                if _gettrace() is not child.ran.trace:
                    child.guard.flag(child.current_root, "switched off the grader's record of which lines ran "
                                                         "(sys.settrace)")
                _settrace(self.previous_trace)
        finally:
            if self.outermost:
                mode, kernels = scope.mode, scope.kernels
                scope.mode = scope.kernels = None
                try:
                    if kernels is not None:
                        kernels.__exit__(None, None, None)
                        if any(_TRITON_REPLACED in p for p in kernels.problems):
                            child.guard.flag(child.current_root, f"the grader's {_TRITON_REPLACED} during the call")
                finally:
                    try:
                        _pop_to(mode)
                        mode.__exit__(None, None, None)
                    except Exception:  # noqa: BLE001  (the stack popped by the notebook's code: a verdict already)
                        pass
            child.watching -= 1
        return False


def _pop_to(mode) -> None:
    """Modes the notebook's code pushed and left on the stack above ours go: the next call starts as every other."""
    import torch
    from torch.utils import _python_dispatch as pd

    while torch._C._len_torch_dispatch_stack() > 1 and pd._get_current_dispatch_mode() is not mode:
        pd._pop_mode()


class Calls:
    """The requests that call the notebook's code (`CALLS`), each call made from the one line in `run`."""

    def __init__(self, child):
        self.child = child
        self.scope = Scope(child)
        child.ran = LinesRun(child)  # which lines of the cells run for each exercise (grader.ran)

    def run(self, op, target, args):
        jobs, reply = self._plan(op, target, args)
        with self.scope.entry(batch=len(jobs) > 1):  # a batch's calls share the mode, the watch and the profiler
            for job in jobs:
                if job.fn is None:
                    continue
                if job.setup is not None:
                    job.setup()
                with self.scope.entry(job):
                    try:
                        job.result = job.fn(*job.args, **job.kwargs)
                    except BaseException as e:  # (the notebook's code may raise anything)
                        if job.again is None or isinstance(e, KeyboardInterrupt):
                            raise
                        job.error = e
        return reply(jobs)

    def _plan(self, op, target, args):
        """([Job], how the reply is made of them) for request `op` on the notebook's callable `target`."""
        child = self.child
        if op == "map":
            return [Job(target, a, k) for a, k in args[0]], lambda jobs: [j.result for j in jobs]
        if op == "observe_many":
            calls, options = args
            jobs = []
            for a, k in calls:
                k = {**dict(k), **{key: v for key, v in dict(options).items() if str(key).startswith("_observe_")}}
                jobs += self._observed(target, tuple(a), k)
            return jobs, lambda jobs: [self._observed_reply(jobs[i], jobs[i + 1]) for i in range(0, len(jobs), 2)]
        if op == "on_device":  # checks.call_on_default_device: torch's default device set around the call only
            device, call_args, kwargs = args
            if device not in ("meta", "cpu"):
                raise ValueError(f"on_device: {device!r} is not a default device a check sets")
        else:
            call_args, kwargs = args
            device = None
        before = child._snapshot(call_args, kwargs)
        if op == "observe":
            jobs = self._observed(target, call_args, kwargs)
            return jobs, lambda jobs: (*self._observed_reply(*jobs), child._copied(call_args, kwargs, before))
        if op == "metered":
            job = Job(target, call_args, kwargs, Recording(meter_only=True))
            return [job], lambda jobs: (job.result, int(job.recording.meter.peak), child._copied(call_args, kwargs, before))
        job = Job(target, call_args, kwargs, device=device)
        return [job], lambda jobs: (job.result, child._copied(call_args, kwargs, before))

    def _observed(self, target, args, kwargs: dict) -> list[Job]:
        """An observed call and its second run (a `Job` that calls nothing when there is none)."""
        child = self.child
        rec = Recording.for_call(args, kwargs, target)  # (`_observe_held`: what `target` keeps, after the call)
        running = other_threads()  # started before the call (at load, say) and still there: a worker
        if running:
            child.guard.flag(child.current_root, f"had {running} thread(s) of its own running when it was observed: "
                                                 f"{ELSEWHERE}")
        job = Job(target, args, kwargs, rec)
        # none for a scaled run (it differs by design), a light one (one of a check's every-call observations) or a
        # call made by a check's own wrapper that is itself observed (`grader.proxy`)
        again = Rerun.of(target, args, kwargs) if rec.again else None
        if again is not None:
            again.accept = getattr(rec, "accept", None)
        second = again.job() if again is not None else Job(None)
        second.again = again
        return [job, second]

    def _observed_reply(self, job: Job, second: Job):
        """(result, observation as data) of an observed call; what it did wrong is flagged at once."""
        child, rec = self.child, job.recording
        root = child.current_root
        obs = rec.observation(job.result)
        if obs.ops.get(WATCH_REMOVED):
            child.guard.flag(root, "switched off the grader's watch of its calls while it was observed")
        if obs.ops.get(DISPATCH_OFF):
            child.guard.flag(root, "ran code with torch's dispatch to the checks' observers switched off (the Python "
                                   "dispatch key excluded or dropped): what ran then went unseen")
        own = sorted(k.split()[-1] for k in obs.ops if k.startswith(OWN_OPERATOR + " "))
        if own:
            child.guard.flag(root, f"ran an operator it registered itself ({', '.join(own[:3])}, torch.library): what "
                                   f"its kernel computes is out of the checks' sight")
        child.lib_seen.setdefault(root, set()).update(obs.lib_calls)
        if second.again is not None:
            why = second.again.differs(job.result, second)
            if why:
                child.guard.flag(root, why)
        return job.result, to_wire(obs)


# --- the second run ----------------------------------------------------------------------------------------------

class Rerun:
    """The second run of an observed call (module docstring): `of` copies what it needs before the call, `job` is
    the call made again, `differs` compares."""

    def __init__(self, fn, args, kwargs, rng, what):
        self.fn, self.args, self.kwargs, self.rng, self.what = fn, args, kwargs, rng, what
        self.accept = None  # ints any correct answer may be (a pool's free blocks): both runs in it is the same

    @classmethod
    def of(cls, target, args, kwargs) -> Rerun | None:
        """None when the call cannot be made again unseen: an argument or its object holds something that cannot
        be copied without running the notebook's code or calling the trusted side (a check's model or spy), or
        its callable is not the notebook's function, method, class or callable object."""
        import random

        import torch

        copier = _Copier()
        try:
            if issubclass(type(target), (types.FunctionType, type)):
                fn, what = target, "its arguments"
            elif type(target) is types.MethodType and issubclass(type(target.__self__), type):
                fn, what = target, "its arguments"  # a classmethod: its class is not copied
            elif type(target) is types.MethodType and type(target.__func__) is types.FunctionType:
                fn, what = types.MethodType(target.__func__, copier.copy(target.__self__)), "its arguments and its object"
            elif _instance(type(target)) and callable(target):
                fn, what = copier.copy(target), "its arguments and the object"
            else:
                return None
            args, kwargs = copier.copy(tuple(args)), copier.copy(dict(kwargs))
        except _NotCopied:
            return None
        return cls(fn, args, kwargs, (torch.get_rng_state(), random.getstate(), _numpy_state()), what)

    def job(self) -> Job:
        job = Job(self.fn, self.args, self.kwargs)
        job.setup = self.restore
        return job

    def restore(self) -> None:
        """The random states the observed call started with."""
        import random

        import torch

        torch.set_rng_state(self.rng[0])
        random.setstate(self.rng[1])
        _numpy_state(self.rng[2])

    def differs(self, result, second: Job) -> str:
        if second.error is not None:
            return (f"raised {type(second.error).__name__} when called a second time, the same way, on copies of "
                    f"{self.what} (an observed call is made again to see that)")
        if self.accept is not None and all(type(r) is int and r in self.accept for r in (result, second.result)):
            return ""
        if not _same(result, second.result):
            return (f"returned other values when called a second time, the same way, on copies of {self.what}: a "
                    f"result may depend only on the arguments, the object and the random state it is given (the "
                    f"checks make an observed call again to see that), not on the calls made before")
        return ""


class _NotCopied(Exception):
    pass


_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class made by a class statement (not one of C's)


def _instance(cls) -> bool:
    """Whether an object of `cls` keeps its state where `_Copier` can copy it: every class in its MRO but `object`
    made by a class statement (no C state: random.Random, numpy's generators), and not a trusted side's proxy."""
    return (cls is not object and all(c is object or c.__flags__ & _HEAPTYPE for c in cls.__mro__)
            and cls.__name__ != "_ParentProxy" and not issubclass(cls, (BaseException, type)))


_ATOMS = (type(None), bool, int, float, complex, str, bytes, range, type(Ellipsis), slice)
_SHARED = (types.FunctionType, types.BuiltinFunctionType, types.ModuleType, type, types.MethodWrapperType)
_COPY_LIMIT = 512 << 20  # bytes of tensors and arrays copied for one second run


class _Copier:
    """A deep copy that runs none of the notebook's code: tensors (views keep sharing a copied storage), numpy
    arrays, generators, Python's containers (dict keys and set items: plain values only, whose hashing runs no
    code), and objects of classes made by class statements, whose `__dict__` and slots are read and written through
    the descriptors of `object` (no `__getattr__`, `__setattr__`, `__deepcopy__`, `__reduce__`, `__init__`).
    Functions, classes and modules are shared. Anything else raises `_NotCopied`."""

    def __init__(self):
        self.memo: dict = {}
        self.storages: dict = {}
        self.bytes = 0

    def copy(self, v, depth=0):
        if type(v) in _ATOMS:
            return v
        done = self.memo.get(id(v))
        if done is not None:
            return done[1]
        if depth > 50:
            raise _NotCopied("too deep")
        out = self._copy(v, depth + 1)
        self.memo[id(v)] = (v, out)  # `v` kept alive: its id is not reused while copying
        return out

    def _count(self, nbytes) -> None:
        self.bytes += nbytes
        if self.bytes > _COPY_LIMIT:
            raise _NotCopied("too large")

    def _copy(self, v, depth):  # one case per kind of value
        import collections

        import torch

        t = type(v)
        if t in (torch.dtype, torch.device, torch.Size, torch.layout, torch.memory_format) or issubclass(t, _SHARED):
            return v
        if t in (torch.Tensor, torch.nn.Parameter):
            return self._tensor(v, t)
        if t is torch.Generator:
            g = torch.Generator(device=v.device)
            g.set_state(v.get_state())
            return g
        if t.__module__ == "numpy" and hasattr(v, "copy") and not getattr(getattr(v, "dtype", None), "hasobject", True):
            self._count(int(getattr(v, "nbytes", 0)))
            return v.copy()
        if t in (list, tuple, set, frozenset):
            if t in (set, frozenset) and not all(_key(x) for x in v):
                raise _NotCopied("a set of objects")
            return t(self.copy(x, depth) for x in v)
        if t is collections.deque:
            return collections.deque((self.copy(x, depth) for x in v), v.maxlen)
        if t in (dict, collections.OrderedDict, collections.Counter, collections.defaultdict):
            if not all(_key(k) for k in v):
                raise _NotCopied("a dict keyed by objects")
            if t is collections.OrderedDict:  # its order is its own, not the dict's (move_to_end), and so is its
                return t((k, self.copy(x, depth)) for k, x in t.items(v))  # list: dict.update would bypass it
            items = [(k, self.copy(x, depth)) for k, x in dict.items(v)]
            out = t(v.default_factory) if t is collections.defaultdict else t()
            dict.update(out, items)
            return out
        if t is types.MethodType and type(v.__func__) is types.FunctionType:
            owner = v.__self__
            return types.MethodType(v.__func__, owner if issubclass(type(owner), type) else self.copy(owner, depth))
        if _instance(t):
            return self._object(v, t, depth)
        raise _NotCopied(t.__name__)

    def _tensor(self, v, t):
        import torch

        with torch.no_grad():
            if v.device.type == "meta" or v.layout != torch.strided or v.is_quantized:
                out = v.detach().clone()
            else:
                storage = v.untyped_storage()
                key = (storage.data_ptr(), storage.nbytes())
                copied = self.storages.get(key)
                if copied is None:
                    self._count(storage.nbytes())
                    copied = self.storages[key] = (storage, storage.clone())
                out = torch.empty(0, dtype=v.dtype, device=v.device).set_(copied[1], v.storage_offset(), v.shape,
                                                                         v.stride())
        if t is torch.nn.Parameter:
            return torch.nn.Parameter(out, requires_grad=v.requires_grad)
        return out.requires_grad_(v.requires_grad) if v.is_leaf else out

    def _object(self, v, t, depth):
        try:
            out = object.__new__(t)
        except TypeError:
            raise _NotCopied(t.__name__) from None
        self.memo[id(v)] = (v, out)  # before its state: an object that refers to itself
        getter = _dict_descriptor(t)
        if getter is not None:
            state = getter.__get__(v, t)
            if not all(type(k) is str for k in state):
                raise _NotCopied("an attribute that is not a name")
            getter.__get__(out, t).update({k: self.copy(x, depth) for k, x in list(state.items())})
        for cls in t.__mro__:
            slots = cls.__dict__.get("__slots__", ())
            for name in ([slots] if isinstance(slots, str) else slots):
                member = cls.__dict__.get(name)
                if type(member) is not types.MemberDescriptorType:
                    continue
                try:
                    value = member.__get__(v, t)
                except AttributeError:
                    continue
                member.__set__(out, self.copy(value, depth))
        return out


def _dict_descriptor(cls):
    """The C descriptor of `__dict__` for `cls`'s instances (None: they have no `__dict__`); a class that puts
    something of its own there cannot be copied unseen."""
    for c in cls.__mro__:
        found = c.__dict__.get("__dict__")
        if found is not None:
            if type(found) is not types.GetSetDescriptorType:
                raise _NotCopied("a class with its own __dict__")
            return found
    return None


def _key(k) -> bool:
    """A value whose hashing and comparing run none of the notebook's code."""
    import torch

    return type(k) in _ATOMS or type(k) in (torch.dtype, torch.device) or (type(k) is tuple and all(_key(x) for x in k))


def _numpy_state(state=None):
    np = sys.modules.get("numpy")
    if np is None:
        return None
    if state is None:
        return np.random.get_state()
    np.random.set_state(state)
    return None


def _same(a, b) -> bool:
    """Bit-for-bit equality of two results (tensors, arrays, numbers, and containers of them); objects of the
    notebook's are judged by the checks, here only by their class."""
    import torch

    ta, tb = issubclass(type(a), torch.Tensor), issubclass(type(b), torch.Tensor)  # (no `__class__` of theirs read)
    if ta or tb:
        if not (ta and tb):
            return False
        if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
            return False
        if a.device.type == "meta":
            return True
        with torch.no_grad():
            x, y = a.detach().contiguous().reshape(-1).cpu(), b.detach().contiguous().reshape(-1).cpu()
            if x.dtype == torch.bool:
                return torch.equal(x, y)
            if a.device.type != "cpu" and x.is_floating_point():  # GPU kernels may use atomics: not bit-stable
                return bool(torch.allclose(x, y, rtol=1e-5, atol=1e-6, equal_nan=True))
            return torch.equal(x.view(torch.uint8), y.view(torch.uint8))
    if type(a).__module__ == "numpy" and hasattr(a, "tobytes"):
        return type(b) is type(a) and getattr(a, "shape", None) == getattr(b, "shape", None) and a.tobytes() == b.tobytes()
    if type(a) in (list, tuple):
        return type(b) is type(a) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if type(a) is dict:
        return type(b) is dict and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if type(a) is float and type(b) is float:
        return a == b or (a != a and b != b)
    if type(a) in (bool, int, str, bytes, type(None), complex):
        return type(b) is type(a) and a == b
    return type(a) is type(b)
