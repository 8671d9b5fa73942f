"""Grades that cannot be forged: what a submission's process can reach, through the isolated path `pytest weeks/NN`
takes (`load_exercises` with the week's view, the checks in this process).

Each test is a route someone took, or would take, to a grade without the work: read the answer key (solutions/,
lib's real files, the checks, a classmate's notebook), switch the grader's watch off and call lib, call lib's
code under another exercise's name, paste a renamed and padded copy of lib or of the solution, behave one way
while observed and another way when not, write into an argument, change a check's object or the shared model,
open a socket, read the instructor's environment, or hold memory while the cells load. Every one must fail the
exercise with a one-line reason, and the honest solution keep passing.
"""
from __future__ import annotations

import ast
import inspect
import json
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
import torch

from grader.harness import load_exercises, with_cell_source

REPO = Path(__file__).resolve().parent.parent


def _solution(week: int) -> tuple[Path, dict]:
    path = next((REPO / "solutions" / str(week)).glob("*.ipynb"))
    return path, json.loads(path.read_text())


def _load(tmp_path: Path, week: int, edits: dict[str, str] | None = None, prepend: dict[str, str] | None = None):
    """The solution of `week` with some exercise cells replaced (or prefixed), loaded as `pytest weeks/NN` does."""
    path, nb = _solution(week)
    for grade_id, src in (edits or {}).items():
        nb = with_cell_source(nb, grade_id, src)
    for grade_id, src in (prepend or {}).items():
        nb = with_cell_source(nb, grade_id, src, prepend=True)
    out = tmp_path / f"w{week}" / path.name
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(nb))
    return load_exercises(out)


def _solution_cells(week: int) -> dict[str, str]:
    from grader.notebook import exercise_cells

    return {g: src for _, g, src in exercise_cells(_solution(week)[1]) if g}


def _reads_restricted(ex) -> bool:
    return "reads only" in getattr(ex._session, "sandbox", "")


# --- what the process can read -----------------------------------------------------------------------------------

def test_the_answer_key_the_checks_and_classmates_are_out_of_reach(tmp_path, monkeypatch):
    classmate = tmp_path / "submitted" / "alice" / "16" / "week16_kv_cache.ipynb"
    classmate.parent.mkdir(parents=True)
    classmate.write_text("{}")
    monkeypatch.setenv("INFERENCE_LAB_INSTRUCTOR_TOKEN", "secret")
    probe = f'''
import json, os, socket

def answer_q1():
    out = {{}}
    for p in {[str(REPO / "solutions" / "16" / "week16_kv_cache.ipynb"), str(REPO / "lib" / "attn" / "masks.py"),
               str(REPO / "grader" / "checks" / "week16.py"), str(REPO / "grader"), str(classmate), str(REPO)]!r}:
        try:
            out[p] = ("listed" if os.path.isdir(p) and os.listdir(p) is not None else
                      "read %d bytes" % len(open(p, "rb").read()))
        except OSError as e:
            out[p] = type(e).__name__
    for name, fam, kind in (("udp", socket.AF_INET, socket.SOCK_DGRAM), ("unix", socket.AF_UNIX, socket.SOCK_STREAM)):
        try:
            socket.socket(fam, kind).close()
            out[name] = "made"
        except OSError as e:
            out[name] = type(e).__name__
    out["token"] = os.environ.get("INFERENCE_LAB_INSTRUCTOR_TOKEN")
    out["etc"] = len(open("/etc/passwd").read()) > 0
    import lib.attn.masks, grader.checks.week16
    for name, fn in (("lib", lambda: lib.attn.masks.causal_mask(2, 3)), ("checks", lambda: grader.checks.week16.check_causal_mask(None))):
        try:
            fn()
            out[name] = "ran"
        except Exception as e:
            out[name] = str(e)
    return json.dumps(out)
'''
    ex = _load(tmp_path, 16, edits={"answer_q1": probe})
    out = json.loads(ex.answer_q1())
    assert out["token"] is None, "the instructor's environment reached the student's process"
    assert out["etc"] is True  # the system's shared files stay readable (Python needs them)
    assert out["lib"].startswith("lib.attn.masks.causal_mask is not available to your code while this week is graded")
    assert "runs in the grader's process" in out["checks"]
    if not _reads_restricted(ex):
        pytest.skip(f"no Landlock read restriction here ({ex._session.sandbox}); the view alone applies")
    for path, what in out.items():
        if path.startswith("/"):
            assert what == "PermissionError", f"the student's process could open {path}: {what}"
    if "no sockets" in ex._session.sandbox:
        assert out["udp"] == out["unix"] == "PermissionError"


def test_a_reference_stays_a_stub_with_the_watch_switched_off(tmp_path):
    from grader.checks import week16 as checks

    ex = _load(tmp_path, 16, edits={"causal_mask": """
        def causal_mask(q_len, kv_len, device=None):
            import sys
            from lib.attn.masks import causal_mask as theirs
            sys.setprofile(None)
            return theirs(q_len, kv_len, device)
        """})
    with pytest.raises(AssertionError, match="is not available to your code while this week is graded: it is the "
                                             "answer to week 16's exercise 2"):
        checks.check_causal_mask(ex.causal_mask)


def test_lib_code_under_another_name_is_a_stub(tmp_path):
    """Week 18's best_k from lib's predicted_speedup, week 19's predict_steps from lib's own engine: lib's routes to
    an exercise are stubs whatever the exercise's name (the week's view keeps only what its setup imports)."""
    from grader.checks import week18, week19

    ex = _load(tmp_path, 18, edits={"best_k": """
        def best_k(alpha, c, verify_cost):
            from lib.spec_decode.speculative import predicted_speedup
            speeds = {k: predicted_speedup(alpha, k, c, verify_cost) for k in range(1, max(verify_cost))}
            k = max(speeds, key=speeds.get)
            return k, speeds[k]
        """})
    with pytest.raises(AssertionError, match="lib.spec_decode.speculative.predicted_speedup is not available to your code"):
        week18.check_best_k(ex.best_k)
    ex = _load(tmp_path, 19, edits={"predict_steps": """
        def predict_steps(prompt_lens, new_tokens, max_num_seqs, token_budget, chunked_prefill=True):
            from lib.batching.engine import LLMEngine
            from lib.modeling.llama import tiny_model
            engine = LLMEngine(tiny_model(), num_blocks=sum(prompt_lens) + sum(new_tokens), block_size=4,
                               max_num_seqs=max_num_seqs, max_num_batched_tokens=token_budget,
                               enable_chunked_prefill=chunked_prefill)
            for p, n in zip(prompt_lens, new_tokens):
                engine.add_request([1] * p, n)
            while engine.has_unfinished():
                engine.step()
            return len(engine.trace)
        """})
    with pytest.raises(AssertionError, match="is not available to your code"):
        week19.check_predict_steps(ex.predict_steps)


def test_the_checks_own_code_is_a_stub_in_the_students_process(tmp_path):
    from grader.checks import week18

    ex = _load(tmp_path, 18, edits={"verify": """
        def verify(p, q, draft_tokens, generator):
            from grader.checks.week18_law import verify_law
            return verify_law(p, q, draft_tokens, generator)
        """})
    with pytest.raises(AssertionError, match="runs in the grader's process, not in the notebook's code"):
        week18.check_verify(ex.verify)


# --- copies of the answer key, renamed and padded -----------------------------------------------------------------

def _renamed_and_padded(*functions) -> str:
    """The source of `functions` with every local renamed, a dead statement after each statement, docstrings
    reworded: what a student pasting lib's code and disguising it would write."""
    out = []
    for fn in functions:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
        node = tree.body[0]
        params = {a.arg for a in [*node.args.args, *node.args.kwonlyargs]}
        local = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)} - params

        class Rename(ast.NodeTransformer):
            def visit_Name(self, n):
                return ast.copy_location(ast.Name(id=f"my_{n.id}" if n.id in local else n.id, ctx=n.ctx), n)

        def pad(body):
            padded = []
            for stmt in body:
                for field in ("body", "orelse", "finalbody"):
                    if isinstance(getattr(stmt, field, None), list) and getattr(stmt, field):
                        setattr(stmt, field, pad(getattr(stmt, field)))
                padded += [stmt, ast.parse("_unused = 0").body[0]]
            return padded

        node = Rename().visit(node)
        node.decorator_list = []
        if isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant):
            node.body[0] = ast.Expr(ast.Constant("My own tiled attention."))
        node.body = pad(node.body)
        out.append(ast.unparse(ast.fix_missing_locations(tree)))
    return "\n\n".join(out)


def test_a_renamed_and_padded_copy_of_lib_is_reference_use(tmp_path):
    from grader.checks import week17
    from lib.attn import attention

    source = "import math\nimport torch\n" + _renamed_and_padded(
        attention._causal_block, attention.accumulation_dtype, attention.flash_attention_forward)
    ex = _load(tmp_path, 17, edits={"flash_attention_forward": source})
    with pytest.raises(AssertionError, match=r"is a copy of lib's lib.attn.attention.flash_attention_forward: it holds "
                                             r"\d+% of that code \(\d+% of its token sequences, \d+% of its statements"):
        week17.check_flash_attention_forward(ex.flash_attention_forward)


def _copy_elsewhere(route: str) -> dict:
    """The renamed and padded copy of lib's flash_attention_forward, out of the exercise cell's own source."""
    import base64

    from lib.attn import attention

    copy = "import math\nimport torch\n" + _renamed_and_padded(
        attention._causal_block, attention.accumulation_dtype, attention.flash_attention_forward)
    encoded = base64.b64encode(copy.encode()).decode()
    decode = f"import base64\n_src = base64.b64decode({encoded!r}).decode()\n"
    return {
        # parked in another exercise's cell (that one is lost; this one used to pass)
        "parked_in_another_cell": dict(prepend={"score_bytes": copy.replace("def flash_attention_forward(", "def _mine(")},
                                       edits={"flash_attention_forward": "flash_attention_forward = _mine\n"}),
        # the source check reads a string constant; the copy is compiled while the cells run
        "decoded_and_exec_d": dict(edits={"flash_attention_forward": decode + "exec(_src)\n"}),
        "written_to_a_file_and_imported": dict(edits={"flash_attention_forward": decode + (
            "import sys\nopen('mine_fa.py', 'w').write(_src)\nsys.path.insert(0, '.')\nimport mine_fa\n"
            "vars(mine_fa).update({k: v for k, v in globals().items() if k not in vars(mine_fa)})\n"
            "flash_attention_forward = mine_fa.flash_attention_forward\n")}),
        # bytecode rebuilt under another file name (what it was compiled under is what the child judged)
        "code_object_rebuilt": dict(edits={"flash_attention_forward": decode + (
            "import types\n"
            "def _moved(c):\n"
            "    return c.replace(co_filename='mine.py', co_consts=tuple(_moved(k) if isinstance(k, types.CodeType) "
            "else k for k in c.co_consts))\n"
            "exec(_moved(compile(_src, '<s>', 'exec')))\n")}),
    }[route]


@pytest.mark.parametrize("route", ["parked_in_another_cell", "decoded_and_exec_d", "written_to_a_file_and_imported",
                                   "code_object_rebuilt"])
def test_a_copy_of_lib_out_of_the_exercise_cells_source_is_reference_use(tmp_path, route):
    """The source check reads each exercise cell; a copy parked in another cell never reaches the child (its body is
    a `raise`), and one decoded and compiled while the cells run is refused by the child's audit hook (all four
    passed before)."""
    from grader.checks import week17

    ex = _load(tmp_path, 17, **_copy_elsewhere(route))
    with pytest.raises(AssertionError, match=r"(ran code copied from the answer key: |RuntimeError: )`\w+` is a copy "
                                             r"of lib's lib.attn.attention.flash_attention_forward|made a code object itself"):
        week17.check_flash_attention_forward(ex.flash_attention_forward)


# Each reaches the child's records (the `_Child` whose `reference_units` judge compiled code) without a word the
# source check reads, switches the judging off, then runs the decoded copy. All three (and the profiler's closure)
# passed before.
_REACH_THE_RECORDS = {
    "import_grader_child": "import grader.child\n_child = grader.child._CHILD\n",
    "the_start_up_scripts_globals": "import __main__\n_child = __main__.child._CHILD\n",
    # a shim the grader put on torch._C: its module globals (the name is built, so that no source check reads it)
    "a_shims_globals": "import torch\n_child = getattr(torch._C._pop_torch_dispatch_stack, '__glo' + 'bals__')['_CHILD']\n",
}


@pytest.mark.parametrize("route", sorted(_REACH_THE_RECORDS))
def test_the_graders_records_are_out_of_the_notebooks_reach(tmp_path, route):
    """The child's records (what ran, which copies to look for) were plain Python objects the notebook's code could
    reach and clear: through `sys.modules`, the start-up script, a shim's globals (and the profiler's closure:
    `test_asking_for_the_profiler_function_is_a_verdict`)."""
    from grader.checks import week17

    route_edits = _copy_elsewhere("decoded_and_exec_d")["edits"]
    source = _REACH_THE_RECORDS[route] + "_child.reference_units = None\n" + route_edits["flash_attention_forward"]
    ex = _load(tmp_path, 17, edits={"flash_attention_forward": source})
    with pytest.raises(AssertionError, match=r"copied from the answer key|is not defined"):
        week17.check_flash_attention_forward(ex.flash_attention_forward)


def test_a_shims_original_taken_out_of_its_closure_is_still_seen(tmp_path):
    """tracemalloc's functions are shims whose closure holds the builtin: called directly, the builtin is a
    verdict too (it passed before). Wrapped in functools.partial it is not seen: README, "does not protect"."""
    from grader.checks import week16

    ex = _load(tmp_path, 16, prepend={"causal_mask": (
        "import tracemalloc\ngetattr(tracemalloc.is_tracing, '__clo' + 'sure__')[0].cell_contents()\n")})
    with pytest.raises(AssertionError, match=r"used tracemalloc"):
        week16.check_causal_mask(ex.causal_mask)


def test_asking_for_the_profiler_function_is_a_verdict(tmp_path):
    """The profiler function's closure leads to the child (its records of what ran: a bound method of it):
    asking for it is a verdict, whatever the notebook does with it next (here: forget which lib functions ran)."""
    from grader.checks import week16

    ex = _load(tmp_path, 16, prepend={"causal_mask": (
        "import sys\n_cells = [getattr(c, 'cell_' + 'contents') for c in getattr(sys.getprofile(), '__clo' + 'sure__')]\n"
        "_child = [getattr(x, '__self__', x) for x in _cells if type(getattr(x, '__self__', x)).__name__ == '_Child'][0]\n"
        "_child.lib_seen.clear()\n")})
    with pytest.raises(AssertionError, match=r"asked for the grader's profiler function"):
        week16.check_causal_mask(ex.causal_mask)


# Through any class of the grader's (`object.__subclasses__()` lists them all), a method's module globals lead to the
# child and its records; no name the source check reads, no audit event. Both routes passed before the copies' code
# stopped reaching the child (cells: `copies.without_copies`) and the references stopped being the child's (code
# compiled while the notebook runs: the audit hook alone holds them).
_CLEAR_THE_RECORDS = textwrap.dedent("""
    for _c in object.__subclasses__():
        if _c.__name__ == '_Child':
            _child = getattr(_c.__init__, '__glo' + 'bals__')['_CHILD']
            _child.copies.clear()
            _child.reference_units = None
    """)


@pytest.mark.parametrize("route", ["parked_in_another_cell", "decoded_and_exec_d"])
def test_a_copy_runs_nowhere_whatever_the_notebook_does_to_the_childs_records(tmp_path, route):
    from grader.checks import week17

    spec = _copy_elsewhere(route)
    spec["edits"] = {**spec["edits"], "flash_attention_forward": _CLEAR_THE_RECORDS + spec["edits"]["flash_attention_forward"]}
    ex = _load(tmp_path, 17, **spec)
    with pytest.raises(AssertionError, match=r"is a copy of lib's lib.attn.attention.flash_attention_forward: it holds \d+% "
                                             r"of that code .* the grader does not (run|compile) a copy"):
        week17.check_flash_attention_forward(ex.flash_attention_forward)


def test_the_guards_tables_emptied_are_a_verdict(tmp_path):
    """What the guard watches (the functions that hide ops, take frames, start threads) is a table the notebook's code
    can reach and empty, after which that whole kind of verdict is off: emptied, it is a verdict itself."""
    from grader.checks import week16

    ex = _load(tmp_path, 16, prepend={"causal_mask": _CLEAR_THE_RECORDS.replace(
        "_child.copies.clear()", "_child.guard.watched_c.clear()")})
    with pytest.raises(AssertionError, match=r"replaced the grader's record of what it saw"):
        week16.check_causal_mask(ex.causal_mask)


def test_a_replaced_torch_equal_hides_no_change_to_the_arguments(tmp_path):
    """The child tells the trusted side which tensor arguments a call changed, comparing them with `torch.equal`:
    replaced by plain names (always True), a call that wrote into the caller's tensors passed as if it had not."""
    from grader.checks import week16

    ex = _load(tmp_path, 16, prepend={"gqa_attention": "torch.equal = lambda *a, **k: True\n"},
               edits={"gqa_attention": _solution_cells(16)["gqa_attention"].replace(
                   "def gqa_attention(", "def _honest_gqa(") + textwrap.dedent("""
                   def gqa_attention(q, k, v, causal=True):
                       out = _honest_gqa(q, k, v, causal)
                       k.zero_()
                       return out
                   """)})
    with pytest.raises(AssertionError, match=r"changed what the checks observe through \(torch.equal\)|changed its argument"):
        week16.check_gqa_attention(ex.gqa_attention)


def test_a_verdict_counts_for_the_exercise_that_ran_whatever_the_child_says(tmp_path):
    """The child names the exercise a verdict is for from its record of which exercise runs, which the notebook's code
    can rewrite around what it wants unseen (here: gc.get_objects in gqa_attention, sent as causal_mask's). The
    trusted side counts it for the exercise its own request ran for as well."""
    from grader.checks import week16

    reach = textwrap.dedent("""
        def _child():
            for c in object.__subclasses__():
                if c.__name__ == '_Child':
                    return getattr(c.__init__, '__glo' + 'bals__')['_CHILD']
        """)
    ex = _load(tmp_path, 16, prepend={"gqa_attention": reach},
               edits={"gqa_attention": _solution_cells(16)["gqa_attention"].replace(
                   "def gqa_attention(", "def _honest_gqa(") + textwrap.dedent("""
                   def gqa_attention(q, k, v, causal=True):
                       child = _child()
                       was, child.current_root = child.current_root, "causal_mask"
                       import gc
                       gc.get_objects()
                       child.current_root = was
                       return _honest_gqa(q, k, v, causal)
                   """)})
    with pytest.raises(AssertionError, match=r"`gqa_attention` called gc.get_objects"):
        week16.check_gqa_attention(ex.gqa_attention)


def test_a_replaced_os_write_drops_no_verdict(tmp_path):
    """Every verdict the child sends went through `os.write`: replaced by plain names with a filter, it dropped them
    (and could have rewritten any reply). The framing now writes with the function it was imported with, and the
    replacement is a verdict of its own."""
    from grader.checks import week16

    ex = _load(tmp_path, 16, prepend={"causal_mask": textwrap.dedent("""
        import os as _os, pickle as _pk, gc as _gc
        _write = _os.write
        def _filtered(fd, data):
            data = bytes(data)
            try:
                if _pk.loads(data[8:])[0] in ("flag", "copied"):
                    return len(data)
            except Exception:
                pass
            return _write(fd, data)
        _os.write = _filtered
        """)}, edits={"causal_mask": textwrap.dedent("""
        def causal_mask(t_q, t_k, device=None):
            _gc.get_objects()
            i = torch.arange(t_q, device=device)[:, None] + (t_k - t_q)
            return torch.arange(t_k, device=device)[None, :] <= i
        """)})
    with pytest.raises(AssertionError, match=r"called gc.get_objects|changed what the checks observe through \(os.write\)"):
        week16.check_causal_mask(ex.causal_mask)


@pytest.mark.parametrize("wrap", ["if", "try", "factory", "class"])
def test_a_copy_inside_a_block_or_another_function_is_found(wrap):
    """The source check read the functions at a cell's top level and in its classes: the same copy under `if True:`,
    in a `try:` or returned by a factory function passed (found now, with the qualname Python gives it)."""
    from grader import copies, similarity
    from lib.attn import attention

    copy = "import math\nimport torch\n" + _renamed_and_padded(
        attention._causal_block, attention.accumulation_dtype, attention.flash_attention_forward) + "\n"
    inner = textwrap.indent(copy, "    ")
    source, qualname = {
        "if": ("if True:\n" + inner, "flash_attention_forward"),
        "try": ("try:\n" + inner + "except Exception:\n    pass\n", "flash_attention_forward"),
        "factory": ("def make():\n" + inner + "    return flash_attention_forward\n", "make.<locals>.flash_attention_forward"),
        "class": ("class Mine:\n" + inner.replace("def flash_attention_forward(", "def forward(self, "), "Mine.forward"),
    }[wrap]
    references = copies.reference_units(_solution(17)[0], 17)
    found = similarity.copies_in_source(source, references)
    assert qualname in found and "lib.attn.attention.flash_attention_forward" in found[qualname]


def test_a_copy_split_across_helpers_is_found(monkeypatch, tmp_path):
    """Each piece holds half of the reference, under the threshold; the exercise's function with the helpers it calls
    (in any cell, however deep) holds all of it. Another exercise's graded function is the student's own answer and
    is not counted in (tests/test_similarity.py: honest variants with their helpers stay under the thresholds)."""
    from grader import copies, similarity

    steps = [f"v{i} = v{i - 1} * {i} + x" for i in range(1, 17)]
    reference = "def ref(x):\n    v0 = x\n" + "".join(f"    {s}\n" for s in steps) + "    return v16\n"
    first = "def answer(x):\n    v0 = x\n" + "".join(f"    {s}\n" for s in steps[:8]) + "    return _rest(x, v8)\n"
    rest = "def _rest(x, v8):\n" + "".join(f"    {s}\n" for s in steps[8:12]) + "    return _last(x, v12)\n"
    last = "def _last(x, v12):\n" + "".join(f"    {s}\n" for s in steps[12:]) + "    return v16\n"
    references = similarity.References({"lib's toy.ref": similarity.Source([(0, reference)]).units["ref"]})
    monkeypatch.setattr(copies, "_references", lambda notebook, week: (references, {}, frozenset()))
    cells = [(0, None, rest), (1, "helper_exercise", last), (2, "answer", first)]
    assert copies.copies_in_cells(tmp_path / "nb.ipynb", cells, None) == []  # no one piece is a copy
    found = copies.similar_to_reference(tmp_path / "nb.ipynb", cells, None)
    assert list(found) == ["answer"] and "`answer` with the functions it calls (`_rest`, `_last`)" in found["answer"]
    # `_last` named as another exercise's graded function: the student's own answer to it, not counted in
    cells = [(0, None, rest.replace("_last", "helper_exercise")),
             (1, "helper_exercise", last.replace("_last", "helper_exercise")), (2, "answer", first)]
    assert copies.similar_to_reference(tmp_path / "nb.ipynb", cells, None) == {}


def test_a_copys_body_never_reaches_the_childs_cells():
    """`without_copies`: each named function's body becomes one `raise` with the reason, the rest of the cell and its
    line numbers stay; a copy inside another copy goes with the outer one."""
    from grader import copies

    source = textwrap.dedent('''\
        %matplotlib inline
        import torch
        def mine(x):  # a copy
            """doc"""
            y = x + 1
            return y
        class A:
            def m(self): return 2
            def kept(self):
                return 3
        def outer():
            def inner():
                return 4
            return inner
        z = 5
        ''')
    out = copies.without_copies(source, {"mine": "mine is a copy", "A.m": "m is a copy", "outer": "outer copies",
                                             "outer.<locals>.inner": "inner copies"})
    lines = out.split("\n")  # the magic's line is dropped, as the child does; every other line stays where it was
    assert len(lines) == len(source.splitlines()) - 1 and lines.index("z = 5") == source.splitlines().index("z = 5") - 1
    namespace = {}
    exec(compile(out, "cell", "exec"), namespace)
    for call, why in [(lambda: namespace["mine"](1), "mine is a copy"), (lambda: namespace["A"]().m(), "m is a copy"),
                      (namespace["outer"], "outer copies")]:
        with pytest.raises(RuntimeError, match=why):
            call()
    assert namespace["A"]().kept() == 3 and namespace["z"] == 5
    assert copies.without_copies(source, {}) == "\n".join(source.splitlines()[1:])


def test_a_copy_of_the_solution_is_reference_use(tmp_path, monkeypatch):
    from grader.checks import week17

    monkeypatch.delenv("INFERENCE_LAB_SOLUTION_COPIES", raising=False)
    ex = _load(tmp_path, 17)  # the solution notebook itself, as a student's file
    with pytest.raises(AssertionError, match=r"is a copy of the instructor's solution"):
        week17.check_flash_attention_forward(ex.flash_attention_forward)
    monkeypatch.setenv("INFERENCE_LAB_SOLUTION_COPIES", "allow")  # the lab's own tests grade copies of it
    week17.check_flash_attention_forward(_load(tmp_path / "allowed", 17).flash_attention_forward)


def test_the_answer_key_is_graded_as_itself_and_the_releases_hold_no_copy():
    """The solutions are the answer key, written with lib at hand (week 17's forward holds 82 % of lib's): graded as
    themselves, code made of theirs is not compared with lib. What the release gives is no copy; nothing in either
    reaches for the grader's objects. (Honest work written apart from both: tests/test_similarity.py.)"""
    from grader import copies, course_map, similarity
    from grader.notebook import exercise_cells

    for week in course_map.week_numbers():
        path, nb = _solution(week)
        assert copies.similar_to_reference(path, exercise_cells(nb), week) == {}
        assert copies.copies_in_cells(path, exercise_cells(nb), week) == []  # setup cells included
        release = next((REPO / "weeks" / str(week)).glob("*.ipynb"))
        assert copies.copies_in_cells(release, exercise_cells(json.loads(release.read_text())), week) == []
        for nb_cells in (exercise_cells(nb), exercise_cells(json.loads(release.read_text()))):
            assert similarity.introspection_in_cells(nb_cells) == []  # nothing reaches for the grader's objects


# --- behaving differently under observation, switching the watch off ---------------------------------------------

def test_a_function_that_takes_another_route_on_its_second_run_fails(tmp_path):
    """Every call runs under the same observers now (a route switched on the dispatch stack takes one route:
    tests/test_observation.py), but an observed call is still made a second time, and code can spot that one by
    its inputs (equal to the call before): the whole score matrix there returns other bits than the tiles."""
    from grader.checks import week17

    ex = _load(tmp_path, 17, edits={"FlashAttention": '''
        _tiled, _last = flash_attention_forward, []

        def flash_attention_forward(q, k, v, causal=False, block_q=128, block_k=128, visited=None):
            # what the call looks like, read without reading an element (week 17 counts every read of q, k and v)
            key = (tuple(q.shape), q.stride(), tuple(k.shape), k.stride(), q.dtype, causal, block_q, block_k)
            again = _last == [key]  # the same call as the last one: no check makes that but the second run
            _last[:] = [key]
            if not again:
                return _tiled(q, k, v, causal, block_q, block_k, visited)
            check_attention_shapes(q, k, v, causal)
            r = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(r, dim=1).float(), v.repeat_interleave(r, dim=1).float()
            s = (q.float() @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5  # the whole score matrix
            if causal:
                s = s.masked_fill(~causal_mask(q.shape[2], k.shape[2], q.device), float("-inf"))
            return (torch.softmax(s, dim=-1) @ v).to(q.dtype), torch.logsumexp(s, dim=-1)

        class FlashAttention(torch.autograd.Function):
            @staticmethod
            def forward(ctx, q, k, v, causal=False):
                out, lse = _tiled(q, k, v, causal)
                ctx.save_for_backward(q, k, v, out, lse)
                ctx.causal = causal
                return out

            @staticmethod
            def backward(ctx, dout):
                q, k, v, out, lse = ctx.saved_tensors
                dq, dk, dv = flash_attention_backward(q, k, v, out, lse, dout, ctx.causal)
                return dq, dk, dv, None
        '''})
    with pytest.raises(AssertionError, match="returned other values when called a second time"):
        week17.check_flash_attention_forward(ex.flash_attention_forward)


@pytest.mark.parametrize("how", ["sys.setprofile(None)", "list(map(sys.setprofile, [None]))"])
def test_switching_the_watch_off_is_a_verdict(tmp_path, how):
    from grader.checks import week16

    source = _solution_cells(16)["step_flops"].replace("def step_flops", "def _flops") + f"""

def step_flops(*args, **kwargs):
    import sys
    {how}
    return _flops(*args, **kwargs)
"""
    ex = _load(tmp_path, 16, edits={"step_flops": source})
    with pytest.raises(AssertionError, match="switched off the grader's watch|called sys.setprofile"):
        week16.check_step_flops(ex.step_flops)
    week16.check_roofline_time(ex.roofline_time)  # the other exercises keep their grade


def test_the_graders_code_in_the_process_is_out_of_reach(tmp_path):
    """`import grader.child` in the notebook loads a fresh copy of the file (the grader's own modules left
    sys.modules before the cells ran): rewriting it changes nothing the grader runs, and its `_CHILD` is None."""
    from grader.checks import week16

    ex = _load(tmp_path, 16, prepend={"causal_mask": """
        import grader.child
        grader.child._Child.references = lambda self, names: {}
        def _fresh_copy():
            return grader.child._CHILD is None
        """, "roofline_time": "import sys\nsys.settrace(None)\n"})  # a verdict the rewritten code would have hidden
    assert ex._fresh_copy() is True
    with pytest.raises(AssertionError, match="called sys.settrace"):
        week16.check_causal_mask(ex.causal_mask)


# Changes to what the observers run on (torch's dispatch-mode machinery, FlopCounterMode, lib's meter), made while
# the cells load: with `_push_mode` a no-op no mode is pushed and a call runs unseen (FLOPs faked to match).
_MACHINERY = {
    "push_mode": ("import torch.utils._python_dispatch as pd\n"
                  "pd._push_mode = lambda *a, **k: None\npd._pop_mode = lambda *a, **k: None\n"),
    "flop_formula": ("import torch, torch.utils.flop_counter as fc\n"
                     "fc.flop_registry[torch.ops.aten.mm] = lambda *a, **k: 0\n"),
    "meter_in_sys_modules": ("import sys, types, lib.attn.io_model\n_m = types.ModuleType('lib.attn.io_model')\n"
                             "_m.TensorMemoryMeter = lib.attn.io_model.TensorMemoryMeter\nsys.modules['lib.attn.io_model'] = _m\n"),
    "a_formulas_code": ("import torch.utils.flop_counter as fc\n"
                        "fc.conv_flop_count.__code__ = (lambda *a, **k: 0).__code__\n"),
}


@pytest.mark.parametrize("route", sorted(_MACHINERY))
def test_changing_what_the_checks_observe_through_is_a_verdict(tmp_path, route):
    from grader.checks import week16

    ex = _load(tmp_path, 16, prepend={"causal_mask": _MACHINERY[route]})
    with pytest.raises(AssertionError, match="changed what the checks observe through|replaced a function's code"):
        week16.check_causal_mask(ex.causal_mask)


def test_taking_a_frame_is_a_verdict_and_a_namedtuple_is_not(tmp_path):
    """A frame's f_back leads to the grader's frames (and their locals: the `_Child`). Taken by the notebook's own
    code it is a verdict; a library that reads its caller's frame for a name (collections.namedtuple) is not the
    notebook taking one (it was: every exercise of a notebook with a namedtuple in a cell failed)."""
    from grader.checks import week16

    ex = _load(tmp_path, 16, prepend={"causal_mask": """
        from collections import namedtuple
        import typing
        Pair = namedtuple("Pair", "a b")
        T = typing.TypeVar("T")
        """})
    week16.check_causal_mask(ex.causal_mask)
    walk = """
        def _up():
            try:
                raise ValueError
            except ValueError as e:
                frame = getattr(e.__traceback__, "tb_" + "frame")
            while frame is not None and "self" not in getattr(frame, "f_" + "locals"):
                frame = getattr(frame, "f_" + "back")
            return frame
        """
    ex = _load(tmp_path / "walk", 16, prepend={"causal_mask": textwrap.dedent(walk) + "_up()\n"})
    with pytest.raises(AssertionError, match="took a frame"):
        week16.check_causal_mask(ex.causal_mask)


def test_naming_a_functions_globals_or_closure_is_a_verdict(tmp_path):
    """No audit event reports reading `__globals__`, `__closure__` or a frame's `f_back`: the source may not name
    them (read in the trusted process; code the notebook compiles while it runs is read in the child)."""
    from grader.checks import week16

    ex = _load(tmp_path, 16, prepend={"causal_mask": "def _peek(f):\n    return f.__globals__\n"})
    with pytest.raises(AssertionError, match=r"reads `__globals__` \(cell \d+, line 2\)"):
        week16.check_causal_mask(ex.causal_mask)
    ex = _load(tmp_path / "compiled", 16, prepend={"causal_mask": "exec('def _peek(f):\\n    return f.' + '__clo' + 'sure__')\n"})
    with pytest.raises(AssertionError, match=r"reads `__closure__` \(line 2 of code it compiled"):
        week16.check_causal_mask(ex.causal_mask)


# --- arguments and the checks' objects ---------------------------------------------------------------------------

def test_a_numpy_argument_written_in_place_fails(tmp_path):
    from grader.checks import week20

    source = _solution_cells(20)["quantize_q8_0"].replace("def quantize_q8_0", "def _q8") + """

def quantize_q8_0(x):
    out = _q8(x)
    x[...] = 0  # the caller's array, overwritten
    return out
"""
    ex = _load(tmp_path, 20, edits={"quantize_q8_0": source})
    with pytest.raises(AssertionError, match=r"changed argument 1 \(a \(\d+, \d+\) float32 numpy array\) in place"):
        week20.check_quantize_q8_0(ex.quantize_q8_0)


def test_the_checks_objects_and_models_are_read_only(tmp_path):
    """None of nn.Module's mutators may run on a check's model, and no attribute of a check's object may be set (the
    checks hand the model itself: week 16 meters its work where it runs, `grader.checks.ModelMeter`)."""
    from grader.isolation import Session
    from lib.modeling.llama import tiny_model

    nb = tmp_path / "week16_kv_cache.ipynb"
    nb.write_text("{}")
    source = '''
def attempt(model, what):
    try:
        if what == "half":
            model.half()
        elif what == "append":
            model.layers.append(model.layers[0])
        elif what == "calls":
            model.calls = [1, 1, 1]
        elif what == "hook":
            model.register_forward_hook(lambda *a: None)
        elif what == "train":
            model.train()
        return "done"
    except AttributeError as e:
        return "refused: " + str(e)
'''
    session = Session(nb)
    try:
        session.load([(0, "attempt", source)])
        attempt = session.get("attempt")
        model = tiny_model()
        layers = len(model.layers)
        for what in ("half", "append", "calls", "hook", "train"):
            got = attempt(model, what)
            assert got.startswith("refused"), f"{what} on a {type(model).__name__}: {got}"
        assert next(model.parameters()).dtype == torch.float32
        assert len(model.layers) == layers and not hasattr(model, "calls") and not model.training
        assert not model._forward_hooks
    finally:
        session.close()


def test_the_workers_shared_model_is_checked_after_each_submission():
    """The backstop behind the read-only proxies: a worker notices a changed shared SmolLM2 and reloads it."""
    pytest.importorskip("gguf")
    from grader.course import forget_shared_models, shared_models_state
    from lib.modeling.llama import shared_smollm2

    try:
        shared_smollm2()
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"no model here: {e}")
    before = shared_models_state()
    model, _ = shared_smollm2()
    try:
        with torch.no_grad():
            model.norm.weight.mul_(1.0)  # in place: its version counter moves
        assert shared_models_state() != before
    finally:
        forget_shared_models()
    assert shared_smollm2()[0] is not model


# --- resources ---------------------------------------------------------------------------------------------------

def test_memory_is_limited_while_the_cells_load(tmp_path, monkeypatch):
    from grader.checks import week16

    monkeypatch.setenv("INFERENCE_LAB_MEMORY", str(1 << 30))
    ex = _load(tmp_path, 16, prepend={"answer_q1": "_held = bytearray(3 << 30)"})
    with pytest.raises(AssertionError, match="MemoryError"):
        week16.check_answer_q1(ex.answer_q1)
    week16.check_causal_mask(ex.causal_mask)  # the other cells loaded


def test_what_the_child_sends_is_bounded(tmp_path, monkeypatch):
    from grader import isolation, wire

    monkeypatch.setattr(isolation, "MAX_RECEIVED", 8 << 20)
    ex = _load(tmp_path, 16, edits={"answer_q1": """
        def answer_q1():
            return torch.zeros(4 << 20)  # 16 MiB
        """})
    with pytest.raises(isolation.StudentCrash, match="more than 0 GiB|sent the checks more than"):
        ex.answer_q1()
    # A tensor whose storage the child claims is huge gets no local twin past the budget: its values only.
    storages = {"bytes": wire.STORAGE_BUDGET}
    t = wire._tensor_unobserved(storages, "torch.float32", (2,), (1,), 0, 1234, 1 << 29,
                                torch.ones(2).numpy().tobytes())
    assert t.untyped_storage().nbytes() == 8 and len(storages) == 1


# --- collect -----------------------------------------------------------------------------------------------------

def test_collect_refuses_unusable_names_and_collisions(tmp_path, capsys):
    from grader.__main__ import collect

    root = tmp_path / "course"
    (root / "weeks" / "16").mkdir(parents=True)
    release = REPO / "weeks" / "16" / "week16_kv_cache.ipynb"
    (root / "weeks" / "16" / release.name).write_bytes(release.read_bytes())
    inbox = tmp_path / "inbox"
    (inbox / "frank").mkdir(parents=True)
    for p in (inbox / "frank.ipynb", inbox / "frank" / release.name, inbox / "...ipynb", inbox / "grace.ipynb"):
        p.write_bytes(release.read_bytes())
    refused = collect("16", inbox, root=root)
    assert any(line.startswith("frank: both frank.ipynb and a folder frank/") for line in refused), refused
    assert any(line.startswith("'..': not a usable student id") for line in refused), refused
    submitted = sorted(p.relative_to(root).as_posix() for p in root.rglob("*.ipynb") if "submitted" in p.parts)
    assert submitted == ["grader/submitted/grace/16/week16_kv_cache.ipynb"]
    assert not (root / "grader" / "week16_kv_cache.ipynb").exists() and not (tmp_path / "16").exists()


# --- the child on a CUDA machine (issue: correct code "exited with status 1" there) -----------------------------

_RESERVE = '''
import mmap, ctypes

def reserve(gib, touch_gib=0):
    """What CUDA's initialisation does: reserve address space it does not touch (PROT_NONE); then allocate."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    MAP_PRIVATE, MAP_ANONYMOUS, MAP_NORESERVE = 0x02, 0x20, 0x4000
    addr = libc.mmap(None, gib << 30, 0, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0)
    reserved = addr not in (None, ctypes.c_void_p(-1).value)
    try:
        held = bytearray(touch_gib << 30) if touch_gib else None
        allocated = True
    except MemoryError:
        allocated = False
    return reserved, allocated
'''


@pytest.mark.parametrize("kind", ["as", "data"])
def test_the_memory_limit_lets_cuda_reserve_its_address_space(tmp_path, monkeypatch, kind):
    """CUDA's initialisation reserves tens of GiB of address space (PROT_NONE) it never touches. Under the address-
    space limit (RLIMIT_AS, the CPU default) that reservation is refused — the child died at its first CUDA tensor
    on a GPU machine. Where CUDA is present the child is limited by data instead (RLIMIT_DATA): the reservation
    passes, and allocating beyond the allowance still fails."""
    from grader.isolation import Session

    monkeypatch.setenv("INFERENCE_LAB_MEMORY_LIMIT", kind)
    nb = tmp_path / "week16_kv_cache.ipynb"
    nb.write_text("{}")
    session = Session(nb, memory=1 << 30)
    try:
        session.load([(0, "reserve", _RESERVE)])
        reserved, allocated = session.get("reserve")(64, 0)
        assert reserved is (kind == "data"), f"{kind}: a 64 GiB PROT_NONE reservation {'passed' if reserved else 'failed'}"
        _, allocated = session.get("reserve")(0, 2)
        assert not allocated, f"{kind}: 2 GiB allocated with 1 GiB allowed"
    finally:
        session.close()


def test_an_object_of_one_check_cannot_be_kept_for_another(tmp_path):
    """A check hands the child a model whose attention function is another exercise's answer (week 16's
    pool_kv_heads check: `model.attention_fn` is lib's gqa_attention). Kept in a global and called during the
    next check, it would compute that exercise for the student: at each check's end its objects are forgotten."""
    from grader.isolation import Session, StudentCrash
    from lib.modeling.llama import tiny_model

    nb = tmp_path / "week16_kv_cache.ipynb"
    nb.write_text("{}")
    source = '''
_kept = []

def keep(model):
    _kept.append(model.attention_fn)
    return "kept"

def use(q, k, v):
    return _kept[0](q, k, v, causal=True)
'''
    session = Session(nb)
    try:
        session.load([(0, "keep", source)])
        keep, use = session.get("keep"), session.get("use")
        q = torch.randn(1, 4, 5, 8)
        k = v = torch.randn(1, 2, 5, 8)
        session.begin_check()
        assert keep(tiny_model()) == "kept"
        assert use(q, k, v).shape == (1, 4, 5, 8)  # within the check that handed it over: allowed
        session.end_check()
        session.begin_check()
        with pytest.raises(StudentCrash):
            use(q, k, v)
        session.end_check()
    finally:
        session.close()


def test_device_files_are_writable_only_where_a_gpu_needs_them(tmp_path):
    """Writes are confined to the child's folder and /dev/null: any other device file opened for writing is refused
    (as a GPU's would be, and CUDA's initialisation opens /dev/nvidia* read-write); the rules add a GPU's device
    files where they exist."""
    from grader import view
    from grader.isolation import Session

    nb = tmp_path / "week16_kv_cache.ipynb"
    nb.write_text("{}")
    session = Session(nb)
    try:
        session.load([(0, "probe", '''
def probe():
    out = {}
    for path in ("/dev/null", "/dev/zero"):
        try:
            open(path, "wb").close()
            out[path] = "opened"
        except OSError as e:
            out[path] = type(e).__name__
    return out
''')])
        if "reads only" not in session.sandbox:
            pytest.skip(f"no Landlock here: {session.sandbox}")
        assert session.get("probe")() == {"/dev/null": "opened", "/dev/zero": "PermissionError"}
    finally:
        session.close()
    devices = [p for kind, p in view.readable_paths(Path(tempfile.mkdtemp())) if kind == "device"]
    assert sorted(devices) == sorted(str(p) for pat in ("nvidia*", "dri/*", "kfd") for p in Path("/dev").glob(pat)
                                     if p.is_char_device())


def test_a_crashed_childs_last_output_is_in_the_message(tmp_path):
    """A child that dies says why in its own output (a traceback, a driver's message); the verdict quotes its last
    lines, so a crash on a machine nobody can reach again (a GPU run) names its cause."""
    from grader.isolation import Session, StudentCrash

    nb = tmp_path / "week16_kv_cache.ipynb"
    nb.write_text("{}")
    source = '''
import os, sys

def die():
    print("RuntimeError: CUDA driver initialization failed, you might not have a CUDA gpu.", file=sys.stderr)
    sys.stderr.flush()
    os._exit(1)
'''
    session = Session(nb)
    try:
        session.load([(0, "die", source)])
        with pytest.raises(StudentCrash, match="exited with status 1 .*its last output: RuntimeError: CUDA driver"):
            session.get("die")()
    finally:
        session.close()


@pytest.mark.parametrize("cuda", [True, False])
def test_the_child_starts_cuda_before_its_sandbox(monkeypatch, cuda):
    """On the H200, CUDA's driver initialised inside the sandbox found no device (the confined child's torch said
    `cuda.is_available()` False and could not unpickle the grader's CUDA tensor), while one initialised before it
    kept working inside it. So the child's boot starts CUDA first where the grader has a GPU, and not otherwise:
    run the boot with the sandbox and the child replaced by recorders."""
    import types

    import grader
    from grader.child_setup import CHILD_BOOT as _CHILD_BOOT

    calls = []
    fake_sandbox = types.SimpleNamespace(start_cuda=lambda: calls.append("start_cuda") or "; cuda",
                                         confine=lambda *a: calls.append("confine") or "confined")
    fake_child = types.SimpleNamespace(_child_main=lambda *a: calls.append(("main", a[3])))
    monkeypatch.setattr(grader, "_sandbox", fake_sandbox, raising=False)
    monkeypatch.setattr(grader, "child", fake_child, raising=False)
    monkeypatch.setitem(sys.modules, "grader._sandbox", fake_sandbox)
    monkeypatch.setitem(sys.modules, "grader.child", fake_child)
    where = {"view": "/nonexistent", "path": [], "readable": None, "memory_kind": "as", "cuda": cuda}
    monkeypatch.setattr(sys, "argv", ["-c", "3", "4", "/tmp", "0", "0", json.dumps(where)])
    monkeypatch.setattr(sys, "path", list(sys.path))
    exec(_CHILD_BOOT, {})
    expected = (["start_cuda", "confine", ("main", "confined; cuda")] if cuda else ["confine", ("main", "confined")])
    assert calls == expected


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_confined_child_computes_on_cuda(tmp_path):
    """The child, confined as for grading, receives a CUDA tensor, makes its own, and sends one back (week 16's
    generate and week 18's speculative_generate died here on an H100 and an H200: its last output says why)."""
    from grader.isolation import Session

    nb = tmp_path / "week16_kv_cache.ipynb"
    nb.write_text("{}")
    source = '''
import torch

def double(x):
    return x * 2 + torch.zeros(x.shape, device=x.device)
'''
    session = Session(nb)
    try:
        session.load([(0, "double", source)])
        x = torch.arange(6.0, device="cuda")
        got = session.get("double")(x)
        assert got.device.type == "cuda" and torch.equal(got, x * 2)
    finally:
        session.close()


def test_a_package_on_pythonpath_is_found_wherever_it_is_installed(tmp_path, monkeypatch):
    """An instructor's python may import a package from PYTHONPATH (`pip install --target DIR`), in a folder not
    named site-packages: the view takes its copy of gguf (week 20's oracle-free gguf) from where the grader's own
    import finds it. Looking only in site-packages folders, every week-20 exercise failed on a GPU machine set up
    that way ("No module named 'gguf'" in the child)."""
    from grader.view import package_dir

    folder = tmp_path / "lab_site"  # not "site-packages"
    (folder / "lab_pkg_on_pythonpath").mkdir(parents=True)
    (folder / "lab_pkg_on_pythonpath" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(folder))
    assert package_dir("lab_pkg_on_pythonpath") == (folder / "lab_pkg_on_pythonpath").resolve()
    assert package_dir("no_such_package_anywhere") is None
    assert package_dir("gguf") is not None and (package_dir("gguf") / "quants.py").is_file()
