"""Red-team round 7, #8 (FINDINGS7.md, mechanism 5): a GPTQ without the dead-input rule (an input always 0 keeps its
weight, rounded) passed on 3 of 5 seeds (1, 3 and 4), the 90 % same-codes rule aggregated over all columns. Now the
dead columns are judged by the rule on every run (each dead weight the grid point nearest 0: within half a step of 0)
and the 90 % on the live columns. Run through the isolated path, as `pytest weeks/20` grades it, on seeds where it
passed before; the honest variant (#7) passes."""
import json
import subprocess
from pathlib import Path

import pytest

from grader.harness import load_exercises, with_cell_source

REPO = Path(__file__).resolve().parent.parent
V7 = REPO / "tests" / "fixtures" / "redteam" / "v7"


def _run(tmp_path, monkeypatch, variant, seed):
    from grader import seeds
    from grader.checks import week20
    monkeypatch.setattr(seeds, "_SEED", seed)
    path = next((REPO / "weeks" / "20").glob("week*.ipynb"))
    text = subprocess.run(["git", "show", f"HEAD:{path.relative_to(REPO)}"], cwd=REPO, capture_output=True, text=True,
                          check=True).stdout
    target = tmp_path / path.name
    target.write_text(json.dumps(with_cell_source(json.loads(text), "gptq_quantize", (V7 / variant).read_text())))
    ex = load_exercises(target)
    try:
        week20.check_gptq_quantize(ex.gptq_quantize)
    finally:
        ex.close()


@pytest.mark.parametrize("seed", [1, 3])  # two of the seeds #8 passed on before
def test_gptq_without_the_dead_input_rule_fails(tmp_path, monkeypatch, seed):
    with pytest.raises(AssertionError, match=r"is always 0, yet row .* more than half a grid step"):
        _run(tmp_path, monkeypatch, "w20_gptq_nodead.py", seed)


@pytest.mark.parametrize("seed", [1, 2])
def test_the_honest_gptq_passes(tmp_path, monkeypatch, seed):
    _run(tmp_path, monkeypatch, "w20_gptq_honest.py", seed)
