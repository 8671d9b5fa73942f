"""A missing or corrupt model file fails with the documented message and the exact fixing command."""
import os
import subprocess
import sys

import pytest

from lib.bench import paths
from lib.bench.paths import ModelFileError, check_smollm2
from lib.modeling.llama import load_smollm2, read_gguf_llama


@pytest.fixture
def models_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(paths, "MODELS_DIR", tmp_path)
    return tmp_path


def test_missing_model_names_the_fix(models_dir):
    with pytest.raises(ModelFileError, match="missing") as e:
        load_smollm2()
    assert "python -m lib.modeling.fetch" in str(e.value) and "make setup" in str(e.value)


def test_truncated_model_names_the_fix(models_dir):
    with open(paths.smollm2_path(), "wb") as f, open(paths.REPO_ROOT / "data" / "models" / paths.SMOLLM2_FILE, "rb") as src:
        f.write(src.read(1_000_000))
    with pytest.raises(ModelFileError, match="truncated") as e:
        load_smollm2()
    assert "python -m lib.modeling.fetch" in str(e.value)


def test_corrupted_bytes_are_caught_by_the_checksum(models_dir):
    good = (paths.REPO_ROOT / "data" / "models" / paths.SMOLLM2_FILE).read_bytes()
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0xFF  # one flipped byte in the middle of the weights
    paths.smollm2_path().write_bytes(bytes(bad))
    with pytest.raises(ModelFileError, match="sha256") as e:
        check_smollm2()
    assert "python -m lib.modeling.fetch" in str(e.value)


def test_garbage_is_not_a_gguf_file(tmp_path):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"this is not a model" * 100)
    with pytest.raises(ValueError, match="not a readable GGUF file"):
        read_gguf_llama(junk)


def test_check_command_exits_nonzero_with_the_fix(tmp_path):
    env = dict(os.environ, INFERENCE_LAB_DATA=str(tmp_path))
    out = subprocess.run([sys.executable, "-m", "lib.modeling.fetch", "--check"], env=env, capture_output=True, text=True)
    assert out.returncode == 1
    assert "missing" in out.stderr and "python -m lib.modeling.fetch" in out.stderr
