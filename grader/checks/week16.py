"""Week 16 — the KV cache and GQA: the milestone checks, used by solutions/16/test_week16.py and the notebook.

One `check_<name>` per exercise; each takes the student's function or class and raises AssertionError
with a message that says what is wrong. The references are in lib/ (kv_cache, attention, generate, gqa).
Every check follows the three rules of `grader.checks`, and one more: **every number a check grades comes from
a call it observed**, whose route it judged in that same call — the calls a check's model makes into the student's
code too (its attention function, its cache's appends) — so code that computes one way when watched and another
way elsewhere is graded on what it did when watched. What each rejects besides wrong numbers
(tests/test_week16_checks.py in-process, tests/test_week16_integrity.py through the isolated path):

- step_flops, roofline_time, kv_cache_bytes, the quiz answers: `lib`'s function under another name; a table of
  the checked values (random cases); roofline_time, the sum of the two times.
- decode_time (`week16_predict`, no lib counterpart): graded on the student's model, on configurations drawn per run;
  each natural mistake (the cache left out, query heads for KV heads, weights per sequence, one side of the roofline,
  their sum, ...) misses, and its hint names it.
- causal_mask: top-left alignment; `lib`'s mask; a mask built on the CPU when `device=` says otherwise.
- LayerKVCache (`week16_caches`): buffers not allocated whole in `__init__` (a cache of 8 positions that grows
  past them); `torch.cat` growth or copies (what an append allocates is bounded by what it appends, at every length
  up to a `max_len` in [48, 400) drawn from the run's seed, filled to the last position, on the host too at the
  end); an append
  that writes nothing into the buffers; returned keys that are not views of one buffer; `lib`'s class; buffers on
  the CPU when a device is given; buffers of another dtype than asked (fp16 and bf16 caches: the constructor's
  bytes bounded both ways, appends of that dtype, views of that dtype and storage back); a refused append that changes the cache.
- gqa_attention: SDPA (or fused attention ops) or `lib`'s reference, on every call: MHA, GQA, MQA, batch 1 to 3,
  q_len < kv_len, odd head dims, non-contiguous q, fp16/bf16, four shapes drawn from the seed, and each call a
  tiny model makes; CPU-built masks.
- generate: re-running the whole sequence when `use_cache=True`, however the model is reached. The model handed
  in is the model itself (no wrapper, nothing a model lacks): `grader.checks.ModelMeter` counts, in this process
  where it runs, the tokens each of its forwards embeds and the FLOPs done with its weights, via `model(...)`,
  `model.forward(...)` or its layers one by one; the student's process may run attention (its own, plugged in) but
  not a copy of the weights: its observed matrix-product FLOPs and summed elements stay within what the forwards'
  attention can need (a copy run there, with matmuls or as products and sums, exceeds it). Every call observed and
  metered; `lib.modeling.generate`; a prompt cut to fit a cache of a fixed size (a tiny model's prompt of 300 to 900
  tokens, drawn per run, must reach the first forward whole). Not seen: a copy of the weights run in numpy.
- pool_kv_heads: `lib.modeling.gqa`; changing the original model; the pooled model's state_dict and forward observed.
- RollingKVCache (`week16_caches`): buffers not allocated in `__init__`; an append that writes nothing into them
  (a list of the appended chunks, numpy history); what an append allocates growing past the window, over a stream
  of 320+ positions with a window drawn from the seed, on the host too at its end (numpy); what the cache object
  keeps (`grader.held`: a history of the chunks, copied or by reference, in the object, its class or the
  notebook's namespace) and `length` (a counter that wraps), over 40,000 to 70,000 positions drawn per run;
  `lib`'s class; appends of several positions after the prefill and of more than a window mid-stream; CPU buffers.
"""
from __future__ import annotations

import functools
import math

import torch

from grader.checks import sweep
from grader.checks import week16_predict as predict
from grader.checks import (ModelMeter, assert_close, assert_route, check_on_meta, generator, observe,
                           seed_note)
from grader.checks.week16_caches import (Watched, append_observed, constructed, ints, layer_dtypes, layer_fill,
                                        layer_limit, overflow, rolling_dtypes, rolling_limit, rolling_new, rolling_positions,
                                        rolling_stream)
from grader.harness import Week
from lib.modeling import kv_cache as ref
from lib.attn.masks import causal_mask as ref_causal_mask
from lib.bench import roofline
from lib.attn.attention import gqa_attention as ref_gqa_attention
from lib.modeling.generate import generate as ref_generate
from lib.modeling.gqa import pool_kv_heads as ref_pool_kv_heads
from lib.modeling.llama import SMOLLM2_135M, tiny_model

WEEK = Week(16, "week16_kv_cache.ipynb",
            child_may_use={"lib.modeling.kv_cache": ("KVCache", "CacheOverflowError"), "lib.modeling.llama": "*"})

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


def _remote(fn) -> bool:
    """Whether `fn` runs in the student's process (a proxy): then `observe` sees that process's work only."""
    return getattr(fn, "__observe__", None) is not None


def _token_flops(model) -> int:
    """FLOPs of one token through the model's linear maps (every projection, the LM head): what a forward costs per
    token it is fed, attention aside."""
    flops = sum(2 * m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    return flops + (2 * model.embed.weight.numel() if model.lm_head is None else 0)


def _run_generate(generate, model, ids, n, use_cache, full=False):
    """`generate(model, ids, n, use_cache=..., return_logits=True)`, observed in the student's process and metered
    here, where the model runs (`ModelMeter`: however the code reaches it). Every call a check judges goes
    through here, with the model itself (no wrapper): nothing tells a graded call from another. `full` also names
    the lib functions that ran (the profiler: slower, so on one call of the check). In this process (the notebook's
    own kernel, or trusted code under test) only the `full` call is observed: the meter sees everything there, and
    observing SmolLM2's decoding in-process would make the notebook's check several times slower."""
    lib_ok = ("lib.modeling.llama", "lib.modeling.kv_cache", "lib.attn.masks", "lib.attn.attention")
    remote = _remote(generate)
    with ModelMeter(model) as seen:
        if remote or full:
            out, obs = observe(generate, model, ids, n, use_cache=use_cache, return_logits=True, _observe_light=not full)
        else:
            out, obs = generate(model, ids, n, use_cache=use_cache, return_logits=True), None
    if obs is not None:
        assert_route(obs, "generate", lib_allowed=lib_ok,
                     why="Write the decode loop yourself; lib.modeling.generate is the reference it is compared with.")
    assert isinstance(out, tuple) and len(out) == 2, (
        "generate(..., return_logits=True) must return a pair (ids, logits), like lib.modeling.generate.generate")
    got_ids, logits = out
    b, t = ids.shape
    assert isinstance(got_ids, torch.Tensor) and tuple(got_ids.shape) == (b, t + n), (
        f"generate returned ids of shape {tuple(getattr(got_ids, 'shape', ()))}; expected [batch, prompt + new] = {(b, t + n)}")
    assert torch.equal(got_ids[:, :t].cpu(), ids.cpu()), "the returned ids must start with the prompt"
    assert isinstance(logits, torch.Tensor) and tuple(logits.shape) == (b, n, model.config.vocab_size), (
        f"logits have shape {tuple(getattr(logits, 'shape', ()))}; expected [batch, new, vocab] = {(b, n, model.config.vocab_size)}")
    per_token = _token_flops(model)
    assert seen.flops <= seen.tokens * per_token, (
        f"the model's weights did {seen.flops:,} FLOPs of work, more than the {seen.tokens} tokens its forwards "
        f"were fed account for ({seen.tokens * per_token:,}): call the model itself, model(ids, cache=...), "
        f"not its layers one by one")
    if remote:  # the student's process may run attention (its own, plugged in), not the model's weights
        cfg = model.config
        attention = 4 * cfg.n_layers * cfg.d_model * (t + n) * seen.tokens  # the most the forwards' attention needs
        # matrix products, and elements summed (a product written as a multiply and a sum is not a matmul to torch)
        # (sums only: choosing the next token — argmax, topk, sort over the logits — multiplies nothing)
        work = obs.flops + 2 * sum(math.prod(shape) for name, shape, _ in obs.reductions if name in _SUMS)
        assert work <= attention + per_token // 2, (
            f"generate computed {work:,} FLOPs of matrix products and sums in your own process, more than the "
            f"attention of the model's forwards could need ({attention:,}): run the model you are given "
            f"(model(ids, cache=...)), not a copy of its weights")
    if use_cache:
        assert seen.calls, "generate never ran the model it was given: call it as model(ids, cache=...)"
        assert seen.calls[0] >= t, (
            f"the model's first forward saw {seen.calls[0]} of the prompt's {t} tokens: feed the whole prompt, however "
            f"long, into a cache sized for it and the new tokens (model.new_cache(batch, prompt + max_new_tokens)); a "
            f"prompt cut to fit a cache of a fixed size forgets its beginning {seed_note()}")
        assert seen.calls[0] == t and all(c == 1 for c in seen.calls[1:]) and seen.tokens <= b * (t + n), (
            f"with use_cache=True the model should see the prompt ({t} tokens) once, then one token per step; its "
            f"forwards were fed {seen.calls[:6]}{'...' if len(seen.calls) > 6 else ''} tokens per sequence "
            f"({len(seen.calls)} forwards, {seen.tokens} tokens in all for {b} x ({t} + {n}))")
    return got_ids, logits


# The reductions that add up products: what a copy of the weights run as a multiply and a sum would call.
_SUMS = frozenset(f"aten.{n}" for n in ("sum", "nansum", "mean", "cumsum", "linalg__powsum", "scatter_add",
                                        "index_add", "embedding_bag", "_embedding_bag", "segment_reduce",
                                        "scatter_reduce", "index_reduce", "bincount", "addcmul"))


# --- 1 ------------------------------------------------------------------------------------------------

@WEEK.exercise(1, "step_flops", section="1 (Why generation without a cache is quadratic)")
def check_step_flops(step_flops) -> None:
    cases = [(100, 2, 8, 1), (100, 2, 8, 10), (134_515_008, 30, 576, 64), (7, 1, 3, 256), (10**9, 40, 5120, 2048)]
    for i in range(4):
        n_params, n_layers, d_model, seq_len = ints(10 + i, 4, 1, 5000)
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
    sweep.step_flops(step_flops)


# --- 2 ------------------------------------------------------------------------------------------------

@WEEK.exercise(2, "causal_mask", section="2 (The causal mask)")
def check_causal_mask(causal_mask) -> None:
    sizes = [(1, 1), (5, 5), (1, 9), (3, 8), (4, 4), (2, 7), (16, 16), (1, 300), (0, 3)]
    for i in range(4):
        kv_len = ints(20 + i, 1, 1, 200)[0]
        sizes.append((ints(30 + i, 1, 1, kv_len + 1)[0], kv_len))
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
    assert_route(obs, "LayerKVCache(...)", why="Write the class yourself; do not subclass lib.modeling.kv_cache.LayerKVCache.")
    assert cache.length == 0, f"a new cache has length {cache.length}; expected 0"
    assert cache.max_len == max_len, f"max_len is {cache.max_len}; expected {max_len}"
    want_bytes = 2 * b * h * max_len * d * 4
    assert cache.nbytes == want_bytes, (
        f"nbytes is {cache.nbytes}; expected {want_bytes} = 2 (K and V) x {b} x {h} x {max_len} x {d} x 4 bytes, "
        f"allocated once in __init__")
    g = generator(40)
    k1, v1 = torch.randn(b, h, 4, d, generator=g), torch.randn(b, h, 4, d, generator=g)
    k, v = append_observed(cache, k1, v1, "LayerKVCache.append of 4 to an empty cache", layer_limit(k1, v1))
    assert tuple(k.shape) == (b, h, 4, d) and tuple(v.shape) == (b, h, 4, d), (
        f"after appending 4 positions, append returned k {tuple(k.shape)} and v {tuple(v.shape)}; expected {(b, h, 4, d)}")
    assert torch.equal(k, k1) and torch.equal(v, v1), "append must return the keys and values it holds, in order"
    ptr = k.data_ptr()
    k2, v2 = torch.randn(b, h, 1, d, generator=g), torch.randn(b, h, 1, d, generator=g)
    k, v = append_observed(cache, k2, v2, "LayerKVCache.append of 1 to a cache holding 4", layer_limit(k2, v2))
    assert cache.length == 5, f"after appending 4 and then 1 positions, length is {cache.length}; expected 5"
    assert tuple(k.shape) == (b, h, 5, d), f"append returned k of shape {tuple(k.shape)}; expected the valid prefix {(b, h, 5, d)}"
    assert torch.equal(k, torch.cat([k1, k2], 2)) and torch.equal(v, torch.cat([v1, v2], 2)), (
        "append must return all positions held so far (old ones first, then the new ones)")
    assert k.data_ptr() == ptr, (
        "append should return views of one preallocated buffer (e.g. self.k[:, :, :length]); "
        "it seems to build a new tensor each time (torch.cat?), which allocates and copies the whole cache every step")
    overflow(cache, b, h, d, max_len, 6, 5)
    layer_fill(LayerKVCache)
    # Another dtype, and a device given: the buffers must be made there (meta stands in for a GPU).
    layer_dtypes(LayerKVCache)  # fp16 and bf16: buffers of that dtype, appends of it, views of it back
    meta = LayerKVCache(1, 2, 6, 8, torch.float32, "meta")
    try:
        mk, _ = meta.append(torch.zeros(1, 2, 3, 8, device="meta"), torch.zeros(1, 2, 3, 8, device="meta"))
    except RuntimeError as e:
        raise AssertionError(f"LayerKVCache(..., device='meta') then append of meta tensors failed: {e} — allocate the "
                             f"buffers with device=device") from None
    assert mk.device.type == "meta", f"a cache built with device='meta' returned keys on {mk.device}"
    # The cache in the model: cached decoding (a prefill, single steps, then chunks of several) = a full forward;
    # every append the model makes is observed and judged.
    model = tiny_model(seed=5, n_heads=4, n_kv_heads=2)
    cfg = model.config
    n = ints(45, 1, 16, 41)[0]
    ids = torch.randint(0, cfg.vocab_size, (2, n), generator=generator(41))
    layers = [constructed(LayerKVCache, 2, cfg.n_kv_heads, n, cfg.head_dim, torch.float32, None)
              for _ in range(cfg.n_layers)]
    kv = ref.KVCache([Watched(layer, f"LayerKVCache.append, layer {i} of a model", layer_limit)
                      for i, layer in enumerate(layers)])
    bounds = [0, 5, 6, 7, 10, 11, 16] + list(range(19, n, 3)) + [n]
    with torch.no_grad():
        full = model(ids)
        steps = [model(ids[:, a:e], cache=kv) for a, e in zip(bounds[:-1], bounds[1:]) if e > a]
    _close(torch.cat(steps, 1), full, f"a tiny model decoding {n} positions with your LayerKVCache (prefill 5, steps "
                                      f"of 1, 1, 3, 1, 5, then 3 at a time) vs a full forward")


# --- 4 ------------------------------------------------------------------------------------------------

GQA_FORBIDDEN = ("aten._scaled_dot_product", "aten.scaled_dot_product", "aten._flash_attention", "aten._efficient_attention",
                 "aten._cudnn_attention", "aten._native_multi_head_attention", "aten._transformer_encoder",
                 "aten._fused_sdp_choice")


def _gqa_observed(gqa_attention, q, k, v, causal, what):
    """One call of the student's gqa_attention, observed; its route judged. Every result the check grades comes
    from here."""
    got, obs = observe(gqa_attention, q, k, v, causal=causal)
    assert_route(obs, f"gqa_attention ({what})", lib_allowed=("lib.attn.masks.causal_mask",), forbidden_ops=GQA_FORBIDDEN,
                 why="Write softmax(q kᵀ/√d) v with your causal_mask yourself.")
    return got


def _gqa_cases():
    """(batch, n_heads, n_kv_heads, q_len, kv_len, head_dim): MHA, GQA and MQA, one token and many, q_len < kv_len,
    odd head dims, batch 1 to 3; then four more drawn from this run's seed."""
    cases = [(2, 8, 8, 5, 5, 16), (2, 8, 2, 5, 5, 24), (2, 8, 1, 5, 5, 16), (2, 9, 3, 1, 7, 40), (2, 6, 3, 3, 8, 20),
             (2, 4, 4, 1, 1, 16), (2, 6, 2, 4, 4, 64), (1, 6, 2, 7, 9, 24), (3, 4, 1, 2, 11, 7)]
    for i in range(4):
        b, hkv, group, kv_len, d = ints(55 + i, 5, 1, 5)[:3] + ints(65 + i, 1, 1, 40) + ints(75 + i, 1, 3, 72)
        cases.append((b, hkv * group, hkv, ints(85 + i, 1, 1, kv_len + 1)[0], kv_len, d))
    return cases


@WEEK.exercise(4, "gqa_attention", section="4 (Attention with grouped KV heads)")
def check_gqa_attention(gqa_attention) -> None:
    for i, (b, h, hkv, tq, tk, d) in enumerate(_gqa_cases()):
        g = generator(50 + i)
        q = torch.randn(b, tq, h, d, generator=g).transpose(1, 2) if i % 2 else torch.randn(b, h, tq, d, generator=g)
        k, v = torch.randn(b, hkv, tk, d, generator=g), torch.randn(b, hkv, tk, d, generator=g)
        for causal in (True, False):
            kind = "MHA" if h == hkv else "MQA" if hkv == 1 else f"GQA {h}:{hkv}"
            what = (f"{kind}, batch {b}, q_len={tq}, kv_len={tk}, head_dim={d}, causal={causal}"
                    f"{', q non-contiguous (a transposed view, as the model passes it)' if i % 2 else ''}")
            got = _gqa_observed(gqa_attention, q, k, v, causal, what)
            assert isinstance(got, torch.Tensor) and tuple(got.shape) == (b, h, tq, d), (
                f"gqa_attention with q {tuple(q.shape)}, k {tuple(k.shape)} returned {tuple(getattr(got, 'shape', ()))}; "
                f"expected [batch, n_heads, q_len, head_dim] = {(b, h, tq, d)}")
            want = ref_gqa_attention(q, k, v, causal=causal)
            _close(got, want, f"{what} (query head j reads KV head j // {h // hkv}; causal means the bottom-right "
                              f"aligned causal_mask)", atol=1e-5, rtol=1e-5)
    for dtype, atol in [(torch.float16, 2e-3), (torch.bfloat16, 1.6e-2)]:
        g = generator(60)
        q, k, v = (torch.randn(1, n, 12, 40, generator=g).to(dtype) for n in (6, 2, 2))
        want = ref_gqa_attention(q.float(), k.float(), v.float(), causal=True).to(dtype)
        _close(_gqa_observed(gqa_attention, q, k, v, True, str(dtype)), want,
               f"gqa_attention on {dtype} inputs (softmax in float32, output in the inputs' dtype)", atol=atol, rtol=atol)
    g = generator(61)
    q, k, v = torch.randn(1, 6, 7, 24, generator=g), torch.randn(1, 2, 9, 24, generator=g), torch.randn(1, 2, 9, 24, generator=g)
    check_on_meta(gqa_attention, (q, k, v), "gqa_attention", dict(causal=True))
    # In a model: each call the model makes is observed and judged like the others.
    model = tiny_model(seed=7, n_heads=6, n_kv_heads=2, d_model=48)
    ids = torch.randint(0, model.config.vocab_size, (1, 9), generator=generator(62))
    with torch.no_grad():
        want = model(ids)
        model.attention_fn = lambda q, k, v, causal=True: _gqa_observed(gqa_attention, q, k, v, causal, "in a model")
        got = model(ids)
    _close(got, want, "a tiny GQA model with your gqa_attention vs lib.attn.attention.gqa_attention")


# --- 5 ------------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=1)
def smollm2_prompt():
    from lib.modeling.llama import shared_smollm2

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
    what uncached decoding gives: one forward over the final sequence yields every step's uncached logits.
    Every call is observed and metered (`_run_generate`), on the model itself."""
    for i, conf in enumerate(TINY_CONFIGS):
        model = tiny_model(**conf)
        batch = 1 + i % 2
        ids = torch.randint(0, model.config.vocab_size, (batch, 3 + i), generator=generator(100 + i))
        c_ids, c_logits = _run_generate(generate, model, ids, 20, use_cache=True, full=i == 0)
        u_ids, u_logits = _run_generate(generate, model, ids, 20, use_cache=False)
        r_ids, r_logits = ref_generate(model, ids, 20, use_cache=False, return_logits=True)
        what = f"tiny model {conf}, batch {batch}"
        assert torch.equal(u_ids, r_ids), f"{what}: your uncached generate gives other tokens than lib.modeling.generate.generate"
        assert torch.equal(c_ids, u_ids), f"{what}: cached and uncached generation give different tokens"
        _close(c_logits, u_logits, f"{what}: cached vs uncached logits")
        _close(u_logits, r_logits, f"{what}: uncached logits vs lib.modeling.generate.generate")
    # A prompt of 300 to 900 tokens (drawn per run: past any cache size a loop could fix), a few new tokens, cached.
    (t, n), model = ints(105, 2, 300, 901), tiny_model(seed=4, n_heads=4, n_kv_heads=2, max_seq_len=1024)
    ids = torch.randint(0, model.config.vocab_size, (1, t), generator=generator(106))
    c_ids, c_logits = _run_generate(generate, model, ids, 4 + n % 5, use_cache=True)
    r_ids, r_logits = ref_generate(model, ids, 4 + n % 5, use_cache=True, return_logits=True)
    assert torch.equal(c_ids, r_ids), f"a prompt of {t} tokens: your generate gives other tokens than lib's {seed_note()}"
    _close(c_logits, r_logits, f"a prompt of {t} tokens: cached logits vs lib.modeling.generate.generate")
    if not smollm2:
        return
    model, prompt = smollm2_prompt()
    prompt = prompt.to(model.device)  # the model may be on a GPU
    ids, logits = _run_generate(generate, model, prompt, SMOLLM2_NEW_TOKENS, use_cache=True)
    head = ids[:, :-1]
    full = _smollm2_uncached(head.dtype, tuple(head.shape), tuple(head.flatten().tolist()))
    full = full[:, prompt.shape[1] - 1:]  # [1, new, vocab]: the uncached logits of every step
    steps = (full.argmax(-1) != ids[:, prompt.shape[1]:]).nonzero()
    assert len(steps) == 0, (
        f"SmolLM2: at step {steps[0, 1].item()} uncached greedy decoding picks another token than your cached loop")
    _close(logits, full, f"SmolLM2, {SMOLLM2_NEW_TOKENS} greedy tokens: cached logits vs uncached")


# --- 6 ------------------------------------------------------------------------------------------------

@WEEK.exercise(6, "kv_cache_bytes", section="6 (How much memory)")
def check_kv_cache_bytes(kv_cache_bytes) -> None:
    def observed(*args, **kwargs):
        got, obs = observe(kv_cache_bytes, *args, **kwargs)
        assert_route(obs, "kv_cache_bytes")
        return got

    got = observed(40, 40, 128, 1)
    assert got == 819_200, (
        f"OPT-13B (40 layers, 40 heads of 128, fp16) needs 819,200 bytes per token; kv_cache_bytes(40, 40, 128, 1) = {got}")
    got = observed(96, 96, 128, 1)
    assert got == 4.5 * 2 ** 20, f"GPT-3 175B (96 layers, 96 heads of 128, fp16) needs 4.5 MiB = 4,718,592 B per token; got {got}"
    cases = [(40, 40, 128, 2048), (32, 8, 128, 4096, 4), (30, 3, 64, 100, 2, 4), (1, 1, 1, 1, 1, 1)]
    for i in range(4):
        cases.append(tuple(ints(80 + i, 4, 1, 300)) + (ints(90 + i, 1, 1, 9)[0], (1, 2, 4)[i % 3]))
    for args in cases:
        got, want = observed(*args), ref.kv_cache_bytes(*args)
        assert got == want, f"kv_cache_bytes{args} = {got}; expected {want} {seed_note()}"
    for batch, length in [(1, 1), (2, 100), (3, 37)]:
        cache = ref.KVCache.for_model(SMOLLM2_135M, batch, length, dtype=torch.float32)
        got = observed(SMOLLM2_135M.n_layers, SMOLLM2_135M.n_kv_heads, SMOLLM2_135M.head_dim, length,
                       batch=batch, bytes_per_element=4)
        assert got == cache.nbytes, (
            f"SmolLM2, batch {batch}, {length} positions, fp32: the allocated cache holds {cache.nbytes} bytes; "
            f"kv_cache_bytes says {got}")
    sweep.kv_cache_bytes(kv_cache_bytes)


# --- 7 ------------------------------------------------------------------------------------------------

@WEEK.exercise(7, "roofline_time", section="7 (How much faster, and why)")
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
    sweep.roofline_time(roofline_time)


@WEEK.exercise(8, "decode_time", section="7 (How much faster, and why)")
def check_decode_time(decode_time) -> None:
    """Graded on the student's model of one decode step's time, on configurations drawn per run: memory and
    compute bound, GQA and MQA, batches of 2 and more (`week16_predict`: the model and the mistakes it tells apart)."""
    def run(fn, *args):
        got, obs = observe(fn, *args)
        assert_route(obs, "decode_time")
        return got

    predict.judge(decode_time, run)


# --- 8 ------------------------------------------------------------------------------------------------

@WEEK.exercise(9, "pool_kv_heads", section="8 (What sharing KV heads costs)")
def check_pool_kv_heads(pool_kv_heads) -> None:
    model = tiny_model(seed=11, n_heads=4, n_kv_heads=4)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ids = torch.randint(0, model.config.vocab_size, (2, 10), generator=generator(120))

    def run(what, fn, *args, forward=False):
        """A call of the student's (the pooling, or the pooled model's), observed and its route judged; the pooled
        model's forward may run the attention the model was given (lib's)."""
        out, obs = observe(fn, *args)
        assert_route(obs, what, lib_allowed=("lib.modeling.llama", "lib.attn.attention", "lib.attn.masks") if forward else ("lib.modeling.llama",),
                     why="Mean-pool the k_proj and v_proj heads yourself; lib.modeling.gqa is the reference.")
        return out

    for g in (4, 2, 1):
        pooled = run(f"pool_kv_heads(model, {g})", pool_kv_heads, model, g)
        assert pooled is not model, "pool_kv_heads must return a new model"
        assert pooled.config.n_kv_heads == g, f"pool_kv_heads(model, {g}).config.n_kv_heads = {pooled.config.n_kv_heads}"
        want = ref_pool_kv_heads(model, g)
        got_sd, want_sd = run(f"the state_dict of the model pooled to {g}", pooled.state_dict), want.state_dict()
        for name, w in want_sd.items():
            assert name in got_sd and tuple(got_sd[name].shape) == tuple(w.shape), (
                f"pooled to {g} KV heads, {name} should have shape {tuple(w.shape)}")
            _close(got_sd[name], w, f"pooled to {g} KV heads, {name} (the mean of the KV heads of each group, in order)",
                   atol=1e-6)
        with torch.no_grad():
            _close(run(f"the model pooled to {g}", pooled, ids, forward=True), want(ids), f"logits of the model pooled to {g} KV heads")
    for name, w in model.state_dict().items():
        assert torch.equal(w, before[name]), f"pool_kv_heads changed the original model's {name}: build a new model instead"
    # KV heads that are already equal within each group: pooling must not change the outputs.
    with torch.no_grad():
        for layer in model.layers:
            for proj in (layer.attn.k_proj, layer.attn.v_proj):
                w = proj.weight.view(2, 2, -1, proj.weight.shape[1])
                w[:, 1] = w[:, 0]
        pooled = run("pool_kv_heads(model, 2)", pool_kv_heads, model, 2)
        _close(run("the model pooled to 2", pooled, ids, forward=True), model(ids), "pooling KV heads that are equal within each group",
               atol=1e-5)


# --- 9 ------------------------------------------------------------------------------------------------

@WEEK.exercise(10, "RollingKVCache", section="9 (Sliding window)")
def check_RollingKVCache(RollingKVCache) -> None:
    rolling_new(RollingKVCache, 1, 1, 3, 2)
    # Appends of one position, of several after the prefill, and of more than a window in the middle of a stream.
    rolling_positions(RollingKVCache, 3, [1] * 10)
    rolling_positions(RollingKVCache, 4, [3, 1, 2, 1, 6, 1, 4, 9, 1])
    rolling_positions(RollingKVCache, 5, ints(130, 12, 1, 12))
    # A long stream with a window and wide rows drawn from this run's seed: what an append allocates, on the host
    # too, stays bounded by the window (a history kept in numpy or lists grows with the length).
    window, schedule = ints(131, 1, 3, 10)[0], []
    for t in ints(132, 320, 1, 9):  # 320 draws of at least 1: the sum reaches 320
        schedule.append(t)
        if sum(schedule) >= 320:  # past the window many times over, and wider than any bound on an append
            break
    rolling_positions(RollingKVCache, window, schedule, heads=4, d=64, host_at=(len(schedule) - 1,))
    rolling_stream(RollingKVCache)  # 40,000+ positions: `length` past an int16, what the object keeps (grader.held)
    for window, prompt, conf, chunks in [(4, 3, TINY_CONFIGS[1], [1]), (3, 7, TINY_CONFIGS[2], [1, 2]),
                                         (1, 2, TINY_CONFIGS[0], [1]), (6, 6, TINY_CONFIGS[3], [1, 3, 8, 1])]:
        model = tiny_model(**conf)
        model.attention_fn = ref.sliding_window_attention(window)
        cfg = model.config
        layers = [constructed(RollingKVCache, 2, cfg.n_kv_heads, window, cfg.head_dim, torch.float32, None)
                  for _ in range(cfg.n_layers)]
        cache = ref.KVCache([Watched(layer, f"RollingKVCache(window={window}).append, layer {i} of a model",
                                      functools.partial(lambda w, k, v: rolling_limit(w, k), window))
                             for i, layer in enumerate(layers)])
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
        assert layers[0].nbytes == nbytes, f"the rolling cache's nbytes changed to {layers[0].nbytes} after {t} positions"
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
    rolling_dtypes(RollingKVCache)  # (last: the findings above say more about a route that also fails here)


# --- 10 -----------------------------------------------------------------------------------------------

def _answer(fn, what):
    got, obs = observe(fn)
    assert_route(obs, what)
    return got


@WEEK.exercise(11, "answer_q1", section="10 (Check your understanding)")
def check_answer_q1(answer_q1) -> None:
    got = float(_answer(answer_q1, "answer_q1"))
    if abs(got - 13e9 * 2 / 2 ** 30) < 0.05:
        raise AssertionError(f"{got:.3g} is in GiB (2^30 bytes); the question asks for GB = 10^9 bytes")
    assert abs(got - 26.0) < 0.05, f"answer_q1() = {got}: count the bytes of 13e9 weights of 2 bytes each, in GB (10^9 B)"


@WEEK.exercise(12, "answer_q3", section="10 (Check your understanding)")
def check_answer_q3(answer_q3) -> None:
    got = float(_answer(answer_q3, "answer_q3"))
    assert abs(got - 4.0) < 1e-9, (
        f"answer_q3() = {got}: the cache holds one K and one V per KV head; compare 32 KV heads (MHA) with 8")
