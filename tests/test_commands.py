"""Every command the READMEs document, run as a user types it, in a scratch copy of the repo (tests/conftest.py's
`scratch`: the tracked files, this checkout's .venv and model linked in), so a command that breaks breaks CI.

The documented commands are read from README.md, grader/README.md, each week's solutions/NN/README.md and
`make help`; `test_every_documented_command_is_run_here` fails on one this module does not run (or list, with
the reason, in NOT_RUN). Long runs go in their quick mode: a benchmark with `--quick` (make: `ARGS=--quick`),
`tools/distill_draft.py` and `tools/train_draft_head.py` for a few seconds, `tools/train_eagle.py` with `--quick`; the grader commands on a class of two; `make lab` / `make grade-ui`
until the server answers on a free loopback port, then stopped (nothing left listening). Each command's time is
printed (`pytest -s`). About 5 minutes on 2 quiet cores.
"""
from __future__ import annotations

import csv
import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", REPO / "grader" / "README.md", *sorted(REPO.glob("solutions/*/README.md"))]
pytestmark = pytest.mark.commands
TIMES: dict[str, float] = {}

# Documented, not run here, and why.
NOT_RUN = {
    r"make test(-quick)?( TEST_JOBS=\d+)?$": "CI's own command: this module runs inside it",
    r"conda ": "conda is not in CI (make setup is the documented default)",
    r"source \.venv/bin/activate$": "changes the calling shell only (scratch.env puts .venv/bin first on PATH)",
    r"python -m grader( autograde)?$": "the program's name in prose; its commands are run below",
    r"nbgrader generate_assignment --force$": "named as what `python -m grader release` replaces (it deletes weeks/NN)",
    r"pytest solutions/\d\d$": "make test runs it (pyproject's testpaths include solutions/)",
    r"(make (serve|bench-load)\b|(\.venv/bin/)?python benchmarks/load\.py)": "tests/test_server.py runs `make serve` "
                                                                         "and `make bench-load ARGS=--quick` as typed",
    r"make setup TORCH_INDEX=": "a multi-GB CUDA download; tests/test_gpu_check.py checks its pip commands (make -n)",
    r"(python -m )?nbgrader collect( 16)?$": "named in prose; it needs students' submissions in an exchange: "
                          "tests/test_jupyterhub_class.py runs `python -m nbgrader collect 16` as the instructor",
    r"python tools/class_hub\.py (setup|start|teardown)": "as root, with users made for it: "
                                                        "tests/test_jupyterhub_class.py runs them as typed",
}
SERVERS = r"make (lab|grade-ui)( ARGS=.*)?$"  # run by test_servers_answer_and_stop, on a free port
# A documented command -> the command run for it here (quick modes); None: run as typed.
QUICK = [
    (r"^(\.venv/bin/)?python (benchmarks/\S+\.py)(.*)$", lambda m: f".venv/bin/python {m[2]}{m[3]} --quick"),
    (r"^make (bench(-\d\d)?|machine)( ARGS=--record)?$", lambda m: f"make {m[1]} ARGS=--quick"),
    (r"^(\.venv/bin/)?python tools/distill_draft\.py --minutes \S+(.*)$",
     lambda m: f".venv/bin/python tools/distill_draft.py --minutes 0.05{m[2]} --out distilled-test.pt"),
    (r"^(\.venv/bin/)?python tools/train_draft_head\.py --minutes \S+(.*)$",
     lambda m: f".venv/bin/python tools/train_draft_head.py --minutes 0.05{m[2]} --prompts 18 --length 64 "
               f"--gen-batch 18 --eval-tokens 16 --out head-test.pt"),
    (r"^(\.venv/bin/)?python tools/train_eagle\.py\b.*$",  # the full run and --quick: the quick mode, as typed
     lambda m: ".venv/bin/python tools/train_eagle.py --quick --out eagle-test.pt"),
    (r"^(INFERENCE_LAB_SEED=\d+ )?(\.venv/bin/)?pytest (weeks/\d\d)(.*)$", lambda m: f".venv/bin/pytest {m[3]}{m[4]}"),
]

BUILDER = r"python tools/weeks/build\.py \d\d$"


def documented_commands() -> list[str]:
    """Shell commands in the docs: lines of ```bash blocks, and inline `...` spans that are commands (not a
    synopsis with placeholders such as `[--jobs N]`, `FOLDER`, `weeks/NN`)."""
    found = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for block in re.findall(r"```(?:bash|sh)\n(.*?)```", text, re.S):
            found += [line.split(" #")[0].strip() for line in block.splitlines() if line.strip()]
        for span in re.findall(r"`([^`\n]+)`", text):
            if re.match(r"(make |python |\.venv/bin/|pytest |nbgrader |benchmarks/\S+\.py|tools/\S+\.py|"
                        r"INFERENCE_LAB_\w+=\S+ |conda |source )", span):
                found.append(span.strip())
    help_text = subprocess.run(["make", "-s", "help"], cwd=REPO, capture_output=True, text=True).stdout
    found += [line.split("  ")[0].strip() for line in help_text.splitlines() if line.startswith("make ")]
    placeholder = re.compile(r"[|\[\]…<>]|\bNN\b|\b[A-Z]{2,}\b(?!=)|ARGS=\.\.\.")
    commands = []
    for cmd in found:
        cmd = re.sub(r"^(\.venv/bin/python|python) (benchmarks|tools)/", r"python \2/", cmd)
        cmd = re.sub(r"^(benchmarks|tools)/", r"python \1/", cmd)
        if not placeholder.search(cmd) and cmd not in commands:
            commands.append(cmd)
    return commands


def to_run() -> list[str]:
    """The documented commands this module runs (all but NOT_RUN's)."""
    return [c for c in documented_commands() if not any(re.match(p, c) for p in NOT_RUN)]


def quick_form(cmd: str) -> str:
    for pattern, make in QUICK:
        m = re.match(pattern, cmd)
        if m:
            return make(m)
    return cmd


# --- running ------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module", autouse=True)
def _print_times():
    yield
    print("\ncommand times (s):\n" + "\n".join(f"{secs:7.1f}  {cmd}" for cmd, secs in TIMES.items()))


@pytest.fixture(scope="module")
def repo(scratch, tmp_path_factory):
    root = scratch.copy(tmp_path_factory.mktemp("commands") / "repo")
    inbox = root.parent / "inbox"  # `python -m grader collect 16 ~/inbox/`: HOME is the scratch folder
    inbox.mkdir()
    release = next((root / "weeks" / "16").glob("*.ipynb"))
    (inbox / "alice.ipynb").write_bytes((root / "solutions" / "16" / release.name).read_bytes())  # honest
    handed_in = 1795685400  # 2026-11-26 09:30:00 UTC: export's timestamp
    os.utime(inbox / "alice.ipynb", (handed_in, handed_in))
    (inbox / "bob.ipynb").write_bytes(release.read_bytes())  # untouched: fails every test
    (root.parent / "roster.csv").write_text("id,first_name,last_name,email\nalice,Alice,Liddell,alice@example.org\n"
                                            "bob,Bob,Dylan,\n../eve,Eve,,\n")  # eve's id is refused
    return root


def run(scratch, root: Path, cmd: str, timeout: float = 300, rc: int | None = 0, **env) -> str:
    """Run `cmd` in bash in `root` as typed; its whole process group is killed afterwards. Returns its output."""
    began = time.monotonic()
    proc = subprocess.Popen(["bash", "-c", cmd], cwd=root, env=scratch.env(root, HOME=root.parent, **env),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"`{cmd}` took longer than {timeout:g} s:\n{out[-4000:]}")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    TIMES[cmd] = time.monotonic() - began
    print(f"[{TIMES[cmd]:6.1f} s] {cmd}")
    if rc is not None:
        assert proc.returncode == rc, f"`{cmd}` exited with {proc.returncode}, expected {rc}:\n{out[-4000:]}"
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def serve(scratch, root: Path, target: str, path: str, expect: str, timeout: float = 120, lands: str = "") -> None:
    """`make <target>` until http://127.0.0.1:<free port>/<path> answers with `expect` in it (after redirects, at
    the path `lands`, when given); then stop it as a user does, SIGTERM to make's PID alone, and check that
    nothing listens there any more."""
    port, token = _free_port(), os.urandom(8).hex()
    cmd = f"make {target} ARGS='--no-browser --ip=127.0.0.1 --port={port} --IdentityProvider.token={token}'"
    began = time.monotonic()
    proc = subprocess.Popen(["bash", "-c", cmd], cwd=root, env=scratch.env(root, HOME=root.parent),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    body, error, landed, still = "", None, None, False
    try:
        while time.monotonic() - began < timeout and proc.poll() is None:
            try:
                ask = urllib.request.Request(f"http://127.0.0.1:{port}/{path}",  # the header survives redirects
                                             headers={"Authorization": f"token {token}"})
                with urllib.request.urlopen(ask, timeout=10) as r:
                    body, landed = r.read().decode("utf-8", "replace"), urllib.parse.urlparse(r.geturl()).path
                break
            except OSError as e:
                error = e
                time.sleep(0.5)
    finally:
        os.kill(proc.pid, signal.SIGTERM)  # `bash -c` execs make: this is make's PID, as `kill <pid of make>`
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pass
        deadline = time.monotonic() + 20
        while (still := _listening(port)) and time.monotonic() < deadline:
            time.sleep(0.5)
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # whatever is left of it, so a failure leaves nothing running
        except ProcessLookupError:
            pass
        proc.wait()
        out = proc.stdout.read()
    TIMES[f"make {target}"] = time.monotonic() - began
    print(f"[{TIMES[f'make {target}']:6.1f} s] {cmd} (until /{path} answered, then stopped)")
    assert expect in body, (f"`{cmd}`: /{path} did not answer with {expect!r} " +
                            (f"(it landed on {landed})" if landed else f"({error})") + f":\n{out[-4000:]}")
    assert (landed or "").startswith(lands), f"`{cmd}`: /{path} landed on {landed}, not {lands}"
    assert not still, f"something still listens on port {port} after SIGTERM to make's PID ({cmd})"


# --- the commands -------------------------------------------------------------------------------------------

def test_every_documented_command_is_run_here():
    here = Path(__file__).read_text()
    missing = []
    for cmd in to_run():
        # run by the tests that loop over the docs (a bench target's quick run: test_benchmarks_in_quick_mode, with
        # `--record` added where a documented `--record` run of its script is folded into it)
        generic = [pattern for pattern, _ in QUICK] + [BUILDER, SERVERS, r"make (bench(-\d\d)?|machine) ARGS=--quick$"]
        if not any(re.match(p, cmd) for p in generic) and cmd not in here and cmd.replace(".venv/bin/", "") not in here:
            missing.append(cmd)  # the grader's and make's commands are written out in the tests below
    assert not missing, f"documented commands that tests/test_commands.py does not run: {missing}"


def test_make_help_and_setup(scratch, repo):
    out = run(scratch, repo, "make help")
    targets = re.search(r"^\.PHONY:(.*)$", (repo / "Makefile").read_text(), re.M)[1].split()
    assert all(f"make {t}" in out for t in targets if t not in ("help", "clean-cache")), out
    run(scratch, repo, "make setup")  # installed already (the venv is linked): only verifies the model
    run(scratch, repo, ".venv/bin/python -m lib.modeling.fetch")
    out = run(scratch, repo, "make lint")
    assert "All checks passed" in out, out


def test_make_results_renders_what_is_committed(scratch, repo):
    """`make results` as typed: it renders README.md's table and docs/performance.md from the committed records, so
    on a clean tree it changes nothing (tests/test_results.py shows that an edit by hand is caught)."""
    before = {p: (repo / p).read_text() for p in ("README.md", "docs/performance.md")}
    out = run(scratch, repo, "make results")
    assert "rendered README.md's results block" in out, out
    assert {p: (repo / p).read_text() for p in before} == before


def test_class_hub_help(scratch, repo):
    """The class's hub tool (grader/README.md, "A class on JupyterHub"): its help, as typed; its setup, start and
    teardown run in tests/test_jupyterhub_class.py, as root, with users made for the test."""
    out = run(scratch, repo, "python tools/class_hub.py --help")
    assert all(word in out for word in ("setup", "start", "teardown")), out


def test_gpu_check_without_a_gpu(scratch, repo):
    """`make gpu-check` where there is no CUDA device (CI never has one): it stops at once and says why."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device: `make gpu-check` would run the whole check")
    out = run(scratch, repo, "make gpu-check", rc=2, timeout=120)
    assert "gpu_check: no CUDA device visible to torch" in out and "== notebooks" not in out, out


def test_the_model_snippet(scratch, repo):
    """README.md's Python example, as written."""
    snippet = re.search(r"```python\n(from lib\.modeling\.llama import load_smollm2.*?)```", (REPO / "README.md").read_text(), re.S)[1]
    (repo.parent / "snippet.py").write_text(snippet)
    out = run(scratch, repo, f".venv/bin/python {repo.parent / 'snippet.py'}")
    assert out.startswith("The capital of France is"), out


def test_students_pytest_commands(scratch, repo):
    """`pytest weeks/NN` (and `-k exNN`) on the untouched release: runs, and fails with the friendly message."""
    for cmd in sorted({quick_form(c) for c in to_run() if re.search(r"pytest weeks/\d\d", c)}):
        out = run(scratch, repo, cmd, rc=1, timeout=180)
        assert "is not implemented yet" in out and not re.search(r"^ERROR ", out, re.M), out  # failed, not broken


def test_grader_commands_for_a_term(scratch, repo):
    """README.md's instructor block and grader/README.md's steps, in order, on a class of two."""
    before = {p: p.read_bytes() for p in (repo / "weeks" / "16").rglob("*") if p.is_file()}
    run(scratch, repo, "make release WEEK=16")
    assert {p: p.read_bytes() for p in (repo / "weeks" / "16").rglob("*") if p.is_file()} == before, \
        "the release is not in sync with solutions/16"
    out = run(scratch, repo, ".venv/bin/python -m grader roster ~/roster.csv", rc=1)
    assert "2 students in the gradebook" in out and "line 4: '../eve': not a usable student id" in out, out
    out = run(scratch, repo, ".venv/bin/python -m grader collect 16 ~/inbox/")
    assert "alice:" in out and "bob:" in out
    out = run(scratch, repo, ".venv/bin/python -m grader autograde 16 bob --jobs 1")
    assert "autograded 1 of 1" in out and "bob: 0 / " in out, out
    assert "test_causal_mask (not implemented)" in out, out  # bob handed in the release: each zero says why
    run(scratch, repo, "nbgrader autograde 16 --JupyterApp.config_file=grader/nbgrader_config")  # grades alice
    assert list((repo / "grader" / "autograded" / "alice" / "16").glob("*.ipynb"))
    out = run(scratch, repo, ".venv/bin/python -m grader autograde 16 --jobs 2")  # both again
    assert "autograded 2 of 2" in out and "FAILED" not in out and "SAWarning" not in out, out
    assert re.search(r"alice: (\d+) / \d+; autograded code (\d+) / \2", out), out  # the solution: every point
    out = run(scratch, repo, ".venv/bin/python -m grader feedback 16")
    assert list((repo / "grader" / "feedback" / "alice" / "16").glob("*.html")), out
    run(scratch, repo, ".venv/bin/python -m grader export grader/grades.csv")
    rows = list(csv.DictReader((repo / "grader" / "grades.csv").open()))
    assert len(rows) == 2 and all(r["status"] == "graded" for r in rows), rows
    assert {(r["student_id"], r["first_name"], r["last_name"]) for r in rows} == {("alice", "Alice", "Liddell"),
                                                                                  ("bob", "Bob", "Dylan")}, rows
    when = {r["student_id"]: r["timestamp"] for r in rows}
    assert when["alice"].startswith("2026-11-26 09:30:00"), when  # the time she handed it in (the file's), kept
    assert subprocess.run(["git", "check-ignore", "-q", "grader/grades.csv"], cwd=REPO).returncode == 0


def test_servers_answer_and_stop(scratch, repo):
    serve(scratch, repo, "grade-ui", "", "formgrader", lands="/formgrader")  # the formgrader, not /lab
    serve(scratch, repo, "lab", "", "JupyterLab", lands="/lab")


# Sizes `--quick` sets itself: two documented commands differing only in these run the same thing quickly.
_SIZES = r" --(new-tokens|repeats|prefill|decode-steps|requests|ks|workloads|short|long) \S+"
# A flag `--quick` makes moot: every benchmark keeps a run as the reference only when it was not quick
# (`as_reference=args.record and not args.quick`). `benchmarks/decode.py --record` and `make bench` are one quick run,
# `make bench ARGS="--quick --record"` (the flag still parsed; 33 s of a core saved on 2 cores, quant.py's as much).
_MOOT = r" --record\b"


def _benchmark_runs() -> dict[tuple, str]:
    """(script, its other arguments) -> the one quick command run for it, the `make` target's where there is one
    (a bench target's recipe is `python benchmarks/<script> $(ARGS)`), with `--record` where a command it stands
    for has it."""
    recipes = dict(re.findall(r"^(bench(?:-\d\d)?|machine):.*\n\t\$\(BIN\)/python (benchmarks/\S+\.py)",
                              (REPO / "Makefile").read_text(), re.M))
    runs: dict[tuple, str] = {}
    record: set[tuple] = set()
    for cmd in to_run():
        quick = quick_form(cmd)
        target = re.match(r"make (bench(?:-\d\d)?|machine) ARGS=--quick$", quick)
        direct = re.match(r"\.venv/bin/python (benchmarks/\S+\.py)(.*) --quick$", quick)
        if target or direct:
            script, args = (recipes[target[1]], "") if target else (direct[1], direct[2])
            key = (script, re.sub(_MOOT, "", re.sub(_SIZES, "", args)).strip())
            if re.search(_MOOT, args):
                record.add(key)
            if target or key not in runs:
                runs[key] = quick
    for key in record:
        if runs[key].startswith("make ") and "--record" not in runs[key]:
            runs[key] = runs[key].replace("ARGS=--quick", 'ARGS="--quick --record"')
    return runs


def test_every_benchmark_target_is_run_quickly():
    """Each bench target in its quick mode; the documented `benchmarks/decode.py --record` and `quant.py --record`
    are their targets' runs with the flag (one run each, not two)."""
    assert {'make bench ARGS="--quick --record"', "make bench-18 ARGS=--quick", "make bench-19 ARGS=--quick",
            'make bench-20 ARGS="--quick --record"', "make machine ARGS=--quick"} <= set(_benchmark_runs().values())


@pytest.mark.timeout(900)  # one benchmark run: 5-36 s on 2 quiet cores, minutes at load 10
@pytest.mark.parametrize("cmd", sorted(set(_benchmark_runs().values())))
def test_benchmarks_in_quick_mode(scratch, repo, cmd):
    """`make bench`, `make bench-18/19/20`, and each documented benchmark command, in its quick mode (one test
    each, so that `make test`'s processes share them out)."""
    if "fresh_clone" in cmd and not (repo / ".git").exists():
        # the scratch copy is files only and the script clones a checkout's HEAD: commit the copy, as a clone has it
        subprocess.run("git init -q && git add -A && git rm -r -q --cached --ignore-unmatch .venv data/models data/cache"
                       " && git -c user.name=lab -c user.email=lab@example.org commit -q -m copy", shell=True,
                       cwd=repo, check=True, capture_output=True)
    out = run(scratch, repo, cmd, timeout=600)
    assert "Traceback" not in out, out


def test_notebook_builders(scratch, repo):
    """`python tools/weeks/build.py NN`, as grader/README gives it, rebuilds that week's solution notebook as committed
    (tests/test_authoring.py checks every week's sources the same way, without running the command as typed)."""
    cmds = sorted({c for c in to_run() if re.match(BUILDER, c)})
    assert cmds, "no documented `python tools/weeks/build.py NN`"
    for cmd in cmds:
        run(scratch, repo, cmd, timeout=120)
        week = re.search(r"build\.py (\d\d)$", cmd)[1]
        for nb in sorted((REPO / "solutions" / week).glob("*.ipynb")):
            assert (repo / "solutions" / week / nb.name).read_bytes() == nb.read_bytes(), f"{cmd} changed {nb.name}"


def test_train_draft_head_for_a_few_seconds(scratch, repo):
    cmds = sorted({quick_form(c) for c in to_run() if "train_draft_head" in c})
    assert cmds, "no documented tools/train_draft_head.py command found"
    for cmd in cmds:
        run(scratch, repo, cmd, timeout=600)
        assert (repo / "head-test.pt").is_file()


def test_train_eagle_quick_mode(scratch, repo):
    """tools/train_eagle.py's whole pipeline (data through the engine, training, checksum, evaluation) on its
    tiny settings: the weights, their sha256 beside them and the learning curve."""
    cmds = sorted({quick_form(c) for c in to_run() if "train_eagle" in c})
    assert cmds, "no documented tools/train_eagle.py command found"
    for cmd in cmds:
        run(scratch, repo, cmd, timeout=600)
        assert (repo / "eagle-test.pt").is_file() and (repo / "eagle-test.pt.sha256").is_file()
        assert json.loads((repo / "eagle-test.json").read_text())["notes"]["learning_curve"]


def test_distill_draft_for_a_few_seconds(scratch, repo):
    cmds = sorted({quick_form(c) for c in to_run() if "distill_draft" in c})
    assert cmds, "no documented tools/distill_draft.py command found"
    for cmd in cmds:
        run(scratch, repo, cmd, timeout=600)
        assert (repo / "distilled-test.pt").is_file()


def test_the_scratch_copy_never_reinstalls_the_shared_venv(scratch, repo):
    """The copy's `.venv` is this checkout's: make must see the install as up to date there, or a `make bench` in the
    copy runs `pip install -e .` from the copy and points this checkout's venv at a folder that is removed later."""
    done = subprocess.run(["make", "-q", ".venv/.installed"], cwd=repo, env=scratch.env(repo), capture_output=True)
    assert done.returncode == 0, "make in the scratch copy would reinstall the lab into the shared venv"
    finder = next((REPO / ".venv").glob("lib/python*/site-packages/__editable__*inference_lab*finder.py"), None)
    if finder is not None:  # an editable install: it must point here
        assert str(REPO / "lib") in finder.read_text(), f"{finder} no longer points at {REPO}"
