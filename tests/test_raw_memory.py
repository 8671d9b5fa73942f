"""Red team 10's #6-#8 (tests/fixtures/redteam/FINDINGS10.md, mechanism 1): memory read and written by address.

Each tensor's data address worked out from `id(t)` and torch's C++ layouts, read (and written) by numpy through a
plain object's `__array_interface__`, the whole computation in numpy: no ctypes, none of torch's conversions, no
audit event — full credit in every torch-only exercise it was tried on. The same addresses read through the file
`/proc/self/mem` did as well (the lead's variant). Both doors are closed in the student's process now:
- numpy reads no `__array_interface__` there (`grader.raw_memory.close_array_interface`: numpy's lookup slot points
  at another name), so the holder becomes a 0-d object array;
- the sandbox gives the child its own /proc folder entry by entry, without `mem` (`grader._sandbox._own_proc`).
Red team 10b then read numpy's redirected name off the holder, answered every name with `__getattr__`, and used
cffi (installed in the environment): numpy now looks up `__array_struct__` there (a capsule only), and cffi and
CPython's test modules are out of the child's view. Held through the isolated path, as `pytest weeks/NN` grades them;
and the two doors, in a fresh process.
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from grader.harness import load_exercises, with_cell_source

REPO = Path(__file__).resolve().parent.parent
RED = REPO / "tests" / "fixtures" / "redteam"


def _run(tmp_path, week, name, variant):
    import importlib
    checks = importlib.import_module(f"grader.checks.week{week}")
    path = next((REPO / "weeks" / week).glob("week*.ipynb"))
    text = subprocess.run(["git", "show", f"HEAD:{path.relative_to(REPO)}"], cwd=REPO, capture_output=True, text=True,
                          check=True).stdout
    target = tmp_path / path.name
    target.write_text(json.dumps(with_cell_source(json.loads(text), name, variant.read_text())))
    ex = load_exercises(target)
    try:
        said = ex._session.sandbox
        assert "no numpy array by address" in said, said  # the child says it closed the door (grader.raw_memory)
        getattr(checks, f"check_{name}")(getattr(ex, name))
    finally:
        ex.close()


@pytest.mark.parametrize("week, name, variant, message", [
    ("16", "gqa_attention", "v10/w16_gqa_address.py", "0-dimensional"),
    ("16", "gqa_attention", "v8/w16_gqa_address_tensor.py", "0-dimensional"),
    ("16", "gqa_attention", "v8/w16_gqa_procmem.py", r"Permission denied: '/proc/self/mem'"),
    ("17", "merge_partials", "v10/w17_merge_address.py", "0-dimensional"),
    # red team 10b: the name numpy looked up instead, set on the holder (#1), or any name answered by `__getattr__`
    # (#2, #3): numpy now looks up `__array_struct__`, which wants a capsule; cffi's `ffi.cast` (#5, #7): not in the view
    ("16", "gqa_attention", "v10b/w16_gqa_renamed_interface.py", "0-dimensional"),
    ("16", "gqa_attention", "v10b/w16_gqa_getattr_interface.py", "'dict' object is not callable"),
    ("17", "merge_partials", "v10b/w17_merge_getattr_interface.py", "'dict' object is not callable"),
    ("16", "gqa_attention", "v10b/w16_gqa_cffi.py", "Permission denied: .*cffi"),
    ("17", "flash_decode", "v10b/w17_flashdecode_cffi.py", "Permission denied: .*cffi"),
], ids=lambda v: v if "/" in str(v) else None)
def test_memory_read_by_address_fails(tmp_path, week, name, variant, message):
    with pytest.raises(AssertionError, match=message):  # (a cell that raises at load: ExerciseMissing, one too)
        _run(tmp_path, week, name, RED / variant)


def test_an_honest_gqa_in_numpys_neighbourhood_still_passes(tmp_path):
    _run(tmp_path, "16", "gqa_attention", RED / "v9" / "w16_gqa_honest_grouped.py")


PROBE = r"""
import os, sys
sys.path.insert(0, sys.argv[1])
import numpy as np
from grader import _sandbox
from grader.raw_memory import close_array_interface
mine = np.arange(3, dtype=np.int64)
class Holder:
    pass
h = Holder()
h.__array_interface__ = {"data": (mine.ctypes.data, True), "shape": (3,), "typestr": "<i8", "version": 3}
before = np.asarray(h).dtype.kind
said = close_array_interface()
after = np.asarray(h).dtype.kind
os.makedirs(sys.argv[2], exist_ok=True)
_sandbox._landlock(sys.argv[2], [("read", "/proc"), ("read", sys.prefix), ("read", "/usr")])
def opens(path):
    try:
        with open(path, "rb", buffering=0) as f:
            f.read(1)
        return "read"
    except OSError as e:
        return type(e).__name__
print(before, after, said, opens("/proc/self/mem"), opens(f"/proc/self/task/{os.getpid()}/mem"),
      opens("/proc/self/statm"), opens("/proc/self/root/etc/hostname"), sep="|")
"""


def test_the_two_doors_are_closed_in_a_fresh_process(tmp_path):
    """In a process of its own (numpy's slot is changed for good, Landlock applies for good): a holder's interface
    is an array before and an object after; /proc/self/mem (the process's and its thread's) cannot be opened while
    /proc/self/statm can, and the link to `/` in its /proc folder leads nowhere readable."""
    out = subprocess.run([sys.executable, "-c", PROBE, str(REPO), str(tmp_path / "work")], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    before, after, said, mem, task_mem, statm, root = out.stdout.strip().split("|")
    assert before == "i" and after == "O", (before, after, said)
    assert said.startswith("no numpy array by address"), said
    if "landlock" not in _landlock_phrase():
        pytest.skip("no Landlock on this machine: /proc/self/mem stays readable (grader/README.md says so)")
    assert (mem, task_mem, statm, root) == ("PermissionError", "PermissionError", "read", "PermissionError")


def _landlock_phrase() -> str:
    out = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
                          "from grader import _sandbox; import tempfile; "
                          "print(_sandbox._landlock(tempfile.mkdtemp(), None)[0])", str(REPO)],
                         capture_output=True, text=True, timeout=60)
    return out.stdout
