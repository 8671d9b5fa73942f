"""Week 19's wrong routes for `paged_attention`: gathering the whole sequence, whole-row softmaxes, pre-made
workspaces, numpy and popped-op routes, and near-solutions with one flaw each (the comment names it). The rest of the
week's routes: tests/_week19_routes.py; tests/test_week19_checks.py sends both to an isolated child."""
import math

import torch

from lib.batching import paged as ref

# --- paged attention ------------------------------------------------------------------------------------

def _gather_all(k_pool, block_tables):
    """[B, Hkv, max_blocks * block_size, d]: every sequence's keys, contiguous (what paging avoids)."""
    b, width = block_tables.shape
    _, hkv, bs, d = k_pool.shape
    return k_pool[block_tables].permute(0, 2, 1, 3, 4).reshape(b, hkv, width * bs, d)


def gather_then_attend(q, k_pool, v_pool, block_tables, context_lens):
    k, v = _gather_all(k_pool, block_tables), _gather_all(v_pool, block_tables)  # [B, Hkv, L, d]
    b, h, d = q.shape
    rep = h // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)  # [B, H, L, d]
    scores = (q[:, :, None] @ k.transpose(-1, -2))[:, :, 0] / math.sqrt(d)  # [B, H, L]
    mask = torch.arange(k.shape[2])[None, :] < context_lens[:, None]  # [B, L]
    probs = torch.softmax(scores.masked_fill(~mask[:, None], float("-inf")), -1)
    return (probs[:, :, None] @ v)[:, :, 0]


def sdpa_on_materialized(q, k_pool, v_pool, block_tables, context_lens):
    outs = []
    for i, n in enumerate(context_lens.tolist()):
        k = _gather_all(k_pool, block_tables[i:i + 1])[:, :, :n]
        v = _gather_all(v_pool, block_tables[i:i + 1])[:, :, :n]
        rep = q.shape[1] // k.shape[1]
        outs.append(torch.nn.functional.scaled_dot_product_attention(
            q[i:i + 1, :, None], k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1))[0, :, 0])
    return torch.stack(outs)


def calls_lib_attention(q, k_pool, v_pool, block_tables, context_lens):
    return ref.paged_attention(q, k_pool, v_pool, block_tables, context_lens)


def ignores_lengths(q, k_pool, v_pool, block_tables, context_lens):  # attends to the last block's empty slots too
    bs = k_pool.shape[2]
    return _solution_like(q, k_pool, v_pool, block_tables, (context_lens + bs - 1) // bs * bs)


WORKSPACE = torch.empty(1 << 22)  # made when the cell runs, before the check observes anything (in the child)


def workspace_gather(q, k_pool, v_pool, block_tables, context_lens):
    """Each sequence's K and V gathered (out=) into a workspace made beforehand: no allocation to see; then a
    softmax over the whole row."""
    b, h, d = q.shape
    _, hkv, bs, _ = k_pool.shape
    outs = []
    for i, n in enumerate(context_lens.tolist()):
        nb = -(-n // bs)
        size = hkv * nb * bs * d
        k, v = WORKSPACE[:size].view(hkv, nb, bs, d), WORKSPACE[size:2 * size].view(hkv, nb, bs, d)
        torch.index_select(k_pool.transpose(0, 1), 1, block_tables[i, :nb], out=k)
        torch.index_select(v_pool.transpose(0, 1), 1, block_tables[i, :nb], out=v)
        kc, vc = k.view(hkv, nb * bs, d)[:, :n], v.view(hkv, nb * bs, d)[:, :n]
        qg = q[i].reshape(hkv, h // hkv, d)
        p = torch.softmax(qg @ kc.transpose(-1, -2) / math.sqrt(d), -1)  # [Hkv, group, n]
        outs.append((p @ vc).reshape(h, d))
    return torch.stack(outs)


def _online_over(q, k, v, n, chunk=32):
    """Online softmax of q [H, d] over contiguous k, v [Hkv, >= n, d], `chunk` keys at a time (GQA by grouping)."""
    h, d = q.shape
    hkv = k.shape[0]
    qg = q.reshape(hkv, h // hkv, d) / math.sqrt(d)
    m = torch.full((hkv, h // hkv), float("-inf"))
    l, acc = torch.zeros(hkv, h // hkv), torch.zeros(hkv, h // hkv, d)
    for s0 in range(0, n, chunk):
        s = qg @ k[:, s0:min(n, s0 + chunk)].transpose(-1, -2)  # [Hkv, group, c]
        m_new = torch.maximum(m, s.amax(-1))
        p, a = torch.exp(s - m_new[..., None]), torch.exp(m - m_new)
        l, acc, m = l * a + p.sum(-1), acc * a[..., None] + p @ v[:, s0:min(n, s0 + chunk)], m_new
    return (acc / l[..., None]).reshape(h, d)


def workspace_online(q, k_pool, v_pool, block_tables, context_lens):
    """Each sequence's K and V gathered (out=) into a workspace made when the cell ran, then an online softmax in
    chunks of 32 over it: no allocation, no long reduction — but the contiguous copy paging avoids."""
    b, h, d = q.shape
    _, hkv, bs, _ = k_pool.shape
    out = torch.empty_like(q)
    for i, n in enumerate(context_lens.tolist()):
        nb = -(-n // bs)
        size = hkv * nb * bs * d
        k, v = WORKSPACE[:size].view(hkv, nb, bs, d), WORKSPACE[size:2 * size].view(hkv, nb, bs, d)
        torch.index_select(k_pool.transpose(0, 1), 1, block_tables[i, :nb], out=k)
        torch.index_select(v_pool.transpose(0, 1), 1, block_tables[i, :nb], out=v)
        out[i] = _online_over(q[i], k.view(hkv, nb * bs, d), v.view(hkv, nb * bs, d), n)
    return out


def workspace_by_block(q, k_pool, v_pool, block_tables, context_lens):
    """The same workspace filled one block at a time (every write is one block, as in the kernel), then read in
    chunks: the copy is still made, just in small pieces."""
    b, h, d = q.shape
    _, hkv, bs, _ = k_pool.shape
    out = torch.empty_like(q)
    for i, n in enumerate(context_lens.tolist()):
        nb = -(-n // bs)
        size = hkv * nb * bs * d
        k, v = WORKSPACE[:size].view(hkv, nb * bs, d), WORKSPACE[size:2 * size].view(hkv, nb * bs, d)
        for j in range(nb):
            k[:, j * bs:(j + 1) * bs].copy_(k_pool[int(block_tables[i, j])])
            v[:, j * bs:(j + 1) * bs].copy_(v_pool[int(block_tables[i, j])])
        out[i] = _online_over(q[i], k, v, n)
    return out


def chunked_gather_full_row(q, k_pool, v_pool, block_tables, context_lens):
    """Blocks read a chunk at a time (nothing big allocated), the scores of the whole row kept, one softmax."""
    b, h, d = q.shape
    _, hkv, bs, _ = k_pool.shape
    out = torch.empty_like(q)
    for i, n in enumerate(context_lens.tolist()):
        qg = q[i].reshape(hkv, h // hkv, d) / math.sqrt(d)
        nb = -(-n // bs)
        scores = torch.cat([qg @ k_pool[int(block_tables[i, j])].transpose(-1, -2) for j in range(nb)], -1)[..., :n]
        p = torch.softmax(scores, -1)  # [Hkv, group, n]
        acc = torch.zeros(hkv, h // hkv, d)
        for j in range(nb):
            pj = p[..., j * bs:min(n, (j + 1) * bs)]
            acc += pj @ v_pool[int(block_tables[i, j])][:, :pj.shape[-1]]
        out[i] = acc.reshape(h, d)
    return out


def _chunks(q, k_pool, block_tables, context_lens):
    """(positions valid [B, c*bs], block ids [B, c]) per chunk of about 32 keys, as the solution walks the tables."""
    bs = k_pool.shape[2]
    per_step = max(1, 32 // bs)
    for j0 in range(0, block_tables.shape[1], per_step):
        j1 = min(j0 + per_step, block_tables.shape[1])
        valid = torch.arange(j0 * bs, j1 * bs, device=q.device)[None, :] < context_lens[:, None]
        yield valid, torch.where(valid[:, ::bs], block_tables[:, j0:j1], 0)


def two_pass_softmax(q, k_pool, v_pool, block_tables, context_lens):
    """Exact, small chunks, no long reduction: a first pass over the blocks for the row's max, a second that
    computes the scores again for the exponentials — K read twice."""
    b, h, d = q.shape
    _, hkv, bs, _ = k_pool.shape
    qg = q.reshape(b, hkv, h // hkv, d) / math.sqrt(d)

    def scores(valid, ids):
        kb = k_pool[ids].permute(0, 2, 1, 3, 4).reshape(b, hkv, -1, d)
        return (qg @ kb.transpose(-1, -2)).masked_fill(~valid[:, None, None, :], float("-inf"))

    m = torch.full((b, hkv, h // hkv), float("-inf"))
    for valid, ids in _chunks(q, k_pool, block_tables, context_lens):
        m = torch.maximum(m, scores(valid, ids).amax(-1))
    l, acc = torch.zeros(b, hkv, h // hkv), torch.zeros(b, hkv, h // hkv, d)
    for valid, ids in _chunks(q, k_pool, block_tables, context_lens):
        p = torch.exp(scores(valid, ids) - m[..., None])
        l = l + p.sum(-1)
        acc = acc + p @ v_pool[ids].permute(0, 2, 1, 3, 4).reshape(b, hkv, -1, d)
    return (acc / l[..., None]).reshape(b, h, d)


def per_query_head_online(q, k_pool, v_pool, block_tables, context_lens):
    """One pass per query head (vLLM's first kernel did this): each block of K read once for every query head of its
    GQA group, where the group shares it (issue 54: read once per KV head)."""
    b, h, d = q.shape
    _, hkv, bs, _ = k_pool.shape
    out = torch.empty_like(q)
    for j in range(h):
        kv = j // (h // hkv)
        dev = q.device
        m, l, acc = torch.full((b,), float("-inf"), device=dev), torch.zeros(b, device=dev), torch.zeros(b, d, device=dev)
        for valid, ids in _chunks(q, k_pool, block_tables, context_lens):
            kb = k_pool[ids, kv].reshape(b, -1, d)  # [B, c*bs, d]
            s = (kb @ q[:, j, :, None])[..., 0].masked_fill(~valid, float("-inf")) / math.sqrt(d)
            m_new = torch.maximum(m, s.amax(-1))
            safe = torch.where(torch.isinf(m_new), 0.0, m_new)
            p, a = torch.exp(s - safe[:, None]), torch.exp(m - safe)
            l, acc, m = l * a + p.sum(-1), acc * a[:, None] + (p[:, None] @ v_pool[ids, kv].reshape(b, -1, d))[:, 0], m_new
        out[:, j] = acc / l[:, None]
    return out


def per_head_full_row(q, k_pool, v_pool, block_tables, context_lens):
    """Per sequence and head: the head's keys gathered, a softmax over the full row."""
    b, h, d = q.shape
    _, hkv, bs, _ = k_pool.shape
    out = torch.empty_like(q)
    for i, n in enumerate(context_lens.tolist()):
        ids = block_tables[i, :-(-n // bs)]
        for j in range(h):
            kv = j // (h // hkv)
            k = k_pool[ids, kv].reshape(-1, d)[:n]
            v = v_pool[ids, kv].reshape(-1, d)[:n]
            out[i, j] = torch.softmax(k @ q[i, j] / math.sqrt(d), 0) @ v
    return out


def per_sequence_all_heads(q, k_pool, v_pool, block_tables, context_lens):
    """The most natural wrong route: one sequence at a time, all its K and V gathered, online softmax in chunks."""
    b, h, d = q.shape
    _, hkv, bs, _ = k_pool.shape
    out = torch.empty_like(q)
    for i, n in enumerate(context_lens.tolist()):
        ids = block_tables[i, :-(-n // bs)]
        k = k_pool[ids].transpose(0, 1).reshape(hkv, -1, d)[:, :n].repeat_interleave(h // hkv, 0)  # [H, n, d]
        v = v_pool[ids].transpose(0, 1).reshape(hkv, -1, d)[:, :n].repeat_interleave(h // hkv, 0)
        m = torch.full((h,), float("-inf"))
        l, acc = torch.zeros(h), torch.zeros(h, d)
        for s0 in range(0, n, 32):
            s = (k[:, s0:s0 + 32] @ q[i][:, :, None])[..., 0] / math.sqrt(d)
            m_new = torch.maximum(m, s.amax(-1))
            p, a = torch.exp(s - m_new[:, None]), torch.exp(m - m_new)
            l, acc, m = l * a + p.sum(-1), acc * a[:, None] + (p[:, None] @ v[:, s0:s0 + 32])[:, 0], m_new
        out[i] = acc / l[:, None]
    return out


def _solution_like(q, k_pool, v_pool, block_tables, context_lens, scale=None, device=True, chunk=32):
    """The solution's online softmax, with the flaw a wrong route below asks for."""
    b, h, d = q.shape
    _, hkv, bs, _ = k_pool.shape
    group = h // hkv
    dev = q.device if device else None
    per_step = max(1, chunk // bs)
    qg = q.reshape(b, hkv, group, d).float() * (scale if scale is not None else d ** -0.5)
    m = torch.full((b, hkv, group), float("-inf"), device=dev)
    l = torch.zeros(b, hkv, group, device=dev)
    acc = torch.zeros(b, hkv, group, d, device=dev)
    for j0 in range(0, block_tables.shape[1], per_step):
        j1 = min(j0 + per_step, block_tables.shape[1])
        pos = torch.arange(j0 * bs, j1 * bs, device=q.device)
        valid = pos[None, :] < context_lens[:, None]
        ids = torch.where(valid[:, ::bs], block_tables[:, j0:j1], 0)
        kb = k_pool[ids].permute(0, 2, 1, 3, 4).reshape(b, hkv, -1, d).float()
        vb = v_pool[ids].permute(0, 2, 1, 3, 4).reshape(b, hkv, -1, d).float()
        s = (qg @ kb.transpose(-1, -2)).masked_fill(~valid[:, None, None, :], float("-inf"))
        m_new = torch.maximum(m, s.amax(-1))
        m_safe = torch.where(torch.isinf(m_new), 0.0, m_new)
        p = torch.exp(s - m_safe[..., None])
        alpha = torch.exp(m - m_safe)
        l = l * alpha + p.sum(-1)
        acc = acc * alpha[..., None] + p @ vb
        m = m_new
    return (acc / l[..., None]).reshape(b, h, d).to(q.dtype)


def scale_quarter(q, k_pool, v_pool, block_tables, context_lens):  # 1/sqrt(16): right only for head_dim 16
    return _solution_like(q, k_pool, v_pool, block_tables, context_lens, scale=0.25)


def no_device(q, k_pool, v_pool, block_tables, context_lens):  # m, l, acc on the CPU whatever q's device
    return _solution_like(q, k_pool, v_pool, block_tables, context_lens, device=False)


def scales_pool_in_place(q, k_pool, v_pool, block_tables, context_lens):  # corrupts the cache for later steps
    k_pool.mul_(q.shape[-1] ** -0.5)
    return _solution_like(q, k_pool, v_pool, block_tables, context_lens, scale=1.0)


def numpy_route(q, k_pool, v_pool, block_tables, context_lens):  # .numpy() fails on CUDA tensors
    import numpy as np

    qn, kn, vn = q.numpy(), k_pool.numpy(), v_pool.numpy()
    b, h, d = qn.shape
    _, hkv, bs, _ = kn.shape
    out = np.zeros_like(qn)
    for i, n in enumerate(context_lens.tolist()):
        ids = block_tables[i, :-(-n // bs)].numpy()
        for j in range(h):
            k = kn[ids, j // (h // hkv)].reshape(-1, d)[:n]
            v = vn[ids, j // (h // hkv)].reshape(-1, d)[:n]
            s = k @ qn[i, j] / math.sqrt(d)
            p = np.exp(s - s.max())
            out[i, j] = (p / p.sum()) @ v
    return torch.from_numpy(out)


def numpy_per_head_decoy_exp(q, k_pool, v_pool, block_tables, context_lens):
    """The numpy route with a torch.exp beside it for the check that wants an exponential seen: torch allocates
    nothing and reads no block of the pool."""
    torch.exp(torch.zeros(1, device=q.device))
    return numpy_route(q, k_pool, v_pool, block_tables, context_lens)


def sdpa_popped(q, k_pool, v_pool, block_tables, context_lens):
    """SDPA after taking every dispatch mode (the observer's) off the stack, put back afterwards."""
    from torch.utils import _python_dispatch as pd

    modes = []
    while torch._C._len_torch_dispatch_stack() > 0:
        modes.append(pd._pop_mode())
    try:
        return sdpa_on_materialized(q, k_pool, v_pool, block_tables, context_lens)
    finally:
        for mode in reversed(modes):
            pd._push_mode(mode)


WRONG = [_gather_all, gather_then_attend, sdpa_on_materialized, calls_lib_attention, ignores_lengths,
         workspace_gather, _online_over, workspace_online, workspace_by_block, chunked_gather_full_row, _chunks,
         two_pass_softmax, per_query_head_online, per_head_full_row, per_sequence_all_heads, _solution_like,
         numpy_per_head_decoy_exp, scale_quarter, no_device, scales_pool_in_place, numpy_route, sdpa_popped]
