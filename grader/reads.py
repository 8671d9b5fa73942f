"""When an observed call read each element of an argument, followed through the copies it made of it.

`observe(fn, ..., _observe_reads=((position, dim), ...))` puts a `Visits` on the tensor argument at `position`.
Every element of that argument, and every element of a tensor the call derived from it element by element — a
copy (`clone`, `.to`, `contiguous`, `cat`, indexing, padding, ...), a pointwise op (`k * scale`, `x - m`,
`exp`), a reduction whose group held that one element (`x.unsqueeze(-1).sum(-1)`) — carries the argument's
address. An op that combines several of those elements into one value (a matrix product, a reduction over a
block, anything not listed above) is a *terminal read* of the elements it combined: that is where a value is
used, and what a fused kernel has to bring in from memory.

Terminal reads are counted per element, and grouped into **visits**: a read continues the element's visit when
the previous terminal read of this argument (by any op, of any of its elements) was also a read of this element;
else it starts a new one. A tiled pass visits each element of K once per query block that needs it, however many
ops each block's work takes; a pass that reads every key block for the row's maximum and then again for the sum
visits each one twice per query block; a chunked softmax visits each element once, and twice if it finds the
maximum in one pass and the sum in another. Copying the argument first does not hide the second pass (the copy
carries the addresses), and reading every element between the two passes to join them makes as many terminal
reads as there are blocks (`Visits.reads`).

A reduction-like op is a terminal read of the groups that held two elements or more. An elementwise op's result
carries the addresses of its input with the most distinct ones; the other inputs' elements that it does not carry
are read terminally there (a statistic of one element, a decoy block), so that no combination hides a read. Ops
outside the lists here — a convolution, an unknown op — are terminal reads.
"""
from __future__ import annotations

import torch

# Ops whose result is a rearrangement of their inputs' elements (run on the addresses to follow them; and by
# grader.reach, whose storages keep their inputs' keys).
MOVES = {"_to_copy", "cat", "stack", "index", "_unsafe_index", "index_select", "gather", "take", "take_along_dim",
         "embedding", "masked_select", "repeat", "flip", "roll", "constant_pad_nd", "tril", "triu", "narrow_copy",
         "reflection_pad1d", "reflection_pad2d", "reflection_pad3d", "replication_pad1d", "replication_pad2d",
         "replication_pad3d", "im2col", "diag_embed", "diag", "block_diag", "index_put", "index_put_",
         "_index_put_impl_", "index_copy", "index_copy_", "masked_scatter", "masked_scatter_", "scatter", "scatter_",
         "slice_scatter", "select_scatter", "diagonal_scatter", "as_strided_scatter", "pixel_shuffle",
         "pixel_unshuffle", "channel_shuffle", "unfold_copy", "expand_copy", "permute_copy", "transpose_copy",
         "t_copy", "view_copy", "unsqueeze_copy", "squeeze_copy", "alias_copy", "detach_copy", "slice_copy",
         "select_copy", "diagonal_copy", "as_strided_copy", "lift_fresh_copy", "_reshape_copy", "movedim_copy"}
# Ops that read their tensor arguments' shapes and dtypes, not their data.
_NO_DATA = {"empty_like", "zeros_like", "ones_like", "full_like", "rand_like", "randn_like", "randint_like", "new_empty",
            "new_zeros", "new_ones", "new_full", "new_empty_strided", "empty_strided", "is_same_size",
            "_has_compatible_shallow_copy_type"}
# Ops that give a tensor a storage of another size in place: its elements keep their places in the storage (a copy of
# the old one when it grows), so they keep their addresses (red team 13's #4, #5: `c.resize_(c.shape)` cleared them).
RESIZES = {"resize_", "resize_as_", "_resize_output_"}
# Reductions along `dim` that `torch.Tag.reduction` does not mark, and cumulative ones (a prefix is a group).
_ALONG_DIM = {"sort", "topk", "kthvalue", "median", "nanmedian", "mode", "msort"}
_CUMULATIVE = {"cumsum", "cumprod", "logcumsumexp", "cummax", "cummin", "_cummax_helper", "_cummin_helper"}
_POOLS = {"max_pool1d_with_indices": 1, "max_pool2d_with_indices": 2, "max_pool3d_with_indices": 3, "avg_pool1d": 1,
          "avg_pool2d": 2, "avg_pool3d": 3, "max_pool1d": 1, "max_pool2d": 2, "max_pool3d": 3}
_BIG = 2 ** 62


def _name(func) -> str:
    return func._schema.name.split("::")[-1]


def _bound(func, args, kwargs) -> dict:
    """The op's arguments by their schema names, defaults filled in."""
    out = {}
    for i, a in enumerate(func._schema.arguments):
        if i < len(args) and not a.kwarg_only:
            out[a.name] = args[i]
        elif a.name in (kwargs or {}):
            out[a.name] = kwargs[a.name]
        elif a.has_default_value():
            out[a.name] = a.default_value
    return out


def _tensors(values) -> list:
    found = []
    for v in values:
        if isinstance(v, torch.Tensor):
            found.append(v)
        elif isinstance(v, (list, tuple)):
            found += [t for t in v if isinstance(t, torch.Tensor)]
    return found


def _ptr(t: torch.Tensor) -> int:
    return 0 if t.device.type == "meta" else t.untyped_storage().data_ptr()


_INDEXING = {"aten.index", "aten._unsafe_index", "aten.index_select", "aten.gather", "aten.take", "aten.embedding"}


class ReadCounter:
    """How many ops read each element of one tensor's storage: `counts[i]` for storage element i
    (`observe(..., _observe_reads=(position,))`, `Observation.reads_of`: each op that reads an element counts once,
    not followed through copies as `Visits` does)."""

    def __init__(self, t: torch.Tensor):
        n = t.untyped_storage().nbytes() // t.element_size()
        self.tensor = t
        self.addresses = torch.arange(n, device=t.device)  # a view of this at t's strides gives the elements it covers
        self.counts = torch.zeros(n, dtype=torch.int32, device=t.device)

    def note(self, func, name: str, args, kwargs, view: torch.Tensor, position) -> None:
        addr = self.addresses.as_strided(view.shape, view.stride(), view.storage_offset())
        if name in _INDEXING:  # what the op gathers: the same op on the addresses
            args, kwargs = list(args), dict(kwargs or {})
            if isinstance(position, int):
                args[position] = addr
            else:
                kwargs[position] = addr
            if "out" in kwargs:  # the gather into a buffer: the same gather, returned
                del kwargs["out"]
                func = func.overloadpacket
            addr = func(*args, **kwargs)
        read = addr.reshape(-1).unique()
        self.counts.index_add_(0, read, torch.ones_like(read, dtype=torch.int32))

    def per_slice(self) -> list[float]:
        t = self.tensor
        if t.dim() == 0 or t.numel() == 0:
            return []
        counts = self.counts.as_strided(t.shape, t.stride(), t.storage_offset())
        return [float(x) for x in counts.reshape(t.shape[0], -1).float().mean(dim=1).cpu()]


class Visits:
    """The terminal reads and visits of each element of one tensor argument (see the module's docstring)."""

    def __init__(self, t: torch.Tensor, dim: int):
        self.tensor, self.dim = t, dim % max(t.dim(), 1)
        self.ptr, self.size = _ptr(t), t.element_size()
        n = t.untyped_storage().nbytes() // self.size
        self.addresses = torch.arange(n, device=t.device)
        self.visits = torch.zeros(n, dtype=torch.int32, device=t.device)
        self.reads = torch.zeros(n, dtype=torch.int32, device=t.device)
        self.last = torch.full((n,), -2, dtype=torch.int64, device=t.device)
        self.serial = 0
        self.hit = None
        self.maps: dict[int, tuple[int, torch.Tensor]] = {}  # storage -> (element size, its elements' addresses)
        self.resizing: tuple | None = None  # (tensor, its storage before) while an op of RESIZES runs on it

    # --- where an element came from -------------------------------------------------------------------------

    def of(self, v: torch.Tensor) -> torch.Tensor | None:
        """The argument's address of each element of `v` (-1: none), or None when `v` holds none of them."""
        p = _ptr(v)
        if p == self.ptr:
            size, base = self.size, self.addresses
        elif p in self.maps:
            size, base = self.maps[p]
        else:
            return None
        if v.element_size() == size:
            return base.as_strided(v.shape, v.stride(), v.storage_offset())
        if v.element_size() > size:  # elements wider than the storage's: the last address each covers (`_covered`)
            return self._covered(v).amax(-1)
        count = v.untyped_storage().nbytes() // v.element_size()  # the storage read as a narrower dtype: by bytes
        at = torch.arange(count, device=base.device).as_strided(v.shape, v.stride(), v.storage_offset())
        return base[(at * v.element_size() // size).clamp(max=base.numel() - 1)]

    def _covered(self, v: torch.Tensor) -> torch.Tensor | None:
        """For a view whose elements are wider than its storage's (a complex view of float pairs, float64 over
        float32): the addresses of every storage element each of its elements covers, [*v.shape, n] (-1 past the
        element; None for any other tensor). An op that reads such a view reads all of them (`op`), and what it
        makes carries the last tracked one (`of`): red team 14b's #1, #2, a pair of a constant and an element of
        the argument viewed as complex and copied, carried the constant's -1 (the first address) and so nothing."""
        p = _ptr(v)
        entry = (self.size, self.addresses) if p == self.ptr else self.maps.get(p)
        if entry is None or v.element_size() <= entry[0]:
            return None
        size, base = entry
        es = v.element_size()
        at = torch.arange(v.untyped_storage().nbytes() // es, device=base.device).as_strided(
            v.shape, v.stride(), v.storage_offset())
        first, last = at * es // size, (at * es + es - 1) // size
        index = first.unsqueeze(-1) + torch.arange(-(-es // size) + 1, device=base.device)
        inside = (index <= last.unsqueeze(-1)) & (index < base.numel())
        return torch.where(inside, base[index.clamp(max=base.numel() - 1)], torch.full_like(index, -1))

    def _store(self, t: torch.Tensor, amap: torch.Tensor | None) -> None:
        """Record that the elements of `t` (an op's result or destination) hold these addresses (None: none)."""
        p = _ptr(t)
        if not p or p == self.ptr or not t.numel():
            return
        entry = self.maps.get(p)
        if entry is not None and entry[0] != t.element_size():
            self._store_bytes(entry, t, amap)
            return
        if entry is None:
            if amap is None or not bool((amap >= 0).any()):
                return
            entry = self.maps[p] = (t.element_size(), torch.full((t.untyped_storage().nbytes() // t.element_size(),),
                                                                 -1, dtype=torch.int64, device=t.device))
        view = entry[1].as_strided(t.shape, t.stride(), t.storage_offset())
        try:
            view.copy_(amap.expand(t.shape) if amap is not None else torch.tensor(-1))
        except RuntimeError:  # a destination whose elements overlap (index_put_ takes one): written element by
            # element as torch wrote the values, and what it wrote read here too (red team 14b's #3, #4: the
            # addresses of a copy made this way were dropped)
            at = torch.arange(entry[1].numel(), device=entry[1].device).as_strided(t.shape, t.stride(),
                                                                                  t.storage_offset())
            values = amap.expand(t.shape) if amap is not None else torch.full(t.shape, -1, device=entry[1].device)
            entry[1][at.reshape(-1)] = values.reshape(-1).long()
            if amap is not None:
                self._terminal(amap)

    @staticmethod
    def _store_bytes(entry, t: torch.Tensor, amap: torch.Tensor | None) -> None:
        """A write through a view of another element size (`buf.view(torch.uint8)[-4:].zero_()`): the storage's
        elements whose bytes it covers hold what it wrote, the rest keep theirs (red team 13b's #1, #2: the whole
        storage's map was dropped)."""
        size, base = entry
        es = t.element_size()
        at = torch.arange(t.untyped_storage().nbytes() // es, device=base.device).as_strided(
            t.shape, t.stride(), t.storage_offset())
        first, last = at * es // size, (at * es + es - 1) // size
        values = (amap.expand(t.shape) if amap is not None else torch.full(t.shape, -1, device=base.device)).long()
        for k in range(int((last - first).max()) + 1 if at.numel() else 0):
            keep = (first + k <= last) & (first + k < base.numel())
            base[(first + k)[keep]] = values[keep]

    def _terminal(self, *addresses: torch.Tensor) -> None:
        hit = torch.zeros(self.addresses.numel() + 1, dtype=torch.bool, device=self.addresses.device)
        for a in addresses:
            if a.numel():
                hit[a.reshape(-1) + 1] = True  # -1 (no address) lands in slot 0
        hit = hit[1:]
        if not bool(hit.any()):
            return
        self.hit = hit if self.hit is None else self.hit | hit  # this op's terminal reads (grader.reach)
        self.serial += 1
        self.visits += (hit & (self.last != self.serial - 1)).int()
        self.reads += hit.int()
        self.last = torch.where(hit, self.serial, self.last)

    # --- one op ----------------------------------------------------------------------------------------------

    def op(self, func, args, kwargs, result) -> None:
        """After `func(*args, **kwargs)` returned `result` (the observers' modes off)."""
        schema = func._schema
        bound = _bound(func, args, kwargs)
        written = {a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write}
        inplace = [bound[n] for n in written if isinstance(bound.get(n), torch.Tensor)]
        results = _tensors(result if isinstance(result, (list, tuple)) else [result])
        outputs = results + [t for t in inplace if all(t is not r for r in results)]
        sources = {p for p in map(_ptr, _tensors(list(bound.values()))) if p}
        for t in results:  # a storage freed and allocated again at the same address: not what it was
            if _ptr(t) in self.maps and _ptr(t) not in sources:
                del self.maps[_ptr(t)]
        name = _name(func)
        if name in RESIZES:
            self._resized(bound.get("self"))
            return
        if name in _NO_DATA:
            for t in outputs:
                self._store(t, None)
            return
        # what the op read: its arguments but pure destinations (copy_'s self, out=)
        reading = [(n, v) for n, v in bound.items() if n not in written or (name.endswith("_") and n == "self"
                                                                               and name not in ("copy_", "fill_", "zero_"))]
        held, wide = [], []
        for n, v in reading:
            for t in ([v] if isinstance(v, torch.Tensor) else v if isinstance(v, (list, tuple)) else []):
                if isinstance(t, torch.Tensor) and t.numel() and t.device.type != "meta":
                    a = self.of(t)
                    covered = self._covered(t) if a is not None else None
                    if covered is not None:
                        wide.append(covered)
                    if a is not None and (_ptr(t) == self.ptr or bool((a >= 0).any())):
                        held.append((n, t, a))
        if wide:  # several of the argument's elements in one: each read here (what the op makes carries one)
            self._terminal(*wide)
        if not held:
            for t in inplace:
                if _ptr(t) in self.maps:
                    self._store(t, None)
            return
        tags = func.tags
        if name == "copy_":
            src = self.of(bound["src"])
            self._store(bound["self"], src.broadcast_to(bound["self"].shape) if src is not None else None)
        elif torch.Tag.pointwise in tags and outputs:
            self._pointwise(held, outputs)
        elif name in MOVES or name == "clone":
            self._move(func, bound, held, results, inplace)
        elif name in _POOLS:
            self._pool(name, bound, held, results)
        elif name in _CUMULATIVE:
            self._cumulative(bound, held, results)
        elif torch.Tag.reduction in tags or name in _ALONG_DIM:
            self._reduce(name, bound, held, results)
        else:
            self._terminal(*(a for _, _, a in held))
            for t in outputs:
                self._store(t, None)

    def before_resize(self, t) -> None:
        """An op of RESIZES is about to run on `t`: remember its storage (a larger size moves it to a new one)."""
        p = _ptr(t) if isinstance(t, torch.Tensor) else 0
        self.resizing = (t, p) if p and (p == self.ptr or p in self.maps) else None

    def _resized(self, t) -> None:
        """After a resize of `t`: a storage that moved holds the old one's elements at the same places."""
        pending, self.resizing = self.resizing, None
        if pending is None or pending[0] is not t or not isinstance(t, torch.Tensor):
            return
        old, new = pending[1], _ptr(t)
        if not new or new == old:
            return  # the same storage: its elements keep their addresses
        size, base = (self.size, self.addresses) if old == self.ptr else self.maps.get(old, (self.size, None))
        if base is None:
            return
        n = t.untyped_storage().nbytes() // size
        moved = torch.full((n,), -1, dtype=torch.int64, device=base.device)
        moved[:min(n, base.numel())] = base[:n]
        self.maps[new] = (size, moved)

    def _pointwise(self, held, outputs) -> None:
        """The result carries the addresses of the input with the most distinct ones (the last, of equals: the new
        value a running statistic is folded with); the other inputs' addresses that it does not hold are read
        terminally here (combined into values that carry other addresses: what no later read would count)."""
        main = held[0][2]
        if len(held) > 1:
            found = [(int(a[a >= 0].unique().numel()), i, a) for i, (_, _, a) in enumerate(held)]
            _, _, main = max(found, key=lambda f: (f[0], f[1]))
            others = []  # the elements an input does not give the result at its own places (a row and its
            for _, _, a in found:  # rotation hold the same set: red team 13's #3)
                if a is not main:
                    try:
                        a, m = torch.broadcast_tensors(a, main)
                        others.append(a[(a >= 0) & (a != m)])
                    except RuntimeError:  # shapes that do not broadcast (an op's own rules): every element read
                        others.append(a[a >= 0])
            if any(o.numel() for o in others):
                self._terminal(*others)
        for t in outputs:
            try:
                self._store(t, main.broadcast_to(t.shape))
            except RuntimeError:
                self._terminal(main)
                self._store(t, None)

    def _move(self, func, bound, held, results, inplace) -> None:
        """Run the op on the addresses (+1, so that the 0 a pad or a mask fills in is -1 again)."""
        mine = {id(t): a for _, t, a in held}

        def enc(v):
            if isinstance(v, torch.Tensor):
                if id(v) in mine:
                    return mine[id(v)] + 1
                a = self.of(v) if v.numel() and v.device.type != "meta" else None
                if a is not None:
                    return a + 1
                if v.dtype in (torch.bool, torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
                    return v  # indices and masks
                return torch.zeros(v.shape, dtype=torch.int64, device=v.device)
            if isinstance(v, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in v):
                return type(v)(enc(x) if x is not None else None for x in v)
            return v

        positional, named = [], {}
        for a in func._schema.arguments:
            if a.name not in bound or a.name == "out":
                continue
            v = bound[a.name]
            if a.name in ("dtype", "layout", "pin_memory"):
                v = None
            elif a.name == "value":  # constant_pad_nd's fill
                v = 0
            elif a.name == "self" and any(v is t for t in inplace):
                v = enc(v).clone()  # in place: the destination's own addresses, then the op on them
            else:
                v = enc(v)
            if a.kwarg_only:
                named[a.name] = v
            else:
                positional.append(v)
        try:
            got = (func if "out" not in bound else func.overloadpacket)(*positional, **named)
        except Exception:  # noqa: BLE001  (an op the addresses cannot go through: its reads are terminal)
            self._terminal(*(a for _, _, a in held))
            for t in results + inplace:
                self._store(t, None)
            return
        if inplace and func._schema.name.endswith("_"):
            got, results = positional[:1], inplace[:1]
        got = _tensors(got if isinstance(got, (list, tuple)) else [got])
        for t, g in zip(results, got):
            self._store(t, (g - 1).broadcast_to(t.shape) if g.shape != t.shape else g - 1)

    def _finish(self, a, hi, lo, results, reduced_dims) -> None:
        """Groups of one element: the results carry its address; groups of several: a terminal read."""
        tracked = a >= 0
        single = (hi >= 0) & (lo == hi)
        multi = (hi >= 0) & (lo != hi)
        self._terminal(a[tracked & multi.broadcast_to(a.shape)])
        amap = torch.where(single, hi, torch.full_like(hi, -1))
        for t in results:
            m = amap
            if t.dim() != m.dim() and reduced_dims:
                m = m.squeeze(tuple(reduced_dims)) if m.dim() else m
            try:
                self._store(t, m.broadcast_to(t.shape))
            except RuntimeError:
                self._store(t, None)

    def _reduce(self, name, bound, held, results) -> None:
        if len(held) != 1:
            self._terminal(*(a for _, _, a in held))
            for t in results:
                self._store(t, None)
            return
        a = held[0][2]
        if a.dim() == 0:
            self._finish(a, a, a, results, [])
            return
        dim = bound.get("dim", None)
        if name in _ALONG_DIM and dim is None:
            dim = -1
        dims = list(range(a.dim())) if dim is None or dim == [] else [dim] if isinstance(dim, int) else list(dim)
        dims = sorted({d % a.dim() for d in dims})
        hi = a.amax(dim=dims, keepdim=True)
        lo = torch.where(a >= 0, a, torch.full_like(a, _BIG)).amin(dim=dims, keepdim=True)
        self._finish(a, hi, lo, results, dims)

    def _cumulative(self, bound, held, results) -> None:
        a = held[0][2]
        if len(held) != 1 or a.dim() == 0:
            return self._reduce("", {"dim": None}, held, results)
        d = bound.get("dim", 0) % a.dim()
        hi = a.cummax(d).values
        lo = torch.where(a >= 0, a, torch.full_like(a, _BIG)).cummin(d).values
        tracked = a >= 0
        whole = ((hi >= 0) & (lo != hi)).narrow(d, a.shape[d] - 1, 1)  # the full prefix mixes elements
        self._terminal(a[tracked & whole.broadcast_to(a.shape)])
        single = (hi >= 0) & (lo == hi)
        for t in results:
            self._store(t, torch.where(single, hi, torch.full_like(hi, -1)) if t.shape == a.shape else None)

    def _pool(self, name, bound, held, results) -> None:
        a = held[0][2]
        n = _POOLS[name]
        pool = getattr(torch.nn.functional, f"max_pool{n}d")
        kernel = bound.get("kernel_size")
        stride = bound.get("stride") or kernel
        try:
            x = a.double()
            hi = pool(x, kernel, stride, bound.get("padding", 0), bound.get("dilation", 1), bound.get("ceil_mode", False))
            lo = -pool(-torch.where(a >= 0, x, torch.full_like(x, float(_BIG))), kernel, stride,
                       bound.get("padding", 0), bound.get("dilation", 1), bound.get("ceil_mode", False))
        except Exception:  # noqa: BLE001
            hi = lo = None
        if len(held) != 1 or hi is None:
            self._terminal(*(h for _, _, h in held))
            for t in results:
                self._store(t, None)
            return
        single = (hi >= 0) & (lo == hi)
        if bool(((hi >= 0) & (lo != hi)).any()):
            self._terminal(a)
        amap = torch.where(single, hi, torch.full_like(hi, -1)).long()
        for t in results:
            self._store(t, amap if t.shape == amap.shape else None)

    # --- what crosses back -----------------------------------------------------------------------------------

    def summary(self) -> list[list[int]]:
        """Per slice of the argument along `dim`: [most visits, fewest visits, most terminal reads] of its elements."""
        t = self.tensor
        if t.dim() == 0 or not t.numel():
            return []
        out = []
        for counts in (self.visits, self.reads):
            view = counts.as_strided(t.shape, t.stride(), t.storage_offset()).movedim(self.dim, 0)
            out.append(view.reshape(t.shape[self.dim], -1))
        visits, reads = out
        return [[int(a), int(b), int(c)] for a, b, c in
                zip(visits.amax(1).tolist(), visits.amin(1).tolist(), reads.amax(1).tolist())]


def before_op(counters: list, schema, args) -> None:
    """Before an op runs: a resize's tensor's storage (`Visits.before_resize`)."""
    if schema is not None and args and schema.name.split("::")[-1] in RESIZES:
        for c in counters:
            c.before_resize(args[0])


def note_op(counters: list, func, args, kwargs, result, views: dict) -> None:
    """Give each `Visits` the op that touched its argument or a copy of it (the observers' modes must be off).
    `views`: the observation's own table of which ops return views (they read nothing and make nothing)."""
    view = views.get(func)
    if view is None:
        schema = getattr(func, "_schema", None)
        view = views[func] = schema is None or any(r.alias_info is not None and not r.alias_info.is_write
                                                   for r in schema.returns)
    if view:
        return
    kwargs = kwargs or {}
    touched = set()  # plain loops: under the child's profiler every call made here costs an event
    for group in (args, kwargs.values(), result if isinstance(result, (list, tuple)) else (result,)):
        for v in group:
            if isinstance(v, torch.Tensor):
                if v.device.type != "meta":
                    touched.add(v.untyped_storage().data_ptr())
            elif isinstance(v, (list, tuple)):
                for t in v:
                    if isinstance(t, torch.Tensor) and t.device.type != "meta":
                        touched.add(t.untyped_storage().data_ptr())
    for c in counters:
        if c.ptr in touched or not touched.isdisjoint(c.maps) or c.resizing is not None:
            c.op(func, args, kwargs, result)
