"""The GPU owner's kit, on a CPU (README.md, "GPU owners"): `tools/gpu_check.sh` refuses a machine without CUDA with
its one-line reason and counts a run right; `tools/run_notebooks.py` reports a passing and a failing notebook in
one line each and never writes over them; `make help` lists `make gpu-check`; `make setup TORCH_INDEX=...` installs
torch from that index, first, keeps torch's own triton where it differs from the pin, and remembers the index.
What it finds on a GPU is only known by running `make gpu-check` on one: CI has none."""
import json
import os
import re
import signal
import subprocess
import sys
import tomllib
from pathlib import Path

import nbformat
import pytest
import torch
from nbformat.v4 import new_code_cell, new_notebook

REPO = Path(__file__).resolve().parent.parent
PIN = re.search(r"torch==([\w.+]+)", "\n".join(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
                                                 ["dependencies"]))[1]
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")


def _env(as_typed: bool = False, **extra) -> dict:
    """The environment, less make's and gpu_check's settings; PYTHON is this run's interpreter unless `as_typed`."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHON", "TORCH_INDEX", "MAKEFLAGS", "MAKELEVEL")}
    if not as_typed:
        env["PYTHON"] = sys.executable
    env.update(extra)
    return env


def _run(cmd: list[str], timeout: float, **env) -> subprocess.CompletedProcess:
    """`cmd` from the repo root in a session of its own, killed whole afterwards (a gpu_check that wrongly goes on
    would leave notebook kernels running)."""
    proc = subprocess.Popen(cmd, cwd=REPO, env=_env(**env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{cmd} took more than {timeout} s:\n{out[-3000:]}{err[-2000:]}")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


@no_cuda
def test_gpu_check_without_cuda_says_why_and_exits_2(tmp_path):
    """As a user types it, from the repo root: one line with the reason, exit status 2, nothing run."""
    done = _run(["bash", "-c", "tools/gpu_check.sh"], 120, as_typed=True, TMPDIR=str(tmp_path))
    assert done.returncode == 2, done.stdout + done.stderr
    reason = (f"gpu_check: no CUDA device visible to torch {torch.__version__} (a CPU build?): "
              f"see README 'GPU owners'")
    assert done.stderr.strip().splitlines() == [reason], done.stderr
    assert f"torch={torch.__version__}" in done.stdout and "device=cpu" in done.stdout, done.stdout
    assert "== notebooks" not in done.stdout and "== pytest" not in done.stdout
    assert not list(tmp_path.iterdir()), "it left an output folder behind although it ran nothing"
    assert re.search(r"^## GPU owners$", (REPO / "README.md").read_text(), re.M), "the reason points to a section"


def test_gpu_check_counts_a_test_run(tmp_path):
    """--allow-cpu --tests-only on a throw-away test file: pytest's counts in the summary line, exit status 1 for a
    failed test, the junit xml and the log where --out says."""
    (tmp_path / "test_throwaway.py").write_text("def test_good():\n    pass\n\n\ndef test_bad():\n    assert 1 == 2\n\n\n"
                                                "def test_skipped():\n    import pytest\n    pytest.skip('no')\n")
    out = tmp_path / "out"
    done = _run(["bash", "tools/gpu_check.sh", "--allow-cpu", "--tests-only", "--out", str(out), "--",
                 str(tmp_path / "test_throwaway.py"), "-p", "no:cacheprovider"], 300)
    assert done.returncode == 1, done.stdout + done.stderr
    summary = [ln for ln in done.stdout.splitlines() if ln.startswith("gpu_check: notebooks")]
    device = "cpu (no CUDA device)" if not torch.cuda.is_available() else torch.cuda.get_device_name(0)
    assert summary == [f"gpu_check: notebooks: not run, pytest: 1 passed, 1 skipped, 1 failed — {device}, "
                       f"torch {torch.__version__}"], done.stdout[-3000:]
    assert (out / "pytest.xml").is_file() and "test_bad" in (out / "pytest.log").read_text()
    assert (out / "summary.txt").read_text().strip() == summary[0]


def _notebook(path: Path, *sources: str, grade_id: dict[int, str] | None = None) -> bytes:
    nb = new_notebook(cells=[new_code_cell(src) for src in sources])
    nb.metadata["kernelspec"] = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
    for index, gid in (grade_id or {}).items():
        nb.cells[index].metadata["nbgrader"] = {"grade_id": gid, "grade": False, "locked": True, "solution": False}
    path.parent.mkdir(parents=True)
    nbformat.write(nb, path)
    return path.read_bytes()


def test_run_notebooks_reports_pass_and_fail_and_writes_no_notebook(tmp_path):
    good, bad = tmp_path / "16" / "good.ipynb", tmp_path / "17" / "bad.ipynb"
    before = {
        good: _notebook(good, "import os, sys\nimport lib\nprint(os.getcwd())\nprint(sys.executable)", "x = 1"),
        bad: _notebook(bad, "y = 2", "raise ValueError('the second cell fails')", "z = 3", grade_id={1: "ex01-tests"}),
    }
    out = tmp_path / "out"
    done = _run([sys.executable, "tools/run_notebooks.py", "--jobs", "2", "--out", str(out), str(good), str(bad)], 300)
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert any(re.fullmatch(rf"PASS  week 16  {re.escape(str(good))}  \d+\.\d s", ln) for ln in lines), lines
    assert any(re.fullmatch(rf"FAIL  week 17  {re.escape(str(bad))}  \d+\.\d s  cell 1 \(ex01-tests\): "
                            r"ValueError: the second cell fails", ln) for ln in lines), lines
    assert lines[-1].startswith("notebooks: 1/2 passed"), lines
    assert {p: p.read_bytes() for p in before} == before, "a notebook was written over"

    ran = json.loads((out / "16" / "good.ipynb").read_text())
    printed = "".join(ran["cells"][0]["outputs"][0]["text"]).splitlines()
    assert printed[0].startswith("torch threads: "), printed  # what `import lib` says in a kernel (lib/bench/threads.py)
    printed = printed[1:]
    assert printed == [str(good.parent), sys.executable], "not run in its own folder, or not by this interpreter"
    failed = json.loads((out / "17" / "bad.ipynb").read_text())
    assert failed["cells"][1]["outputs"][0]["ename"] == "ValueError" and not failed["cells"][2].get("outputs")
    assert "the second cell fails" in (out / "17" / "bad.error.txt").read_text()


def test_run_notebooks_reports_a_cell_over_its_time(tmp_path):
    slow = tmp_path / "18" / "slow.ipynb"
    _notebook(slow, "a = 1", "import time\ntime.sleep(60)")
    done = _run([sys.executable, "tools/run_notebooks.py", "--timeout", "2", "--out", str(tmp_path / "o"), str(slow)], 120)
    assert done.returncode == 1
    assert re.search(r"^FAIL  week 18  .*slow\.ipynb  \d+\.\d s  cell 1 \(\w+\): CellTimeoutError: ", done.stdout,
                     re.M), done.stdout


def test_make_help_lists_gpu_check():
    out = subprocess.run(["make", "-s", "help"], cwd=REPO, capture_output=True, text=True, env=_env()).stdout
    assert re.search(r"^make gpu-check  ", out, re.M) and "TORCH_INDEX=" in out, out
    assert re.search(r"^gpu-check: setup\n\tPYTHON=\$\(BIN\)/python tools/gpu_check\.sh \$\(ARGS\)$",
                     (REPO / "Makefile").read_text(), re.M)


def _dry_run(venv: Path, *args: str) -> list[str]:
    done = subprocess.run(["make", "-n", "setup", f"VENV={venv}", *args], cwd=REPO, capture_output=True, text=True,
                          env=_env(), timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_setup_with_torch_index_installs_torch_from_it_first(tmp_path):
    """`make -n` (nothing installed): the pip commands, in order, with and without TORCH_INDEX."""
    venv, index = tmp_path / "venv", "https://download.pytorch.org/whl/cu130"
    plain = [ln for ln in _dry_run(venv) if "pip install" in ln]
    assert [ln.split("-q ")[-1] for ln in plain] == [f"torch=={PIN}", "-e ."], plain

    lines = _dry_run(venv, f"TORCH_INDEX={index}")
    text = "\n".join(lines)
    torch_line = next(i for i, ln in enumerate(lines) if re.search(rf"pip install .*--index-url {index} torch=={PIN}$", ln))
    project = next(i for i, ln in enumerate(lines) if "-e ." in ln)
    assert torch_line < project, text
    assert "pip uninstall -y -q torch" in lines[torch_line - 1], "a CPU torch already there would be kept"
    assert "--no-deps -e ." in text and "requirements-gpu.txt" in text, "no route for torch's own triton"
    assert lines.count(f"echo '{index}' > {venv}/.torch-index") == 1, text
    assert "--index-url" not in "\n".join(plain)


def test_setup_remembers_the_index(tmp_path):
    """Set up with an index, later make commands keep it (nothing to do, or, once pyproject.toml changes, the same
    index again); another index installs again."""
    venv, index = tmp_path / "venv", "https://download.pytorch.org/whl/cu130"
    venv.mkdir()
    (venv / ".torch-index").write_text(index + "\n")
    (venv / ".installed").touch()
    os.utime(venv / ".installed", (2e9, 2e9))  # newer than pyproject.toml
    assert not [ln for ln in _dry_run(venv) if "pip" in ln], "a plain `make setup` would reinstall"
    assert not [ln for ln in _dry_run(venv, f"TORCH_INDEX={index}") if "pip" in ln]
    again = _dry_run(venv, "TORCH_INDEX=https://download.pytorch.org/whl/cu126")
    assert any("--index-url https://download.pytorch.org/whl/cu126 torch==" in ln for ln in again), again
    os.utime(venv / ".installed", (0, 0))  # older than pyproject.toml: a plain `make setup` installs again
    assert any(f"--index-url {index} torch==" in ln for ln in _dry_run(venv)), "the venv's index was forgotten"
