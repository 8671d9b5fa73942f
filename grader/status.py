"""Grading state, in the one form every part of the grader uses: a failure as one line (`one_line`), a
submission that could not be graded (`GradingError`), a submission's grading notes (`status_path`, `read_status`,
`write_status`, `status_files`: written by `grader.grading` and `grader.course`, read by `grader.course` for the
grades), and the limits on the student's process (`limits`, `limits_set`: the grader's `--timeout`, else the
environment's INFERENCE_LAB_* knobs, else the defaults). The lowest module of the grader's own.
"""
from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass, replace
from pathlib import Path


class GradingError(RuntimeError):
    """One submission could not be graded; the message is one line with the real cause."""


def status_path(root: str | Path, week: str, student: str) -> Path:
    return Path(root) / "grader" / "grading_status" / str(week) / f"{student}.json"


def read_status(root: str | Path, week: str, student: str) -> dict:
    """One submission's grading notes ({} when there are none, or they cannot be read)."""
    try:
        return json.loads(status_path(root, week, student).read_text())
    except (OSError, ValueError):
        return {}


def write_status(root: str | Path, week: str, student: str, notes: dict) -> None:
    path = status_path(root, week, student)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(notes, indent=1, sort_keys=True))


def status_files(root: str | Path) -> list[tuple[str, str]]:
    """(week, student) of every submission with grading notes."""
    folder = Path(root) / "grader" / "grading_status"
    return [(p.parent.name, p.stem) for p in sorted(folder.glob("*/*.json"))] if folder.is_dir() else []


# --- the limits on the student's process --------------------------------------------------------------------------

DEFAULT_CALL_TIMEOUT = 60.0  # seconds of silence from the child in one call
DEFAULT_BUDGET = 900.0  # seconds for a whole notebook
# How a verdict of the student's process's guard ends (grader.child, grader.isolation): the harness words its
# message for it (the code tampered with the watching; not "lib's implementation").
TAMPERED_TAIL = "the grader judges a result only when the code left it alone"
DEFAULT_EXERCISE_TIMEOUT = 180.0  # seconds of the student's code per graded test (autograde), summed over its calls
DEFAULT_MEMORY = 4 << 30  # bytes of address space the child may add after importing torch
DEFAULT_CPU = 600  # CPU seconds for one child


@dataclass(frozen=True)
class Limits:
    call_timeout: float
    budget: float
    memory: int
    cpu: int
    exercise_timeout: float


_SET: dict = {}  # what `limits_set` holds in force


def _env_float(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name) or default)
    except ValueError:
        return default


def limits() -> Limits:
    """The limits in force: those `limits_set` holds, else INFERENCE_LAB_CALL_TIMEOUT, _BUDGET, _MEMORY, _CPU and
    _EXERCISE_TIMEOUT from the environment (the knobs grader/README.md documents), else the defaults."""
    env = Limits(_env_float("INFERENCE_LAB_CALL_TIMEOUT", DEFAULT_CALL_TIMEOUT),
                 _env_float("INFERENCE_LAB_BUDGET", DEFAULT_BUDGET),
                 int(_env_float("INFERENCE_LAB_MEMORY", DEFAULT_MEMORY)), int(_env_float("INFERENCE_LAB_CPU", DEFAULT_CPU)),
                 _env_float("INFERENCE_LAB_EXERCISE_TIMEOUT", DEFAULT_EXERCISE_TIMEOUT))
    return replace(env, **_SET)


@contextlib.contextmanager
def limits_set(**values):
    """Hold these limits (`call_timeout=`, ...; None leaves one as it is) in force inside the block."""
    given = {k: v for k, v in values.items() if v is not None}
    unknown = set(given) - set(Limits.__dataclass_fields__)
    if unknown:
        raise TypeError(f"no such limit: {sorted(unknown)}")
    before = dict(_SET)
    _SET.update(given)
    try:
        yield limits()
    finally:
        _SET.clear()
        _SET.update(before)


def one_line(e: BaseException | str, limit: int = 400) -> str:
    """An exception as one line: `Type: message`, whitespace collapsed, cut at `limit` characters."""
    if isinstance(e, BaseException):
        text = str(e) if isinstance(e, (GradingError, SystemExit)) else f"{type(e).__name__}: {e}"
    else:
        text = e
    text = str(text)[:8 * limit + 64]  # a huge message is cut before it is split (its words would not fit memory)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 1] + "…"
