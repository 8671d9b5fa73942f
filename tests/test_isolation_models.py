"""The checks' models are shared by every submission a grading worker sees: the notebook's code, in its isolated
process, may run them and read their weights but never change them (else the next student is graded against a
broken model). Fast: a tiny model and one child process."""
import pytest
import torch

from grader.isolation import Session
from lib.modeling.llama import tiny_model

HOSTILE = '''
import torch

def run(model, ids):
    return model(ids)

def read(model):
    return sum(p.numel() for p in model.parameters()), model.config.n_layers, model.embed.weight.shape

def to_half(model):
    model.half()

def replace_layer(model):
    model.layers[0] = model.layers[1]

def set_norm(model):
    model.norm = None

def hook(model):
    model.register_forward_hook(lambda *a: None)

def zero_copy(model):
    model.embed.weight.zero_()  # a copy: the weights cross by value
'''


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    s = Session(tmp_path_factory.mktemp("nb") / "hostile.ipynb")
    s.load([(0, None, HOSTILE)])
    yield s
    s.close()


def test_models_run_and_read_but_never_change(session):
    model = tiny_model(seed=0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ids = torch.randint(0, model.config.vocab_size, (1, 5), generator=torch.Generator().manual_seed(0))
    expected = model(ids)
    torch.testing.assert_close(session.get("run")(model, ids), expected, atol=0, rtol=0)
    n, layers, shape = session.get("read")(model)
    assert (n, layers, tuple(shape)) == (sum(p.numel() for p in model.parameters()), model.config.n_layers,
                                         tuple(model.embed.weight.shape))
    for name in ("to_half", "replace_layer", "set_norm", "hook"):
        with pytest.raises(AttributeError, match="read-only to the notebook's code"):
            session.get(name)(model)
    session.get("zero_copy")(model)
    after = model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert model.embed.weight.dtype == torch.float32 and not model._forward_hooks and model.norm is not None
    torch.testing.assert_close(model(ids), expected, atol=0, rtol=0)


CHANGERS = '''
import torch

def scale(k):
    k.mul_(2)
    return k.sum()

def through_data(k):
    k.data[0] = 7.0
    return 1

def keyword(k, *, v):
    v.zero_()
    return k.sum()

def grow(k):
    k.resize_(k.numel() + 1)
    return 0

def pure(k):
    return (k * 2).sum()
'''


def test_a_tensor_argument_changed_in_place_fails_the_call_and_the_callers_tensor_is_kept(tmp_path):
    """In one process a check sees its argument changed by comparing with a clone; across the boundary the
    child compares bits before and after and the call fails with ArgumentChanged — the caller's tensor (maybe a
    worker's cached input, shared with the next submission) is never written."""
    from grader.isolation import ArgumentChanged

    s = Session(tmp_path / "changers.ipynb")
    s.load([(0, None, CHANGERS)])
    try:
        k = torch.tensor([1.0, float("nan"), -0.0, 3.0])
        kept = k.clone()
        for name, call, what in [("scale", lambda f: f(k), "argument 1 (a (4,) float32 tensor)"),
                                 ("through_data", lambda f: f(k), "argument 1"),
                                 ("keyword", lambda f: f(k, v=k.clone()), "argument `v`"),
                                 ("grow", lambda f: f(k), "now (5,) float32")]:
            with pytest.raises(ArgumentChanged, match="in place") as e:
                call(s.get(name))
            assert what in str(e.value), (name, str(e.value))
            assert torch.equal(k.view(torch.int32), kept.view(torch.int32)), name  # NaN and -0.0 bit for bit
        assert float(s.get("pure")(torch.arange(3.0))) == 6.0  # unchanged arguments (NaN included) pass
        assert torch.isnan(s.get("pure")(k))
    finally:
        s.close()
