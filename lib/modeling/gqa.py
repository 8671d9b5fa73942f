"""Sharing KV heads: from multi-head to grouped-query (GQA) and multi-query (MQA) attention (week 16).

GQA (Ainslie et al. 2023, "GQA: Training Generalized Multi-Query Transformer Models from Multi-Head
Checkpoints") lets each group of query heads share one key head and one value head; MQA (Shazeer 2019,
"Fast Transformer Decoding: One Write-Head is All You Need") is the case of a single group. The KV cache
shrinks by n_kv_heads_before / n_kv_heads_after; the query heads and the attention FLOPs stay the same.

To turn a checkpoint's KV heads into fewer groups, the GQA paper mean-pools the key and value
projection heads of each group (then uptrains for ~5 % of the pre-training compute; we skip that, so
what we measure is the quality lost *before* uptraining).

    mqa = pool_kv_heads(model, 1)    # a new model; `model` is left as it was
"""
from __future__ import annotations

import torch

from lib.modeling.llama import LlamaModel


def kv_group_options(n_heads: int, n_kv_heads: int | None = None) -> list[int]:
    """The KV-head counts a model can use: divisors of `n_heads` (and of `n_kv_heads` when pooling from it)."""
    limit = n_heads if n_kv_heads is None else n_kv_heads
    return [g for g in range(limit, 0, -1) if n_heads % g == 0 and limit % g == 0]


def mean_pool_heads(weight: torch.Tensor, n_kv_heads: int, n_groups: int) -> torch.Tensor:
    """`[n_kv_heads * head_dim, d_model]` projection rows -> `[n_groups * head_dim, d_model]`.

    KV heads are grouped in order (heads 0..r-1 form group 0, with r = n_kv_heads // n_groups), which keeps
    every query head reading a pool of the heads it read before: query head h reads KV head h // (H / Hkv).
    """
    if n_groups < 1 or n_kv_heads % n_groups:
        raise ValueError(f"n_groups ({n_groups}) must divide n_kv_heads ({n_kv_heads}); "
                         f"options: {kv_group_options(n_kv_heads)}")
    rows, d_model = weight.shape
    head_dim = rows // n_kv_heads
    w = weight.reshape(n_groups, n_kv_heads // n_groups, head_dim, d_model)  # [groups, r, head_dim, d_model]
    return w.mean(dim=1).reshape(n_groups * head_dim, d_model)


@torch.no_grad()
def pool_kv_heads(model: LlamaModel, n_groups: int) -> LlamaModel:
    """A new model whose `n_groups` KV heads are the means of the original KV heads of each group.

    Every other weight is copied unchanged and `model` itself is not modified. Pooling 3 -> 3 returns
    an equal model; pooling to 1 gives MQA.
    """
    cfg = model.config
    new_cfg = cfg.replace(n_kv_heads=n_groups)  # validates that n_groups divides n_heads
    state = {}
    for name, w in model.state_dict().items():
        if name.endswith(("attn.k_proj.weight", "attn.v_proj.weight")):
            w = mean_pool_heads(w, cfg.n_kv_heads, n_groups)
        state[name] = w.clone()
    with torch.device("meta"):  # no memory, no random init: the weights come from `state`
        new = LlamaModel(new_cfg, attention_fn=model.attention_fn)
    new.load_state_dict(state, strict=True, assign=True)
    return new.eval()
