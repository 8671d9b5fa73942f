"""What week 16's cache checks share (below `grader.checks.week16`): every append a check grades is observed in the
student's process and judged there and then (`append_observed`: its route, the tensor bytes it allocates, on the host
too where asked, and that it writes into the buffers made before it), also the appends a check's model makes
(`Watched`); a cache filled to a length drawn from the run's seed (`layer_fill`); a rolling cache's appends checked
position by position (`rolling_positions`).
"""
from __future__ import annotations

import torch

from grader.checks import assert_route, generator, observe, seed_note
from grader.held import LIMIT


def constructed(cls, *args, what=None):
    """`cls(*args)`, observed, its route judged: a cache whose numbers (nbytes, length) a check grades."""
    obj, obs = observe(cls, *args, _observe_light=True)
    assert_route(obs, what or f"{getattr(cls, '__name__', 'the class')}(...)")
    return obj


def ints(offset, n, low, high):
    """n random ints in [low, high) from this run's seed."""
    return [int(x) for x in torch.randint(low, high, (n,), generator=generator(offset))]


def append_observed(cache, k, v, what, limit, host=False, light=False, held=None):
    """`cache.append(k, v)`, observed (memory on the host too with `host`: numpy's arrays, Python lists), its route
    judged and the bytes it allocated held to `limit`. Every append whose result a check grades goes through here.
    `held`, a list: the bytes the cache object reaches after the append (`grader.held`) are appended to it."""
    out, obs = observe(cache.append, k, v, _observe_host=host, _observe_light=light, _observe_held=held is not None)
    if held is not None:
        held.append(obs.held_bytes)
    assert_route(obs, what)
    assert obs.peak_bytes <= limit, (
        f"{what}: the append allocated {obs.peak_bytes:,} bytes of tensors; it needs at most {limit:,} (the new "
        f"positions, a few times): write into the buffers allocated once, never a new copy of what the cache holds "
        f"(torch.cat grows the cache anew at every step) {seed_note()}")
    assert obs.premade_bytes > 0, (
        f"{what}: the append wrote nothing into buffers made before it (the K and V buffers allocated in __init__): "
        f"store the new positions there, not in new tensors or lists of the appended ones {seed_note()}")
    if host:
        assert obs.host_peak_bytes <= limit, (
            f"{what}: the append allocated {obs.host_peak_bytes:,} bytes outside torch's tensors (numpy arrays, "
            f"Python lists); it needs at most {limit:,}: keep the cache in its tensor buffers {seed_note()}")
    assert isinstance(out, tuple) and len(out) == 2 and all(isinstance(x, torch.Tensor) for x in out), (
        f"{what}: append must return (keys, values), two tensors [batch, n_kv_heads, n, head_dim]")
    return out


class Watched:
    """A student's layer cache as a check's model sees it: each append the model makes is observed and judged
    (`append_observed`), like the check's own calls."""

    def __init__(self, layer, what, limit):
        self._layer, self._what, self._limit = layer, what, limit

    @property
    def length(self):
        return self._layer.length

    def append(self, k, v):
        keys, values = append_observed(self._layer, k, v, self._what, self._limit(k, v), light=True)
        return keys, values


def layer_limit(k, v) -> int:
    """What one LayerKVCache append may allocate: a couple of copies of the new positions, and a page."""
    return 2 * (k.nbytes + v.nbytes) + 8192


def layer_fill(LayerKVCache) -> None:
    """A cache of a length drawn from this run's seed, filled to the last position by appends of 1 to max(8,
    max_len / 10) positions, each observed: right contents, views of one buffer, no allocation that grows with the length held (on the host
    too, at the end), then an overflow that changes nothing."""
    b, h, d = 2, 4, 32
    max_len = ints(42, 1, 48, 400)[0]
    cache, obs = observe(LayerKVCache, b, h, max_len, d, torch.float32, None)
    assert_route(obs, "LayerKVCache(...)", why="Write the class yourself; do not subclass lib.modeling.kv_cache.LayerKVCache.")
    nbytes = 2 * b * h * max_len * d * 4
    assert cache.nbytes == nbytes, f"LayerKVCache({b}, {h}, {max_len}, {d}).nbytes = {cache.nbytes}; expected {nbytes}"
    assert obs.peak_bytes >= nbytes, (
        f"LayerKVCache({b}, {h}, max_len={max_len}, {d}) allocated {obs.peak_bytes:,} bytes of tensors in __init__; "
        f"its K and V buffers for max_len positions are {nbytes:,}: allocate them whole, once, in __init__ {seed_note()}")
    g = generator(43)
    sizes = ints(44, max_len, 1, max(9, max_len // 10))
    held_k, held_v, length, ptr = [], [], 0, None
    while length < max_len:
        t = min(sizes[len(held_k)], max_len - length)
        k, v = torch.randn(b, h, t, d, generator=g), torch.randn(b, h, t, d, generator=g)
        what = f"LayerKVCache(max_len={max_len}) holding {length}, append of {t}"
        last = length + t == max_len
        gk, gv = append_observed(cache, k, v, what, layer_limit(k, v), host=last, light=not last and len(held_k) > 1)
        held_k.append(k)
        held_v.append(v)
        length += t
        assert tuple(gk.shape) == (b, h, length, d) and torch.equal(gk, torch.cat(held_k, 2)) and \
            torch.equal(gv, torch.cat(held_v, 2)), (
                f"{what}: append must return all {length} positions held, old ones first, then the new ones {seed_note()}")
        ptr = gk.data_ptr() if ptr is None else ptr
        assert gk.data_ptr() == ptr, (
            f"{what}: the keys returned are not views of the buffer the first append returned; append should "
            f"return views of one preallocated buffer (self.k[:, :, :length]), not a new tensor {seed_note()}")
        assert cache.length == length, f"{what}: length is {cache.length}; expected {length}"
    overflow(cache, b, h, d, max_len, 1, max_len)


def layer_dtypes(LayerKVCache) -> None:
    """Caches of fp16 and bf16: the constructor allocates the K and V buffers in that dtype (at least their nbytes,
    at most 3x: a float32 temporary cast down is fine), and appends of that dtype come back as views of that dtype, of a buffer of that dtype."""
    b, h, n, d = 1, 2, 6, 8
    for dtype in (torch.float16, torch.bfloat16):
        name = str(dtype).removeprefix("torch.")
        nbytes = 2 * b * h * n * d * torch.empty((), dtype=dtype).element_size()
        cache, obs = observe(LayerKVCache, b, h, n, d, dtype, None, _observe_light=True)
        assert_route(obs, f"LayerKVCache(..., {name})")
        assert cache.nbytes == nbytes, f"a {name} cache of [{b}, {h}, {n}, {d}] has nbytes {cache.nbytes}; expected {nbytes}"
        # at most 3x: an honest `torch.zeros(shape).to(dtype)` passes through a float32 (or float64) temporary; what
        # the cache keeps is judged below (views of one buffer of the dtype, storage no bigger than nbytes)
        assert nbytes <= obs.peak_bytes <= 3 * nbytes + 8192, (
            f"LayerKVCache({b}, {h}, {n}, {d}, {name}) allocated {obs.peak_bytes:,} bytes of tensors in __init__; its "
            f"K and V buffers in {name} are {nbytes:,}: allocate them whole, in the dtype asked for (dtype=dtype), once")
        g = generator(46)
        ptr = None
        for t in (2, 3):
            k, v = (torch.randn(b, h, t, d, generator=g).to(dtype) for _ in range(2))
            gk, gv = append_observed(cache, k, v, f"{name} LayerKVCache.append of {t}", layer_limit(k, v), light=True)
            assert gk.dtype == dtype and gv.dtype == dtype, (
                f"a {name} cache returned keys of {gk.dtype} and values of {gv.dtype} after a {name} append; the "
                f"buffers hold the dtype asked for (torch.zeros(..., dtype=dtype)), and so do the views of them")
            for x, what in ((gk, "keys"), (gv, "values")):
                assert x.untyped_storage().nbytes() <= nbytes, (
                    f"the {name} cache's {what} are views of a storage of {x.untyped_storage().nbytes():,} bytes; its "
                    f"buffers in {name} are {nbytes:,} bytes in all: keep them in the dtype asked for")
            ptr = gk.data_ptr() if ptr is None else ptr
            assert gk.data_ptr() == ptr, (
                f"the {name} cache's keys are not views of one buffer from append to append (a converted copy?): "
                f"return self.k[:, :, :length] of buffers allocated in {name}")


def overflow(cache, b, h, d, max_len, t, held) -> None:
    try:
        cache.append(torch.zeros(b, h, t, d), torch.zeros(b, h, t, d))
    except NotImplementedError:
        raise
    except Exception as e:  # noqa: BLE001  (whatever it raised is the verdict, in one line)
        assert isinstance(e, ValueError), (
            f"overflow raised {type(e).__name__}; raise CacheOverflowError (a ValueError) with a message saying why")
        assert str(e), "the overflow error needs a message (how many positions are held, how many fit)"
    else:
        raise AssertionError(f"appending {t} positions to a cache holding {held} of {max_len} must raise "
                             f"CacheOverflowError, not succeed")
    assert cache.length == held, (
        f"a refused append must leave the cache as it was; length is now {cache.length}, expected {held}")


def rolling_limit(window, k) -> int:
    """What one RollingKVCache append of k [B, Hkv, t, d] may allocate: a few copies of the held and new positions."""
    row = k.shape[0] * k.shape[1] * k.shape[3] * k.element_size()
    return 4 * (window + k.shape[2]) * 2 * row + 8192


def rolling_new(RollingKVCache, batch, heads, window, d):
    cache, obs = observe(RollingKVCache, batch, heads, window, d, torch.float32, None)
    assert_route(obs, "RollingKVCache(...)", why="Write the class yourself; do not subclass lib.modeling.kv_cache.RollingKVCache.")
    nbytes = 2 * batch * heads * window * d * 4
    assert cache.nbytes == nbytes, (
        f"RollingKVCache({batch}, {heads}, window={window}, {d}).nbytes = {cache.nbytes}; expected {nbytes}: K and V "
        f"buffers of [batch, n_kv_heads, window, head_dim], fp32")
    assert obs.peak_bytes >= nbytes, (
        f"RollingKVCache({batch}, {heads}, window={window}, {d}) allocated {obs.peak_bytes:,} bytes of tensors in "
        f"__init__; its K and V buffers are {nbytes:,}: allocate them whole, once, as tensors {seed_note()}")
    return cache


def rolling_dtypes(RollingKVCache) -> None:
    """Sliding-window caches of fp16 and bf16 (red team 13's #7: buffers always float32 passed): the constructor
    allocates its buffers in that dtype, `nbytes` says so, appends of that dtype come back in it, positions right,
    and what the cache keeps is its buffers of that dtype (red team 14b's #8: float32 buffers behind an `nbytes`
    worked out for the dtype, the answers cast down, passed)."""
    b, h, window, d = 1, 2, 64, 32
    wide_kept = None
    for dtype in (torch.float16, torch.bfloat16):
        name = str(dtype).removeprefix("torch.")
        nbytes = 2 * b * h * window * d * torch.empty((), dtype=dtype).element_size()
        cache, obs = observe(RollingKVCache, b, h, window, d, dtype, None, _observe_light=True)
        assert_route(obs, f"RollingKVCache(..., {name})")
        assert cache.nbytes == nbytes, (
            f"a {name} RollingKVCache({b}, {h}, window={window}, {d}) has nbytes {cache.nbytes}; expected {nbytes}: K "
            f"and V buffers of [batch, n_kv_heads, window, head_dim] in the dtype asked for")
        assert nbytes <= obs.peak_bytes <= 3 * nbytes + 8192, (  # (a float32 temporary cast down is fine)
            f"RollingKVCache({b}, {h}, window={window}, {d}, {name}) allocated {obs.peak_bytes:,} bytes of tensors in "
            f"__init__; its K and V buffers in {name} are {nbytes:,}: allocate them whole, in the dtype asked for "
            f"(dtype=dtype), once")
        length = 0
        for t in (3, 2, 70):
            new = torch.arange(length, length + t, dtype=dtype)[None, None, :, None].expand(b, h, t, d).contiguous()
            kept = [] if length == 0 else None
            k, v = append_observed(cache, new, -new, f"{name} RollingKVCache.append of {t}", rolling_limit(window, new),
                                   light=True, held=kept)
            if kept is not None:  # what it reaches, beside a float32 cache's: at least most of the buffers' difference
                if wide_kept is None:
                    wide_kept = _kept_after(RollingKVCache, (b, h, window, d), torch.float32)
                assert wide_kept - kept[-1] >= nbytes // 2, (
                    f"a {name} RollingKVCache({b}, {h}, window={window}, {d}) reaches {kept[-1]:,} bytes after its first "
                    f"append, a float32 one {wide_kept:,}: its K and V buffers in {name} ({nbytes:,} bytes) must be half of "
                    f"the float32 ones. Keep the buffers in the dtype asked for, not in float32 cast down on the way "
                    f"out {seed_note()}")
            assert k.dtype == dtype and v.dtype == dtype, (
                f"a {name} RollingKVCache returned keys of {k.dtype} and values of {v.dtype} after a {name} append; "
                f"keep the buffers in the dtype asked for (torch.zeros(..., dtype=dtype))")
            held = min(length, window)
            assert k[0, 0, :, 0].float().tolist() == [float(p) for p in range(length - held, length + t)], (
                f"a {name} RollingKVCache after {length} positions, append of {t}: keys of positions "
                f"{k[0, 0, :, 0].float().tolist()}; expected the {held} held positions (oldest first), then the new ones")
            length += t


def _kept_after(RollingKVCache, shape, dtype) -> int:
    """What a new cache of `shape` and `dtype` reaches after an append of 3 positions (`grader.held`)."""
    cache, obs = observe(RollingKVCache, *shape, dtype, None, _observe_light=True)
    assert_route(obs, "RollingKVCache(...)")
    b, h, _, d = shape
    new = torch.arange(3, dtype=dtype)[None, None, :, None].expand(b, h, 3, d).contiguous()
    kept = []
    append_observed(cache, new, -new, "RollingKVCache.append of 3", rolling_limit(shape[2], new), light=True, held=kept)
    return kept[-1]


def rolling_positions(RollingKVCache, window, schedule, heads=2, d=3, host_at=(), kept_bytes=None):
    """Append positions in chunks of `schedule`, each key/value holding its position number, every append observed
    (on the host too at the indices `host_at`): what each returns (held positions oldest first, then the new ones),
    what it allocates (bounded by the window, not the length), that it writes into the buffers, and its `length`.
    `kept_bytes`, a list: what the cache object keeps is measured after every append and judged (`kept`)."""
    cache = rolling_new(RollingKVCache, 1, heads, window, d)
    nbytes, length = cache.nbytes, 0
    for i, t in enumerate(schedule):
        pos = torch.arange(length, length + t, dtype=torch.float32)
        new = pos[None, None, :, None].expand(1, heads, t, d).contiguous()
        what = f"RollingKVCache(window={window}) after {length} positions, append of {t}"
        k, v = append_observed(cache, new, -new, what, rolling_limit(window, new), host=i in host_at,
                               light=i > 1 and i not in host_at, held=kept_bytes)
        held = min(length, window)
        want = list(range(length - held, length + t))
        assert k.dim() == 4 and tuple(k.shape) == (1, heads, held + t, d), (
            f"{what}: append must return (keys, values) [B, Hkv, held + new, d] = {(1, heads, held + t, d)}; got "
            f"{tuple(k.shape)}")
        assert k[0, 0, :, 0].tolist() == [float(p) for p in want], (
            f"{what} returned keys of positions {[int(x) for x in k[0, 0, :, 0].tolist()][:8]}; expected the "
            f"{held} held positions (oldest first) then the {t} new ones: {want[:6]}{'...' if len(want) > 6 else ''} "
            f"{seed_note()}")
        assert torch.equal(v, -k), f"{what}: values must come back in the same order as the keys"
        length += t
        got = cache.length
        assert got == length, (
            f"{what}: length is {got}; it counts every position ever appended ({length})"
            + (": a counter in a small integer type wraps (a torch.int16 past 32,767, an int32 past 2**31 - 1); "
               "count in a Python int" if type(got) is int and got < length else "") + f" {seed_note()}")
        assert cache.nbytes == nbytes, f"{what}: nbytes changed from {nbytes} to {cache.nbytes}; the buffers are allocated once"
        # this answer dies before the next append: what the next append's measure finds alive is that append's
        # answer and inputs (`grader.held.note_made`), which `kept` allows, not two answers (two large appends
        # in a row took an honest ring buffer past the bound)
        del k, v
        if kept_bytes is not None:
            kept(kept_bytes, window, schedule[:i + 1], heads * d * 4, what)


def kept(held, window, schedule, row, what) -> None:
    """What a rolling cache reaches after each append (`held`: bytes, `grader.held`) may exceed what it reached after
    the first by what a window and the largest append account for (a cache may keep its last answer), never by the
    stream: a history of the chunks appended grows with every append."""
    limit = 2 * (window + max(schedule)) * 2 * row + 65536
    assert min(held) >= 0, (
        f"{what}: the cache object reaches more than {LIMIT:,} objects (its own, its class's and the notebook's "
        f"namespace's): keep the cache in its K and V buffers, not in Python containers")
    grown = held[-1] - held[0]
    assert grown <= limit, (
        f"{what}: the cache object now keeps {grown:,} bytes more than after its first append of {schedule[0]} "
        f"positions ({sum(schedule[1:]):,} positions appended since); a window of {window} and appends of at most "
        f"{max(schedule):,} positions need at most {limit:,} more. It keeps what it was given (a list of the chunks "
        f"appended, or copies of them, or a growing tensor): keep only the last `window` positions, in the K and V "
        f"buffers allocated in __init__ {seed_note()}")


def rolling_stream(RollingKVCache) -> None:
    """A stream of 40,000 to 70,000 positions (drawn per run: past an int16's range, past any constant a cache could be
    sized for) in appends of 2,000 to 6,000 (an append costs window + t), with a window drawn per run: every answer
    and `length` compared, and what the cache object keeps measured after every append (`kept`)."""
    window, total = ints(133, 1, 3, 10)[0], ints(134, 1, 40_000, 70_001)[0]
    schedule = []
    for t in ints(135, 40, 2_000, 6_001):  # 40 draws of at least 2,000: the sum reaches `total`
        schedule.append(min(t, total - sum(schedule)))
        if sum(schedule) >= total:
            break
    rolling_positions(RollingKVCache, window, schedule, heads=2, d=8, kept_bytes=[])
