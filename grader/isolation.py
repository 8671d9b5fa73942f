"""Student code in a separate, resource-limited process; the checks in the trusted one, talking through proxies.

What it guards: **the student's code never runs in the checks' process, and a child that loops, dies, floods
the protocol or outlives its budget is stopped (and restarted for the next exercise)** — `Session` below.

    session = Session(notebook)           # starts the child: rlimits, Landlock, its own temporary folder
    session.load(cells)                   # the child runs the notebook's exercise cells
    fn = session.get("causal_mask")       # a proxy: calling it sends the arguments to the child,
    fn(3, 8)                              #   runs the student's function there, and receives the result

What crosses the boundary
-------------------------
- trusted -> child: pickled. Plain data (numbers, strings, tensors, containers, dtypes, dataclass configs) is
  copied; anything with identity or behaviour (models, spies, functions made in a check, autograd contexts)
  stays in the trusted process and the child gets a proxy that calls back.
- child -> trusted: **never unpickled as such.** The child encodes its results as plain data (exact built-in
  types, tensors as raw bytes with dtype/shape/strides, numpy arrays as bytes) or as a reference to an object
  that stays in the child (a class, an instance, a function); the trusted side decodes with an unpickler that
  refuses every global, so the student's code can never run in the trusted process and a value can never
  lie about what it is (an `int` subclass whose `__eq__` always says True arrives as a plain `int`).
- Exceptions cross as (class names of the MRO, message); the trusted side re-raises the nearest built-in
  class (a `CacheOverflowError(ValueError)` arrives as a `ValueError` subclass of that name). `SystemExit`
  and `KeyboardInterrupt` raised by student code arrive as `RuntimeError`.

Emulated so that checks written for one process keep working: in-place changes to list/dict arguments are
copied back (`visited=[]` out-parameters); a tensor view of a buffer the student keeps (a KV cache's
`k[:, :, :length]`) keeps the same `data_ptr()` between calls; a `TensorMemoryMeter` active around a call
sees the peak bytes allocated in the child; a student `torch.autograd.Function` subclass arrives as a local
`Function` whose forward/backward run in the child (the `ctx` stays here). A tensor argument the call
changes in place (`k_pool.mul_(2)`, `x.data[0] = 1`, a resize) is *not* copied back — the caller's tensor
may be a worker's cached input, shared with the next submission — the call raises `ArgumentChanged` (an
AssertionError: the exercise fails with that reason), as a check comparing its arguments after the call would.

Limits of one child: RLIMIT_AS (address space), RLIMIT_CPU, RLIMIT_FSIZE, RLIMIT_CORE=0, a wall-clock
timeout for each call (`INFERENCE_LAB_CALL_TIMEOUT`, default 60 s of silence from the child) and a budget for
the whole session (`INFERENCE_LAB_BUDGET`, default 900 s). A child that dies (os._exit, a crash, out of
memory, killed at a timeout) is restarted for the next exercise, up to `max_restarts` times.

The parts, lowest first (each file's docstring says what it guards): `grader.child_setup` (how the child starts),
`grader.trusted_objects` (what it may ask of the checks' objects), `grader.wire` (the messages), `grader.processes`
(every process a submission starts, found and killed), `grader.proxy` (`ChildProxy`), `grader.child` (the student's
process), and this module: `Session`, which starts, feeds, times and restarts the child (names: `__all__`).
"""
from __future__ import annotations

import atexit
import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import weakref
from pathlib import Path

from grader import bounds
from grader.processes import (is_subreaper, pids_cgroup, remove_cgroup, process_start_time, become_subreaper, kill_tree,
                              child_environment, make_undumpable)
from grader.proxy import ChildProxy, autograd_function_of
from grader.child_setup import CHILD_BOOT, child_import_path, memory_kind, triton_interpreted_in_child, uses_cuda
from grader.trusted_objects import CHILD_MAY, refuse_module_change
from grader.status import (TAMPERED_TAIL, DEFAULT_BUDGET, DEFAULT_CALL_TIMEOUT, DEFAULT_CPU, DEFAULT_EXERCISE_TIMEOUT,
                            DEFAULT_MEMORY, limits, one_line)
from grader.copies import copies_in_cells, reference_units, similar_and_nearest, without_copies
from grader.similarity import introspection_in_cells
from grader.view import ViewSpec, build_view, readable_paths
from grader.wire import (MAX_FROM_CHILD, ArgumentChanged, IsolationError, ResourceRefused, StudentCrash, StudentMemoryError,
                         StudentTimeout, ByValue, SafeUnpickler, TrustedPickler, apply_operation, copy_back, exception_for_child,
                         rebuild_exception, recv_message, send_message)

__all__ = ["Session", "ChildProxy", "IsolationError", "StudentTimeout", "StudentCrash", "ArgumentChanged", "ResourceRefused",
           "kill_tree", "become_subreaper", "DEFAULT_CALL_TIMEOUT", "DEFAULT_BUDGET", "DEFAULT_EXERCISE_TIMEOUT",
           "DEFAULT_MEMORY", "DEFAULT_CPU"]

MAX_RECEIVED = bounds.MAX_RECEIVED  # bytes the child may send the trusted side in all, per session: beyond it, a verdict
_SESSIONS: "weakref.WeakSet[Session]" = weakref.WeakSet()


def _close_all() -> None:
    for session in list(_SESSIONS):
        session.close()


atexit.register(_close_all)


class Session:
    """One student process: started on demand, restarted after it dies, stopped with `close()`."""

    def __init__(self, notebook: str | Path, cells: list[tuple[int, str | None, str]] | None = None,
                 call_timeout: float | None = None, budget: float | None = None,
                 memory: int | None = None, cpu: int | None = None, max_restarts: int = 4,
                 view: "ViewSpec | None" = None):
        self.notebook = str(notebook)
        self.view = view if view is not None else ViewSpec.make(None)
        self.received = 0  # bytes of data the child has sent (MAX_RECEIVED)
        self.similar: dict[str, str] = {}  # exercise -> a copy of the answer key its source holds
        self.tampered: dict[str | None, list[str]] = {}  # exercise (None: at load, "*": any) -> what its code did
        self._root_now: str | None = None  # the exercise the request in flight runs for (`_request_raw`)
        self.copied: dict[str | None, list[str]] = {}  # exercise (None: at load) -> a copy of the answer key it ran
        self.copies: list = []  # (cell index, qualname, why): see `load`
        self.reference_units: dict = {}
        self.cells = cells
        lim = limits()  # the grader's --timeout, else the environment's knobs, else the defaults
        self.call_timeout = call_timeout or lim.call_timeout
        self.budget = budget or lim.budget
        self.exercise: str | None = None  # the graded test running now (`time_limit`)
        self.exercise_limit: float | None = None
        self.exercise_used = 0.0
        self.deadline: float | None = None  # when the check running now must end, wall clock (`begin_check`)
        self.timeouts: list[str] = []  # one line per time limit that stopped the child
        self.memory = int(memory or lim.memory)
        self.cpu = int(cpu or lim.cpu)
        self.max_restarts = max_restarts
        self.generation = 0
        self.proc: subprocess.Popen | None = None
        self.dead: str | None = None  # why the current child is gone
        self.load_info: dict = {}
        self.started = time.monotonic()
        self.restarts = 0
        self._exports: dict[int, object] = {}
        self.meter = bounds.Meter(self)  # what the notebook's code makes this process hold or do (grader.bounds)
        self._storages: dict[int, object] = {}
        self._next_req = 0
        self.workdir: str | None = None
        self.cgroup: str | None = None
        self._child_start: int | None = None
        self.log_lines: list[str] = []
        _SESSIONS.add(self)

    # --- lifecycle ------------------------------------------------------------------------------------------
    def start(self) -> None:
        if self.proc is not None and self.dead is None:
            return
        if self.proc is not None:
            self.restarts += 1
            if self.restarts > self.max_restarts:
                raise StudentCrash(f"the student's process was restarted {self.max_restarts} times; giving up "
                                   f"(last: {self.dead})")
        self._stop_child()
        self.generation += 1
        self._exports.clear()
        self._storages.clear()
        self.workdir = tempfile.mkdtemp(prefix="inference-lab-student-")
        make_undumpable()  # this process's /proc files (environ, memory, maps, fds) out of the child's reach
        with bounds.lifted():  # the child (and the probe below) must not inherit a ceiling of this process's
            self._spawn()
        limit, self.exercise_limit = self.exercise_limit, None  # a fresh child's start-up is not the exercise's time
        deadline, self.deadline, began = self.deadline, None, time.monotonic()  # nor the check's (call_timeout bounds it)
        used = self.exercise_used
        try:
            hello = self._wait_reply(None, timeout=max(120.0, self.call_timeout))
            self.sandbox = bounds.plain_text(hello, 1000)
            if self.cells is not None:
                self.load_info = bounds.load_info(self._request_raw("load", None, (self.notebook, self.cells, self.copies,
                                                                                   self.reference_units)))
        finally:
            self.exercise_limit, self.exercise_used = limit, used
            self.deadline = None if deadline is None else deadline + time.monotonic() - began

    def _spawn(self) -> None:
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        view = build_view(self.view)
        paths = child_import_path()
        readable = None if self.view.open else readable_paths(view, extra=paths)
        env = child_environment()  # the instructor's environment is theirs: the few variables Python needs
        env.update(HOME=self.workdir, TMPDIR=self.workdir, MPLCONFIGDIR=self.workdir, XDG_CACHE_HOME=self.workdir,
                   PYTHONDONTWRITEBYTECODE="1", MPLBACKEND="Agg")
        env.setdefault("OMP_NUM_THREADS", "1")
        # Triton kernels run in the interpreter, where the checks see every launch, load and tl.dot (week 17): a
        # kernel compiled for a GPU is invisible to them, so a grade on a GPU machine would judge its numbers only.
        if triton_interpreted_in_child():
            env["TRITON_INTERPRET"] = "1"
        self.cgroup = pids_cgroup()
        if self.cgroup:
            env["INFERENCE_LAB_PIDS_CGROUP"] = self.cgroup
        log = open(os.path.join(self.workdir, "output.log"), "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-c", CHILD_BOOT, str(to_child_r), str(from_child_w), self.workdir,
             str(self.memory), str(self.cpu), json.dumps({"view": str(view), "path": paths, "readable": readable,
                                                          "memory_kind": memory_kind(), "cuda": uses_cuda()})],
            pass_fds=(to_child_r, from_child_w), cwd=self.workdir, env=env, stdin=subprocess.DEVNULL,
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        self._child_start = process_start_time(self.proc.pid)
        os.close(to_child_r)
        os.close(from_child_w)
        self._w, self._r = to_child_w, from_child_r
        self.dead = None

    def load(self, cells: list[tuple[int, str | None, str]]) -> dict:
        self.cells = cells
        # Read here, from the source: a renamed or padded copy of lib's code or of the solution (grader.similarity).
        self.similar, self.nearest = similar_and_nearest(self.notebook, cells, self.view.week)
        # ... and for the child, which names the exercise a copy runs for (one parked in another cell, or compiled
        # by the notebook's code while it runs): the copies in every cell, and the references' statement hashes
        self.copies = copies_in_cells(self.notebook, cells, self.view.week)
        self.reference_units = reference_units(self.notebook, self.view.week)
        # ... and it never gets those copies' code: each copy's body is a `raise` saying why (nothing the notebook's
        # code does in its process — its records of what ran cleared, say — lets a copy run unseen)
        self.cells = [(index, grade_id, without_copies(source, {q: why for i, q, why in self.copies if i == index}))
                      if any(i == index for i, _, _ in self.copies) else (index, grade_id, source)
                      for index, grade_id, source in cells]
        # ... and the ways from a function or a frame to the grader's objects in the child, which nothing there sees
        for why in introspection_in_cells(cells):
            found = self.tampered.setdefault("*", [])
            if why not in found:
                found.append(why)
        self.start()
        return self.load_info

    def _stop_child(self) -> None:
        if self.proc is None:
            return
        for fd in (getattr(self, "_w", None), getattr(self, "_r", None)):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._w = self._r = None
        self._kill_all()
        self._collect_log()
        if self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def _collect_log(self) -> None:
        try:
            with open(os.path.join(self.workdir, "output.log"), "rb") as f:
                f.seek(0, 2)
                f.seek(max(0, f.tell() - 4000))
                self.log_lines = f.read().decode("utf-8", "replace").splitlines()[-20:]
        except (OSError, TypeError):
            pass

    def close(self) -> None:
        self._stop_child()
        self.proc = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass

    def _kill(self, why: str) -> None:
        self.dead = why
        if self.proc is not None:
            self._kill_all()
            self._collect_log()

    def _kill_all(self) -> None:
        """The child and everything it started, `setsid`'d and double-forked processes included (`kill_tree`)."""
        if self.proc is None:
            return
        if not sys.platform.startswith("linux"):  # no /proc, pidfds or subreapers: the process group only
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            self.proc.wait()
            return
        others = {s.proc.pid for s in list(_SESSIONS) if s is not self and s.proc is not None}
        since = self._child_start if self._child_start is not None and is_subreaper() else None
        kill_tree(self.proc.pid if self.proc.poll() is None else None, orphans_since=since, keep=others,
                  cgroup=self.cgroup)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        remove_cgroup(self.cgroup)
        self.cgroup = None

    def _death_reason(self, during: str) -> str:
        rc = self.proc.poll() if self.proc is not None else None
        if rc is not None and self.workdir:
            self._collect_log()  # what it said last: the out-of-memory hint and the message quote it
        if rc is None:
            return f"stopped responding during {during}"
        if rc < 0:
            sig = -rc
            what = {signal.SIGXCPU: f"used up its CPU time ({self.cpu} s)", signal.SIGKILL: "was killed (out of memory?)",
                    signal.SIGSEGV: "crashed (segmentation fault; out of memory?)", signal.SIGXFSZ: "wrote too big a file",
                    signal.SIGABRT: "aborted (out of memory?)"}.get(sig, f"was ended by signal {sig}")
            return f"the process running the notebook's code {what} during {during}"
        tail = [ln for ln in self.log_lines if ln.strip()]
        hint = ""
        if any("MemoryError" in ln or "std::bad_alloc" in ln or "DefaultCPUAllocator" in ln for ln in tail):
            hint = f" (out of memory: the limit is {self.memory >> 20} MiB beyond the imports)"
        last = " | ".join(ln.strip()[:200] for ln in tail[-3:])[:600]
        said = f"; its last output: {last}" if last else ""
        return (f"the process running the notebook's code exited with status {rc} during {during} "
                f"(os._exit() or sys.exit() in the code?){hint}{said}")

    # --- messaging ------------------------------------------------------------------------------------------
    def _encode(self, msg) -> bytes:
        buf = io.BytesIO()
        TrustedPickler(buf, self).dump(msg)
        return buf.getvalue()

    def _decode(self, data: bytes):
        return SafeUnpickler(io.BytesIO(data), self).load()

    def export(self, obj) -> tuple:
        oid = id(obj)
        if oid not in self._exports and len(self._exports) >= bounds.MAX_EXPORTS:
            raise self.meter.refuse(f"the notebook's code asked for more than {bounds.MAX_EXPORTS} of the checks' "
                                    f"objects in one check; each stays in the grader's process until the check ends")
        self._exports[oid] = obj
        t = type(obj)
        return (oid, getattr(t, "__module__", ""), getattr(t, "__qualname__", t.__name__))

    def begin_check(self) -> None:
        """A check starts (`grader.harness.Week.exercise`); checks may nest."""
        if not getattr(self, "_checks", 0):  # the whole check, its own work included: a hard wall-clock ceiling
            self.deadline = time.monotonic() + WALL_FACTOR * (self.exercise_limit or limits().exercise_timeout)
        self._checks = getattr(self, "_checks", 0) + 1

    def end_check(self) -> None:
        """A check ended: the objects it handed the child (its models, spies, functions) are forgotten, so the
        notebook's code cannot keep one and call it during another exercise's check (a model's attention function
        kept from one check is another exercise's answer in the next)."""
        self._checks = max(0, getattr(self, "_checks", 1) - 1)
        if self._checks == 0:
            self.deadline = None
            self._exports.clear()
            self.meter.end_check()

    def _budget_left(self) -> float:
        return self.budget - (time.monotonic() - self.started)

    @contextlib.contextmanager
    def time_limit(self, exercise: str, seconds: float | None):
        """While this block runs (one graded test), the student's code may take `seconds` in all — the time spent
        waiting for the child, not the checks' own work — so a slow exercise costs only its own points."""
        self.exercise, self.exercise_limit, self.exercise_used = exercise, seconds, 0.0
        try:
            yield
        finally:
            self.exercise = self.exercise_limit = None

    def _timed_out(self, line: str) -> StudentTimeout:
        self.timeouts.append(line)
        self._kill(line)
        return StudentTimeout(line)

    def _wait_reply(self, req_id, timeout: float, during: str = "start-up"):
        """Serve the child's requests until the reply to `req_id` arrives (req_id None: the start-up hello)."""
        while True:
            left = self._budget_left()
            if left <= 0:
                raise self._timed_out(f"the time budget for this notebook ({self.budget:g} s) is used up; "
                                      f"stopped during {during}" + (f" ({self.exercise})" if self.exercise else ""))
            wait = min(timeout, left)
            if self.exercise_limit is not None:
                exercise_left = self.exercise_limit - self.exercise_used
                if exercise_left <= 0:
                    raise self._timed_out(f"{self.exercise} ran out of time: the notebook's code used up this test's "
                                          f"time limit ({self.exercise_limit:g} s, INFERENCE_LAB_EXERCISE_TIMEOUT); "
                                          f"stopped during {during}")
                wait = min(wait, exercise_left)
            if self.deadline is not None:
                self._past_deadline(during)
                wait = min(wait, self.deadline - time.monotonic())
            began = time.monotonic()
            try:
                data = recv_message(self._r, wait, MAX_FROM_CHILD)
            except TimeoutError:
                self.exercise_used += time.monotonic() - began
                if wait < timeout:
                    continue  # the budget or exercise check above reports it
                raise self._timed_out(f"{during} took longer than {timeout:g} s (an endless loop?); the process "
                                      f"running the notebook's code was stopped") from None
            except (EOFError, OSError, ValueError, MemoryError) as e:
                self.exercise_used += time.monotonic() - began
                time.sleep(0.05)
                why = (self._death_reason(during) if isinstance(e, (EOFError, OSError)) else f"protocol violation: {e}"
                       if isinstance(e, ValueError) else f"the notebook's code sent a message the grader's process has "
                       f"no room for (it holds at most {bounds.CHECK_MEMORY >> 20} MiB for the notebook's code in a "
                       f"check); stopped during {during}")
                self._kill(why)
                raise StudentCrash(why) from None
            self.exercise_used += time.monotonic() - began
            self.received += len(data)
            if self.received > MAX_RECEIVED:
                why = (f"the notebook's code sent the checks more than {MAX_RECEIVED >> 20} MiB of data in all; "
                       f"stopped during {during}")
                self._kill(why)
                raise StudentCrash(why)
            try:
                msg = self._decode(data)
            except Exception as e:  # noqa: BLE001
                size, data = len(data), None
                self._kill(f"undecodable message ({one_line(e, limit=300)})")
                if bounds.is_memory_error(e):
                    raise StudentCrash(f"the student's process sent a message of {size} bytes that would take more "
                                       f"than the {bounds.CHECK_MEMORY >> 20} MiB the grader's process gives a check "
                                       f"to read; stopped during {during}") from None
                raise StudentCrash(f"the student's process sent something that is not plain data ({one_line(e, limit=300)})") from None
            if type(msg) is not tuple or not msg or type(msg[0]) is not str:
                self._kill("malformed message")
                raise StudentCrash("the student's process broke the protocol")
            kind = msg[0]
            if kind in ("ok", "err") and len(msg) == 3:
                if msg[1] != req_id:
                    self._kill("reply to the wrong request")
                    raise StudentCrash("the student's process broke the protocol (reply to the wrong request)")
                if kind == "ok":
                    return msg[2]
                exc = rebuild_exception(msg[2])
                if isinstance(exc, MemoryError):
                    # A process that ran out of memory may stay short of it: the next exercise gets a fresh one.
                    self._kill(f"it ran out of memory during {during}")
                    exc = StudentMemoryError(f"out of memory during {during} (the limit is {self.memory >> 20} MiB "
                                             f"beyond the imports) {exc}".strip())
                raise exc
            if kind == "req" and len(msg) == 5:
                self._serve(msg)
                continue
            if kind in ("flag", "copied") and len(msg) == 3 and (msg[1] is None or type(msg[1]) is str) and type(msg[2]) is str:
                self._note(kind, msg[1], msg[2])
                continue
            self._kill("malformed message")
            raise StudentCrash("the student's process broke the protocol")

    def _note(self, kind: str, root: str | None, why: str) -> None:
        """What the child's guard saw, or a copy of the answer key that ran: kept here, for good — for the exercise
        the child names and for the one this side's request ran for (None, while the cells load: every exercise)."""
        book = self.tampered if kind == "flag" else self.copied
        root = root[:200] if type(root) is str else root
        for where in {root, self._root_now} if root != "*" else {root}:
            if where not in book and where != self._root_now and len(book) >= 200:
                continue  # names the child made up: the exercise this side ran for still gets it
            found = book.setdefault(where, [])
            if len(found) < 10 and why[:400] not in found:
                found.append(why[:400])

    def _serve(self, msg) -> None:
        """The child asks something of one of our objects (a model, a spy, a ctx). Only public attributes: the
        private and dunder ones (`__globals__`, `__class__`, `_modules`...) are how one would walk from an
        object to the grader's modules and functions."""
        _, rid, op, target, args = msg
        try:
            if type(op) is not str or type(args) is not tuple or op not in CHILD_MAY:
                raise TypeError("bad request")
            if op in ("getattr", "setattr", "delattr") and (type(args[0]) is not str or args[0].startswith("_")):
                raise AttributeError(f"the checks' objects do not expose private attributes ({args[0]!r}) "
                                     f"to the notebook's code")
            refuse_module_change(op, target, args)
            with self.meter.callback(op, target, args) as call:  # bounded, or refused (grader.bounds)
                value = ByValue(target) if op == "byvalue" else apply_operation(op, target, args)
                try:
                    payload = self._encode(("ok", rid, value))
                except Exception as e:  # noqa: BLE001
                    del value
                    payload = self._encode(("err", rid, exception_for_child(call.failed(e))))
        except BaseException as e:
            if isinstance(e, KeyboardInterrupt):
                raise
            payload = self._encode(("err", rid, exception_for_child(e)))
        send_message(self._w, payload)

    def _request_raw(self, op: str, target, args: tuple, during: str | None = None):
        if self.dead is not None:
            raise StudentCrash(self.dead)
        self._next_req += 1
        rid = self._next_req
        payload = self._encode(("req", rid, op, target, args))
        # The exercise this request runs the notebook's code for, as this side knows it (a name looked up, or the
        # exercise an object came from): a verdict arriving meanwhile counts for it, whatever exercise the child
        # names — its record of which exercise runs is the notebook's to rewrite (`_note`).
        previous = self._root_now
        if op == "getname":
            self._root_now = str(args[0])
        elif isinstance(target, ChildProxy):
            self._root_now = target._root
        try:
            with self.meter.request():  # what the child makes this process hold meanwhile is bounded (grader.bounds)
                try:
                    send_message(self._w, payload)
                except OSError:
                    why = self._death_reason(during or op)
                    self._kill(why)
                    raise StudentCrash(why) from None
                return self._wait_reply(rid, self.call_timeout, during or self._describe(op, target))
        finally:
            self._root_now = previous

    def _describe(self, op: str, target) -> str:
        name = target._info.get("name") if isinstance(target, ChildProxy) else None
        if op in ("call", "callback", "metered", "observe", "on_device", "map", "observe_many"):
            return f"a call of `{name}`" if name else "a call into the notebook's code"
        return f"{op} on an object of the notebook's code"

    def _exercise_over(self) -> None:
        """Within a graded test whose time is up, every further call fails at once (no restart for it)."""
        if self.exercise_limit is not None and self.exercise_used >= self.exercise_limit:
            raise StudentTimeout(f"{self.exercise} ran out of time (its limit: {self.exercise_limit:g} s)")
        self._past_deadline("a request")

    def _past_deadline(self, during: str) -> None:
        """A check past its wall-clock deadline fails now, whatever keeps it going: endless short calls (an endless
        generator's `next`) spend little of the student's time per call, and the checks' own share is not counted
        in `exercise_used`. The child is stopped; every later request of this check fails at once."""
        if self.deadline is not None and time.monotonic() >= self.deadline:
            if self.dead is not None:
                raise StudentTimeout(self.timeouts[-1] if self.timeouts else "this test ran out of time")
            limit = self.exercise_limit or limits().exercise_timeout
            raise self._timed_out(f"{self.exercise or 'this test'} ran out of time: a test may take {WALL_FACTOR * limit:g} s "
                                  f"in all, the checks' own work included ({WALL_FACTOR:g} x INFERENCE_LAB_EXERCISE_TIMEOUT"
                                  f", {limit:g} s); the notebook's code kept it going (endless results?); stopped "
                                  f"during {during}")

    def request(self, op: str, target: "ChildProxy", args: tuple):
        self._exercise_over()
        if target._generation != self.generation:
            if target._name is not None and self.dead is not None:
                self.start()
                fresh = self.get(target._name)
                if isinstance(fresh, ChildProxy):
                    return self.request(op, fresh, args)
                return apply_operation(op, fresh, args)
            raise StudentCrash(f"this object belonged to the student's earlier process, which ended: {self.dead or ''}")
        if self.dead is not None and target._name is not None:
            self.start()
            return self.request(op, self.get(target._name), args)
        return self._request_raw(op, target, args)

    def call(self, target: "ChildProxy", args: tuple, kwargs: dict, device: str | None = None):
        """`target(*args, **kwargs)` in the child; with `device`, under `with torch.device(device)` there."""
        if device is None:
            result, copied = self.request("callback", target, (args, kwargs))
        else:
            result, copied = self.request("on_device", target, (str(device), args, kwargs))
        copy_back(args, kwargs, copied)
        return result

    def observe(self, target: "ChildProxy", args: tuple, kwargs: dict):
        from grader.observe import from_wire

        result, obs, copied = self.request("observe", target, (args, kwargs))
        copy_back(args, kwargs, copied)
        return result, from_wire(obs)

    def observe_many(self, target: "ChildProxy", calls, options: dict):
        """[(result, Observation)] of `target(*args, **kwargs)` for each of `calls`, every one observed in the child
        (`grader.checks.observe_many`), in one round trip."""
        from grader.observe import from_wire

        calls = [(tuple(a), dict(k)) for a, k in calls]
        out = self.request("observe_many", target, (calls, dict(options)))
        if type(out) is not list or len(out) != len(calls) or not all(type(x) is tuple and len(x) == 2 for x in out):
            raise IsolationError("the student's process returned a malformed batch of observations")
        return [(result, from_wire(obs)) for result, obs in out]

    def get(self, name: str):
        """A name defined by the notebook's exercise cells: plain data, or a proxy."""
        self._exercise_over()
        self.start()
        value = self._request_raw("getname", None, (name,), during=f"looking up `{name}`")
        if isinstance(value, ChildProxy):
            object.__setattr__(value, "_name", name)
            value._info["name"] = name
            if value._info.get("autograd_function"):
                return autograd_function_of(value)
        return value

    def reference_use(self, names: list[str]) -> dict[str, str]:
        """{exercise name: how it uses lib's own implementation, or a copy of the answer key} for the names that
        do: what the source shows (`grader.similarity`, judged here), then what the child saw (lib's own bytecode,
        the more exact finding, before a copy of the answer key that ran for the exercise)."""
        found = {name: self.similar[name] for name in names if name in self.similar}
        copied = {}
        for name in names:
            whys = self.copied.get(name, []) + self.copied.get(None, [])
            if whys and name not in found:
                copied[name] = f"`{name}` ran code copied from the answer key: {whys[0]}"
            whys = self.tampered.get(name, []) + self.tampered.get(None, []) + self.tampered.get("*", [])
            if whys and name not in found:
                found[name] = f"`{name}` {whys[0]} — {TAMPERED_TAIL}"
        if self.dead is not None:
            return {**copied, **found}
        try:
            seen = self._request_raw("refs", None, (list(names),), during="the reference-use query")
        except IsolationError:
            return {**copied, **found}
        seen = {k: v[:400] for k, v in seen.items() if k in names and type(v) is str} if type(seen) is dict else {}
        return {**copied, **seen, **found}

    def proxy(self, oid: int, info: dict) -> ChildProxy:
        """A proxy of the child's object `oid` (the codec's `R` tag), of the exercise whose request it came in."""
        return ChildProxy(self, oid, info, root=self._root_now)


WALL_FACTOR = 2.0  # a check's wall-clock ceiling, in exercise time limits (`Session._past_deadline`)
