"""Grades that cannot be forged: what a submission's process can reach, through the isolated path `pytest weeks/NN`
takes (`load_exercises` with the week's view, the checks in this process).

Each test is a route someone took, or would take, to a grade without the work: read the answer key (solutions/,
lib's real files, the checks, a classmate's notebook), switch the grader's watch off and call lib, call lib's
code under another exercise's name, behave one way while observed and another way when not, write into an argument,
change a check's object or the shared model, open a socket or read the instructor's environment. Every one must fail the exercise with a one-line reason, and the honest
solution keep passing. Renamed and padded copies of lib or of the solution: tests/test_integrity_copies.py; the
child's resources, collect's names and the child on a CUDA machine: tests/test_integrity_resources.py.
"""
from __future__ import annotations

import importlib.util
import json
import textwrap
from pathlib import Path

import pytest
import torch


_spec = importlib.util.spec_from_file_location("_integrity_support", Path(__file__).with_name("_integrity_support.py"))
_spec.loader.exec_module(_support := importlib.util.module_from_spec(_spec))
REPO, _load, _solution_cells, _reads_restricted = (
    _support.REPO, _support._load, _support._solution_cells, _support._reads_restricted)


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


def test_a_class_of_the_graders_changed_is_a_verdict_a_fresh_copys_is_not(tmp_path):
    """The audit hook's "changed a class of the grader's" is for the classes the grader runs (`OWN`'s): the notebook's
    fresh copy of a grader file is its own, and changing one of its classes changes nothing (red team 9's #5 made the
    fresh copies' code the notebook's; their own code sets attributes of their objects: frozen dataclasses)."""
    from grader.checks import week16

    # a fresh copy of a grader file: its functions are the notebook's to change
    fresh = _load(tmp_path / "a", 16, prepend={"causal_mask": "import grader.course_map as _fresh\n"
                                                            "_fresh.week_numbers.__defaults__ = None\n"})
    week16.check_causal_mask(fresh.causal_mask)
    source = _solution_cells(16)["causal_mask"].replace("def causal_mask", "def _mask") + """

def causal_mask(*args, **kwargs):
    import inspect
    inspect.getclosurevars(torch.Tensor.numpy).globals["_exported"].__defaults__ = None  # the grader's own function
    return _mask(*args, **kwargs)
"""
    real = _load(tmp_path / "b", 16, edits={"causal_mask": source})
    with pytest.raises(AssertionError, match="changed a class of the grader's"):
        week16.check_causal_mask(real.causal_mask)
