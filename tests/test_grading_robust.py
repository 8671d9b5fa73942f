"""One broken submission never stops a run: collect refuses what cannot be graded, autograde reports one line
per failure and goes on, export lists every submitted student (graded or not). Fast: nothing is executed."""
import json
import shutil
from pathlib import Path

from grader.__main__ import autograde, collect, main
from grader.course import Course, read_csv

REPO = Path(__file__).resolve().parent.parent
WEEK = "17"


def _course(tmp_path):
    root = tmp_path / "repo"
    for part in ("solutions", "weeks"):
        shutil.copytree(REPO / part / WEEK, root / part / WEEK,
                        ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache", "*.backup-*"))
    return root


def test_collect_refuses_what_cannot_be_graded_and_export_lists_everyone(tmp_path, capsys):
    root = _course(tmp_path)
    release = next((root / "weeks" / WEEK).glob("*.ipynb"))
    subs = tmp_path / "subs"
    (subs / "bob").mkdir(parents=True)
    (subs / "carol").mkdir()
    (subs / "alice.ipynb").write_text('{"cells": [')  # invalid JSON
    shutil.copy(release, subs / "bob" / "a.ipynb")  # two notebooks, neither named like the release
    shutil.copy(release, subs / "bob" / "b.ipynb")
    shutil.copy(release, subs / "carol" / release.name)  # two notebooks, one named like the release: taken
    shutil.copy(release, subs / "carol" / "week17-Copy1.ipynb")
    broken = json.loads(release.read_text())
    broken["cells"][3]["metadata"]["nbgrader"] = "oops"
    (subs / "erin.ipynb").write_text(json.dumps(broken))

    refused = collect(WEEK, subs, root=root)
    out = capsys.readouterr().out
    why = {line.split(":")[0]: line for line in refused}
    assert sorted(why) == ["alice", "bob", "erin"]
    assert "not valid notebook JSON" in why["alice"] and "nbgrader metadata" in why["erin"]
    assert "taking " + release.name in out
    assert (root / "grader" / "submitted" / "carol" / WEEK / release.name).is_file()

    (root / "grader" / "submitted" / "dave" / WEEK).mkdir(parents=True)
    (root / "grader" / "submitted" / "dave" / WEEK / release.name).write_text("{oops")  # broken after collect
    failures = autograde(WEEK, ["dave"], root=root)  # fresh clone: no gradebook entry yet; added, said so
    assert len(failures) == 1 and failures[0].startswith("dave: ") and "not valid notebook JSON" in failures[0]
    assert "the gradebook had no week 17: added it" in capsys.readouterr().out

    course = Course(root)
    rows = {r["student_id"]: r for r in read_csv(course.export(tmp_path / "grades.csv"))}
    assert set(rows) == {"alice", "bob", "carol", "dave", "erin"}
    assert rows["carol"]["status"] == "ungraded" and "autograde 17 carol" in rows["carol"]["error"]
    assert rows["dave"]["status"] == "failed"
    assert rows["alice"]["status"] == "refused at collect"
    assert all(float(r["score"]) == 0 for r in rows.values())
    assert "reference_use" in next(iter(rows.values()))


def test_cli_exits_non_zero_and_lists_failures(tmp_path, capsys, monkeypatch):
    import grader.__main__ as cli

    root = _course(tmp_path)
    monkeypatch.setattr(cli, "REPO_ROOT", root)
    subs = tmp_path / "subs"
    subs.mkdir()
    (subs / "alice.ipynb").write_text("not json")
    assert main(["collect", WEEK, str(subs)]) == 1
    err = capsys.readouterr().err
    assert "1 submission was refused:" in err and "alice:" in err


def test_cell_metadata_problems_get_their_cause_and_nbgrader_warnings_stay_off_screen(tmp_path, capfd):
    """A renamed grade_id (nbgrader itself says only "see the above traceback"), a duplicated one and a deleted
    graded cell each get a one-line cause; nbgrader's SAWarnings go to the status file, not the screen."""
    root = _course(tmp_path)
    release = next((root / "weeks" / WEEK).glob("*.ipynb"))
    nb = json.loads(release.read_text())
    graded = [c for c in nb["cells"] if c["metadata"].get("nbgrader", {}).get("grade") and c["cell_type"] == "code"]
    first = graded[0]["metadata"]["nbgrader"]["grade_id"]

    def submit(student, cells):
        folder = root / "grader" / "submitted" / student / WEEK
        folder.mkdir(parents=True)
        (folder / release.name).write_text(json.dumps(dict(nb, cells=cells)))

    renamed = json.loads(json.dumps(nb["cells"]))
    for cell in renamed:
        if cell["metadata"].get("nbgrader", {}).get("grade_id") == first:
            cell["metadata"]["nbgrader"]["grade_id"] = first + "_v2"
    submit("renamed", renamed)
    submit("duplicated", nb["cells"] + [json.loads(json.dumps(graded[0]))])
    submit("missing", [c for c in nb["cells"] if c["metadata"].get("nbgrader", {}).get("grade_id") != first])

    failures = dict(line.split(": ", 1) for line in autograde(WEEK, ["renamed", "duplicated", "missing"], root=root))
    out, err = capfd.readouterr()
    assert set(failures) == {"renamed", "duplicated"}, failures
    assert f"grade_id '{first}_v2', which week {WEEK}'s release does not have" in failures["renamed"]
    assert f"lacks: {first}" in failures["renamed"] and "see the above traceback" not in failures["renamed"]
    assert f"share grade_id '{first}'" in failures["duplicated"]
    assert f"missing cells (0 points): {first}" in out
    status = Course(root).read_status(WEEK, "missing")
    assert status["missing_cells"] == [first]
    assert "SAWarning" not in out + err
    assert any("SAWarning" in w for w in status["nbgrader_warnings"]), status["nbgrader_warnings"]
