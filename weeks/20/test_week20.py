"""Week 20 checks: `pytest weeks/20` (your notebook) or `pytest weeks/20 -k ex03` (one exercise).

Only the notebook's exercise cells are run (no demos, no plots); the checks live in grader/checks/week20.py
and are the same ones the notebook's graded cells call. gguf-py is the oracle: every byte must match it.
"""
from grader.checks import week20 as checks
from grader.fixtures import ex  # noqa: F401  (the fixture: the exercises of the notebook beside this file)


def test_ex01_quantize_q8_0(ex):
    """Milestone: Q8_0 bytes equal gguf-py's on random, heavy-tailed, real SmolLM2 and rounding-tie blocks."""
    checks.check_quantize_q8_0(ex.quantize_q8_0)


def test_ex02_quantize_q4_1(ex):
    """Milestone: Q4_1 bytes equal gguf-py's, ties included."""
    checks.check_quantize_q4_1(ex.quantize_q4_1)


def test_ex03_quantize_q5_0(ex):
    """Q5_0 bytes equal gguf-py's: the fifth bits packed into a little-endian uint32, near-ties included."""
    checks.check_quantize_q5_0(ex.quantize_q5_0)


def test_ex04_predict_rmse(ex):
    """Your model of a format's RMS error, from each block's min and max, within 0.8-1.25x of the measured error on
    tensors and formats drawn this run."""
    checks.check_predict_rmse(ex.predict_rmse)


def test_ex05_dequantize_q4_k(ex):
    """Milestone: Q4_K dequantized bit-exact with gguf-py (packed 6-bit scales and mins)."""
    checks.check_dequantize_q4_k(ex.dequantize_q4_k)


def test_ex06_quantize_q4_k(ex):
    """Q4_K as good as llama.cpp's scale search: within 0.5 % of its weighted error, 1 % of its RMSE, below 0.95x
    Q4_1's on Gaussian weights."""
    checks.check_quantize_q4_k(ex.quantize_q4_k)


def test_ex07_column_importance(ex):
    """The importance matrix: per-column weights proportional to the mean squared activation, float32 from float16."""
    checks.check_column_importance(ex.column_importance)


def test_ex08_allocate_bits(ex):
    """Within the budget, saving at least the perplexity a greedy allocation by ΔPPL per weight saves."""
    checks.check_allocate_bits(ex.allocate_bits)


def test_ex09_gptq_quantize(ex):
    """GPTQ: lib.quantization.gptq's weights on a uniform grid, as low an output error on held-out inputs; inputs unchanged."""
    checks.check_gptq_quantize(ex.gptq_quantize)


def test_ex10_awq_quantize(ex):
    checks.check_awq_quantize(ex.awq_quantize)


def test_ex11_gguf_bytes(ex):
    """A GGUF v3 file's bytes that gguf-py reads back: names, types, dims innermost first, data at aligned offsets."""
    checks.check_gguf_bytes(ex.gguf_bytes)


def test_ex12_answer_q9(ex):
    """The two most costly tensor types of a sensitivity measurement drawn this run, as GGUF names."""
    checks.check_answer_q9(ex.answer_q9)
