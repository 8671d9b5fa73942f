"""Grades that cannot be forged, copies of the answer key: a renamed and padded copy of lib or of the solution,
parked in another cell, decoded and exec'd, written to a file and imported, split across helpers or hidden in a
block, and the grader's records that would tell them apart kept out of the notebook's reach. Each is reference use
with a one-line reason, through the isolated path `pytest weeks/NN` takes; the answer key itself is graded as itself.
The rest of the routes to a grade without the work: tests/test_integrity.py."""
from __future__ import annotations

import ast
import importlib.util
import inspect
import json
import textwrap
from pathlib import Path

import pytest


_spec = importlib.util.spec_from_file_location("_integrity_support", Path(__file__).with_name("_integrity_support.py"))
_spec.loader.exec_module(_support := importlib.util.module_from_spec(_spec))
REPO, _solution, _load, _solution_cells = (
    _support.REPO, _support._solution, _support._load, _support._solution_cells)


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
