"""Week 19's lib: the block allocator, slot mapping, paged attention against contiguous attention, and the
engine against lib.modeling.generate.generate run on each request alone (tiny models; SmolLM2 marked slow)."""
import random

import pytest
import torch

from lib.attn.attention import gqa_attention
from lib.batching.blocks import block_hashes
from lib.batching.engine import LLMEngine
from lib.modeling.generate import generate
from lib.modeling.llama import tiny_model
from lib.batching.paged import (BlockAllocator, OutOfBlocksError, block_table_tensor, blocks_needed,
                       paged_attention, preallocated_waste, slot_mapping, slots_wasted)
from lib.modeling.sampling import SamplingParams


def test_seed_waste_example():
    lengths = [2000, 100, 500, 1500]  # seed 001: 258 blocks, 28 slots wasted vs 4 x 2048 preallocated
    assert sum(blocks_needed(n, 16) for n in lengths) == 258
    assert slots_wasted(lengths, 16) == 28
    assert preallocated_waste(lengths, 2048) == 4092
    with pytest.raises(ValueError):
        blocks_needed(3, 0)


def test_allocator_ref_counts_and_errors():
    a = BlockAllocator(3)
    b0, b1, b2 = a.allocate(), a.allocate(), a.allocate()
    assert {b0, b1, b2} == {0, 1, 2} and a.num_free == 0
    with pytest.raises(OutOfBlocksError, match="3 blocks.*3 in use"):
        a.allocate()
    a.fork(b1)
    a.free(b1)
    assert a.num_free == 0  # still owned once
    a.free(b1)
    assert a.num_free == 1 and a.allocate() == b1
    a.free(b0)
    with pytest.raises(ValueError, match="not allocated"):
        a.free(b0)
    with pytest.raises(ValueError):
        a.fork(b0)
    with pytest.raises(ValueError):
        a.free(7)


def test_allocator_random_against_a_model():
    rng = random.Random(0)
    a, owners = BlockAllocator(16), {}
    for _ in range(2000):
        op = rng.choice(["alloc", "fork", "free"])
        if op == "alloc" and len(owners) < 16:
            b = a.allocate()
            assert b not in owners
            owners[b] = 1
        elif op == "fork" and owners:
            b = rng.choice(list(owners))
            a.fork(b)
            owners[b] += 1
        elif op == "free" and owners:
            b = rng.choice(list(owners))
            a.free(b)
            owners[b] -= 1
            if owners[b] == 0:
                del owners[b]
        assert a.num_free == 16 - len(owners)


def test_slot_mapping():
    assert slot_mapping([5, 2, 9], 0, 7, 3).tolist() == [15, 16, 17, 6, 7, 8, 27]
    assert slot_mapping([5, 2, 9], 4, 2, 3).tolist() == [7, 8]
    with pytest.raises(ValueError):
        slot_mapping([5], 0, 4, 3)
    assert block_table_tensor([[1, 2], [3]]).tolist() == [[1, 2], [3, 0]]


@pytest.mark.parametrize("block_size", [1, 5, 16])
@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (6, 1)])
def test_paged_attention_equals_contiguous(block_size, heads):
    g = torch.Generator().manual_seed(block_size)
    h, hkv, d = *heads, 8
    lens = [1, 17, 40, 33]
    nb = sum(blocks_needed(n, block_size) for n in lens) + 2
    kp, vp = torch.randn(nb, hkv, block_size, d, generator=g), torch.randn(nb, hkv, block_size, d, generator=g)
    perm, tables = torch.randperm(nb, generator=g).tolist(), []
    for n in lens:
        tables.append(perm[:blocks_needed(n, block_size)])
        perm = perm[blocks_needed(n, block_size):]
    q = torch.randn(len(lens), h, d, generator=g)
    bt = block_table_tensor(tables)
    bt[0, 1:] = 10**6  # entries past a sequence's last block are ignored
    out = paged_attention(q, kp, vp, bt, torch.tensor(lens), chunk_tokens=16)
    flat_k = kp.permute(0, 2, 1, 3).reshape(-1, hkv, d)  # [slots, Hkv, d]
    flat_v = vp.permute(0, 2, 1, 3).reshape(-1, hkv, d)
    for i, n in enumerate(lens):
        slots = slot_mapping(tables[i], 0, n, block_size)
        want = gqa_attention(q[i][None, :, None], flat_k[slots].transpose(0, 1)[None],
                             flat_v[slots].transpose(0, 1)[None])[0, :, 0]
        torch.testing.assert_close(out[i], want, atol=1e-5, rtol=0)
    with pytest.raises(ValueError):
        paged_attention(q, kp, vp, bt, torch.tensor([0, 1, 1, 1]))


def _prompts(n, seed=0, vocab=128, lo=1, hi=40):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (int(k),), generator=g).tolist() for k in torch.randint(lo, hi, (n,), generator=g)]


def _alone(model, prompts, new):
    return [generate(model, torch.tensor([p]), new)[0, len(p):].tolist() for p in prompts]


ENGINES = [
    dict(num_blocks=64),
    dict(num_blocks=64, block_size=1),
    dict(num_blocks=14, block_size=4, max_num_batched_tokens=16),  # preemption and chunked prefill
    dict(num_blocks=64, policy="static"),
    dict(num_blocks=10, block_size=8, max_num_seqs=4, max_num_batched_tokens=8, enable_prefix_caching=True),
    dict(num_blocks=64, enable_chunked_prefill=False, max_num_seqs=3),
]


@pytest.mark.parametrize("kwargs", ENGINES)
def test_engine_equals_generate_alone(kwargs):
    model = tiny_model(seed=1, n_heads=4, n_kv_heads=2)
    prompts = _prompts(10)
    engine = LLMEngine(model, **kwargs)
    assert engine.generate(prompts, 20) == _alone(model, prompts, 20)
    assert engine.blocks.num_in_use == 0 and not engine.has_unfinished()
    if kwargs["num_blocks"] < 16:
        assert engine.num_preemptions > 0


def test_engine_batches_decodes_in_one_forward():
    model = tiny_model(seed=2)
    engine = LLMEngine(model, num_blocks=32, max_num_seqs=4)
    engine.generate(_prompts(4, seed=3), 6)
    assert max(len(step) for step in engine.trace) == 4  # four requests in one forward
    assert engine.trace[-1] == [(i, 1) for i in range(4)]


def test_long_prefill_token_threshold_lets_a_short_request_in():
    """A long prompt's prefill takes the whole token budget of every step until it is done, and a request sent
    meanwhile waits for all of it; with the threshold each step gives the prompt at most that many tokens, and the
    short request runs in the next step. Outputs are unchanged either way."""
    model = tiny_model(seed=5)
    long, short = _prompts(1, seed=7, lo=100, hi=101)[0], _prompts(1, seed=8, lo=3, hi=4)[0]
    for threshold in (0, 16):
        engine = LLMEngine(model, num_blocks=64, block_size=8, max_num_batched_tokens=32,
                           long_prefill_token_threshold=threshold)
        a = engine.add_request(long, 4)
        engine.step()
        b = engine.add_request(short, 4)
        engine.step()
        got = dict(engine.trace[-1])
        if threshold:
            assert got == {0: 16, 1: 3}, engine.trace
        else:
            assert got == {0: 32}, engine.trace  # the short request waits for the whole prompt
        while engine.has_unfinished():
            engine.step()
        assert max(n for step in engine.trace for i, n in step if i == 0) == (threshold or 32)
        assert engine.finished_outputs() == dict(zip([a, b], _alone(model, [long, short], 4)))
    with pytest.raises(ValueError, match="chunked prefill"):
        LLMEngine(model, num_blocks=64, enable_chunked_prefill=False, long_prefill_token_threshold=16)


def test_engine_errors():
    model = tiny_model(seed=0)
    engine = LLMEngine(model, num_blocks=4, block_size=4)
    with pytest.raises(ValueError, match="never fit"):
        engine.add_request(list(range(10)), 10)
    with pytest.raises(ValueError, match="max_seq_len"):
        LLMEngine(model, num_blocks=100).add_request([1] * 250, 10)
    with pytest.raises(ValueError):
        engine.add_request([], 3)
    with pytest.raises(ValueError, match="^unknown request id 12345"):  # UnknownRequestError: a KeyError too
        engine.output(12345)
    with pytest.raises(KeyError, match="unknown request id"):
        engine.abort("nope")
    rid = engine.add_request([1, 2, 3], 2, request_id="a")
    with pytest.raises(ValueError, match="already in use"):
        engine.add_request([1], 2, request_id="a")
    with pytest.raises(ValueError):
        engine.generate([[1, 2], list(range(20))], 5)  # the second never fits: nothing of this call is queued
    assert list(engine.requests) == [rid]
    while engine.has_unfinished():
        engine.step()
    assert engine.finished_outputs() == {"a": _alone(model, [[1, 2, 3]], 2)[0]}


def test_prefix_cache_hits_and_eviction():
    model = tiny_model(seed=4)
    system = _prompts(1, seed=5, lo=40, hi=41)[0]
    prompts = [system + p for p in _prompts(6, seed=6, lo=2, hi=9)]
    engine = LLMEngine(model, num_blocks=40, block_size=8, max_num_seqs=2, enable_prefix_caching=True)
    assert engine.generate(prompts, 5) == _alone(model, prompts, 5)
    # the first two are admitted together (nothing cached yet); each later one reuses the 5 system blocks
    assert engine.prefix_hit_tokens == 4 * 40
    small = LLMEngine(model, num_blocks=9, block_size=8, max_num_seqs=1, enable_prefix_caching=True)
    others = _prompts(4, seed=7, lo=40, hi=60)
    assert small.generate(others + prompts[:2], 5) == _alone(model, others + prompts[:2], 5)
    assert small.blocks.num_evictions > 0
    h = block_hashes(list(range(20)), 8)
    assert len(h) == 2 and h == block_hashes(list(range(16)) + [0], 8)
    assert block_hashes([9] + list(range(1, 20)), 8)[1] != h[1]  # chained: block 1's hash depends on block 0


@pytest.mark.model
def test_engine_on_smollm2_equals_generate(smollm2):
    model, tok = smollm2
    texts = ["To be, or not to be, that is the question:", "The capital of France is", "def fibonacci(n):",
             "Once upon a time, in a land far away, there lived a", "1, 2, 3, 4,"]
    prompts = [tok(t).input_ids for t in texts]
    want = _alone(model, prompts, 16)
    assert LLMEngine(model, num_blocks=64).generate(prompts, 16) == want
    tight = LLMEngine(model, num_blocks=6, block_size=8, max_num_batched_tokens=16)
    assert tight.generate(prompts, 16) == want and tight.num_preemptions > 0


@pytest.mark.parametrize("kwargs", [dict(num_blocks=32, block_size=8), dict(num_blocks=80, block_size=1),
                                    dict(num_blocks=9, block_size=4, max_num_batched_tokens=8)])
def test_parallel_sampling_copy_on_write(kwargs):
    """n = 4 samples share the prompt's blocks; each equals lib.modeling.generate with its own seeded generator."""
    model = tiny_model(seed=3, n_heads=4, n_kv_heads=2)
    prompt = _prompts(1, seed=1, lo=21, hi=22)[0]
    want = [generate(model, torch.tensor([prompt]), 12, temperature=1.0,
                     generator=torch.Generator().manual_seed(5 + k))[0, 21:].tolist() for k in range(4)]
    assert len(set(map(tuple, want))) > 1  # the samples differ, so a shared block written twice would show
    engine = LLMEngine(model, **kwargs)
    assert engine.sample(prompt, 12, n=4, temperature=1.0, seed=5) == want
    assert engine.blocks.num_in_use == 0
    if kwargs["block_size"] == 8:  # 21 = 2 full blocks shared + a partial one, copied by 3 of the 4 samples
        assert engine.num_cow_copies == 3



def _seeded(model, prompt, n, seed, k):
    return generate(model, torch.tensor([prompt]), n, temperature=1.0,
                    generator=torch.Generator().manual_seed(seed + k))[0, len(prompt):].tolist()


def test_siblings_fork_off_a_waiting_requests_prompt():
    """`params.sibling_of` (how the server's n and best_of reach the engine past a ServingLoop that submits n plain
    requests): the siblings take no place in the queue, the prompt is computed once, then they fork off it and
    each equals its own seeded run. Before it existed, each sample computed the prompt again."""
    model = tiny_model(seed=3, n_heads=4, n_kv_heads=2)
    prompt = _prompts(1, seed=1, lo=21, hi=22)[0]
    engine = LLMEngine(model, num_blocks=32, block_size=8, max_num_seqs=4)
    engine.add_request(prompt, 6, request_id="p", temperature=1.0, seed=5)
    for k in (1, 2):
        engine.add_request(prompt, 6, request_id=("s", k), params=SamplingParams(temperature=1.0, seed=5 + k,
                                                                                 sibling_of="p"))
    assert len(engine.waiting) == 1 and engine.request("p").n == 3
    first = engine.step()
    assert sorted(map(str, (e.request_id for e in first))) == sorted(map(str, ["p", ("s", 1), ("s", 2)]))
    assert engine.step_stats[0]["num_tokens"] == len(prompt)  # computed once, not three times
    assert engine.blocks.pool.ref_count(engine.request("p").blocks[0]) == 3
    while engine.has_unfinished():
        engine.step()
    out = engine.finished_outputs()
    assert [out["p"], out[("s", 1)], out[("s", 2)]] == [_seeded(model, prompt, 6, 5, k) for k in range(3)]
    assert engine.blocks.num_in_use == 0 and engine.prompt_tokens == len(prompt)


@pytest.mark.parametrize("who", ["parent", "sibling", "started"])
def test_siblings_when_their_parent_goes_or_has_started(who):
    """The parent aborted before its prompt ran: its siblings queue on their own, in its place. A sibling
    aborted: the parent runs alone. A parent already running: the sibling queues on its own. Every remaining
    request still equals its own seeded run and no block is left behind."""
    model = tiny_model(seed=3)
    prompt = _prompts(1, seed=2, lo=13, hi=14)[0]
    engine = LLMEngine(model, num_blocks=32, block_size=4, max_num_seqs=4)
    engine.add_request(prompt, 5, request_id="p", temperature=1.0, seed=9)
    if who == "started":
        engine.step()
    engine.add_request(prompt, 5, request_id="s", params=SamplingParams(temperature=1.0, seed=10, sibling_of="p"))
    engine.add_request([4, 5, 6], 5, request_id="later")
    if who == "parent":
        engine.abort("p")
        assert [r.request_id for r in engine.waiting] == ["s", "later"]
    elif who == "sibling":
        engine.abort("s")
        assert engine.request("p").n == 1 and not engine.request("p").siblings
    else:
        assert engine.request("s") in engine.waiting
    while engine.has_unfinished():
        engine.step()
    out = engine.finished_outputs()
    if who != "sibling":
        assert out["s"] == _seeded(model, prompt, 5, 9, 1)
    if who != "parent":
        assert engine.prompt_tokens == len(prompt) * (2 if who == "started" else 1) + 3
        assert out["p"] == _seeded(model, prompt, 5, 9, 0)
    assert out["later"] == _alone(model, [[4, 5, 6]], 5)[0]
    assert engine.blocks.num_in_use == 0

def test_run_load_and_simulate_steps():
    from lib.batching.engine import simulate_steps
    from lib.batching.engine_load import percentile, run_load

    model = tiny_model(seed=3)
    prompts = _prompts(12, seed=8, lo=5, hi=50)
    g = torch.Generator().manual_seed(0)
    arrivals = torch.cumsum(torch.empty(12).exponential_(100.0, generator=g), 0).tolist()
    engine = LLMEngine(model, num_blocks=64, block_size=8)
    r = run_load(engine, prompts, [6] * 12, arrivals)
    assert len(r["ttft"]) == 12 and len(r["tbt"]) == 12 * 5 and min(r["ttft"]) > 0
    assert 0 < r["kv_utilization_max_len"] < r["kv_utilization_preallocated"] <= r["kv_utilization"] <= 1
    assert not engine.has_unfinished() and engine.blocks.num_in_use == 0
    assert percentile([1.0, 2.0, 3.0], 50) == 2.0
    assert simulate_steps([50, 200] * 4, 8, "static") == simulate_steps([50, 200] * 4, 8) == 200
    assert (simulate_steps([50, 200] * 32, 8, "static"), simulate_steps([50, 200] * 32, 8)) == (1600, 1100)
    with pytest.raises(ValueError):
        simulate_steps([0], 1)


# --- engine bugs fixed (issue 20, item 4): each test failed before its fix ------------------------------------

def test_no_chunking_rejects_a_request_that_could_not_be_recomputed_in_one_step():
    """Chunked prefill off: a preempted request is recomputed (prompt + output) in one step, so prompt +
    max_new_tokens - 1 must fit the budget. Before: accepted, then `RuntimeError: the scheduler could schedule
    nothing` once a request of 11 prompt tokens had generated 2 (13 > 12) and was preempted."""
    model = tiny_model(seed=5)
    prompts = _prompts(6, seed=11, lo=9, hi=12)
    engine = LLMEngine(model, num_blocks=8, block_size=4, max_num_batched_tokens=12, enable_chunked_prefill=False)
    with pytest.raises(ValueError, match="could never be recomputed"):
        engine.generate(prompts, 8)
    fits = LLMEngine(model, num_blocks=8, block_size=4, max_num_batched_tokens=20, enable_chunked_prefill=False)
    assert fits.generate(prompts, 8) == _alone(model, prompts, 8)
    assert fits.num_preemptions > 0 and fits.blocks.num_in_use == 0


def test_parallel_sampling_stays_within_max_num_seqs():
    """n samples take n slots. Before: n = 6 with max_num_seqs = 2 ran 6 sequences at once, and a request of
    n = 3 admitted next to another forked to 4 running sequences with max_num_seqs = 3."""
    model = tiny_model(seed=3)
    engine = LLMEngine(model, num_blocks=64, block_size=4, max_num_seqs=3)
    with pytest.raises(ValueError, match="max_num_seqs"):
        engine.add_request([1, 2, 3], 4, n=6, temperature=1.0)
    engine.add_request([5, 6, 7, 8, 9], 6, request_id="greedy")
    engine.add_request([1, 2, 3], 4, request_id="s", n=3, temperature=1.0, seed=2)
    while engine.has_unfinished():
        engine.step()
    assert max(s["num_running"] for s in engine.step_stats) <= 3
    assert max(len(step) for step in engine.trace) <= 3
    out = engine.finished_outputs()
    assert out["greedy"] == _alone(model, [[5, 6, 7, 8, 9]], 6)[0]
    for k in range(3):
        want = generate(model, torch.tensor([[1, 2, 3]]), 4, temperature=1.0,
                        generator=torch.Generator().manual_seed(2 + k))[0, 3:].tolist()
        assert out["s" if k == 0 else ("s", k)] == want


def test_prefix_cache_compares_tokens_on_a_hit(monkeypatch):
    """A hash collision must be a miss. With every block hashing alike, prompts that differ must still get their
    own keys and values. Before: keyed by Python's hash() and never compared, a collision reused another
    prompt's blocks (and chain_hash did not exist: blocks were keyed by hash(), not a content hash)."""
    import lib.batching.blocks as blocks_module

    monkeypatch.setattr(blocks_module, "chain_hash", lambda parent, tokens: 42)  # every block collides
    model = tiny_model(seed=4)
    prompts = _prompts(5, seed=12, lo=17, hi=30)
    engine = LLMEngine(model, num_blocks=40, block_size=4, max_num_seqs=1, enable_prefix_caching=True)
    assert engine.generate(prompts, 5) == _alone(model, prompts, 5)
    assert engine.prefix_hit_tokens == 0


def test_block_hashes_are_content_hashes():
    """sha256-based: the same in another process (Python's hash() of None is not, before 3.12)."""
    import subprocess
    import sys

    code = "from lib.batching.blocks import block_hashes; print(block_hashes(list(range(12)), 4))"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**__import__("os").environ, "PYTHONHASHSEED": "123"}).stdout.strip()
    assert other == str(block_hashes(list(range(12)), 4))
    assert all(h.bit_length() > 64 for h in block_hashes(list(range(40)), 4))  # 128 bits, not hash()'s 64


class _LogitRows:
    """The model, recording how many rows of logits each forward returns."""

    def __init__(self, model):
        self._model, self.rows = model, []

    def __call__(self, *args, **kwargs):
        out = self._model(*args, **kwargs)
        self.rows.append(out.shape[1])
        return out

    def __getattr__(self, name):
        return getattr(self._model, name)


def test_engine_computes_logits_only_for_each_sequences_last_token():
    """The LM head (49,152 outputs per token on SmolLM2) runs on the rows a token is sampled from, not on every
    prefill token. Before: [N, vocab] logits for all N tokens of the step."""
    model = tiny_model(seed=2)
    spy = _LogitRows(model)
    prompts = _prompts(4, seed=13, lo=20, hi=40)
    engine = LLMEngine(spy, num_blocks=64, block_size=4, max_num_batched_tokens=32)
    assert engine.generate(prompts, 5) == _alone(model, prompts, 5)
    assert all(rows <= len(step) for rows, step in zip(spy.rows, engine.trace))
    assert sum(spy.rows) == 4 * 5  # one row per token generated


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preemption_by_recompute_or_swap(mode):
    """Both ways of preempting give generate's output; recompute computes tokens again, swap copies blocks."""
    model = tiny_model(seed=6, n_heads=4, n_kv_heads=2)
    prompts = _prompts(8, seed=14, lo=5, hi=30)
    engine = LLMEngine(model, num_blocks=12, block_size=4, max_num_batched_tokens=16, preemption_mode=mode)
    assert engine.generate(prompts, 12) == _alone(model, prompts, 12)
    assert engine.num_preemptions > 0 and engine.blocks.num_in_use == 0
    if mode == "swap":
        assert engine.recomputed_tokens == 0 and engine.swap_bytes > 0
    else:
        assert engine.recomputed_tokens > 0 and engine.swap_bytes == 0
    with pytest.raises(ValueError, match="preemption_mode"):
        LLMEngine(model, num_blocks=4, preemption_mode="disk")


def test_one_percentile_for_both_load_tests():
    """The in-process load test and the HTTP one report p50/p95 the same way: linear interpolation, as numpy's default
    (they differed: the HTTP one took the nearest rank above, 0.95 * n rounded down)."""
    import numpy as np

    import lib.serve.loadtest
    from lib.batching.engine_load import percentile

    assert vars(lib.serve.loadtest)["percentile"] is percentile and not hasattr(lib.serve.loadtest, "pct")  # the one it uses
    rng = np.random.default_rng(5)
    for n in (1, 2, 7, 40):
        values = rng.exponential(size=n).tolist()
        for q in (0, 5, 50, 95, 100):
            assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)), rel=1e-12)
    assert percentile([], 50) != percentile([], 50)  # nan
    with pytest.raises(ValueError, match="outside"):
        percentile([1.0], 150)
