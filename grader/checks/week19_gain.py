"""Week 19's predict-then-measure exercise, `continuous_gain`, graded on the student's model (below
`grader.checks.week19`, which registers it): the throughput gain of continuous over static batching for a deep queue
of requests whose numbers of new tokens follow a given distribution, on a given number of slots, in section 1's
step-count model (one token per running request per step, prefill left out).

The model it is judged against: under continuous batching every slot is busy as long as the queue lasts, so `slots`
requests finish per E[L] steps; a static batch takes `slots` requests and holds its slots until the longest of them
is done, E[max of `slots` draws] steps, with P(max <= l) = F(l)^slots. The gain is E[max] / E[L] (= 1 / (1 - idle),
idle the share of a static batch's slot-steps that no token fills). The check draws distributions (2 to 6 lengths,
some of them rare) and slot counts per run, each kept only where every natural mistake below misses it by more than
2 %: the longest length for every batch (the seed's ceiling argument), the unweighted mean of the lengths, the
distribution of the max without differencing the CDF, the ratio upside down, a batch of one slot fewer or one more.
A simulation of a sampled queue lands near the answer but not within the bound (1e-6 relative): the answer is an
expectation, computed from the distribution.
"""
from __future__ import annotations

import math
import random

from grader.checks import run_seed, seed_note

# The notebook's and the seed's cases first: 50/200 half and half on 8 slots (the seed's claim), no spread, one slot.
FIXED = [({50: 0.5, 200: 0.5}, 8), ({200: 1.0}, 8), ({50: 0.5, 200: 0.5}, 1), ({4: 0.5, 16: 0.5}, 4)]


def expected_max(dist: dict[int, float], slots: int, difference: bool = True) -> float:
    """E[max of `slots` independent draws]: the sum over lengths l of l * (F(l)^slots - F(l-)^slots)."""
    total, cdf, below = 0.0, 0.0, 0.0
    for length, p in sorted(dist.items()):
        cdf += p
        total += length * (cdf ** slots - (below if difference else 0.0))
        below = cdf ** slots
    return total


def mean(dist: dict[int, float]) -> float:
    return sum(length * p for length, p in dist.items())


def gain(dist: dict[int, float], slots: int) -> float:
    """The model: steps per request, static over continuous, for a deep queue."""
    return expected_max(dist, slots) / mean(dist)


def mistakes(dist: dict[int, float], slots: int) -> list[tuple[str, float]]:
    """(why, what a natural mistake returns) for this case."""
    return [
        ("it lets every static batch run as long as the longest possible request: a batch of S requests lasts as long "
         "as the longest of ITS requests, and all S are short with probability F(short)^S",
         max(dist) / mean(dist)),
        ("it takes the plain mean of the lengths: weight each length by its probability",
         expected_max(dist, slots) / (sum(dist) / len(dist))),
        ("it sums l * F(l)^S: that is P(max <= l), not P(max = l) = F(l)^S - F(l-1)^S",
         expected_max(dist, slots, difference=False) / mean(dist)),
        ("it is upside down: the gain of continuous batching is static's steps over continuous's (> 1 when lengths "
         "differ)", mean(dist) / expected_max(dist, slots)),
        ("a static batch holds S requests, not S - 1", expected_max(dist, max(1, slots - 1)) / mean(dist)),
        ("a static batch holds S requests, not S + 1", expected_max(dist, slots + 1) / mean(dist)),
    ]


def draw(rng: random.Random) -> tuple[dict[int, float], int]:
    """A distribution of 2 to 6 lengths (some rare) and a slot count where the model and each mistake differ."""
    while True:
        k = rng.randint(2, 6)
        lengths = rng.sample(range(1, 513), k)
        weights = [rng.choice([rng.uniform(0.02, 0.1), rng.uniform(0.1, 1.0)]) for _ in lengths]
        dist = {n: w / sum(weights) for n, w in zip(lengths, weights)}
        slots = rng.randint(2, 24)
        want = gain(dist, slots)
        if all(abs(v - want) > 0.02 * want for _, v in mistakes(dist, slots)):
            return dist, slots


# Wide cases, every run: slot counts from 25 to 8192 (one per band) and a longest length past 512, up to 2^18, so
# that a constant hidden in the code (a step at some slot count, lengths cut at some size, slots capped) is crossed.
BANDS = ((25, 64), (65, 1024), (1025, 8192))


def draw_wide(rng: random.Random, low: int, high: int) -> tuple[dict[int, float], int]:
    """Slots log-uniform in [low, high]; the longest length (513 to 2^18) rare enough, about 0.2 to 2 per batch of
    S, that a batch holds it or not with fair odds: its E[max] is neither the shortest nor the longest length."""
    while True:
        slots = int(math.exp(rng.uniform(math.log(low), math.log(high + 1))))
        slots = min(max(slots, low), high)
        longest = int(math.exp(rng.uniform(math.log(513), math.log(1 << 18))))
        others = rng.sample(range(1, longest), rng.randint(1, 5))
        p_long = rng.uniform(0.2, 2.0) / slots
        weights = [rng.uniform(0.1, 1.0) for _ in others]
        dist = {n: (1 - p_long) * w / sum(weights) for n, w in zip(others, weights)}
        dist[longest] = p_long
        want = gain(dist, slots)  # a slot more or fewer moves E[max] by ~1/S here: judged exactly, not kept apart
        if all(abs(v - want) > 0.02 * want for _, v in mistakes(dist, slots)[:4]):
            return dist, slots


def cases() -> list[tuple[str, dict[int, float], int]]:
    rng = random.Random(run_seed() + 190)
    out = [(f"fixed case {i + 1}", d, s) for i, (d, s) in enumerate(FIXED)]
    out += [(f"wide case {i + 1}", *draw_wide(rng, lo, hi)) for i, (lo, hi) in enumerate(BANDS)]
    return out + [(f"drawn case {i + 1}", *draw(rng)) for i in range(10)]


def judge(continuous_gain) -> None:
    for what, dist, slots in cases():
        got = continuous_gain(dict(dist), slots)
        try:
            got = float(got)
        except (TypeError, ValueError):
            raise AssertionError(f"continuous_gain returned {type(got).__name__}; expected a number (the gain)") from None
        want = gain(dist, slots)
        if math.isclose(got, want, rel_tol=1e-6):
            continue
        shown = {n: round(p, 4) for n, p in dist.items()}
        why = next((w for w, v in mistakes(dist, slots) if math.isclose(got, v, rel_tol=1e-6)), None)
        if why is None and math.isclose(got, want, rel_tol=0.05):
            why = ("close, not exact: a simulation of a sampled queue estimates it; the gain of a deep queue is an "
                   "expectation, computed from the distribution itself")
        assert False, (f"continuous_gain({shown}, slots={slots}) [{what}] = {got:.6g}, expected {want:.6g}: "
                       f"{why or 'under continuous batching every slot stays busy (S requests per E[L] steps); a static batch lasts as long as the longest of its S requests'} "
                       f"{seed_note()}")
