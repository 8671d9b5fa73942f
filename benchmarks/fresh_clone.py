"""What a fresh clone costs on this machine: `git clone`, `make setup` (its time, the clone's size with the venv and
the model), then the test command CI runs (`make test`: its time and pytest's counts), written as a record.

    python benchmarks/fresh_clone.py              # clone, set up, run the whole test command (tens of minutes)
    python benchmarks/fresh_clone.py --setup-only # clone and set up (minutes)
    python benchmarks/fresh_clone.py --quick      # clone only, and its size (seconds)
    python benchmarks/fresh_clone.py --record     # also keep the run as this machine class's committed record

The clone is of this checkout's HEAD (commit it first), in a temporary folder removed afterwards; pip's cache is
the machine's, as a student's second set-up would find it. The README's set-up and test times are rendered from
this record (`make results`).
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def du(path: Path) -> float:
    """Bytes under `path`, not following links."""
    out = subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True).stdout.split()
    return float(out[0]) if out else 0.0


def timed(cmd: list[str], cwd: Path, env: dict) -> tuple[float, str, int]:
    print(f"$ {' '.join(cmd)}", flush=True)
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    return time.monotonic() - t0, proc.stdout + proc.stderr, proc.returncode


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="clone only, and measure its size")
    ap.add_argument("--setup-only", action="store_true", help="clone and set up; no test command")
    ap.add_argument("--record", action="store_true", help="keep the run as this machine class's committed record")
    args = ap.parse_args()
    from lib.bench.records import Record
    from lib.bench.timing import Conditions

    if subprocess.run(["git", "rev-parse", "--verify", "-q", "HEAD"], cwd=ROOT, capture_output=True).returncode:
        print(f"{ROOT} is not a git checkout with a commit: this script clones a checkout's HEAD, as CI does. Run it "
              "in your clone of the lab (`git clone ...`), after committing what you want measured.", file=sys.stderr)
        return 2
    conditions, record = Conditions.now(), Record("fresh-clone")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "INFERENCE_LAB_", "PYTEST"))}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if ".venv" not in p)
    tmp = Path(tempfile.mkdtemp(prefix="inference-lab-fresh-"))
    tmp.chmod(0o755)  # as a clone anywhere else: the sandbox test's unprivileged child must read the checkout
    try:
        clone = tmp / "inference-lab"
        seconds, out, rc = timed(["git", "clone", "-q", str(ROOT), str(clone)], tmp, env)
        if rc:
            print(out)
            return rc
        record.add("clone size", du(clone) / 1e9, "GB", False)
        print(f"cloned in {seconds:.0f} s: {du(clone) / 1e9:.2f} GB")
        if not args.quick:
            seconds, out, rc = timed(["make", "setup"], clone, env)
            print("\n".join(line for line in out.splitlines() if line.startswith("make setup:")))
            if rc:
                print(out[-3000:])
                return rc
            record.add("make setup", seconds / 60, "min", False)
            record.add("size after set-up", du(clone) / 1e9, "GB", False)
            record.add("of it, the venv", du(clone / ".venv") / 1e9, "GB", False)
            print(f"make setup: {seconds / 60:.1f} min; the clone is now {du(clone) / 1e9:.2f} GB "
                  f"(.venv {du(clone / '.venv') / 1e9:.2f} GB)")
        if not (args.quick or args.setup_only):
            seconds, out, rc = timed(["make", "test"], clone, dict(env, CI="true"))
            summary = next((line for line in reversed(out.splitlines()) if re.search(r"\d+ (passed|failed)", line)),
                           "no pytest summary")
            record.add("make test", seconds / 60, "min", False)
            record.note("make test", summary.strip("= "))
            print(f"make test: {seconds / 60:.1f} min: {summary}")
            if rc:
                print(out[-6000:])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    conditions.done()
    print(conditions.line())
    record.note("load", conditions.line())
    record.write(commit_as_reference=args.record and not args.quick)
    return 0 if args.quick or args.setup_only or rc == 0 else rc


if __name__ == "__main__":
    sys.exit(main())
