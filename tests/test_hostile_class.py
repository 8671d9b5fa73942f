"""A hostile class: crafted week-16 submissions graded in one run next to honest controls.

Every control gets exactly its honest score; no crafted submission gets credit it did not earn; the run
finishes and lists its failures; the gradebook, the checks and the repo are unchanged by the students' code.
Fast: demo cells are stripped, `generate` is left a stub in every notebook (its check loads SmolLM2), and the
endless-loop case runs under a short per-call timeout set here.
"""
import hashlib
import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from grader.__main__ import autograde, collect
from grader.course import Course, read_csv
from grader.harness import load_exercises, with_cell_source

REPO = Path(__file__).resolve().parent.parent
WEEK = "16"
CHECKS_FILE = REPO / "grader" / "checks" / "week16.py"


def _nb(path: Path) -> dict:
    return json.loads(path.read_text())


def _points(release: dict) -> dict[str, float]:
    return {c["metadata"]["nbgrader"]["grade_id"]: float(c["metadata"]["nbgrader"]["points"])
            for c in release["cells"] if c["cell_type"] == "code" and c["metadata"].get("nbgrader", {}).get("grade")}


def _honest(solution: dict, release: dict) -> dict:
    """The solution with demo cells stripped and `generate` left as the release's stub."""
    stubs = {c["metadata"]["nbgrader"]["grade_id"]: c["source"] for c in release["cells"]
             if c["metadata"].get("nbgrader", {}).get("solution")}
    nb = json.loads(json.dumps(solution))
    cells = []
    for cell in nb["cells"]:
        meta = cell["metadata"]
        nbg = meta.get("nbgrader", {})
        if cell["cell_type"] == "code" and not (nbg.get("solution") or nbg.get("grade") or "setup" in meta.get("tags", [])):
            continue  # a demo cell
        if nbg.get("grade_id") == "generate":
            cell["source"] = stubs["generate"]
        cells.append(cell)
    nb["cells"] = cells
    return nb


_edit = with_cell_source


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _crafted(honest: dict, root: Path) -> dict[str, tuple[dict, set[str]]]:
    """name -> (notebook, grade_ids of the tests it must fail on top of `test_generate`)."""
    db = root / "grader" / "gradebook.db"
    return {
        "gradebook_writer": (_edit(honest, "step_flops", f"""
            import sqlite3
            for sql in ("UPDATE grade SET manual_score = 100", "UPDATE grade SET auto_score = 0"):
                try:
                    con = sqlite3.connect({str(db)!r}); con.execute(sql); con.commit(); con.close()
                except Exception as e:
                    print("blocked:", e)
            try:
                open({str(db)!r}, "r+b").write(b"garbage")
            except Exception as e:
                print("blocked:", e)
            """, prepend=True), set()),
        "checks_writer": (_edit(honest, "step_flops", f"""
            for path in ({str(CHECKS_FILE)!r}, {str(root / 'grader' / 'PWNED')!r}):
                try:
                    with open(path, "a") as f:
                        f.write("\\ncheck_step_flops = lambda *a, **k: None  # pwned\\n")
                except Exception as e:
                    print("blocked:", e)
            """, prepend=True), set()),
        "check_rebinding": (_edit(honest, "step_flops", """
            def step_flops(*args):
                return 0
            check_step_flops = lambda fn: None
            import grader.checks.week16 as _w
            _w.check_step_flops = lambda fn: None
            """), {"test_step_flops"}),
        "module_patching": (_edit(honest, "gqa_attention", """
            import torch
            import grader.checks, grader.checks.week16 as _w
            grader.checks.assert_close = _w.assert_close = lambda *a, **k: None
            _w._close = lambda *a, **k: None
            setattr(_w, "ref_gqa_attention", lambda q, k, v, causal=True: torch.zeros(q.shape))
            def gqa_attention(q, k, v, causal=True):
                return torch.zeros(q.shape)
            """), {"test_gqa_attention"}),
        "os_exit_in_function": (_edit(honest, "causal_mask", """
            import os
            def causal_mask(q_len, kv_len):
                os._exit(0)
            """), {"test_causal_mask", "test_gqa_attention"}),  # the solution's gqa_attention calls causal_mask
        "os_exit_at_load": (_edit(honest, "answer_q3", """
            import os
            os._exit(0)
            """), set(_points_cache)),
        "endless_loop": (_edit(honest, "roofline_time", """
            def roofline_time(flops, bytes_moved, flops_per_s, bytes_per_s):
                while True:
                    pass
            """), {"test_roofline_time"}),
        "memory_bomb": (_edit(honest, "kv_cache_bytes", """
            def kv_cache_bytes(*args, **kwargs):
                blocks = []
                while True:
                    blocks.append(bytearray(1 << 30))
            """), {"test_kv_cache_bytes", "test_answer_q3"}),  # the solution's answer_q3 calls kv_cache_bytes
        # The door (grader/view.py): with the watch switched off, lib's reference is still a stub; the solutions,
        # the real lib and a classmate's submission cannot be read at all.
        "watch_off_reference": (_edit(honest, "step_flops", """
            def step_flops(*args):
                import sys
                from lib.bench import roofline
                sys.setprofile(None)
                return roofline.step_flops(*args)
            """), {"test_step_flops"}),
        "reads_the_solution": (_edit(honest, "roofline_time", f"""
            import json
            _cells = json.load(open({str(REPO / "solutions" / WEEK / "week16_kv_cache.ipynb")!r}))["cells"]
            exec(next("".join(c["source"]) for c in _cells if c["metadata"].get("nbgrader", {{}}).get("grade_id") == "roofline_time"))
            """), {"test_roofline_time"}),
        "reads_a_classmate": (_edit(honest, "kv_cache_bytes", f"""
            import json
            _theirs = {str(root / "grader" / "submitted" / "honest" / WEEK / "week16_kv_cache.ipynb")!r}
            _cells = json.load(open(_theirs))["cells"]
            exec(next("".join(c["source"]) for c in _cells if c["metadata"].get("nbgrader", {{}}).get("grade_id") == "kv_cache_bytes"))
            """), {"test_kv_cache_bytes", "test_answer_q3"}),  # the solution's answer_q3 calls kv_cache_bytes
        "reference_import": (_edit(_edit(honest, "causal_mask", """
            from lib.attn.masks import causal_mask
            """), "step_flops", """
            def step_flops(*args):
                from lib.bench import roofline
                return roofline.step_flops(*args)
            """), {"test_causal_mask", "test_step_flops", "test_gqa_attention"}),  # its gqa_attention calls the stub
    }


_points_cache: dict = {}


@pytest.fixture(scope="module")
def course_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile") / "repo"
    for part in ("solutions", "weeks"):
        shutil.copytree(REPO / part / WEEK, root / part / WEEK,
                        ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache", "*.backup-*"))
    return root


@pytest.mark.notebook  # minutes: a dozen submissions autograded (about 4 min on 2 loaded cores)
def test_hostile_class(course_root, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("INFERENCE_LAB_MEMORY", str(1 << 30))  # 1 GiB beyond the imports: the bomb stops early
    root = course_root
    release_path = next((root / "weeks" / WEEK).glob("*.ipynb"))
    release, solution = _nb(release_path), _nb(root / "solutions" / WEEK / release_path.name)
    points = _points(release)
    _points_cache.update(points)
    honest = _honest(solution, release)
    Course(root).ensure_assignment(WEEK)
    crafted = _crafted(honest, root)

    subs = tmp_path / "subs"
    subs.mkdir()
    expected_fail: dict[str, set[str]] = {}
    for name, (nb, fails) in crafted.items():
        (subs / f"{name}.ipynb").write_text(json.dumps(nb))
        expected_fail[name] = fails | {"test_generate"}
    (subs / "honest.ipynb").write_text(json.dumps(honest))
    expected_fail["honest"] = {"test_generate"}
    shutil.copy(release_path, subs / "untouched.ipynb")
    expected_fail["untouched"] = set(points)
    (subs / "invalid_json.ipynb").write_text(json.dumps(honest)[:-10])
    (subs / "two_notebooks").mkdir()
    (subs / "two_notebooks" / "mine.ipynb").write_text(json.dumps(honest))
    (subs / "two_notebooks" / "mine-Copy1.ipynb").write_text(json.dumps(release))
    (subs / "two_named").mkdir()
    (subs / "two_named" / release_path.name).write_text(json.dumps(honest))
    (subs / "two_named" / "week16-Copy1.ipynb").write_text(json.dumps(release))
    expected_fail["two_named"] = {"test_generate"}

    checks_before, lib_before = _sha(CHECKS_FILE), {str(p): _sha(p) for p in (REPO / "lib").rglob("*.py")}
    refused = collect(WEEK, subs, root=root)
    assert sorted(line.split(":")[0] for line in refused) == ["invalid_json", "two_notebooks"]

    failures = autograde(WEEK, [], jobs=2, timeout=12, root=root)
    out = capsys.readouterr().out
    print(out)

    # the run finished, every student has a score, nobody's code touched the gradebook, checks or repo
    assert _sha(CHECKS_FILE) == checks_before, "a submission rewrote grader/checks/week16.py"
    assert {str(p): _sha(p) for p in (REPO / "lib").rglob("*.py")} == lib_before
    assert not (root / "grader" / "PWNED").exists()
    with sqlite3.connect(root / "grader" / "gradebook.db") as con:
        assert con.execute("SELECT COUNT(*) FROM grade WHERE manual_score IS NOT NULL").fetchone()[0] == 0
    assert failures == [], failures  # crafted code loses points; it does not break the run

    course = Course(root)
    total = sum(points.values())
    for student, fails in expected_fail.items():
        got = course.score(WEEK, student)
        want = total - sum(points[g] for g in fails)
        assert got["code_score"] == want, f"{student}: {got['code_score']} points, expected exactly {want}"
    status = course.read_status(WEEK, "reference_import")
    assert "not available to your code" in status["tests"]["test_causal_mask"], status["tests"]
    assert "causal_mask" in status["reference_use"]  # lib's stub, imported under the exercise's name, is lib's own
    assert "not available to your code" in course.read_status(WEEK, "watch_off_reference")["tests"]["test_step_flops"]
    for student, cell in (("reads_the_solution", "roofline_time"), ("reads_a_classmate", "kv_cache_bytes")):
        problems = course.read_status(WEEK, student)["load_problems"]
        assert any(cell in where and "PermissionError" in why for where, why in problems.items()), problems
    assert "timeout" in course.read_status(WEEK, "endless_loop")["tests"]["test_roofline_time"].lower() or \
        "longer than" in course.read_status(WEEK, "endless_loop")["tests"]["test_roofline_time"]

    rows = {r["student_id"]: r for r in read_csv(course.export(tmp_path / "grades.csv"))}
    assert rows["invalid_json"]["status"] == "refused at collect" and float(rows["invalid_json"]["score"]) == 0
    assert rows["two_notebooks"]["status"] == "refused at collect"
    assert rows["honest"]["status"] == "graded"


def test_pytest_path_is_isolated_too(course_root, tmp_path):
    """What `pytest weeks/16` does: the checks run here, so rebinding or patching them in a cell earns nothing,
    and os._exit in a cell ends the child, not pytest."""
    from grader.checks import week16 as checks

    release_path = next((course_root / "weeks" / WEEK).glob("*.ipynb"))
    honest = _honest(_nb(course_root / "solutions" / WEEK / release_path.name), _nb(release_path))
    crafted = _crafted(honest, course_root)
    nb = _edit(crafted["module_patching"][0], "step_flops", """
        def step_flops(*args):
            return 0
        import grader.checks.week16 as _w
        setattr(_w, "check_step_flops", lambda fn: None)
        """)
    path = tmp_path / release_path.name
    path.write_text(json.dumps(nb))
    ex = load_exercises(path)
    with pytest.raises(AssertionError, match="exercise 1, `step_flops`"):
        checks.check_step_flops(ex.step_flops)
    with pytest.raises(AssertionError, match="exercise 4, `gqa_attention`"):
        checks.check_gqa_attention(ex.gqa_attention)
    checks.check_causal_mask(ex.causal_mask)  # the honest ones still pass

    path.write_text(json.dumps(crafted["os_exit_in_function"][0]))
    ex = load_exercises(path)
    with pytest.raises(AssertionError, match="exited with status 0"):
        checks.check_causal_mask(ex.causal_mask)
    checks.check_step_flops(ex.step_flops)  # a fresh child for the next exercise

    # Work handed to another thread or process runs where the checks' dispatch mode and profiler do not watch: a
    # forbidden op there would go unseen, so starting one while graded is a verdict, as is a worker left running.
    for route, source in _ELSEWHERE.items():
        path.write_text(json.dumps(_edit(honest, "gqa_attention", _SDPA_ROUTE + source)))
        ex = load_exercises(path)
        with pytest.raises(AssertionError, match="started a thread or a process|thread\\(s\\) of its own running"):
            checks.check_gqa_attention(ex.gqa_attention)
        if route == "worker_at_load":  # started while the cells loaded: every exercise's verdict
            with pytest.raises(AssertionError, match="thread"):
                checks.check_causal_mask(ex.causal_mask)
        else:
            checks.check_causal_mask(ex.causal_mask)
        ex.close()

    path.write_text(json.dumps(crafted["reference_import"][0]))
    ex = load_exercises(path, week=checks.WEEK)
    with pytest.raises(AssertionError, match="lib.attn.masks.causal_mask is not available to your code while this week "
                                             "is graded: it is the answer to week 16's exercise 2"):
        checks.check_causal_mask(ex.causal_mask)


# gqa_attention by torch's fused attention (forbidden), run elsewhere than the thread the checks watch.
_SDPA_ROUTE = """
def _sdpa(q, k, v, causal):
    import torch, torch.nn.functional as F
    g = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    i = torch.arange(q.shape[2], device=q.device)[:, None] + (kk.shape[2] - q.shape[2])
    mask = torch.arange(kk.shape[2], device=q.device)[None, :] <= i if causal else None
    return F.scaled_dot_product_attention(q.float(), kk.float(), vv.float(), attn_mask=mask).to(q.dtype)
"""
_ELSEWHERE = {
    "thread": """
import threading
def gqa_attention(q, k, v, causal=True):
    box = []
    t = threading.Thread(target=lambda: box.append(_sdpa(q, k, v, causal)))
    t.start(); t.join()
    return box[0]
""",
    "raw_thread": """
import _thread, time
def gqa_attention(q, k, v, causal=True):
    box = []
    _thread.start_new_thread(lambda: box.append(_sdpa(q, k, v, causal)), ())
    while not box:
        time.sleep(0.001)
    return box[0]
""",
    "worker_at_load": """
import threading, queue
_jobs, _done = queue.Queue(), queue.Queue()
threading.Thread(target=lambda: [_done.put(_sdpa(*_jobs.get())) for _ in iter(int, 1)], daemon=True).start()
def gqa_attention(q, k, v, causal=True):
    _jobs.put((q, k, v, causal))
    return _done.get()
""",
    "fork": """
import os, pickle
def gqa_attention(q, k, v, causal=True):
    r, w = os.pipe()
    if os.fork() == 0:
        os.write(w, pickle.dumps(_sdpa(q, k, v, causal)))
        os._exit(0)
    os.close(w)
    data = b"".join(iter(lambda: os.read(r, 1 << 20), b""))
    os.wait()
    return pickle.loads(data)
""",
    "thread_through_partial": """
import _thread, functools, time
def gqa_attention(q, k, v, causal=True):
    box = []
    functools.partial(_thread.start_new_thread, lambda: box.append(_sdpa(q, k, v, causal)), ())()
    while not box:
        time.sleep(0.001)
    return box[0]
""",
    "fork_through_partial": """
import functools, os, pickle
def gqa_attention(q, k, v, causal=True):
    r, w = os.pipe()
    if functools.partial(os.fork)() == 0:
        os.write(w, pickle.dumps(_sdpa(q, k, v, causal)))
        os._exit(0)
    os.close(w)
    data = b"".join(iter(lambda: os.read(r, 1 << 20), b""))
    os.wait()
    return pickle.loads(data)
""",
}


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
_FORWARD_IN_NUMPY_THEN_RESET = """
import functools, _tracemalloc
import numpy as np
def _blocks(q, k, v, causal, bq, bk):
    nq, nk = q.shape[2], k.shape[2]
    for qs in range(0, nq, bq):
        qi = q[:, :, qs:qs + bq].float() * q.shape[-1] ** -0.5
        m, l = torch.full(qi.shape[:3], float("-inf")), torch.zeros(qi.shape[:3])
        acc = torch.zeros(qi.shape[:3] + (v.shape[-1],))
        for ks in range(0, nk, bk):
            if causal and ks > min(qs + bq, nq) - 1 + nk - nq:
                break
            s = qi @ k[:, :, ks:ks + bk].float().transpose(-1, -2)
            if causal:
                s = s.masked_fill(torch.arange(ks, min(ks + bk, nk))[None, :]
                                  > torch.arange(qs, min(qs + bq, nq))[:, None] + nk - nq, float("-inf"))
            top = torch.maximum(m, s.amax(-1))
            base = torch.where(torch.isinf(top), torch.zeros_like(top), top)
            p, a = torch.exp(s - base[..., None]), torch.exp(m - base)
            l, acc, m = a * l + p.sum(-1), a[..., None] * acc + p @ v[:, :, ks:ks + bk].float(), top
def flash_attention_forward(q, k, v, causal=False, block_q=128, block_k=128, visited=None):
    check_attention_shapes(q, k, v, causal)
    if q.device.type == "meta":
        return torch.empty(q.shape, dtype=q.dtype, device="meta"), torch.empty(q.shape[:3], device="meta")
    nq, nk = q.shape[2], k.shape[2]
    for qs in range(0, nq, block_q):
        for ks in range(0, nk, block_k):
            if visited is not None and not (causal and ks > min(qs + block_q, nq) - 1 + nk - nq):
                visited.append((qs, ks))
    _blocks(q, k, v, causal, block_q, block_k)
    qn, kn, vn = (t.detach().numpy() if t.dtype == torch.float32 else t.detach().float().numpy() for t in (q, k, v))
    s = qn @ kn.swapaxes(-1, -2) / np.sqrt(qn.shape[-1])
    if causal:
        s = np.where(np.arange(nk)[None, :] <= np.arange(nq)[:, None] + nk - nq, s, -np.inf)
    m = s.max(-1, keepdims=True)
    p = np.exp(s - m)
    lse = m[..., 0] + np.log(p.sum(-1))
    out = (p / p.sum(-1, keepdims=True)) @ vn
    res = (torch.from_numpy(np.ascontiguousarray(out, dtype=np.float32)).to(q.dtype),
           torch.from_numpy(np.ascontiguousarray(lse, dtype=np.float32)))
    del s, p, out, lse, m
    functools.partial(_tracemalloc.reset_peak)()
    return res
"""


def test_resetting_the_host_meter_is_a_verdict(tmp_path):
    from grader.checks import week17 as checks

    release_path = next((REPO / "weeks" / "17").glob("*.ipynb"))
    honest = _honest(_nb(REPO / "solutions" / "17" / release_path.name), _nb(release_path))
    path = tmp_path / release_path.name
    path.write_text(json.dumps(_edit(honest, "flash_attention_forward", _FORWARD_IN_NUMPY_THEN_RESET)))
    ex = load_exercises(path)
    try:
        with pytest.raises(AssertionError, match="used tracemalloc"):
            checks.check_flash_attention_forward(ex.flash_attention_forward)
    finally:
        ex.close()


# Started by an exercise cell when it loads: each process carries `MARKER` and its kind in its argv.
_SPAWN_AT_LOAD = r'''
import ctypes, os, subprocess, sys
# /bin/sh, not sys.executable: the child's uid may not reach the interpreter (a pyenv under /root, mode 0700)
def _exec(kind, code="sleep 900; exit 0"):  # a second command: a shell may exec a lone one (argv lost)
    os.execv("/bin/sh", ["/bin/sh", "-c", code, "MARKER", kind])
subprocess.Popen(["/bin/sh", "-c", "sleep 900; exit 0", "MARKER", "popen-setsid"], start_new_session=True)
subprocess.Popen(["/bin/sh", "-c", "while :; do :; done", "MARKER", "cpu-burner-setsid"], start_new_session=True)
if os.fork() == 0:
    _exec("fork")
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        _exec("double-fork-setsid")
    os._exit(0)
ctypes.CDLL(None).prctl(36, 0, 0, 0, 0)  # no longer the subreaper of its tree: its orphans go to the grader
if os.fork() == 0:
    if os.fork() == 0:
        _exec("double-fork-orphan")
    os._exit(0)
'''

# A check's call that leaves a setsid'd CPU burner behind and ends the child.
_SPAWN_THEN_EXIT = r'''
import os, subprocess, sys, time
def causal_mask(q_len, kv_len, device=None):
    subprocess.Popen(["/bin/sh", "-c", "while :; do :; done", "MARKER", "burner-of-a-dead-child"],
                     start_new_session=True)
    time.sleep(1.0)  # the burner is running (and seen by the test's 0.1 s poll) before its parent dies
    os._exit(0)
'''

# Two exercises whose code takes 40 s, against a 15 s limit per graded test (the call limit is 60 s).
_SLOW = r'''
import time
def roofline_time(flops, bytes_moved, flops_per_s, bytes_per_s):
    time.sleep(40)
    return max(flops / flops_per_s, bytes_moved / bytes_per_s)
'''
_SLOW_Q1 = r'''
import time
def answer_q1():
    time.sleep(40)
    return 26.0
'''


def _marked(marker: str) -> dict[int, str]:
    """pid -> kind of the live processes whose argv holds `marker` (zombies have no argv)."""
    import os

    kinds = {}
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if marker.encode() in argv:
                kinds[int(pid)] = argv[argv.index(marker.encode()) + 1].decode()
    return kinds


@pytest.mark.notebook  # about a minute: three submissions through `python -m grader autograde 16 --jobs 2`
def test_cli_autograde_kills_every_process_and_times_each_exercise(scratch, tmp_path):
    """`python -m grader autograde 16 --jobs 2`, as typed: what a submission starts — forked, double-forked,
    `setsid`'d, a CPU-burning loop, an orphan of a child that gave up being their subreaper, a process left by a
    child that then exited — runs while it is graded and is gone when the command returns; an exercise slower
    than its time limit loses its own points only, and the status file names it."""
    import os
    import signal
    import subprocess
    import time
    import uuid

    root = scratch.copy(tmp_path / "repo")
    release_path = next((root / "weeks" / WEEK).glob("*.ipynb"))
    release, solution = _nb(release_path), _nb(root / "solutions" / WEEK / release_path.name)
    points = _points(release)
    honest = _honest(solution, release)
    marker = f"inference-lab-hostile-{uuid.uuid4().hex}"
    subs = tmp_path / "subs"
    subs.mkdir()
    notebooks = {
        "spawner": _edit(honest, "step_flops", _SPAWN_AT_LOAD.replace("MARKER", marker), prepend=True),
        "spawn_then_exit": _edit(honest, "causal_mask", _SPAWN_THEN_EXIT.replace("MARKER", marker)),
        "slow": _edit(_edit(honest, "roofline_time", _SLOW), "answer_q1", _SLOW_Q1),
    }
    for name, nb in notebooks.items():
        (subs / f"{name}.ipynb").write_text(json.dumps(nb))
    env = scratch.env(root, INFERENCE_LAB_EXERCISE_TIMEOUT=15, INFERENCE_LAB_CALL_TIMEOUT=60)
    py = str(root / ".venv" / "bin" / "python")
    subprocess.run([py, "-m", "grader", "collect", WEEK, str(subs)], cwd=root, env=env, check=True,
                   capture_output=True)

    seen: set[str] = set()
    proc = subprocess.Popen([py, "-m", "grader", "autograde", WEEK, "--jobs", "2"], cwd=root, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        while proc.poll() is None:
            seen.update(_marked(marker).values())
            time.sleep(0.1)
        out = proc.stdout.read()
    finally:
        proc.kill()
        left = _marked(marker)
        for pid in left:  # a failing run must not leave them to the next test
            os.kill(pid, signal.SIGKILL)
    print(out)
    assert proc.returncode == 0, out
    assert not left, f"still running after autograde returned: {sorted(left.values())}"
    assert seen >= {"popen-setsid", "cpu-burner-setsid", "fork", "double-fork-setsid", "double-fork-orphan",
                    "burner-of-a-dead-child"}, f"the submissions did not start what the test expects: {seen}"
    assert "SAWarning" not in out

    course = Course(root)
    total = sum(points.values())
    # test_generate runs SmolLM2 for 64 tokens: against the 15 s limit set here it passes on quiet cores and runs out
    # of time on a busy machine (or beside a submission's CPU burner), so its points are not what this test judges.
    # The spawner called C through ctypes while its cells loaded (prctl): a verdict for every exercise (grader.child).
    fails = {"spawner": set(points), "spawn_then_exit": {"test_causal_mask", "test_gqa_attention"},
             "slow": {"test_roofline_time", "test_answer_q1"}}
    for student, failed in fails.items():
        got = course.score(WEEK, student)["code_score"]
        want = total - sum(points[g] for g in failed)
        assert got in (want, want - points["test_generate"]), f"{student}: {got} points, expected {want} (test_generate aside)"
    timed_out = course.read_status(WEEK, "slow")["timed_out"]
    assert set(timed_out) == {"test_roofline_time", "test_answer_q1"}, timed_out
    assert all("ran out of time" in why and "(15 s" in why for why in timed_out.values()), timed_out


def test_a_fork_bomb_stops_at_the_process_limit(course_root, tmp_path):
    """A cell forking 400 sleepers gets at most `_sandbox.MAX_PROCESSES` of them (pids cgroup as root, RLIMIT_NPROC
    otherwise), and they die with the child."""
    from grader._sandbox import MAX_PROCESSES

    release_path = next((course_root / "weeks" / WEEK).glob("*.ipynb"))
    honest = _honest(_nb(course_root / "solutions" / WEEK / release_path.name), _nb(release_path))
    marker = f"inference-lab-bomb-{tmp_path.name}"
    nb = _edit(honest, "step_flops", f"""
        import os, time
        started, error = 0, None
        for _ in range(400):
            try:
                if os.fork() == 0:
                    os.execv("/bin/sleep", ["/bin/sleep", "60", {marker!r}])
                started += 1
            except OSError as e:
                error = type(e).__name__
                break
        def bomb():
            return started, error
        """, prepend=True)
    path = tmp_path / release_path.name
    path.write_text(json.dumps(nb))
    ex = load_exercises(path)
    if "no process-count limit" in ex._session.sandbox:
        ex.close()
        pytest.skip(f"no process-count limit here: {ex._session.sandbox}")
    started, error = ex.bomb()
    ex.close()
    assert error == "BlockingIOError" and started <= MAX_PROCESSES, (started, error)
    assert not _marked(marker), "the sleepers outlived the child"
