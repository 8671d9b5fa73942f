"""grader.ran's switches by other spellings (the gaps grader/README listed after the fourth red-team round): a
comparison spelled as a call (`operator.lt`, `j.__gt__`, `np.greater`), a maximum by another name (`builtins.max`,
`np.maximum` of scalars) and a clamp at zero of a shifted size (`max(0, n - 1024)`) must come out more than one way
while the checks run; honest spellings that do, or that only guard a degenerate value, pass."""
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
])
def test_an_honest_spelling_passes(source, calls):
    assert _judge(source, calls, "f") is None
