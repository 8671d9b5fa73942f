"""Every process a submission starts, found and stopped: `kill_tree`, subreapers, pids cgroups (Linux).

What it guards: **no process a student's code started outlives its grading.** A process group is not
enough: `setsid` leaves it, and a double fork leaves the child's process tree. The child is the subreaper of
its own tree (`grader._sandbox`), a grading worker is the subreaper of what the child leaves
(`become_subreaper`), and, as root where a pids cgroup can be made, the child is in one of its own
(`pids_cgroup`). `kill_tree` stops (a stopped process cannot fork) and then kills all of them, each through
a pidfd taken while its start time still matched, so a reused pid is never hit.
"""
from __future__ import annotations

import os
import signal
import sys
import tempfile
import time

_PR_SET_CHILD_SUBREAPER, _PR_GET_CHILD_SUBREAPER = 36, 37


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
