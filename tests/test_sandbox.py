"""The student's process holds nothing of the instructor's (grader/README.md, "How a submission is graded"; issue 54's
seventh mechanism): it runs with no capability and `no_new_privs`; the grading process's /proc entries (and every
other process's) are out of its reach; no secret of the instructor's environment reaches it, nor the gradebook or the
feedback through a message of its; and the run's seed never crosses, not even inside a `torch.Generator` a check
hands it.

Each is tried the way a student who read the grader's code would try it, through the isolated path (`pytest
weeks/NN`: `load_exercises`, here in a grading process started with the secrets, as the instructor's would be) and,
for the environment, through `python -m grader autograde 16 --jobs 2` as typed.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import torch

from grader.harness import load_exercises, with_cell_source

REPO = Path(__file__).resolve().parent.parent
ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox is Linux's")

# Every route to the grading process's environment and command line a notebook can take in its own process: its own
# environment, the grading process's /proc entries (environ, cmdline, its threads', its memory where the environment
# lies), every process's environ and cmdline, and the system's root-only files. What it finds is returned, raised
# and printed: whatever reaches a message reaches the gradebook and the feedback.
_PROBE = r'''
def _findings():
    import ctypes, json, os, resource
    out = {"marker": "PROBE-RAN", "os.environ": dict(os.environ), "reads": {}, "calls": {}}
    def read(path, limit=1 << 20):
        try:
            if os.path.isdir(path):
                return "listed " + " ".join(sorted(os.listdir(path)))
            with open(path, "rb") as f:
                return "read " + f.read(limit).decode("latin1")
        except OSError as e:
            return type(e).__name__
    out["status"] = read("/proc/self/status")
    out["reads"]["/proc/self/environ"] = read("/proc/self/environ")
    pp = os.getppid()
    for what in ("environ", "cmdline", "maps", "status", "stat", "mem", "fd", "task", "cwd", "exe", "auxv", "smaps",
                 "io", "stack", "syscall", "limits", "mountinfo"):
        out["reads"][f"/proc/{pp}/{what}"] = read(f"/proc/{pp}/{what}")
    try:
        for tid in os.listdir(f"/proc/{pp}/task"):
            out["reads"][f"/proc/{pp}/task/{tid}/environ"] = read(f"/proc/{pp}/task/{tid}/environ")
    except OSError:
        pass
    try:  # the environment lies at the top of the stack: read the grading process's memory there
        for line in open(f"/proc/{pp}/maps"):
            if "[stack]" in line:
                lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
                with open(f"/proc/{pp}/mem", "rb") as f:
                    f.seek(max(lo, hi - (1 << 20)))
                    out["reads"]["stack"] = f.read(1 << 20).decode("latin1")
    except (OSError, ValueError):
        out["reads"]["stack"] = "refused"
    try:
        pids = {int(p) for p in os.listdir("/proc") if p.isdigit()}
        out["listed /proc"] = True
    except OSError:
        pids, out["listed /proc"] = set(), False
    everyone = []
    for pid in sorted(pids | set(range(1, 1 << 16)) | {pp, EXTRA_PID}):
        for what in ("environ", "cmdline"):
            got = read(f"/proc/{pid}/{what}")
            if got.startswith("read ") and pid != os.getpid():
                everyone.append(f"{pid}/{what}: {got}")
    out["everyone"] = everyone
    for path in ("/etc/shadow", "/etc/gshadow", *[f"/dev/{d}" for d in os.listdir("/dev") if d.startswith(("loop", "sd", "vd", "nvme"))][:4]):
        out["reads"][path] = read(path, 64)
    def attempt(name, fn):
        try:
            fn()
            out["calls"][name] = "done"
        except (OSError, ValueError) as e:
            out["calls"][name] = type(e).__name__
    out["ids"] = [os.getuid(), os.geteuid(), os.getgid(), os.getegid(), os.getgroups()]
    out["workdir"] = os.getcwd()
    try:  # modules nothing imported before the uid changed: Python's own folders must still be reachable
        import bz2, colorsys, json.tool
        out["imported"] = [bz2.decompress(bz2.compress(b"ok")).decode(), colorsys.__file__, json.tool.__name__]
    except Exception as e:
        out["imported"] = repr(e)
    os.makedirs("locked/inner")  # what it leaves in its folder, locked: the grader must still remove it
    with open("locked/inner/data", "w") as f:
        f.write("x")
    os.chmod("locked/inner/data", 0)
    os.chmod("locked/inner", 0)
    os.chmod("locked", 0)
    attempt("kill the grading process", lambda: os.kill(pp, 0))
    attempt("setuid", lambda: os.setuid(12345))
    attempt("raise its CPU limit", lambda: resource.setrlimit(resource.RLIMIT_CPU, (10**6, 10**6)))
    libc = ctypes.CDLL(None, use_errno=True)
    out["calls"]["user namespace"] = "done" if libc.unshare(0x10000000) == 0 else os.strerror(ctypes.get_errno())
    out["securebits"] = libc.prctl(27, 0, 0, 0, 0)  # PR_GET_SECUREBITS
    return json.dumps(out)

def _leaks():
    """What a student would send out: the secrets found, first, in a few hundred characters (a message is cut at 400)."""
    import re
    found = re.findall(r"[A-Z_]*(?:TOKEN|SECRET)[A-Z_]*=[^\x00\s\"\\]+", _findings())
    return "PROBE-RAN " + " ".join(dict.fromkeys(found))
'''


def _solution(week: int) -> tuple[Path, dict]:
    path = next((REPO / "solutions" / str(week)).glob("*.ipynb"))
    return path, json.loads(path.read_text())


def _notebook(tmp_path: Path, week: int, edits: dict[str, str], release: bool = False) -> Path:
    path, nb = _solution(week)
    if release:
        nb = json.loads(next((REPO / "weeks" / str(week)).glob("*.ipynb")).read_text())
    for grade_id, src in edits.items():
        nb = with_cell_source(nb, grade_id, src)
    out = tmp_path / f"w{week}" / path.name
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(nb))
    return out


_GRADER = r'''
import json, os, sys
from grader.harness import load_exercises
ex = load_exercises(sys.argv[1])
print("RESULT " + json.dumps({"sandbox": ex._session.sandbox, "probe": json.loads(ex.answer_q1())}))
ex.close()
'''


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    """The probe, run in the child of a grading process (the isolated path `pytest weeks/16` takes) that was started
    with two secrets: one in its environment, one on its command line. (secrets, what the child found, sandbox.)"""
    tmp = tmp_path_factory.mktemp("probed")
    secrets = {"env": f"env-secret-{uuid.uuid4().hex}", "argv": f"argv-secret-{uuid.uuid4().hex}",
               "plain": f"plain-secret-{uuid.uuid4().hex}"}
    path = _notebook(tmp, 16, {"answer_q1": _PROBE.replace("EXTRA_PID", str(os.getpid())) + """
def answer_q1():
    return _findings()
"""})
    env = {**os.environ, "INFERENCE_LAB_TEST_SECRET": secrets["env"], "MY_SERVICE_CONFIG": secrets["plain"],
           "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", _GRADER, str(path), secrets["argv"]], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line, f"the grading process failed: {done.stdout[-2000:]} {done.stderr[-3000:]}"
    result = json.loads(line[len("RESULT "):])
    return secrets, result["probe"], result["sandbox"]


@linux_only
def test_the_child_runs_with_no_capability_and_no_new_privs(probed):
    _, found, sandbox = probed
    status = dict(line.split(":\t", 1) for line in found["status"].removeprefix("read ").splitlines() if ":\t" in line)
    for field in ("CapEff", "CapPrm", "CapInh", "CapAmb"):
        assert int(status[field], 16) == 0, f"the child holds capabilities: {field} {status[field]} ({sandbox})"
    if ROOT:
        assert int(status["CapBnd"], 16) == 0, f"a root grader's child keeps a bounding set: {status['CapBnd']}"
        # NOROOT, NO_SETUID_FIXUP and NO_CAP_AMBIENT_RAISE set, KEEP_CAPS clear, each locked: no way back
        assert found["securebits"] == 0xEF, f"securebits {found['securebits']:#x}"
    assert status["NoNewPrivs"].strip() == "1", "the child may gain privileges through exec (no_new_privs unset)"
    assert status["Seccomp"].strip() == "2", "the child has no seccomp filter"
    uid = int(status["Uid"].split()[0])
    assert uid == os.geteuid() or ROOT, f"the child runs as uid {uid}, not the instructor's"
    uid, euid, gid, egid, groups = found["ids"]  # as the child's own os.getuid() ... say them
    assert uid != 0 and euid != 0, f"the child runs as root: uid {uid}, euid {euid} ({sandbox})"
    if ROOT:
        assert gid != 0 and egid != 0 and 0 not in groups, f"the child keeps root's group: {found['ids']}"
    calls = found["calls"]
    assert calls["setuid"] == "PermissionError", calls
    assert calls["raise its CPU limit"] == "ValueError", calls  # "not allowed to raise maximum limit"
    assert calls["user namespace"] != "done", "the child made a user namespace (every capability inside it)"
    assert calls["kill the grading process"] == "PermissionError", calls


@linux_only
def test_the_grading_process_and_every_other_process_are_out_of_the_childs_reach(probed):
    _, found, sandbox = probed
    if "landlock" not in sandbox:
        pytest.skip(f"no Landlock here ({sandbox})")
    opened = {path: what[:80] for path, what in found["reads"].items()
              if not path.startswith("/proc/self") and (what.startswith(("read ", "listed ")))}
    assert not opened, f"the child read the grading process's or the system's private entries: {opened}"
    assert found["reads"]["/proc/self/environ"].startswith("read "), "the child cannot read its own /proc (test broken?)"
    assert not found["listed /proc"], "the child listed /proc (every process's pid)"
    assert not found["everyone"], f"the child read other processes' environ or cmdline: {found['everyone'][:3]}"


def test_the_unprivileged_child_imports_python_and_the_grader_removes_what_it_left(probed):
    """Python's own folders stay importable after the uid change (anchored where only root may walk to them, as
    under pyenv's /root/.pyenv), and the child's folder, with a locked folder it left inside, is gone once the
    grading process has closed the session."""
    _, found, sandbox = probed
    assert isinstance(found["imported"], list), f"the child could not import Python's modules: {found['imported']}"
    assert not found["imported"][1].startswith("/proc/"), found["imported"]  # the real file name is kept
    assert not Path(found["workdir"]).exists(), f"the child's folder was left behind: {found['workdir']}"


def test_a_secret_of_the_graders_environment_or_command_line_does_not_reach_the_child(probed):
    secrets, found, _ = probed
    text = json.dumps(found)
    assert "PROBE-RAN" in text
    for where, secret in secrets.items():
        assert secret not in text, f"the child found the grading process's {where} secret"
    assert not any(k.startswith("INFERENCE_LAB_") for k in found["os.environ"]), found["os.environ"]


# --- the run's seed -----------------------------------------------------------------------------------------------

_GENERATORS = r'''
def draws(generators):
    import torch
    return [(g.initial_seed(), g.get_state(), torch.rand(4, generator=g)) for g in generators]

def overwrite(g):
    g.manual_seed(42)
    return 0

def relay(check_object):
    try:
        check_object()
    except Exception as e:
        return str(e)
'''


def _seed_bytes(seed: int) -> list[bytes]:
    return [(seed & 0xFFFFFFFF).to_bytes(4, "little"), (seed & (2**64 - 1)).to_bytes(8, "little")]


def test_a_generator_handed_to_the_childs_code_carries_no_seed_of_the_run(tmp_path):
    """A check's generators cross as others, seeded one-way from them and the run's seed: the child reads neither the
    run's seed nor any generator's from `initial_seed()` or the state, each handed generator's seed differs from
    every other's, equal states still give equal generators, and the caller's generator afterwards is not the
    child's to set. A check's object that fails when the child calls it sends its message without the seed."""
    from grader.checks import generator, run_seed, seed_note

    ex = load_exercises(_notebook(tmp_path, 16, {"answer_q1": _GENERATORS + "\ndef answer_q1():\n    return 26.0\n"}))
    seed = run_seed()
    given = [torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed + 1), generator(0), generator(1),
             torch.Generator().manual_seed(seed)]
    known = {seed + k for k in range(-5, 1000)} | {generator(k).initial_seed() for k in range(100)} | \
        {g.initial_seed() for g in given}
    got = ex.draws(given)
    seeds = [s for s, _, _ in got]
    assert not set(seeds) & known, f"the child read a seed of the run: {seeds} (run seed {seed})"
    for s, state, _ in got:
        raw = bytes(state.numpy().tobytes())
        assert not any(b in raw for k in known for b in _seed_bytes(k)), "a seed of the run is in a handed state"
    assert len(set(seeds[:4])) == 4, f"two handed generators share a seed: {seeds}"
    assert seeds[0] == seeds[4] and torch.equal(got[0][2], got[4][2]), "equal states gave different generators"
    assert len({s & 0xFFFFFFFF for s in seeds[:4]}) == 4, "two handed CPU generators share a Mersenne Twister stream"
    g = torch.Generator().manual_seed(seed + 7)
    ex.overwrite(g)
    assert not torch.equal(g.get_state(), torch.Generator().manual_seed(42).get_state()), \
        "the child chose the state of the check's generator"

    def spy():  # a check's object that fails when the notebook's code calls it, with the seed in its message
        raise AssertionError(f"the spy saw a wrong call {seed_note()}")

    relayed = ex.relay(spy)
    assert "the spy saw a wrong call" in relayed and str(seed) not in relayed, relayed
    ex.close()


def test_a_check_hands_no_seed_of_the_run(tmp_path):
    """Week 18's `check_verify` hands `verify` a generator seeded from the run's seed (and many more): a `verify` that
    reports its generator's seed and state in its error — which the failure message carries — tells nothing."""
    from grader.checks import generator, run_seed
    from grader.checks import week18 as checks

    ex = load_exercises(_notebook(tmp_path, 18, {"verify": """
        def verify(target_probs, draft_probs, draft_tokens, generator=None):
            raise ValueError(f"SEED {generator.initial_seed()} STATE {bytes(generator.get_state().numpy().tobytes()).hex()}")
        """}))
    with pytest.raises(Exception) as caught:
        checks.check_verify(ex.verify)
    ex.close()
    message = str(caught.value)
    match = re.search(r"SEED (\d+) STATE ([0-9a-f]+)", message)
    assert match, message[:500]
    seed, state = run_seed(), bytes.fromhex(match[2])
    known = {(seed * k + j) % 2**62 for k in (1, 1000) for j in range(-10, 10)} | \
        {generator(k).initial_seed() for k in range(100)}
    assert int(match[1]) not in known, f"the check handed the run's seed ({seed}) to the notebook's code"
    assert not any(b in state for k in known for b in _seed_bytes(k)), "the handed state holds the run's seed"


def test_the_seed_note_still_reproduces_a_run(monkeypatch):
    """`INFERENCE_LAB_SEED=<seed>` (what every failure prints) gives the same inputs and the same handed generators."""
    import grader.checks as checks
    from grader import seeds
    from grader.wire import handed_generator_seed

    def inputs():
        monkeypatch.setattr(seeds, "_SEED", None)
        return (torch.rand(5, generator=checks.generator(3)), handed_generator_seed(checks.generator(4)),
                checks.seed_note())

    monkeypatch.setenv("INFERENCE_LAB_SEED", "123456789012345")
    a, b = inputs(), inputs()
    assert torch.equal(a[0], b[0]) and a[1] == b[1] and "INFERENCE_LAB_SEED=123456789012345" in a[2]
    monkeypatch.delenv("INFERENCE_LAB_SEED")
    c = inputs()
    assert not torch.equal(a[0], c[0]) and a[1] != c[1]


# --- the sandbox's parts, each where a machine cannot show it through a grading run ------------------------------

_SIGNALS = r'''
import os, sys, threading, subprocess, json
sys.path.insert(0, sys.argv[1])
from grader import _sandbox
parent = os.getppid()
print(_sandbox._seccomp(signals_to_self=True))
out = {}
for name, fn in (("parent", lambda: os.kill(parent, 0)), ("init", lambda: os.kill(1, 0)), ("itself", lambda: os.kill(os.getpid(), 0)),
                 ("its group", lambda: os.kill(0, 0))):
    try:
        fn(); out[name] = "sent"
    except OSError as e:
        out[name] = type(e).__name__
t = threading.Thread(target=lambda: out.setdefault("thread", "ran")); t.start(); t.join()
out["subprocess"] = subprocess.run(["/bin/echo", "ran"], capture_output=True, text=True).stdout.strip()
print(json.dumps(out))
'''


@linux_only
def test_without_landlocks_signal_scoping_the_child_signals_only_itself():
    """Where Landlock cannot scope signals (ABI < 6), seccomp lets the child signal only itself and its own group;
    threads and processes of its own still start."""
    done = subprocess.run([sys.executable, "-c", _SIGNALS, str(REPO)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.splitlines()[-1])
    assert out == {"parent": "PermissionError", "init": "PermissionError", "itself": "sent", "its group": "sent",
                   "thread": "ran", "subprocess": "ran"}, out


_NOT_ROOT = r'''
import json, os, sys, tempfile
sys.path.insert(0, sys.argv[1])
from grader import _sandbox, processes
getattr(processes, "make_undumpable", lambda: None)()
w = tempfile.mkdtemp()
r, wfd = os.pipe()
pid = os.fork()
if pid == 0:
    line = _sandbox.confine(w, 60, [("read", "/proc"), ("read", "/usr"), ("read", "/etc"), ("read", "/lib"), ("read", "/dev")])
    parent = os.getppid()
    status = dict(ln.rstrip("\n").split(":\t", 1) for ln in open("/proc/self/status") if ":\t" in ln)
    out = {"line": line, "creds": {k: status.get(k, "").strip() for k in ("Uid", "CapEff", "NoNewPrivs")}}
    for what in ("environ", "cmdline", "maps", "status", "fd"):
        try:
            p = f"/proc/{parent}/{what}"
            out[what] = "listed" if os.path.isdir(p) and os.listdir(p) is not None else open(p, "rb").read().decode("latin1")
        except OSError as e:
            out[what] = type(e).__name__
    try:
        os.kill(parent, 0)
        out["kill"] = "sent"
    except OSError as e:
        out["kill"] = type(e).__name__
    os.write(wfd, json.dumps(out).encode())
    os._exit(0)
os.close(wfd)
data = b"".join(iter(lambda: os.read(r, 1 << 16), b""))
os.waitpid(pid, 0)
print(data.decode())
'''


@linux_only
@pytest.mark.skipif(not ROOT, reason="starts a grading process as another user: needs root")
def test_a_non_root_instructors_child_cannot_read_their_grading_process(tmp_path):
    """Not as root, the child keeps the instructor's uid, with no capability: the grading process (non-dumpable, and
    outside the child's Landlock domain) keeps its environment, command line, memory and descriptors to itself, and
    cannot be signalled. Shown with user nobody as the instructor and a Python every user can run."""
    import shutil

    python = next((p for p in ("/usr/bin/python3", "/usr/local/bin/python3", shutil.which("python3"))
                   if p and subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", p, "-c", ""],
                                           capture_output=True).returncode == 0), None)
    if python is None or not shutil.which("setpriv"):
        pytest.skip("no Python that user nobody can run here, or no setpriv")
    secret = f"nobody-secret-{uuid.uuid4().hex}"
    done = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", python, "-c", _NOT_ROOT,
                           str(REPO), secret], env={"PATH": "/usr/bin:/bin", "INSTRUCTOR_SECRET": secret},
                          capture_output=True, text=True, timeout=60, cwd="/")
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.splitlines()[-1])
    assert secret not in done.stdout, f"the child read the instructor's secret: {out}"
    assert out["creds"]["Uid"].split()[0] == "65534" and int(out["creds"]["CapEff"], 16) == 0, out["creds"]
    assert out["creds"]["NoNewPrivs"] == "1", out["creds"]
    if "landlock" in out["line"]:
        assert {k: out[k] for k in ("environ", "cmdline", "maps", "status", "fd", "kill")} == dict.fromkeys(
            ("environ", "cmdline", "maps", "status", "fd", "kill"), "PermissionError"), out
    else:
        assert out["environ"] == out["maps"] == "PermissionError", out  # non-dumpable: its files are root's


# --- through `python -m grader autograde`, as typed ---------------------------------------------------------------

def _tree(root_pid: int) -> list[int]:
    """`root_pid` and every live descendant of it."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_bytes()
                children.setdefault(int(stat[stat.rindex(b")") + 2:].split()[1]), []).append(int(entry))
            except (OSError, ValueError):
                pass
    found, todo = [], [root_pid]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


@linux_only
@pytest.mark.notebook  # about a minute: two submissions through `python -m grader autograde 16 --jobs 2`
def test_a_secret_of_the_instructors_shell_reaches_no_grade_feedback_or_worker(scratch, tmp_path):
    """The instructor's shell holds a secret (a token, a grader setting named like one); a submission tries every
    route to it from its process — its environment, its grading process's /proc entries and memory, every process's
    environ and cmdline — and puts what it found in a failure message (raised, and returned where a number is
    expected) and in its last output before it dies. The secret is in no grading process's environment while the
    run lasts, and nowhere in the course afterwards: status files, gradebook, autograded notebooks, feedback,
    export."""
    root = scratch.copy(tmp_path / "repo")
    secrets = [f"shell-secret-{uuid.uuid4().hex}", f"lab-secret-{uuid.uuid4().hex}"]
    release = json.loads(next((root / "weeks" / "16").glob("*.ipynb")).read_text())
    probe = _PROBE.replace("EXTRA_PID", "1")
    prober = with_cell_source(with_cell_source(release, "answer_q1", probe + """
def answer_q1():
    raise AssertionError(_leaks())
"""), "causal_mask", probe + """
def causal_mask(q_len, kv_len, device=None):
    import os
    print(_leaks(), flush=True)
    os._exit(3)
""")
    subs = tmp_path / "subs"
    subs.mkdir()
    (subs / "prober.ipynb").write_text(json.dumps(prober))
    (subs / "returner.ipynb").write_text(json.dumps(with_cell_source(release, "answer_q1", probe + """
def answer_q1():
    return _leaks()
""")))
    env = scratch.env(root, INFERENCE_LAB_EXERCISE_TIMEOUT=120, INFERENCE_LAB_CALL_TIMEOUT=120,
                      INFERENCE_LAB_TEST_SECRET=secrets[1])
    py = str(root / ".venv" / "bin" / "python")
    subprocess.run([py, "-m", "grader", "collect", "16", str(subs)], cwd=root, env=env, check=True, capture_output=True)
    # the instructor's shell: the secret in its environment, and it stays (the grader's parent) while grading runs
    shell = subprocess.Popen(["bash", "-c", f'export API_TOKEN={secrets[0]}; "$0" -m grader autograde 16 --jobs 2; '
                              'echo "exit $?"', py], cwd=root, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    # while a student's process runs, the grading process above it and the student's own hold no secret
    leaked, graders = set(), set()
    while shell.poll() is None:
        for pid in _tree(shell.pid):
            try:
                if b"_sandbox.confine" not in Path(f"/proc/{pid}/cmdline").read_bytes():
                    continue
                stat = Path(f"/proc/{pid}/stat").read_bytes()
                parent = int(stat[stat.rindex(b")") + 2:].split()[1])
                environs = {pid: Path(f"/proc/{pid}/environ").read_bytes(),
                            parent: Path(f"/proc/{parent}/environ").read_bytes()}
            except (OSError, ValueError):
                continue
            graders.add(parent)
            leaked |= {p for p, environ in environs.items() for s in secrets if s.encode() in environ}
        time.sleep(0.2)
    out = shell.stdout.read()
    print(out)
    assert "exit 0" in out, out
    subprocess.run([py, "-m", "grader", "feedback", "16"], cwd=root, env=env, check=True, capture_output=True)
    subprocess.run([py, "-m", "grader", "export", str(tmp_path / "grades.csv")], cwd=root, env=env,
                   capture_output=True)
    status = (root / "grader" / "grading_status" / "16" / "prober.json").read_text()
    assert "PROBE-RAN" in status, "the probe's findings did not reach the status file (the test would prove nothing)"
    assert "PROBE-RAN" in (root / "grader" / "grading_status" / "16" / "returner.json").read_text()
    files = [p for p in (root / "grader").rglob("*") if p.is_file()] + [tmp_path / "grades.csv"]
    assert any(p.suffix == ".html" for p in files), "no feedback was generated"
    for path in files:
        data = path.read_bytes()
        for secret in secrets:
            assert secret.encode() not in data, f"the instructor's secret reached {path.relative_to(tmp_path)}"
    assert len(graders) == 2, f"saw {len(graders)} grading processes run a student's process (two workers expected)"
    assert not leaked, f"a grading process or a student's process holds the instructor's secret: {leaked}"
