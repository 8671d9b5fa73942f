"""Week 17's `FlashAttention` (the autograd.Function exercise) written other ways, as notebook cell sources: the wrong
routes that keep the whole score matrix or its blocks of P for backward. tests/week17_variants.py, the index of the
week's variants, loads this sibling by its path and lists each route in its `WRONG` with the words its rejection
says."""

FUNCTION_NAIVE = '''
class FlashAttention(torch.autograd.Function):
    """The whole score matrix forward, and autograd through it in backward (q, k, v, out, lse saved)."""
    @staticmethod
    def forward(ctx, q, k, v, causal=False, block_q=128, block_k=128):
        s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        if causal:
            s = s.masked_fill(~causal_mask(q.shape[2], k.shape[2], device=q.device), float("-inf"))
        out = torch.softmax(s, -1) @ v
        ctx.save_for_backward(q, k, v, out, torch.logsumexp(s, -1))
        ctx.causal = causal
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, _, _ = ctx.saved_tensors
        q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
        with torch.enable_grad():
            s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
            if ctx.causal:
                s = s.masked_fill(~causal_mask(q.shape[2], k.shape[2], device=q.device), float("-inf"))
            o = torch.softmax(s, -1) @ v
            return (*torch.autograd.grad(o, (q, k, v), dout), None, None, None)
'''

_FUNCTION_KEEPING_P = '''
def _p_blocks(q, k, causal, block_q, block_k):
    """Tiled: out and lse by blocks (each block once), and the probabilities of every block, kept."""
    nq, nk, scale = q.shape[2], k.shape[2], q.shape[-1] ** -0.5
    rows = []
    for qs in range(0, nq, block_q):
        qe = min(qs + block_q, nq)
        blocks, m, l = [], None, None
        for ks in range(0, nk, block_k):
            ke = min(ks + block_k, nk)
            s = (q[:, :, qs:qe] @ k[:, :, ks:ke].transpose(-1, -2)) * scale
            if causal:
                hidden = torch.arange(ks, ke)[None, :] > torch.arange(qs, qe)[:, None] + nk - nq
                s = s.masked_fill(hidden, float("-inf"))
            top = s.amax(-1) if m is None else torch.maximum(m, s.amax(-1))
            top = torch.where(torch.isinf(top), torch.zeros_like(top), top)
            l = torch.exp(s - top[..., None]).sum(-1) if m is None else l * torch.exp(m - top) + torch.exp(s - top[..., None]).sum(-1)
            m = top
            blocks.append((ks, s))
        rows.append((qs, [(ks, torch.exp(s - (m + torch.log(l))[..., None])) for ks, s in blocks], m + torch.log(l)))
    return rows


def _backward_from(rows, q, k, v, dout, out):
    scale = q.shape[-1] ** -0.5
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for qs, blocks, _ in rows:
        do = dout[:, :, qs:qs + blocks[0][1].shape[2]]
        delta = (do * out[:, :, qs:qs + do.shape[2]]).sum(-1, keepdim=True)
        for ks, p in blocks:
            q[:, :, qs:qs + do.shape[2]] @ k[:, :, ks:ks + p.shape[3]].transpose(-1, -2)  # S again, for show
            dv[:, :, ks:ks + p.shape[3]] += p.transpose(-1, -2) @ do
            ds = p * (do @ v[:, :, ks:ks + p.shape[3]].transpose(-1, -2) - delta)
            dq[:, :, qs:qs + do.shape[2]] += (ds @ k[:, :, ks:ks + p.shape[3]]) * scale
            dk[:, :, ks:ks + p.shape[3]] += (ds.transpose(-1, -2) @ q[:, :, qs:qs + do.shape[2]]) * scale
    return dq, dk, dv


def _forward_from(rows, v):
    outs = [sum(p @ v[:, :, ks:ks + p.shape[3]] for ks, p in blocks) for _, blocks, _ in rows]
    return torch.cat(outs, 2)
'''

FUNCTION_P_ON_CTX = _FUNCTION_KEEPING_P + '''
class FlashAttention(torch.autograd.Function):
    """Blocks both ways; the blocks of P kept in a list on ctx (not saved_tensors)."""
    @staticmethod
    def forward(ctx, q, k, v, causal=False, block_q=128, block_k=128):
        rows = _p_blocks(q, k, causal, block_q, block_k)
        out = _forward_from(rows, v)
        ctx.save_for_backward(q, k, v, out)
        ctx.rows = [(qs, list(blocks), lse) for qs, blocks, lse in rows]
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out = ctx.saved_tensors
        return (*_backward_from(ctx.rows, q, k, v, dout, out), None, None, None)
'''

FUNCTION_P_IN_A_GLOBAL = _FUNCTION_KEEPING_P + '''
_KEPT = {}


class FlashAttention(torch.autograd.Function):
    """Blocks both ways; the blocks of P kept in a module global between forward and backward."""
    @staticmethod
    def forward(ctx, q, k, v, causal=False, block_q=128, block_k=128):
        rows = _p_blocks(q, k, causal, block_q, block_k)
        out = _forward_from(rows, v)
        ctx.save_for_backward(q, k, v, out)
        _KEPT["rows"] = rows
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out = ctx.saved_tensors
        return (*_backward_from(_KEPT["rows"], q, k, v, dout, out), None, None, None)
'''
