"""The grader's code in the student's process is compared by identity with what it was before the cells ran
(`grader.child_identity.grader_code`): a function or a method of any of the child's own modules — its runtime
(`grader.child`), its codec (`grader.child_wire`), its guard (`grader.child_guard`) and the identity lists themselves
(`grader.child_identity`) — replaced by the notebook's code is a verdict. Each is reached here as a hostile notebook
would: a class of the grader's found through `type.__subclasses__`, a function's module globals by a built name (no
word the source check reads), and the function put back behind a wrapper that changes nothing it does — so that only
the comparison can tell. Replacing an entry of a module's dict raises no audit event."""
from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

_FIND = """
def _classes(c):
    for s in type.__subclasses__(c):
        yield s
        yield from _classes(s)

def _grader_class(name):
    return next(c for c in _classes(object) if c.__name__ == name and c.__module__.startswith('grader.'))

def _module_of(fn):
    return getattr(fn, '__glo' + 'bals__')

def _wrapped(f):
    return lambda *a, **k: f(*a, **k)
"""
# (what the notebook replaces, the label the verdict names it by)
_REPLACED = {
    "runtime": ("_g = _module_of(_grader_class('_Child').__init__)\n_g['_changed'] = _wrapped(_g['_changed'])\n",
                "grader.child._changed"),
    "codec": ("_g = _module_of(_grader_class('_ChildPickler').persistent_id)\n_g['encode'] = _wrapped(_g['encode'])\n",
              "grader.child_wire.encode"),
    "codec_class": ("_p = _grader_class('_ParentProxy')\n_p.__repr__ = _wrapped(_p.__repr__)\n",
                    "_ParentProxy.__repr__"),
    "guard": ("_g = _module_of(_grader_class('_Guard').flag)\n_g['judge_compiled'] = _wrapped(_g['judge_compiled'])\n",
              "grader.child_guard.judge_compiled"),
    "identity_lists": ("_g = _module_of(_module_of(_grader_class('_Guard').remember)['grader_code'])\n"
                       "_g['observer_machinery'] = _wrapped(_g['observer_machinery'])\n",
                       "grader.child_identity.observer_machinery"),
}


def _load(tmp_path: Path, prepend: str):
    from grader.harness import load_exercises, with_cell_source

    path = next((REPO / "solutions" / "16").glob("*.ipynb"))
    nb = with_cell_source(json.loads(path.read_text()), "causal_mask", textwrap.dedent(prepend), prepend=True)
    out = tmp_path / path.name
    out.write_text(json.dumps(nb))
    return load_exercises(out)


@pytest.mark.parametrize("module", sorted(_REPLACED))
def test_the_childs_own_code_replaced_is_a_verdict(tmp_path, module):
    from grader.checks import week16

    source, label = _REPLACED[module]
    ex = _load(tmp_path, _FIND + source)
    try:
        with pytest.raises(AssertionError, match="causal_mask"):
            week16.check_causal_mask(ex.causal_mask)
        verdicts = " ".join(w for whys in ex._session.tampered.values() for w in whys)
        assert re.search(r"replaced the grader's own code in its process \([^)]*" + re.escape(label), verdicts), verdicts
    finally:
        ex.close()
