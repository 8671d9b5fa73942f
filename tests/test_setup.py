"""The set-up promises: one list of dependencies, pins that agree, CI running the README's command."""
import re
import shutil
import os
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def _torch_pin(text: str) -> str:
    pins = set(re.findall(r"torch==([\w.+]+)", text))
    assert len(pins) == 1, f"expected one torch pin, found {pins}"
    return pins.pop()


def test_torch_pin_agrees_everywhere():
    deps = PYPROJECT["project"]["dependencies"]
    pin = _torch_pin("\n".join(deps))
    assert _torch_pin((REPO / "Makefile").read_text()) == pin
    assert _torch_pin((REPO / "environment.yml").read_text()) == pin


def test_installed_torch_is_the_pin():
    """What `make setup` installs, CPU wheel or (TORCH_INDEX) CUDA build: fails where some other torch is in use,
    e.g. a GPU machine's own install (tools/gpu_check.sh says so before it runs the tests)."""
    import torch

    pin = _torch_pin("\n".join(PYPROJECT["project"]["dependencies"]))
    assert torch.__version__.split("+")[0] == pin, (
        f"torch {torch.__version__} is installed, the lab pins {pin}: `make setup` installs the pin")


def test_environment_yml_installs_this_project_and_nothing_else():
    text = (REPO / "environment.yml").read_text()
    body = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    assert "- python=3.11" in body
    pip_section = body[body.index("- pip:") + 1:]
    assert pip_section == [f"- torch=={_torch_pin(text)}", "- -e ."], (
        "environment.yml's pip section must only pin torch and install this project: every other dependency "
        "belongs in pyproject.toml")
    assert PYPROJECT["project"]["requires-python"].startswith(">=3.11")


def test_ci_runs_the_readme_test_command():
    readme = (REPO / "README.md").read_text()
    ci = (REPO / ".ci" / "run").read_text()
    match = re.search(r"test command[^\n]*\n+```(?:bash|sh)?\n(.+?)\n```", readme, re.S)
    assert match, "README.md must show the test command in a code block after the words 'test command'"
    command = match.group(1).strip().splitlines()[-1].strip()
    assert command in [ln.strip() for ln in ci.splitlines()], f"CI does not run the README's `{command}`"


def test_pytest_uses_importlib_mode():
    assert "--import-mode=importlib" in PYPROJECT["tool"]["pytest"]["ini_options"]["addopts"]


def test_pytest_never_collects_nbgrader_folders():
    """A submission's copy of test_week16.py under grader/ must never run as part of the suite."""
    planted = []
    try:
        for folder in ("submitted", "autograded"):
            path = REPO / "grader" / folder / "zz-collection-probe" / "16" / "test_week16.py"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("def test_probe():\n    assert False\n")
            planted.append(path)
        out = subprocess.run([sys.executable, "-m", "pytest", "grader", "--collect-only", "-q", "-p", "no:cacheprovider"],
                             cwd=REPO, capture_output=True, text=True, timeout=300)
        assert "test_probe" not in out.stdout, out.stdout[-2000:]
    finally:
        for path in planted:
            shutil.rmtree(path.parents[1], ignore_errors=True)


def test_pytest_weeks_16_collects_only_week_16():
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}  # a `-v` there prints a tree, not ids
    out = subprocess.run([sys.executable, "-m", "pytest", "weeks/16", "--collect-only", "-q", "-p", "no:cacheprovider"],
                         cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    ids = [ln for ln in out.stdout.splitlines() if "::" in ln]
    assert ids and all(ln.startswith("weeks/16/") for ln in ids), out.stdout[-2000:]


def test_model_file_is_in_place_and_verified():
    from lib.bench.paths import check_smollm2

    check_smollm2()  # raises with the fixing command if `make setup` did not place it
