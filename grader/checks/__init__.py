"""The milestone checks, one module per week, and what they share.

Three rules every week's checks follow (see docs/authoring-a-week.md, "Checks that only the technique passes"):

1. **Data in, data out.** A check calls the student's functions (or constructs the student's classes and calls
   their methods) only with plain data — tensors, numbers, strings, tuples, lists, dicts — and judges only the
   data they return. That is what lets the grader run the student's code in another process than the check.
2. **Randomized, reproducible inputs.** Inputs come from `generator(...)`, seeded from `run_seed()`: a fresh
   seed per run (so a lookup table of inputs fails), printed in every failure (so a student can reproduce it
   with `INFERENCE_LAB_SEED=<seed> pytest weeks/NN`). The run's seed never reaches the student's process: each
   generator's seed is drawn from it one-way (`grader.seeds`), and a generator handed to the student's code
   crosses as another one, seeded one-way from it (`grader.wire.handed_generator_seed`).
3. **The technique, not just the numbers.** Where an exercise forbids a route (calling the library op or lib's
   reference, materializing what the technique avoids), the check runs the student's function under
   `observe(...)` and judges what it did: the aten ops it called, the matmul shapes, FLOPs, peak tensor
   bytes, and which `lib` functions ran.
4. **Judge what you observe.** Every number a check grades comes from a call whose route was observed in that
   same call: `got, obs = observe(fn, ...)`, then judge `got` *and* `obs` — never `_, obs = observe(...)` beside a
   separate, unobserved call whose result is graded. Where a check needs many calls, `observe_many` observes
   them all in one round trip. The student's process runs every call of the notebook's code under the same
   dispatch mode, profiler and meters, observed or not (grader/child_observe.py), so no query tells its code
   which call is observed — except the time recording takes, which is why an unobserved result must not count.
   An observed call is made a second time on copies of its arguments (and of its object, for a method or a
   callable object) and must return the same bits (a result may not depend on how many calls came before).
"""
from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from grader.observe import (INPUTS_WRITTEN, PREMADE_WRITTEN, UNRECORDED, Observation, OpRecorder,  # noqa: F401  (re-exported)
                            argument_storages, observe)
from grader.seeds import derived_seed, run_seed  # the checks import both from here

_OPTIONS = ("_observe_reads", "_observe_dot_scale", "_observe_light", "_observe_host")

_LIB_DIR = str(Path(__file__).resolve().parent.parent.parent / "lib") + os.sep


def generator(offset: int = 0, device: str | torch.device = "cpu") -> torch.Generator:
    """A torch.Generator seeded from this run's seed and `offset` (so two cases of one check differ), one-way: from
    one generator's seed or draws nothing follows about another's."""
    return torch.Generator(device=device).manual_seed(derived_seed("generator", offset))


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


class ModelMeter(TorchFunctionMode):
    """The work a check's model does while the student's code runs it, counted in this process (where the model
    lives) however the code reaches it: `model(...)`, `model.forward(...)`, a submodule or a submodule's
    `forward`. Nothing is attached to the model, so the code sees the very object it would see anywhere else.

        with ModelMeter(model) as seen:
            generate(model, ids, n)
        seen.calls   # tokens per sequence of each embedding lookup of the model's own (one per forward)
        seen.tokens  # tokens embedded in all (every sequence)
        seen.flops   # FLOPs of the products with the model's weights (2 * rows * in * out each)

    Only this process's work: code that copies the weights out and computes elsewhere is for `observe` to see."""

    def __init__(self, model):
        super().__init__()
        self.weights = {p.untyped_storage().data_ptr() for p in model.parameters() if p.device.type != "meta"}
        self.calls: list[int] = []
        self.tokens = 0
        self.flops = 0

    def _mine(self, w) -> bool:
        return isinstance(w, torch.Tensor) and w.device.type != "meta" and w.untyped_storage().data_ptr() in self.weights

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear and len(args) + len(kwargs) >= 2:
            x, w = args[0] if args else kwargs.get("input"), args[1] if len(args) > 1 else kwargs.get("weight")
            if self._mine(w) and isinstance(x, torch.Tensor) and x.dim():
                self.flops += 2 * (x.numel() // max(1, x.shape[-1])) * w.numel()
        elif func is F.embedding and len(args) + len(kwargs) >= 2:
            ids, w = args[0] if args else kwargs.get("input"), args[1] if len(args) > 1 else kwargs.get("weight")
            if self._mine(w) and isinstance(ids, torch.Tensor):
                self.calls.append(int(ids.shape[-1]) if ids.dim() else 1)
                self.tokens += ids.numel()
        return func(*args, **kwargs)


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


def observe_many(fn, calls, **options) -> list[tuple[object, Observation]]:
    """`[observe(fn, *args, **kwargs, **options) for args, kwargs in calls]`, in one round trip when `fn` lives in
    another process: every call observed (rule 4), each with its own Observation, each made a second time unless
    `_observe_light=True` (cheaper: no profiler, no second run; for thousands of small calls). `options`: the
    `_observe_*` keywords of `observe`. Arguments are copied for each call, as by `call_many`."""
    unknown = sorted(set(options) - set(_OPTIONS))
    if unknown:
        raise TypeError(f"observe_many: unknown options {unknown}; it takes {_OPTIONS}")
    calls = [(tuple(a), dict(k)) for a, k in calls]
    remote = getattr(fn, "__observe_many__", None)
    if remote is not None:
        return remote(calls, options)
    return [observe(fn, *a, **{**k, **options}) for a, k in calls]


def call_many_observing(fn, calls, observed, **options):
    """`call_many(fn, calls)`, but the calls whose indices are in `observed` run under `observe(fn, ..., **options)`,
    in their place in the order: returns (results in call order, {index: Observation}). For a check that judges
    many calls and observes some of them, chosen at random, whose results it counts with the others' (a check
    judges what it observed; it never throws an observed result away)."""
    calls = [(tuple(a), dict(k)) for a, k in calls]
    results, observations, start = [], {}, 0
    for i in sorted(set(observed)):
        results += call_many(fn, calls[start:i]) if i > start else []
        a, k = calls[i]
        result, observations[i] = observe(fn, *a, **k, **options)
        results.append(result)
        start = i + 1
    results += call_many(fn, calls[start:]) if start < len(calls) else []
    return results, observations


# --- the routes a check rejects, and device hygiene -----------------------------------------------------------

def assert_classified(obs: Observation, what: str, allowed: tuple[str, ...] = ()) -> None:
    """Reject a call that ran an aten op the observer cannot classify (`grader.op_table`: neither known to combine
    nothing nor a reduction or matrix product whose extent it measures), unless its name starts with one of
    `allowed`: what such an op combined went unmeasured, so a route check would pass on what it did not see. Also
    any op the observers failed to record (`grader.observe.UNRECORDED`: a sparse result, a storage-less subclass)."""
    failed = sorted(k[len(UNRECORDED) + 1:] for k in obs.ops if k.startswith(UNRECORDED + " "))
    assert not failed, (
        f"{what}: ran {failed[0]}{f' (and {len(failed) - 1} more)' if len(failed) > 1 else ''} on arguments the "
        f"checks cannot record (a sparse tensor, a tensor subclass without storage, ...): what it did went unseen. "
        f"Use ordinary dense tensors")
    unknown = [op for op in obs.unclassified if not (allowed and op.startswith(allowed))]
    assert not unknown, (
        f"{what}: used {unknown[0]}{f' (and {len(unknown) - 1} more)' if len(unknown) > 1 else ''}, which the checks "
        f"cannot classify: compute it with elementwise ops, reductions (sum, amax, ...), matmuls and indexing, "
        f"whose extents the checks measure")


def assert_route(obs: Observation, what: str, lib_allowed: tuple[str, ...] = (), forbidden_ops: tuple[str, ...] = (),
                 max_extent: int | None = None, why: str = "", min_flops: int = 0,
                 unclassified_allowed: tuple[str, ...] = ()) -> None:
    """Reject a result computed by a forbidden route: a `lib` function other than `lib_allowed` ran, an aten op
    starting with one of `forbidden_ops` was called, or (with `max_extent`) a matmul or a reduction spanned more
    than `max_extent` elements (a full row or a full score matrix where the technique works in blocks). With
    `min_flops`: the matrix products torch counted must reach it (the work the technique does at the least), so
    that a result computed out of the observer's sight (numpy, Python arithmetic) is not judged by what it saw.
    Always: every op that ran is one the observer classifies (`assert_classified`), but those starting with one of
    `unclassified_allowed`."""
    if min_flops:
        assert obs.flops >= min_flops, (
            f"{what}: torch's FlopCounterMode counted {obs.flops:,} FLOPs of matrix products; the technique does at "
            f"least {min_flops:,}. The rest ran where the checks cannot see it (numpy, Python arithmetic): compute "
            f"with torch ops on the inputs, block by block.")
    lib = obs.lib_calls_except(*lib_allowed)
    assert not lib, (f"{what}: your code called the lab's reference {lib}; the exercise is to write it yourself "
                     f"(from lib import ... of the same function is not allowed here)")
    ops = obs.called(*forbidden_ops) if forbidden_ops else []
    assert not ops, f"{what}: your code called {ops}, which this exercise asks you to do without. {why}".rstrip()
    assert_classified(obs, what, unclassified_allowed)
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
    except Exception:  # noqa: BLE001  (any other failure on meta is not judged: see the docstring)
        pass
