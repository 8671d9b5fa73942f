"""What the notebook's code can make the trusted process hold or do: the budgets, and the `Meter` that holds a
session to them.

What it guards: **whatever a submission sends or calls, the grading worker's memory stays within `CHECK_MEMORY` of what
it held before** — denied, not detected: the kernel refuses the allocation, so the memory never exists.

- A call from the child into one of the checks' objects (a model, a spy, an autograd ctx, a method; `Meter.callback`)
  is refused before it runs when it asks a model for more than any check does (`model_call_refusal`: more than
  `MAX_MODEL_TOKENS` tokens, or more positions than the model's context); it runs under `torch.no_grad()` (a graph
  built here would outlive the call: a KV cache the check made holds every step's) and under a ceiling of
  `CALLBACK_MEMORY` beyond what the process held when it began — RLIMIT_DATA for host memory (tensors, lists,
  numpy, the reply's encoding), torch's per-process fraction for a GPU's. Its time counts in the exercise's.
- A request (`Meter.request`: a check's call of the notebook's code, with all the child sends and asks meanwhile,
  decoding included) runs under a ceiling of `CHECK_MEMORY`, less what the check's earlier requests left held.
- A refusal reaches the notebook's code as an exception and fails the check's call, whatever that code does with it
  (`ResourceRefused`, an AssertionError: "exercise 5, `generate`: the notebook's code called the check's model ...").

The budgets come from the solutions (weeks 16-21, `pytest solutions/NN`, measured in the trusted process): the
largest message 12.6 MB (week 16's SmolLM2 logits), at most 14.5 MB received and 14.3 MB of twins in a session,
the heaviest callback (a SmolLM2 forward of 13 tokens) 2.6 MB of tensors at its peak (19.6 MB before callbacks ran
without autograd) and 0.74 s, 26,010 objects exported in a check (week 18's law test), 8,003 references received in a
session (week 19), model calls of at most 50 tokens. The margins: 5x for one message (64 MiB), 10x and more for the
counts, 18x for the twins, 20x for the model's tokens, 70x for all a child sends, 200x for a callback's memory; the
wire's own budgets are in `grader.wire`.
"""
from __future__ import annotations

import contextlib
import os
import time

from grader.status import one_line
from grader.wire import ResourceRefused, StudentMemoryError

CALLBACK_MEMORY = 512 << 20  # one call of the notebook's code into a check's object
CHECK_MEMORY = 1 << 30  # all one check's calls into the notebook's code may leave held (and any one of them use)
MAX_RECEIVED = 1 << 30  # bytes the child may send in all, per session (the wire bounds one message)
MAX_MODEL_TOKENS = 1024  # batch x length of one call of a check's model (the checks' largest: 50)
MAX_EXPORTS = 250_000  # the checks' objects handed to the child in one check

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_STATM: list = []  # the open /proc/self/statm of this process: (pid, fd)


def data_bytes() -> int | None:
    """This process's private writable memory (the kernel's `data` of /proc/self/statm, what RLIMIT_DATA counts);
    None where there is no /proc."""
    try:
        if not _STATM or _STATM[0][0] != os.getpid():  # opened once per process (a fork reads its own)
            _STATM[:] = [(os.getpid(), os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC))]
        return int(os.pread(_STATM[0][1], 256, 0).split()[5]) * _PAGE
    except (OSError, ValueError, IndexError, AttributeError):
        return None


_SOFT_BEFORE: list[int] = []  # the soft RLIMIT_DATA each ceiling replaced, outermost first


@contextlib.contextmanager
def ceiling(extra: int):
    """While the block runs this process may hold at most `extra` bytes more private memory than now (never more
    than an enclosing ceiling allows): past it, the kernel refuses the allocation (MemoryError, or torch's "can't
    allocate memory"). Nothing where RLIMIT_DATA cannot be read or set."""
    try:
        import resource
    except ImportError:  # not POSIX
        yield
        return
    now = data_bytes()
    if now is None:
        yield
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    want = now + max(0, int(extra))
    for cap in (soft, hard):
        if cap != resource.RLIM_INFINITY:
            want = min(want, cap)
    try:
        resource.setrlimit(resource.RLIMIT_DATA, (want, hard))
    except (ValueError, OSError):
        yield
        return
    _SOFT_BEFORE.append(soft)
    try:
        yield
    finally:
        _SOFT_BEFORE.pop()
        resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))


@contextlib.contextmanager
def lifted():
    """No ceiling while the block runs (a process started here inherits its limits: the student's own has its own)."""
    if not _SOFT_BEFORE:
        yield
        return
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    resource.setrlimit(resource.RLIMIT_DATA, (_SOFT_BEFORE[0], hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))


@contextlib.contextmanager
def device_ceiling(extra: int):
    """The same for a GPU, where this process has started CUDA: torch's caching allocator refuses to reserve more
    than `extra` bytes beyond what it holds now (`torch.cuda.set_per_process_memory_fraction`)."""
    import sys

    torch = sys.modules.get("torch")
    before = None
    if torch is not None and torch.cuda.is_initialized():
        try:
            device = torch.cuda.current_device()
            total = torch.cuda.get_device_properties(device).total_memory
            before = torch.cuda.get_per_process_memory_fraction(device)
            torch.cuda.set_per_process_memory_fraction(
                min(before, (torch.cuda.memory_reserved(device) + extra) / total), device)
        except (AttributeError, RuntimeError, ValueError):  # a torch without the fraction's getter
            before = None
    try:
        yield
    finally:
        if before is not None:
            torch.cuda.set_per_process_memory_fraction(before, device)


def is_memory_error(e: BaseException) -> bool:
    """An allocation of this process refused (not the student's process running out: `StudentMemoryError`, or an
    exception of the other process's)."""
    if isinstance(e, StudentMemoryError) or getattr(e, "from_child", False):
        return False
    if isinstance(e, MemoryError) or type(e).__name__ == "OutOfMemoryError":
        return True
    return isinstance(e, RuntimeError) and any(s in str(e)[:2000] for s in (
        "can't allocate memory", "not enough memory", "Cannot allocate memory", "out of memory"))


def describe(value) -> str:
    """A value the child sent, in a few words: `[16384, 256] int64 tensor`, `1000`, `a list of 12`."""
    import torch

    if isinstance(value, torch.Tensor):
        return f"{list(value.shape)} {str(value.dtype).removeprefix('torch.')} tensor"
    if type(value) in (int, float, bool) or value is None:
        return repr(value)[:40]
    if type(value) is str:
        return repr(value[:40]) + ("..." if len(value) > 40 else "")
    if isinstance(value, (list, tuple, dict, set)):
        return f"a {type(value).__name__} of {len(value)}"
    return f"a {type(value).__name__}"


def what_is_called(op: str, target, args) -> str:
    """`the check's model (LlamaModel)` or `the check's `new_cache`` with its arguments, for a message."""
    owner = getattr(target, "__self__", None)
    name = getattr(target, "__name__", None) if owner is not None else None
    kind = type(owner if owner is not None else target).__name__
    what = f"`{kind}.{name}`" if name else f"the check's {kind}"
    if op == "call" and type(args) is tuple and len(args) == 2:
        pos, kw = args
        shown = [describe(a) for a in pos][:4] + [f"{k}={describe(v)}" for k, v in list(kw.items())[:4]]
        return f"a call of {what} with ({', '.join(shown)})"
    return f"{op} on {what}"


def model_call_refusal(op: str, target, args) -> str | None:
    """Why a call of one of the checks' models (or a spy, or its `forward`) is refused before it runs: more tokens
    than any check feeds (`MAX_MODEL_TOKENS`), or more positions than the model's context. None: it may run."""
    if op != "call" or type(args) is not tuple or len(args) != 2 or type(args[0]) is not tuple:
        return None
    import torch

    pos, kw = args
    ids = pos[0] if pos else kw.get("input_ids") if type(kw) is dict else None
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2:
        return None
    owner = getattr(target, "__self__", None)
    model = owner if owner is not None and getattr(target, "__name__", "") in ("forward", "__call__") else target
    try:
        config = getattr(model, "config", None)
    except Exception:  # noqa: BLE001
        config = None
    context = getattr(config, "max_seq_len", None)
    if not isinstance(model, torch.nn.Module) and not (type(context) is int and hasattr(config, "vocab_size")):
        return None
    b, t = ids.shape
    if b * t > MAX_MODEL_TOKENS or (type(context) is int and t > context):
        limit = f"{MAX_MODEL_TOKENS} tokens a call" + (f", at most its context of {context} positions"
                                                        if type(context) is int else "")
        return (f"the notebook's code called the check's model with a [{b}, {t}] input: more than the checks allow "
                f"({limit}). The model runs in the grader's process, whose memory is not the notebook's to use: feed "
                f"it what the exercise does")
    return None


_RUNS = ("call", "byvalue", "iter", "next")  # the operations that run a check's code on the child's arguments


class _Call:
    """One callback being served: `failed(e)` turns a refused allocation into its `ResourceRefused`."""

    def __init__(self, meter: "Meter", op: str, target, args):
        self.meter, self.op, self.target, self.args = meter, op, target, args

    @property
    def what(self) -> str:
        return what_is_called(self.op, self.target, self.args)

    def failed(self, e: BaseException) -> BaseException:
        if isinstance(e, ResourceRefused) or not is_memory_error(e):
            return e
        return self.meter.refuse(f"{self.what} needed more memory than the grader's process gives the notebook's "
                                 f"code ({CALLBACK_MEMORY >> 20} MiB a call into the checks' objects, "
                                 f"{CHECK_MEMORY >> 20} MiB a check): {one_line(e, limit=160)}")


class Meter:
    """One session's bounds: `request()` around each of the trusted side's requests, `callback()` around each call
    the child makes into the checks' objects, `end_check()` when a check's objects are forgotten."""

    def __init__(self, session):
        self.session = session
        self.depth = 0  # requests in flight (a check's object may call the notebook's code during a callback)
        self.held = 0  # bytes this check's requests left held (the process's private memory grew by that much)
        self.refusal: str | None = None  # why a callback of the request in flight was refused

    def refuse(self, why: str) -> ResourceRefused:
        """Record why (the request in flight then fails, whatever the notebook's code does with the exception)."""
        if self.refusal is None:
            self.refusal = why
        return ResourceRefused(why)

    def end_check(self) -> None:
        self.held = 0

    @contextlib.contextmanager
    def request(self):
        if self.depth:  # inside a callback: the outer request's ceiling holds
            self.depth += 1
            try:
                yield
            finally:
                self.depth -= 1
            return
        left = CHECK_MEMORY - self.held
        if left <= 0:
            raise ResourceRefused(f"the notebook's code made the grader's process hold {self.held >> 20} MiB during "
                                  f"this check (what it sent, and what it had the checks' objects make): more than "
                                  f"the {CHECK_MEMORY >> 20} MiB a check allows")
        self.refusal, before, self.depth = None, data_bytes(), 1
        failed: BaseException | None = None
        try:
            with ceiling(left):
                yield
        except BaseException as e:
            failed = e
            raise
        finally:
            self.depth = 0
            after = data_bytes()
            if before is not None and after is not None:
                self.held += max(0, after - before)
            if not getattr(self.session, "_checks", 0):
                self.held = 0  # outside a check nothing keeps what a request returned for long
            refusal, self.refusal = self.refusal, None
            if refusal is None and failed is not None and is_memory_error(failed):
                refusal = (f"the notebook's code made the grader's process need more than {left >> 20} MiB during one "
                           f"call (what it sent, and what it had the checks' objects make): {one_line(failed, 160)}")
            if refusal is not None:
                raise ResourceRefused(refusal) from None

    @contextlib.contextmanager
    def callback(self, op: str, target, args):
        """Serve one call of the child into a check's object, metered (see the module's docstring)."""
        session = self.session
        if self.refusal is not None:
            raise ResourceRefused(self.refusal)
        limit = getattr(session, "exercise_limit", None)
        if limit is not None and session.exercise_used >= limit:
            raise self.refuse(f"{session.exercise} ran out of time ({limit:g} s) while the notebook's code kept "
                              f"calling the checks' objects")
        why = model_call_refusal(op, target, args)
        if why is not None:
            raise self.refuse(why)
        call = _Call(self, op, target, args)
        began, cpu, waited = time.monotonic(), time.process_time(), session.exercise_used
        try:
            if op in _RUNS:
                import torch

                with ceiling(CALLBACK_MEMORY), device_ceiling(CALLBACK_MEMORY), torch.no_grad():
                    yield call
            else:  # an attribute, an item, a length...: the request's ceiling holds
                yield call
        except BaseException as e:  # noqa: BLE001  (a refused allocation becomes the refusal; the rest passes)
            raise call.failed(e) from None
        finally:
            own = time.monotonic() - began - (session.exercise_used - waited)  # less the child's time meanwhile
            session.exercise_used += max(0.0, own)
            spent = max(own, time.process_time() - cpu)
            if spent > session.call_timeout:
                self.refuse(f"{call.what} took {spent:.0f} s of the grader's process (a call may take "
                            f"{session.call_timeout:g} s)")


def plain_text(value, limit: int = 400) -> str:
    """A string the child sent, for the grader's notes: cut at `limit` characters ("" if it is not a string)."""
    return value[:limit] if type(value) is str else ""


def load_info(info) -> dict:
    """The child's report of the cells it loaded (`stubbed` labels, `broken` label -> why), cut to a size the status
    file and the gradebook can hold."""
    if type(info) is not dict:
        return {}
    stubbed = info.get("stubbed", [])
    broken = info.get("broken", {})
    return {"stubbed": [plain_text(s, 200) for s in stubbed[:200]] if type(stubbed) is list else [],
            "broken": ({plain_text(k, 200): plain_text(v) for k, v in list(broken.items())[:200]}
                       if type(broken) is dict else {})}
