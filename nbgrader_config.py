# nbgrader configuration found from the repo root: the formgrader (`make grade-ui`) and any `nbgrader ...`
# command run here read it. The same course as grader/nbgrader_config.py (grader.course.course_config):
# source solutions/NN, release weeks/NN, submissions, autograded copies, feedback and the gradebook in grader/
# — never a gradebook.db in the repo root (nbgrader's default without this file).
import sys
from pathlib import Path

_root = Path(__file__).resolve().parent
if (_root / "grader" / "__init__.py").is_file() and str(_root) not in sys.path:
    sys.path.insert(0, str(_root))  # this checkout's grader package, whoever started the server

from grader.course import course_config  # noqa: E402

c = get_config()  # noqa: F821  (provided by traitlets when it loads this file)
c.merge(course_config(_root))
