"""Red-team round 7, #15, #16 and #19 (FINDINGS7.md, mechanisms 3 and 4), through the isolated path as `pytest
weeks/16` grades them:
- #15: a RollingKVCache that keeps every chunk appended in a list (its ring written as a decoy) earned full credit:
  only what each append allocates was metered. Now what the cache object keeps (`grader.held`: the bytes it
  reaches) is measured after every append of a stream of 40,000+ positions and may not grow with the stream.
- #16: a position counter in a torch.int16 tensor wraps at 32,768; the stream (drawn per run, 40,000 to 70,000
  positions in appends of thousands) compares `length` after every append.
- #19: a `generate` with a cache fixed at 128 positions and the prompt cut by `deque(..., maxlen=128 - n)`; a
  tiny-model prompt of 300 to 900 tokens (drawn per run) must be fed whole.
The honest variants (#14, #17, and tests/fixtures/honest's) keep their credit."""
import json
import subprocess
from pathlib import Path

import pytest
import torch

from grader.harness import load_exercises, with_cell_source
from grader.held import held_bytes

REPO = Path(__file__).resolve().parent.parent
V7 = REPO / "tests" / "fixtures" / "redteam" / "v7"
HONEST = REPO / "tests" / "fixtures" / "honest"


def _run(tmp_path, name, variant):
    from grader.checks import week16
    path = next((REPO / "weeks" / "16").glob("week*.ipynb"))
    text = subprocess.run(["git", "show", f"HEAD:{path.relative_to(REPO)}"], cwd=REPO, capture_output=True, text=True,
                          check=True).stdout
    target = tmp_path / path.name
    target.write_text(json.dumps(with_cell_source(json.loads(text), name, variant.read_text())))
    ex = load_exercises(target)
    try:
        if name == "generate":
            week16.check_generate(ex.generate, smollm2=False)  # the tiny models: the long prompt is among them
        else:
            week16.check_RollingKVCache(ex.RollingKVCache)
    finally:
        ex.close()


def test_a_rolling_cache_that_keeps_every_chunk_fails(tmp_path):
    with pytest.raises(AssertionError, match=r"the cache object now keeps [\d,]+ bytes more than after its first "
                                             r"append .* keep only the last `window` positions"):
        _run(tmp_path, "RollingKVCache", V7 / "w16_rolling_listhistory.py")


@pytest.mark.parametrize("variant", ["v9/w16_rolling_sparse_history.py", "v9/w16_rolling_module_history.py",
                                     "v9/w16_rolling_mmap_history.py", "v8/w16_rolling_imported_module_history.py",
                                     "v8/w16_rolling_class_history.py", "v10/w16_rolling_imported_module.py",
                                     "v10b/w16_rolling_resized_premade.py", "v10b/w16_rolling_sparse_history.py"])
def test_history_kept_in_sparse_tensors_a_module_or_mmaps_fails(tmp_path, variant):
    """Red team 9's #8-#10 (FINDINGS9.md): the history held where the walk did not count it (grader.held); and
    round 9's open route, the history on an imported module (`math`) or a class of torch's, where the walk never
    goes: what the observed appends made and something other than the grader keeps alive is counted; red team 10b:
    a tensor made in __init__ and grown by `resize_`, or chunks kept as sparse tensors, on `codecs` (the storages
    every op of an append read or wrote are counted too)."""
    # (the sparse ones now fail earlier: an op the observers cannot record is a verdict, checks.assert_classified)
    with pytest.raises(AssertionError, match=r"the cache object now keeps [\d,]+ bytes more than after its first|"
                                             r"on arguments the checks cannot record"):
        _run(tmp_path, "RollingKVCache", V7.parent / variant)


def test_a_rolling_cache_whose_count_wraps_fails(tmp_path):
    with pytest.raises(AssertionError, match=r"length is -\d+; it counts every position ever appended .*torch\.int16"):
        _run(tmp_path, "RollingKVCache", V7 / "w16_rolling_int16len.py")


def test_generate_with_a_cache_of_128_and_the_prompt_cut_by_a_deque_fails(tmp_path):
    with pytest.raises(AssertionError, match=r"first forward saw \d+ of the prompt's \d+ tokens: feed the whole prompt"):
        _run(tmp_path, "generate", V7 / "w16_generate_cache128_deque.py")


@pytest.mark.parametrize("variant", [V7 / "w16_rolling_honest.py", HONEST / "w16_RollingKVCache_b.py"],
                         ids=lambda p: p.stem)
def test_honest_rolling_caches_pass(tmp_path, variant):
    _run(tmp_path, "RollingKVCache", variant)


@pytest.mark.parametrize("variant", [V7 / "w16_generate_honest.py", HONEST / "w16_generate_a.py"], ids=lambda p: p.stem)
def test_honest_generates_pass(tmp_path, variant):
    _run(tmp_path, "generate", variant)


# --- grader.held: what an object reaches ---------------------------------------------------------------------------

_NOTEBOOK = '''
import torch
HISTORY = []
class Cache:
    shared = []
    def __init__(self, how):
        self.how, self.buf, self.mine = how, torch.zeros(1000), []
    def append(self, x):
        if self.how == "attribute":
            self.mine.append(x)
        elif self.how == "class":
            Cache.shared.append(x.clone())
        elif self.how == "global":
            HISTORY.append(x.numpy().copy())
        elif self.how == "floats":
            self.mine.extend(x.tolist())
        else:
            self.buf[:len(x)] = x
'''


@pytest.mark.parametrize("how", ["attribute", "class", "global", "floats"])
def test_held_bytes_sees_what_an_object_keeps_wherever_it_keeps_it(how):
    names = {"__name__": "notebook_under_test"}
    exec(compile(_NOTEBOOK, "<notebook>", "exec"), names)
    cache = names["Cache"](how)
    cache.append(torch.ones(10))
    before = held_bytes(cache.append)
    for _ in range(20):
        cache.append(torch.ones(1000))
    assert held_bytes(cache.append) - before >= 20 * 1000 * 4


def test_held_bytes_of_a_cache_that_keeps_nothing_does_not_grow():
    names = {"__name__": "notebook_under_test"}
    exec(compile(_NOTEBOOK, "<notebook>", "exec"), names)
    cache = names["Cache"]("ring")
    cache.append(torch.ones(10))
    before = held_bytes(cache.append)
    assert before >= 1000 * 4  # its buffer
    for _ in range(20):
        cache.append(torch.ones(1000))
    assert held_bytes(cache.append) == before
