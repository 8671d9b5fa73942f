"""Red team 11 and 11b (tests/fixtures/redteam/FINDINGS11.md, FINDINGS11b.md) and the lead's variants after them
(v11l/), through the isolated path as `pytest weeks/NN` grades them. Each notebook holds several variants, one per
exercise cell, so that one student process serves them all.

- Doors to a tensor's memory that round 10b's fixes did not name: a storage mapped from a file numpy maps too
  (`UntypedStorage.from_file`), torch's shared memory (`_new_shared`, `_share_fd_cpu_`), a storage's raw bytes
  written to Python (`_write_file`): each raises in the child now (`grader.raw_memory.close_storage_doors`); and a
  storage object the notebook's code makes or takes, whose bytes Python reads item by item, makes its memory count
  as numbers leaving torch (`grader.host_budget.HANDLED`).
- A rolling cache's history in files, or in numpy through those doors, or as MKL-DNN tensors (an op the observers
  cannot record is a verdict: `grader.checks.assert_classified`).
- No max subtracted: flash_decode's splits and paged_attention's chunks, on scores in the hundreds.
- A ServingLoop that applies cancels after the run's submissions, or keeps every id it was given; an allocator and a prefix cache that refuse a
  double free only on an empty pool; a scheduler that skips running requests in a step that preempts; tree_accept
  seeding its own generator when given none; a GGUF type table right for six types only.
The honest variants written apart from the solution keep their credit.
(Not here, checked by hand: an `allocate_bits` that tries every subset, which fails by the call time limit on the
210-unit case.)
"""
import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("_redteam_cells", Path(__file__).with_name("_redteam_cells.py"))
_spec.loader.exec_module(_cells := importlib.util.module_from_spec(_spec))
_load, _check = _cells.load, _cells.check


WRONG = {  # a notebook each: {exercise: (variant, what the failure says)}
    "16a": {"gqa_attention": ("v11/w16_gqa_shared_file.py", "storage method from_file is not available"),
            "RollingKVCache": ("v11/w16_rolling_history_in_files.py", "storage method from_file is not available")},
    "16b": {"gqa_attention": ("v11/w16_gqa_storage_write_file.py", "storage method _write_file is not available"),
            "RollingKVCache": ("v11/w16_rolling_numpy_on_module.py", "storage method from_file is not available")},
    "16c": {"gqa_attention": ("v11/w16_gqa_shared_fd.py", "storage method _new_shared is not available"),
            "RollingKVCache": ("v11/w16_rolling_mkldnn_history.py", "ran to_mkldnn.default on arguments the checks cannot "
                                                                   "record")},
    "16d": {"gqa_attention": ("v11l/w16_gqa_storage_peek.py", "numbers out of torch .*a storage object the notebook holds")},
    "16e": {"gqa_attention": ("v11l/w16_gqa_cell_storage_peek.py", "numbers out of torch .*a storage object the "
                                                                   "notebook holds")},
    "17": {"flash_decode": ("v11/w17_flashdecode_no_max.py", "flash_decode on large scores .*NaN or inf"),
           "merge_partials": ("v11/w17_merge_honest.py", None)},
    "18": {"tree_accept": ("v11b/w18_tree_accept_fixed_default_seed.py", "60 calls with generator=None")},
    "19": {"paged_attention": ("v11/w19_paged_no_running_max.py", "scores in the hundreds.*NaN or inf"),
           "BlockAllocator": ("v11b/w19_allocator_double_free.py", r"of a free block \(no one owns it; .* did not raise"),
           "PrefixCache": ("v11b/w19_prefix_cache_double_free.py", r"free\(\) of a free block \(block \d+ still owned\)"),
           "schedule": ("v11b/w19_schedule_skip_after_preempt.py", "got no tokens although the plan leaves")},
    "19b": {"paged_attention": ("v11/w19_paged_shared_file.py", "storage method from_file is not available")},
    "20": {"gguf_bytes": ("v11b/w20_gguf_bytes_partial_types.py", r"gguf_bytes\(")},
    "21": {"ServingLoop": ("v11/w21_servingloop_racy_unordered.py", r"cancel\('retry'\) then submit\('retry'\)")},
    "21b": {"ServingLoop": ("v11l/w21_servingloop_keeps_ids.py", r"the loop object reaches [\d,]+ bytes more than before")},
}
HONEST = {
    "18": ["v11b/w18_tree_accept_honest.py"],
    "19": ["v11/w19_paged_honest_online.py", "v11b/w19_prefix_cache_honest.py", "v11b/w19_schedule_honest.py"],
    "20": ["v11b/w20_gguf_bytes_honest.py", "v11b/w20_allocate_bits_honest.py"],
    "21": ["v11/w21_servingloop_honest.py"],
}
_HONEST_NAMES = {"w18_tree_accept_honest": "tree_accept", "w19_paged_honest_online": "paged_attention",
                 "w19_prefix_cache_honest": "PrefixCache", "w19_schedule_honest": "schedule",
                 "w20_gguf_bytes_honest": "gguf_bytes", "w20_allocate_bits_honest": "allocate_bits",
                 "w21_servingloop_honest": "ServingLoop"}


@pytest.mark.parametrize("key", sorted(WRONG))
def test_round_11_wrong_routes_fail(tmp_path, key):
    week = key[:2]
    cells = {name: variant for name, (variant, _) in WRONG[key].items()}
    ex = _load(tmp_path, week, cells)
    try:
        for name, (_, message) in WRONG[key].items():
            if message is None:  # an honest helper the route calls (it passes)
                _check(week, name, ex)
                continue
            with pytest.raises(AssertionError, match=message):  # (a cell that raises at load: ExerciseMissing, one too)
                _check(week, name, ex)
    finally:
        ex.close()


@pytest.mark.parametrize("week", sorted(HONEST))
def test_round_11_honest_variants_pass(tmp_path, week):
    cells = {_HONEST_NAMES[Path(v).stem]: v for v in HONEST[week]}
    ex = _load(tmp_path, week, cells)
    try:
        for name in cells:
            _check(week, name, ex)
    finally:
        ex.close()
