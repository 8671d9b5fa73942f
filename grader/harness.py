"""The glue between a week's notebook, its checks and pytest.

- `Week(16, "week16_kv_cache.ipynb")` names a week's notebook; its `exercise` decorator registers a
  check for one exercise and turns a stub's `NotImplementedError` into a friendly failure:
  "exercise 2, `causal_mask`, is not implemented yet — section 2 of weeks/16/week16_kv_cache.ipynb".
- `load_exercises(path)` runs only a notebook's exercise cells (nbgrader solution cells, plus cells
  tagged `setup`, such as imports) into a fresh module: no demo cells, no plots, no model loads.

The same check is called by the week's pytest file (on the module `load_exercises` returns) and by
the notebook's nbgrader test cells (on the functions defined in the running kernel).

Isolation: `load_exercises` runs the exercise cells in a separate, resource-limited process
(`grader.isolation`) and returns a module-like object whose functions and classes are proxies: the
check runs here, the student's code there, and only data crosses. `python -m grader autograde` grades
the same way. Set `INFERENCE_LAB_ISOLATION=0` to run the cells in this process instead (debugging).
A check that passes on code that *is* or *runs* `lib`'s own implementation of the exercise fails with
a message saying so ("reference use"); see grader/README.md.
"""
from __future__ import annotations

import contextvars
import functools
import json
import os
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from grader.notebook import (ExerciseMissing, NotImplementedYet, ReferenceUse, exercise_cells, exercise_module,
                             read_notebook)
from grader.status import TAMPERED_TAIL


def _session_of(args, kwargs):
    """The isolation session of the student's objects among a check's arguments (None: in-process)."""
    from grader.isolation import ChildProxy

    for arg in list(args) + list(kwargs.values()):
        proxy = getattr(arg, "_remote", arg)
        if isinstance(proxy, ChildProxy):
            return proxy._session
    return None


# True while a check runs on a student's objects in the isolated child (`Week.exercise`'s wrapper sets it). The
# child runs every Triton kernel in Triton's interpreter, on a GPU machine too (`grader.isolation`), so week 17's
# checks judge a kernel's route there whatever this process's TRITON_INTERPRET says
# (`grader.checks.week17_triton.interpreting`).
CHECKING_ISOLATED: contextvars.ContextVar[bool] = contextvars.ContextVar("checking_isolated", default=False)


def _reference_use(name: str, args, kwargs) -> str | None:
    session = _session_of(args, kwargs)
    return session.reference_use([name]).get(name) if session is not None else None


def _looked_up(args, kwargs) -> str | None:
    """The name the student's object among a check's arguments was looked up by (`ex.<name>`), if any."""
    from grader.isolation import ChildProxy

    for arg in list(args) + list(kwargs.values()):
        proxy = getattr(arg, "_remote", arg)
        if isinstance(proxy, ChildProxy) and isinstance(proxy._name, str):
            return proxy._name
    return None


def _unreached(session, name: str, exercises: list[str]) -> tuple[str | None, int]:
    """(why exercise `name` has code that never ran while its checks ran, or None; how many lines of the cells' code
    ran for it) — `grader.ran`; (None, 0) when the child has died (its records went with it: the check that passed
    ran in a new one)."""
    from grader.isolation import IsolationError

    if session.dead is not None:
        return None, 0
    try:
        got = session._request_raw("unreached", None, (name, exercises), during="the query of which lines ran")
    except IsolationError:
        return None, 0
    if type(got) is not tuple or len(got) != 2 or type(got[1]) is not int:
        raise IsolationError("the student's process answered the query of which lines ran with something else")
    why, lines = got
    return (why[:900] if type(why) is str else None), lines


@dataclass
class Week:
    number: int
    notebook: str  # file name inside weeks/NN/
    # What of lib the notebook's code may use while it is graded: module -> names (or "*"); the rest of lib, and
    # every lib function or class named like one of the week's exercises, is a stub in its process (grader.view).
    child_may_use: dict = field(default_factory=dict)
    exercises: dict[str, tuple[int, str]] = field(default_factory=dict)  # name -> (number, section)

    def view(self):
        """The `grader.view.ViewSpec` the notebook's code is graded under."""
        from grader.view import ViewSpec

        return ViewSpec.make(self.number, self.child_may_use, self.exercises)

    @property
    def location(self) -> str:
        return f"weeks/{self.number}/{self.notebook}"

    def exercise(self, number: int, name: str, section: str, max_python_lines: int | None = None,
                 max_python_lines_why: str = "formula"):
        """Decorate `check_<name>(student_fn, ...)`; a stub raising NotImplementedError fails with a clear message.
        `max_python_lines`: the most lines of the notebook's Python its calls in one check may run (counted by
        `grader.ran`, whatever the machine's load): a formula's exercise is not passed by a simulation."""
        self.exercises[name] = (number, section)

        def decorate(check):
            @functools.wraps(check)
            def wrapper(*args, **kwargs):
                __tracebackhide__ = True  # pytest: show the student the message, not the check's source
                from grader.isolation import IsolationError

                session = _session_of(args, kwargs)
                if session is not None:
                    session.begin_check()
                isolated = CHECKING_ISOLATED.set(session is not None)
                try:
                    result = check(*args, **kwargs)
                except (NotImplementedError, NotImplementedYet) as e:
                    if isinstance(e, NotImplementedYet) and "is not implemented yet: it is not defined in" in str(e):
                        raise NotImplementedYet(f"exercise {number}, `{name}`: {e}") from None
                    raise NotImplementedYet(
                        f"exercise {number}, `{name}`, is not implemented yet — section {section} of "
                        f"{self.location}. Replace the `raise NotImplementedError()` with your code, "
                        f"then run `pytest weeks/{self.number} -k ex{number:02d}`."
                    ) from None
                except ExerciseMissing as e:
                    raise ExerciseMissing(f"exercise {number}, `{name}`: {e}") from None
                except IsolationError as e:
                    raise type(e)(f"exercise {number}, `{name}`: {e}") from None
                except AssertionError as e:
                    raise AssertionError(f"exercise {number}, `{name}`: {e}") from None
                except Exception as e:  # noqa: BLE001  (a wrong return type tripping the check, say)
                    raise AssertionError(f"exercise {number}, `{name}`: {type(e).__name__}: {e}") from None
                finally:
                    CHECKING_ISOLATED.reset(isolated)
                    if session is not None:
                        session.end_check()
                used = _reference_use(name, args, kwargs)
                if used:
                    tail = (f"The check passed, but on lib's implementation, not yours: write `{name}` yourself "
                            f"(lib/ is the answer key)." if not used.endswith(TAMPERED_TAIL) else
                            "Its numbers do not count: let the graded code run as plain code, on the thread that "
                            "calls it, with the grader's watch left as it is.")
                    raise ReferenceUse(f"exercise {number}, `{name}`: {used}. {tail}")
                # judged when the object the check was given is the notebook's `name` (as grading gives it); a
                # function looked up by another name (a test's route beside others in one cell) is not
                judged = _looked_up(args, kwargs) in (None, name) and session is not None
                unreached, lines = _unreached(session, name, list(self.exercises)) if judged else (None, 0)
                if unreached:
                    raise AssertionError(f"exercise {number}, `{name}` {unreached}.")
                if max_python_lines is not None and lines > max_python_lines:
                    raise AssertionError(
                        f"exercise {number}, `{name}` ran {lines:,} lines of Python for this check's calls; a "
                        f"{max_python_lines_why} takes at most {max_python_lines:,}: {name} is to be worked out, "
                        f"not simulated or searched for in the graded function")
                return result

            wrapper.exercise = (self.number, number, name)
            return wrapper

        return decorate


def with_cell_source(nb: dict, grade_id: str, source: str, prepend: bool = False) -> dict:
    """A copy of notebook `nb` whose cell `grade_id` holds `source` (dedented), or `source` followed by its old
    source (`prepend=True`). For crafting submissions in tests; raises KeyError for an unknown grade_id."""
    import textwrap

    nb = json.loads(json.dumps(nb))
    for cell in nb["cells"]:
        if cell["metadata"].get("nbgrader", {}).get("grade_id") == grade_id:
            old = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
            cell["source"] = (textwrap.dedent(source) + "\n" + old) if prepend else textwrap.dedent(source)
            return nb
    raise KeyError(grade_id)


def _warn_other_notebooks(path: Path) -> None:
    others = sorted(p.name for p in path.parent.glob("*.ipynb") if p.name != path.name)
    if others:
        msg = (f"{path.parent} holds {len(others) + 1} notebooks; testing {path.name} only (not "
               f"{', '.join(others)}). Work in {path.name}, or copy your work into it.")
        warnings.warn(msg, stacklevel=3)
        print(f"WARNING: {msg}", file=sys.stderr)


class IsolatedExercises:
    """What `load_exercises` returns: `ex.<name>` is the notebook's `name`, living in a child process."""

    def __init__(self, path: Path, session):
        self.__file__ = str(path)
        self._session = session

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return self._session.get(name)

    def close(self) -> None:
        self._session.close()


def threads_per_worker(jobs: int = 1) -> int:
    """torch threads for each grading or checking process: this process's share of the CPU (its affinity mask and
    its cgroup's CPU quota, `lib.bench.threads`), less what the machine's other work keeps busy (cores minus the 1-minute
    load average, rounded), shared out among `jobs` workers, at least one. Threads beyond the idle cores wait on
    each other: on 2 cores at load 3, week 16's checks took ~115 s with 2 threads and 8 s with 1
    (tests/test_week16_checks.py). `INFERENCE_LAB_THREADS` overrides; `OMP_NUM_THREADS` does not (a worker's
    share is the grader's to decide)."""
    from lib.bench.threads import choose

    return choose(jobs, environ={k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}).threads


def _fewer_threads_when_busy() -> None:
    """The checks run in this process (pytest's): on a machine whose other work keeps its cores busy, torch's
    threads wait on each other (week 16's checks: 8 s with 1 thread, ~115 s with 2, 2 cores at load 3), so use
    no more threads than there are idle cores. Never more threads than torch already uses."""
    import torch

    torch.set_num_threads(min(torch.get_num_threads(), threads_per_worker(1)))


def week_of(notebook: str | Path) -> Week | None:
    """The `Week` a notebook belongs to, by its name (`week16_...ipynb` -> `grader.checks.week16.WEEK`), or None."""
    import importlib
    import re

    match = re.match(r"week(\d+)_", Path(notebook).name)
    if not match:
        return None
    try:
        return importlib.import_module(f"grader.checks.week{int(match[1])}").WEEK
    except (ImportError, AttributeError):
        return None


def load_exercises(notebook: str | Path, isolated: bool | None = None, week: Week | None = None, view=None):
    """Execute the exercise (and `setup`-tagged) cells of `notebook`, in order, into a new module.

    Isolated (the default): in a child process, returning proxies, with `week`'s view of the lab (`Week.view`;
    the week is found from the notebook's name when not given; without one, no part of lib keeps its code
    there; `view` overrides it, e.g. `ViewSpec.everything()` in tests of what the checks catch behind it);
    `isolated=False` or `INFERENCE_LAB_ISOLATION=0`: in this process, returning the module itself."""
    path = Path(notebook)
    nb = read_notebook(path)
    _warn_other_notebooks(path)
    _fewer_threads_when_busy()
    cells = exercise_cells(nb)
    if isolated is None:
        isolated = os.environ.get("INFERENCE_LAB_ISOLATION", "1") != "0"
    if isolated:
        from grader.isolation import Session

        week = week if week is not None else week_of(path)
        session = Session(path, view=view if view is not None else week.view() if week is not None else None)
        session.load(cells)
        return IsolatedExercises(path, session)
    return exercise_module(path, cells)
