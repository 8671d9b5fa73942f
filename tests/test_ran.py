"""grader.ran: an exercise's code must all run while its checks run (a route switched on only above the sizes the
checks draw earns nothing), with the exemptions the module names: lines that only raise, branches on what the caller
passes, guards for a degenerate value.

The first tests judge small functions in this process (a stand-in for the child: the trace function and the
judgement are the same code); the last ones grade the red team's size-switching notebooks
(tests/fixtures/redteam/v, section A of its FINDINGS.md) through the isolated path, as `pytest weeks/NN` does.
"""
import json
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
import torch

from grader.harness import load_exercises, with_cell_source
from grader.ran import LinesRun

REPO = Path(__file__).resolve().parent.parent
RED = REPO / "tests" / "fixtures" / "redteam" / "v"


class _Child:
    def __init__(self):
        self.cell_files = {"nb.ipynb[cell 1]": 1}
        self.current_root = None
        self.module = None
        self.guard = types.SimpleNamespace(compiled={"<hidden>"})  # the file names the notebook compiled code under


def _judge(source: str, calls: str, name: str, exercises=None) -> str | None:
    """Run `calls` (under root `name`) against the cell `source`, and judge exercise `name`."""
    child = _Child()
    ran = LinesRun(child)
    source = textwrap.dedent(source)
    ran.remember([(1, "cell", source)])
    module = types.ModuleType("nb")
    module.torch = torch
    exec(ran.compile_cell(source, "nb.ipynb[cell 1]"), module.__dict__)
    child.module = module
    child.current_root = name
    previous = sys.gettrace()
    sys.settrace(ran.trace)
    try:
        exec(textwrap.dedent(calls), module.__dict__)
    finally:
        sys.settrace(previous)
    return ran.unreached(name, exercises or [name])


SOFTMAX = """
    def _rows(x):
        m = x.amax(-1, keepdim=True)
        e = (x - m).exp()
        return e / e.sum(-1, keepdim=True)

    def softmax(x):
        if x.shape[-1] > 4096:
            return torch.softmax(x, -1)
        return _rows(x)
"""


def test_a_branch_for_larger_sizes_is_named_with_its_line():
    why = _judge(SOFTMAX, "softmax(torch.randn(3, 5))", "softmax")
    assert why is not None and "cell 1 line 9" in why and "torch.softmax" in why
    assert _judge(SOFTMAX, "softmax(torch.randn(3, 5)); softmax(torch.randn(2, 5000))", "softmax") is None


@pytest.mark.parametrize("body", [
    "return torch.softmax(x, -1) if x.shape[-1] > 4096 else _rows(x)",
    "return (x.shape[-1] > 4096 and torch.softmax(x, -1)) or _rows(x)",
    "return ([torch.softmax(x, -1) for _ in range(int(x.shape[-1] > 4096))] + [_rows(x)])[0]",
    "return {True: lambda: torch.softmax(x, -1), False: lambda: _rows(x)}[x.shape[-1] > 4096]()",
])
def test_a_switch_inside_one_line_is_seen_by_the_instructions_that_ran(body):
    source = SOFTMAX.split("    def softmax")[0] + f"\n    def softmax(x):\n        {body}\n"
    why = _judge(source, "softmax(torch.randn(3, 5))", "softmax")
    assert why is not None and "never ran" in why


def test_helpers_are_judged_whether_named_or_reached_through_a_table():
    source = """
        def _tiled(x):
            return x * 2

        def _naive(x):
            return x * 2

        _ROUTES = {"small": _tiled, "big": _naive}

        def double(x):
            return _ROUTES["big" if x.numel() > 1 << 20 else "small"](x)
    """
    why = _judge(source, "double(torch.ones(3))", "double")
    assert why is not None and "line 6" in why  # _naive's body


def test_a_helper_is_judged_with_the_exercise_that_names_it_only():
    source = """
        def other(x):
            return _shared(x)

        def _shared(x):
            return x + 1

        def _leftover(x):
            return x - 1

        def mine(x):
            return x * 2
    """
    assert _judge(source, "mine(torch.ones(2))", "mine", ["mine", "other"]) is None  # _shared is other's, _leftover no one's
    why = _judge(source, "other(torch.ones(2)) if False else None", "other", ["mine", "other"])
    assert why is not None and "line 6" in why


def test_the_callers_choices_and_errors_are_exempt():
    source = """
        def f(x, scale=None, out=None, dim=-1):
            if x.dim() == 3:
                x = x.reshape(-1, x.shape[-1])
            if x.dim() != 2:
                msg = f"x must be 2-D, got {tuple(x.shape)}"
                raise ValueError(msg)
            if out is not None:
                out.copy_(x)
                return out
            if scale is None:
                scale = 1.0
            if not isinstance(x, torch.Tensor):
                x = torch.as_tensor(x)
            y = x * scale if x.dtype == torch.float32 else x.float() * scale
            return y
    """
    assert _judge(source, "f(torch.ones(2, 3))", "f") is None


def test_a_branch_for_cuda_must_run_like_any_other():
    """The checks run on the CPU (and the meta device): a CUDA branch is code they never run, and where a wrong route
    would matter most (red team round 3, #8)."""
    source = """
        def f(x):
            if x.device.type == "cuda":
                return torch.softmax(x, -1)
            return x * 2
    """
    why = _judge(source, "f(torch.ones(3))", "f")
    assert why is not None and "torch.softmax" in why


def test_a_caller_choice_exempts_only_a_block_that_never_ran():
    source = """
        def f(x, out=None):
            if out is None:
                y = x * 2
                if x.numel() > 4096:
                    y = torch.softmax(x, -1)
                return y
            out.copy_(x)
            return out
    """
    why = _judge(source, "f(torch.ones(3))", "f")
    assert why is not None and "line 6" in why and "line 8" not in why


def test_a_guard_for_a_degenerate_value_is_exempt_but_not_a_threshold_in_disguise():
    source = """
        def f(p, q, n):
            if n == 0:
                return None
            resid = (p - q).clamp_min(0)
            if float(resid.sum()) <= 0:
                resid = p.clone()
            return resid
    """
    assert _judge(source, "f(torch.rand(4), torch.zeros(4), 3)", "f") is None
    for gate in ("big = n - 4096\n            if big > 0:", "d = n * n\n            if n - d > 0:",
                 "if n - LIMIT > 0:", "if _excess(n) > 0:", "big = 0\n            for _ in range(2):\n                if big > 0:\n"
                 "                    resid = p.clone()\n                big = n - 4096\n            if False:"):
        disguised = f"""
        LIMIT = 4096

        def _excess(n):
            return n - LIMIT

        def f(p, q, n):
            resid = (p - q).clamp_min(0)
            {gate}
                resid = p.clone()
            return resid
        """
        why = _judge(disguised, "f(torch.rand(4), torch.zeros(4), 3); _excess(3)", "f")
        assert why is not None and "resid = p.clone()" in why, gate


def test_a_tuple_assignment_taints_each_name_by_its_own_value():
    """`nk, wide = k.shape[2], promote_types(...)`: nk is a size read off the input, its zero guard is exempt; the
    name paired with a threshold is not (the honest flash_decode of tests/week17_variants.py)."""
    source = """
        def f(k):
            nk, wide = k.shape[0], torch.promote_types(k.dtype, torch.float32)
            size = nk // 2 if nk else 1
            return size, wide
    """
    assert _judge(source, "f(torch.ones(4))", "f") is None
    disguised = source.replace("nk, wide = k.shape[0]", "nk, wide = k.shape[0] - 4096")
    why = _judge(disguised, "f(torch.ones(4))", "f")
    assert why is not None and "line 4" in why


def test_a_guard_on_the_objects_state_is_not_exempt():
    source = """
        class Cache:
            def __init__(self, limit=4096):
                self.limit = limit
                self.n = 0

            def add(self, k):
                self.n += k
                if self.n - self.limit > 0:
                    return torch.zeros(self.n)
                return None
    """
    why = _judge(source, "c = Cache(); c.add(3)", "Cache")
    assert why is not None and "torch.zeros(self.n)" in why


def test_code_compiled_from_text_while_the_notebook_runs_cannot_hide_a_route():
    source = """
        exec(compile("def _route(x):\\n    return x * 2 if x.numel() < 4096 else torch.softmax(x, -1)\\n",
                     "<hidden>", "exec"), globals())

        def f(x):
            return _route(x)
    """
    why = _judge(source, "f(torch.ones(3))", "f")
    assert why is not None and "compiled from text" in why and "_route" in why


def test_lines_run_for_another_exercise_do_not_count():
    source = """
        def helper_user(x):
            return mine(x)

        def mine(x):
            if x.numel() > 10:
                return x * 3
            return x * 2
    """
    child = _Child()
    ran = LinesRun(child)
    ran.remember([(1, "cell", textwrap.dedent(source))])
    module = types.ModuleType("nb")
    exec(compile(textwrap.dedent(source), "nb.ipynb[cell 1]", "exec"), module.__dict__)
    child.module = module
    sys.settrace(ran.trace)
    try:
        child.current_root = "helper_user"
        module.helper_user(torch.ones(20))
        child.current_root = "mine"
        module.mine(torch.ones(2))
    finally:
        sys.settrace(None)
    why = ran.unreached("mine", ["mine", "helper_user"])
    assert why is not None and "return x * 3" in why


# --- switches: comparisons and min/max that never go the other way ----------------------------------------------

@pytest.mark.parametrize("source,calls,said", [
    ("def f(j):\n    return 3 * (j < 512)\n", "f(3); f(4)", "`j < 512` was True every time"),  # round 3, #9
    ("def f(x, end):\n    return (torch.Tensor.add, torch.Tensor.sub)[end > 4096](x, 1)\n", "f(torch.ones(2), 3)",
     "`end > 4096` was False every time"),  # a table of library methods (#5)
    ("def f(n, block=64):\n    return max(block, n - 1024)\n", "f(10); f(70)", "took only argument 1 of 2"),  # #7
    ("def f(live):\n    s = 0\n    for _ in range(1 + (len(live) > 8)):\n        s += 1\n    return s\n",
     "f([1, 2])", "`len(live) > 8` was False"),  # a loop's count (#21)
    ("def f(k, new):\n    return min(k, 9) * (new < 100)\n", "f(4, 3)", "`new < 100` was True"),  # #10
    ("def f(j):\n    fb = False\n    if j < 512:\n        fb = True\n    return fb\n", "f(3)", "`j < 512` was True"),
    ("import numpy as np\ndef f(j):\n    return 3 * (np.int64(j) < 512)\n", "f(3)", "was True"),  # numpy's bool
    # the fourth round (tests/fixtures/redteam/FINDINGS4.md): thresholds no taint sees, and switches by other names
    ('def f(end):\n    if f"{end:0>8}" > "00004096":\n        return 1\n    return 2\n', "f(3)", "was False"),
    ("def f(end):\n    from mmap import PAGESIZE\n    return ('a', 'b')[end > PAGESIZE]\n", "f(3)", "was False"),
    ("import numpy as np\ndef f(n, b=64):\n    return max(b, np.int64(n) - 1024)\n", "f(10)", "took only argument 1"),
    ("def f(end):\n    if end < 0 or (big := end > 4096) is None:\n        raise ValueError\n    return ('a', 'b')[big]\n",
     "f(3)", "`end > 4096` was False"),  # a walrus in the test of an `if` that raises
    ("def f(end):\n    for v in (torch.tensor(end), end):\n        x = v > 4096\n    return x\n", "f(3)",
     "`v > 4096` was False"),  # one tensor outcome does not exempt the plain ones
    ("def f(n, b=64):\n    return (b, n)[bool(n // 1025)]\n", "f(3)", "`bool(n // 1025)` = False"),
    ("_tile = lambda n, b: n if n > 1024 else b\ndef f(n):\n    return _tile(n, 64)\n", "f(3)", "conditional"),
    ('def f(n):\n    return {0: "detach"}.get(n // 1025, "contiguous")\n', "f(3); f(5)", "`n // 1025` = 0"),
    ("_FAR = dict.fromkeys(range(1, 4096), 0.0)\ndef f(j):\n    try:\n        keep = _FAR[j // 512]\n"
     "    except KeyError:\n        keep = 1.0\n    return keep\n", "f(3); f(4)", "`j // 512` = 0"),
    ("def f(n, b=64):\n    return sorted((b, n - 1024))[-1]\n", "f(3); f(5)", "in the same order every time"),
])
def test_a_switch_the_checks_never_flip_is_named(source, calls, said):
    why = _judge(source, calls, "f")
    assert why is not None and said in why, why


@pytest.mark.parametrize("source,calls", [
    ("def f(j):\n    return 3 * (j < 512)\n", "f(3); f(600)"),  # both ways
    ("def f(x):\n    return x * (x < 512)\n", "f(torch.ones(3))"),  # a tensor of comparisons: no switch
    ("def f(n):\n    if n > 4096:\n        raise ValueError('too long')\n    return n\n", "f(3)"),  # bad input errs
    ("def f(n, bs=16):\n    r = n % bs\n    out = n\n    if r > 0:\n        out = n + bs - r\n    return out\n",
     "f(5); f(7)"),  # `r > 0` always True: a guard for a zero
    ("def f(bs):\n    return max(1, 32 // bs)\n", "f(8)"),  # a clamp
    ("def f(n, block=16):\n    return [min(s + block, n) for s in range(0, n, block)]\n", "f(40)"),  # tiles
    ("def f(n, k=4):\n    out = []\n    while len(out) < n:\n        out += [0] * min(k, n - len(out))\n"
     "    return out\n", "f(10)"),
    ("def f(x, y=None):\n    return x if y is None else y\n", "f(2)"),
    ("def f(x, verbose=False):\n    for i in range(3):\n        if verbose and i % 100 == 0:\n            print(i)\n"
     "    return x\n", "f(1)"),  # the caller's flag turns the block off
    ("MIX = {1: 0.5, 2: 0.5}\nLONG = 2\ndef f(n):\n    return MIX[LONG] * n\n", "f(3)"),  # a constant key
    ("NAMES = ('k', 'v')\ndef f(n):\n    return [NAMES[i % 2] for i in range(n)]\n", "f(3)"),
    ("def f(a, b):\n    return sorted((a, b))[0]\n", "f(1, 2); f(3, 2)"),
    ("class Q:\n    def __init__(self):\n        self.queue = []\n    def f(self):\n"
     "        return len(self.queue) > 0 or False\n\ndef f():\n    return Q().f()\n", "f()"),  # an emptiness test
])
def test_a_switch_that_goes_both_ways_or_guards_a_degenerate_value_passes(source, calls):
    assert _judge(source, calls, "f") is None


def test_the_probes_keep_the_codes_meaning():
    """What `compile_cell` makes gives what `compile` does: chained comparisons, tensors, min/max with a key or
    of tensors, comparisons in a class body's comprehension, defaults, f-strings and `super()`."""
    source = textwrap.dedent("""
        import torch

        class Base:
            def size(self):
                return 3

        class Child(Base):
            LIMITS = [n for n in range(6) if n > 2]

            def size(self, big=5 > 4):
                return (super().size() > 2, big, f"{1 < 2 <= 2}")

        def values():
            x = torch.arange(4)
            return [(x > 1).tolist(), min([3, 1, 2], key=lambda v: -v), max(torch.tensor(2), torch.tensor(5)).item(),
                    min(4, 2, 9), max(1.5, 2), 1 < 3 > 2, 3 in (1, 3), "a" < "b", Child.LIMITS, Child().size(),
                    sorted([3, 1, 2], key=lambda v: v > 1)]
    """)
    plain, probed = {}, {}
    exec(compile(source, "nb.ipynb[cell 1]", "exec"), plain)
    exec(LinesRun(_Child()).compile_cell(source, "nb.ipynb[cell 1]"), probed)
    assert probed["values"]() == plain["values"]()


# --- through the isolated path ----------------------------------------------------------------------------------

def _release(week: str) -> tuple[Path, dict]:
    path = next((REPO / "weeks" / week).glob("week*.ipynb"))
    text = subprocess.run(["git", "show", f"HEAD:{path.relative_to(REPO)}"], cwd=REPO, capture_output=True,
                          text=True, check=True).stdout
    return path, json.loads(text)


# (week, grade id, the red team's file, the check) — each passed every check before the rule (FINDINGS.md, section A)
SIZE_SWITCHES = [
    ("16", "LayerKVCache", "w16_cache_cat_large.py", "check_LayerKVCache"),
    ("17", "online_softmax", "w17_softmax_big_torch.py", "check_online_softmax"),
    ("21", "ServingLoop", "w21_serving_busy_twosteps.py", "check_ServingLoop"),
    ("20", "quantize_q8_0", "w20_q8_npround_wide.py", "check_quantize_q8_0"),
]


# the five branch-free switches of the red team's third round (FINDINGS3.md #5, #7, #9, #10, #21)
SIZE_SWITCHES += [
    ("16", "LayerKVCache", "../v3/w16_cache_W3_table.py", "check_LayerKVCache"),
    ("17", "flash_attention_forward", "../v3/w17_flash_W5_maxblock.py", "check_flash_attention_forward"),
    ("18", "speculative_generate", "../v3/w18_spec_W8_nodraft100.py", "check_speculative_generate"),
    ("20", "gptq_quantize", "../v3/w20_gptq_W7_rtnwide.py", "check_gptq_quantize"),
    ("21", "ServingLoop", "../v3/w21_loop_W15_twosteps.py", "check_ServingLoop"),
    ("18", "expected_rejections", "../v5/w18_exprej_first64.py", "check_expected_rejections"),  # FINDINGS5.md #2
    ("21", "ServingLoop", "../v5/w21_loop_admit16.py", "check_ServingLoop"),
    ("19", "paged_attention", "../v5/w19_paged_rowpast8k.py", "check_paged_attention"),
    ("19", "blocks_needed", "../v5/w19_blocks_divmod.py", "check_blocks_needed"),
]


@pytest.mark.parametrize("week,grade_id,variant,check", SIZE_SWITCHES, ids=[s[2] for s in SIZE_SWITCHES])
def test_a_route_switched_on_above_the_checks_sizes_earns_nothing(tmp_path, week, grade_id, variant, check):
    import importlib

    path, release = _release(week)
    nb = with_cell_source(release, grade_id, (RED / variant).read_text())
    target = tmp_path / path.name
    target.write_text(json.dumps(nb))
    checks = importlib.import_module(f"grader.checks.week{week}")
    ex = load_exercises(target)
    try:
        # the checks' own sizes catch some (bytes allocated, a count past 2**53, week 21's uptime), the never-ran rule all
        with pytest.raises(AssertionError, match=r"never ran while its checks ran|allocated|a whole row|= \d+; expected|"
                                                 r"the loop object reaches"):
            getattr(checks, check)(getattr(ex, grade_id))
    finally:
        ex.close()


def test_a_formula_exercise_is_not_passed_by_a_simulation(tmp_path):
    """Week 21's `predict_ttft` by an event simulation of the stated rules (20,000 requests: the red team's #30,
    within the check's tolerance of the truth) fails on the lines of Python it runs, counted by grader.ran whatever
    the machine's load; a formula runs a few dozen per call."""
    from grader.checks import week21

    path, release = _release("21")
    nb = with_cell_source(release, "predict_ttft", (RED / "w21_ttft_simulate.py").read_text())
    target = tmp_path / path.name
    target.write_text(json.dumps(nb))
    ex = load_exercises(target)
    try:
        # the line budget, or (judged first) a comparison of the simulation's clock the checks never flip
        with pytest.raises(AssertionError, match=r"ran [\d,]+ lines of Python .* worked out, not simulated|"
                                                 r"the comparison `.*` was (True|False) every time|exactly M/D/1"):
            week21.check_predict_ttft(ex.predict_ttft)
    finally:
        ex.close()


# --- red team, round 3: routes past the first rule, and honest work it failed ------------------------------------

CACHE_HEAD = """
    class Cache:
        def __init__(self):
            self.k = torch.zeros(8)
            self.n = 0
"""


@pytest.mark.parametrize("route", [
    # one line: the test runs, the statement after the colon does not (#18)
    """
        def append(self, x):
            if self.n + len(x) > 4096: return torch.cat([self.k[:self.n], x])
            self.k[self.n:self.n + len(x)] = x
            self.n += len(x)
            return self.k[:self.n]
    """,
    # a number spelled as text, a class attribute, doubling, a threshold handed to a helper (#2, #4, #6, #12)
    """
        def append(self, x):
            if self.n + len(x) > int("4096"):
                return torch.cat([self.k[:self.n], x])
            self.k[self.n:self.n + len(x)] = x
            self.n += len(x)
            return self.k[:self.n]
    """,
    """
        BIG = 4096

        def append(self, x):
            if self.n + len(x) > self.BIG:
                return torch.cat([self.k[:self.n], x])
            self.k[self.n:self.n + len(x)] = x
            self.n += len(x)
            return self.k[:self.n]
    """,
    """
        def append(self, x):
            t = len(x)
            for _ in range(12):
                t = t + t
            if self.n > t:
                return torch.cat([self.k[:self.n], x])
            self.k[self.n:self.n + len(x)] = x
            self.n += len(x)
            return self.k[:self.n]
    """,
    """
        def append(self, x):
            return self._put(x, 4096)

        def _put(self, x, limit):
            if self.n + len(x) > limit:
                return torch.cat([self.k[:self.n], x])
            self.k[self.n:self.n + len(x)] = x
            self.n += len(x)
            return self.k[:self.n]
    """,
    # a result carried out of a block that ends in `raise` (#11)
    """
        def append(self, x):
            try:
                if self.n + len(x) > 4096:
                    raise _Held(torch.cat([self.k[:self.n], x]))
                self.k[self.n:self.n + len(x)] = x
                self.n += len(x)
                raise _Held(self.k[:self.n])
            except _Held as held:
                return held.args[0]
    """,
    # the wrong code in a default argument's lambda (#13)
    """
        def append(self, x, _big=lambda k, n, x: torch.cat([k[:n], x])):
            if self.n + len(x) > 4096:
                return _big(self.k, self.n, x)
            self.k[self.n:self.n + len(x)] = x
            self.n += len(x)
            return self.k[:self.n]
    """,
    # `__wrapped__` pointing elsewhere (#15, #20)
    """
        __wrapped__ = None

        def append(self, x):
            if self.n + len(x) > 4096:
                return torch.cat([self.k[:self.n], x])
            self.k[self.n:self.n + len(x)] = x
            self.n += len(x)
            return self.k[:self.n]
        append.__wrapped__ = None
    """,
], ids=["one-line", "int-text", "class-attr", "doubling", "passed-limit", "raise-carrier", "default-lambda",
        "wrapped"])
def test_round_three_routes_past_the_first_rule_fail(route):
    source = CACHE_HEAD + textwrap.indent(textwrap.dedent(route), "        ") + """
    class _Held(Exception):
        pass
"""
    why = _judge(source, "c = Cache(); c.append(torch.ones(2)); c.append(torch.ones(3))", "Cache")
    assert why is not None and "torch.cat" in why, why


def test_an_inherited_method_is_judged():
    """A wrong `append` in a base made with `type(...)`, its function deleted from the module (#17)."""
    source = """
        def _append(self, x):
            if self.n + len(x) > 4096:
                return torch.cat([self.k[:self.n], x])
            self.k[self.n:self.n + len(x)] = x
            self.n += len(x)
            return self.k[:self.n]

        _Base = type("_Base", (), {"append": _append})
        del _append

        class Cache(_Base):
            def __init__(self):
                self.k = torch.zeros(8)
                self.n = 0
    """
    why = _judge(source, "c = Cache(); c.append(torch.ones(2))", "Cache")
    assert why is not None and "torch.cat" in why


def test_round_three_honest_work_passes():
    """A debug flag, a `__repr__` nothing calls, a decorator of the cell's own, a rank test after a product (#31,
    #35, #36, #37)."""
    source = """
        import functools

        DEBUG = False

        def _no_grad(fn):
            @functools.wraps(fn)
            def run(*args, **kwargs):
                with torch.no_grad():
                    return fn(*args, **kwargs)
            return run

        class Cache:
            def __init__(self):
                self.k = torch.zeros(8)
                self.n = 0

            def __repr__(self):
                return f"Cache({self.n} of {self.k.numel()})"

            @_no_grad
            def append(self, x, scale=1.0):
                x = x * scale
                if x.dim() == 0:
                    x = x[None]
                if DEBUG:
                    print("append", x.shape)
                self.k[self.n:self.n + len(x)] = x
                self.n += len(x)
                return self.k[:self.n]
    """
    child = _Child()
    ran = LinesRun(child)
    source = textwrap.dedent(source)
    ran.remember([(1, "cell", source)])
    module = types.ModuleType("nb")
    module.torch = torch
    previous = sys.gettrace()
    sys.settrace(ran.trace)
    try:
        exec(compile(source, "nb.ipynb[cell 1]", "exec"), module.__dict__)  # the cell loads: the decorator runs
        child.module, child.current_root = module, "Cache"
        exec("c = Cache(); c.append(torch.ones(2)); c.append(torch.ones(3))", module.__dict__)
    finally:
        sys.settrace(previous)
    assert ran.unreached("Cache", ["Cache"]) is None
