"""Week 17 checks: `pytest weeks/17` (your notebook) or `pytest weeks/17 -k ex04` (one exercise).

Only the notebook's exercise cells are run (no demos, no plots, no model); the checks live in
grader/checks/week17.py and are the same ones the notebook's graded cells call.
"""
from grader.checks import week17 as checks
from grader.fixtures import ex  # noqa: F401  (the fixture: the exercises of the notebook beside this file)


def test_ex01_naive_attention(ex):
    checks.check_naive_attention(ex.naive_attention)


def test_ex02_score_bytes(ex):
    checks.check_score_bytes(ex.score_bytes)


def test_ex03_online_softmax(ex):
    checks.check_online_softmax(ex.online_softmax)


def test_ex04_flash_attention_forward(ex):
    checks.check_flash_attention_forward(ex.flash_attention_forward)


def test_ex05_standard_io(ex):
    checks.check_standard_io(ex.standard_io)


def test_ex06_flash_io(ex):
    checks.check_flash_io(ex.flash_io)


def test_ex07_flash_attention_backward(ex):
    checks.check_flash_attention_backward(ex.flash_attention_backward)


def test_ex08_FlashAttention(ex):
    checks.check_FlashAttention(ex.FlashAttention)


def test_ex09_merge_partials(ex):
    checks.check_merge_partials(ex.merge_partials)


def test_ex10_flash_decode(ex):
    checks.check_flash_decode(ex.flash_decode)


# Exercise 17 is graded where the notebook has it, section 7, before the Triton exercises: this file runs the
# checks in the notebook's order, as the isolated autograde does (tests/test_paths_agree.py holds the two alike).
def test_ex17_predict_peak_bytes(ex):
    checks.check_predict_peak_bytes(ex.predict_peak_bytes)


def test_ex11_softmax_rows(ex):
    checks.check_softmax_rows(ex.softmax_rows)


def test_ex12_tiled_matmul(ex):
    checks.check_tiled_matmul(ex.tiled_matmul)


def test_ex13_flash_attention_triton(ex):
    checks.check_flash_attention_triton(ex.flash_attention_triton)


def test_ex14_answer_q1(ex):
    checks.check_answer_q1(ex.answer_q1)


def test_ex15_answer_q2(ex):
    checks.check_answer_q2(ex.answer_q2)


def test_ex16_answer_q3(ex):
    checks.check_answer_q3(ex.answer_q3)
