"""Timing helpers the benchmark scripts share (benchmarks/decode.py, quant.py, ...), on top of `lib.bench.timing` (the
interleaved repeats, the load, the warning line the notebooks use too). Each script puts its own folder on sys.path
and imports `from timing import ...`."""
from __future__ import annotations

import time

from lib.bench.roofline import sync
from lib.bench.timing import Conditions, Timed, interleaved, warning

__all__ = ["Conditions", "Timed", "interleaved", "warning", "sync", "time_call", "time_decodes", "finish"]


def time_decodes(steps: dict, new_tokens: int, repeats: int, device=None) -> dict[str, Timed]:
    """Seconds per decoded token of each `steps[name](k)` (generate k tokens), one sample per round:
    (time(1 + n) of that round - the best time(1)) / n. The paths take turns within each round, starting from the
    next one each round, so a load that comes and goes (other processes on a shared machine) falls on all of them
    alike; the best sample is the least disturbed one, and the spread of the samples says how disturbed the run
    was. (Not the per-round difference: one slow time(1) makes a difference too small — even negative.)"""
    for step in steps.values():
        step(1)  # warm-up
    names = list(steps)
    short = {name: [] for name in names}
    long = {name: [] for name in names}
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            if device is not None:
                sync(device)
            t0 = time.perf_counter()
            steps[name](1)
            if device is not None:
                sync(device)
            t1 = time.perf_counter()
            steps[name](1 + new_tokens)
            if device is not None:
                sync(device)
            t2 = time.perf_counter()
            short[name].append(t1 - t0)
            long[name].append(t2 - t1)
    return {name: Timed(name, [max(t - min(short[name]), 1e-9) / new_tokens for t in long[name]]) for name in names}


def time_call(fn, repeats: int, device) -> float:
    """Median seconds of `fn()` over `repeats` calls after one warm-up, the device synchronized after each."""
    return interleaved({"fn": fn}, repeats, warmup=1, device=device)["fn"].median


def finish(conditions: Conditions, timings: list[Timed], record=None, as_reference: bool = False) -> None:
    """The end of a benchmark: the load line, the warning if the figures were disturbed, and the record written
    (`lib.bench.records`; `as_reference`: also the class's committed record)."""
    conditions.done()
    print(f"\n{conditions.line()}")
    warn = warning(timings, conditions)
    if warn:
        print(warn)
    if record is not None:
        record.note("disturbed", warn)
        record.write(commit_as_reference=as_reference and warn is None)
        if as_reference and warn is not None:
            print("not kept as the class's reference record: the run was disturbed")
