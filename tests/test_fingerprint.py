"""grader.fingerprint: lib's code is recognised wherever it is loaded from, and honest solutions are not."""
import json
import sys
import types
from pathlib import Path

import pytest

from grader.fingerprint import MIN_CODE_BYTES, lib_name

ROOT = Path(__file__).resolve().parent.parent


def _load_as(src: str, modname: str, filename: str) -> types.ModuleType:
    mod = types.ModuleType(modname)
    sys.modules[modname] = mod  # dataclasses look their module up
    try:
        exec(compile(src, filename, "exec"), mod.__dict__)
    finally:
        del sys.modules[modname]
    return mod


def test_lib_source_under_another_name_is_recognised():
    src = (ROOT / "lib" / "spec_decode" / "speculative.py").read_text()
    mod = _load_as(src, "not_lib_at_all", "/tmp/my_own_work.py")
    assert lib_name(mod.verify.__code__) == "lib.spec_decode.speculative.verify"


def test_renamed_function_locals_and_constants_still_recognised():
    src = (ROOT / "lib" / "batching" / "paged.py").read_text()
    renamed = src.replace("def paged_attention(", "def attend(").replace('"""', '"""Mine. ', 1)
    mod = _load_as(renamed, "mine", "<cell>")
    assert lib_name(mod.attend.__code__) == "lib.batching.paged.paged_attention"


def test_different_code_is_not_recognised():
    def verify(p, q, draft, generator=None):  # same name as lib's, other code
        import torch
        out = torch.zeros(len(draft) + 1, dtype=torch.long)
        for i, t in enumerate(draft):
            out[i] = t + 1
        return out
    assert len(verify.__code__.co_code) >= MIN_CODE_BYTES
    assert lib_name(verify.__code__) is None


@pytest.mark.parametrize("notebook", sorted(p.relative_to(ROOT).as_posix() for p in ROOT.glob("solutions/*/*.ipynb")))
def test_no_solution_exercise_is_lib_code(notebook):
    """An honest solution that happens to equal lib's function would be reported as reference use."""
    cells = json.loads((ROOT / notebook).read_text())["cells"]
    hits = []
    for i, cell in enumerate(cells):
        if cell["cell_type"] != "code" or not cell.get("metadata", {}).get("nbgrader", {}).get("solution"):
            continue
        src = "".join(cell["source"])
        try:
            code = compile(src, f"{notebook}:{i}", "exec")
        except SyntaxError:
            continue
        stack = [code]
        while stack:
            c = stack.pop()
            stack.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
            if c.co_name != "<module>" and lib_name(c):
                hits.append(f"cell {i}: {c.co_qualname} is {lib_name(c)}")
    assert not hits, f"{notebook}: solution code identical to lib's (reported as reference use): {hits}"
