"""The causal masks (week 16), the lowest module of lib's attention: `lib.attn.attention` and `lib.modeling.kv_cache` import it.

A decoder attends from each query position to every key position at or before it. When the keys
come from a cache, the queries are the *last* `q_len` positions of a `kv_len`-long sequence, so the
mask is aligned at the bottom right:  query i may see key j  iff  j <= i + (kv_len - q_len).

    prefill          q_len = T,  kv_len = T       -> lower-triangular [T, T]
    cached decode    q_len = 1,  kv_len = T + 1   -> one row of all True [1, T + 1]
    chunked prefill  q_len = c,  kv_len = n + c   -> [c, n + c], the first n columns all True

`sliding_window_mask` is the same mask that also hides keys more than a window behind the query
(`lib.modeling.kv_cache.sliding_window_attention` and `RollingKVCache` use it).
"""
from __future__ import annotations

import torch


def causal_mask(q_len: int, kv_len: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Boolean mask `[q_len, kv_len]`, True where query i may attend to key j (bottom-right aligned)."""
    if q_len < 0 or kv_len < q_len:
        raise ValueError(
            f"causal_mask needs 0 <= q_len <= kv_len (the queries are the last q_len of kv_len positions); "
            f"got q_len={q_len}, kv_len={kv_len}"
        )
    i = torch.arange(q_len, device=device).unsqueeze(1)  # [q_len, 1]
    j = torch.arange(kv_len, device=device).unsqueeze(0)  # [1, kv_len]
    return j <= i + (kv_len - q_len)


def sliding_window_mask(q_len: int, kv_len: int, window: int, device=None, n_sinks: int = 0) -> torch.Tensor:
    """Causal mask that also hides keys more than `window - 1` positions behind the query.

    With `n_sinks > 0` (StreamingLLM's attention sinks, Xiao et al. 2023), the first `n_sinks` positions stay
    visible to every query and the recent window shrinks to `window - n_sinks`, so each query still sees at most
    `window` keys: the sinks, then itself and the `window - n_sinks - 1` positions before it.
    """
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    if not 0 <= n_sinks < window:
        raise ValueError(f"need 0 <= n_sinks < window; got n_sinks={n_sinks}, window={window}")
    i = torch.arange(q_len, device=device).unsqueeze(1) + (kv_len - q_len)  # absolute query positions
    j = torch.arange(kv_len, device=device).unsqueeze(0)
    recent = j > i - (window - n_sinks)
    if n_sinks:
        recent = recent | (j < n_sinks)
    return causal_mask(q_len, kv_len, device) & recent
