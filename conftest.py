import os
import sys

# pytest runs from the repo root with --import-mode=importlib (pyproject.toml): solutions/NN, weeks/NN and
# grader/autograded/... hold test files with the same names. nbgrader's working folders are never collected.
collect_ignore_glob = [
    "grader/submitted/*",
    "grader/autograded/*",
    "grader/feedback/*",
    "grader/exchange/*",
    ".venv/*",
    "data/*",
]

# Under pytest-xdist (`make test`: -n TEST_JOBS) the workers share the cores: each runs torch, and the processes it
# starts (OMP_NUM_THREADS is inherited), on cores / workers threads. Threads beyond the idle cores wait on each other
# (grader/harness.py, threads_per_worker: 115 s instead of 8 for week 16's checks on 2 cores at load 3).
if os.environ.get("PYTEST_XDIST_WORKER"):
    _threads = max(1, (os.cpu_count() or 1) // max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))))
    os.environ["OMP_NUM_THREADS"] = str(_threads)
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(_threads)


def pytest_collection_modifyitems(config, items):
    """The slowest tests first (whole notebooks and the JupyterHub class, then the documented commands), the rest in
    their own order: the workers start on the long ones and share out the many short ones at the end, so they finish
    together."""
    def rank(item):
        if item.get_closest_marker("notebook") or item.get_closest_marker("hub"):
            return 0
        return 1 if item.get_closest_marker("commands") else 2
    items.sort(key=rank)  # stable


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Each failed test's one-line message in full. pytest's short summary trims it to the terminal's width, which
    leaves "FAILED weeks/16/test_week16.py::test_ex02_causal_mask - NotImplementedYet: ex..." on a laptop's
    terminal: the reason is the part a student needs."""
    from _pytest.terminal import running_on_ci

    failed = terminalreporter.stats.get("failed", []) + terminalreporter.stats.get("error", [])
    if not failed or running_on_ci() or config.option.verbose >= 2:
        return
    lines = []
    for rep in failed:
        message = getattr(getattr(rep.longrepr, "reprcrash", None), "message", None)
        if message:
            lines.append(f"{rep.nodeid.rsplit('::', 1)[-1]}: {message.splitlines()[0]}")
    if lines:
        terminalreporter.section("why each failed", sep="-")
        for line in lines:
            terminalreporter.line(line)
