"""Week 19, issue 54: the routes the week-19 checks let through before, through the isolated path.

Each route below is an ordinary function or class of this file; `child` sends their source to one isolated child
process (as a notebook's cells would define them, after the solution notebook's own cells) and the checks get
proxies, as `pytest weeks/19` gives them a student's code. Each gives the right numbers, or would but for the flaw
named, and each is rejected every run:

- a scheduler that preempts every newer request at once (the order was checked, not the amount);
- paged attention in two passes whenever n_heads > n_kv_heads (the read bound allowed group + 0.5), or one pass per
  query head (each block of K read once per query head of its group instead of once per KV head);
- a whole row of keys gathered per sequence and KV head, then chunked reductions (passed whenever no case drew a
  single KV head: about one run in two);
- answers that are junk only while observed (the checks threw the observed result away and judged other calls),
  and paged attention that switches to SDPA inside the engine.
"""
import inspect
import json
import math
import re
import textwrap
from pathlib import Path

import pytest
import torch

from grader.checks import week19 as checks
from grader.checks import observe
from grader.checks.week19_sim import LONG_CASE, paged_case, preemptions_needed
from grader.harness import exercise_cells, load_exercises
from grader.isolation import Session

NOTEBOOK = Path(__file__).resolve().parent.parent / "solutions" / "19" / checks.WEEK.notebook


# --- the scheduler ----------------------------------------------------------------------------------------------

def _plan(running, waiting, free_blocks, block_size, token_budget, max_num_seqs, chunked_prefill=True, flaw=""):
    """The scheduling rule of the notebook, written apart from lib's; `flaw="all_newer"` preempts every newer
    running request at once when one does not fit."""
    def grow(req, n):
        return max(0, -(-(req["computed"] + n) // block_size) - req["blocks"])

    alive, preempt, run, budget, free, i = list(running), [], [], token_budget, free_blocks, 0
    while i < len(alive) and budget > 0:
        req = alive[i]
        n = min(req["tokens"] - req["computed"], budget)
        if grow(req, n) > free and flaw == "all_newer":
            while len(alive) > i + 1:  # everyone newer at once, newest first
                victim = alive.pop()
                preempt.append(victim["id"])
                free += victim["freeable"]
        while grow(req, n) > free:
            victim = alive.pop()
            preempt.append(victim["id"])
            free += victim["freeable"]
            if victim is req:
                break
        if i >= len(alive) or alive[i] is not req:
            break
        run.append([req["id"], n])
        free, budget, i = free - grow(req, n), budget - n, i + 1
    if preempt:
        return {"preempt": preempt, "run": run}
    seqs = sum(r["seqs"] for r in alive)
    for req in waiting:
        left = req["tokens"] - req["computed"]
        n = min(left, budget)
        if seqs + req["seqs"] > max_num_seqs or budget <= 0 or (n < left and not chunked_prefill) or grow(req, n) > free:
            break
        run.append([req["id"], n])
        free, budget, seqs = free - grow(req, n), budget - n, seqs + req["seqs"]
    return {"preempt": preempt, "run": run}


def schedule_apart(*args):
    return _plan(*args)


def preempts_all_newer(*args):
    return _plan(*args, flaw="all_newer")


JUNK = []


def _watched():
    """Whether this call looks observed (the observers' dispatch modes are on torch's stack): then the junk is
    answered. Where no call can tell (every call under the same dispatch stack), junk is answered in every call or in
    none: rejected, or nothing to catch (`junk_answered` counts)."""
    if torch._C._len_torch_dispatch_stack() > 0:
        JUNK.append(1)
        return True
    return False


def junk_answered():
    return len(JUNK)


def schedule_junk_observed(*args):
    return {"preempt": [], "run": []} if _watched() else _plan(*args)


# --- paged attention ---------------------------------------------------------------------------------------------

def _chunks(q, k_pool, block_tables, context_lens):
    """(positions valid [B, c*bs], block ids [B, c]) per chunk of about 32 keys."""
    bs = k_pool.shape[2]
    per_step = max(1, 32 // bs)
    for j0 in range(0, block_tables.shape[1], per_step):
        j1 = min(j0 + per_step, block_tables.shape[1])
        valid = torch.arange(j0 * bs, j1 * bs, device=q.device)[None, :] < context_lens[:, None]
        yield valid, torch.where(valid[:, ::bs], block_tables[:, j0:j1], 0)


def one_pass(q, k_pool, v_pool, block_tables, context_lens):
    """Online softmax over chunks of blocks, every head of a KV group at once: each block of K read once."""
    b, h, d = q.shape
    _, hkv, bs, _ = k_pool.shape
    qg = q.reshape(b, hkv, h // hkv, d) / math.sqrt(d)
    m = torch.full((b, hkv, h // hkv), float("-inf"), device=q.device)
    l, acc = torch.zeros(b, hkv, h // hkv, device=q.device), torch.zeros(b, hkv, h // hkv, d, device=q.device)
    for valid, ids in _chunks(q, k_pool, block_tables, context_lens):
        s = (qg @ k_pool[ids].permute(0, 2, 1, 3, 4).reshape(b, hkv, -1, d).transpose(-1, -2))
        s = s.masked_fill(~valid[:, None, None, :], float("-inf"))
        m_new = torch.maximum(m, s.amax(-1))
        safe = torch.where(torch.isinf(m_new), 0.0, m_new)
        p, a = torch.exp(s - safe[..., None]), torch.exp(m - safe)
        l = l * a + p.sum(-1)
        acc = acc * a[..., None] + p @ v_pool[ids].permute(0, 2, 1, 3, 4).reshape(b, hkv, -1, d)
        m = m_new
    return (acc / l[..., None]).reshape(b, h, d)


def per_sequence_blocks(q, k_pool, v_pool, block_tables, context_lens):
    """Honest, written apart from the solution: one sequence at a time, whole blocks covering about 32 keys per step,
    an online softmax over them (each block of K read once, for all the query heads of its group)."""
    b, h, d = q.shape
    _, hkv, bs, _ = k_pool.shape
    dev = q.device
    out = torch.empty(q.shape, device=dev)  # fp32 whatever q's dtype: the result is rounded to it once, at the end
    step = max(1, 32 // bs)
    for i, n in enumerate(context_lens.tolist()):
        qg = q[i].reshape(hkv, h // hkv, d).float() / math.sqrt(d)
        m = torch.full((hkv, h // hkv), float("-inf"), device=dev)
        l, acc = torch.zeros(hkv, h // hkv, device=dev), torch.zeros(hkv, h // hkv, d, device=dev)
        for j0 in range(0, -(-n // bs), step):
            ids = block_tables[i, j0:min(j0 + step, -(-n // bs))]
            kb = k_pool[ids].permute(1, 0, 2, 3).reshape(hkv, -1, d).float()  # [Hkv, c*bs, d]
            vb = v_pool[ids].permute(1, 0, 2, 3).reshape(hkv, -1, d).float()
            valid = torch.arange(j0 * bs, j0 * bs + kb.shape[1], device=dev) < n
            s = (qg @ kb.transpose(-1, -2)).masked_fill(~valid, float("-inf"))  # [Hkv, group, c*bs]
            m_new = torch.maximum(m, s.amax(-1))
            p, a = torch.exp(s - m_new[..., None]), torch.exp(m - m_new)
            l, acc, m = l * a + p.sum(-1), acc * a[..., None] + p @ vb, m_new
        out[i] = (acc / l[..., None]).reshape(h, d)
    return out.to(q.dtype)


def two_pass_when_grouped(q, k_pool, v_pool, block_tables, context_lens):
    """One pass for MHA; with n_heads > n_kv_heads a first pass over the blocks for the max, a second for the
    exponentials: K read twice (the old bound allowed group + 0.5 reads, so every GQA case let it through)."""
    b, h, d = q.shape
    _, hkv, bs, _ = k_pool.shape
    if h == hkv:
        return one_pass(q, k_pool, v_pool, block_tables, context_lens)
    qg = q.reshape(b, hkv, h // hkv, d) / math.sqrt(d)

    def scores(valid, ids):
        kb = k_pool[ids].permute(0, 2, 1, 3, 4).reshape(b, hkv, -1, d)
        return (qg @ kb.transpose(-1, -2)).masked_fill(~valid[:, None, None, :], float("-inf"))

    dev = q.device
    m = torch.full((b, hkv, h // hkv), float("-inf"), device=dev)
    for valid, ids in _chunks(q, k_pool, block_tables, context_lens):
        m = torch.maximum(m, scores(valid, ids).amax(-1))
    l, acc = torch.zeros(b, hkv, h // hkv, device=dev), torch.zeros(b, hkv, h // hkv, d, device=dev)
    for valid, ids in _chunks(q, k_pool, block_tables, context_lens):
        p = torch.exp(scores(valid, ids) - m[..., None])
        l = l + p.sum(-1)
        acc = acc + p @ v_pool[ids].permute(0, 2, 1, 3, 4).reshape(b, hkv, -1, d)
    return (acc / l[..., None]).reshape(b, h, d)


def whole_row_per_kv_head(q, k_pool, v_pool, block_tables, context_lens):
    """Per sequence and KV head, that head's whole row of keys gathered (the values read 32 positions at a time from
    the pool), then an online softmax in chunks of 32, every reduction short: a copy of 1 / n_kv_heads of the
    sequence's keys at a time, under the old bound (half of all its K and V) whenever n_kv_heads >= 2."""
    b, h, d = q.shape
    _, hkv, bs, _ = k_pool.shape
    group = h // hkv
    out = torch.empty_like(q)
    for i, n in enumerate(context_lens.tolist()):
        ids = block_tables[i, :-(-n // bs)]
        for kv in range(hkv):
            k = k_pool[ids, kv].reshape(-1, d)[:n]  # [n, d]: the head's whole row of keys
            qh = q[i, kv * group:(kv + 1) * group] / math.sqrt(d)  # [group, d]
            dev = q.device
            m = torch.full((group,), float("-inf"), device=dev)
            l, acc = torch.zeros(group, device=dev), torch.zeros(group, d, device=dev)
            for s0 in range(0, n, 32):
                pos = torch.arange(s0, min(n, s0 + 32), device=dev)
                s = qh @ k[s0:s0 + 32].T
                m_new = torch.maximum(m, s.amax(-1))
                p, a = torch.exp(s - m_new[:, None]), torch.exp(m - m_new)
                l, acc, m = l * a + p.sum(-1), acc * a[:, None] + p @ v_pool[ids[pos // bs], kv, pos % bs], m_new
            out[i, kv * group:(kv + 1) * group] = acc / l[:, None]
            del k  # one row alive at a time
    return out


def per_query_head(q, k_pool, v_pool, block_tables, context_lens):
    """One online-softmax pass per query head: each block of K read once for every query head of its group (not
    once per KV head, shared by the group)."""
    b, h, d = q.shape
    _, hkv, bs, _ = k_pool.shape
    out = torch.empty_like(q)
    for j in range(h):
        kv = j // (h // hkv)
        dev = q.device
        m = torch.full((b,), float("-inf"), device=dev)
        l, acc = torch.zeros(b, device=dev), torch.zeros(b, d, device=dev)
        for valid, ids in _chunks(q, k_pool, block_tables, context_lens):
            s = (k_pool[ids, kv].reshape(b, -1, d) @ q[:, j, :, None])[..., 0].masked_fill(~valid, float("-inf"))
            s = s / math.sqrt(d)
            m_new = torch.maximum(m, s.amax(-1))
            safe = torch.where(torch.isinf(m_new), 0.0, m_new)
            p, a = torch.exp(s - safe[:, None]), torch.exp(m - safe)
            l = l * a + p.sum(-1)
            acc = acc * a[:, None] + (p[:, None] @ v_pool[ids, kv].reshape(b, -1, d))[:, 0]
            m = m_new
        out[:, j] = acc / l[:, None]
    return out


def sdpa_in_the_engine(q, k_pool, v_pool, block_tables, context_lens):
    """One pass, except on the engine's shapes (the tiny model: 4 heads, 2 KV heads of 16, blocks of 2 or 4, a pool of
    a few blocks), where every sequence's keys are gathered and handed to SDPA."""
    b, h, d = q.shape
    n_blocks, hkv, bs, _ = k_pool.shape
    if (h, hkv, d) != (4, 2, 16) or bs not in (2, 4) or n_blocks >= 30:
        return one_pass(q, k_pool, v_pool, block_tables, context_lens)
    outs = []
    for i, n in enumerate(context_lens.tolist()):
        ids = block_tables[i, :-(-n // bs)]
        k = k_pool[ids].transpose(0, 1).reshape(hkv, -1, d)[:, :n].repeat_interleave(h // hkv, 0)
        v = v_pool[ids].transpose(0, 1).reshape(hkv, -1, d)[:, :n].repeat_interleave(h // hkv, 0)
        outs.append(torch.nn.functional.scaled_dot_product_attention(q[i][:, None], k, v)[:, 0])
    return torch.stack(outs)


ROUTES = [_plan, schedule_apart, preempts_all_newer, _watched, junk_answered, schedule_junk_observed, _chunks, one_pass,
          per_sequence_blocks, two_pass_when_grouped, whole_row_per_kv_head, per_query_head, sdpa_in_the_engine]

# The solution notebook's PrefixCache, misbehaving in an instance made while observed (the check used to observe a
# PrefixCache(4) and throw it away): every lookup misses, every free is dropped.
PREFIX_CACHE_JUNK = """
class PrefixCacheJunkObserved(PrefixCache):
    def __init__(self, num_blocks):
        super().__init__(num_blocks)
        self.junk = _watched()

    def lookup(self, block_hash, tokens):
        return None if self.junk else super().lookup(block_hash, tokens)

    def free(self, block):
        if not self.junk:
            super().free(block)
"""


@pytest.fixture(scope="module")
def child(tmp_path_factory):
    """The solution notebook's cells, then the routes, in one isolated child process."""
    cells = [src for _, _, src in exercise_cells(json.loads(NOTEBOOK.read_text()))]
    source = "JUNK = []\n\n" + "\n\n".join(textwrap.dedent(inspect.getsource(r)) for r in ROUTES) + PREFIX_CACHE_JUNK
    session = Session(tmp_path_factory.mktemp("nb") / "week19_routes.ipynb", view=checks.WEEK.view(), call_timeout=300)
    session.load([(i, None, src) for i, src in enumerate(cells)] + [(len(cells), None, "import math\nimport torch\n\n" + source)])
    yield session
    session.close()


@pytest.fixture(scope="module")
def ex():
    exercises = load_exercises(NOTEBOOK, isolated=True)
    yield exercises
    exercises.close()


def test_the_honest_routes_pass(child):
    """A scheduler and a one-pass attention written apart from the solution pass their checks."""
    checks.check_schedule(child.get("schedule_apart"))
    checks.check_paged_attention(child.get("per_sequence_blocks"))


def test_preempting_every_newer_request_at_once_is_rejected(child):
    with pytest.raises(AssertionError, match="already frees the blocks"):
        checks.check_schedule(child.get("preempts_all_newer"))


def test_preemptions_needed_follows_the_rule():
    """The amount the check holds a plan to, on hand-made steps: one victim, two victims, the request itself."""
    def req(i, computed, blocks, freeable, tokens=None):
        return dict(id=i, computed=computed, tokens=tokens or computed + 1, blocks=blocks, freeable=freeable, seqs=1)

    full = [req(0, 4, 2, 2), req(1, 4, 2, 2), req(2, 4, 2, 2)]  # block size 2: each needs a third block
    assert preemptions_needed(full, 0, 2, 8) == 1  # the newest frees 2: the other two fit
    shared = [req(0, 4, 2, 0), req(1, 4, 2, 1), req(2, 4, 2, 0)]
    assert preemptions_needed(shared, 0, 2, 8) == 2  # 2 frees nothing, 1 frees one: 0 fits, then nobody runs
    alone = [req(0, 4, 2, 0)]
    assert preemptions_needed(alone, 0, 2, 8) == 1  # it does not fit: it is preempted itself


@pytest.mark.parametrize("name, match", [
    ("two_pass_when_grouped", "median full block of K was read 2.0 times"),
    ("per_query_head", "not once per query head"),
    ("whole_row_per_kv_head", "one KV head's keys|contiguous copy of the longest"),
])
def test_paged_attention_rejects(child, name, match):
    with pytest.raises(AssertionError, match=match) as err:
        checks.check_paged_attention(child.get(name))
    print(name, "->", str(err.value)[:300])


def test_the_long_case_alone_rejects_a_whole_row_per_kv_head(child):
    """Whatever the other cases draw (a whole row of keys per KV head passed them whenever no case had a single KV
    head: with 2 or more it is under half a sequence's whole K and V), the long case (B = 2, groups of 64 query heads
    on 1 or 2 KV heads, 4500-5000 keys, head_dim 64) sees it hold at least one KV head's keys, twice its bound of half
    of them; one pass in chunks of about 32 keys holds less than half the bound (a third, with 64-128 query heads'
    running statistics)."""
    c = paged_case(torch.Generator().manual_seed(0), LONG_CASE, 64)
    bound = max(c["lens"]) * 64 * 4 / 2
    _, obs = observe(child.get("whole_row_per_kv_head"), *c["args"])
    assert obs.peak_bytes + obs.premade_bytes >= 2 * bound
    _, obs = observe(child.get("one_pass"), *c["args"])
    assert obs.peak_bytes + obs.premade_bytes < bound / 2


def _rejected_or_never_junk(child, check, name, match):
    before = child.get("junk_answered")()
    try:
        check(child.get(name))
    except AssertionError as err:
        assert re.search(match, str(err)), str(err)
        return
    assert child.get("junk_answered")() == before, f"{name} answered junk while observed, and the check passed it"


def test_observed_plans_are_judged(child):
    _rejected_or_never_junk(child, checks.check_schedule, "schedule_junk_observed", "the plan")  # runs nothing, ...


def test_observed_prefix_caches_are_judged(child):
    _rejected_or_never_junk(child, checks.check_PrefixCache, "PrefixCacheJunkObserved", "PrefixCache")


def test_sdpa_inside_the_engine_is_seen(ex, child):
    parts = [child.get("sdpa_in_the_engine") if p == "paged_attention" else getattr(ex, p) for p in checks._PARTS]
    with pytest.raises(AssertionError, match="your paged_attention ran"):
        checks.check_engine(*parts)
