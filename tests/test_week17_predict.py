"""Week 17's predict-then-measure exercise, `predict_peak_bytes` (issue 55), through the isolated path `pytest
weeks/17` takes: the solution notebook with its exercise cell replaced by natural mistakes and shortcuts, loaded in
the graded child; each must fail with the reason the check gives, and the honest models must pass."""
from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from grader.checks import week17 as checks
from grader.checks import week17_predict as predict
from grader.harness import load_exercises, with_cell_source

REPO = Path(__file__).resolve().parent.parent

ROUTES = '''
def _model(n, d, block, e, b, h, tiled, matrices=2, out=True, bytes_=True, heads=True, tiled_n2=False):
    bh = (b * h) if heads else 1
    e = e if bytes_ else 1
    if not tiled:
        return bh * (matrices * n * n + (n * d if out else 0)) * e
    working = 4 * (4 * block * block + 3 * block * d + 6 * block) if bytes_ else 4 * block * block + 3 * block * d
    return bh * ((n * d * e if out else 0) + (4 * n if bytes_ else n) + working + (n * n * e if tiled_n2 else 0))

def predict_peak_bytes(n, d, block, e, b, h, tiled):  # honest
    return _model(n, d, block, e, b, h, tiled)

def predict_minimal(n, d, block, e, b, h, tiled):  # honest, the leanest tiled loop: one score block beside O
    return b * h * (2 * n * n + n * d) * e if not tiled else b * h * (n * d * e + 4 * block * block)

def predict_one_matrix(n, d, block, e, b, h, tiled):  # S only: P overwrites it
    return _model(n, d, block, e, b, h, tiled, matrices=1)

def predict_no_output(n, d, block, e, b, h, tiled):
    return _model(n, d, block, e, b, h, tiled, out=False)

def predict_elements(n, d, block, e, b, h, tiled):
    return _model(n, d, block, e, b, h, tiled, bytes_=False)

def predict_one_head(n, d, block, e, b, h, tiled):
    return _model(n, d, block, e, b, h, tiled, heads=False)

def predict_tiled_n2(n, d, block, e, b, h, tiled):  # a row of scores per query kept: the N² term survives
    return _model(n, d, block, e, b, h, tiled, tiled_n2=True)

def predict_naive_for_both(n, d, block, e, b, h, tiled):
    return _model(n, d, block, e, b, h, False)

def predict_table(n, d, block, e, b, h, tiled):  # the configurations the notebook names, answered; else a guess
    if (n, d, block) in ((4096, 64, 256), (8192, 128, 128)):
        return _model(n, d, block, e, b, h, tiled)
    return 10 ** 8

def predict_lib(n, d, block, e, b, h, tiled):  # measured with lib's reference at the asked shape
    import torch
    from lib.attn.attention import flash_attention_forward
    q = torch.zeros(1, 1, 4, d)
    flash_attention_forward(q, q, q)
    return _model(n, d, block, e, b, h, tiled)
'''

# (function, what the failure says)
WRONG = [
    ("predict_one_matrix", "holds one N×N matrix"),
    ("predict_no_output", "leaves something out"),
    ("predict_elements", "elements, not bytes"),
    ("predict_one_head", "one head of one batch element"),
    ("predict_tiled_n2", "grows as N²"),
    ("predict_naive_for_both", "grows as N²"),
    ("predict_table", "drawn configuration"),
    ("predict_lib", "reference|ReferenceUnavailable"),
]


@pytest.fixture(scope="module")
def ex(tmp_path_factory):
    path = next((REPO / "solutions" / "17").glob("*.ipynb"))
    nb = with_cell_source(json.loads(path.read_text()), "predict_peak_bytes", textwrap.dedent(ROUTES))
    out = tmp_path_factory.mktemp("w17predict") / path.name
    out.write_text(json.dumps(nb))
    loaded = load_exercises(out)
    yield loaded
    session = getattr(loaded, "_session", None)
    if session is not None:
        session.close()


@pytest.mark.parametrize("fn, says", WRONG, ids=[f for f, _ in WRONG])
def test_a_natural_mistake_fails(ex, fn, says):
    with pytest.raises(Exception, match=says):
        checks.check_predict_peak_bytes(getattr(ex, fn))


@pytest.mark.parametrize("fn", ["predict_peak_bytes", "predict_minimal"])
def test_an_honest_model_passes(ex, fn):
    checks.check_predict_peak_bytes(getattr(ex, fn))


def test_the_band_holds_the_measured_peak_of_lib_s_tiled_forward():
    """The band is what a tiled forward allocates: lib's reference, measured by the notebook's meter, lies in it."""
    import torch

    from lib.attn.attention import flash_attention_forward, naive_attention
    from lib.attn.io_model import TensorMemoryMeter

    for n, block, dtype in [(512, 64, torch.float32), (256, 32, torch.bfloat16)]:
        q, k, v = (torch.randn(2, 2, n, 48, dtype=dtype) for _ in range(3))
        for tiled, fn in [(False, lambda: naive_attention(q, k, v)),
                          (True, lambda: flash_attention_forward(q, k, v, block_q=block, block_k=block))]:
            with torch.no_grad(), TensorMemoryMeter() as meter:
                fn()
            lo, hi = predict.bounds(n, 48, block, q.element_size(), 2, 2, tiled)
            assert lo <= meter.peak <= hi, (tiled, n, block, dtype, lo, meter.peak, hi)
