"""nbgrader autograde without a Jupyter kernel: the notebook's exercise cells run isolated, the tests run here.

`IsolatedExecute` replaces nbgrader's `Execute` preprocessor (see `course_config`). For one submission it

1. starts a `grader.isolation.Session` and runs the notebook's exercise cells (nbgrader solution cells and
   `setup`-tagged cells) in the child — the same cells, loaded the same way, as `pytest weeks/NN`;
2. runs each graded test cell **here**, with the source the gradebook holds for it (never the submission's),
   in a namespace where the release's setup names (the `check_*` functions, torch, ...) come first and the
   notebook's names are proxies into the child: a student cannot rebind `check_*` or patch `grader.checks`;
3. writes each test's outcome as the cell's output (an error output of one line, which nbgrader scores 0),
   and the trusted side's notes (failed tests, reference use, load problems, sandbox) to
   `grader/grading_status/<week>/<student>.json`, which `export` reads.

Demo and measurement cells are not run at all when grading: they earn no points, and the tests do not
depend on them (exercise cells only define things), so grading an honest week-16 submission takes tens of
seconds instead of minutes. Set `INFERENCE_LAB_ISOLATION=0` to use nbgrader's kernel execution instead.
"""
from __future__ import annotations

import builtins
import contextlib
import io
import json
import time
from pathlib import Path

from nbformat.v4 import new_output
from traitlets import Unicode

from nbgrader.preprocessors import NbGraderPreprocessor

from grader.notebook import exercise_cells
from grader.status import limits, one_line, write_status


class _Names(dict):
    """Locals of a test cell: names the cell assigns, then the trusted setup names, then the notebook's (proxies)."""

    def __init__(self, trusted: dict, session):
        super().__init__()
        self.trusted = trusted
        self.session = session

    def __getitem__(self, key):
        if dict.__contains__(self, key):
            return dict.__getitem__(self, key)
        if key in self.trusted:
            return self.trusted[key]
        if hasattr(builtins, key) or key.startswith("__"):
            raise KeyError(key)
        return self.session.get(key)


def _week_view(week: str):
    """The view of the lab the week's notebook is graded under (`grader.view`), from the week's checks."""
    import importlib

    try:
        return importlib.import_module(f"grader.checks.week{week}").WEEK.view()
    except (ImportError, AttributeError):
        return None


def _trusted_namespace(root: Path, week: str, notebook_id: str) -> dict:
    """The release's setup cells, run here (the instructor's code), plus every `check_*` of the week."""
    import importlib

    ns: dict = {"__name__": "__grading__"}
    release = root / "weeks" / week / f"{notebook_id}.ipynb"
    if release.is_file():
        nb = json.loads(release.read_text(encoding="utf-8"))
        for cell in nb.get("cells", []):
            if cell.get("cell_type") == "code" and "setup" in cell.get("metadata", {}).get("tags", []):
                src = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
                src = "\n".join(ln for ln in src.splitlines() if not ln.lstrip().startswith(("%", "!")))
                exec(compile(src, f"{release.name}[setup]", "exec"), ns)
    try:
        checks = importlib.import_module(f"grader.checks.week{week}")
    except ImportError:
        checks = None
    if checks is not None:
        ns.update({k: v for k, v in vars(checks).items() if k.startswith("check_")})
        ns.setdefault("checks", checks)
    return ns


class IsolatedExecute(NbGraderPreprocessor):
    course_root = Unicode("", help="the course root (for the release's setup cells and the status file)").tag(config=True)

    def preprocess(self, nb, resources):
        from nbgrader.api import Gradebook, MissingEntry

        from grader.isolation import IsolationError, Session

        info = resources["nbgrader"]
        week, student, notebook_id = str(info["assignment"]), str(info["student"]), str(info["notebook"])
        root = Path(self.course_root or ".").resolve()
        start = time.monotonic()
        notes: dict = {"failed": [], "reference_use": [], "load_problems": {}, "tests": {}}

        # The source of every graded test cell, from the gradebook: never the submission's.
        sources: dict[str, str] = {}
        with Gradebook(info["db_url"]) as gb:
            for cell in nb.cells:
                meta = cell.metadata.get("nbgrader", {})
                if cell.cell_type == "code" and meta.get("grade") and not meta.get("solution"):
                    try:
                        sources[meta["grade_id"]] = gb.find_source_cell(meta["grade_id"], notebook_id, week).source
                    except MissingEntry:
                        pass

        # A graded test whose code runs out of its time limit loses its points and the next one gets a fresh child:
        # allow a restart per graded test (the notebook's budget stays the backstop).
        session = Session(Path(resources.get("metadata", {}).get("path", ".")) / f"{notebook_id}.ipynb",
                          max_restarts=max(4, len(sources)), view=_week_view(week))
        limit = limits().exercise_timeout
        try:
            try:
                began = time.monotonic()
                load = session.load(exercise_cells(nb))
                notes["start_seconds"] = round(time.monotonic() - began, 1)
                notes["sandbox"] = getattr(session, "sandbox", "")
                notes["load_problems"] = {**load.get("broken", {}), **{c: "NotImplementedError" for c in load.get("stubbed", [])}}
                notes["exercise_time_limit"] = limit
            except IsolationError as e:
                notes["load_problems"] = {"exercise cells": one_line(e)}
                if session.timeouts:
                    notes.setdefault("timed_out", {})["exercise cells"] = session.timeouts[-1]
            trusted = _trusted_namespace(root, week, notebook_id)
            for cell in nb.cells:
                meta = cell.metadata.get("nbgrader", {})
                if cell.cell_type != "code":
                    continue
                cell.outputs = []
                if meta.get("solution"):
                    label = meta.get("grade_id")
                    problem = next((why for where, why in notes["load_problems"].items() if label and label in where), None)
                    if problem and problem != "NotImplementedError":
                        cell.outputs.append(new_output("stream", name="stdout",
                                                       text=f"[grader] this cell raised {problem}\n"))
                    continue
                if not (meta.get("grade") and cell.metadata.get("nbgrader", {}).get("grade_id") in sources):
                    continue  # demo, plot and measurement cells are not run when grading
                grade_id = meta["grade_id"]
                began, timeouts = time.monotonic(), len(session.timeouts)
                with session.time_limit(grade_id, limit):
                    outcome = self._run_test(sources[grade_id], trusted, session)
                notes.setdefault("test_seconds", {})[grade_id] = round(time.monotonic() - began, 1)
                if len(session.timeouts) > timeouts:  # which test ran out of time, and which limit stopped it
                    notes.setdefault("timed_out", {})[grade_id] = session.timeouts[-1]
                notes["tests"][grade_id] = outcome or "passed"
                if outcome is None:
                    cell.outputs.append(new_output("stream", name="stdout", text="passed\n"))
                else:
                    notes["failed"].append(grade_id)
                    cell.outputs.append(new_output("error", ename=outcome.split(":", 1)[0],
                                                   evalue=outcome.split(":", 1)[-1].strip(), traceback=[outcome]))
            names = [n for n in _exercise_names(trusted)]
            used = session.reference_use(names) if names else {}
            notes["reference_use"] = sorted(used)
            notes["reference_use_why"] = {name: used[name] for name in sorted(used)}
            notes["nearest_reference"] = dict(sorted(getattr(session, "nearest", {}).items()))  # below the thresholds too
        finally:
            notes["restarts"] = session.restarts
            session.close()
        notes["seconds"] = round(time.monotonic() - start, 1)
        write_status(root, week, student, notes)
        return nb, resources

    @staticmethod
    def _run_test(source: str, trusted: dict, session) -> str | None:
        """Run one test cell here; None if it passed, else one line: `Type: message`."""
        names = _Names(trusted, session)
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out):
                exec(compile(source, "<test cell>", "exec"), dict(trusted), names)
        except BaseException as e:
            if isinstance(e, KeyboardInterrupt):
                raise
            return one_line(f"{type(e).__name__}: {e}", limit=1000)
        return None


def _exercise_names(trusted: dict) -> list[str]:
    checks = trusted.get("checks")
    week = getattr(checks, "WEEK", None)
    return sorted(week.exercises) if week is not None else []
