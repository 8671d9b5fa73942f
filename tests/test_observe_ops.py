"""The observer classifies every op that computes (`grader.op_table`): pools, convolutions, windows made by
`unfold`/`as_strided`, cumulative scans, sorting and selection, scatter-adds and the like are reductions or matrix
products of the extent they combine, and an op it does not know is a verdict, not a pass.

First `observe()` in-process: each family, on a row of N elements combined at once, must show an extent of N (the
numbers below are worked out from the op's definition, not read from the table). Then wrong routes through the
isolated path, as `pytest weeks/NN` grades them: a whole-row softmax done with pooling, a convolution or an op the
observer cannot classify must fail the checks that bound the extent, and the solutions must still pass them.
"""
from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from grader import op_table
from grader.checks import assert_classified, assert_route
from grader.observe import from_wire, observe, to_wire

REPO = Path(__file__).resolve().parent.parent
N = 200  # the row length: a route that combines a whole row shows N
ROWS = 4


def _x(*shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0))


def _zeros_index(*shape):
    return torch.zeros(*shape, dtype=torch.long)


x = _x(ROWS, N)

# Each combines a whole row of N elements into one output (or, for a scan or a sort, into outputs that depend on
# all N): the observer must record a reduction of extent N.
WHOLE_ROW_REDUCTIONS = {
    "max_pool1d": lambda: F.max_pool1d(x[:, None], N),
    "max_pool1d with indices": lambda: F.max_pool1d(x[:, None], N, return_indices=True),
    "avg_pool1d": lambda: F.avg_pool1d(x[:, None], N) * N,
    "lp_pool1d": lambda: F.lp_pool1d(x[:, None].abs(), 2, N),
    "max_pool2d over a row": lambda: F.max_pool2d(x[None], (1, N)),
    "avg_pool2d over a row": lambda: F.avg_pool2d(x[None], (1, N)),
    "max_pool3d over a row": lambda: F.max_pool3d(x[None, None], (1, 1, N)),
    "adaptive_max_pool1d": lambda: F.adaptive_max_pool1d(x[:, None], 1),
    "adaptive_avg_pool1d": lambda: F.adaptive_avg_pool1d(x[:, None], 1),
    "adaptive_max_pool2d": lambda: F.adaptive_max_pool2d(x[None], (ROWS, 1)),
    "a kernel wider than the row": lambda: F.max_pool1d(x[:, None], N + 2, padding=(N + 2) // 2),
    "unfold window, then amax": lambda: x.unfold(-1, N, 1).amax(-1),
    "as_strided window, then sum": lambda: x.as_strided((ROWS, 1, N), (N, 1, 1)).sum(-1),
    "cumsum": lambda: x.cumsum(-1), "cumprod": lambda: x.cumprod(-1), "cummax": lambda: x.cummax(-1),
    "cummin": lambda: x.cummin(-1), "logcumsumexp": lambda: x.logcumsumexp(-1),
    "sort": lambda: x.sort(-1), "argsort": lambda: x.argsort(-1), "msort": lambda: torch.msort(x.t()),
    "topk": lambda: x.topk(1, -1), "kthvalue": lambda: x.kthvalue(N, -1), "median": lambda: x.median(-1),
    "nanmedian": lambda: x.nanmedian(-1), "mode": lambda: x.mode(-1),
    "searchsorted": lambda: torch.searchsorted(x[0].sort().values, x[0]),
    "bucketize": lambda: torch.bucketize(x[0], torch.linspace(-3, 3, N)),
    "argmax": lambda: x.argmax(-1), "aminmax": lambda: torch.aminmax(x, dim=-1), "max(dim)": lambda: x.max(-1),
    "std": lambda: x.std(-1), "var": lambda: x.var(-1), "var_mean": lambda: torch.var_mean(x, -1),
    "all": lambda: (x > 0).all(-1), "any": lambda: (x > 0).any(-1),
    "count_nonzero": lambda: torch.count_nonzero(x, -1), "norm(dim=-1)": lambda: x.norm(dim=-1),
    "linalg.vector_norm": lambda: torch.linalg.vector_norm(x, dim=-1), "dist": lambda: torch.dist(x[0], x[1]),
    "logsumexp": lambda: x.logsumexp(-1), "softmax": lambda: x.softmax(-1), "prod": lambda: x.prod(-1),
    "nansum": lambda: x.nansum(-1), "layer_norm": lambda: F.layer_norm(x, (N,)),
    "multinomial": lambda: torch.multinomial(x.exp(), 1, generator=torch.Generator().manual_seed(1)),
    "rfft": lambda: torch.fft.rfft(x, dim=-1), "fft": lambda: torch.fft.fft(x.to(torch.complex64), dim=-1),
    "embedding_bag (sum)": lambda: F.embedding_bag(torch.arange(N)[None], x.t().contiguous(), mode="sum"),
    "embedding_bag (max)": lambda: F.embedding_bag(torch.arange(N)[None], x.t().contiguous(), mode="max"),
    "index_reduce": lambda: torch.zeros(1, ROWS).index_reduce(0, _zeros_index(N), x.t().contiguous(), "amax"),
    "index_add": lambda: torch.zeros(1, ROWS).index_add(0, _zeros_index(N), x.t().contiguous()),
    "scatter_add": lambda: torch.zeros(ROWS, 1).scatter_add(1, _zeros_index(ROWS, N), x),
    "scatter_reduce": lambda: torch.zeros(ROWS, 1).scatter_reduce(1, _zeros_index(ROWS, N), x, "amax"),
    "scatter(reduce='add')": lambda: torch.zeros(ROWS, 1).scatter(1, _zeros_index(ROWS, N), x, reduce="add"),
    "index_put(accumulate=True)": lambda: torch.zeros(ROWS, 1).index_put_(
        (torch.arange(ROWS)[:, None], _zeros_index(ROWS, N)), x, accumulate=True),
    "put(accumulate=True)": lambda: torch.zeros(1).put_(_zeros_index(N), x[0], accumulate=True),
    "segment_reduce": lambda: torch.segment_reduce(x.t().contiguous(), "max", lengths=torch.tensor([N])),
    "bincount with weights": lambda: torch.bincount(_zeros_index(N), weights=x[0]),
    "histc": lambda: torch.histc(x[0], 10),
    "unique": lambda: torch.unique(x[0]),
    "nll_loss (mean over N rows)": lambda: F.nll_loss(x.t(), _zeros_index(N)),
}


@pytest.mark.parametrize("name", list(WHOLE_ROW_REDUCTIONS))
def test_a_whole_row_reduction_is_seen_with_its_extent(name):
    _, obs = observe(WHOLE_ROW_REDUCTIONS[name])
    assert obs.unclassified == []
    assert obs.max_reduction_extent() >= N, (name, obs.reductions)
    assert obs.max_reduction_extent() <= ROWS * N  # not more than the whole input either


# Matrix products that multiply across a whole row: the contraction (or an output extent) is N.
WHOLE_ROW_PRODUCTS = {
    "conv1d, a kernel as long as the row": (lambda: F.conv1d(x[:, None], torch.ones(1, 1, N)), "inner"),
    "conv1d, depthwise (a row per channel)": (lambda: F.conv1d(x[None], torch.ones(ROWS, 1, N), groups=ROWS), "inner"),
    "conv2d over a row": (lambda: F.conv2d(x[None, None], torch.ones(1, 1, 1, N)), "inner"),
    "conv_transpose1d": (lambda: F.conv_transpose1d(x[:, None, :1].contiguous(), torch.ones(1, 1, N)), "dim"),
    "conv1d, a row of positions": (lambda: F.conv1d(x.t()[None].transpose(1, 2).contiguous(), torch.ones(1, ROWS, 1)), "dim"),
    "einsum": (lambda: torch.einsum("ij,kj->ik", x, x), "inner"),
    "tensordot": (lambda: torch.tensordot(x, x, dims=([1], [1])), "inner"),
    "matmul": (lambda: x @ x.t(), "inner"), "linear": (lambda: F.linear(x, x, torch.ones(ROWS)), "inner"),
    "addmv": (lambda: torch.addmv(torch.zeros(ROWS), x, torch.ones(N)), "inner"),
    "baddbmm": (lambda: torch.baddbmm(torch.zeros(1, ROWS, ROWS), x[None], x.t()[None]), "inner"),
    "addbmm": (lambda: torch.addbmm(torch.zeros(ROWS, ROWS), x[None], x.t()[None]), "inner"),
    "addr (outer product)": (lambda: torch.addr(torch.zeros(ROWS, N), torch.ones(ROWS), torch.ones(N)), "outer"),
    "cdist": (lambda: torch.cdist(x, x), "inner"), "cdist p=1": (lambda: torch.cdist(x, x, p=1), "inner"),
    "pdist": (lambda: F.pdist(x), "inner"),
    "bilinear": (lambda: F.bilinear(x, x, torch.ones(3, N, N)), "inner"),
    "a solve of an N×N system": (lambda: torch.linalg.solve(torch.eye(N) * 2, x.t()), "dim"),
    "sdpa over N keys": (lambda: F.scaled_dot_product_attention(x[None, None, :1], x[None, None], x[None, None]), "dim"),
}


@pytest.mark.parametrize("name", list(WHOLE_ROW_PRODUCTS))
def test_a_whole_row_product_is_seen_with_its_extent(name):
    fn, which = WHOLE_ROW_PRODUCTS[name]
    _, obs = observe(fn)
    assert obs.unclassified == []
    seen = {"inner": obs.max_matmul_inner(), "outer": obs.max_matmul_outer(), "dim": obs.max_matmul_dim()}[which]
    assert seen >= N, (name, obs.matmuls)
    assert obs.max_matmul_dim() >= N


def test_sdpa_is_also_a_softmax_over_its_keys():
    _, obs = observe(lambda: F.scaled_dot_product_attention(x[None, None, :1], x[None, None], x[None, None]))
    assert obs.max_reduction_extent() == ROWS  # 4 keys (the rows of x): each query's softmax combines 4 scores


CHUNK = 16
# The same quantities computed chunk by chunk: the extents stay at the chunk (the table over-reports nothing).
CHUNKED = {
    "max_pool1d in windows of 16": lambda: F.max_pool1d(x[:, None], CHUNK),
    "conv1d with a kernel of 16, stride 16": lambda: F.conv1d(x[:, None], torch.ones(1, 1, CHUNK), stride=CHUNK),
    "unfold windows of 16": lambda: x.unfold(-1, CHUNK, CHUNK).amax(-1),
    "cumsum of chunks": lambda: x[:, :192].reshape(ROWS, -1, CHUNK).cumsum(-1),
    "scatter_add of chunks": lambda: torch.zeros(ROWS, N // 8).scatter_add(
        1, torch.arange(N).div(CHUNK, rounding_mode="floor").expand(ROWS, N), x),
    "sort of chunks": lambda: x[:, :192].reshape(ROWS, -1, CHUNK).sort(-1),
    "bmm of 16-wide blocks": lambda: x[:, :192].reshape(ROWS, -1, CHUNK) @ torch.ones(CHUNK, 1),
}


@pytest.mark.parametrize("name", list(CHUNKED))
def test_chunked_work_shows_the_chunk(name):
    _, obs = observe(CHUNKED[name])
    assert obs.unclassified == []
    assert max(obs.max_reduction_extent(), obs.max_matmul_inner()) == CHUNK, (obs.reductions, obs.matmuls)


ELEMENTWISE_AND_MOVES = {
    "arithmetic": lambda: torch.exp(x - x.clamp(min=0)) * 2 + 1,
    "max of two tensors": lambda: torch.max(x, x.flip(-1)),
    "where and masks": lambda: torch.where(x > 0, x, torch.zeros_like(x)).masked_fill(x < -1, float("-inf")),
    "views and copies": lambda: torch.cat([x.t().contiguous().view(-1), x[:, ::2].reshape(-1)]).float(),
    "indexing": lambda: (x[torch.tensor([0, 2])], x[x > 0], x.gather(1, _zeros_index(ROWS, 3)), x.nonzero()),
    "assignment through a mask": lambda: x.clone().masked_fill_(x > 0, 0.0).index_put_((x > 1,), torch.tensor(1.0)),
    "creation": lambda: (torch.arange(5), torch.full((2, 2), 3.0), torch.empty(3), torch.randn(2)),
    ".item() and .tolist()": lambda: (x[0, 0].item(), x[0].tolist(), torch.promote_types(x.dtype, torch.float64)),
}


@pytest.mark.parametrize("name", list(ELEMENTWISE_AND_MOVES))
def test_ops_that_combine_nothing_are_known_and_record_no_extent(name):
    _, obs = observe(ELEMENTWISE_AND_MOVES[name])
    assert obs.unclassified == []
    assert obs.reductions == [] and obs.matmuls == []


def test_an_op_the_table_does_not_know_is_recorded_and_crosses_the_wire():
    def row_sums():  # prims.sum is a whole-row sum the table does not classify; quantize_per_tensor likewise
        torch.quantize_per_tensor(x, 0.1, 0, torch.quint8)
        return torch.ops.prims.sum(x, [1])

    got, obs = observe(row_sums)
    assert torch.allclose(got, x.sum(1))
    assert obs.unclassified == ["aten.prims.sum", "aten.quantize_per_tensor"]
    assert obs.max_reduction_extent() == 0  # unmeasured: that is why it is a verdict
    assert from_wire(json.loads(json.dumps(to_wire(obs)))).unclassified == obs.unclassified
    with pytest.raises(AssertionError, match=r"^row_sums: used aten.prims.sum \(and 1 more\), which the checks "
                                             r"cannot classify: compute it with"):
        assert_route(obs, "row_sums")
    with pytest.raises(AssertionError, match="used aten.prims.sum, which the checks cannot classify"):
        assert_classified(obs, "row_sums", allowed=("aten.quantize",))
    assert_route(obs, "row_sums", unclassified_allowed=("aten.prims.", "aten.quantize_per_tensor"))  # allowed


def test_a_classification_that_fails_is_unclassified_not_a_crash(monkeypatch):
    def broken(b, result):
        raise KeyError("an argument the table did not expect")

    reductions = dict(op_table.REDUCTIONS, sum=broken)
    monkeypatch.setattr(op_table, "REDUCTIONS", reductions)
    got, obs = observe(lambda: x.sum(-1))
    assert torch.equal(got, x.sum(-1)) and obs.unclassified == ["aten.sum"]


def test_data_dependent_extents_fall_back_to_a_bound_on_meta():
    index = _zeros_index(ROWS, N).to("meta")
    _, obs = observe(lambda: torch.zeros(ROWS, 1, device="meta").scatter_add(1, index, x.to("meta")))
    assert obs.unclassified == [] and obs.max_reduction_extent() == N  # every index could name one slot


def test_the_table_names_real_ops_once():
    """A typo would leave the op it meant unclassified; an op in two families would be read two ways."""
    real = {op_table.base_name("aten." + n.split("::")[1].split(".")[0]) for n in torch._C._dispatch_get_all_op_names()
            if n.startswith("aten::")}
    families = [op_table.ELEMENTWISE, op_table.VIEWS, op_table.COPIES, op_table.CREATION, op_table.INDEXING,
                op_table.METADATA, frozenset(op_table.REDUCTIONS), frozenset(op_table.MATMULS), op_table.ATTENTION]
    names = [n for f in families for n in f]
    assert sorted(n for n in names if n not in real) == []
    assert sorted({n for n in names if names.count(n) > 1}) == []


def test_every_op_torch_calls_pointwise_is_known():
    """torch's own `pointwise` tag, as a second opinion on the elementwise list (the table is explicit: the tag
    also marks `equal` and `max`, which reduce, and a torch upgrade can add ops to review)."""
    tagged = set()
    for n in torch._C._dispatch_get_all_op_names():
        if not n.startswith("aten::"):
            continue
        packet, _, overload = n[len("aten::"):].partition(".")
        op = getattr(getattr(torch.ops.aten, packet, None), overload or "default", None)
        if op is not None and torch.Tag.pointwise in op.tags:
            tagged.add(op_table.base_name("aten." + packet))
    assert sorted(tagged - op_table.KNOWN) == []


# --- wrong routes through the isolated path -------------------------------------------------------------------

def _load(tmp_path: Path, week: int, edits: dict[str, str]):
    """The solution of `week` with some exercise cells replaced, loaded as `pytest weeks/NN` does."""
    from grader.harness import load_exercises, with_cell_source

    path = next((REPO / "solutions" / str(week)).glob("*.ipynb"))
    nb = json.loads(path.read_text())
    for grade_id, src in edits.items():
        nb = with_cell_source(nb, grade_id, textwrap.dedent(src))
    out = tmp_path / f"w{week}" / path.name
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(nb))
    return load_exercises(out)


# The whole row's max by max_pool1d and its sum by avg_pool1d (times the length): no reduction op the observer
# used to know combined more than nothing.
ONLINE_SOFTMAX_POOLED = """
    import torch.nn.functional as F

    def online_softmax(x, chunk_size):
        n = x.shape[-1]
        m = F.max_pool1d(x.reshape(-1, 1, n), n).reshape(*x.shape[:-1], 1)  # the whole row at once
        m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
        e = torch.exp(x - m)
        return e / (F.avg_pool1d(e.reshape(-1, 1, n), n).reshape(*x.shape[:-1], 1) * n)
    """
# The max chunk by chunk, as asked, but the sum as one convolution with a kernel of ones as long as the row.
ONLINE_SOFTMAX_CONV = """
    import torch.nn.functional as F

    def online_softmax(x, chunk_size):
        n = x.shape[-1]
        m = torch.full(x.shape[:-1], float("-inf"), dtype=x.dtype, device=x.device)
        for start in range(0, n, chunk_size):
            m = torch.maximum(m, x[..., start:start + chunk_size].amax(dim=-1))
        m = torch.where(torch.isinf(m), torch.zeros_like(m), m)[..., None]
        e = torch.exp(x - m)
        ones = torch.ones(1, 1, n, dtype=x.dtype, device=x.device)
        return e / F.conv1d(e.reshape(-1, 1, n), ones).reshape(*x.shape[:-1], 1)
    """
# Scores and P·V split by split (every product stays within a split), the softmax over all the keys at once.
_FLASH_DECODE = """
    import torch.nn.functional as F

    def flash_decode(q, k, v, n_splits=4):
        nk, d = k.shape[2], q.shape[-1]
        bounds = [i * nk // n_splits for i in range(n_splits + 1)]
        splits = list(zip(bounds[:-1], bounds[1:]))
        s = torch.cat([q.float() @ k[:, :, a:b].float().transpose(-1, -2) for a, b in splits], dim=-1) * d ** -0.5
        {row_max}
        p = torch.exp(s - m)
        {row_sum}
        return (sum(p[..., a:b] @ v[:, :, a:b].float() for a, b in splits) / l).to(q.dtype)
    """
FLASH_DECODE_POOLED = _FLASH_DECODE.format(
    row_max="m = F.max_pool1d(s.reshape(-1, 1, nk), nk).reshape(*s.shape[:-1], 1)",
    row_sum="l = F.avg_pool1d(p.reshape(-1, 1, nk), nk).reshape(*s.shape[:-1], 1) * nk")
FLASH_DECODE_CONV = _FLASH_DECODE.format(
    row_max="m = torch.stack([s[..., a:b].amax(-1) for a, b in splits if b > a], -1).amax(-1, keepdim=True)",
    row_sum="l = F.conv1d(p.reshape(-1, 1, nk), torch.ones(1, 1, nk, device=p.device)).reshape(*s.shape[:-1], 1)")
# The row sum by an op the observer does not classify (prims.sum), the max chunk by chunk.
ONLINE_SOFTMAX_UNKNOWN_OP = """
    def online_softmax(x, chunk_size):
        m = torch.full(x.shape[:-1], float("-inf"), dtype=x.dtype, device=x.device)
        for start in range(0, x.shape[-1], chunk_size):
            m = torch.maximum(m, x[..., start:start + chunk_size].amax(dim=-1))
        e = torch.exp(x - torch.where(torch.isinf(m), torch.zeros_like(m), m)[..., None])
        return e / torch.ops.prims.sum(e, [e.dim() - 1]).unsqueeze(-1)
    """


@pytest.mark.parametrize("route", ["pooling", "conv1d"])
def test_week17_a_whole_row_softmax_by_pooling_or_convolution_fails(tmp_path, route):
    from grader.checks import week17

    online, decode = {"pooling": (ONLINE_SOFTMAX_POOLED, FLASH_DECODE_POOLED),
                      "conv1d": (ONLINE_SOFTMAX_CONV, FLASH_DECODE_CONV)}[route]
    ex = _load(tmp_path, 17, {"online_softmax": online, "flash_decode": decode})
    # the row's length in the message is whichever of the check's (randomized) calls the route first failed on
    seen = r"a reduction .* combined \d+ elements" if route == "pooling" else r"a matrix product of \d+ rows/columns"
    with pytest.raises(AssertionError, match=f"online_softmax.*{seen}"):
        week17.check_online_softmax(ex.online_softmax)
    with pytest.raises(AssertionError, match=f"flash_decode.*{seen}"):
        week17.check_flash_decode(ex.flash_decode)
    week17.check_merge_partials(ex.merge_partials)  # the solution's other exercises still pass


# The whole-row softmax on a sparse copy of the row: the observers cannot record a sparse op (no extent is seen), so
# before it was a verdict this passed every extent bound (the forward's max_reduction_extent was 0).
ONLINE_SOFTMAX_SPARSE = """
    def online_softmax(x, chunk_size):
        return torch.sparse.softmax(x.to_sparse(), x.dim() - 1).to_dense()
    """


def test_an_op_the_observers_cannot_record_is_a_verdict():
    got, obs = observe(lambda: torch.sparse.softmax(x.to_sparse(), 1).to_dense())
    assert torch.allclose(got, x.softmax(1)) and obs.max_reduction_extent() == 0  # unseen
    assert from_wire(json.loads(json.dumps(to_wire(obs)))).ops == obs.ops
    with pytest.raises(AssertionError, match=r"^sparse: ran _sparse_softmax.default \(and 2 more\) on arguments "
                                             r"the checks cannot record"):
        assert_classified(obs, "sparse")


def test_week17_a_whole_row_softmax_on_a_sparse_tensor_fails(tmp_path):
    from grader.checks import week17

    ex = _load(tmp_path, 17, {"online_softmax": ONLINE_SOFTMAX_SPARSE})
    with pytest.raises(AssertionError, match="online_softmax.*cannot record"):
        week17.check_online_softmax(ex.online_softmax)


# The child's live op table, reached from the recorder's class (one `object.__subclasses__()` walk away; the names
# built so that no source check reads them), with prims.sum moved among the ops that combine nothing.
_TABLE_REWRITTEN = """
    def _classes(c):
        for s in type.__subclasses__(c):
            yield s
            yield from _classes(s)

    _recorder = next(c for c in _classes(object) if c.__name__ == "OpRecorder")
    _observe = getattr(_recorder._classify, "__glo" + "bals__")
    _table = getattr(_observe["classify"], "__glo" + "bals__")
    _table["COMBINE_NOTHING"] = _table["COMBINE_NOTHING"] | {"prims.sum"}
    """


@pytest.mark.parametrize("table", ["as it is", "rewritten"])
def test_week17_a_row_sum_by_an_op_the_observer_cannot_classify_fails(tmp_path, table):
    from grader.checks import week17

    source = ONLINE_SOFTMAX_UNKNOWN_OP if table == "as it is" else _TABLE_REWRITTEN + ONLINE_SOFTMAX_UNKNOWN_OP
    ex = _load(tmp_path, 17, {"online_softmax": source})
    if table == "as it is":
        with pytest.raises(AssertionError, match="online_softmax.*used aten.prims.sum, which the checks cannot classify"):
            week17.check_online_softmax(ex.online_softmax)
        return
    with pytest.raises(AssertionError, match="online_softmax"):  # whichever the check meets first (two passes, say)
        week17.check_online_softmax(ex.online_softmax)
    # ... and the rewritten table is a verdict for the exercise whatever else failed
    verdicts = " ".join(w for whys in ex._session.tampered.values() for w in whys)
    assert "replaced the grader's own code in its process (grader.op_table.COMBINE_NOTHING)" in verdicts, verdicts


# Scores a few blocks at a time (every product within ~32 keys, each block of K read once), kept for the whole
# sequence, then the softmax over the whole row by pooling, and P·V a few blocks at a time again.
PAGED_ATTENTION_POOLED = """
    import torch.nn.functional as F

    def paged_attention(q, k_pool, v_pool, block_tables, context_lens):
        b, h, d = q.shape
        _, hkv, bs, _ = k_pool.shape
        step = max(1, 32 // bs)
        out = torch.empty(b, h, d, dtype=q.dtype, device=q.device)
        for i in range(b):
            n = int(context_lens[i])
            blocks = -(-n // bs)
            qg = q[i].reshape(hkv, h // hkv, d).float() / math.sqrt(d)
            s = torch.empty(hkv, h // hkv, blocks * bs, device=q.device)
            for j in range(0, blocks, step):
                kb = k_pool[block_tables[i, j:min(j + step, blocks)]].permute(1, 0, 2, 3).reshape(hkv, -1, d).float()
                s[..., j * bs:min(j + step, blocks) * bs] = qg @ kb.transpose(-1, -2)
            s[..., n:] = float("-inf")
            width = s.shape[-1]
            m = F.max_pool1d(s.reshape(-1, 1, width), width).reshape(hkv, h // hkv, 1)  # the whole row
            s.sub_(m).exp_()
            l = F.avg_pool1d(s.reshape(-1, 1, width), width).reshape(hkv, h // hkv, 1) * width
            acc = torch.zeros(hkv, h // hkv, d, device=q.device)
            for j in range(0, blocks, step):
                vb = v_pool[block_tables[i, j:min(j + step, blocks)]].permute(1, 0, 2, 3).reshape(hkv, -1, d).float()
                acc += s[..., j * bs:min(j + step, blocks) * bs] @ vb
            out[i] = (acc / l).reshape(h, d).to(q.dtype)
        return out
    """


def test_week19_a_whole_row_softmax_by_pooling_fails(tmp_path):
    from grader.checks import week19

    ex = _load(tmp_path, 19, {"paged_attention": PAGED_ATTENTION_POOLED})
    with pytest.raises(AssertionError, match=r"paged_attention case 0.*one reduction \(softmax, max, sum\) combined"):
        week19.check_paged_attention(ex.paged_attention)
