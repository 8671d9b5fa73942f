"""lib.bench.timing: figures that know when they were disturbed (no wall-clock assertions: the clock is not what is tested,
the bookkeeping around it is)."""
from lib.bench.timing import Conditions, Timed, interleaved, not_monotone, report, warning


def test_interleaved_calls_each_in_turn_starting_from_the_next_each_round():
    calls = []
    out = interleaved({n: (lambda n=n: calls.append(n)) for n in "abc"}, repeats=3, warmup=1)
    assert calls == list("abc") + list("abc") + list("bca") + list("cab")
    assert {n: len(t.samples) for n, t in out.items()} == {"a": 3, "b": 3, "c": 3}


def test_a_quiet_run_gets_no_warning_and_a_busy_or_spread_one_does():
    quiet = Conditions(load_before=0.1, load_after=2.1, cores=2, threads=2)  # our own two threads after
    steady = {"x": Timed("x", [1.0, 1.05, 1.1])}
    assert not quiet.busy and warning(steady, quiet) is None
    busy = Conditions(load_before=3.0, load_after=5.0, cores=2, threads=2)
    assert busy.busy and "other work kept the load at 3.0 on 2 cores" in warning(steady, busy)
    spread = {"x": Timed("x", [1.0, 1.9, 1.2])}
    line = warning(spread, quiet)
    assert line.startswith("measurement disturbed") and "'x' spread 1.90×" in line and "rerun" in line
    table = report(spread, quiet, unit="ms")
    assert "1e+03" in table and "1.9e+03" in table and "load average 0.10 → 2.10 on 2 cores" in table
    assert table.splitlines()[-1] == line


def test_a_curve_that_must_rise_and_falls_is_a_disturbance():
    assert not_monotone([1, 2, 3, 4], [1.0, 1.2, 1.19, 1.6], "verify cost") is None  # within 5 %
    line = not_monotone([1, 2, 3, 4], [0.78, 0.46, 2.03, 0.63], "the verify cost")
    assert line.startswith("measurement disturbed: the verify cost falls from 0.78 at 1 to 0.46 at 2")


def test_a_verify_curve_that_no_machine_can_give_is_a_disturbance():
    from lib.bench.timing import impossible_verify_curve

    assert impossible_verify_curve({1: 1.0, 2: 1.55, 3: 1.85, 4: 1.41, 16: 1.56}) is None  # a real, non-monotone one
    line = impossible_verify_curve({1: 0.78, 2: 0.46, 3: 2.03, 4: 0.63})  # measured under load, 2026-12
    assert line.startswith("measurement disturbed") and "m = 1: 0.78 steps" in line and "m = 2: 0.46" in line
    assert "m = 3" not in line  # 2.03 steps for 3 tokens is possible
