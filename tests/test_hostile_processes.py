"""A hostile class, the processes a submission starts and the meters it resets: tracemalloc's peak reset under the
host meter, processes spawned at load or left behind (killed by `python -m grader autograde`, each exercise timed),
and a fork bomb held at the process limit. The class run itself: tests/test_hostile_class.py; shared helpers:
tests/_hostile_support.py."""
import importlib.util
import json
from pathlib import Path

import pytest

from grader.course import Course
from grader.harness import load_exercises

_spec = importlib.util.spec_from_file_location("_hostile_support", Path(__file__).with_name("_hostile_support.py"))
_spec.loader.exec_module(_support := importlib.util.module_from_spec(_spec))
REPO, WEEK, _nb, _points, _honest, _edit, course_root = (
    _support.REPO, _support.WEEK, _support._nb, _support._points, _support._honest, _support._edit,
    _support.course_root)


_FORWARD_IN_NUMPY_THEN_RESET = """
import functools, _tracemalloc
import numpy as np
def _blocks(q, k, v, causal, bq, bk):
    nq, nk = q.shape[2], k.shape[2]
    for qs in range(0, nq, bq):
        qi = q[:, :, qs:qs + bq].float() * q.shape[-1] ** -0.5
        m, l = torch.full(qi.shape[:3], float("-inf")), torch.zeros(qi.shape[:3])
        acc = torch.zeros(qi.shape[:3] + (v.shape[-1],))
        for ks in range(0, nk, bk):
            if causal and ks > min(qs + bq, nq) - 1 + nk - nq:
                break
            s = qi @ k[:, :, ks:ks + bk].float().transpose(-1, -2)
            if causal:
                s = s.masked_fill(torch.arange(ks, min(ks + bk, nk))[None, :]
                                  > torch.arange(qs, min(qs + bq, nq))[:, None] + nk - nq, float("-inf"))
            top = torch.maximum(m, s.amax(-1))
            base = torch.where(torch.isinf(top), torch.zeros_like(top), top)
            p, a = torch.exp(s - base[..., None]), torch.exp(m - base)
            l, acc, m = a * l + p.sum(-1), a[..., None] * acc + p @ v[:, :, ks:ks + bk].float(), top
def flash_attention_forward(q, k, v, causal=False, block_q=128, block_k=128, visited=None):
    check_attention_shapes(q, k, v, causal)
    if q.device.type == "meta":
        return torch.empty(q.shape, dtype=q.dtype, device="meta"), torch.empty(q.shape[:3], device="meta")
    nq, nk = q.shape[2], k.shape[2]
    for qs in range(0, nq, block_q):
        for ks in range(0, nk, block_k):
            if visited is not None and not (causal and ks > min(qs + block_q, nq) - 1 + nk - nq):
                visited.append((qs, ks))
    _blocks(q, k, v, causal, block_q, block_k)
    qn, kn, vn = (t.detach().numpy() if t.dtype == torch.float32 else t.detach().float().numpy() for t in (q, k, v))
    s = qn @ kn.swapaxes(-1, -2) / np.sqrt(qn.shape[-1])
    if causal:
        s = np.where(np.arange(nk)[None, :] <= np.arange(nq)[:, None] + nk - nq, s, -np.inf)
    m = s.max(-1, keepdims=True)
    p = np.exp(s - m)
    lse = m[..., 0] + np.log(p.sum(-1))
    out = (p / p.sum(-1, keepdims=True)) @ vn
    res = (torch.from_numpy(np.ascontiguousarray(out, dtype=np.float32)).to(q.dtype),
           torch.from_numpy(np.ascontiguousarray(lse, dtype=np.float32)))
    del s, p, out, lse, m
    functools.partial(_tracemalloc.reset_peak)()
    return res
"""


def test_resetting_the_host_meter_is_a_verdict(tmp_path):
    from grader.checks import week17 as checks

    release_path = next((REPO / "weeks" / "17").glob("*.ipynb"))
    honest = _honest(_nb(REPO / "solutions" / "17" / release_path.name), _nb(release_path))
    path = tmp_path / release_path.name
    path.write_text(json.dumps(_edit(honest, "flash_attention_forward", _FORWARD_IN_NUMPY_THEN_RESET)))
    ex = load_exercises(path)
    try:
        with pytest.raises(AssertionError, match="used tracemalloc"):
            checks.check_flash_attention_forward(ex.flash_attention_forward)
    finally:
        ex.close()


# Started by an exercise cell when it loads: each process carries `MARKER` and its kind in its argv.
_SPAWN_AT_LOAD = r'''
import ctypes, os, subprocess, sys
# /bin/sh, not sys.executable: the child's uid may not reach the interpreter (a pyenv under /root, mode 0700)
def _exec(kind, code="sleep 900; exit 0"):  # a second command: a shell may exec a lone one (argv lost)
    os.execv("/bin/sh", ["/bin/sh", "-c", code, "MARKER", kind])
subprocess.Popen(["/bin/sh", "-c", "sleep 900; exit 0", "MARKER", "popen-setsid"], start_new_session=True)
subprocess.Popen(["/bin/sh", "-c", "while :; do :; done", "MARKER", "cpu-burner-setsid"], start_new_session=True)
if os.fork() == 0:
    _exec("fork")
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        _exec("double-fork-setsid")
    os._exit(0)
ctypes.CDLL(None).prctl(36, 0, 0, 0, 0)  # no longer the subreaper of its tree: its orphans go to the grader
if os.fork() == 0:
    if os.fork() == 0:
        _exec("double-fork-orphan")
    os._exit(0)
'''

# A check's call that leaves a setsid'd CPU burner behind and ends the child.
_SPAWN_THEN_EXIT = r'''
import os, subprocess, sys, time
def causal_mask(q_len, kv_len, device=None):
    subprocess.Popen(["/bin/sh", "-c", "while :; do :; done", "MARKER", "burner-of-a-dead-child"],
                     start_new_session=True)
    time.sleep(1.0)  # the burner is running (and seen by the test's 0.1 s poll) before its parent dies
    os._exit(0)
'''

# Two exercises whose code takes 40 s, against a 30 s limit per graded test (the call limit is 60 s; at 15 s an honest
# RollingKVCache check ran out of time on a busy 2-core machine, in a fresh-clone run and again by hand).
_SLOW = r'''
import time
def roofline_time(flops, bytes_moved, flops_per_s, bytes_per_s):
    time.sleep(40)
    return max(flops / flops_per_s, bytes_moved / bytes_per_s)
'''
_SLOW_Q1 = r'''
import time
def answer_q1():
    time.sleep(40)
    return 26.0
'''


def _marked(marker: str) -> dict[int, str]:
    """pid -> kind of the live processes whose argv holds `marker` (zombies have no argv)."""
    import os

    kinds = {}
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if marker.encode() in argv:
                kinds[int(pid)] = argv[argv.index(marker.encode()) + 1].decode()
    return kinds


@pytest.mark.notebook  # about a minute: three submissions through `python -m grader autograde 16 --jobs 2`
def test_cli_autograde_kills_every_process_and_times_each_exercise(scratch, tmp_path):
    """`python -m grader autograde 16 --jobs 2`, as typed: what a submission starts — forked, double-forked,
    `setsid`'d, a CPU-burning loop, an orphan of a child that gave up being their subreaper, a process left by a
    child that then exited — runs while it is graded and is gone when the command returns; an exercise slower
    than its time limit loses its own points only, and the status file names it."""
    import os
    import signal
    import subprocess
    import time
    import uuid

    root = scratch.copy(tmp_path / "repo")
    release_path = next((root / "weeks" / WEEK).glob("*.ipynb"))
    release, solution = _nb(release_path), _nb(root / "solutions" / WEEK / release_path.name)
    points = _points(release)
    honest = _honest(solution, release)
    marker = f"inference-lab-hostile-{uuid.uuid4().hex}"
    subs = tmp_path / "subs"
    subs.mkdir()
    notebooks = {
        "spawner": _edit(honest, "step_flops", _SPAWN_AT_LOAD.replace("MARKER", marker), prepend=True),
        "spawn_then_exit": _edit(honest, "causal_mask", _SPAWN_THEN_EXIT.replace("MARKER", marker)),
        "slow": _edit(_edit(honest, "roofline_time", _SLOW), "answer_q1", _SLOW_Q1),
    }
    for name, nb in notebooks.items():
        (subs / f"{name}.ipynb").write_text(json.dumps(nb))
    env = scratch.env(root, INFERENCE_LAB_EXERCISE_TIMEOUT=30, INFERENCE_LAB_CALL_TIMEOUT=60)
    py = str(root / ".venv" / "bin" / "python")
    subprocess.run([py, "-m", "grader", "collect", WEEK, str(subs)], cwd=root, env=env, check=True,
                   capture_output=True)

    seen: set[str] = set()
    proc = subprocess.Popen([py, "-m", "grader", "autograde", WEEK, "--jobs", "2"], cwd=root, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        while proc.poll() is None:
            seen.update(_marked(marker).values())
            time.sleep(0.1)
        out = proc.stdout.read()
    finally:
        proc.kill()
        left = _marked(marker)
        for pid in left:  # a failing run must not leave them to the next test
            os.kill(pid, signal.SIGKILL)
    print(out)
    assert proc.returncode == 0, out
    assert not left, f"still running after autograde returned: {sorted(left.values())}"
    assert seen >= {"popen-setsid", "cpu-burner-setsid", "fork", "double-fork-setsid", "double-fork-orphan",
                    "burner-of-a-dead-child"}, f"the submissions did not start what the test expects: {seen}"
    assert "SAWarning" not in out

    course = Course(root)
    total = sum(points.values())
    # test_generate runs SmolLM2 for 64 tokens: against the 30 s limit set here it passes on quiet cores and runs out
    # of time on a busy machine (or beside a submission's CPU burner), so its points are not what this test judges.
    # The spawner called C through ctypes while its cells loaded (prctl): a verdict for every exercise (grader.child).
    fails = {"spawner": set(points), "spawn_then_exit": {"test_causal_mask", "test_gqa_attention"},
             "slow": {"test_roofline_time", "test_answer_q1"}}
    for student, failed in fails.items():
        got = course.score(WEEK, student)["code_score"]
        want = total - sum(points[g] for g in failed)
        assert got in (want, want - points["test_generate"]), f"{student}: {got} points, expected {want} (test_generate aside)"
    timed_out = course.read_status(WEEK, "slow")["timed_out"]
    assert set(timed_out) == {"test_roofline_time", "test_answer_q1"}, timed_out
    assert all("ran out of time" in why and "(30 s" in why for why in timed_out.values()), timed_out


def test_a_fork_bomb_stops_at_the_process_limit(course_root, tmp_path):
    """A cell forking 400 sleepers gets at most `_sandbox.MAX_PROCESSES` of them (pids cgroup as root, RLIMIT_NPROC
    otherwise), and they die with the child."""
    from grader._sandbox import MAX_PROCESSES

    release_path = next((course_root / "weeks" / WEEK).glob("*.ipynb"))
    honest = _honest(_nb(course_root / "solutions" / WEEK / release_path.name), _nb(release_path))
    marker = f"inference-lab-bomb-{tmp_path.name}"
    nb = _edit(honest, "step_flops", f"""
        import os, time
        started, error = 0, None
        for _ in range(400):
            try:
                if os.fork() == 0:
                    os.execv("/bin/sleep", ["/bin/sleep", "60", {marker!r}])
                started += 1
            except OSError as e:
                error = type(e).__name__
                break
        def bomb():
            return started, error
        """, prepend=True)
    path = tmp_path / release_path.name
    path.write_text(json.dumps(nb))
    ex = load_exercises(path)
    if "no process-count limit" in ex._session.sandbox:
        ex.close()
        pytest.skip(f"no process-count limit here: {ex._session.sandbox}")
    started, error = ex.bomb()
    ex.close()
    assert error == "BlockingIOError" and started <= MAX_PROCESSES, (started, error)
    assert not _marked(marker), "the sleepers outlived the child"
