"""How many threads torch should use in this process: its share of the CPU, not the host's core count.

torch sizes its thread pool to the cores it sees (`os.cpu_count()`), which is the host's: a JupyterHub server
with a one-core CPU quota, or a process pinned to one core, still starts two or more threads, and threads beyond
the process's share wait on each other (week 18's solution notebook at load 3-6 on 2 cores: > 600 s with torch's
default threads, 292 s with one). `choose()` takes, in order:

1. `INFERENCE_LAB_THREADS=N`, else `OMP_NUM_THREADS=N` (an explicit choice, kept as it is);
2. else the smallest of: the cores in the process's affinity mask (`taskset`, cpusets), its cgroup's CPU quota
   (v2 `cpu.max`, v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us`, the tightest along the cgroup's path, rounded
   down: a 1.5-core quota gets one thread, which never waits for the quota's next period), and the cores the
   machine's other work leaves idle (cores minus the 1-minute load average, rounded); at least one.

`lib/__init__.py` applies it when lib is first imported (a notebook kernel, the engine, the server, a benchmark)
and a notebook kernel prints the one line `describe()` gives.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

ENV = "INFERENCE_LAB_THREADS"


@dataclass(frozen=True)
class Choice:
    threads: int
    why: str


def _int_env(name: str, environ) -> int | None:
    try:
        n = int(environ[name])
    except (KeyError, ValueError):
        return None
    return n if n >= 1 else None


def _cgroup_dirs(proc: Path, controller: str) -> list[Path]:
    """The folders of this process's cgroup for `controller` (v1) or of the unified hierarchy (v2, controller
    ""), from the process's own cgroup path and the mounts it sees, deepest first, up to the mount's root."""
    try:
        cgroups = (proc / "self" / "cgroup").read_text().splitlines()
        mounts = (proc / "self" / "mountinfo").read_text().splitlines()
    except OSError:
        return []
    path = None
    for line in cgroups:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hid, controllers, p = parts
        if (controller == "" and hid == "0" and controllers == "") or controller in controllers.split(","):
            path = p
            break
    if path is None:
        return []
    for line in mounts:
        fields = line.split()
        if " - " not in line:
            continue
        pre, post = line.split(" - ", 1)
        fs_type, _, options = (post.split() + ["", "", ""])[:3]
        fields = pre.split()
        root, mountpoint = fields[3], fields[4]
        if controller == "" and fs_type != "cgroup2":
            continue
        if controller and (fs_type != "cgroup" or controller not in options.split(",")):
            continue
        # The cgroup's path is relative to the hierarchy's root; the mount shows the hierarchy from `root`.
        rel = os.path.relpath(path, root) if path.startswith(root) else path.lstrip("/")
        rel = "" if rel == "." else rel
        here = Path(mountpoint) / rel
        dirs = [here]
        while here != Path(mountpoint) and here.parent != here:
            here = here.parent
            dirs.append(here)
        return dirs
    return []


def cgroup_cpu_limit(proc: str | Path = "/proc") -> float | None:
    """The CPU quota of this process's cgroup in cores (e.g. 1.5), the tightest along its path, in cgroup v2 or v1;
    None when there is none."""
    proc = Path(proc)
    limits = []
    for d in _cgroup_dirs(proc, ""):
        try:
            quota, period = (d / "cpu.max").read_text().split()[:2]
        except (OSError, ValueError):
            continue
        if quota != "max" and int(period) > 0:
            limits.append(int(quota) / int(period))
    for d in _cgroup_dirs(proc, "cpu"):
        try:
            quota = int((d / "cpu.cfs_quota_us").read_text())
            period = int((d / "cpu.cfs_period_us").read_text())
        except (OSError, ValueError):
            continue
        if quota > 0 and period > 0:
            limits.append(quota / period)
    return min(limits) if limits else None


def affinity_cores() -> int:
    """The cores this process may run on (its affinity mask), else the machine's."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def choose(jobs: int = 1, environ=None, proc: str | Path = "/proc", load: float | None = None) -> Choice:
    """The threads for each of `jobs` processes sharing this process's CPU, and why (see the module's text).
    `OMP_NUM_THREADS` is taken as this process's own choice only for one job (`jobs == 1`)."""
    environ = os.environ if environ is None else environ
    for name in (ENV, "OMP_NUM_THREADS") if jobs == 1 else (ENV,):
        n = _int_env(name, environ)
        if n is not None:
            return Choice(n, f"{name}={n}")
    cores = affinity_cores()
    share, parts = float(cores), [f"{cores} core{'s' * (cores != 1)} in this process's affinity mask"]
    if cores != (os.cpu_count() or cores):
        parts[0] += f" of the machine's {os.cpu_count()}"
    quota = cgroup_cpu_limit(proc)
    if quota is not None:
        parts.append(f"its cgroup's CPU quota of {quota:g} core{'s' * (quota != 1)}")
        share = min(share, quota)
    if load is None:
        try:
            load = os.getloadavg()[0]
        except OSError:
            load = 0.0
    idle = max(0, int(math.floor(cores - load + 0.5)))
    if idle < share:
        parts.append(f"load average {load:.1f} leaves {idle} idle")
        share = idle
    if jobs > 1:
        parts.append(f"shared by {jobs} processes")
    return Choice(max(1, int(share // max(1, jobs))), "; ".join(parts))


def describe(choice: Choice) -> str:
    return (f"torch threads: {choice.threads} ({choice.why}; {ENV}=N overrides)")


def apply(jobs: int = 1) -> Choice:
    """Set torch's intra-op threads to `choose(jobs)` (never more than torch would use) and return the choice."""
    import torch

    choice = choose(jobs)
    if choice.why.startswith(f"{ENV}="):
        torch.set_num_threads(choice.threads)
    elif not choice.why.startswith("OMP_NUM_THREADS="):
        torch.set_num_threads(min(torch.get_num_threads(), choice.threads))
    return choice
