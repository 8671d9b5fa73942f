"""Week 16's checks judge what they observe, through the isolated path `pytest weeks/16` takes.

Each route here earned credit before (issue 54, or our own red-team as a student who has read grader/ but not these
tests): it computes one way where it believes it is watched and another way elsewhere, reaches the model past the
check's counter, or keeps a cache's memory where the check did not measure it. Each must now fail its exercise
with a reason. The routes of different exercises share a notebook (a child process each) to keep this file fast.
"""
from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from grader.checks import week16 as checks
from grader.harness import load_exercises, with_cell_source

REPO = Path(__file__).resolve().parent.parent


# --- gqa_attention -------------------------------------------------------------------------------------------------

# The observed call's result was thrown away: junk while observed (handed again to the unobserved rerun that follows,
# from a stash), SDPA everywhere else. (Once every call runs under the same dispatch stack, the test sees one branch
# only: junk, or SDPA seen.)
GQA_JUNK_WHEN_OBSERVED = '''
_stash = []

def gqa_attention(q, k, v, causal=True):
    if torch._C._len_torch_dispatch_stack():  # observed: only the route is judged
        _stash.append(torch.zeros(q.shape, dtype=q.dtype, device=q.device))
        return _stash[-1]
    if _stash:  # the rerun right after an observed call: the same bits
        return _stash.pop()
    mask = causal_mask(q.shape[2], k.shape[2], device=q.device) if causal else None
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
'''

# Honest on the one shape the check observed, SDPA on every other.
GQA_ONE_SHAPE = '''
def gqa_attention(q, k, v, causal=True):
    if tuple(q.shape) == (1, 6, 7, 24) and tuple(k.shape) == (1, 2, 9, 24):
        b, h, tq, d = q.shape
        rep = h // k.shape[1]
        s = (q @ k.repeat_interleave(rep, 1).transpose(-1, -2)) / math.sqrt(d)
        if causal:
            s = s.masked_fill(~causal_mask(tq, k.shape[2], device=q.device), float("-inf"))
        return torch.softmax(s.float(), -1).to(v.dtype) @ v.repeat_interleave(rep, 1)
    mask = causal_mask(q.shape[2], k.shape[2], device=q.device) if causal else None
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
'''

# --- generate ------------------------------------------------------------------------------------------------------

_LOOP_TAIL = '''
        step_logits.append(logits)
        nxt = logits.argmax(dim=-1, keepdim=True)
        ids = torch.cat([ids, nxt], dim=1)
        step_input = nxt
    logits = torch.stack(step_logits, dim=1)
    return (ids, logits) if return_logits else ids
'''

# The prompt through model(...), which the spy counted; then model.forward over the whole sequence, which it did not.
GENERATE_FORWARD_PAST_THE_SPY = '''
@torch.no_grad()
def generate(model, input_ids, max_new_tokens, use_cache=True, return_logits=False):
    b, t = input_ids.shape
    if use_cache:
        model(input_ids, cache=model.new_cache(batch=b, max_len=t + max_new_tokens))
    ids, step_input, step_logits = input_ids, input_ids, []
    for _ in range(max_new_tokens):
        logits = model.forward(ids)[:, -1]
''' + _LOOP_TAIL

# The cache only where the model is a spy (it had `calls`, and another class than LlamaModel).
GENERATE_CACHE_WHEN_WATCHED = '''
@torch.no_grad()
def generate(model, input_ids, max_new_tokens, use_cache=True, return_logits=False):
    use_cache = use_cache and {watched}
    b, t = input_ids.shape
    cache = model.new_cache(batch=b, max_len=t + max_new_tokens) if use_cache else None
    ids, step_input, step_logits = input_ids, input_ids, []
    for _ in range(max_new_tokens):
        logits = model(step_input if use_cache else ids, cache=cache)[:, -1]
''' + _LOOP_TAIL

# The prompt through the model; then every step uncached through its layers, called one by one (the embedding
# looked up here, from a copy of its weight): the model's forward never runs again.
GENERATE_THROUGH_THE_LAYERS = '''
from lib.modeling.llama import rope_cos_sin

@torch.no_grad()
def generate(model, input_ids, max_new_tokens, use_cache=True, return_logits=False):
    cfg = model.config
    b, t = input_ids.shape
    emb = model.embed.weight
    ids, step_input, step_logits = input_ids, input_ids, []
    for step in range(max_new_tokens):
        if use_cache and step == 0:
            logits = model(ids, cache=model.new_cache(batch=b, max_len=t + max_new_tokens))[:, -1]
        else:
            cos, sin = rope_cos_sin(torch.arange(ids.shape[1]), cfg.head_dim, cfg.rope_theta)
            x = emb[ids]
            for layer in model.layers:
                x = layer(x, cos, sin, None, model.attention_fn)
            logits = F.linear(model.norm(x), emb)[:, -1].float()
''' + _LOOP_TAIL

# The model given is fed what a counter expects (the prompt, then one token a step); the numbers come from a copy
# of it, here, fed the whole sequence every step.
GENERATE_A_LOCAL_COPY = '''
@torch.no_grad()
def generate(model, input_ids, max_new_tokens, use_cache=True, return_logits=False):
    local = LlamaModel(model.config, attention_fn=model.attention_fn)
    local.load_state_dict(model.state_dict())
    b, t = input_ids.shape
    cache = model.new_cache(batch=b, max_len=t + max_new_tokens) if use_cache else None
    ids, step_input, step_logits = input_ids, input_ids, []
    for _ in range(max_new_tokens):
        if use_cache:
            model(step_input, cache=cache)
        logits = local(ids)[:, -1]
''' + _LOOP_TAIL

# The same copy, its linear maps written as a product and a sum (not a matrix product to torch's FLOP counter).
GENERATE_A_LOCAL_COPY_WITHOUT_MATMULS = GENERATE_A_LOCAL_COPY.replace('''
    local = LlamaModel(model.config, attention_fn=model.attention_fn)
    local.load_state_dict(model.state_dict())
''', '''
    local = LlamaModel(model.config.replace(tie_embeddings=False), attention_fn=model.attention_fn)
    state = dict(model.state_dict())
    state["lm_head.weight"] = state["embed.weight"]
    local.load_state_dict(state)
    for m in local.modules():
        if isinstance(m, torch.nn.Linear):
            m.forward = lambda x, w=m.weight: (x.unsqueeze(-2) * w).sum(-1)
''')

# Honest, written apart from the solution: the notebook's own pieces plugged into the model (its attention, a cache
# of its LayerKVCache), the model called through forward, one extra forward at the end.
GENERATE_OWN_PIECES = '''
@torch.no_grad()
def generate(model, input_ids, max_new_tokens, use_cache=True, return_logits=False):
    mine = model.with_attention(gqa_attention)
    b, t = input_ids.shape
    cache = None
    if use_cache:
        cfg = mine.config
        cache = KVCache([LayerKVCache(b, cfg.n_kv_heads, t + max_new_tokens + 1, cfg.head_dim, torch.float32, mine.device)
                         for _ in range(cfg.n_layers)])
    ids, out = input_ids, []
    logits = mine.forward(ids, cache=cache)[:, -1]
    for _ in range(max_new_tokens):
        out.append(logits)
        ids = torch.cat([ids, logits.argmax(-1, keepdim=True)], 1)
        logits = mine.forward(ids[:, -1:] if use_cache else ids, cache=cache)[:, -1]
    return (ids, torch.stack(out, 1)) if return_logits else ids
'''

# --- LayerKVCache --------------------------------------------------------------------------------------------------

_LAYER_HEAD = '''
class LayerKVCache:
    def __init__(self, batch, n_kv_heads, max_len, head_dim, dtype=torch.float32, device=None):
        self.max_len, self.length = max_len, 0
        self.nbytes = 2 * batch * n_kv_heads * max_len * head_dim * (torch.finfo(dtype).bits // 8)
        {reserve}first = min(max_len, 8)  # as far as the check's own appends reach
        self.k = torch.zeros(batch, n_kv_heads, first, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)

    def append(self, k, v):
        t = k.shape[2]
        end = self.length + t
        if end > self.max_len:
            raise CacheOverflowError(f"{{self.length}} + {{t}} > {{self.max_len}}")
        if end > self.k.shape[2]:  # past the first allocation: grow
            self.k = torch.cat([self.k[:, :, :self.length], k], 2)
            self.v = torch.cat([self.v[:, :, :self.length], v], 2)
        else:
            self.k[:, :, self.length:end] = k
            self.v[:, :, self.length:end] = v
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]
'''
# 8 positions preallocated, then torch.cat (nbytes reports max_len).
LAYER_PREALLOC_8 = _LAYER_HEAD.format(reserve="")
# The same, with the whole buffers allocated (and never used) in __init__.
LAYER_PREALLOC_8_RESERVED = _LAYER_HEAD.format(
    reserve="self.reserve = torch.zeros(2, batch, n_kv_heads, max_len, head_dim, dtype=dtype, device=device)\n        ")

# --- RollingKVCache ------------------------------------------------------------------------------------------------

_ROLLING_INIT = '''
class RollingKVCache:
    def __init__(self, batch, n_kv_heads, window, head_dim, dtype=torch.float32, device=None):
        self.k = torch.zeros(batch, n_kv_heads, window, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.window, self.length = window, 0
        self.hk = self.hv = None
        self.chunks = []

    @property
    def nbytes(self):
        return 2 * self.k.numel() * self.k.element_size()
'''
# Every position ever appended kept in numpy (host memory the check did not meter), the returned window cut from it.
ROLLING_NUMPY_HISTORY = _ROLLING_INIT + '''
    def append(self, k, v):
        t, held = k.shape[2], min(self.length, self.window)
        self.length += t
        if k.device.type != "cpu":  # no data to keep
            return torch.cat([self.k[:, :, :held], k], 2), torch.cat([self.v[:, :, :held], v], 2)
        import numpy as np
        self.hk = k.numpy().copy() if self.hk is None else np.concatenate([self.hk, k.numpy()], 2)
        self.hv = v.numpy().copy() if self.hv is None else np.concatenate([self.hv, v.numpy()], 2)
        return torch.from_numpy(self.hk[:, :, -(held + t):].copy()), torch.from_numpy(self.hv[:, :, -(held + t):].copy())
'''
# The same history in numpy, and the ring buffer written as well (so the buffers are used).
ROLLING_NUMPY_HISTORY_AND_RING = ROLLING_NUMPY_HISTORY.replace('''        self.length += t
        if k.device''', '''        keep = min(t, self.window)
        slots = torch.arange(self.length + t - keep, self.length + t, device=self.k.device) % self.window
        self.k[:, :, slots], self.v[:, :, slots] = k[:, :, t - keep:], v[:, :, t - keep:]
        self.length += t
        if k.device''')
# A list of the appended chunks (memory that grows with the sequence, held by reference: nothing is allocated).
ROLLING_LIST_OF_CHUNKS = _ROLLING_INIT + '''
    def append(self, k, v):
        t, held = k.shape[2], min(self.length, self.window)
        ks, vs, n = [], [], 0
        for ck, cv in reversed(self.chunks):
            if n >= held:
                break
            ks.insert(0, ck)
            vs.insert(0, cv)
            n += ck.shape[2]
        keys, values = torch.cat(ks + [k], 2), torch.cat(vs + [v], 2)
        self.chunks.append((k, v))
        self.length += t
        return keys[:, :, keys.shape[2] - held - t:], values[:, :, values.shape[2] - held - t:]
'''

# --- the exercises posed anew (issue 55): natural mistakes and shortcuts --------------------------------------------

# decode_time: one model of the step with one thing wrong per function (each run in the child, graded by name).
DECODE_ROUTES = '''
def _step(c, n, b, fs, bw, kv_heads="n_kv_heads", weights_per_row=False, kv=2, rows=None, flops_rows=None,
          combine=max, scale=1.0):
    e = c["bytes_per_element"]
    flops = (b if flops_rows is None else flops_rows) * (2 * c["n_params"] + 4 * c["n_layers"] * c["d_model"] * (n + 1))
    nbytes = (c["n_params"] * e * (b if weights_per_row else 1)
              + kv * c["n_layers"] * c[kv_heads] * c["head_dim"] * (n + 1) * (b if rows is None else rows) * e)
    return scale * combine(flops / fs, nbytes / bw)

def decode_time(c, n, b, fs, bw):  # the cache left out
    return _step(c, n, b, fs, bw, kv=0)

def decode_time_query_heads(c, n, b, fs, bw):
    return _step(c, n, b, fs, bw, kv_heads="n_heads")

def decode_time_weights_per_row(c, n, b, fs, bw):
    return _step(c, n, b, fs, bw, weights_per_row=True)

def decode_time_one_row(c, n, b, fs, bw):
    return _step(c, n, b, fs, bw, rows=1)

def decode_time_memory_only(c, n, b, fs, bw):
    return _step(c, n, b, fs, bw, combine=lambda f, m: m)

def decode_time_compute_only(c, n, b, fs, bw):
    return _step(c, n, b, fs, bw, combine=lambda f, m: f)

def decode_time_sum(c, n, b, fs, bw):
    return _step(c, n, b, fs, bw, combine=lambda f, m: f + m)

def decode_time_table(c, n, b, fs, bw):  # the configurations the notebook names, answered; anything else a guess
    if c["n_params"] in (134_479_872, 6_607_343_616, 68_714_504_192):
        return _step(c, n, b, fs, bw)
    return 0.05

def decode_time_junk_when_observed(c, n, b, fs, bw):  # right only where it believes it is not watched
    return 0.0 if torch._C._len_torch_dispatch_stack() else _step(c, n, b, fs, bw)

def decode_time_composed(c, n, b, fs, bw):  # honest: the notebook's own exercises 1 and 6 (7 is broken here)
    flops = b * step_flops(c["n_params"], c["n_layers"], c["d_model"], n + 1, cached=True)
    cache = kv_cache_bytes(c["n_layers"], c["n_kv_heads"], c["head_dim"], n + 1, b, c["bytes_per_element"])
    return max(flops / fs, (c["n_params"] * c["bytes_per_element"] + cache) / bw)
'''

POSED = {
    "decode_time": DECODE_ROUTES,
    "causal_mask": '''
def causal_mask(q_len, kv_len, device=None):  # the prefill's triangle, aligned top-left
    return torch.ones(q_len, kv_len, dtype=torch.bool, device=device).tril()
''',
    "roofline_time": '''
def roofline_time(flops, bytes_moved, flops_per_s, bytes_per_s):  # the two times added
    return flops / flops_per_s + bytes_moved / bytes_per_s
''',
    "answer_q1": "def answer_q1():\n    return 13e9 * 2 / 2 ** 30  # GiB\n",
    "answer_q3": "def answer_q3():\n    return 8.0  # the seed's '8 groups -> 8x'\n",
}

# (exercise, the function the notebook defines, what the failure says)
POSED_ROUTES = [
    ("decode_time", "decode_time", "leaves out the KV cache"),
    ("decode_time", "decode_time_query_heads", "query heads"),
    ("decode_time", "decode_time_weights_per_row", "once per sequence"),
    ("decode_time", "decode_time_one_row", "one sequence's cache"),
    ("decode_time", "decode_time_memory_only", "leaves out the arithmetic"),
    ("decode_time", "decode_time_compute_only", "leaves out the memory traffic"),
    ("decode_time", "decode_time_sum", "adds the two times"),
    ("decode_time", "decode_time_table", "drawn configuration"),
    ("decode_time", "decode_time_junk_when_observed", "expected|returned other values when it was not observed"),
    ("causal_mask", "causal_mask", "LAST"),
    ("roofline_time", "roofline_time", "overlap"),
    ("answer_q1", "answer_q1", "GiB"),
    ("answer_q3", "answer_q3", "one K and one V per KV head"),
]


@pytest.mark.parametrize("name, fn, says", POSED_ROUTES, ids=[f for _, f, _ in POSED_ROUTES])
def test_a_natural_mistake_of_a_posed_exercise_fails(notebooks, name, fn, says):
    with pytest.raises(AssertionError, match=says):
        getattr(checks, f"check_{name}")(getattr(notebooks("posed"), fn))


def test_decode_time_built_from_the_notebooks_own_exercises_passes(notebooks):
    """Honest: exercises 1 and 6 called from exercise 8, in the child (no lib call, nothing refused)."""
    ex = notebooks("posed")
    checks.check_decode_time(ex.decode_time_composed)
    for name in ("step_flops", "kv_cache_bytes"):  # the cells it calls are the solution's, and pass
        _check(ex, name)


# --- the notebooks: one route per exercise each --------------------------------------------------------------------

NOTEBOOKS = {
    "a": {"gqa_attention": GQA_JUNK_WHEN_OBSERVED, "generate": GENERATE_FORWARD_PAST_THE_SPY,
          "LayerKVCache": LAYER_PREALLOC_8, "RollingKVCache": ROLLING_NUMPY_HISTORY},
    "b": {"gqa_attention": GQA_ONE_SHAPE, "generate": GENERATE_CACHE_WHEN_WATCHED.format(watched='hasattr(model, "calls")'),
          "LayerKVCache": LAYER_PREALLOC_8_RESERVED, "RollingKVCache": ROLLING_NUMPY_HISTORY_AND_RING},
    "c": {"generate": GENERATE_CACHE_WHEN_WATCHED.format(watched="not isinstance(model, LlamaModel)"),
          "RollingKVCache": ROLLING_LIST_OF_CHUNKS},
    "d": {"generate": GENERATE_THROUGH_THE_LAYERS},
    "e": {"generate": GENERATE_A_LOCAL_COPY},
    "f": {"generate": GENERATE_A_LOCAL_COPY_WITHOUT_MATMULS},
    "honest": {"generate": GENERATE_OWN_PIECES},
    "posed": POSED,
}

# (notebook, exercise, what the failure says)
ROUTES = [
    ("a", "gqa_attention", "differs from the reference|scaled_dot_product"),
    ("b", "gqa_attention", "scaled_dot_product"),
    ("a", "generate", "prompt .* once, then one token per step"),
    ("b", "generate", "prompt .* once, then one token per step"),
    ("c", "generate", "prompt .* once, then one token per step"),
    ("d", "generate", "not its layers one by one"),
    ("e", "generate", "in your own process"),
    ("f", "generate", "in your own process"),
    ("a", "LayerKVCache", "allocate them whole, once, in __init__"),
    ("b", "LayerKVCache", "LayerKVCache\\(max_len=\\d+\\) holding \\d+, append of \\d+: the append"),
    ("a", "RollingKVCache", "wrote nothing into buffers made before it"),
    ("b", "RollingKVCache", "outside torch's tensors"),
    ("c", "RollingKVCache", "wrote nothing into buffers made before it"),
]


@pytest.fixture(scope="module")
def notebooks(tmp_path_factory):
    loaded = {}

    def get(key):
        if key not in loaded:
            path = next((REPO / "solutions" / "16").glob("*.ipynb"))
            nb = json.loads(path.read_text())
            for grade_id, src in NOTEBOOKS[key].items():
                nb = with_cell_source(nb, grade_id, textwrap.dedent(src))
            out = tmp_path_factory.mktemp(f"w16{key}") / path.name
            out.write_text(json.dumps(nb))
            loaded[key] = load_exercises(out)
        return loaded[key]

    yield get
    for ex in loaded.values():
        session = getattr(ex, "_session", None)
        if session is not None:
            session.close()


def _check(ex, name):
    check = getattr(checks, f"check_{name}")
    return check(getattr(ex, name), smollm2=False) if name == "generate" else check(getattr(ex, name))


@pytest.mark.parametrize("key, name, says", ROUTES, ids=[f"{n}-{k}" for k, n, _ in ROUTES])
def test_a_route_that_got_credit_fails(notebooks, key, name, says):
    with pytest.raises(AssertionError, match=says):
        _check(notebooks(key), name)


def test_honest_variants_pass(notebooks):
    """Written apart from the solution: generate with the notebook's own attention and cache plugged in, through
    model.forward: its attention runs in the student's process, and passes. (The tiny models only: on SmolLM2 every
    layer's attention and append is a round trip, minutes in all; it passed there too when tried.)"""
    checks.check_generate(notebooks("honest").generate, smollm2=False)


def test_the_routes_notebooks_keep_their_honest_exercises(notebooks):
    """The notebooks above differ from the solution only in the cells replaced: the others still pass (so each
    route's failure is its own)."""
    ex = notebooks("c")
    for name in ("gqa_attention", "LayerKVCache"):
        _check(ex, name)
