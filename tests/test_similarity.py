"""Copies of the answer key (`grader.similarity`, `grader.copies`), sized on fixtures:

- tests/fixtures/honest/: implementations of the exercises most at risk written from the release notebooks alone
  (markdown and stubs), before lib's code or the solutions were read; each passes its week's check.
- tests/fixtures/copies/: lib's code and the instructor's solution (and gguf-py's, week 20's oracle), reworded: renamed,
  reordered, operands swapped, statements split and merged, comments and docstrings changed, a loop as a
  comprehension, helpers inlined or folded into a class, options and checks the exercise does not need dropped.
- tests/fixtures/copies_uncaught/: copies of answers too short to judge (grader/README.md, "Reference use").

A fixture's name says what it is: `wNN_<exercise>_<variant>.py` (honest), `wNN_<exercise>__<source>_<how>.py`.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from grader import copies, similarity
from grader.harness import with_cell_source
from grader.notebook import exercise_cells

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"
HONEST = sorted((FIXTURES / "honest").glob("w*.py"))
COPIES = sorted((FIXTURES / "copies").glob("w*.py"))
UNCAUGHT = sorted((FIXTURES / "copies_uncaught").glob("w*.py"))
MARGIN = 0.9  # every honest variant stays under this fraction of the thresholds (similarity.ratio); measured: 0.86


def _exercise(path: Path) -> tuple[int, str]:
    stem = path.stem
    return int(stem[1:3]), stem[4:].split("__")[0] if "__" in stem else stem[4:-2]


def _as_students(week: int, replaced: dict[str, str]) -> list:
    """The cells of the solution notebook with these exercises' cells replaced: a student's notebook."""
    nb = json.loads(next((REPO / "solutions" / str(week)).glob("*.ipynb")).read_text())
    for grade_id, source in replaced.items():
        nb = with_cell_source(nb, grade_id, source)
    return exercise_cells(nb)


def _score(path: Path, monkeypatch) -> tuple:
    """(token share, statement share, reference, qualname, helpers) of the fixture as a student's exercise cell,
    compared with lib and with the solution, as a class's submissions are."""
    monkeypatch.delenv("INFERENCE_LAB_SOLUTION_COPIES", raising=False)
    week, grade_id = _exercise(path)
    return copies.scores(REPO / "submitted" / "student.ipynb", _as_students(week, {grade_id: path.read_text()}),
                         week)[grade_id]


def test_the_fixtures_are_there():
    assert len(HONEST) >= 30 and len(COPIES) >= 12
    exercises = {_exercise(p)[1] for p in HONEST}
    for at_risk in ("flash_attention_forward", "RollingKVCache", "LayerKVCache", "paged_attention", "gptq_quantize",
                    "TextStream", "ServingLoop", "BlockAllocator", "PrefixCache", "quantize_q8_0", "quantize_q4_1"):
        assert at_risk in exercises


@pytest.mark.parametrize("path", HONEST, ids=lambda p: p.stem)
def test_honest_work_stays_under_the_thresholds_with_margin(path, monkeypatch):
    tok, st, ref, name, _ = _score(path, monkeypatch)
    assert similarity.ratio((tok, st, ref)) < MARGIN, (
        f"{path.name}: `{name}` holds {tok:.0%} of the token sequences and {st:.0%} of the statements of {ref}, "
        f"within {1 - MARGIN:.0%} of the thresholds ({similarity.TOKEN_THRESHOLD:.0%}, {similarity.THRESHOLD:.0%})")


@pytest.mark.parametrize("path", COPIES, ids=lambda p: p.stem)
def test_reworded_copies_are_found(path, monkeypatch):
    tok, st, ref, name, _ = _score(path, monkeypatch)
    source = path.stem.split("__")[1].split("_")[0]
    assert similarity.ratio((tok, st, ref)) >= 1, f"{path.name}: {tok:.0%} of the tokens, {st:.0%} of the statements of {ref}"
    assert ref.startswith({"lib": "lib's", "solution": "the instructor's solution", "gguf": "gguf-py's"}[source]), ref


def test_the_red_teams_copy_with_four_operands_swapped_is_whole(monkeypatch):
    """lib's forward with four operands swapped held 0.889 of lib's statements, under the old 0.9: the normalised
    form sorts the operands of `+`, `*`, `==` and turns `a >= b` into `b <= a`; one swap inside a call's arguments
    (`torch.maximum(s.amax(-1), m)`) is left, and costs one statement and a few k-grams."""
    tok, st, ref, _, _ = _score(FIXTURES / "copies" / "w17_flash_attention_forward__lib_swapped.py", monkeypatch)
    assert ref == "lib's lib.attn.attention.flash_attention_forward" and tok >= 0.95 and st >= 0.9


def test_a_deep_expression_neither_hides_a_copy_nor_stalls_the_grader(monkeypatch):
    """`x + x + ... + x` of 1,500 terms parses and runs, but nests deeper than Python's recursion limit lets a tree
    walk go (the source check raised RecursionError), and sorting the operands level by level took seconds per
    thousand terms: the chain is flattened without recursion and each term sorted once."""
    import time

    path = FIXTURES / "copies" / "w19_schedule__lib_reworded.py"
    padded = path.read_text().replace('    """Plan one step."""\n',
                                      '    """Plan one step."""\n    _pad = ' + " + ".join(["token_budget"] * 1500) + "\n")
    assert "_pad" in padded
    monkeypatch.delenv("INFERENCE_LAB_SOLUTION_COPIES", raising=False)
    started = time.process_time()
    tok, st, ref, _, _ = copies.scores(REPO / "submitted" / "student.ipynb", _as_students(19, {"schedule": padded}),
                                       19)["schedule"]
    assert similarity.ratio((tok, st, ref)) >= 1 and ref == "lib's lib.batching.engine.schedule"
    assert time.process_time() - started < 10


@pytest.mark.parametrize("path", UNCAUGHT, ids=lambda p: p.stem)
def test_copies_of_the_shortest_answers_are_not_judged(path, monkeypatch):
    """The known limit (grader/README.md): these answers are too short for either measure — under MIN_FINGERPRINTS
    fingerprints and MIN_STATEMENTS statements once the idiom is out, or as short as honest variants of them
    (tests/fixtures/honest/w16_LayerKVCache_a.py comes to 77 % of the threshold, the copy of the solution to 70 %) — so a copy of them
    passes. A measure that catches them must also pass every honest variant: then move them to copies/."""
    tok, st, ref, name, _ = _score(path, monkeypatch)
    assert similarity.ratio((tok, st, ref)) < 1


RED_HONEST = sorted((FIXTURES / "redteam").glob("v*/w*honest*.py"))


def _grade_of(path: Path) -> str | None:
    """The exercise a red team's variant answers: the solution's exercise cell defining a name it defines."""
    import ast

    names = {n.name for n in ast.parse(path.read_text()).body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    for _, grade_id, text in _as_students(int(path.name[1:3]), {}):
        if grade_id and names & {n.name for n in ast.parse(similarity.without_magics(text)).body
                                 if isinstance(n, (ast.FunctionDef, ast.ClassDef))}:
            return grade_id
    return None


@pytest.mark.parametrize("path", RED_HONEST, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_the_red_teams_honest_work_stays_under_the_thresholds_with_margin(path, monkeypatch):
    """The red teams' honest variants (written apart from the solution, each round's FINDINGS*.md) keep the margin
    tests/fixtures/honest/ keeps: the distribution the thresholds are sized on (grader/copy_thresholds.py)."""
    grade_id = _grade_of(path)
    assert grade_id is not None, path
    monkeypatch.delenv("INFERENCE_LAB_SOLUTION_COPIES", raising=False)
    week = int(path.name[1:3])
    found = copies.scores(REPO / "submitted" / "student.ipynb", _as_students(week, {grade_id: path.read_text()}),
                          week).get(grade_id)
    if found is not None:  # None: nothing it holds is anywhere near a reference
        assert similarity.ratio(found[:3]) < MARGIN, (path.name, found[:4])


_NEAR = {"redteam/v6/w18_bsg_honest_dictfeeds.py": (18, "batched_speculative_generate"),
         "redteam/v6/w19_sched_honest_twophase.py": (19, "schedule"),
         "redteam/v11/w21_servingloop_honest.py": (21, "ServingLoop")}


@pytest.mark.parametrize("variant", sorted(_NEAR))
def test_honest_work_that_the_interface_dictates_is_not_a_copy(variant, monkeypatch):
    """Red team 6's #22, a `batched_speculative_generate` written from the exercise's text and the check's docstring
    alone, holds 60 % of the solution's token sequences (its dict of feeds, leading matches and per-row truncate are
    what the cache's interface leaves to write): 0.993 of the flat threshold, where a reworded copy of the solution
    holds 72 % (tests/fixtures/copies/). The threshold of such a reference is the highest honest share / MARGIN
    (`grader.copy_thresholds`): each entry is recomputed here from its variant, and the variant keeps the margin
    every honest variant keeps. Fails before (flat 0.6: #22 at 0.993 of it)."""
    from grader import copy_thresholds

    week, grade_id = _NEAR[variant]
    monkeypatch.delenv("INFERENCE_LAB_SOLUTION_COPIES", raising=False)
    text = (FIXTURES / variant).read_text()
    tok, st, ref, _, _ = copies.scores(REPO / "submitted" / "student.ipynb", _as_students(week, {grade_id: text}),
                                       week)[grade_id]
    share, where = copy_thresholds.HONEST_HIGHEST[ref]
    assert where == variant and share - 0.01 < tok <= share, (ref, tok, share)  # the table holds what is measured
    assert copy_thresholds.MARGIN == MARGIN
    assert similarity.ratio((tok, st, ref)) < MARGIN
    assert grade_id not in copies.similar_to_reference(REPO / "submitted" / "student.ipynb",
                                                       _as_students(week, {grade_id: text}), week)


def test_honest_statements_the_interface_dictates_raise_that_references_statement_threshold(monkeypatch):
    """Red team 11b's honest `schedule`, written from the notebook, holds 72 % of lib's schedule's statements: 0.90 of
    the flat 0.8 (a scheduler's branches are the exercise's rules). Its reference's statement threshold is that share
    / MARGIN (`grader.copy_thresholds.HONEST_STATEMENTS`), each entry recomputed here from its variant; a reworded copy
    of lib's schedule holds 97 % of its tokens (tests/fixtures/copies/)."""
    from grader import copy_thresholds

    monkeypatch.delenv("INFERENCE_LAB_SOLUTION_COPIES", raising=False)
    for name, (share, where) in copy_thresholds.HONEST_STATEMENTS.items():
        path = FIXTURES / where
        week, grade_id = int(path.name[1:3]), _grade_of(path)
        tok, st, ref, _, _ = copies.scores(REPO / "submitted" / "student.ipynb",
                                           _as_students(week, {grade_id: path.read_text()}), week)[grade_id]
        assert ref == name and share - 0.01 < st <= share, (ref, st, share)  # the table holds what is measured
        assert similarity.ratio((tok, st, ref)) < MARGIN


def test_small_methods_are_judged_as_their_class_and_every_method_of_a_copy_is_replaced(tmp_path):
    """Every method of lib's RollingKVCache is under 12 statements and was never compared; the class is, and a copy
    parked in a setup cell loses every method (each body becomes a `raise` in the cells the child gets)."""
    path = FIXTURES / "copies" / "w16_RollingKVCache__lib_reworded.py"
    source = path.read_text().replace("class RollingKVCache", "class _Mine")
    cells = [(0, None, "import torch\n" + source), (1, "RollingKVCache", "RollingKVCache = _Mine\n")]
    found = copies.copies_in_cells(tmp_path / "nb.ipynb", cells, 16)
    methods = {q for i, q, _ in found if i == 0}
    assert methods == {f"_Mine.{m}" for m in ("__init__", "nbytes", "max_len", "held", "_check_new", "append", "reset",
                                              "truncate")}
    replaced = copies.without_copies(cells[0][2], {q: why for _, q, why in found})
    assert replaced.count("raise RuntimeError(") == len(methods)
    from lib.modeling import kv_cache
    import inspect

    lib_units = similarity.Source([(0, inspect.getsource(kv_cache))]).units
    assert all(sum(lib_units[q].st.values()) < 12 for q in lib_units if q.startswith("RollingKVCache."))


def test_the_instructors_screen_names_the_match_and_its_share(monkeypatch):
    """The autograde line per student and the CSV's reference_use column (`grader.course.reference_use_text`, from
    the reasons grading.py stores in grader/grading_status/<week>/<id>.json) name what was copied, and how much."""
    from grader.course import reference_use_text

    path = FIXTURES / "copies" / "w21_TextStream__lib_reworded.py"
    monkeypatch.delenv("INFERENCE_LAB_SOLUTION_COPIES", raising=False)
    cells = _as_students(21, {"TextStream": path.read_text()})
    why = copies.similar_to_reference(REPO / "submitted" / "student.ipynb", cells, 21)["TextStream"]
    tok, st, ref, _, _ = copies.scores(REPO / "submitted" / "student.ipynb", cells, 21)["TextStream"]
    assert ref == "lib's lib.serve.serving.TextStream"
    status = {"reference_use": ["TextStream", "ServingLoop"],
              "reference_use_why": {"TextStream": why, "ServingLoop": "`ServingLoop` ran lib's lib.serve.serving.ServingLoop"}}
    # a reference use that is not a copy says what it ran, in one line
    assert reference_use_text(status) == [f"TextStream (copy of lib.serve.serving.TextStream {max(tok, st):.0%})",
                                          "ServingLoop (`ServingLoop` ran lib's lib.serve.serving.ServingLoop)"]
    solution_why = why.replace("lib's lib.serve.serving.TextStream", "the instructor's solution (its `TextStream._take`)")
    assert similarity.match_label(solution_why) == f"the solution's TextStream._take {max(tok, st):.0%}"


def test_the_nearest_reference_is_reported_below_the_thresholds_too(monkeypatch):
    """Red team 10's #10: lib's TextStream re-spelled line by line holds ~23 % of its tokens, under the thresholds
    (honest work scores as much): not a copy, but the status file's `nearest_reference` names lib's TextStream with
    its share, for the instructor to read."""
    path = REPO / "tests" / "fixtures" / "redteam" / "v10" / "w21_textstream_respelled.py"
    monkeypatch.delenv("INFERENCE_LAB_SOLUTION_COPIES", raising=False)
    cells = _as_students(21, {"TextStream": path.read_text()})
    similar, nearest = copies.similar_and_nearest(REPO / "submitted" / "student.ipynb", cells, 21)
    assert "TextStream" not in similar
    assert re.fullmatch(r"lib's lib\.serve\.serving\.TextStream( [(].*[)])? \d+% \(tokens \d+%, statements \d+%\)",
                        nearest["TextStream"]), nearest


# --- through the isolated path: the copies score 0 as `pytest weeks/NN` and autograde grade them ------------------

_BY_WEEK = {}
for _path in COPIES:
    _week, _grade_id = _exercise(_path)
    if "__lib_" in _path.stem:  # the lab's tests grade copies of the solution as honest (conftest.py); lib's are not
        _BY_WEEK.setdefault(_week, {}).setdefault(_grade_id, _path.read_text())


@pytest.mark.parametrize("week", sorted(_BY_WEEK))
def test_copies_of_lib_score_zero_through_the_isolated_path(week, tmp_path):
    import importlib
    import sys

    sys.path.insert(0, str(REPO / "tests"))
    from _integrity_support import _load

    checks = importlib.import_module(f"grader.checks.week{week}")
    ex = _load(tmp_path, week, edits=_BY_WEEK[week])
    assert set(_BY_WEEK[week]) <= set(ex._session.nearest), ex._session.nearest  # (grading.py's `nearest_reference`)
    for grade_id in _BY_WEEK[week]:
        # the check fails on the copy's body (a `raise` saying why), or else on the reference use
        with pytest.raises(AssertionError, match=rf"`{grade_id}`: (RuntimeError: )?`[\w.]+`( with the functions it "
                                                 rf"calls .*)? is a copy of lib's lib\.[\w.]+.*: (it holds|together "
                                                 rf"they hold) \d+% of that"):
            getattr(checks, f"check_{grade_id}")(getattr(ex, grade_id))
