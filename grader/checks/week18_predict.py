"""Week 18's models of a round, graded on configurations drawn per run (registered by `grader.checks.week18`):

- exercise 6, `best_k(alpha, c, verify_cost)`: the K of the highest predicted speedup, and that speedup. `alpha` is
  one acceptance probability for every draft position, or a list of them, `alpha[i]` = P(draft token i is
  accepted | tokens 0..i-1 were) — a draft that reads its own guesses (section 10's head) gets worse with i, and
  the constant-α formula (lib.spec_decode.speculative's) does not answer the list;
- exercise 7, `expected_target_calls(alpha, k, max_new_tokens)`: the expected number of target calls (rounds) a
  speculative run makes to write exactly max_new_tokens tokens, each draft token accepted with probability α given
  the ones before it, the last rounds drafting fewer so that none overshoots (no lib counterpart).

The models they are judged against, as exact numbers: a round that drafts m tokens writes j ≤ m tokens with
probability α^(j-1)·(1 - α) (j - 1 kept, then the target's correction) and m + 1 with probability α^m (all kept,
then the bonus token); it costs m·c + verify_cost[m + 1] target steps. The natural mistakes each miss some case by
far more than the tolerance (1e-9 relative): the steady-state tokens per round n / E[tokens] for the calls (it
ignores the end, where rounds draft fewer), every draft token tested independently (1 + αK), the bonus token
forgotten, α[0] or the mean α for every position, products that include the token's own α.
"""
from __future__ import annotations

import torch

from grader.checks import generator, observe, seed_note


def round_tokens(alpha, k: int) -> float:
    """E[tokens a round of K drafted tokens writes]: token i + 1 is written iff draft tokens 0..i were all kept."""
    alphas = [float(alpha)] * k if isinstance(alpha, (int, float)) else [float(a) for a in alpha[:k]]
    total, reach = 1.0, 1.0
    for a in alphas:
        reach *= a
        total += reach
    return total


def speedup(alpha, k: int, c: float, verify_cost: dict) -> float:
    return round_tokens(alpha, k) / (k * c + verify_cost[k + 1])


def expected_calls(alpha: float, k: int, n: int, bonus: bool = True) -> float:
    """E[target calls to write exactly n tokens]: calls[r] for r tokens still to write, the round drafting
    m = min(K, r - 1) so that it writes at most r (`bonus=False`: the mistake of a round that keeps all m guesses
    writing m tokens, not m + 1)."""
    calls = [0.0] * (n + 1)
    for r in range(1, n + 1):
        m = min(k, r - 1)
        e = 1.0 + alpha ** m * calls[r - (m + 1 if bonus else max(m, 1))]
        for j in range(1, m + 1):
            e += alpha ** (j - 1) * (1 - alpha) * calls[r - j]
        calls[r] = e
    return calls[n]


def _run(fn, name: str, *args):
    out, obs = observe(fn, *args)  # every call observed: its answer and its route judged
    used = sorted(c for c in obs.lib_calls if c.startswith("lib."))
    assert not used, f"{name} must be your own model; it called {used}"
    return out


# --- exercise 6 ------------------------------------------------------------------------------------------------

def _curve(g, m: int, flat: bool) -> dict:
    if flat:
        return {i: 1.0 for i in range(1, m + 1)}  # a GPU at batch 1
    steps = torch.cumsum(0.25 * torch.rand(m, generator=g, dtype=torch.float64), 0)
    return {i: 1.0 + float(steps[i - 2]) if i > 1 else 1.0 for i in range(1, m + 1)}


def best_k_cases(offset: int) -> list[tuple]:
    """(alpha, c, curve): one α for every position first (α = 0 and 1 included; two curves longer than the rest,
    M = 40-199 (drawn per run) and 48, where a search capped at K = 15 is wrong), then lists of per-position α drawn per run: falling
    (a draft that reads its own guesses), rising, one sure position then a hopeless one, and random."""
    g = generator(offset)
    plain = [(1.0, 0.0, 16), (1.0, 0.3, 9), (0.0, 0.1, 12), (0.999999, 0.05, 16), (0.5, 0.0, 3)]
    for _ in range(40):
        plain.append((float(torch.rand((), generator=g)), 0.8 * float(torch.rand((), generator=g)),
                      int(torch.randint(2, 17, (), generator=g))))
    plain += [(1.0, 0.0, int(torch.randint(40, 200, (), generator=g))), (0.97, 0.01, 48)]  # the first: flat, the
    # best K is its last (M - 1), drawn per run: a search capped at any K below it is wrong (FINDINGS5.md #3)
    out = [(alpha, c, _curve(g, m, j % 3 == 0)) for j, (alpha, c, m) in enumerate(plain)]
    for j in range(24):
        m = int(torch.randint(3, 17, (), generator=g))
        u = torch.rand(m - 1, generator=g, dtype=torch.float64)
        kind = j % 4
        if kind == 0:  # falling, like a head that drafts from its own features
            alphas = (0.5 + 0.5 * u[0]) * torch.cumprod(0.55 + 0.4 * u, 0)
        elif kind == 1:  # rising
            alphas = torch.sort(u).values
        elif kind == 2:  # a sure token, then a hopeless one, then anything
            alphas = u.clone()
            alphas[0], alphas[1] = 1.0, 0.02 * float(u[1])
        else:
            alphas = u
        out.append(([float(a) for a in alphas], 0.3 * float(torch.rand((), generator=g)), _curve(g, m, j % 3 == 0)))
    return out


def _alpha_text(alpha) -> str:
    return f"α={alpha:.4g}" if isinstance(alpha, float) else f"α per position={[round(a, 4) for a in alpha]}"


def judge_best_k(best_k) -> None:
    for alpha, c, curve in best_k_cases(8):
        m = max(curve)
        speeds = {k: speedup(alpha, k, c, curve) for k in range(1, m)}
        best = max(speeds.values())
        out = _run(best_k, "best_k", list(alpha) if isinstance(alpha, list) else alpha, c, dict(curve))
        assert isinstance(out, tuple) and len(out) == 2, f"best_k must return (k, predicted_speedup); got {out!r}"
        k, s = out
        assert isinstance(k, int) and 1 <= k < m, (
            f"best_k({_alpha_text(alpha)}, c={c:.4g}, a curve for m = 1..{m}) returned K = {k!r}: K must be an int in "
            f"1..{m - 1} (a round verifies K + 1 tokens)")
        assert abs(float(s) - best) <= 1e-9 * best and speeds[k] >= best * (1 - 1e-9), (
            f"best_k({_alpha_text(alpha)}, c={c:.4g}, verify_cost over m = 1..{m}) = ({k}, {float(s):.6g}); the best "
            f"is K = {max(speeds, key=speeds.get)} with {best:.6g}x. Derive the expected tokens a round writes (token "
            f"i of the round is kept only if the i draft tokens before it were, each with its own α when α is a "
            f"list) and its cost in target steps (K draft steps of cost c, one target forward over K + 1 tokens) "
            f"{seed_note()}")


# --- exercise 7 ------------------------------------------------------------------------------------------------

def calls_cases(offset: int) -> list[tuple]:
    """(α, K, n): the edges (α = 0: one token a call; α = 1: K + 1 a call, the last round shorter), then 36 drawn
    per run, a third of them with n within 2K of the end, where the last rounds draft fewer."""
    g = generator(offset)
    out = [(0.6, 8, 2), (0.9, 1, 7), (0.0, 4, 10), (1.0, 4, 10), (1.0, 3, 1)]
    for j in range(36):
        k = int(torch.randint(1, 13, (), generator=g))
        n = int(torch.randint(1, 2 * k + 3, (), generator=g)) if j % 3 == 0 else int(torch.randint(1, 97, (), generator=g))
        out.append((float(torch.rand((), generator=g, dtype=torch.float64)), k, n))
    return out


def _calls_hint(got: float, alpha: float, k: int, n: int) -> str:
    steady = round_tokens(alpha, k)
    mistakes = [
        ("that is n / (tokens per round in the long run): near the end a round drafts fewer tokens (it may write "
         "only the tokens still missing), so the last rounds write less", n / steady),
        ("every draft token is counted as tested independently (1 + αK a round): a token is tested only if the "
         "ones before it were kept", n / (1 + alpha * k)),
        ("the bonus token is missing: a round that keeps all its draft tokens also writes the target's own",
         expected_calls(alpha, k, n, bonus=False)),
        ("the bonus token is missing: a round that keeps all its draft tokens also writes the target's own",
         n / max(round_tokens(alpha, k) - alpha ** k, 1e-300)),
    ]
    for why, value in mistakes:
        if abs(got - value) <= 1e-6 * value:
            return why
    return ("a round that drafts m tokens writes j ≤ m with probability α^(j-1)(1 - α) and m + 1 with probability "
            "α^m; with r tokens still to write it drafts m = min(K, r - 1); the expected calls follow from r = n down "
            "(exactly: no simulation)")


def judge_expected_target_calls(expected_target_calls) -> None:
    for alpha, k, n in calls_cases(9):
        want = expected_calls(alpha, k, n)
        got = _run(expected_target_calls, "expected_target_calls", alpha, k, n)
        try:
            got = float(got)
        except (TypeError, ValueError):
            raise AssertionError(f"expected_target_calls returned {type(got).__name__}; expected a number") from None
        assert abs(got - want) <= 1e-9 * want, (
            f"expected_target_calls(α={alpha:.6g}, K={k}, max_new_tokens={n}) = {got:.6g}; expected {want:.6g} "
            f"target calls ({n / want:.4g} tokens per call): {_calls_hint(got, alpha, k, n)} {seed_note()}")
