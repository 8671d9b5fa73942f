"""Weeks 16 and 17's closed-form exercises are judged over the whole meaningful range of every argument
(`grader.checks.sweep`; the sixth red-team round, FINDINGS6.md #25 #26 #28 #30 #31 #32): a cap, clamp or step at a
constant inside that range, however it is spelled (a sorted pair, a digit count, `(x + abs(x)) / 2`, `int(a / C)`,
`np.clip`, `np.heaviside`), fails every run through the isolated path, as `pytest weeks/NN` grades it; the honest
variant written apart from the solution (`max` as `(a + b + |a - b|) / 2`) passes."""
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


@pytest.mark.parametrize("week,grade_id,variant", [
    (16, "step_flops", "w16_step_flops_sortedpair.py"),  # #25: attention span capped at 8,192 positions
    (16, "kv_cache_bytes", "w16_kv_bytes_digits.py"),  # #26: batch ignored from 900,000 positions
    (16, "roofline_time", "w16_roofline_abs_relu.py"),  # #28: bytes past 1e12 counted half
    (17, "score_bytes", "w17_score_bytes_intdiv.py"),  # #30: halved past 2^25 scores
    (17, "standard_io", "w17_standard_io_npclip.py"),  # #31: N clipped at 16,384
    (17, "flash_io", "w17_flash_io_heaviside.py"),  # #32: T_c halved past 2^17 keys
])
def test_a_switch_inside_the_range_fails_every_run(tmp_path, week, grade_id, variant):
    with pytest.raises(AssertionError, match="however large"):
        _run(tmp_path, week, grade_id, variant)


def test_the_honest_max_without_max_passes(tmp_path):
    _run(tmp_path, 16, "roofline_time", "w16_roofline_honest_abs.py")  # #27
