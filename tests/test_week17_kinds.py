"""Week 17's kinds of exercise (issue 55): each graded code exercise's answer — formula, algorithm, the code's
shape — is printed after its graded test cell in the student's notebook, never above it (solutions/17/README.md's
table says where)."""
import json
from pathlib import Path

import pytest

from grader.checks import week17 as checks

REPO = Path(__file__).resolve().parents[1]
RELEASE = REPO / "weeks" / "17" / checks.WEEK.notebook

# exercise -> phrases that state its answer: none above the exercise's graded test cell, each of them below it.
ANSWER_AFTER_THE_CHECK = {
    "online_softmax": ["l' = l\\,e^{m - m'}", "softmax(x) = exp(x - m) / l"],
    "flash_attention_forward": ["alpha = exp(m - m_new)", "acc = alpha · acc + p v_j", "lse_i = m + log(l)",
                                "k_start > q_end - 1 + (Nk - Nq)"],
    "flash_attention_backward": ["P_ij = exp(S_ij − lse_i)", "dS_{ij} = P_{ij}\\circ(dP_{ij} - D_i)"],
    "FlashAttention": ["(dq, dk, dv, None, None, None)", "saves `q, k, v, out, lse`"],
    "merge_partials": ["o = \\sum_s e^{\\mathrm{lse}_s - \\mathrm{lse}}", "is the share of the total softmax mass"],
    "flash_decode": ["i·Nk // n_splits"],
    "answer_q1": ["score_bytes(8, 8, 1024, 1024)"],
    "answer_q2": ["T(T+1)/2"],
    "predict_peak_bytes": ["`S` is still alive when softmax writes `P`"],
}
# Phrases that must not appear above the check and are not restated after it (the answer is in the failure hint).
NOWHERE_ABOVE = {"answer_q2": ["T(T+1)/2"]}


def _cells(path):
    return [(c.get("metadata", {}).get("nbgrader", {}).get("grade_id"), " ".join("".join(c["source"]).split()))
            for c in json.loads(path.read_text())["cells"]]


def _test_cell(cells, name):
    return next(i for i, (grade_id, _) in enumerate(cells) if grade_id == f"test_{name}")


def misplaced(cells, name) -> list[str]:
    """What is wrong with where `name`'s answer stands in `cells`: printed above its check, or not given after it."""
    at = _test_cell(cells, name)
    wrong = []
    for phrase in ANSWER_AFTER_THE_CHECK[name]:
        above = [i for i, (_, text) in enumerate(cells[:at]) if phrase in text]
        if above:
            wrong.append(f"{name}'s answer ({phrase!r}) is printed above its check, in cell {above[0]}")
        if phrase not in NOWHERE_ABOVE.get(name, ()) and not any(phrase in text for _, text in cells[at + 1:]):
            wrong.append(f"{name}'s answer ({phrase!r}) is not given after its check")
    return wrong


@pytest.mark.parametrize("name", list(ANSWER_AFTER_THE_CHECK))
def test_the_answer_comes_after_the_check(name):
    assert misplaced(_cells(RELEASE), name) == []


def test_an_answer_moved_above_its_check_is_caught():
    """The rule printed above the exercise again (as it was in November) fails: the cell after merge_partials's check,
    moved before its exercise cell."""
    cells = _cells(RELEASE)
    at = _test_cell(cells, "merge_partials")
    rule = cells[at + 1]
    moved = cells[:at - 1] + [rule] + cells[at - 1:at + 1] + cells[at + 2:]
    assert misplaced(moved, "merge_partials")
    assert len(misplaced(moved, "merge_partials")) == 2 * len(ANSWER_AFTER_THE_CHECK["merge_partials"])


def test_the_readme_lists_every_exercise_with_its_kind():
    """solutions/17/README.md's table has one row per graded code exercise, numbered as the checks number them, and at
    least two thirds of them are derive, design or predict."""
    kinds = (REPO / "solutions/17/README.md").read_text().split("## Kinds of exercise", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1:6] for line in kinds.splitlines()
            if line.startswith("| ") and line.split("|")[1].strip().isdigit()]
    listed = {cell[1].strip().strip("`"): int(cell[0]) for cell in rows}
    assert listed == {name: n for name, (n, _) in checks.WEEK.exercises.items()}
    now = [cell[2].split("→")[1].strip() for cell in rows]
    thoughtful = [k for k in now if k.startswith(("derive", "design", "predict"))]
    assert len(thoughtful) * 3 >= 2 * len(rows), now
