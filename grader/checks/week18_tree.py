"""Week 18, exercise 9: `tree_accept`, one node of a sampled draft tree — its children, drawn from the draft's q
without replacement, tried in drawn order against the target's p (multi-draft recursive rejection sampling).

    tree_accept(target_probs [V], draft_probs [V], children [n] int64, generator) -> (index or None, token)

What the check certifies (`judge`), on inputs drawn per run (`tree_cases`; the seed is printed on failure): the
check draws each call's children from q itself, without replacement (Gumbel top-n, in drawn order), calls the
student's function once per draw with its own generator, and tests the counts against the rule's exact law
(`tree_law`, computed by enumerating every ordered draw):

- (a) the emitted token's law is p, token by token: what makes a tree exact;
- (b) the law of which child is accepted (the first, the second, ..., none) is the rule's: a function that ignores
  the children and samples p keeps (a) and accepts nothing;
- the joint law of (accepted child, token): which token each child emits — the cells where a rule that forgets
  part of the update differs most.

Every test is a binomial test at `law_level` (Chernoff + union bound over every test of every case), so a correct
implementation fails the whole check with probability < FALSE_FAILURE = 1e-6; cells of probability 0 must never
appear. How each natural mistake fails is computed exactly in tests/test_week18_tree.py (its probability of
passing, <= 1e-6 over the cases' whole range), where each is also run through the isolated path.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import torch

from grader.checks import call_many_observing, check_on_meta, derived_seed, generator, seed_note
from grader.checks.week18_law import (FALSE_FAILURE, acceptance_band, kl_divergence, law_level,  # noqa: F401
                                      rank_groups, rank_span)

TREE_VOCAB = 6
WIDE_VOCAB = 49_152  # the "wide vocabulary" case: the fallback token spread over SmolLM2's whole vocabulary
WIDE_RANKS = 4  # ... tested in groups of tokens by rank, a quarter of the mass each
MAIN_TRIALS = 2_000  # see tests/test_week18_tree.py for what each case's size buys


@dataclass
class TreeCase:
    """One input of the law test: `trials` calls, each with n children the check draws from q."""
    name: str
    p: torch.Tensor  # [V] float64, the target's
    q: torch.Tensor  # [V] float64, the draft's
    n: int  # children per call
    trials: int
    why: str
    groups: int = 0  # > 0: the tokens p and the fallback spread over are tested in this many groups by rank
    _law: torch.Tensor | None = field(default=None, init=False, repr=False, compare=False)

    def law(self) -> torch.Tensor:
        """[n + 1, V]: P(child j accepted and token y emitted) for j < n; row n: none accepted, token y (computed once)."""
        if self._law is None:
            self._law = tree_law(self.p, self.q, self.n)
        return self._law


def ordered_draws(q: torch.Tensor, n: int):
    """Every ordered draw of n distinct tokens from q without replacement, with its probability."""
    q = [float(x) for x in q]
    support = [t for t, w in enumerate(q) if w > 0]
    for seq in itertools.permutations(support, n):
        prob, left = 1.0, 1.0
        for x in seq:
            prob *= q[x] / left
            left -= q[x]
        yield seq, prob


def node_law(p: torch.Tensor, q: torch.Tensor, seq) -> tuple[list[float], torch.Tensor]:
    """For children `seq` (fixed): P(child j accepted) for each j, and the law [V] of the token emitted when none is
    (p, q: float64 [V])."""
    accept, reach = [], 1.0
    for x in seq:
        px, qx = float(p[x]), float(q[x])
        a = 1.0 if px >= qx else px / qx
        accept.append(reach * a)
        reach *= 1.0 - a
        if reach == 0.0:
            accept += [0.0] * (len(seq) - len(accept))
            break
        res = (p - q).clamp(min=0.0)
        total = float(res.sum())
        p = res / total if total > 0 else p
        if qx < 1.0:
            q = q / (1.0 - qx)
            q[x] = 0.0
    return accept, reach * p


def tree_law(p: torch.Tensor, q: torch.Tensor, n: int) -> torch.Tensor:
    """The exact law [n + 1, V] of (accepted child, emitted token) of the rule, over the children's draws."""
    v = p.shape[0]
    law = torch.zeros(n + 1, v, dtype=torch.float64)
    p, q = p.double(), q.double()
    for seq, prob in ordered_draws(q, n):
        accept, none = node_law(p, q, seq)
        for j, (x, a) in enumerate(zip(seq, accept)):
            law[j, x] += prob * a
        law[n] += prob * none
    return law


def _row(g, v: int, fixed: dict[int, float]) -> torch.Tensor:
    """A distribution over v tokens: the `fixed` entries, the rest of the mass spread at random (each > 0)."""
    free = [t for t in range(v) if t not in fixed]
    w = 0.3 + torch.rand(len(free), generator=g, dtype=torch.float64)
    row = torch.zeros(v, dtype=torch.float64)
    row[free] = (1.0 - sum(fixed.values())) * w / w.sum()
    for t, val in fixed.items():
        row[t] = val
    return row


def tree_cases(g: torch.Generator) -> list[TreeCase]:
    """The inputs of the law test, drawn from `g` (so, per run); tokens placed at random among TREE_VOCAB
    (WIDE_VOCAB in the wide case)."""
    def u(lo, hi):
        return lo + (hi - lo) * float(torch.rand((), generator=g))

    v = TREE_VOCAB
    t = [int(x) for x in torch.randperm(v, generator=g)]
    cases = []
    # main: the draft's favourite h is the target's least, so the first child is usually h and usually rejected;
    # z is a token the draft never proposes, which only the residual can emit.
    h, z, o = t[0], t[1], t[2]
    q = _row(g, v, {h: u(0.45, 0.55), z: 0.0, o: u(0.05, 0.08)})
    p = _row(g, v, {h: u(0.04, 0.08), z: u(0.15, 0.22), o: u(0.22, 0.3)})
    cases.append(TreeCase("main", p, q, 3, MAIN_TRIALS,
                          "three children; the draft's favourite is the target's least likely token, and one token "
                          "the target likes is one the draft never proposes"))
    # four children (red team 14's #3: a rule exact for up to three children, which stopped updating the residual
    # and q from the fourth on, passed cases of two and three): the draft's mass mostly on three tokens the target
    # rarely writes, so that the fourth child is one of two it rarely drafts and the target likes, reached in most
    # calls and judged against what three rejections left (a pass probability below 1e-100 for that rule here)
    b3, c3, d3, a3, e3, z3 = t
    q = torch.zeros(v, dtype=torch.float64)
    q[a3], q[e3] = u(0.01, 0.02), u(0.001, 0.004)
    rest = torch.tensor([u(0.33, 0.4), u(0.35, 0.42), u(0.2, 0.26)], dtype=torch.float64)
    q[[b3, c3, d3]] = (1.0 - q[a3] - q[e3]) * rest / rest.sum()
    p = _row(g, v, {b3: u(0.12, 0.16), c3: u(0.015, 0.03), d3: u(0.02, 0.04), a3: u(0.3, 0.38), e3: u(0.12, 0.16)})
    cases.append(TreeCase("four children", p, q, 4, 3_000,
                          "four children; the draft's three favourites are tokens the target rarely writes, so that "
                          "the fourth child, one the draft rarely proposes, is reached in most calls"))
    # p over-covers: p(x) > q(x) on two tokens (sure acceptance when drawn), p small on the draft's favourite
    a, b, c = t[3], t[4], t[5]
    q = _row(g, v, {a: u(0.12, 0.16), b: u(0.12, 0.16), c: u(0.4, 0.5)})
    p = _row(g, v, {a: u(0.3, 0.35), b: u(0.25, 0.3), c: u(0.05, 0.1)})
    cases.append(TreeCase("p above q", p, q, 2, 1_500,
                          "two children; p(x) > q(x) on two tokens (a child drawn there is always accepted)"))
    # two uncertain children in a row: the first child is usually a, accepted about 2/3 of the time; after its
    # rejection the second is usually b, which the residual accepts about half the time (a rule that reuses the first
    # child's uniform never accepts it: its ratio is below a's)
    a, b, c = t[1], t[3], t[5]
    qa = u(0.55, 0.62)
    pa = qa * u(0.6, 0.7)
    q = torch.zeros(v, dtype=torch.float64)
    q[a], q[b] = qa, (1 - qa) * u(0.58, 0.66)
    q[c] = 1 - q[a] - q[b]
    owed = torch.zeros(v, dtype=torch.float64)  # the residual after a is rejected
    owed[b] = u(0.45, 0.55) * q[b] / (1 - qa)
    owed[c] = 1 - owed[b]
    p = q + (qa - pa) * owed
    p[a] = pa
    cases.append(TreeCase("two uncertain children", p, q, 2, 3_000,
                          "two children; the first is usually accepted two times in three, and after its rejection "
                          "the second about half the time"))
    # children drawn without replacement, told apart from children drawn with it: the draft's favourite h (about half
    # of q) is the target's least, so the first child is usually h, rejected; after that the residual owes the two
    # "low" tokens l about 0.4 of what q without h gives them (half of what q itself does) and the "high" ones more
    h, l1, l2, h1, h2 = t[2], t[0], t[4], t[1], t[5]
    qh = u(0.5, 0.58)
    share = u(0.27, 0.33)  # of q without h, on each low token
    r = u(0.3, 0.4)  # the residual's ratio to q without h on the low tokens
    q = torch.zeros(v, dtype=torch.float64)
    q[h], q[[l1, l2]], q[[h1, h2]] = qh, share * (1 - qh), (0.5 - share) * (1 - qh)
    owed = torch.zeros(v, dtype=torch.float64)  # the residual after h is rejected
    owed[[l1, l2]] = r * share
    owed[[h1, h2]] = (1 - 2 * r * share) / 2
    ph = u(0.02, 0.05)
    p = q + (qh - ph) * owed
    p[h] = ph
    cases.append(TreeCase("without replacement", p, q, 2, 3_500,
                          "two children; the first is usually the draft's favourite, rejected, and the second must "
                          "then be judged against q without it"))
    # a wide vocabulary, the model's: q's mass on five tokens, p spread over all of it and low on those five (a child
    # is accepted about one time in six), so the fallback spreads over ~49,000 tokens: a fallback drawn from the top
    # k (top-k), exact where V = 6, never emits the rest (red team 14's #2 with k = 64, when this case had 64 tokens);
    # tested in WIDE_RANKS groups by rank
    few = torch.randperm(WIDE_VOCAB, generator=g)[:5]
    q = torch.zeros(WIDE_VOCAB, dtype=torch.float64)
    q[few] = _row(g, 5, {})
    p = _row(g, WIDE_VOCAB, {int(x): u(0.1, 0.25) * float(q[x]) for x in few})
    cases.append(TreeCase("wide vocabulary", p, q, 2, 2_000,
                          f"two children; V = {WIDE_VOCAB:,}, the draft's mass on five tokens and the target's spread "
                          f"over all, so that the token emitted after the children's rejection can be any of them "
                          f"(tested in {WIDE_RANKS} groups by rank)", WIDE_RANKS))
    pq = _row(g, v, {t[0]: 0.0})
    cases.append(TreeCase("p = q", pq, pq.clone(), 2, 300,
                          "the draft is the target: the first child is always accepted"))
    pd = torch.zeros(v, dtype=torch.float64)
    qd = torch.zeros(v, dtype=torch.float64)
    pd[t[:2]] = torch.tensor([0.35, 0.65], dtype=torch.float64)
    qd[t[2:]] = _row(g, v - 2, {})
    cases.append(TreeCase("disjoint supports", pd, qd, 3, 300,
                          "p and q disjoint: every child is rejected and the token comes from the residual, p"))
    return cases


def tree_tests(case: TreeCase) -> list[tuple[str, tuple, float]]:
    """The binomial tests of one case as (family, key, probability): 'token' (y,), 'index' (j,), 'cell' (j, y); j = n
    is "none accepted". Events of probability 0 or 1 are checked exactly, not counted here."""
    law = case.law()
    if case.groups:  # a wide vocabulary: the tokens p and the fallback spread over, in groups by rank
        tests = [("token", (y,), float(case.p[y].sum())) for y in rank_groups(case.p, case.groups)]
        tests += [("index", (j,), float(law[j].sum())) for j in range(case.n + 1)]
        tests += [("cell", (j, y), float(law[j, y])) for j in range(case.n) for y in law[j].nonzero().flatten().tolist()]
        tests += [("cell", (case.n, y), float(law[case.n, y].sum())) for y in rank_groups(law[case.n], case.groups)]
        return [t for t in tests if 0 < t[2] < 1]
    tests = [("token", (y,), float(case.p[y])) for y in range(law.shape[1]) if 0 < float(case.p[y]) < 1]
    tests += [("index", (j,), float(law[j].sum())) for j in range(case.n + 1) if 0 < float(law[j].sum()) < 1]
    tests += [("cell", (j, y), float(law[j, y])) for j in range(case.n + 1) for y in range(law.shape[1])
              if 0 < float(law[j, y]) < 1]
    return tests


def tree_level(cases: list[TreeCase]) -> float:
    return law_level(sum(len(tree_tests(c)) for c in cases))


def draw_children(q: torch.Tensor, n: int, g: torch.Generator) -> torch.Tensor:
    """n tokens from q without replacement, in drawn order (Gumbel top-n: the same law as n draws one at a time)."""
    gumbel = -torch.log(-torch.log(torch.rand(q.shape, generator=g, dtype=torch.float64).clamp_min(1e-300)))
    return (q.log() + gumbel).topk(n).indices


def tree_calls(case: TreeCase, seed: int) -> list:
    """The case's calls: call t with children drawn from q by generator seed + t, and its own generator seed + t."""
    calls = []
    for t in range(case.trials):
        g = torch.Generator().manual_seed(seed + t)
        calls.append(((case.p, case.q, draw_children(case.q, case.n, g)),
                      {"generator": torch.Generator().manual_seed(seed + 5_000_000 + t)}))
    return calls


def _result(out, children: torch.Tensor, v: int, what: str) -> tuple[int, int]:
    """(row of the law, token): row n for "none accepted"."""
    n = children.shape[0]
    ok = (isinstance(out, tuple) and len(out) == 2 and (out[0] is None or type(out[0]) is int)
          and type(out[1]) is int)
    assert ok, (f"tree_accept must return a tuple (index of the accepted child or None, token), both ints; got "
                f"{out!r} ({what})")
    j, y = out
    assert 0 <= y < v, f"tree_accept returned token {y} over a vocabulary of {v} ({what})"
    if j is None:
        return n, y
    assert 0 <= j < n, f"tree_accept returned child index {j} for {n} children ({what})"
    assert y == int(children[j]), (f"tree_accept accepted child {j} (token {int(children[j])}) but returned token "
                                   f"{y}: an accepted child emits its own token ({what})")
    return j, y


def tree_failures(case: TreeCase, counts: torch.Tensor, level: float) -> list[str]:
    """What is wrong with `counts` [n + 1, V] for `case` (empty when nothing is)."""
    law, n = case.law(), case.n

    def name(j):
        return "no child accepted" if j == n else f"child {j} accepted"

    bad = [f"{int(counts[j, y])} runs: {name(j)}, token {y}, which the rule gives probability 0"
           + (" (the target gives it none)" if float(case.p[y]) == 0 else "")
           for j, y in ((counts > 0) & (law <= 1e-15)).nonzero().tolist()]
    m = int(counts.sum())
    for family, key, a in tree_tests(case):
        y = key[-1]
        token = (f"token {y}" if isinstance(y, int) else
                 f"a token of rank {rank_span(case.p if family == 'token' else law[key[0]], y)} ({y.numel():,} tokens)")
        if family == "token":
            x, label = int(counts[:, y].sum()), f"{token} emitted (the target's p gives {a:.4f})"
        elif family == "index":
            x, label = int(counts[key[0]].sum()), f"{name(key[0])} (the rule gives {a:.4f})"
        else:
            x, label = int(counts[key[0], y].sum()), f"{name(key[0])} with {token} (the rule gives {a:.4f})"
        if m * kl_divergence(x / m, a) > level:
            lo, hi = acceptance_band(m, a, level)
            bad.append(f"{label}: {x}/{m} = {x / m:.4f} (a correct rule stays in [{lo:.4f}, {hi:.4f}] here)")
    return bad


def describe(case: TreeCase) -> str:
    def show(row):
        if row.shape[0] <= TREE_VOCAB:
            return str([round(float(x), 3) for x in row])
        return str({i: round(float(x), 3) for i, x in enumerate(row) if x > 0.02}) + " (the others below 0.02)"
    return (f"case '{case.name}' ({case.why}; V={case.p.shape[0]}, {case.n} children per call, p = "
            f"{show(case.p)}, q = {show(case.q)}, {case.trials} runs)")


def judge(tree_accept) -> None:
    g = generator(91)
    cases = tree_cases(g)
    main = cases[0]
    check_on_meta(tree_accept, (main.p.float(), main.q.float(), draw_children(main.q, main.n, g)), "tree_accept")
    level = tree_level(cases)
    base = derived_seed("week18 tree_accept calls") % (2**60)
    for index, case in sorted(enumerate(cases), key=lambda ic: ic[1].trials):  # the cheap cases first
        calls = tree_calls(case, base + index * 10_000_000)
        watched = int(torch.randint(0, case.trials, (), generator=g))
        (p, q, kids), kw = calls[watched]
        calls[watched] = ((p.clone(), q.clone(), kids.clone()), kw)
        outs, observations = call_many_observing(tree_accept, calls, {watched})
        obs = observations[watched]
        assert not obs.inputs_written, (
            f"tree_accept wrote into its arguments ({describe(case)}): the caller's p and q are needed again for the "
            f"node's other uses. Compute what p and q become in new tensors")
        used = sorted(c for c in obs.lib_calls if c.startswith("lib."))
        assert not used, f"tree_accept must be your own; it called {used}"
        counts = torch.zeros(case.n + 1, case.p.shape[0], dtype=torch.int64)
        for out, (args, _) in zip(outs, calls):
            counts[_result(out, args[2], case.p.shape[0], case.name)] += 1
        bad = tree_failures(case, counts, level)
        if bad:
            accepted = 1 - float(case.law()[case.n].sum())
            raise AssertionError(
                f"{describe(case)}: tree_accept's output does not follow the law of the rule: {'; '.join(bad[:3])}. "
                f"The emitted token must have exactly p's law over the children's draws, and a child must be "
                f"accepted as often as the rule allows (here {accepted:.3f} of the calls): try the children in "
                f"drawn order, each with a fresh uniform from `generator`, and think about what p and q are after "
                f"a rejection — the next child was drawn without the rejected one. {seed_note()}")
    # without a generator: torch's global one, a fresh draw every call (red team 11b: a generator seeded 0 per call
    # passed every case above, all of which hand one over). p and q disjoint: the token comes from p = (0.35, 0.65)
    # every call, so 60 calls give one token only with probability < 1e-11. Half of them observed, each replayed
    # from the global generator's state it started with (red team 12: a generator of its own, seeded once, gives
    # the replay the token the call gave with probability 0.35² + 0.65², so 30 replays all agree < 1e-7).
    case = next(c for c in cases if c.name == "disjoint supports")
    calls = [((case.p, case.q, draw_children(case.q, case.n, g)), {"generator": None}) for _ in range(60)]
    outs, _ = call_many_observing(tree_accept, calls, set(torch.randperm(60, generator=g)[:30].tolist()))
    tokens = {_result(out, args[2], case.p.shape[0], "generator=None")[1] for out, (args, _) in zip(outs, calls)}
    assert len(tokens) > 1, (
        f"60 calls with generator=None on {describe(case)} all emitted token {tokens.pop()}: without a generator, "
        f"draw from torch's global random number generator (torch.rand(...) with no generator), not from a "
        f"generator seeded the same at every call {seed_note()}")
