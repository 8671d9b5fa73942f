"""Red-team round 7, #3, #4, #5 (FINDINGS7.md, mechanism 2): copies of gguf-py's quantizers earned full credit in
week 20. gguf-py is the oracle the week-20 checks compare bytes with, and the student's environment has it; calling it
is seen (`grader.fingerprint.ORACLE_MODULES`, exact bytecode), but the copy detector compared with lib and the
solution only, so gguf's `Q8_0.quantize_blocks` with `np_roundf` inlined (#3), `Q5_0.quantize_blocks` (#4) and
`Q4_K.dequantize_blocks` with `get_scale_min` (#5), each with a name or two changed, scored full. Now gguf-py's
`quants.py` and `gguf_writer.py` are references of week 20 (`grader.copies._oracle_units`, read from the installed
package in the trusted process), in the trusted process and in what the child judges code compiled at runtime with.
Honest week-20 code — every variant of tests/fixtures/ written apart from gguf-py, the solution and lib's own
quantizers — keeps the margin every honest variant keeps (tests/test_similarity.py)."""
import ast
import json
import subprocess
from functools import lru_cache
from pathlib import Path

import pytest

from grader import copies, similarity
from grader.harness import load_exercises, with_cell_source
from grader.notebook import exercise_cells

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"
V7 = FIXTURES / "redteam" / "v7"
STUDENT = REPO / "submitted" / "student.ipynb"
MARGIN = 0.9  # as tests/test_similarity.py

# the red team's copies: (file, exercise, the gguf-py reference it copies)
COPIES = [("w20_q8_ggufcopy.py", "quantize_q8_0", "gguf-py's gguf.quants.Q8_0.quantize_blocks with `np_roundf`"),
          ("w20_q5_ggufcopy.py", "quantize_q5_0", "gguf-py's gguf.quants.Q5_0.quantize_blocks"),
          ("w20_dq4k_ggufcopy.py", "dequantize_q4_k", "gguf-py's gguf.quants.Q4_K.dequantize_blocks"),
          # red team 8: pastes tidied as a student tidies anyway, under the general 60 % (59 %, 56 %, 48 %); found at
          # gguf-py's own threshold (grader/copy_thresholds.py: GGUF_HONEST_HIGHEST)
          ("../v8/w20_q8_ggufcopy_edits.py", "quantize_q8_0",
           "gguf-py's gguf.quants.Q8_0.quantize_blocks with `np_roundf`"),
          ("../v8/w20_q5_ggufcopy_nibbles.py", "quantize_q5_0", "gguf-py's gguf.quants.Q5_0.quantize_blocks"),
          ("../v8/w20_q41_ggufcopy_light.py", "quantize_q4_1", "gguf-py's gguf.quants.Q4_1.quantize_blocks")]
EXERCISES = ("quantize_q8_0", "quantize_q4_1", "quantize_q5_0", "predict_rmse", "dequantize_q4_k", "quantize_q4_k",
             "gguf_bytes", "gptq_quantize", "awq_quantize", "column_importance", "allocate_bits")
# week-20 code written apart from gguf-py: the honest variants, and the red teams' other routes (wrong, not copied;
# their demo scripts, which are no cell, aside)
APART = sorted([*(FIXTURES / "honest").glob("w20_*.py"),
                *(p for p in (FIXTURES / "redteam").glob("v*/w20_*.py") if "copy" not in p.stem and "demo" not in p.stem)])


def _cells(replaced: dict[str, str]) -> list:
    nb = json.loads(next((REPO / "solutions" / "20").glob("*.ipynb")).read_text())
    for grade_id, source in replaced.items():
        nb = with_cell_source(nb, grade_id, source)
    return exercise_cells(nb)


def _grade_of(path: Path) -> str:
    names = {n.name for n in ast.parse(path.read_text()).body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    (grade_id,) = names & set(EXERCISES)
    return grade_id


@lru_cache(maxsize=1)
def _gguf_only() -> similarity.References:
    units = copies._oracle_units()
    assert any(".Q8_0.quantize_blocks" in name for name in units)  # the installed gguf-py was read
    return similarity.References(units, copies._common(),
                                 min_fingerprints=dict.fromkeys(units, copies.ORACLE_MIN_FINGERPRINTS))


def _nearest_gguf(cells, grade_id: str):
    """(token share, statement share, reference) of the gguf-py reference the exercise's code comes nearest to
    copying, as `copies.scores` judges a cell (each function, and each with the notebook's functions it calls)."""
    refs, source = _gguf_only(), similarity.Source([(i, t) for i, _, t in cells])
    index = next(i for i, g, _ in cells if g == grade_id)
    graded = {g for _, g, _ in cells if g}
    given = copies._given(copies._solution_cells(20, STUDENT.name), grade_id)
    best = None
    for name in (n for n, where in source.where.items() if where == index):
        units = [source.units[name]]
        if "." not in name:
            units.append(source.closure(name, exclude=graded - {grade_id})[0])
        for unit in units:
            hit = refs.best(unit, given)
            if hit is not None and (best is None or similarity.ratio(hit) > similarity.ratio(best)):
                best = hit
    return best


@pytest.mark.parametrize("variant, grade_id, reference", COPIES, ids=[c[0] for c in COPIES])
def test_the_red_teams_copies_of_gguf_are_found(variant, grade_id, reference, monkeypatch):
    monkeypatch.delenv("INFERENCE_LAB_SOLUTION_COPIES", raising=False)
    cells = _cells({grade_id: (V7 / variant).read_text()})
    tok, st, ref, name, _ = copies.scores(STUDENT, cells, 20)[grade_id]
    assert ref == reference and similarity.ratio((tok, st, ref)) >= 1, (ref, tok, st)
    why = copies.similar_to_reference(STUDENT, cells, 20)[grade_id]
    assert why.startswith(f"`{grade_id}`") and f"is a copy of {reference}" in why and "% of that code" in why
    if variant.startswith("../v8/"):
        return  # split across a helper of the student's: judged whole (above), not replaced function by function
    # the body the child gets says which gguf-py function it copies, and to write it
    found = {q: w for i, q, w in copies.copies_in_cells(STUDENT, cells, 20)}
    text = copies.without_copies(next(t for _, g, t in cells if g == grade_id), found)
    assert reference in text and "write the function yourself" in text and "def " + grade_id in text


def test_a_copy_of_gguf_compiled_while_the_notebook_runs_is_found_by_the_child():
    """The child judges code compiled at runtime (an encoded copy decoded and exec'd) with the references the
    trusted process hands it (`copies.reference_units`: hashes only): gguf-py's are among them in week 20."""
    data = copies.reference_units(STUDENT, 20)
    for variant, grade_id, reference in COPIES:
        if variant == "../v8/w20_q8_ggufcopy_edits.py":
            continue  # split across a helper of its own: the runtime judge compares function by function (left open)
        found = similarity.copies_in_source("import numpy as np\n" + (V7 / variant).read_text(), data)
        assert reference in found.get(grade_id, ""), (variant, found)


def test_a_pasted_gguf_q4_1_is_found(monkeypatch):
    """The fourth byte-exact quantizer gguf-py has (tests/fixtures/copies/ holds the paste)."""
    monkeypatch.delenv("INFERENCE_LAB_SOLUTION_COPIES", raising=False)
    path = FIXTURES / "copies" / "w20_quantize_q4_1__gguf_pasted.py"
    tok, st, ref, _, _ = copies.scores(STUDENT, _cells({"quantize_q4_1": path.read_text()}), 20)["quantize_q4_1"]
    assert ref == "gguf-py's gguf.quants.Q4_1.quantize_blocks" and similarity.ratio((tok, st, ref)) >= 1


@pytest.mark.parametrize("path", APART, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_code_written_apart_from_gguf_keeps_the_margin(path):
    grade_id = _grade_of(path)
    found = _nearest_gguf(_cells({grade_id: path.read_text()}), grade_id)
    if found is not None:  # None: nothing it holds is anywhere near gguf-py
        assert similarity.ratio(found) < MARGIN, (path.name, found)


def test_the_solution_and_lib_are_not_copies_of_gguf():
    """The instructor's answers and lib's own quantizers were written with gguf-py as the oracle, not pasted from it
    (each at most 0.52 of a threshold, measured): nothing of them comes near."""
    cells = _cells({})
    for _, grade_id, _ in cells:
        if grade_id in EXERCISES:
            found = _nearest_gguf(cells, grade_id)
            assert found is None or similarity.ratio(found) < MARGIN, (grade_id, found)
    for name, unit in copies._units_of(copies._lib_sources()["lib.gguf.qformats"], str).items():
        found = _gguf_only().best(unit)
        assert found is None or similarity.ratio(found) < MARGIN, (name, found)


def test_the_copies_score_zero_through_the_isolated_path(tmp_path):
    """As `pytest weeks/20` grades them: the Q8_0 copy's body is a `raise` that names gguf-py's function; the Q5_0
    copy, decoded and exec'd while the cells run, is refused by the child's audit hook on the same references."""
    import base64

    from grader.checks import week20
    path = next((REPO / "weeks" / "20").glob("week*.ipynb"))
    text = subprocess.run(["git", "show", f"HEAD:{path.relative_to(REPO)}"], cwd=REPO, capture_output=True, text=True,
                          check=True).stdout
    encoded = base64.b64encode((V7 / "w20_q5_ggufcopy.py").read_bytes()).decode()
    nb = with_cell_source(json.loads(text), "quantize_q8_0", (V7 / "w20_q8_ggufcopy.py").read_text())
    nb = with_cell_source(nb, "quantize_q5_0", f"import base64\nexec(base64.b64decode({encoded!r}).decode())\n")
    target = tmp_path / path.name
    target.write_text(json.dumps(nb))
    ex = load_exercises(target)
    try:
        with pytest.raises(AssertionError, match=r"`quantize_q8_0` is a copy of gguf-py's gguf\.quants\.Q8_0\."
                                                 r"quantize_blocks with `np_roundf`: it holds \d+% .*write the "
                                                 r"function yourself"):
            week20.check_quantize_q8_0(ex.quantize_q8_0)
        # the cell's compile raises (the copy never exists), saying why
        with pytest.raises(AssertionError, match=r"`quantize_q5_0` is a copy of gguf-py's gguf\.quants\.Q5_0\."
                                                 r"quantize_blocks: it holds \d+% .*the grader does not compile a copy"):
            week20.check_quantize_q5_0(ex.quantize_q5_0)
    finally:
        ex.close()


def test_gguf_pys_threshold_is_the_highest_honest_share_over_the_margin():
    """gguf-py's threshold is measured, as every raised one is (tests/test_similarity.py): the honest variant nearest
    any of gguf-py's units is the one the table names, at the share it gives (rounded up to the hundredth)."""
    from grader import copy_thresholds

    share, where = copy_thresholds.GGUF_HONEST_HIGHEST
    nearest = {}
    for path in APART:
        grade_id = _grade_of(path)
        found = _nearest_gguf(_cells({grade_id: path.read_text()}), grade_id)
        if found is not None:
            nearest[str(path.relative_to(FIXTURES))] = found[0]
    top = max(nearest, key=nearest.get)
    assert top == where and share - 0.01 < nearest[top] <= share, (top, nearest[top], share)
    assert copy_thresholds.token_threshold("gguf-py's gguf.quants.Q8_0.quantize_blocks", 0.6) == share / MARGIN
