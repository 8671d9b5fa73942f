"""The linter passes: `make lint` (ruff, configured in pyproject.toml) as the test command runs it."""
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_ruff_finds_nothing():
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    assert ruff, "ruff is not installed: `make setup` installs it (pyproject.toml's dependencies)"
    done = subprocess.run([ruff, "check", "--no-cache", "."], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-1000:]
