"""Red-team round 7, #26 (FINDINGS7.md, mechanism 7): a flash_decode with ceil-sized splits (ceil(Nk / n) keys each,
the last what is left: 6, 6, 6, 6, 6, 6, 1 for 37 keys in 7) earned full credit, though the exercise asks for splits
"as even as they can be (sizes differing by at most one)": every bound on a product's extent and a read's reach is
ceil(Nk / n), which those splits meet. Now the largest key sets the reads combine (`grader.reach`) must be the even
partition. Run through the isolated path, as `pytest weeks/17` grades it; the honest variant (#24) passes."""
import json
import subprocess
from pathlib import Path

import pytest

from grader.harness import load_exercises, with_cell_source

REPO = Path(__file__).resolve().parent.parent
V7 = REPO / "tests" / "fixtures" / "redteam" / "v7"


def _run(tmp_path, variant):
    from grader.checks import week17
    path = next((REPO / "weeks" / "17").glob("week*.ipynb"))
    text = subprocess.run(["git", "show", f"HEAD:{path.relative_to(REPO)}"], cwd=REPO, capture_output=True, text=True,
                          check=True).stdout
    target = tmp_path / path.name
    target.write_text(json.dumps(with_cell_source(json.loads(text), "flash_decode", (V7 / variant).read_text())))
    ex = load_exercises(target)
    try:
        week17.check_flash_decode(ex.flash_decode)
    finally:
        ex.close()


def test_ceil_sized_splits_fail(tmp_path):
    with pytest.raises(AssertionError, match=r"as even as they can be"):
        _run(tmp_path, "w17_decode_ceilsplits.py")


def test_the_honest_split_k_passes(tmp_path):
    _run(tmp_path, "w17_decode_honest.py")
