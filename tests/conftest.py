import os

import pytest

# The lab's own tests grade copies of the solution notebooks as honest students; a real class's copies of the
# solution are reported as reference use (grader/similarity.py; tests/test_similarity.py checks that, unset).
os.environ.setdefault("INFERENCE_LAB_SOLUTION_COPIES", "allow")


@pytest.fixture(scope="session")
def smollm2():
    """The lab's SmolLM2 (fp32, CPU) and tokenizer, loaded once for the whole run."""
    from lib.modeling.llama import load_smollm2

    return load_smollm2(device="cpu")


@pytest.fixture(scope="session")
def hf_smollm2():
    """transformers' LlamaForCausalLM, loaded by transformers itself from the same GGUF file."""
    from transformers import AutoModelForCausalLM

    from lib.bench import paths
    from lib.bench.paths import check_smollm2

    check_smollm2()
    model = AutoModelForCausalLM.from_pretrained(str(paths.MODELS_DIR), gguf_file=paths.SMOLLM2_FILE)
    return model.eval()



def _scratch_copy(root):
    """Copy this checkout as a fresh clone has it (`git ls-files`: tracked files, uncommitted edits included, plus
    untracked files git does not ignore) to `root`, and link in this checkout's `.venv` and model (`data/models`,
    `data/cache`): documented commands run there as typed, without writing into this checkout."""
    import shutil
    import subprocess
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    root = Path(root)
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=repo,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        if (repo / rel).is_file():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(repo / rel, root / rel)
    (root / ".venv").symlink_to(repo / ".venv")
    # The venv is this checkout's, shared: a `make` target in the copy must not think it stale and reinstall the lab
    # into it from the copy (`pip install -e .` there pointed this checkout's venv at a temporary folder, so lib
    # was imported from the copy, records were written there, and the venv broke when the copy was removed).
    stamp = repo / ".venv" / ".installed"
    if stamp.exists():
        older = min(stamp.stat().st_mtime, (root / "pyproject.toml").stat().st_mtime) - 1
        os.utime(root / "pyproject.toml", (older, older))
    for part in ("models", "cache"):
        (root / "data" / part).symlink_to(repo / "data" / part)
    return root


def _scratch_env(root, **extra) -> dict:
    """The environment for a command in a scratch copy: the venv's bin/ first on PATH (as after `source
    .venv/bin/activate`), the copy's own code imported rather than this checkout's (the venv's editable install
    points here), none of this run's INFERENCE_LAB_* settings but INFERENCE_LAB_SOLUTION_COPIES (the classes
    these commands grade are copies of the solutions); `extra` added."""
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith(("INFERENCE_LAB_", "PYTEST_"))}
    env["INFERENCE_LAB_SOLUTION_COPIES"] = os.environ.get("INFERENCE_LAB_SOLUTION_COPIES", "")
    env["PATH"] = f"{root / '.venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(root)
    env.update({k: str(v) for k, v in extra.items()})
    return env


@pytest.fixture(scope="session")
def scratch():
    """`scratch.copy(root)` makes a scratch copy of this checkout at `root`; `scratch.env(root, **extra)` is the
    environment to run its documented commands in (tests/test_commands.py, the CLI tests of the grader)."""
    import types

    return types.SimpleNamespace(copy=_scratch_copy, env=_scratch_env)
