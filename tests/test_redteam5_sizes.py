"""Week 19's checks reach the sizes where fixed-width integers break and the dtypes where half-precision sums do (the
fifth red-team round, FINDINGS5.md #24, #25 and #22): an allocator whose free list is an `np.uint32` bitmask, a slot
mapping computed in int16, and paged attention accumulating in bf16/fp16 with no upcast each fail every run through the
isolated path, as `pytest weeks/19` grades them; the round's honest paged attention (an fp32 computation rounded once,
in a loop per sequence) passes the bf16 and fp16 cases."""
import json
import subprocess
from pathlib import Path

import pytest

from grader.harness import load_exercises, with_cell_source

REPO = Path(__file__).resolve().parent.parent
V5 = REPO / "tests" / "fixtures" / "redteam" / "v5"


def _graded(tmp_path, grade_id, variant):
    """The week 19 release notebook with `grade_id`'s cell replaced by the variant, loaded as `pytest weeks/19` does."""
    path = next((REPO / "weeks" / "19").glob("week*.ipynb"))
    text = subprocess.run(["git", "show", f"HEAD:{path.relative_to(REPO)}"], cwd=REPO, capture_output=True, text=True,
                          check=True).stdout
    target = tmp_path / path.name
    target.write_text(json.dumps(with_cell_source(json.loads(text), grade_id, (V5 / variant).read_text())))
    return load_exercises(target)


@pytest.mark.parametrize("grade_id,variant,said", [
    ("BlockAllocator", "w19_alloc_bitmask32.py", "num_free = 32"),  # a pool of 65-5000 blocks, every run
    ("slot_mapping", "w19_slotmap_int16.py", "slot_mapping"),  # block ids of 2^27 and more, every run
    # #22: bf16 at least 5.7x the bound over 275 seeds (grader/checks/week19_dtype.py); the fp16 case follows it
    ("paged_attention", "w19_paged_nofloat.py", r"on torch.bfloat16 inputs.*what rounding allows"),
])
def test_a_route_fails_at_the_sizes_and_dtypes_the_checks_draw(tmp_path, grade_id, variant, said):
    from grader.checks import week19

    ex = _graded(tmp_path, grade_id, variant)
    try:
        with pytest.raises(AssertionError, match=said):
            getattr(week19, f"check_{grade_id}")(getattr(ex, grade_id))
    finally:
        ex.close()


def test_the_rounds_honest_paged_attention_passes_in_every_dtype(tmp_path):
    from grader.checks import week19

    ex = _graded(tmp_path, "paged_attention", "w19_paged_honest_perseq.py")
    try:
        week19.check_paged_attention(ex.paged_attention)
    finally:
        ex.close()
