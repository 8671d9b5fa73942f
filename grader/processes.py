"""Every process a submission starts, found and stopped: `kill_tree`, subreapers, pids cgroups (Linux).

What it guards: **no process a student's code started outlives its grading.** A process group is not
enough: `setsid` leaves it, and a double fork leaves the child's process tree. The child is the subreaper of
its own tree (`grader._sandbox`), a grading worker is the subreaper of what the child leaves
(`become_subreaper`), and, as root where a pids cgroup can be made, the child is in one of its own
(`pids_cgroup`). `kill_tree` stops (a stopped process cannot fork) and then kills all of them, each through
a pidfd taken while its start time still matched, so a reused pid is never hit.

And what a grading process holds that a submission must not read: **the instructor's environment** and the
process's own memory. `worker_environment` is what a grading process keeps of the environment it was started with
(`exec_clean` restarts `python -m grader autograde` with it, `clean_environ` starts `--jobs` workers with it; the
child gets less still, `grader.isolation`), and `make_undumpable` puts a grading process's `/proc/<pid>` files
out of reach of processes of the same uid without capabilities (the child).
"""
from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
import tempfile
import time

_PR_SET_CHILD_SUBREAPER, _PR_GET_CHILD_SUBREAPER = 36, 37
_PR_SET_DUMPABLE = 4


def _libc():
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def become_subreaper() -> bool:
    """Make this process the subreaper of its descendants: one whose parent dies is handed to it, not to init."""
    return sys.platform.startswith("linux") and _libc().prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def is_subreaper() -> bool:
    import ctypes

    flag = ctypes.c_int(0)
    return sys.platform.startswith("linux") and \
        _libc().prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0) == 0 and flag.value == 1


def _processes() -> dict[int, tuple[int, int, str]]:
    """pid -> (parent pid, start time in clock ticks since boot, state) of every process (Linux /proc)."""
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    stat = f.read()
                fields = stat[stat.rindex(b")") + 2:].split()
                table[int(entry)] = (int(fields[1]), int(fields[19]), fields[0].decode())
            except (OSError, ValueError, IndexError):
                pass
    return table


def process_start_time(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return int(stat[stat.rindex(b")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _cgroup_members(cgroup: str | None) -> set[int]:
    if not cgroup:
        return set()
    try:
        with open(os.path.join(cgroup, "cgroup.procs")) as f:
            return {int(line) for line in f if line.strip()}
    except (OSError, ValueError):
        return set()


def kill_tree(root: int | None, orphans_since: int | None = None, keep: set[int] = frozenset(),
              cgroup: str | None = None) -> int:
    """SIGKILL `root`, every descendant of it, every process in `cgroup`, and (`orphans_since`, a start time) this
    process's own children started since then but `keep` — a subreaper's share of what a dead child left. Each is
    first stopped, through a pidfd taken while its start time still matched (so a reused pid is never hit),
    until a pass finds no new one; then all are killed and this process's own are reaped. Returns how many."""
    me = os.getpid()
    held: dict[int, int] = {}  # pid -> pidfd of a stopped process
    try:
        for _ in range(1000):
            table = _processes()
            roots = ({root} if root in table else set()) | (_cgroup_members(cgroup) & set(table))
            if orphans_since is not None:
                roots |= {p for p, (parent, start, _) in table.items()
                          if parent == me and start >= orphans_since and p not in keep}
            children: dict[int, list[int]] = {}
            for p, (parent, _, _) in table.items():
                children.setdefault(parent, []).append(p)
            found, todo = set(), list(roots)
            while todo:
                p = todo.pop()
                if p not in found:
                    found.add(p)
                    todo.extend(children.get(p, ()))
            new = [p for p in found - set(held) if table[p][2] not in "ZX"]
            if not new:
                break
            for p in new:
                try:
                    fd = os.pidfd_open(p)
                except OSError:
                    continue
                if process_start_time(p) != table[p][1]:
                    os.close(fd)
                    continue
                held[p] = fd
                try:
                    signal.pidfd_send_signal(fd, signal.SIGSTOP)
                except OSError:
                    pass
        for fd in held.values():
            try:
                signal.pidfd_send_signal(fd, signal.SIGKILL)
            except OSError:
                pass
    finally:
        for fd in held.values():
            os.close(fd)
    # Reap the ones handed to this process (a Popen reaps its own `root`), and those that had already exited.
    deadline = time.monotonic() + 5
    mine = {p for p in held if p != root}
    if orphans_since is not None:
        mine |= {p for p, (parent, start, state) in _processes().items()
                 if parent == me and state == "Z" and start >= orphans_since and p != root and p not in keep}
    while mine and time.monotonic() < deadline:
        for p in list(mine):
            try:
                done, _ = os.waitpid(p, os.WNOHANG)
            except ChildProcessError:  # not ours: its own parent (also being killed) or init reaps it
                done = p
            if done:
                mine.discard(p)
        if mine:
            time.sleep(0.01)
    return len(held)


def pids_cgroup() -> str | None:
    """As root: a new pids cgroup (at most `_sandbox.MAX_PROCESSES` tasks) below this process's own, or None where
    none can be made (no pids controller, not writable, not root: then RLIMIT_NPROC applies)."""
    from grader._sandbox import MAX_PROCESSES

    if os.geteuid() != 0:
        return None
    try:
        with open("/proc/self/cgroup") as f:
            lines = [line.rstrip("\n").split(":", 2) for line in f]
    except OSError:
        return None
    for _, controllers, path in lines:
        if "pids" in controllers.split(","):
            base = f"/sys/fs/cgroup/pids{path.rstrip('/')}"
            break
    else:
        return None
    try:
        cgroup = tempfile.mkdtemp(prefix="inference-lab-", dir=base)
        with open(os.path.join(cgroup, "pids.max"), "w") as f:
            f.write(str(MAX_PROCESSES))
        return cgroup
    except OSError:
        return None


def remove_cgroup(cgroup: str | None) -> None:
    if cgroup:
        for _ in range(50):
            try:
                os.rmdir(cgroup)
                return
            except FileNotFoundError:
                return
            except OSError:  # still has (dying) members
                time.sleep(0.02)


# --- the environment a grading process keeps ---------------------------------------------------------------

# What a grading process needs of the instructor's environment: where things are (PATH, HOME, TMPDIR, PYTHONPATH,
# the virtual environment, Jupyter's and the caches' folders), the locale and time zone, thread counts, the GPU's
# settings, and the grader's own INFERENCE_LAB_* settings. Nothing else — tokens, keys, cloud credentials, a
# hub's API token — reaches it; and no name that looks like a secret, whatever its prefix.
WORKER_ENV = {"PATH", "HOME", "USER", "LOGNAME", "SHELL", "TERM", "COLUMNS", "LINES", "TMPDIR", "TEMP", "TMP", "TZ",
              "LANG", "LANGUAGE", "PYTHONPATH", "PYTHONHASHSEED", "PYTHONUTF8", "PYTHONIOENCODING", "PYTHONWARNINGS",
              "PYTHONDONTWRITEBYTECODE", "VIRTUAL_ENV", "CONDA_PREFIX", "LD_LIBRARY_PATH", "CC", "CXX", "HF_HOME",
              "HF_HUB_CACHE", "HF_HUB_OFFLINE", "TRANSFORMERS_CACHE", "TRANSFORMERS_OFFLINE", "MPLBACKEND",
              "LAB_QMATMUL", "SYSTEMROOT"}
WORKER_ENV_PREFIXES = ("INFERENCE_LAB_", "LC_", "XDG_", "JUPYTER_", "CUDA_", "NVIDIA_", "TRITON_", "CUBLAS_", "NCCL_",
                       "TORCH_", "OMP_", "MKL_", "OPENBLAS_", "KMP_", "GOMP_")
_SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSW|KEY|CREDENTIAL|AUTH|COOKIE|PRIVATE|CERT", re.IGNORECASE)


def secret_name(name: str) -> bool:
    """Whether an environment variable's name says it holds a secret (`INFERENCE_LAB_API_TOKEN`, `HF_TOKEN`)."""
    return bool(_SECRET_NAME.search(name))


def worker_environment(environ=None) -> dict[str, str]:
    """The part of `environ` (default: this process's) a grading process keeps (`WORKER_ENV`)."""
    environ = os.environ if environ is None else environ
    return {k: v for k, v in environ.items()
            if (k in WORKER_ENV or k.startswith(WORKER_ENV_PREFIXES)) and not secret_name(k)}


# The variables the child keeps (locale, libraries, devices, threads), less any whose name looks like a secret; the
# rest — paths, the seed of the checks' inputs, the grader's own settings — is the instructor's.
CHILD_ENV = {"PATH", "LANG", "LANGUAGE", "TZ", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES", "CUDA_HOME",
             "NVIDIA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "SYSTEMROOT"}
CHILD_ENV_PREFIXES = ("LC_", "TRITON_", "CUBLAS_", "NCCL_")


def child_environment(environ=None) -> dict[str, str]:
    """The part of `environ` (default: this process's) the child is started with (`grader.isolation` adds its own
    folders, HOME and TMPDIR among them)."""
    environ = os.environ if environ is None else environ
    return {k: v for k, v in environ.items()
            if (k in CHILD_ENV or k.startswith(CHILD_ENV_PREFIXES)) and not secret_name(k)}


def exec_clean() -> None:
    """Restart this process (`python -m grader ...`, as typed) with `worker_environment` alone, unless that is all it
    has: `/proc/<pid>/environ` shows the environment a process was *started* with, whatever it removes from
    `os.environ` afterwards, and the `--jobs` workers inherit it. POSIX only (Windows' exec starts another process)."""
    clean = worker_environment()
    if clean == dict(os.environ) or os.name != "posix":
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, list(sys.orig_argv), clean)


@contextlib.contextmanager
def clean_environ():
    """Within this block this process's environment is `worker_environment` alone (for starting the `--jobs`
    workers, which inherit it); the whole environment again afterwards."""
    saved = dict(os.environ)
    clean = worker_environment(saved)
    try:
        os.environ.clear()
        os.environ.update(clean)
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def make_undumpable() -> bool:
    """PR_SET_DUMPABLE 0 for this process (a grading worker, pytest's process): its `/proc/<pid>` files then belong to
    root and the kernel lets no process without CAP_SYS_PTRACE read its memory, `environ`, `maps` or `fd` — the
    child runs with no capability, as the instructor's uid or (under a root grader) an unprivileged uid of its own
    (`grader._sandbox`). No core dumps of it either; an `execve` makes a process dumpable again."""
    return sys.platform.startswith("linux") and _libc().prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) == 0
