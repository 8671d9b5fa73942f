"""A hostile class: crafted week-16 submissions graded in one run next to honest controls.

Every control gets exactly its honest score; no crafted submission gets credit it did not earn; the run
finishes and lists its failures; the gradebook, the checks and the repo are unchanged by the students' code.
Fast: demo cells are stripped, `generate` is left a stub in every notebook (its check loads SmolLM2), and the
endless-loop case runs under a short per-call timeout set here.
"""
import importlib.util
import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from grader.__main__ import autograde, collect
from grader.course import Course, read_csv
from grader.harness import load_exercises

_spec = importlib.util.spec_from_file_location("_hostile_support", Path(__file__).with_name("_hostile_support.py"))
_spec.loader.exec_module(_support := importlib.util.module_from_spec(_spec))
REPO, WEEK, CHECKS_FILE, _nb, _points, _honest, _sha, _edit, _SDPA_ROUTE, _ELSEWHERE, course_root = (
    _support.REPO, _support.WEEK, _support.CHECKS_FILE, _support._nb, _support._points, _support._honest,
    _support._sha, _support._edit, _support._SDPA_ROUTE, _support._ELSEWHERE, _support.course_root)


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
