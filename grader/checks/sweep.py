"""Whole-range sweeps for the closed-form exercises (week 16's step_flops, kv_cache_bytes, roofline_time; week 17's
score_bytes, standard_io, flash_io): a step, clamp or cap at any constant inside an argument's meaningful range is
straddled by two drawn inputs on every run, whatever its spelling.

Each argument has a range, from its smallest meaningful value to the largest any real model could reach (see
grader/README.md, "Closed-form exercises: the whole range"). `grid` draws, every run, integers (or floats) covering
that range log-spaced at ratio <= 2 with a per-run jitter, both ends included; `cases` sweeps every argument over its
grid while the others take random points of their grids other than the lowest (so a batch or a head count is > 1
while positions sweep). The references are Python integers (exact at 2**50 and beyond); a float result is accepted
within a relative 1e-12 of the exact value, so float arithmetic that is right passes and a factor from a switch
does not.
"""
from __future__ import annotations

import math
import numbers

import torch

from grader.checks import assert_route, generator, observe_many, seed_note


def grid(offset: int, lo: float, hi: float, ratio: float = 2.0, integer: bool = True) -> list:
    """Points from `lo` to `hi` (both included), consecutive ones at most `ratio` apart, jittered per run."""
    g = generator(offset)
    steps = max(1, math.ceil(math.log(hi / lo) / math.log(ratio)))
    jitter = torch.rand(steps, generator=g, dtype=torch.float64).tolist()
    points = {lo, hi}
    for i, u in enumerate(jitter):
        x = lo * ratio ** (i + u)
        points.add(min(hi, max(lo, int(x) if integer else x)))
    return sorted(points)


def cases(offset: int, grids: dict[str, list]) -> list[dict]:
    """One case per (argument, grid point): that argument at the point, the others at random points of their grids
    other than the lowest; then every argument at its lowest, and every argument at its highest."""
    g = generator(offset)
    out = []
    for name, points in grids.items():
        for x in points:
            case = {}
            for other, pts in grids.items():
                pool = pts[1:] if len(pts) > 1 else pts
                case[other] = x if other == name else pool[int(torch.randint(len(pool), (1,), generator=g))]
            out.append(case)
    out.append({k: v[0] for k, v in grids.items()})
    out.append({k: v[-1] for k, v in grids.items()})
    return out


def _agrees(got, want) -> bool:
    if isinstance(want, tuple):
        return (isinstance(got, (tuple, list)) and len(got) == len(want)
                and all(_agrees(a, b) for a, b in zip(got, want)))
    if isinstance(got, bool) or not isinstance(got, numbers.Real):
        return False
    if isinstance(got, numbers.Integral):
        return int(got) == want
    return math.isfinite(got) and abs(float(got) - want) <= 1e-12 * abs(want)


def judge(fn, name: str, calls: list[tuple[tuple, dict]], reference, explain: str, rel: float | None = None) -> None:
    """Every call observed (one round trip), its route judged, its result equal to `reference(*args, **kwargs)`
    (exact for an int; within 1e-12, or `rel`, for a float)."""
    results = observe_many(fn, calls, _observe_light=True)
    for (args, kwargs), (got, obs) in zip(calls, results):
        what = f"{name}({', '.join([repr(a) for a in args] + [f'{k}={v!r}' for k, v in kwargs.items()])})"
        assert_route(obs, name)
        want = reference(*args, **kwargs)
        if rel is None:
            ok = _agrees(got, want)
        else:
            ok = (isinstance(got, numbers.Real) and not isinstance(got, bool) and math.isfinite(got)
                  and abs(float(got) - want) <= rel * abs(want))
        assert ok, (f"{what} = {got!r}; expected {want!r}. {explain} The formula holds at every size, however large "
                    f"{seed_note()}")


# --- the exercises' ranges -------------------------------------------------------------------------------------
# Largest meaningful values: 2**44 parameters (17 T), 2**10 layers, 2**16 model width, 2**12 head dim, 2**10
# heads, 2**16 sequences in a batch, 2**30 positions for a step's FLOPs, 2**32 for a cache or an attention head,
# 16 bytes per element; week 17's fast memory up to 2**24 key rows per block.

def step_flops(fn) -> None:
    grids = dict(n_params=grid(1601, 1, 2 ** 44), n_layers=grid(1602, 1, 2 ** 10), d_model=grid(1603, 1, 2 ** 16),
                 seq_len=grid(1604, 1, 2 ** 30))
    calls = [((c["n_params"], c["n_layers"], c["d_model"], c["seq_len"], cached), {})
             for c in cases(1605, grids) for cached in (True, False)]
    judge(fn, "step_flops", calls, lambda p, L, d, s, cached: (1 if cached else s) * (2 * p + 4 * L * d * s),
          "Each token that runs costs 2*n_params, plus 4*n_layers*d_model*seq_len in attention.")


def kv_cache_bytes(fn) -> None:
    grids = dict(n_layers=grid(1611, 1, 2 ** 10), n_kv_heads=grid(1612, 1, 2 ** 10), head_dim=grid(1613, 1, 2 ** 12),
                 seq_len=grid(1614, 1, 2 ** 32), batch=grid(1615, 1, 2 ** 16), bytes_per_element=grid(1616, 1, 16))
    calls = [((c["n_layers"], c["n_kv_heads"], c["head_dim"], c["seq_len"]),
              dict(batch=c["batch"], bytes_per_element=c["bytes_per_element"])) for c in cases(1617, grids)]
    judge(fn, "kv_cache_bytes", calls, lambda L, h, d, s, batch, bytes_per_element: 2 * L * h * d * s * batch * bytes_per_element,
          "2 (K and V) x layers x KV heads x head_dim x positions x batch x bytes per element.")


def roofline_time(fn) -> None:
    """Every argument over its range, each point twice: memory-bound and compute-bound (the other time a drawn
    factor of 2 to 16 away), so a change to either side is seen whichever side it is on."""
    g = generator(1621)
    calls = []
    ranges = dict(flops=(1.0, 1e30), bytes_moved=(1.0, 2.0 ** 60), flops_per_s=(1e3, 1e21), bytes_per_s=(1e3, 1e18))
    for j, (name, (lo, hi)) in enumerate(ranges.items()):
        for x in grid(1622 + j, lo, hi, ratio=4.0, integer=False):
            for memory_bound in (True, False):
                factor = 2.0 ** (1 + 3 * float(torch.rand(1, generator=g, dtype=torch.float64)))
                a = {k: (x if k == name else 10 ** (math.log10(lo_) + (math.log10(hi_) - math.log10(lo_))
                                                   * float(torch.rand(1, generator=g, dtype=torch.float64))))
                     for k, (lo_, hi_) in ranges.items()}
                # set the partner of the swept argument so that the other time is `factor` away
                memory = a["bytes_moved"] / a["bytes_per_s"]
                compute = memory / factor if memory_bound else memory * factor
                if name in ("flops", "flops_per_s"):
                    memory = (a["flops"] / a["flops_per_s"]) * (factor if memory_bound else 1 / factor)
                    a["bytes_moved"] = memory * a["bytes_per_s"]
                else:
                    a["flops"] = compute * a["flops_per_s"]
                calls.append(((a["flops"], a["bytes_moved"], a["flops_per_s"], a["bytes_per_s"]), {}))
    judge(fn, "roofline_time", calls, lambda f, b, fs, bs: max(f / fs, b / bs),
          "Compute takes flops/flops_per_s, memory traffic bytes/bytes_per_s, and they overlap.", rel=1e-9)


def score_bytes(fn) -> None:
    grids = dict(batch=grid(1631, 1, 2 ** 16), heads=grid(1632, 1, 2 ** 10), q_len=grid(1633, 1, 2 ** 32),
                 kv_len=grid(1634, 1, 2 ** 32), bytes_per_element=grid(1635, 1, 16))
    calls = [((c["batch"], c["heads"], c["q_len"], c["kv_len"]), dict(bytes_per_element=c["bytes_per_element"]))
             for c in cases(1636, grids)]
    judge(fn, "score_bytes", calls, lambda b, h, nq, nk, bytes_per_element: b * h * nq * nk * bytes_per_element,
          "batch·heads·q_len·kv_len·bytes per element.")


def standard_io(fn) -> None:
    grids = dict(n=grid(1641, 1, 2 ** 32), d=grid(1642, 1, 2 ** 14))
    calls = [((c["n"], c["d"]), {}) for c in cases(1643, grids)]
    judge(fn, "standard_io", calls, lambda n, d: (3 * n * d + 2 * n * n, n * d + 2 * n * n),
          "Read Q, K (2Nd), write S (N²); read S, write P (N² each); read P (N²) and V (Nd), write O (Nd).")


def flash_io(fn) -> None:
    """m = 4·d·B_c − r with r in [0, 4d) (r = 0 for B_c = 1: M >= 4d): B_c = ceil(m / 4d) swept over its range too."""
    grids = dict(n=grid(1651, 1, 2 ** 32), d=grid(1652, 1, 2 ** 14), b_c=grid(1653, 1, 2 ** 24))
    g = generator(1654)
    calls = []
    for c in cases(1655, grids):
        d = c["d"]
        r = int(torch.randint(4 * d, (1,), generator=g)) if c["b_c"] > 1 else 0
        calls.append(((c["n"], d, 4 * d * c["b_c"] - r), {}))

    def want(n, d, m):
        t_c = -(-n // -(-m // (4 * d)))
        return (2 * n * d + t_c * (2 * n * d + 2 * n), n * d + 2 * n + t_c * (n * d + 2 * n))
    judge(fn, "flash_io", calls, want, "B_c = ceil(M/4d), T_c = ceil(N/B_c): K and V read once; Q, O, l, m read, and "
          "O, l, m written, once per key block (and written once at initialisation).")
