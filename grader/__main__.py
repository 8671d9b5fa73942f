"""Instructor commands (no Jupyter server needed). Run from anywhere inside the repo:

    python -m grader release 16              # solutions/16 -> weeks/16, never deleting a student's edits
    python -m grader collect 16 DIR          # DIR/<student>.ipynb or DIR/<student>/*.ipynb -> grader/submitted/
    python -m grader autograde 16 [STUDENT ...]
    python -m grader feedback 16 [STUDENT ...]
    python -m grader export grader/grades.csv
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from grader.course import REPO_ROOT, Course


def _committed_bytes(path: Path, repo: Path) -> bytes | None:
    """The file as last committed, or None when git can't tell (not a repo, untracked)."""
    rel = path.resolve().relative_to(repo.resolve()).as_posix()
    try:
        out = subprocess.run(["git", "-C", str(repo), "show", f"HEAD:{rel}"], capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout


def release(week: str, repo: Path = REPO_ROOT) -> list[Path]:
    """Regenerate weeks/<week> from solutions/<week>; return the backups made of files a student had edited.

    nbgrader's own `generate_assignment --force` deletes the release folder first. Here it writes into
    a temporary course instead, and each file is then copied over: a file identical to its last
    committed version is replaced, a file with uncommitted edits is first kept as `<name>.backup-<time>`,
    and files that only exist in weeks/<week> are left alone.
    """
    src = repo / "solutions" / week
    if not src.is_dir():
        raise SystemExit(f"no such week: {src}")
    backups = []
    (repo / "grader").mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copytree(src, Path(tmp) / "solutions" / week, ignore=shutil.ignore_patterns(
            "__pycache__", ".ipynb_checkpoints", ".pytest_cache"))
        out = Course(tmp, db=repo / "grader" / "gradebook.db").generate(week)
        for new in sorted(p for p in out.rglob("*") if p.is_file()):
            dest = repo / "weeks" / week / new.relative_to(out)
            data = new.read_bytes()
            if dest.exists():
                old = dest.read_bytes()
                if old == data:
                    continue
                if _committed_bytes(dest, repo) != old:
                    backup = dest.with_name(f"{dest.name}.backup-{stamp}")
                    shutil.copy2(dest, backup)
                    backups.append(backup)
                    print(f"kept your edited copy as {backup.relative_to(repo)}")
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(data)
            print(f"wrote {dest.relative_to(repo)}")
    return backups


def collect(week: str, folder: Path) -> None:
    release_nbs = sorted((REPO_ROOT / "weeks" / week).glob("*.ipynb"))
    if len(release_nbs) != 1:
        raise SystemExit(f"weeks/{week} should hold exactly one notebook, found {len(release_nbs)}")
    name = release_nbs[0].name
    found = [(p.stem, p) for p in folder.glob("*.ipynb")]
    found += [(d.name, nb) for d in folder.iterdir() if d.is_dir() for nb in d.glob("*.ipynb")]
    if not found:
        raise SystemExit(f"no notebooks in {folder} (expected <student>.ipynb or <student>/<any>.ipynb)")
    for student, nb in found:
        dest = REPO_ROOT / "grader" / "submitted" / student / week / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(nb, dest)
        print(f"{student}: {nb} -> {dest.relative_to(REPO_ROOT)}")


def _students(week: str, given: list[str]) -> list[str]:
    if given:
        return given
    sub = REPO_ROOT / "grader" / "submitted"
    return sorted(d.name for d in sub.iterdir() if (d / week).is_dir()) if sub.is_dir() else []


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m grader", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("release").add_argument("week")
    c = sub.add_parser("collect")
    c.add_argument("week")
    c.add_argument("folder", type=Path)
    for name in ("autograde", "feedback"):
        s = sub.add_parser(name)
        s.add_argument("week")
        s.add_argument("students", nargs="*")
    sub.add_parser("export").add_argument("csv", type=Path, nargs="?", default=REPO_ROOT / "grader" / "grades.csv")
    args = p.parse_args(argv)

    if args.cmd == "release":
        release(args.week)
    elif args.cmd == "collect":
        collect(args.week, args.folder)
    elif args.cmd in ("autograde", "feedback"):
        course = Course()
        students = _students(args.week, args.students)
        if not students:
            raise SystemExit(f"no submissions for week {args.week} under grader/submitted/ (run collect first)")
        for student in students:
            if args.cmd == "autograde":
                course.autograde(args.week, student)
                s = course.score(args.week, student)
                manual = " (written answers still to grade by hand)" if s["needs_manual_grade"] else ""
                print(f"{student}: {s['score']:g} / {s['max_score']:g}; autograded code "
                      f"{s['code_score']:g} / {s['max_code_score']:g}{manual}")
            else:
                print(f"{student}: {course.feedback(args.week, student)}")
    elif args.cmd == "export":
        print(f"grades written to {Course().export(args.csv)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
