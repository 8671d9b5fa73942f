"""Week 17: how the checks of exercises 1-10 call the notebook's functions, and the routes they hold each call to.

Every call whose result a check judges is observed (`call`: lightly, without the profiler — the few calls that
look for lib's functions by name observe fully), and the route it took is judged on that same call: a function
cannot answer the calls that are judged one way and the calls that are watched another, since they are the same.
The bounds, by exercise (`grader.reads` says what a terminal read and a visit are):

- a tiled forward (`forward_route`): no matrix product or reduction wider than a block; the matrix-product FLOPs
  of every visible (query, key) pair at least, and at most 1.2x those of the blocks a tiled pass computes (whole
  blocks, edges padded or not: a pass that computes each score block twice, once for the row's maximum and once
  for the sum, does 1.5x); each element of K and V visited at most once per query block (T_r = ceil(Nq/block_q):
  Algorithm 2's order, query blocks outside, reads each key block once per query block), each element of Q at most
  once per key block (T_c: Algorithm 1's order, key blocks outside, reads each query block once per key block),
  every element read, and terminal reads at most twice those counts (joining the two passes of a two-pass route
  into one visit takes a read of every element between them). Both orders of the paper pass; a second pass over
  the key blocks visits K 2·T_r times, or Q 2·T_c times.
- a chunked softmax (`softmax_route`): reductions of one chunk at most, each element visited once (the running
  max and the rescaled sum take one pass; the output exp(x - m) / l is elementwise and reads nothing terminally),
  at most 4 terminal reads, every element read, and (a product is not needed) matrix-product FLOPs of 4 per element
  at most — a copy through a product with an identity matrix is not a way around the counter. Chunks of one element
  are not counted (a running max of single values is elementwise), nor a last chunk of one element's reads.
- split-K decoding (`decode_route`): each split's keys alone in a product or reduction (the merge may reduce over
  the splits), each element of K and V visited once and read, the FLOPs of one pass (at least 0.9x, at most 2x:
  an identity product per split costs more), and the splits independent (`grader.reach`): no read of K or V
  combines more keys than one split holds, counting the keys its other inputs depend on — a single online pass
  with a chunk as its block reads V_j with probabilities shifted by the running max of every chunk before. The
  largest key sets the reads combine are the even partition the exercise asks for (`assert_even_splits`:
  min(n_splits, Nk) contiguous splits of floor or ceil(Nk / n_splits) keys; ceil-sized splits with a short last
  one fail).
- the backward (`backward_route`): blocks only, no softmax, the five products of each visible pair at least.
- memory (`assert_memory_growth`): what a forward holds beyond its results may grow with N by O(N·d) — output-sized
  state, m and l for every row, per-block outputs kept for a concatenation: 3·(d + 2) numbers a row and head, with
  64 kB of slack for the host meter's noise — but not by a row of scores per query block (block_q numbers a row and
  head: the check takes block_q = 64 > 3·(d + 2) = 30) or the score matrix.
"""
from __future__ import annotations

import math

from grader.checks import assert_route, observe, seed_note

SDPA_OPS = ("aten._scaled_dot_product", "aten.scaled_dot_product", "aten._flash_attention", "aten._efficient_attention")
SOFTMAX_OPS = ("aten._softmax", "aten._log_softmax", "aten.softmax", "aten.log_softmax")
SHAPES_OK = ("lib.attn.attention.check_attention_shapes", "lib.attn.masks.causal_mask")  # the helpers the notebook imports


def call(fn, what: str, *args, route: dict | None = None, visits: dict | None = None, full: bool = False,
         reach: dict | None = None, **kwargs):
    """`fn(*args, **kwargs)`, observed in the same call (`full`: with the profiler, which names lib's functions),
    its route judged (`route`: `assert_route`'s keywords and `max_flops`; `visits`: see `assert_visits`; `reach`:
    dict(most, why), the most keys one read of K or V may combine, `grader.reach`). Returns (result, observation)."""
    reads = tuple((position, spec["dim"]) for position, spec in (visits or {}).items())
    extra = {} if full else {"_observe_light": True}
    if reach and reads:
        extra["_observe_reach"] = True
    result, obs = observe(fn, *args, _observe_reads=reads, **extra, **kwargs)
    route = dict(route or {})
    most = route.pop("max_flops", None)
    assert_route(obs, what, **route)
    if most is not None:
        assert obs.flops <= most, (
            f"{what}: torch's FlopCounterMode counted {obs.flops:,} FLOPs of matrix products, "
            f"{obs.flops / max(most / 1.2, 1):.2f}× what one pass over the blocks takes (at most {most:,} allowed): "
            f"each block's scores are computed once — not once for the row's maximum and again for its sum — and "
            f"nothing is copied through a matrix product {seed_note()}")
    assert_visits(obs, what, visits or {})
    if reach and reads:
        assert obs.reach <= reach["most"], (
            f"{what}: a matrix product or reduction read keys of K or V together with values that depend on "
            f"{obs.reach} keys, more than the {reach['most']} one split holds: {reach['why']} {seed_note()}")
        if reach.get("even"):
            assert_even_splits(obs, what, *reach["even"])
    return result, obs


def assert_even_splits(obs, what: str, nk: int, n_splits: int) -> None:
    """The splits the reads of K and V combined (`Observation.reach_splits`) are the even partition the exercise
    asks for: min(n_splits, nk) contiguous runs of keys, each of floor(nk / n_splits) or ceil(nk / n_splits) keys."""
    sizes = {nk // n_splits, -(-nk // n_splits)} - {0}
    runs = obs.reach_splits
    bad = [r for r in runs if r[2] not in sizes or r[1] - r[0] + 1 != r[2]]
    assert not bad and len(runs) == min(n_splits, nk) and sum(r[2] for r in runs) == nk, (
        f"{what}: the keys were attended to in {len(runs)} splits of "
        f"{', '.join(str(r[2]) for r in runs[:12])}{' ...' if len(runs) > 12 else ''} keys; {nk} keys in {n_splits} "
        f"splits are {min(n_splits, nk)} contiguous chunks as even as they can be, of {' or '.join(map(str, sorted(sizes)))} "
        f"keys (sizes differing by at most one: split i starts at key i·{nk}//{n_splits}) {seed_note()}")


def assert_visits(obs, what: str, visits: dict) -> None:
    """`visits`: {position: dict(name, dim, most, reads, fewest, why)} — each element of that argument visited at
    most `most` times (and at least `fewest`), read terminally at most `reads` times (`grader.reads`)."""
    for position, spec in visits.items():
        slices = obs.visits_of(position)
        if not slices:
            assert not spec.get("fewest"), (f"{what}: no torch op read {spec['name']}: compute with torch ops on the "
                                            f"inputs (numpy and Python arithmetic are out of the checks' sight)")
            continue
        most = max(s[0] for s in slices)
        at = next(i for i, s in enumerate(slices) if s[0] == most)
        assert most <= spec["most"], (
            f"{what}: an element of {spec['name']} (at index {at} along dim {spec['dim']}) was visited {most} times — "
            f"read, then read again after other elements of {spec['name']} were read (a copy of it counts as it) — "
            f"more than the {spec['most']} one pass needs: {spec['why']} {seed_note()}")
        reads = max(s[2] for s in slices)
        assert reads <= spec["reads"], (
            f"{what}: an element of {spec['name']} was read by {reads} ops that combine it with others (matrix "
            f"products, reductions), more than the {spec['reads']} allowed ({spec['most']} visits): {spec['why']}")
        fewest = min(s[1] for s in slices)
        if spec.get("fewest"):
            at = next(i for i, s in enumerate(slices) if s[1] == fewest)
            assert fewest >= spec["fewest"], (
                f"{what}: elements of {spec['name']} (at index {at} along dim {spec['dim']}, for one) were never read "
                f"by a torch op that uses them (a product or a reduction): compute with torch ops on the inputs "
                f"(numpy and Python arithmetic are out of the checks' sight) {seed_note()}")


# --- the routes ---------------------------------------------------------------------------------------------------

def blocks(nq: int, nk: int, bq: int, bk: int, causal: bool) -> list[tuple[int, int]]:
    """(q_start, k_start) of the blocks a tiled pass computes: all, or those not wholly above the diagonal
    (bottom-right aligned: query i sees keys j <= i + nk - nq)."""
    return [(qs, ks) for qs in range(0, nq, bq) for ks in range(0, nk, bk)
            if not (causal and ks > min(qs + bq, nq) - 1 + nk - nq)]


def pairs(nq: int, nk: int, causal: bool) -> int:
    """How many (query, key) pairs attention uses."""
    return sum(min(nk, i + 1 + nk - nq) for i in range(nq)) if causal else nq * nk


def forward_route(q, k, causal: bool, bq: int, bk: int, offset: int = 0) -> dict:
    """`call`'s keywords for flash_attention_forward(q, k, v, ...) (q at position `offset`)."""
    (b, h, nq, d), nk = q.shape, k.shape[2]
    heads = b * h
    full = sum(min(bq, nq) * min(bk, nk) for _ in blocks(nq, nk, bq, bk, causal))
    t_r, t_c = math.ceil(nq / bq) if nq else 0, math.ceil(nk / bk) if nk else 0
    why = ("compute each block's scores once, folding them into the running max, sum and output (a pass for the "
           "maximum and another for the sum reads every key block twice)")
    route = dict(lib_allowed=SHAPES_OK, forbidden_ops=SDPA_OPS, max_extent=max(bq, bk, d), why="Never hold more than a [block_q, block_k] block "
                 "of scores.", min_flops=int(0.9 * 4 * d * heads * pairs(nq, nk, causal)),
                 max_flops=int(1.2 * 4 * d * heads * full) + 1)
    visits = {offset: dict(name="q", dim=2, most=t_c, reads=2 * t_c, fewest=1, why=why)}
    for i, name in ((1, "k"), (2, "v")):
        visits[offset + i] = dict(name=name, dim=2, most=t_r, reads=2 * t_r, fewest=1, why=why)
    return dict(route=route, visits=visits if nq and nk else {})


def softmax_route(x, chunk: int) -> dict:
    """`call`'s keywords for online_softmax(x, chunk). Chunks of one element are reduced by elementwise ops (a
    running max of single values): not counted. A last chunk of one element makes the row's statistics that element
    (`grader.reads`: a copy of it), combined with every chunk, and never read otherwise: neither its reads nor
    whether it was read are judged then."""
    why = ("keep a running max and a rescaled running sum, reading each chunk once (a first pass for the maximum and "
           "a second for the sum read it twice)")
    whole = x.shape[-1] % chunk != 1
    return dict(route=dict(forbidden_ops=SOFTMAX_OPS, max_extent=chunk, max_flops=4 * x.numel(),
                           why="Read each row a chunk at a time, keeping a running max and a rescaled running sum."),
                visits={0: dict(name="x", dim=x.dim() - 1, most=1, reads=4 if whole else x.numel(),
                                fewest=int(whole), why=why)} if chunk > 1 else {})


def decode_route(q, k, n_splits: int) -> dict:
    """`call`'s keywords for flash_decode(q, k, v, n_splits) (the merge reduces over the splits: n_splits wide)."""
    (b, h, nq, d), nk = q.shape, k.shape[2]
    one = 4 * b * h * nq * nk * d
    why = ("attend to each split once, then merge the partial results by their logsumexp (a first pass over the "
           "splits for the global maximum reads every key twice)")
    visits = {i: dict(name=name, dim=2, most=1, reads=2, fewest=1, why=why) for i, name in ((1, "k"), (2, "v"))}
    return dict(route=dict(lib_allowed=("lib.attn.attention.check_attention_shapes",), forbidden_ops=SDPA_OPS,
                           max_extent=max(math.ceil(nk / n_splits), d, n_splits),
                           why=f"Attend to each of the {n_splits} splits of the keys separately, then merge by logsumexp.",
                           min_flops=int(0.9 * one), max_flops=2 * one + 1),
                visits=visits if nk else {},
                reach=dict(most=math.ceil(nk / n_splits), even=(nk, n_splits), why=(
                    "compute each split's partial result (its own max, sum and output) from its keys alone, then "
                    "merge the partials by their logsumexp — one online pass over the chunks in sequence folds each "
                    "chunk into a running max and sum of the chunks before it (split-K: the splits are independent)")))


def backward_route(q, k, causal: bool, bq: int, bk: int) -> dict:
    """`call`'s route for flash_attention_backward (five products a visible pair: S, dP, dV, dQ, dK)."""
    (b, h, nq, d), nk = q.shape, k.shape[2]
    return dict(route=dict(lib_allowed=SHAPES_OK, forbidden_ops=SDPA_OPS + SOFTMAX_OPS + ("aten._softmax_backward",),
                           max_extent=max(bq, bk, d), why="Recompute P block by block from the saved lse.",
                           min_flops=int(0.9 * 10 * d * b * h * pairs(nq, nk, causal))))


def assert_memory_growth(peaks: dict, what: str, heads: int, d: int, block_q: int) -> None:
    """`peaks`: {N: bytes held beyond the results} at two lengths; growth allowed: O(N·d) state (see the docstring)."""
    (n1, p1), (n2, p2) = sorted(peaks.items())
    allowed = 3 * (n2 - n1) * (d + 2) * 4 * heads + 64 * 1024
    assert p2 - p1 <= allowed, (
        f"{what}: memory beyond the output (tensors, numpy arrays, lists) grew from {p1 / 1e3:.0f} kB at N={n1} to "
        f"{p2 / 1e3:.0f} kB at N={n2}, more than the {allowed / 1e3:.0f} kB that state of the output's size allows "
        f"(the output itself, m and l for each row, per-block outputs kept for a concatenation); a row of scores for "
        f"each query block grows by {(n2 - n1) * block_q * 4 * heads / 1e3:.0f} kB, the score matrix at N={n2} is "
        f"{n2 * n2 * 4 * heads / 1e6:.1f} MB {seed_note()}")
