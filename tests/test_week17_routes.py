"""Week 17's wrong routes and honest variants (tests/week17_variants.py) through the isolated path `pytest weeks/17`
takes: the solution notebook with an exercise cell replaced, loaded in the confined child, the check in this process.

Each wrong route must fail its exercise, with the words its rejection says; each honest variant must pass. The
routes are those issue 54 names for week 17 — a function that does block-shaped work with wrong numbers while
observed and SDPA, torch.softmax or naive attention otherwise (the checks judged numbers from calls they did not
observe), a tiled forward right only where the blocks divide the lengths, two passes over the key blocks or the
chunks (no read count), a row of scores kept per query block — and honest work the memory rule used to fail (the
paper's Algorithm 1 order, per-block outputs concatenated). To keep the cost down, one notebook carries a variant
of several exercises at once (each variant stands alone: it calls no other exercise's function).
"""
from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

from grader.checks import week17 as checks
from grader.harness import load_exercises, with_cell_source

REPO = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("week17_variants", Path(__file__).with_name("week17_variants.py"))
VARIANTS = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(VARIANTS)

# Notebooks: {exercise: route} — a route of VARIANTS.WRONG or VARIANTS.HONEST for each exercise edited.
WRONG_NOTEBOOKS = [
    {"flash_attention_forward": "junk when observed, the whole matrix otherwise",
     "online_softmax": "junk when observed, torch.softmax otherwise", "flash_decode": "junk when observed, SDPA otherwise",
     "naive_attention": "junk when observed, SDPA otherwise",
     "flash_attention_backward": "zeros from blocks when observed, the whole matrix otherwise",
     "FlashAttention": "naive forward, autograd backward"},
    {"flash_attention_forward": "the whole matrix unless the blocks divide the lengths",
     "online_softmax": "max pass, then sum pass", "flash_decode": "a global max pass over the splits first",
     "FlashAttention": "P in blocks on ctx"},
    {"flash_attention_forward": "two passes over the key blocks", "online_softmax": "two passes on a copy",
     "FlashAttention": "P in blocks in a global"},
    {"flash_attention_forward": "two passes in algorithm 1 order", "online_softmax": "two passes on a laundered copy"},
    {"flash_attention_forward": "a row of scores per query block"},
]
HONEST_NOTEBOOKS = [
    {"flash_attention_forward": "algorithm 1 order", "online_softmax": "exponentials kept and rescaled",
     "flash_decode": "a small score matrix per split"},
    {"flash_attention_forward": "outputs concatenated", "online_softmax": "running logsumexp"},
    {"flash_attention_forward": "one flat loop over block pairs"},
]
_LOADED: dict = {}


def _notebook(tmp_path_factory, kind: str, i: int):
    """The solution with the cells of notebook `i` of `kind` ("wrong" or "honest") replaced, loaded once."""
    key = (kind, i)
    if key not in _LOADED:
        routes = (WRONG_NOTEBOOKS if kind == "wrong" else HONEST_NOTEBOOKS)[i]
        path = next((REPO / "solutions" / "17").glob("*.ipynb"))
        nb = json.loads(path.read_text())
        for name, route in routes.items():
            source = VARIANTS.WRONG[name][route][0] if kind == "wrong" else VARIANTS.HONEST[name][route]
            nb = with_cell_source(nb, name, source)
        out = tmp_path_factory.mktemp(f"w17-{kind}-{i}") / path.name
        out.write_text(json.dumps(nb))
        _LOADED[key] = load_exercises(out)
    return _LOADED[key]


@pytest.mark.parametrize("i, name", [(i, name) for i, nb in enumerate(WRONG_NOTEBOOKS) for name in nb])
def test_a_wrong_route_fails_in_the_child(tmp_path_factory, i, name):
    route = WRONG_NOTEBOOKS[i][name]
    says = VARIANTS.WRONG[name][route][1]
    ex = _notebook(tmp_path_factory, "wrong", i)
    with pytest.raises(AssertionError) as failed:
        getattr(checks, f"check_{name}")(getattr(ex, name))
    assert re.search(says, str(failed.value)), f"{name}, {route}: rejected, but for another reason: {failed.value}"


@pytest.mark.parametrize("i, name", [(i, name) for i, nb in enumerate(HONEST_NOTEBOOKS) for name in nb])
def test_an_honest_variant_passes_in_the_child(tmp_path_factory, i, name):
    ex = _notebook(tmp_path_factory, "honest", i)
    getattr(checks, f"check_{name}")(getattr(ex, name))


def test_every_named_route_runs_in_the_child():
    """Each of week17_variants' routes is one of these notebooks' cells (and so runs through the isolated path)."""
    wrong = {(name, route) for nb in WRONG_NOTEBOOKS for name, route in nb.items()}
    honest = {(name, route) for nb in HONEST_NOTEBOOKS for name, route in nb.items()}
    assert wrong == {(name, route) for name, routes in VARIANTS.WRONG.items() for route in routes}
    assert honest == {(name, route) for name, routes in VARIANTS.HONEST.items() for route in routes}


# Red team #33: one online-softmax pass over the chunks in sequence, a chunk as its key block — no split is computed
# on its own, nothing is merged. Every product is a chunk wide, so only the splits' independence tells it apart
# (grader.reach: reading V_j with probabilities shifted by the running max of the chunks before j).
DECODE_SEQUENTIAL = '''
def flash_decode(q, k, v, n_splits=4):
    """No split-K: one sequential online-softmax pass whose key block is a chunk's size (nothing to merge)."""
    chunk = max(1, -(-k.shape[2] // n_splits))
    return flash_attention_forward(q, k, v, block_q=max(1, q.shape[2]), block_k=chunk)[0]
'''


def test_one_sequential_pass_is_not_split_k(tmp_path):
    path = next((REPO / "solutions" / "17").glob("*.ipynb"))
    out = tmp_path / path.name
    out.write_text(json.dumps(with_cell_source(json.loads(path.read_text()), "flash_decode", DECODE_SEQUENTIAL)))
    ex = load_exercises(out)
    try:
        with pytest.raises(AssertionError, match="depend on .* keys, more than the .* one split holds"):
            checks.check_flash_decode(ex.flash_decode)
    finally:
        ex.close()
