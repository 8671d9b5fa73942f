"""Shared by the hostile-class tests (tests/test_hostile_class.py, tests/test_hostile_attention.py,
tests/test_hostile_processes.py): week 16's course copied to a scratch root, its solution made an honest control
(demo cells stripped, `generate` left a stub), and the attention routes run elsewhere than the thread the checks
watch. The tests run with --import-mode=importlib, so they load this sibling by its path."""
import hashlib
import json
import shutil
from pathlib import Path

import pytest

from grader.harness import with_cell_source

REPO = Path(__file__).resolve().parent.parent
WEEK = "16"
CHECKS_FILE = REPO / "grader" / "checks" / "week16.py"


def _nb(path: Path) -> dict:
    return json.loads(path.read_text())


def _points(release: dict) -> dict[str, float]:
    return {c["metadata"]["nbgrader"]["grade_id"]: float(c["metadata"]["nbgrader"]["points"])
            for c in release["cells"] if c["cell_type"] == "code" and c["metadata"].get("nbgrader", {}).get("grade")}


def _honest(solution: dict, release: dict) -> dict:
    """The solution with demo cells stripped and `generate` left as the release's stub."""
    stubs = {c["metadata"]["nbgrader"]["grade_id"]: c["source"] for c in release["cells"]
             if c["metadata"].get("nbgrader", {}).get("solution")}
    nb = json.loads(json.dumps(solution))
    cells = []
    for cell in nb["cells"]:
        meta = cell["metadata"]
        nbg = meta.get("nbgrader", {})
        if cell["cell_type"] == "code" and not (nbg.get("solution") or nbg.get("grade") or "setup" in meta.get("tags", [])):
            continue  # a demo cell
        if nbg.get("grade_id") == "generate":
            cell["source"] = stubs["generate"]
        cells.append(cell)
    nb["cells"] = cells
    return nb


_edit = with_cell_source


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def course_root(tmp_path_factory) -> Path:
    """Week 16's solutions and release copied under a fresh root, once per test module that binds this fixture."""
    root = tmp_path_factory.mktemp("hostile") / "repo"
    for part in ("solutions", "weeks"):
        shutil.copytree(REPO / part / WEEK, root / part / WEEK,
                        ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache", "*.backup-*"))
    return root


# gqa_attention by torch's fused attention (forbidden), run elsewhere than the thread the checks watch.
_SDPA_ROUTE = """
def _sdpa(q, k, v, causal):
    import torch, torch.nn.functional as F
    g = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    i = torch.arange(q.shape[2], device=q.device)[:, None] + (kk.shape[2] - q.shape[2])
    mask = torch.arange(kk.shape[2], device=q.device)[None, :] <= i if causal else None
    return F.scaled_dot_product_attention(q.float(), kk.float(), vv.float(), attn_mask=mask).to(q.dtype)
"""
_ELSEWHERE = {
    "thread": """
import threading
def gqa_attention(q, k, v, causal=True):
    box = []
    t = threading.Thread(target=lambda: box.append(_sdpa(q, k, v, causal)))
    t.start(); t.join()
    return box[0]
""",
    "raw_thread": """
import _thread, time
def gqa_attention(q, k, v, causal=True):
    box = []
    _thread.start_new_thread(lambda: box.append(_sdpa(q, k, v, causal)), ())
    while not box:
        time.sleep(0.001)
    return box[0]
""",
    "worker_at_load": """
import threading, queue
_jobs, _done = queue.Queue(), queue.Queue()
threading.Thread(target=lambda: [_done.put(_sdpa(*_jobs.get())) for _ in iter(int, 1)], daemon=True).start()
def gqa_attention(q, k, v, causal=True):
    _jobs.put((q, k, v, causal))
    return _done.get()
""",
    "fork": """
import os, pickle
def gqa_attention(q, k, v, causal=True):
    r, w = os.pipe()
    if os.fork() == 0:
        os.write(w, pickle.dumps(_sdpa(q, k, v, causal).tolist()))  # (a tensor's pickle writes its storage's
        os._exit(0)  # bytes out, which the grader's process refuses: a list crosses)
    os.close(w)
    data = b"".join(iter(lambda: os.read(r, 1 << 20), b""))
    os.wait()
    return torch.tensor(pickle.loads(data), dtype=q.dtype)
""",
    "thread_through_partial": """
import _thread, functools, time
def gqa_attention(q, k, v, causal=True):
    box = []
    functools.partial(_thread.start_new_thread, lambda: box.append(_sdpa(q, k, v, causal)), ())()
    while not box:
        time.sleep(0.001)
    return box[0]
""",
    "fork_through_partial": """
import functools, os, pickle
def gqa_attention(q, k, v, causal=True):
    r, w = os.pipe()
    if functools.partial(os.fork)() == 0:
        os.write(w, pickle.dumps(_sdpa(q, k, v, causal).tolist()))  # (a tensor's pickle writes its storage's
        os._exit(0)  # bytes out, which the grader's process refuses: a list crosses)
    os.close(w)
    data = b"".join(iter(lambda: os.read(r, 1 << 20), b""))
    os.wait()
    return torch.tensor(pickle.loads(data), dtype=q.dtype)
""",
}
