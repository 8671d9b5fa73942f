"""Week 18's checks of exercises 1-3 (speculative_generate, verify, speculative_sample) accept an honest solution and
reject each wrong route, graded the way `pytest weeks/18` and autograde grade a student: the wrong routes are written
into a copy of the solution notebook and run in the isolated child (grader/isolation.py); the checks see them through
proxies. Exercises 4-6 (expected_rejections, lookup_draft, best_k): tests/test_week18_theory.py."""
import importlib.util
import math
from pathlib import Path

import pytest
import torch

from grader.checks import week18 as checks

_spec = importlib.util.spec_from_file_location("_week18_support", Path(__file__).with_name("_week18_support.py"))
_support = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_support)
_isolated = _support.isolated


# --- 2: verify -------------------------------------------------------------------------------------------------

WRONG_VERIFY = '''
import torch as _t


def _fine(p, q, x, generator, i):
    return float(p[i, x]), float(q[i, x])


def _residual(p, q, i, generator):
    res = (p[i] - q[i]).clamp(min=0)
    if float(res.sum()) <= 0:
        res = p[i]
    return int(_t.multinomial(res, 1, generator=generator))


def verify_sequence_ratio(target_probs, draft_probs, draft_tokens, generator=None):
    # one uniform against the running product min(1, Π p/q): a sequence-level ratio
    k = draft_tokens.shape[0]
    u = float(_t.rand((), generator=generator))
    ratio = 1.0
    for i in range(k):
        px, qx = _fine(target_probs, draft_probs, int(draft_tokens[i]), generator, i)
        ratio *= px / qx
        if u >= min(1.0, ratio):
            return i, _residual(target_probs, draft_probs, i, generator)
    return k, int(_t.multinomial(target_probs[k], 1, generator=generator))


def verify_all_or_nothing(target_probs, draft_probs, draft_tokens, generator=None):
    k = draft_tokens.shape[0]
    ratio = 1.0
    for i in range(k):
        px, qx = _fine(target_probs, draft_probs, int(draft_tokens[i]), generator, i)
        ratio *= px / qx
    if float(_t.rand((), generator=generator)) < min(1.0, ratio):
        return k, int(_t.multinomial(target_probs[k], 1, generator=generator))
    return 0, _residual(target_probs, draft_probs, 0, generator)


def _per_token(target_probs, draft_probs, draft_tokens, generator, accept, fix=None):
    k = draft_tokens.shape[0]
    for i in range(k):
        px, qx = _fine(target_probs, draft_probs, int(draft_tokens[i]), generator, i)
        if accept(i, px, qx):
            continue
        if fix is not None:
            return i, fix(i)
        return i, _residual(target_probs, draft_probs, i, generator)
    return k, int(_t.multinomial(target_probs[k], 1, generator=generator))


def verify_argmax_correction(target_probs, draft_probs, draft_tokens, generator=None):
    return _per_token(target_probs, draft_probs, draft_tokens, generator,
                      lambda i, px, qx: float(_t.rand((), generator=generator)) * qx < px,
                      fix=lambda i: int((target_probs[i] - draft_probs[i]).clamp(min=0).argmax()))


def verify_lenient(target_probs, draft_probs, draft_tokens, generator=None):
    return _per_token(target_probs, draft_probs, draft_tokens, generator,
                      lambda i, px, qx: float(_t.rand((), generator=generator)) < px / qx + 0.08)


def verify_two_points_generous(target_probs, draft_probs, draft_tokens, generator=None):
    return _per_token(target_probs, draft_probs, draft_tokens, generator,
                      lambda i, px, qx: float(_t.rand((), generator=generator)) < px / qx + 0.02 * (0 < px < qx))


def verify_two_points_strict_at_third(target_probs, draft_probs, draft_tokens, generator=None):
    return _per_token(target_probs, draft_probs, draft_tokens, generator,
                      lambda i, px, qx: float(_t.rand((), generator=generator)) < px / qx - 0.02 * (i == 2 and px < qx))


def verify_lenient_after_three(target_probs, draft_probs, draft_tokens, generator=None):
    # exact for the first three draft tokens (every case but one has K = 3), lenient after them
    return _per_token(target_probs, draft_probs, draft_tokens, generator,
                      lambda i, px, qx: float(_t.rand((), generator=generator)) < px / qx + 0.15 * (i >= 3))


def verify_one_uniform(target_probs, draft_probs, draft_tokens, generator=None):
    u = float(_t.rand((), generator=generator))  # drawn once, reused by every test
    return _per_token(target_probs, draft_probs, draft_tokens, generator, lambda i, px, qx: u * qx < px)


def verify_one_uniform_for_everything(target_probs, draft_probs, draft_tokens, generator=None):
    # one uniform for the tests, the residual and the bonus (inverse CDF)
    u = float(_t.rand((), generator=generator))
    k = draft_tokens.shape[0]

    def inv(row):
        row = row / row.sum()
        return min(int((_t.cumsum(row, 0) <= u).sum()), row.shape[0] - 1)
    for i in range(k):
        px, qx = _fine(target_probs, draft_probs, int(draft_tokens[i]), generator, i)
        if u * qx < px:
            continue
        res = (target_probs[i] - draft_probs[i]).clamp(min=0)
        return i, inv(res if float(res.sum()) > 0 else target_probs[i])
    return k, inv(target_probs[k])


def verify_ignores_generator(target_probs, draft_probs, draft_tokens, generator=None):
    return verify(target_probs, draft_probs, draft_tokens, generator=None)  # torch's global generator


def verify_deterministic_from_third(target_probs, draft_probs, draft_tokens, generator=None):
    return _per_token(target_probs, draft_probs, draft_tokens, generator,
                      lambda i, px, qx: px / qx >= 0.5 if i >= 2 else float(_t.rand((), generator=generator)) * qx < px)


def verify_residual_from_p(target_probs, draft_probs, draft_tokens, generator=None):
    return _per_token(target_probs, draft_probs, draft_tokens, generator,
                      lambda i, px, qx: float(_t.rand((), generator=generator)) * qx < px,
                      fix=lambda i: int(_t.multinomial(target_probs[i], 1, generator=generator)))


def verify_flipped_ratio(target_probs, draft_probs, draft_tokens, generator=None):
    return _per_token(target_probs, draft_probs, draft_tokens, generator,
                      lambda i, px, qx: float(_t.rand((), generator=generator)) * px < qx)


def verify_writes_into_p(target_probs, draft_probs, draft_tokens, generator=None):
    k = draft_tokens.shape[0]
    for i in range(k):
        px, qx = _fine(target_probs, draft_probs, int(draft_tokens[i]), generator, i)
        if float(_t.rand((), generator=generator)) * qx < px:
            continue
        res = target_probs[i].sub_(draft_probs[i]).clamp_(min=0)  # the caller's p is overwritten
        if float(res.sum()) <= 0:
            res = draft_probs[i]
        return i, int(_t.multinomial(res, 1, generator=generator))
    return k, int(_t.multinomial(target_probs[k], 1, generator=generator))


def verify_cpu_uniforms(target_probs, draft_probs, draft_tokens, generator=None):
    # all K uniforms at once, made on the CPU whatever the inputs' device (fails on CUDA)
    k = draft_tokens.shape[0]
    idx = _t.arange(k, device=target_probs.device)
    p_at, q_at = target_probs[:k][idx, draft_tokens], draft_probs[idx, draft_tokens]
    u = _t.rand(k, generator=generator, dtype=p_at.dtype)
    ok = (u * q_at < p_at).tolist()
    n = ok.index(False) if False in ok else k
    if n == k:
        return k, int(_t.multinomial(target_probs[k], 1, generator=generator))
    return n, _residual(target_probs, draft_probs, n, generator)


def verify_lib_renamed(target_probs, draft_probs, draft_tokens, generator=None):
    return _lib_verify(target_probs, draft_probs, draft_tokens, generator)


import sys as _sys
import types as _types

_mine = _types.ModuleType("mine")
_sys.modules["mine"] = _mine
exec(compile(open(__import__("lib.spec_decode.speculative", fromlist=["x"]).__file__).read(), "/tmp/mine.py", "exec"),
     _mine.__dict__)
_lib_verify = _mine.verify
'''

# name -> what the check's message must say
VERIFY_ROUTES = {
    "verify_sequence_ratio": "law",
    "verify_all_or_nothing": "law",
    "verify_argmax_correction": "law",
    "verify_lenient": "law",
    "verify_lenient_after_three": "case 'long round'",
    "verify_two_points_generous": "law",
    "verify_two_points_strict_at_third": "law",
    "verify_one_uniform": "law",
    "verify_one_uniform_for_everything": "law",
    "verify_ignores_generator": "equal states",
    "verify_deterministic_from_third": "law",
    "verify_residual_from_p": "law",
    "verify_flipped_ratio": "law",
    "verify_writes_into_p": "wrote into its arguments|changed argument 1 .* in place|does not follow the law",  # p overwritten: later runs see another p
    "verify_cpu_uniforms": "CPU tensor",
    "verify_lib_renamed": "your own|lib",
}


@pytest.fixture(scope="module")
def wrong_verify(tmp_path_factory):
    return _isolated(tmp_path_factory, {"verify": WRONG_VERIFY})


def test_verify_accepts_the_solution_isolated(wrong_verify):
    checks.check_verify(wrong_verify.verify)


@pytest.mark.parametrize("name", sorted(VERIFY_ROUTES))
def test_verify_rejects(wrong_verify, name):
    with pytest.raises(AssertionError, match=VERIFY_ROUTES[name]) as err:
        checks.check_verify(getattr(wrong_verify, name))
    print(name, "->", str(err.value)[:300])


def test_law_test_power_and_false_failure_rate():
    """The design of check_verify's statistics, computed exactly: an acceptance probability off by 2 points at
    any position of the main case is caught with probability >= 0.999 from the runs that reach it, and the
    number reaching position 2 is below that only with probability < 1e-9; false failures < 1e-6 by
    construction (Chernoff + union bound, law_level)."""
    g = torch.Generator().manual_seed(0)
    cases = checks.law_cases(g)
    level = checks.law_level(sum(len(checks.law_tests(c)) for c in cases))
    assert math.isclose(2 * math.exp(-level) * sum(len(checks.law_tests(c)) for c in cases), checks.FALSE_FAILURE)
    lo, hi = checks.MAIN_RATIOS
    reach = lo ** (checks.LAW_K - 1)  # the least probability of reaching the last position
    n = checks.MAIN_TRIALS
    m_min = 29_500
    sd = math.sqrt(n * reach * (1 - reach))
    assert n * reach - 6.1 * sd >= m_min  # P[Binomial(n, reach) < m_min] < 1e-9 (normal tail, 6.1 sd)
    for a in (lo, (lo + hi) / 2, hi):
        for delta in (0.02, -0.02):
            assert checks.law_power(m_min, a, delta, level) >= 0.999, (a, delta)
    # and it is not over-powered into flagging rounding: 0.2 points is not detectable
    assert checks.law_power(m_min, lo, 0.002, level) < 0.01


# --- 1, 3: speculative_generate, speculative_sample -----------------------------------------------------------

WRONG_LOOPS = '''
import sys as _sys
import types as _types

import torch as _t


def _loop(target, draft, input_ids, max_new_tokens, k=4, temperature=0.0, generator=None, cache=True,
          roll_target=True, roll_draft=True, keep=None, call=None, scale=True, overtrim=False, kept=None):
    """One speculative loop with switches that break it."""
    out = input_ids[0].tolist()
    t0 = len(out)
    max_len = t0 + max_new_tokens + k + 1
    tc = target.new_cache(batch=1, max_len=max_len) if cache else None
    dc = draft.new_cache(batch=1, max_len=max_len) if cache else None
    run = call or (lambda m, ids, c: m(ids, cache=c))
    t_seen = d_seen = 0  # what the loop believes each cache holds (the truth when it rolls back)
    while len(out) - t0 < max_new_tokens:
        kk = min(k, max_new_tokens - (len(out) - t0) - 1)
        drafted, q_rows = [], []
        for _ in range(kk):
            seen = d_seen if dc is not None else 0
            logits = run(draft, _t.tensor([(out + drafted)[seen:]]), dc)[0, -1]
            d_seen = len(out) + len(drafted)
            if temperature == 0:
                drafted.append(int(logits.argmax()))
            else:
                q = _t.softmax(logits / (temperature if scale else 1.0), -1)
                q_rows.append(q)
                drafted.append(int(_t.multinomial(q, 1, generator=generator)))
        seen = t_seen if tc is not None else 0
        logits = run(target, _t.tensor([(out + drafted)[seen:]]), tc)[0, -(kk + 1):]
        t_seen = len(out) + len(drafted)
        if temperature == 0:
            best = logits.argmax(-1).tolist()
            n = 0
            while n < kk and drafted[n] == best[n]:
                n += 1
            nxt = best[n]
        elif keep is not None:
            n, nxt = keep(logits, drafted, generator)
        else:
            p = _t.softmax(logits / (temperature if scale else 1.0), -1)
            q = _t.stack(q_rows) if q_rows else p.new_zeros(0, p.shape[-1])
            n, nxt = verify(p, q, _t.tensor(drafted, dtype=_t.int64), generator=generator)
        out += kept(drafted, n, nxt, kk) if kept is not None else drafted[:n] + [nxt]
        t_seen, d_seen = min(t_seen, len(out) - 1), min(d_seen, len(out) - 1)
        if overtrim:
            t_seen = d_seen = t0 - 1
        if tc is not None and roll_target:
            tc.truncate(t_seen)
        if dc is not None and roll_draft:
            dc.truncate(d_seen)
    return _t.tensor([out])


def generate_cacheless(target, draft, input_ids, max_new_tokens, k=4):
    return _loop(target, draft, input_ids, max_new_tokens, k, cache=False)


def generate_no_draft_rollback(target, draft, input_ids, max_new_tokens, k=4):
    return _loop(target, draft, input_ids, max_new_tokens, k, roll_draft=False)


def generate_no_target_rollback(target, draft, input_ids, max_new_tokens, k=4):
    return _loop(target, draft, input_ids, max_new_tokens, k, roll_target=False)


def generate_refeeds_everything(target, draft, input_ids, max_new_tokens, k=4):
    # caches, rolled back to the prompt every round: each round re-reads everything generated so far
    return _loop(target, draft, input_ids, max_new_tokens, k, overtrim=True)


def generate_target_by_forward(target, draft, input_ids, max_new_tokens, k=4):
    # greedy decoding with target.forward (once a counter's blind spot), the draft only touched
    draft(input_ids, cache=draft.new_cache(batch=1, max_len=input_ids.shape[1] + 1))
    out = input_ids
    cache = target.new_cache(batch=1, max_len=input_ids.shape[1] + max_new_tokens)
    nxt = input_ids
    for _ in range(max_new_tokens):
        tok = target.forward(nxt, cache=cache)[:, -1].argmax(-1, keepdim=True)
        out = _t.cat([out, tok], 1)
        nxt = tok
    return out


_mine = _types.ModuleType("mine_spec")
_sys.modules["mine_spec"] = _mine
exec(compile(open(__import__("lib.spec_decode.speculative", fromlist=["x"]).__file__).read(), "/tmp/my_spec.py", "exec"),
     _mine.__dict__)


def generate_lib_renamed(target, draft, input_ids, max_new_tokens, k=4):
    return _mine.speculative_generate(target, draft, input_ids, max_new_tokens, k=k)


def sample_lib_renamed(target, draft, input_ids, max_new_tokens, k=4, temperature=1.0, generator=None):
    return _mine.speculative_generate(target, draft, input_ids, max_new_tokens, k=k, temperature=temperature,
                                      generator=generator)


def sample_greedy_acceptance(target, draft, input_ids, max_new_tokens, k=4, temperature=1.0, generator=None):
    # keep sampled draft tokens while they are the target's argmax, then a sample from p
    def keep(logits, drafted, generator):
        best = logits.argmax(-1).tolist()
        n = 0
        while n < len(drafted) and drafted[n] == best[n]:
            n += 1
        return n, int(_t.multinomial(_t.softmax(logits[n] / temperature, -1), 1, generator=generator))
    return _loop(target, draft, input_ids, max_new_tokens, k, temperature, generator, keep=keep)


def sample_ignores_temperature(target, draft, input_ids, max_new_tokens, k=4, temperature=1.0, generator=None):
    return _loop(target, draft, input_ids, max_new_tokens, k, temperature, generator, scale=False)


def sample_no_draft_rollback(target, draft, input_ids, max_new_tokens, k=4, temperature=1.0, generator=None):
    return _loop(target, draft, input_ids, max_new_tokens, k, temperature, generator, roll_draft=False)


def sample_cacheless(target, draft, input_ids, max_new_tokens, k=4, temperature=1.0, generator=None):
    return _loop(target, draft, input_ids, max_new_tokens, k, temperature, generator, cache=False)


def sample_ignores_generator(target, draft, input_ids, max_new_tokens, k=4, temperature=1.0, generator=None):
    # the right law, from torch's global generator (draft samples and verify's draws alike)
    return _loop(target, draft, input_ids, max_new_tokens, k, temperature, None)


def sample_fixed_seed(target, draft, input_ids, max_new_tokens, k=4, temperature=1.0, generator=None):
    # reproducible, but from a generator of its own: every call draws the same numbers
    return _loop(target, draft, input_ids, max_new_tokens, k, temperature, _t.Generator().manual_seed(0))


def sample_one_token_per_round(target, draft, input_ids, max_new_tokens, k=4, temperature=1.0, generator=None):
    # exact law, no speculation: each round keeps only its first token (the first draft token or the correction)
    return _loop(target, draft, input_ids, max_new_tokens, k, temperature, generator,
                 kept=lambda drafted, n, nxt, kk: drafted[:1] if n else [nxt])


def sample_drops_the_bonus(target, draft, input_ids, max_new_tokens, k=4, temperature=1.0, generator=None):
    # after K acceptances the bonus token from p_K is thrown away: K tokens per full round instead of K + 1
    return _loop(target, draft, input_ids, max_new_tokens, k, temperature, generator,
                 kept=lambda drafted, n, nxt, kk: drafted[:n] + ([nxt] if n < kk or kk == 0 else []))


# right in every way but one: the ids fed to the models are made with torch.tensor(...) without device=, which
# puts them on the CPU beside a model on CUDA
def generate_default_device(target, draft, input_ids, max_new_tokens, k=4):
    return _loop(target, draft, input_ids, max_new_tokens, k)


def sample_default_device(target, draft, input_ids, max_new_tokens, k=4, temperature=1.0, generator=None):
    return _loop(target, draft, input_ids, max_new_tokens, k, temperature, generator)
'''

GENERATE_ROUTES = {
    "generate_cacheless": "without a cache",
    "generate_no_draft_rollback": "roll the draft's cache back",
    "generate_no_target_rollback": "differs from greedy|rejected draft tokens were left",
    "generate_refeeds_everything": "target call 1 was fed",
    "generate_target_by_forward": "target ran .* forwards|fed",
    "generate_lib_renamed": "own loop|is not available to your code",  # the view: lib.spec_decode.speculative is stubs
    "generate_default_device": "default device set to 'meta'.*ids on 'meta'",
}
SAMPLE_ROUTES = {
    "sample_lib_renamed": "own loop|is not available to your code",
    "sample_greedy_acceptance": "target's law|with p = q every draft token is accepted",
    "sample_ignores_temperature": "target's law",
    "sample_no_draft_rollback": "roll the draft's cache back",
    "sample_cacheless": "without a cache",
    "sample_default_device": "default device set to 'meta'.*ids on 'meta'",
    "sample_ignores_generator": "equal states gave different ids",
    "sample_fixed_seed": "do not have the target's law|different states gave the same",  # 1,500 runs, one output
    "sample_one_token_per_round": "with p = q every draft token is accepted",
    "sample_drops_the_bonus": "with p = q every draft token is accepted",
}


@pytest.fixture(scope="module")
def wrong_loops(tmp_path_factory):
    return _isolated(tmp_path_factory, {"speculative_sample": WRONG_LOOPS})


def test_speculative_generate_accepts_the_solution_isolated(wrong_loops):
    checks.check_speculative_generate(wrong_loops.speculative_generate, smollm2=False)


@pytest.mark.parametrize("name", sorted(GENERATE_ROUTES))
def test_speculative_generate_rejects(wrong_loops, name):
    with pytest.raises(AssertionError, match=GENERATE_ROUTES[name]) as err:
        checks.check_speculative_generate(getattr(wrong_loops, name), smollm2=False)
    print(name, "->", str(err.value)[:300])


def test_speculative_sample_accepts_the_solution_isolated(wrong_loops):
    checks.check_speculative_sample(wrong_loops.speculative_sample)


@pytest.mark.parametrize("name", sorted(SAMPLE_ROUTES))
def test_speculative_sample_rejects(wrong_loops, name):
    with pytest.raises(AssertionError, match=SAMPLE_ROUTES[name]) as err:
        checks.check_speculative_sample(getattr(wrong_loops, name))
    print(name, "->", str(err.value)[:300])
