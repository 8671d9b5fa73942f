"""nbgrader, driven from Python: one configuration for the repo and for throw-away course folders.

`course_config(root)` is the single description of the course layout; `grader/nbgrader_config.py`
uses it for the real course, and tests use it for a temporary copy. `Course` wraps nbgrader's
Python API (`NbGraderAPI`), which is several times faster than one `nbgrader` CLI call per step.
"""
from __future__ import annotations

import csv
import json
import os
import re
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

from traitlets.config import Config

from grader.course_map import week_folders
from grader.notebook import validate_notebook
from grader.similarity import match_label
from grader.status import (GradingError, limits_set, one_line, read_status, status_files, status_path,
                            write_status)

REPO_ROOT = Path(__file__).resolve().parent.parent
WEEKS = week_folders()  # ("16", "17", ...): grader/course_map.py declares the course


NBGRADER_EXCHANGE = "/srv/nbgrader/exchange"  # nbgrader's default exchange, where a shared machine or hub keeps it


def exchange_root(root: Path) -> str:
    """Where nbgrader's exchange is (release, fetch, submit, collect between users: a hub or a shared machine):
    $INFERENCE_LAB_EXCHANGE if set; else nbgrader's default where it exists; else grader/exchange in the course
    (git-ignored; created here, empty, so the formgrader does not warn that the exchange is missing — the lab's
    own route on one machine, `python -m grader collect`, does not use it)."""
    chosen = os.environ.get("INFERENCE_LAB_EXCHANGE")
    if chosen:
        return chosen
    if os.path.isdir(NBGRADER_EXCHANGE):
        return NBGRADER_EXCHANGE
    local = root / "grader" / "exchange"
    try:
        local.mkdir(parents=True, exist_ok=True)
    except OSError:  # a read-only checkout: nbgrader says what is missing when the exchange is used
        pass
    return str(local)


def course_config(root: str | Path, db: str | Path | None = None) -> Config:
    root = Path(root).resolve()
    db = Path(db) if db is not None else root / "grader" / "gradebook.db"
    c = Config()
    c.CourseDirectory.root = str(root)
    c.CourseDirectory.course_id = "inference-lab"
    c.CourseDirectory.source_directory = "solutions"
    c.CourseDirectory.release_directory = "weeks"
    c.CourseDirectory.submitted_directory = "grader/submitted"
    c.CourseDirectory.autograded_directory = "grader/autograded"
    c.CourseDirectory.feedback_directory = "grader/feedback"
    c.CourseDirectory.db_url = f"sqlite:///{db}"
    c.CourseDirectory.ignore = [".ipynb_checkpoints", "*.pyc", "__pycache__", ".pytest_cache", "*.backup-*"]
    c.Exchange.root = exchange_root(root)
    c.ExchangeFactory.collect = "grader.exchange.OwnerCheckedCollect"  # refuses submissions forged in another's name
    if os.environ.get("INFERENCE_LAB_ISOLATION", "1") != "0":
        # Grading runs the exercise cells in an isolated child and the tests here (grader/grading.py);
        # nbgrader's kernel execution (every cell, demos included, in the instructor's account) is not used.
        from nbconvert.preprocessors import ClearMetadataPreprocessor
        from nbgrader.preprocessors import (AssignLatePenalties, CheckCellMetadata, IgnorePattern, LimitOutput,
                                            SaveAutoGrades)

        from grader.grading import IsolatedExecute

        c.Autograde.autograde_preprocessors = [IsolatedExecute, IgnorePattern, ClearMetadataPreprocessor, LimitOutput,
                                               SaveAutoGrades, AssignLatePenalties, CheckCellMetadata]
        c.IsolatedExecute.course_root = str(root)
    # INFERENCE_LAB_ISOLATION=0 (debugging only): nbgrader runs the whole notebook in a kernel; the slowest
    # honest cell (a real-model demo) takes about 2 minutes on 2 loaded cores.
    c.ExecutePreprocessor.timeout = 300
    c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
    c.ClearSolutions.text_stub = "YOUR ANSWER HERE"
    return c


def _venv_on_path() -> None:
    """nbgrader runs `alembic` by name: the interpreter's bin/ must be on PATH (a failure there deleted a release)."""
    bindir = str(Path(sys.executable).parent)
    if bindir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")


class Course:
    def __init__(self, root: str | Path = REPO_ROOT, db: str | Path | None = None):
        from nbgrader.apps import NbGraderAPI
        from nbgrader.coursedir import CourseDirectory

        _venv_on_path()
        self.root = Path(root).resolve()
        db = Path(db) if db is not None else self.root / "grader" / "gradebook.db"
        db.parent.mkdir(parents=True, exist_ok=True)
        self.db = db
        self.config = course_config(self.root, db)
        self.api = NbGraderAPI(coursedir=CourseDirectory(config=self.config), config=self.config)

    @staticmethod
    def _ok(result: dict, step: str) -> dict:
        if not result.get("success"):
            raise GradingError(f"nbgrader {step} failed: {nbgrader_cause(result)}")
        return result

    # --- the gradebook -------------------------------------------------------------------------------------

    def has_assignment(self, week: str) -> bool:
        from nbgrader.api import Gradebook, MissingEntry

        with Gradebook(self.config.CourseDirectory.db_url) as gb:
            try:
                gb.find_assignment(str(week))
            except MissingEntry:
                return False
        return True

    def ensure_assignment(self, week: str) -> str | None:
        """Make sure the gradebook knows week `week` (a fresh clone's gradebook is empty: it is gitignored).

        Adds it from solutions/<week>, as `python -m grader release <week>` does, without touching weeks/.
        Returns a line saying so, or None when it was there already."""
        week = str(week)
        if self.has_assignment(week):
            return None
        src = self.root / "solutions" / week
        if not src.is_dir():
            raise GradingError(f"the gradebook has no week {week} and there is no solutions/{week} to add it from")
        with tempfile.TemporaryDirectory() as tmp:
            shutil.copytree(src, Path(tmp) / "solutions" / week, ignore=shutil.ignore_patterns(
                "__pycache__", ".ipynb_checkpoints", ".pytest_cache"))
            Course(tmp, db=self.db).generate(week)
        return (f"the gradebook had no week {week}: added it from solutions/{week} "
                f"(what `python -m grader release {week}` does; weeks/{week} untouched)")

    def status_file(self, week: str, student: str) -> Path:
        return status_path(self.root, week, student)

    def record_status(self, week: str, student: str, **fields) -> None:
        """The trusted side's notes on one grading (status, error, reference use, per-exercise outcome)."""
        fields.setdefault("time", time.strftime("%Y-%m-%d %H:%M:%S"))
        write_status(self.root, week, student, fields)

    def read_status(self, week: str, student: str) -> dict:
        return read_status(self.root, week, student)

    def generate(self, week: str) -> Path:
        """solutions/<week> -> weeks/<week> (nbgrader replaces that folder) and the gradebook's copy of the assignment."""
        self._ok(self.api.generate_assignment(str(week), force=True), f"generate_assignment {week}")
        return self.root / "weeks" / str(week)

    def autograde(self, week: str, student: str) -> list[str]:
        """nbgrader's autograde of one submission; returns the warnings nbgrader raised on the way (SQLAlchemy's
        "SAWarning: Object of type <SubmittedNotebook> not in session", twice per submission, and the like) as
        one line each — `autograde_safely` logs them to the status file rather than the instructor's screen."""
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = self.api.autograde(str(week), student, force=True)
        self._ok(result, f"autograde {week} {student}")
        return list(dict.fromkeys(one_line(f"{w.category.__name__}: {w.message}", limit=300) for w in caught))

    def cell_problems(self, week: str, notebook: Path) -> tuple[str | None, list[str]]:
        """The submission's nbgrader cells against the gradebook's copy of the release: (a reason it cannot be
        graded — a grade_id the release does not have, which nbgrader fails on with no cause — or None, and the
        release's graded cells it lacks, which nbgrader scores 0)."""
        from nbgrader.api import Gradebook, MissingEntry

        nb = json.loads(notebook.read_text(encoding="utf-8"))
        ids = {}
        for i, cell in enumerate(nb.get("cells", [])):
            meta = cell.get("metadata", {}).get("nbgrader", {})
            if isinstance(meta, dict) and isinstance(meta.get("grade_id"), str) and \
                    (meta.get("grade") or meta.get("solution") or meta.get("locked") or meta.get("task")):
                ids.setdefault(meta["grade_id"], i)
        with Gradebook(self.config.CourseDirectory.db_url) as gb:
            try:
                source = gb.find_notebook(notebook.stem, str(week))
            except MissingEntry:
                names = ", ".join(n.name for n in gb.find_assignment(str(week)).notebooks)
                return (f"the notebook is named {notebook.name}, but week {week}'s release has {names}.ipynb", [])
            known = {c.name for c in source.source_cells}
            graded = [c.name for c in source.grade_cells] + [c.name for c in source.task_cells]
        unknown = [gid for gid in ids if gid not in known]
        missing = [gid for gid in graded if gid not in ids]
        if unknown:
            lacking = [gid for gid in known if gid not in ids]
            return (f"cell {ids[unknown[0]]} has grade_id {unknown[0]!r}, which week {week}'s release does not have "
                    f"(renamed, or copied from another notebook?)" +
                    (f"; the release's cells it lacks: {', '.join(lacking)}" if lacking else "") +
                    f" — restore that cell's metadata from weeks/{week}/{notebook.name}", missing)
        return None, missing

    def submitted_notebooks(self, week: str, student: str) -> list[Path]:
        folder = self.root / "grader" / "submitted" / student / str(week)
        return sorted(p for p in folder.glob("*.ipynb")) if folder.is_dir() else []

    def autograde_safely(self, week: str, student: str) -> str:
        """Validate, autograde and score one submission; a one-line summary, or GradingError with the cause."""
        week = str(week)
        nbs = self.submitted_notebooks(week, student)
        if not nbs:
            raise GradingError(f"no notebook in grader/submitted/{student}/{week}/ (run collect)")
        for nb in nbs:
            problem = validate_notebook(nb)
            if problem:
                raise GradingError(f"{nb.name}: {problem}")
        missing = []
        for nb in nbs:
            problem, lacking = self.cell_problems(week, nb)
            if problem:
                raise GradingError(f"{nb.name}: {problem}")
            missing += lacking
        self.status_file(week, student).unlink(missing_ok=True)  # the executor writes this run's notes
        caught = self.autograde(week, student)
        s = self.score(week, student)
        status = self.read_status(week, student)
        refs = status.get("reference_use", [])
        failed = status.get("failed", [])
        self.record_status(week, student, status="graded", error="", missing_cells=missing, nbgrader_warnings=caught,
                           **{k: v for k, v in status.items() if k not in ("status", "error", "time")})
        manual = " (written answers still to grade by hand)" if s["needs_manual_grade"] else ""
        why = failure_reasons(status)
        self.comment_reasons(week, student, nbs, status, why)
        extra = f"; reference use: {', '.join(reference_use_text(status))}" if refs else ""
        extra += f"; failed: {', '.join(f'{t} ({why[t]})' for t in failed)}" if failed else ""
        extra += f"; missing cells (0 points): {', '.join(missing)}" if missing else ""
        extra += f"; out of time: {', '.join(status['timed_out'])}" if status.get("timed_out") else ""
        return (f"{s['score']:g} / {s['max_score']:g}; autograded code {s['code_score']:g} / "
                f"{s['max_code_score']:g}{manual}{extra}")

    def comment_reasons(self, week: str, student: str, nbs: list[Path], status: dict, why: dict[str, str]) -> None:
        """The reason each exercise lost its points, as the autograder's comment on its solution cell: the formgrader
        shows it beside the student's code (and the feedback under it), as the one-line summary does. A cell the
        student left as released keeps nbgrader's own "No response."."""
        from nbgrader.api import Gradebook, MissingEntry

        reasons: dict[str, str] = {}
        for test, reason in why.items():  # test_<exercise> -> the exercise's solution cell
            reasons.setdefault(test.removeprefix("test_"), f"{test}: {reason}")
        for name, label in zip(status.get("reference_use", []), reference_use_text(status)):
            reasons[name] = f"reference use: {label}"
        if not reasons:
            return
        with Gradebook(self.config.CourseDirectory.db_url) as gb:
            for nb in nbs:
                for cell, text in reasons.items():
                    try:
                        comment = gb.find_comment(cell, nb.stem, str(week), student)
                    except MissingEntry:
                        continue
                    if comment.auto_comment != "No response.":
                        comment.auto_comment = f"[autograder] {text}"
            gb.db.commit()

    def feedback(self, week: str, student: str) -> Path:
        self._ok(self.api.generate_feedback(str(week), student, force=True), f"generate_feedback {week} {student}")
        return self.root / "grader" / "feedback" / student / str(week)

    def score(self, week: str, student: str) -> dict[str, float]:
        """Points of one autograded submission: total, and split into autograded code and hand-graded answers."""
        from nbgrader.api import Gradebook

        with Gradebook(self.config.CourseDirectory.db_url) as gb:
            sub = gb.find_submission(str(week), student)
            nbs = sub.notebooks
            return {
                "score": float(sub.score), "max_score": float(sub.max_score),
                "code_score": float(sum(nb.code_score for nb in nbs)),
                "max_code_score": float(sum(nb.max_code_score for nb in nbs)),
                "written_score": float(sum(nb.written_score for nb in nbs)),
                "max_written_score": float(sum(nb.max_written_score for nb in nbs)),
                "needs_manual_grade": bool(sub.needs_manual_grade),
            }

    def add_students(self, students: list[tuple[str, dict]]) -> None:
        """Add or update students in the gradebook: (id, {"first_name": ..., "last_name": ..., "email": ...})."""
        from nbgrader.api import Gradebook

        with Gradebook(self.config.CourseDirectory.db_url) as gb:
            for sid, fields in students:
                gb.update_or_create_student(sid, **fields)

    EXPORT_COLUMNS = ["assignment", "student_id", "first_name", "last_name", "status", "score", "max_score",
                      "code_score", "max_code_score", "written_score", "max_written_score", "needs_manual_grade",
                      "reference_use", "failed_exercises", "error", "timestamp"]

    def _submitted(self) -> dict[tuple[str, str], Path]:
        sub = self.root / "grader" / "submitted"
        found = {}
        if sub.is_dir():
            for student in sorted(p for p in sub.iterdir() if p.is_dir()):
                for week in sorted(p for p in student.iterdir() if p.is_dir()):
                    found[(week.name, student.name)] = week
        return found

    def rows(self) -> list[dict]:
        """One row per (week, student) that was submitted or graded: score, status, reference use, errors."""
        from nbgrader.api import Gradebook, MissingEntry

        rows = []
        submitted = self._submitted()
        with Gradebook(self.config.CourseDirectory.db_url) as gb:
            graded = set()
            for assignment in gb.assignments:
                for student in gb.students:
                    try:
                        sub = gb.find_submission(assignment.name, student.id)
                    except MissingEntry:
                        continue
                    graded.add((assignment.name, student.id))
                    status = self.read_status(assignment.name, student.id)
                    nbs = sub.notebooks
                    rows.append({
                        "assignment": assignment.name, "student_id": student.id,
                        "first_name": student.first_name or "", "last_name": student.last_name or "",
                        "status": status.get("status", "graded"),
                        "score": float(sub.score), "max_score": float(sub.max_score),
                        "code_score": float(sum(nb.code_score for nb in nbs)),
                        "max_code_score": float(sum(nb.max_code_score for nb in nbs)),
                        "written_score": float(sum(nb.written_score for nb in nbs)),
                        "max_written_score": float(sum(nb.max_written_score for nb in nbs)),
                        "needs_manual_grade": bool(sub.needs_manual_grade),
                        "reference_use": "; ".join(reference_use_text(status)),
                        "failed_exercises": " ".join(status.get("failed", [])),
                        "error": status.get("error", ""), "timestamp": sub.timestamp or "",
                    })
            for (week, student), _ in submitted.items():
                if (week, student) in graded:
                    continue
                status = self.read_status(week, student)
                rows.append({"assignment": week, "student_id": student,
                             "status": status.get("status") or "ungraded", "score": 0.0,
                             "error": status.get("error") or "submitted, never autograded: run "
                                                            f"`python -m grader autograde {week} {student}`"})
            for week, student in status_files(self.root):
                if (week, student) in graded or (week, student) in submitted:
                    continue
                status = self.read_status(week, student)
                rows.append({"assignment": week, "student_id": student, "status": status.get("status", "failed"),
                             "score": 0.0, "error": status.get("error", "")})
        return rows

    def ungraded(self) -> list[str]:
        return [f"week {r['assignment']} {r['student_id']}: {r['status']}: {r.get('error', '')}"
                for r in self.rows() if r["status"] != "graded"]

    def export(self, csv_path: str | Path) -> Path:
        """All grades to CSV, one row per student and week, ungraded and failed submissions included (score 0)."""
        csv_path = Path(csv_path)
        csv_path.parent.mkdir(parents=True, exist_ok=True)
        with open(csv_path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=self.EXPORT_COLUMNS, restval="")
            writer.writeheader()
            for row in self.rows():
                writer.writerow(row)
        return csv_path


def grading_worker() -> None:
    """Set up a process that grades submissions (each `--jobs` worker, and `python -m grader autograde` itself with
    `--jobs 1`): it becomes the subreaper of what it starts, so a process a submission leaves behind (double fork,
    `setsid`) is handed to it rather than to init, and is killed when that submission's child is stopped
    (`grader.processes.kill_tree`). And it is made non-dumpable, so that a child (no capabilities, the same uid or
    root without capabilities) cannot read its memory, environment, maps or open files under /proc
    (`grader.processes.make_undumpable`)."""
    from grader.processes import become_subreaper, make_undumpable

    become_subreaper()
    make_undumpable()


def shared_models_state() -> tuple:
    """What the worker's shared SmolLM2 is now (structure, dtypes, buffers and their in-place version counters):
    unchanged by any submission, or the next one would be graded against another model."""
    from lib.modeling.llama import shared_smollm2

    if shared_smollm2.cache_info().currsize == 0:
        return ()
    model, _ = shared_smollm2()
    return (type(model).__name__, model.training, len(list(model.modules())),
            tuple((n, str(t.dtype), tuple(t.shape), t.data_ptr(), t._version) for n, t in
                  [*model.named_parameters(), *model.named_buffers()]))


def forget_shared_models() -> None:
    """Drop the worker's shared model and every cached value of the checks (some hold the model)."""
    import functools
    import sys

    from lib.modeling.llama import shared_smollm2

    shared_smollm2.cache_clear()
    for name, module in list(sys.modules.items()):
        if name.startswith("grader.checks"):
            for value in vars(module).values():
                if isinstance(value, functools._lru_cache_wrapper):
                    value.cache_clear()


def grade_one(week: str, student: str, root: str, timeout: float | None,
              threads: int | None = None) -> tuple[str, bool, str, float]:
    """Autograde one student; never raises. Returns (student, ok, one-line summary, seconds). Module-level here
    (not in `__main__`) so that `--jobs N`'s spawned workers can import it."""
    start = time.perf_counter()
    if threads:  # --jobs N: N workers share the cores instead of each running torch on all of them
        import torch

        torch.set_num_threads(threads)
        os.environ["OMP_NUM_THREADS"] = str(threads)
    try:
        with limits_set(call_timeout=timeout):  # --timeout: a setting of this process, not an environment variable
            return _grade_one(week, student, root, start)
    except BaseException as e:  # noqa: BLE001  (one student's failure must not stop the run)
        return student, False, one_line(e), time.perf_counter() - start


def _grade_one(week: str, student: str, root: str, start: float) -> tuple[str, bool, str, float]:
    """`grade_one` inside its limits: grade, then the backstop on the shared model."""
    before = shared_models_state()
    line = Course(root).autograde_safely(week, student)
    if before and shared_models_state() != before:  # a backstop: the isolation refuses every change it knows of
        # (`before` is empty when this submission's checks loaded the model: nothing to compare yet)
        forget_shared_models()
        why = (f"{student}'s code changed the checks' shared model (SmolLM2) in this worker; it was reloaded "
               f"for the next submission — grade {student} by hand")
        course = Course(root)
        course.record_status(week, student, **{**course.read_status(week, student), "integrity": why})
        return student, False, why, time.perf_counter() - start
    return student, True, line, time.perf_counter() - start


def nbgrader_cause(result: dict) -> str:
    """The real cause of a failed nbgrader API call, from its log and traceback (nbgrader itself only says
    "see the above traceback")."""
    log = result.get("log") or ""
    errors = [m.group(1) for m in re.finditer(r"^\[ERROR\] (.*)$", log, re.M)]
    generic = ("There was an error processing assignment", "Please see the error log", "nbgrader ",
               "Interrupting kernel")  # what nbgrader does after "Timeout waiting for execute reply (300s)"
    useful = [e for e in errors if not e.startswith(generic) and "see the above traceback" not in e]
    tb_lines = [ln for ln in (log + "\n" + (result.get("error") or "")).splitlines()
                if re.match(r"^[A-Za-z_.]*(Error|Exception|Exit|Interrupt)\b.*:", ln.strip())]
    specific = [ln.strip() for ln in tb_lines if "NbGraderException" not in ln and "see the above" not in ln]
    for candidate in (useful[-1:] or []) + specific[-1:]:
        if candidate:
            return one_line(candidate)
    return one_line((result.get("error") or log or "unknown error").strip().splitlines()[-1])


def read_csv(path: str | Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def failure_reasons(status: dict) -> dict[str, str]:
    """Why each failed test failed, in a few words an instructor can act on: not implemented, reference use, out of
    time, the student's process crashed, a resource refused, or the check's own one line (a wrong answer)."""
    out = {}
    refs = set(status.get("reference_use", []))
    for test in status.get("failed", []):
        line = str(status.get("tests", {}).get(test, ""))
        kind, _, msg = line.partition(":")
        msg = msg.strip()
        if test in (status.get("timed_out") or {}):
            out[test] = f"out of time: {one_line(str(status['timed_out'][test]), 120)}"
        elif kind == "NotImplementedYet" or "is not implemented yet" in msg:
            out[test] = "not implemented"
        elif test.removeprefix("test_") in refs or kind == "ReferenceUse":
            out[test] = "reference use"
        elif kind in ("StudentCrash", "StudentMemoryError"):
            out[test] = f"the student's process crashed: {one_line(msg, 120)}"
        elif kind == "StudentTimeout":
            out[test] = f"out of time: {one_line(msg, 120)}"
        elif kind == "ResourceRefused":
            out[test] = f"refused: {one_line(msg, 120)}"
        else:
            out[test] = f"{kind}: {one_line(msg, 160)}" if msg else (kind or "failed")
    return out


def reference_use_text(status: dict) -> list[str]:
    """Each exercise of a submission's reference use, with what it copied and how much where it is a copy of the
    answer key (`grader.similarity.match_label`): "flash_attention_forward (copy of lib.attn.attention.flash_attention_forward
    93%)". The one-line autograde summary and the grades' CSV show these."""
    whys = status.get("reference_use_why") or {}
    out = []
    for name in status.get("reference_use", []):
        why = whys.get(name, "")
        label = match_label(why)
        out.append(f"{name} (copy of {label})" if label else f"{name} ({one_line(why, 160)})" if why else name)
    return out
