"""nbgrader, driven from Python: one configuration for the repo and for throw-away course folders.

`course_config(root)` is the single description of the course layout; `grader/nbgrader_config.py`
uses it for the real course, and tests use it for a temporary copy. `Course` wraps nbgrader's
Python API (`NbGraderAPI`), which is several times faster than one `nbgrader` CLI call per step.
"""
from __future__ import annotations

import csv
import os
import sys
from pathlib import Path

from traitlets.config import Config

REPO_ROOT = Path(__file__).resolve().parent.parent
WEEKS = ("16", "17", "18", "19", "20")


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
    # Real-model cells take longer than nbgrader's default 30 s per cell.
    c.ExecutePreprocessor.timeout = 900
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
        self.config = course_config(self.root, db)
        self.api = NbGraderAPI(coursedir=CourseDirectory(config=self.config), config=self.config)

    @staticmethod
    def _ok(result: dict, step: str) -> dict:
        if not result.get("success"):
            raise RuntimeError(f"nbgrader {step} failed:\n{result.get('error') or result.get('log')}")
        return result

    def generate(self, week: str) -> Path:
        """solutions/<week> -> weeks/<week> (nbgrader replaces that folder) and the gradebook's copy of the assignment."""
        self._ok(self.api.generate_assignment(str(week), force=True), f"generate_assignment {week}")
        return self.root / "weeks" / str(week)

    def autograde(self, week: str, student: str) -> None:
        self._ok(self.api.autograde(str(week), student, force=True), f"autograde {week} {student}")

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

    def export(self, csv_path: str | Path) -> Path:
        """All grades to CSV, one row per student and assignment."""
        from nbgrader.apps import NbGraderApp  # noqa: F401  (keeps nbgrader's logging set up)
        from nbgrader.plugins import CsvExportPlugin
        from nbgrader.api import Gradebook

        csv_path = Path(csv_path)
        plugin = CsvExportPlugin(config=self.config)
        plugin.to = str(csv_path)
        with Gradebook(self.config.CourseDirectory.db_url) as gb:
            plugin.export(gb)
        return csv_path


def read_csv(path: str | Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))
