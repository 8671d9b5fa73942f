"""Hand-grading: `make grade-ui` starts JupyterLab on the course root, and nbgrader's formgrader finds the course.

A throw-away course gets the repo's root `nbgrader_config.py`; a week is released and one submission
autograded with `python -m grader`'s code; then a real JupyterLab server, started as `make grade-ui` starts it
(cwd and notebook dir = the course root), is asked through the formgrader's JSON API for the assignments and
the submissions. Both must be there, read from `grader/gradebook.db` (where the CLI writes), and the server must
not create nbgrader's default `gradebook.db` in the course root. About 30 s on 2 loaded cores.
"""
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from grader.__main__ import autograde, collect

REPO = Path(__file__).resolve().parent.parent
WEEK = "17"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _recipe(target: str) -> str:
    return re.search(rf"^{target}:.*\n\t(.+)$", (REPO / "Makefile").read_text(), re.M).group(1)


def test_formgrader_lists_the_autograded_week(tmp_path, capsys):
    recipe = _recipe("grade-ui")
    assert "jupyter lab" in recipe and "--notebook-dir=." in recipe and "cd $(CURDIR)" in recipe

    root = tmp_path / "course"
    for part in ("solutions", "weeks"):
        shutil.copytree(REPO / part / WEEK, root / part / WEEK,
                        ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache", "*.backup-*"))
    shutil.copy(REPO / "nbgrader_config.py", root / "nbgrader_config.py")
    release = next((root / "weeks" / WEEK).glob("*.ipynb"))
    subs = tmp_path / "subs"
    subs.mkdir()
    shutil.copy(release, subs / "alice.ipynb")  # the untouched release: fast to grade, 0 points
    assert collect(WEEK, subs, root=root) == []
    assert autograde(WEEK, ["alice"], root=root) == []
    capsys.readouterr()
    assert (root / "grader" / "gradebook.db").is_file()

    port, token = _free_port(), secrets.token_hex(16)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
               JUPYTER_CONFIG_DIR=str(tmp_path / "jupyter-config"), JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"))
    cmd = [str(Path(sys.executable).parent / "jupyter"), "lab", "--notebook-dir=.", "--no-browser",
           f"--port={port}", "--ip=127.0.0.1", f"--IdentityProvider.token={token}", "--ServerApp.password="]
    if os.geteuid() == 0:
        cmd.append("--allow-root")  # as the Makefile's LAB_ARGS does
    log = tmp_path / "server.log"
    with open(log, "w") as log_file:
        server = subprocess.Popen(cmd, cwd=root, env=env, stdout=log_file, stderr=subprocess.STDOUT)

    def get(path: str):
        request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers={"Authorization": f"token {token}"})
        with urllib.request.urlopen(request, timeout=30) as r:
            return json.load(r)

    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                get("/formgrader/api/status")
                break
            except OSError:
                assert server.poll() is None, f"jupyter lab exited: {log.read_text()[-3000:]}"
                assert time.monotonic() < deadline, f"jupyter lab did not answer in 120 s: {log.read_text()[-3000:]}"
                time.sleep(1)

        assignments = {a["name"]: a for a in get("/formgrader/api/assignments")}
        assert WEEK in assignments, f"formgrader lists {sorted(assignments)}; log: {log.read_text()[-3000:]}"
        assert assignments[WEEK]["num_submissions"] == 1
        submissions = {s["student"]: s for s in get(f"/formgrader/api/submissions/{WEEK}")}
        assert set(submissions) == {"alice"}
        assert submissions["alice"]["autograded"] is True and submissions["alice"]["score"] == 0
        notebooks = get(f"/formgrader/api/notebooks/{WEEK}")
        assert [n["name"] for n in notebooks] == [release.stem]
        request = urllib.request.Request(f"http://127.0.0.1:{port}/formgrader/manage_assignments",
                                         headers={"Authorization": f"token {token}"})
        with urllib.request.urlopen(request, timeout=30) as r:
            page = r.read().decode()
        assert "Manage Assignments" in page or "manage_assignments" in page, page[:2000]
        # nbgrader's default exchange (/srv/nbgrader/exchange) is missing on one machine: the course's own is used
        assert 'id="warning-exchange"' not in page, "the formgrader warns that the exchange directory is missing"
        assert (root / "grader" / "exchange").is_dir() or Path("/srv/nbgrader/exchange").is_dir()
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    text = log.read_text()
    assert "No nbgrader_config.py file found" not in text, text[-3000:]
    assert "not a subdirectory of the notebook server root" not in text, text[-3000:]
    assert not (root / "gradebook.db").exists(), "the formgrader created nbgrader's default gradebook.db"


def test_the_exchange_is_the_environments_then_nbgraders_then_the_courses(tmp_path, monkeypatch):
    from grader.course import NBGRADER_EXCHANGE, course_config, exchange_root

    monkeypatch.setenv("INFERENCE_LAB_EXCHANGE", str(tmp_path / "shared"))
    assert course_config(tmp_path).Exchange.root == str(tmp_path / "shared")
    monkeypatch.delenv("INFERENCE_LAB_EXCHANGE")
    want = NBGRADER_EXCHANGE if Path(NBGRADER_EXCHANGE).is_dir() else str(tmp_path / "grader" / "exchange")
    assert exchange_root(tmp_path) == want and Path(want).is_dir()
