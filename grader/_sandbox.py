"""Confine the current process before it runs a student's code (called first thing in the child).

- rlimits: CPU seconds (RLIMIT_CPU, then SIGXCPU/SIGKILL), no core files, files written at most 256 MiB
  (RLIMIT_FSIZE); the address-space limit (RLIMIT_AS) is set later, after torch is imported.
- Linux Landlock (kernel 5.13+, no privileges needed): from here on this process and its children may create,
  write, truncate, rename or delete files **only** under `workdir` (its own temporary folder; plus /dev/null);
  reading stays allowed everywhere (the lab's `lib/`, torch, the checks). With Landlock ABI >= 4 it may not
  open TCP connections or bind ports; with ABI >= 6 it may not signal processes outside its sandbox (so it
  cannot kill the grader) nor connect to abstract UNIX sockets.
- processes: the child is the subreaper of everything it starts (a double-forked or `setsid`'d process stays in
  its process tree, where the grader finds and kills it) and dies with the process that started it. A
  process-count limit: `RLIMIT_NPROC` when not root (it counts all of the user's tasks, so it is set to their
  number now plus `MAX_PROCESSES`); the kernel never applies `RLIMIT_NPROC` to uid 0, so as root the grader
  puts the child in a pids cgroup of its own instead, where one is writable (`grader.processes`).
- Without Landlock, when running as root, the process drops to user `nobody` instead (then the repo, owned by
  root and not world-writable, cannot be written either); otherwise nothing stops it writing where the
  instructor can — `confine` says which of these applied, and the grader prints it.
"""
from __future__ import annotations

import ctypes
import os
import resource
import sys

_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_PDEATHSIG, _PR_SET_CHILD_SUBREAPER = 1, 36
MAX_PROCESSES = 256  # processes (tasks: threads count) a submission may add

# LANDLOCK_ACCESS_FS_*
_EXECUTE, _WRITE_FILE, _READ_FILE, _READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_REMOVE_DIR, _REMOVE_FILE = 1 << 4, 1 << 5
_MAKE = sum(1 << b for b in range(6, 13))  # CHAR DIR REG SOCK FIFO BLOCK SYM
_REFER, _TRUNCATE = 1 << 13, 1 << 14


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _landlock(workdir: str, readable: list | None = None) -> str | None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    abi = libc.syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    if abi < 1:
        return None
    fs = _WRITE_FILE | _REMOVE_DIR | _REMOVE_FILE | _MAKE
    if abi >= 2:
        fs |= _REFER
    if abi >= 3:
        fs |= _TRUNCATE
    read = _READ_FILE | _READ_DIR | _EXECUTE
    if readable is not None:
        fs |= read
    attr = _RulesetAttr(handled_access_fs=fs, handled_access_net=3 if abi >= 4 else 0, scoped=3 if abi >= 6 else 0)
    size = ctypes.sizeof(_RulesetAttr) if abi >= 6 else (16 if abi >= 4 else 8)
    ruleset = libc.syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        return None
    file_rights = _EXECUTE | _WRITE_FILE | _READ_FILE | (_TRUNCATE if abi >= 3 else 0)
    rules = [(workdir, fs), ("/dev/null", (_WRITE_FILE | (_TRUNCATE if abi >= 3 else 0)) | (read if readable is not None else 0))]
    kinds = {"read": read, "list": _READ_DIR, "device": _READ_FILE | _WRITE_FILE}
    rules += [(path, kinds.get(kind, 0) & fs) for kind, path in (readable or ())]
    try:
        for path, access in rules:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue  # gone since the list was made: nothing to allow
            try:
                if not os.path.isdir(path):
                    access &= file_rights
                if not access:
                    continue
                rule = _PathBeneath(allowed_access=access, parent_fd=fd)
                if libc.syscall(_SYS_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(1), ctypes.byref(rule),
                                ctypes.c_uint32(0)) != 0:
                    return None
            finally:
                os.close(fd)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            return None
        if libc.syscall(_SYS_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
            return None
    finally:
        os.close(ruleset)
    extras = (", no TCP" if abi >= 4 else "") + (", no signals outside" if abi >= 6 else "")
    reads = ", reads only the week's view and the Python environment" if readable is not None else ""
    return f"landlock ABI {abi}: writes only under its temporary folder{reads}{extras}"


# seccomp: the child may not open sockets (UDP and unix-domain sockets are beyond Landlock's reach) or io_uring
# rings (whose operations seccomp does not see). struct sock_filter / sock_fprog, and the BPF program below.
class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_SockFilter))]


_AUDIT_ARCH_X86_64, _AUDIT_ARCH_AARCH64 = 0xC000003E, 0xC00000B7
# syscall numbers refused: socket, io_uring_setup (x86_64: 41, 425; aarch64: 198, 425)
_REFUSED = {_AUDIT_ARCH_X86_64: (41, 425), _AUDIT_ARCH_AARCH64: (198, 425)}


def _seccomp() -> str | None:
    import platform

    arch = {"x86_64": _AUDIT_ARCH_X86_64, "aarch64": _AUDIT_ARCH_AARCH64}.get(platform.machine())
    if arch is None or not sys.platform.startswith("linux"):
        return None
    ld_w_abs, jeq_k, jge_k, ret_k = 0x20, 0x15, 0x35, 0x06
    allow, refuse = 0x7FFF0000, 0x00050000 | 1  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EPERM
    nrs = _REFUSED[arch]
    refuse_at = len(nrs) + 5  # the index of the last instruction; a jump's offset counts from the next one
    prog = [(ld_w_abs, 0, 0, 4),  # the calling convention's architecture: another one (int 0x80) is refused
            (jeq_k, 0, refuse_at - 2, arch),
            (ld_w_abs, 0, 0, 0),  # the syscall number
            (jge_k, refuse_at - 4, 0, 0x40000000)]  # x32 syscalls: another way to the same calls, refused
    prog += [(jeq_k, refuse_at - (4 + i) - 1, 0, nr) for i, nr in enumerate(nrs)]
    prog += [(ret_k, 0, 0, allow), (ret_k, 0, 0, refuse)]
    filters = (_SockFilter * len(prog))(*[_SockFilter(*f) for f in prog])
    fprog = _SockFprog(len(prog), filters)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return None
    if libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) != 0:  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
        return None
    return "no sockets (seccomp)"


def _tasks_of(uid: int) -> int:
    """Tasks (processes and their threads) of real user `uid` now: what RLIMIT_NPROC counts."""
    n = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/status") as f:
                    fields = dict(line.split(":", 1) for line in f if ":" in line)
                if int(fields["Uid"].split()[0]) == uid:
                    n += int(fields["Threads"])
            except (OSError, KeyError, ValueError):
                pass
    return n


def _process_limit() -> str:
    """Limit the processes this one may start: RLIMIT_NPROC when not root, else join the pids cgroup the grader
    made for it (`INFERENCE_LAB_PIDS_CGROUP`); one phrase saying what applies."""
    uid = os.getuid()
    if uid == 0:
        cgroup = os.environ.pop("INFERENCE_LAB_PIDS_CGROUP", "")
        if not cgroup:  # (an empty path would write `cgroup.procs` into the working folder)
            return "no process-count limit (root, and no writable pids cgroup)"
        try:
            with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:  # before Landlock: this is a file write
                f.write(str(os.getpid()))
            with open(os.path.join(cgroup, "pids.max")) as f:
                return f"processes <= {f.read().strip()} (pids cgroup)"
        except OSError:
            return "no process-count limit (root, and no writable pids cgroup)"
    limit = _tasks_of(uid) + MAX_PROCESSES
    resource.setrlimit(resource.RLIMIT_NPROC, (limit, limit))
    return f"processes <= {MAX_PROCESSES} more (RLIMIT_NPROC)"


def start_cuda() -> str:
    """Initialise CUDA's driver (`cuInit`, through torch) in this process, before `confine`; a phrase for the
    sandbox's line. Run after Landlock's rules, the driver's initialisation finds no device (an H200, driver 580:
    `torch.cuda.is_available()` False, so the first CUDA tensor the grader sent could not be unpickled and the
    child exited), while a driver initialised before them goes on working inside them: contexts, kernels, cuBLAS,
    compiled Triton (`/dev/nvidia*` stay open for writing: `grader.view.readable_paths`). Only where the grader's
    own torch sees a GPU (`grader.isolation`); nothing of the student's has run yet."""
    import torch

    try:
        torch.cuda.init()
    except Exception as e:  # noqa: BLE001  (the student's CUDA calls will say the same; grading goes on)
        return f"; CUDA did not start ({type(e).__name__}: {e})"
    return "; CUDA started before the sandbox"


def confine(workdir: str, cpu_seconds: int, readable: list | None = None) -> str:
    """Apply the limits; return one line saying what applied. `readable`: the only paths the process may read,
    as ("read" or "list", path) pairs (`grader.view.readable_paths`); None leaves reading unrestricted."""
    linux = sys.platform.startswith("linux")
    if linux:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)  # orphans of the student's processes stay in this tree
        libc.prctl(_PR_SET_PDEATHSIG, 9, 0, 0, 0)  # SIGKILL when the grader that started it dies
    processes = _process_limit() if linux else "no process-count limit (not Linux)"
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (256 << 20, 256 << 20))
    if cpu_seconds > 0:
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 5))
    try:
        how = _landlock(workdir, readable)
    except (OSError, AttributeError):
        how = None
    if how is None and os.geteuid() == 0:
        os.chown(workdir, 65534, 65534)
        os.setgroups([])
        os.setgid(65534)
        os.setuid(65534)
        how = ("no landlock: running as user nobody (the repo is not writable for it; files readable by all users "
               "stay readable)")
    elif how is None:
        how = ("no landlock and not root: the student's code can read and write wherever you can (run it in a "
               "container)")
    try:
        sockets = _seccomp()
    except (OSError, AttributeError):
        sockets = None
    return how + f"; CPU {cpu_seconds} s, files <= 256 MiB, {processes}; " + (sockets or "sockets allowed (no seccomp)")
