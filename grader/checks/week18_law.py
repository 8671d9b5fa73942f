"""The laws week 18 judges its sampling by, and the binomial tests it judges them with (exercises 2 and 3).

- 2: the exact law of `verify`'s output on fixed inputs (`law_cases`, `verify_law`, `law_failures`);
- 3: speculative_sample's output against the target's law at every new position (`SAMPLE_CASES`: position tables
  at K = 4, 8, 1, 2 and 8 (a draft whose law depends on T), every position of a round, the residual and the bonus
  token, and a 64-token case tested by groups of the draft's ranks; `sample_failures`).

Separate from the checks because the statistics are a unit of their own: the closed-form laws, the per-cell
tests with their false-failure bound (Chernoff + union bound) and their power are used by the checks, by the
notebook's picture of the law test and by tests/test_week18_checks.py's and tests/test_week18_sampling.py's
power tests.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from grader.checks import call_many

# --- 2 ------------------------------------------------------------------------------------------------
# verify is checked against the exact law of its output. For fixed inputs p [K+1, V], q [K, V] and draft tokens
# x [K], with a_i = min(1, p_i(x_i) / q_i(x_i)) and r_i = normalize(max(p_i - q_i, 0)):
#     P(n_accepted = j, next = y) = a_0 ··· a_{j-1} · (1 - a_j) · r_j(y)    (j < K)
#     P(n_accepted = K, next = y) = a_0 ··· a_{K-1} · p_K(y)
# (Summed over the x_i drawn from q this is the one-position identity P(emit y) = p(y); the law conditional on
# the draft tokens is what a wrong rule changes, so that is what is tested, cell by cell.)

FALSE_FAILURE = 1e-6  # statistical checks: a correct implementation fails less often than this
LAW_VOCAB = 5
LAW_K = 3
LONG_K = 6  # the "long round" case: a verify must hold at every position, not only the first LAW_K
WIDE_VOCAB = 49_152  # the "wide vocabulary" case: residual and bonus rows spread over SmolLM2's whole vocabulary
WIDE_RANKS = 4  # ... its tokens tested in groups of a quarter of each row's mass, by rank
WIDE_TRIALS = 1_000
MAIN_RATIOS = (0.85, 0.90)  # case "main": every p_i(x_i)/q_i(x_i) drawn in this range, strictly inside (0, 1)
MAIN_TRIALS = 42_000  # the power case: see law_power() and tests/test_week18_checks.py
SMALL_TRIALS = 4_000  # each edge case
REPEATS = 300  # calls run twice with equal generator states


@dataclass
class LawCase:
    """One input of the law test: verify(p, q, x) is called `trials` times, each with its own generator."""
    name: str
    p: torch.Tensor  # [K+1, V] float64
    q: torch.Tensor  # [K, V]
    x: torch.Tensor  # [K] int64
    trials: int
    why: str  # what the case is for, shown when it fails
    groups: int = 0  # > 0: each next-token row tested as this many groups of tokens by rank, each of equal mass

    def law(self) -> torch.Tensor:
        """[K+1, V]: P(n_accepted = j, next_token = y), exactly."""
        return verify_law(self.p, self.q, self.x)


def verify_law(p: torch.Tensor, q: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The exact law [K+1, V] of (n_accepted, next_token) of speculative sampling's verify on these inputs."""
    k = x.shape[0]
    p, q = p.double(), q.double()
    law = torch.zeros(k + 1, p.shape[1], dtype=torch.float64)
    reach = 1.0
    for i in range(k):
        px, qx = float(p[i, x[i]]), float(q[i, x[i]])
        a = 1.0 if px >= qx else px / qx
        if a < 1.0:
            res = (p[i] - q[i]).clamp(min=0)
            law[i] = reach * (1.0 - a) * res / res.sum()
        reach *= a
    law[k] = reach * p[k]
    return law


def _row(g, v, fixed: dict[int, float]) -> torch.Tensor:
    """A distribution over v tokens with the given entries fixed and the rest of the mass spread at random
    over the other tokens (each > 0)."""
    free = [t for t in range(v) if t not in fixed]
    w = 0.2 + torch.rand(len(free), generator=g, dtype=torch.float64)
    row = torch.zeros(v, dtype=torch.float64)
    row[free] = (1.0 - sum(fixed.values())) * w / w.sum()
    for t, val in fixed.items():
        row[t] = val
    return row


def _positions(g, ratios):
    """p [K+1, V], q [K, V], x [K] with p_i(x_i) / q_i(x_i) = ratios[i], q_i zero at a token where p_i has mass,
    and p_K zero at one token."""
    v = LAW_VOCAB
    ps, qs, xs = [], [], []
    for r in ratios:
        x, z = (int(t) for t in torch.randperm(v, generator=g)[:2])
        qx = 0.25 + 0.2 * float(torch.rand((), generator=g)) if r <= 1 else 0.2 + 0.15 * float(torch.rand((), generator=g))
        qs.append(_row(g, v, {x: qx, z: 0.0}))
        ps.append(_row(g, v, {x: r * qx}))
        xs.append(x)
    ps.append(_row(g, v, {int(torch.randint(v, (), generator=g)): 0.0}))
    return torch.stack(ps), torch.stack(qs), torch.tensor(xs, dtype=torch.int64)


def law_cases(g: torch.Generator) -> list[LawCase]:
    """The inputs of the law test, drawn from `g` (so, per run)."""
    def u(lo, hi):
        return lo + (hi - lo) * float(torch.rand((), generator=g))

    v, k = LAW_VOCAB, LAW_K
    cases = []
    p, q, x = _positions(g, [u(*MAIN_RATIOS) for _ in range(k)])
    cases.append(LawCase("main", p, q, x, MAIN_TRIALS, "every acceptance ratio strictly between 0 and 1"))
    p, q, x = _positions(g, [u(1.5, 2.0), u(0.2, 0.5), u(0.5, 0.8)])
    cases.append(LawCase("ratio above 1 first", p, q, x, SMALL_TRIALS,
                         "p_0(x_0) > q_0(x_0): token 0 is always accepted, and does not raise the later ones' odds"))
    # rows shared by every position (broadcast views, stride 0): a verify that writes into its arguments fails
    pi = _row(g, v, {int(torch.randint(v, (), generator=g)): 0.0})
    tok = int(torch.multinomial(pi, 1, generator=g))
    cases.append(LawCase("p = q", pi.expand(k + 1, v), pi.expand(k, v), torch.tensor(tok).expand(k), SMALL_TRIALS,
                         "the draft is the target (α = 1): every token accepted, then the bonus from p_K"))
    perm = torch.randperm(v, generator=g)
    pd = torch.zeros(v, dtype=torch.float64)
    qd = torch.zeros(v, dtype=torch.float64)
    pd[perm[:2]] = torch.tensor([0.3, 0.7], dtype=torch.float64)
    qd[perm[2:]] = _row(g, v - 2, {})
    cases.append(LawCase("disjoint supports", pd.expand(k + 1, v), qd.expand(k, v), perm[2:3].expand(k),
                         SMALL_TRIALS, "p and q disjoint: the first token is always rejected, the next comes from p"))
    x = int(torch.randint(v, (), generator=g))
    z = (x + 1 + int(torch.randint(v - 1, (), generator=g))) % v
    qx = u(0.3, 0.5)
    qs, ps = _row(g, v, {x: qx, z: 0.0}), _row(g, v, {x: u(0.3, 0.7) * qx})
    cases.append(LawCase("one row for all positions", ps.expand(k + 1, v), qs.expand(k, v),
                         torch.tensor(x).expand(k), SMALL_TRIALS,
                         "the same p and q at every position, q zero where p has mass"))
    # A longer round: three sure acceptances, then three uncertain ones, so positions 3-5 and the bonus at 6 are
    # reached by most runs (a verify exact for the first LAW_K positions and wrong later fails here).
    p, q, x = _positions(g, [u(1.2, 1.6) for _ in range(3)] + [u(0.6, 0.9) for _ in range(LONG_K - 3)])
    cases.append(LawCase("long round", p, q, x, SMALL_TRIALS,
                         f"K = {LONG_K}: the first three always accepted, the last three each with its own ratio"))
    # A wide vocabulary, the model's: q's mass on the draft token and four others, p's spread over all of it, so
    # the residual max(p - q, 0) and the bonus row p_K spread over ~49,000 tokens: a sampler that draws from the top
    # k (top-k), exact where V = 5, never emits the rest (red team 10's #3 with k = 5; 14's #1, #2, #7 with k = 64,
    # when this case had 64 tokens). Each row is tested in WIDE_RANKS groups by rank, a quarter of its mass each:
    # a top-k with k under ~80 % of the vocabulary empties or thins the last. One position (K = 1).
    ps, qs, xs = [], [], []
    for _ in range(1):
        x, *few = torch.randperm(WIDE_VOCAB, generator=g)[:5].tolist()
        qx = u(0.3, 0.5)
        q = torch.zeros(WIDE_VOCAB, dtype=torch.float64)
        q[x], q[few] = qx, (1.0 - qx) * _row(g, 4, {})
        ps.append(_row(g, WIDE_VOCAB, {x: u(0.3, 0.6) * qx}))
        qs.append(q)
        xs.append(x)
    ps.append(_row(g, WIDE_VOCAB, {}))
    cases.append(LawCase("wide vocabulary", torch.stack(ps), torch.stack(qs), torch.tensor(xs, dtype=torch.int64),
                         WIDE_TRIALS, f"V = {WIDE_VOCAB:,}: the residual and the bonus spread over all but five tokens, "
                         f"tested in {WIDE_RANKS} groups by rank", WIDE_RANKS))
    return cases


def kl_divergence(x: float, a: float) -> float:
    """KL(Bernoulli(x) || Bernoulli(a)), 0 < a < 1."""
    out = 0.0
    if x > 0:
        out += x * math.log(x / a)
    if x < 1:
        out += (1 - x) * math.log((1 - x) / (1 - a))
    return out


def law_level(n_tests: int) -> float:
    """The bound on m·KL(X/m || a) for one of `n_tests` binomial tests.

    Chernoff: for X ~ Binomial(m, a), P[X/m >= a + t] <= exp(-m·KL(a + t || a)) and the same below, so
    P[m·KL(X/m || a) > L] <= 2·exp(-L). With L = ln(2·n_tests / FALSE_FAILURE) and a union bound over the
    n_tests tests, a correct verify fails the whole check with probability < FALSE_FAILURE."""
    return math.log(2 * n_tests / FALSE_FAILURE)


def acceptance_band(m: int, a: float, level: float) -> tuple[float, float]:
    """The frequencies x with m·KL(x || a) <= level: the interval a correct implementation stays in."""
    def edge(lo, hi):  # bisect between a (inside) and an end (outside, unless the end itself is inside)
        if m * kl_divergence(hi, a) <= level:
            return hi
        for _ in range(60):
            mid = (lo + hi) / 2
            if m * kl_divergence(mid, a) <= level:
                lo = mid
            else:
                hi = mid
        return lo
    return edge(a, 0.0), edge(a, 1.0)


def law_power(m: int, a: float, delta: float, level: float) -> float:
    """P[the binomial test at `level` rejects] when X ~ Binomial(m, a + delta) is tested against a: the
    probability that an acceptance probability off by `delta` is caught from m runs that reach it."""
    lo, hi = acceptance_band(m, a, level)
    x = torch.arange(m + 1, dtype=torch.float64)
    b = a + delta
    logpmf = (torch.lgamma(torch.tensor(m + 1.0, dtype=torch.float64)) - torch.lgamma(x + 1) - torch.lgamma(m - x + 1)
              + x * math.log(b) + (m - x) * math.log(1 - b))
    inside = (x / m >= lo) & (x / m <= hi)
    return float(1.0 - logpmf[inside].exp().sum())


def law_tests(case: LawCase) -> list[tuple[str, int, int, float]]:
    """The binomial tests of one case as (what, X, m, a) — set up from the law alone (the data only fills in
    X and m, by `_fill`); events of probability 0 or 1 are checked exactly, not counted here."""
    law = case.law()
    k = case.x.shape[0]
    tests = []
    for i in range(k):
        reach, go = float(law[i:].sum()), float(law[i + 1:].sum())
        if reach > 0 and 0 < go / reach < 1:
            tests.append((f"acc{i}", i, -1, go / reach))
    for j in range(k + 1):
        total = float(law[j].sum())
        for i, y in enumerate(rank_groups(law[j], case.groups) if case.groups else range(law.shape[1])):
            share = float(law[j, y].sum()) / total if total > 0 else 0.0
            if 0 < share < 1:
                tests.append((f"next{j},{y if isinstance(y, int) else f'rank group {i}'}", j, y, share))
    return tests


def rank_groups(row: torch.Tensor, n: int) -> list[torch.Tensor]:
    """The tokens of `row` (a law over tokens) in `n` groups by rank, most likely first, each holding about 1/n of
    its mass (a token in a group is the event tested: ~49,000 tokens each tested alone would have no power)."""
    order = row.argsort(descending=True, stable=True)
    order = order[row[order] > 0]
    mass = row[order]
    group = ((mass.cumsum(0) - mass) / mass.sum() * n).floor().clamp(max=n - 1).long()
    return [order[group == i] for i in range(n) if bool((group == i).any())]


def law_calls(case: LawCase, seed: int) -> list:
    """The case's calls of verify: case.trials of them, call t with generator seed + t."""
    return [((case.p, case.q, case.x), {"generator": torch.Generator().manual_seed(seed + t)})
            for t in range(case.trials)]


def law_counts(verify, case: LawCase, seed: int, results: list | None = None) -> torch.Tensor:
    """Counts [K+1, V] of (n_accepted, next_token) over the `law_calls` (made here in one batch, unless their
    `results` are given)."""
    k, v = case.x.shape[0], case.p.shape[1]
    counts = torch.zeros(k + 1, v, dtype=torch.int64)
    for out in (results if results is not None else call_many(verify, law_calls(case, seed))):
        n, y = _result(out, k, v, case.name)
        counts[n, y] += 1
    return counts


def _result(out, k: int, v: int, what: str) -> tuple[int, int]:
    assert isinstance(out, tuple) and len(out) == 2 and all(isinstance(o, int) for o in out), (
        f"verify must return a tuple of two ints (n_accepted, next_token); got {out!r} ({what})")
    n, y = out
    assert 0 <= n <= k and 0 <= y < v, (f"verify returned ({n}, {y}) for K={k} draft tokens over {v} tokens: "
                                        f"n_accepted must be in 0..K, next_token in 0..V-1 ({what})")
    return n, y


def law_failures(case: LawCase, counts: torch.Tensor, level: float) -> list[str]:
    """What is wrong with `counts` for `case` (empty when nothing is): impossible cells hit, then the binomial
    tests of acceptance at each position and of the next token after each n_accepted."""
    law = case.law()
    bad = []
    for j, y in ((counts > 0) & (law == 0)).nonzero().tolist():
        what = (f"all {j} accepted, then the bonus token {y}, which p_K gives probability 0" if j == case.x.shape[0]
                else f"{j} accepted, then token {y}" + (", which the residual max(p - q, 0) gives probability 0"
                                                       if float(law[j].sum()) > 0 else
                                                       f": n_accepted = {j} has probability 0 here"))
        bad.append(f"{int(counts[j, y])} runs emitted {what}")
    for name, j, y, a in law_tests(case):
        if isinstance(y, int) and y < 0:
            m, x = int(counts[j:].sum()), int(counts[j + 1:].sum())
            label = f"draft token {j} accepted (of the runs that reached it)"
        else:
            m, x = int(counts[j].sum()), int(counts[j, y].sum())
            token = f"token {y}" if isinstance(y, int) else (
                f"a token of rank {rank_span(case.law()[j], y)} (a group of {y.numel():,} tokens)")
            label = (f"next {token} after all {j} accepted (p_K)" if j == case.x.shape[0] else
                     f"next {token} after a rejection at position {j} (residual)")
        if m and m * kl_divergence(x / m, a) > level:
            lo, hi = acceptance_band(m, a, level)
            bad.append(f"{label}: {x}/{m} = {x / m:.4f}; the law gives {a:.4f} (a correct verify stays in "
                       f"[{lo:.4f}, {hi:.4f}] here)")
    return bad


def rank_span(row: torch.Tensor, tokens: torch.Tensor) -> str:
    """The ranks in `row` that `tokens` (one of `rank_groups`) span, as "a-b" (1 = the most likely)."""
    order = row.argsort(descending=True, stable=True)
    where = torch.isin(order, tokens).nonzero().flatten()
    return f"{int(where.min()) + 1:,}-{int(where.max()) + 1:,}"


def describe_law(case: LawCase) -> str:
    k = case.x.shape[0]
    ratios = [float(case.p[i, case.x[i]] / case.q[i, case.x[i]]) for i in range(k)]
    return (f"case '{case.name}' ({case.why}; K={k}, V={case.p.shape[1]}, draft tokens {case.x.tolist()}, "
            f"p_i(x_i)/q_i(x_i) = {[round(r, 3) for r in ratios]}, {case.trials} runs)")


# --- 3 ------------------------------------------------------------------------------------------------
# speculative_sample is checked against the target's own law at every new position. The test models are position
# tables (`week18_models.TableLM`): the target's law of new token t is the row p[t] whatever came before it, so the
# new tokens of a correct loop are independent, token t distributed as p[t] — at any K, however the rounds fall and
# wherever in a round token t is written (a draft position, the residual after a rejection, the bonus). Each case
# designs p and q per position over three tokens (64 in the wide case; placed at random among a vocabulary of random size, the others
# of probability 0 in both) so that the mistakes named in tests/test_week18_sampling.py change some position's
# law by far more than its test allows: their passing probabilities are computed exactly there (<= 1e-6 each).

_A = (0.3, 0.2, 0.5)  # a target row
_B = (0.6, 0.4, 0.0)  # its draft: p/q = 1/2 on both draft tokens, so the residual is the third token
_S = (0.5, 0.5, 0.0)  # a row the target and the draft share: its draft token is accepted for sure
_X = (0.05, 0.15, 0.8)  # a bonus row unlike every other row of its case
_C = (0.1, 0.2, 0.7)  # a target row far from its square (what a loop that ignores T = 2 samples)
_D = (0.9, 0.05, 0.05)  # a row far from its own square root: a draft sampled at T = 1 where T = 0.5 was asked for
# writes (0.68, 0.16, 0.16) (softmax of logits 0.5·log(_D)) while verify is handed q = _D
SAMPLE_FLOOR = 1e-30  # the probability the models give a token they "never" write (its logit is finite)


# A wide row (red team 10's gap: with three designed tokens a draft sampled from its top k, k >= 3, is exact): the
# draft's q nearly flat over SmolLM2's whole vocabulary, strictly decreasing (so its top k is the first k), the
# target's p equal to q on the last half and shaped otherwise on the first. Each eighth of the tokens by q's rank is
# one event (the first three halving the first half): a correct loop writes each group as often as p gives it at every
# position; a draft drawn from q's top k (transformers' default top_k is 50; red team 14's #7 took 64, when this row
# had 64 tokens) never drafts the rest, while the residual max(p - q, 0) gives the last half nothing.
WIDE = 49_152
_WQ_W = [1.3 - 0.6 * i / (WIDE - 1) for i in range(WIDE)]
_WQ_SUM = sum(_WQ_W)
_WQ = tuple(w / _WQ_SUM for w in _WQ_W)
_HEAD = sum(_WQ[:WIDE // 2])
_WP = tuple(_HEAD * (0.5 + i) / ((WIDE // 2) ** 2 / 2) for i in range(WIDE // 2)) + _WQ[WIDE // 2:]
_CUTS = (0, WIDE // 16, WIDE // 8, WIDE // 4, WIDE // 2, 5 * WIDE // 8, 3 * WIDE // 4, 7 * WIDE // 8, WIDE)
WIDE_GROUPS = tuple(tuple(range(a, b)) for a, b in zip(_CUTS, _CUTS[1:]))  # by q's rank: each one event
del _WQ_W, _WQ_SUM


@dataclass
class SampleCase:
    """One input of speculative_sample's law test: `trials` runs of `len(p)` new tokens at `k` and `temperature`."""
    name: str
    k: int
    temperature: float
    p: tuple  # per new token, the target's law over the designed tokens (three, or WIDE)
    q: tuple  # per new token, the draft's
    trials: int
    why: str
    groups: tuple = ()  # the events tested, as tuples of designed tokens: each token alone unless given

    def events(self) -> tuple:
        return self.groups or tuple((j,) for j in range(len(self.p[0])))


SAMPLE_CASES = (
    SampleCase("four per round", 4, 1.0, (_A,) * 5, (_B,) * 5, 200,
               "every draft token accepted with probability 1/2, at every position of a round"),
    SampleCase("past the first rejection", 8, 0.5, (_S,) * 5 + (_A,) * 3 + (_X,), (_S,) * 5 + (_B,) * 4, 120,
               "K = 8: five draft tokens accepted for sure, three with probability 1/2 each, then the bonus"),
    SampleCase("one per round", 1, 2.0, (_C,) * 3, (_B,) * 3, 240,
               "K = 1 at temperature 2: one draft token, then the residual or the bonus"),
    SampleCase("the bonus", 2, 1.0, (_A, _S, _X), (_B, _S, _B), 200,
               "K = 2: the last new token is always a bonus token (after all K draft tokens are accepted)"),
    SampleCase("the draft's temperature", 8, 0.5, (_D,) * 8 + (_X,), (_D,) * 9, 60,
               "K = 8 at temperature 0.5, the draft's row the target's (every draft token accepted), far from its "
               "square root: each draft token must be drawn from the q handed to verify, softmax(draft logits / T)"),
    SampleCase("a wide vocabulary", 2, 1.0, (_WP,) * 3, (_WQ,) * 3, 200,
               f"K = 2 over {WIDE:,} tokens, the draft's q nearly flat: q's least likely eighth holds ~0.1 of the "
               f"target's law at every position, and a draft sampled from q's top k never drafts it",
               WIDE_GROUPS),
)


def sample_models(case: SampleCase, g: torch.Generator, prompt_len: int = 3):
    """(target, draft, prompt ids, labels): the case's position tables over a vocabulary of random size, its three
    designed tokens at random labels, logits T·log(probability) so that softmax(logits / T) is the designed row."""
    from grader.checks.week18_models import TableLM

    width = len(case.p[0])
    vocab = int(torch.randint(width, width + 22, (), generator=g))
    labels = torch.randperm(vocab, generator=g)[:width]

    def table(rows):
        probs = torch.full((len(rows), vocab), SAMPLE_FLOOR, dtype=torch.float64)
        probs[:, labels] = torch.tensor(rows, dtype=torch.float64).clamp(min=SAMPLE_FLOOR)
        return TableLM(case.temperature * probs.log(), prompt_len)

    ids = labels[torch.randint(0, width, (1, prompt_len), generator=g)]
    return table(case.p), table(case.q), ids, labels


def sample_law(target, temperature: float) -> torch.Tensor:
    """[new tokens, V]: the law of each new token, from the target's own logits (float64)."""
    return torch.softmax(target.logits.double() / temperature, -1)


def sample_tests(case: SampleCase) -> list[tuple[tuple, tuple, float]]:
    """The binomial tests of one case as (positions, event, probability), an event a tuple of designed tokens (one
    token, or a group of the wide case): each position alone, and the positions that share a row pooled
    (independent under the target's law: Binomial(positions × trials, p))."""
    n = len(case.p)
    tests = []
    for t in range(n):
        tests += [((t,), e, a) for e in case.events() if 0 < (a := sum(case.p[t][j] for j in e)) < 1 - 1e-12]
    rows: dict = {}
    for t, row in enumerate(case.p):
        rows.setdefault(row, []).append(t)
    tests += [(tuple(ts), e, a) for row, ts in rows.items() if len(ts) > 1 for e in case.events()
              if 0 < (a := sum(row[j] for j in e)) < 1 - 1e-12]
    return tests


def sample_level() -> float:
    """The per-test bound of speculative_sample's law test: < FALSE_FAILURE false failures over every case."""
    return law_level(sum(len(sample_tests(c)) for c in SAMPLE_CASES))


def sample_failures(case: SampleCase, counts: torch.Tensor, law: torch.Tensor, labels: torch.Tensor,
                    level: float) -> list[str]:
    """What is wrong with `counts` [new tokens, V] (how often each new token was each token): a token written where
    the target gives it probability 0 (< 1e-12: the models' floor is 1e-30), then the binomial tests."""
    m = case.trials
    bad = [f"new token {t} was token {y} in {int(counts[t, y])} runs; the target gives it probability "
           f"{float(law[t, y]):.1e} there" for t, y in ((counts > 0) & (law < 1e-12)).nonzero().tolist()]
    for positions, event, a in sample_tests(case):
        chosen = labels[list(event)]
        x, trials = int(counts[list(positions)][:, chosen].sum()), m * len(positions)
        label = (f"token {int(chosen[0])}" if len(event) == 1 else
                 f"one of the {len(event)} tokens {', '.join(str(int(y)) for y in chosen[:4])}, ... (the draft's "
                 f"ranks {event[0]}-{event[-1]})")
        if trials * kl_divergence(x / trials, a) > level:
            lo, hi = acceptance_band(trials, a, level)
            where = (f"new token {positions[0]}" if len(positions) == 1 else
                     f"new tokens {positions[0]}-{positions[-1]} together (the same law at each)")
            bad.append(f"{where} was {label} in {x}/{trials} = {x / trials:.3f} of the draws; the target's "
                       f"law gives {a:.3f} (a correct loop stays in [{lo:.3f}, {hi:.3f}] here)")
    return bad
