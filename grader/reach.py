"""How many keys the values an observed call combined with K or V depended on (split-K decoding, week 17).

`observe(fn, ..., _observe_reads=((1, 2), (2, 2)), _observe_reach=True)`: the `Visits` of K and V (`grader.reads`,
followed through copies along the key dimension) say which keys an op read terminally; `Reach` keeps, for every
storage the call made, the set of keys its values depend on (a bit per key position, K's and V's alike: key j of K
and key j of V are one key), and measures each op that reads K or V terminally: the keys it read together with
those its other inputs depend on. `Observation.reach` is the most over the call.

Split-K attends to each split of the keys on its own — scores, running max, sum and output of split s depend on
split s alone — and merges the partial results afterwards, an op that reads no key: every read of K or V combines
at most one split's keys. One online-softmax pass over the chunks in sequence folds chunk j into a running max and
sum that depend on chunks 0..j-1: its product of chunk j's probabilities with V_j combines every key before it.

What is coarse: a storage's set is one for all its elements (a buffer that collects each split's scores in its own
rows depends on every split written into it), and a copy or an elementwise op of K or V carries its keys element by
element (`grader.reads`), so that slicing a whole converted copy of K is still a split's keys.
"""
from __future__ import annotations

import torch

from grader.reads import MOVES

_CARRY = MOVES | {"clone", "copy_"}  # ops whose results hold their inputs' elements, addresses and all


def _name(func) -> str:
    return func._schema.name.split("::")[-1]


def _tensors(values) -> list:
    return [t for v in values for t in (v if isinstance(v, (list, tuple)) else [v]) if isinstance(t, torch.Tensor)]


def _ptr(t: torch.Tensor) -> int:
    return 0 if t.device.type == "meta" else t.untyped_storage().data_ptr()


class Reach:
    """The keys each storage's values depend on, and the most keys one read of K or V combined."""

    def __init__(self, visits: list):
        self.visits = visits  # grader.reads.Visits of K and V, along the key dimension
        self.keys = []  # per Visits: the key position of each element of its argument's storage (-1: none)
        for v in visits:
            t = v.tensor
            at = torch.full((t.untyped_storage().nbytes() // v.size,), -1, dtype=torch.int64, device=t.device)
            shape = [1] * t.dim()
            shape[v.dim] = t.shape[v.dim]
            try:
                at.as_strided(t.shape, t.stride(), t.storage_offset()).copy_(
                    torch.arange(t.shape[v.dim], device=t.device).view(shape).expand(t.shape))
            except RuntimeError:  # an overlapping view: its elements read as one key
                pass
            self.keys.append(at)
        self.deps: dict[int, int] = {}  # storage -> bitmask of the keys its values depend on
        self.most = 0
        self.combined: set[int] = set()  # the key sets the reads of K or V combined (bitmasks; at most 4096 kept)

    def before(self) -> None:
        for v in self.visits:
            v.hit = None

    def after(self, func, args, kwargs, result) -> None:
        """After the Visits saw the op (their `hit`: the elements it read terminally)."""
        schema = getattr(func, "_schema", None)
        if schema is None or any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns):
            return  # a view: the same storage, the same keys
        written = [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
        results = _tensors(result if isinstance(result, (list, tuple)) else [result])
        values = list(args) + list((kwargs or {}).values())
        inputs = [t for v in values for t in (v if isinstance(v, (list, tuple)) else [v]) if isinstance(t, torch.Tensor)]
        mask = 0
        for t in inputs:
            mask |= self.deps.get(_ptr(t), 0)
        read = 0
        for v, keys in zip(self.visits, self.keys):
            if v.hit is not None:
                for j in keys[v.hit].unique().tolist():
                    if j >= 0:
                        read |= 1 << j
        if read:
            self.most = max(self.most, bin(mask | read).count("1"))
            if len(self.combined) < 4096:
                self.combined.add(mask | read)
        total = mask | (0 if _name(func) in _CARRY else read)
        bound = dict(zip([a.name for a in schema.arguments], args))
        bound.update(kwargs or {})
        inplace = [bound[n] for n in written if isinstance(bound.get(n), torch.Tensor)]
        for t in results:
            if any(t is d for d in inplace):
                continue
            p = _ptr(t)
            if total:
                self.deps[p] = total
            else:
                self.deps.pop(p, None)
        for t in inplace:
            p = _ptr(t)
            if total | self.deps.get(p, 0):
                self.deps[p] = total | self.deps.get(p, 0)

    def splits(self) -> list:
        """The largest key sets the reads combined (none inside another), as (first key, last key, how many keys),
        by first key: split-K's splits, one each."""
        sets = sorted(self.combined, key=lambda m: -bin(m).count("1"))
        top: list[int] = []
        for m in sets:
            if not any(m | t == t for t in top):
                top.append(m)
        return sorted(((m & -m).bit_length() - 1, m.bit_length() - 1, bin(m).count("1")) for m in top)
