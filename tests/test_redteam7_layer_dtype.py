"""Red-team round 7, #13 (FINDINGS7.md, mechanism 6): a LayerKVCache whose buffers are always float32 while its nbytes
is computed from the dtype asked for earned full credit (the fp16 cache was only asked its nbytes). Now fp16 and bf16
caches are appended to and must return views of that dtype, of buffers of that dtype, and the constructor's bytes are
bounded by the dtype's. Run through the isolated path, as `pytest weeks/16` grades it; the honest variant (#12)
passes."""
import json
import subprocess
from pathlib import Path

import pytest

from grader.harness import load_exercises, with_cell_source

REPO = Path(__file__).resolve().parent.parent
V7 = REPO / "tests" / "fixtures" / "redteam" / "v7"


def _run(tmp_path, variant):
    from grader.checks import week16
    path = next((REPO / "weeks" / "16").glob("week*.ipynb"))
    text = subprocess.run(["git", "show", f"HEAD:{path.relative_to(REPO)}"], cwd=REPO, capture_output=True, text=True,
                          check=True).stdout
    target = tmp_path / path.name
    target.write_text(json.dumps(with_cell_source(json.loads(text), "LayerKVCache", (V7 / variant).read_text())))
    ex = load_exercises(target)
    try:
        week16.check_LayerKVCache(ex.LayerKVCache)
    finally:
        ex.close()


def test_a_cache_whose_buffers_are_always_float32_fails(tmp_path):
    with pytest.raises(AssertionError, match=r"float16 .*(allocated|returned keys of)"):
        _run(tmp_path, "w16_layer_fp32always.py")


def test_the_honest_cache_passes(tmp_path):
    _run(tmp_path, "w16_layer_honest.py")
