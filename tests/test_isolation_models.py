"""The checks' models are shared by every submission a grading worker sees: the notebook's code, in its isolated
process, may run them and read their weights but never change them (else the next student is graded against a
broken model). Fast: a tiny model and one child process."""
import pytest
import torch

from grader.isolation import Session
from lib.model import tiny_model

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
