"""The milestone checks, one module per week, and what they share.

Three rules every week's checks follow (see docs/authoring-a-week.md, "Checks that only the technique passes"):

1. **Data in, data out.** A check calls the student's functions (or constructs the student's classes and calls
   their methods) only with plain data — tensors, numbers, strings, tuples, lists, dicts — and judges only the
   data they return. That is what lets the grader run the student's code in another process than the check.
2. **Randomized, reproducible inputs.** Inputs come from `generator(...)`, seeded from `run_seed()`: a fresh
   seed per run (so a lookup table of inputs fails), printed in every failure (so a student can reproduce it
   with `INFERENCE_LAB_SEED=<seed> pytest weeks/NN`).
3. **The technique, not just the numbers.** Where an exercise forbids a route (calling the library op or lib's
   reference, materializing what the technique avoids), the check runs the student's function under
   `observe(...)` and judges what it did: the aten ops it called, the matmul shapes, FLOPs, peak tensor
   bytes, and which `lib` functions ran.
"""
from __future__ import annotations

import os
import random
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch

_LIB_DIR = str(Path(__file__).resolve().parent.parent.parent / "lib") + os.sep
_SEED: int | None = None


def run_seed() -> int:
    """This run's seed: `INFERENCE_LAB_SEED` if set, else drawn once per process (and kept for the run)."""
    global _SEED
    if _SEED is None:
        env = os.environ.get("INFERENCE_LAB_SEED")
        _SEED = int(env) if env not in (None, "") else random.SystemRandom().randrange(1, 2**31 - 1)
    return _SEED


def generator(offset: int = 0, device: str | torch.device = "cpu") -> torch.Generator:
    """A torch.Generator seeded from this run's seed (+ `offset`, so two cases of one check differ)."""
    return torch.Generator(device=device).manual_seed(run_seed() + offset)


def seed_note() -> str:
    """Appended to failure messages: how to rerun with the same inputs."""
    return f"[inputs drawn with seed {run_seed()}; rerun with INFERENCE_LAB_SEED={run_seed()} to reproduce]"


def assert_close(got, want, what: str, atol: float, rtol: float = 0.0, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None) -> None:
    """`got` is a finite tensor of `want`'s shape (and `dtype`/`device`, default `want`'s), within atol + rtol·|want|.

    Else an AssertionError that says which, with the run's seed."""
    assert isinstance(got, torch.Tensor), f"{what}: returned {type(got).__name__}, expected a torch.Tensor"
    assert tuple(got.shape) == tuple(want.shape), f"{what}: shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    want_dtype = dtype if dtype is not None else want.dtype
    assert got.dtype == want_dtype, f"{what}: dtype {got.dtype}, expected {want_dtype}"
    want_device = torch.device(device) if device is not None else want.device
    assert got.device.type == want_device.type, f"{what}: on device {got.device}, expected {want_device}"
    assert torch.isfinite(got).all(), (f"{what}: contains NaN or inf (in a softmax, a row that has seen only "
                                       f"-inf gives exp(-inf - -inf) = NaN) {seed_note()}")
    diff = (got.double() - want.double()).abs()
    allowed = atol + rtol * want.double().abs()
    if not bool((diff <= allowed).all()):
        worst = (diff - allowed).argmax()
        err = diff.flatten()[worst].item()
        raise AssertionError(f"{what}: differs from the reference by {err:.3g} at flat index {worst.item()} "
                             f"(allowed {atol:g} + {rtol:g}·|reference|) {seed_note()}")


# --- observing how a result was computed ---------------------------------------------------------------------

@dataclass
class Observation:
    """What one call did. `ops`: aten op name -> count; `matmuls`: (shape of a, shape of b) of every mm/bmm/
    matmul-like op; `flops`: FLOPs counted by torch's FlopCounterMode; `peak_bytes`: peak tensor bytes
    allocated during the call (inputs excluded); `lib_calls`: qualified names of `lib` functions that ran
    (recognised by `grader.fingerprint`: lib's bytecode counts wherever it was loaded from), and of the
    oracles' (`grader.fingerprint.ORACLE_MODULES`, e.g. "gguf.quants.dequantize"), recognised the same way."""
    ops: Counter = field(default_factory=Counter)
    matmuls: list = field(default_factory=list)
    flops: int = 0
    peak_bytes: int = 0
    lib_calls: set = field(default_factory=set)
    reductions: list = field(default_factory=list)  # (op name, input shape, reduced extent) of every reduction

    def called(self, *prefixes: str) -> list[str]:
        """The aten ops called whose names start with any of `prefixes` (e.g. "aten._scaled_dot_product")."""
        return sorted(op for op in self.ops if op.startswith(prefixes))

    def max_matmul_inner(self) -> int:
        """The largest contraction length of any matmul seen (e.g. the key-axis extent of P @ V)."""
        return max((a[-1] for a, _ in self.matmuls), default=0)

    def max_matmul_outer(self) -> int:
        """The largest output-column count of any matmul seen (e.g. the key-axis extent of Q @ K^T)."""
        return max((b[-1] for _, b in self.matmuls), default=0)

    def max_matmul_dim(self) -> int:
        """The largest row, column or contraction length of any matmul seen (batch dims excluded): a tiled
        attention keeps it <= max(block_q, block_k, head_dim) whichever way round it multiplies."""
        return max((max(a[-2:] + b[-2:]) for a, b in self.matmuls), default=0)

    def max_reduction_extent(self) -> int:
        """The most elements any one reduction (sum, amax, max, logsumexp, softmax, mean, ...) combined per
        output element: a chunked softmax keeps it <= the chunk size, a full-row softmax makes it the row length."""
        return max((extent for _, _, extent in self.reductions), default=0)

    @property
    def inputs_written(self) -> int:
        """How many ops wrote into the storage of a tensor argument of the observed call (in place, `out=`, or
        through a view of it). Kept among `ops` under a name no aten op has, so it crosses the isolation as data."""
        return self.ops.get(INPUTS_WRITTEN, 0)

    @property
    def premade_bytes(self) -> int:
        """Bytes of buffers made before the call (neither arguments nor allocated during it: a workspace made when
        the cell ran, a global) that the call wrote into — by `out=`, in place, or through a view — counted as
        each buffer's high-water mark. Allocation that `peak_bytes` cannot see. Kept among `ops` like
        `inputs_written`."""
        return self.ops.get(PREMADE_WRITTEN, 0)

    def lib_calls_except(self, *allowed: str) -> list[str]:
        """The `lib` functions that ran, other than those whose qualified names start with any of `allowed`."""
        return sorted(c for c in self.lib_calls if c.startswith("lib.") and not (allowed and c.startswith(allowed)))




_REDUCTIONS = {"aten.sum", "aten.amax", "aten.amin", "aten.max", "aten.min", "aten.logsumexp", "aten._softmax",
               "aten._log_softmax", "aten.mean", "aten.prod", "aten.nansum", "aten.cumsum", "aten.logcumsumexp",
               "aten.norm", "aten.linalg_vector_norm", "aten.softmax", "aten.log_softmax"}


def _reduced_extent(args, kwargs) -> int | None:
    """How many elements a reduction op combines per output (None: not a reduction, e.g. max(a, b))."""
    x = args[0]
    if not isinstance(x, torch.Tensor) or x.dim() == 0:
        return None
    dims = args[1] if len(args) > 1 else (kwargs or {}).get("dim")
    if isinstance(dims, torch.Tensor):  # torch.max(a, b): elementwise
        return None
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return x.numel()
    dims = [dims] if isinstance(dims, int) else list(dims)
    extent = 1
    for d in dims:
        extent *= x.shape[d]
    return extent


INPUTS_WRITTEN = "<write into an argument>"  # the key of Observation.inputs_written in Observation.ops
PREMADE_WRITTEN = "<bytes written into buffers made before the call>"  # Observation.premade_bytes


def _tensors(values) -> list:
    """The tensors among `values` (one level into lists and tuples)."""
    out = []
    for v in values:
        out += [t for t in (v if isinstance(v, (list, tuple)) else [v]) if isinstance(t, torch.Tensor)]
    return out


def _ptr(t: torch.Tensor) -> int:
    return 0 if t.device.type == "meta" else t.untyped_storage().data_ptr()


def _span_end(t: torch.Tensor) -> int:
    """Bytes from the start of `t`'s storage to the end of the last element `t` covers."""
    if t.numel() == 0:
        return 0
    last = t.storage_offset() + sum((n - 1) * st for n, st in zip(t.shape, t.stride()) if n > 0)
    return (last + 1) * t.element_size()


class _OpRecorder(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self, obs: Observation, inputs: set[int] = frozenset()):
        super().__init__()
        self.obs = obs
        self.inputs = inputs  # data pointers of the observed call's tensor arguments' storages
        self.fresh: set[int] = set()  # storages that ops made during the call
        self.premade: dict[int, int] = {}  # storage made before the call -> high-water mark of the bytes written

    def _note_storages(self, func, args, kwargs, result) -> None:
        """Remember the storages this op made; note writes into storages made before the call."""
        seen = {_ptr(t) for t in _tensors(list(args) + list((kwargs or {}).values()))}
        lifted = func.overloadpacket is torch.ops.aten.lift_fresh if hasattr(func, "overloadpacket") else False
        for t in _tensors(result if isinstance(result, (list, tuple)) else [result]):
            p = _ptr(t)
            if p and (p not in seen or lifted):
                self.fresh.add(p)
        schema = getattr(func, "_schema", None)
        if schema is None or not schema.is_mutable:
            return
        values = list(zip(schema.arguments, args)) + [(a, (kwargs or {}).get(a.name)) for a in schema.arguments
                                                        if a.kwarg_only]
        for a, v in values:
            if a.alias_info is not None and a.alias_info.is_write and isinstance(v, torch.Tensor):
                p = _ptr(v)
                if p and p not in self.inputs and p not in self.fresh:
                    self.premade[p] = max(self.premade.get(p, 0), _span_end(v))

    def _writes_input(self, func, args, kwargs) -> bool:
        schema = getattr(func, "_schema", None)
        if not self.inputs or schema is None or not schema.is_mutable:
            return False
        values = list(zip(schema.arguments, args)) + [(a, (kwargs or {}).get(a.name)) for a in schema.arguments
                                                        if a.kwarg_only]
        return any(a.alias_info is not None and a.alias_info.is_write and isinstance(v, torch.Tensor)
                   and v.untyped_storage().data_ptr() in self.inputs for a, v in values)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket) if hasattr(func, "overloadpacket") else str(func)
        name = name if name.startswith("aten.") else f"aten.{name}"
        self.obs.ops[name] += 1
        if self._writes_input(func, args, kwargs):
            self.obs.ops[INPUTS_WRITTEN] += 1
        if name in ("aten.mm", "aten.bmm"):
            self.obs.matmuls.append((tuple(args[0].shape), tuple(args[1].shape)))
        elif name in ("aten.addmm", "aten.baddbmm"):
            self.obs.matmuls.append((tuple(args[1].shape), tuple(args[2].shape)))
        elif name == "aten.mv":
            self.obs.matmuls.append((tuple(args[0].shape), tuple(args[1].shape) + (1,)))
        elif name in ("aten.dot", "aten.vdot"):
            self.obs.matmuls.append(((1,) + tuple(args[0].shape), tuple(args[1].shape) + (1,)))
        elif name in _REDUCTIONS:
            extent = _reduced_extent(args, kwargs)
            if extent is not None:
                self.obs.reductions.append((name, tuple(args[0].shape), extent))
        result = func(*args, **(kwargs or {}))
        self._note_storages(func, args, kwargs, result)
        return result


class CountingModel:
    """Wraps a model and records how many tokens each forward call receives (to see that a cache is used, or
    how many positions a verify step sends); every other attribute is the model's."""

    def __init__(self, model):
        self._model = model
        self.calls: list[int] = []

    def __call__(self, input_ids, *args, **kwargs):
        self.calls.append(input_ids.shape[1])
        return self._model(input_ids, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._model, name)


def call_many(fn, calls):
    """`[fn(*args, **kwargs) for args, kwargs in calls]`, in one round trip when `fn` lives in another process.

    For statistical checks that call a small function thousands of times. Arguments are copied for each call
    (give each call its own `torch.Generator`; a shared one is not advanced between the calls)."""
    calls = [(tuple(a), dict(k)) for a, k in calls]
    remote = getattr(fn, "__map__", None)
    if remote is not None:
        out = remote(calls)
        if type(out) is not list or len(out) != len(calls):
            raise AssertionError("the student's process returned a malformed batch of results")
        return out
    return [fn(*a, **k) for a, k in calls]


def _storages(args, kwargs) -> set[int]:
    """Data pointers of the storages of the tensors among `args` and `kwargs` (one level into lists/tuples)."""
    found = set()
    for a in list(args) + list(kwargs.values()):
        for t in (a if isinstance(a, (list, tuple)) else [a]):
            if isinstance(t, torch.Tensor) and t.device.type != "meta" and t.untyped_storage().data_ptr():
                found.add(t.untyped_storage().data_ptr())
    return found


def observe(fn, *args, **kwargs):
    """Call `fn(*args, **kwargs)` and return `(result, Observation)`.

    A grader that runs student code in another process hands checks a proxy with an `__observe__` method;
    then the observation is made there, around the real call, and shipped back as data."""
    remote = getattr(fn, "__observe__", None)
    if remote is not None:
        return remote(args, kwargs)
    from torch.utils.flop_counter import FlopCounterMode

    from lib.io_model import TensorMemoryMeter

    obs = Observation()
    seen: set[str] = set()

    from grader.fingerprint import lib_name, oracle_name, warm

    warm()  # builds the tables of lib's (and the oracles') code before the code observed runs

    def profile(frame, event, arg):
        if event == "call":  # lib's (or an oracle's) code by file, or by fingerprint wherever it was loaded from
            name = lib_name(frame.f_code) or oracle_name(frame.f_code)
            if name is not None and not name.startswith("lib.io_model.TensorMemoryMeter"):  # the meter observing
                seen.add(name)

    flops = FlopCounterMode(display=False)
    meter = TensorMemoryMeter()
    previous = sys.getprofile()
    sys.setprofile(profile)
    recorder = _OpRecorder(obs, _storages(args, kwargs))
    try:
        with flops, meter, recorder:
            result = fn(*args, **kwargs)
    finally:
        sys.setprofile(previous)
    if recorder.premade:
        obs.ops[PREMADE_WRITTEN] = sum(recorder.premade.values())
    obs.flops = int(flops.get_total_flops())
    obs.peak_bytes = int(meter.peak)
    obs.lib_calls = seen
    return result, obs


# --- the routes a check rejects, and device hygiene -----------------------------------------------------------

def assert_route(obs: Observation, what: str, lib_allowed: tuple[str, ...] = (), forbidden_ops: tuple[str, ...] = (),
                 max_extent: int | None = None, why: str = "") -> None:
    """Reject a result computed by a forbidden route: a `lib` function other than `lib_allowed` ran, an aten op
    starting with one of `forbidden_ops` was called, or (with `max_extent`) a matmul or a reduction spanned more
    than `max_extent` elements (a full row or a full score matrix where the technique works in blocks)."""
    lib = obs.lib_calls_except(*lib_allowed)
    assert not lib, (f"{what}: your code called the lab's reference {lib}; the exercise is to write it yourself "
                     f"(from lib import ... of the same function is not allowed here)")
    ops = obs.called(*forbidden_ops) if forbidden_ops else []
    assert not ops, f"{what}: your code called {ops}, which this exercise asks you to do without. {why}".rstrip()
    if max_extent is not None:
        mm, red = obs.max_matmul_dim(), obs.max_reduction_extent()
        assert mm <= max_extent, (f"{what}: a matrix product of {mm} rows/columns ran, more than the {max_extent} "
                                  f"one block allows: work block by block, never on whole rows. {why}").rstrip()
        assert red <= max_extent, (f"{what}: a reduction (sum, max, softmax, logsumexp, ...) combined {red} elements "
                                   f"at once, more than the {max_extent} one block holds: reduce block by block and "
                                   f"keep running statistics. {why}").rstrip()


def call_on_default_device(fn, device: str, *args, **kwargs):
    """`fn(*args, **kwargs)` with torch's default device set to `device` ("meta") where `fn`'s code runs: in the
    student's process when `fn` is a proxy, else around the call. The arguments keep their devices.

    For code that reads its data (`.tolist()`, `.item()`), which `check_on_meta` cannot run: on real CPU inputs a
    tensor made without `device=` lands on `meta` and meets them, as it would land on the CPU beside CUDA inputs.
    Check-side objects the code calls (models behind spies) must make their own tensors under
    `with torch.device(...)` of their own when this runs in-process."""
    remote = getattr(fn, "__on_default_device__", None)
    if remote is not None:
        return remote(device, args, kwargs)
    with torch.device(device):
        return fn(*args, **kwargs)


def check_on_meta(fn, args: tuple, what: str, kwargs: dict | None = None) -> None:
    """Run `fn` on `meta`-device copies of the tensors in `args` (shapes, no data — like tensors on a GPU seen
    from a CPU-only machine). A tensor created without `device=` lands on the CPU and meets a meta tensor: torch
    raises a device mismatch, which fails the check. Any other failure on meta (an op without a meta kernel,
    `.item()` on data that isn't there) is not judged."""
    def to_meta(x):
        return x.to("meta") if isinstance(x, torch.Tensor) else x

    try:
        fn(*(to_meta(a) for a in args), **{k: to_meta(v) for k, v in (kwargs or {}).items()})
    except RuntimeError as e:
        msg = str(e)
        if "device" in msg and ("cpu" in msg or "meta" in msg):
            raise AssertionError(
                f"{what}: with its inputs on another device (here 'meta', as they would be on 'cuda'), your code "
                f"mixed in a CPU tensor: {msg.splitlines()[0]} — create every tensor on the inputs' device, e.g. "
                f"torch.arange(n, device=q.device)") from None
    except Exception:
        pass
