"""No memory read or written by address in the student's process: numpy's `__array_interface__` is not read there.

A numpy array over any integer address is one attribute away: a plain object whose `__array_interface__` says
`{"data": (address, False), "shape": ..., "typestr": ...}` becomes, through `np.asarray`, an array over that memory,
with no ctypes call, no audit event and none of torch's conversions (red team 10's #6-#8: each tensor's data address
worked out from `id(t)` and torch's C++ layouts, the answer computed in numpy and written into a `torch.empty`).
numpy's C code looks the attribute up under one interned string, which it keeps in its own static data
(`numpy._core._multiarray_umath`); before the notebook's code runs, `close_array_interface` points that slot at
`__array_struct__`, so numpy never reads an interface an object offers, in `asarray`, `array`, ufuncs or anywhere else.
numpy's own arrays keep theirs (a getter by its C name, which nothing here changes). `np.lib.stride_tricks.as_strided`
and `sliding_window_view`, which make their arrays the same way, are unavailable there too: a stride past an array's
end is a read by address as well. The other door to the process's memory, `/proc/self/mem`, is closed by the
sandbox (`grader._sandbox._own_proc`); ctypes' is a verdict (`grader.child_guard`), and cffi and CPython's test modules are not in its view (`grader.view.DENIED_PACKAGES`).

torch's storage API has doors of its own (red team 11): a storage mapped from a file numpy maps too
(`UntypedStorage.from_file`), shared memory handed out by descriptor or name (`_share_fd_cpu_`, `_new_shared`...),
a storage's raw bytes written into a Python file object (`_write_file`). None is what a kernel or a cache needs; `close_storage_doors` makes each raise in the student's process (a storage the
notebook's code makes or takes, which remains, is memory Python sees: `grader.host_budget`). Bytes into a storage from
a file object (`_set_from_file`, `_new_with_file`: torch's legacy unpickling, which the grader's wire uses) come only
from a real file or an `io.BytesIO` there: torch hands any other object's `readinto` a memoryview of the storage's own
memory, which that object may keep (red team 12b's #1).
"""
from __future__ import annotations

import ctypes
import struct
import sys

_NAME = "__array_interface__"
# What numpy looks up instead: `__array_struct__` itself, which numpy asks for first and accepts only as a capsule,
# which Python code cannot make (ctypes' is a verdict, cffi is out of the view). Any other name could be answered:
# a fixed one by an attribute of that name, any one by a class's `__getattr__` (red team 10b's #1, #2); an object
# that answers `__array_struct__` with an interface dict is refused by numpy's capsule check.
_ELSEWHERE = sys.intern("__array_struct__")


def _data_sections(path: str) -> list[tuple[int, int]]:
    """(start, end) in this process of the shared object's `.data` and `.bss` (from its ELF section headers, placed
    by the address its first mapping is loaded at): where its static variables live, and nothing else."""
    with open(path, "rb") as f:
        elf = f.read()
    if elf[:4] != b"\x7fELF" or elf[4] != 2 or elf[5] != 1:  # 64-bit little-endian only
        return []
    shoff, = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    headers = [struct.unpack_from("<IIQQQQ", elf, shoff + i * shentsize) for i in range(shnum)]
    names = headers[shstrndx][4]  # the section-name table's file offset
    with open("/proc/self/maps") as f:
        starts = [int(line.split()[0].split("-")[0], 16) for line in f
                  if line.split()[-1] == path and int(line.split()[2], 16) == 0]
    if not starts:
        return []
    out = []
    for name_at, _kind, _flags, addr, _offset, size in headers:
        name = elf[names + name_at:elf.index(b"\0", names + name_at)]
        if name in (b".data", b".bss") and size:
            out.append((starts[0] + addr, starts[0] + addr + size))
    return out


def _offers_memory() -> bool:
    """Whether numpy still makes an array from an object's interface (pointed at an array of its own): one set as the
    attribute, one that a `__getattr__` hands out for any name but `__array_struct__`."""
    import numpy

    mine = numpy.arange(3, dtype=numpy.int64)
    interface = {"data": (mine.ctypes.data, True), "shape": (3,), "typestr": "<i8", "version": 3}

    class Holder:
        pass

    class Answers:
        def __getattr__(self, name):
            if name.startswith("__array") and name != "__array_struct__":
                return interface
            raise AttributeError(name)

    h = Holder()
    setattr(h, _NAME, interface)
    for holder in (h, Answers()):
        try:
            got = numpy.asarray(holder)
        except Exception:  # noqa: BLE001  (refused: what is wanted)
            continue
        if got.dtype == numpy.int64 and got.tolist() == [0, 1, 2]:
            return True
    return False


def close_array_interface() -> str:
    """Point numpy's lookup of `__array_interface__` at `__array_struct__`; a phrase for the sandbox's description."""
    try:
        import numpy
    except ImportError:  # pragma: no cover
        return ""
    target = id(sys.intern(_NAME))
    hits = []
    for lo, hi in _data_sections(numpy._core._multiarray_umath.__file__):
        lo = -(-lo // 8) * 8  # pointers are 8-aligned
        words = (ctypes.c_uint64 * ((hi - lo) // 8)).from_address(lo)
        hits += [lo + 8 * int(i) for i in numpy.nonzero(numpy.frombuffer(words, dtype=numpy.uint64) == target)[0]]
    if len(hits) != 1:
        return f"numpy's __array_interface__ still read ({len(hits)} slots found, 1 expected)"
    ctypes.c_uint64.from_address(hits[0]).value = id(_ELSEWHERE)
    if _offers_memory():
        ctypes.c_uint64.from_address(hits[0]).value = target
        return "numpy's __array_interface__ still read (its slot did not hold the lookup)"
    return "no numpy array by address (__array_interface__ not read)"


# torch._C.StorageBase's methods that map a file or shared memory, or move a storage's raw bytes out to Python. (Bytes
# into a storage stay: `from_buffer`, `_set_from_file` and `_new_with_file` are how torch unpickles a storage, as the
# grader's own wire does in this process; numbers into torch are not what the checks count.)
STORAGE_DOORS = ("from_file", "_new_shared_fd_cpu", "_new_shared_filename_cpu", "_new_using_fd_cpu",
                 "_new_using_filename_cpu", "_share_fd_cpu_", "_share_filename_cpu_", "_get_shared_fd", "_get_filename",
                 "_write_file", "_shared_incref", "_shared_decref", "_new_with_weak_ptr")


def _denied(name: str):
    def denied(*args, **kwargs):
        raise PermissionError(
            f"torch's storage method {name} is not available in the grader's process: it maps files or shared memory, "
            f"or moves a storage's raw bytes out to Python, out of the checks' sight. Compute with torch ops on "
            f"tensors")
    denied.__name__ = denied.__qualname__ = name
    return denied


_READ_FROM = ("_set_from_file", "_new_with_file")  # read a file object into a storage (`_plain_file`)


def _plain_file(f) -> bool:
    """Whether torch may read `f` into a storage: an `io.BytesIO`, a `FileIO`, or a buffered reader over one (whose
    `readinto` copies and keeps nothing); any other object's `readinto` would be handed the storage's memory."""
    import io

    if type(f) in (io.BytesIO, io.FileIO):
        return True
    return type(f) in (io.BufferedReader, io.BufferedRandom) and type(getattr(f, "raw", None)) is io.FileIO


def _reading(name: str, original):
    """`original` (`_set_from_file`, a method, or `_new_with_file`, a static method) for plain files only."""
    def refuse(f):
        raise PermissionError(
            f"torch's storage method {name} reads only a real file or an io.BytesIO in the grader's process (not a "
            f"{type(f).__name__}): torch hands any other object's readinto the storage's own memory, out of the "
            f"checks' sight. Compute with torch ops on tensors")
    if name == "_set_from_file":
        def read(self, f, *args, **kwargs):
            if not _plain_file(f):
                refuse(f)
            return original(self, f, *args, **kwargs)
    else:
        def read(f, *args, **kwargs):
            if not _plain_file(f):
                refuse(f)
            return original(f, *args, **kwargs)
    read.__name__ = read.__qualname__ = name
    return read


def close_storage_doors() -> str:
    """Make torch's storage methods that map files or shared memory or move raw bytes (`STORAGE_DOORS`) raise, in the
    C base's own dict (immutable from Python: changed through the dict itself, as `grader.host_budget` does) and in
    the Python classes over it; a phrase for the sandbox's description."""
    import gc

    import torch

    base = gc.get_referents(torch._C.StorageBase.__dict__)[0]
    for name in STORAGE_DOORS:
        if name in base:
            base[name] = _denied(name)
    for name in _READ_FROM:
        found = base.get(name)
        if isinstance(found, staticmethod):
            base[name] = staticmethod(_reading(name, found.__func__))
        elif found is not None:
            base[name] = _reading(name, found)
    ctypes.pythonapi.PyType_Modified(ctypes.py_object(torch._C.StorageBase))
    for cls in (torch.UntypedStorage, torch.storage._StorageBase, torch.TypedStorage, torch.storage._LegacyStorage):
        for name in STORAGE_DOORS + ("share_memory_", "_share_memory_", "_new_shared"):
            if name in vars(cls):
                setattr(cls, name, _denied(name))
    sys._clear_type_cache()
    return "no storage over files, shared memory or raw bytes, nor read from a file object of Python's"
