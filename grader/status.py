"""What grading reports, in the form every part of the grader uses: a failure as one line (`one_line`), a
submission that could not be graded (`GradingError`), and where a submission's grading notes are kept
(`status_path`: written by `grader.grading`, read by `grader.course`). The lowest module of the grader's own.
"""
from __future__ import annotations

from pathlib import Path


class GradingError(RuntimeError):
    """One submission could not be graded; the message is one line with the real cause."""


def status_path(root: str | Path, week: str, student: str) -> Path:
    return Path(root) / "grader" / "grading_status" / str(week) / f"{student}.json"


def one_line(e: BaseException | str, limit: int = 400) -> str:
    """An exception as one line: `Type: message`, whitespace collapsed, cut at `limit` characters."""
    if isinstance(e, BaseException):
        text = str(e) if isinstance(e, (GradingError, SystemExit)) else f"{type(e).__name__}: {e}"
    else:
        text = e
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 1] + "…"
