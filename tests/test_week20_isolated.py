"""Week 20's wrong routes of issues 21 and 56 (ISOLATED_CASES) and the honest routes a problem posed without its
method admits (HONEST_CASES), graded as `pytest weeks/20` grades a student: in an isolated process, in the week's view
and behind it. The routes' source: tests/_week20_routes.py; the in-process checks: tests/test_week20_checks.py."""
import importlib.util
from pathlib import Path

import pytest

from grader.checks import week20 as checks
from grader.harness import load_exercises
from grader.view import ViewSpec

pytestmark = pytest.mark.model  # the checks draw real SmolLM2 rows

_spec = importlib.util.spec_from_file_location("_week20_routes", Path(__file__).with_name("_week20_routes.py"))
_routes = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_routes)
WRONG_ROUTES = _routes.WRONG_ROUTES


# (check, wrong route, what its one-line reason must say)
ISOLATED_CASES = [
    ("dequantize_q4_k", "dq4_k_gguf_class", "calls gguf-py"),
    ("quantize_q8_0", "q8_0_gguf", "calls gguf-py"),
    # (behind the view: compiling gguf-py's or lib's source is refused, its functions being copies of gguf-py's, the
    # week's oracle, or of the answer key: grader/copies.py)
    ("quantize_q8_0", "q8_0_gguf_source", "is a copy of gguf-py's gguf.quants"),
    ("quantize_q8_0", "q8_0_lib_source", "is a copy of lib's lib.gguf.qformats"),
    ("quantize_q8_0", "q8_0_trunc_in_float32", "differ"),
    ("quantize_q8_0", "q8_0_flush_subnormal", "differ"),
    ("quantize_q4_1", "q4_1_exact_half_up", "differ"),
    ("quantize_q8_0", "q8_0_divide", "differ"),
    ("quantize_q8_0", "q8_0_float64", "differ"),
    ("quantize_q4_1", "q4_1_divide", "differ"),
    ("quantize_q5_0", "q5_0_divide", "differ"),
    ("quantize_q4_k", "q4_k_min_max", "Q4_1's"),
    ("quantize_q5_0", "q5_0_gguf_class", "calls gguf-py"),
    ("column_importance", "imp_abs_mean", "AWQ's statistic"),
    ("column_importance", "imp_variance", "variance"),
    ("column_importance", "imp_rms", "root mean square"),
    ("column_importance", "imp_first_dim", "all dims but the last"),
    ("column_importance", "imp_first_1024_tokens", "average over every token"),
    ("column_importance", "imp_512_random_tokens", "average over every token"),
    ("column_importance", "imp_squares_in_half", "overflow"),
    ("column_importance", "imp_in_input_dtype", "float32 whatever"),
    ("column_importance", "imp_in_place", "in place"),
    ("column_importance", "imp_cpu_sum", "device"),
    ("allocate_bits", "allocate_no_guard", "saves ΔPPL"),
    ("gptq_quantize", "gptq_kmeans", "uniform"),
    ("gptq_quantize", "gptq_diag_search", "GPTQ's"),
    ("gptq_quantize", "gptq_in_place", "in place"),
    ("gptq_quantize", "gptq_cpu_eye", "device"),
    ("gptq_quantize", "gptq_batch_only", "past its lazy batch"),
    ("gptq_quantize", "gptq_damp_ignored", "the argument, not a constant"),
    ("awq_quantize", "awq_zero_kmeans", "uniform"),
    ("awq_quantize", "awq_fixed_alpha_05", "no fixed one fits them all"),
    ("awq_quantize", "awq_n_grid_ignored", "not a fixed number"),
    ("awq_quantize", "awq_fixed_alpha_09", "no fixed one fits them all"),
    ("awq_quantize", "awq_diagonal_error", "cross terms between channels included"),
    ("awq_quantize", "awq_first_128_tokens", "over every token of x"),
    ("gguf_bytes", "gguf_via_writer", "calls gguf-py"),
    ("gguf_bytes", "gguf_dims_as_torch", "innermost first"),
    ("gguf_bytes", "gguf_back_to_back", "multiple of the alignment"),
    ("gguf_bytes", "gguf_data_out_of_order", "ggml's own loader expects it"),
    ("gguf_bytes", "gguf_characters", "UTF-8"),
    ("gguf_bytes", "gguf_silent_alignment", "general.alignment"),
    ("gguf_bytes", "gguf_unpadded_infos", "first multiple of the alignment"),
    ("gguf_bytes", "gguf_trailing_bytes", "nothing else"),
    ("gguf_bytes", "gguf_version_2", "write version 3"),
    ("gguf_bytes", "gguf_alignment_u64", "value type is 4 (uint32)"),
    ("predict_rmse", "predict_max_error", "a model within 0.8-1.25x passes"),
    ("predict_rmse", "predict_mean_step", "a model within 0.8-1.25x passes"),
    ("predict_rmse", "predict_affine_everywhere", "a model within 0.8-1.25x passes"),
    ("predict_rmse", "predict_symmetric_everywhere", "a model within 0.8-1.25x passes"),
    ("predict_rmse", "predict_tensor_range", "a model within 0.8-1.25x passes"),
    ("predict_rmse", "predict_no_root", "a model within 0.8-1.25x passes"),
    ("predict_rmse", "predict_four_bits_for_q5", "a model within 0.8-1.25x passes"),
    ("answer_q9", "q9_fixed", "not a fixed set"), ("answer_q9", "q9_hf_names", "GGUF names"),
    ("answer_q9", "q9_least_costly", "the two types that cost the most"),
    ("answer_q9", "q9_first_two", "the two types that cost the most")]
# Problems posed without their method (issue 56): routes other than the solution's that reach the answer pass.
HONEST_CASES = [("gptq_quantize", "gptq_explicit_inverse"), ("allocate_bits", "allocate_exact")]


def _wrong_routes(tmp_path_factory, view=None):
    nb = {"cells": [{"cell_type": "code", "metadata": {"tags": ["setup"]}, "source": WRONG_ROUTES, "outputs": [],
                     "execution_count": None}], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path = tmp_path_factory.mktemp("wrong") / checks.WEEK.notebook
    path.write_text(__import__("json").dumps(nb))
    return load_exercises(path, isolated=True, view=view)


@pytest.fixture(scope="module")
def wrong(tmp_path_factory):
    """The routes in the week's view (grader.view), as `pytest weeks/20` and autograde run them."""
    ex = _wrong_routes(tmp_path_factory)
    yield ex
    ex.close()


@pytest.fixture(scope="module")
def wrong_behind_the_view(tmp_path_factory):
    """The routes with lib and gguf-py whole and readable, as on a machine without Landlock's read restriction."""
    ex = _wrong_routes(tmp_path_factory, ViewSpec.everything(20))
    yield ex
    ex.close()


# Routes that call gguf-py's quantizers or writer, or exec gguf-py's or lib's source: in the week's view those are
# stubs ("... is not available to your code"); behind it the fingerprints recognise them (the reasons listed).
AT_THE_DOOR = {"dq4_k_gguf_class", "q8_0_gguf", "q8_0_gguf_source", "q8_0_lib_source",
               "q5_0_gguf_class", "gguf_via_writer"}


@pytest.mark.parametrize("check, route, reason", ISOLATED_CASES, ids=[c[1] for c in ISOLATED_CASES])
def test_wrong_route_fails_in_the_isolated_process(wrong, check, route, reason):
    with pytest.raises(AssertionError) as info:
        getattr(checks, f"check_{check}")(getattr(wrong, route))
    msg = str(info.value)
    assert ("is not available to your code while this week is graded" if route in AT_THE_DOOR else reason) in msg, msg
    print(f"{route}: {msg.splitlines()[0][:200]}")


@pytest.mark.parametrize("check, route", HONEST_CASES, ids=[c[1] for c in HONEST_CASES])
def test_an_honest_route_of_a_posed_problem_passes_in_the_isolated_process(wrong, check, route):
    getattr(checks, f"check_{check}")(getattr(wrong, route))


@pytest.mark.parametrize("check, route, reason", [c for c in ISOLATED_CASES if c[1] in AT_THE_DOOR],
                         ids=[c[1] for c in ISOLATED_CASES if c[1] in AT_THE_DOOR])
def test_behind_the_view_the_fingerprints_recognise_gguf_and_lib(wrong_behind_the_view, check, route, reason):
    with pytest.raises(AssertionError) as info:
        getattr(checks, f"check_{check}")(getattr(wrong_behind_the_view, route))
    assert reason in str(info.value), str(info.value)
