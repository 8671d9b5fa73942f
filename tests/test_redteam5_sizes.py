"""Week 19's checks reach the sizes where fixed-width integers break (the fifth red-team round, FINDINGS5.md #24 and
#25): an allocator whose free list is an `np.uint32` bitmask, and a slot mapping computed in int16, each fail every run
through the isolated path, as `pytest weeks/19` grades them."""
import json
import subprocess
from pathlib import Path

import pytest

from grader.harness import load_exercises, with_cell_source

REPO = Path(__file__).resolve().parent.parent
V5 = REPO / "tests" / "fixtures" / "redteam" / "v5"


@pytest.mark.parametrize("grade_id,variant,said", [
    ("BlockAllocator", "w19_alloc_bitmask32.py", "num_free = 32"),  # a pool of 65-5000 blocks, every run
    ("slot_mapping", "w19_slotmap_int16.py", "slot_mapping"),  # block ids of 2^27 and more, every run
])
def test_a_fixed_width_route_fails_at_the_sizes_the_checks_draw(tmp_path, grade_id, variant, said):
    from grader.checks import week19

    path = next((REPO / "weeks" / "19").glob("week*.ipynb"))
    text = subprocess.run(["git", "show", f"HEAD:{path.relative_to(REPO)}"], cwd=REPO, capture_output=True, text=True,
                          check=True).stdout
    target = tmp_path / path.name
    target.write_text(json.dumps(with_cell_source(json.loads(text), grade_id, (V5 / variant).read_text())))
    ex = load_exercises(target)
    try:
        with pytest.raises(AssertionError, match=said):
            getattr(week19, f"check_{grade_id}")(getattr(ex, grade_id))
    finally:
        ex.close()
