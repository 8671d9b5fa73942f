"""Week 16's checks accept the reference solution and reject every wrong route we could think of.

The reference here is the solution notebook's own code (`load_exercises`), i.e. what a student writes; lib's
functions themselves must be *rejected* (a student could import them under the exercise's name). Each wrong
route gives the right numbers (or would, but for the flaw named) by a route the exercise forbids. The SmolLM2
part of `check_generate` is left out here (`smollm2=False`): it needs the real model and is run by
solutions/16/test_week16.py.
"""
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from grader.checks import week16 as checks
from grader.harness import load_exercises
from lib.modeling import generate as lib_generate
from lib.modeling import gqa as lib_gqa
from lib.modeling import kv_cache as lib_kv
from lib.attn import masks as lib_masks
from lib.bench import roofline as lib_roofline
from lib.attn.attention import gqa_attention as lib_gqa_attention
from lib.modeling.kv_cache import CacheOverflowError

NOTEBOOK = Path(__file__).resolve().parent.parent / "solutions" / "16" / checks.WEEK.notebook


@pytest.fixture(scope="module")
def ex():
    return load_exercises(NOTEBOOK, isolated=False)  # the checks themselves are under test: trusted code, in-process


# --- wrong routes -------------------------------------------------------------------------------------

FLOPS_TABLE = {(100, 2, 8, 1, True): 264, (100, 2, 8, 1, False): 264}


def step_flops_table(n_params, n_layers, d_model, seq_len, cached):
    return FLOPS_TABLE.get((n_params, n_layers, d_model, seq_len, cached), 0)


def mask_top_left(q_len, kv_len, device=None):
    return torch.ones(q_len, kv_len, dtype=torch.bool, device=device).tril()


def mask_ignores_device(q_len, kv_len, device=None):
    i = torch.arange(q_len).unsqueeze(1)
    return torch.arange(kv_len).unsqueeze(0) <= i + (kv_len - q_len)


def mask_without_device_argument(q_len, kv_len):
    return mask_ignores_device(q_len, kv_len)


class CatCache:
    """Grows with torch.cat: right values, but a new tensor (and a copy of the whole cache) every append."""

    def __init__(self, batch, n_kv_heads, max_len, head_dim, dtype=torch.float32, device=None):
        self.k = torch.zeros(batch, n_kv_heads, 0, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.max_len, self.itemsize = max_len, torch.finfo(dtype).bits // 8
        self.dims = (batch, n_kv_heads, head_dim)

    @property
    def length(self):
        return self.k.shape[2]

    @property
    def nbytes(self):
        b, h, d = self.dims
        return 2 * b * h * self.max_len * d * self.itemsize

    def append(self, k, v):
        if self.length + k.shape[2] > self.max_len:
            raise CacheOverflowError("full")
        self.k, self.v = torch.cat([self.k, k], 2), torch.cat([self.v, v], 2)
        return self.k, self.v


class Prealloc8Cache(CatCache):
    """Preallocates the first 8 positions (as far as a short check reaches), then grows with torch.cat."""

    def __init__(self, batch, n_kv_heads, max_len, head_dim, dtype=torch.float32, device=None):
        super().__init__(batch, n_kv_heads, max_len, head_dim, dtype, device)
        self.k = torch.zeros(batch, n_kv_heads, min(max_len, 8), head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self._length = 0

    @property
    def length(self):
        return self._length

    def append(self, k, v):
        end = self._length + k.shape[2]
        if end > self.max_len:
            raise CacheOverflowError("full")
        if end > self.k.shape[2]:
            self.k = torch.cat([self.k[:, :, :self._length], k], 2)
            self.v = torch.cat([self.v[:, :, :self._length], v], 2)
        else:
            self.k[:, :, self._length:end], self.v[:, :, self._length:end] = k, v
        self._length = end
        return self.k[:, :, :end], self.v[:, :, :end]


def cache_on_cpu(ex):
    class OnCPU(ex.LayerKVCache):
        def __init__(self, batch, n_kv_heads, max_len, head_dim, dtype=torch.float32, device=None):
            super().__init__(batch, n_kv_heads, max_len, head_dim, dtype, None)  # ignores device
    return OnCPU


def gqa_via_sdpa(q, k, v, causal=True):
    mask = lib_masks.causal_mask(q.shape[2], k.shape[2], device=q.device) if causal else None
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


def gqa_mask_on_cpu(ex):
    def fn(q, k, v, causal=True):
        b, h, tq, d = q.shape
        rep = h // k.shape[1]
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        s = (q @ k.transpose(-1, -2)) / d ** 0.5
        if causal:
            s = s.float() + torch.zeros(tq, k.shape[2]).masked_fill(~ex.causal_mask(tq, k.shape[2]), float("-inf"))
        return torch.softmax(s.float(), -1).to(v.dtype) @ v
    return fn


def generate_always_uncached(ex):
    def fn(model, input_ids, max_new_tokens, use_cache=True, return_logits=False):
        return ex.generate(model, input_ids, max_new_tokens, use_cache=False, return_logits=return_logits)
    return fn


def generate_in_a_cache_of_128(ex):
    """A cache of 128 positions, "enough": the prompt fed cut to its last 128 - max_new_tokens tokens (red team 7, #19)."""
    names = {"torch": torch}
    exec((Path(__file__).parent / "fixtures" / "redteam" / "v7" / "w16_generate_cache128_deque.py").read_text(), names)
    return names["generate"]


@torch.no_grad()
def generate_forward_past_the_counter(model, input_ids, max_new_tokens, use_cache=True, return_logits=False):
    """The prompt through model(...), then model.forward over the whole sequence at every step."""
    b, t = input_ids.shape
    if use_cache:
        model(input_ids, cache=model.new_cache(batch=b, max_len=t + max_new_tokens))
    ids, steps = input_ids, []
    for _ in range(max_new_tokens):
        steps.append(model.forward(ids)[:, -1])
        ids = torch.cat([ids, steps[-1].argmax(-1, keepdim=True)], 1)
    return (ids, torch.stack(steps, 1)) if return_logits else ids


def roofline_sum(flops, bytes_moved, flops_per_s, bytes_per_s):
    return flops / flops_per_s + bytes_moved / bytes_per_s


# decode_time: the natural mistakes, each a whole model of the step with one thing wrong.
def _decode(c, cache_len, batch, fs, bw, kv_heads="n_kv_heads", weights_per_row=False, kv=2, rows=None,
            flops_rows=None, combine=max, scale=1.0):
    e = c["bytes_per_element"]
    rows = batch if rows is None else rows
    flops = (batch if flops_rows is None else flops_rows) * (2 * c["n_params"] + 4 * c["n_layers"] * c["d_model"] * (cache_len + 1))
    nbytes = c["n_params"] * e * (batch if weights_per_row else 1) + kv * c["n_layers"] * c[kv_heads] * c["head_dim"] * (cache_len + 1) * rows * e
    return scale * combine(flops / fs, nbytes / bw)


DECODE_WRONG = [
    (lambda c, n, b, fs, bw: _decode(c, n, b, fs, bw, kv=0), "leaves out the KV cache"),
    (lambda c, n, b, fs, bw: _decode(c, n, b, fs, bw, kv_heads="n_heads"), "query heads"),
    (lambda c, n, b, fs, bw: _decode(c, n, b, fs, bw, weights_per_row=True), "once per sequence"),
    (lambda c, n, b, fs, bw: _decode(c, n, b, fs, bw, kv=1), "keys but not the values"),
    (lambda c, n, b, fs, bw: _decode(c, n, b, fs, bw, rows=1), "one sequence's cache"),
    (lambda c, n, b, fs, bw: _decode(c, n, b, fs, bw, combine=lambda f, m: m), "leaves out the arithmetic"),
    (lambda c, n, b, fs, bw: _decode(c, n, b, fs, bw, combine=lambda f, m: f), "leaves out the memory traffic"),
    (lambda c, n, b, fs, bw: _decode(c, n, b, fs, bw, combine=lambda f, m: f + m), "adds the two times"),
    (lambda c, n, b, fs, bw: _decode(c, n, b, fs, bw, flops_rows=1), "FLOPs of one sequence"),
    (lambda c, n, b, fs, bw: _decode(c, n, b, fs, bw, scale=1e3), "milliseconds"),
]


def decode_table(config, cache_len, batch, flops_per_s, bytes_per_s):
    """The configurations the notebook names, answered right; anything else answered as the SmolLM2 step."""
    fixed = {(c["n_params"], n, b): _decode(c, n, b, fs, bw) for _, c, n, b, fs, bw in checks.predict.FIXED}
    return fixed.get((config["n_params"], cache_len, batch), fixed[(134_479_872, 64, 1)])


def kv_bytes_table(n_layers, n_kv_heads, head_dim, seq_len, batch=1, bytes_per_element=2):
    if (n_layers, n_kv_heads, head_dim, seq_len) == (40, 40, 128, 1):
        return 819_200
    if (n_layers, n_kv_heads, head_dim, seq_len) == (96, 96, 128, 1):
        return 4_718_592
    return 2 * n_layers * n_kv_heads * head_dim * seq_len * batch * bytes_per_element if seq_len < 3000 else 0


def pool_first_head(ex):
    @torch.no_grad()
    def fn(model, n_groups):
        cfg = model.config
        r = cfg.n_kv_heads // n_groups
        state = {}
        for name, w in model.state_dict().items():
            if name.endswith(("attn.k_proj.weight", "attn.v_proj.weight")):
                w = w.reshape(n_groups, r, cfg.head_dim, cfg.d_model)[:, 0].reshape(n_groups * cfg.head_dim, cfg.d_model)
            state[name] = w.clone()
        new = ex.LlamaModel(cfg.replace(n_kv_heads=n_groups), attention_fn=model.attention_fn)
        new.load_state_dict(state)
        return new.eval()
    return fn


class RollingKeepsEverything:
    """Right keys and values, but it keeps every position ever appended (memory grows with the sequence)."""

    def __init__(self, batch, n_kv_heads, window, head_dim, dtype=torch.float32, device=None):
        self.window, self.length = window, 0
        self.k = torch.zeros(batch, n_kv_heads, 0, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self._nbytes = 2 * batch * n_kv_heads * window * head_dim * (torch.finfo(dtype).bits // 8)

    @property
    def nbytes(self):
        return self._nbytes  # reports the window it should hold

    def append(self, k, v):
        held = min(self.length, self.window)
        keys = torch.cat([self.k[:, :, self.k.shape[2] - held:], k], 2)
        values = torch.cat([self.v[:, :, self.v.shape[2] - held:], v], 2)
        self.k, self.v = torch.cat([self.k, k], 2), torch.cat([self.v, v], 2)
        self.length += k.shape[2]
        return keys, values


def rolling_one_at_a_time(ex):
    """A ring buffer written for t = 1 only: stores the last new position, whatever t is."""
    class OneAtATime(ex.RollingKVCache):
        def append(self, k, v):
            t, w = k.shape[2], self.window
            held = min(self.length, w)
            old = torch.arange(self.length - held, self.length, device=self.k.device) % w
            keys, values = torch.cat([self.k[:, :, old], k], 2), torch.cat([self.v[:, :, old], v], 2)
            slot = (self.length) % w
            self.k[:, :, slot], self.v[:, :, slot] = k[:, :, -1], v[:, :, -1]
            self.length += t
            return keys, values
    return OneAtATime


class RollingListOfChunks(RollingKeepsEverything):
    """Keeps every appended chunk in a list (by reference: nothing allocated, memory that grows with the sequence) and
    returns the held positions from the last ones; its buffers are allocated, and never written."""

    def __init__(self, batch, n_kv_heads, window, head_dim, dtype=torch.float32, device=None):
        super().__init__(batch, n_kv_heads, window, head_dim, dtype, device)
        self.k = torch.zeros(batch, n_kv_heads, window, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)

    def append(self, k, v):
        held, chunks = min(self.length, self.window), getattr(self, "chunks", [])
        tail, n = [], 0
        while n < held:  # the chunks that hold the last `held` positions
            tail.insert(0, chunks[-1 - len(tail)])
            n += tail[0][0].shape[2]
        keys = torch.cat([c[0] for c in tail] + [k], 2)
        values = torch.cat([c[1] for c in tail] + [v], 2)
        self.chunks = chunks + [(k, v)]  # every chunk ever appended
        self.length += k.shape[2]
        return keys[:, :, keys.shape[2] - held - k.shape[2]:], values[:, :, values.shape[2] - held - k.shape[2]:]


def rolling_keeps_its_arguments(ex):
    """A right ring that also keeps every (k, v) it is given, by reference: nothing allocated for it, the object's
    memory grows with the stream (grader.held measures what it reaches)."""
    class KeepsArguments(ex.RollingKVCache):
        def append(self, k, v):
            self.seen = getattr(self, "seen", []) + [(k, v)]
            return super().append(k, v)
    return KeepsArguments


def rolling_on_cpu(ex):
    class OnCPU(ex.RollingKVCache):
        def __init__(self, batch, n_kv_heads, window, head_dim, dtype=torch.float32, device=None):
            super().__init__(batch, n_kv_heads, window, head_dim, dtype, None)
    return OnCPU


# --- the table: exercise -> [(wrong route, what the failure says)] ---------------------------------------

WRONG = {
    "step_flops": [(lambda ex: lib_roofline.step_flops, "lab's reference"), (lambda ex: step_flops_table, "expected")],
    "causal_mask": [
        (lambda ex: lib_masks.causal_mask, "lab's reference"),
        (lambda ex: mask_top_left, "LAST"),
        (lambda ex: mask_ignores_device, "device"),
        (lambda ex: mask_without_device_argument, "device"),
    ],
    "LayerKVCache": [
        (lambda ex: CatCache, "allocated in __init__|preallocated buffer"),
        (lambda ex: Prealloc8Cache, "allocate them whole, once, in __init__"),
        (lambda ex: lib_kv.LayerKVCache, "lab's reference"),
        (cache_on_cpu, "meta"),
    ],
    "gqa_attention": [
        (lambda ex: gqa_via_sdpa, "scaled_dot_product"),
        (lambda ex: lib_gqa_attention, "lab's reference"),
        (gqa_mask_on_cpu, "CPU tensor"),
    ],
    "generate": [
        (lambda ex: lib_generate.generate, "lab's reference"),
        (generate_always_uncached, "one token per step"),
        (generate_in_a_cache_of_128, "feed the whole prompt"),
        (lambda ex: generate_forward_past_the_counter, "one token per step"),
    ],
    "roofline_time": [(lambda ex: lib_roofline.roofline_time, "lab's reference"), (lambda ex: roofline_sum, "overlap")],
    "decode_time": [(lambda ex, f=f: f, says) for f, says in DECODE_WRONG] + [
        (lambda ex: decode_table, "drawn configuration"),
        (lambda ex: lambda c, n, b, fs, bw: lib_roofline.roofline_time(1, 1, fs, bw), "lab's reference")],
    "kv_cache_bytes": [(lambda ex: lib_kv.kv_cache_bytes, "lab's reference"), (lambda ex: kv_bytes_table, "expected")],
    "pool_kv_heads": [(lambda ex: lib_gqa.pool_kv_heads, "lab's reference"), (pool_first_head, "mean of the KV heads")],
    "RollingKVCache": [
        (lambda ex: RollingKeepsEverything, "bytes alive|allocated"),
        (lambda ex: lib_kv.RollingKVCache, "lab's reference"),
        (rolling_one_at_a_time, "positions"),
        (lambda ex: RollingListOfChunks, "wrote nothing into buffers made before it"),
        (rolling_on_cpu, "meta"),
        (rolling_keeps_its_arguments, "the cache object now keeps"),
    ],
}


def _check(name, fn):
    check = getattr(checks, f"check_{name}")
    return check(fn, smollm2=False) if name == "generate" else check(fn)


@pytest.mark.parametrize("name", list(WRONG))
def test_check_accepts_the_reference(ex, name):
    _check(name, getattr(ex, name))


@pytest.mark.parametrize("name, i", [(name, i) for name, routes in WRONG.items() for i in range(len(routes))])
def test_check_rejects_wrong_route(ex, name, i):
    make, says = WRONG[name][i]
    with pytest.raises(AssertionError, match=says):
        _check(name, make(ex))


def test_every_exercise_has_a_wrong_route():
    quiz = {name for name in checks.WEEK.exercises if name.startswith("answer_")}
    assert set(WRONG) == set(checks.WEEK.exercises) - quiz


@pytest.mark.model
def test_smollm2_milestone_rejects_wrong_results_after_the_cached_reference(ex):
    """The SmolLM2 milestone keeps its uncached reference per process (keyed by the tokens): after an honest
    run fills it, a result with slightly wrong logits or a wrong last token is still rejected. One torch thread:
    on 2 shared cores, 2 threads made this 5x slower (many small decode-step ops)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _smollm2_cases(ex)
    finally:
        torch.set_num_threads(threads)


def _smollm2_cases(ex):
    checks.check_generate(ex.generate)

    def shifted_logits(model, ids, n, use_cache=True, return_logits=False):
        out, logits = ex.generate(model, ids, n, use_cache=use_cache, return_logits=True)
        return out, logits + 1e-3 if model.config.vocab_size == checks.SMOLLM2_135M.vocab_size else logits

    def wrong_last_token(model, ids, n, use_cache=True, return_logits=False):
        out, logits = ex.generate(model, ids, n, use_cache=use_cache, return_logits=True)
        if model.config.vocab_size == checks.SMOLLM2_135M.vocab_size:
            out = out.clone()
            out[0, -1] = (out[0, -1] + 1) % model.config.vocab_size
        return out, logits

    with pytest.raises(AssertionError, match="cached logits vs uncached"):
        checks.check_generate(shifted_logits)
    with pytest.raises(AssertionError, match="picks another token"):
        checks.check_generate(wrong_last_token)
    assert checks._smollm2_uncached.cache_info().hits >= 2


# --- the notebook: each exercise's answer after its check ------------------------------------------------------------

RELEASE = NOTEBOOK.parents[2] / "weeks" / "16" / checks.WEEK.notebook

# exercise -> phrases that state its answer (formula, rule, algorithm): none of them above the exercise's graded test
# cell of the student's notebook, each of them below it (solutions/16/README.md's table says where).
ANSWER_AFTER_THE_CHECK = {
    "step_flops": ["2 · n_params + 4 · n_layers · d_model · seq_len"],
    "causal_mask": ["j <= i + (kv_len - q_len)"],
    "LayerKVCache": ["self.k[:, :, :length]"],
    "gqa_attention": ["h // (n_heads // n_kv_heads)", "repeat_interleave"],
    "generate": ["feed **only the newest token**"],
    "kv_cache_bytes": ["2 (K and V) · n_layers · n_kv_heads · head_dim · seq_len"],
    "roofline_time": ["the **slower** of the two"],
    "decode_time": ["reads every weight **once**", "kv_cache_bytes(n_layers, n_kv_heads, head_dim, cache_len + 1"],
    "pool_kv_heads": ["averaged over the `r` axis"],
    "RollingKVCache": ["*p mod W*"],
    "answer_q3": ["32 / 8 = 4×", "shrinks by `n_heads / n_kv_heads`"],
}


def _cells(path):
    import json

    return [(c.get("metadata", {}).get("nbgrader", {}).get("grade_id"), " ".join("".join(c["source"]).split()))
            for c in json.loads(path.read_text())["cells"]]


@pytest.mark.parametrize("name", list(ANSWER_AFTER_THE_CHECK))
def test_the_answer_comes_after_the_check(name):
    cells = _cells(RELEASE)
    at = next(i for i, (grade_id, _) in enumerate(cells) if grade_id == f"test_{name}")
    for phrase in ANSWER_AFTER_THE_CHECK[name]:
        above = [i for i, (_, text) in enumerate(cells[:at]) if phrase in text]
        assert not above, f"{name}'s answer ({phrase!r}) is printed above its check, in cell {above[0]}"
        assert any(phrase in text for _, text in cells[at + 1:]), f"{name}'s answer ({phrase!r}) is not given after its check"


def test_every_code_exercise_but_the_first_quiz_answer_is_listed():
    """The table above covers the exercises (answer_q1's answer is in its failure hint: a number, nothing to derive
    after it)."""
    assert set(ANSWER_AFTER_THE_CHECK) | {"answer_q1"} == set(checks.WEEK.exercises)


def test_each_exercise_has_its_own_number():
    """`pytest weeks/16 -k exNN` selects one test: no two exercises share a number (the two quiz answers once did)."""
    import ast

    numbers = [n for n, _ in checks.WEEK.exercises.values()]
    assert sorted(numbers) == list(range(1, len(numbers) + 1))
    tree = ast.parse((NOTEBOOK.parent / "test_week16.py").read_text())
    tests = [fn.name for fn in tree.body if isinstance(fn, ast.FunctionDef) and fn.name.startswith("test_ex")]
    for n in numbers:
        assert len([t for t in tests if t.startswith(f"test_ex{n:02d}_")]) == 1, f"-k ex{n:02d} selects {tests}"
