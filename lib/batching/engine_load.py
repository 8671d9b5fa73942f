"""A load test of the serving engine in this process (week 19): requests arrive at given times, the engine serves
them step by step, and the run is summed up the way its users and its operator see it.

    r = run_load(engine, prompts, max_new_tokens, arrivals)    # arrivals: seconds from 0, one per request
    percentile(r["ttft"], 95), percentile(r["tbt"], 50), r["tokens_per_s"], r["kv_utilization"]

TTFT (arrival to first token), TBT (gaps between a request's tokens), throughput, and KV utilization against
two contiguous caches. `SkipClock` skips the idle gaps between arrivals, so a slow machine measures every step
for real without sleeping.

Separate from `lib/batching/engine.py`: it drives an engine from outside (its `clock`, `add_request`, `step`,
`requests`, `step_stats`) and is no part of serving. Not to be confused
with `lib/serve/loadtest.py`, the load test of a running server over HTTP (week 21).
"""
from __future__ import annotations

import time
from collections.abc import Sequence


class SkipClock:
    """Wall-clock time that skips idle gaps: `advance_to(t)` jumps forward when nothing is running.

    A load test on a slow machine then measures every step for real without sleeping between arrivals."""

    def __init__(self):
        self.offset = time.perf_counter()

    def __call__(self) -> float:
        return time.perf_counter() - self.offset

    def advance_to(self, t: float) -> None:
        now = self()
        if t > now:
            self.offset -= t - now


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation between the closest ranks (numpy's and torch.quantile's
    default); nan for no values. The lab's one percentile: the in-process load test (here), the HTTP load test
    (`lib.serve.loadtest`) and the notebooks report p50 and p95 the same way."""
    s = sorted(float(v) for v in values)
    if not s:
        return float("nan")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile: q={q} is outside 0..100")
    at = (len(s) - 1) * q / 100
    lo = int(at)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (at - lo)


def run_load(engine, prompts: Sequence[Sequence[int]], max_new_tokens: Sequence[int],
             arrivals: Sequence[float], progress=None, prealloc_len: int = 2048) -> dict:
    """Serve requests arriving at `arrivals` (seconds from 0) on `engine` (a `lib.batching.engine.LLMEngine`); returns latency
    and throughput.

    TTFT: arrival to first token. TBT: gaps between a request's tokens. Throughput: generated tokens per
    second from the first arrival to the last token. KV utilization: slots holding a token / slots in the
    running requests' blocks, averaged over steps, against two contiguous caches: one that reserves exactly
    prompt + max_new_tokens per request (lengths known in advance), one that reserves `prealloc_len`
    (the usual case: the answer's length is unknown). Idle time between arrivals is skipped (`SkipClock`), busy time is measured."""
    if not (len(prompts) == len(max_new_tokens) == len(arrivals)):
        raise ValueError("one prompt, max_new_tokens and arrival time per request")
    clock = SkipClock()
    engine.clock = clock
    order = sorted(range(len(prompts)), key=lambda i: arrivals[i])
    first_step = len(engine.step_stats)
    i = 0
    while i < len(order) or engine.has_unfinished():
        while i < len(order) and arrivals[order[i]] <= clock():
            r = order[i]
            engine.add_request(prompts[r], max_new_tokens[r], request_id=("load", r), arrival=arrivals[r])
            i += 1
        if not engine.has_unfinished():
            clock.advance_to(arrivals[order[i]])
            continue
        produced = engine.step()
        if progress is not None:
            progress.update(len(produced))
    reqs = [engine.requests[("load", r)] for r in range(len(prompts))]
    engine.finished_outputs()
    ttft = [r.first_token_time - r.arrival for r in reqs]
    tbt = [b - a for r in reqs for a, b in zip(r.token_times, r.token_times[1:])]
    end = max(r.token_times[-1] for r in reqs)
    stats = engine.step_stats[first_step:]
    used = sum(s["slots_used"] for s in stats)
    return dict(
        ttft=ttft, tbt=tbt, duration=end - min(arrivals),
        tokens_per_s=sum(len(r.output) for r in reqs) / (end - min(arrivals)),
        requests_per_s=len(reqs) / (end - min(arrivals)),
        kv_utilization=used / max(1, sum(s["slots_allocated"] for s in stats)),
        kv_utilization_preallocated=used / max(1, sum(s["slots_preallocated"] for s in stats)),
        kv_utilization_max_len=used / max(1, prealloc_len * sum(s["num_running"] for s in stats)),
        mean_batch=sum(s["num_seqs"] for s in stats) / max(1, len(stats)),
        preemptions=sum(r.num_preemptions for r in reqs),
    )
