"""The dispatch mode every observed call runs under, and the meter of the memory its Python side holds.

`Observers` is one `TorchDispatchMode` whose handler runs each aten op the same way whether anything is recorded
or not, and hands the op, before and after it runs, to the recordings in effect (`grader.observe.Recording`:
ops, matmuls, reductions, FLOPs, tensor memory, reads). In the student's process it is pushed around *every* call
into the notebook's code (`grader.child_observe`), recording or not, so that the code cannot tell an observed call
from another by the dispatch stack, its depth, the modes' classes or the frames their handler runs in: only what
the recordings keep differs, and that is the grader's. Like FlopCounterMode (whose formulas the recordings use),
it runs an op that has a CompositeImplicitAutograd decomposition as that decomposition, under itself, so that the
products inside it are seen and counted (`aten.matmul` under `torch.inference_mode`, `aten.linear`, SDPA's math).

`HostMeter` measures what numpy and Python allocate during a call, by tracemalloc (any use of which by the
notebook's code is a verdict in the student's process).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_COMPOSITE_KEY = torch._C.DispatchKey.CompositeImplicitAutograd
# op's C++ handle (`_op`) -> (whether it runs as its CompositeImplicitAutograd decomposition, what runs it
# otherwise): fixed per op. Keyed by the handle, whose hash is C's: an OpOverload's own is Python code, which would
# run (and be profiled) on every op. An OpOverload runs through that handle too (what its `__call__` calls).
_PLAN: dict = {}
# Ops that hand a tensor's data to Python as a scalar (`item`, `float(t)`, `bool(t)`, `torch.equal`): what a call of a
# torch-only exercise takes out of torch (`grader.host_budget`), counted by `Observers.host`
_SCALAR_OPS = frozenset(op._op for op in (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.equal.default,
                                          torch.ops.aten.allclose.default, torch.ops.aten.is_nonzero.default))


def _plan(func) -> tuple:
    try:
        overload = isinstance(func, torch._ops.OpOverload)
        composite = (overload and func is not torch.ops.prim.device.default
                     and (_COMPOSITE_KEY in func.py_kernels
                          or torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), _COMPOSITE_KEY)))
        run = func._op if overload and type(func).__call__ is torch._ops.OpOverload.__call__ else func
    except Exception:  # noqa: BLE001  (an operator torch cannot describe is run as it is)
        composite, run = False, func
    key = getattr(func, "_op", None)
    if key is not None:
        _PLAN[key] = (composite, run)
    return composite, run


class Observers(TorchDispatchMode):
    """Runs every op, and tells `recordings` (objects with `before(func, args, kwargs)`, `after(func, args, kwargs,
    out, counted)` and `failed(func)`) about it. `counted` is False for a decomposed op, whose parts were counted
    themselves. What a recording raises is its own failure (`failed`), never the op's: a recorded call behaves as an
    unrecorded one (a tensor subclass whose storage cannot be read fails no op because it is observed)."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:  # see grader.observe._without_dynamo_import
        return False

    def __init__(self, recordings=()):
        super().__init__()
        self.recordings = tuple(recordings)
        self.host = None  # a call's `grader.host_budget.HostBudget`, while a call of a torch-only exercise runs

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        recordings = self.recordings
        if self.host is not None and getattr(func, "_op", None) in _SCALAR_OPS:
            self.host.scalar(func, args)
        for r in recordings:
            try:
                r.before(func, args, kwargs)
            except Exception:  # noqa: BLE001  (a recording never changes what the op does: noted, not raised)
                r.failed(func)
        try:
            composite, run = _PLAN[func._op]
        except (KeyError, AttributeError):  # (AttributeError: not an OpOverload)
            composite, run = _plan(func)
        if composite:
            with self:
                out = func.decompose(*args, **kwargs)
            if out is not NotImplemented:
                for r in recordings:
                    try:
                        r.after(func, args, kwargs, out, False)
                    except Exception:  # noqa: BLE001
                        r.failed(func)
                return out
        out = run(*args, **kwargs)
        if self.host is not None:
            self.host.op(func, args, kwargs, out)
        for r in recordings:
            try:
                r.after(func, args, kwargs, out, True)
            except Exception:  # noqa: BLE001
                r.failed(func)
        return out


def _observer_dirs() -> tuple:
    """Where the code of Python, the installed packages, torch and the grader is: code run while the observers'
    own dispatch handlers run (the mode stack popped) lives there, not in the notebook."""
    import site
    import sysconfig

    dirs = {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"], str(Path(torch.__file__).parent),
            str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent.parent / "lib" / "attn" / "io_model.py")}
    dirs.update(p for p in sys.path if p.endswith(("site-packages", "dist-packages")))
    try:
        dirs.update(site.getsitepackages())
    except AttributeError:
        pass
    return tuple(d.rstrip(os.sep) + (os.sep if not d.endswith(".py") else "") for d in dirs if d)


_OBSERVER_DIRS = _observer_dirs()


def observers_code(code, globals_: dict) -> bool:
    """Whether `code` is Python's, a package's, torch's or the grader's (not the observed code's): by its file, or,
    for a frozen module of Python's (abc, importlib), by its globals being that module's own."""
    if code.co_filename.startswith(_OBSERVER_DIRS):
        return True
    spec = globals_.get("__spec__")
    module = sys.modules.get(getattr(spec, "name", None) or "")
    return (code.co_filename.startswith("<frozen ") and module is not None and vars(module) is globals_
            and getattr(spec, "origin", None) == "frozen")


OUTSIDE_CODE: dict = {}  # code object -> whether it is the observed code's (not `observers_code`)


# Where the allocations of the observers (and of torch's own caches, which fill as ops are first seen) are made:
# whatever of theirs is alive when the call ends is not the call's (`HostMeter.stop`).
OBSERVERS = (str(Path(__file__).resolve().parent / "*"), str(Path(torch.__file__).resolve().parent / "*"),
             str(Path(__file__).resolve().parent.parent / "lib" / "attn" / "io_model.py"))


class HostMeter:
    """Peak bytes of the Python side's allocations during a call, by tracemalloc (numpy registers its arrays' data
    with it; torch's tensors are the other meter's). The call may not stop, clear or reset the tracing: a sentinel
    traced before the call must still be traced after it, and tracing must still be on (else None)."""

    def start(self, collect: bool = True) -> None:
        import gc
        import tracemalloc

        # Garbage left by earlier work (reference cycles) is freed whenever the collector next runs, which depends on
        # everything allocated before: collected now, the collections during the call depend on the call alone (an
        # honest call's peak once differed by 70 kB between two runs under load, failing a bound on its growth).
        # In the student's process every call starts with a collection (`grader.child_observe`), not only this one.
        if collect:
            gc.collect()
        self.tm, self.was_tracing = tracemalloc, tracemalloc.is_tracing()
        if not self.was_tracing:
            tracemalloc.start(1)
        self.sentinel = bytearray(64)  # allocated while tracing: traced
        tracemalloc.reset_peak()
        self.base = tracemalloc.get_traced_memory()[0]

    def stop(self) -> int | None:
        """The peak, less what the observers themselves still hold at the end (their records only grow during the
        call: the recorder's lists and sets, the FLOP counts), or None when the call stopped or cleared the tracing."""
        tm = self.tm
        if not tm.is_tracing() or tm.get_object_traceback(self.sentinel) is None:
            return None
        peak = tm.get_traced_memory()[1] - self.base
        ours = tm.take_snapshot().filter_traces([tm.Filter(True, pattern) for pattern in OBSERVERS])
        return max(0, peak - sum(stat.size for stat in ours.statistics("filename")))

    def close(self) -> None:
        if getattr(self, "tm", None) is not None and not self.was_tracing:
            self.tm.stop()
