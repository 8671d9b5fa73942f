"""How the confined child is started, decided in the trusted process before it starts (`grader.isolation.Session`):
how its memory is limited, whether it runs Triton kernels in Triton's interpreter, whether it starts CUDA before its
sandbox, and the import path it gets."""
from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def memory_kind() -> str:
    """How the child's memory is limited: "as" (address space), or "data" where CUDA is present (its
    initialisation reserves address space an RLIMIT_AS refuses; `grader.child._Child._apply_memory_limit`).
    `INFERENCE_LAB_MEMORY_LIMIT=as|data` overrides."""
    forced = os.environ.get("INFERENCE_LAB_MEMORY_LIMIT")
    if forced in ("as", "data"):
        return forced
    import torch

    return "data" if torch.cuda.is_available() else "as"


_INTERPRETER_WORKS: bool | None = None
_INTERPRETER_PROBE = """
import os, torch
os.environ["TRITON_INTERPRET"] = "1"
import lib.attn.triton_attention as t
a, b = torch.randn(20, 40), torch.randn(40, 24)
assert torch.allclose(t.tiled_matmul(a, b), a @ b, atol=1e-4, rtol=1e-4)
"""


def triton_interpreted_in_child() -> bool:
    """Whether the confined child runs Triton kernels in Triton's interpreter, where week 17's checks see them. Yes
    wherever the interpreter works: always on a CPU (the lab's triton pin), and on a GPU machine when its triton's
    interpreter runs lib's tiled matmul here (probed once per process, in a subprocess: the triton a CUDA build of
    torch requires may be older than the pin, and 3.6's interpreter fails on numpy 2.4, a scalar used in range()).
    Where it does not, the child compiles the kernels and the checks judge their numbers and wrappers only. Without a
    GPU the probe is skipped (it cost every grading process ~5 s of a core): there Triton runs interpreted or not
    at all, and a broken interpreter fails the notebook's own Triton cells as it fails the checks."""
    global _INTERPRETER_WORKS
    if os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "on", "yes"):
        return True
    if _INTERPRETER_WORKS is None and not uses_cuda():
        _INTERPRETER_WORKS = True  # no GPU to compile for: the interpreter is the only way Triton runs here
    if _INTERPRETER_WORKS is None:
        try:
            done = subprocess.run([sys.executable, "-c", _INTERPRETER_PROBE], cwd=str(REPO_ROOT), timeout=120,
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            _INTERPRETER_WORKS = done.returncode == 0
        except (OSError, subprocess.SubprocessError):
            _INTERPRETER_WORKS = False
        if not _INTERPRETER_WORKS:
            warnings.warn("Triton's interpreter does not run here (its triton is older than the lab's pin?): week 17's "
                          "Triton exercises are graded compiled, on their numbers and wrappers only, not their "
                          "kernels' route", stacklevel=2)
    return _INTERPRETER_WORKS


def uses_cuda() -> bool:
    """Whether the child starts CUDA's driver before its sandbox (`grader._sandbox.start_cuda`): where the grader's
    own torch sees a GPU."""
    import torch

    return torch.cuda.is_available()


def child_import_path() -> list[str]:
    """The grader's own import path, for the child (a package installed on PYTHONPATH is found there too), less
    what the view replaces: the repository and anything in it but the Python environment."""
    out = []
    for p in sys.path:
        if not p or not os.path.isdir(p):
            continue
        real = Path(p).resolve()
        env = Path(sys.prefix).resolve()
        if (real == REPO_ROOT or REPO_ROOT in real.parents) and not (real == env or env in real.parents):
            continue
        if str(real) not in out:
            out.append(str(real))
    return out


# The child's first lines (`python -I -c CHILD_BOOT rfd wfd workdir memory cpu where.json`): its import path, CUDA
# started before the sandbox where the grader has a GPU (tests/test_integrity_resources.py says why), the sandbox, then
# `grader.child`.
CHILD_BOOT = r"""
import json, os, sys
rfd, wfd, workdir, memory, cpu = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
where = json.loads(sys.argv[6])
sys.path[:0] = [where["view"]] + [p for p in where["path"] if p not in sys.path]
from grader import _sandbox
cuda = _sandbox.start_cuda() if where.get("cuda") else ""
sandbox = _sandbox.confine(workdir, cpu, where["readable"]) + cuda
from grader import child
child._child_main(rfd, wfd, memory, sandbox, where["memory_kind"])
"""
