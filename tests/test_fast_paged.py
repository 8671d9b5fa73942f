"""lib.batching.fast_paged: the engine's decode-only steps as CUDA graphs (issue 31, item 3).

On the CPU the replayed step's code runs uncaptured (`PagedDecodeGraphs(capture=False)`), with the same padding of
the batch and of the block tables a graph replays, inside the engine, against `lib.modeling.generate` on each prompt alone.
On a GPU the engine captures by itself (`graphs=None`), and the CUDA-marked tests check the same."""
import random

import pytest
import torch

import lib.batching.fast_paged as fast_paged
from lib.batching.engine import LLMEngine
from lib.modeling.fast import FastLlama
from lib.batching.fast_paged import PagedDecodeGraphs
from lib.modeling.generate import generate
from lib.modeling.llama import tiny_model


def _prompts(n, seed=0, vocab=128):
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(rng.randrange(1, 30))] for _ in range(n)]


def _alone(model, prompts, new):
    return [generate(model, torch.tensor([p], device=model.device), new)[0, len(p):].tolist() for p in prompts]


def _uncaptured(engine, checked=None):
    """The engine's replayed step, uncaptured; with `checked` (a list), each replayed step's logits are also
    compared with lib.modeling.llama's forward on the same cache, after the replayed code wrote its keys and values (a
    key written to the wrong slot is then read back at once). Greedy tokens of a tiny random model repeat
    themselves, so the logits say more than the tokens."""
    graphs = PagedDecodeGraphs(FastLlama(engine.model, packed=False), engine.cache, capture=False)
    engine.runner.graphs = graphs
    if checked is None:
        return graphs
    decode = graphs.decode

    def both(ids, starts, tables):
        got = decode(ids, starts, tables)
        if got is not None:
            engine.cache.prepare(tables, starts, [1] * len(ids))
            engine.cache.logits_rows = torch.arange(len(ids), device=engine.cache.device)
            want = engine.model(torch.tensor([ids], device=engine.cache.device), cache=engine.cache)[0]
            engine.cache.positions = engine.cache.logits_rows = None
            torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
            checked.append(len(ids))
        return got

    graphs.decode = both
    return graphs


@pytest.mark.parametrize("blocks_bucket", [1, 16])
@pytest.mark.parametrize("kwargs", [
    dict(num_blocks=64, max_num_seqs=3),  # a batch of 3 padded to 4 rows
    dict(num_blocks=80, block_size=1, max_num_seqs=5),
    dict(num_blocks=14, block_size=4, max_num_batched_tokens=16),  # preemption and chunked prefill between decodes
    dict(num_blocks=10, block_size=8, max_num_seqs=4, max_num_batched_tokens=8, enable_prefix_caching=True),
])
@pytest.mark.parametrize("heads", [(4, 2), (4, 4), (6, 1)])
def test_replayed_engine_decode_is_generate_alone(kwargs, heads, blocks_bucket, monkeypatch):
    monkeypatch.setattr(fast_paged, "BLOCKS_BUCKET", blocks_bucket)
    n_heads, n_kv_heads = heads
    model = tiny_model(seed=1 + n_heads, n_heads=n_heads, n_kv_heads=n_kv_heads, d_model=48 if n_heads == 6 else 64)
    prompts = _prompts(9, seed=n_kv_heads)
    engine = LLMEngine(model, **kwargs)
    checked = []
    graphs = _uncaptured(engine, checked)
    assert engine.generate(prompts, 20) == _alone(model, prompts, 20)
    assert engine.blocks.num_in_use == 0
    decodes = sum(all(n == 1 for _, n in step) for step in engine.trace)
    assert len(checked) == decodes > 10 and max(checked) > 1  # every decode-only step, batched, replayed
    if blocks_bucket == 16:
        assert all(width % 16 == 0 or width == graphs.max_blocks for _, width in graphs.graphs)


def test_a_batch_beyond_the_last_bucket_runs_eagerly(monkeypatch):
    monkeypatch.setattr(fast_paged, "BATCH_BUCKETS", (1, 2))
    model = tiny_model(seed=3, n_heads=4, n_kv_heads=2)
    prompts = _prompts(5, seed=9)
    engine = LLMEngine(model, num_blocks=64, max_num_seqs=4)
    graphs = _uncaptured(engine)
    assert engine.generate(prompts, 12) == _alone(model, prompts, 12)
    assert {bucket for bucket, _ in graphs.graphs} <= {1, 2}


def test_graphs_are_asked_for_where_they_can_run():
    model = tiny_model(seed=1)
    assert LLMEngine(model, num_blocks=8).runner.graphs is None  # on a CPU: off
    with pytest.raises(ValueError, match="CUDA"):
        LLMEngine(model, num_blocks=8, graphs=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_engine_replays_its_decodes():
    model = tiny_model(seed=1, n_heads=4, n_kv_heads=2).to("cuda")
    prompts = _prompts(7, seed=2)
    engine = LLMEngine(model, num_blocks=64, max_num_seqs=5)
    assert engine.runner.graphs is not None
    assert engine.generate(prompts, 24) == _alone(model, prompts, 24)
    assert engine.runner.graphs.captures >= 1 and engine.runner.graphs.replays > 10
    off = LLMEngine(model, num_blocks=64, max_num_seqs=5, graphs=False)
    assert off.runner.graphs is None and off.generate(prompts, 24) == _alone(model, prompts, 24)


@pytest.mark.model
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_smollm2_cuda_engine_equals_generate():
    from lib.modeling.llama import load_smollm2
    model, tok = load_smollm2(device="cuda")
    texts = ["To be, or not to be, that is the question:", "The capital of France is", "def fibonacci(n):",
             "Once upon a time, in a land far away, there lived a", "1, 2, 3, 4,"]
    prompts = [tok(t).input_ids for t in texts]
    engine = LLMEngine(model, num_blocks=64)
    assert engine.generate(prompts, 32) == _alone(model, prompts, 32)
    assert engine.runner.graphs.replays > 20
