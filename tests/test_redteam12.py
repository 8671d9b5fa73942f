"""Red team 12 and 12b (tests/fixtures/redteam/FINDINGS12.md, FINDINGS12b.md), through the isolated path as
`pytest weeks/NN` grades them, several variants to a notebook (one per exercise cell), one student process each.

- Doors to a tensor's memory round 11's fixes left: a storage made by `UntypedStorage.from_buffer` (a C static
  method, which skipped the storage base's `__new__`: now a storage the notebook holds, `grader.host_budget.HANDLED`),
  read out by `torch.save`; `_set_from_file` handing a Python object's `readinto` a memoryview of the storage's own
  memory (now: a real file or an `io.BytesIO` only, `grader.raw_memory`), which carried gqa_attention, a rolling
  cache's history, flash_decode and paged_attention into numpy; `torch.from_dlpack` over a numpy array (now memory
  both sides see, `EXPORTED`).
- Code that tells a call under a dispatch mode (every call the checks make) from a notebook's: the dispatch stack's
  length and the dispatch keys in effect are watched like the modes themselves (`grader.child_guard`).
- Week 18: a batched loop that keeps a row's state by its prompt, or writes one token for a row asked for none (a
  batch with two rows of one prompt and rows asked for 0-2 tokens); tree_accept drawing from a generator of its own
  when given none (half of the 60 calls observed, each replayed from the global state it began with).
- Week 20: a Q4_K quantizer that writes zeros for the super-blocks whose search has a tie (a bound of their own).
The honest variants written apart from the solution keep their credit.
- Week 21: a ServingLoop that reads its queue before the step and empties it after (a submission made during the step
  is lost), and one that holds its lock across the whole step (the front end waits for every step): the check makes a
  submit and a cancel while run_once is inside engine.step() (`grader.checks.week21_during`).
- A call that never returns (red team 11b's exhaustive allocate_bits on 210 units) fails saying why, not only that the
  call time limit stopped it.
(Checked by hand, not here, for its cost: verify with a generator of its own, the same replay rule as tree_accept's, in
a check that takes a minute isolated.)
"""
import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("_redteam_cells", Path(__file__).with_name("_redteam_cells.py"))
_spec.loader.exec_module(_cells := importlib.util.module_from_spec(_spec))
_load, _check = _cells.load, _cells.check

WRONG = {  # a notebook each: {exercise: (variant, what the failure says)}
    "16a": {"gqa_attention": ("v12b/w16_gqa_readinto_memview.py", "_set_from_file reads only a real file or an io.BytesIO"),
            "RollingKVCache": ("v12b/w16_rolling_numpy_readinto.py", "_set_from_file reads only a real file")},
    "16b": {"gqa_attention": ("v12b/w16_gqa_from_buffer_torch_save.py", "numbers out of torch .*a storage object the "
                                                                       "notebook holds")},
    "16c": {"gqa_attention": ("v12b/w16_gqa_from_dlpack_numpy.py", "numbers out of torch .*from_dlpack")},
    "16d": {"gqa_attention": ("v12b/w16_gqa_observed_only_nobranch.py", "called torch._C._len_torch_dispatch_stack"),
            "causal_mask": ("v12b/w16_causal_mask_honest.py", None)},
    "17": {"flash_decode": ("v12b/w17_flashdecode_readinto_memview.py", "_set_from_file reads only a real file")},
    "18": {"batched_speculative_generate": ("v12/w18_batched_keyed_by_prompt.py", r"row \d: returned \d+ ids"),
           "tree_accept": ("v12/w18_tree_accept_private_default_generator.py", "the random state it is given")},
    "18b": {"batched_speculative_generate": ("v12/w18_batched_zero_tokens_writes_one.py", r"row \d: returned \d+ ids")},
    "19": {"paged_attention": ("v12b/w19_paged_readinto_memview.py", "_set_from_file reads only a real file")},
    "20": {"quantize_q4_k": ("v12/w20_q4k_zero_tied_blocks.py", "super-block\\(s\\) whose search has a tie")},
    "21": {"ServingLoop": ("v12b/w21_servingloop_no_lock.py", r"submit\('second'\), made while run 0 was inside "
                                                              r"engine.step\(\), gave nothing at run 1")},
    "21b": {"ServingLoop": ("v12l/w21_servingloop_lock_across_step.py",  # (a thread of the student's process waits 5 s)
                            r"took 0.2 s or more: does your loop hold a lock across the whole run_once")},
}
HONEST = {  # a notebook each: {exercise: variant}
    "16": {"gqa_attention": "v12b/w16_gqa_honest.py", "causal_mask": "v12b/w16_causal_mask_honest.py"},
    "18": {"batched_speculative_generate": "v12/w18_batched_honest_guarded.py"},  # h2: guards for an empty batch, a row asked for none
    "20": {"quantize_q4_k": "v12/w20_q4k_honest.py", "gptq_quantize": "v12/w20_gptq_honest.py",
           "awq_quantize": "v12/w20_awq_honest.py"},
    "21": {"TextStream": "v12b/w21_textstream_honest.py", "predict_ttft": "v12b/w21_predict_ttft_honest.py"},
}


@pytest.mark.parametrize("key", sorted(WRONG))
def test_round_12_wrong_routes_fail(tmp_path, key):
    _cells.wrong_routes_fail(tmp_path, key[:2], WRONG[key])


@pytest.mark.parametrize("week", sorted(HONEST))
def test_round_12_honest_variants_pass(tmp_path, week):
    _cells.honest_pass(tmp_path, week, HONEST[week])



NEVER_RETURNS = {  # week: (exercise, variant, what the failure says)
    "20": ("allocate_bits", "v11b/w20_allocate_bits_exhaustive.py",  # red team 11b's #5
           r"210 units\) did not return .*a search over every subset takes 2\^210 steps"),
}


@pytest.mark.parametrize("week", sorted(NEVER_RETURNS))
def test_a_call_that_never_returns_fails_saying_why(tmp_path, monkeypatch, week):
    """An exhaustive allocate_bits never returns on 210 units. The call time limit stops it (15 s here) and the check
    says why, not only that time ran out."""
    monkeypatch.setenv("INFERENCE_LAB_CALL_TIMEOUT", "15")
    name, variant, message = NEVER_RETURNS[week]
    ex = _load(tmp_path, week, {name: variant})
    try:
        with pytest.raises(AssertionError, match=message):
            _check(week, name, ex)
    finally:
        ex.close()
