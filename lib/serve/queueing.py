"""A step-level model of a continuous-batching server, simulated (week 21: predicting TTFT under a load).

    simulate_ttft(rate=2.0, prefill_s=0.1, step_s=0.05, max_num_seqs=8, max_tokens=16)   # mean TTFT, seconds

The server it simulates keeps these rules (week 21's notebook states them; the check of `predict_ttft` compares a
student's prediction with this simulation on configurations drawn at random):

- requests arrive as a Poisson process at `rate` per second, each asking for `max_tokens` tokens (none stops early);
- the engine runs steps back to back while it has work; at the start of a step it admits waiting requests, oldest
  first, while fewer than `max_num_seqs` run;
- a step costs `step_s` (one decode of every running request: the weights are read once whatever the batch) plus
  `prefill_s` for each request admitted in it (a prompt's prefill is work the batch does not share);
- a request admitted in a step has its first token at that step's end, then one token per step; it leaves after the
  step of its last token (`max_tokens` steps in all), and its slot is free for the next step;
- a request that arrives while a step runs waits for that step to end; one that arrives when the engine is idle
  starts a step at once.

TTFT is the time from a request's arrival to its first token. The simulation jumps over runs of identical decode
steps (nothing is admitted until the next arrival or the next finish), so 50,000 requests take a fraction of a
second. It is the truth a model is judged against, not a model: it says nothing about why.
"""
from __future__ import annotations

import math
import random


def simulate_ttft(rate: float, prefill_s: float, step_s: float, max_num_seqs: int, max_tokens: int,
                  n_requests: int = 50_000, seed: int = 0, warmup: float = 0.05) -> float:
    """The mean TTFT (seconds) of `n_requests` requests under the rules above, leaving out the first `warmup` share
    (the server starts empty). Above the server's capacity the mean grows with `n_requests`: it has no limit."""
    ttfts = simulate(rate, prefill_s, step_s, max_num_seqs, max_tokens, n_requests, seed)
    skip = int(warmup * n_requests)
    return math.fsum(ttfts[skip:]) / (n_requests - skip)


def simulate(rate: float, prefill_s: float, step_s: float, max_num_seqs: int, max_tokens: int, n_requests: int,
             seed: int = 0) -> list[float]:
    """Each request's TTFT, in order of arrival."""
    if rate <= 0 or step_s <= 0 or prefill_s < 0 or max_num_seqs < 1 or max_tokens < 1 or n_requests < 1:
        raise ValueError("rate and step_s must be positive, prefill_s >= 0, max_num_seqs, max_tokens, n_requests >= 1")
    rng = random.Random(seed)
    arrivals, t = [], 0.0
    for _ in range(n_requests):
        t += rng.expovariate(rate)
        arrivals.append(t)
    ttft = [0.0] * n_requests
    admitted = queued = 0  # arrivals[admitted:queued] wait; arrivals[queued:] have not come yet
    running: list[int] = []  # steps left to each running request
    now = 0.0  # the start of the next step (or the moment the engine went idle)
    while admitted < n_requests:
        if not running and admitted == queued:  # idle: the next arrival starts a step at once
            now = max(now, arrivals[queued])
            queued += 1
        k = min(queued - admitted, max_num_seqs - len(running))
        if k > 0:  # a step that admits k requests: their prefills, everyone's decode
            now += step_s + prefill_s * k
            for i in range(admitted, admitted + k):
                ttft[i] = now - arrivals[i]
            admitted += k
            running = [r - 1 for r in running + [max_tokens] * k if r > 1]
        else:  # decode steps only, until a slot frees (someone waits) or the next arrival
            m = min(running)
            if queued == admitted and queued < n_requests:
                m = max(1, min(m, math.ceil((arrivals[queued] - now) / step_s)))
            now += m * step_s
            running = [r - m for r in running if r > m]
        while queued < n_requests and arrivals[queued] <= now:
            queued += 1
    return ttft
