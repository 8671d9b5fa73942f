"""Red team 9 (tests/fixtures/redteam/FINDINGS9.md #8-#10): a rolling cache kept its whole history where
`grader.held.held_bytes` did not count it — as hybrid sparse tensors (no storage of their own), on a module object the
cache made (the walk stopped at every module), in anonymous mmaps filled by `torch.frombuffer(mm).copy_`. Each kind is
counted now: the bytes a stream of appends leaves reachable grow by at least the chunks kept. And round 9's open
route: a history kept where the walk never goes (an imported module, a class of torch's) is counted through what the
observed calls made and left alive (`grader.held.note_made`)."""
import math
import mmap
import types

import pytest
import torch

from grader.held import held_bytes
from grader.observe import observe

CHUNK = (4, 100, 8)  # 3,200 float32: 12,800 bytes
N = 10


class _Sparse:
    def __init__(self):
        self.kept = []

    def append(self, k):
        self.kept.append(k.to_sparse(1))
        return k


class _Module:
    def __init__(self):
        self.history = types.ModuleType("history")
        self.history.chunks = {}

    def append(self, k):
        self.history.chunks[len(self.history.chunks)] = k.clone()
        return k


class _Mmap:
    def __init__(self):
        self.maps = []

    def append(self, k):
        mm = mmap.mmap(-1, k.numel() * 4)
        torch.frombuffer(mm, dtype=torch.float32).copy_(k.flatten())
        self.maps.append(mm)
        return k


class _Forgets:  # the control: keeps nothing
    def append(self, k):
        return k


@pytest.mark.parametrize("cls", [_Sparse, _Module, _Mmap])
def test_history_kept_in_another_kind_of_object_is_counted(cls):
    cache = cls()
    before = held_bytes(cache.append)
    for i in range(N):
        cache.append(torch.full(CHUNK, float(i + 1)))
    grew = held_bytes(cache.append) - before
    assert grew >= N * 12_800, (cls.__name__, grew)


def test_a_cache_that_keeps_nothing_does_not_grow():
    cache = _Forgets()
    before = held_bytes(cache.append)
    for i in range(N):
        cache.append(torch.full(CHUNK, float(i + 1)))
    assert held_bytes(cache.append) - before < 12_800


class _NamesTorch:
    def __init__(self):
        self.t = torch

    def append(self, k):
        return k


def test_an_imported_module_still_stops_the_walk():
    """torch's state is not the notebook's: a cache that names an imported module holds no more than one that does
    not (the walk stops there)."""
    assert held_bytes(_NamesTorch().append) - held_bytes(_Forgets().append) < 10_000


class _OnMath:  # the history on an imported module, found by name: the walk stops at `math`
    def append(self, k):
        math.__dict__.setdefault("_lab_history", []).append(k.clone())
        return k + 0


class _OnTorchClass:  # ... or on a class of torch's, which the walk does not follow
    def append(self, k):
        torch.nn.Module.__dict__.get("_lab_history") or setattr(torch.nn.Module, "_lab_history", [])
        torch.nn.Module._lab_history.append(k.clone())
        return k + 0


class _KeepsOnlyItsLast:  # the control: what it returns, and nothing else (each result is new memory)
    def append(self, k):
        self.last = k + 0
        return self.last


@pytest.mark.parametrize("cls", [_OnMath, _OnTorchClass, _KeepsOnlyItsLast])
def test_what_observed_calls_made_and_something_keeps_is_counted_wherever_it_is(cls):
    cache = cls()
    try:
        held = [observe(cache.append, torch.full(CHUNK, float(i + 1)), _observe_held=True)[1].held_bytes
                for i in range(N)]
    finally:
        for owner in (math, torch.nn.Module):
            if "_lab_history" in vars(owner):
                delattr(owner, "_lab_history")
    grew = held[-1] - held[0]
    if cls is _KeepsOnlyItsLast:
        assert grew < 12_800, grew
    else:
        assert grew >= (N - 1) * 12_800, (cls.__name__, grew)
