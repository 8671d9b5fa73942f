"""Red-team round 7, mechanism 1 (FINDINGS7.md; #22, #23, #25): numpy was out of the route meters' sight. A decoy of
tiled torch products gave the FLOPs, extents, visits and reach of a tiled pass while the answer was computed in
numpy (a whole row of scores with a two-pass softmax, P and dS on 64 rows x all keys, one softmax over every key):
all three earned full credit. Now, during a call of an exercise the course map marks `torch_only`, the tensors' data
may not leave torch (`grader.host_budget`): more than HOST_LIMIT numbers out, or a storage, an address or DLPack,
is a verdict. The routes are counted here in this process (the child's profiler hook and dispatch mode, with a
guard that records), and the three variants and the honest one nearest the limit run through the isolated path."""
import contextlib
import io
import json
import operator
import pickle
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from grader.course_map import COURSE
from grader.harness import load_exercises, with_cell_source
from grader import host_budget
from grader.host_budget import HOST_LIMIT, TORCH_ONLY, HostBudget
from grader.observers import Observers

REPO = Path(__file__).resolve().parent.parent
REDTEAM = REPO / "tests" / "fixtures" / "redteam"


class _Guard:
    """The child's guard as HostBudget uses it: verdicts recorded; this file is the notebook's code."""

    def __init__(self):
        self.flags = []

    def flag(self, root, why):
        self.flags.append(why)

    def student(self, frame):
        return frame is not None and frame.f_code.co_filename == __file__


@pytest.fixture(autouse=True, scope="module")
def _wrappers():
    """The wrappers, as the child installs them before the notebook's code runs; the C functions put back after
    (read from the keeper's frame, as only a test may: in the child that read is a verdict)."""
    import ctypes
    import gc

    before = {name: vars(torch.Tensor).get(name) for name in host_budget._WRAPPED}
    host_budget.install()
    yield
    sends = host_budget.WRAPPERS["numpy"].__closure__[host_budget.WRAPPER_CODE.co_freevars.index("sends")]
    originals = sends.cell_contents[0].__self__.gi_frame.f_locals["originals"]
    for name, shim in host_budget.WRAPPERS.items():
        for holder in gc.get_referrers(shim):
            if type(holder) is dict:
                for key in [k for k, v in holder.items() if v is shim]:
                    holder[key] = originals[name]
    for name, was in before.items():
        if was is None:
            vars(torch.Tensor).get(name) is not None and delattr(torch.Tensor, name)
        else:
            setattr(torch.Tensor, name, was)
    for t in (torch._C.TensorBase, *torch._tensor_classes):
        ctypes.pythonapi.PyType_Modified(ctypes.py_object(t))
    sys._clear_type_cache()
    host_budget.WRAPPERS.clear()


def _prof(budget):
    def prof(frame, event, arg):
        if event == "c_call":
            budget.c_call(frame, arg)
    return prof


@contextlib.contextmanager
def _budgeted(root="flash_decode", args=()):
    """(budget, guard) of a call of `root` with `args`, as the child counts it, while the block runs."""
    guard = _Guard()
    budget = HostBudget(guard, root, args)
    prof = _prof(budget)
    mode = Observers()
    mode.host = budget
    with mode:
        sys.setprofile(prof)
        try:
            yield budget, guard
        finally:
            sys.setprofile(None)


def _count(fn):
    """(numbers moved, verdicts) of `fn()` run as a call of flash_decode is in the child."""
    with _budgeted() as (budget, guard):
        fn()
    return budget.moved, guard.flags


T = torch.randn(2, 150)  # 300 numbers: a row of scores for 2 heads


@pytest.mark.parametrize("route", [
    lambda: T.numpy(), lambda: T.tolist(), lambda: np.asarray(T), lambda: [float(x) for x in T.flatten()],
    lambda: [x.item() for x in T.flatten()], lambda: repr(T.flatten()[:200]),
    lambda: [bool(x > 0) for x in T.flatten()], lambda: [torch.equal(x, T[0, 0]) for x in T.flatten()],
    lambda: list(map(torch.Tensor.numpy, [T])), lambda: list(map(operator.methodcaller("tolist"), [T])),
    # torch._C's own methods called from C (FINDINGS8.md's open route), and the legacy types' copies of them
    lambda: list(map(torch._C.TensorBase.numpy, [T])), lambda: list(map(torch._C.TensorBase.tolist, [T])),
    lambda: list(map(torch.FloatTensor.numpy, [T])), lambda: list(map(vars(torch._C.TensorBase)["tolist"], [T])),
], ids=["numpy", "tolist", "asarray", "float", "item", "repr", "bool", "equal", "map-numpy", "methodcaller-tolist",
        "map-base-numpy", "map-base-tolist", "map-legacy-numpy", "map-base-dict-tolist"])
def test_every_way_out_to_python_is_counted(route):
    moved, flags = _count(route)
    assert moved >= 200, moved
    assert len(flags) == 1 and "out of torch in one call" in flags[0], flags


@pytest.mark.parametrize("route", [
    lambda: pickle.dumps(T), lambda: torch.save(T, io.BytesIO()), lambda: T.untyped_storage(),
    lambda: T.data_ptr(), lambda: np.from_dlpack(T), lambda: T.clone().apply_(lambda x: x * 2),
    lambda: list(map(torch.Tensor.untyped_storage, [T])), lambda: list(map(torch.utils.dlpack.to_dlpack, [T])),
    lambda: T.const_data_ptr(), lambda: torch._C._storage_address(T),
    lambda: list(map(torch._C.TensorBase.data_ptr, [T])), lambda: list(map(torch.DoubleTensor.untyped_storage, [T])),
], ids=["pickle", "save", "storage", "data_ptr", "dlpack", "apply_", "map-storage", "map-dlpack", "const_data_ptr",
        "storage_address", "map-base-data_ptr", "map-legacy-storage"])
def test_a_tensors_memory_itself_is_denied(route):
    _, flags = _count(route)
    assert any("reached a tensor's memory" in f for f in flags), flags


def test_what_honest_kernels_take_out_stays_free():
    n = torch.tensor([37, 5])

    def honest():
        lengths = n.tolist()  # a length
        int(n.max())  # a bound
        for _ in range(40):  # a printed running max per chunk (tests/fixtures/redteam/v4/w17_os_honest_verbose.py)
            T[0, :8].max().item()
        return lengths

    moved, flags = _count(honest)
    assert moved == 2 + 1 + 40 and not flags, (moved, flags)
    assert moved < HOST_LIMIT


def test_the_torch_only_exercises_are_the_kernels_and_caches():
    names = [e.name for w in COURSE for e in w.exercises]
    assert all(names.count(n) == 1 for n in TORCH_ONLY), "a torch-only exercise's name must be one week's alone"
    assert {"online_softmax", "flash_attention_forward", "flash_attention_backward", "flash_decode",
            "merge_partials", "gqa_attention", "paged_attention"} <= TORCH_ONLY
    assert not TORCH_ONLY & {"softmax_rows", "tiled_matmul", "flash_attention_triton"}  # the interpreter uses numpy


def _run(tmp_path, week, grade_id, variant, verdicts=None):
    """Check `grade_id` of the week's release with `variant` as its cell, in the isolated child; `verdicts` gets
    every verdict the child sent (`Session.tampered`), whatever the check raised first."""
    from importlib import import_module
    path = next((REPO / "weeks" / str(week)).glob("week*.ipynb"))
    text = subprocess.run(["git", "show", f"HEAD:{path.relative_to(REPO)}"], cwd=REPO, capture_output=True, text=True,
                          check=True).stdout
    target = tmp_path / path.name
    target.write_text(json.dumps(with_cell_source(json.loads(text), grade_id, variant.read_text())))
    ex = load_exercises(target)
    try:
        getattr(import_module(f"grader.checks.week{week}"), f"check_{grade_id}")(getattr(ex, grade_id))
    finally:
        if verdicts is not None:
            verdicts += [why for whys in ex._session.tampered.values() for why in whys]
        ex.close()


@pytest.mark.parametrize("grade_id, variant, says", [
    ("flash_attention_forward", "v7/w17_fwd_numpy_twopass.py", "numbers out of torch in one call"),  # #22
    ("flash_attention_backward", "v7/w17_bwd_numpy_rows.py", "numbers out of torch in one call"),  # #23
    ("flash_decode", "v7/w17_decode_numpy_rowsoftmax.py", "numbers out of torch in one call"),  # #25
    # red team 8 (FINDINGS8.md): the conversions called from C (#1), Python run on each element by apply_ (#2)
    ("flash_decode", "v8/w17_decode_map_numpy.py", "numbers out of torch in one call"),
    ("flash_decode", "v8/w17_decode_apply_python.py", r"ran Python on each element \(apply_\(\)\)"),
    # after round 8: torch._C.TensorBase's own numpy() called by map; the C function taken from the keeper's frame
    ("flash_decode", "v8/w17_decode_base_numpy.py", "numbers out of torch in one call"),
    ("flash_decode", "v8/w17_decode_keeper_frame.py", "took a frame"),
    ("flash_decode", "v8/w17_decode_keeper_send.py", "numbers out of torch in one call"),
    ("flash_decode", "v8/w17_decode_ctypes_read.py", "read the process's memory by address through ctypes"),
    # red team 9 (FINDINGS9.md): copies into memory numpy sees (#1), a fresh copy of a grader file calling numpy() (#5)
    ("flash_decode", "v9/w17_decode_frombuffer.py", "numbers out of torch in one call"),
    ("flash_decode", "v9/w17_decode_grader_values.py", "numbers out of torch in one call"),
])
def test_a_kernel_computed_in_numpy_fails(tmp_path, grade_id, variant, says):
    """The child's verdict, sent the moment it is reached, is among what failed the check (on a busy machine a bound
    of the check's own can fail a slow wrong route first: the verdict is still there, and the grade is 0 either way)."""
    verdicts = []
    with pytest.raises(AssertionError) as failed:
        _run(tmp_path, 17, grade_id, REDTEAM / variant, verdicts)
    assert re.search(says, str(failed.value)) or any(re.search(says, why) for why in verdicts), (
        str(failed.value)[:300], verdicts)


def test_the_honest_softmax_that_prints_each_chunk_passes(tmp_path):
    _run(tmp_path, 17, "online_softmax", REDTEAM / "v4" / "w17_os_honest_verbose.py")


def test_the_integer_arguments_are_metadata_read_freely():
    """Week 19's honest kernels read the lengths and block tables in Python (`int(context_lens[b])`, an index taken
    from a block table: tests/fixtures/honest/w19_paged_attention_b.py); a copy of them is not the argument."""
    tables, lens = torch.arange(600).reshape(20, 30), torch.arange(20)
    with _budgeted("paged_attention", (T, tables, lens)) as (budget, guard):
        [int(tables[b, i]) for b in range(20) for i in range(30)]
        lens.tolist()
        free = budget.moved
        (tables * 1).tolist()
    assert free == 0 and budget.moved == 600 and len(guard.flags) == 1, (free, budget.moved, guard.flags)


def test_taking_the_wrappers_off_is_a_verdict():
    guard = _Guard()
    saved = torch.Tensor.numpy
    torch.Tensor.numpy = lambda self: None
    try:
        HostBudget(guard, "flash_decode")
    finally:
        torch.Tensor.numpy = saved
    assert len(guard.flags) == 1 and "took torch.Tensor's numpy back" in guard.flags[0], guard.flags


_HOLDERS = """
import gc, sys
import torch
from grader import host_budget
host_budget.install()


def main():  # (its names in a frame, which the check leaves out, not in the module's globals)
  sends = host_budget.WRAPPERS["numpy"].__closure__[host_budget.WRAPPER_CODE.co_freevars.index("sends")]
  originals = sends.cell_contents[0].__self__.gi_frame.f_locals["originals"]
  assert set(originals) >= {"numpy", "tolist", "item", "untyped_storage", "data_ptr", "_to_dlpack"}
  for name in list(originals):
      fn = originals[name]
      holders = [h for h in gc.get_referrers(fn) if h is not originals and not isinstance(h, type(sys._getframe()))]
      assert not holders, (name, [type(h).__name__ for h in holders])
      assert getattr(torch._C.TensorBase, name, None) in (None, host_budget.WRAPPERS[name]) or name in \\
          host_budget._MODULE_FUNCTIONS
  assert torch._C._to_dlpack is host_budget.WRAPPERS["_to_dlpack"]
  print("held by the keepers alone")


main()
"""


def test_the_c_functions_are_held_by_the_keepers_frame_alone():
    """No dict, list, module or type the notebook's code can name still holds a C function a wrapper replaced: the one
    way to them is the keeper generator's frame, and reading a frame is a verdict in the child (child_guard). In a
    fresh process, installed right after torch's import as the child does: a test worker may have run code that made
    a frozenset of torch's methods before (which no wrapper can replace), and the child runs none."""
    done = subprocess.run([sys.executable, "-c", _HOLDERS], cwd=Path(__file__).resolve().parent.parent,
                          capture_output=True, text=True, timeout=300)
    assert "held by the keepers alone" in done.stdout, done.stderr[-3000:]
    assert torch.tensor([1.5, 2.5]).tolist() == [1.5, 2.5] and torch.tensor(3).item() == 3  # and they still work
    with pytest.raises(RuntimeError, match="requires grad"):
        torch.ones(2, requires_grad=True).numpy()  # the C function's own error, raised by the wrapper
    with torch.device("meta"):  # a __torch_function__ mode: item() asked again from inside item() (week 18's check)
        assert torch.tensor(2.0, device="cpu").item() == 2.0


def test_a_keeper_asked_directly_is_counted():
    """Code that finds a keeper's `send` (the wrapper's closure) and calls it from C gets the C function's answer, but
    the call is made from the keeper's frame, where the profiler counts it whoever asked."""
    sends = torch.Tensor.numpy.__closure__[host_budget.WRAPPER_CODE.co_freevars.index("sends")].cell_contents
    moved, flags = _count(lambda: list(map(sends[0], [("numpy", (T,), {}), ("tolist", (T,), {})])))
    assert moved == 600 and len(flags) == 1 and "out of torch in one call" in flags[0], (moved, flags)
    _, flags = _count(lambda: list(map(sends[1], [("data_ptr", (T,), {})])))
    assert any("reached a tensor's memory" in f for f in flags), flags


@pytest.fixture
def _notebook_exports():
    """What the notebook's code shares with numpy is noted (`host_budget.EXPORTED`): this file plays the notebook."""
    host_budget._STUDENT.append(_Guard().student)
    yield
    host_budget._STUDENT.clear()
    host_budget.EXPORTED.clear()


def test_memory_torch_shares_with_numpy_or_python_is_counted(_notebook_exports):
    """Red team 9 (FINDINGS9.md #1-#4): no conversion at all — torch copies into memory numpy or Python sees
    (`torch.frombuffer(bytearray)`, `torch.from_numpy(np.empty)`, a tensor whose numpy() a cell took), numpy reads it,
    and the answer comes back through `torch.from_numpy`. Counted by the ops that touch that memory."""
    flat = T.flatten()
    shared = [torch.frombuffer(bytearray(4 * 300), dtype=torch.float32),
              torch.from_numpy(np.empty(300, np.float32))]
    premapped = torch.zeros(300)
    seen = premapped.numpy()  # taken "when the cell ran": outside any call
    for target in (*shared, premapped):
        moved, flags = _count(lambda: target.copy_(flat))
        assert moved >= 300 and len(flags) == 1 and "out of torch in one call" in flags[0], (moved, flags)
    moved, flags = _count(lambda: torch.from_numpy(np.ones(300, np.float32)) * 2)  # an answer coming back
    assert moved >= 300 and flags, (moved, flags)
    assert seen.shape == (300,)


def test_a_constant_the_notebook_made_from_python_counts_once(_notebook_exports):
    neg_inf = torch.as_tensor(float("-inf"))

    def honest():
        m = torch.full((4,), -1.0)
        for _ in range(500):
            m = torch.maximum(m, neg_inf)
        return m

    moved, flags = _count(honest)
    assert moved <= 1 and not flags, (moved, flags)


def test_an_integer_argument_written_into_is_no_longer_free():
    """#7: scores written into the block table's memory through a float view, read back with tolist(), the table
    restored after: the write ends the table's being free metadata for the rest of the call."""
    tables, lens = torch.arange(600).reshape(20, 30), torch.arange(20)
    saved = tables.clone()
    with _budgeted("paged_attention", (T, tables, lens)) as (budget, guard):
        lens.tolist()
        free = budget.moved
        tables.view(torch.float32).copy_(torch.randn(20, 60))
        tables.view(torch.float32).tolist()
        tables.copy_(saved)
    assert free == 0 and budget.moved >= 1200 and len(guard.flags) == 1, (free, budget.moved, guard.flags)


def test_a_meta_tensors_tolist_moves_nothing():
    """#14: an honest paged kernel reads its block table once with tolist(); in the checks' meta-device run that
    raises (a meta tensor has no data), and it must not count the table as numbers out of torch."""
    def honest():
        with pytest.raises(Exception):
            torch.empty(2, 300, device="meta").tolist()
    moved, flags = _count(honest)
    assert moved == 0 and not flags, (moved, flags)


def test_numpy_through_torchs_own_code_is_noted_as_shared(_notebook_exports):
    """`np.asarray(t)` asks torch's `__array__`, which calls numpy(): memory the notebook shares that way counts too."""
    premapped = torch.zeros(300)
    seen = np.asarray(premapped)
    moved, flags = _count(lambda: premapped.copy_(T.flatten()))
    assert moved >= 300 and flags and seen.shape == (300,), (moved, flags)
