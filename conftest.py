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
