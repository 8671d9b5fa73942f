"""torch's threads follow the process's share of the CPU (lib/bench/threads.py): its cgroup's CPU quota (v1 and v2, mocked
here, and a real v1 quota where this machine lets root make one), its affinity mask, an explicit
INFERENCE_LAB_THREADS — not the host's core count. A notebook kernel prints the choice."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from lib.bench import threads

REPO = Path(__file__).resolve().parent.parent
QUIET = {"INFERENCE_LAB_THREADS", "OMP_NUM_THREADS"}


def _fake_proc(tmp_path: Path, cgroup_lines: list[str], mounts: list[tuple[str, str, str, str]]) -> Path:
    """A /proc with self/cgroup and self/mountinfo: mounts are (root, mountpoint, fs type, super options)."""
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "cgroup").write_text("\n".join(cgroup_lines) + "\n")
    info = [f"{30 + i} 20 0:{40 + i} {root} {point} rw,nosuid - {kind} cgroup {opts}"
            for i, (root, point, kind, opts) in enumerate(mounts)]
    (proc / "self" / "mountinfo").write_text("\n".join(info) + "\n")
    return proc


def test_a_cgroup_v2_quota_along_the_path_is_found(tmp_path):
    fs = tmp_path / "cg2"
    (fs / "hub" / "student").mkdir(parents=True)
    (fs / "cpu.max").write_text("max 100000\n")
    (fs / "hub" / "cpu.max").write_text("150000 100000\n")  # 1.5 cores for the hub's users
    (fs / "hub" / "student" / "cpu.max").write_text("max 100000\n")
    proc = _fake_proc(tmp_path, ["0::/hub/student"], [("/", str(fs), "cgroup2", "rw")])
    assert threads.cgroup_cpu_limit(proc) == 1.5
    choice = threads.choose(environ={}, proc=proc, load=0.0)
    assert choice.threads == 1 and "CPU quota of 1.5" in choice.why
    (fs / "hub" / "cpu.max").write_text("max 100000\n")
    assert threads.cgroup_cpu_limit(proc) is None


def test_a_cgroup_v1_quota_seen_from_a_container_is_found(tmp_path):
    fs = tmp_path / "cpu"
    (fs / "job").mkdir(parents=True)
    (fs / "cpu.cfs_quota_us").write_text("-1\n")
    (fs / "cpu.cfs_period_us").write_text("100000\n")
    (fs / "job" / "cpu.cfs_quota_us").write_text("100000\n")
    (fs / "job" / "cpu.cfs_period_us").write_text("100000\n")
    # The process's cgroup is /kubepods/pod1/job on the host; the container's mount shows /kubepods/pod1 as its root.
    proc = _fake_proc(tmp_path, ["4:memory:/kubepods/pod1/job", "2:cpu,cpuacct:/kubepods/pod1/job"],
                      [("/kubepods/pod1", str(fs), "cgroup", "rw,cpu,cpuacct")])
    assert threads.cgroup_cpu_limit(proc) == 1.0
    assert threads.choose(environ={}, proc=proc, load=0.0).threads == 1


def test_the_explicit_choice_and_the_load(tmp_path):
    proc = _fake_proc(tmp_path, ["0::/"], [])
    assert threads.choose(environ={"INFERENCE_LAB_THREADS": "3"}, proc=proc).threads == 3
    assert threads.choose(environ={"OMP_NUM_THREADS": "2"}, proc=proc).threads == 2
    # for several jobs, OMP_NUM_THREADS is not the per-job share
    assert "OMP" not in threads.choose(jobs=2, environ={"OMP_NUM_THREADS": "2"}, proc=proc, load=0.0).why
    cores = threads.affinity_cores()
    busy = threads.choose(environ={}, proc=proc, load=float(cores) + 2)
    assert busy.threads == 1 and "leaves 0 idle" in busy.why
    assert threads.choose(environ={}, proc=proc, load=0.0).threads == cores


def _child_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in QUIET}
    env.update(extra)
    return env


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no affinity masks on this platform")
def test_an_affinity_mask_of_one_core_gives_one_thread():
    code = ("import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); import lib, torch; "
            "print(torch.get_num_threads()); print(lib.THREADS.why)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=_child_env(), capture_output=True, text=True,
                         timeout=300, check=True).stdout.splitlines()
    assert out[0] == "1" and "1 core in this process's affinity mask" in out[1], out


def _cpu_cgroup_v1() -> Path | None:
    root = Path("/sys/fs/cgroup/cpu")
    if os.geteuid() != 0 or not (root / "cpu.cfs_quota_us").exists() or not os.access(root, os.W_OK):
        return None
    return root


@pytest.mark.notebook
@pytest.mark.skipif(_cpu_cgroup_v1() is None, reason="needs root and a writable cgroup v1 cpu controller")
def test_a_notebook_kernel_under_a_one_core_quota_uses_one_thread(tmp_path):
    """A notebook cell run by a Jupyter kernel inside a cgroup with a one-core CPU quota (as JupyterHub gives a
    student's server) sees torch on one thread, and the kernel printed why."""
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("import lib, torch\nprint('threads', torch.get_num_threads())")]
    path = tmp_path / "quota.ipynb"
    path.write_text(nbformat.writes(nb))
    group = _cpu_cgroup_v1() / f"inference-lab-test-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    try:
        (group / "cpu.cfs_period_us").write_text("100000")
        (group / "cpu.cfs_quota_us").write_text("100000")
        run = (f"echo $$ > {group}/cgroup.procs && exec {sys.executable} -m jupyter nbconvert --to notebook "
               f"--execute --output out.ipynb {path.name}")
        subprocess.run(["sh", "-c", run], cwd=tmp_path, env=_child_env(PYTHONPATH=str(REPO)), check=True,
                       capture_output=True, timeout=600)
        outputs = json.loads((tmp_path / "out.ipynb").read_text())["cells"][0]["outputs"]
        text = "".join("".join(o.get("text", "")) for o in outputs)
        assert "threads 1" in text and "CPU quota of 1 core" in text, text
    finally:
        group.rmdir()
