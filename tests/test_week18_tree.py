"""Week 18, exercise 9 (`tree_accept`, issue 60): the check's law, its false-failure bound, and each natural mistake
rejected.

The check (grader/checks/week18_tree.py) draws one node's children from q without replacement and tests the counts of
(accepted child, emitted token) against the rule's exact law. For each mistake below, the law of what it returns is
computed here exactly (by enumerating the ordered draws, as the check does for the rule), and from it an upper bound
on the probability that the check passes: the least, over the check's binomial tests, probability that one test
passes. It is <= 1e-6 for every mistake on every case family drawn from a range of seeds. Then each mistake, written
as a notebook would write it, is run through the isolated path (the solution notebook with the route appended to the
exercise's cell, loaded as `pytest weeks/18` loads it) and must be rejected.
"""
import json
import math
from pathlib import Path

import pytest
import torch

from grader.checks import week18 as checks
from grader.checks import week18_tree as tree
from grader.harness import load_exercises, with_cell_source

SOLUTION = Path(__file__).resolve().parent.parent / "solutions" / "18" / checks.WEEK.notebook


# --- the exact law of each mistake --------------------------------------------------------------------------------

def _flawed_node(p, q, seq, flaw):
    """P(child j accepted) for each j and the law of the token emitted when none is, for children `seq`, under `flaw`:
    "no_residual" (p kept after a rejection), "q_kept" (q kept: the rule for children drawn with replacement),
    "q_unnormalized" (the rejected token zeroed in q, q not renormalized), "one_uniform" (one uniform for every
    child), "inverted" (min(1, q/p)), "first_only" (the first child tried, the others ignored), "fallback_from_p" (p
    and q updated for the children, but the token sampled from the original p when all are rejected), "top_k" (the
    token sampled from the top 8 of the updated p when all are rejected: red team 10's gap, exact where V = 6),
    "stale_from_fourth" (p and q updated after the first three children only: red team 14's #3)."""
    p0, accept, reach, highest = p, [], 1.0, 0.0  # p, q: float64 tensors [V] (the wide case has 49,152 tokens)
    tried = seq[:1] if flaw == "first_only" else seq
    for i, x in enumerate(tried):
        num, den = (float(q[x]), float(p[x])) if flaw == "inverted" else (float(p[x]), float(q[x]))
        a = 1.0 if num >= den else num / den
        if flaw == "one_uniform":  # u >= every earlier ratio and u < this one
            accept.append(max(0.0, a - highest))
            highest = max(highest, a)
        else:
            accept.append(reach * a)
            reach *= 1.0 - a
        if flaw == "stale_from_fourth" and i >= 3:
            continue
        if flaw != "no_residual":
            res = (p - q).clamp(min=0.0)
            p = res / res.sum() if float(res.sum()) > 0 else p
        qx = float(q[x])
        if flaw == "q_unnormalized":
            q = q.clone()
            q[x] = 0.0
        elif flaw != "q_kept" and qx < 1:
            q = q / (1 - qx)
            q[x] = 0.0
    if flaw == "one_uniform":
        reach = 1.0 - highest
    if flaw == "fallback_from_p":
        p = p0
    if flaw == "top_k":  # the fallback drawn from the top 8 tokens of what p has become (exact where V <= 8)
        top = p.topk(min(8, p.numel())).indices
        kept = torch.zeros_like(p)
        kept[top] = p[top] / p[top].sum()
        p = kept
    return accept + [0.0] * (len(seq) - len(accept)), reach * p


def flawed_law(case: tree.TreeCase, flaw: str) -> torch.Tensor:
    law = torch.zeros(case.n + 1, case.p.shape[0], dtype=torch.float64)
    if flaw == "sample_p":
        law[case.n] = case.p
        return law
    p, q = case.p.double(), case.q.double()
    for seq, prob in tree.ordered_draws(case.q, case.n):
        accept, none = _flawed_node(p, q, seq, flaw)
        for j, (x, a) in enumerate(zip(seq, accept)):
            law[j, x] += prob * a
        law[case.n] += prob * none
    return law


def _log_passes(m: int, a: float, b: float, level: float) -> float:
    """log P[the binomial test of probability `a` at `level` passes] when the count is Binomial(m, b)."""
    x = torch.arange(m + 1, dtype=torch.float64)
    f = x / m  # the check's own rule (tree_failures): a count passes when m·KL(x/m || a) <= level
    passes = m * (torch.xlogy(f, f / a) + torch.xlogy(1 - f, (1 - f) / (1 - a))) <= level
    if b <= 0.0 or b >= 1.0:
        return 0.0 if bool(passes[0 if b <= 0.0 else m]) else -math.inf
    logpmf = (math.lgamma(m + 1) - torch.lgamma(x + 1) - torch.lgamma(m - x + 1) + x * math.log(b)
              + (m - x) * math.log1p(-b))
    inside = float(logpmf[passes].exp().sum())
    return math.log(inside) if inside > 0 else -math.inf


def log_pass_bound(case: tree.TreeCase, law: torch.Tensor, level: float) -> float:
    """log of an upper bound on P[`case` passes] when the outputs follow `law`: every test must pass, so the least
    probability of one test passing bounds it; a cell the rule gives probability 0 must never appear."""
    m, rule = case.trials, case.law()
    bound = 0.0
    impossible = float(law[rule <= 1e-15].sum())
    if impossible > 0:
        bound = m * math.log1p(-min(impossible, 1 - 1e-16))
    for family, key, a in tree.tree_tests(case):
        b = float(law[:, key[0]].sum() if family == "token" else law[key[0]].sum() if family == "index" else law[key].sum())
        bound = min(bound, _log_passes(m, a, b, level))
    return bound


FLAWS = ("no_residual", "q_kept", "q_unnormalized", "one_uniform", "inverted", "first_only", "fallback_from_p",
         "sample_p", "top_k", "stale_from_fourth")
SEEDS = range(12)


def test_the_rules_law_is_exact_and_the_false_failure_bound_holds():
    """The rule's law emits p exactly (summed over the children and "none"), for every case of many runs; the
    per-test level is the union bound's: a correct implementation fails the check with probability < 1e-6."""
    for seed in SEEDS:
        cases = tree.tree_cases(torch.Generator().manual_seed(seed))
        n_tests = sum(len(tree.tree_tests(c)) for c in cases)
        level = tree.tree_level(cases)
        assert math.isclose(2 * math.exp(-level) * n_tests, tree.FALSE_FAILURE)
        for case in cases:
            law = case.law()
            assert torch.allclose(law.sum(0), case.p, atol=1e-12), (seed, case.name)
            assert math.isclose(float(law.sum()), 1.0, abs_tol=1e-12)
            # the Chernoff band each test uses holds a correct count with probability >= 1 - 2 exp(-level)
            for _, _, a in tree.tree_tests(case)[:3]:
                assert _log_passes(case.trials, a, a, level) > math.log1p(-2 * math.exp(-level) * 1.0001)


@pytest.mark.parametrize("flaw", FLAWS)
def test_each_mistake_passes_with_probability_below_one_in_a_million(flaw):
    for seed in SEEDS:
        cases = tree.tree_cases(torch.Generator().manual_seed(seed))
        level = tree.tree_level(cases)
        bound = sum(log_pass_bound(c, flawed_law(c, flaw), level) for c in cases)  # the cases are independent
        assert bound < math.log(tree.FALSE_FAILURE), (flaw, seed, bound / math.log(10))


# --- the mistakes, as a notebook writes them, through the isolated path ----------------------------------------

WRONG = '''
import torch as _t


def _draw(p, generator):
    return int(_t.multinomial(p, 1, generator=generator))


def _rule(p, q, children, generator, flaw=""):
    p, q = p.double(), q.double()
    p0 = p
    u0 = _t.rand((), generator=generator).item()
    for j in range(children.shape[0]):
        x = int(children[j])
        u = u0 if flaw == "one_uniform" else _t.rand((), generator=generator).item()
        if flaw == "no_min":
            if _t.bernoulli(p[x] / q[x], generator=generator).item():
                return j, x
        elif flaw == "inverted":
            if u * float(p[x]) < float(q[x]):
                return j, x
        elif u * float(q[x]) < float(p[x]):
            return j, x
        if flaw == "first_only":
            break
        if flaw != "no_residual":
            residual = (p - q).clamp(min=0)
            p = residual / residual.sum()
        if flaw != "q_kept":
            q = q.clone()
            q[x] = 0
            if flaw != "q_unnormalized":
                q = q / q.sum()
    if flaw == "first_only":
        residual = (p - q).clamp(min=0)
        p = residual / residual.sum()
    if flaw == "top_k":  # the fallback from the top 8 tokens, renormalized
        top = p.topk(min(8, p.shape[0]))
        p = _t.zeros_like(p).index_put_((top.indices,), top.values / top.values.sum())
    return None, _draw(p0 if flaw == "fallback_from_p" else p, generator)


def tree_accept_no_residual(target_probs, draft_probs, children, generator=None):
    return _rule(target_probs, draft_probs, children, generator, "no_residual")


def tree_accept_q_kept(target_probs, draft_probs, children, generator=None):
    return _rule(target_probs, draft_probs, children, generator, "q_kept")


def tree_accept_q_unnormalized(target_probs, draft_probs, children, generator=None):
    return _rule(target_probs, draft_probs, children, generator, "q_unnormalized")


def tree_accept_one_uniform(target_probs, draft_probs, children, generator=None):
    return _rule(target_probs, draft_probs, children, generator, "one_uniform")


def tree_accept_no_min(target_probs, draft_probs, children, generator=None):
    return _rule(target_probs, draft_probs, children, generator, "no_min")


def tree_accept_inverted(target_probs, draft_probs, children, generator=None):
    return _rule(target_probs, draft_probs, children, generator, "inverted")


def tree_accept_first_only(target_probs, draft_probs, children, generator=None):
    return _rule(target_probs, draft_probs, children, generator, "first_only")


def tree_accept_fallback_from_p(target_probs, draft_probs, children, generator=None):
    return _rule(target_probs, draft_probs, children, generator, "fallback_from_p")


def tree_accept_top_k(target_probs, draft_probs, children, generator=None):
    return _rule(target_probs, draft_probs, children, generator, "top_k")


def tree_accept_sample_p(target_probs, draft_probs, children, generator=None):
    return None, _draw(target_probs.double(), generator)


def tree_accept_lib(target_probs, draft_probs, children, generator=None):
    from lib.spec_decode.tree_speculative import tree_accept as _ref
    return _ref(target_probs, draft_probs, children, generator)


def tree_accept_lib_verify(target_probs, draft_probs, children, generator=None):
    from lib.spec_decode.speculative import verify as _verify  # one child at a time through section 3's verify: a lib reference
    return _verify(target_probs[None].expand(2, -1), draft_probs[None], children[:1], generator)
'''

# name -> what the check's message must say
ROUTES = {
    "tree_accept_no_residual": "does not follow the law",
    "tree_accept_q_kept": "does not follow the law",
    "tree_accept_q_unnormalized": "does not follow the law",
    "tree_accept_one_uniform": "does not follow the law",
    "tree_accept_no_min": "p_in >= 0 && p_in <= 1|does not follow the law",  # torch.bernoulli(p/q) refuses p > q
    "tree_accept_inverted": "does not follow the law",
    "tree_accept_first_only": "does not follow the law",
    "tree_accept_fallback_from_p": "does not follow the law",
    "tree_accept_sample_p": "does not follow the law",
    "tree_accept_top_k": "wide vocabulary.*does not follow the law",
    "tree_accept_lib": "your own|lib|Reference",
    "tree_accept_lib_verify": "your own|lib|Reference",
}


@pytest.fixture(scope="module")
def wrong(tmp_path_factory):
    nb = json.loads(SOLUTION.read_text())
    for cell in nb["cells"]:
        if cell["metadata"].get("nbgrader", {}).get("grade_id") == "tree_accept":
            old = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
            nb = with_cell_source(nb, "tree_accept", old + "\n\n" + WRONG)
    path = tmp_path_factory.mktemp("w18tree") / SOLUTION.name
    path.write_text(json.dumps(nb))
    return load_exercises(path, isolated=True)


def test_tree_accept_accepts_the_solution_isolated(wrong):
    checks.check_tree_accept(wrong.tree_accept)


@pytest.mark.parametrize("name", sorted(ROUTES))
def test_tree_accept_rejects(wrong, name):
    with pytest.raises(Exception, match=ROUTES[name]) as err:
        checks.check_tree_accept(getattr(wrong, name))
    print(name, "->", str(err.value)[:300])


def test_the_checks_second_line_rejects_lib_where_lib_is_readable():
    """Without the week's view (lib whole, as on a machine without Landlock), the observed call's lib calls still name
    lib's reference: the check's own assertion, not the stub, rejects it."""
    from lib.spec_decode.tree_speculative import tree_accept as reference

    with pytest.raises(AssertionError, match="must be your own; it called .*lib.spec_decode.tree_speculative.tree_accept"):
        checks.check_tree_accept(reference)
