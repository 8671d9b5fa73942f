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
Round 13b (FINDINGS13b.md): a write through a uint8 view of a copy's spare element wiped the read map of its whole
storage (now only the elements it covers); paged attention and flash_decode with no max at all, in float64 (one
score of 1000 per head); a scheduler that shares a running prefill's budget with later arrivals; a ServingLoop that
empties its inbox after the aborts, and one whose front end waits out the step's lock with a timeout (a front-end
call must take under 0.2 s; a submit is made inside engine.abort too). (Paged attention in float64 with no max,
v13b/w19_paged_float64_no_max.py, is not run here: it runs past the call time limit in the long case first; the
large-score case is tested in test_the_large_score_cases_defeat_a_float64_exp_with_no_max.)
The honest variants written apart from the solution keep their credit.
"""
import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("_redteam_cells", Path(__file__).with_name("_redteam_cells.py"))
_spec.loader.exec_module(_cells := importlib.util.module_from_spec(_spec))


VISITED = r"was visited \d+ times"
WRONG = {  # a notebook each: {exercise: (variant, what the failure says)}
    "16": {"RollingKVCache": ("v13/w16_rolling_ignores_dtype.py", r"a float16 RollingKVCache.* has nbytes \d+; expected")},
    "17a": {"online_softmax": ("v13/w17_online_softmax_laundered_two_pass.py", VISITED),
            "flash_attention_forward": ("v13/w17_forward_laundered_two_pass.py", VISITED)},
    "17b": {"online_softmax": ("v13/w17_online_softmax_roll_doubling.py", VISITED)},
    "19": {"paged_attention": ("v13/w19_paged_stored_scores_two_pass.py", r"case 4: .*allocated \d+ bytes at peak")},
    "21a": {"ServingLoop": ("v13/w21_servingloop_rlock_across_step.py",
                            r"took 0.2 s or more: does your loop hold a lock across the whole run_once")},
    "21b": {"ServingLoop": ("v13/w21_servingloop_clear_before_step.py",
                            r"submit\('third'\), made while run 0 was handing 'first' to the engine")},
    # round 13b (FINDINGS13b.md)
    "17c": {"online_softmax": ("v13b/w17_online_softmax_byte_view_two_pass.py", VISITED),
            "flash_attention_forward": ("v13b/w17_forward_byte_view_two_pass.py", VISITED),
            "flash_decode": ("v13b/w17_flash_decode_float64_no_max.py", "one score of 1000 per head")},
    "19b": {"schedule": ("v13b/w19_schedule_fair_share.py", r"running request \d+ gets \d+ tokens")},
    "21c": {"ServingLoop": ("v13b/w21_servingloop_clear_after_aborts.py", r"submit\('fourth'\), made while run 2")},
    "21d": {"ServingLoop": ("v13b/w21_servingloop_lock_timeout.py", r"took 0.2 s or more")},
}
HONEST = {  # a notebook each: {exercise: variant}
    "16": {"RollingKVCache": "v13/w16_rolling_honest.py"},
    "17": {"online_softmax": "v13/w17_online_softmax_honest.py"},
    "19": {"paged_attention": "v13/w19_paged_honest.py", "schedule": "v13b/w19_schedule_honest.py"},
    "21": {"ServingLoop": "v13/w21_servingloop_honest.py"},
}


@pytest.mark.parametrize("key", sorted(WRONG))
def test_round_13_wrong_routes_fail(tmp_path, key):
    _cells.wrong_routes_fail(tmp_path, key[:2], WRONG[key])


@pytest.mark.parametrize("week", sorted(HONEST))
def test_round_13_honest_variants_pass(tmp_path, week):
    _cells.honest_pass(tmp_path, week, HONEST[week])


def test_the_large_score_cases_defeat_a_float64_exp_with_no_max():
    """One score of 1000 (grader.checks.week17.one_score, week19_sim.paged_one_score): attention computed with the
    max is finite and one-hot where the score is; exp of the raw scores in float64 overflows."""
    import torch

    from grader.checks import generator
    from grader.checks.week17 import one_score
    from grader.checks.week19_sim import contiguous_reference, paged_case, paged_one_score

    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 2, 1, 16, generator=g), torch.randn(1, 2, 61, 16, generator=g)
    s = (q.double() @ one_score(q, k, 1000.0, g).double().transpose(-1, -2)) / 4.0
    assert torch.allclose(s.amax(-1), torch.full((1, 2, 1), 1000.0, dtype=torch.float64), atol=1e-3)
    assert not torch.isfinite(s.exp().sum(-1)).all() and torch.isfinite(torch.softmax(s, -1)).all()
    c = paged_case(generator(5), 3, 32)
    q, k_pool, v_pool, tables, lens = paged_one_score(c, 1000.0, g)
    out = contiguous_reference(q, k_pool, v_pool, c["tables"], c["lens"])
    assert torch.isfinite(out).all()
    group = c["h"] // c["hkv"]
    for i, (table, n) in enumerate(zip(c["tables"], c["lens"])):
        keys = torch.cat([k_pool[b] for b in table], 1)[:, :n]  # [hkv, n, d]
        scores = torch.einsum("hd,hnd->hn", q[i, ::group].double(), keys.double()) / q.shape[-1] ** 0.5
        assert float(scores.amax()) >= 999.0 and not torch.isfinite(scores.exp().sum(-1)).all()
