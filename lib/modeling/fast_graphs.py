"""`lib.modeling.fast`'s one-token decode as CUDA graphs (item 8 of `lib.modeling.fast`'s docstring): `GraphedDecode` hands out
caches over recycled buffers and replays, on them, a step captured once per (cache, window) — `FastLlama.window_step`,
the step written for fixed addresses and shapes. `lib.batching.fast_paged` does the same over the engine's paged cache.
"""
from __future__ import annotations

import weakref

import torch

from lib.modeling.kv_cache import KVCache, LayerKVCache


GRAPH_BUCKET = 256  # the replayed step attends over the cache's length rounded up to this many positions


class _Slot:
    """One cache's K and V buffers and the decode graphs captured on them, one per attended window."""

    def __init__(self, ks: list, vs: list):
        self.ks, self.vs = ks, vs
        self.graphs: dict = {}  # width -> (graph or None, tok, pos, logits, hidden)


class GraphedDecode:
    """FastLlama's one-token decode as CUDA graphs (item 8 of the module's docstring).

    `new_cache` hands out `KVCache`s over recycled buffers (a cache's buffers go back to a free list when the
    cache is garbage-collected, at most `spare` per shape), so a graph captured on them is replayed by every
    later cache of that shape. `step` replays (capturing first if needed) and advances the cache's length.
    With `capture=False` the same step runs eagerly: that is how the CPU tests check the replayed code."""

    def __init__(self, fast, capture: bool = True, spare: int = 2):  # fast: a lib.modeling.fast.FastLlama
        self.fast, self.capture, self.spare = fast, capture, spare
        self.free: dict = {}  # (batch, max_len) -> [_Slot]
        self.captures = self.replays = 0
        self._tag = object()  # marks the caches this decoder made

    def new_cache(self, batch: int = 1, max_len: int | None = None) -> KVCache:
        f = self.fast
        max_len = f.config.max_seq_len if max_len is None else max_len
        key = (batch, max_len)
        if self.free.get(key):
            slot = self.free[key].pop()
            cache = KVCache([LayerKVCache.on_buffers(k, v) for k, v in zip(slot.ks, slot.vs)])
        else:
            cache = KVCache.for_model(f.config, batch, max_len, dtype=f.dtype, device=f.device)
            slot = _Slot([layer.k for layer in cache.layers], [layer.v for layer in cache.layers])
        cache.graph_slot, cache.graph_owner = slot, self._tag
        weakref.finalize(cache, self._give_back, key, slot)
        return cache

    def _give_back(self, key, slot) -> None:
        spare = self.free.setdefault(key, [])
        if len(spare) < self.spare:
            spare.append(slot)

    def owns(self, cache) -> bool:
        """Whether `cache` is one of ours, still on the buffers its graphs were captured on."""
        slot = getattr(cache, "graph_slot", None)
        return (slot is not None and getattr(cache, "graph_owner", None) is self._tag
                and all(layer.k is k and layer.v is v for layer, k, v in zip(cache.layers, slot.ks, slot.vs)))

    def step(self, input_ids: torch.Tensor, cache: KVCache):
        f, slot, start = self.fast, cache.graph_slot, cache.length
        b, max_len = slot.ks[0].shape[0], slot.ks[0].shape[2]
        if input_ids.shape != (b, 1):
            raise ValueError(f"a decode step on this cache takes input_ids [{b}, 1]; got {tuple(input_ids.shape)}")
        if start + 1 > max_len:
            raise ValueError(f"KV cache overflow: it holds {start} of {max_len} positions and 1 more was appended. "
                             f"Allocate the cache with max_len >= prompt length + max_new_tokens")
        width = min(max_len, -(-(start + 1) // GRAPH_BUCKET) * GRAPH_BUCKET)
        entry = slot.graphs.get(width)
        if entry is None:
            tok = input_ids.to(f.device).clone()
            pos = torch.full((1,), start, dtype=torch.long, device=f.device)
            entry = self._capture(slot, tok, pos, width)
            slot.graphs[width] = entry
        else:
            entry[1].copy_(input_ids)
            entry[2].fill_(start)
        graph, _, _, logits, hidden = entry
        if graph is None:  # capture=False: run the replayed step's code eagerly
            logits, hidden = f.window_step(entry[1], entry[2], slot.ks, slot.vs, width)
        else:
            graph.replay()
            self.replays += 1
        for layer in cache.layers:
            layer.length = start + 1
        return logits.clone(), hidden.clone()  # the graph's outputs are overwritten by its next replay

    def _capture(self, slot: _Slot, tok, pos, width: int):
        f = self.fast
        if not self.capture:
            return (None, tok, pos, None, None)
        side = torch.cuda.Stream(device=f.device)  # warm-up off the main stream, as torch.cuda.graphs asks
        side.wait_stream(torch.cuda.current_stream(f.device))
        with torch.cuda.stream(side):
            for _ in range(2):  # writes this position's K and V: the same values the replay writes again
                f.window_step(tok, pos, slot.ks, slot.vs, width)
        torch.cuda.current_stream(f.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):  # the server's other threads may use CUDA
            logits, hidden = f.window_step(tok, pos, slot.ks, slot.vs, width)
        self.captures += 1
        return (graph, tok, pos, logits, hidden)
