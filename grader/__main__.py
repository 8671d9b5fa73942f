"""Instructor commands (no Jupyter server needed). Run from anywhere inside the repo:

    python -m grader release 16              # solutions/16 -> weeks/16, never deleting a student's edits
    python -m grader roster roster.csv       # the class: id,first_name,last_name,email (names in formgrader, export)
    python -m grader collect 16 DIR          # DIR/<student>.ipynb or DIR/<student>/*.ipynb -> grader/submitted/
    python -m grader autograde 16 [STUDENT ...] [--jobs N] [--timeout S]
    python -m grader feedback 16 [STUDENT ...]
    python -m grader export grader/grades.csv

One broken submission never stops a run: its error is printed in one line, the others are graded, and
the command ends with the list of failures and exit status 1.
"""
from __future__ import annotations

import argparse
import datetime
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from grader.course import REPO_ROOT, Course, grade_one, grading_worker
from grader.harness import threads_per_worker as _threads_per_worker
from grader.notebook import validate_notebook
from grader.processes import clean_environ, exec_clean
from grader.status import one_line, status_path


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
    backups, written = [], 0
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
            written += 1
    if not written:
        print(f"weeks/{week} is up to date with solutions/{week}: nothing written")
    return backups


def _release_name(week: str, root: Path = REPO_ROOT) -> str:
    release_nbs = sorted((root / "weeks" / week).glob("*.ipynb"))
    if len(release_nbs) != 1:
        raise SystemExit(f"weeks/{week} should hold exactly one notebook, found {len(release_nbs)}")
    return release_nbs[0].name


STUDENT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@+-]{0,99}")


def _handed_in(notebook: Path, folder: Path) -> str:
    """When the student handed the notebook in, as nbgrader's `timestamp.txt` says it (autograde reads it into the
    gradebook; export's `timestamp`): the `timestamp.txt` nbgrader's exchange left beside it, else the notebook's
    modification time, in UTC."""
    for d in notebook.parents:  # the student's own folders only, not the inbox itself
        if d == folder or folder not in d.parents:
            break
        if (d / "timestamp.txt").is_file():
            return (d / "timestamp.txt").read_text().strip()
    when = datetime.datetime.fromtimestamp(notebook.stat().st_mtime, datetime.timezone.utc)
    return when.strftime("%Y-%m-%d %H:%M:%S.%f UTC")


def collect(week: str, folder: Path, root: Path = REPO_ROOT) -> list[str]:
    """Copy each student's notebook into grader/submitted/<student>/<week>/, with the time it was handed in
    (`_handed_in`, nbgrader's timestamp.txt); return one line per refused student.

    `<folder>/<student>.ipynb`, or `<folder>/<student>/` holding one notebook (with several, the one named
    like the release is taken, and said so; otherwise the student is refused). Notebooks that are not
    valid JSON or have broken nbgrader metadata are refused."""
    name = _release_name(week, root)
    folder = Path(folder)
    if not folder.is_dir():
        raise SystemExit(f"no such folder: {folder}")
    candidates: list[tuple[str, list[Path]]] = [(p.stem, [p]) for p in sorted(folder.glob("*.ipynb"))]
    for d in sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")):
        candidates.append((d.name, sorted(nb for nb in d.rglob("*.ipynb") if ".ipynb_checkpoints" not in nb.parts)))
    if not candidates:
        raise SystemExit(f"no notebooks in {folder} (expected <student>.ipynb or <student>/<any>.ipynb)")
    refused = []
    course = None

    def refuse(student: str, why: str) -> None:
        nonlocal course
        refused.append(f"{student}: {why}")
        course = course or Course(root)
        course.record_status(week, student, status="refused at collect", error=why)

    count = Counter(student for student, _ in candidates)
    for student, nbs in candidates:
        if not STUDENT_ID.fullmatch(student):  # a name like `..` would be a path outside grader/submitted
            refused.append(f"{student!r}: not a usable student id (letters, digits and _ . @ + -, starting with "
                           f"a letter or digit): rename {folder / student}[.ipynb]")
            print(refused[-1])
            continue
        if count[student] > 1:
            if nbs is next(n for s, n in candidates if s == student):
                refuse(student, f"both {student}.ipynb and a folder {student}/ are in {folder}: keep one of them")
            continue
        if not nbs:
            refuse(student, f"no notebook in {folder / student}")
            continue
        if len(nbs) > 1:
            named = [nb for nb in nbs if nb.name == name]
            if len(named) != 1:
                refuse(student, f"{len(nbs)} notebooks ({', '.join(nb.name for nb in nbs)}) and none is "
                                f"exactly {name}: keep one, or name the one to grade {name}")
                continue
            print(f"{student}: {len(nbs)} notebooks; taking {named[0].name} (named like the release), "
                  f"ignoring {', '.join(nb.name for nb in nbs if nb != named[0])}")
            nbs = named
        problem = validate_notebook(nbs[0])
        if problem:
            refuse(student, f"{nbs[0]}: {problem}")
            continue
        dest = root / "grader" / "submitted" / student / week / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(nbs[0], dest)
        (dest.parent / "timestamp.txt").write_text(_handed_in(nbs[0], folder))
        status_path(root, week, student).unlink(missing_ok=True)
        print(f"{student}: {nbs[0]} -> {dest.relative_to(root)}")
    return refused


def _students(week: str, given: list[str], root: Path = REPO_ROOT) -> list[str]:
    if given:
        return given
    sub = root / "grader" / "submitted"
    return sorted(d.name for d in sub.iterdir() if (d / week).is_dir()) if sub.is_dir() else []


def autograde(week: str, students: list[str], jobs: int = 1, timeout: float | None = None,
              root: Path = REPO_ROOT) -> list[str]:
    """Autograde `students` (all submitted when empty); return one line per failed student."""
    course = Course(root)
    added = course.ensure_assignment(week)
    if added:
        print(added)
    students = _students(week, students, root)
    if not students:
        raise SystemExit(f"no submissions for week {week} under grader/submitted/ (run collect first)")
    failures = []
    start = time.perf_counter()
    threads = _threads_per_worker(jobs)
    print(f"grading {len(students)} submission(s), {jobs} at a time, {threads} torch thread(s) each", flush=True)
    if jobs <= 1:
        import torch

        previous_threads = torch.get_num_threads()
        torch.set_num_threads(threads)

        def _results():
            try:
                for s in students:
                    yield grade_one(week, s, str(root), timeout)
            finally:
                torch.set_num_threads(previous_threads)

        results = _results()
    else:
        import multiprocessing
        from concurrent.futures import as_completed

        # spawn, not fork: a forked copy of a process holding torch threads and a sqlite connection is fragile.
        # The worker function lives in grader.course, not here: a spawned worker imports it by module name, and
        # `python -m grader` runs this file as `__main__`, which spawn does not re-import.
        # The workers start with the instructor's non-secret settings alone (`grader.processes.WORKER_ENV`), whatever
        # this process holds: a submission's child must find no secret in its grading process's environment.
        pool = ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"),
                                   initializer=grading_worker)
        with clean_environ():  # a spawn pool starts its workers within `submit`
            futures = {pool.submit(grade_one, week, s, str(root), timeout, threads): s for s in students}

        def _results():
            for future in as_completed(futures):
                try:
                    yield future.result()
                except BaseException as e:  # noqa: BLE001  (a worker process died)
                    yield futures[future], False, f"the grading worker failed: {one_line(e)}", 0.0

        results = _results()
    for student, ok, line, seconds in results:
        if ok:
            print(f"{student}: {line} [{seconds:.1f} s]", flush=True)
        else:
            failures.append(f"{student}: {line}")
            course.record_status(week, student, status="failed", error=line)
            print(f"{student}: FAILED — {line}", flush=True)
    if jobs > 1:
        pool.shutdown()
    print(f"autograded {len(students) - len(failures)} of {len(students)} in {time.perf_counter() - start:.0f} s")
    return failures


def feedback(week: str, students: list[str], root: Path = REPO_ROOT) -> list[str]:
    course = Course(root)
    students = _students(week, students, root)
    if not students:
        raise SystemExit(f"no submissions for week {week} under grader/submitted/ (run collect first)")
    failures = []
    for student in students:
        try:
            print(f"{student}: {course.feedback(week, student)}")
        except Exception as e:  # noqa: BLE001
            failures.append(f"{student}: {one_line(e)}")
            print(f"{student}: FAILED — {one_line(e)}")
    return failures


def roster(csv_path: Path, root: Path = REPO_ROOT) -> list[str]:
    """Add or update the class's students in the gradebook from a CSV file with a header: `id` (or
    `student_id`), and optionally `first_name`, `last_name`, `email` (nbgrader's own `db student import`
    columns). The formgrader then shows names instead of "None, None", and `export` writes them. Returns one
    line per refused row (an id that is not a usable student id, or a repeated one)."""
    import csv

    path = Path(csv_path)
    if not path.is_file():
        raise SystemExit(f"no such file: {path}")
    with open(path, newline="", encoding="utf-8-sig") as f:
        reader = csv.DictReader(f)
        key = next((k for k in ("id", "student_id") if k in (reader.fieldnames or [])), None)
        if key is None:
            raise SystemExit(f"{path}: the header must name the id column `id` (or `student_id`); it has "
                             f"{reader.fieldnames}. Columns: id,first_name,last_name,email")
        rows = list(reader)
    refused, seen, students = [], set(), []
    for line, row in enumerate(rows, start=2):
        sid = (row.get(key) or "").strip()
        if not STUDENT_ID.fullmatch(sid) or sid in seen:
            refused.append(f"line {line}: {sid!r}: " + ("repeated" if sid in seen else "not a usable student id "
                           "(letters, digits and _ . @ + -, starting with a letter or digit)"))
            continue
        seen.add(sid)
        students.append((sid, {k: (row.get(k) or "").strip() or None for k in ("first_name", "last_name", "email")}))
    Course(root).add_students(students)
    print(f"{len(students)} students in the gradebook from {path}" + (f"; {len(refused)} rows refused" if refused else ""))
    return refused


def _report(failures: list[str], one: str, many: str) -> int:
    """Print the failures under one heading ("1 roster row was refused:", "3 submissions failed:"); 1 if any."""
    if not failures:
        return 0
    print(f"\n{len(failures)} {one if len(failures) == 1 else many}:", file=sys.stderr)
    for line in failures:
        print(f"  {line}", file=sys.stderr)
    return 1


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
        if name == "autograde":
            s.add_argument("--jobs", "-j", type=int, default=1, help="submissions graded at once (default 1)")
            s.add_argument("--timeout", type=float, default=None,
                           help="seconds one call into a student's code may take (default 60)")
    sub.add_parser("export").add_argument("csv", type=Path, nargs="?", default=REPO_ROOT / "grader" / "grades.csv")
    sub.add_parser("roster").add_argument("csv", type=Path)
    args = p.parse_args(argv)
    if args.cmd == "autograde" and argv is None:
        # As typed: grading starts again from the instructor's non-secret settings alone (`/proc/<pid>/environ` of
        # this process and of its `--jobs` workers shows the environment it was started with)
        exec_clean()

    if args.cmd == "release":
        release(args.week, repo=REPO_ROOT)
    elif args.cmd == "roster":
        return _report(roster(args.csv, root=REPO_ROOT), "roster row was refused", "roster rows were refused")
    elif args.cmd == "collect":
        return _report(collect(args.week, args.folder, root=REPO_ROOT), "submission was refused",
                       "submissions were refused")
    elif args.cmd == "autograde":
        grading_worker()  # --jobs 1 grades in this process
        return _report(autograde(args.week, args.students, jobs=args.jobs, timeout=args.timeout, root=REPO_ROOT),
                       "submission failed", "submissions failed")
    elif args.cmd == "feedback":
        return _report(feedback(args.week, args.students, root=REPO_ROOT), "feedback report failed",
                       "feedback reports failed")
    elif args.cmd == "export":
        course = Course(REPO_ROOT)
        path, ungraded = course.export(args.csv), course.ungraded()
        print(f"grades written to {path}")
        if ungraded:
            print(f"{len(ungraded)} submitted but not graded (rows with status != graded):", file=sys.stderr)
            for line in ungraded:
                print(f"  {line}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
