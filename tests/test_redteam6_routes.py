"""The sixth red-team round's routes in weeks 18 and 21 (FINDINGS6.md), through the isolated path as `pytest weeks/NN`
grades them: week 18's batched speculative loop with at most 6 rows per forward (#23) or K capped at 4 (#24) fails
every run (a batch of 16-32 rows with K 8-12 is drawn every run); week 21's TTFT model with 1/(1 - rho) cut to five
Taylor terms (#9) fails every run (the loads just below the capacity are judged for accuracy), and one that simulates
a slot with numpy (#10) too (its arrays pass the host-memory bound, and one slot a hair below the capacity, where M/D/1
is exact and no simulation of a size that runs comes near, is judged); the honest variants
written apart from the solution (#22, #8) pass."""
import json
import subprocess
from pathlib import Path

import pytest

from grader.harness import load_exercises, with_cell_source

REPO = Path(__file__).resolve().parent.parent
V6 = REPO / "tests" / "fixtures" / "redteam" / "v6"


def _run(tmp_path, week, grade_id, variant):
    import importlib
    checks = importlib.import_module(f"grader.checks.week{week}")
    path = next((REPO / "weeks" / str(week)).glob("week*.ipynb"))
    text = subprocess.run(["git", "show", f"HEAD:{path.relative_to(REPO)}"], cwd=REPO, capture_output=True, text=True,
                          check=True).stdout
    target = tmp_path / path.name
    target.write_text(json.dumps(with_cell_source(json.loads(text), grade_id, (V6 / variant).read_text())))
    ex = load_exercises(target)
    try:
        getattr(checks, f"check_{grade_id}")(getattr(ex, grade_id))
    finally:
        ex.close()


@pytest.mark.parametrize("week,grade_id,variant,said", [
    (18, "batched_speculative_generate", "w18_bsg_zip_lanes6.py", "rows, K="),  # #23
    (18, "batched_speculative_generate", "w18_bsg_keymin_k4.py", "rows, K="),  # #24
    (21, "predict_ttft", "w21_ttft_taylor_nearcap.py", "Near the capacity"),  # #9
    (21, "predict_ttft", "w21_ttft_numpy_lindley.py", "allocated|exactly M/D/1"),  # #10: a numpy simulation
])
def test_a_capped_or_truncated_route_fails_every_run(tmp_path, week, grade_id, variant, said):
    with pytest.raises(AssertionError, match=said):
        _run(tmp_path, week, grade_id, variant)


@pytest.mark.parametrize("week,grade_id,variant", [
    (18, "batched_speculative_generate", "w18_bsg_honest_dictfeeds.py"),  # #22 (the loop's judge; copies aside)
    (21, "predict_ttft", "w21_ttft_honest_erlang.py"),  # #8
])
def test_the_honest_variant_passes(tmp_path, week, grade_id, variant):
    _run(tmp_path, week, grade_id, variant)


def test_the_honest_batched_loop_passes_with_the_solution_compared(tmp_path, monkeypatch):
    """#22 as a class's submission is graded, the instructor's solution compared (the lab's tests allow copies of it:
    conftest.py): 60 % of the solution's token sequences, under the threshold of that reference
    (grader/copy_thresholds.py; tests/test_similarity.py holds its margin)."""
    monkeypatch.delenv("INFERENCE_LAB_SOLUTION_COPIES", raising=False)
    _run(tmp_path, 18, "batched_speculative_generate", "w18_bsg_honest_dictfeeds.py")


def test_a_reworded_copy_of_the_solutions_batched_loop_still_scores_zero(tmp_path, monkeypatch):
    """The other side of the raised threshold: the solution's loop renamed, its finished test flipped and its match
    loop rewritten (tests/fixtures/copies/) holds 72 % of it, over the 66.7 % #22's 59.6 % set (0.60 / 0.9)."""
    monkeypatch.delenv("INFERENCE_LAB_SOLUTION_COPIES", raising=False)
    with pytest.raises(AssertionError, match=r"is a copy of the instructor's solution \(its `batched_speculative_gen"):
        _run(tmp_path, 18, "batched_speculative_generate",
             "../../copies/w18_batched_speculative_generate__solution_reworded.py")
