"""Confine the current process before it runs a student's code (called first thing in the child).

- rlimits: CPU seconds (RLIMIT_CPU, then SIGXCPU/SIGKILL), no core files, files written at most 256 MiB
  (RLIMIT_FSIZE); the address-space limit (RLIMIT_AS) is set later, after torch is imported.
- Linux Landlock (kernel 5.13+, no privileges needed): from here on this process and its children may create,
  write, truncate, rename or delete files **only** under `workdir` (its own temporary folder; plus /dev/null),
  and read only where `readable` says (the week's view, the Python environment, the system's files: `grader.view`;
  everywhere when it is None). With Landlock ABI >= 4 it may not
  open TCP connections or bind ports; with ABI >= 6 it may not signal processes outside its sandbox (so it
  cannot kill the grader) nor connect to abstract UNIX sockets.
- processes: the child is the subreaper of everything it starts (a double-forked or `setsid`'d process stays in
  its process tree, where the grader finds and kills it) and dies with the process that started it. A
  process-count limit: `RLIMIT_NPROC` when not root (it counts all of the user's tasks, so it is set to their
  number now plus `MAX_PROCESSES`); the kernel never applies `RLIMIT_NPROC` to uid 0, so as root the grader
  puts the child in a pids cgroup of its own instead, where one is writable (`grader.processes`).
- /proc: with Landlock, the process may read the system's files there (`/proc/cpuinfo`, `/proc/sys`, ...) and its
  own `/proc/<pid>`, never another process's entries (`environ`, `cmdline`, `maps`, `fd`, ...: `_proc_rules`).
- credentials (`_drop_privileges`): `no_new_privs`, and no capability in any set (effective, permitted,
  inheritable, ambient; the bounding set too where it can be dropped, i.e. as root); securebits set and locked so
  that neither exec nor a uid change gives capabilities back. As root the process then becomes an unprivileged user
  of its own (`_unprivileged`: uid and gid `UID_BASE` + its pid, no supplementary group; user `nobody` where the
  container maps no such uid): it owns no file but its temporary folder (handed to it first), so what it reads is
  what every user may read — beneath what Landlock allows — and it cannot signal, trace or change the limits of
  the grader or of another student's process (each has its own uid). Its own IPC namespace as well. Not as root,
  the process keeps the instructor's uid, with no capability.
- what an unprivileged uid could not reach (`_anchor_imports`): a Python installed beneath a folder only root may
  enter (pyenv's /root/.pyenv: /root is 0700) stays importable. Before the uid changes, each folder on the import
  path that the new uid could not walk to is held open (an O_PATH descriptor), and a path hook finds modules in it
  through `/proc/self/fd/N` (a magic link, which skips the folders above), with their real file names kept
  (`__file__`, tracebacks). `/proc/self/fd` is then the process's own only while it is dumpable, so it is made
  dumpable again after the uid change (the kernel clears it): with a uid of its own, no other process may trace or
  read it for that, and Landlock keeps it out of every other process's /proc entries either way. The parent-death
  signal, which a uid change clears too, is set again.
- Without Landlock, the same unprivileged uid (the repo, owned by root and not world-writable, cannot be written
  either; the import folders are anchored only where the uid is its own, not nobody's: a Python beneath /root may
  not run then); not as root, nothing stops it writing where the instructor can — `confine` says which of these applied, and the grader prints it.
- seccomp (`_seccomp`): no sockets, io_uring, user namespaces (which would give capabilities back inside one),
  keyrings, ptrace (nor another process's memory or descriptors: process_vm_*, pidfd_getfd), perf events or bpf;
  and, where Landlock does not scope signals (ABI < 6), signals only to itself.
"""
from __future__ import annotations

import ctypes
import os
import platform  # here: once the uid is unprivileged the standard library may be out of reach
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


def _world_readable(root: str) -> list[tuple[str, str]]:
    """`root` as rules for what every user may read beneath it: a folder that only root may enter, a file or
    device only root may open (`/etc/shadow`, a disk's `/dev/sda`), and the sticky, world-writable folders where
    processes leave files (`/dev/shm`) are left out: the rules are made while the child is still root (its uid
    changes after them), and grant nothing its later uid could not read."""
    import stat

    out: list[tuple[str, str]] = []

    def walk(path: str, depth: int) -> bool:  # True: everything beneath `path` may be read by all
        try:
            st = os.lstat(path)
        except OSError:
            return False
        if stat.S_ISLNK(st.st_mode):
            return True  # a link is followed when opened, and the rules of its target apply
        if not stat.S_ISDIR(st.st_mode):
            return bool(st.st_mode & stat.S_IROTH)
        if (st.st_mode & (stat.S_IROTH | stat.S_IXOTH)) != (stat.S_IROTH | stat.S_IXOTH) or \
                (st.st_mode & stat.S_ISVTX and st.st_mode & stat.S_IWOTH) or depth > 12:
            return False
        try:
            entries = sorted(os.listdir(path))
        except OSError:
            return False
        ok = [(e, walk(os.path.join(path, e), depth + 1)) for e in entries]
        if all(fine for _, fine in ok):
            return True
        out.append(("list", path))
        out.extend(("read", os.path.join(path, e)) for e, fine in ok if fine)
        return False

    if walk(root, 0):
        out.append(("read", root))
    return out


_PINNED: list[int] = []  # O_PATH descriptors of this process's own /proc/<pid> (see `_proc_rules`)


def _proc_rules(as_root: bool) -> list[tuple[str, str]]:
    """/proc for a Landlock ruleset: the system's entries (cpuinfo, meminfo, sys, ...; as root only those every user
    may read) and this process's own `/proc/<pid>` (where `/proc/self` leads), never another process's — not its
    `environ` nor its `cmdline`, `maps`, `fd`, `status`; /proc itself cannot be listed (a right to list a folder
    holds for every folder beneath it). Its own folder's descriptor stays open: a rule is held by the inode, and
    /proc makes a new inode for a pid's folder each time its cached entry is dropped."""
    me = str(os.getpid())
    rules = _own_proc(f"/proc/{me}")
    for entry in sorted(os.listdir("/proc")):
        if entry.isdigit() or entry in ("self", "thread-self"):
            continue
        path = f"/proc/{entry}"
        rules += _world_readable(path) if as_root else [("read", path)]
    return rules


_RAW = ("mem",)  # the process's memory as a file: read at any address, it is a raw memory read (red team 10)


def _own_proc(folder: str) -> list[tuple[str, str]]:
    """This process's own /proc folder, entry by entry, less `mem` (its own and each thread's, under `task/`): reading
    /proc/self/mem at an address reads this process's memory without torch, numpy or ctypes seeing it. Each entry's
    descriptor stays open (`_PINNED`: a rule is held by the inode)."""
    rules = []
    for entry in sorted(os.listdir(folder)):
        path = f"{folder}/{entry}"
        if entry in _RAW or os.path.islink(path):
            continue  # (a link — root, cwd, exe — would put the rule on what it leads to: `/` for root)
        if entry == "task":
            for tid in sorted(os.listdir(path)):
                try:
                    rules += _own_proc(f"{path}/{tid}")
                except OSError:  # a thread that has just ended
                    continue
            _PINNED.append(os.open(path, os.O_PATH | os.O_CLOEXEC))
            rules.append(("list", path))
            continue
        try:
            _PINNED.append(os.open(path, os.O_PATH | os.O_CLOEXEC))
        except OSError:
            continue
        rules.append(("read", path))
    _PINNED.append(os.open(folder, os.O_PATH | os.O_CLOEXEC))
    return rules + [("list", folder)]


def _expand(readable: list, as_root: bool) -> list:
    """The view's rules, with /proc as `_proc_rules` and, as root, /etc and /dev as `_world_readable`."""
    out = []
    for kind, path in readable:
        if kind == "read" and path == "/proc":
            out += _proc_rules(as_root)
        elif kind == "read" and as_root and path in ("/etc", "/dev"):
            out += _world_readable(path)
        else:
            out.append((kind, path))
    return out


def _landlock(workdir: str, readable: list | None = None) -> tuple[str | None, int]:
    """Landlock's rules for this process; (a phrase saying what applies, or None where Landlock is missing, and its
    ABI: 0 where missing)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    abi = libc.syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    if abi < 1:
        return None, 0
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
        return None, 0
    file_rights = _EXECUTE | _WRITE_FILE | _READ_FILE | (_TRUNCATE if abi >= 3 else 0)
    rules = [(workdir, fs), ("/dev/null", (_WRITE_FILE | (_TRUNCATE if abi >= 3 else 0)) | (read if readable is not None else 0))]
    kinds = {"read": read, "list": _READ_DIR, "device": _READ_FILE | _WRITE_FILE}
    rules += [(path, kinds.get(kind, 0) & fs) for kind, path in _expand(readable or [], os.geteuid() == 0)]
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
                    return None, 0
            finally:
                os.close(fd)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            return None, 0
        if libc.syscall(_SYS_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
            return None, 0
    finally:
        os.close(ruleset)
    extras = (", no TCP" if abi >= 4 else "") + (", no signals outside" if abi >= 6 else "")
    reads = (", reads only the week's view, the Python environment and the system's files (not another "
             "process's /proc)") if readable is not None else ""
    return f"landlock ABI {abi}: writes only under its temporary folder{reads}{extras}", abi


# --- credentials ---------------------------------------------------------------------------------------------

_PR_CAPBSET_DROP, _PR_SET_SECUREBITS, _PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 24, 28, 47, 4
# SECBIT_NOROOT, SECBIT_NO_SETUID_FIXUP, SECBIT_NO_CAP_AMBIENT_RAISE set, SECBIT_KEEP_CAPS clear: each locked
_SECUREBITS = (1 << 0) | (1 << 1) | (1 << 2) | (1 << 3) | (1 << 5) | (1 << 6) | (1 << 7)
_CAPABILITY_VERSION_3 = 0x20080522
_CLONE_NEWIPC = 0x08000000
_CAP_FIELDS = ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def credentials() -> dict[str, str]:
    """This process's uids, capability sets and no_new_privs, as /proc/self/status says them."""
    with open("/proc/self/status") as f:
        fields = dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
    return {k: fields.get(k, "").strip() for k in ("Uid", *_CAP_FIELDS, "NoNewPrivs")}


UID_BASE = 0x7F000000  # a root grader's child runs as uid and gid UID_BASE + its pid (< 2^31: pids are < 2^22)
NOBODY = 65534
_PR_SET_DUMPABLE = 4


def _mapped(ident: int, which: str) -> bool:
    """Whether this user namespace maps `ident` (/proc/self/uid_map or gid_map): a rootless container maps few."""
    try:
        with open(f"/proc/self/{which}_map") as f:
            rows = [tuple(int(x) for x in line.split()) for line in f if line.strip()]
    except (OSError, ValueError):
        return ident == NOBODY
    return any(inside <= ident < inside + count for inside, _, count in rows)


def _unprivileged() -> tuple[int, int]:
    """(uid, gid) for this process once it drops root: its own (`UID_BASE` + pid), else nobody's."""
    own = UID_BASE + os.getpid()
    if _mapped(own, "uid") and _mapped(own, "gid"):
        return own, own
    return NOBODY, NOBODY


def _reachable(path: str, uid: int, gid: int) -> bool:
    """Whether `uid` (group `gid`, no other) may walk to folder `path` and list it, by the permission bits alone."""
    parts = os.path.realpath(path).split(os.sep)
    for i in range(1, len(parts) + 1):
        here = os.sep.join(parts[:i]) or os.sep
        try:
            st = os.stat(here)
        except OSError:
            return False
        shift = 6 if st.st_uid == uid else (3 if st.st_gid == gid else 0)
        need = 0o5 if i == len(parts) else 0o1  # read and search on the folder itself, search above it
        if (st.st_mode >> shift) & need != need:
            return False
    return True


_ANCHORS: dict[str, str] = {}  # a folder on the import path the new uid cannot reach -> /proc/self/fd/N


def _through(path: str) -> str | None:
    """`path` by way of the anchor of the deepest anchored folder holding it, or None."""
    for real in sorted(_ANCHORS, key=len, reverse=True):
        if path == real or path.startswith(real + os.sep):
            return _ANCHORS[real] + path[len(real):]
    return None


def _back(path: str) -> str:
    """An anchored path's real name."""
    for real, fd in _ANCHORS.items():
        if path == fd or path.startswith(fd + os.sep):
            return real + path[len(fd):]
    return path


def _anchor_imports(uid: int, gid: int) -> int:
    """Before the uid changes: every folder of the import path (`sys.path`, and the imported packages' `__path__`)
    that `uid` could not walk to is held open, and a path hook imports from it (see the module's docstring). The
    number of folders anchored."""
    from importlib import machinery

    folders = [p for p in sys.path if isinstance(p, str) and p]
    for module in list(sys.modules.values()):
        where = getattr(module, "__path__", None)
        folders += [p for p in where if isinstance(p, str) and p] if isinstance(where, list) else []
    for folder in sorted(set(folders), key=len):
        if _through(folder) is None and os.path.isdir(folder) and not _reachable(folder, uid, gid):
            _ANCHORS[folder] = f"/proc/self/fd/{os.open(folder, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)}"
    if not _ANCHORS:
        return 0
    finder_of = machinery.FileFinder.path_hook(
        (machinery.ExtensionFileLoader, machinery.EXTENSION_SUFFIXES),
        (machinery.SourceFileLoader, machinery.SOURCE_SUFFIXES),
        (machinery.SourcelessFileLoader, machinery.BYTECODE_SUFFIXES))

    class AnchoredLoader(machinery.SourceFileLoader):  # the real file name, read through the anchor; nothing written
        def get_data(self, path):
            return super().get_data(_through(path) or path)

        def path_stats(self, path):
            return super().path_stats(_through(path) or path)

        def set_data(self, path, data, *, _mode=0o666):
            pass

    class AnchoredFinder:
        def __init__(self, finder):
            self.finder = finder

        def find_spec(self, fullname, target=None):
            spec = self.finder.find_spec(fullname, target)
            if spec is None:
                return None
            if type(spec.loader) is machinery.SourceFileLoader and spec.origin:
                spec.origin = _back(spec.origin)
                spec.loader = AnchoredLoader(fullname, spec.origin)
            if spec.submodule_search_locations is not None:
                spec.submodule_search_locations[:] = [_back(p) for p in spec.submodule_search_locations]
            return spec

        def invalidate_caches(self):
            self.finder.invalidate_caches()

    def anchored(path):
        through = _through(path) if isinstance(path, str) else None
        if through is None:
            raise ImportError("not an anchored folder")
        return AnchoredFinder(finder_of(through))

    sys.path_hooks.insert(0, anchored)
    sys.path_importer_cache.clear()
    return len(_ANCHORS)


def _drop_privileges(ids: tuple[int, int] | None, dumpable: bool = False) -> str:
    """`no_new_privs` and no capability in any set, for good (see the module's docstring); as root with `ids`,
    that uid and gid as well (and, with `dumpable`, dumpable again). One phrase saying what holds; RuntimeError
    where a capability or root is left."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise RuntimeError("could not set no_new_privs")
    if os.geteuid() == 0:
        for cap in range(64):  # EINVAL past the kernel's last capability
            libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)
        libc.prctl(_PR_SET_SECUREBITS, _SECUREBITS, 0, 0, 0)
    libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    if ids is not None and os.geteuid() == 0:
        parent = os.getppid()
        os.setgroups([])
        os.setresgid(ids[1], ids[1], ids[1])
        os.setresuid(ids[0], ids[0], ids[0])
        libc.prctl(_PR_SET_PDEATHSIG, 9, 0, 0, 0)  # cleared by the uid change
        if os.getppid() != parent:  # the grader died before it was set again
            os._exit(1)
        if dumpable:
            libc.prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0)  # its own /proc/self/fd for the anchors (cleared too)
    header, data = _CapHeader(_CAPABILITY_VERSION_3, 0), (_CapData * 2)()
    if libc.capset(ctypes.byref(header), data) != 0:
        raise RuntimeError(f"could not drop its capabilities: {os.strerror(ctypes.get_errno())}")
    now = credentials()
    left = [k for k in ("CapInh", "CapPrm", "CapEff", "CapAmb") if int(now[k] or "0", 16)]
    if left or now["NoNewPrivs"] != "1" or (ids is not None and 0 in os.getresuid() + os.getresgid()):
        raise RuntimeError(f"capabilities or root left after dropping them: {now}")
    uid = os.getuid()
    who = ("user nobody" if uid == NOBODY else f"uid {uid} (its own)") if ids is not None else (
        "uid 0 (root)" if uid == 0 else f"uid {uid} (the instructor's)")
    bounding = "" if int(now["CapBnd"] or "0", 16) == 0 else ", bounding set kept (not root: exec cannot use it)"
    return f"{who} with no capabilities{bounding}, no_new_privs"


def _new_ipc_namespace() -> str:
    """As root: a SysV IPC namespace of its own (uid 0 would otherwise own root's shared memory segments)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if os.geteuid() == 0 and libc.unshare(_CLONE_NEWIPC) == 0:
        return ", its own IPC namespace"
    return ""


# seccomp: the child may not open sockets (UDP and unix-domain sockets are beyond Landlock's reach) or io_uring
# rings (whose operations seccomp does not see), make a user namespace (where it would hold every capability over
# what the namespace owns), use the kernel's keyrings, trace a process, read performance counters or load bpf;
# where Landlock does not scope signals, it may signal only itself. struct sock_filter / sock_fprog, and the BPF
# program `_filter` assembles.
class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_SockFilter))]


_AUDIT_ARCH_X86_64, _AUDIT_ARCH_AARCH64 = 0xC000003E, 0xC00000B7
_SYSCALLS = {  # name: (x86_64, aarch64)
    "socket": (41, 198), "io_uring_setup": (425, 425), "unshare": (272, 97), "setns": (308, 268),
    "add_key": (248, 217), "request_key": (249, 218), "keyctl": (250, 219), "ptrace": (101, 117),
    "process_vm_readv": (310, 270), "process_vm_writev": (311, 271), "perf_event_open": (298, 241),
    "bpf": (321, 280), "clone": (56, 220), "clone3": (435, 435), "kill": (62, 129), "tkill": (200, 130),
    "tgkill": (234, 131), "rt_sigqueueinfo": (129, 138), "rt_tgsigqueueinfo": (297, 240),
    "pidfd_send_signal": (424, 424), "pidfd_getfd": (438, 438)}
_REFUSED = ("socket", "io_uring_setup", "unshare", "setns", "add_key", "request_key", "keyctl", "ptrace",
            "process_vm_readv", "process_vm_writev", "perf_event_open", "bpf", "pidfd_getfd")
_CLONE_NEWUSER = 0x10000000


def _filter(arch: int, own_pid: int | None) -> list[tuple[int, int, int, int]]:
    """The BPF program: (code, jt, jf, k) rows. `own_pid`: signals only to that process (kill: also its group)."""
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    allow, eperm, enosys = 0x7FFF0000, 0x00050000 | 1, 0x00050000 | 38  # SECCOMP_RET_ALLOW, _ERRNO | errno
    nr = {name: numbers[0 if arch == _AUDIT_ARCH_X86_64 else 1] for name, numbers in _SYSCALLS.items()}
    rows: list[list] = []
    labels: dict[str, int] = {}

    def op(code, k=0, jt=0, jf=0):
        rows.append([code, jt, jf, k])

    op(ld, 4)  # the calling convention's architecture: another one (int 0x80) is refused
    op(jeq, arch, 0, "refuse")
    op(ld, 0)  # the syscall number
    op(jge, 0x40000000, "refuse", 0)  # x32 syscalls: another way to the same calls, refused
    for name in _REFUSED:
        op(jeq, nr[name], "refuse", 0)
    op(jeq, nr["clone3"], "nosys", 0)  # its flags are in memory, out of BPF's sight: libc falls back to clone
    op(jeq, nr["clone"], "clone", 0)
    if own_pid is not None:
        op(jeq, nr["kill"], "kill", 0)
        for name in ("tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo"):
            op(jeq, nr[name], "own", 0)
        for name in ("tkill", "pidfd_send_signal"):
            op(jeq, nr[name], "refuse", 0)
    op(ret, allow)
    labels["clone"] = len(rows)
    op(ld, 16)  # the low half of the first argument (little-endian): clone's flags
    op(jset, _CLONE_NEWUSER, "refuse", "allow")
    if own_pid is not None:
        labels["kill"] = len(rows)
        op(ld, 16)
        op(jeq, 0, "allow", 0)  # its own process group
        labels["own"] = len(rows)
        op(ld, 16)
        op(jeq, own_pid, "allow", "refuse")
    labels["allow"] = len(rows)
    op(ret, allow)
    labels["refuse"] = len(rows)
    op(ret, eperm)
    labels["nosys"] = len(rows)
    op(ret, enosys)
    for i, row in enumerate(rows):
        for j in (1, 2):
            if isinstance(row[j], str):
                row[j] = labels[row[j]] - i - 1
                assert 0 <= row[j] < 256
    return [tuple(r) for r in rows]


def _seccomp(signals_to_self: bool = False) -> str | None:
    arch = {"x86_64": _AUDIT_ARCH_X86_64, "aarch64": _AUDIT_ARCH_AARCH64}.get(platform.machine())
    if arch is None or not sys.platform.startswith("linux"):
        return None
    prog = _filter(arch, os.getpid() if signals_to_self else None)
    filters = (_SockFilter * len(prog))(*[_SockFilter(*f) for f in prog])
    fprog = _SockFprog(len(prog), filters)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return None
    if libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) != 0:  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
        return None
    return "no sockets, user namespaces, keyrings or ptrace (seccomp)" + (", signals only to itself" if signals_to_self else "")


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
    if not linux:
        return (f"not Linux: no landlock, seccomp or capability drop; CPU {cpu_seconds} s, files <= 256 MiB, "
                f"{processes}")
    ipc = _new_ipc_namespace()
    try:
        how, abi = _landlock(workdir, readable)
    except (OSError, AttributeError):
        how, abi = None, 0
    ids = _unprivileged() if os.geteuid() == 0 else None
    anchored = 0
    if ids is not None:
        os.chown(workdir, *ids)  # its own folder (made by the grader, as root, mode 0700)
        if how is not None or ids[0] != NOBODY:  # dumpable, below: only where no other process shares the uid,
            anchored = _anchor_imports(*ids)  # or Landlock keeps the others out of its /proc entries
    if how is None and ids is not None:
        how = ("no landlock: an unprivileged uid of its own (the repo is not writable for it; files readable by all "
               "users stay readable)")
    elif how is None:
        how = ("no landlock and not root: the student's code can read and write wherever you can (run it in a "
               "container)")
    who = _drop_privileges(ids, dumpable=bool(anchored)) + (
        f", {anchored} import folder{'s' if anchored > 1 else ''} anchored" if anchored else "")
    if ids is not None and processes.startswith("no process-count limit"):
        processes = _process_limit()  # RLIMIT_NPROC applies to an unprivileged uid
    try:
        sockets = _seccomp(signals_to_self=abi < 6)
    except (OSError, AttributeError):
        sockets = None
    return (how + f"; {who}{ipc}; CPU {cpu_seconds} s, files <= 256 MiB, {processes}; " +
            (sockets or "sockets allowed (no seccomp)"))
