"""solutions/ -> weeks/: the committed release is what nbgrader makes, a stub fails every exercise test,
and re-releasing never destroys a student's edits."""
import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from grader.__main__ import release
from grader.course import Course
from grader.course_map import week_folders

REPO = Path(__file__).resolve().parent.parent
WEEKS = list(week_folders())  # grader/course_map.py; tests/test_course_map.py holds solutions/ to it


def test_every_week_has_a_release():
    assert WEEKS, "no weeks in grader/course_map.py"
    for week in WEEKS:
        assert (REPO / "weeks" / week).is_dir(), f"weeks/{week} missing: run `python -m grader release {week}`"


@pytest.mark.parametrize("week", WEEKS)
def test_release_is_in_sync_with_solutions(week, tmp_path):
    shutil.copytree(REPO / "solutions" / week, tmp_path / "solutions" / week,
                    ignore=shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints", ".pytest_cache"))
    out = Course(tmp_path, db=tmp_path / "gradebook.db").generate(week)
    made = sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file())
    assert made, "nbgrader produced nothing"
    for rel in made:
        committed = REPO / "weeks" / week / rel
        assert committed.is_file(), f"weeks/{week}/{rel} is missing: run `python -m grader release {week}`"
        assert committed.read_bytes() == (out / rel).read_bytes(), (
            f"weeks/{week}/{rel} differs from what solutions/{week} generates: run `python -m grader release {week}`"
            f" and commit (never edit weeks/ by hand)")
    extra = {p.name for p in (REPO / "weeks" / week).glob("*.ipynb")} - {p.name for p in made}
    assert not extra, f"weeks/{week} has notebooks no solution generates: {extra}"


@pytest.mark.parametrize("week", WEEKS)
def test_untouched_release_fails_every_exercise_test(week, tmp_path):
    report = tmp_path / "report.xml"
    proc = subprocess.run([sys.executable, "-m", "pytest", f"weeks/{week}", "-q", "-p", "no:cacheprovider",
                           f"--junitxml={report}"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert report.exists(), proc.stdout + proc.stderr
    cases = ET.parse(report).getroot().iter("testcase")
    results = {}
    for case in cases:
        failure = case.find("failure")
        results[case.get("name")] = None if failure is None else failure.get("message", "")
    declared = subprocess.run(["grep", "-c", r"^def test_", f"weeks/{week}/test_week{week}.py"], cwd=REPO,
                              capture_output=True, text=True).stdout.strip()
    assert len(results) == int(declared) > 0, f"ran {len(results)} tests, the file declares {declared}"
    passed = [name for name, msg in results.items() if msg is None]
    assert not passed, f"these tests pass on the untouched release, so they check nothing: {passed}"
    unfriendly = [name for name, msg in results.items() if "NotImplementedYet" not in msg]
    assert not unfriendly, f"these fail without the 'not implemented yet' message: {unfriendly}"


def test_release_keeps_a_students_edits(tmp_path, capsys):
    week = WEEKS[0]
    repo = tmp_path / "repo"
    shutil.copytree(REPO / "solutions" / week, repo / "solutions" / week,
                    ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))
    shutil.copytree(REPO / "weeks" / week, repo / "weeks" / week,
                    ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t", "-C", str(repo)]
    subprocess.run(git + ["init", "-q"], check=True)
    subprocess.run(git + ["add", "-A"], check=True)
    subprocess.run(git + ["commit", "-qm", "release"], check=True)

    nb = next((repo / "weeks" / week).glob("*.ipynb"))
    student = json.loads(nb.read_text())
    student["cells"][0]["source"] = "my notes, do not lose them"
    nb.write_text(json.dumps(student))
    scratch = repo / "weeks" / week / "my_scratch.py"
    scratch.write_text("x = 1\n")

    backups = release(week, repo=repo)
    assert len(backups) == 1 and "my notes, do not lose them" in backups[0].read_text()
    assert nb.read_bytes() == (REPO / "weeks" / week / nb.name).read_bytes()  # the fresh release
    assert scratch.read_text() == "x = 1\n"  # files only the student has stay
    capsys.readouterr()
    assert release(week, repo=repo) == []  # nothing edited now: nothing to back up
    assert f"weeks/{week} is up to date" in capsys.readouterr().out  # and it says so


def test_a_student_sees_each_message_whole_and_the_readme_quotes_it():
    """`pytest weeks/16 -q -k ex02` as a student types it on a laptop (not CI: pytest trims its short summary to the
    terminal's width there): the one-line message is printed whole under "why each failed", and it is the message
    the README quotes."""
    import re

    env = {k: v for k, v in os.environ.items() if k not in ("CI", "BUILD_NUMBER")}
    env["COLUMNS"] = "80"
    proc = subprocess.run([sys.executable, "-m", "pytest", "weeks/16", "-q", "-k", "ex02", "-p", "no:cacheprovider"],
                          cwd=REPO, capture_output=True, text=True, timeout=600, env=env)
    section = proc.stdout.split("why each failed", 1)
    assert len(section) == 2, proc.stdout[-3000:]
    line = next(x for x in section[1].splitlines() if x.startswith("test_ex02_causal_mask: "))
    message = line.split("NotImplementedYet: ", 1)[1]
    quoted = re.search(r'\*"(exercise 2, `causal_mask`.*?)"\*', (REPO / "README.md").read_text(), re.S)
    assert quoted and " ".join(quoted[1].split()) == message, (quoted and quoted[1], message)
