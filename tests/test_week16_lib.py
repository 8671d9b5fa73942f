"""Fast tests of week 16's lib additions: rolling cache, KV-head pooling, cache size, perplexity, cost model."""
import math

import pytest
import torch

from lib.attn.attention import gqa_attention
from lib.modeling.generate import generate
from lib.modeling.gqa import kv_group_options, mean_pool_heads, pool_kv_heads
from lib.modeling.kv_cache import KVCache, RollingKVCache, kv_cache_bytes, sliding_window_attention
from lib.attn.masks import sliding_window_mask
from lib.bench.roofline import matmul_params, roofline_time, step_flops
from lib.modeling.llama import SMOLLM2_135M, tiny_model
from lib.modeling.text import load_text, perplexity, token_nlls


@pytest.mark.parametrize("window, prompt", [(1, 3), (4, 2), (5, 9), (8, 8)])
def test_rolling_cache_equals_sliding_window_attention(window, prompt):
    model = tiny_model(seed=window, n_kv_heads=1)
    model.attention_fn = sliding_window_attention(window)
    ids = torch.randint(0, model.config.vocab_size, (2, prompt), generator=torch.Generator().manual_seed(0))
    cache = KVCache.rolling(model.config, window, batch=2)
    nbytes = cache.nbytes
    with torch.no_grad():
        logits = [model(ids, cache=cache)[:, -1]]
        seq = ids
        for _ in range(3 * window + 4):
            nxt = logits[-1].argmax(-1, keepdim=True)
            seq = torch.cat([seq, nxt], dim=1)
            logits.append(model(nxt, cache=cache)[:, -1])
        full = model(seq)  # uncached, sliding-window mask over the whole sequence
    want = full[:, prompt - 1:]
    torch.testing.assert_close(torch.stack(logits, 1), want, atol=1e-4, rtol=0)
    assert cache.nbytes == nbytes == kv_cache_bytes(2, 1, 16, window, batch=2, bytes_per_element=4)
    assert cache.length == seq.shape[1]


def test_sliding_window_wider_than_sequence_is_causal():
    q, k, v = (torch.randn(1, 4, 6, 8), torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8))
    torch.testing.assert_close(sliding_window_attention(6)(q, k, v), gqa_attention(q, k, v, causal=True))
    assert sliding_window_mask(1, 5, 2).tolist() == [[False, False, False, True, True]]


def test_pool_kv_heads_shapes_and_no_mutation():
    model = tiny_model(seed=0, n_heads=4, n_kv_heads=4)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    for g in (4, 2, 1):
        pooled = pool_kv_heads(model, g)
        assert pooled.config.n_kv_heads == g
        assert pooled.layers[0].attn.k_proj.weight.shape == (g * 16, 64)
        assert pooled.new_cache(max_len=8).nbytes == model.new_cache(max_len=8).nbytes * g // 4
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    ids = torch.randint(0, 128, (1, 10))
    torch.testing.assert_close(pool_kv_heads(model, 4)(ids), model(ids))
    w = torch.arange(4 * 2 * 3, dtype=torch.float32).reshape(8, 3)  # 4 heads of head_dim 2
    torch.testing.assert_close(mean_pool_heads(w, 4, 2), torch.stack([w[0:4].reshape(2, 2, 3).mean(0),
                                                                      w[4:8].reshape(2, 2, 3).mean(0)]).reshape(4, 3))
    assert kv_group_options(9, 3) == [3, 1] and kv_group_options(32) == [32, 16, 8, 4, 2, 1]
    with pytest.raises(ValueError):
        pool_kv_heads(model, 3)


def test_pooling_identical_heads_changes_nothing():
    model = tiny_model(seed=1, n_heads=4, n_kv_heads=4)
    with torch.no_grad():
        for layer in model.layers:
            for proj in (layer.attn.k_proj, layer.attn.v_proj):
                w = proj.weight.view(2, 2, 16, 64)
                w[:, 1] = w[:, 0]
    ids = torch.randint(0, 128, (2, 12))
    torch.testing.assert_close(pool_kv_heads(model, 2)(ids), model(ids), atol=1e-5, rtol=0)


def test_kv_cache_bytes_matches_allocation_and_papers():
    assert kv_cache_bytes(40, 40, 128, 1) == 819_200  # OPT-13B, fp16
    assert kv_cache_bytes(96, 96, 128, 1) == 4.5 * 2 ** 20  # GPT-3 175B, fp16
    for batch, length in [(1, 1), (2, 17), (3, 100)]:
        cache = KVCache.for_model(SMOLLM2_135M, batch, length, dtype=torch.float32)
        assert cache.nbytes == kv_cache_bytes(30, 3, 64, length, batch, bytes_per_element=4)


def test_cost_model():
    assert step_flops(100, 2, 8, 10, cached=True) == 2 * 100 + 4 * 2 * 8 * 10
    assert step_flops(100, 2, 8, 10, cached=False) == 10 * (2 * 100) + 4 * 2 * 8 * 100
    assert roofline_time(10, 4, 5, 1) == 4 and roofline_time(10, 4, 1, 100) == 10
    model = tiny_model()
    per_layer = 64 * 64 + 2 * 32 * 64 + 64 * 64 + 3 * 64 * 128  # q, k and v (2 KV heads of 16), o, SwiGLU
    assert matmul_params(model) == 2 * per_layer + 128 * 64  # + the tied LM head


def test_perplexity_sanity():
    class Uniform(torch.nn.Module):
        def forward(self, ids):
            return torch.zeros(*ids.shape, 50)

    ids = torch.randint(0, 50, (300,))
    assert math.isclose(perplexity(Uniform(), ids, window=64, stride=16), 50, rel_tol=1e-5)
    model = tiny_model(seed=0)
    ids = torch.randint(0, 128, (40,), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logp = torch.log_softmax(model(ids[None])[0], -1)
    want = -logp[:-1].gather(1, ids[1:, None])[:, 0]
    # a window longer than the text scores every token with its full context
    torch.testing.assert_close(token_nlls(model, ids, window=64, stride=63), want, atol=1e-5, rtol=0)
    strided = token_nlls(model, ids, window=16, stride=4)
    assert strided.shape == (39,) and torch.allclose(strided[:12], want[:12], atol=1e-5)  # tokens 1..12 see all of their context
    assert "HAMLET" in load_text("hamlet")[:200]


def test_cache_mask_attention_and_model_run_on_meta():
    """Every tensor the week's reference creates is made on its inputs' device: run on `meta` (shapes, no data),
    a stray CPU tensor raises a device mismatch — what would fail on a GPU, caught on a CPU-only machine."""
    from lib.modeling.kv_cache import LayerKVCache
    from lib.attn.masks import causal_mask

    assert causal_mask(3, 5, device="meta").device.type == "meta"
    assert sliding_window_mask(3, 5, 2, device="meta").device.type == "meta"
    q, k, v = (torch.zeros(1, n, 4, 24, device="meta") for n in (6, 2, 2))
    assert gqa_attention(q, k, v, causal=True).device.type == "meta"
    assert sliding_window_attention(3)(q, k, v).device.type == "meta"
    for cache in (LayerKVCache(1, 2, 9, 24, device="meta"), RollingKVCache(1, 2, 3, 24, device="meta")):
        for t in (4, 1, 3):
            keys, values = cache.append(torch.zeros(1, 2, t, 24, device="meta"), torch.zeros(1, 2, t, 24, device="meta"))
            assert keys.device.type == values.device.type == "meta"
    model = tiny_model(seed=0).to("meta")
    out = generate(model, torch.zeros(2, 5, dtype=torch.long, device="meta"), 0)
    assert out.device.type == "meta"
    cache = model.new_cache(batch=2, max_len=8)
    with torch.no_grad():
        assert model(torch.zeros(2, 5, dtype=torch.long, device="meta"), cache=cache).device.type == "meta"
        assert model(torch.zeros(2, 1, dtype=torch.long, device="meta"), cache=cache).shape == (2, 1, 128)


def test_rolling_cache_appends_several_and_more_than_a_window():
    for window, schedule in [(4, [3, 1, 2, 6, 1, 9, 1]), (1, [2, 1, 3]), (5, [5, 5, 1, 12])]:
        cache, length = RollingKVCache(1, 1, window, 1), 0
        for t in schedule:
            new = torch.arange(length, length + t, dtype=torch.float32)[None, None, :, None]
            keys, _ = cache.append(new, new)
            held = min(length, window)
            assert keys[0, 0, :, 0].tolist() == list(range(length - held, length + t))
            length += t
        assert cache.length == length and cache.held == min(length, window)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cached_generation_on_cuda():
    model = tiny_model(seed=0, n_kv_heads=2)
    ids = torch.randint(0, 128, (2, 6), generator=torch.Generator().manual_seed(0))
    want_ids, want_logits = generate(model, ids, 12, return_logits=True)
    model = model.cuda()
    for use_cache in (True, False):
        got_ids, got_logits = generate(model, ids.cuda(), 12, use_cache=use_cache, return_logits=True)
        assert torch.equal(got_ids.cpu(), want_ids)
        torch.testing.assert_close(got_logits.cpu(), want_logits, atol=1e-3, rtol=1e-3)
    windowed = model.with_attention(sliding_window_attention(4))
    cache = KVCache.rolling(model.config, 4, batch=2, device="cuda")
    with torch.no_grad():
        steps = [windowed(ids.cuda()[:, :3], cache=cache)] + [windowed(ids.cuda()[:, t:t + 1], cache=cache) for t in range(3, 6)]
        torch.testing.assert_close(torch.cat(steps, 1), windowed(ids.cuda()), atol=1e-4, rtol=1e-4)


def test_attention_sinks_mask():
    m = sliding_window_mask(6, 6, 3, n_sinks=1)
    assert m.sum(-1).tolist() == [1, 2, 3, 3, 3, 3]  # never more than the window
    assert m[:, 0].all()  # the sink is seen by every query
    assert m[5].tolist() == [True, False, False, False, True, True]
    assert torch.equal(sliding_window_mask(4, 9, 3, n_sinks=0), sliding_window_mask(4, 9, 3))
    with pytest.raises(ValueError):
        sliding_window_mask(3, 3, 2, n_sinks=2)
