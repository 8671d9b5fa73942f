"""Week 21's ServingLoop: the front end's calls made while `run_once` is inside `engine.step()`.

In the server, `submit` and `cancel` run on the HTTP thread whenever a request comes, and the engine thread is inside
`step()` most of the time. A loop that reads its queue before the step and empties it after (red team 12b's #7: a
copy of the inbox at the start of `run_once`, `clear()` at its end) loses every submission made during the step (most
of them in the red team's two-thread run: tests/fixtures/redteam/v12b/w21_servingloop_race_demo.py). The check's
other calls come one at a time, between two `run_once`s, where that loop is right. Here the engine view's `step()`
makes a `submit`, then a `cancel`, first: in the notebook's own process from a thread, as the server's front end does
(waiting at most `WAIT` seconds: a loop that holds a lock across the whole step makes its front end wait for every
step); in the student's process as a request served while the step's reply is awaited (the same thread: a lock held
across the step never returns there, and the call runs into the per-call time limit).
"""
from __future__ import annotations

import threading

from grader.checks import seed_note
from grader.wire import StudentTimeout

WAIT = 5.0  # seconds a front-end call made during a step may take, in the notebook's process


def _stepping_view(base, engine, here: bool):
    class Stepping(base):
        """The check's engine view, whose `step()` first makes the front end's calls queued in `during`."""

        def __init__(self):
            super().__init__(engine)
            self.during: list = []
            self.stuck: list[str] = []

        def step(self):
            calls, self.during = self.during, []
            for what, call in calls:
                if here:  # the notebook's own process: a thread, as the server's (a held lock must not hang a kernel)
                    t = threading.Thread(target=call, daemon=True)
                    t.start()
                    t.join(WAIT)
                    if t.is_alive():
                        self.stuck.append(what)
                else:  # the student's process serves it while it waits for this step's reply
                    try:
                        call()
                    except StudentTimeout:  # (the process is stopped: what follows fails, this says why)
                        self.stuck.append(what)
                        raise
            return super().step()
    return Stepping()


def check_calls_during_step(ServingLoop, engine, eos, prompt: list, want: list, base, here: bool) -> None:
    """`prompt` gives `want` alone (its first 3 tokens, none the end-of-sequence token); `engine` is fresh."""
    from lib.modeling.sampling import SamplingParams

    view = _stepping_view(base, engine, here)
    loop = ServingLoop(view, eos)
    loop.submit("first", list(prompt), 6, SamplingParams())
    view.during = [("submit('second')", lambda: loop.submit("second", list(prompt), 3, SamplingParams()))]
    runs = []
    try:
        for run in range(8):
            runs.append(loop.run_once())
            if run == 0:
                view.during = [("cancel('first')", lambda: loop.cancel("first"))]
    except Exception:  # (the call that never returned stopped the student's process: said below)
        if not view.stuck:
            raise
    assert not view.stuck, (
        f"{view.stuck[0]}, made while run_once was inside engine.step() (as the server's front end makes it), did "
        f"not return ({f'within {WAIT:g} s' if here else 'within the call time limit'}): does your loop hold a lock "
        f"across the whole run_once? The front end would wait for every step. Hold a lock only while moving requests "
        f"in and out of the queue")
    second = [[m for m in msgs if m[1] == "second"] for msgs in runs]
    assert second[1][:1] == [("token", "second", want[0])], (
        f"submit('second'), made while run 0 was inside engine.step(), gave {second[1] or 'nothing'} at run 1 "
        f"(runs 0-7: {second}): a submission that arrives during a step must run in the next one. Does run_once read "
        f"the queue before the step and empty it after? What arrived in between is lost {seed_note()}")
    first = [m for msgs in runs[2:] for m in msgs if m[1] == "first"]
    assert first[:1] == [("done", "first", "abort")], (
        f"cancel('first'), made while run 1 was inside engine.step(), gave {first[:3] or 'nothing'} from run 2 on: "
        f"a cancellation that arrives during a step applies at the next run_once {seed_note()}")
