"""Week 21's ServingLoop: the front end's calls made while `run_once` is inside `engine.step()`.

In the server, `submit` and `cancel` run on the HTTP thread whenever a request comes, and the engine thread is inside
`step()` most of the time. A loop that reads its queue before the step and empties it after (red team 12b's #7: a
copy of the inbox at the start of `run_once`, `clear()` at its end) loses every submission made during the step (most
of them in the red team's two-thread run: tests/fixtures/redteam/v12b/w21_servingloop_race_demo.py). The check's
other calls come one at a time, between two `run_once`s, where that loop is right. Here the engine view's `step()`
makes a `submit`, then a `cancel`, first, on a thread as the server's front end does — of the notebook's own process,
or of the student's where the loop runs there (`grader.child`'s "thread" request) — waiting at most `WAIT` seconds: a
loop that holds a lock across the whole step, a re-entrant one too (red team 13's #1), makes its front end wait for
every step; so does one whose calls wait for its lock with a timeout (13b's #5): a call must take under `SLOW`. And
its `add_request()` and `abort()` each make a `submit` (red team 13's #2, 13b's #4: a loop that empties its inbox after
applying part of it loses what arrived meanwhile), which must run in that run or the next.
"""
from __future__ import annotations

import threading
import time

from grader.checks import seed_note
from grader.wire import StudentTimeout

WAIT = 5.0  # seconds a front-end call made during a step is waited for
SLOW = 0.2  # ... and may take (a swap under a lock takes microseconds; a lock across the step waits for the step)
ADD_WAIT = 1.0  # ... made during add_request or abort, waited for before the loop goes on (a lock held there: after)


def _stepping_view(base, engine, here: bool):
    class Stepping(base):
        """The check's engine view, whose `step()`, `add_request()` and `abort()` first make the front end's calls
        queued in `during`, `adding` and `aborting`."""

        def __init__(self):
            super().__init__(engine)
            self.during: list = []
            self.adding: list = []
            self.aborting: list = []
            self.stuck: list[str] = []

        def _front(self, calls, strict: bool = True):
            """`strict`: a call that takes SLOW seconds or more (waited for up to WAIT) is a finding (in add_request
            a loop may hold its lock: the call goes on once it is released, waited for ADD_WAIT)."""
            for what, call in calls:
                if here:  # the notebook's own process: a thread, as the server's (a held lock must not hang a kernel)
                    took = []
                    t = threading.Thread(target=lambda: took.append(_timed(call)), daemon=True)
                    t.start()
                    t.join(WAIT if strict else ADD_WAIT)
                    slow = t.is_alive() or not took or took[0] >= SLOW
                else:  # the student's process runs it on a thread of its own while it waits for this reply
                    try:
                        reply = call(WAIT if strict else ADD_WAIT)
                    except StudentTimeout:  # (the process is stopped: what follows fails, this says why)
                        self.stuck.append(what)
                        raise
                    slow = reply[0] == "stuck" or reply[1] >= SLOW
                if slow and strict:
                    self.stuck.append(what)

        def add_request(self, *args, **kwargs):
            calls, self.adding = self.adding, []
            self._front(calls, strict=False)
            return super().add_request(*args, **kwargs)

        def abort(self, *args, **kwargs):
            calls, self.aborting = self.aborting, []
            self._front(calls, strict=False)
            return super().abort(*args, **kwargs)

        def step(self):
            calls, self.during = self.during, []
            self._front(calls)
            return super().step()
    return Stepping()


def check_calls_during_step(ServingLoop, engine, eos, prompt: list, want: list, base, here: bool) -> None:
    """`prompt` gives `want` alone (its first 3 tokens, none the end-of-sequence token); `engine` is fresh."""
    from lib.modeling.sampling import SamplingParams

    view = _stepping_view(base, engine, here)
    loop = ServingLoop(view, eos)

    def front(method, *args):  # the front end's call, on a thread (of the student's process where the loop runs there)
        return (lambda *_: method(*args)) if here else (lambda wait: method._do("thread", args, {}, wait))
    loop.submit("first", list(prompt), 6, SamplingParams())
    view.adding = [("submit('third') (while run 0 handed 'first' to the engine)",
                    front(loop.submit, "third", list(prompt), 3, SamplingParams()))]
    view.during = [("submit('second')", front(loop.submit, "second", list(prompt), 3, SamplingParams()))]
    runs = []
    try:
        for run in range(8):
            runs.append(loop.run_once())
            if run == 0:
                view.during = [("cancel('first')", front(loop.cancel, "first"))]
                view.aborting = [("submit('fourth')", front(loop.submit, "fourth", list(prompt), 3, SamplingParams()))]
    except Exception:  # (the call that never returned stopped the student's process: said below)
        if not view.stuck:
            raise
    assert not view.stuck, (
        f"{view.stuck[0]}, made while run_once was inside engine.step() (as the server's front end makes it), took "
        f"{SLOW:g} s or more: does your loop hold a lock across the whole run_once (a re-entrant one too, or one waited "
        f"for with a timeout)? The front end would wait for every step. Hold a lock only while moving requests in and "
        f"out of the queue")
    second = [[m for m in msgs if m[1] == "second"] for msgs in runs]
    assert second[1][:1] == [("token", "second", want[0])], (
        f"submit('second'), made while run 0 was inside engine.step(), gave {second[1] or 'nothing'} at run 1 "
        f"(runs 0-7: {second}): a submission that arrives during a step must run in the next one. Does run_once read "
        f"the queue before the step and empty it after? What arrived in between is lost {seed_note()}")
    first = [m for msgs in runs[2:] for m in msgs if m[1] == "first"]
    assert first[:1] == [("done", "first", "abort")], (
        f"cancel('first'), made while run 1 was inside engine.step(), gave {first[:3] or 'nothing'} from run 2 on: "
        f"a cancellation that arrives during a step applies at the next run_once {seed_note()}")
    for rid, run, inside in (("third", 0, "handing 'first' to the engine (inside engine.add_request)"),
                             ("fourth", 2, "cancelling 'first' (inside engine.abort)")):
        got = [m for msgs in runs[run:run + 2] for m in msgs if m[1] == rid]
        assert got[:1] == [("token", rid, want[0])], (
            f"submit('{rid}'), made while run {run} was {inside}, gave {got[:3] or 'nothing'} in runs {run}-{run + 1}: a "
            f"submission that arrives while run_once applies the queue must run in that run or the next. Does run_once "
            f"empty the queue after reading it? Take the queue and put an empty one in its place in one step, under the "
            f"lock {seed_note()}")


def _timed(call) -> float:
    """How long `call()` took, in seconds (the front end's call, on its thread)."""
    start = time.perf_counter()
    try:
        call()
    except Exception:  # noqa: BLE001  (what it raised shows in what the runs give)
        pass
    return time.perf_counter() - start
