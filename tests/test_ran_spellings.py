"""grader.ran's switches by other spellings (the gaps grader/README listed after the fourth red-team round): a
comparison spelled as a call (`operator.lt`, `j.__gt__`, `np.greater`), a maximum by another name (`builtins.max`,
`np.maximum` of scalars) and a clamp at zero of a shifted size (`max(0, n - 1024)`) must come out more than one way
while the checks run; and (the fifth round) a quotient by a size must not be 0 every time (`n // 8192`), a remainder
by a large modulus must wrap, and a slice bounded by a size must cut a part at least once (`p[:64]`, `r[8:] = 0.0`);
and a maximum or comparison through an alias (`pick = max`, bound before or after the function, `from builtins import
max as most`, `below = operator.lt`) or a clamp at zero shifted by a named constant (`max(0, n - LIMIT)`, `LIMIT = 1024`)
is judged as its plain spelling. Honest spellings that do, or that only guard a degenerate value, pass; and (red team
12's h2/h3) a guard whose block only returns an empty list, tuple or dict need not run."""
import importlib.util
from pathlib import Path

import pytest


def _test_ran():
    """tests/test_ran.py, whose `_judge` runs a cell's calls under the trace function and judges them (the tests run
    with --import-mode=importlib: a sibling is loaded by its path)."""
    spec = importlib.util.spec_from_file_location("test_ran_judge", Path(__file__).with_name("test_ran.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_judge = _test_ran()._judge


@pytest.mark.parametrize("source,calls,said", [
    ("import operator\ndef f(j):\n    return 3 * operator.lt(j, 512)\n", "f(3); f(4)", "`operator.lt(j, 512)` was True"),
    ("from operator import gt\ndef f(n):\n    return ('a', 'b')[gt(n, 4096)]\n", "f(3)", "`gt(n, 4096)` was False"),
    ("def f(j):\n    return ('a', 'b')[j.__ge__(512)]\n", "f(3); f(7)", "`j.__ge__(512)` was False"),
    ("import numpy as np\ndef f(n):\n    return ('a', 'b')[int(np.greater(n, 4096))]\n", "f(3)", "was False"),
    ("import builtins\ndef f(n, b=64):\n    return builtins.max(b, n - 1024)\n", "f(3); f(70)", "took only argument 1"),
    ("import numpy as np\ndef f(n, b=64):\n    return int(np.maximum(b, n - 1024))\n", "f(3); f(70)",
     "took only argument 1"),
    ("from numpy import fmin\ndef f(n, b=64):\n    return int(fmin(b, 4096 - n))\n", "f(3)", "took only argument 1"),
    ("def f(n, b=64):\n    return b + max(0, n - 1024)\n", "f(3); f(70)", "took only argument 1"),  # a shifted clamp
    # the fifth round (tests/fixtures/redteam/FINDINGS5.md): a size threshold in a quotient or a slice's bound
    ("def f(n, bs=16):\n    return -(-32 // bs) * (1 + (n // 8192) * n)\n", "f(3); f(900)", "`n // 8192` was 0"),
    ("def f(grp):\n    return grp - (grp // 7) * (grp - 1)\n", "f(1); f(2); f(4)", "`grp // 7` was 0"),
    ("def f(k, m):\n    return min(k, 9) * (1 // (1 + m // 128))\n", "f(4, 3); f(2, 100)", "`m // 128` was 0"),
    ("def f(n):\n    return n >> 13\n", "f(3); f(4000)", "`n >> 13` was 0"),
    ("def f(n):\n    return n % 8192\n", "f(3); f(4000)", "never wrapped"),
    ("def f(p):\n    return sum(p[:64])\n", "f([1, 2]); f(list(range(40)))", "`p[:64]` took all"),
    ("def f(t):\n    recent = t[-512:]\n    return recent\n", "f([1, 2, 3])", "took all"),
    ("def f(r):\n    r[8:] = 0.0\n    return r\n", "f(torch.ones(3)); f(torch.ones(8))", "`r[8:]` took none"),
    ("def f(x):\n    return x[..., :64].sum()\n", "f(torch.ones(2, 5)); f(torch.ones(3, 64))", "took all"),
    ("def f(q):\n    todo, q[:] = q[:16], q[16:]\n    return todo\n", "f([1, 2]); f([3] * 9)", "took all"),
    # the spellings grader/README listed as not seen after the fifth round: an alias, bound after the function that
    # calls it or imported under another name, and a clamp at zero shifted by a named constant
    ("def f(n, b=64):\n    return pick(b, n - 1024)\n\npick = max\n", "f(3); f(70)", "took only argument 1"),
    ("import builtins\ndef f(n, b=64):\n    return top(b, n - 1024)\n\ntop, low = builtins.max, min\n", "f(3)",
     "took only argument 1"),
    ("from builtins import max as most\ndef f(n, b=64):\n    return most(b, n - 1024)\n", "f(3)", "took only argument 1"),
    ("import operator\nbelow = operator.lt\ndef f(j):\n    return 3 * below(j, 512)\n", "f(3); f(4)", "was True"),
    ("LIMIT = 1024\ndef f(n, b=64):\n    return b + max(0, n - LIMIT)\n", "f(3); f(70)", "took only argument 1"),
    ("def f(n, tbt=0.01):\n    far = 1000\n    return 0.5 * tbt * max(0, n - far)\n", "f(3); f(800)", "took only argument 1"),
])
def test_a_switch_by_another_spelling_is_named(source, calls, said):
    why = _judge(source, calls, "f")
    assert why is not None and said in why, why


@pytest.mark.parametrize("source,calls", [
    ("import operator\ndef f(j):\n    return 3 * operator.lt(j, 512)\n", "f(3); f(600)"),  # both ways
    ("import numpy as np\ndef f(n, b=64):\n    return int(np.maximum(b, n - 1024))\n", "f(3); f(2000)"),
    ("import numpy as np\ndef f(x, y):\n    return np.maximum(x, y).sum()\n", "f(np.ones(3), np.zeros(3))"),  # arrays
    ("import torch\ndef f(x):\n    return torch.lt(x, 0.5).sum()\n", "f(torch.rand(4))"),  # a tensor of comparisons
    ("def f(end, window=4):\n    return max(0, end - window)\n", "f(2)"),  # a clamp at zero, of no literal shift
    ("def f(n):\n    return max(0, n - 1)\n", "f(3)"),  # shifted by one: a guard
    ("def f(bs):\n    return max(1, 32 // bs)\n", "f(8)"),  # a clamp
    ("import numpy as np\ndef f(x):\n    return np.max(x, 0)\n", "f(np.ones((2, 3)))"),  # an axis, not a pick
    ("def f(n):\n    return n // 8192\n", "f(3); f(9000)"),  # both ways
    ("def f(n, bs=16):\n    return -(-n // bs)\n", "f(3)"),  # by a parameter: the caller's size
    ("def f(i):\n    return i % 2\n", "f(0); f(1)"),  # a parity: a small modulus is structure, not a threshold
    ("def f(t):\n    return t[-512:]\n", "f([1, 2, 3]); f(list(range(600)))"),  # it cut once
    ("def f(t, n):\n    return t[-n:]\n", "f([1, 2], 3)"),  # the caller's bound
    ("def f(x):\n    return x[:-1], x[1:]\n", "f([1])"),  # by one: no threshold
    ("def f(x):\n    return x[:, :2]\n", "f(torch.ones(3, 5))"),  # a part every time
    ("def f(n, b=64):\n    return pick(b, n - 1024)\n\npick = max\n", "f(3); f(2000)"),  # an alias, both ways
    ("def mine(a, b):\n    return a\n\npick = mine\ndef f(n):\n    return pick(n, 4096)\n", "f(3)"),  # not a max
    ("LIMIT = 1024\ndef f(n):\n    return max(0, n - LIMIT)\n", "f(3); f(2000)"),  # the named shift, both ways
    ("def f(end, window=4):\n    span = 1\n    return max(0, end - window - span)\n", "f(2)"),  # by one: a guard
])
def test_an_honest_spelling_passes(source, calls):
    assert _judge(source, calls, "f") is None


def test_the_quotient_and_slice_probes_keep_the_codes_meaning():
    """What `compile_cell` makes of quotients, remainders and slices (read, written, augmented) gives what `compile`
    does, each operand evaluated once."""
    import textwrap

    LinesRun = _test_ran().LinesRun
    source = textwrap.dedent("""
        import torch

        class Box:
            def __init__(self):
                self.k = torch.zeros(2, 6)
                self.calls = 0

            def seq(self):
                self.calls += 1
                return [1, 2, 3, 4, 5]

        def values():
            b, r = Box(), torch.arange(10.0)
            r[8:] = 0.0
            r[1:3] += 5
            b.k[:, :2] = 1.0
            s = "abcdef"
            return [r.tolist(), b.k.tolist(), b.seq()[1:4], b.seq()[-512:], b.calls, s[-3:], s[::2], 17 // 5, -17 // 5,
                    17 % 5, "%d-%s" % (3, "x"), 1 << 4 >> 2, 7.5 // 2, torch.tensor(9) // 2, r[..., :3].tolist()]
    """)
    plain, probed = {}, {}
    exec(compile(source, "nb.ipynb[cell 1]", "exec"), plain)
    exec(LinesRun(_test_ran()._Child()).compile_cell(source, "nb.ipynb[cell 1]"), probed)
    assert probed["values"]() == plain["values"]()


def test_a_guard_that_returns_an_empty_result_need_not_run_but_its_test_is_still_judged():
    """`if not outs: return []` (red team 12's h3): an input the checks never draw, answered with an empty result,
    which is no route to credit. A threshold in the test is still a switch the checks must flip, and `return None`
    (a caller's `if r is None:` is an optional block of its own) is judged as before."""
    guarded = """
        def f(prompts, k=4):
            outs = [list(p) + [k] for p in prompts]
            if not outs:
                return []
            outs[0] += [k * k]
            return outs
    """
    assert _judge(guarded, "f([[1, 2], [3]])", "f") is None
    for gate, said in (("if len(prompts) > 4096:\n                return []", "was False every time"),
                       ("if not outs:\n                return None", "return None"),
                       ("if not outs:\n                return [0]", "return [0]")):
        source = guarded.replace("if not outs:\n                return []", gate)
        why = _judge(source, "f([[1, 2], [3]])", "f")
        assert why is not None and said in why, (gate, why)
