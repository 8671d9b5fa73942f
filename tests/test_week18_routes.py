"""Week 18's exercises posed for the student to work out (issue 55) reject their natural mistakes and shortcuts,
graded the way `pytest weeks/18` and autograde grade a student: each wrong route is written into a copy of the
solution notebook and run in the isolated child (grader/isolation.py); the checks see it through proxies.

- exercise 2, `verify` (derive): a rule that is exact but accepts less often than it could;
- exercise 6, `best_k` (derive, one α or one per draft position): the constant-α formula copied from lib, the first
  or the mean α for every position, the token's own α in its product, independent tests;
- exercise 7, `expected_target_calls` (predict): the steady state n / E[tokens a round], independent tests, no
  bonus token, a simulation, tokens per call instead of calls, lib's formula;
- exercise 8, `batched_speculative_generate` (design): one row a forward, the batch held to its slowest row, finished
  rows fed on, no rollback, one rollback for all rows, rows decoded one after another, no speculation, lib's loop.
"""
import json
from pathlib import Path

import pytest

from grader.checks import week18 as checks
from grader.checks import week18_batch, week18_predict
from grader.harness import load_exercises, with_cell_source

ROOT = Path(__file__).resolve().parent.parent
SOLUTION = ROOT / "solutions" / "18" / checks.WEEK.notebook


def _isolated(tmp_path_factory, grade_id: str, source: str):
    """The solution notebook with `source` added after cell `grade_id`'s own, loaded isolated."""
    nb = json.loads(SOLUTION.read_text())
    for cell in nb["cells"]:
        if cell["metadata"].get("nbgrader", {}).get("grade_id") == grade_id:
            old = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
            nb = with_cell_source(nb, grade_id, old + "\n\n" + source)
            break
    else:
        raise KeyError(grade_id)
    path = tmp_path_factory.mktemp("w18routes") / SOLUTION.name
    path.write_text(json.dumps(nb))
    return load_exercises(path, isolated=True)


# --- exercise 2: an exact rule that accepts less than it could ------------------------------------------------

TIMID_VERIFY = '''
def verify_exact_but_timid(target_probs, draft_probs, draft_tokens, generator=None):
    # accept with half of min(1, p/q), and make up for it in the replacement: still exactly p, fewer acceptances
    k = draft_tokens.shape[0]
    for i in range(k):
        x = int(draft_tokens[i])
        p_x, q_x = float(target_probs[i, x]), float(draft_probs[i, x])
        u = float(torch.rand((), generator=generator, device=target_probs.device))
        if u * q_x < 0.5 * min(p_x, q_x):
            continue
        rest = (target_probs[i] - 0.5 * torch.minimum(target_probs[i], draft_probs[i])).clamp(min=0)
        return i, int(torch.multinomial(rest, 1, generator=generator))
    return k, int(torch.multinomial(target_probs[k], 1, generator=generator))
'''


def test_an_exact_rule_that_accepts_less_is_rejected(tmp_path_factory):
    ns = _isolated(tmp_path_factory, "verify", TIMID_VERIFY)
    with pytest.raises(AssertionError, match="does not follow the law of speculative sampling"):
        checks.check_verify(ns.verify_exact_but_timid)


# --- exercise 6: best_k with one α per draft position -----------------------------------------------------------

WRONG_BEST_K = '''
def _best(speeds):
    k = max(speeds, key=speeds.get)
    return k, speeds[k]


def _alphas(alpha, m):
    return [float(alpha)] * (m - 1) if isinstance(alpha, (int, float)) else [float(a) for a in alpha]


def best_k_lib_formula_copied(alpha, c, verify_cost):
    # lib.spec_decode.speculative's constant-alpha formula, typed out (no lib call): the list read as its first alpha
    a = float(alpha) if isinstance(alpha, (int, float)) else float(alpha[0])
    tokens = {k: (k + 1.0 if a == 1.0 else (1 - a ** (k + 1)) / (1 - a)) for k in range(1, max(verify_cost))}
    return _best({k: t / (k * c + verify_cost[k + 1]) for k, t in tokens.items()})


def best_k_mean_alpha(alpha, c, verify_cost):
    alphas = _alphas(alpha, max(verify_cost))
    a = sum(alphas) / len(alphas)  # one mean alpha for every position
    return _best({k: sum(a ** i for i in range(k + 1)) / (k * c + verify_cost[k + 1]) for k in range(1, max(verify_cost))})


def best_k_own_alpha_in_product(alpha, c, verify_cost):
    alphas = _alphas(alpha, max(verify_cost))
    speeds = {}
    for k in range(1, max(verify_cost)):
        tokens, reach = 1.0, 1.0
        for i in range(k):
            reach *= alphas[min(i + 1, len(alphas) - 1)]  # token i + 1 weighted by the next guess's alpha
            tokens += reach
        speeds[k] = tokens / (k * c + verify_cost[k + 1])
    return _best(speeds)


def best_k_independent_list(alpha, c, verify_cost):
    alphas = _alphas(alpha, max(verify_cost))
    return _best({k: (1 + sum(alphas[:k])) / (k * c + verify_cost[k + 1]) for k in range(1, max(verify_cost))})
'''

BEST_K_ROUTES = ["best_k_lib_formula_copied", "best_k_mean_alpha", "best_k_own_alpha_in_product",
                 "best_k_independent_list"]


@pytest.fixture(scope="module")
def wrong_best_k(tmp_path_factory):
    return _isolated(tmp_path_factory, "best_k", WRONG_BEST_K)


@pytest.mark.parametrize("name", BEST_K_ROUTES)
def test_best_k_rejects(wrong_best_k, name):
    with pytest.raises(AssertionError, match="the best is"):
        checks.check_best_k(getattr(wrong_best_k, name))


def test_best_k_draws_lists_that_tell_the_routes_apart():
    """The per-position cases are drawn per run and each of the natural mistakes above misses one by far more than
    the tolerance (in-process: the check's own arithmetic on its own cases)."""
    cases = [c for c in week18_predict.best_k_cases(8) if isinstance(c[0], list)]
    assert len(cases) == 24
    constant = [c for c in week18_predict.best_k_cases(8) if not isinstance(c[0], list)]
    assert {round(a, 6) for a, _, _ in constant} >= {0.0, 1.0}
    for alpha, c, curve in cases:
        assert len(alpha) >= max(curve) - 1 and all(0 <= a <= 1 for a in alpha)


# --- exercise 7: expected_target_calls ---------------------------------------------------------------------------

WRONG_CALLS = '''
import random as _random


def _steady(alpha, k):
    return k + 1.0 if alpha == 1.0 else (1 - alpha ** (k + 1)) / (1 - alpha)


def calls_steady_state(alpha, k, max_new_tokens):
    return max_new_tokens / _steady(alpha, k)  # ignores the end, where rounds guess fewer


def calls_independent(alpha, k, max_new_tokens):
    return max_new_tokens / (1 + alpha * k)


def calls_no_bonus(alpha, k, max_new_tokens):
    calls = [0.0] * (max_new_tokens + 1)
    for r in range(1, max_new_tokens + 1):
        m = min(k, r - 1)
        e = 1.0 + alpha ** m * calls[r - max(m, 1)]  # all m kept: m tokens, the bonus forgotten
        for j in range(1, m + 1):
            e += alpha ** (j - 1) * (1 - alpha) * calls[r - j]
        calls[r] = e
    return calls[max_new_tokens]


def calls_simulated(alpha, k, max_new_tokens):
    rng, total, runs = _random.Random(0), 0, 4000
    for _ in range(runs):
        written = 0
        while written < max_new_tokens:
            m, kept = min(k, max_new_tokens - written - 1), 0
            while kept < m and rng.random() < alpha:
                kept += 1
            written += kept + 1
            total += 1
    return total / runs


def calls_tokens_per_call(alpha, k, max_new_tokens):
    return max_new_tokens / expected_target_calls(alpha, k, max_new_tokens)  # the tokens per call, not the calls


def calls_lib(alpha, k, max_new_tokens):
    from lib.spec_decode.speculative import expected_tokens_per_call
    return max_new_tokens / expected_tokens_per_call(alpha, k)
'''

CALLS_ROUTES = {"calls_steady_state": "long run", "calls_independent": "independently", "calls_no_bonus": "bonus",
                "calls_simulated": "expected", "calls_tokens_per_call": "expected", "calls_lib": "lib"}


@pytest.fixture(scope="module")
def wrong_calls(tmp_path_factory):
    return _isolated(tmp_path_factory, "expected_target_calls", WRONG_CALLS)


def test_expected_target_calls_accepts_the_solution_isolated(wrong_calls):
    checks.check_expected_target_calls(wrong_calls.expected_target_calls)


@pytest.mark.parametrize("name", sorted(CALLS_ROUTES))
def test_expected_target_calls_rejects(wrong_calls, name):
    with pytest.raises(AssertionError, match=CALLS_ROUTES[name]):
        checks.check_expected_target_calls(getattr(wrong_calls, name))


def test_the_calls_model_by_hand():
    """The check's model on cases worked by hand: α = 0 (a call a token), α = 1 (K + 1 a call, the last round
    shorter), and one round of two tokens: 1 call if the single guess is kept (α), else 1 + 1."""
    assert week18_predict.expected_calls(0.0, 4, 10) == 10
    assert week18_predict.expected_calls(1.0, 4, 10) == 2  # 5 + 5
    assert week18_predict.expected_calls(1.0, 3, 9) == 3  # 4 + 4 + 1
    assert week18_predict.expected_calls(0.3, 5, 2) == pytest.approx(0.3 * 1 + 0.7 * 2)


# --- exercise 8: the ragged batch ------------------------------------------------------------------------------

WRONG_BATCH = '''
def _round_inputs(outs, start, max_new_tokens, k, draft, lengths, rows):
    guesses, feeds = {}, {}
    for row in rows:
        left = max_new_tokens[row] - (len(outs[row]) - start[row])
        m = min(k, left - 1)
        guesses[row] = list(draft(outs[row], m))[:m]
        feeds[row] = (outs[row] + guesses[row])[lengths[row]:]
    return guesses, feeds


def _keep(outs, row, guess, row_logits):
    best = row_logits[-(len(guess) + 1):].argmax(-1).tolist()
    n = 0
    while n < len(guess) and guess[n] == best[n]:
        n += 1
    outs[row] += guess[:n] + [best[n]]
    return n


def _left(outs, start, max_new_tokens, row):
    return max_new_tokens[row] - (len(outs[row]) - start[row])


def _setup(target, prompts, max_new_tokens, k):
    outs, start = [list(p) for p in prompts], [len(p) for p in prompts]
    cache = target.new_cache(len(prompts), max(len(p) + n for p, n in zip(prompts, max_new_tokens)) + k + 8)
    return outs, start, cache


def batch_one_row_a_forward(target, draft, prompts, max_new_tokens, k=4):
    outs, start, cache = _setup(target, prompts, max_new_tokens, k)
    while any(_left(outs, start, max_new_tokens, r) > 0 for r in range(len(outs))):
        rows = [r for r in range(len(outs)) if _left(outs, start, max_new_tokens, r) > 0]
        guesses, feeds = _round_inputs(outs, start, max_new_tokens, k, draft, cache.lengths, rows)
        for row in rows:  # a forward per row: nothing batched
            logits = target({row: feeds[row]}, cache=cache)
            _keep(outs, row, guesses[row], logits[row])
            cache.truncate(row, len(outs[row]) - 1)
    return outs


def batch_held_to_slowest(target, draft, prompts, max_new_tokens, k=4):
    # every row keeps only as many guesses as the row that kept fewest: one length for the batch
    outs, start, cache = _setup(target, prompts, max_new_tokens, k)
    while True:
        rows = [r for r in range(len(outs)) if _left(outs, start, max_new_tokens, r) > 0]
        if not rows:
            return outs
        guesses, feeds = _round_inputs(outs, start, max_new_tokens, k, draft, cache.lengths, rows)
        logits = target(feeds, cache=cache)
        kept = {}
        for row in rows:
            best = logits[row][-(len(guesses[row]) + 1):].argmax(-1).tolist()
            n = 0
            while n < len(guesses[row]) and guesses[row][n] == best[n]:
                n += 1
            kept[row] = (n, best)
        fewest = min(n for n, _ in kept.values())
        for row, (n, best) in kept.items():
            outs[row] += guesses[row][:fewest] + [best[fewest]]
            cache.truncate(row, len(outs[row]) - 1)


def batch_feeds_finished_rows(target, draft, prompts, max_new_tokens, k=4):
    # a rectangle: finished rows stay in the batch, fed their last token again, until every row is done
    outs, start, cache = _setup(target, prompts, max_new_tokens, k)
    while any(_left(outs, start, max_new_tokens, r) > 0 for r in range(len(outs))):
        live = [r for r in range(len(outs)) if _left(outs, start, max_new_tokens, r) > 0]
        guesses, feeds = _round_inputs(outs, start, max_new_tokens, k, draft, cache.lengths, live)
        for r in range(len(outs)):
            if r not in live:
                feeds[r] = outs[r][-1:]
        logits = target(feeds, cache=cache)
        for r in range(len(outs)):
            if r in live:
                _keep(outs, r, guesses[r], logits[r])
            cache.truncate(r, len(outs[r]) - 1)
    return outs


def batch_no_rollback(target, draft, prompts, max_new_tokens, k=4):
    outs, start, cache = _setup(target, prompts, max_new_tokens, k)
    seen = [0] * len(outs)  # what each cache was fed, rejected guesses included
    while True:
        rows = [r for r in range(len(outs)) if _left(outs, start, max_new_tokens, r) > 0]
        if not rows:
            return outs
        guesses, feeds = {}, {}
        for row in rows:
            m = min(k, _left(outs, start, max_new_tokens, row) - 1)
            guesses[row] = list(draft(outs[row], m))[:m]
            feeds[row] = (outs[row] + guesses[row])[min(seen[row], len(outs[row]) - 1):]
        logits = target(feeds, cache=cache)
        for row in rows:
            seen[row] += len(feeds[row])
            _keep(outs, row, guesses[row], logits[row])


def batch_one_rollback_for_all(target, draft, prompts, max_new_tokens, k=4):
    # a cache with one length: every row rolled back to the shortest row's output
    outs, start, cache = _setup(target, prompts, max_new_tokens, k)
    while True:
        rows = [r for r in range(len(outs)) if _left(outs, start, max_new_tokens, r) > 0]
        if not rows:
            return outs
        guesses, feeds = _round_inputs(outs, start, max_new_tokens, k, draft, cache.lengths, rows)
        logits = target(feeds, cache=cache)
        for row in rows:
            _keep(outs, row, guesses[row], logits[row])
        shortest = min(len(outs[r]) for r in rows) - 1
        for row in rows:
            cache.truncate(row, min(shortest, cache.lengths[row]))


def batch_rows_one_after_another(target, draft, prompts, max_new_tokens, k=4):
    outs, start, cache = _setup(target, prompts, max_new_tokens, k)
    for row in range(len(outs)):  # each row to its end, then the next
        while _left(outs, start, max_new_tokens, row) > 0:
            guesses, feeds = _round_inputs(outs, start, max_new_tokens, k, draft, cache.lengths, [row])
            logits = target(feeds, cache=cache)
            _keep(outs, row, guesses[row], logits[row])
            cache.truncate(row, len(outs[row]) - 1)
    return outs


def batch_without_speculation(target, draft, prompts, max_new_tokens, k=4):
    # one token a row a round: right tokens, every row at the pace of plain decoding
    outs, start, cache = _setup(target, prompts, max_new_tokens, k)
    while True:
        rows = [r for r in range(len(outs)) if _left(outs, start, max_new_tokens, r) > 0]
        if not rows:
            return outs
        logits = target({r: outs[r][cache.lengths[r]:] for r in rows}, cache=cache)
        for row in rows:
            outs[row].append(int(logits[row][-1].argmax()))


def batch_lib_loop(target, draft, prompts, max_new_tokens, k=4):
    from lib.spec_decode.speculative import speculative_generate
    return [speculative_generate(target, draft, p, n, k=k) for p, n in zip(prompts, max_new_tokens)]
'''

BATCH_ROUTES = {
    "batch_one_row_a_forward": "left out of forward",
    "batch_held_to_slowest": "decoded alone with the same draft it needs",
    "batch_feeds_finished_rows": "after it had written",
    "batch_no_rollback": "roll each row back",
    "batch_one_rollback_for_all": "tokens; a round feeds a row",
    "batch_rows_one_after_another": "left out of forward",
    "batch_without_speculation": "decoded alone with the same draft it needs",
    "batch_lib_loop": "lib.spec_decode.speculative",
}


@pytest.fixture(scope="module")
def wrong_batch(tmp_path_factory):
    return _isolated(tmp_path_factory, "batched_speculative_generate", WRONG_BATCH)


def test_batched_accepts_the_solution_isolated(wrong_batch):
    checks.check_batched_speculative_generate(wrong_batch.batched_speculative_generate)


@pytest.mark.parametrize("name", sorted(BATCH_ROUTES))
def test_batched_rejects(wrong_batch, name):
    with pytest.raises(AssertionError, match=BATCH_ROUTES[name]) as err:
        checks.check_batched_speculative_generate(getattr(wrong_batch, name))
    print(name, "->", str(err.value)[:300])


def test_the_batch_is_ragged():
    """The check's rows take different numbers of rounds alone (perfect, hopeless and flawed drafts), so a batch held
    to one pace, or one that feeds finished rows, cannot pass by luck (in-process, the check's own cases)."""
    import torch

    from grader.checks.week18_models import MarkovLM

    chain = MarkovLM(24, 5)
    g = torch.Generator().manual_seed(0)
    what, target, draft, prompts, ns, k, expect = week18_batch._case(g, chain, week18_batch.RowWise(chain), 24, 4, 3,
                                                                     "x")
    rounds = [r for _, r in expect]
    assert rounds[1] == ns[1]  # the hopeless draft: a token a round
    assert rounds[0] == -(-ns[0] // (k + 1))  # the perfect one: K + 1 a round
    assert len(set(rounds)) > 1
