"""Week 21's "near" tolerance for `predict_ttft` (grader/checks/week21.py: TTFT_TOLERANCE["near"] = 1.4, a simulation
of TTFT_REQUESTS["near"] requests as the truth) leaves a correct model more than 5 standard deviations of the
simulation's own spread, so that it fails < 1e-6 of runs: the spread the comment at the constants states, and the
solution's bias on configurations the check draws. Fixed seeds throughout."""
from __future__ import annotations

import json
import math
import random
import statistics
from pathlib import Path

from grader.checks import week21
from lib.serve.queueing import simulate_ttft

REPO = Path(__file__).resolve().parent.parent


def _solution_predict_ttft():
    nb = json.loads((REPO / "solutions" / "21" / "week21_serving.ipynb").read_text())
    source = next("".join(c["source"]) for c in nb["cells"]
                  if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == "predict_ttft")
    namespace = {"math": math}  # imported in an earlier cell
    exec(compile(source, "predict_ttft", "exec"), namespace)
    return namespace["predict_ttft"]


def _at(load: float, slots: int, rng: random.Random) -> dict:
    """A configuration as `_ttft_case("near")` draws it, at this load and slot count."""
    step, n = rng.uniform(0.01, 0.1), rng.randint(16, 64)
    prefill = rng.uniform(0.2, 1.0) * n * step / slots
    return dict(rate=load * week21.capacity(prefill, step, slots, n), prefill_s=prefill, step_s=step,
                max_num_seqs=slots, max_tokens=n)


def test_the_near_simulations_spread_is_what_the_tolerance_was_sized_on():
    """At the highest load "near" draws (0.92), the relative standard deviation of the simulated mean, measured on 16
    seeds of 100,000 requests and scaled by sqrt(100,000 / TTFT_REQUESTS["near"]) (the queue forgets in thousands of
    requests), is at most TTFT_NEAR_REL_SD. Fails if the simulation is cut back (at 200,000 requests: 0.035)."""
    w = _at(0.92, 8, random.Random(7))
    sims = [simulate_ttft(**w, n_requests=100_000, seed=s) for s in range(16)]
    rel_sd = statistics.stdev(sims) / statistics.fmean(sims) * math.sqrt(100_000 / week21.TTFT_REQUESTS["near"])
    assert rel_sd <= week21.TTFT_NEAR_REL_SD, rel_sd


def test_a_correct_model_is_more_than_five_sigma_inside_the_near_tolerance():
    """The solution's model against the check's own simulation (TTFT_REQUESTS["near"] requests), at the loads and
    slot counts where its bias is largest (8 slots) and the spread largest (0.92): |log(prediction / simulation)|
    plus 5 sigma stays within log(TTFT_TOLERANCE["near"]). Fails at a tolerance of 1.2, or with a model 15 % low."""
    predict = _solution_predict_ttft()
    limit = math.log(week21.TTFT_TOLERANCE["near"]) - 5 * week21.TTFT_NEAR_REL_SD
    rng = random.Random(11)
    for load, slots in ((0.85, 8), (0.92, 8), (0.92, 1)):
        w = _at(load, slots, rng)
        truth = simulate_ttft(**w, n_requests=week21.TTFT_REQUESTS["near"], seed=rng.randrange(2**31))
        assert abs(math.log(predict(**w) / truth)) <= limit, (load, slots, predict(**w) / truth, math.exp(limit))
