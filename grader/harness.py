"""The glue between a week's notebook, its checks and pytest.

- `Week(16, "week16_kv_cache.ipynb")` names a week's notebook; its `exercise` decorator registers a
  check for one exercise and turns a stub's `NotImplementedError` into a friendly failure:
  "exercise 2, `causal_mask`, is not implemented yet — section 2 of weeks/16/week16_kv_cache.ipynb".
- `load_exercises(path)` runs only a notebook's exercise cells (nbgrader solution cells, plus cells
  tagged `setup`, such as imports) into a fresh module: no demo cells, no plots, no model loads.

The same check is called by the week's pytest file (on the module `load_exercises` returns) and by
the notebook's nbgrader test cells (on the functions defined in the running kernel).
"""
from __future__ import annotations

import functools
import json
import types
from dataclasses import dataclass, field
from pathlib import Path


class NotImplementedYet(AssertionError):
    """An exercise still holds the release's stub."""


class ExerciseMissing(AssertionError):
    """The notebook does not define a name the checks need."""


@dataclass
class Week:
    number: int
    notebook: str  # file name inside weeks/NN/
    exercises: dict[str, tuple[int, str]] = field(default_factory=dict)  # name -> (number, section)

    @property
    def location(self) -> str:
        return f"weeks/{self.number}/{self.notebook}"

    def exercise(self, number: int, name: str, section: str):
        """Decorate `check_<name>(student_fn, ...)`; a stub raising NotImplementedError fails with a clear message."""
        self.exercises[name] = (number, section)

        def decorate(check):
            @functools.wraps(check)
            def wrapper(*args, **kwargs):
                try:
                    return check(*args, **kwargs)
                except NotImplementedError as e:
                    raise NotImplementedYet(
                        f"exercise {number}, `{name}`, is not implemented yet — section {section} of "
                        f"{self.location}. Replace the `raise NotImplementedError()` with your code, "
                        f"then run `pytest weeks/{self.number} -k ex{number}`."
                    ) from None

            wrapper.exercise = (self.number, number, name)
            return wrapper

        return decorate


def _exercise_cells(nb: dict):
    for index, cell in enumerate(nb.get("cells", [])):
        if cell.get("cell_type") != "code":
            continue
        meta = cell.get("metadata", {})
        if meta.get("nbgrader", {}).get("solution") or "setup" in meta.get("tags", []):
            source = cell.get("source", "")
            yield index, meta.get("nbgrader", {}).get("grade_id"), "".join(source) if isinstance(source, list) else source


class ExerciseModule(types.ModuleType):
    """A module of a notebook's exercise cells; a missing name fails with a message, not an AttributeError."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        stubbed = self.__dict__.get("_stubbed_cells", [])
        if stubbed:
            raise NotImplementedYet(
                f"`{name}` is not defined in {self.__file__}: its exercise cell still raises NotImplementedError "
                f"(unfinished cells: {', '.join(stubbed)}). Finish that cell, then run the check again."
            )
        raise ExerciseMissing(
            f"{self.__file__} defines no `{name}`. Its exercise cell may have been deleted or renamed: "
            f"restore the cell that defines `{name}` (git diff shows what changed)."
        )


def load_exercises(notebook: str | Path) -> ExerciseModule:
    """Execute the exercise (and `setup`-tagged) cells of `notebook`, in order, into a new module."""
    path = Path(notebook)
    try:
        nb = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"notebook not found: {path}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid notebook JSON ({e}); restore it with `git checkout {path}` "
                         f"(your work is in the broken file: copy it out first)") from e
    module = ExerciseModule(path.stem)
    module.__file__ = str(path)
    module._stubbed_cells = []
    for index, grade_id, source in _exercise_cells(nb):
        # IPython magics and shell escapes mean nothing outside Jupyter; skip those lines.
        lines = [ln for ln in source.splitlines() if not ln.lstrip().startswith(("%", "!"))]
        try:
            code = compile("\n".join(lines), f"{path.name}[cell {index}]", "exec")
            exec(code, module.__dict__)
        except NotImplementedError:  # a stub at the top level of a cell (e.g. `answer = ...` left undone)
            module._stubbed_cells.append(grade_id or f"cell {index}")
        except Exception as e:
            raise RuntimeError(
                f"cell {index} of {path} raised {type(e).__name__}: {e}. Exercise cells must only define "
                f"functions and classes; fix the cell, or run it in Jupyter to see the full traceback."
            ) from e
    return module
