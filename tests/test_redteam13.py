"""Red team 13 (tests/fixtures/redteam/FINDINGS13.md), through the isolated path as `pytest weeks/NN` grades them,
several variants to a notebook (one per exercise cell), one student process each.

- Week 17: two-pass softmaxes and forwards whose first pass reads copies laundered by `resize_` to their own shape
  (grader.reads kept no addresses through a resize; now a resize keeps them, moved with the elements when it grows),
  and a row max found by `maximum(m, roll(m, 2^i))` over whole rows (an elementwise op's inputs were read only where
  their addresses were nowhere in the main input; now position by position).
- Week 19: paged attention that keeps every chunk's scores for a second pass (the long case has groups of 64 query
  heads, whose row of scores outweighs a row of keys, and a bound on it).
- Week 16: a RollingKVCache that ignores its dtype (fp16 and bf16 caches are checked).
- Week 21: a ServingLoop holding a re-entrant lock across the step (the front end's calls during the step now come from
  a thread of the student's process too) and one that empties its inbox after applying it (a submit made inside
  engine.add_request must run).
The honest variants written apart from the solution keep their credit.
"""
import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("_redteam_cells", Path(__file__).with_name("_redteam_cells.py"))
_spec.loader.exec_module(_cells := importlib.util.module_from_spec(_spec))
_load, _check = _cells.load, _cells.check

VISITED = r"was visited \d+ times"
WRONG = {  # a notebook each: {exercise: (variant, what the failure says)}
    "16": {"RollingKVCache": ("v13/w16_rolling_ignores_dtype.py", r"a float16 RollingKVCache.* has nbytes \d+; expected")},
    "17a": {"online_softmax": ("v13/w17_online_softmax_laundered_two_pass.py", VISITED),
            "flash_attention_forward": ("v13/w17_forward_laundered_two_pass.py", VISITED)},
    "17b": {"online_softmax": ("v13/w17_online_softmax_roll_doubling.py", VISITED)},
    "19": {"paged_attention": ("v13/w19_paged_stored_scores_two_pass.py", r"case 4: .*allocated \d+ bytes at peak")},
    "21a": {"ServingLoop": ("v13/w21_servingloop_rlock_across_step.py",
                            r"did not return within 5 s: does your loop hold a lock across the whole run_once")},
    "21b": {"ServingLoop": ("v13/w21_servingloop_clear_before_step.py",
                            r"submit\('third'\), made while run 0 was handing 'first' to the engine")},
}
HONEST = {  # a notebook each: {exercise: variant}
    "16": {"RollingKVCache": "v13/w16_rolling_honest.py"},
    "17": {"online_softmax": "v13/w17_online_softmax_honest.py"},
    "19": {"paged_attention": "v13/w19_paged_honest.py"},
    "21": {"ServingLoop": "v13/w21_servingloop_honest.py"},
}


@pytest.mark.parametrize("key", sorted(WRONG))
def test_round_13_wrong_routes_fail(tmp_path, key):
    week = key[:2]
    ex = _load(tmp_path, week, {name: variant for name, (variant, _) in WRONG[key].items()})
    try:
        for name, (_, message) in WRONG[key].items():
            with pytest.raises(AssertionError, match=message):
                _check(week, name, ex)
    finally:
        ex.close()


@pytest.mark.parametrize("week", sorted(HONEST))
def test_round_13_honest_variants_pass(tmp_path, week):
    ex = _load(tmp_path, week, HONEST[week])
    try:
        for name in HONEST[week]:
            _check(week, name, ex)
    finally:
        ex.close()
