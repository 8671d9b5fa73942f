"""Grades that cannot be forged, the child's resources and machine: memory limited while the cells load, what the
child sends bounded, collect refusing unusable names, and the child on a CUDA machine (address space reserved by
CUDA, device files, CUDA started before the sandbox, a crash's last output in the message, packages on PYTHONPATH).
The routes to a grade without the work: tests/test_integrity.py and tests/test_integrity_copies.py."""
from __future__ import annotations

import importlib.util
import json
import sys
import tempfile
from pathlib import Path

import pytest
import torch


_spec = importlib.util.spec_from_file_location("_integrity_support", Path(__file__).with_name("_integrity_support.py"))
_spec.loader.exec_module(_support := importlib.util.module_from_spec(_spec))
REPO, _load = (
    _support.REPO, _support._load)


# --- resources ---------------------------------------------------------------------------------------------------

def test_memory_is_limited_while_the_cells_load(tmp_path, monkeypatch):
    from grader.checks import week16

    monkeypatch.setenv("INFERENCE_LAB_MEMORY", str(1 << 30))
    ex = _load(tmp_path, 16, prepend={"answer_q1": "_held = bytearray(3 << 30)"})
    with pytest.raises(AssertionError, match="MemoryError"):
        week16.check_answer_q1(ex.answer_q1)
    week16.check_causal_mask(ex.causal_mask)  # the other cells loaded


def test_what_the_child_sends_is_bounded(tmp_path, monkeypatch):
    from grader import isolation, wire

    monkeypatch.setattr(isolation, "MAX_RECEIVED", 8 << 20)
    ex = _load(tmp_path, 16, edits={"answer_q1": """
        def answer_q1():
            return torch.zeros(4 << 20)  # 16 MiB
        """})
    with pytest.raises(isolation.StudentCrash, match="more than 0 GiB|sent the checks more than"):
        ex.answer_q1()
    # A tensor whose storage the child claims is huge gets no local twin past the budget: its values only.
    storages = {"bytes": wire.STORAGE_BUDGET}
    t = wire._tensor_unobserved(storages, "torch.float32", (2,), (1,), 0, 1234, 1 << 29,
                                torch.ones(2).numpy().tobytes())
    assert t.untyped_storage().nbytes() == 8 and len(storages) == 1


# --- collect -----------------------------------------------------------------------------------------------------

def test_collect_refuses_unusable_names_and_collisions(tmp_path, capsys):
    from grader.__main__ import collect

    root = tmp_path / "course"
    (root / "weeks" / "16").mkdir(parents=True)
    release = REPO / "weeks" / "16" / "week16_kv_cache.ipynb"
    (root / "weeks" / "16" / release.name).write_bytes(release.read_bytes())
    inbox = tmp_path / "inbox"
    (inbox / "frank").mkdir(parents=True)
    for p in (inbox / "frank.ipynb", inbox / "frank" / release.name, inbox / "...ipynb", inbox / "grace.ipynb"):
        p.write_bytes(release.read_bytes())
    refused = collect("16", inbox, root=root)
    assert any(line.startswith("frank: both frank.ipynb and a folder frank/") for line in refused), refused
    assert any(line.startswith("'..': not a usable student id") for line in refused), refused
    submitted = sorted(p.relative_to(root).as_posix() for p in root.rglob("*.ipynb") if "submitted" in p.parts)
    assert submitted == ["grader/submitted/grace/16/week16_kv_cache.ipynb"]
    assert not (root / "grader" / "week16_kv_cache.ipynb").exists() and not (tmp_path / "16").exists()


# --- the child on a CUDA machine (issue: correct code "exited with status 1" there) -----------------------------

_RESERVE = '''
import mmap, ctypes

def reserve(gib, touch_gib=0):
    """What CUDA's initialisation does: reserve address space it does not touch (PROT_NONE); then allocate."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    MAP_PRIVATE, MAP_ANONYMOUS, MAP_NORESERVE = 0x02, 0x20, 0x4000
    addr = libc.mmap(None, gib << 30, 0, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0)
    reserved = addr not in (None, ctypes.c_void_p(-1).value)
    try:
        held = bytearray(touch_gib << 30) if touch_gib else None
        allocated = True
    except MemoryError:
        allocated = False
    return reserved, allocated
'''


@pytest.mark.parametrize("kind", ["as", "data"])
def test_the_memory_limit_lets_cuda_reserve_its_address_space(tmp_path, monkeypatch, kind):
    """CUDA's initialisation reserves tens of GiB of address space (PROT_NONE) it never touches. Under the address-
    space limit (RLIMIT_AS, the CPU default) that reservation is refused — the child died at its first CUDA tensor
    on a GPU machine. Where CUDA is present the child is limited by data instead (RLIMIT_DATA): the reservation
    passes, and allocating beyond the allowance still fails."""
    from grader.isolation import Session

    monkeypatch.setenv("INFERENCE_LAB_MEMORY_LIMIT", kind)
    nb = tmp_path / "week16_kv_cache.ipynb"
    nb.write_text("{}")
    session = Session(nb, memory=1 << 30)
    try:
        session.load([(0, "reserve", _RESERVE)])
        reserved, allocated = session.get("reserve")(64, 0)
        assert reserved is (kind == "data"), f"{kind}: a 64 GiB PROT_NONE reservation {'passed' if reserved else 'failed'}"
        _, allocated = session.get("reserve")(0, 2)
        assert not allocated, f"{kind}: 2 GiB allocated with 1 GiB allowed"
    finally:
        session.close()


def test_an_object_of_one_check_cannot_be_kept_for_another(tmp_path):
    """A check hands the child a model whose attention function is another exercise's answer (week 16's
    pool_kv_heads check: `model.attention_fn` is lib's gqa_attention). Kept in a global and called during the
    next check, it would compute that exercise for the student: at each check's end its objects are forgotten."""
    from grader.isolation import Session, StudentCrash
    from lib.modeling.llama import tiny_model

    nb = tmp_path / "week16_kv_cache.ipynb"
    nb.write_text("{}")
    source = '''
_kept = []

def keep(model):
    _kept.append(model.attention_fn)
    return "kept"

def use(q, k, v):
    return _kept[0](q, k, v, causal=True)
'''
    session = Session(nb)
    try:
        session.load([(0, "keep", source)])
        keep, use = session.get("keep"), session.get("use")
        q = torch.randn(1, 4, 5, 8)
        k = v = torch.randn(1, 2, 5, 8)
        session.begin_check()
        assert keep(tiny_model()) == "kept"
        assert use(q, k, v).shape == (1, 4, 5, 8)  # within the check that handed it over: allowed
        session.end_check()
        session.begin_check()
        with pytest.raises(StudentCrash):
            use(q, k, v)
        session.end_check()
    finally:
        session.close()


def test_device_files_are_writable_only_where_a_gpu_needs_them(tmp_path):
    """Writes are confined to the child's folder and /dev/null: any other device file opened for writing is refused
    (as a GPU's would be, and CUDA's initialisation opens /dev/nvidia* read-write); the rules add a GPU's device
    files where they exist."""
    from grader import view
    from grader.isolation import Session

    nb = tmp_path / "week16_kv_cache.ipynb"
    nb.write_text("{}")
    session = Session(nb)
    try:
        session.load([(0, "probe", '''
def probe():
    out = {}
    for path in ("/dev/null", "/dev/zero"):
        try:
            open(path, "wb").close()
            out[path] = "opened"
        except OSError as e:
            out[path] = type(e).__name__
    return out
''')])
        if "reads only" not in session.sandbox:
            pytest.skip(f"no Landlock here: {session.sandbox}")
        assert session.get("probe")() == {"/dev/null": "opened", "/dev/zero": "PermissionError"}
    finally:
        session.close()
    devices = [p for kind, p in view.readable_paths(Path(tempfile.mkdtemp())) if kind == "device"]
    assert sorted(devices) == sorted(str(p) for pat in ("nvidia*", "dri/*", "kfd") for p in Path("/dev").glob(pat)
                                     if p.is_char_device())


def test_a_crashed_childs_last_output_is_in_the_message(tmp_path):
    """A child that dies says why in its own output (a traceback, a driver's message); the verdict quotes its last
    lines, so a crash on a machine nobody can reach again (a GPU run) names its cause."""
    from grader.isolation import Session, StudentCrash

    nb = tmp_path / "week16_kv_cache.ipynb"
    nb.write_text("{}")
    source = '''
import os, sys

def die():
    print("RuntimeError: CUDA driver initialization failed, you might not have a CUDA gpu.", file=sys.stderr)
    sys.stderr.flush()
    os._exit(1)
'''
    session = Session(nb)
    try:
        session.load([(0, "die", source)])
        with pytest.raises(StudentCrash, match="exited with status 1 .*its last output: RuntimeError: CUDA driver"):
            session.get("die")()
    finally:
        session.close()


@pytest.mark.parametrize("cuda", [True, False])
def test_the_child_starts_cuda_before_its_sandbox(monkeypatch, cuda):
    """On the H200, CUDA's driver initialised inside the sandbox found no device (the confined child's torch said
    `cuda.is_available()` False and could not unpickle the grader's CUDA tensor), while one initialised before it
    kept working inside it. So the child's boot starts CUDA first where the grader has a GPU, and not otherwise:
    run the boot with the sandbox and the child replaced by recorders."""
    import types

    import grader
    from grader.child_setup import CHILD_BOOT as _CHILD_BOOT

    calls = []
    fake_sandbox = types.SimpleNamespace(start_cuda=lambda: calls.append("start_cuda") or "; cuda",
                                         confine=lambda *a: calls.append("confine") or "confined")
    fake_child = types.SimpleNamespace(_child_main=lambda *a: calls.append(("main", a[3])))
    monkeypatch.setattr(grader, "_sandbox", fake_sandbox, raising=False)
    monkeypatch.setattr(grader, "child", fake_child, raising=False)
    monkeypatch.setitem(sys.modules, "grader._sandbox", fake_sandbox)
    monkeypatch.setitem(sys.modules, "grader.child", fake_child)
    where = {"view": "/nonexistent", "path": [], "readable": None, "memory_kind": "as", "cuda": cuda}
    monkeypatch.setattr(sys, "argv", ["-c", "3", "4", "/tmp", "0", "0", json.dumps(where)])
    monkeypatch.setattr(sys, "path", list(sys.path))
    exec(_CHILD_BOOT, {})
    expected = (["start_cuda", "confine", ("main", "confined; cuda")] if cuda else ["confine", ("main", "confined")])
    assert calls == expected


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_confined_child_computes_on_cuda(tmp_path):
    """The child, confined as for grading, receives a CUDA tensor, makes its own, and sends one back (week 16's
    generate and week 18's speculative_generate died here on an H100 and an H200: its last output says why)."""
    from grader.isolation import Session

    nb = tmp_path / "week16_kv_cache.ipynb"
    nb.write_text("{}")
    source = '''
import torch

def double(x):
    return x * 2 + torch.zeros(x.shape, device=x.device)
'''
    session = Session(nb)
    try:
        session.load([(0, "double", source)])
        x = torch.arange(6.0, device="cuda")
        got = session.get("double")(x)
        assert got.device.type == "cuda" and torch.equal(got, x * 2)
    finally:
        session.close()


def test_a_package_on_pythonpath_is_found_wherever_it_is_installed(tmp_path, monkeypatch):
    """An instructor's python may import a package from PYTHONPATH (`pip install --target DIR`), in a folder not
    named site-packages: the view takes its copy of gguf (week 20's oracle-free gguf) from where the grader's own
    import finds it. Looking only in site-packages folders, every week-20 exercise failed on a GPU machine set up
    that way ("No module named 'gguf'" in the child)."""
    from grader.view import package_dir

    folder = tmp_path / "lab_site"  # not "site-packages"
    (folder / "lab_pkg_on_pythonpath").mkdir(parents=True)
    (folder / "lab_pkg_on_pythonpath" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(folder))
    assert package_dir("lab_pkg_on_pythonpath") == (folder / "lab_pkg_on_pythonpath").resolve()
    assert package_dir("no_such_package_anywhere") is None
    assert package_dir("gguf") is not None and (package_dir("gguf") / "quants.py").is_file()
