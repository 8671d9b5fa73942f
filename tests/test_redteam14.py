"""Red team 14 (tests/fixtures/redteam/FINDINGS14.md, FINDINGS14b.md), through the isolated path as `pytest weeks/NN`
grades them, several variants to a notebook (one per exercise cell), one student process each.

Round 14 (weeks 18 and 20):
- verify, tree_accept and speculative_sample drawing the residual, the bonus, the fallback or the draft from the top
  64 tokens: the widest law case had 64 tokens. The wide cases now spread over SmolLM2's 49,152 tokens, tested in
  groups of tokens by rank (grader.checks.week18_law.rank_groups).
- tree_accept exact up to three children, wrong from the fourth, with no branch a `ran` rule sees: the tree cases now
  include four children.
Round 14b (weeks 16 and 17):
- two-pass softmaxes and forwards whose first pass reads a copy made through a complex view (each element paired with
  a zero) or written by index_put_ into a destination whose rows overlap: grader.reads gave a wide element the first
  address it covers (the zero's, none) and dropped an overlapping write's addresses. Now an op reads every address a
  wide element covers and its result carries the last; an overlapping write keeps its addresses and is read.
- an fp16/bf16 RollingKVCache keeping float32 buffers behind an `nbytes` worked out for the dtype: what the cache
  reaches is now compared with a float32 cache's.
The honest variants written apart from the solution keep their credit.
"""
import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("_redteam_cells", Path(__file__).with_name("_redteam_cells.py"))
_spec.loader.exec_module(_cells := importlib.util.module_from_spec(_spec))

VISITED = r"was visited \d+ times|was read by \d+ ops"
WIDE = r"case '(a )?wide vocabulary'.*rank"
WRONG = {  # a notebook each: {exercise: (variant, what the failure says)}
    "18a": {"verify": ("v14/w18_verify_top64_residual.py", WIDE),
            "tree_accept": ("v14/w18_tree_accept_top64_fallback.py", WIDE)},
    "18b": {"tree_accept": ("v14/w18_tree_accept_exact_to_3_children.py", "case 'four children'"),
            "speculative_sample": ("v14/w18_speculative_sample_top64.py", r"case 'a wide vocabulary'.*draft's ranks")},
    "16": {"RollingKVCache": ("v14b/w16_rolling_float32_buffers_nbytes_formula.py",
                              "must be half of the float32 ones")},
    "17a": {"online_softmax": ("v14b/w17_online_softmax_complex_two_pass.py", VISITED),
            "flash_attention_forward": ("v14b/w17_forward_complex_two_pass.py", VISITED)},
    "17b": {"online_softmax": ("v14b/w17_online_softmax_overlap_two_pass.py", VISITED),
            "flash_attention_forward": ("v14b/w17_forward_overlap_two_pass.py", VISITED)},
}
HONEST = {  # a notebook each: {exercise: variant}
    "18": {"verify": "v14/w18_verify_honest_mine.py", "tree_accept": "v14/w18_tree_accept_honest_mine.py"},
    "17": {"online_softmax": "v14b/w17_online_softmax_honest.py"},
}  # (the round's honest week-19 and week-20 variants passed checks this round did not change: FINDINGS14*.md)


@pytest.mark.parametrize("key", sorted(WRONG))
def test_round_14_wrong_routes_fail(tmp_path, key):
    _cells.wrong_routes_fail(tmp_path, key[:2], WRONG[key])


@pytest.mark.parametrize("week", sorted(HONEST))
def test_round_14_honest_variants_pass(tmp_path, week):
    _cells.honest_pass(tmp_path, week, HONEST[week])
