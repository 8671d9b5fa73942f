"""The grading worker's memory stays bounded whatever a submission sends or calls (`grader/bounds.py`, `grader/wire.py`).

Each test is a route by which a submission once could, or would, make the trusted process — where the checks and
their models run — hold gigabytes: call a check's model with a huge input, have a check's object allocate by its
arguments (once, or many times over and keep the results), send results the checks keep, send a message that grows
when it is read (empty sets, references to its objects), announce a message of a gigabyte, put an exception's
message of tens of MB where the grader's notes and the gradebook take it. Each attempts 8 GB or more (the
announced message: 1 GB) in the trusted process. Each must fail its exercise with a one-line reason while this
process's peak resident memory grows by less than the route's bound (measured here: /proc/self/clear_refs resets
the peak), and an honest call still passes. The attempts are denied before they allocate, so these tests do not
hold gigabytes themselves.
"""
from __future__ import annotations

import gc
import json
import shutil
import sqlite3
import sys
from pathlib import Path

import pytest
import torch

from grader.harness import load_exercises, with_cell_source
from grader.notebook import exercise_cells

REPO = Path(__file__).resolve().parent.parent
MiB = 1 << 20

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_DATA and /proc: Linux")


def _solution(week: int) -> tuple[Path, dict]:
    path = next((REPO / "solutions" / str(week)).glob("*.ipynb"))
    return path, json.loads(path.read_text())


def _load(tmp_path: Path, week: int, edits: dict[str, str]):
    """The solution of `week` with some exercise cells replaced, loaded as `pytest weeks/NN` does."""
    path, nb = _solution(week)
    for grade_id, src in edits.items():
        nb = with_cell_source(nb, grade_id, src)
    out = tmp_path / f"w{week}" / path.name
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(nb))
    return load_exercises(out)


def _solution_source(week: int, grade_id: str) -> str:
    return next(src for _, g, src in exercise_cells(_solution(week)[1]) if g == grade_id)


def _status_bytes(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


class _Peak:
    """This process's peak resident memory while the block runs, beyond what it held when the block began."""

    def __enter__(self):
        gc.collect()
        try:
            Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current resident size
        except OSError:
            pytest.skip("cannot reset this process's peak memory (/proc/self/clear_refs)")
        self.before = _status_bytes("VmRSS")
        return self

    def __exit__(self, *exc):
        self.growth = _status_bytes("VmHWM") - self.before
        print(f"the grader's process: peak {self.growth / MiB:.0f} MiB above where it began")
        return False


# The honest generate of week 16, wrapped: the notebook's code first tries to make the grader's process allocate, then
# decodes honestly, so only the attempt can fail the exercise. ATTEMPT runs with `model` (the check's, behind its
# spy) and `torch`; whatever it raises is caught, as a submission would.
_WRAPPED = '''
_honest_generate = generate


def generate(model, input_ids, max_new_tokens, use_cache=True, return_logits=False):
    global _tried
    if not _tried:
        _tried = True
        try:
{attempt}
        except Exception as e:  # the refusal reaches the notebook's code; catching it changes nothing
            _caught.append(type(e).__name__)
    return _honest_generate(model, input_ids, max_new_tokens, use_cache=use_cache, return_logits=return_logits)


_tried, _caught, _kept = False, [], []
'''

_ATTEMPTS = {
    # [16384, 256] token ids (33 MB to send): 1 GB of embeddings per layer input and 17 GB of attention scores
    "a huge input to the model": ("model(torch.zeros(16384, 256, dtype=torch.long))",
                                  "called the check's model with a [16384, 256] input", 256 * MiB),
    # one cache of 8 GiB: its first buffer (2 GiB) is refused before it exists
    "a method that allocates by its arguments": ('''
cfg = model.config
per_sequence = cfg.n_layers * 2 * cfg.n_kv_heads * cfg.max_seq_len * (cfg.d_model // cfg.n_heads) * 4
model.new_cache(batch=(8 << 30) // per_sequence + 1, max_len=cfg.max_seq_len)''',
                                                 "needed more memory than the grader's process gives", 768 * MiB),
    # 33 caches of 256 MiB each, all kept (the check's process keeps what it hands over until the check ends): 8.4 GB
    "many medium objects kept": ('''
cfg = model.config
per_sequence = cfg.n_layers * 2 * cfg.n_kv_heads * cfg.max_seq_len * (cfg.d_model // cfg.n_heads) * 4
for _ in range(33):
    _kept.append(model.new_cache(batch=(256 << 20) // per_sequence, max_len=cfg.max_seq_len))''',
                                 "needed more memory than the grader's process gives", 1536 * MiB),
}


@pytest.mark.parametrize("route", list(_ATTEMPTS))
def test_what_the_checks_objects_do_for_the_notebook_is_bounded(tmp_path, route):
    """Week 16's generate gets the check's model behind a spy; every call it makes runs in the grader's process."""
    from grader.checks import week16
    from grader.isolation import ResourceRefused

    attempt, reason, bound = _ATTEMPTS[route]
    body = "\n".join(" " * 12 + line for line in attempt.strip().splitlines())
    ex = _load(tmp_path, 16, {"generate": _solution_source(16, "generate") + _WRAPPED.replace("{attempt}", body)})
    try:
        with _Peak() as peak, pytest.raises(ResourceRefused) as refused:
            week16.check_generate(ex.generate, smollm2=False)
        message = str(refused.value)
        assert message.startswith("exercise 5, `generate`: ") and reason in message and "\n" not in message
        assert peak.growth < bound, f"{route}: the grader's process grew by {peak.growth / MiB:.0f} MiB"
        assert ex._session.get("_caught"), "the refusal did not reach the notebook's code as an exception"
    finally:
        ex.close()


def test_the_honest_calls_still_pass_beside_a_refused_one(tmp_path):
    """A refusal fails the call it happened in, not the next: the honest generate passes the same check after."""
    from grader.checks import week16

    ex = _load(tmp_path, 16, {"generate": _solution_source(16, "generate")})
    try:
        with _Peak() as peak:
            week16.check_generate(ex.generate, smollm2=False)
        assert peak.growth < 256 * MiB
    finally:
        ex.close()


@pytest.mark.parametrize("how", ["returned", "written into an out-parameter"])
def test_results_the_checks_keep_are_bounded(tmp_path, how):
    """60 MiB each time (bytes, so the student's process keeps none of them), returned or written into a list the
    check passes (copied back into the check's list, as `visited=[]` is), kept by a check that calls 150 times: 9.4
    GB in all. Within a check the grader's process holds at most a GiB for the notebook's code."""
    from grader.isolation import IsolationError

    ex = _load(tmp_path, 16, {"answer_q1": "def answer_q1(out=None):\n"
                                           "    return bytes(60 << 20) if out is None else out.append(bytes(60 << 20))\n"})
    session, kept = ex._session, []
    try:
        with _Peak() as peak, pytest.raises(IsolationError) as stopped:
            session.begin_check()
            try:
                for _ in range(150):
                    if how == "returned":
                        kept.append(ex.answer_q1())
                    else:
                        kept.append([])
                        ex.answer_q1(kept[-1])
            finally:
                session.end_check()
        assert sum(map(len, kept)) <= 17 * (60 * MiB if how == "returned" else 1), len(kept)
        assert any(why in str(stopped.value) for why in ("no room for", "during this check", "of data in all", "gives a check to read")), \
            str(stopped.value)
        kept.clear()
        assert peak.growth < 1536 * MiB, f"the grader's process grew by {peak.growth / MiB:.0f} MiB"
    finally:
        ex.close()


# What the notebook's code writes on its own end of the pipe (the child's write end is argv[2] of its process): a
# message of its own making, which the grader's process reads as it reads the child's.
_RAW = '''
import os, struct, sys


def _send(payload, size=None):
    """A message: `payload`, or `size` zero bytes (written a MiB at a time)."""
    fd = int(sys.argv[2])
    os.write(fd, struct.pack(">Q", len(payload) if size is None else size))
    view, left = memoryview(payload if size is None else bytes(1 << 20)), len(payload) if size is None else size
    while left:
        n = os.write(fd, view[:left])
        left -= n
        if size is None:
            view = view[n:]


def answer_q1():
{body}
    return "sent"
'''

_MESSAGES = {
    # 42 M empty sets, one opcode (a byte) each: 9.4 GB once read (216 bytes a set, 8 a pointer to it)
    "empty sets": ('_send(b"\\x80\\x05](" + b"\\x8f" * (40 << 20) + b"e.")',
                   "that would take more than", 1536 * MiB),
    # 21 M references to the child's objects (three bytes each), each with 20 fields: 28 GB of proxies once read
    "references": ('''info = b"}(" + b"".join(b"\\x8c\\x03k" + bytes([48 + i // 10, 48 + i % 10]) + b"K\\x01" for i in range(20)) + b"u"
    pid = b"\\x8c\\x01RK\\x01" + info + b"\\x87\\x94"
    _send(b"\\x80\\x05" + pid + b"0" + b"h\\x00Q" * (21 << 20) + b".")''',
                   "references to the notebook's objects", 256 * MiB),
    # a message of 1 GiB (an exception's message, say): refused before a byte of it is read
    "a 1 GiB message": ('_send(b"", size=(1 << 30) - 1)', "more than the 64 MiB one message may hold", 256 * MiB),
}


@pytest.mark.parametrize("kind", list(_MESSAGES))
def test_a_message_that_grows_when_read_is_refused(tmp_path, kind):
    from grader.isolation import StudentCrash

    body, reason, bound = _MESSAGES[kind]
    ex = _load(tmp_path, 16, {"answer_q1": _RAW.replace("{body}", "    " + body)})
    try:
        with _Peak() as peak, pytest.raises(StudentCrash, match=reason):
            ex.answer_q1()
        assert peak.growth < bound, f"{kind}: the grader's process grew by {peak.growth / MiB:.0f} MiB"
    finally:
        ex.close()


def test_what_the_child_says_is_cut_before_the_grader_keeps_it():
    """An exception's message and class names, the cells' load report, a verdict's exercise name: the child's word,
    cut to a line's size before the grader's notes, the status file or the gradebook hold it."""
    from grader import wire
    from grader.isolation import Session
    from grader.status import one_line

    e = wire.rebuild_exception((["X" * (8 * MiB), "ValueError", "Exception"], "y" * (64 * MiB)))
    assert isinstance(e, ValueError) and len(str(e)) <= 20_000 and len(type(e).__name__) <= 100
    words = "word " * (32 * MiB)  # 160 MiB of words: split whole, 2.6 GB of str objects
    with _Peak() as peak:
        line = one_line(words)
    assert len(line) <= 400 and peak.growth < 64 * MiB
    from grader import bounds

    info = bounds.load_info({"broken": {"cell 1 (x)": "z" * MiB, "k" * MiB: "v"}, "stubbed": ["s" * MiB] * 1000})
    assert len(json.dumps(info)) < 200_000
    session = Session("nothing.ipynb")
    for i in range(1000):
        session._note("flag", f"exercise-{i}-" + "r" * 1000, "w" * 1000)
    assert len(session.tampered) <= 201 and all(len(k or "") <= 200 for k in session.tampered)


def test_autograde_keeps_the_childs_report_out_of_the_gradebook(tmp_path):
    """Through `autograde`: an honest week-21 notebook whose cells' load report (the child's word) carries a 30 MB
    message. The status file, the autograded notebook and the gradebook stay small, and the honest work scores full."""
    from grader.__main__ import autograde

    week = "21"
    root = tmp_path / "repo"
    for part in ("solutions", "weeks"):
        shutil.copytree(REPO / part / week, root / part / week,
                        ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache", "*.backup-*"))
    path, nb = _solution(21)
    nb = with_cell_source(nb, "TextStream", _solution_source(21, "TextStream") +
                          "\n_broken_cells['cell 99 (ServingLoop)'] = 'x' * (30 << 20)\n")
    sub = root / "grader" / "submitted" / "mallory" / week
    sub.mkdir(parents=True)
    (sub / path.name).write_text(json.dumps(nb))
    assert autograde(week, ["mallory"], root=root) == []
    status = root / "grader" / "grading_status" / week / "mallory.json"
    assert status.stat().st_size < 200_000, f"the status file holds {status.stat().st_size} bytes"
    notes = json.loads(status.read_text())
    assert notes["failed"] == [] and len(notes["load_problems"]["cell 99 (ServingLoop)"]) <= 400
    graded = root / "grader" / "autograded" / "mallory" / week / path.name
    assert graded.stat().st_size < 2 * MiB, f"the autograded notebook holds {graded.stat().st_size} bytes"
    with sqlite3.connect(root / "grader" / "gradebook.db") as db:
        tables = [name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        longest = max((len(str(v)) for table in tables for row in db.execute(f'SELECT * FROM "{table}"') for v in row),
                      default=0)
    assert longest < 100_000, f"the gradebook holds a value of {longest} characters"


def test_the_ceilings_refuse_before_allocating_and_come_off_after():
    """`bounds.ceiling`: an allocation past it is refused (nothing is held), nested ones never loosen the outer, and
    the limit is what it was afterwards; `lifted` takes every ceiling off for a process started inside."""
    import resource

    from grader import bounds

    before = resource.getrlimit(resource.RLIMIT_DATA)
    with _Peak() as peak:
        with bounds.ceiling(256 * MiB):
            with bounds.ceiling(4 << 30):  # never above the enclosing ceiling
                with pytest.raises(MemoryError):
                    bytearray(512 * MiB)
                with bounds.lifted():
                    assert resource.getrlimit(resource.RLIMIT_DATA) == before
            held = bytearray(64 * MiB)  # within it
            with pytest.raises(RuntimeError, match="allocate"):
                torch_empty(512 * MiB)
        del held
        assert resource.getrlimit(resource.RLIMIT_DATA) == before
        big = torch_empty(512 * MiB)  # the ceiling is off (and the pages are never touched)
        del big
    assert peak.growth < 256 * MiB


def torch_empty(n: int):
    return torch.empty(n, dtype=torch.uint8)


def test_a_gpu_gets_the_same_ceiling(monkeypatch):
    """Where CUDA runs in the grader's process, a call into a check's object may make torch's caching allocator
    reserve `CALLBACK_MEMORY` more than it holds (its per-process fraction), and the fraction is put back after.
    (Faked here: no GPU on the machines this lab is tested on.)"""
    from grader import bounds

    total, reserved, calls = 80 << 30, 3 << 30, []
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: type("P", (), {"total_memory": total})())
    monkeypatch.setattr(torch.cuda, "get_per_process_memory_fraction", lambda d: 1.0)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda d: reserved)
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, d: calls.append(f))
    with pytest.raises(ValueError), bounds.device_ceiling(bounds.CALLBACK_MEMORY):
        raise ValueError("the call failed")
    assert calls == [(reserved + bounds.CALLBACK_MEMORY) / total, 1.0]
