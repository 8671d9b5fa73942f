"""lib.serve.queueing simulates the server whose mean TTFT week 21's `predict_ttft` models (the check's truth). Checked here
against what queueing theory says independently of it: with one slot the server is an M/D/1 queue (the
Pollaczek-Khinchine mean wait), with free prefills and fine steps an M/D/c one (a plain first-come-first-served
simulation of c servers), and past its capacity the mean has no limit."""
from __future__ import annotations

import heapq
import random

import pytest

from lib.serve.queueing import simulate, simulate_ttft


def test_one_slot_is_an_md1_queue():
    """S = prefill + n steps; mean wait rho S / (2 (1 - rho)); the first token comes at the end of the first step."""
    step, prefill, n = 0.05, 0.1, 16
    service = prefill + n * step
    for rho in (0.3, 0.6):
        rate = rho / service
        want = rho * service / (2 * (1 - rho)) + step + prefill
        got = simulate_ttft(rate, prefill, step, 1, n, n_requests=60_000, seed=3)
        assert got == pytest.approx(want, rel=0.06), (rho, got, want)


def _mdc_wait(rate: float, service: float, servers: int, n: int, seed: int) -> float:
    """Mean wait of an M/D/c queue, first come first served (each arrival takes the server that frees first)."""
    rng, free, t, wait = random.Random(seed), [0.0] * servers, 0.0, 0.0
    for _ in range(n):
        t += rng.expovariate(rate)
        start = max(t, heapq.heappop(free))
        wait += start - t
        heapq.heappush(free, start + service)
    return wait / n


def test_free_prefills_and_fine_steps_make_an_mdc_queue():
    """prefill_s = 0 and steps much shorter than a request: a slot is a server holding each request n * step."""
    servers, n, step = 4, 400, 1.0 / 400  # a request holds its slot for 1 s
    rate = 0.7 * servers
    want = _mdc_wait(rate, n * step, servers, 200_000, seed=1) + step  # + its own first step
    got = simulate_ttft(rate, 0.0, step, servers, n, n_requests=30_000, seed=2)
    assert got == pytest.approx(want, rel=0.1, abs=2 * step)


def test_every_first_token_costs_at_least_its_own_step():
    ttfts = simulate(3.0, 0.02, 0.01, 8, 12, n_requests=5_000, seed=0)
    assert min(ttfts) >= 0.01 + 0.02 - 1e-12


def test_past_the_capacity_the_mean_grows_with_the_run():
    """c / (n step + c prefill) requests per second at most: above it, more requests, longer waits."""
    step, prefill, c, n = 0.02, 0.05, 4, 16
    rate = 1.2 * c / (n * step + c * prefill)
    short, long = (simulate_ttft(rate, prefill, step, c, n, n_requests=k, seed=5) for k in (2_000, 8_000))
    assert long > 2.5 * short
    below = 0.6 * c / (n * step + c * prefill)
    short, long = (simulate_ttft(below, prefill, step, c, n, n_requests=k, seed=5) for k in (20_000, 80_000))
    assert long == pytest.approx(short, rel=0.1)
