"""Week 18's checks of exercises 4-6 (expected_rejections, lookup_draft, best_k) accept an honest solution and
reject each wrong route, graded through the isolated path as in tests/test_week18_checks.py (which holds exercises
1-3); the shared loader is tests/_week18_support.py."""
import importlib.util
from pathlib import Path

import pytest

from grader.checks import week18 as checks

_spec = importlib.util.spec_from_file_location("_week18_support", Path(__file__).with_name("_week18_support.py"))
_support = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_support)
_isolated = _support.isolated


# --- 4, 5, 6: expected_rejections, lookup_draft, best_k ---------------------------------------------------------

WRONG_THEORY = '''
import numpy as _np
import torch as _t


def rejections_acceptances(p, q):
    return _t.minimum(p, q).sum()  # the acceptance rate, transcribed, not the rejections


def rejections_mean(p, q):
    return (1 - _t.minimum(p, q).sum(-1)).mean()  # per position, not summed


def rejections_over_p(p, q):
    return (p * (1 - _t.clamp(p / q, max=1))).sum()  # averaged over p instead of the draft's q


def rejections_in_place(p, q):
    if p.shape != q.shape:
        raise ValueError("shapes")
    return (1 - _t.minimum(p, q, out=p).sum(-1)).sum()  # writes into the caller's p


def rejections_numpy(p, q):
    if p.shape != q.shape:
        raise ValueError("shapes")
    a = _np.minimum(p.detach().cpu().numpy(), q.detach().cpu().numpy())  # a round trip through the CPU
    return _t.tensor((1 - a.sum(-1)).sum(), dtype=p.dtype)


def rejections_cpu_weights(p, q):
    if p.shape != q.shape:
        raise ValueError("shapes")
    weights = _t.ones(p.shape[0], dtype=p.dtype)  # on the CPU whatever p's device
    return (weights * (1 - _t.minimum(p, q).sum(-1))).sum()


def rejections_no_shape_check(p, q):
    return (1 - _t.minimum(p, q[..., :p.shape[-1]]).sum(-1)).sum()


def rejections_lib(p, q):
    from lib.spec_decode.speculative import acceptance_rate
    if p.shape != q.shape:
        raise ValueError("shapes")
    return (1 - acceptance_rate(p, q)).sum()


def lookup_earliest(tokens, k, max_ngram=3, min_ngram=1):
    if k < 0 or not 1 <= min_ngram <= max_ngram:
        raise ValueError("bad")
    for n in range(min(max_ngram, len(tokens) - 1), min_ngram - 1, -1):
        for start in range(len(tokens) - n):  # the earliest occurrence, not the latest
            if start + n < len(tokens) and tokens[start:start + n] == tokens[len(tokens) - n:] and start + n <= len(tokens) - 1:
                if start + n < len(tokens) - 0 and start != len(tokens) - n:
                    return tokens[start + n:start + n + k]
    return []


def lookup_shortest_first(tokens, k, max_ngram=3, min_ngram=1):
    if k < 0 or not 1 <= min_ngram <= max_ngram:
        raise ValueError("bad")
    for n in range(min_ngram, min(max_ngram, len(tokens) - 1) + 1):  # shortest n-gram first
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start:start + n] == tokens[len(tokens) - n:]:
                return tokens[start + n:start + n + k]
    return []


def lookup_one_token(tokens, k, max_ngram=3, min_ngram=1):
    out = lookup_draft(tokens, k, max_ngram, min_ngram)
    return out[:1]  # ignores k


def lookup_ignores_min(tokens, k, max_ngram=3, min_ngram=1):
    return lookup_draft(tokens, k, max_ngram, 1)


def lookup_no_errors(tokens, k, max_ngram=3, min_ngram=1):
    return lookup_draft(tokens, max(k, 0), max(max_ngram, 1), max(1, min(min_ngram, max_ngram)))


def lookup_last_64(tokens, k, max_ngram=3, min_ngram=1):  # searches only the last 64 tokens of the text
    return lookup_draft(tokens[max(0, len(tokens) - 64):], k, max_ngram, min_ngram)


def lookup_k_at_most_8(tokens, k, max_ngram=3, min_ngram=1):  # never drafts more than 8 tokens, whatever k
    return lookup_draft(tokens, min(k, 8), max_ngram, min_ngram)


def lookup_ngram_at_most_5(tokens, k, max_ngram=3, min_ngram=1):  # n-grams of at most 5 tokens, whatever max_ngram
    return lookup_draft(tokens, k, min(max_ngram, 5), min(min_ngram, 5))


def best_k_independent(alpha, c, verify_cost):
    ks = range(1, max(verify_cost))
    speed = {k: (1 + alpha * k) / (k * c + verify_cost[k + 1]) for k in ks}  # every token tested, independently
    k = max(speed, key=speed.get)
    return k, speed[k]


def best_k_at_most_15(alpha, c, verify_cost):  # searches K = 1..15 whatever the curve's length
    ks = range(1, min(max(verify_cost), 16))
    speed = {k: sum(alpha ** i for i in range(k + 1)) / (k * c + verify_cost[k + 1]) for k in ks}
    k = max(speed, key=speed.get)
    return k, speed[k]


def best_k_no_bonus(alpha, c, verify_cost):
    ks = range(1, max(verify_cost))
    speed = {k: sum(alpha ** i for i in range(k)) / (k * c + verify_cost[k + 1]) for k in ks}
    k = max(speed, key=speed.get)
    return k, speed[k]


def best_k_closed_form(alpha, c, verify_cost):
    ks = range(1, max(verify_cost))
    speed = {k: (1 - alpha ** (k + 1)) / (1 - alpha) / (k * c + verify_cost[k + 1]) for k in ks}  # alpha = 1: 0/0
    k = max(speed, key=speed.get)
    return k, speed[k]


def best_k_verifies_k(alpha, c, verify_cost):
    ks = range(1, max(verify_cost))
    speed = {k: sum(alpha ** i for i in range(k + 1)) / (k * c + verify_cost[k]) for k in ks}
    k = max(speed, key=speed.get)
    return k, speed[k]


def best_k_free_draft(alpha, c, verify_cost):
    ks = range(1, max(verify_cost))
    speed = {k: sum(alpha ** i for i in range(k + 1)) / verify_cost[k + 1] for k in ks}
    k = max(speed, key=speed.get)
    return k, speed[k]


def best_k_lib(alpha, c, verify_cost):
    from lib.spec_decode.speculative import predicted_speedup
    ks = range(1, max(verify_cost))
    speed = {k: predicted_speedup(alpha, k, c, verify_cost) for k in ks}
    k = max(speed, key=speed.get)
    return k, speed[k]
'''

THEORY_ROUTES = {
    ("expected_rejections", "rejections_acceptances"): "expected",
    ("expected_rejections", "rejections_mean"): "expected",
    ("expected_rejections", "rejections_over_p"): "expected",
    ("expected_rejections", "rejections_in_place"): "wrote into its arguments|changed argument 1 .* in place",
    ("expected_rejections", "rejections_numpy"): "another device",
    ("expected_rejections", "rejections_cpu_weights"): "another device",
    ("expected_rejections", "rejections_no_shape_check"): "ValueError",
    ("expected_rejections", "rejections_lib"): "lib",
    ("lookup_draft", "lookup_earliest"): "expected",
    ("lookup_draft", "lookup_shortest_first"): "expected",
    ("lookup_draft", "lookup_one_token"): "expected",
    ("lookup_draft", "lookup_ignores_min"): "expected",
    ("lookup_draft", "lookup_no_errors"): "ValueError",
    ("lookup_draft", "lookup_last_64"): "search the whole text",
    ("lookup_draft", "lookup_k_at_most_8"): "search the whole text",
    ("lookup_draft", "lookup_ngram_at_most_5"): "search the whole text",
    ("best_k", "best_k_independent"): "the best is",
    ("best_k", "best_k_no_bonus"): "the best is",
    ("best_k", "best_k_at_most_15"): r"the best is K = (39|[4-9]\d|1\d\d) ",  # a flat curve of 40-199 steps
    ("best_k", "best_k_closed_form"): "ZeroDivisionError",
    ("best_k", "best_k_verifies_k"): "the best is",
    ("best_k", "best_k_free_draft"): "the best is",
    ("best_k", "best_k_lib"): "lib",
}


@pytest.fixture(scope="module")
def wrong_theory(tmp_path_factory):
    return _isolated(tmp_path_factory, {"best_k": WRONG_THEORY})


@pytest.mark.parametrize("exercise", ["expected_rejections", "lookup_draft", "best_k"])
def test_theory_accepts_the_solution_isolated(wrong_theory, exercise):
    getattr(checks, f"check_{exercise}")(getattr(wrong_theory, exercise))


@pytest.mark.parametrize("exercise,name", sorted(THEORY_ROUTES))
def test_theory_rejects(wrong_theory, exercise, name):
    with pytest.raises(AssertionError, match=THEORY_ROUTES[exercise, name]) as err:
        getattr(checks, f"check_{exercise}")(getattr(wrong_theory, name))
    print(name, "->", str(err.value)[:300])
