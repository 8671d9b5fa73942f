# nbgrader configuration for Inference Lab: solutions/NN (source) -> weeks/NN (release),
# submissions, autograded copies, feedback and the gradebook under grader/.
# Use it as:  nbgrader <command> --JupyterApp.config_file=grader/nbgrader_config   (no ".py")
# or through `python -m grader ...`, which needs no flags (see grader/README.md).
from pathlib import Path

from grader.course import course_config

c = get_config()  # noqa: F821  (provided by traitlets when it loads this file)
c.merge(course_config(Path(__file__).resolve().parent.parent))
