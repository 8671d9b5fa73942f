"""A notebook as the grader reads it, below everything that runs or grades it.

- `read_notebook(path)` and `validate_notebook(path)`: a notebook's JSON, and whether nbgrader can grade it;
- `exercise_cells(nb)`: the cells a week's checks need (nbgrader solution cells and `setup`-tagged cells);
- `exercise_module(path, cells)`: those cells run, in order, into a fresh `ExerciseModule` (in the trusted
  process when isolation is off, in the child otherwise: `grader.child` and `grader.harness` share this);
- the exercise failures both sides raise and recognise: `NotImplementedYet`, `ExerciseMissing`, `ReferenceUse`.

It imports nothing of the grader's but `grader.status`.
"""
from __future__ import annotations

import json
import types
from pathlib import Path

from grader.status import one_line


class NotImplementedYet(AssertionError):
    """An exercise still holds the release's stub."""


class ExerciseMissing(AssertionError):
    """The notebook does not define a name the checks need."""


class ReferenceUse(AssertionError):
    """The exercise is, or runs, lib's own implementation of itself."""


# Shown as `NotImplementedYet: exercise 2, ...` in pytest's one-line summary (not `grader.notebook.NotImpl...`).
for _cls in (NotImplementedYet, ExerciseMissing, ReferenceUse):
    _cls.__module__ = "builtins"


def exercise_cells(nb: dict) -> list[tuple[int, str | None, str]]:
    """(index, grade_id, source) of each nbgrader solution cell and each `setup`-tagged cell, in order."""
    found = []
    for index, cell in enumerate(nb.get("cells", [])):
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        meta = cell.get("metadata", {})
        meta = meta if isinstance(meta, dict) else {}
        nbg = meta.get("nbgrader", {}) if isinstance(meta.get("nbgrader", {}), dict) else {}
        tags = meta.get("tags", []) if isinstance(meta.get("tags", []), list) else []
        if nbg.get("solution") or "setup" in tags:
            source = cell.get("source", "")
            source = "".join(source) if isinstance(source, list) else str(source)
            grade_id = nbg.get("grade_id") if isinstance(nbg.get("grade_id"), str) else None
            found.append((index, grade_id, source))
    return found


class ExerciseModule(types.ModuleType):
    """A module of a notebook's exercise cells; a missing name fails with a message, not an AttributeError."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        broken = self.__dict__.get("_broken_cells", {})
        stubbed = self.__dict__.get("_stubbed_cells", [])
        if broken:
            raise ExerciseMissing(
                f"`{name}` is not defined in {self.__file__}: " + "; ".join(
                    f"{cell} raised {why}" for cell, why in broken.items()) +
                ". Exercise cells must only define functions and classes: fix that cell (run it in Jupyter to see "
                "the full traceback).")
        if stubbed:
            raise NotImplementedYet(
                f"`{name}` is not implemented yet: it is not defined in {self.__file__}, whose exercise cell still "
                f"raises NotImplementedError (unfinished cells: {', '.join(stubbed)}). Finish that cell, then run the "
                f"check again."
            )
        raise ExerciseMissing(
            f"{self.__file__} defines no `{name}`. Its exercise cell may have been deleted or renamed: "
            f"restore the cell that defines `{name}` (git diff shows what changed)."
        )


def remember_source(name: str, lines: list[str]) -> str:
    """Register a cell's source under a file name in `linecache`, as Jupyter does, so that `inspect.getsource`
    finds the functions it defines (Triton reads a kernel's source to compile it, the checks to read it); a name
    already taken by other text gets the text's hash appended."""
    import hashlib
    import linecache

    text = [ln + "\n" for ln in lines]
    held = linecache.cache.get(name)
    if held is not None and list(held[2]) != text:
        name = f"{name}@{hashlib.sha1(''.join(text).encode()).hexdigest()[:8]}"
    linecache.cache[name] = (sum(map(len, text)), None, text, name)
    return name


def run_cells(module: ExerciseModule, path: Path, cells, files: dict | None = None, compiler=None) -> None:
    """Execute `cells` into `module`; a cell that raises is noted (its name then fails with the reason). `files`
    gets the file name each cell's code was compiled under -> the cell's index; `compiler(text, file name)`, if
    given, compiles each cell instead of `compile` (the child's `grader.ran.LinesRun.compile_cell`)."""
    for index, grade_id, source in cells:
        # IPython magics and shell escapes mean nothing outside Jupyter; skip those lines.
        lines = [ln for ln in source.splitlines() if not ln.lstrip().startswith(("%", "!"))]
        label = grade_id or f"cell {index}"
        try:
            name = remember_source(f"{path.name}[cell {index}]", lines)
            if files is not None:
                files[name] = index
            code = compile("\n".join(lines), name, "exec") if compiler is None else compiler("\n".join(lines), name)
            exec(code, module.__dict__)
        except NotImplementedError:  # a stub at the top level of a cell (e.g. `answer = ...` left undone)
            module._stubbed_cells.append(label)
        except BaseException as e:
            if isinstance(e, KeyboardInterrupt):
                raise
            msg = " ".join(str(e).split())[:300]
            module._broken_cells[f"cell {index} ({label})"] = f"{type(e).__name__}: {msg}" if msg else type(e).__name__


def read_notebook(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"notebook not found: {path}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not valid notebook JSON ({e}); restore it with `git checkout {path}` "
                         f"(your work is in the broken file: copy it out first)") from None


def exercise_module(path: Path, cells, files: dict | None = None, compiler=None) -> ExerciseModule:
    """A new module holding what `cells` (from `exercise_cells`) define, run in order; see `run_cells`."""
    module = ExerciseModule(Path(path).stem)
    module.__file__ = str(path)
    module._stubbed_cells = []
    module._broken_cells = {}
    run_cells(module, Path(path), cells, files, compiler)
    return module


def validate_notebook(path: Path) -> str | None:
    """None if `path` is a notebook nbgrader can grade, else one line saying why not."""
    import nbformat

    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        return f"not a text file ({e.reason} at byte {e.start})"
    except json.JSONDecodeError as e:
        return f"not valid notebook JSON ({e.msg} at line {e.lineno}, column {e.colno})"
    if not isinstance(raw, dict) or not isinstance(raw.get("cells"), list):
        return "not a notebook (no list of cells)"
    try:
        nb = nbformat.reads(json.dumps(raw), as_version=4)
        nbformat.validate(nb)
    except Exception as e:  # noqa: BLE001  (nbformat.ValidationError and friends)
        return f"not a valid notebook: {one_line(e)}"
    ids = {}
    for i, cell in enumerate(nb.cells):
        meta = cell.get("metadata", {}).get("nbgrader")
        if meta is None:
            continue
        if not isinstance(meta, dict):
            return f"cell {i}: its nbgrader metadata is {type(meta).__name__}, not a dict (restore the cell from the release)"
        grade_id = meta.get("grade_id")
        if (meta.get("grade") or meta.get("solution") or meta.get("locked")) and not isinstance(grade_id, str):
            return f"cell {i}: nbgrader metadata without a grade_id (restore the cell from the release)"
        if grade_id in ids and (meta.get("grade") or meta.get("solution")):
            return f"cells {ids[grade_id]} and {i} share grade_id {grade_id!r} (a copied cell: delete the copy)"
        ids[grade_id] = i
        if meta.get("grade") and not isinstance(meta.get("points", 0), (int, float)):
            return f"cell {i} ({grade_id}): points is {meta.get('points')!r}, not a number"
    return None
