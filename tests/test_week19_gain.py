"""Week 19, issue 56: the exercises the student now works out, through the isolated path.

Exercise 1, `continuous_gain` (predict: the throughput gain of continuous over static batching for a deep queue, from
the distribution of lengths and the number of slots), is graded on the student's model on distributions drawn per
run. Each route below is an ordinary function of this file; `child` sends their source to one isolated child process
(after the solution notebook's own cells), and the check gets proxies, as `pytest weeks/19` gives it a student's
code. The natural mistakes are each rejected with the hint that names them; an honest model written apart from the
solution (the distribution of the longest request enumerated batch by batch) passes; so does the solution.

The quiz answers each have their own exercise number now (`-k ex10` selected two tests); their natural mistakes
with the new exercise beside them (the deep-queue gain for the 64-request queue, the waste for the use) fail.
"""
import inspect
import json
import re
import textwrap
from pathlib import Path

import pytest

from grader.checks import week19 as checks
from grader.checks import week19_gain
from grader.harness import exercise_cells
from grader.isolation import Session

REPO = Path(__file__).resolve().parent.parent
NOTEBOOK = REPO / "solutions" / "19" / checks.WEEK.notebook


def _mean(lengths):
    return sum(n * p for n, p in lengths.items())


def _expected_longest(lengths, slots):
    """E[longest of `slots` draws], by convolving the law of the longest one draw at a time (no closed form)."""
    law = {0: 1.0}
    for _ in range(slots):
        nxt = {}
        for m, q in law.items():
            for n, p in lengths.items():
                k = max(m, n)
                nxt[k] = nxt.get(k, 0.0) + q * p
        law = nxt
    return sum(m * q for m, q in law.items())


def gain_apart(lengths, slots):
    return _expected_longest(lengths, slots) / _mean(lengths)


def longest_always(lengths, slots):
    """The seed's ceiling argument: every static batch as long as the longest possible request."""
    return max(lengths) / _mean(lengths)


def unweighted_mean(lengths, slots):
    return _expected_longest(lengths, slots) / (sum(lengths) / len(lengths))


def cdf_not_differenced(lengths, slots):
    cdf, total = 0.0, 0.0
    for n, p in sorted(lengths.items()):
        cdf += p
        total += n * cdf ** slots
    return total / _mean(lengths)


def upside_down(lengths, slots):
    return _mean(lengths) / _expected_longest(lengths, slots)


def one_slot_fewer(lengths, slots):
    return _expected_longest(lengths, max(1, slots - 1)) / _mean(lengths)


def sampled_queue(lengths, slots):
    """A simulation: a queue of 20,000 requests drawn from the distribution, static against continuous steps."""
    import random

    rng = random.Random(0)
    queue = rng.choices(list(lengths), weights=list(lengths.values()), k=20_000)
    static = sum(max(queue[i:i + slots]) for i in range(0, len(queue), slots))
    return static / (sum(queue) / slots)


def q3_deep_queue():
    """Q3 answered with the deep-queue model instead of the 64 requests' own step counts."""
    return gain_apart({50: 0.5, 200: 0.5}, 8)


def q1_waste():
    """Q1 answered with the share of empty slots, not the share in use."""
    return 28 / (258 * 16)


ROUTES = [_mean, _expected_longest, gain_apart, longest_always, unweighted_mean, cdf_not_differenced, upside_down,
          one_slot_fewer, sampled_queue, q3_deep_queue, q1_waste]


@pytest.fixture(scope="module")
def child(tmp_path_factory):
    cells = [src for _, _, src in exercise_cells(json.loads(NOTEBOOK.read_text()))]
    source = "\n\n".join(textwrap.dedent(inspect.getsource(r)) for r in ROUTES)
    session = Session(tmp_path_factory.mktemp("nb") / "week19_gain.ipynb", view=checks.WEEK.view(), call_timeout=300)
    session.load([(i, None, src) for i, src in enumerate(cells)] + [(len(cells), None, source)])
    yield session
    session.close()


def test_the_honest_models_pass(child):
    checks.check_continuous_gain(child.get("continuous_gain"))  # the solution's
    checks.check_continuous_gain(child.get("gain_apart"))  # the law of the longest request, convolved


@pytest.mark.parametrize("name, match", [
    ("longest_always", "as long as the longest possible request"),
    ("unweighted_mean", "plain mean of the lengths"),
    ("cdf_not_differenced", r"P\(max <= l\), not P\(max = l\)"),
    ("upside_down", "upside down"),
    ("one_slot_fewer", "holds S requests, not S - 1"),
    ("sampled_queue", "close, not exact: a simulation"),
])
def test_continuous_gain_rejects(child, name, match):
    with pytest.raises(AssertionError, match=match) as err:
        checks.check_continuous_gain(child.get(name))
    assert "seed" in str(err.value)  # the run's seed, to reproduce it


def test_each_drawn_case_tells_the_mistakes_apart():
    """The drawn cases are kept only where every natural mistake misses by more than 2 %: on 200 seeds' cases, the
    model and each mistake differ by that much (a bound the 1e-6 tolerance is far inside)."""
    import random

    for seed in range(200):
        dist, slots = week19_gain.draw(random.Random(seed))
        assert abs(sum(dist.values()) - 1) < 1e-9 and 2 <= slots <= 24
        want = week19_gain.gain(dist, slots)
        assert want >= 1 - 1e-12
        assert all(abs(v - want) > 0.02 * want for _, v in week19_gain.mistakes(dist, slots))


def test_the_model_is_the_long_run_of_the_step_count():
    """The model the check holds the student to is what lib's step count of a deep queue converges on (a test of the
    check's reference against a measurement it did not derive from)."""
    import random

    from lib.batching.engine import simulate_steps

    rng = random.Random(3)
    for dist, slots in [({4: 0.5, 16: 0.5}, 4), ({3: 0.7, 40: 0.2, 90: 0.1}, 6)]:
        queue = rng.choices(list(dist), weights=list(dist.values()), k=60_000)
        measured = simulate_steps(queue, slots, "static") / simulate_steps(queue, slots)
        assert abs(measured / week19_gain.gain(dist, slots) - 1) < 0.02


@pytest.mark.parametrize("name, check", [("q3_deep_queue", "check_answer_q3"), ("q1_waste", "check_answer_q1")])
def test_quiz_mistakes_are_rejected(child, name, check):
    with pytest.raises(AssertionError):
        getattr(checks, check)(child.get(name))


def test_every_week19_exercise_has_its_own_number():
    """`pytest weeks/19 -k exNN` selects one exercise: no two share a number (answer_q1 and answer_q3 were both 10)."""
    numbers = [number for number, _ in checks.WEEK.exercises.values()]
    assert sorted(numbers) == list(range(1, len(numbers) + 1))
    tests = re.findall(r"^def (test_ex(\d\d)_\w+)", (REPO / "solutions" / "19" / "test_week19.py").read_text(), re.M)
    assert len({n for _, n in tests}) == len(tests) == len(numbers)
