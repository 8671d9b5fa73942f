"""A hostile class, attention by routes the checks' watch must not miss: week 16's gqa_attention by an attention whose
ops torch's dispatch hides from the checks' modes, and the guard's verdicts, which leave the child before the notebook
can clear them. The class run itself: tests/test_hostile_class.py; shared helpers: tests/_hostile_support.py."""
import importlib.util
import json
from pathlib import Path

import pytest

from grader.harness import load_exercises

_spec = importlib.util.spec_from_file_location("_hostile_support", Path(__file__).with_name("_hostile_support.py"))
_spec.loader.exec_module(_support := importlib.util.module_from_spec(_spec))
WEEK, _nb, _honest, _edit, _SDPA_ROUTE, course_root = (
    _support.WEEK, _support._nb, _support._honest, _support._edit, _support._SDPA_ROUTE, _support.course_root)


# gqa_attention by an attention whose ops torch's dispatch hides from the checks' modes (each passed before the
# child watched for it): a dispatch-key guard, made directly or through functools.partial (no profiler event of
# its own), the Python key excluded (or the modes popped) through partial'd setters, an operator redispatched below
# the modes, an operator or kernel of the notebook's own (torch.library), which runs inside the modes' handlers; and
# code compiled under a file name of Python's, or run in a module of Python's globals, which the child took for
# Python's own.
_ATTENTION_BY = """
import torch
def _attn(run, q, k, v, causal):
    A = torch.ops.aten
    g = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(g, 1).float(), v.repeat_interleave(g, 1).float()
    s = run(A.matmul.default, q.float(), kk.transpose(-1, -2)) * (q.shape[-1] ** -0.5)
    if causal:
        i = torch.arange(q.shape[2], device=q.device)[:, None] + (kk.shape[2] - q.shape[2])
        s = s.masked_fill(~(torch.arange(kk.shape[2], device=q.device)[None, :] <= i), float("-inf"))
    return run(A.matmul.default, run(A._softmax.default, s, -1, False), vv).to(q.dtype)
def _below(q):
    return torch._C.DispatchKeySet(torch._C.DispatchKey.Meta if q.is_meta else torch._C.DispatchKey.CPU)
"""
_UNSEEN = {
    "disable_torch_dispatch": """
def gqa_attention(q, k, v, causal=True):
    with torch._C._DisableTorchDispatch():
        return _sdpa(q, k, v, causal)
""",
    "guard_through_partial": """
import functools
def gqa_attention(q, k, v, causal=True):
    guard = functools.partial(torch._C.ExcludeDispatchKeyGuard, torch._C.DispatchKeySet(torch._C.DispatchKey.Python))()
    out = _sdpa(q, k, v, causal)
    del guard
    return out
""",
    "key_excluded_through_partial": """
import functools
_set = torch._C._dispatch_tls_set_dispatch_key_excluded
def gqa_attention(q, k, v, causal=True):
    functools.partial(_set, torch._C.DispatchKey.Python, True)()
    try:
        return _sdpa(q, k, v, causal)
    finally:
        functools.partial(_set, torch._C.DispatchKey.Python, False)()
""",
    "redispatch": """
def gqa_attention(q, k, v, causal=True):
    return _attn(lambda op, *a: op.redispatch(_below(q), *a), q, k, v, causal)
""",
    "redispatch_boxed": """
def gqa_attention(q, k, v, causal=True):
    return _attn(lambda op, *a: op._handle.redispatch_boxed(_below(q), *a), q, k, v, causal)
""",
    "custom_op": """
@torch.library.custom_op("hostile::attn", mutates_args=())
def _own(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    return _sdpa(q, k, v, causal).clone()
def gqa_attention(q, k, v, causal=True):
    return _own(q, k, v, causal)
""",
    "compiled_as_pythons_own": """
import functools
_SOURCE = '''
def _hidden(q, k, v, causal):
    import torch
    g, n, m = q.shape[1] // k.shape[1], q.shape[2], k.shape[2]
    i = torch.arange(n, device=q.device)[:, None] + (m - n)
    mask = torch.arange(m, device=q.device)[None, :] <= i if causal else None
    with torch._C._DisableTorchDispatch():
        return torch.nn.functional.scaled_dot_product_attention(
            q.float(), k.repeat_interleave(g, 1).float(), v.repeat_interleave(g, 1).float(), attn_mask=mask).to(q.dtype)
'''
_ns = vars(functools)  # run as functools' own code, by its globals and its file name
exec(compile(_SOURCE, functools.__file__, "exec"), _ns)
_hidden = _ns.pop("_hidden")
def gqa_attention(q, k, v, causal=True):
    return _hidden(q, k, v, causal)
""",
    "run_in_pythons_globals": """
import functools
_ns = vars(functools)  # run in functools' globals (its __file__), compiled as "<string>"
exec("def _run(below):\\n    return lambda op, *a: op.redispatch(below, *a)\\n", _ns)
_run = _ns.pop("_run")
def gqa_attention(q, k, v, causal=True):
    return _attn(_run(_below(q)), q, k, v, causal)
""",
    "modes_popped_through_partial": """
import functools
from torch.utils import _python_dispatch as _pd
def gqa_attention(q, k, v, causal=True):
    popped = []
    while torch._C._len_torch_dispatch_stack():
        popped.append(functools.partial(_pd._pop_torch_dispatch_stack, None)())
    try:
        return _sdpa(q, k, v, causal)
    finally:
        for mode in reversed(popped):
            functools.partial(_pd._push_on_torch_dispatch_stack, mode)()
""",
    "kernel_of_an_aten_op": """
_lib, _box = torch.library.Library("aten", "IMPL"), {}
_lib.impl("cos", lambda x: _sdpa(*_box["args"]), "CPU")
def gqa_attention(q, k, v, causal=True):
    _box["args"] = (q, k, v, causal)
    return torch.cos(torch.empty(0))
""",
}


@pytest.mark.parametrize("route", sorted(_UNSEEN))
def test_ops_hidden_from_the_dispatch_modes_are_a_verdict(course_root, tmp_path, route):
    """Each route computes gqa_attention with torch's fused attention (or aten's matmul and softmax redispatched
    below the modes), so the route and the ops the check forbids go unseen; it must not pass, and the verdict
    names tampering."""
    from grader.checks import week16 as checks

    release_path = next((course_root / "weeks" / WEEK).glob("*.ipynb"))
    honest = _honest(_nb(course_root / "solutions" / WEEK / release_path.name), _nb(release_path))
    path = tmp_path / release_path.name
    path.write_text(json.dumps(_edit(honest, "gqa_attention", _SDPA_ROUTE + _ATTENTION_BY + _UNSEEN[route])))
    ex = load_exercises(path)
    try:
        # (torch.library's registration reads sys._getframe from the notebook's frame: the first verdict named; a
        # custom op that registers unseen still reaches the dispatch modes as an op the op table cannot classify)
        with pytest.raises(AssertionError, match="dispatch|redispatched|registered|torch.library|sys._getframe|"
                                                 "compiled code under the file name|which the checks cannot classify"):
            checks.check_gqa_attention(ex.gqa_attention)
    finally:
        ex.close()


# The guard's record reached through any of the grader's classes (`object.__subclasses__()`, a method's module globals
# by a built name): cleared after the hidden route ran, or its `flag` shadowed on the instance before. Both passed
# while the guard's verdicts waited in its record for the end of the request.
_REACH_THE_GUARD = """
def _guard():
    for c in object.__subclasses__():
        if c.__name__ == '_Child':
            return getattr(c.__init__, '__glo' + 'bals__')['_CHILD'].guard
_inner = gqa_attention
def gqa_attention(q, k, v, causal=True):
    {before}
    out = _inner(q, k, v, causal)
    {after}
    return out
"""


@pytest.mark.parametrize("how", ["cleared_after", "flag_shadowed_before", "compiled_names_cleared"])
def test_the_guards_verdicts_leave_before_the_notebook_can_clear_them(course_root, tmp_path, how):
    """(compiled_names_cleared: the guard's record of the file names the notebook compiled code under, emptied once
    the code that redispatches below the modes was compiled in functools' globals — after which it passed for
    functools' own.)"""
    from grader.checks import week16 as checks

    release_path = next((course_root / "weeks" / WEEK).glob("*.ipynb"))
    honest = _honest(_nb(course_root / "solutions" / WEEK / release_path.name), _nb(release_path))
    reach = _REACH_THE_GUARD.format(before="_guard().flag = lambda *a: None" if how == "flag_shadowed_before" else "",
                                    after="_guard().flags.clear()" if how == "cleared_after" else "")
    route = "run_in_pythons_globals" if how == "compiled_names_cleared" else "disable_torch_dispatch"
    if how == "compiled_names_cleared":
        reach += "\n_guard().compiled.clear()\n"
    path = tmp_path / release_path.name
    path.write_text(json.dumps(_edit(honest, "gqa_attention", _SDPA_ROUTE + _ATTENTION_BY + _UNSEEN[route] + reach)))
    ex = load_exercises(path)
    try:
        with pytest.raises(AssertionError, match=r"made one of torch._C's dispatch-key guards|replaced the grader's own "
                                                 r"code in its process \(_Guard.flag, on the instance\)|replaced the "
                                                 r"grader's record of what it saw"):
            checks.check_gqa_attention(ex.gqa_attention)
    finally:
        ex.close()


# Week 17's forward by the whole score matrix in numpy (out of torch's sight), a real tiled pass beside it for the
# observers (every call's FLOPs, blocks and reads), then tracemalloc's peak reset — through functools.partial, which
# calls a builtin without a profiler event — so that the host meter sees only what was left: it passed before the
# child made tracemalloc's functions Python code of its own.
