"""The KV cache (week 16); its causal mask is `lib.attn.masks.causal_mask`.

A cache keeps each layer's keys and values so that a decode step computes one new position's, and attends
from it to all the cached ones (the bottom-right aligned mask of `lib.attn.masks`).

Also here: the sliding-window variant (`sliding_window_attention` on `lib.attn.masks.sliding_window_mask`, and
`RollingKVCache`, whose memory stays constant however long the sequence grows), the cache's size
(`kv_cache_bytes`), and `truncate(n)` (alias `crop`), the rollback speculative decoding needs (week 18). The cost model of week 16's section 6 is in `lib.bench.roofline`.
"""
from __future__ import annotations

import torch

from lib.attn.attention import gqa_attention
from lib.attn.masks import sliding_window_mask


def sliding_window_attention(window: int, attention=None, n_sinks: int = 0):
    """An attention backend `(q, k, v, causal=True) -> out` in which each query sees at most `window` keys:
    itself and the `window - 1` before it (or, with `n_sinks`, the first `n_sinks` positions of the sequence
    plus itself and the `window - n_sinks - 1` before it). Set `model.attention_fn = sliding_window_attention(W)`.

    `attention` is the backend to wrap (default `lib.attn.attention.gqa_attention`); it must accept `mask=`.
    """
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    if not 0 <= n_sinks < window:
        raise ValueError(f"need 0 <= n_sinks < window; got n_sinks={n_sinks}, window={window}")

    inner = gqa_attention if attention is None else attention

    def backend(q, k, v, causal=True, **kwargs):
        mask = sliding_window_mask(q.shape[2], k.shape[2], window, device=q.device, n_sinks=n_sinks)  # [q_len, kv_len]
        return inner(q, k, v, causal=False, mask=mask, **kwargs)

    backend.__name__ = f"sliding_window_attention({window}{f', n_sinks={n_sinks}' if n_sinks else ''})"
    return backend


class CacheOverflowError(ValueError):
    """Raised when a write would run past the space a cache was allocated with."""


class _KVBuffers:
    """K and V buffers `[batch, n_kv_heads, slots, head_dim]` and what every cache layer does with them."""

    def __init__(self, batch: int, n_kv_heads: int, slots: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str | None = None):
        shape = (batch, n_kv_heads, slots, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # [batch, n_kv_heads, slots, head_dim]
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.length = 0

    @property
    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() + self.v.numel() * self.v.element_size()

    def _check_new(self, k: torch.Tensor, v: torch.Tensor) -> int:
        """Check new keys/values `[batch, n_kv_heads, t, head_dim]` fit these buffers; return t."""
        b, h, t, d = k.shape
        if k.shape != v.shape or (b, h, d) != (self.k.shape[0], self.k.shape[1], self.k.shape[3]):
            raise ValueError(
                f"cache holds [batch={self.k.shape[0]}, n_kv_heads={self.k.shape[1]}, *, head_dim={self.k.shape[3]}]; "
                f"got k {tuple(k.shape)} and v {tuple(v.shape)}"
            )
        return t

    def reset(self) -> None:
        self.length = 0

    def truncate(self, n: int) -> None:
        """Keep only the first `n` positions (drop the rest): speculative decoding's rollback (week 18).

        Nothing is erased or copied: later appends overwrite the dropped slots."""
        if not isinstance(n, int) or isinstance(n, bool):
            raise ValueError(f"truncate(n) needs an int number of positions to keep; got {n!r}")
        if not 0 <= n <= self.length:
            raise ValueError(f"truncate({n}): the cache holds {self.length} positions; keep between 0 and "
                             f"{self.length} of them (truncate only drops positions, it cannot add any)")
        self.length = n


class LayerKVCache(_KVBuffers):
    """One layer's keys and values, preallocated as `[batch, n_kv_heads, max_len, head_dim]`.

    `append(k, v)` writes the new positions after the ones already held and returns views of the
    valid prefix `[batch, n_kv_heads, length, head_dim]`; nothing is copied on read.
    """

    def __init__(self, batch: int, n_kv_heads: int, max_len: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str | None = None):
        super().__init__(batch, n_kv_heads, max_len, head_dim, dtype, device)

    @property
    def max_len(self) -> int:
        return self.k.shape[2]

    @classmethod
    def on_buffers(cls, k: torch.Tensor, v: torch.Tensor) -> "LayerKVCache":
        """An empty layer cache over existing buffers `[batch, n_kv_heads, max_len, head_dim]` (their old contents
        are never read: only positions below `length` are). `lib.modeling.fast` recycles a graph's buffers this way."""
        if k.shape != v.shape or k.dim() != 4:
            raise ValueError(f"K and V buffers must both be [batch, n_kv_heads, max_len, head_dim]; got "
                             f"{tuple(k.shape)} and {tuple(v.shape)}")
        layer = cls.__new__(cls)
        layer.k, layer.v, layer.length = k, v, 0
        return layer

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        t = self._check_new(k, v)
        end = self.length + t
        if end > self.max_len:
            raise CacheOverflowError(
                f"KV cache overflow: it holds {self.length} of {self.max_len} positions and {t} more were "
                f"appended. Allocate the cache with max_len >= prompt length + max_new_tokens "
                f"(here at least {end})."
            )
        self.k[:, :, self.length:end] = k
        self.v[:, :, self.length:end] = v
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]


class RollingKVCache(_KVBuffers):
    """One layer's sliding-window cache: a ring buffer `[batch, n_kv_heads, window, head_dim]`.

    Position p lives in slot p % window, so the buffer never grows and nothing is shifted. `append(k, v)`
    returns the held positions (at most `window`, oldest first) followed by the new ones: exactly the
    keys that a sliding-window mask lets the new queries see, plus a few that
    `sliding_window_mask(q_len, kv_len, window)` (bottom-right aligned) hides. `length` counts every
    position ever appended (the model takes its RoPE positions from it); `held` is how many are kept.
    Use it with `sliding_window_attention(window)`; the result equals full attention under a
    sliding-window mask.
    """

    def __init__(self, batch: int, n_kv_heads: int, window: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str | None = None):
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        super().__init__(batch, n_kv_heads, window, head_dim, dtype, device)
        self.window = window

    @property
    def max_len(self) -> int:
        return self.window

    @property
    def held(self) -> int:
        return min(self.length, self.window)

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        t = self._check_new(k, v)
        w, held = self.window, self.held
        old = torch.arange(self.length - held, self.length, device=self.k.device) % w  # slots, oldest first
        keys = torch.cat([self.k[:, :, old], k], dim=2)  # [B, Hkv, held + t, d]
        values = torch.cat([self.v[:, :, old], v], dim=2)
        keep = min(t, w)  # only the last `window` new positions can still be seen later
        slots = torch.arange(self.length + t - keep, self.length + t, device=self.k.device) % w
        self.k[:, :, slots] = k[:, :, t - keep:]
        self.v[:, :, slots] = v[:, :, t - keep:]
        self.length += t
        return keys, values

    def truncate(self, n: int) -> None:
        """Drop positions `n ...`; possible only while the window positions before `n` are still in the ring.

        A ring buffer overwrites position p with p + window, so once more than `window` positions have been
        appended, any rollback would need an overwritten one: truncating then raises `ValueError`."""
        if not isinstance(n, int) or isinstance(n, bool):
            raise ValueError(f"truncate(n) needs an int number of positions to keep; got {n!r}")
        if not 0 <= n <= self.length:
            raise ValueError(f"truncate({n}): the cache holds {self.length} positions; keep between 0 and "
                             f"{self.length} of them")
        if n < self.length and self.length > self.window:
            raise ValueError(
                f"RollingKVCache cannot roll back from {self.length} to {n} positions: it has already overwritten "
                f"positions the window at {n} needs (a ring of {self.window} slots keeps only the newest "
                f"{self.window}). Speculative decoding needs a full KVCache (KVCache.for_model).")
        self.length = n


class KVCache:
    """The whole model's cache: one `LayerKVCache` (or `RollingKVCache`) per layer, all at the same length."""

    def __init__(self, layers: list):
        self.layers = layers

    @classmethod
    def rolling(cls, config, window: int, batch: int = 1, dtype: torch.dtype = torch.float32,
                device=None) -> "KVCache":
        """A sliding-window cache for every layer; pair it with `sliding_window_attention(window)`."""
        return cls([RollingKVCache(batch, config.n_kv_heads, window, config.head_dim, dtype, device)
                    for _ in range(config.n_layers)])

    @classmethod
    def for_model(cls, config, batch: int = 1, max_len: int | None = None,
                  dtype: torch.dtype = torch.float32, device=None) -> "KVCache":
        max_len = config.max_seq_len if max_len is None else max_len
        return cls([LayerKVCache(batch, config.n_kv_heads, max_len, config.head_dim, dtype, device)
                    for _ in range(config.n_layers)])

    def __getitem__(self, i: int) -> LayerKVCache:
        return self.layers[i]

    def __len__(self) -> int:
        return len(self.layers)

    @property
    def length(self) -> int:
        return self.layers[0].length

    @property
    def max_len(self) -> int:
        return self.layers[0].max_len

    @property
    def nbytes(self) -> int:
        return sum(layer.nbytes for layer in self.layers)

    def reset(self) -> None:
        for layer in self.layers:
            layer.reset()

    def truncate(self, n: int) -> None:
        """Keep the first `n` positions of every layer (roll back rejected draft tokens, week 18)."""
        for layer in self.layers:
            layer.truncate(n)

    crop = truncate  # the name transformers' DynamicCache uses


def kv_cache_bytes(n_layers: int, n_kv_heads: int, head_dim: int, seq_len: int,
                   batch: int = 1, bytes_per_element: int = 2) -> int:
    """Bytes of a KV cache: 2 (K and V) x layers x KV heads x head_dim x positions x batch x element size."""
    return 2 * n_layers * n_kv_heads * head_dim * seq_len * batch * bytes_per_element
