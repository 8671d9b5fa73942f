"""Week 16 — the KV cache and GQA: the milestone checks, used by solutions/16/test_week16.py and the notebook.

One `check_<name>` per exercise; each takes the student's function or class and raises AssertionError
with a message that says what is wrong. The references are in lib/ (kv_cache, attention, generate, gqa).
Every check follows the three rules of `grader.checks`; what each rejects besides wrong numbers
(tests/test_week16_checks.py has them all):

- step_flops, roofline_time, kv_cache_bytes: `lib`'s function under another name; a table of the checked values.
- causal_mask: top-left alignment; `lib`'s mask; a mask built on the CPU when `device=` says otherwise.
- LayerKVCache: `torch.cat` growth (a new tensor per append, memory growing with the length held); `lib`'s
  class; buffers on the CPU when a device is given; a refused append that changes the cache.
- gqa_attention: SDPA or `lib`'s reference; CPU-built masks; fp16/bf16, non-contiguous q, odd head dims.
- generate: re-running the whole sequence when `use_cache=True`; `lib.generate`.
- pool_kv_heads: `lib.gqa`; changing the original model.
- RollingKVCache: memory that grows with the sequence; `lib`'s class; appends of several positions after the
  prefill and of more than a window mid-stream; CPU buffers.
"""
from __future__ import annotations

import functools

import torch

from grader.checks import (CountingModel, assert_close, assert_route, check_on_meta, generator, observe,
                           seed_note)
from grader.harness import Week
from lib import kv_cache as ref
from lib.masks import causal_mask as ref_causal_mask
from lib import roofline
from lib.attention import gqa_attention as ref_gqa_attention
from lib.generate import generate as ref_generate
from lib.gqa import pool_kv_heads as ref_pool_kv_heads
from lib.model import SMOLLM2_135M, tiny_model

WEEK = Week(16, "week16_kv_cache.ipynb",
            child_may_use={"lib.kv_cache": ("KVCache", "CacheOverflowError"), "lib.model": "*"})

# Prompt and length of the SmolLM2 milestone (greedy, >= 64 new tokens).
SMOLLM2_PROMPT = "To be, or not to be, that is the question:"
SMOLLM2_NEW_TOKENS = 64
LOGIT_ATOL = 1e-4

# Random tiny configurations of the SmolLM2 architecture: MHA, GQA and MQA, one and two sequences.
TINY_CONFIGS = [
    dict(seed=0, n_heads=4, n_kv_heads=4),
    dict(seed=1, n_heads=4, n_kv_heads=2),
    dict(seed=2, n_heads=6, n_kv_heads=1, d_model=96, n_layers=3),
    dict(seed=3, n_heads=6, n_kv_heads=3, d_model=48, n_layers=1),
]


def _close(got, want, what, atol=LOGIT_ATOL, rtol=0.0, **kw):
    assert_close(got, want, what, atol, rtol, **kw)


def _ints(offset, n, low, high):
    """n random ints in [low, high) from this run's seed."""
    return [int(x) for x in torch.randint(low, high, (n,), generator=generator(offset))]


def _run_generate(generate, model, ids, n, use_cache):
    out = generate(model, ids, n, use_cache=use_cache, return_logits=True)
    assert isinstance(out, tuple) and len(out) == 2, (
        "generate(..., return_logits=True) must return a pair (ids, logits), like lib.generate.generate")
    got_ids, logits = out
    b, t = ids.shape
    assert tuple(got_ids.shape) == (b, t + n), (
        f"generate returned ids of shape {tuple(got_ids.shape)}; expected [batch, prompt + new] = {(b, t + n)}")
    assert torch.equal(got_ids[:, :t].cpu(), ids.cpu()), "the returned ids must start with the prompt"
    assert tuple(logits.shape) == (b, n, model.config.vocab_size), (
        f"logits have shape {tuple(logits.shape)}; expected [batch, new, vocab] = {(b, n, model.config.vocab_size)}")
    return got_ids, logits


# --- 1 ------------------------------------------------------------------------------------------------

@WEEK.exercise(1, "step_flops", section="1 (Why generation without a cache is quadratic)")
def check_step_flops(step_flops) -> None:
    cases = [(100, 2, 8, 1), (100, 2, 8, 10), (134_515_008, 30, 576, 64), (7, 1, 3, 256), (10**9, 40, 5120, 2048)]
    for i in range(4):
        n_params, n_layers, d_model, seq_len = _ints(10 + i, 4, 1, 5000)
        cases.append((n_params * 1000 + 7, n_layers % 100 + 1, d_model, seq_len))
    for n_params, n_layers, d_model, seq_len in cases:
        for cached in (True, False):
            got, obs = observe(step_flops, n_params, n_layers, d_model, seq_len, cached)
            want = roofline.step_flops(n_params, n_layers, d_model, seq_len, cached)
            assert got == want, (
                f"step_flops(n_params={n_params}, n_layers={n_layers}, d_model={d_model}, seq_len={seq_len}, "
                f"cached={cached}) = {got}; expected {want}. The step's forward pass covers seq_len positions and runs "
                f"{'1 token (the new one; the cache holds the other seq_len - 1)' if cached else 'all seq_len tokens'}: "
                f"2*n_params FLOPs per token that runs, plus 4*n_layers*d_model*seq_len per such token in attention. "
                f"{seed_note()}")
            assert_route(obs, "step_flops")


# --- 2 ------------------------------------------------------------------------------------------------

@WEEK.exercise(2, "causal_mask", section="2 (The causal mask)")
def check_causal_mask(causal_mask) -> None:
    sizes = [(1, 1), (5, 5), (1, 9), (3, 8), (4, 4), (2, 7), (16, 16), (1, 300), (0, 3)]
    for i in range(4):
        kv_len = _ints(20 + i, 1, 1, 200)[0]
        sizes.append((_ints(30 + i, 1, 1, kv_len + 1)[0], kv_len))
    for q_len, kv_len in sizes:
        got, obs = observe(causal_mask, q_len, kv_len)
        assert isinstance(got, torch.Tensor), f"causal_mask({q_len}, {kv_len}) returned {type(got).__name__}, expected a torch.Tensor"
        assert tuple(got.shape) == (q_len, kv_len), (
            f"causal_mask({q_len}, {kv_len}) has shape {tuple(got.shape)}; expected ({q_len}, {kv_len}) = [q_len, kv_len]")
        assert got.dtype == torch.bool, f"causal_mask({q_len}, {kv_len}) has dtype {got.dtype}; expected torch.bool (True = may attend)"
        want = ref_causal_mask(q_len, kv_len)
        if not torch.equal(got, want):
            bad = (got != want).nonzero()[0].tolist()
            raise AssertionError(
                f"causal_mask({q_len}, {kv_len}) is wrong at query {bad[0]}, key {bad[1]}: got {bool(got[bad[0], bad[1]])}. "
                f"The queries are the LAST {q_len} of {kv_len} positions: query i may see key j iff j <= i + {kv_len - q_len}. "
                f"{seed_note()}")
        assert_route(obs, f"causal_mask({q_len}, {kv_len})")
    try:
        got = causal_mask(3, 5, device="meta")
    except TypeError as e:
        raise AssertionError(f"causal_mask(3, 5, device='meta') failed: {e} — take a device argument (default None) "
                             f"and create the mask there") from None
    assert isinstance(got, torch.Tensor) and got.device.type == "meta", (
        "causal_mask(3, 5, device='meta') must build the mask on that device (pass device= to torch.arange): "
        "on a GPU, a mask on the CPU meets scores on the GPU and torch raises a device mismatch")


# --- 3 ------------------------------------------------------------------------------------------------

@WEEK.exercise(3, "LayerKVCache", section="3 (The cache)")
def check_LayerKVCache(LayerKVCache) -> None:
    b, h, max_len, d = 2, 3, 10, 4
    cache, obs = observe(LayerKVCache, b, h, max_len, d, torch.float32, None)
    assert_route(obs, "LayerKVCache(...)", why="Write the class yourself; do not subclass lib.kv_cache.LayerKVCache.")
    assert cache.length == 0, f"a new cache has length {cache.length}; expected 0"
    assert cache.max_len == max_len, f"max_len is {cache.max_len}; expected {max_len}"
    want_bytes = 2 * b * h * max_len * d * 4
    assert cache.nbytes == want_bytes, (
        f"nbytes is {cache.nbytes}; expected {want_bytes} = 2 (K and V) x {b} x {h} x {max_len} x {d} x 4 bytes, "
        f"allocated once in __init__")
    g = generator(40)
    k1, v1 = torch.randn(b, h, 4, d, generator=g), torch.randn(b, h, 4, d, generator=g)
    k, v = cache.append(k1, v1)
    assert tuple(k.shape) == (b, h, 4, d) and tuple(v.shape) == (b, h, 4, d), (
        f"after appending 4 positions, append returned k {tuple(k.shape)} and v {tuple(v.shape)}; expected {(b, h, 4, d)}")
    assert torch.equal(k, k1) and torch.equal(v, v1), "append must return the keys and values it holds, in order"
    ptr = k.data_ptr()
    k2, v2 = torch.randn(b, h, 1, d, generator=g), torch.randn(b, h, 1, d, generator=g)
    (k, v), obs = observe(cache.append, k2, v2)
    assert_route(obs, "LayerKVCache.append")
    assert cache.length == 5, f"after appending 4 and then 1 positions, length is {cache.length}; expected 5"
    assert tuple(k.shape) == (b, h, 5, d), f"append returned k of shape {tuple(k.shape)}; expected the valid prefix {(b, h, 5, d)}"
    assert torch.equal(k, torch.cat([k1, k2], 2)) and torch.equal(v, torch.cat([v1, v2], 2)), (
        "append must return all positions held so far (old ones first, then the new ones)")
    assert k.data_ptr() == ptr, (
        "append should return views of one preallocated buffer (e.g. self.k[:, :, :length]); "
        "it seems to build a new tensor each time (torch.cat?), which allocates and copies the whole cache every step")
    assert obs.peak_bytes < k1.nbytes, (
        f"appending one position allocated {obs.peak_bytes} bytes; it should only write into the preallocated "
        f"buffers (a torch.cat of the whole cache allocates it anew at every step)")
    try:
        cache.append(torch.randn(b, h, 6, d, generator=g), torch.randn(b, h, 6, d, generator=g))
    except NotImplementedError:
        raise
    except Exception as e:  # noqa: BLE001  (whatever it raised is the verdict, in one line)
        assert isinstance(e, ValueError), (
            f"overflow raised {type(e).__name__}; raise CacheOverflowError (a ValueError) with a message saying why")
        assert str(e), "the overflow error needs a message (how many positions are held, how many fit)"
    else:
        raise AssertionError(f"appending 6 positions to a cache holding 5 of {max_len} must raise CacheOverflowError, not succeed")
    assert cache.length == 5, f"a refused append must leave the cache as it was; length is now {cache.length}, expected 5"
    # Another dtype, and a device given: the buffers must be made there (meta stands in for a GPU).
    half = LayerKVCache(1, 2, 6, 8, torch.float16, None)
    assert half.nbytes == 2 * 1 * 2 * 6 * 8 * 2, f"an fp16 cache of [1, 2, 6, 8] has nbytes {half.nbytes}; expected {2 * 2 * 6 * 8 * 2}"
    meta = LayerKVCache(1, 2, 6, 8, torch.float32, "meta")
    try:
        mk, _ = meta.append(torch.zeros(1, 2, 3, 8, device="meta"), torch.zeros(1, 2, 3, 8, device="meta"))
    except RuntimeError as e:
        raise AssertionError(f"LayerKVCache(..., device='meta') then append of meta tensors failed: {e} — allocate the "
                             f"buffers with device=device") from None
    assert mk.device.type == "meta", f"a cache built with device='meta' returned keys on {mk.device}"
    # The cache in the model: cached decoding (a prefill, single steps, then chunks of several) = a full forward.
    model = tiny_model(seed=5, n_heads=4, n_kv_heads=2)
    cfg = model.config
    ids = torch.randint(0, cfg.vocab_size, (2, 16), generator=generator(41))
    kv = ref.KVCache([LayerKVCache(2, cfg.n_kv_heads, 16, cfg.head_dim, torch.float32, None) for _ in range(cfg.n_layers)])
    with torch.no_grad():
        full = model(ids)
        bounds = [0, 5, 6, 7, 10, 11, 16]
        steps = [model(ids[:, a:e], cache=kv) for a, e in zip(bounds[:-1], bounds[1:])]
    _close(torch.cat(steps, 1), full, "a tiny model decoding with your LayerKVCache (prefill 5, steps of 1, 1, 3, 1, 5) "
                                      "vs a full forward")


# --- 4 ------------------------------------------------------------------------------------------------

@WEEK.exercise(4, "gqa_attention", section="4 (Attention with grouped KV heads)")
def check_gqa_attention(gqa_attention) -> None:
    cases = [(8, 8, 5, 5, 16), (8, 2, 5, 5, 24), (8, 1, 5, 5, 16), (9, 3, 1, 7, 40), (6, 3, 3, 8, 20), (4, 4, 1, 1, 16),
             (6, 2, 4, 4, 64)]
    for i, (h, hkv, tq, tk, d) in enumerate(cases):
        g = generator(50 + i)
        q = torch.randn(2, tq, h, d, generator=g).transpose(1, 2) if i % 2 else torch.randn(2, h, tq, d, generator=g)
        k, v = torch.randn(2, hkv, tk, d, generator=g), torch.randn(2, hkv, tk, d, generator=g)
        for causal in (True, False):
            got = gqa_attention(q, k, v, causal=causal)
            assert tuple(got.shape) == (2, h, tq, d), (
                f"gqa_attention with q {tuple(q.shape)}, k {tuple(k.shape)} returned {tuple(got.shape)}; "
                f"expected [batch, n_heads, q_len, head_dim] = {(2, h, tq, d)}")
            want = ref_gqa_attention(q, k, v, causal=causal)
            kind = "MHA" if h == hkv else "MQA" if hkv == 1 else f"GQA {h}:{hkv}"
            _close(got, want, f"{kind}, q_len={tq}, kv_len={tk}, head_dim={d}, causal={causal}"
                              f"{', q non-contiguous (a transposed view, as the model passes it)' if i % 2 else ''} "
                              f"(query head j reads KV head j // {h // hkv}; causal means the bottom-right aligned causal_mask)",
                   atol=1e-5, rtol=1e-5)
    for dtype, atol in [(torch.float16, 2e-3), (torch.bfloat16, 1.6e-2)]:
        g = generator(60)
        q, k, v = (torch.randn(1, n, 12, 40, generator=g).to(dtype) for n in (6, 2, 2))
        want = ref_gqa_attention(q.float(), k.float(), v.float(), causal=True).to(dtype)
        _close(gqa_attention(q, k, v, causal=True), want, f"gqa_attention on {dtype} inputs (softmax in float32, "
                                                          f"output in the inputs' dtype)", atol=atol, rtol=atol)
    g = generator(61)
    q, k, v = torch.randn(1, 6, 7, 24, generator=g), torch.randn(1, 2, 9, 24, generator=g), torch.randn(1, 2, 9, 24, generator=g)
    got, obs = observe(gqa_attention, q, k, v, causal=True)
    _close(got, ref_gqa_attention(q, k, v, causal=True), "gqa_attention (q [1, 6, 7, 24], k [1, 2, 9, 24], causal), the "
           "call whose route is judged", atol=1e-5, rtol=1e-5)
    assert_route(obs, "gqa_attention", lib_allowed=("lib.masks.causal_mask",),
                 forbidden_ops=("aten._scaled_dot_product", "aten.scaled_dot_product", "aten._flash_attention"),
                 why="Write softmax(q kᵀ/√d) v with your causal_mask yourself.")
    check_on_meta(gqa_attention, (q, k, v), "gqa_attention", dict(causal=True))
    model = tiny_model(seed=7, n_heads=6, n_kv_heads=2, d_model=48)
    ids = torch.randint(0, model.config.vocab_size, (1, 9), generator=generator(62))
    with torch.no_grad():
        want = model(ids)
        model.attention_fn = gqa_attention
        got = model(ids)
    _close(got, want, "a tiny GQA model with your gqa_attention vs lib.attention.gqa_attention")


# --- 5 ------------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=1)
def smollm2_prompt():
    from lib.model import shared_smollm2

    model, tok = shared_smollm2()
    return model, tok(SMOLLM2_PROMPT, return_tensors="pt").input_ids


@functools.lru_cache(maxsize=2)
def _smollm2_uncached(dtype, shape, values):
    """SmolLM2's logits for every position of `values` in one uncached forward. Kept per process: every honest
    submission produces the same 64 tokens, so a grading worker computes this once (about 0.6 s a submission)."""
    model, _ = smollm2_prompt()
    with torch.no_grad():
        return model(torch.tensor(values, dtype=dtype, device=model.device).reshape(shape))


@WEEK.exercise(5, "generate", section="5 (Generation with the cache)")
def check_generate(generate, smollm2: bool = True) -> None:
    """Tiny random configs: cached == uncached (and == lib's generate). SmolLM2: 64 greedy cached tokens are
    what uncached decoding gives: one forward over the final sequence yields every step's uncached logits."""
    for i, conf in enumerate(TINY_CONFIGS):
        model = tiny_model(**conf)
        batch = 1 + i % 2
        ids = torch.randint(0, model.config.vocab_size, (batch, 3 + i), generator=generator(100 + i))
        spy = CountingModel(model)
        c_ids, c_logits = _run_generate(generate, spy, ids, 20, use_cache=True)
        assert spy.calls, "generate never called the model as model(ids, cache=...): call the model itself, not model.forward"
        assert spy.calls[0] == ids.shape[1] and all(n == 1 for n in spy.calls[1:]), (
            f"with use_cache=True the model should see the prompt once, then one token per step; it saw "
            f"{spy.calls[:6]}... tokens per call")
        u_ids, u_logits = _run_generate(generate, model, ids, 20, use_cache=False)
        if i == 0:
            _, obs = observe(generate, model, ids, 3, use_cache=True, return_logits=True)
            assert_route(obs, "generate", lib_allowed=("lib.model", "lib.kv_cache", "lib.masks", "lib.attention"),
                         why="Write the decode loop yourself; lib.generate is the reference it is compared with.")
        r_ids, r_logits = ref_generate(model, ids, 20, use_cache=False, return_logits=True)
        what = f"tiny model {conf}, batch {batch}"
        assert torch.equal(u_ids, r_ids), f"{what}: your uncached generate gives other tokens than lib.generate.generate"
        assert torch.equal(c_ids, u_ids), f"{what}: cached and uncached generation give different tokens"
        _close(c_logits, u_logits, f"{what}: cached vs uncached logits")
        _close(u_logits, r_logits, f"{what}: uncached logits vs lib.generate.generate")
    if not smollm2:
        return
    model, prompt = smollm2_prompt()
    prompt = prompt.to(model.device)  # the model may be on a GPU
    spy = CountingModel(model)
    ids, logits = _run_generate(generate, spy, prompt, SMOLLM2_NEW_TOKENS, use_cache=True)
    assert spy.calls and all(n == 1 for n in spy.calls[1:]), "with use_cache=True each decode step should feed the model one token"
    head = ids[:, :-1]
    full = _smollm2_uncached(head.dtype, tuple(head.shape), tuple(head.flatten().tolist()))
    full = full[:, prompt.shape[1] - 1:]  # [1, new, vocab]: the uncached logits of every step
    steps = (full.argmax(-1) != ids[:, prompt.shape[1]:]).nonzero()
    assert len(steps) == 0, (
        f"SmolLM2: at step {steps[0, 1].item()} uncached greedy decoding picks another token than your cached loop")
    _close(logits, full, f"SmolLM2, {SMOLLM2_NEW_TOKENS} greedy tokens: cached logits vs uncached")


# --- 6 ------------------------------------------------------------------------------------------------

@WEEK.exercise(6, "roofline_time", section="6 (How much faster, and why)")
def check_roofline_time(roofline_time) -> None:
    cases = [(1e9, 1e6, 1e11, 1e10), (1e6, 1e9, 1e11, 1e10), (2e10, 5e8, 3.2e11, 2.5e10), (0, 8, 1, 2)]
    g = generator(70)
    for _ in range(4):
        cases.append(tuple(float(10 ** (x * 12)) for x in torch.rand(4, generator=g, dtype=torch.float64)))
    for flops, nbytes, f, bw in cases:
        (got, obs), want = observe(roofline_time, flops, nbytes, f, bw), roofline.roofline_time(flops, nbytes, f, bw)
        assert abs(got - want) <= 1e-9 * want, (
            f"roofline_time(flops={flops:g}, bytes={nbytes:g}, flops_per_s={f:g}, bytes_per_s={bw:g}) = {got:g}; expected "
            f"{want:g}: compute takes {flops / f:g} s, memory traffic {nbytes / bw:g} s, and they overlap {seed_note()}")
        assert_route(obs, "roofline_time")


# --- 7 ------------------------------------------------------------------------------------------------

@WEEK.exercise(7, "kv_cache_bytes", section="7 (How much memory)")
def check_kv_cache_bytes(kv_cache_bytes) -> None:
    got = kv_cache_bytes(40, 40, 128, 1)
    assert got == 819_200, (
        f"OPT-13B (40 layers, 40 heads of 128, fp16) needs 819,200 bytes per token; kv_cache_bytes(40, 40, 128, 1) = {got}")
    got = kv_cache_bytes(96, 96, 128, 1)
    assert got == 4.5 * 2 ** 20, f"GPT-3 175B (96 layers, 96 heads of 128, fp16) needs 4.5 MiB = 4,718,592 B per token; got {got}"
    cases = [(40, 40, 128, 2048), (32, 8, 128, 4096, 4), (30, 3, 64, 100, 2, 4), (1, 1, 1, 1, 1, 1)]
    for i in range(4):
        cases.append(tuple(_ints(80 + i, 4, 1, 300)) + (_ints(90 + i, 1, 1, 9)[0], (1, 2, 4)[i % 3]))
    for args in cases:
        (got, obs), want = observe(kv_cache_bytes, *args), ref.kv_cache_bytes(*args)
        assert got == want, f"kv_cache_bytes{args} = {got}; expected {want} {seed_note()}"
        assert_route(obs, "kv_cache_bytes")
    for batch, length in [(1, 1), (2, 100), (3, 37)]:
        cache = ref.KVCache.for_model(SMOLLM2_135M, batch, length, dtype=torch.float32)
        got = kv_cache_bytes(SMOLLM2_135M.n_layers, SMOLLM2_135M.n_kv_heads, SMOLLM2_135M.head_dim, length,
                             batch=batch, bytes_per_element=4)
        assert got == cache.nbytes, (
            f"SmolLM2, batch {batch}, {length} positions, fp32: the allocated cache holds {cache.nbytes} bytes; "
            f"kv_cache_bytes says {got}")


# --- 8 ------------------------------------------------------------------------------------------------

@WEEK.exercise(8, "pool_kv_heads", section="8 (What sharing KV heads costs)")
def check_pool_kv_heads(pool_kv_heads) -> None:
    model = tiny_model(seed=11, n_heads=4, n_kv_heads=4)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ids = torch.randint(0, model.config.vocab_size, (2, 10), generator=generator(120))
    for g in (4, 2, 1):
        pooled, obs = observe(pool_kv_heads, model, g)
        assert_route(obs, f"pool_kv_heads(model, {g})", lib_allowed=("lib.model",),
                     why="Mean-pool the k_proj and v_proj heads yourself; lib.gqa is the reference.")
        assert pooled is not model, "pool_kv_heads must return a new model"
        assert pooled.config.n_kv_heads == g, f"pool_kv_heads(model, {g}).config.n_kv_heads = {pooled.config.n_kv_heads}"
        want = ref_pool_kv_heads(model, g)
        got_sd, want_sd = pooled.state_dict(), want.state_dict()
        for name, w in want_sd.items():
            assert name in got_sd and tuple(got_sd[name].shape) == tuple(w.shape), (
                f"pooled to {g} KV heads, {name} should have shape {tuple(w.shape)}")
            _close(got_sd[name], w, f"pooled to {g} KV heads, {name} (the mean of the KV heads of each group, in order)",
                   atol=1e-6)
        with torch.no_grad():
            _close(pooled(ids), want(ids), f"logits of the model pooled to {g} KV heads")
    for name, w in model.state_dict().items():
        assert torch.equal(w, before[name]), f"pool_kv_heads changed the original model's {name}: build a new model instead"
    # KV heads that are already equal within each group: pooling must not change the outputs.
    with torch.no_grad():
        for layer in model.layers:
            for proj in (layer.attn.k_proj, layer.attn.v_proj):
                w = proj.weight.view(2, 2, -1, proj.weight.shape[1])
                w[:, 1] = w[:, 0]
        _close(pool_kv_heads(model, 2)(ids), model(ids), "pooling KV heads that are equal within each group", atol=1e-5)


# --- 9 ------------------------------------------------------------------------------------------------

def _rolling_stream(RollingKVCache, window, steps):
    """Memory over a whole stream of appends (fresh inputs each step): what stays alive must not grow."""
    def stream():
        cache = RollingKVCache(1, 2, window, 8, torch.float32, None)
        for t in range(steps):
            cache.append(torch.full((1, 2, 1, 8), float(t)), torch.full((1, 2, 1, 8), float(t)))
        return cache.length
    _, obs = observe(stream)
    row = 2 * 2 * 8 * 4  # K and V of one position, fp32
    limit = 6 * (window + 1) * row + 4096
    assert obs.peak_bytes <= limit, (
        f"RollingKVCache(window={window}): {steps} appends of one position kept {obs.peak_bytes} bytes alive at peak; "
        f"a rolling buffer holds {window} positions ({window * row} bytes) whatever the length: keep nothing else")


def _rolling_positions(RollingKVCache, window, schedule, offset):
    """Append positions in chunks of `schedule`, each key/value holding its position number; check what each
    append returns (held positions oldest first, then the new ones) and that memory does not grow."""
    cache = RollingKVCache(1, 2, window, 3, torch.float32, None)
    nbytes, length = cache.nbytes, 0
    for t in schedule:
        pos = torch.arange(length, length + t, dtype=torch.float32)
        new = pos[None, None, :, None].expand(1, 2, t, 3).contiguous()
        (k, v), obs = observe(cache.append, new, -new)
        held = min(length, window)
        want = list(range(length - held, length + t))
        what = f"RollingKVCache(window={window}) after {length} positions, append of {t}"
        assert isinstance(k, torch.Tensor) and k.dim() == 4, f"{what}: append must return (keys, values) [B, Hkv, n, d]"
        assert k[0, 0, :, 0].tolist() == [float(p) for p in want], (
            f"{what} returned keys of positions {[int(x) for x in k[0, 0, :, 0].tolist()]}; expected the "
            f"{held} held positions (oldest first) then the {t} new ones: {want[:6]}{'...' if len(want) > 6 else ''}")
        assert torch.equal(v, -k), f"{what}: values must come back in the same order as the keys"
        assert_route(obs, "RollingKVCache.append")
        limit = 4 * (window + t) * 2 * 3 * 4 + 4096  # a few copies of the returned keys and values
        assert obs.peak_bytes <= limit, (
            f"{what}: the append allocated {obs.peak_bytes} bytes; a rolling cache needs O(window + t), not memory "
            f"that grows with the sequence")
        length += t
        assert cache.length == length, f"{what}: length is {cache.length}; it counts every position ever appended ({length})"
        assert cache.nbytes == nbytes, f"{what}: nbytes changed from {nbytes} to {cache.nbytes}; the buffers are allocated once"


@WEEK.exercise(9, "RollingKVCache", section="9 (Sliding window)")
def check_RollingKVCache(RollingKVCache) -> None:
    cache, obs = observe(RollingKVCache, 1, 1, 3, 2, torch.float32, None)
    assert_route(obs, "RollingKVCache(...)", why="Write the class yourself; do not subclass lib.kv_cache.RollingKVCache.")
    # Appends of one position, of several after the prefill, and of more than a window in the middle of a stream.
    _rolling_positions(RollingKVCache, 3, [1] * 10, 0)
    _rolling_positions(RollingKVCache, 4, [3, 1, 2, 1, 6, 1, 4, 9, 1], 1)
    _rolling_positions(RollingKVCache, 5, _ints(130, 12, 1, 12), 2)
    _rolling_stream(RollingKVCache, 4, 120)
    for window, prompt, conf, chunks in [(4, 3, TINY_CONFIGS[1], [1]), (3, 7, TINY_CONFIGS[2], [1, 2]),
                                         (1, 2, TINY_CONFIGS[0], [1]), (6, 6, TINY_CONFIGS[3], [1, 3, 8, 1])]:
        model = tiny_model(**conf)
        model.attention_fn = ref.sliding_window_attention(window)
        cfg = model.config
        layers = [RollingKVCache(2, cfg.n_kv_heads, window, cfg.head_dim, torch.float32, None) for _ in range(cfg.n_layers)]
        cache = ref.KVCache(layers)
        nbytes = 2 * 2 * cfg.n_kv_heads * window * cfg.head_dim * 4
        assert layers[0].nbytes == nbytes, (
            f"RollingKVCache(2, {cfg.n_kv_heads}, window={window}, {cfg.head_dim}).nbytes = {layers[0].nbytes}; "
            f"expected {nbytes}: K and V buffers of [batch, n_kv_heads, window, head_dim], fp32")
        ids = torch.randint(0, cfg.vocab_size, (2, prompt + 3 * window + 10), generator=generator(140 + window))
        with torch.no_grad():
            full = model(ids)  # sliding-window attention over the whole sequence, no cache
            steps, t, i = [model(ids[:, :prompt], cache=cache)], prompt, 0
            while t < ids.shape[1]:
                n = min(chunks[i % len(chunks)], ids.shape[1] - t)
                steps.append(model(ids[:, t:t + n], cache=cache))
                t, i = t + n, i + 1
                assert layers[0].nbytes == nbytes, f"the rolling cache's nbytes changed to {layers[0].nbytes} at position {t}"
        assert cache.length == ids.shape[1], (
            f"after {ids.shape[1]} positions, length is {cache.length}: length counts every position appended "
            f"(the model takes the RoPE position of the next token from it)")
        _close(torch.cat(steps, 1), full, f"window {window}, prompt {prompt}, then chunks of {chunks}: decoding with your "
                                          f"RollingKVCache vs full attention with a sliding-window mask")
    # The buffers live on the device given (meta stands in for a GPU).
    meta = RollingKVCache(1, 2, 4, 8, torch.float32, "meta")
    try:
        for t in (3, 2, 6):
            mk, _ = meta.append(torch.zeros(1, 2, t, 8, device="meta"), torch.zeros(1, 2, t, 8, device="meta"))
    except RuntimeError as e:
        raise AssertionError(f"RollingKVCache(..., device='meta') then appends of meta tensors failed: "
                             f"{str(e).splitlines()[0]} — allocate the buffers, and the slot indices (torch.arange), "
                             f"on the cache's device") from None
    assert mk.device.type == "meta", f"a cache built with device='meta' returned keys on {mk.device}"


# --- 10 -----------------------------------------------------------------------------------------------

@WEEK.exercise(10, "answer_q1", section="10 (Check your understanding)")
def check_answer_q1(answer_q1) -> None:
    got = float(answer_q1())
    if abs(got - 13e9 * 2 / 2 ** 30) < 0.05:
        raise AssertionError(f"{got:.3g} is in GiB (2^30 bytes); the question asks for GB = 10^9 bytes")
    assert abs(got - 26.0) < 0.05, f"answer_q1() = {got}: count the bytes of 13e9 weights of 2 bytes each, in GB (10^9 B)"


@WEEK.exercise(10, "answer_q3", section="10 (Check your understanding)")
def check_answer_q3(answer_q3) -> None:
    got = float(answer_q3())
    assert abs(got - 4.0) < 1e-9, (
        f"answer_q3() = {got}: the cache holds one K and one V per KV head; compare 32 KV heads (MHA) with 8")
