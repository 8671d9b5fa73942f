"""Timing that knows when it is disturbed: the notebooks' timed cells and the benchmarks use it.

On a shared machine (a JupyterHub node, a laptop with a browser open, a 2-core VM whose host is busy) the same step
timed twice can differ by 1.5× or more, and a figure taken in one moment can read as a finding when it is noise
(week 18's verify-cost curve once read 0.78, 0.46, 2.03, 0.63 decode steps for m = 1..4 under load). So:

- `interleaved({name: fn, ...}, repeats)` times the things being compared in turn, round by round (A B C, B C A,
  ...), so a disturbance hits all of them alike; each figure keeps every sample (`Timed`: best, median, worst);
- `Conditions` notes the load average before and after, the cores and torch's threads;
- `warning(...)` gives one line when the load or the spread of the repeats makes the figures unreliable, saying
  what to do; `not_monotone(...)` says "measurement disturbed" for a curve that must rise and does not;
- `report(...)` prints a table of best / median / worst with the load line and the warning.

The figure to read is the best (least disturbed) run, and ratios between figures of one run.
"""
from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

from lib.bench.roofline import sync

# Repeats whose worst is more than this multiple of their best were disturbed (a quiet 2-core VM: <= 1.1-1.2).
SPREAD_LIMIT = 1.3


@dataclass
class Timed:
    """Seconds of each repeat of one timed thing."""
    label: str
    samples: list[float] = field(default_factory=list)

    @property
    def best(self) -> float:
        return min(self.samples)

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def worst(self) -> float:
        return max(self.samples)

    @property
    def spread(self) -> float:
        """worst / best (1.0: every repeat alike)."""
        return self.worst / self.best if self.best > 0 else float("inf")


def load_average() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:
        return 0.0


@dataclass
class Conditions:
    """The machine around a measurement: the 1-minute load average before and after, the cores this process may
    use, torch's threads."""
    load_before: float
    load_after: float | None = None
    cores: int = 1
    threads: int = 1

    @classmethod
    def now(cls) -> "Conditions":
        import torch

        try:
            cores = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cores = os.cpu_count() or 1
        return cls(load_average(), None, cores, torch.get_num_threads())

    def done(self) -> "Conditions":
        self.load_after = load_average()
        return self

    @property
    def others(self) -> float:
        """How many cores' worth of other work the load shows: the load before we started (our own threads were not
        running yet), or after less our own threads."""
        after = max(0.0, (self.load_after or 0.0) - self.threads)
        return max(self.load_before, after)

    @property
    def busy(self) -> bool:
        """Other work wants the cores our threads need."""
        return self.others > self.cores - self.threads + 0.5

    def line(self) -> str:
        after = "" if self.load_after is None else f" → {self.load_after:.2f}"
        return (f"load average {self.load_before:.2f}{after} on {self.cores} core{'s' * (self.cores != 1)}, "
                f"torch on {self.threads} thread{'s' * (self.threads != 1)}")


def interleaved(fns: dict[str, Callable[[], object]], repeats: int = 5, warmup: int = 1, device=None) -> dict[str, Timed]:
    """Time each of `fns` `repeats` times, in turn: round r calls them starting from the r-th, so that whatever
    disturbs the machine for a while falls on all of them. Each call is synchronized on `device` (CUDA runs
    asynchronously) before the clock is read. `warmup` untimed rounds first (allocation, thread pools, caches)."""
    names = list(fns)
    out = {name: Timed(name) for name in names}
    for _ in range(warmup):
        for name in names:
            fns[name]()
    if device is not None:
        sync(device)
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            if device is not None:
                sync(device)
            t0 = time.perf_counter()
            fns[name]()
            if device is not None:
                sync(device)
            out[name].samples.append(time.perf_counter() - t0)
    return out


def warning(timings, conditions: Conditions, spread_limit: float = SPREAD_LIMIT) -> str | None:
    """One line when these figures are not to be trusted, and what to do; None when they are."""
    timings = list(timings.values()) if isinstance(timings, dict) else list(timings)
    why = []
    if conditions.busy:
        why.append(f"other work kept the load at {conditions.others:.1f} on {conditions.cores} cores")
    spread = max((t.spread for t in timings if t.samples), default=1.0)
    if spread > spread_limit:
        worst = max((t for t in timings if t.samples), key=lambda t: t.spread)
        why.append(f"the repeats of '{worst.label}' spread {spread:.2f}× (worst / best)")
    if not why:
        return None
    return ("measurement disturbed: " + " and ".join(why) + ". Read the ratios between figures of this run, not the "
            "absolute times; for figures you can trust, rerun when the machine is quieter (stop other work), with "
            "more repeats, or with INFERENCE_LAB_THREADS=1 set before the kernel starts.")


def not_monotone(xs, ys, what: str, tolerance: float = 0.05) -> str | None:
    """For a curve that must rise with x (the cost of verifying m tokens, of a longer prompt): 'measurement
    disturbed' naming the first fall larger than `tolerance` (relative), else None."""
    for (x0, y0), (x1, y1) in zip(zip(xs, ys), list(zip(xs, ys))[1:]):
        if y1 < y0 * (1 - tolerance):
            return (f"measurement disturbed: {what} falls from {y0:.3g} at {x0} to {y1:.3g} at {x1}, which more work "
                    f"cannot cost — a disturbance, not a finding; rerun the cell when the machine is quieter")
    return None


def impossible_verify_curve(cost: dict[int, float], tolerance: float = 0.15) -> str | None:
    """For a verify curve (the time of one forward over m new tokens, in one-token steps): 'measurement disturbed'
    when it says what no machine can do — one token costing other than one step, m tokens costing less than one
    step, or more than m separate steps — else None. (It need not be monotone: a matmul library picks its kernel
    by the number of rows, and 3 rows can cost more than 4.)"""
    bad = []
    for m, c in sorted(cost.items()):
        if (m == 1 and abs(c - 1) > tolerance) or c < 1 - tolerance or c > m * (1 + tolerance):
            bad.append(f"m = {m}: {c:.2f} steps")
    if not bad:
        return None
    return (f"measurement disturbed: the verify curve says what no machine can do ({'; '.join(bad[:4])}; one token is "
            f"one step, m tokens cost between 1 and m steps) — a disturbance, not a finding; rerun the cell when the "
            f"machine is quieter")


def report(timings: dict[str, Timed], conditions: Conditions, unit: str = "ms", scale: float = 1e3,
           per: dict[str, float] | None = None) -> str:
    """A table of best / median / worst for each timed thing (`scale` seconds into `unit`; `per`: a divisor per
    name, e.g. tokens), the conditions, and the warning line if any."""
    width = max([len(n) for n in timings] + [4])
    lines = [f"{'':{width}}  {'best':>9} {'median':>9} {'worst':>9}  ({unit}, {len(next(iter(timings.values())).samples)} "
             f"repeats, interleaved)"]
    for name, t in timings.items():
        d = (per or {}).get(name, 1.0)
        lines.append(f"{name:{width}}  {t.best * scale / d:9.3g} {t.median * scale / d:9.3g} {t.worst * scale / d:9.3g}")
    lines.append(conditions.line())
    warn = warning(timings, conditions)
    if warn:
        lines.append(warn)
    return "\n".join(lines)
