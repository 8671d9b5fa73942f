"""Observing how a result was computed: the aten ops a call ran, its matmul shapes, FLOPs, peak tensor bytes,
the reductions and writes it made, and which of `lib`'s functions ran.

Below the sandbox's two sides on purpose: the checks call `observe(fn, ...)`, and when `fn` is a proxy of the
student's function the observation is made in the student's process (`grader.child` imports this module, which
needs nothing of the grader's but `grader.fingerprint`) and crosses back as data — `to_wire` and `from_wire` are
its one encoding. What is observed in the student's process is evidence, not proof (its code could forge it):
the checks judge results in the trusted process, and `grader.view` keeps the answers out of that process's reach.
"""
from __future__ import annotations

import os
import sys
from collections import Counter
from dataclasses import dataclass, field

import torch

from grader.fingerprint import lib_name, oracle_name, warm
from grader.held import held_bytes, touching  # (what `fn` keeps: `_observe_held`)
from grader.observers import OUTSIDE_CODE, HostMeter, Observers, observers_code
from grader.op_table import classify
from grader.reach import Reach
from grader.reads import ReadCounter, Visits, before_op, note_op
from grader.triton_watch import TritonWatch


@dataclass
class Observation:
    """What one call did. `ops`: aten op name -> count; `matmuls`: (shape of a, shape of b) of every matrix product
    (mm, bmm, a conv as its im2col product, cdist, ...: `grader.op_table`), a's last dim the contraction; `flops`:
    FLOPs counted by torch's FlopCounterMode; `peak_bytes`: peak tensor bytes allocated during the call (inputs
    excluded); `lib_calls`: qualified names of `lib` functions that ran
    (recognised by `grader.fingerprint`: lib's bytecode counts wherever it was loaded from), and of the
    oracles' (`grader.fingerprint.ORACLE_MODULES`, e.g. "gguf.quants.dequantize"), recognised the same way."""
    ops: Counter = field(default_factory=Counter)
    matmuls: list = field(default_factory=list)
    flops: int = 0
    peak_bytes: int = 0
    lib_calls: set = field(default_factory=set)
    reductions: list = field(default_factory=list)  # (op name, input shape, extent) of every reduction (op_table)
    reads: dict = field(default_factory=dict)  # argument position -> [mean reads of each slice along its dim 0]
    visits: dict = field(default_factory=dict)  # argument position -> `visits_of`'s list (grader.reads.Visits)
    reach: int = 0  # the most keys one read of K or V combined (`_observe_reach`, grader.reach)
    reach_splits: list = field(default_factory=list)  # (first, last, count) of the largest key sets combined (Reach.splits)
    # Triton kernels run by the interpreter (TRITON_INTERPRET=1) during the call: one (kernel name, grid) per
    # launch, and the (M, K, N) of every `tl.dot` its programs executed (a compiled GPU kernel is not seen).
    kernel_launches: list = field(default_factory=list)
    kernel_dots: list = field(default_factory=list)
    # And what those kernels read and wrote, against the call's arguments and results
    # (`grader.triton_watch.TritonWatch.summary`; empty when no kernel was interpreted).
    kernel: dict = field(default_factory=dict)
    # Peak bytes the call's Python side allocated (numpy arrays, lists: what tracemalloc traces, torch's tensors
    # not), beyond what it held when the call began: memory `peak_bytes` cannot see. Measured when the check asks
    # (`observe(..., _observe_host=True)`), else 0.
    host_peak_bytes: int = 0
    held_bytes: int = 0  # `_observe_held`: bytes reachable from the callable after the call (grader.held), else 0

    @property
    def all_peak_bytes(self) -> int:
        """Tensors and host objects both: a score matrix held as a numpy array counts as one held as a tensor."""
        return self.peak_bytes + self.host_peak_bytes

    def reads_of(self, position: int) -> list[float]:
        """For the tensor argument at `position` (asked for with `observe(..., _observe_reads=(position,))`): how
        many times each slice along its first dimension (a block of a pool, say) was read, as the mean over the
        slice's elements of the number of ops that read each element (views read nothing; an indexing op reads
        what it gathers; any other op reads each element of its view once)."""
        return list(self.reads.get(position, []))

    def visits_of(self, position: int) -> list[list[int]]:
        """For the tensor argument at `position` (asked for with `observe(..., _observe_reads=((position, dim),))`):
        per slice along `dim`, [the most visits, the fewest visits, the most terminal reads] of its elements
        (`grader.reads`: reads followed through copies, in visits: runs of reads no other read breaks)."""
        return [list(v) for v in self.visits.get(position, [])]

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

    def kernel_dot_flops(self) -> int:
        """FLOPs of the `tl.dot`s that interpreted Triton kernels executed during the call (2·M·K·N each)."""
        return sum(2 * m * k * n for m, k, n in self.kernel_dots)

    def max_kernel_dot_dim(self) -> int:
        """The largest M, K or N of any `tl.dot` an interpreted kernel ran: a tiled kernel keeps it <= max(blocks, d)."""
        return max((max(d) for d in self.kernel_dots), default=0)

    def max_reduction_extent(self) -> int:
        """The most elements any one reduction (sum, amax, softmax, a pool's window, a cumulative scan, a sort, a
        scatter-add's contributions to one slot, ...: `grader.op_table`) combined per output element: a chunked
        softmax keeps it <= the chunk size, a full-row softmax makes it the row length."""
        return max((extent for _, _, extent in self.reductions), default=0)

    @property
    def unclassified(self) -> list[str]:
        """The aten ops the call ran that `grader.op_table` cannot classify (neither known to combine nothing nor a
        reduction or matrix product it measures): what they combined went unmeasured. Kept among `ops`."""
        return sorted(k[len(UNCLASSIFIED) + 1:] for k in self.ops if k.startswith(UNCLASSIFIED + " "))

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




WATCH_REMOVED = "<the profiler watching the call was switched off>"  # counted among Observation.ops
INPUTS_WRITTEN = "<write into an argument>"  # the key of Observation.inputs_written in Observation.ops
PREMADE_WRITTEN = "<bytes written into buffers made before the call>"  # Observation.premade_bytes
# The observed code ran with torch's dispatch to the observers switched off: the Python dispatch key excluded or
# dropped (torch._C._DisableTorchDispatch, a dispatch-key guard, torch._C._dispatch_tls_set_dispatch_key_*, through
# functools.partial or not): whatever ran then went unseen. Counted among Observation.ops, one per builtin it called
# in that state. (A popped mode stack is the state inside the observers' own handlers, so it is not counted here:
# the functions that pop it, and torch.library's registrations, are grader.child_guard's verdicts.)
DISPATCH_OFF = "<code ran with the observers' dispatch switched off>"
# An operator registered after grader.observe was imported (torch.library: the observed code's own): the observers
# see the operator, not what its kernel runs.
OWN_OPERATOR = "<an operator of the observed code's own>"
# An op the observers could not record (their own code raised on its arguments: a tensor subclass without storage,
# say): counted among Observation.ops, the op itself ran as it would unobserved.
UNRECORDED = "<an op the observers could not record>"
# An op `grader.op_table` does not classify (neither known to combine nothing nor a reduction or matrix product it
# measures): counted among Observation.ops as f"{UNCLASSIFIED} aten.X" (Observation.unclassified).
UNCLASSIFIED = "<an op the observer cannot classify>"
_OPS_AT_START = frozenset(name.split(".")[0] for name in torch._C._dispatch_get_all_op_names())


def _dispatch_state() -> tuple:
    """What decides whether an op reaches the observers: the Python dispatch key included and not excluded in this
    thread, and how many dispatch modes are on the stack."""
    key = torch._C.DispatchKey.Python
    return (torch._C._dispatch_tls_is_dispatch_key_included(key), torch._C._dispatch_tls_is_dispatch_key_excluded(key),
            torch._C._len_torch_dispatch_stack())


def _tensors(values) -> list:
    """The tensors among `values` (one level into lists and tuples)."""
    out = []
    for v in values:
        out += [t for t in (v if issubclass(type(v), (list, tuple)) else [v]) if issubclass(type(t), torch.Tensor)]
    return out


def _ptr(t: torch.Tensor) -> int:
    return 0 if t.device.type == "meta" else t.untyped_storage().data_ptr()


def _span_end(t: torch.Tensor) -> int:
    """Bytes from the start of `t`'s storage to the end of the last element `t` covers."""
    if t.numel() == 0:
        return 0
    last = t.storage_offset() + sum((n - 1) * st for n, st in zip(t.shape, t.stride()) if n > 0)
    return (last + 1) * t.element_size()


class OpRecorder(torch.utils._python_dispatch.TorchDispatchMode):
    @classmethod
    def _should_skip_dynamo(cls) -> bool:  # see _without_dynamo_import
        return False

    def __init__(self, obs: Observation, inputs: set[int] = frozenset(), counted: dict | None = None,
                 visits: list | None = None, reach: Reach | None = None):
        super().__init__()
        self.reach = reach  # grader.reach.Reach over `visits`, or None
        self.visits, self.views = visits or [], {}  # grader.reads.Visits of arguments whose reads are followed
        self.obs = obs
        self.inputs = inputs  # data pointers of the observed call's tensor arguments' storages
        self.fresh: set[int] = set()  # storages that ops made during the call
        self.premade: dict[int, int] = {}  # storage made before the call -> high-water mark of the bytes written
        self.counted = counted or {}  # data pointer -> ReadCounter of an argument whose reads are counted

    def _note_reads(self, func, name, args, kwargs) -> None:
        schema = getattr(func, "_schema", None)
        if schema is None or any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns):
            return  # a view reads nothing
        written = {a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write}
        named = [a.name for a in schema.arguments]
        slots = list(enumerate(args)) + list((kwargs or {}).items())
        for position, v in slots:
            if (named[position] if isinstance(position, int) and position < len(named) else position) in written:
                continue  # the destination of a copy or an in-place op
            if isinstance(v, torch.Tensor) and v.device.type != "meta" and v.numel():
                counter = self.counted.get(v.untyped_storage().data_ptr())
                if counter is not None:
                    counter.note(func, name, args, kwargs, v, position)
            elif isinstance(v, (list, tuple)):  # cat, stack: each tensor read whole
                for t in v:
                    if isinstance(t, torch.Tensor) and t.device.type != "meta" and t.numel():
                        counter = self.counted.get(t.untyped_storage().data_ptr())
                        if counter is not None:
                            counter.note(func, "", (), {}, t, None)

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
        self.before(func, args, kwargs)
        result = func(*args, **(kwargs or {}))
        self.after(func, args, kwargs, result)
        return result

    @staticmethod
    def _name(func) -> str:
        name = str(func.overloadpacket) if hasattr(func, "overloadpacket") else str(func)
        return name if name.startswith("aten.") else f"aten.{name}"

    def before(self, func, args, kwargs) -> None:
        """Note an op about to run (`grader.observers.Observers` calls this, then the op, then `after`)."""
        name = self._name(func)
        self.obs.ops[name] += 1
        schema = getattr(func, "_schema", None)
        if schema is not None and schema.name not in _OPS_AT_START:
            self.obs.ops[OWN_OPERATOR] += 1
            self.obs.ops[f"{OWN_OPERATOR} {schema.name}"] += 1
        if self._writes_input(func, args, kwargs):
            self.obs.ops[INPUTS_WRITTEN] += 1
        self.visits and before_op(self.visits, schema, args)  # (where a resized tensor's elements were)

    def after(self, func, args, kwargs, result, counted: bool = True) -> None:
        """Note an op that ran. `counted` is False for an op the observers ran as its decomposition: its parts were
        noted themselves (what they read, multiplied and reduced), so it is not again."""
        self._note_storages(func, args, kwargs, result)
        if not counted:
            return
        name = self._name(func)
        if self.counted:
            with torch.utils._python_dispatch._disable_current_modes():
                self._note_reads(func, name, args, kwargs)
        self._classify(func, name, args, kwargs, result)
        if self.visits:
            with torch.utils._python_dispatch._disable_current_modes():
                self.reach and self.reach.before()
                note_op(self.visits, func, args, kwargs, result, self.views)
                self.reach and self.reach.after(func, args, kwargs, result)

    def _classify(self, func, name, args, kwargs, result) -> None:
        """The op's matmuls and reductions (`grader.op_table`), or, for an op the table does not know, its name
        among `Observation.unclassified`."""
        try:
            found = classify(name, func, args, kwargs, result)
        except (RuntimeError, TypeError, ValueError, IndexError, KeyError, AttributeError, ZeroDivisionError):
            found = None  # arguments the table's reading of the op did not expect: not classified
        if found is None:
            self.obs.ops[f"{UNCLASSIFIED} {name}"] += 1
            return
        self.obs.matmuls += found[0]
        self.obs.reductions += found[1]



def argument_storages(args, kwargs) -> set[int]:
    """Data pointers of the storages of the tensors among `args` and `kwargs` (one level into lists/tuples)."""
    found = set()
    for a in list(args) + list(kwargs.values()):
        for t in (a if type(a) in (list, tuple) else [a]):  # (type: no `__class__` of the notebook's objects read)
            if issubclass(type(t), torch.Tensor) and t.device.type != "meta" and t.untyped_storage().data_ptr():
                found.add(t.untyped_storage().data_ptr())
    return found


class Recording:
    """What one observed call does, recorded as it runs: each op before and after it runs (`grader.observers.
    Observers` hands them over: ops, matmuls, reductions, writes and reads by `OpRecorder`, FLOPs by
    FlopCounterMode's formulas, tensor memory by lib's meter), the profiler's events (`hook`: lib's functions, and
    code run with the observers' dispatch switched off), a Triton interpreter watch (`kernels`) and, where asked,
    tracemalloc. `observe` runs a call with one; in the student's process `grader.child_observe` starts and stops
    one inside the observers every call runs under, so that the observed call runs as any other does."""

    def __init__(self, args=(), kwargs=None, reads=(), dot_scale=1.0, light=False, host=False, meter_only=False,
                 reach=False):
        _, TensorMemoryMeter, formulas = _observer_classes()
        self.obs = obs = Observation()
        self.formulas = formulas  # the formulas as they were before the observed code could change them
        self.flops = 0
        self.meter = TensorMemoryMeter()
        self.meter_only = bool(meter_only)  # a `metered` call: tensor memory only
        self.light = bool(light) or self.meter_only  # no profiler: lib's functions are not named (cheaper)
        self.dot_scale = float(dot_scale)
        # Host memory too (`Observation.host_peak_bytes`): tracemalloc slows Python-heavy code several-fold, so only
        # where a check bounds memory that numpy could hold instead of torch.
        self.host = HostMeter() if host and not self.light else None
        counted, self.reading, self.visits = {}, {}, {}
        for i in reads:
            if type(i) in (tuple, list):  # (position, dim): followed through copies, in visits (grader.reads)
                i, dim = int(i[0]), int(i[1])
                if issubclass(type(args[i]), torch.Tensor) and args[i].device.type != "meta" and args[i].numel():
                    self.visits[i] = Visits(args[i], dim)
            elif issubclass(type(args[i]), torch.Tensor) and args[i].device.type != "meta":
                self.reading[i] = counted[args[i].untyped_storage().data_ptr()] = ReadCounter(args[i])
        # `reach`: which keys each storage depends on, over the Visits of `reads` (grader.reach)
        self.keys = Reach(list(self.visits.values())) if reach and self.visits else None
        self.recorder = OpRecorder(obs, argument_storages(args, kwargs or {}), counted, list(self.visits.values()),
                                   self.keys)
        self.inputs = {i: a for i, a in enumerate(args) if issubclass(type(a), torch.Tensor)}
        self.inputs.update({k: a for k, a in (kwargs or {}).items() if issubclass(type(a), torch.Tensor)})
        self.kernels = None  # the TritonWatch the call runs under, set by whoever runs it
        self._kernels_before = self._kernel_records = None
        self.remote: list[Observation] = []  # calls observed in the student's process during this one (`merge`)
        self.again = False  # whether the student's process makes the call a second time (`grader.child_observe`)
        self.expected: list = [None]
        self.seen: set[str] = set()
        self.hook = self._profile()  # one object: compared by identity after the call

    @classmethod
    def for_call(cls, args, kwargs: dict, fn=None) -> Recording:
        """A recording of `fn(*args, **kwargs)`, the observation's options taken out of `kwargs` (`_observe_reads`,
        `_observe_dot_scale`, `_observe_light`, `_observe_host`, `_observe_reach`; `_observe_again=False`: no second
        run in the student's process; `_observe_accept=[int, ...]`: a second run may return another of these)."""
        rec = cls(args, kwargs, reads=tuple(kwargs.pop("_observe_reads", ())),
                  dot_scale=float(kwargs.pop("_observe_dot_scale", 1.0)), light=bool(kwargs.pop("_observe_light", False)),
                  host=bool(kwargs.pop("_observe_host", False)), reach=bool(kwargs.pop("_observe_reach", False)))
        rec.held_root, rec.meter = (fn, touching(rec)) if kwargs.pop("_observe_held", False) else (None, rec.meter)
        rec.again = bool(kwargs.pop("_observe_again", True)) and rec.dot_scale == 1.0 and not rec.light
        accept = kwargs.pop("_observe_accept", None)  # ints any correct answer may be: the second run's may differ
        rec.accept = frozenset(accept) if type(accept) is list and all(type(a) is int for a in accept) else None
        return rec

    def _profile(self):
        seen, obs, expected, mine = self.seen, self.obs, self.expected, OUTSIDE_CODE

        def profile(frame, event, arg):
            if event == "call":  # lib's (or an oracle's) code by file, or by fingerprint wherever it was loaded from
                name = lib_name(frame.f_code) or oracle_name(frame.f_code)
                if name is not None and not name.startswith("lib.attn.io_model.TensorMemoryMeter"):  # the meter observing
                    seen.add(name)
            # At each builtin the observed code calls (a torch function, a tensor method, len): the state it runs in.
            # Not at Python-level calls: torch's dispatcher calls Python from C, whose caller then looks like the code's.
            elif event == "c_call" and expected[0] is not None:
                code = frame.f_code
                inside = mine.get(code)
                if inside is None:
                    inside = mine[code] = not observers_code(code, frame.f_globals)
                if inside:
                    state = _dispatch_state()
                    # Fewer modes than set up: torch is running one of them (its handler, or the Python code the
                    # dispatcher runs first), which calls code of torch's and Python's own. With the modes all there,
                    # the Python key must be as it was: excluded or dropped, no mode sees an op.
                    if state[2] >= expected[0][2] and state[:2] != expected[0][:2]:
                        obs.ops[DISPATCH_OFF] += 1
        return profile

    # what `grader.observers.Observers` calls around each op
    def before(self, func, args, kwargs) -> None:
        if not self.meter_only:
            self.recorder.before(func, args, kwargs)

    def after(self, func, args, kwargs, out, counted: bool) -> None:
        if not self.meter_only:
            self.recorder.after(func, args, kwargs, out, counted)
            formula = self.formulas.get(getattr(func, "_overloadpacket", None)) if counted else None
            if formula is not None:  # as FlopCounterMode counts an op it did not decompose
                self.flops += formula(*args, **kwargs, out_val=out)
        self.meter.note(args, kwargs, out)

    def failed(self, func) -> None:
        self.obs.ops[UNRECORDED] += 1
        self.obs.ops[f"{UNRECORDED} {getattr(func, '__name__', func)}"] += 1

    def start(self, collect: bool = True) -> None:
        """Just before the call, inside the observers (`collect`: the garbage collector runs first, for `host`)."""
        if self.kernels is not None:
            self._kernels_before = self.kernels.begin(self.dot_scale, self.inputs)
        if self.host is not None:
            self.host.start(collect)
        self.expected[0] = _dispatch_state()

    def stop(self) -> None:
        """Just after the call returned or raised."""
        self.expected[0] = None
        if self.host is not None:
            try:
                peak = self.host.stop()
                if peak is None:
                    self.obs.ops[WATCH_REMOVED] += 1
                self.obs.host_peak_bytes = peak or 0
            finally:
                self.host.close()
        if self.kernels is not None:
            self._kernel_records = self.kernels.end(self._kernels_before)

    def merge(self, other: Observation) -> None:
        """Add what a call into the student's process did during this call, observed there (`grader.proxy`)."""
        self.remote.append(other)
        self.meter.peak = max(self.meter.peak, self.meter.current + other.peak_bytes)

    def observation(self, result) -> Observation:
        """The call's Observation (`result`: what it returned, which its Triton kernels should have written)."""
        obs = self.obs
        if self.recorder.premade:
            obs.ops[PREMADE_WRITTEN] = sum(self.recorder.premade.values())
        obs.flops = int(self.flops)
        obs.peak_bytes = int(self.meter.peak)
        obs.lib_calls = self.seen
        obs.held_bytes = held_bytes(self.held_root, self.meter) if getattr(self, "held_root", None) is not None else 0
        records = self._kernel_records
        if records is not None and (records.launches or records.problems):
            obs.kernel = records.summary(self.inputs, _tensors(result if issubclass(type(result), (list, tuple)) else [result]))
            obs.kernel_launches, obs.kernel_dots = list(records.launches), list(records.dots)
        obs.reads = {i: counter.per_slice() for i, counter in self.reading.items()}
        obs.visits = {i: v.summary() for i, v in self.visits.items()}
        obs.reach, obs.reach_splits = (self.keys.most, self.keys.splits()) if self.keys is not None else (0, [])
        for other in self.remote:
            obs.ops.update(other.ops)
            obs.matmuls += other.matmuls
            obs.reductions += other.reductions
            obs.flops += other.flops
            obs.lib_calls |= other.lib_calls
            obs.host_peak_bytes = max(obs.host_peak_bytes, other.host_peak_bytes)
            obs.kernel_launches += other.kernel_launches
            obs.kernel_dots += other.kernel_dots
            if other.kernel:
                obs.kernel = obs.kernel or other.kernel
        return obs


_ACTIVE: list = []  # the recordings of the `observe` calls running in this process, innermost last


def recording_now() -> Recording | None:
    """The innermost `observe` running in this process: a call into the student's process made during it (through a
    proxy: `grader.proxy`) is observed there, and what it did added to this one (`Recording.merge`)."""
    return _ACTIVE[-1] if _ACTIVE else None


def observe(fn, *args, **kwargs):
    """Call `fn(*args, **kwargs)` and return `(result, Observation)`.

    A grader that runs student code in another process hands checks a proxy with an `__observe__` method;
    then the observation is made there, around the real call, and shipped back as data. A call of this process's
    (a check's wrapper) that calls the student's code through a proxy has those calls observed there too."""
    remote = getattr(fn, "__observe__", None)
    if remote is not None:
        return remote(args, kwargs)
    rec = Recording.for_call(args, kwargs, fn)
    warm()  # builds the tables of lib's (and the oracles') code before the code observed runs
    if rec.host is not None and not _WARMED:
        warm_up()  # the observers' first use imports modules: their memory is not the call's
    kernels = rec.kernels = TritonWatch()
    previous = sys.getprofile()
    if not rec.light:
        sys.setprofile(rec.hook)
    _ACTIVE.append(rec)
    try:
        with Observers((rec,)), kernels:
            rec.start()
            try:
                result = fn(*args, **kwargs)
            finally:
                rec.stop()
    finally:
        _ACTIVE.remove(rec)
        if not rec.light and sys.getprofile() is not rec.hook:
            rec.obs.ops[WATCH_REMOVED] += 1
        sys.setprofile(previous)
    return result, rec.observation(result)


_WARMED: list = []
_OBSERVER_CLASSES: list = []


def _observer_classes() -> list:
    """[FlopCounterMode, lib's TensorMemoryMeter, FlopCounterMode's formulas] as first looked up — in the student's
    process at start-up (`warm_up`), before its code runs: a class or a formula it later puts in their modules'
    place is not the one used (and is a verdict there: grader.child_identity's `observer_machinery`). Imported here, not at
    this module's import: torch.utils.flop_counter imports triton, after lib has set TRITON_INTERPRET."""
    if not _OBSERVER_CLASSES:
        # As lib's __init__ does — which does not run where another `lib` folder shadows the lab's (llama-cpp-python
        # installs one into site-packages, and then `import lib` outside the repo is a namespace package): without
        # it, a notebook whose check observed a call before its Triton cell could not interpret kernels.
        if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
            os.environ["TRITON_INTERPRET"] = "1"
        from torch.utils import flop_counter

        from lib.attn.io_model import TensorMemoryMeter

        _without_dynamo_import(getattr(flop_counter, "_FlopCounterMode", object))  # FlopCounterMode's own mode
        _OBSERVER_CLASSES.extend((flop_counter.FlopCounterMode, TensorMemoryMeter, dict(flop_counter.flop_registry)))
    return _OBSERVER_CLASSES


def _without_dynamo_import(mode_class) -> None:
    """Call `mode_class`'s own `__torch_dispatch__`, not the wrapper TorchDispatchMode puts around it to keep
    torch.compile out of it: that wrapper imports torch._dynamo at its first call, 2.5-5 s of a core in every
    process that observes anything (measured on a 2-core EPYC: the child at start-up, each test process, each
    notebook kernel). Nothing here is compiled; a notebook that calls torch.compile inside an observed call
    compiles through the observers (torch's `_should_skip_dynamo() -> False` route, which our own mode classes
    take)."""
    raw = getattr(mode_class.__dict__.get("__torch_dispatch__"), "__wrapped__", None)
    if raw is not None:
        mode_class.__torch_dispatch__ = raw


def warm_up() -> None:
    """Observe a few trivial calls once, while the student's process starts (a time no exercise is charged for), so
    that an exercise's time limit measures the notebook's code. First uses cost seconds: the dispatch modes'
    wrappers imported torch._dynamo (2.5-5 s; `_without_dynamo_import`); tracemalloc's snapshots and the read counters
    import modules (mid-call, they would show the notebook's code modules no other call has); torch's Python
    references import torch._dynamo at their first call (`_disable_dynamo`; a meta-device comparison, which most
    checks make: ~1.5 s here, ~4.4 s inside a check's first call under the child's hooks, on a 2-core EPYC)."""
    _WARMED.append(True)
    observe(lambda: torch.zeros(2) + 1)
    observe(lambda x: (x + 1)[x.long()], torch.zeros(2), _observe_host=True, _observe_reads=(0,))
    observe(lambda m: m[:, None] <= m[None, :], torch.arange(3, device="meta"))


def to_wire(obs: Observation) -> dict:
    """An observation as plain data (what the child sends)."""
    return {"ops": dict(obs.ops), "matmuls": [tuple(map(tuple, m)) for m in obs.matmuls], "flops": int(obs.flops),
            "peak_bytes": int(obs.peak_bytes), "host_peak_bytes": int(obs.host_peak_bytes), "held_bytes": int(obs.held_bytes), "lib_calls": sorted(obs.lib_calls),
            "reductions": [(str(n), tuple(map(int, sh)), int(e)) for n, sh, e in obs.reductions],
            "reads": {int(i): [float(x) for x in v] for i, v in obs.reads.items()},
            "visits": {int(i): [[int(x) for x in s][:3] for s in v] for i, v in obs.visits.items()},
            "reach": int(obs.reach), "reach_splits": [tuple(int(x) for x in t)[:3] for t in obs.reach_splits][:4096],
            "kernel_launches": [(str(n), tuple(int(g) for g in grid)) for n, grid in obs.kernel_launches],
            "kernel_dots": [tuple(int(x) for x in d) for d in obs.kernel_dots], "kernel": _kernel_data(obs.kernel)}


def from_wire(data) -> Observation:
    """An observation from plain data, each field checked (what the trusted side reads)."""
    if type(data) is not dict:
        raise TypeError("the student's process sent a malformed observation")
    o = Observation()
    o.ops = Counter({k: v for k, v in dict(data.get("ops", {})).items() if type(k) is str and type(v) is int})
    o.matmuls = [(tuple(int(x) for x in a), tuple(int(x) for x in b)) for a, b in data.get("matmuls", ())]
    o.flops, o.peak_bytes = int(data.get("flops", 0)), int(data.get("peak_bytes", 0))
    o.host_peak_bytes, o.held_bytes = int(data.get("host_peak_bytes", 0)), int(data.get("held_bytes", 0))
    o.lib_calls = {c for c in data.get("lib_calls", ()) if type(c) is str}
    o.reductions = [(str(n), tuple(int(x) for x in sh), int(e)) for n, sh, e in data.get("reductions", ())]
    o.reads = {int(i): [float(x) for x in v] for i, v in dict(data.get("reads", {})).items()}
    o.visits = {int(i): [[int(x) for x in s][:3] for s in v] for i, v in dict(data.get("visits", {})).items()}
    o.reach, o.reach_splits = int(data.get("reach", 0)), [tuple(int(x) for x in t)[:3] for t in data.get("reach_splits", ())][:4096]
    o.kernel_launches = [(str(n), tuple(int(g) for g in grid)) for n, grid in data.get("kernel_launches", ())]
    o.kernel_dots = [(int(m), int(k), int(n)) for m, k, n in data.get("kernel_dots", ())]
    o.kernel = _kernel_data(data.get("kernel", {}))
    return o


def _kernel_data(k) -> dict:
    """`Observation.kernel` as plain data of checked types (both ways across the wire)."""
    if type(k) is not dict or not k:
        return {}
    out = {key: int(k.get(key, 0)) for key in ("loaded_elsewhere", "loaded_from_outputs", "widest_load",
                                               "stored_elsewhere", "outputs_not_stored", "reduce_rank")}
    out["loaded"] = {str(a): int(b) for a, b in dict(k.get("loaded", {})).items()}
    out["problems"] = [str(p) for p in k.get("problems", ())]
    return out
