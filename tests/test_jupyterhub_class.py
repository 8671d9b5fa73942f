"""A class on JupyterHub, end to end, with real Unix users (grader/README.md, "A class on JupyterHub").

As root: `tools/class_hub.py setup` as the README types it (an instructor and three students, created for the
test), the hub started on 127.0.0.1, each user's server started through the hub and running as that user. The
instructor releases week 16 through nbgrader's exchange; each student fetches and submits through their own server
(the Assignments extension's API): one the solution (graded as a class is: a copy where long enough to judge), one
untouched, one that also tries, as their Unix user, to list the exchange's inbound folder, to read another
student's home and fetched notebook, to change the released files, and to forge a submission in another student's name, and whose notebook tries at grading time to read
the others' submissions. The instructor collects with `nbgrader collect`, grades with the lab's isolated autograde,
generates and returns feedback, which the students fetch, and exports. Every score is checked, and every attempt at
another student's files must have failed. Teardown as typed must leave no process, user or folder behind.
"""
from __future__ import annotations

import csv
import json
import os
import pwd
import re
import secrets
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
WEEK = "16"
COURSE = "inference-lab"

pytestmark = [
    pytest.mark.hub,
    pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                       reason="creates Unix users and starts servers as them: needs root"),
    pytest.mark.skipif(not all(shutil.which(t) for t in ("useradd", "userdel", "runuser", "pgrep")),
                       reason="needs useradd, userdel, runuser and pgrep"),
]


def documented(subcommand: str) -> str:
    """The README's `tools/class_hub.py <subcommand>` line, as typed there."""
    text = (REPO / "grader" / "README.md").read_text(encoding="utf-8")
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.splitlines():
            line = line.split(" #")[0].strip()
            if re.match(rf"(sudo )?\.venv/bin/python tools/class_hub\.py {subcommand}\b", line):
                return line
    raise AssertionError(f"grader/README.md has no ```bash line running tools/class_hub.py {subcommand}")


class Class:
    def __init__(self, root: Path, port: int, state: dict):
        self.root, self.port, self.state = root, port, state
        self.token = (root / "admin-token").read_text().strip()
        self.url = f"http://127.0.0.1:{port}"

    def api(self, method: str, path: str, body: dict | None = None, timeout: float = 120):
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data=data, method=method,
                                         headers={"Authorization": f"token {self.token}",
                                                  "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=timeout) as r:
            text = r.read().decode()
        return json.loads(text) if text.strip() else None

    def env(self, user: str) -> list[str]:
        """The environment a user's server gives its terminals (the hub's Spawner.environment)."""
        entry = pwd.getpwnam(user)
        return ["env", "-i", f"HOME={entry.pw_dir}", f"USER={user}", f"PATH={self.state['path']}",
                f"INFERENCE_LAB_EXCHANGE={self.state['exchange']}", f"JUPYTER_CONFIG_PATH={self.root}/etc/jupyter",
                "LANG=C.UTF-8"]

    def as_user(self, user: str, cmd: list[str], cwd: str | None = None, timeout: float = 600, check: bool = True):
        done = subprocess.run(["runuser", "-u", user, "--", *self.env(user), *cmd], text=True, capture_output=True,
                              cwd=cwd or pwd.getpwnam(user).pw_dir, timeout=timeout)
        if check:
            assert done.returncode == 0, (f"{user}: {' '.join(cmd)} exited {done.returncode}:\n{done.stdout[-3000:]}"
                                          f"\n{done.stderr[-3000:]}")
        return done

    def instructor(self, *args: str, timeout: float = 600):
        return self.as_user(self.state["instructor"], [self.state["python"], "-m", *args],
                            cwd=self.state["course"], timeout=timeout)

    def assignments(self, user: str, action: str) -> dict:
        query = f"course_id={COURSE}&assignment_id={WEEK}"
        reply = self.api("POST", f"/user/{user}/assignments/{action}?{query}")
        assert reply["success"], f"{user}: {action} through their server failed: {reply}"
        return reply


def try_as(c: Class, user: str, code: str) -> str:
    """Run `code` as `user` (their Unix account, as their server's kernel would) and return what it printed."""
    return c.as_user(user, [c.state["python"], "-c", code], check=False).stdout.strip()


ATTEMPT = """
import os, sys
try:
    {action}
    print("DONE")
except OSError as e:
    print(type(e).__name__)
"""


def test_a_class_on_jupyterhub_from_release_to_grades(tmp_path):
    readable = subprocess.run(["runuser", "-u", "nobody", "--", "test", "-r", str(REPO / "pyproject.toml")])
    if readable.returncode != 0:
        pytest.skip(f"other users cannot read this checkout ({REPO}): a class needs the lab where its students can "
                    f"read it (setup says so too)")
    tag = "il" + secrets.token_hex(3)
    teach, ann, ben, cat = (f"{tag}-{n}" for n in ("teach", "ann", "ben", "cat"))
    students = [ann, ben, cat]
    root = Path(f"/tmp/inference-lab-class-{tag}")
    # Another hub, or `make serve`, on the machine: JupyterHub's default ports (8000 public, 8081 the hub's own, 8001
    # its proxy's API) held by other listeners where this test can take them. Setup, as typed (no --port), must pick
    # a free public port and say so, and the hub must start anyway.
    held = []
    for taken in (8000, 8081, 8001):
        sock = socket.socket()
        try:
            sock.bind(("127.0.0.1", taken))
            sock.listen()
            held.append(sock)
        except OSError:  # held already by something else: as good
            sock.close()
    started = time.monotonic()
    setup = documented("setup")
    setup = re.sub(r"--instructor \S+", f"--instructor {teach}", setup)
    setup = re.sub(r"--students \S+", f"--students {','.join(students)}", setup)
    assert "--create-users" in setup, setup
    setup = setup.removeprefix("sudo ") + f" --root {root}"
    start = documented("start").removeprefix("sudo ") + f" --root {root}"
    teardown = documented("teardown").removeprefix("sudo ") + f" --root {root}"
    hub = done = port = None
    leak = Path(f"/tmp/inference-lab-leak-{tag}")
    if shutil.which("npm") is None:
        pytest.skip("JupyterHub's proxy comes from the npm registry and npm is not installed")
    try:
        trial = subprocess.run(["bash", "-c", setup], cwd=REPO, text=True, capture_output=True, timeout=900)
        if trial.returncode != 0 and re.search(r"npm install .* failed:.*(ENOTFOUND|EAI_AGAIN|ETIMEDOUT|ECONNREFUSED)",
                                               trial.stderr, re.S):
            pytest.skip(f"the npm registry cannot be reached from here: {trial.stderr.strip()[-300:]}")
        assert trial.returncode == 0, f"`{setup}` exited {trial.returncode}:\n{trial.stdout[-3000:]}\n{trial.stderr[-3000:]}"
        out = trial.stdout
        setup_s = time.monotonic() - started
        state = json.loads((root / "class.json").read_text())
        port = state["port"]
        assert port not in (8000, 8081, 8001) and "port 8000 on 127.0.0.1 is taken" in out, out
        assert set(state["created_users"]) == {teach, *students}, out
        for user in (teach, *students):
            assert os.stat(pwd.getpwnam(user).pw_dir).st_mode & 0o077 == 0, f"{user}'s home is readable by others"
        c = Class(root, port, state)

        hub = subprocess.Popen(["bash", "-c", start], cwd=REPO, stdout=open(tmp_path / "hub.log", "w"),
                               stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 240
        while "class_hub: ready:" not in (tmp_path / "hub.log").read_text():  # start says so once the hub answers
            assert hub.poll() is None, f"the hub exited: {(tmp_path / 'hub.log').read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"no hub in 240 s: {(tmp_path / 'hub.log').read_text()[-3000:]}"
            time.sleep(0.5)
        c.api("GET", "/hub/api/", timeout=5)  # at once: no window where the proxy answers without the hub
        for user in (teach, *students):
            c.api("POST", f"/hub/api/users/{user}/server")
        for user in (teach, *students):
            deadline = time.monotonic() + 180
            while not c.api("GET", f"/hub/api/users/{user}")["servers"].get("", {}).get("ready"):
                assert time.monotonic() < deadline, f"{user}'s server did not start: {(tmp_path / 'hub.log').read_text()[-3000:]}"
                time.sleep(1)
            owners = subprocess.run(["pgrep", "-u", user, "-f", "jupyterhub.singleuser"], capture_output=True)
            assert owners.returncode == 0, f"{user}'s server does not run as {user}"
        # The students' servers have the Assignments tools, not the formgrader; the instructor's has both.
        assert c.api("GET", f"/user/{ann}/assignments?course_id={COURSE}")["success"]
        with pytest.raises(urllib.error.HTTPError):
            c.api("GET", f"/user/{ann}/formgrader/api/assignments")
        assert isinstance(c.api("GET", f"/user/{teach}/formgrader/api/assignments"), list)

        # Release through the exchange.
        c.instructor("grader", "release", WEEK)
        c.instructor("nbgrader", "release_assignment", WEEK)
        release = next(Path(state["course"], "weeks", WEEK).glob("*.ipynb"))
        for user in students:
            listed = c.assignments(user, "fetch")["value"]
            assert any(a["assignment_id"] == WEEK and a["status"] == "fetched" for a in listed), listed
        mine = Path(pwd.getpwnam(ann).pw_dir) / WEEK / release.name
        assert mine.is_file() and mine.stat().st_uid == pwd.getpwnam(ann).pw_uid

        # ann: the solution, written through her server's contents API; ben: untouched; cat: the release with a
        # first exercise cell that looks for the others' submissions while it is graded.
        solution = json.loads((REPO / "solutions" / WEEK / release.name).read_text())
        c.api("PUT", f"/user/{ann}/api/contents/{WEEK}/{release.name}",
              {"type": "notebook", "format": "json", "content": solution})
        hostile = json.loads(release.read_text())
        snoop = (f"import glob\nfor _p in glob.glob('/home/*/inference-lab/grader/submitted/*/{WEEK}/*.ipynb') + "
                 f"glob.glob('{state['exchange']}/*/inbound/*/*.ipynb') + glob.glob('/home/{ann}/{WEEK}/*.ipynb'):\n"
                 f"    try:\n        open('{leak}', 'a').write(_p + open(_p).read()[:20] + '\\n')\n"
                 f"    except OSError:\n        pass\n")
        first = next(cell for cell in hostile["cells"] if cell["metadata"].get("nbgrader", {}).get("solution"))
        first["source"] = snoop + "".join(first["source"])
        c.api("PUT", f"/user/{cat}/api/contents/{WEEK}/{release.name}",
              {"type": "notebook", "format": "json", "content": hostile})
        for user in students:
            c.assignments(user, "submit")

        # cat, as her own Unix user, at the others' files and the exchange.
        inbound = Path(state["exchange"]) / COURSE / "inbound"
        outbound = Path(state["exchange"]) / COURSE / "outbound" / WEEK / release.name
        anns = [p for p in Path(inbound).iterdir() if p.name.startswith(f"{ann}+")]  # root can list it
        attempts = {
            "list the exchange's inbound": f"os.listdir({str(inbound)!r})",
            "read ann's fetched notebook": f"open({str(mine)!r}).read()",
            "list ann's home": f"os.listdir({pwd.getpwnam(ann).pw_dir!r})",
            "change the released notebook": f"open({str(outbound)!r}, 'a').write(' ')",
            "add a file to the release": f"open({str(outbound.parent / 'extra.py')!r}, 'w').write('x')",
            "write into ann's home": f"open({pwd.getpwnam(ann).pw_dir + '/x'!r}, 'w').write('x')",
        }
        results = {what: try_as(c, cat, ATTEMPT.format(action=action)) for what, action in attempts.items()}
        # Reading a submission needs its folder's name, which nbgrader makes random and the inbound does not list:
        # recorded, not judged (its files are world-readable, as nbgrader sets them).
        results["read ann's submission, told its folder's name"] = try_as(c, cat, ATTEMPT.format(
            action=f"open({str(anns[0] / release.name) if anns else '/nonexistent'!r}).read()"))
        # A forged submission in ann's name: the inbound folder takes it (nbgrader's exchange lets anyone write
        # there), `nbgrader collect` must not (the folder's owner is not ann).
        forged = inbound / f"{ann}+{WEEK}+2099-01-01 00:00:00.000000 UTC+forgedforged"
        results["forge a submission in ann's name"] = try_as(c, cat, ATTEMPT.format(
            action=f"os.mkdir({str(forged)!r}); open({str(forged / release.name)!r}, 'w').write(open("
                   f"{str(Path(pwd.getpwnam(cat).pw_dir) / WEEK / release.name)!r}).read())"))
        print("\nwhat cat's attempts returned:\n" + "\n".join(f"  {k}: {v}" for k, v in results.items()))
        assert results["forge a submission in ann's name"] == "DONE", "the inbound folder refused the forged folder"
        for what, result in results.items():
            if what not in ("forge a submission in ann's name", "read ann's submission, told its folder's name"):
                assert result in ("PermissionError", "FileNotFoundError"), f"cat could {what}: {result}"
        assert anns, "ann's submission is not in the inbound folder"

        # Collect, grade, feedback, export: the instructor's commands.
        collected = c.instructor("nbgrader", "collect", WEEK)
        submitted = Path(state["course"]) / "grader" / "submitted"
        assert sorted(p.name for p in submitted.iterdir()) == sorted(students), collected.stderr[-2000:]
        got = json.loads((submitted / ann / WEEK / release.name).read_text())
        assert got["cells"] == solution["cells"], "collect took another notebook than ann's own submission"
        graded = c.instructor("grader", "autograde", WEEK, "--jobs", "2", timeout=900)
        c.instructor("grader", "feedback", WEEK)
        c.instructor("nbgrader", "release_feedback", WEEK)
        for user in students:
            c.assignments(user, "fetch_feedback")
        reports = list((Path(pwd.getpwnam(ann).pw_dir) / WEEK / "feedback").rglob("*.html"))
        assert reports and all(r.stat().st_uid == pwd.getpwnam(ann).pw_uid for r in reports), "no feedback for ann"
        c.instructor("grader", "export", "grader/grades.csv")
        rows = {r["student_id"]: r for r in csv.DictReader(open(Path(state["course"]) / "grader" / "grades.csv"))}
        print(graded.stdout)
        assert set(rows) == set(students), rows
        # ann handed in the solution, graded as a class is (no INFERENCE_LAB_SOLUTION_COPIES=allow here): each exercise
        # long enough to judge is a copy of the answer key, and says so; every other point is hers
        line = next(x for x in graded.stdout.splitlines() if x.startswith(f"{ann}:"))
        assert 0 < float(rows[ann]["code_score"]) <= float(rows[ann]["max_code_score"]), rows[ann]
        if float(rows[ann]["code_score"]) < float(rows[ann]["max_code_score"]):
            failed = re.search(r"; failed: (.*) \[", line)
            assert failed and all(f.endswith("(reference use)") for f in failed[1].split(", ")), line
            assert "copy of the solution's" in line, line
        assert float(rows[ben]["code_score"]) == 0 and float(rows[cat]["code_score"]) == 0, (rows[ben], rows[cat])
        assert all(rows[s]["timestamp"] for s in students), "export lost the submission times"
        assert not leak.exists(), f"cat's graded code read another student's files: {leak.read_text()[:500]}"
        print(f"setup {setup_s:.0f} s; whole class {time.monotonic() - started:.0f} s")
    finally:
        for sock in held:
            sock.close()
        if hub is not None and hub.poll() is None:
            os.killpg(hub.pid, signal.SIGTERM)
            try:
                hub.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(hub.pid, signal.SIGKILL)
        if (root / "class.json").exists():
            done = subprocess.run(["bash", "-c", teardown], cwd=REPO, text=True, capture_output=True, timeout=300)
            print(done.stdout, done.stderr)
        if leak.exists():
            leak.unlink()
    assert done is not None and done.returncode == 0, done and done.stderr
    for user in (teach, *students):
        with pytest.raises(KeyError):
            pwd.getpwnam(user)
    assert not root.exists()
    with socket.socket() as s:
        assert port is None or s.connect_ex(("127.0.0.1", port)) != 0, "something still listens on the hub's port"
    left = subprocess.run(["pgrep", "-f", str(root)], capture_output=True, text=True).stdout.split()
    assert not left, f"processes of the class left running: {left}"
