"""Week 19's checks against the sixth red-team round (FINDINGS6.md), through the isolated path as `pytest weeks/19`
grades: wrong routes that hid a constant below the sizes the checks reached (a tanh step, `0 ** len(range(512, n))`,
a keyed `max` as a cap) fail every run, now that every run draws cases past any such constant; honest variants
written apart from the solution pass (one of them meets its `not chunked_prefill and n < left` both ways every run)."""
import json
import subprocess
from pathlib import Path

import pytest

from grader.harness import load_exercises, with_cell_source

REPO = Path(__file__).resolve().parent.parent
V6 = REPO / "tests" / "fixtures" / "redteam" / "v6"


def _grade(tmp_path, grade_id: str, variant: str) -> None:
    from grader.checks import week19

    path = next((REPO / "weeks" / "19").glob("week*.ipynb"))
    text = subprocess.run(["git", "show", f"HEAD:{path.relative_to(REPO)}"], cwd=REPO, capture_output=True, text=True,
                          check=True).stdout
    target = tmp_path / path.name
    target.write_text(json.dumps(with_cell_source(json.loads(text), grade_id, (V6 / variant).read_text())))
    ex = load_exercises(target)
    try:
        getattr(week19, f"check_{grade_id}")(getattr(ex, grade_id))
    finally:
        ex.close()


@pytest.mark.parametrize("grade_id,variant,said", [
    ("continuous_gain", "w19_gain_tanh_oneslot.py", "wide case"),  # #2: one slot's max past 24 slots
    ("continuous_gain", "w19_gain_rangepow_tail.py", "wide case|ZeroDivisionError"),  # #3: lengths past 512 dropped
    ("continuous_gain", "w19_gain_keymax_cap32.py", "wide case"),  # #4: slots capped at 32
    ("schedule", "w19_sched_zip_chunk256.py", "schedule"),  # #18: prefill chunks capped at 256 (a 300-8192 prompt)
    ("schedule", "w19_sched_tanh_extra13.py", "schedule"),  # #19: one preemption too many with 13+ running
])
def test_a_wrong_route_fails_every_run(tmp_path, grade_id, variant, said):
    with pytest.raises(AssertionError, match=said):
        _grade(tmp_path, grade_id, variant)


@pytest.mark.parametrize("grade_id,variant", [
    ("continuous_gain", "w19_gain_honest_survival.py"),  # #1
    ("schedule", "w19_sched_honest_twophase.py"),  # #17: `not chunked_prefill and n < left` meets both outcomes
])
def test_an_honest_variant_passes(tmp_path, grade_id, variant):
    _grade(tmp_path, grade_id, variant)


@pytest.mark.parametrize("variant,said", [
    ("w19_prefix_deque_maxlen12.py", "PrefixCache"),  # #13: free cached blocks in a deque(maxlen=12)
    ("w19_prefix_uint8_tokens.py", "PrefixCache"),  # #14: tokens compared as uint8
    ("w19_prefix_tanh_mru.py", "PrefixCache"),  # #15: newest evicted in pools of 17+
])
def test_a_wrong_prefix_cache_fails_every_run(tmp_path, variant, said):
    with pytest.raises(AssertionError, match=said):
        _grade(tmp_path, "PrefixCache", variant)


def test_a_prefix_cache_choosing_by_set_pop_passes(tmp_path):
    """#11: any free block that caches nothing may be allocated; a copied set pops another one, and the observed
    call's second run on copies accepts any of them (`_observe_accept`), not only the same block."""
    _grade(tmp_path, "PrefixCache", "w19_prefix_honest_setpop.py")
