"""Week 18, issue 54: speculative_sample's law test covers every position of a round at several K, and every
week-18 check judges the calls it observes.

The law test (grader/checks/week18_law.py, `SAMPLE_CASES`) runs the loop on position tables, so that a correct loop's
new tokens are independent, token t distributed as the case's row p[t]. For each mistake named below the law of
what it writes is computed here exactly (a round at a time, as a loop with the solution's round sizes writes it),
and from it the probability that the check's binomial tests all pass: <= 1e-6 for each, by construction. Then each
mistake, written as a notebook would write it, is run through the isolated path (the solution notebook with the
route appended to a cell, loaded as `pytest weeks/18` loads it) and must be rejected.
"""
import itertools
import json
import math
import re
from pathlib import Path

import pytest
import torch

from grader.checks import week18 as checks
from grader.checks.week18_law import SAMPLE_CASES, kl_divergence, sample_level, sample_tests
from grader.harness import load_exercises, with_cell_source

SOLUTION = Path(__file__).resolve().parent.parent / "solutions" / "18" / checks.WEEK.notebook


# --- the exact law of a round-by-round sampler on position tables -------------------------------------------------

def _marginals(case, flaw: str = "") -> list[list[float]]:
    """[new token][designed token]: the law of each new token a loop with `flaw` writes on `case` (exact; rounds of
    min(K, tokens left - 1) draft tokens, as the solution drafts). Flaws: "greedy" (the draft's argmax passed off as
    a sample of q), "one_uniform" (one uniform per round, reused at every draft position), "after_two" (every draft
    token accepted once two tokens are written), "residual_p" (a rejection resampled from p), "bonus_row" (the bonus
    from p's previous row), "no_temperature" (softmax of the logits, T ignored), "draft_t1" (the draft's tokens drawn at T = 1, verify handed
    q at T), "draft_top_k" (the draft's tokens drawn from q's top 50, transformers' default top_k, verify handed q)."""
    n, k, temp, width = len(case.p), case.k, case.temperature, len(case.p[0])
    if width > 64:  # the wide case (SmolLM2's 49,152 tokens): its draft tuples cannot be enumerated
        return _marginals_factorized(case, flaw)

    def law(rows):
        if flaw != "no_temperature":
            return [list(r) for r in rows]
        return [[x ** temp / sum(y ** temp for y in r) for x in r] for r in rows]

    p, q = law(case.p), law(case.q)
    drawn = [[x ** temp / sum(y ** temp for y in r) for x in r] for r in case.q] if flaw == "draft_t1" else q
    if flaw == "draft_top_k":
        drawn = [[x / sum(sorted(r)[-50:]) if x >= sorted(r)[-min(50, width)] else 0.0 for x in r] for r in q]
    out = [[0.0] * width for _ in range(n)]
    start = [1.0] + [0.0] * n  # the probability that a round starts at each new token
    for s in range(n):
        kk = min(k, n - s - 1)
        choices = [[(max(range(width), key=lambda y: q[s + i][y]), 1.0)] if flaw == "greedy" else
                   [(y, drawn[s + i][y]) for y in range(width) if drawn[s + i][y] > 0] for i in range(kk)]
        for drafted in itertools.product(*choices):
            mass = start[s] * math.prod(w for _, w in drafted)
            xs = [x for x, _ in drafted]
            r = [1.0 if flaw == "after_two" and s + i >= 2 else min(1.0, p[s + i][x] / q[s + i][x])
                 for i, x in enumerate(xs)]
            if flaw == "one_uniform":  # u < r_i for i < j, u >= r_j
                stop = [max(0.0, min(r[:j], default=1.0) - r[j]) for j in range(kk)] + [min(r, default=1.0)]
            else:
                stop = [math.prod(r[:j]) * (1 - r[j]) for j in range(kk)] + [math.prod(r)]
            for j, w in enumerate(stop):
                if w <= 0:
                    continue
                for i in range(j):
                    out[s + i][xs[i]] += mass * w
                t = s + j
                if j == kk:
                    nxt = p[t - 1] if flaw == "bonus_row" and j > 0 else p[t]
                else:
                    res = [max(a - b, 0.0) for a, b in zip(p[t], q[t])]
                    nxt = p[t] if flaw == "residual_p" or sum(res) == 0 else [x / sum(res) for x in res]
                for y in range(len(nxt)):
                    out[t][y] += mass * w * nxt[y]
                start[t + 1] += mass * w
    return out


def _marginals_factorized(case, flaw: str = "") -> list[list[float]]:
    """`_marginals` for a case too wide to enumerate the draft tokens' tuples: with a fresh uniform per draft token, a
    round's draft tokens are independent and each is accepted with its own ratio, so the law of the round factorizes
    (the token at draft position i, given the round gets past it, has the law drawn_i · r_i / A_i, A_i = Σ drawn_i · r_i).
    Not for "one_uniform" (one uniform ties the positions: the wide case's bound is left to the other cases) and
    "no_temperature" at T = 1 is the loop itself."""
    assert flaw != "one_uniform"
    n, k, temp = len(case.p), case.k, case.temperature
    p = [torch.tensor(r, dtype=torch.float64) for r in case.p]
    q = [torch.tensor(r, dtype=torch.float64) for r in case.q]
    if flaw == "no_temperature":
        p, q = [r ** temp / (r ** temp).sum() for r in p], [r ** temp / (r ** temp).sum() for r in q]
    if flaw == "draft_t1":
        drawn = [r ** temp / (r ** temp).sum() for r in q]
    elif flaw == "draft_top_k":
        top = [r.topk(min(50, r.numel())).indices for r in q]
        drawn = [torch.zeros_like(r).index_put_((i,), r[i] / r[i].sum()) for r, i in zip(q, top)]
    elif flaw == "greedy":
        drawn = [torch.nn.functional.one_hot(r.argmax(), r.numel()).double() for r in q]
    else:
        drawn = q
    out = [torch.zeros_like(p[0]) for _ in range(n)]
    start = [1.0] + [0.0] * n
    for s in range(n):
        kk, reach = min(k, n - s - 1), start[s]
        for i in range(kk + 1):
            t = s + i
            if i == kk:  # every draft token accepted: the bonus
                out[t] += reach * (p[t - 1] if flaw == "bonus_row" and i > 0 else p[t])
                start[t + 1] += reach
                break
            r = torch.ones_like(p[t]) if flaw == "after_two" and t >= 2 else torch.where(
                q[t] > 0, (p[t] / q[t].clamp(min=1e-300)).clamp(max=1.0), torch.zeros_like(p[t]))
            kept = drawn[t] * r
            accepted = float(kept.sum())
            res = (p[t] - q[t]).clamp(min=0.0)
            nxt = p[t] if flaw == "residual_p" or float(res.sum()) == 0 else res / res.sum()
            out[t] += reach * (1.0 - accepted) * nxt  # rejected here: the residual
            start[t + 1] += reach * (1.0 - accepted)
            out[t] += reach * kept  # accepted here, the round goes on
            reach *= accepted
    return [o.tolist() for o in out]


def _passes(trials: int, a: float, b: float, level: float) -> float:
    """P[the binomial test of probability `a` at `level` passes] when the count is Binomial(trials, b)."""
    if b in (0.0, 1.0):
        x = trials * b
        return 1.0 if trials * kl_divergence(x / trials, a) <= level else 0.0
    logs = [math.lgamma(trials + 1) - math.lgamma(x + 1) - math.lgamma(trials - x + 1) + x * math.log(b)
            + (trials - x) * math.log(1 - b) for x in range(trials + 1)]
    return sum(math.exp(lp) for x, lp in enumerate(logs) if trials * kl_divergence(x / trials, a) <= level)


# the flaws whose new tokens stay independent (each position's token drawn afresh, rows alike): for them the pooled
# counts are exactly binomial, so the pooled tests' passing probabilities are exact too
INDEPENDENT = {"greedy", "residual_p", "no_temperature"}
NAMED = ["greedy", "one_uniform", "after_two", "residual_p", "bonus_row", "no_temperature", "draft_t1", "draft_top_k"]


def _passing_probability(flaw: str) -> float:
    """An upper bound on P[the check passes a loop with `flaw`]: the least, over every case and test, of that one
    test's passing probability (the check passes only if all of them pass; any one bounds it)."""
    level, least = sample_level(), 1.0
    for case in SAMPLE_CASES:
        if flaw == "one_uniform" and len(case.p[0]) > 64:
            continue  # (a bound from the other cases is a bound: the check passes only if every case passes)
        law = _marginals(case, flaw)
        for t, j in itertools.product(range(len(case.p)), range(len(case.p[0]))):  # a token the target never writes
            if case.p[t][j] == 0 and law[t][j] > 1e-12:
                least = min(least, (1 - law[t][j]) ** case.trials)
        for positions, event, a in sample_tests(case):
            # a draft drawn at T = 1 where p = q: every draft token accepted whatever it is, one independent draw each
            shared = flaw == "draft_t1" and all(case.p[t] == case.q[t] for t in positions)
            if len(positions) == 1 or flaw in INDEPENDENT or shared:
                b = sum(law[t][j] for t in positions for j in event) / len(positions)
                least = min(least, _passes(case.trials * len(positions), a, b, level))
    return least


def test_a_correct_loop_writes_the_target_law_and_fails_less_than_once_in_a_million():
    for case in SAMPLE_CASES:
        law = _marginals(case)
        assert all(abs(law[t][j] - case.p[t][j]) < 1e-12 for t in range(len(case.p)) for j in range(len(case.p[0]))), case.name
    n_tests = sum(len(sample_tests(c)) for c in SAMPLE_CASES)
    # Chernoff: P[m·KL(X/m || a) > L] <= 2·exp(-L) per test; the union bound over n_tests tests gives 1e-6
    assert math.isclose(2 * n_tests * math.exp(-sample_level()), checks.FALSE_FAILURE)


def test_the_factorized_law_is_the_enumerated_one_where_both_can_be_computed():
    """The wide case's law (`_marginals_factorized`) against the enumeration, on every case narrow enough for it."""
    for case in SAMPLE_CASES:
        if len(case.p[0]) > 64:
            continue
        for flaw in ["", *NAMED]:
            if flaw != "one_uniform":
                got, want = _marginals_factorized(case, flaw), _marginals(case, flaw)
                assert all(abs(a - b) < 1e-12 for g, w in zip(got, want) for a, b in zip(g, w)), (case.name, flaw)


@pytest.mark.parametrize("flaw", NAMED)
def test_each_named_mistake_passes_with_probability_below_one_in_a_million(flaw):
    assert _passing_probability(flaw) <= 1e-6, flaw


def test_the_named_mistakes_change_what_they_change():
    """The exact law is not vacuous: one uniform per round leaves the first token exact and changes the later ones;
    a loop exact for two tokens is exact at the first two; the bonus from another row changes only the bonus."""
    four = SAMPLE_CASES[0]
    law = _marginals(four, "one_uniform")
    assert abs(law[0][2] - 0.5) < 1e-12 and abs(law[3][2] - 0.5) > 0.3
    law = _marginals(SAMPLE_CASES[1], "after_two")
    assert all(abs(law[t][j] - SAMPLE_CASES[1].p[t][j]) < 1e-12 for t in range(2) for j in range(3))
    bonus = SAMPLE_CASES[3]
    law = _marginals(bonus, "bonus_row")
    assert [x for row in law[:2] for x in row] == pytest.approx([x for row in _marginals(bonus)[:2] for x in row])
    assert law[2][2] == 0.0


# --- the mistakes, written as a notebook would write them ----------------------------------------------------------

WRONG_LOOPS = '''
import torch as _t


def _sloop(target, draft, input_ids, max_new_tokens, k, temperature, generator, flaw):
    """The solution's loop with its verification written inline, and one flaw."""
    out = input_ids[0].tolist()
    t0, dev = len(out), input_ids.device
    max_len = t0 + max_new_tokens + k + 1
    tc, dc = target.new_cache(batch=1, max_len=max_len), draft.new_cache(batch=1, max_len=max_len)
    t_seen = d_seen = 0
    scale = 1.0 if flaw == "no_temperature" else temperature
    while len(out) - t0 < max_new_tokens:
        kk = min(k, max_new_tokens - (len(out) - t0) - 1)
        drafted, q_rows = [], []
        for _ in range(kk):
            logits = draft(_t.tensor([(out + drafted)[d_seen:]], device=dev), cache=dc)[0, -1]
            d_seen = len(out) + len(drafted)
            q = _t.softmax(logits.float() / scale, -1)
            q_rows.append(q)
            drawn = _t.softmax(logits.float(), -1) if flaw == "draft_t1" else q  # drawn at T = 1, q given at T
            if flaw == "draft_top_k":  # drawn from q's top 50 (transformers' default top_k), q given whole
                top = q.topk(min(50, q.shape[-1]))
                drawn = _t.zeros_like(q).index_put_((top.indices,), top.values)
            drafted.append(int(q.argmax()) if flaw == "greedy" else int(_t.multinomial(drawn, 1, generator=generator)))
        logits = target(_t.tensor([(out + drafted)[t_seen:]], device=dev), cache=tc)[0, -(kk + 1):]
        t_seen = len(out) + len(drafted)
        p = _t.softmax(logits.float() / scale, -1)
        u_round = float(_t.rand((), generator=generator, device=dev))
        n = 0
        while n < kk:
            x = drafted[n]
            u = u_round if flaw == "one_uniform" else float(_t.rand((), generator=generator, device=dev))
            if (flaw == "after_two" and len(out) - t0 + n >= 2) or u * float(q_rows[n][x]) < float(p[n, x]):
                n += 1
                continue
            break
        if n < kk:
            res = p[n] if flaw == "residual_p" else (p[n] - q_rows[n]).clamp(min=0)
            nxt = int(_t.multinomial(res if float(res.sum()) > 0 else p[n], 1, generator=generator))
        else:
            nxt = int(_t.multinomial(p[n - 1] if flaw == "bonus_row" and n > 0 else p[n], 1, generator=generator))
        out += drafted[:n] + [nxt]
        t_seen, d_seen = min(t_seen, len(out) - 1), min(d_seen, len(out) - 1)
        tc.truncate(t_seen)
        dc.truncate(d_seen)
    return _t.tensor([out], dtype=input_ids.dtype, device=dev)


def sample_inline(target, draft, input_ids, max_new_tokens, k=4, temperature=1.0, generator=None):
    return _sloop(target, draft, input_ids, max_new_tokens, k, temperature, generator, "")


def sample_greedy_draft(target, draft, input_ids, max_new_tokens, k=4, temperature=1.0, generator=None):
    # the draft's argmax, passed to the acceptance test as if it had been drawn from q
    return _sloop(target, draft, input_ids, max_new_tokens, k, temperature, generator, "greedy")


def sample_one_uniform(target, draft, input_ids, max_new_tokens, k=4, temperature=1.0, generator=None):
    # one uniform per round, reused at every draft position
    return _sloop(target, draft, input_ids, max_new_tokens, k, temperature, generator, "one_uniform")


def sample_exact_for_two(target, draft, input_ids, max_new_tokens, k=4, temperature=1.0, generator=None):
    # exact for the first two new tokens; after them every draft token is kept untested
    return _sloop(target, draft, input_ids, max_new_tokens, k, temperature, generator, "after_two")


def sample_residual_from_p(target, draft, input_ids, max_new_tokens, k=4, temperature=1.0, generator=None):
    return _sloop(target, draft, input_ids, max_new_tokens, k, temperature, generator, "residual_p")


def sample_bonus_from_last_row(target, draft, input_ids, max_new_tokens, k=4, temperature=1.0, generator=None):
    # after K acceptances, the bonus token from the row that verified the last draft token
    return _sloop(target, draft, input_ids, max_new_tokens, k, temperature, generator, "bonus_row")


def sample_inline_no_temperature(target, draft, input_ids, max_new_tokens, k=4, temperature=1.0, generator=None):
    return _sloop(target, draft, input_ids, max_new_tokens, k, temperature, generator, "no_temperature")


def sample_draft_at_t1(target, draft, input_ids, max_new_tokens, k=4, temperature=1.0, generator=None):
    # the draft's tokens drawn from softmax(logits) (T = 1), verify handed q = softmax(logits / T)
    return _sloop(target, draft, input_ids, max_new_tokens, k, temperature, generator, "draft_t1")


def sample_draft_top_k(target, draft, input_ids, max_new_tokens, k=4, temperature=1.0, generator=None):
    # the draft's tokens drawn from q's 50 most likely, verify handed the whole q
    return _sloop(target, draft, input_ids, max_new_tokens, k, temperature, generator, "draft_top_k")
'''

SAMPLE_ROUTES = ["sample_greedy_draft", "sample_one_uniform", "sample_exact_for_two", "sample_residual_from_p",
                 "sample_bonus_from_last_row", "sample_inline_no_temperature", "sample_draft_at_t1",
                 "sample_draft_top_k"]

# Each exercise's solution, answering junk only while it looks observed (torch's dispatch-mode stack is not empty):
# the checks before issue 54 threw the observed result away and judged other calls. Where no call can tell it is
# observed (every call under the same dispatch stack), the route answers junk in every call or in none: rejected, or
# never junk (then there is nothing to catch) — `junk_answered` counts.
OBSERVED_JUNK = '''
import torch as _t


_JUNK = []


def _watched():
    """Whether this call looks observed (torch's dispatch-mode stack is not empty): then the junk is answered."""
    if _t._C._len_torch_dispatch_stack() > 0:
        _JUNK.append(1)
        return True
    return False


def junk_answered():
    return len(_JUNK)


def generate_junk_observed(target, draft, input_ids, max_new_tokens, k=4):
    if _watched():
        return _t.cat([input_ids, _t.zeros(1, max_new_tokens, dtype=input_ids.dtype)], 1)
    return speculative_generate(target, draft, input_ids, max_new_tokens, k=k)


def verify_junk_observed(target_probs, draft_probs, draft_tokens, generator=None):
    if _watched():
        return draft_tokens.shape[0] + 1, 0
    return verify(target_probs, draft_probs, draft_tokens, generator=generator)


def sample_junk_observed(target, draft, input_ids, max_new_tokens, k=4, temperature=1.0, generator=None):
    if _watched():
        return _t.cat([input_ids, _t.full((1, max_new_tokens), 10**6, dtype=input_ids.dtype)], 1)
    return speculative_sample(target, draft, input_ids, max_new_tokens, k=k, temperature=temperature,
                              generator=generator)


def rejections_junk_observed(p, q):
    if _watched():
        return _t.zeros((), dtype=p.dtype, device=p.device)
    return expected_rejections(p, q)


def lookup_junk_observed(tokens, k, max_ngram=3, min_ngram=1):
    if _watched():
        return [-1]
    return lookup_draft(tokens, k, max_ngram=max_ngram, min_ngram=min_ngram)


def best_k_junk_observed(alpha, c, verify_cost):
    if _watched():
        return 0, 0.0
    return best_k(alpha, c, verify_cost)
'''

OBSERVED_ROUTES = {
    "speculative_generate": ("generate_junk_observed", "differs from greedy"),
    "verify": ("verify_junk_observed", "n_accepted must be in 0..K"),
    # (junk in every call where each sees the same dispatch stack: then the draft model is never called)
    "speculative_sample": ("sample_junk_observed", "expected the prompt's ids and|the draft model was never called"),
    "expected_rejections": ("rejections_junk_observed", "expected"),
    "lookup_draft": ("lookup_junk_observed", "expected"),
    "best_k": ("best_k_junk_observed", "K must be an int"),
}


@pytest.fixture(scope="module")
def ex(tmp_path_factory):
    """The solution notebook with the routes appended to two of its cells, loaded isolated as `pytest weeks/18`."""
    nb = json.loads(SOLUTION.read_text())
    for grade_id, source in (("speculative_sample", WRONG_LOOPS), ("best_k", OBSERVED_JUNK)):
        cell = next(c for c in nb["cells"] if c["metadata"].get("nbgrader", {}).get("grade_id") == grade_id)
        old = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        nb = with_cell_source(nb, grade_id, old + "\n\n" + source)
    path = tmp_path_factory.mktemp("w18") / SOLUTION.name
    path.write_text(json.dumps(nb))
    exercises = load_exercises(path, isolated=True)
    yield exercises
    exercises.close()


def test_the_inline_loop_without_a_flaw_passes(ex):
    """The routes' loop, flaw switched off: what the check rejects below is the flaw, not the inline verification."""
    checks.check_speculative_sample(ex.sample_inline)


@pytest.mark.parametrize("name", SAMPLE_ROUTES)
def test_speculative_sample_rejects(ex, name):
    """The law test of check_speculative_sample (its work runs, which these routes pass, are left out here)."""
    bad = checks.sampled_law_failures(getattr(ex, name), checks.generator(5))
    assert bad and "the target's law gives" in bad[0], bad
    print(name, "->", bad[0][:300])


@pytest.mark.parametrize("exercise", sorted(OBSERVED_ROUTES))
def test_the_observed_calls_are_judged(ex, exercise):
    name, match = OBSERVED_ROUTES[exercise]
    check = getattr(checks, f"check_{exercise}")
    kwargs = {"smollm2": False} if exercise == "speculative_generate" else {}
    before = ex.junk_answered()
    try:
        check(getattr(ex, name), **kwargs)
    except AssertionError as err:
        assert re.search(match, str(err)), str(err)
        print(name, "->", str(err)[:300])
        return
    assert ex.junk_answered() == before, f"{name} answered junk while observed, and the check passed it"
